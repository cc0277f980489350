"""Talks to a running `ember serve` with NVIDIA's own Triton clients (tritonclient.grpc and
tritonclient.http), the way a Triton user would, and checks that both protocols give the same
scores for the same random requests (every output of a multi-task model, and one head alone when
asked for by name), that errors come back as the clients expect, and that the calls Triton users
reach for work: versioned readiness and metadata, the statistics extension
(both protocols, counting the requests sent), the model configuration (HTTP), and a message on
what gRPC does not implement. With `--ssl-ca` (and `--ssl-cert` / `--ssl-key` for a server started
with `--tls-client-ca`) both clients speak TLS, through their own SSL options, to a server started
with `--tls-cert`.

    python3 -m venv ~/.venvs/triton && ~/.venvs/triton/bin/pip install "tritonclient[grpc,http]" numpy
    ember serve &        # HTTP on :8080, gRPC on :8081
    ~/.venvs/triton/bin/python tools/triton_client_check.py [--http 127.0.0.1:8080] [--grpc 127.0.0.1:8081]
    # TLS: ember serve --tls-cert server.pem --tls-key server.key [--tls-client-ca ca.pem]
    ~/.venvs/triton/bin/python tools/triton_client_check.py --http localhost:8080 --grpc localhost:8081 \
        --ssl-ca ca.pem [--ssl-cert client.pem --ssl-key client.key]

Not needed at run time and not part of the test suite (it needs Python and the clients); the
Rust integration tests cover the same protocol with tonic's client.
"""

import argparse
import sys

import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th


def inputs(mod, meta, n, rng):
    """Random valid inputs for `n` samples, in the client module `mod`'s InferInput."""
    out = []
    dense_in = meta["dense"][1]
    t = mod.InferInput("dense", [n, dense_in], "FP32")
    t.set_data_from_numpy(rng.random((n, dense_in), dtype=np.float32) * 4)
    out.append(t)
    for name, rows in meta["features"]:
        lengths = rng.integers(0, 4, n).astype(np.int64)
        ids = rng.integers(0, rows, int(lengths.sum())).astype(np.int64)
        for suffix, arr in (("_lengths", lengths), ("_ids", ids)):
            t = mod.InferInput(name + suffix, list(arr.shape), "INT64")
            t.set_data_from_numpy(arr)
            out.append(t)
    return out


def clients(a):
    """Triton's gRPC and HTTP clients of the server, over TLS with --ssl-ca."""
    if not a.ssl_ca:
        return tg.InferenceServerClient(a.grpc), th.InferenceServerClient(a.http)
    if bool(a.ssl_cert) != bool(a.ssl_key):
        sys.exit("--ssl-cert and --ssl-key go together")
    import gevent.ssl

    def context(**_):
        ctx = gevent.ssl.create_default_context(cafile=a.ssl_ca)
        if a.ssl_cert:
            ctx.load_cert_chain(a.ssl_cert, a.ssl_key)
        return ctx

    g = tg.InferenceServerClient(
        a.grpc,
        ssl=True,
        root_certificates=a.ssl_ca,
        private_key=a.ssl_key,
        certificate_chain=a.ssl_cert,
    )
    h = th.InferenceServerClient(a.http, ssl=True, ssl_context_factory=context)
    return g, h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--http", default="127.0.0.1:8080")
    ap.add_argument("--grpc", default="127.0.0.1:8081")
    ap.add_argument("--model", default="default")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--ssl-ca", help="speak TLS, trusting this CA (PEM)")
    ap.add_argument("--ssl-cert", help="with --ssl-ca: the client's certificate (mutual TLS)")
    ap.add_argument("--ssl-key", help="with --ssl-cert: its key")
    a = ap.parse_args()

    g, h = clients(a)
    assert g.is_server_live() and g.is_server_ready() and g.is_model_ready(a.model)
    assert h.is_server_live() and h.is_server_ready() and h.is_model_ready(a.model)
    gm = g.get_model_metadata(a.model)
    hm = h.get_model_metadata(a.model)
    assert [i.name for i in gm.inputs] == [i["name"] for i in hm["inputs"]]
    # Table sizes: Ember's metadata gives `parameters.rows` on each `<feature>_ids` input (HTTP).
    meta = {
        "dense": [int(d) for d in hm["inputs"][0]["shape"]],
        "features": [
            (i["name"][: -len("_ids")], i["parameters"]["rows"])
            for i in hm["inputs"]
            if i["name"].endswith("_ids")
        ],
    }
    outputs = [o["name"] for o in hm["outputs"]]
    rng = np.random.default_rng(7)
    worst = 0.0
    for k in range(a.requests):
        n = 1 + k % 8
        seed = int(rng.integers(1 << 31))
        rg = g.infer(a.model, inputs(tg, meta, n, np.random.default_rng(seed)))
        rh = h.infer(a.model, inputs(th, meta, n, np.random.default_rng(seed)))
        for name in outputs:
            sg, sh = rg.as_numpy(name), rh.as_numpy(name)
            assert sg.shape == (n,) and sh.shape == (n,), (name, sg.shape, sh.shape)
            if name == "scores":  # a DLRM model's probabilities (a graph model's heads are as its graph gives them)
                assert np.all((sg >= 0) & (sg <= 1))
            worst = max(worst, float(np.max(np.abs(sg - sh))))
    assert worst <= 1e-6, f"gRPC and HTTP scores differ by {worst}"
    if len(outputs) > 1:
        # A multi-task model: one head asked for by name comes back alone, equal to the whole answer's.
        seed = int(rng.integers(1 << 31))
        whole = h.infer(a.model, inputs(th, meta, 3, np.random.default_rng(seed)))
        for mod, client in ((tg, g), (th, h)):
            r = client.infer(a.model, inputs(mod, meta, 3, np.random.default_rng(seed)),
                             outputs=[mod.InferRequestedOutput(outputs[-1])])
            assert r.as_numpy(outputs[0]) is None, "an output not asked for came back"
            assert np.allclose(r.as_numpy(outputs[-1]), whole.as_numpy(outputs[-1]), rtol=0, atol=1e-6)
    # Errors as the clients report them.
    bad = inputs(tg, meta, 1, rng)[:5]
    try:
        g.infer(a.model, bad)
        sys.exit("a request missing inputs was accepted")
    except tg.InferenceServerException as e:
        assert e.status() == "StatusCode.INVALID_ARGUMENT", e.status()
        print("gRPC error as expected:", e.message())
    try:
        h.infer(a.model, inputs(th, meta, 1, rng)[:5])
        sys.exit("a request missing inputs was accepted")
    except th.InferenceServerException as e:
        assert e.status() == "400", e.status()
        print("HTTP error as expected:", e.message())
    # Versioned readiness and metadata, as clients ask with a version string.
    assert h.is_model_ready(a.model, "1") and g.is_model_ready(a.model, "1")
    assert not h.is_model_ready(a.model, "9") and not g.is_model_ready(a.model, "9")
    assert h.get_model_metadata(a.model, "1")["versions"] == ["1"]
    # Statistics: both protocols count the same requests (the 2 x requests above succeeded).
    hs = h.get_inference_statistics(a.model)["model_stats"][0]
    gs = g.get_inference_statistics(a.model, as_json=True)["model_stats"][0]
    ok_h = int(hs["inference_stats"]["success"]["count"])
    ok_g = int(gs["inference_stats"]["success"]["count"])
    assert ok_h == ok_g >= 2 * a.requests, (ok_h, ok_g)
    assert int(hs["inference_count"]) >= sum(1 + k % 8 for k in range(a.requests)) * 2
    assert int(hs["execution_count"]) >= 1 and hs["batch_stats"], hs
    # Model configuration: inputs with dims, the batcher's limits; both protocols the same.
    cfg = h.get_model_config(a.model)
    assert cfg["name"] == a.model and cfg["max_batch_size"] >= 1, cfg
    assert [i["name"] for i in cfg["input"]] == [i["name"] for i in hm["inputs"]]
    gcfg = g.get_model_config(a.model, "1", as_json=True)["config"]
    assert gcfg["name"] == cfg["name"] and gcfg["max_batch_size"] == cfg["max_batch_size"], gcfg
    for gi, hi in zip(gcfg["input"], cfg["input"], strict=True):
        assert gi["name"] == hi["name"] and gi["data_type"] == hi["data_type"], (gi, hi)
        assert [int(d) for d in gi["dims"]] == hi["dims"], (gi, hi)
    # What gRPC does not serve answers UNIMPLEMENTED with a message that says so.
    try:
        g.get_trace_settings(a.model)
        sys.exit("gRPC TraceSetting answered")
    except tg.InferenceServerException as e:
        assert e.status() == "StatusCode.UNIMPLEMENTED", e.status()
        assert "TraceSetting" in e.message() and "ModelInfer" in e.message(), e.message()
    print(
        f"tritonclient.grpc and tritonclient.http: {a.requests} requests, same scores of outputs {outputs} "
        f"(largest difference {worst:.1e}); {len(gm.inputs)} inputs, platform {gm.platform}; "
        f"versioned ready/metadata, statistics ({ok_h} successes on both), configuration on both "
        f"(max_batch_size {cfg['max_batch_size']}) and the UNIMPLEMENTED message as Triton's "
        f"clients expect"
    )


if __name__ == "__main__":
    main()
