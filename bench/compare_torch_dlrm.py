#!/usr/bin/env python3
"""A whole DLRM forward pass, Ember against PyTorch eager, side by side.

Runs `ember bench model --preset P --batch B --threads T --warmup W --iters N --json` and the identical
architecture in PyTorch (facebookresearch/dlrm's DLRM_Net as tools/dlrm_ref.py's DLRMNet: one
nn.EmbeddingBag per table, int64 offsets and ids as dlrm passes them, `torch.inference_mode()`,
`torch.set_num_threads(T)`), alternating the two for several rounds so that drift on a shared
machine hits both alike. Each side times every batch: samples/s, p50 and p99 batch latency.

    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset rm1 --batch 64 --threads 1
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset rm1 --batch 256 --threads 2 --rounds 5 --json
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --torch-only --iters 20        # PyTorch alone
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --device cuda --batch 2048 --iters 200   # on a GPU

With --device cuda both sides run on the GPU and every batch starts on the host: PyTorch copies
its (pinned) inputs with non_blocking=True, runs the model eagerly and synchronizes, per batch;
Ember runs `bench model --device cuda --gpu-variant V` (its inputs copied on a copy stream while
the previous batch computes).

Preset rm1 (DeepRecSys RM1-like): dense 2048 -> bottom MLP 2048-256-64 (ReLU after each),
32 tables x 500,000 rows x dim 64 f32 (4.1 GB), every bag exactly 80 uniform random ids, dot
interaction without self pairs (33 vectors -> 528 pairs + 64 = 592), top MLP 592-768-384-1
then sigmoid. PyTorch uses fresh ids per batch (a pool of pre-generated batches, cycled when
iters is large); both sides run the same --warmup untimed batches first. Preset small: the same
with 8 tables x 10,000 rows.

PyTorch is needed: `python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors`,
then run this script with that venv's python.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.exit(
        f"compare_torch_dlrm.py needs PyTorch and NumPy ({e}).\n"
        "Install them in a virtual environment outside the repository, e.g.\n"
        "  python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors\n"
        "and run this script with ~/.venvs/torch/bin/python."
    )

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from dlrm_ref import DLRMNet  # noqa: E402

# dlrm notation: bottom includes the input size; top lists output sizes (input follows from the
# interaction). Add a preset here and to `ember bench model` alike.
PRESETS = {
    "rm1": dict(bottom=[2048, 256, 64], tables=32, rows=500_000, dim=64, pooling=80, top=[768, 384, 1]),
    "small": dict(bottom=[2048, 256, 64], tables=8, rows=10_000, dim=64, pooling=80, top=[768, 384, 1]),
}
POOL_BYTES = 512 << 20  # cap on pre-generated batches


def build_model(p, seed=0):
    n = p["tables"] + 1
    num_int = p["dim"] + n * (n - 1) // 2
    return DLRMNet(p["dim"], [p["rows"]] * p["tables"], p["bottom"], [num_int] + p["top"], "dot", False, seed).eval()


def make_batches(p, batch, count, ids_dtype, seed=1, pin=False):
    gen = torch.Generator().manual_seed(seed)
    per = batch * p["pooling"]
    offsets = torch.arange(0, per, p["pooling"], dtype=ids_dtype)
    out = []
    for _ in range(count):
        dense = torch.rand(batch, p["bottom"][0], generator=gen)
        ids = torch.randint(0, p["rows"], (p["tables"], per), generator=gen, dtype=torch.int64).to(ids_dtype)
        if pin:
            dense, offsets, ids = dense.pin_memory(), offsets.pin_memory(), ids.pin_memory()
        out.append((dense, [offsets] * p["tables"], list(ids)))
    return out


def run_torch(model, batches, warmup, iters, cuda=False):
    times = []
    with torch.inference_mode():
        for i in range(warmup + iters):
            dense, offs, ids = batches[i % len(batches)]
            t0 = time.perf_counter()
            if cuda:
                dense = dense.cuda(non_blocking=True)
                offs = [o.cuda(non_blocking=True) for o in offs]
                ids = [x.cuda(non_blocking=True) for x in ids]
                model(dense, offs, ids).cpu()
                torch.cuda.synchronize()
            else:
                model(dense, offs, ids)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return summarize(times, batches[0][0].shape[0])


def summarize(times, batch):
    ms = np.array(times) * 1e3
    return {"samples_per_s": batch * len(times) / (ms.sum() / 1e3),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def run_ember(a):
    cmd = [a.ember, "bench", "model", "--preset", a.preset, "--batch", str(a.batch), "--threads", str(a.threads),
           "--warmup", str(a.warmup), "--iters", str(a.iters), "--json"]
    if a.device == "cuda":
        cmd += ["--device", "cuda", "--gpu-variant", a.gpu_variant]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"ember failed ({' '.join(cmd)}):\n{proc.stderr}{proc.stdout}")
    lines = proc.stdout.strip().splitlines()
    try:
        res = json.loads(lines[-1])
        missing = [k for k in ("samples_per_s", "p50_ms", "p99_ms") if k not in res]
    except (IndexError, json.JSONDecodeError):
        res, missing = None, ["a JSON last line"]
    if missing:
        sys.exit(f"`{' '.join(cmd)}` printed no {', '.join(missing)}:\n{proc.stdout}")
    return res, "\n".join(lines[:-1])


def show(title, rows):
    print(f"{title:<18}{'samples/s':>12}{'p50 ms':>10}{'p99 ms':>10}")
    for name, r in rows:
        print(f"  {name:<16}{r['samples_per_s']:>12.1f}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="rm1", help="model shape (default rm1)")
    ap.add_argument("--batch", type=int, default=64, help="samples per batch (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="threads for both sides (default 1)")
    ap.add_argument("--iters", type=int, default=300, help="timed batches per round (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed batches before them (default 30)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"), help="ember binary")
    ap.add_argument("--ids-dtype", choices=["int64", "int32"], default="int64",
                    help="PyTorch offsets/ids dtype (default int64, as dlrm)")
    ap.add_argument("--torch-only", action="store_true", help="run the PyTorch side alone")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides run (default cpu)")
    ap.add_argument("--gpu-variant", default="tuned", help="ember's GPU embedding variant (default tuned)")
    ap.add_argument("--json", action="store_true", help="print a final JSON line")
    a = ap.parse_args()
    p = PRESETS[a.preset]
    if not a.torch_only:
        if not os.path.exists(a.ember):
            sys.exit(f"{a.ember} not found: build it with `cargo build --release -p ember-cli` (or pass --ember)")
        if subprocess.run([a.ember, "bench", "model", "--help"], capture_output=True).returncode != 0:
            sys.exit(f"{a.ember} has no `bench model` command: rebuild it, or use --torch-only")

    torch.set_num_threads(a.threads)
    print(f"building the PyTorch model ({a.preset}: {p['tables']} tables x {p['rows']} rows x dim {p['dim']}) ...",
          file=sys.stderr, flush=True)
    model = build_model(p)
    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("--device cuda: PyTorch sees no CUDA device")
        model = model.cuda()
    ids_dtype = torch.int32 if a.ids_dtype == "int32" else torch.int64
    per_batch = a.batch * (p["tables"] * p["pooling"] * ids_dtype.itemsize + p["bottom"][0] * 4)
    batches = make_batches(p, a.batch, max(1, min(a.warmup + a.iters, POOL_BYTES // per_batch)), ids_dtype,
                           pin=cuda)
    ember_runs, torch_runs = [], []
    for rnd in range(a.rounds):
        rows = []
        if not a.torch_only:
            print(f"[round {rnd + 1}/{a.rounds}] ember ...", file=sys.stderr, flush=True)
            res, text = run_ember(a)
            want = {"pooling": p["pooling"], "batch": a.batch, "table_bytes": p["tables"] * p["rows"] * p["dim"] * 4}
            off = {k: (res[k], v) for k, v in want.items() if k in res and res[k] != v}
            if off:
                sys.exit(f"ember's {a.preset} differs from this script's (ember, here): {off}")
            if rnd == 0 and text:
                print(text)
            ember_runs.append(res)
            rows.append(("ember", res))
        print(f"[round {rnd + 1}/{a.rounds}] pytorch ...", file=sys.stderr, flush=True)
        torch_runs.append(run_torch(model, batches, a.warmup, a.iters, cuda))
        rows.append(("pytorch", torch_runs[-1]))
        show(f"round {rnd + 1}/{a.rounds}", rows)

    def med(runs):
        return {k: statistics.median(r[k] for r in runs) for k in ("samples_per_s", "p50_ms", "p99_ms")}

    t = med(torch_runs)
    summary = {"preset": a.preset, "device": a.device, "batch": a.batch, "threads": a.threads, "iters": a.iters, "warmup": a.warmup,
               "rounds": a.rounds, "ids_dtype": a.ids_dtype, "torch_version": torch.__version__, "torch": t,
               "torch_rounds": torch_runs}
    print()
    print(f"medians of {a.rounds} rounds: {a.preset}, batch {a.batch}, {a.threads} threads, {a.iters} batches "
          f"after {a.warmup} warm-up, torch {torch.__version__} ({a.ids_dtype} ids)")
    rows = [("pytorch", t)]
    if ember_runs:
        e = med(ember_runs)
        rows.insert(0, ("ember", e))
        summary.update(ember=e, ember_rounds=ember_runs, samples_ratio=e["samples_per_s"] / t["samples_per_s"],
                       p99_ratio=e["p99_ms"] / t["p99_ms"])
    show("", rows)
    if ember_runs:
        print(f"  ember / pytorch samples/s: {summary['samples_ratio']:.2f}x    "
              f"ember p99 / pytorch p99: {summary['p99_ratio']:.2f}")
    if a.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
