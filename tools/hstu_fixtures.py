#!/usr/bin/env python3
"""Writes the HSTU parity fixtures under crates/ember-model/tests/fixtures/hstu_*/ and checks them.

    ~/.venvs/hstu/bin/python tools/hstu_fixtures.py              # (re)writes all of them
    ~/.venvs/hstu/bin/python tools/hstu_fixtures.py --only hstu_small

The reference is generative-recommenders' DlrmHSTU (the MLPerf DLRMv3 ranking model) run on CPU
with its PyTorch kernels, imported by tools/hstu_ref.py (see there for the environment and the
fbgemm / torchrec shims). Each fixture directory holds:

- config.json + model.safetensors: the Ember model, written by running tools/export_torch.py's
  command line (`--from generative-recommenders STATE.pt --hstu-config CONFIG.json
  --time-bucket-clamp pytorch|triton`) on a saved state_dict and config, exactly as a user would.
- users.jsonl: one user per line, `{"uih": {feature: [ints]}, "candidates": {feature: [ints]}}`
  keyed by hstu_uih_feature_names / hstu_candidate_feature_names.
- expected.json: `{"alone": [{task: [score per candidate]} per user], "batched": [same]}`: the
  reference's float32 mt_target_preds (sigmoid for binary tasks, raw for regression), "alone"
  with each user in a batch of one, "batched" with all of the fixture's users in one batch (the
  reference divides the attention by the batch's longest sequence, so the two differ).

Fixtures (every dim of a fixture differs from the others, so that two mixed-up dims fail; the
item and prediction MLPs' hidden size is 512, hard-coded in DlrmHSTU):
- hstu_small: the "streaming" (MLPerf DLRMv3) feature layout, contextual user_id (max length 1,
  min_uih_length 20: sequence length = history + candidates, some users below it), action
  weights [1, 2, 4, 8, 16], three binary tasks and one regression task, the timestamp
  layer-norm postprocessor; table dim 12, model dim 20, preprocessor hidden 14, attention
  linear dim 6, qk dim 7, 3 heads, 2 layers.
- hstu_ctx2: two contextual features (user_id max length 1; user_segment max length 2 with
  min_uih_length 20, one user giving only one value), action weights [1, 4, 2, 16, 8], the
  layer-norm postprocessor, one task; table dim 10, model dim 16, hidden 11, linear dim 9,
  qk dim 4, 2 heads, 3 layers; one user whose candidates have different query times.
- hstu_triton: `time_bucket_clamp: triton` (export_torch's default): the expected outputs use the
  reference's Triton position kernel (time buckets saturate at num_time_buckets = 50, not at the
  embedding dim - 1 = 15), run on CPU by Triton's interpreter (TRITON_INTERPRET=1, set by this
  script; see hstu_ref.use_triton_time_buckets); streaming layout, min_uih_length 15, one binary
  and one regression task; table dim 6, model dim 16, hidden 7, linear dim 3, qk dim 4, 2 heads,
  1 layer. Checked: with a timestamp table of dim rows (both clamps then at dim - 1) the Triton
  and PyTorch kernels agree within 1e-6, and with the fixture's table they differ.
The positional tables are smaller than DlrmHSTU's 8192 / 2049 rows (both kernels read the sizes
from the tables), which keeps the fixtures small and makes long histories hit the position
clamp (rows - 1). hstu_small and hstu_ctx2 are exported with `--time-bucket-clamp pytorch`:
their time buckets saturate at the embedding dim - 1, as in the PyTorch kernel. Time gaps run
from 0 s (repeated timestamps) to ~3 years, half of them within the unclamped buckets.
`--quant int8` (or f16, bf16, int4) also writes {fixture}_{dtype} copies with quantized tables.

Every parameter (LayerNorm weights and biases, the uvqk bias, contextual bias, action tables,
...) is random from a fixed seed; the last prediction Linear is rescaled per task so that the
logits span about [-2.5, 2.5]. The script fails unless:
  - every parameter tensor moves the batched outputs (> 1e-4 when perturbed),
  - the float32 outputs agree with the same model run in float64 (max |diff| < 1e-5),
  - the exported directory, read back into the reference (hstu_ref.load_ember), reproduces them,
  - dlrm_v3's collate gives the KeyedJaggedTensors a plain key-major concatenation gives,
  - export_torch rejects a state_dict with an extra tensor, a missing one, a wrong shape or a
    wrong buffer with an ExportError naming the tensor.
"""

import argparse
import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile

# The hstu_triton fixture runs the reference's Triton position kernel on CPU through Triton's
# interpreter, which must be chosen before the kernels are decorated (at import).
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_torch  # noqa: E402
import hstu_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "ember-model", "tests", "fixtures")

STREAMING_UIH = ["user_id", "item_id", "item_rating", "action_timestamp", "item_weights", "dummy_watch_time",
                 "item_category_id"]
STREAMING_CAND = ["item_candidate_id", "item_candidate_rating", "item_query_time", "item_action_weights",
                  "item_dummy_watchtime", "item_candidate_category_id"]
STREAMING_MAP = [["item_id", "item_candidate_id"], ["item_rating", "item_candidate_rating"],
                 ["action_timestamp", "item_query_time"], ["item_weights", "item_action_weights"],
                 ["dummy_watch_time", "item_dummy_watchtime"], ["item_category_id", "item_candidate_category_id"]]


def streaming_config(extra_contextual=()):
    """The feature names and mapping of dlrm_v3's get_hstu_configs("streaming")."""
    uih = list(STREAMING_UIH)
    user = ["item_id", "user_id", "item_category_id"]
    for name in extra_contextual:
        uih.insert(1, name)
        user.append(name)
    return dict(
        user_embedding_feature_names=user,
        item_embedding_feature_names=["item_candidate_id", "item_candidate_category_id"],
        uih_post_id_feature_name="item_id", uih_action_time_feature_name="action_timestamp",
        candidates_querytime_feature_name="item_query_time", candidates_weight_feature_name="item_action_weights",
        uih_weight_feature_name="item_weights", candidates_watchtime_feature_name="item_rating",
        merge_uih_candidate_feature_mapping=STREAMING_MAP, hstu_uih_feature_names=uih,
        hstu_candidate_feature_names=list(STREAMING_CAND),
    )


def tables(dim, item_rows, cat_rows, user_rows, extra=()):
    t = {"item_id": {"num_embeddings": item_rows, "embedding_dim": dim,
                     "feature_names": ["item_id", "item_candidate_id"]},
         "item_category_id": {"num_embeddings": cat_rows, "embedding_dim": dim,
                              "feature_names": ["item_category_id", "item_candidate_category_id"]},
         "user_id": {"num_embeddings": user_rows, "embedding_dim": dim, "feature_names": ["user_id"]}}
    for name, rows in extra:
        t[name] = {"num_embeddings": rows, "embedding_dim": dim, "feature_names": [name]}
    return t


def base_config(**kw):
    c = dict(max_seq_len=128, max_num_candidates=20, max_num_candidates_inference=20, hstu_group_norm=False,
             hstu_input_dropout_ratio=0.2, hstu_linear_dropout_rate=0.1, causal_multitask_weights=0.2,
             action_embedding_init_std=5.0, enable_postprocessor=True)
    c.update(kw)
    return c


FIXTURES = {
    "hstu_small": dict(
        seed=21, num_users=8, max_history=40, num_position_buckets=32, num_time_buckets=23,
        config={"hstu_config": base_config(
            hstu_num_heads=3, hstu_attn_linear_dim=6, hstu_attn_qk_dim=7, hstu_attn_num_layers=2,
            hstu_embedding_table_dim=12, hstu_preprocessor_hidden_dim=14, hstu_transducer_embedding_dim=20,
            contextual_feature_to_max_length={"user_id": 1}, contextual_feature_to_min_uih_length={"user_id": 20},
            action_weights=[1, 2, 4, 8, 16], use_layer_norm_postprocessor=False,
            multitask_configs=[{"task_name": "click", "task_weight": 1, "task_type": 0},
                               {"task_name": "like", "task_weight": 2, "task_type": "binary_classification"},
                               {"task_name": "share", "task_weight": 16, "task_type": 0},
                               {"task_name": "watch_time", "task_weight": 4, "task_type": 1}],
            **streaming_config()),
            "tables": tables(12, 300, 17, 50)},
        histories=[1, 40, 3, 19, 12, 27, 7, 33], candidates=[1, 20, 5, 1, 8, 13, 2, 17]),
    "hstu_ctx2": dict(
        seed=22, num_users=8, max_history=40, num_position_buckets=40, num_time_buckets=20,
        config={"hstu_config": base_config(
            hstu_num_heads=2, hstu_attn_linear_dim=9, hstu_attn_qk_dim=4, hstu_attn_num_layers=3,
            hstu_embedding_table_dim=10, hstu_preprocessor_hidden_dim=11, hstu_transducer_embedding_dim=16,
            contextual_feature_to_max_length={"user_id": 1, "user_segment": 2},
            contextual_feature_to_min_uih_length={"user_segment": 20},
            action_weights=[1, 4, 2, 16, 8], use_layer_norm_postprocessor=True,
            multitask_configs=[{"task_name": "rating", "task_weight": 1, "task_type": "binary_classification"}],
            **streaming_config(extra_contextual=["user_segment"])),
            "tables": tables(10, 250, 17, 50, extra=[("user_segment", 9)])},
        histories=[40, 1, 17, 2, 9, 38, 14, 25], candidates=[20, 1, 1, 16, 9, 3, 6, 11], spread_query_user=5),
    "hstu_triton": dict(
        seed=23, num_users=6, max_history=30, num_position_buckets=20, num_time_buckets=50, clamp="triton",
        near_seconds=160_000,
        config={"hstu_config": base_config(
            hstu_num_heads=2, hstu_attn_linear_dim=3, hstu_attn_qk_dim=4, hstu_attn_num_layers=1,
            hstu_embedding_table_dim=6, hstu_preprocessor_hidden_dim=7, hstu_transducer_embedding_dim=16,
            contextual_feature_to_max_length={"user_id": 1}, contextual_feature_to_min_uih_length={"user_id": 15},
            action_weights=[1, 2, 4, 8, 16], use_layer_norm_postprocessor=False,
            multitask_configs=[{"task_name": "click", "task_weight": 1, "task_type": 0},
                               {"task_name": "dwell", "task_weight": 2, "task_type": 1}],
            **streaming_config()),
            "tables": tables(6, 120, 17, 50)},
        histories=[1, 30, 7, 18, 12, 25], candidates=[3, 10, 8, 6, 12, 2]),
}
# Sequence lengths (history + candidates) against min_uih_length 20: hstu_small 2, 60, 8, 20, 20,
# 40, 9, 50 (users 0, 2, 6 below, 3 and 4 at the threshold); hstu_ctx2 60, 2, 18, 18, 18, 41, 20,
# 36 (users 1-4 below, 6 at the threshold); hstu_triton against 15: 4, 40, 15, 24, 24, 27.


# ---------------------------------------------------------------------------------------------
# model


def randomize(model, seed):
    """Every parameter random, at scales that keep each part of the model visible in the outputs."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            shape = tuple(p.shape)
            if name.startswith("_embedding_collection."):
                v = normal(shape, 0.6)
            elif "_positional_encoder" in name:
                v = normal(shape, 0.8)
            elif "_action_encoder" in name:
                v = normal(shape, 0.7)
            elif leaf == "_batched_contextual_linear_weights":
                v = normal(shape, 1.0 / shape[1] ** 0.5)
            elif leaf in ("_batched_contextual_linear_bias", "_uvqk_beta"):
                v = normal(shape, 0.3)
            elif leaf in ("_input_norm_weight", "_output_norm_weight"):
                v = normal(shape, 0.25, 1.0)
            elif leaf in ("_input_norm_bias", "_output_norm_bias"):
                v = normal(shape, 0.2)
            elif leaf == "_uvqk_weight":
                v = normal(shape, 1.0 / shape[0] ** 0.5)
            elif leaf == "_output_weight":
                v = normal(shape, 0.7 / shape[0] ** 0.5)
            elif p.dim() == 2:  # Linear weight [out, in]
                v = normal(shape, 1.0 / max(shape[1], 1) ** 0.5)
            elif leaf == "weight":  # LayerNorm / SwishLayerNorm
                v = normal(shape, 0.25, 1.0)
            elif leaf == "bias":
                v = normal(shape, 0.2)
            else:
                raise RuntimeError(f"randomize: no rule for {name} {shape}")
            p.copy_(v.to(p.dtype))


def rescale_head(model, users):
    """Per task: the last prediction Linear's row rescaled so that the batched logits span +-2.5."""
    head = model._multitask_module._prediction_module[2]
    kinds = [hstu_ref.task_type_name(t.task_type) for t in model._multitask_configs]
    m64 = hstu_ref.to_float64(model)
    preds = hstu_ref.run(m64, users)
    with torch.no_grad():
        for k, (t, kind) in enumerate(zip(preds, kinds)):
            z = torch.tensor([x for u in preds[t] for x in u], dtype=torch.float64)
            if kind == "binary_classification":
                z = torch.logit(z)
            s = 2.5 / (z - z.mean()).abs().max()
            head.weight[k].mul_(s.item())
            head.bias[k] = ((head.bias[k].double() - z.mean()) * s).item()


# ---------------------------------------------------------------------------------------------
# users


def make_users(spec, config, rng):
    c = config["hstu_config"]
    tab = config["tables"]
    ctx = c["contextual_feature_to_max_length"]
    rows = {f: t["num_embeddings"] for t in tab.values() for f in t["feature_names"]}
    aw_bits = 32
    users = []
    for i, (n, m) in enumerate(zip(spec["histories"], spec["candidates"])):
        uih, cand = {}, {}
        for f, max_len in ctx.items():
            length = max_len if not (f == "user_segment" and i == 3) else max_len - 1  # one short contextual list
            uih[f] = [int(x) for x in rng.integers(0, rows[f], length)]
        # seconds from the query time back to each action: half within the first ~20 time buckets
        # (bucket = floor(sqrt(delta / 60))), half log-uniform from a minute to ~3 years; some equal
        query = int(rng.integers(1_550_000_000, 1_750_000_000))
        near = rng.uniform(0, spec.get("near_seconds", 26_000), n)
        far = np.exp(rng.uniform(np.log(60), np.log(1e8), n))
        deltas = np.where(rng.uniform(0, 1, n) < 0.5, near, far).astype(np.int64)
        deltas = np.sort(deltas)[::-1].copy()
        for k in range(1, n):
            if rng.uniform() < 0.1:
                deltas[k] = deltas[k - 1]  # two actions at the same second
        times = [query - int(x) for x in deltas]
        ids = [int(x) for x in rng.integers(0, rows["item_id"], n)]
        for f in c["hstu_uih_feature_names"]:
            if f in ctx:
                continue
            if f == "item_id":
                uih[f] = ids
            elif f == "item_category_id":
                uih[f] = [int(x) for x in rng.integers(0, rows[f], n)]
            elif f == "action_timestamp":
                uih[f] = times
            elif f == "item_weights":
                uih[f] = [int(x) for x in rng.integers(0, aw_bits, n)]
            elif f == "item_rating":
                uih[f] = [int(x) for x in rng.integers(1, 6, n)]
            elif f == "dummy_watch_time":
                uih[f] = [0] * n
            else:
                raise RuntimeError(f"make_users: no rule for uih feature {f}")
        for f in c["hstu_candidate_feature_names"]:
            if f == "item_candidate_id":
                cand[f] = [int(x) for x in rng.integers(0, rows[f], m)]
            elif f == "item_candidate_category_id":
                cand[f] = [int(x) for x in rng.integers(0, rows[f], m)]
            elif f == "item_query_time":
                if i == spec.get("spread_query_user"):  # candidates with different query times
                    cand[f] = sorted(query + int(x) for x in rng.integers(0, 4 * 86400, m))
                else:
                    cand[f] = [query] * m
            elif f == "item_action_weights":
                cand[f] = [int(x) for x in rng.integers(0, aw_bits, m)]
            elif f == "item_candidate_rating":
                cand[f] = [int(x) for x in rng.integers(1, 6, m)]
            elif f == "item_dummy_watchtime":
                cand[f] = [1] * m
            else:
                raise RuntimeError(f"make_users: no rule for candidate feature {f}")
        users.append({"uih": {f: uih[f] for f in c["hstu_uih_feature_names"]},
                      "candidates": {f: cand[f] for f in c["hstu_candidate_feature_names"]}})
    return users


# ---------------------------------------------------------------------------------------------
# checks


def fail(msg):
    sys.exit(f"hstu_fixtures.py: FAILED {msg}")


def max_diff(a, b):
    """Max |a - b| over two run() results."""
    err = 0.0
    for t in a:
        for x, y in zip(a[t], b[t]):
            if len(x) != len(y):
                return float("inf")
            err = max(err, max((abs(p - q) for p, q in zip(x, y)), default=0.0))
    return err


def run_alone(model, users):
    out = {}
    for u in users:
        for t, v in hstu_ref.run(model, [u]).items():
            out.setdefault(t, []).extend(v)
    return out


def per_user(res, n):
    return [{t: res[t][i] for t in res} for i in range(n)]


def check_collate(model, users):
    """dlrm_v3's collate_fn (fbgemm reorder ops) vs a plain key-major concatenation."""
    cfg = model._hstu_configs
    uih, cand = hstu_ref.batch(model, users)
    for kjt, keys, part in ((uih, cfg.hstu_uih_feature_names, "uih"),
                            (cand, cfg.hstu_candidate_feature_names, "candidates")):
        lengths = [len(u[part][k]) for k in keys for u in users]
        values = [x for k in keys for u in users for x in u[part][k]]
        if kjt.keys() != list(keys) or kjt.lengths().tolist() != lengths or kjt.values().tolist() != values:
            fail(f"dlrm_v3 collate of the {part} features differs from the key-major layout")


def check_sensitivity(model, users, name):
    """Every parameter tensor must move the outputs, so that Ember's parity test covers it."""
    m64 = hstu_ref.to_float64(model)
    base = hstu_ref.run(m64, users)
    params = dict(m64.named_parameters())
    dead = []
    for pname, p in params.items():
        saved = p.detach().clone()
        with torch.no_grad():
            p.add_(torch.full_like(p, 0.05) + 0.05 * saved.abs())
        if max_diff(hstu_ref.run(m64, users), base) <= 1e-4:
            dead.append(pname)
        with torch.no_grad():
            p.copy_(saved)
    if dead:
        fail(f"{name}: parameters with no visible effect on the outputs: {dead}")


def check_triton_kernel(model, users, name):
    """The Triton position kernel (interpreted on CPU) differs from the PyTorch one by the time-bucket
    clamp alone: equal once the timestamp table has dim rows (both clamps at dim - 1), and visibly
    different with the fixture's table (so the fixture tells the two clamps apart)."""
    pt = hstu_ref.run(model, users)
    tri = hstu_ref.use_triton_time_buckets(copy.deepcopy(model))
    gap = max_diff(hstu_ref.run(tri, users), pt)
    if not gap > 1e-3:
        fail(f"{name}: the Triton and PyTorch time-bucket clamps give the same outputs ({gap:.3g})")
    d = model._hstu_configs.hstu_transducer_embedding_dim
    cut_pt = hstu_ref.resize_positional(copy.deepcopy(model), model._hstu_transducer._positional_encoder.
                                        _position_embeddings_weight.shape[0], d - 1)
    cut_tri = hstu_ref.use_triton_time_buckets(copy.deepcopy(cut_pt))
    err = max_diff(hstu_ref.run(cut_tri, users), hstu_ref.run(cut_pt, users))
    if not err <= 1e-6:
        fail(f"{name}: Triton vs PyTorch position kernel with a {d}-row timestamp table: {err:.3g}")


def check_export_errors(sd, config_path, tmp):
    """export_torch must name the tensor that is extra, missing, misshapen or a wrong buffer."""
    c, tabs = export_torch.read_hstu_config(config_path)
    some = "_hstu_transducer._stu_module._stu_layers.0._uvqk_beta"
    buf = "_hstu_transducer._input_preprocessor._action_encoder._combined_action_weights"
    cases = {
        "extra": ({**sd, "_hstu_transducer._stu_module._stu_layers.9._uvqk_weight": torch.zeros(1)},
                  "_hstu_transducer._stu_module._stu_layers.9._uvqk_weight"),
        "missing": ({k: v for k, v in sd.items() if k != some}, some),
        "shape": ({**sd, some: torch.zeros(sd[some].numel() + 1)}, some),
        "buffer": ({**sd, buf: sd[buf].flip(0)}, buf),
    }
    for what, (bad, key) in cases.items():
        try:
            export_torch.export_hstu(bad, c, tabs)
        except export_torch.ExportError as e:
            if key not in str(e):
                fail(f"export error for a {what} tensor does not name {key}: {e}")
        else:
            fail(f"export_torch accepted a state_dict with a {what} tensor ({key})")
    # and through the command line: exits with the message
    path = os.path.join(tmp, "bad_state.pt")
    torch.save(cases["extra"][0], path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            export_torch.main(["--from", "generative-recommenders", path, "--hstu-config", config_path,
                               "--out", os.path.join(tmp, "bad")])
        except SystemExit as e:
            if cases["extra"][1] not in str(e.code):
                fail(f"export_torch.py's exit message does not name the extra tensor: {e.code}")
        else:
            fail("export_torch.py exported a state_dict with an extra tensor")


# ---------------------------------------------------------------------------------------------


def export(argv):
    """tools/export_torch.py's command line, its summary line silenced."""
    with contextlib.redirect_stdout(io.StringIO()):
        export_torch.main(argv)


def make(name, tmp, quant=()):
    spec = FIXTURES[name]
    config = json.loads(json.dumps(spec["config"]))  # strings as a JSON file gives them
    torch.manual_seed(spec["seed"])
    model = hstu_ref.build_model(config)
    hstu_ref.resize_positional(model, spec["num_position_buckets"], spec["num_time_buckets"])
    randomize(model, spec["seed"])
    rng = np.random.default_rng(spec["seed"])
    users = make_users(spec, config, rng)
    rescale_head(model, users)
    check_collate(model, users)
    check_sensitivity(model, users, name)

    state = os.path.join(tmp, f"{name}_state.pt")
    cfg_path = os.path.join(tmp, f"{name}_config.json")
    torch.save(model.state_dict(), state)
    with open(cfg_path, "w") as f:
        json.dump(config, f, indent=1)
    check_export_errors(model.state_dict(), cfg_path, tmp)

    out = os.path.join(OUT, name)
    shutil.rmtree(out, ignore_errors=True)
    clamp = spec.get("clamp", "pytorch")
    export(["--from", "generative-recommenders", state, "--hstu-config", cfg_path, "--out", out,
            "--time-bucket-clamp", clamp])

    model = hstu_ref.load(state, config)  # what a user of the checkpoint gets
    if clamp == "triton":
        check_triton_kernel(model, users, name)
        hstu_ref.use_triton_time_buckets(model)
    batched = hstu_ref.run(model, users)
    alone = run_alone(model, users)
    m64 = hstu_ref.to_float64(model)
    e32 = max(max_diff(batched, hstu_ref.run(m64, users)), max_diff(alone, run_alone(m64, users)))
    if not e32 < 1e-5:
        fail(f"{name}: float32 vs float64 reference: max |diff| {e32:.3g} >= 1e-5")
    ember = hstu_ref.load_ember(out)
    e_rt = max(max_diff(batched, hstu_ref.run(ember, users)), max_diff(alone, run_alone(ember, users)))
    if not e_rt <= 1e-6:
        fail(f"{name}: exported model read back vs reference: max |diff| {e_rt:.3g} > 1e-6")
    gap = max_diff(batched, alone)

    def write(d, alone_res, batched_res):
        with open(os.path.join(d, "users.jsonl"), "w") as f:
            for u in users:
                f.write(json.dumps(u, separators=(",", ":")) + "\n")
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump({"alone": per_user(alone_res, len(users)), "batched": per_user(batched_res, len(users))}, f)
            f.write("\n")

    write(out, alone, batched)
    sizes = {}
    for dtype in quant:
        qout = f"{out}_{dtype}"
        shutil.rmtree(qout, ignore_errors=True)
        export(["--from", "generative-recommenders", state, "--hstu-config", cfg_path, "--out", qout,
                "--time-bucket-clamp", "pytorch", "--dtype", dtype])
        q = hstu_ref.load_ember(qout)  # the tables as PyTorch itself dequantizes them
        qb, qa = hstu_ref.run(q, users), run_alone(q, users)
        write(qout, qa, qb)
        sizes[dtype] = (sum(os.path.getsize(os.path.join(qout, f)) for f in os.listdir(qout)), max_diff(qb, batched))

    scores = [x for t in batched for u in batched[t] for x in u]
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    ctx_min = config["hstu_config"]["contextual_feature_to_min_uih_length"]
    print(f"  {name}: {size / 1024:.1f} KiB, {len(users)} users, {sum(spec['candidates'])} candidates, "
          f"outputs in [{min(scores):.3f}, {max(scores):.3f}]; f32 vs f64 {e32:.2g}, read back {e_rt:.2g}; "
          f"max |batched - alone| {gap:.3g}; min_uih_length {ctx_min}, seq lengths "
          f"{[h + c for h, c in zip(spec['histories'], spec['candidates'])]}")
    for dtype, (qsize, qerr) in sizes.items():
        print(f"  {name}_{dtype}: {qsize / 1024:.1f} KiB, max |diff| vs f32 tables {qerr:.3g}")
    return size + sum(s for s, _ in sizes.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(FIXTURES), action="append", help="fixture(s) to write (default all)")
    ap.add_argument("--quant", choices=["f16", "bf16", "int8", "int4"], action="append", default=[],
                    help="also write {fixture}_{dtype} with the tables in that dtype (expected outputs: the "
                         "reference on the tables as PyTorch dequantizes them); not written by default, to "
                         "keep the fixtures small")
    a = ap.parse_args()
    v = hstu_ref.versions()
    print("reference: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only or FIXTURES:
            total += make(name, tmp, a.quant)
    print(f"fixtures OK in {os.path.relpath(OUT, ROOT)} ({total / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
