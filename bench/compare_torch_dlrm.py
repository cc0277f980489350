#!/usr/bin/env python3
"""A whole DLRM forward pass, Ember against PyTorch, side by side.

Runs `ember bench model --preset P --batch B --threads T --warmup W --iters N --json` and the identical
architecture in PyTorch (one nn.EmbeddingBag per table, int64 offsets and ids as dlrm and
TorchRec pass them, `torch.inference_mode()`, `torch.set_num_threads(T)`), alternating the two
for several rounds so that drift on a shared machine hits both alike. Each side times every
batch: samples/s, p50 and p99 batch latency; the figures are the medians of the rounds.

    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset rm1 --batch 64 --threads 1
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset rm1 --batch 256 --threads 2 --rounds 5 --json
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --torch-only --iters 20        # PyTorch alone
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --device cuda --batch 2048 --iters 200   # on a GPU
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset dlrm-v2 --batch 2048 --iters 10
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset dlrm-v2 --batch mlperf --iters 100
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset dlrm-v2 --ember-dense f32,bf16,int8
    ~/.venvs/torch/bin/python bench/compare_torch_dlrm.py --preset dlrm-v2 --check   # PyTorch == Ember?

Presets rm1 and small (facebookresearch/dlrm's DLRM_Net as tools/dlrm_ref.py's DLRMNet): RM1 is
dense 2048 -> bottom MLP 2048-256-64 (ReLU after each), 32 tables x 500,000 rows x dim 64 f32
(4.1 GB), every bag exactly 80 uniform random ids, dot interaction without self pairs (33
vectors -> 528 pairs + 64 = 592), top MLP 592-768-384-1 then sigmoid; small is the same with 8
tables x 10,000 rows. PyTorch runs eagerly in f32 (`--torch-modes` adds others).

Preset dlrm-v2: MLPerf DLRM-v2, TorchRec's `DLRM_DCN` as tools/dlrm_ref.py's DLRMDCN (plain
PyTorch, TorchRec's modules and state_dict keys; `--check` compares it with the real TorchRec
class where torchrec imports): dense 13 -> DenseArch 512-256-128 (ReLU after every layer), the 26
tables of data/tables/mlperf_dlrm_dcnv2_tables.csv (dim 128, rows capped at --max-rows, default
200,000, as `ember bench model` caps them), each feature's bag exactly its MLPerf multi-hot size
(3, 2, 1, ... 100, 27, ...: 214 ids a sample), InteractionDCNArch (concat of the dense output and
the 26 pooled vectors, 3456 wide, then a 3-layer LowRankCrossNet of rank 512: x_{l+1} = x_0 *
(W_l (V_l x_l) + b_l) + x_l), OverArch 1024-1024-512-256 with ReLU then Linear(256, 1), sigmoid.
PyTorch runs three ways, each reported: f32 eager, bf16 autocast (`torch.autocast(device,
torch.bfloat16)` inside inference_mode), and `torch.compile` under bf16 autocast (compiled on
every batch size once before the rounds; when compiling fails, the failure is reported and the
others run on). "PyTorch's best" is the fastest of them, and Ember's ratio is against it.

`--batch mlperf` cycles both sides through MLPerf's query sizes (100, 100, 200 x 12, 300, 300,
400, 500, 600, 700: the 5% quantiles, 270 on average; Ember: `--batch-sizes mlperf`), batch i of
a run having the i-th size of the cycle on both sides. `--ember-dense f32,bf16,int8` runs Ember
once per round for each, with `--dense-dtype X`; a configuration that Ember refuses (an Ember
without that flag) is reported and left out, and the rest go on. `--ember-args "..."` passes
more flags to every Ember run.

`--check` builds the dlrm-v2 model in PyTorch with small tables (`--check-rows`, 1000) and
weights drawn wider than TorchRec's initialisation (so that scores spread over (0, 1) and every
layer counts), exports it with tools/export_torch.py's TorchRec path into a temporary Ember
model directory, scores `--check-samples` random samples (bags of 0 to twice each feature's
multi-hot size) with `ember predict` and with PyTorch, and prints the largest difference of the
scores (also against a float64 PyTorch run, and against the real TorchRec DLRM_DCN when
torchrec imports); it fails over 1e-4.

With --device cuda both sides run on the GPU and every batch starts on the host: PyTorch copies
its (pinned) inputs with non_blocking=True, runs the model and synchronizes, per batch;
Ember runs `bench model --device cuda --gpu-variant V`: its inputs, page-locked ahead likewise
(`--gpu-inputs pinned`, its default), are copied on a copy stream while the batch before
computes, and checked on the device (`--ember-args "--gpu-inputs staged"` has the host check and
stage each batch instead, as `ember serve` does).

PyTorch is needed: `python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors`,
then run this script with that venv's python.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import shlex
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
        f"compare_torch_dlrm.py needs PyTorch and NumPy ({e}).\n"
        "Install them in a virtual environment outside the repository, e.g.\n"
        "  python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch numpy safetensors\n"
        "and run this script with ~/.venvs/torch/bin/python."
    )

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from dlrm_ref import DLRMDCN, DLRMNet  # noqa: E402

# dlrm notation: bottom includes the input size; top lists output sizes (input follows from the
# interaction). Add a preset here and to `ember bench model` alike. (bench/torch_serve_dlrm.py
# imports these two.)
PRESETS = {
    "rm1": dict(bottom=[2048, 256, 64], tables=32, rows=500_000, dim=64, pooling=80, top=[768, 384, 1]),
    "small": dict(bottom=[2048, 256, 64], tables=8, rows=10_000, dim=64, pooling=80, top=[768, 384, 1]),
}
# TorchRec DLRM_DCN presets: the tables (rows, dim, multi-hot size) come from the CSV.
DCN_PRESETS = {
    "dlrm-v2": dict(dense_in=13, bottom=[512, 256, 128], tables_csv="data/tables/mlperf_dlrm_dcnv2_tables.csv",
                    dcn_layers=3, dcn_rank=512, top=[1024, 1024, 512, 256, 1], max_rows=200_000),
}
# MLPerf DLRM-v2's query sizes (the 5% quantiles), as `ember bench model --batch-sizes mlperf`.
MLPERF_QUERY_SIZES = [100, 100] + [200] * 12 + [300, 300, 400, 500, 600, 700]
TORCH_MODES = ("fp32", "bf16", "compile-bf16")
POOL_BYTES = 512 << 20  # cap on pre-generated batches


def build_model(p, seed=0):
    n = p["tables"] + 1
    num_int = p["dim"] + n * (n - 1) // 2
    return DLRMNet(p["dim"], [p["rows"]] * p["tables"], p["bottom"], [num_int] + p["top"], "dot", False, seed).eval()


def read_tables(path):
    """A tables CSV (table,rows,dim,pooling_factor; '#' comments) -> [(rows, dim, pooling)]."""
    out = []
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            if line.startswith("#") or line.startswith("table,") or not line.strip():
                continue
            _, rows, dim, pooling = line.strip().split(",")
            out.append((int(rows), int(dim), int(pooling)))
    return out


def sized_rows(rows, scale, cap):
    """A table's rows as `ember bench model` sizes them: scaled, rounded up, then capped."""
    r = max(1, math.ceil(rows * scale))
    return min(r, cap) if cap else r


def shape_of(a):
    """The preset's shape as both sides build it: rows, pooling per feature, dims, a builder."""
    if a.preset in PRESETS:
        p = PRESETS[a.preset]
        cap = a.max_rows
        rows = [sized_rows(p["rows"], a.rows_scale, cap)] * p["tables"]
        pooling = [p["pooling"]] * p["tables"]
        dim, dense_in = p["dim"], p["bottom"][0]
        n = p["tables"] + 1

        def build(rows, seed=0):
            return DLRMNet(dim, rows, p["bottom"], [dim + n * (n - 1) // 2] + p["top"], "dot", False, seed).eval()
    else:
        p = DCN_PRESETS[a.preset]
        cap = p["max_rows"] if a.max_rows is None else a.max_rows
        tables = read_tables(p["tables_csv"])
        rows = [sized_rows(r, a.rows_scale, cap) for r, _, _ in tables]
        pooling = [k for _, _, k in tables]
        dim, dense_in = tables[0][1], p["dense_in"]

        def build(rows, seed=0):
            return DLRMDCN(dense_in, rows, dim, p["bottom"], p["top"], p["dcn_layers"], p["dcn_rank"], seed=seed).eval()
    if a.pooling is not None:
        pooling = [a.pooling] * len(pooling)
    return dict(rows=rows, pooling=pooling, dim=dim, dense_in=dense_in, build=build, max_rows=cap or None)


def make_batches(shape, sizes, count, ids_dtype, seed=1, pin=False):
    """`count` batches (dense, offsets, ids), batch i of sizes[i % len(sizes)] samples."""
    gen = torch.Generator().manual_seed(seed)
    offsets = {}
    out = []
    for i in range(count):
        b = sizes[i % len(sizes)]
        dense = torch.rand(b, shape["dense_in"], generator=gen)
        offs, ids = [], []
        for rows, k in zip(shape["rows"], shape["pooling"]):
            if (b, k) not in offsets:
                offsets[b, k] = torch.arange(0, b * k, k, dtype=ids_dtype)
            offs.append(offsets[b, k])
            ids.append(torch.randint(0, rows, (b * k,), generator=gen, dtype=torch.int64).to(ids_dtype))
        if pin:
            dense, offs, ids = dense.pin_memory(), [o.pin_memory() for o in offs], [x.pin_memory() for x in ids]
        out.append((dense, offs, ids))
    return out


def mode_context(mode, device):
    """The context a PyTorch mode runs its batches in."""
    if mode == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=torch.bfloat16)


def run_torch(model, batches, warmup, iters, mode, device):
    times, samples = [], 0
    cuda = device == "cuda"
    with torch.inference_mode(), mode_context(mode, device):
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
                samples += dense.shape[0]
    return summarize(times, samples)


def summarize(times, samples):
    ms = np.array(times) * 1e3
    return {"samples_per_s": samples / (ms.sum() / 1e3),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def compile_model(model, batches, sizes, device):
    """torch.compile(model), compiled on one batch of each size: (module, seconds) or (None, why)."""
    first = {}
    for i, b in enumerate(batches):
        first.setdefault(sizes[i % len(sizes)], b)
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(model)
        with torch.inference_mode(), mode_context("compile-bf16", device):
            for dense, offs, ids in first.values():
                if device == "cuda":
                    dense, offs, ids = dense.cuda(), [o.cuda() for o in offs], [x.cuda() for x in ids]
                compiled(dense, offs, ids)
    except Exception as e:  # noqa: BLE001 - any compiler failure is reported, not fatal
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        return None, f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]
    return compiled, time.perf_counter() - t0


class EmberFailed(Exception):
    """An Ember run that exited with an error; the message is its command and output."""


def ember_command(a, extra=()):
    cmd = [a.ember, "bench", "model", "--preset", a.preset, "--threads", str(a.threads),
           "--warmup", str(a.warmup), "--iters", str(a.iters), "--json"]
    cmd += ["--batch-sizes", "mlperf"] if a.batch == "mlperf" else ["--batch", str(a.batch)]
    if a.max_rows is not None:
        cmd += ["--max-rows", str(a.max_rows)]
    if a.rows_scale != 1.0:
        cmd += ["--rows-scale", repr(a.rows_scale)]
    if a.pooling is not None:
        cmd += ["--pooling", str(a.pooling)]
    if a.device == "cuda":
        cmd += ["--device", "cuda", "--gpu-variant", a.gpu_variant]
    for more in a.ember_args:
        cmd += shlex.split(more)
    return cmd + list(extra)


def run_ember(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmberFailed(f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{(proc.stderr + proc.stdout).strip()}")
    lines = proc.stdout.strip().splitlines()
    try:
        res = json.loads(lines[-1])
        missing = [k for k in ("samples_per_s", "p50_ms", "p99_ms") if k not in res]
    except (IndexError, json.JSONDecodeError):
        res, missing = None, ["a JSON last line"]
    if missing:
        raise EmberFailed(f"`{' '.join(cmd)}` printed no {', '.join(missing)}:\n{proc.stdout}")
    return res, "\n".join(lines[:-1])


def check_same_shape(a, shape, sizes, res):
    """Exits when Ember's run is not the shape this script runs (a preset changed on one side)."""
    pooling = shape["pooling"]
    want = {"pooling": pooling[0] if len(set(pooling)) == 1 else pooling}
    if a.batch == "mlperf":
        want["batch_sizes"] = sizes
    else:
        want["batch"] = sizes[0]
    if "table_rows" in res:
        want["table_rows"] = sum(shape["rows"])
    elif res.get("dtype", "f32") == "f32":
        want["table_bytes"] = sum(shape["rows"]) * shape["dim"] * 4
    off = {k: (res[k], v) for k, v in want.items() if k in res and res[k] != v}
    if off:
        sys.exit(f"ember's {a.preset} differs from this script's (ember, here): {off}")


def show(title, rows):
    print(f"{title:<24}{'samples/s':>12}{'p50 ms':>10}{'p99 ms':>10}")
    for name, r in rows:
        print(f"  {name:<22}{r['samples_per_s']:>12.1f}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}")


def med(runs):
    return {k: statistics.median(r[k] for r in runs) for k in ("samples_per_s", "p50_ms", "p99_ms")}


# ---------------------------------------------------------------------------------------------
# --check: the PyTorch model against Ember's f32 scores


def widen(model, gen):
    """Redraws the weights wider than TorchRec's initialisation (He-normal MLPs, biases N(0, 0.1),
    tables uniform in +-0.1), so that activations keep their scale through every layer."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0, (2 / m.in_features) ** 0.5, generator=gen)
                m.bias.normal_(0, 0.1, generator=gen)
            elif isinstance(m, torch.nn.EmbeddingBag):
                m.weight.uniform_(-0.1, 0.1, generator=gen)
        for b in model.inter_arch.crossnet.bias:
            b.normal_(0, 0.1, generator=gen)


def check_inputs(shape, n, gen):
    """n samples: dense N(0, 1), each bag 0 to twice its feature's multi-hot size uniform ids."""
    dense = torch.randn(n, shape["dense_in"], generator=gen)
    lengths = torch.stack([torch.randint(0, 2 * k + 1, (n,), generator=gen) for k in shape["pooling"]])
    ids = [torch.randint(0, r, (int(ln.sum()),), generator=gen) for r, ln in zip(shape["rows"], lengths)]
    return dense, lengths, ids


def run_check(a, shape):
    import export_torch
    from dlrm_ref import split_batch, to_kjt, torchrec_classes

    if a.preset not in DCN_PRESETS:
        sys.exit("--check is for the DLRM_DCN presets (dlrm-v2); rm1 and small are checked by tools/check_auc.py")
    rows = [min(r, a.check_rows) for r in shape["rows"]]
    shape = dict(shape, rows=rows)
    gen = torch.Generator().manual_seed(11)
    model = shape["build"](rows, seed=5)
    widen(model, gen)
    dense, lengths, ids = check_inputs(shape, a.check_samples, gen)
    offs, idx = split_batch(lengths, torch.cat(ids))
    # Scale the last layer so that the logits of these samples have mean 0 and std 2.
    with torch.inference_mode():
        z = model.logits(dense, offs, idx)[:, 0]
    last = model.over_arch.model[1]
    k = 2.0 / float(z.std())
    with torch.no_grad():
        last.weight.mul_(k)
        last.bias.sub_(float(z.mean())).mul_(k)
    with torch.inference_mode():
        torch_scores = model(dense, offs, idx)[:, 0].double().numpy()
        f64 = copy.deepcopy(model).double()
        ref = f64(dense.double(), offs, idx)[:, 0].numpy()
    names = list(model.sparse_arch.embedding_bag_collection.embedding_bags.keys())
    torchrec_diff = None
    try:
        c = torchrec_classes()
    except ImportError as e:
        torchrec_note = f"torchrec does not import ({e}); the real DLRM_DCN was not compared"
    else:
        ebc = c.EmbeddingBagCollection(tables=[
            c.EmbeddingBagConfig(name=t, embedding_dim=shape["dim"], num_embeddings=r, feature_names=[t])
            for t, r in zip(names, rows)])
        p = DCN_PRESETS[a.preset]
        real = c.DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=shape["dense_in"],
                          dense_arch_layer_sizes=p["bottom"], over_arch_layer_sizes=p["top"],
                          dcn_num_layers=p["dcn_layers"], dcn_low_rank_dim=p["dcn_rank"]).eval()
        real.load_state_dict(model.state_dict(), strict=True)
        with torch.inference_mode():
            real_scores = torch.sigmoid(real(dense, to_kjt(names, lengths, torch.cat(ids))))[:, 0].double().numpy()
        torchrec_diff = float(np.abs(real_scores - torch_scores).max())
        torchrec_note = f"real TorchRec DLRM_DCN (same state_dict) vs this script's: max |diff| {torchrec_diff:.3g}"
    with tempfile.TemporaryDirectory(prefix="ember-check-") as tmp:
        cfg, tensors = export_torch.export_torchrec(model.state_dict())
        export_torch.write_model(os.path.join(tmp, "model"), cfg, tensors)
        arrays = {"dense": dense.numpy()}
        for t, ln, x in zip(names, lengths, ids):
            arrays[f"{t}_lengths"] = ln.numpy()
            arrays[f"{t}_ids"] = x.numpy()
        np.savez(os.path.join(tmp, "inputs.npz"), **arrays)
        out = os.path.join(tmp, "scores.txt")
        cmd = [a.ember, "predict", "--model", os.path.join(tmp, "model"), "--data", os.path.join(tmp, "inputs.npz"),
               "--out", out, "--threads", str(a.threads), "--batch", "128"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        ember_scores = np.loadtxt(out, dtype=np.float64)
    if ember_scores.shape != torch_scores.shape:
        sys.exit(f"ember predict wrote {ember_scores.shape[0]} scores for {torch_scores.shape[0]} samples")
    diff = float(np.abs(ember_scores - torch_scores).max())
    result = {
        "samples": a.check_samples, "rows_per_table": a.check_rows, "ids": int(lengths.sum()),
        "score_min": float(torch_scores.min()), "score_max": float(torch_scores.max()),
        "max_abs_diff_torchrec_torch": torchrec_diff,
    }
    print(f"--check {a.preset}: {a.check_samples} samples ({result['ids']} ids), tables of at most {a.check_rows} rows, "
          f"scores {result['score_min']:.3f} to {result['score_max']:.3f}")
    for key, what, x, y in [("ember_torch", "ember predict vs PyTorch f32:  ", ember_scores, torch_scores),
                            ("ember_f64", "ember vs PyTorch float64:      ", ember_scores, ref),
                            ("torch_f64", "PyTorch f32 vs PyTorch float64:", torch_scores, ref)]:
        d = np.abs(x - y)
        result[f"max_abs_diff_{key}"], result[f"mean_abs_diff_{key}"] = float(d.max()), float(d.mean())
        print(f"  {what} max |score diff| {d.max():.3g}, mean {d.mean():.3g}")
    print(f"  {torchrec_note}")
    if a.json:
        print(json.dumps(result))
    if diff > 1e-4 or (torchrec_diff is not None and torchrec_diff > 1e-6):
        sys.exit("--check failed: the scores differ by more than 1e-4 (Ember) or 1e-6 (TorchRec)")


# ---------------------------------------------------------------------------------------------


def batch_arg(text):
    if text == "mlperf":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a batch size (a number, or mlperf)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--batch {n}: a batch has at least 1 sample")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS) + sorted(DCN_PRESETS), default="rm1",
                    help="model shape (default rm1)")
    ap.add_argument("--batch", type=batch_arg, default=64,
                    help="samples per batch, or mlperf: MLPerf's query sizes, cycled (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="threads for both sides (default 1)")
    ap.add_argument("--iters", type=int, default=300, help="timed batches per round (default 300)")
    ap.add_argument("--warmup", type=int, help="untimed batches before them (default 30; dlrm-v2: 3)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"), help="ember binary")
    ap.add_argument("--ids-dtype", choices=["int64", "int32"], default="int64",
                    help="PyTorch offsets/ids dtype (default int64, as dlrm)")
    ap.add_argument("--max-rows", type=int,
                    help="cap on each table's rows, both sides, 0 for none (default: dlrm-v2 200000, rm1/small none)")
    ap.add_argument("--rows-scale", type=float, default=1.0, help="multiply every table's rows, both sides")
    ap.add_argument("--pooling", type=int, help="ids per bag of every feature, both sides (default: the preset's)")
    ap.add_argument("--torch-modes",
                    help=f"PyTorch modes, comma-separated from {','.join(TORCH_MODES)} "
                         "(default: all three for dlrm-v2, fp32 for rm1 and small)")
    ap.add_argument("--ember-dense",
                    help="Ember dense dtypes to run, comma-separated (e.g. f32,bf16,int8): one run each per "
                         "round with --dense-dtype X (default: one run without the flag)")
    ap.add_argument("--ember-args", action="append", default=[],
                    help="more flags for every Ember run, shell-quoted (repeatable); a lone flag as "
                         "--ember-args=--flag")
    ap.add_argument("--torch-only", action="store_true", help="run the PyTorch side alone")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides run (default cpu)")
    ap.add_argument("--gpu-variant", default="tuned", help="ember's GPU embedding variant (default tuned)")
    ap.add_argument("--check", action="store_true",
                    help="compare the PyTorch model's scores with `ember predict` on its export, then exit")
    ap.add_argument("--check-rows", type=int, default=1000, help="--check: rows per table at most (default 1000)")
    ap.add_argument("--check-samples", type=int, default=300, help="--check: samples scored (default 300)")
    ap.add_argument("--json", action="store_true", help="print a final JSON line")
    a = ap.parse_args()
    if a.warmup is None:
        a.warmup = 3 if a.preset in DCN_PRESETS else 30
    if a.rows_scale <= 0 or not math.isfinite(a.rows_scale):
        ap.error(f"--rows-scale {a.rows_scale}: expected a positive number")
    modes = (a.torch_modes or ("fp32,bf16,compile-bf16" if a.preset in DCN_PRESETS else "fp32")).split(",")
    bad = [m for m in modes if m not in TORCH_MODES]
    if bad:
        ap.error(f"--torch-modes: unknown {', '.join(bad)} (known: {', '.join(TORCH_MODES)})")
    if not a.torch_only or a.check:
        if not os.path.exists(a.ember):
            sys.exit(f"{a.ember} not found: build it with `cargo build --release -p ember-cli` (or pass --ember)")
        if subprocess.run([a.ember, "bench", "model", "--help"], capture_output=True).returncode != 0:
            sys.exit(f"{a.ember} has no `bench model` command: rebuild it, or use --torch-only")

    torch.set_num_threads(a.threads)
    shape = shape_of(a)
    if a.check:
        return run_check(a, shape)
    sizes = MLPERF_QUERY_SIZES if a.batch == "mlperf" else [a.batch]
    print(f"building the PyTorch model ({a.preset}: {len(shape['rows'])} tables, {sum(shape['rows'])} rows, "
          f"dim {shape['dim']}) ...", file=sys.stderr, flush=True)
    model = shape["build"](shape["rows"])
    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("--device cuda: PyTorch sees no CUDA device")
        model = model.cuda()
    ids_dtype = torch.int32 if a.ids_dtype == "int32" else torch.int64
    mean_batch = sum(sizes) / len(sizes)
    per_batch = mean_batch * (sum(shape["pooling"]) * ids_dtype.itemsize + shape["dense_in"] * 4)
    count = max(1, min(a.warmup + a.iters, int(POOL_BYTES // per_batch)))
    count = max(len(sizes), count // len(sizes) * len(sizes))  # whole cycles of the sizes
    batches = make_batches(shape, sizes, count, ids_dtype, pin=cuda)

    runnable, failed = {}, {}
    for mode in modes:
        if mode == "compile-bf16":
            print("compiling the PyTorch model (torch.compile, bf16 autocast) ...", file=sys.stderr, flush=True)
            compiled, how = compile_model(model, batches, sizes, a.device)
            if compiled is None:
                failed[f"pytorch {mode}"] = f"torch.compile failed: {how}"
                print(f"pytorch {mode}: torch.compile failed: {how}", file=sys.stderr)
                continue
            print(f"  compiled in {how:.1f}s", file=sys.stderr)
            runnable[mode] = compiled
        else:
            runnable[mode] = model
    configs = []
    if not a.torch_only:
        if a.ember_dense:
            configs = [(f"ember {d}", ["--dense-dtype", d]) for d in a.ember_dense.split(",")]
        else:
            configs = [("ember", [])]

    ember_runs = {name: [] for name, _ in configs}
    torch_runs = {m: [] for m in runnable}
    for rnd in range(a.rounds):
        rows = []
        for name, extra in configs:
            if name in failed:
                continue
            print(f"[round {rnd + 1}/{a.rounds}] {name} ...", file=sys.stderr, flush=True)
            try:
                res, text = run_ember(ember_command(a, extra))
            except EmberFailed as e:
                failed[name] = str(e)
                print(f"{name} failed, left out:\n{e}", file=sys.stderr)
                continue
            check_same_shape(a, shape, sizes, res)
            if rnd == 0 and text:
                print(text)
            ember_runs[name].append(res)
            rows.append((name, res))
        for mode, m in runnable.items():
            print(f"[round {rnd + 1}/{a.rounds}] pytorch {mode} ...", file=sys.stderr, flush=True)
            torch_runs[mode].append(run_torch(m, batches, a.warmup, a.iters, mode, a.device))
            rows.append((f"pytorch {mode}", torch_runs[mode][-1]))
        show(f"round {rnd + 1}/{a.rounds}", rows)

    batch_text = "MLPerf query sizes (mean 270)" if a.batch == "mlperf" else f"batch {a.batch}"
    summary = {"preset": a.preset, "device": a.device, "batch": a.batch, "batch_sizes": sizes, "threads": a.threads,
               "iters": a.iters, "warmup": a.warmup, "rounds": a.rounds, "ids_dtype": a.ids_dtype,
               "max_rows": shape["max_rows"], "table_rows": sum(shape["rows"]), "torch_version": torch.__version__,
               "failed": failed}
    print()
    print(f"medians of {a.rounds} rounds: {a.preset}, {batch_text}, {a.threads} threads, {a.iters} batches "
          f"after {a.warmup} warm-up, torch {torch.__version__} ({a.ids_dtype} ids)")
    t = {m: med(r) for m, r in torch_runs.items() if r}
    e = {name: med(r) for name, r in ember_runs.items() if r}
    show("", [(name, r) for name, r in e.items()] + [(f"pytorch {m}", r) for m, r in t.items()])
    if t:
        best = max(t, key=lambda m: t[m]["samples_per_s"])
        summary.update(torch=t[best], torch_best_mode=best, torch_modes=t, torch_rounds=torch_runs)
        if len(t) > 1:
            print(f"  pytorch's best: {best} ({t[best]['samples_per_s']:.1f} samples/s)")
        for name, r in e.items():
            if len(t) == 1 and len(e) == 1:
                print(f"  ember / pytorch samples/s: {r['samples_per_s'] / t[best]['samples_per_s']:.2f}x    "
                      f"ember p99 / pytorch p99: {r['p99_ms'] / t[best]['p99_ms']:.2f}")
                continue
            print(f"  {name} / pytorch's best ({best}) samples/s: {r['samples_per_s'] / t[best]['samples_per_s']:.2f}x"
                  f"    p99 / its p99: {r['p99_ms'] / t[best]['p99_ms']:.2f}"
                  + (f"    vs pytorch fp32: {r['samples_per_s'] / t['fp32']['samples_per_s']:.2f}x"
                     if "fp32" in t and best != "fp32" else ""))
        if e:
            first = next(iter(e))
            summary.update(ember=e[first], ember_configs=e, ember_rounds=ember_runs,
                           samples_ratio=e[first]["samples_per_s"] / t[best]["samples_per_s"],
                           p99_ratio=e[first]["p99_ms"] / t[best]["p99_ms"],
                           ratios={n: r["samples_per_s"] / t[best]["samples_per_s"] for n, r in e.items()})
    for name, why in failed.items():
        lines = [ln.strip() for ln in why.splitlines() if ln.strip()]
        print(f"  {name}: failed: {next((ln for ln in lines if ln.startswith('error')), lines[-1] if lines else '')}")
    if a.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
