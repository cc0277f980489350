#!/usr/bin/env python3
"""A graph model's dense part (dense.onnx): Ember's graph runtime against ONNX Runtime, same file,
same batch sizes and thread counts, alternating, medians (docs/graph-models.md).

    ~/.venvs/graph/bin/python bench/compare_onnx.py --model DIR [--batch 256,2048] [--threads 1,2]
        [--reps 5] [--ember target/release/ember] [--dense-dtype f32]

DIR is what `tools/export_torch.py --from torch-module` wrote. Each rep runs `ember bench graph
--json --rounds 1` over every cell, then ONNX Runtime over every cell (one InferenceSession per
thread count: intra_op_num_threads = threads, inter_op 1, sequential execution, all graph
optimizations); each cell's figure is the median over the reps. Inputs are random, of the widths
config.json declares (as Ember's bench draws them).
"""

import argparse
import json
import os
import subprocess

import numpy as np

from timing import ms_per_call


def widths(model):
    c = json.load(open(os.path.join(model, "config.json")))
    dims = {t["name"]: t["dim"] for t in c["tables"]}
    return c["dense_in"], sum(dims[f["table"]] for f in c["features"]), c["interaction"]["file"]


def ort_cells(path, batches, threads, dense_in, sparse_w, budget=0.2):
    import onnxruntime as ort

    out = {}
    for t in threads:
        so = ort.SessionOptions()
        so.intra_op_num_threads = t
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = {i.name for i in s.get_inputs()}
        rng = np.random.default_rng(1)
        for b in batches:
            feeds = {"dense": rng.uniform(-1, 1, (b, dense_in)).astype(np.float32),
                     "sparse": rng.uniform(-0.5, 0.5, (b, sparse_w)).astype(np.float32)}
            feeds = {k: v for k, v in feeds.items() if k in names}
            out[(b, t)] = ms_per_call(lambda: s.run(None, feeds), budget, cap=10_000)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="256,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ember", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "ember"))
    ap.add_argument("--dense-dtype", default="f32")
    a = ap.parse_args()
    batches = [int(x) for x in a.batch.split(",")]
    threads = [int(x) for x in a.threads.split(",")]
    dense_in, sparse_w, file = widths(a.model)
    import onnxruntime as ort

    ember, onnx_rt, cpu = {}, {}, ""
    for _ in range(a.reps):
        r = subprocess.run([a.ember, "bench", "graph", "--model", a.model, "--batch", a.batch, "--threads", a.threads,
                            "--rounds", "1", "--dense-dtype", a.dense_dtype, "--json"],
                           capture_output=True, text=True, check=True)
        j = json.loads(r.stdout.strip().splitlines()[-1])
        cpu = j["cpu"]
        for c in j["cells"]:
            ember.setdefault((c["batch"], c["threads"]), []).append(c["ms"])
        for k, v in ort_cells(os.path.join(a.model, file), batches, threads, dense_in, sparse_w).items():
            onnx_rt.setdefault(k, []).append(v)
    print(f"{a.model}: {cpu}; ONNX Runtime {ort.__version__}; Ember {a.dense_dtype}; medians of {a.reps} reps")
    print("| batch | threads | Ember ms | ONNX Runtime ms | Ember samples/s | ONNX Runtime samples/s | Ember / ORT |")
    print("|---|---|---|---|---|---|---|")
    for b in batches:
        for t in threads:
            e, o = float(np.median(ember[(b, t)])), float(np.median(onnx_rt[(b, t)]))
            print(f"| {b} | {t} | {e:.3f} | {o:.3f} | {b / e * 1e3:,.0f} | {b / o * 1e3:,.0f} | {o / e:.2f}x |")


if __name__ == "__main__":
    main()
