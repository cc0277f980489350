#!/usr/bin/env python3
"""HSTU (MLPerf DLRMv3) on one GPU: Ember against Meta's reference model, the same weights, users and GPU.

    python3 bench/gpu/compare_hstu_gpu.py --ember .gpu/ember --model /tmp/dlrmv3 \
        --cells 1024:512,4096:2048 --users-per-batch 1,8 --json out.json

--model: an Ember HSTU model directory (`ember data model --preset dlrm-v3 --rows-scale R --dtype f16
--out DIR`: MLPerf DLRMv3's dims, random weights, tables scaled by R). The reference reads the same
directory through tools/hstu_ref.py's `load_ember` (generative-recommenders' `DlrmHSTU`, imported
from $GR_ROOT; torchrec importable; fbgemm_gpu optional: its ops get plain-PyTorch versions).

Users: tools of bench/compare_torch_hstu.py (`make_users`): exactly H history actions and C
candidates each, in the shape of dlrm_v3's streaming data, --distinct of them per cell, cycled.

Peers (the reference on the GPU, one forward pass per batch of B users, inputs on the device ahead,
torch.inference_mode, torch.cuda.synchronize after each pass):
  triton       the reference's Triton kernels (HammerKernel.TRITON on every module: HSTU attention,
               layer norms, addmm, position encoder), under torch.autocast(bfloat16)
  triton-fp32  the same in float32
  pytorch      the reference's PyTorch kernels under torch.autocast(bfloat16)
A peer that fails (an import, a kernel that does not compile for this GPU) is reported and skipped.
Ember: `ember bench model --device cuda --model DIR --users FILE --users-per-batch B --dense-dtype
bf16 --json` (its last stdout line), and f32 with --ember-dtypes bf16,f32; bf16-v2 is bf16 with the second
attention kernel (EMBER_HSTU_ATTENTION=v2); the ratio takes Ember's faster bf16 kernel.

Per (cell, B): --rounds rounds of each peer and Ember; reported: the median over rounds of users/s
(samples/s) and of the p99 of a pass. Accuracy check (first cell): the reference's float32 scores
(PyTorch kernels, each user alone) against `ember predict --device cuda` in f32 and bf16.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def write_users(path, users):
    with open(path, "w") as f:
        for u in users:
            f.write(json.dumps(u) + "\n")


class Reference:
    def __init__(self, model_dir):
        import torch
        import hstu_ref

        self.torch, self.ref = torch, hstu_ref
        t0 = time.time()
        self.model = hstu_ref.load_ember(model_dir)
        r = hstu_ref.ref()
        self.kernels = r.HammerKernel
        self.model = self.model.cuda().eval()
        ec = self.model._embedding_collection
        if hasattr(ec, "_device"):
            ec._device = torch.device("cuda")
        self.load_s = time.time() - t0
        self.kernel = None

    def cut_autotune(self, keep):
        """Cuts every autotuned Triton kernel of the reference to `keep` configs: its smallest,
        largest and middle ones by block size x warps (the full lists take minutes to tune per
        shape, more than a device lease holds). Returns how many kernels were cut."""
        from triton.runtime.autotuner import Autotuner

        def size(c):
            blocks = 1
            for k, v in c.kwargs.items():
                if k.startswith("BLOCK") and isinstance(v, int):
                    blocks *= v
            return (blocks, c.num_warps, c.num_stages)

        cut = 0
        for name, mod in list(sys.modules.items()):
            if not name.startswith("generative_recommenders.ops.triton") or mod is None:
                continue
            for obj in list(vars(mod).values()):
                while obj is not None:
                    if isinstance(obj, Autotuner) and len(obj.configs) > keep:
                        cs = sorted(obj.configs, key=size)
                        picks = sorted({0, len(cs) - 1, len(cs) // 2} | set(range(max(0, keep - 3))))
                        obj.configs = [cs[i] for i in picks][:keep]
                        cut += 1
                    obj = getattr(obj, "fn", None)
        return cut

    def set_kernel(self, name):
        k = {"triton": self.kernels.TRITON, "pytorch": self.kernels.PYTORCH}[name]
        self.model.recursive_setattr("_hammer_kernel", k)
        self.kernel = name

    def inputs(self, users):
        uih, cand = self.ref.batch(self.model, users)
        return uih.to("cuda"), cand.to("cuda")

    def forward(self, x, bf16):
        torch = self.torch
        if bf16:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return self.model(uih_features=x[0], candidates_features=x[1])[3]
        return self.model(uih_features=x[0], candidates_features=x[1])[3]

    def time(self, batches, bf16, warmup, iters):
        torch = self.torch
        with torch.inference_mode():
            for i in range(warmup):
                self.forward(batches[i % len(batches)], bf16)
            torch.cuda.synchronize()
            lat = []
            t0 = time.perf_counter()
            for i in range(iters):
                t = time.perf_counter()
                self.forward(batches[i % len(batches)], bf16)
                torch.cuda.synchronize()
                lat.append((time.perf_counter() - t) * 1e3)
            wall = time.perf_counter() - t0
        return lat, wall

    def scores(self, users):
        torch = self.torch
        self.set_kernel("pytorch")
        out = []
        with torch.inference_mode():
            for u in users:
                p = self.forward(self.inputs([u]), False).float()
                if p.dim() == 1:
                    p = p.view(1, -1)
                out.append(p.cpu())
        return out


def ember_env(name):
    """(dense dtype, environment) of an --ember-dtypes entry: `bf16-v2` is bf16 with the second
    attention kernel (EMBER_HSTU_ATTENTION=v2)."""
    dtype, _, kernel = name.partition("-")
    env = dict(os.environ)
    if kernel:
        env["EMBER_HSTU_ATTENTION"] = kernel
    return dtype, env


def ember_bench(a, users_path, upb, name, iters, warmup):
    dtype, env = ember_env(name)
    cmd = [a.ember, "bench", "model", "--device", "cuda", "--gpu-variant", a.gpu_variant, "--model", a.model,
           "--users", users_path, "--users-per-batch", str(upb), "--dense-dtype", dtype, "--iters", str(iters),
           "--warmup", str(warmup), "--threads", str(a.threads), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.step_timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc {p.returncode}\n{p.stderr[-3000:]}")
    log("    " + "\n    ".join(l for l in p.stderr.splitlines() if l.strip())[-1500:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def accuracy(a, ref, users, path):
    import numpy as np

    want = ref.scores(users)
    res = {}
    for name in a.ember_dtypes:
        dtype, env = ember_env(name)
        out = os.path.join(a.work, f"scores_{name}.jsonl")
        cmd = [a.ember, "predict", "--device", "cuda", "--gpu-variant", a.gpu_variant, "--model", a.model,
               "--data", path, "--out", out, "--dense-dtype", dtype, "--batch", "1", "--attention-norm", "alone"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.step_timeout, env=env)
        if p.returncode != 0:
            res[name] = {"error": p.stderr[-2000:]}
            continue
        got = [json.loads(l)["scores"] for l in open(out)]
        worst = 0.0
        for g, w in zip(got, want):
            for t, task in enumerate(g):
                worst = max(worst, float(np.max(np.abs(np.array(g[task]) - w[t].numpy()))))
        res[name] = {"max_abs_diff_vs_reference_fp32": worst}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cells", default="1024:512,4096:2048")
    ap.add_argument("--users-per-batch", default="1,8")
    ap.add_argument("--peers", default="triton,pytorch")
    ap.add_argument("--ember-dtypes", default="bf16",
                    help="Ember's runs: bf16, f32, bf16-v2 (bf16 with the second attention kernel)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--distinct", type=int, default=16)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--gpu-variant", default="prefetch")
    ap.add_argument("--step-timeout", type=int, default=300)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--triton-configs", type=int, default=3,
                    help="autotune configs kept per Triton kernel of the reference (0: all)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    a.ember_dtypes = a.ember_dtypes.split(",")
    a.work = a.work or tempfile.mkdtemp(prefix="hstu_gpu_")
    os.makedirs(a.work, exist_ok=True)
    cells = [tuple(int(x) for x in c.split(":")) for c in a.cells.split(",")]
    upbs = [int(x) for x in a.users_per_batch.split(",")]
    peers = a.peers.split(",")

    import compare_torch_hstu as cth
    import torch

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    rows = {t["name"]: t["rows"] for t in cfg["tables"]}
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "model": a.model,
              "tables": {t["name"]: [t["rows"], t["dim"], t["dtype"]] for t in cfg["tables"]}, "cells": []}
    try:
        import triton
        result["triton"] = triton.__version__
    except Exception as e:
        result["triton"] = f"not importable: {e}"
    ref = None
    try:
        ref = Reference(a.model)
        log(f"reference loaded in {ref.load_s:.1f}s")
        if a.triton_configs > 0 and any(p.startswith("triton") for p in peers):
            result["triton_autotune_cut"] = {"kept": a.triton_configs, "kernels": ref.cut_autotune(a.triton_configs)}
            log(f"triton autotune: {result['triton_autotune_cut']}")
    except Exception as e:
        traceback.print_exc()
        result["reference_error"] = f"{type(e).__name__}: {e}"
    for ci, (h, c) in enumerate(cells):
        users = cth.make_users(a.distinct, h, c, rows, a.seed + ci)
        path = os.path.join(a.work, f"users_{h}x{c}.jsonl")
        write_users(path, users)
        if ci == 0 and not a.no_check and ref is not None:
            try:
                result["accuracy"] = accuracy(a, ref, users[:4], path)
                log(f"accuracy: {result['accuracy']}")
            except Exception as e:
                traceback.print_exc()
                result["accuracy"] = {"error": f"{type(e).__name__}: {e}"}
        for upb in upbs:
            rec = {"history": h, "candidates": c, "users_per_batch": upb, "peers": {}, "ember": {}}
            batches = []
            if ref is not None:
                groups = [[users[(k * upb + j) % len(users)] for j in range(upb)] for k in range(max(1, a.distinct // upb))]
                batches = [ref.inputs(g) for g in groups]
            result["cells"].append(rec)

            def dump():
                if a.json:
                    json.dump(result, open(a.json, "w"), indent=1)

            for r in range(a.rounds):
                for dtype in a.ember_dtypes:
                    try:
                        j = ember_bench(a, path, upb, dtype, a.iters, a.warmup)
                        d = rec["ember"].setdefault(dtype, {"rounds": []})
                        d["rounds"].append({"users_per_s": j["users_per_s"], "p50_ms": j["p50_ms"],
                                            "p99_ms": j["p99_ms"], "stage_s": j.get("stage_s"),
                                            "engine": j.get("engine")})
                        print(f"{h}x{c} x{upb} ember {dtype}: {j['users_per_s']:.1f} users/s p50 {j['p50_ms']:.2f} "
                              f"p99 {j['p99_ms']:.2f} ms", flush=True)
                    except Exception as e:
                        rec["ember"][dtype] = {"error": str(e)[-1500:]}
                    dump()
                for peer in peers:
                    if ref is None or rec["peers"].get(peer, {}).get("error"):
                        continue
                    name, bf16 = {"triton": ("triton", True), "triton-fp32": ("triton", False),
                                  "pytorch": ("pytorch", True)}[peer]
                    try:
                        ref.set_kernel(name)
                        t0 = time.time()
                        lat, wall = ref.time(batches, bf16, a.warmup if r else max(a.warmup, 2), a.iters)
                        d = rec["peers"].setdefault(peer, {"rounds": []})
                        d["rounds"].append({"users_per_s": a.iters * upb / wall, "p50_ms": pct(lat, 0.5),
                                            "p99_ms": pct(lat, 0.99), "incl_warmup_s": time.time() - t0})
                        x = d["rounds"][-1]
                        print(f"{h}x{c} x{upb} ref {peer}: {x['users_per_s']:.1f} users/s p50 {x['p50_ms']:.2f} "
                              f"p99 {x['p99_ms']:.2f} ms (with warmup {x['incl_warmup_s']:.0f} s)", flush=True)
                    except Exception as e:
                        traceback.print_exc()
                        rec["peers"][peer] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
                    dump()
            for side in (rec["peers"], rec["ember"]):
                for k, d in side.items():
                    if "rounds" in d:
                        for f in ("users_per_s", "p50_ms", "p99_ms"):
                            d[f] = statistics.median(x[f] for x in d["rounds"])
            best = max((d for d in rec["peers"].values() if "users_per_s" in d),
                       key=lambda d: d["users_per_s"], default=None)
            # Ember's best bf16 kernel (bf16, bf16-v2), else whatever ran.
            e = max((d for k, d in rec["ember"].items() if k.startswith("bf16") and "users_per_s" in d),
                    key=lambda d: d["users_per_s"], default=None) or next(iter(rec["ember"].values()), None)
            if best and e and "users_per_s" in e:
                rec["ratio_users_per_s"] = e["users_per_s"] / best["users_per_s"]
                rec["ratio_p99"] = best["p99_ms"] / e["p99_ms"]
            line = f"{h}x{c}, {upb} users a pass:"
            for k, d in rec["peers"].items():
                line += f"  ref {k}: " + (f"{d['users_per_s']:.1f} users/s p99 {d['p99_ms']:.2f} ms" if "users_per_s" in d else d.get("error", "?")[:200])
            for k, d in rec["ember"].items():
                line += f"  ember {k}: " + (f"{d['users_per_s']:.1f} users/s p99 {d['p99_ms']:.2f} ms" if "users_per_s" in d else d.get("error", "?")[:300])
            if "ratio_users_per_s" in rec:
                line += f"  ratio (ember / best ref) {rec['ratio_users_per_s']:.2f}x, p99 {rec['ratio_p99']:.2f}x"
            print(line, flush=True)
            dump()
    if a.json:
        json.dump(result, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
