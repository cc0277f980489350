#!/usr/bin/env python3
"""Meta's HSTU ranking model (MLPerf DLRMv3), Ember against the PyTorch reference, one user at a time.

    ~/.venvs/hstu/bin/python bench/compare_torch_hstu.py --quick              # 256x64 and 1024x512, 4 users, 1 round
    ~/.venvs/hstu/bin/python bench/compare_torch_hstu.py                      # the issue's 4 cells, 8 users, 3 rounds
    ~/.venvs/hstu/bin/python bench/compare_torch_hstu.py --cells 4096:2048 --threads 2 --json out.json
    ~/.venvs/hstu/bin/python bench/compare_torch_hstu.py --torch-only --peers fp32,compile   # PyTorch alone

The model: generative-recommenders' `DlrmHSTU` (tools/hstu_ref.py imports it from /work/gr, or
$GR_ROOT, on a CPU) at the MLPerf DLRMv3 dims of dlrm_v3/configs.py's get_hstu_configs("streaming-..."):
5 STU layers, 4 heads, attention linear / qk dims 128 / 128, table dim 512, model dim 512,
preprocessor hidden 256, the "streaming" feature layout (item_id / user_id / item_category_id tables,
user_id contextual, action weights [1, 2, 4, 8, 16], one binary task "rating"), 8192 position buckets,
2048 time buckets. The tables' real sizes (1e9 / 10M / 128 rows) are scaled by --rows-scale (default
1e-4) with a floor of --min-rows (4096) rows, never above the real size: 100,000 / 4096 / 128 rows.
Weights are random from --seed (tools/hstu_fixtures.py's `randomize`, the prediction head rescaled on
8 calibration users so that the logits spread over about +-2.5), the tables rounded to float16.
They are saved as STATE.pt + CONFIG.json in --work and exported once with
`tools/export_torch.py --from generative-recommenders ... --dtype f16 --time-bucket-clamp triton`
(MLPerf's item table is FP16; MLPerf's published runs use the reference's Triton kernels).

Users (one users.jsonl per cell, Ember's format, every feature of hstu_uih_feature_names /
hstu_candidate_feature_names): exactly H history actions and C candidates each, in the shape of
dlrm_v3's streaming data: uniform item ids, categories and user ids, ratings 1-5, history action
weights random bitmasks over [1, 2, 4, 8, 16], increasing timestamps over at most 120 days, the
candidates' one query time at or after the last action, candidate action weights int(rating >= 3.5)
as dlrm_v3's loader sets them (the model zeroes them at inference anyway). The time gaps stay below
the reference's PyTorch position kernel's clamp (time bucket 511, i.e. 181 days), so the PyTorch
peers (PyTorch kernels) and Ember (Triton clamp, 2048) compute the same function; --check shows it.

PyTorch peers, one user per forward pass (a batch of one, KeyedJaggedTensors built ahead by
dlrm_v3's collate and not timed), `torch.inference_mode()`, `torch.set_num_threads(T)`:
  fp32     eager, float32
  bf16     eager under `torch.autocast("cpu", dtype=torch.bfloat16)`
  compile  `torch.compile(model, dynamic=False)` (Inductor, float32), with dynamo's
           capture_scalar_outputs and capture_dynamic_output_shape_ops on and fake (meta) kernels
           registered for the fbgemm ops hstu_ref replaces with plain PyTorch (fbgemm_gpu registers
           its own): the whole forward pass is then one graph. `--compile-graph-breaks` compiles with
           dynamo's defaults instead (at MLPerf dims, 256x64: 45 graph breaks, 48 graphs; without
           the fake kernels 99 / 93); if the capturing compile fails, that is the fallback, noted.
           `--compile-freezing` adds torch._inductor.config.freezing. Compiled once per (cell,
           thread count), every user of the cell run once before the timing: Inductor's CPU kernels
           bake in torch.get_num_threads(), so the dynamo cache is reset when either changes. A
           compile that fails is reported and the other peers go on.
They run in one worker subprocess (this script, --_stage worker) started with an allocator that keeps
and reuses freed memory: MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at 20 GB (glibc: large
tensors come from the heap instead of fresh mmaps that the kernel must zero on every forward pass),
plus jemalloc through LD_PRELOAD when `ldconfig -p` lists it (--allocator auto|jemalloc|tcmalloc|glibc
|plain; `plain` is glibc with no settings, to see their effect). Measured on a 2-core Xeon (AVX-512,
no AVX512-BF16 / AMX), 1024x512, fp32 eager, 1 thread: plain ~1540 ms, raised glibc thresholds
~1050-1180 ms, jemalloc ~1050-1340 ms (a busy machine; the raised thresholds are the gain).

Ember: `ember bench model --model DIR --users FILE --threads T --dense-dtype f32|bf16 --iters N
--warmup W --json` (each user of the file scored alone, cycling through it; the last stdout line is a
JSON object with p50_ms, p99_ms, mean_ms, users_per_s, stage_s).

Each cell and thread count: --runs rounds, each round the PyTorch peers (each: --warmup users, then
every user once, --reps times) then Ember f32 and bf16 (the same --warmup and users x --reps
iterations); reported: the medians over the rounds of each round's p50 and p99 per user (p99 of a
round of 8 users is its slowest). "Ember bf16 vs PyTorch's best": best = the peer with the lowest
p50; the ratio is its p50 / Ember bf16's p50 (above 1: Ember is faster), and likewise for p99.

Accuracy side check (default on, --no-check skips it): on the smallest cell's users, the reference's
float32 scores (eager, each user alone, tables holding the exported f16 values) against
`ember predict --model DIR --data users.jsonl --out scores.jsonl --threads 1 --attention-norm alone`
(and with --dense-dtype bf16, for information); max |diff| of the f32 scores is expected near 1e-5
(measured: 2.3e-5 on 256x64; a line "CHECK FAILED" above 1e-4).

The 1-minute load average before each run is recorded, and a cell is flagged when it shows other
work on the machine. Cost, on that 2-core machine at 1 thread: a 4096x2048 user takes ~11.6 s in
fp32 eager, ~26 s under bf16 autocast (no native bf16 there), ~10 s compiled (worker peak RSS
~3.3 GB); each torch.compile takes 40-90 s (15-25 s once inductor_cache in --work holds it). --quick
runs in 7-15 minutes; the default run
(4 cells x 2 thread counts x 3 rounds x 8 users) takes hours, most of it in the 4096x2048 cell.
Files: --work holds STATE.pt, CONFIG.json, ember_model/, the users files, torch_worker.log (the
worker's stderr: tracebacks, compile warnings), check_scores_*.jsonl and inductor_cache/.
"""

import argparse
import datetime
import json
import math
import os
import platform
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")
ISSUE_CELLS = [(256, 64), (1024, 512), (4096, 512), (4096, 2048)]
QUICK_CELLS = [(256, 64), (1024, 512)]
PEERS = ("fp32", "bf16", "compile")
PEER_NAMES = {"fp32": "torch fp32 eager", "bf16": "torch bf16 autocast", "compile": "torch.compile fp32"}
STAGES = ("lookups", "preprocess", "projections", "attention", "pointwise", "head")
REPLY = "@@HSTU_WORKER "
BIG = str(20 * 1000 ** 3)  # the glibc thresholds, 20 GB
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
DAY = 86400
MAX_GAP_S = 120 * DAY  # < 511^2 * 60 s (181 days): the PyTorch position kernel's time-bucket clamp

# Real sizes of dlrm_v3's streaming tables (get_embedding_table_config("streaming-...")).
REAL_ROWS = {"item_id": 1_000_000_000, "user_id": 10_000_000, "item_category_id": 128}
TABLE_FEATURES = {"item_id": ["item_id", "item_candidate_id"], "item_category_id": ["item_category_id",
                                                                                     "item_candidate_category_id"],
                  "user_id": ["user_id"]}
UIH = ["user_id", "item_id", "item_rating", "action_timestamp", "item_weights", "dummy_watch_time", "item_category_id"]
CAND = ["item_candidate_id", "item_candidate_rating", "item_query_time", "item_action_weights", "item_dummy_watchtime",
        "item_candidate_category_id"]


class Failed(Exception):
    """A step that failed; the message says what and why."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# model config and users


def table_rows(rows_scale, min_rows):
    return {t: min(real, max(min_rows, math.ceil(real * rows_scale))) for t, real in REAL_ROWS.items()}


def mlperf_config(rows, max_seq_len, max_candidates):
    """CONFIG.json for export_torch / hstu_ref: get_hstu_configs("streaming-...") + its tables."""
    hstu = dict(
        max_seq_len=max_seq_len, max_num_candidates=32, max_num_candidates_inference=max_candidates,
        hstu_num_heads=4, hstu_attn_linear_dim=128, hstu_attn_qk_dim=128, hstu_attn_num_layers=5,
        hstu_embedding_table_dim=512, hstu_preprocessor_hidden_dim=256, hstu_transducer_embedding_dim=512,
        hstu_group_norm=False, hstu_input_dropout_ratio=0.2, hstu_linear_dropout_rate=0.1,
        causal_multitask_weights=0.2,
        contextual_feature_to_max_length={"user_id": 1}, contextual_feature_to_min_uih_length={"user_id": 20},
        candidates_weight_feature_name="item_action_weights", candidates_watchtime_feature_name="item_rating",
        candidates_querytime_feature_name="item_query_time",
        multitask_configs=[{"task_name": "rating", "task_weight": 1, "task_type": "binary_classification"}],
        user_embedding_feature_names=["item_id", "user_id", "item_category_id"],
        item_embedding_feature_names=["item_candidate_id", "item_candidate_category_id"],
        uih_post_id_feature_name="item_id", uih_action_time_feature_name="action_timestamp",
        uih_weight_feature_name="item_weights", hstu_uih_feature_names=list(UIH),
        hstu_candidate_feature_names=list(CAND),
        merge_uih_candidate_feature_mapping=[["item_id", "item_candidate_id"], ["item_rating", "item_candidate_rating"],
                                             ["action_timestamp", "item_query_time"],
                                             ["item_weights", "item_action_weights"],
                                             ["dummy_watch_time", "item_dummy_watchtime"],
                                             ["item_category_id", "item_candidate_category_id"]],
        action_weights=[1, 2, 4, 8, 16], action_embedding_init_std=5.0, enable_postprocessor=True,
        use_layer_norm_postprocessor=False,
    )
    tables = {t: {"num_embeddings": rows[t], "embedding_dim": 512, "feature_names": TABLE_FEATURES[t]}
              for t in ("item_id", "item_category_id", "user_id")}
    return {"hstu_config": hstu, "tables": tables}


def make_users(n, history, candidates, rows, seed):
    """n users of exactly `history` actions and `candidates` candidates (see the module doc)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    users = []
    for _ in range(n):
        h, c = history, candidates
        query = int(rng.integers(1_600_000_000, 1_700_000_000))
        # gaps back from the query time: a third within a day, the rest up to MAX_GAP_S; some repeated
        near = rng.uniform(0, DAY, h)
        far = rng.uniform(0, MAX_GAP_S, h)
        gaps = np.sort(np.where(rng.uniform(0, 1, h) < 1 / 3, near, far).astype(np.int64))[::-1].copy()
        same = rng.uniform(0, 1, h) < 0.05
        for k in range(1, h):
            if same[k]:
                gaps[k] = gaps[k - 1]
        last = int(rng.integers(0, 3600))  # the query comes up to an hour after the last action
        times = [query - last - int(g) for g in gaps]
        uih = {
            "user_id": [int(rng.integers(0, rows["user_id"]))],
            "item_id": rng.integers(0, rows["item_id"], h).tolist(),
            "item_rating": rng.integers(1, 6, h).tolist(),
            "action_timestamp": times,
            "item_weights": rng.integers(0, 32, h).tolist(),
            "dummy_watch_time": [0] * h,
            "item_category_id": rng.integers(0, rows["item_category_id"], h).tolist(),
        }
        ratings = rng.integers(1, 6, c)
        cand = {
            "item_candidate_id": rng.integers(0, rows["item_id"], c).tolist(),
            "item_candidate_rating": ratings.tolist(),
            "item_query_time": [query] * c,
            "item_action_weights": [int(r >= 3.5) for r in ratings],
            "item_dummy_watchtime": [1] * c,
            "item_candidate_category_id": rng.integers(0, rows["item_category_id"], c).tolist(),
        }
        users.append({"uih": {f: uih[f] for f in UIH}, "candidates": {f: cand[f] for f in CAND}})
    return users


def write_users(path, users):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for u in users:
            f.write(json.dumps(u, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------------------------
# stage "prep": random weights -> STATE.pt (subprocess, so that its memory goes away)


def stage_prep(a):
    import torch

    sys.path.insert(0, TOOLS)
    import hstu_fixtures  # noqa: F401  (sets TRITON_INTERPRET=1 for itself; unused here)
    import hstu_ref

    with open(a.config) as f:
        config = json.load(f)
    t0 = time.time()
    torch.manual_seed(a.seed)
    model = hstu_ref.build_model(config)
    hstu_fixtures.randomize(model, a.seed)
    with torch.no_grad():  # the tables as float16 holds them: both sides read the same values
        for p in model._embedding_collection.parameters():
            p.copy_(p.half().float())
    rows = {t: v["num_embeddings"] for t, v in config["tables"].items()}
    calib = make_users(8, 256, 64, rows, a.seed + 1)
    hstu_fixtures.rescale_head(model, calib)
    sd = model.state_dict()
    torch.save(sd, a.state)
    n = sum(v.numel() for k, v in sd.items() if not k.startswith("_embedding_collection."))
    log(f"  random weights (seed {a.seed}): {n / 1e6:.1f}M dense parameters, tables "
        f"{ {t: tuple(p.shape) for t, p in model._embedding_collection.embeddings.named_parameters()} } "
        f"in {time.time() - t0:.0f}s")


# ---------------------------------------------------------------------------------------------
# stage "worker": the PyTorch peers, commands as JSON lines on stdin, replies on stdout


class Worker:
    def __init__(self, a):
        import torch

        sys.path.insert(0, TOOLS)
        import hstu_ref

        self.torch = torch
        self.ref = hstu_ref
        with open(a.config) as f:
            config = json.load(f)
        t0 = time.time()
        self.model = hstu_ref.load(a.state, config)
        self.tables_note = self._load_exported_tables(a.model_dir)
        self.load_s = time.time() - t0
        self.freezing = a.compile_freezing
        self.capture = not a.compile_graph_breaks
        self.fakes = self._register_fakes()
        self.inputs = []
        self.cell = None
        self.compiled = None
        self.compiled_key = None
        self.compile_info = {}
        self.tasks = [t.task_name for t in self.model._multitask_configs]

    def _load_exported_tables(self, model_dir):
        """The exported tables' values (f16) copied into the model's float32 tables."""
        from safetensors.torch import load_file

        tensors = load_file(os.path.join(model_dir, "model.safetensors"))
        changed = 0
        with self.torch.no_grad():
            for name, p in self.model._embedding_collection.embeddings.named_parameters():
                t = tensors[f"tables.{name.split('.')[0]}"]
                if tuple(t.shape) != tuple(p.shape):
                    raise Failed(f"exported table {name}: {tuple(t.shape)} vs the model's {tuple(p.shape)}")
                v = t.float()
                changed += int(not self.torch.equal(v, p))
                p.copy_(v)
        dtypes = sorted({str(t.dtype).replace("torch.", "") for k, t in tensors.items() if k.startswith("tables.")})
        return (f"tables loaded from the export ({'/'.join(dtypes)} values as float32; "
                f"{'equal to STATE.pt' if not changed else f'{changed} differed from STATE.pt'})")

    def hello(self):
        torch = self.torch
        maps = open("/proc/self/maps").read()
        loaded = [lib for lib in ("jemalloc", "tcmalloc") if lib in maps]
        return {"torch": torch.__version__, "versions": self.ref.versions(), "load_s": self.load_s,
                "tables": self.tables_note, "malloc_loaded": loaded, "fake_kernels": self.fakes,
                "env": {k: os.environ.get(k) for k in ("LD_PRELOAD", "MALLOC_CONF", "MALLOC_MMAP_THRESHOLD_",
                                                      "MALLOC_TRIM_THRESHOLD_") if os.environ.get(k)},
                "mkldnn": torch.backends.mkldnn.is_available(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability()}

    def set_cell(self, path):
        users = read_jsonl(path)
        self.inputs = [self.ref.batch(self.model, [u]) for u in users]
        self.cell = path
        return {"users": len(users)}

    def _register_fakes(self):
        """Fake (meta) kernels for the fbgemm ops hstu_ref gives a plain-PyTorch implementation, as
        fbgemm_gpu's own library registers them: without one, dynamo graph-breaks at every call
        ("Operator does not support running with fake tensors"). Eager runs do not use them."""
        torch = self.torch

        def j2p(values, offsets, max_lengths, padding_value=0.0):
            return values.new_empty((offsets[0].shape[0] - 1, max_lengths[0]) + tuple(values.shape[1:]))

        def d2j(dense, x_offsets, total_L=None):
            if total_L is None:
                total_L = torch.library.get_ctx().new_dynamic_size()
            return dense.new_empty((total_L,) + tuple(dense.shape[2:])), [x_offsets[0].clone()]

        def cumsum(t_in):
            return t_in.new_empty((t_in.numel() + 1,))

        done = []
        for name, fn in (("jagged_to_padded_dense", j2p), ("dense_to_jagged", d2j),
                         ("asynchronous_complete_cumsum", cumsum)):
            try:
                torch.library.register_fake(f"fbgemm::{name}", fn)
                done.append(name)
            except Exception:  # a native op that has its own
                pass
        return done

    def _compile(self, capture):
        torch = self.torch
        import torch._dynamo
        import torch._inductor.config

        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        # capture: .item() and nonzero() traced into the graph (unbacked sizes) rather than breaking it
        torch._dynamo.config.capture_scalar_outputs = capture
        torch._dynamo.config.capture_dynamic_output_shape_ops = capture
        torch._inductor.config.freezing = self.freezing
        # static shapes: every user of a cell has the same lengths, and the cache is reset per cell
        return torch.compile(self.model, dynamic=False)

    def _forward(self, peer):
        torch, model = self.torch, self.model
        if peer == "fp32":
            return lambda x: model(uih_features=x[0], candidates_features=x[1])[3]
        if peer == "bf16":
            def f(x):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return model(uih_features=x[0], candidates_features=x[1])[3]
            return f
        if peer == "compile":
            c = self.compiled
            return lambda x: c(uih_features=x[0], candidates_features=x[1])[3]
        raise Failed(f"unknown peer {peer}")

    def _fresh_compile(self, warmup):
        """Compiles for this (cell, thread count): runs every user of the cell once (and at least
        `warmup` passes) so that any recompilation happens before the timing."""
        torch = self.torch
        from torch._dynamo.utils import counters

        info = {"freezing": self.freezing}
        modes = [True, False] if self.capture else [False]
        for capture in modes:
            self.compiled = self._compile(capture)
            fwd = self._forward("compile")
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    for i in range(max(warmup, len(self.inputs))):
                        fwd(self.inputs[i % len(self.inputs)])
            except Exception as e:
                traceback.print_exc()
                msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                if capture and len(modes) > 1:
                    info["capture_failed"] = msg
                    continue
                self.compiled = None
                raise Failed(f"torch.compile failed: {msg}" + (
                    f" (and with scalar/dynamic-shape capture: {info['capture_failed']})"
                    if "capture_failed" in info else ""))
            breaks = dict(counters["graph_break"])
            reasons = {}
            for k, v in sorted(breaks.items(), key=lambda kv: -kv[1])[:8]:
                reasons[" ".join(k.split())[:200]] = v
            info.update(compile_and_warmup_s=time.perf_counter() - t0, capture=capture,
                        graph_breaks=sum(breaks.values()), graph_break_reasons=reasons,
                        unique_graphs=counters["stats"].get("unique_graphs", 0))
            return info

    def time_peer(self, peer, threads, warmup, reps):
        torch = self.torch
        torch.set_num_threads(threads)
        out = {"threads": torch.get_num_threads()}
        if peer == "compile":
            key = (self.cell, threads)
            if self.compiled_key != key or self.compiled is None:
                self.compiled_key = None
                self.compile_info = self._fresh_compile(warmup)
                self.compiled_key = key
            out["compile"] = self.compile_info
        fwd = self._forward(peer)
        with torch.inference_mode():
            t0 = time.perf_counter()
            for i in range(warmup):
                fwd(self.inputs[i % len(self.inputs)])
            out["warmup_s"] = time.perf_counter() - t0
            times = []
            for _ in range(reps):
                for x in self.inputs:
                    t = time.perf_counter()
                    fwd(x)
                    times.append((time.perf_counter() - t) * 1e3)
        out["times_ms"] = times
        import resource

        out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the worker's peak so far
        return out

    def scores(self, path):
        """float32 eager scores, each user alone: [{task: [score per candidate]} per user]."""
        torch = self.torch
        torch.set_num_threads(1)
        res = []
        with torch.inference_mode():
            for u in read_jsonl(path):
                uih, cand = self.ref.batch(self.model, [u])
                res.append(self._per_task(self.model(uih_features=uih, candidates_features=cand)[3]))
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    res[-1]["__bf16"] = self._per_task(
                        self.model(uih_features=uih, candidates_features=cand)[3].float())
        return res

    def _per_task(self, preds):
        if preds.dim() == 1:
            preds = preds.view(1, -1)
        return {t: preds[i].tolist() for i, t in enumerate(self.tasks)}


def stage_worker(a):
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed (C or Python) goes to the log, not into the replies
    sys.stdout = sys.stderr

    def send(obj):
        reply.write(REPLY + json.dumps(obj) + "\n")
        reply.flush()

    try:
        w = Worker(a)
        send({"ok": True, **w.hello()})
    except Exception as e:
        traceback.print_exc()
        send({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "quit":
                send({"ok": True})
                return
            if op == "cell":
                res = w.set_cell(cmd["users"])
            elif op == "time":
                res = w.time_peer(cmd["peer"], cmd["threads"], cmd["warmup"], cmd["reps"])
            elif op == "scores":
                res = {"scores": w.scores(cmd["users"])}
            else:
                raise Failed(f"unknown op {op}")
            send({"ok": True, **res})
        except Exception as e:
            traceback.print_exc()
            msg = f"{type(e).__name__}: {e}"
            send({"ok": False, "error": msg[:4000]})


# ---------------------------------------------------------------------------------------------
# the driver's side of the worker


def allocator_env(choice):
    """-> (env additions, description)."""
    libs = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    found = {}
    for name, sonames in (("jemalloc", ("libjemalloc.so.2", "libjemalloc.so")),
                          ("tcmalloc", ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4"))):
        for line in libs.splitlines():
            parts = line.strip().split(" => ")
            if len(parts) == 2 and parts[0].split()[0] in sonames and os.path.exists(parts[1].strip()):
                found.setdefault(name, parts[1].strip())
    if choice == "plain":
        return {}, "glibc malloc, default settings (--allocator plain)"
    env = {"MALLOC_MMAP_THRESHOLD_": BIG, "MALLOC_TRIM_THRESHOLD_": BIG}
    glibc = f"glibc MALLOC_MMAP_THRESHOLD_={BIG} MALLOC_TRIM_THRESHOLD_={BIG}"
    pick = choice
    if choice == "auto":
        pick = "jemalloc" if "jemalloc" in found else "tcmalloc" if "tcmalloc" in found else "glibc"
    if pick == "glibc":
        return env, glibc + (" (no jemalloc / tcmalloc in ldconfig -p)" if choice == "auto" else "")
    if pick not in found:
        raise Failed(f"--allocator {pick}: not found in `ldconfig -p`")
    env["LD_PRELOAD"] = found[pick]
    desc = f"{pick} ({found[pick]}) via LD_PRELOAD"
    if pick == "jemalloc":
        env["MALLOC_CONF"] = JEMALLOC_CONF
        desc += f", MALLOC_CONF={JEMALLOC_CONF}"
    return env, desc + f"; {glibc} set as well"


class TorchWorker:
    """The worker subprocess: started on first use, restarted after a crash or a timeout."""

    def __init__(self, a, files, env_add):
        self.a, self.files, self.env_add = a, files, env_add
        self.proc, self.q, self.hello = None, None, None
        self.cell = None
        self.log_path = os.path.join(a.work, "torch_worker.log")

    def start(self):
        env = dict(os.environ, **self.env_add)
        env.pop("TRITON_INTERPRET", None)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(self.a.work, "inductor_cache"))
        cmd = [sys.executable, os.path.abspath(__file__), "--_stage", "worker", "--_config", self.files["config"],
               "--_state", self.files["state"], "--_model-dir", self.files["model"]]
        if self.a.compile_freezing:
            cmd.append("--compile-freezing")
        if self.a.compile_graph_breaks:
            cmd.append("--compile-graph-breaks")
        self.logf = open(self.log_path, "a")
        self.logf.write(f"\n=== {datetime.datetime.now().isoformat()} {shlex.join(cmd)}\n")
        self.logf.flush()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.logf, text=True,
                                     env=env, cwd=ROOT)
        self.q = queue.Queue()
        proc, q = self.proc, self.q

        def pump():
            for line in proc.stdout:
                if line.startswith(REPLY):
                    q.put(json.loads(line[len(REPLY):]))
            q.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.hello = self._wait(600, "loading the model")
        self.cell = None

    def _wait(self, timeout, what):
        try:
            msg = self.q.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise Failed(f"PyTorch worker: {what} took over {timeout}s (killed; log: {self.log_path})")
        if msg is None:
            rc = self.proc.wait()
            self.proc = None
            oom = ", killed: out of memory?" if rc in (-9, 137) else ""
            raise Failed(f"PyTorch worker died while {what} (exit {rc}{oom}); last log lines:\n{self.tail()}")
        if not msg.get("ok"):
            raise Failed(f"PyTorch worker, {what}: {msg.get('error')}")
        return msg

    def tail(self, n=15):
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def call(self, cmd, timeout, what):
        if self.proc is None:
            self.start()
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._wait(timeout, what)

    def set_cell(self, users_path):
        if self.proc is None:
            self.start()
        if self.cell != users_path:
            self.call({"op": "cell", "users": users_path}, 600, f"reading {os.path.basename(users_path)}")
            self.cell = users_path

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self):
        if self.proc is not None:
            try:
                self.call({"op": "quit"}, 30, "quitting")
            except Failed:
                pass
            self.kill()


# ---------------------------------------------------------------------------------------------
# Ember


def ember_supports(exe):
    """None when `ember bench model` takes --model / --users, else why not."""
    if not os.path.exists(exe):
        return f"{exe} not found (build it: cargo build --release -p ember-cli)"
    p = subprocess.run([exe, "bench", "model", "--help"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return f"{exe} has no `bench model` command"
    missing = [f for f in ("--model", "--users") if f not in p.stdout]
    if missing:
        return (f"{exe}'s `bench model` has no {' / '.join(missing)} yet (rebuild: cargo build --release -p "
                f"ember-cli)")
    return None


def run_ember_bench(a, model_dir, users, threads, dtype, n_users):
    cmd = [a.ember, "bench", "model", "--model", model_dir, "--users", users, "--threads", str(threads),
           "--dense-dtype", dtype, "--iters", str(n_users * a.reps), "--warmup", str(a.warmup), "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.ember_timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise Failed(f"`{shlex.join(cmd)}` ran over {a.ember_timeout}s")
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    if p.returncode != 0 or not lines:
        raise Failed(f"`{shlex.join(cmd)}` exited {p.returncode}:\n{p.stderr.strip()[-2000:]}")
    try:
        res = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise Failed(f"`{shlex.join(cmd)}`: its last stdout line is not JSON: {lines[-1][:300]}")
    missing = [k for k in ("p50_ms", "p99_ms") if k not in res]
    if missing:
        raise Failed(f"`{shlex.join(cmd)}`: its JSON has no {', '.join(missing)} (keys: {sorted(res)})")
    res["command"] = shlex.join(cmd)
    return res


def ember_predict(a, model_dir, users, out, dtype):
    cmd = [a.ember, "predict", "--model", model_dir, "--data", users, "--out", out, "--threads", "1",
           "--attention-norm", "alone"]
    if dtype != "f32":
        cmd += ["--dense-dtype", dtype]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.ember_timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise Failed(f"`{shlex.join(cmd)}` ran over {a.ember_timeout}s")
    if p.returncode != 0:
        raise Failed(f"`{shlex.join(cmd)}` exited {p.returncode}:\n{p.stderr.strip()[-2000:]}")
    return [json.loads(line)["scores"] for line in open(out) if line.strip()]


# ---------------------------------------------------------------------------------------------
# numbers


def pct(xs, q):
    """Percentile q (0-100) with linear interpolation."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def max_diff(a, b, key=None):
    err = 0.0
    if len(a) != len(b):
        return float("inf")
    for ua, ub in zip(a, b):
        for t in ub:
            if t.startswith("__"):
                continue
            xa = ua[t] if key is None else ua[key][t]
            if len(xa) != len(ub[t]):
                return float("inf")
            err = max(err, max((abs(x - y) for x, y in zip(xa, ub[t])), default=0.0))
    return err


def first_error(text):
    """The line of a failure message that says what went wrong."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for ln in lines:
        if ln.lower().startswith("error"):
            return ln[:200]
    return (lines[-1] if lines else "")[:200]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt(x, digits=2):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}" if x < 100 else f"{x:.0f}"


def summarize_torch(rounds):
    p50s = [pct(r["times_ms"], 50) for r in rounds]
    p99s = [pct(r["times_ms"], 99) for r in rounds]
    pooled = [t for r in rounds for t in r["times_ms"]]
    return {"p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s),
            "p99_pooled_ms": pct(pooled, 99), "mean_ms": statistics.fmean(pooled),
            "round_p50_ms": p50s, "round_p99_ms": p99s}


def summarize_ember(rounds):
    out = {"p50_ms": statistics.median(r["p50_ms"] for r in rounds),
           "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
           "round_p50_ms": [r["p50_ms"] for r in rounds], "round_p99_ms": [r["p99_ms"] for r in rounds]}
    for k in ("mean_ms", "users_per_s", "projections_gflops", "attention_gflops"):
        vals = [r[k] for r in rounds if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = statistics.median(vals)
    stages = [r.get("stage_s") for r in rounds if isinstance(r.get("stage_s"), dict)]
    if stages:
        keys = [k for k in stages[0] if all(isinstance(s.get(k), (int, float)) for s in stages)]
        med = {k: statistics.median(s[k] for s in stages) for k in keys}
        out["stage_s"] = med
        wall = med.get("wall") or sum(v for k, v in med.items() if k != "wall")
        if wall:
            shares = {k: med[k] / wall for k in keys if k != "wall"}
            shares["other"] = max(0.0, 1.0 - sum(shares.values())) if "wall" in med else 0.0
            out["stage_share"] = shares
    return out


# ---------------------------------------------------------------------------------------------
# driver


def parse_list(text, what, conv=int):
    try:
        vals = [conv(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{what} {text!r}: expected a comma-separated list")
    if not vals:
        raise SystemExit(f"{what}: empty")
    return vals


def resolve_cells(a):
    if a.cells:
        cells = []
        for item in a.cells.split(","):
            try:
                h, c = item.lower().replace("x", ":").split(":")
                cells.append((int(h), int(c)))
            except ValueError:
                raise SystemExit(f"--cells {a.cells!r}: expected h:c,h:c (e.g. 256:64,1024:512)")
        return cells
    if a.quick:
        return list(QUICK_CELLS)
    if a.history or a.candidates:
        hs = parse_list(a.history or "256,1024,4096", "--history")
        cs = parse_list(a.candidates or "64,512,2048", "--candidates")
        return [(h, c) for h in hs for c in cs]
    return list(ISSUE_CELLS)


def prepare(a, cells):
    """STATE.pt, CONFIG.json, the Ember export and the users files under --work (reused when they match)."""
    rows = table_rows(a.rows_scale, a.min_rows)
    longest = max(h + c for h, c in cells) + 1  # + the contextual user_id
    max_seq_len = max(8192, -(-longest // 1024) * 1024)
    max_cand = max(2048, max(c for _, c in cells))
    config = mlperf_config(rows, max_seq_len, max_cand)
    files = {"config": os.path.join(a.work, "CONFIG.json"), "state": os.path.join(a.work, "STATE.pt"),
             "model": os.path.join(a.work, "ember_model"), "spec": os.path.join(a.work, "spec.json")}
    spec = {"config": config, "seed": a.seed, "table_dtype": "f16", "time_bucket_clamp": "triton", "version": 1}
    old = None
    if os.path.exists(files["spec"]):
        with open(files["spec"]) as f:
            old = json.load(f)
    have = all(os.path.exists(p) for p in (files["state"], os.path.join(files["model"], "config.json"),
                                           os.path.join(files["model"], "model.safetensors")))
    if old == spec and have:
        log(f"reusing the model in {a.work} (same config and seed)")
    else:
        if os.path.exists(files["spec"]):
            os.remove(files["spec"])
        with open(files["config"], "w") as f:
            json.dump(config, f, indent=1)
        log(f"building random weights at the MLPerf DLRMv3 dims (tables {rows}) ...")
        cmd = [sys.executable, os.path.abspath(__file__), "--_stage", "prep", "--_config", files["config"],
               "--_state", files["state"], "--seed", str(a.seed)]
        env = dict(os.environ)
        p = subprocess.run(cmd, env=env, cwd=ROOT, timeout=1800, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        sys.stderr.write(p.stdout[-3000:] if p.returncode else "".join(
            ln + "\n" for ln in p.stdout.splitlines() if ln.startswith("  ")))
        if p.returncode != 0:
            raise Failed(f"building the weights failed (exit {p.returncode})")
        log("exporting it with tools/export_torch.py (--dtype f16 --time-bucket-clamp triton) ...")
        cmd = [sys.executable, os.path.join(TOOLS, "export_torch.py"), "--from", "generative-recommenders",
               files["state"], "--hstu-config", files["config"], "--out", files["model"], "--dtype", "f16",
               "--time-bucket-clamp", "triton"]
        p = subprocess.run(cmd, cwd=ROOT, timeout=1800, capture_output=True, text=True)
        if p.returncode != 0:
            raise Failed(f"`{shlex.join(cmd)}` exited {p.returncode}:\n{(p.stderr or p.stdout).strip()[-2000:]}")
        log("  " + (p.stdout.strip().splitlines() or [""])[-1])
        with open(files["spec"], "w") as f:
            json.dump(spec, f)
    users = {}
    for h, c in cells:
        path = os.path.join(a.work, f"users_h{h}_c{c}_n{a.users}_s{a.seed}.jsonl")
        if not os.path.exists(path):
            write_users(path, make_users(a.users, h, c, rows, a.seed * 1_000_003 + h * 7919 + c))
        users[(h, c)] = path
    return files, users, config


def accuracy_check(a, worker, files, users_path, ember_ok):
    log(f"accuracy check on {os.path.basename(users_path)} ...")
    t0 = time.time()
    ref = worker.call({"op": "scores", "users": users_path}, a.torch_timeout, "scoring the check users")["scores"]
    out = {"users": users_path, "torch_bf16_vs_fp32": max_diff([{t: u["__bf16"][t] for t in u["__bf16"]} for u in ref],
                                                                [{t: v for t, v in u.items() if t != "__bf16"}
                                                                 for u in ref])}
    flat = [x for u in ref for t, v in u.items() if t != "__bf16" for x in v]
    out["score_range"] = [min(flat), max(flat)]
    if a.torch_only or not os.path.exists(a.ember):
        out["ember"] = "skipped: --torch-only" if a.torch_only else f"skipped: {a.ember} not found"
        return out
    for dtype in ("f32", "bf16"):
        try:
            em = ember_predict(a, files["model"], users_path, os.path.join(a.work, f"check_scores_{dtype}.jsonl"),
                               dtype)
            out[f"ember_{dtype}_vs_torch_fp32"] = max_diff(em, ref)
        except Failed as e:
            out[f"ember_{dtype}_error"] = str(e)
    out["seconds"] = time.time() - t0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", help="history lengths, with --candidates a grid of cells (default: the issue's cells)")
    ap.add_argument("--candidates", help="candidate counts (see --history)")
    ap.add_argument("--cells", help="explicit cells h:c,h:c (default 256:64,1024:512,4096:512,4096:2048)")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--users", type=int, default=None, help="distinct users per cell (default 8; --quick 4)")
    ap.add_argument("--runs", type=int, default=None, help="alternating rounds (default 3; --quick 1)")
    ap.add_argument("--reps", type=int, default=1, help="times each user is timed per round, both sides (default 1)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up forward passes per peer and round (default 2)")
    ap.add_argument("--peers", default="fp32,bf16,compile", help="PyTorch peers: fp32,bf16,compile")
    ap.add_argument("--ember", default=os.path.join(ROOT, "target", "release", "ember"), help="ember binary")
    ap.add_argument("--ember-dtypes", default="f32,bf16", help="Ember --dense-dtype runs (default f32,bf16)")
    ap.add_argument("--torch-only", action="store_true", help="the PyTorch side alone")
    ap.add_argument("--ember-only", action="store_true", help="Ember alone (no PyTorch timing)")
    ap.add_argument("--quick", action="store_true", help="256x64 and 1024x512, 4 users, 1 round (a test)")
    ap.add_argument("--rows-scale", type=float, default=1e-4, help="table rows = real rows x this (default 1e-4)")
    ap.add_argument("--min-rows", type=int, default=4096, help="floor on a scaled table's rows (default 4096)")
    ap.add_argument("--seed", type=int, default=7, help="weights and users seed (default 7)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "ember_hstu_bench"),
                    help="work directory: STATE.pt, CONFIG.json, the export, users, logs "
                         "(default /tmp/ember_hstu_bench)")
    ap.add_argument("--allocator", default="auto", choices=["auto", "jemalloc", "tcmalloc", "glibc", "plain"],
                    help="PyTorch worker's allocator (default auto: jemalloc if installed, else tcmalloc, else glibc; "
                         "the glibc thresholds are always raised except with plain)")
    ap.add_argument("--compile-freezing", action="store_true", help="torch._inductor.config.freezing for compile")
    ap.add_argument("--compile-graph-breaks", action="store_true",
                    help="compile with dynamo's defaults (graph breaks at .item() / nonzero) instead of "
                         "capture_scalar_outputs + capture_dynamic_output_shape_ops")
    ap.add_argument("--no-check", action="store_true", help="skip the accuracy side check")
    ap.add_argument("--torch-timeout", type=int, default=3600, help="seconds per PyTorch peer round (default 3600)")
    ap.add_argument("--ember-timeout", type=int, default=1800, help="seconds per Ember run (default 1800)")
    ap.add_argument("--json", dest="json_out", metavar="OUT", help="write every number to this JSON file")
    ap.add_argument("--_stage", choices=["prep", "worker"], help=argparse.SUPPRESS)
    ap.add_argument("--_config", dest="config", help=argparse.SUPPRESS)
    ap.add_argument("--_state", dest="state", help=argparse.SUPPRESS)
    ap.add_argument("--_model-dir", dest="model_dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._stage == "prep":
        return stage_prep(a)
    if a._stage == "worker":
        return stage_worker(a)

    if a.users is None:
        a.users = 4 if a.quick else 8
    if a.runs is None:
        a.runs = 1 if a.quick else 3
    if a.users < 1 or a.runs < 1 or a.reps < 1 or a.warmup < 0:
        ap.error("--users, --runs, --reps must be >= 1 and --warmup >= 0")
    if a.torch_only and a.ember_only:
        ap.error("--torch-only and --ember-only exclude each other")
    cells = resolve_cells(a)
    threads = parse_list(a.threads, "--threads")
    peers = [] if a.ember_only else parse_list(a.peers, "--peers", str)
    bad = [p for p in peers if p not in PEERS]
    if bad:
        ap.error(f"--peers: unknown {bad} (known: {', '.join(PEERS)})")
    dtypes = [] if a.torch_only else parse_list(a.ember_dtypes, "--ember-dtypes", str)
    a.ember = os.path.abspath(a.ember)
    a.work = os.path.abspath(a.work)
    os.makedirs(a.work, exist_ok=True)

    env_add, alloc_desc = allocator_env(a.allocator)
    ember_why = None if a.torch_only else ember_supports(a.ember)
    ember_version = None
    if os.path.exists(a.ember):
        v = subprocess.run([a.ember, "--version"], capture_output=True, text=True)
        ember_version = v.stdout.strip() or None
    now = datetime.datetime.now().astimezone()
    meta = {"date": now.isoformat(timespec="seconds"), "cpu": cpu_model(), "cores": os.cpu_count(),
            "allocator": alloc_desc, "allocator_env": env_add, "cells": cells, "threads": threads,
            "users_per_cell": a.users, "runs": a.runs, "reps": a.reps, "warmup": a.warmup, "peers": peers,
            "ember_dtypes": dtypes, "ember": a.ember, "ember_version": ember_version, "seed": a.seed,
            "rows_scale": a.rows_scale, "min_rows": a.min_rows,
            "tables_note": "tables exported as f16 (MLPerf's are FP16); PyTorch holds the same values in float32",
            "time_bucket_clamp": "triton (time gaps < 181 days: the PyTorch peers' kernel gives the same buckets)"}
    result = {"meta": meta, "check": None, "cells": [], "failures": {}}

    def save():
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump(result, f, indent=1)

    files, users, config = prepare(a, cells)
    meta["rows"] = {t: v["num_embeddings"] for t, v in config["tables"].items()}
    meta["max_seq_len"] = config["hstu_config"]["max_seq_len"]
    meta["work"] = a.work
    worker = TorchWorker(a, files, env_add)
    dead = {}  # peer / ember dtype -> why it is left out for the rest of the run
    print(f"# HSTU (MLPerf DLRMv3 dims), Ember vs PyTorch, one user per forward pass -- {meta['date']}")
    print(f"# CPU: {meta['cpu']} ({meta['cores']} logical cores)")
    try:
        if peers or not a.no_check:
            worker.start()
            h = worker.hello
            meta["torch"] = h["torch"]
            meta["reference_versions"] = h["versions"]
            meta["torch_cpu_capability"] = h["cpu_capability"]
            meta["tables_loaded"] = h["tables"]
            meta["malloc_loaded"] = h["malloc_loaded"]
            print(f"# torch {h['torch']} (CPU capability {h['cpu_capability']}), reference: "
                  + ", ".join(f"{k} {v}" for k, v in h["versions"].items() if k != "torch"))
            print(f"# PyTorch allocator: {alloc_desc}"
                  + ("" if not env_add.get("LD_PRELOAD") or h["malloc_loaded"] else " -- NOT loaded in the worker!"))
            print(f"# PyTorch model: {h['tables']}")
        print("# Ember: not run (--torch-only)" if a.torch_only else
              f"# Ember: {a.ember} ({ember_version or '?'})" + (f" -- not run: {ember_why}" if ember_why else ""))
        print(f"# model: 5 STU layers, 4 heads, linear/qk 128/128, table dim 512 (f16 tables: MLPerf's item table "
              f"is FP16), model dim 512, hidden 256; tables {meta['rows']} rows; 8192 position / 2048 time "
              f"buckets, Triton time-bucket clamp; max_seq_len {meta['max_seq_len']}")
        print(f"# {a.users} users per cell, {a.runs} rounds, each user timed {a.reps}x per round after "
              f"{a.warmup} warm-up passes; p50/p99 per user = medians over the rounds")
        sys.stdout.flush()

        if not a.no_check:
            small = min(cells, key=lambda hc: (hc[0] + hc[1], hc))
            try:
                chk = accuracy_check(a, worker, files, users[small], ember_why)
            except Failed as e:
                chk = {"error": str(e)}
            result["check"] = chk
            line = f"# check ({small[0]}x{small[1]}, {a.users} users, scores in " + (
                f"[{chk['score_range'][0]:.3f}, {chk['score_range'][1]:.3f}]): " if "score_range" in chk else ": ")
            parts = []
            for k, label in (("ember_f32_vs_torch_fp32", "Ember f32 vs PyTorch fp32"),
                             ("ember_bf16_vs_torch_fp32", "Ember bf16 vs PyTorch fp32"),
                             ("torch_bf16_vs_fp32", "PyTorch bf16 autocast vs fp32")):
                if k in chk:
                    parts.append(f"{label} max |diff| {chk[k]:.2e}")
            for k in ("ember_f32_error", "ember_bf16_error", "error"):
                if k in chk:
                    parts.append(f"{k}: {first_error(chk[k])}")
                    log(chk[k])
            print(line + "; ".join(parts))
            if chk.get("ember_f32_vs_torch_fp32", 0) > 1e-4:
                print("# CHECK FAILED: Ember f32 and the reference differ by more than 1e-4")
            sys.stdout.flush()
            save()

        if ember_why:
            for d in dtypes:
                dead[f"ember {d}"] = ember_why
        for (h, c) in cells:
            path = users[(h, c)]
            for t in threads:
                rec = {"history": h, "candidates": c, "threads": t, "users": a.users, "torch": {}, "ember": {},
                       "compile": None, "errors": {}}
                loads = []  # 1-minute load average before each run: other work on the machine skews both sides
                traw = {p: [] for p in peers}
                eraw = {d: [] for d in dtypes}
                for r in range(a.runs):
                    for p in peers:
                        if p in dead:
                            continue
                        loads.append(os.getloadavg()[0])
                        log(f"[{h}x{c}, {t} threads, round {r + 1}/{a.runs}] {PEER_NAMES[p]} ...")
                        try:
                            worker.set_cell(path)
                            res = worker.call({"op": "time", "peer": p, "threads": t, "warmup": a.warmup,
                                               "reps": a.reps}, a.torch_timeout, f"{PEER_NAMES[p]} on {h}x{c}")
                        except Failed as e:
                            msg = str(e)
                            log(f"  {PEER_NAMES[p]} failed: {msg}")
                            rec["errors"][p] = msg
                            if p == "compile" or "timeout" in msg or "took over" in msg or "died" in msg:
                                dead[p] = msg  # do not retry it (compile errors and timeouts repeat)
                            if worker.proc is None:
                                worker.cell = None
                            continue
                        if res.get("threads") != t:
                            rec["errors"][p] = f"asked for {t} threads, torch.get_num_threads() = {res.get('threads')}"
                        traw[p].append(res)
                        if p == "compile" and res.get("compile"):
                            rec["compile"] = res["compile"]
                        log(f"  p50 {pct(res['times_ms'], 50):.2f} ms, p99 {pct(res['times_ms'], 99):.2f} ms "
                            f"(warm-up {res['warmup_s']:.1f}s; worker peak RSS {res['max_rss_mb'] / 1024:.1f} GB)")
                    for d in dtypes:
                        if f"ember {d}" in dead:
                            continue
                        loads.append(os.getloadavg()[0])
                        log(f"[{h}x{c}, {t} threads, round {r + 1}/{a.runs}] ember {d} ...")
                        try:
                            res = run_ember_bench(a, files["model"], path, t, d, a.users)
                        except Failed as e:
                            log(f"  ember {d} failed: {e}")
                            rec["errors"][f"ember {d}"] = str(e)
                            if "unexpected argument" in str(e) or "ran over" in str(e):
                                dead[f"ember {d}"] = str(e)
                            continue
                        eraw[d].append(res)
                        log(f"  p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms")
                rec["load_avg_1m"] = loads
                for p, rounds in traw.items():
                    if rounds:
                        rec["torch"][p] = {**summarize_torch(rounds), "rounds": rounds}
                for d, rounds in eraw.items():
                    if rounds:
                        rec["ember"][d] = {**summarize_ember(rounds), "rounds": rounds}
                if rec["torch"]:
                    best = min(rec["torch"], key=lambda p: rec["torch"][p]["p50_ms"])
                    rec["torch_best"] = best
                    if "bf16" in rec["ember"]:
                        e, b = rec["ember"]["bf16"], rec["torch"][best]
                        rec["ratio_p50"] = b["p50_ms"] / e["p50_ms"]
                        rec["ratio_p99"] = b["p99_ms"] / e["p99_ms"]
                result["cells"].append(rec)
                print_cell(rec, peers, dtypes, a, dead)
                save()
    finally:
        worker.close()
    result["failures"] = dict(dead)
    save()
    if a.json_out:
        print(f"# numbers written to {a.json_out}")


def print_cell(rec, peers, dtypes, a, dead):
    h, c, t = rec["history"], rec["candidates"], rec["threads"]
    print(f"\n## {h} history x {c} candidates, {t} thread{'s' if t > 1 else ''} "
          f"({rec['users']} users, {a.runs} round{'s' if a.runs > 1 else ''})")
    print(f"  {'':24s} {'p50 ms':>10s} {'p99 ms':>10s}")
    for p in peers:
        r = rec["torch"].get(p)
        if r:
            extra = ""
            if p == "compile" and rec.get("compile"):
                ci = rec["compile"]
                extra = (f"   (compile+warm-up {ci['compile_and_warmup_s']:.0f}s, {ci['graph_breaks']} graph breaks, "
                         f"{ci['unique_graphs']} graph{'s' if ci['unique_graphs'] != 1 else ''}"
                         f"{', scalar/dynamic-shape capture' if ci.get('capture') else ', dynamo defaults'}"
                         f"{', freezing' if ci.get('freezing') else ''})")
                if ci.get("capture_failed"):
                    extra += f"\n  {'':24s} capturing compile failed, fell back to dynamo defaults: " \
                             f"{ci['capture_failed'][:150]}"
            print(f"  {PEER_NAMES[p]:24s} {fmt(r['p50_ms']):>10s} {fmt(r['p99_ms']):>10s}{extra}")
        else:
            why = first_error(rec["errors"].get(p, dead.get(p, "not run")))
            print(f"  {PEER_NAMES[p]:24s} {'failed' if p in rec['errors'] else '-':>10s}   {why}")
    for d in dtypes:
        r = rec["ember"].get(d)
        name = f"ember {d}"
        if r:
            print(f"  {name:24s} {fmt(r['p50_ms']):>10s} {fmt(r['p99_ms']):>10s}")
        else:
            why = first_error(rec["errors"].get(name, dead.get(name, "not run")))
            print(f"  {name:24s} {'-':>10s}   {why}")
    if "ratio_p50" in rec:
        best = rec["torch_best"]
        print(f"  Ember bf16 vs PyTorch's best ({PEER_NAMES[best]}): {rec['ratio_p50']:.2f}x at p50, "
              f"{rec['ratio_p99']:.2f}x at p99 (PyTorch's ms / Ember's ms)")
    elif rec["torch"]:
        best = rec["torch_best"]
        print(f"  PyTorch's best: {PEER_NAMES[best]} (no Ember bf16 number to compare)")
    loads = rec.get("load_avg_1m") or []
    if loads and max(loads) > t + 0.75:
        print(f"  WARNING: 1-minute load average up to {max(loads):.1f} on {os.cpu_count()} cores during this cell "
              f"(this benchmark accounts for about {t}): other work skewed the timings")
    for d in dtypes:
        sh = rec["ember"].get(d, {}).get("stage_share")
        if sh:
            keys = [k for k in STAGES if k in sh] + [k for k in sh if k not in STAGES and k != "other"]
            if sh.get("other", 0) >= 0.005:
                keys.append("other")
            gf = [f"{k} {rec['ember'][d][k + '_gflops']:.1f}" for k in ("projections", "attention")
                  if isinstance(rec["ember"][d].get(k + "_gflops"), (int, float))]
            print(f"  Ember {d} stages (share of wall): " + ", ".join(f"{k} {100 * sh[k]:.0f}%" for k in keys)
                  + (f"; GFLOP/s {', '.join(gf)}" if gf else ""))
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        main()
    except Failed as e:
        sys.exit(f"compare_torch_hstu.py: {e}")
    except KeyboardInterrupt:
        sys.exit("compare_torch_hstu.py: interrupted")
