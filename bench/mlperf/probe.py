"""One query at a time: the latency of a lone query of each size, with a pause between queries.

Sends queries of the given sizes (pairs) round-robin to a KServe v2 gRPC server, one at a time,
`--gap-ms` apart, and prints each size's latency percentiles. It separates the time a query
takes on an idle server (no queueing, no other query) from what LoadGen's Server scenario adds,
and shows how much a pause before a query costs on this machine (a query after 200 ms of idle
is slower than one right after another; docs/mlperf.md).

    python probe.py --grpc 127.0.0.1:18121 --model-dir DIR --sizes 100,700 --n 300 --gap-ms 50
"""
import argparse
import time
import types

import numpy as np

import harness as h
import mlperf_common as mc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpc", default="127.0.0.1:8081")
    ap.add_argument("--model", default=h.OFFICIAL_MODEL)
    ap.add_argument("--model-dir", default=None, help="model directory whose config.json gives the rows")
    ap.add_argument("--sizes", default="100,700", help="query sizes in pairs, comma-separated")
    ap.add_argument("--n", type=int, default=300, help="queries in all")
    ap.add_argument("--gap-ms", type=float, default=50.0, help="pause after each answer")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    if a.n < 1 or a.gap_ms < 0:
        raise SystemExit("--n must be >= 1 and --gap-ms >= 0")
    sizes = [int(s) for s in a.sizes.split(",")]
    if any(s < 1 for s in sizes):
        raise SystemExit(f"--sizes {a.sizes}: every size must be >= 1")

    import grpc
    from tritonclient.grpc import service_pb2 as pb
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    ch = grpc.insecure_channel(a.grpc, options=opts)
    md = h.model_metadata(pb, ch, a.model)
    md_feats, output = h.server_features(md)
    args = types.SimpleNamespace(model_dir=a.model_dir, tables_csv=mc.DEFAULT_CSV, rows_scale=1.0,
                                 max_rows=0, pooling=0)
    features = h.resolve_features(args, md_feats)
    samplers = [mc.IdSampler(r, "uniform", None, salt=i) for i, (_, r, _) in enumerate(features)]
    reqs = {}
    for s in sizes:
        rng = np.random.default_rng([a.seed, s])
        reqs[s] = [mc.encode_request(pb, a.model, *mc.build_query(rng, s, features, samplers), output)
                   for _ in range(8)]
    call = ch.unary_unary(mc.MODEL_INFER)
    lat = {s: [] for s in sizes}
    for i in range(a.n):
        s = sizes[i % len(sizes)]
        t = time.perf_counter_ns()
        call(reqs[s][(i // len(sizes)) % 8], timeout=30.0)
        lat[s].append((time.perf_counter_ns() - t) / 1e6)
        time.sleep(a.gap_ms / 1000)  # the pause under test, not a synchronisation
    print(f"{a.n} queries one at a time, {a.gap_ms:g} ms apart:")
    for s in sizes:
        x = np.asarray(lat[s])
        p50, p90, p99 = np.percentile(x, [50, 90, 99])
        print(f"  {s:4d} pairs: n={len(x)} p50 {p50:.1f}  p90 {p90:.1f}  p99 {p99:.1f}  max {x.max():.1f} ms")


if __name__ == "__main__":
    main()
