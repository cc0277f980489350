#!/usr/bin/env python3
"""Ember's embedding stage against PyTorch nn.EmbeddingBag, side by side, on the identical workload.

Runs `ember bench embed --json --save-ids IDS <your flags>` and PyTorch's EmbeddingBag (mode sum
or mean; int8/int4 rows through FBGEMM's row-wise quantized bags) over the same table shapes, the
same ids and the same thread count, alternating the two for several rounds so that drift on a
shared machine hits both alike, and prints both medians and their ratio. The last line is JSON.

    ~/.venvs/torch/bin/python bench/compare_torch.py --preset rm1 --threads 1
    ~/.venvs/torch/bin/python bench/compare_torch.py --preset rm1 --dtype int8
    ~/.venvs/torch/bin/python bench/compare_torch.py --preset rm1 --ids data/traces/reuse_medium_table_500K.txt

Flags this script does not know are passed to `ember bench embed` (see `ember bench embed --help`).
With `--preset rm1 --ids TRACE`, the plain C loop `../shared/tools/gather_ceiling_trace.c` (the
issue-23 yardstick: RM1 on 2 MiB pages, each table replaying its own window of the trace) is
compiled with `cc -O3 -march=native` and run in every round too, at each distance of
--plain-loop-prefetch (default 16,32,64,96), and Ember is reported against it (its distance 16,
as published, and its best distance in this run). The loop times 60 batches per pass and reports
the best of 3 passes, so with it Ember runs 60 batches per run too (unless --batches is given),
and its best of its first 3 runs is reported beside its median, the same statistic as the loop's.

Own flags: --ember PATH (default: target/release/ember, built if missing), --rounds N (default 3),
--plain-loop PATH.c (default ../shared/tools/gather_ceiling_trace.c; "none" skips it),
--plain-loop-prefetch LIST,
--torch-layout fused|per-table (fused: one EmbeddingBag over the concatenated tables, one call per
batch, the fastest way to drive PyTorch; per-table: one EmbeddingBag per table, like TorchRec's
EmbeddingBagCollection), --index-dtype int64|int32.

PyTorch is needed: `python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors`,
then run this script with that venv's python.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.exit(
        f"compare_torch.py needs PyTorch and NumPy ({e}).\n"
        "Install them in a virtual environment outside the repository, e.g.\n"
        "  python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors\n"
        "and run this script with ~/.venvs/torch/bin/python."
    )

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What one figure of the plain loop is: the best of 3 timed passes over 60 batches (NB in the C).
PLAIN_LOOP_PASSES = 3
PLAIN_LOOP_BATCHES = 60


def flag_value(flags, name):
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return None


class PlainLoop:
    """The C gather-and-sum loop over RM1 and the trace, compiled once, run at several distances."""

    def __init__(self, source, trace, distances, tmp):
        self.trace, self.distances = trace, distances
        self.exe = os.path.join(tmp, "plain_loop")
        cmd = ["cc", "-O3", "-march=native", source, "-o", self.exe]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"compiling the plain loop failed ({' '.join(cmd)}):\n{proc.stderr}")

    def run(self):
        """Million lookups/s per distance."""
        out = {}
        for d in self.distances:
            proc = subprocess.run([self.exe, self.trace, str(d), "1"], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"the plain loop failed: {proc.stderr}{proc.stdout}")
            out[d] = float(proc.stdout.split(":")[-1].split("Mlookups/s")[0]) * 1e6
        return out


def run_ember(ember, flags, ids_path):
    cmd = [ember, "bench", "embed", "--json", "--save-ids", ids_path] + flags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"ember failed ({' '.join(cmd)}):\n{proc.stderr}{proc.stdout}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


class TorchBags:
    """The same tables and ids in PyTorch."""

    def __init__(self, cfg, layout, index_dtype):
        t, r, d = cfg["tables"], cfg["rows"], cfg["dim"]
        self.cfg, self.layout = cfg, layout
        self.mode = {"sum": 0, "mean": 1}.get(cfg["mode"], 0)
        self.weighted = cfg["mode"] == "weighted_sum"
        dtype = cfg["dtype"]
        self.dtype = dtype
        self.idx_dtype = torch.int64 if index_dtype == "int64" else torch.int32
        n_tables = 1 if layout == "fused" else t
        rows_each = t * r if layout == "fused" else r
        gen = torch.Generator().manual_seed(0)
        self.weights = []
        for _ in range(n_tables):
            w = torch.empty(rows_each, d).uniform_(-1, 1, generator=gen)
            if dtype == "f32":
                self.weights.append(w)
            elif dtype in ("f16", "bf16"):
                self.weights.append(w.to(torch.float16 if dtype == "f16" else torch.bfloat16))
            elif dtype == "int8":
                self.weights.append(torch.ops.quantized.embedding_bag_byte_prepack(w))
            elif dtype == "int4":
                self.weights.append(torch.ops.quantized.embedding_bag_4bit_prepack(w))
            else:
                sys.exit(f"unsupported dtype {dtype}")
            del w

    def prepare(self, ids_np):
        """ids_np: [batches, tables, batch*pooling] -> per-batch call arguments."""
        cfg = self.cfg
        t, b, p, r = cfg["tables"], cfg["batch"], cfg["pooling"], cfg["rows"]
        calls = []
        for batch in ids_np:
            ids = torch.from_numpy(batch.astype(np.int64))
            if self.layout == "fused":
                flat = (ids + torch.arange(t, dtype=torch.int64)[:, None] * r).reshape(-1).to(self.idx_dtype)
                offs = torch.arange(0, t * b * p, p, dtype=self.idx_dtype)
                psw = torch.rand(flat.numel()) + 0.5 if self.weighted else None
                calls.append([(flat, offs, psw)])
            else:
                offs = torch.arange(0, b * p, p, dtype=self.idx_dtype)
                calls.append(
                    [
                        (ids[k].to(self.idx_dtype), offs, torch.rand(b * p) + 0.5 if self.weighted else None)
                        for k in range(t)
                    ]
                )
        return calls

    def bag(self, k, idx, offs, psw):
        w = self.weights[k]
        if self.dtype == "int8":
            return torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
                w, idx, offs, False, self.mode, False, psw, None, False
            )
        if self.dtype == "int4":
            return torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(
                w, idx, offs, False, self.mode, False, psw, None, False
            )
        mode = "sum" if self.mode == 0 else "mean"
        return torch.nn.functional.embedding_bag(idx, w, offs, mode=mode, per_sample_weights=psw)

    def time_run(self, calls):
        n = 0
        t0 = time.perf_counter()
        for per_batch in calls:
            for k, (idx, offs, psw) in enumerate(per_batch):
                self.bag(k, idx, offs, psw)
                n += idx.numel()
        return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torch-layout", choices=["fused", "per-table"], default="fused")
    ap.add_argument("--index-dtype", choices=["int64", "int32"], default="int32")
    ap.add_argument("--plain-loop", default=os.path.join(ROOT, "..", "shared", "tools", "gather_ceiling_trace.c"))
    ap.add_argument("--plain-loop-prefetch", default="16,32,64,96")
    own, flags = ap.parse_known_args()
    if "--json" in flags:
        flags.remove("--json")
    if not os.path.exists(own.ember):
        subprocess.run(["cargo", "build", "--release", "-p", "ember-cli"], cwd=ROOT, check=True)

    with tempfile.TemporaryDirectory() as tmp:
        ids_path = os.path.join(tmp, "ids.npy")
        plain, plain_runs = None, []
        trace = flag_value(flags, "--ids")
        rm1 = flag_value(flags, "--preset") == "rm1" and not any(
            flag_value(flags, f) for f in ("--tables", "--rows", "--dim", "--pooling", "--batch", "--dtype"))
        if own.plain_loop != "none":
            if not (rm1 and trace and os.path.isfile(trace)):
                print("plain loop: skipped (it runs RM1 in f32 over a trace: --preset rm1 --ids FILE)", file=sys.stderr)
            elif not os.path.isfile(own.plain_loop):
                print(f"plain loop: skipped ({own.plain_loop} not found)", file=sys.stderr)
            else:
                dists = [int(x) for x in own.plain_loop_prefetch.split(",")]
                plain = PlainLoop(own.plain_loop, trace, dists, tmp)
        if plain and flag_value(flags, "--batches") is None:
            # The loop's pass: 60 batches (PyTorch replays the same saved ids).
            flags += ["--batches", str(PLAIN_LOOP_BATCHES)]
        print(f"[round 1/{own.rounds}] ember ...", file=sys.stderr, flush=True)
        first, text = run_ember(own.ember, flags, ids_path)
        print(text)
        cfg = first
        ids_np = np.load(ids_path)
        threads = cfg["threads"]
        torch.set_num_threads(threads)
        print(f"building PyTorch tables ({cfg['dtype']}, {own.torch_layout}) ...", file=sys.stderr, flush=True)
        tb = TorchBags(cfg, own.torch_layout, own.index_dtype)
        calls = tb.prepare(ids_np)
        ember_runs, torch_runs = [first["lookups_per_s"]], []
        # The plain loop reports the best of its 3 timed passes: Ember's best of its first 3 runs
        # of each round is the same statistic (over the same 60 batches, by default).
        ember_best = [max(first["run_lookups_per_s"][:PLAIN_LOOP_PASSES])]
        ceiling_runs = [first["ceiling_lookups_per_s"]]
        with torch.inference_mode():
            tb.time_run(calls)  # warm-up
            for rnd in range(own.rounds):
                if rnd > 0:
                    print(f"[round {rnd + 1}/{own.rounds}] ember ...", file=sys.stderr, flush=True)
                    res, _ = run_ember(own.ember, flags + ["--no-check"], ids_path)
                    ember_runs.append(res["lookups_per_s"])
                    ember_best.append(max(res["run_lookups_per_s"][:PLAIN_LOOP_PASSES]))
                    ceiling_runs.append(res["ceiling_lookups_per_s"])
                print(f"[round {rnd + 1}/{own.rounds}] torch ...", file=sys.stderr, flush=True)
                per = [tb.time_run(calls) for _ in range(cfg["runs"])]
                torch_runs.append(statistics.median(per))
                if plain:
                    print(f"[round {rnd + 1}/{own.rounds}] plain loop ...", file=sys.stderr, flush=True)
                    plain_runs.append(plain.run())

    e, t, c = statistics.median(ember_runs), statistics.median(torch_runs), statistics.median(ceiling_runs)
    print()
    print(f"side by side: {cfg['tables']} tables x {cfg['rows']} rows x dim {cfg['dim']} {cfg['dtype']}, "
          f"pooling {cfg['pooling']}, batch {cfg['batch']}, ids {cfg['ids']}, {threads} threads, "
          f"torch {torch.__version__} ({own.torch_layout}, {own.index_dtype} ids)")
    print(f"  {'':<18}{'lookups/s (median of rounds)':>30}   per round")
    print(f"  {'ember':<18}{e / 1e6:>28.2f} M   " + " ".join(f"{x / 1e6:.2f}" for x in ember_runs))
    print(f"  {'pytorch':<18}{t / 1e6:>28.2f} M   " + " ".join(f"{x / 1e6:.2f}" for x in torch_runs))
    print(f"  {'memory ceiling':<18}{c / 1e6:>28.2f} M   " + " ".join(f"{x / 1e6:.2f}" for x in ceiling_runs))
    plain_med = {}
    if plain_runs:
        for d in plain_runs[0]:
            runs = [r[d] for r in plain_runs]
            plain_med[d] = statistics.median(runs)
            print(f"  {'plain loop pf ' + str(d):<18}{plain_med[d] / 1e6:>28.2f} M   " + " ".join(f"{x / 1e6:.2f}" for x in runs))
    print(f"  ember / pytorch: {e / t:.2f}x    pytorch / ceiling: {t / c:.2f}    ember / ceiling: {e / c:.2f}")
    if plain_med:
        best = max(plain_med, key=plain_med.get)
        first = list(plain_med)[0]
        eb = statistics.median(ember_best)
        print(f"  ember / plain loop pf {first}: {e / plain_med[first]:.2f}    "
              f"ember / plain loop at its best (pf {best}): {e / plain_med[best]:.2f}")
        print(f"  best of {PLAIN_LOOP_PASSES} runs, as the plain loop reports (ember {eb / 1e6:.2f} M, "
              f"{cfg['batches']} batches a run): ember / plain loop at its best (pf {best}): "
              f"{eb / plain_med[best]:.2f}")
    print(json.dumps({
        "ember_lookups_per_s": e, "torch_lookups_per_s": t, "ceiling_lookups_per_s": c, "ratio": e / t,
        "ember_rounds": ember_runs, "torch_rounds": torch_runs, "ceiling_rounds": ceiling_runs,
        "threads": threads, "dtype": cfg["dtype"], "ids": cfg["ids"], "dedup": cfg["dedup"],
        "unique_ratio": cfg["unique_ratio"], "torch_version": torch.__version__, "torch_layout": own.torch_layout,
        "quant_rel_error": cfg.get("quant_rel_error"), "prefetch": cfg.get("prefetch"),
        "plain_loop_lookups_per_s": {str(d): v for d, v in plain_med.items()},
        "ember_best_run_rounds": ember_best if plain_med else None,
        "batches": cfg["batches"],
    }))


if __name__ == "__main__":
    main()
