#!/usr/bin/env python3
"""A graph model, whole (ids to scores): Ember (its embedding stage, then its graph runtime, in
f32, bf16 and int8) against PyTorch running the same model (eager f32, bf16 autocast, and
torch.compile where it builds), same batch sizes and thread counts, alternating, medians
(docs/graph-models.md).

    EMBER_GRAPH_ROWS=100000 ~/.venvs/graph/bin/python bench/compare_torch_graph.py \\
        --factory tools/graph_models.py:dcn_mlperf --model DIR [--batch 256,2048] [--threads 1,2] \\
        [--reps 3] [--modes eager,autocast,compile]

DIR is what `tools/export_torch.py --from torch-module` wrote from the same factory with the same
EMBER_GRAPH_ROWS (the factories are seeded, so the weights are the same). Both sides draw one id
per (feature, sample) uniformly from each table (max_len ids per sequence feature: a full history,
as `ember bench graph --whole` draws) and dense values uniform in [-1, 1). A model with sequence
features needs fbgemm's native ops for TorchRec's JaggedTensor.to_padded_dense (the `tr`
environment of docs/graph-models.md).
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from timing import ms_per_call  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factory", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="256,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="eager,autocast,compile")
    ap.add_argument("--ember", default=os.path.join(HERE, "..", "target", "release", "ember"))
    a = ap.parse_args()
    import torch_module

    model = torch_module.load_factory(a.factory)
    _, _, config, keys, rows, per = torch_module.bench_shape(model, a.model)
    dense_in = config["dense_in"]
    batches = [int(x) for x in a.batch.split(",")]
    threads = [int(x) for x in a.threads.split(",")]
    modes = a.modes.split(",")
    g = torch.Generator().manual_seed(3)
    inputs = {}
    for b in batches:
        dense = torch.rand(b, dense_in, generator=g) * 2 - 1
        values = torch.cat([torch.randint(0, r, (b * p,), generator=g) for r, p in zip(rows, per)])
        lengths = torch.cat([torch.full((b,), p, dtype=torch.long) for p in per])
        kjt = torch_module._tr().KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
        inputs[b] = (dense, kjt)
    compiled = None
    if "compile" in modes:
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*inputs[batches[0]])
        except Exception as e:  # noqa: BLE001 (reported, the other modes run)
            print(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            compiled = None
    res = {}
    for _ in range(a.reps):
        for d in ["f32", "bf16", "int8"]:
            r = subprocess.run([a.ember, "bench", "graph", "--whole", "--model", a.model, "--batch", a.batch,
                                "--threads", a.threads, "--rounds", "1", "--dense-dtype", d, "--json"],
                               capture_output=True, text=True, check=True)
            for c in json.loads(r.stdout.strip().splitlines()[-1])["cells"]:
                res.setdefault((f"ember {d}", c["batch"], c["threads"]), []).append(c["ms"])
        for t in threads:
            torch.set_num_threads(t)
            for b in batches:
                x = inputs[b]
                with torch.no_grad():
                    if "eager" in modes:
                        res.setdefault(("eager", b, t), []).append(ms_per_call(lambda: model(*x)))
                    if "autocast" in modes:
                        def ac():
                            with torch.autocast("cpu", dtype=torch.bfloat16):
                                return model(*x)
                        res.setdefault(("autocast", b, t), []).append(ms_per_call(ac))
                    if compiled is not None:
                        res.setdefault(("compile", b, t), []).append(ms_per_call(lambda: compiled(*x)))
    names = [m for m in ["eager", "autocast", "compile"] if any(k[0] == m for k in res)]
    ember = ["ember f32", "ember bf16", "ember int8"]
    print(f"{a.factory} ({a.model}), EMBER_GRAPH_ROWS={os.environ.get('EMBER_GRAPH_ROWS', '100')}, torch "
          f"{torch.__version__}; ms a batch, medians of {a.reps} reps")
    print("| batch | threads | " + " | ".join(names + ember) + " | Ember best / PyTorch best |")
    print("|---|---|" + "---|" * (len(names) + len(ember) + 1))
    for b in batches:
        for t in threads:
            med = {m: float(np.median(res[(m, b, t)])) for m in names + ember}
            best_t = min(med[m] for m in names)
            best_e = min(med[m] for m in ember)
            cells = " | ".join(f"{med[m]:.2f}" for m in names + ember)
            print(f"| {b} | {t} | {cells} | {best_t / best_e:.2f}x |")


if __name__ == "__main__":
    main()
