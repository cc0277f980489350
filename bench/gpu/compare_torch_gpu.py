#!/usr/bin/env python3
"""Ember's GPU embedding variants against PyTorch's nn.EmbeddingBag on CUDA, on identical workloads.

Runs `ember bench embed --device cuda --json --save-ids IDS <your flags>` (every variant, the
device-to-device copy bandwidth), then PyTorch's EmbeddingBag on the same GPU over tables of the
same shape and the same ids, timed the same way (each batch's inputs already on the device, one
untimed call, then CUDA events around --gpu-iters calls, summed over the batches, median of runs),
and prints per variant: ms per batch, GB/s (logical: lookups x row bytes), % of copy bandwidth,
and the ratio to PyTorch. PyTorch runs in two layouts (one fused EmbeddingBag over the concatenated
tables with one call per batch; one EmbeddingBag per table, like TorchRec's
EmbeddingBagCollection) and the ratio is taken against the faster. The last line is JSON.

    python bench/gpu/compare_torch_gpu.py --tables 12 --rows 500000 --dim 128 --pooling 150 \
        --batch 2048 --ids data/traces/reuse_medium_table_500K.txt

Own flags: --ember PATH (default target/release/ember), --rounds N (ember and torch alternate).
Other flags go to `ember bench embed` (see its --help; --device cuda is added).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.exit(f"compare_torch_gpu.py needs PyTorch with CUDA and NumPy ({e})")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_ember(ember, flags, ids_path):
    cmd = [ember, "bench", "embed", "--device", "cuda", "--json", "--save-ids", ids_path] + flags
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"ember failed ({' '.join(cmd)}):\n{proc.stdout}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1])


def torch_copy_gbps(nbytes=1 << 30):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times) / 1e9


class TorchBags:
    def __init__(self, cfg, layout):
        t, r, d = cfg["tables"], cfg["rows"], cfg["dim"]
        dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}.get(cfg["dtype"])
        if dt is None:
            raise SystemExit(f"PyTorch's CUDA EmbeddingBag has no {cfg['dtype']} rows; use f32, f16 or bf16")
        self.cfg, self.layout = cfg, layout
        self.mode = "mean" if cfg["mode"] == "mean" else "sum"
        self.weighted = cfg["mode"] == "weighted_sum"
        n, rows = (1, t * r) if layout == "fused" else (t, r)
        self.w = [torch.empty(rows, d, device="cuda", dtype=dt).uniform_(-1, 1) for _ in range(n)]

    def prepare(self, ids_np):
        cfg = self.cfg
        t, b, p, r = cfg["tables"], cfg["batch"], cfg["pooling"], cfg["rows"]
        calls = []
        for batch in ids_np:
            ids = torch.from_numpy(batch.astype(np.int64)).cuda()
            if self.layout == "fused":
                flat = (ids + torch.arange(t, device="cuda")[:, None] * r).reshape(-1)
                offs = torch.arange(0, t * b * p, p, device="cuda")
                psw = torch.rand(flat.numel(), device="cuda") + 0.5 if self.weighted else None
                calls.append([(0, flat, offs, psw)])
            else:
                offs = torch.arange(0, b * p, p, device="cuda")
                calls.append([(k, ids[k].contiguous(), offs,
                               torch.rand(b * p, device="cuda") + 0.5 if self.weighted else None)
                              for k in range(t)])
        return calls

    def call(self, per_batch):
        for k, idx, offs, psw in per_batch:
            torch.nn.functional.embedding_bag(idx, self.w[k], offs, mode=self.mode, per_sample_weights=psw)

    def time_run(self, calls, iters):
        total = 0.0
        for per_batch in calls:
            self.call(per_batch)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                self.call(per_batch)
            b.record()
            b.synchronize()
            total += a.elapsed_time(b) / 1e3 / iters
        return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"))
    ap.add_argument("--rounds", type=int, default=2)
    own, flags = ap.parse_known_args()
    flags = [f for f in flags if f != "--json"]
    if not torch.cuda.is_available():
        sys.exit("PyTorch sees no CUDA device")
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = os.path.join(tmp, "ids.npy")
        first, text = run_ember(own.ember, flags, ids_path)
        print(text)
        cfg = first
        ids_np = np.load(ids_path)
        lookups = int(ids_np.size)
        row_bytes = cfg["row_bytes"]
        runs, iters = cfg["runs"], cfg["gpu_iters"]
        torch_sec = {}
        ember_rounds = [first]
        with torch.inference_mode():
            layouts = {}
            for layout in ("fused", "per-table"):
                print(f"building PyTorch tables ({layout}) ...", file=sys.stderr, flush=True)
                tb = TorchBags(cfg, layout)
                calls = tb.prepare(ids_np)
                tb.time_run(calls[:2], 1)  # warm-up
                torch_sec[layout] = []
                layouts[layout] = (tb, calls)
                for rnd in range(own.rounds):
                    torch_sec[layout].append(statistics.median(tb.time_run(calls, iters) for _ in range(runs)))
                del tb, calls, layouts[layout]
                torch.cuda.empty_cache()
            tcopy = torch_copy_gbps()
        for rnd in range(1, own.rounds):
            res, _ = run_ember(own.ember, flags + ["--no-check"], ids_path)
            ember_rounds.append(res)
    t_best_layout = min(torch_sec, key=lambda k: statistics.median(torch_sec[k]))
    t_sec = statistics.median(torch_sec[t_best_layout])
    nb = ids_np.shape[0]
    t_gbps = lookups * row_bytes / t_sec / 1e9
    copy = statistics.median(r["copy_gb_per_s"] for r in ember_rounds)
    print()
    print(f"side by side on {cfg['device']['name']}: {cfg['tables']} tables x {cfg['rows']} rows x dim "
          f"{cfg['dim']} {cfg['dtype']}, pooling {cfg['pooling']}, batch {cfg['batch']}, ids {cfg['ids']} "
          f"(unique ratio {cfg['unique_ratio']:.3f}), torch {torch.__version__}")
    print(f"  copy bandwidth (read + write): ember {copy:.0f} GB/s, torch {tcopy:.0f} GB/s")
    print(f"  {'':<20}{'ms/batch':>10}{'GB/s':>9}{'% copy':>9}{'vs torch':>10}")
    for layout in ("fused", "per-table"):
        s = statistics.median(torch_sec[layout])
        g = lookups * row_bytes / s / 1e9
        print(f"  {'torch ' + layout:<20}{s * 1e3 / nb:>10.3f}{g:>9.0f}{100 * g / copy:>8.1f}%{t_sec / s:>9.2f}x")
    out = []
    for v in first["variants"]:
        name = v["variant"]
        ms = statistics.median(next(x for x in r["variants"] if x["variant"] == name)["ms_per_batch"]
                               for r in ember_rounds)
        g = lookups * row_bytes / (ms * nb / 1e3) / 1e9
        ratio = t_sec * 1e3 / nb / ms
        out.append({"variant": name, "ms_per_batch": ms, "gb_per_s": g, "fraction_of_copy": g / copy,
                    "vs_torch": ratio})
        print(f"  {'ember ' + name:<20}{ms:>10.3f}{g:>9.0f}{100 * g / copy:>8.1f}%{ratio:>9.2f}x")
    print(json.dumps({
        "device": cfg["device"]["name"], "ids": cfg["ids"], "unique_ratio": cfg["unique_ratio"],
        "tables": cfg["tables"], "rows": cfg["rows"], "dim": cfg["dim"], "dtype": cfg["dtype"],
        "pooling": cfg["pooling"], "batch": cfg["batch"], "copy_gb_per_s": copy, "torch_copy_gb_per_s": tcopy,
        "torch_ms_per_batch": {k: statistics.median(v) * 1e3 / nb for k, v in torch_sec.items()},
        "torch_best_layout": t_best_layout, "torch_gb_per_s": t_gbps, "variants": out,
        "torch_version": torch.__version__,
    }))


if __name__ == "__main__":
    main()
