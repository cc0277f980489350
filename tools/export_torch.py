#!/usr/bin/env python3
"""Converts a PyTorch DLRM or HSTU model to an Ember model directory (config.json + model.safetensors).

The format is docs/model-format.md. Three sources:

  # facebookresearch/dlrm: a `--save-model` checkpoint (dict with `state_dict`) or a bare state_dict,
  # with the arch flags it was trained with (they are checked against the weights)
  ~/.venvs/torch/bin/python tools/export_torch.py --from dlrm model.pt --out models/kaggle \\
      --arch-sparse-feature-size 16 --arch-mlp-bot 13-512-256-64-16 --arch-mlp-top 512-256-1 \\
      --arch-interaction-op dot

  # TorchRec DLRM or DLRM_DCN (DCN is detected from inter_arch.crossnet.* keys): a state_dict
  ~/.venvs/torch/bin/python tools/export_torch.py --from torchrec dlrm_state.pt --out models/dcn \\
      --features t_cat_0:cat_0,t_cat_1:cat_1

  # generative-recommenders DlrmHSTU (the MLPerf DLRMv3 ranking model): a state_dict and its config
  ~/.venvs/hstu/bin/python tools/export_torch.py --from generative-recommenders dlrm_hstu_state.pt \\
      --hstu-config CONFIG.json --out models/hstu [--time-bucket-clamp triton|pytorch]

Shapes come from the weights; the flags, where given, are cross-checked against them.
`--dtype int8|int4` quantizes the tables at import with PyTorch's FBGEMM row-wise prepack
(int8: dim codes + f32 scale + f32 bias per row; int4: ceil(dim/2) bytes, low nibble first, + f16
scale + f16 bias; odd dims are packed with one padding code). `--dtype f16|bf16` casts them.
MLP and cross-net weights stay f32.

Features: dlrm has one feature per table (tables t0.., features C1.. unless --feature-names).
TorchRec's state_dict does not record feature names: by default each table gets one feature
named after it; `--feature-names` renames them (one per table), `--features table:feature,...`
lists them in the model's order (TorchRec's: the tables in order, each table's features in
order), which is how a table read by several features is expressed.

HSTU: CONFIG.json is {"hstu_config": dataclasses.asdict(DlrmHSTUConfig), "tables": {name:
{"num_embeddings", "embedding_dim", "feature_names"}}} (the EmbeddingConfigs; a task_type may be 0 /
1 or binary_classification / regression; missing DlrmHSTUConfig fields take its defaults). Every
tensor's shape is checked against what the config implies (an unknown or missing tensor is an
error naming it). model.safetensors holds every dense parameter under its state_dict name, as F32
(`_hstu_transducer._stu_module._stu_layers.0._uvqk_weight`, `_item_embedding_mlp.0.weight`, ...),
and the tables `_embedding_collection.embeddings.{table}.weight` as `tables.{table}` in --dtype.
The buffers (the action encoder's `_combined_action_weights`, the timestamp postprocessor's
`_period_units` / `_units_per_period`) are checked against the config and not written.
config.json is {"format": "ember-hstu", "format_version": 1, "family": "hstu", "hstu": {every
DlrmHSTUConfig field (task types by name, the feature mapping as [[uih, candidate], ...]),
"num_position_buckets": rows of the position table (8192 in DlrmHSTU), "num_time_buckets": rows
of the timestamp table - 1 (2048), "time_bucket_clamp"}, "tables": [{name, rows, dim, dtype}],
"features": [{name, table}] (every table's feature names, in the tables' order)}.
`--time-bucket-clamp`: the reference's Triton kernel saturates time buckets at num_time_buckets;
its PyTorch kernel (ops/pytorch/pt_position.py) at the timestamp table's embedding dim - 1 (a
bug). Default triton, what the published GPU runs use; pytorch for parity with the PyTorch kernel.
Needs only torch and safetensors (not the generative_recommenders package).

Checkpoints are loaded with `torch.load(weights_only=True)`; one that holds other Python objects
(dlrm's checkpoints store numpy scalars) needs `--trust-checkpoint`, which unpickles it fully:
only use it on files you trust.
"""

import argparse
import json
import os
import re
import sys

import torch
from safetensors.torch import save_file

DTYPES = ("f32", "f16", "bf16", "int8", "int4")


class ExportError(Exception):
    """A checkpoint that cannot be exported as asked; the message says why."""


def encode_table(w, dtype):
    """float [rows, dim] -> the `tables.{name}` tensor for `dtype` (docs/model-format.md)."""
    w = w.detach().float().contiguous()
    if dtype == "f32":
        return w
    if dtype == "f16":
        return w.to(torch.float16)
    if dtype == "bf16":
        return w.to(torch.bfloat16)
    rows, dim = w.shape
    if dtype == "int8":
        q = torch.ops.quantized.embedding_bag_byte_prepack(w)
        expect = dim + 8
    elif dtype == "int4":
        # FBGEMM packs even dims only; a copy of column 0 as padding leaves min/max (so scale
        # and bias) unchanged and only fills the unused high nibble of the last byte.
        padded = torch.cat([w, w[:, :1]], dim=1) if dim % 2 else w
        q = torch.ops.quantized.embedding_bag_4bit_prepack(padded.contiguous())
        expect = (dim + 1) // 2 + 4
    else:
        raise ExportError(f"unknown --dtype {dtype!r} (one of {', '.join(DTYPES)})")
    if q.dtype != torch.uint8 or tuple(q.shape) != (rows, expect):
        raise ExportError(f"{dtype} prepack gave {q.dtype} {tuple(q.shape)}, expected uint8 {(rows, expect)}")
    return q.contiguous()


def _mlp_layers(sd, pattern, what, step=1):
    """Collects the Linear layers whose keys match `pattern` (one group: the layer index)."""
    found = {}
    for key in sd:
        m = re.fullmatch(pattern, key)
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = key
    idx = sorted(found)
    if idx != list(range(0, step * len(idx), step)):
        raise ExportError(f"{what}: Linear layers at indices {idx}, expected {list(range(0, step * len(idx), step))}")
    layers = []
    for i in idx:
        if set(found[i]) != {"weight", "bias"}:
            raise ExportError(f"{what}: layer {i} needs a weight and a bias, has {sorted(found[i])}")
        w, b = sd[found[i]["weight"]], sd[found[i]["bias"]]
        if w.dim() != 2 or tuple(b.shape) != (w.shape[0],):
            raise ExportError(f"{what}: layer {i} has weight {tuple(w.shape)} and bias {tuple(b.shape)}")
        if layers and layers[-1][0].shape[0] != w.shape[1]:
            raise ExportError(f"{what}: layer {i} takes {w.shape[1]} inputs but the previous one gives "
                              f"{layers[-1][0].shape[0]}")
        layers.append((w, b))
    return layers, [found[i][p] for i in idx for p in ("weight", "bias")]


def _mlp_tensors(prefix, layers):
    out = {}
    for k, (w, b) in enumerate(layers):
        out[f"{prefix}.{k}.weight"] = w.detach().float().contiguous()
        out[f"{prefix}.{k}.bias"] = b.detach().float().contiguous()
    return out


def _parse_sizes(text, flag):
    try:
        return [int(x) for x in text.split("-")]
    except ValueError:
        raise ExportError(f"{flag} {text!r}: expected sizes joined by '-', e.g. 13-512-256-64") from None


def _check_unknown(sd, used, what):
    extra = sorted(set(sd) - set(used))
    if extra:
        raise ExportError(f"unexpected keys in the {what} state_dict: {', '.join(extra[:8])}"
                          + (f" (and {len(extra) - 8} more)" if len(extra) > 8 else ""))


def _model(family, dense_in, bottom, interaction, top, tables, features, pooling="sum"):
    if top[-1][0].shape[0] != 1:
        raise ExportError(f"the top MLP must end in 1 output, it ends in {top[-1][0].shape[0]}")
    names = [f["name"] for f in features]
    if len(set(names)) != len(names):
        raise ExportError(f"feature names must be unique: {names}")
    return {
        "format": "ember-dlrm",
        "format_version": 1,
        "family": family,
        "dense_in": dense_in,
        "bottom_mlp": [w.shape[0] for w, _ in bottom],
        "interaction": interaction,
        "top_mlp": [w.shape[0] for w, _ in top],
        "tables": tables,
        "features": features,
        "pooling": pooling,
    }


def export_dlrm(sd, dtype="f32", arch_mlp_bot=None, arch_mlp_top=None, arch_sparse_feature_size=None,
                arch_interaction_op="dot", arch_interaction_itself=False, feature_names=None):
    """facebookresearch/dlrm state_dict -> (config dict, tensors dict)."""
    sd = {re.sub(r"^(bot_l|top_l)\.module\.", r"\1.", k): v for k, v in sd.items()}  # DDP-wrapped MLPs
    special = [k for k in sd if re.fullmatch(r"emb_l\.\d+\.(weight_q|weight_r|embs\.weight|proj\.weight)", k)]
    if special:
        raise ExportError(f"QR / mixed-dimension embeddings (--qr-flag / --md-flag) are not supported "
                          f"(found {special[0]}); retrain with plain embeddings")
    emb = {int(m.group(1)): k for k in sd if (m := re.fullmatch(r"emb_l\.(\d+)\.weight", k))}
    if not emb:
        raise ExportError("no emb_l.{i}.weight keys: not a facebookresearch/dlrm state_dict "
                          "(for TorchRec use --from torchrec)")
    if sorted(emb) != list(range(len(emb))):
        raise ExportError(f"embedding tables are not numbered 0..{len(emb) - 1}: {sorted(emb)}")
    weights = [sd[emb[i]] for i in range(len(emb))]
    if any(w.dim() != 2 for w in weights):
        raise ExportError(f"embedding weights must be 2-D, got {[tuple(w.shape) for w in weights]}")
    bottom, bkeys = _mlp_layers(sd, r"bot_l\.(\d+)\.(weight|bias)", "bottom MLP (bot_l)", step=2)
    top, tkeys = _mlp_layers(sd, r"top_l\.(\d+)\.(weight|bias)", "top MLP (top_l)", step=2)
    _check_unknown(sd, list(emb.values()) + bkeys + tkeys, "dlrm")
    if not bottom or not top:
        raise ExportError("the dlrm state_dict needs a bottom (bot_l) and a top (top_l) MLP")

    ln_bot = [bottom[0][0].shape[1]] + [w.shape[0] for w, _ in bottom]
    if arch_mlp_bot is not None and _parse_sizes(arch_mlp_bot, "--arch-mlp-bot") != ln_bot:
        raise ExportError(f"--arch-mlp-bot {arch_mlp_bot} does not match the weights: {'-'.join(map(str, ln_bot))}")
    d = ln_bot[-1]
    dims = [w.shape[1] for w in weights]
    if arch_sparse_feature_size is not None and any(x != arch_sparse_feature_size for x in dims):
        raise ExportError(f"--arch-sparse-feature-size {arch_sparse_feature_size} does not match the "
                          f"tables' dims {dims}")
    n = len(weights) + 1
    sizes = {"cat": d + sum(dims), "dot": d + n * (n - 1) // 2, "dot --arch-interaction-itself": d + n * (n + 1) // 2}
    if arch_interaction_op == "dot":
        if any(x != d for x in dims):
            raise ExportError(f"dot interaction needs every table dim to equal the bottom MLP output {d}, "
                              f"got {dims}")
        asked = "dot --arch-interaction-itself" if arch_interaction_itself else "dot"
        interaction = {"kind": "dot", "self_interaction": bool(arch_interaction_itself), "pair_order": "lower"}
    elif arch_interaction_op == "cat":
        asked, interaction = "cat", {"kind": "cat"}
    else:
        raise ExportError(f"--arch-interaction-op {arch_interaction_op!r} is not supported (dot or cat)")
    top_in = top[0][0].shape[1]
    if top_in != sizes[asked]:
        fits = [k for k, v in sizes.items() if v == top_in]
        hint = f"; the weights fit --arch-interaction-op {fits[0]}" if fits else ""
        raise ExportError(f"the top MLP takes {top_in} inputs but {asked} interaction gives {sizes[asked]}{hint}")
    ln_top = [w.shape[0] for w, _ in top]
    if arch_mlp_top is not None and _parse_sizes(arch_mlp_top, "--arch-mlp-top") != ln_top:
        raise ExportError(f"--arch-mlp-top {arch_mlp_top} does not match the weights' output sizes: "
                          f"{'-'.join(map(str, ln_top))}")

    names = feature_names or [f"C{i + 1}" for i in range(len(weights))]
    if len(names) != len(weights):
        raise ExportError(f"--feature-names has {len(names)} names for {len(weights)} tables")
    tables = [{"name": f"t{i}", "rows": w.shape[0], "dim": w.shape[1], "dtype": dtype} for i, w in enumerate(weights)]
    features = [{"name": nm, "table": f"t{i}"} for i, nm in enumerate(names)]
    cfg = _model("dlrm", ln_bot[0], bottom, interaction, top, tables, features)
    tensors = {**_mlp_tensors("bottom_mlp", bottom), **_mlp_tensors("top_mlp", top)}
    tensors.update({f"tables.t{i}": encode_table(w, dtype) for i, w in enumerate(weights)})
    return cfg, tensors


TR_TABLE = r"sparse_arch\.embedding_bag_collection\.embedding_bags\.(.+)\.weight"


def export_torchrec(sd, dtype="f32", features=None, feature_names=None, pooling="sum"):
    """TorchRec DLRM / DLRM_DCN state_dict -> (config dict, tensors dict).

    features: [(table, feature), ...] in the model's order; feature_names: one per table.
    """
    anchor = next((k for k in sd if re.search(TR_TABLE, k)), None)
    if anchor is None:
        raise ExportError("no sparse_arch.embedding_bag_collection.embedding_bags.*.weight keys: not a "
                          "TorchRec DLRM state_dict (for facebookresearch/dlrm use --from dlrm)")
    prefix = anchor[: re.search(TR_TABLE, anchor).start()]  # e.g. "model." from DLRMTrain
    if any(not k.startswith(prefix) for k in sd):
        raise ExportError(f"keys do not share the prefix {prefix!r} of {anchor!r}")
    sd = {k[len(prefix):]: v for k, v in sd.items()}
    if any(k.startswith("inter_arch.interaction_branch") for k in sd):
        raise ExportError("DLRM_Projection (inter_arch.interaction_branch*) is not supported")
    tables = [(m.group(1), v) for k, v in sd.items() if (m := re.fullmatch(TR_TABLE, k))]
    tkeys = [f"sparse_arch.embedding_bag_collection.embedding_bags.{t}.weight" for t, _ in tables]
    bottom, bkeys = _mlp_layers(sd, r"dense_arch\.model\._mlp\.(\d+)\._linear\.(weight|bias)", "dense_arch")
    over, okeys = _mlp_layers(sd, r"over_arch\.model\.0\._mlp\.(\d+)\._linear\.(weight|bias)", "over_arch MLP")
    lkeys = ["over_arch.model.1.weight", "over_arch.model.1.bias"]
    last = [(sd[lkeys[0]], sd[lkeys[1]])] if all(k in sd for k in lkeys) else []
    cross = {}
    for k in sd:
        if m := re.fullmatch(r"inter_arch\.crossnet\.(W_kernels|V_kernels|bias)\.(\d+)", k):
            cross.setdefault(int(m.group(2)), {})[m.group(1)] = k
    _check_unknown(sd, tkeys + bkeys + okeys + lkeys + [k for v in cross.values() for k in v.values()], "TorchRec")
    if not bottom or not over or len(last) != 1:
        raise ExportError("the TorchRec state_dict needs dense_arch, over_arch.model.0 and over_arch.model.1")
    top = over + last
    w, b = last[0]
    if w.dim() != 2 or tuple(b.shape) != (w.shape[0],) or w.shape[1] != over[-1][0].shape[0]:
        raise ExportError(f"over_arch.model.1 has weight {tuple(w.shape)} and bias {tuple(b.shape)} after "
                          f"an MLP giving {over[-1][0].shape[0]}")

    d = bottom[-1][0].shape[0]
    bad = [(t, tuple(w.shape)) for t, w in tables if w.dim() != 2 or w.shape[1] != d]
    if bad:
        raise ExportError(f"TorchRec DLRM needs every table dim to equal the dense_arch output {d}: {bad}")
    names = [t for t, _ in tables]
    if features is not None and feature_names is not None:
        raise ExportError("give --features or --feature-names, not both")
    if features is None:
        fnames = feature_names or names
        if len(fnames) != len(names):
            raise ExportError(f"--feature-names has {len(fnames)} names for {len(names)} tables {names}")
        features = list(zip(names, fnames))
    order = []
    for t, f in features:
        if t not in names:
            raise ExportError(f"--features: feature {f!r} names table {t!r}, the tables are {names}")
        order.append(names.index(t))
    if sorted(order) != order or sorted(set(order)) != list(range(len(names))):
        raise ExportError(f"--features must list every table's features in TorchRec's order "
                          f"(tables {names} in this order, each table at least once)")
    n = len(features) + 1
    if cross:
        layers = sorted(cross)
        if layers != list(range(len(layers))) or any(len(cross[l]) != 3 for l in layers):
            raise ExportError(f"inter_arch.crossnet needs W_kernels, V_kernels and bias for layers 0..L-1: {cross}")
        r = sd[cross[0]["W_kernels"]].shape[1]
        big_n = n * d
        for l in layers:
            got = [tuple(sd[cross[l][p]].shape) for p in ("V_kernels", "W_kernels", "bias")]
            if got != [(r, big_n), (big_n, r), (big_n,)]:
                raise ExportError(f"crossnet layer {l}: V, W, bias have shapes {got}, expected "
                                  f"{[(r, big_n), (big_n, r), (big_n,)]} for {n - 1} features of dim {d}")
        family, interaction, top_in = "torchrec_dlrm_dcn", {"kind": "dcn", "layers": len(layers), "low_rank": r}, big_n
    else:
        family, top_in = "torchrec_dlrm", d + n * (n - 1) // 2
        interaction = {"kind": "dot", "self_interaction": False, "pair_order": "upper"}
    if top[0][0].shape[1] != top_in:
        raise ExportError(f"over_arch takes {top[0][0].shape[1]} inputs but {n - 1} features of dim {d} "
                          f"give {top_in} ({interaction['kind']}); check --features")
    cfg = _model(family, bottom[0][0].shape[1], bottom, interaction, top,
                 [{"name": t, "rows": w.shape[0], "dim": w.shape[1], "dtype": dtype} for t, w in tables],
                 [{"name": f, "table": t} for t, f in features], pooling)
    tensors = {**_mlp_tensors("bottom_mlp", bottom), **_mlp_tensors("top_mlp", top)}
    tensors.update({f"tables.{t}": encode_table(w, dtype) for t, w in tables})
    for l in cross:
        for part, key in (("V", "V_kernels"), ("W", "W_kernels"), ("bias", "bias")):
            tensors[f"crossnet.{l}.{part}"] = sd[cross[l][key]].detach().float().contiguous()
    return cfg, tensors


# ---------------------------------------------------------------------------------------------
# generative-recommenders DlrmHSTU (MLPerf DLRMv3)

# DlrmHSTUConfig's fields and defaults (generative_recommenders/modules/dlrm_hstu.py).
HSTU_FIELDS = {
    "max_seq_len": 16384, "max_num_candidates": 10, "max_num_candidates_inference": 5, "hstu_num_heads": 1,
    "hstu_attn_linear_dim": 256, "hstu_attn_qk_dim": 128, "hstu_attn_num_layers": 12,
    "hstu_embedding_table_dim": 192, "hstu_preprocessor_hidden_dim": 256, "hstu_transducer_embedding_dim": 0,
    "hstu_group_norm": False, "hstu_input_dropout_ratio": 0.2, "hstu_linear_dropout_rate": 0.2,
    "contextual_feature_to_max_length": {}, "contextual_feature_to_min_uih_length": {},
    "candidates_weight_feature_name": "", "candidates_watchtime_feature_name": "",
    "candidates_querytime_feature_name": "", "causal_multitask_weights": 0.2, "multitask_configs": [],
    "user_embedding_feature_names": [], "item_embedding_feature_names": [], "uih_post_id_feature_name": "",
    "uih_action_time_feature_name": "", "uih_weight_feature_name": "", "hstu_uih_feature_names": [],
    "hstu_candidate_feature_names": [], "merge_uih_candidate_feature_mapping": [], "action_weights": None,
    "action_embedding_init_std": 0.1, "enable_postprocessor": True, "use_layer_norm_postprocessor": False,
}
TASK_TYPES = ("binary_classification", "regression")  # MultitaskTaskType 0, 1
TIME_CLAMPS = ("triton", "pytorch")
# Hard-coded in DlrmHSTU / its modules.
HSTU_MLP_HIDDEN = 512  # item embedding MLP and prediction MLP
HSTU_ACTION_DIM = 8  # ContextualPreprocessor's action_embedding_dim
HSTU_TIME_FEATURES = [(3600.0, 24.0), (86400.0, 7.0)]  # TimestampLayerNormPostprocessor: hour of day, day of week


def _task_type_name(t, where):
    if isinstance(t, bool):
        raise ExportError(f"{where}: task_type {t!r}: expected 0, 1 or a name")
    if isinstance(t, int) and 0 <= t < len(TASK_TYPES):
        return TASK_TYPES[t]
    if isinstance(t, str):
        name = t.strip().lower()
        name = name.split(".", 1)[1] if name.startswith("multitasktasktype.") else name
        if name in TASK_TYPES:
            return name
    raise ExportError(f"{where}: task_type {t!r}: expected 0 (binary_classification), 1 (regression) or a name")


def _str_list(v, what):
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ExportError(f"hstu_config.{what}: expected a list of strings, got {v!r}")
    return list(v)


def hstu_config_fields(raw):
    """CONFIG.json's `hstu_config` (dataclasses.asdict(DlrmHSTUConfig)) -> every field, normalized."""
    if not isinstance(raw, dict):
        raise ExportError("hstu_config: expected an object of DlrmHSTUConfig fields")
    unknown = sorted(set(raw) - set(HSTU_FIELDS))
    if unknown:
        raise ExportError(f"hstu_config: unknown DlrmHSTUConfig fields: {', '.join(unknown)}")
    c = {k: json.loads(json.dumps(raw.get(k, v))) for k, v in HSTU_FIELDS.items()}
    for k, v in HSTU_FIELDS.items():
        if isinstance(v, bool):
            if not isinstance(c[k], bool):
                raise ExportError(f"hstu_config.{k}: expected true or false, got {c[k]!r}")
        elif isinstance(v, int):
            if not isinstance(c[k], int) or isinstance(c[k], bool):
                raise ExportError(f"hstu_config.{k}: expected an integer, got {c[k]!r}")
        elif isinstance(v, float):
            if not isinstance(c[k], (int, float)) or isinstance(c[k], bool):
                raise ExportError(f"hstu_config.{k}: expected a number, got {c[k]!r}")
            c[k] = float(c[k])
        elif isinstance(v, str):
            if not isinstance(c[k], str):
                raise ExportError(f"hstu_config.{k}: expected a string, got {c[k]!r}")
    for k in ("user_embedding_feature_names", "item_embedding_feature_names", "hstu_uih_feature_names",
              "hstu_candidate_feature_names"):
        c[k] = _str_list(c[k], k)
    for k in ("contextual_feature_to_max_length", "contextual_feature_to_min_uih_length"):
        if not isinstance(c[k], dict) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                for x in c[k].values()):
            raise ExportError(f"hstu_config.{k}: expected an object of feature -> integer >= 0, got {c[k]!r}")
    pairs = []
    for p in c["merge_uih_candidate_feature_mapping"]:
        if not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, str) for x in p):
            raise ExportError(f"hstu_config.merge_uih_candidate_feature_mapping: entry {p!r} is not [uih, candidate]")
        pairs.append([p[0], p[1]])
    c["merge_uih_candidate_feature_mapping"] = pairs
    tasks = []
    for i, t in enumerate(c["multitask_configs"]):
        if not isinstance(t, dict) or set(t) != {"task_name", "task_weight", "task_type"}:
            raise ExportError(f"hstu_config.multitask_configs[{i}]: expected task_name, task_weight, task_type; "
                              f"got {t!r}")
        if not isinstance(t["task_name"], str) or not isinstance(t["task_weight"], int) or isinstance(
                t["task_weight"], bool):
            raise ExportError(f"hstu_config.multitask_configs[{i}]: task_name must be a string and task_weight an "
                              f"integer, got {t!r}")
        tasks.append({"task_name": t["task_name"], "task_weight": t["task_weight"],
                      "task_type": _task_type_name(t["task_type"], f"hstu_config.multitask_configs[{i}]")})
    c["multitask_configs"] = tasks
    aw = c["action_weights"]
    if aw is not None and (not isinstance(aw, list) or not aw
                           or not all(isinstance(x, int) and not isinstance(x, bool) for x in aw)):
        raise ExportError(f"hstu_config.action_weights: expected null or a non-empty list of integers, got {aw!r}")
    return c


def _hstu_check_config(c, tables):
    """Cross-checks the config against itself and the tables, as DlrmHSTU's forward needs them."""
    names = [t["task_name"] for t in c["multitask_configs"]]
    if not names:
        raise ExportError("hstu_config.multitask_configs: at least one task is needed")
    if len(set(names)) != len(names):
        raise ExportError(f"hstu_config.multitask_configs: task names must be unique: {names}")
    order = [TASK_TYPES.index(t["task_type"]) for t in c["multitask_configs"]]
    if order != sorted(order):
        raise ExportError("hstu_config.multitask_configs must be sorted by task_type (binary_classification "
                          f"first, then regression), as DlrmHSTU requires: {names}")
    for k in ("hstu_num_heads", "hstu_attn_linear_dim", "hstu_attn_qk_dim", "hstu_attn_num_layers",
              "hstu_embedding_table_dim", "hstu_preprocessor_hidden_dim", "hstu_transducer_embedding_dim"):
        if c[k] <= 0:
            raise ExportError(f"hstu_config.{k} must be positive, got {c[k]}")
    feature_table = {}
    for name, t in tables.items():
        for f in t["feature_names"]:
            if f in feature_table:
                raise ExportError(f"feature {f!r} is read by tables {feature_table[f]!r} and {name!r}")
            feature_table[f] = name
    emb = c["user_embedding_feature_names"] + c["item_embedding_feature_names"]
    missing = [f for f in emb if f not in feature_table]
    if missing:
        raise ExportError(f"embedding features {missing} (user_embedding_feature_names / "
                          f"item_embedding_feature_names) are in no table")
    if not c["item_embedding_feature_names"]:
        raise ExportError("hstu_config.item_embedding_feature_names is empty")
    uih, cand = c["hstu_uih_feature_names"], c["hstu_candidate_feature_names"]
    for k, where in (("uih_post_id_feature_name", uih), ("uih_action_time_feature_name", uih),
                     ("candidates_querytime_feature_name", cand)):
        if c[k] not in where:
            raise ExportError(f"hstu_config.{k} {c[k]!r} is not among the "
                              f"{'uih' if where is uih else 'candidate'} features {where}")
    if c["uih_post_id_feature_name"] not in c["user_embedding_feature_names"]:
        raise ExportError(f"hstu_config.uih_post_id_feature_name {c['uih_post_id_feature_name']!r} must be one of "
                          f"user_embedding_feature_names")
    if c["action_weights"] is not None and c["uih_weight_feature_name"] not in uih:
        raise ExportError(f"hstu_config.uih_weight_feature_name {c['uih_weight_feature_name']!r} is not among "
                          f"the uih features (action_weights needs it)")
    for f in c["contextual_feature_to_max_length"]:
        if f not in c["user_embedding_feature_names"] or f not in uih:
            raise ExportError(f"contextual feature {f!r} must be in user_embedding_feature_names and "
                              f"hstu_uih_feature_names")
    extra = sorted(set(c["contextual_feature_to_min_uih_length"]) - set(c["contextual_feature_to_max_length"]))
    if extra:
        raise ExportError(f"contextual_feature_to_min_uih_length names non-contextual features {extra}")
    for u, v in c["merge_uih_candidate_feature_mapping"]:
        if u not in uih or v not in cand:
            raise ExportError(f"merge_uih_candidate_feature_mapping [{u!r}, {v!r}]: {u!r} must be a uih feature "
                              f"and {v!r} a candidate feature")
    for f in c["user_embedding_feature_names"] + c["item_embedding_feature_names"]:
        if f not in uih and f not in cand:
            raise ExportError(f"embedding feature {f!r} is in neither hstu_uih_feature_names nor "
                              f"hstu_candidate_feature_names")
    dims = {t["embedding_dim"] for t in tables.values()}
    if dims != {c["hstu_embedding_table_dim"]}:
        raise ExportError(f"every table's embedding_dim must be hstu_embedding_table_dim "
                          f"{c['hstu_embedding_table_dim']}, got {sorted(dims)}")


def hstu_additional_features(c):
    """DlrmHSTU._additional_embedding_features, with `!=` where the reference has `is not`."""
    return [u for u, v in c["merge_uih_candidate_feature_mapping"]
            if v in c["item_embedding_feature_names"] and u in c["user_embedding_feature_names"]
            and u != c["uih_post_id_feature_name"]]


def _hstu_mlp(prefix, d_in, hidden, d_out):
    """Linear, SwishLayerNorm, Linear (Sequential indices 0-2; callers add the LayerNorm at 3)."""
    shapes = {f"{prefix}.0.weight": (hidden, d_in), f"{prefix}.0.bias": (hidden,),
              f"{prefix}.1.weight": (hidden,), f"{prefix}.1.bias": (hidden,),
              f"{prefix}.2.weight": (d_out, hidden), f"{prefix}.2.bias": (d_out,)}
    return shapes


def hstu_param_shapes(c, tables):
    """-> ({parameter: shape} except the two positional tables, {buffer: expected value})."""
    e, d, hd = c["hstu_embedding_table_dim"], c["hstu_transducer_embedding_dim"], c["hstu_preprocessor_hidden_dim"]
    h, lin, qk = c["hstu_num_heads"], c["hstu_attn_linear_dim"], c["hstu_attn_qk_dim"]
    p, buffers = {}, {}
    for name, t in tables.items():
        p[f"_embedding_collection.embeddings.{name}.weight"] = (t["num_embeddings"], t["embedding_dim"])
    n_tasks = len(c["multitask_configs"])
    p.update(_hstu_mlp("_multitask_module._prediction_module", d, HSTU_MLP_HIDDEN, n_tasks))
    for i in range(c["hstu_attn_num_layers"]):
        s = f"_hstu_transducer._stu_module._stu_layers.{i}."
        norm = h if c["hstu_group_norm"] else lin * h
        p.update({s + "_uvqk_weight": (d, (2 * lin + 2 * qk) * h), s + "_uvqk_beta": ((2 * lin + 2 * qk) * h,),
                  s + "_input_norm_weight": (d,), s + "_input_norm_bias": (d,), s + "_output_weight": (3 * lin * h, d),
                  s + "_output_norm_weight": (norm,), s + "_output_norm_bias": (norm,)})
    pre = "_hstu_transducer._input_preprocessor."
    ctx = sum(c["contextual_feature_to_max_length"].values())
    if ctx > 0:
        p[pre + "_batched_contextual_linear_weights"] = (ctx, e, d)
        p[pre + "_batched_contextual_linear_bias"] = (ctx, d)

    def mlp_ln(prefix, d_in):
        p.update(_hstu_mlp(prefix, d_in, hd, d))
        p.update({f"{prefix}.3.weight": (d,), f"{prefix}.3.bias": (d,)})

    mlp_ln(pre + "_content_embedding_mlp", e)
    mlp_ln(pre + "_additional_embedding_mlp", e * len(hstu_additional_features(c)))
    if c["action_weights"] is not None:
        k = len(c["action_weights"])
        p[pre + "_action_encoder._action_embedding_table"] = (k, HSTU_ACTION_DIM)
        p[pre + "_action_encoder._target_action_embedding_table"] = (1, k * HSTU_ACTION_DIM)
        buffers[pre + "_action_encoder._combined_action_weights"] = [float(x) for x in c["action_weights"]]
        mlp_ln(pre + "_action_embedding_mlp", k * HSTU_ACTION_DIM)
    if c["enable_postprocessor"]:
        post = "_hstu_transducer._output_postprocessor."
        p.update({post + "_layer_norm.weight": (d,), post + "_layer_norm.bias": (d,)})
        if not c["use_layer_norm_postprocessor"]:
            p.update({post + "_time_feature_combiner.weight": (d, d + 2 * len(HSTU_TIME_FEATURES)),
                      post + "_time_feature_combiner.bias": (d,)})
            buffers[post + "_period_units"] = [[u for u, _ in HSTU_TIME_FEATURES]]
            buffers[post + "_units_per_period"] = [[n for _, n in HSTU_TIME_FEATURES]]
    item_in = e * len(c["item_embedding_feature_names"])
    p.update(_hstu_mlp("_item_embedding_mlp", item_in, HSTU_MLP_HIDDEN, d))
    p.update({"_item_embedding_mlp.3.weight": (d,), "_item_embedding_mlp.3.bias": (d,)})
    return p, buffers


HSTU_POS = "_hstu_transducer._positional_encoder._position_embeddings_weight"
HSTU_TS = "_hstu_transducer._positional_encoder._timestamp_embeddings_weight"


def read_hstu_config(path):
    """CONFIG.json -> (normalized hstu_config fields, {table: {num_embeddings, embedding_dim, feature_names}})."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: not JSON: {e}") from None
    if not isinstance(raw, dict) or set(raw) != {"hstu_config", "tables"}:
        raise ExportError(f"{path}: expected {{\"hstu_config\": ..., \"tables\": ...}}, got "
                          f"{sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
    c = hstu_config_fields(raw["hstu_config"])
    if not isinstance(raw["tables"], dict) or not raw["tables"]:
        raise ExportError(f"{path}: tables must be a non-empty object of name -> table")
    tables = {}
    for name, t in raw["tables"].items():
        keys = {"num_embeddings", "embedding_dim", "feature_names"}
        if not isinstance(t, dict) or not keys <= set(t) or set(t) - keys - {"name"}:
            raise ExportError(f"{path}: table {name!r}: expected num_embeddings, embedding_dim, feature_names; "
                              f"got {t!r}")
        if t.get("name", name) != name:
            raise ExportError(f"{path}: table {name!r} has name {t['name']!r}")
        if not all(isinstance(t[k], int) and not isinstance(t[k], bool) and t[k] > 0
                   for k in ("num_embeddings", "embedding_dim")):
            raise ExportError(f"{path}: table {name!r}: num_embeddings and embedding_dim must be positive integers")
        fn = t["feature_names"] or [name]  # torchrec's default
        if not isinstance(fn, list) or not all(isinstance(x, str) for x in fn):
            raise ExportError(f"{path}: table {name!r}: feature_names must be a list of strings")
        tables[name] = {"num_embeddings": t["num_embeddings"], "embedding_dim": t["embedding_dim"],
                        "feature_names": list(fn)}
    return c, tables


def export_hstu(sd, c, tables, dtype="f32", time_bucket_clamp="triton"):
    """DlrmHSTU state_dict + its config -> (config dict, tensors dict)."""
    if time_bucket_clamp not in TIME_CLAMPS:
        raise ExportError(f"--time-bucket-clamp {time_bucket_clamp!r}: expected one of {', '.join(TIME_CLAMPS)}")
    _hstu_check_config(c, tables)
    shapes, buffers = hstu_param_shapes(c, tables)
    d = c["hstu_transducer_embedding_dim"]
    want = set(shapes) | set(buffers) | {HSTU_POS, HSTU_TS}
    extra = sorted(set(sd) - want)
    if extra:
        raise ExportError(f"unexpected tensors in the DlrmHSTU state_dict for this config: {', '.join(extra[:8])}"
                          + (f" (and {len(extra) - 8} more)" if len(extra) > 8 else ""))
    missing = [k for k in list(shapes) + [HSTU_POS, HSTU_TS] + list(buffers) if k not in sd]
    if missing:
        raise ExportError(f"the DlrmHSTU state_dict lacks tensors this config needs: {', '.join(missing[:8])}"
                          + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""))
    for k, shape in shapes.items():
        if tuple(sd[k].shape) != tuple(shape):
            raise ExportError(f"{k} has shape {tuple(sd[k].shape)}, the config implies {tuple(shape)}")
    for k in (HSTU_POS, HSTU_TS):
        if sd[k].dim() != 2 or sd[k].shape[1] != d or sd[k].shape[0] < 1:
            raise ExportError(f"{k} has shape {tuple(sd[k].shape)}, the config implies (rows, {d})")
    for k in shapes:
        if not sd[k].is_floating_point():
            raise ExportError(f"{k} is {sd[k].dtype}, expected a floating-point tensor")
    for k, value in buffers.items():
        got = sd[k].detach().double().reshape(-1).tolist()
        flat = [x for row in value for x in row] if value and isinstance(value[0], list) else value
        if got != flat:
            raise ExportError(f"{k} is {got}, the config implies {flat}")
    num_pos = int(sd[HSTU_POS].shape[0])
    num_time = int(sd[HSTU_TS].shape[0]) - 1
    ctx = sum(c["contextual_feature_to_max_length"].values())
    if num_pos < max(ctx, 1):
        raise ExportError(f"{HSTU_POS} has {num_pos} rows, fewer than the {ctx} contextual positions")
    if time_bucket_clamp == "pytorch" and num_time + 1 < d:
        raise ExportError(f"--time-bucket-clamp pytorch clamps time buckets at the embedding dim - 1 = {d - 1}, "
                          f"but {HSTU_TS} has only {num_time + 1} rows")

    hstu = dict(c)
    hstu["num_position_buckets"] = num_pos
    hstu["num_time_buckets"] = num_time
    hstu["time_bucket_clamp"] = time_bucket_clamp
    cfg = {
        "format": "ember-hstu",
        "format_version": 1,
        "family": "hstu",
        "hstu": hstu,
        "tables": [{"name": n, "rows": t["num_embeddings"], "dim": t["embedding_dim"], "dtype": dtype}
                   for n, t in tables.items()],
        "features": [{"name": f, "table": n} for n, t in tables.items() for f in t["feature_names"]],
    }
    tensors = {}
    for k in list(shapes) + [HSTU_POS, HSTU_TS]:
        m = re.fullmatch(r"_embedding_collection\.embeddings\.(.+)\.weight", k)
        if m and m.group(1) in tables:
            tensors[f"tables.{m.group(1)}"] = encode_table(sd[k], dtype)
        else:
            tensors[k] = sd[k].detach().float().contiguous()
    return cfg, tensors


def write_model(out, cfg, tensors):
    """Writes DIR/config.json and DIR/model.safetensors."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_file(tensors, os.path.join(out, "model.safetensors"))


def load_state_dict(path, trust=False):
    """torch.load a checkpoint -> its state_dict (a dlrm checkpoint's `state_dict` entry)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=not trust)
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except Exception as e:
        if trust:
            raise ExportError(f"{path}: cannot load: {e}") from None
        raise ExportError(f"{path}: torch.load(weights_only=True) refused it ({type(e).__name__}: it holds "
                          "Python objects besides tensors, or is not a torch.save file); if you trust the file, "
                          "add --trust-checkpoint") from None
    sd = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ExportError(f"{path}: expected a state_dict (name -> tensor) or a dict with one under 'state_dict'")
    return sd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", nargs=2, metavar=("KIND", "PATH"), required=True,
                    help="KIND is dlrm (facebookresearch/dlrm), torchrec (DLRM / DLRM_DCN state_dict), "
                         "generative-recommenders (DlrmHSTU state_dict) or torch-module (FILE.py:FACTORY: any "
                         "model over TorchRec EmbeddingBagCollections, its dense part as ONNX)")
    ap.add_argument("--out", required=True, help="model directory to write")
    g = ap.add_argument_group("torch-module (any model whose sparse part is TorchRec EmbeddingBagCollections; "
                              "PATH is FILE.py:FACTORY; see tools/torch_module.py)")
    g.add_argument("--state", metavar="STATE.pt", help="a state_dict to load into FACTORY()'s model")
    g.add_argument("--example", metavar="INPUTS.pt",
                   help="torch.save of {dense [B, n], keys [F], lengths [F * B] feature-major, values}: the "
                        "batch the graph is checked on [default: 8 random samples]")
    g.add_argument("--dense-in", type=int, help="the dense features' width, for the random example batch")
    g.add_argument("--outputs", help="comma-separated names of the model's outputs [default: a dict's keys, "
                                     "'score' for one tensor, output_0.. for a tuple]")
    g.add_argument("--rtol", type=float, default=1e-5, help="largest relative error of the graph against the "
                                                            "model on the example (default 1e-5)")
    ap.add_argument("--dtype", choices=DTYPES, default="f32", help="table element type (default f32)")
    ap.add_argument("--feature-names", help="comma-separated feature names, one per table")
    ap.add_argument("--trust-checkpoint", action="store_true",
                    help="unpickle arbitrary objects in the checkpoint (only for files you trust)")
    g = ap.add_argument_group("dlrm")
    g.add_argument("--arch-sparse-feature-size", type=int, help="embedding dim, checked against the tables")
    g.add_argument("--arch-mlp-bot", help="bottom MLP sizes with the input first, e.g. 13-512-256-64")
    g.add_argument("--arch-mlp-top", help="top MLP output sizes, e.g. 512-256-1")
    g.add_argument("--arch-interaction-op", choices=["dot", "cat"], default="dot")
    g.add_argument("--arch-interaction-itself", action="store_true", help="dot interaction includes self pairs")
    g = ap.add_argument_group("torchrec")
    g.add_argument("--features", help="table:feature,... in the model's feature order")
    g.add_argument("--pooling", choices=["sum", "mean"], default="sum",
                   help="the EmbeddingBagConfigs' pooling (not in the state_dict; default sum)")
    g = ap.add_argument_group("generative-recommenders")
    g.add_argument("--hstu-config", metavar="CONFIG.json",
                   help='{"hstu_config": dataclasses.asdict(DlrmHSTUConfig), "tables": {name: {"num_embeddings", '
                        '"embedding_dim", "feature_names"}}}')
    g.add_argument("--time-bucket-clamp", choices=TIME_CLAMPS,
                   help="where time buckets saturate: triton (default; num_time_buckets, the GPU kernels) or "
                        "pytorch (the embedding dim - 1, as the reference's PyTorch kernel does)")
    a = ap.parse_args(argv)
    kind, path = a.source
    names = a.feature_names.split(",") if a.feature_names else None
    try:
        if kind == "torch-module":
            import torch_module

            cfg, tensors, data, rep = torch_module.export_module(
                path, a.state, a.example, a.dtype, a.outputs.split(",") if a.outputs else None, a.rtol,
                a.trust_checkpoint, a.dense_in)
            torch_module.write(a.out, cfg, tensors, data)
            t = cfg["tables"]
            errs = ", ".join(f"{n} {e:.1e}" for n, e in rep["errors"])
            print(f"wrote {a.out}: graph ({rep['exporter']}), {len(t)} tables ({sum(x['rows'] for x in t)} rows, "
                  f"{a.dtype}), {len(cfg['features'])} features, outputs {cfg['interaction']['outputs']}; checked with "
                  f"{rep['checked_with']} on {len(rep['example']['dense'])} samples, largest relative error {errs}")
            return
        if a.state or a.example or a.outputs or a.dense_in:
            raise ExportError("--state, --example, --dense-in and --outputs are for --from torch-module")
        if kind == "generative-recommenders":
            if a.feature_names or a.features or a.pooling != "sum" or a.arch_mlp_bot or a.arch_mlp_top \
                    or a.arch_sparse_feature_size or a.arch_interaction_itself or a.arch_interaction_op != "dot":
                raise ExportError("--feature-names, --features, --pooling and the --arch-* flags are not for "
                                  "--from generative-recommenders (the features and shapes come from --hstu-config)")
            if not a.hstu_config:
                raise ExportError("--from generative-recommenders needs --hstu-config CONFIG.json")
            c, tables = read_hstu_config(a.hstu_config)
            sd = load_state_dict(path, a.trust_checkpoint)
            cfg, tensors = export_hstu(sd, c, tables, a.dtype, a.time_bucket_clamp or "triton")
            write_model(a.out, cfg, tensors)
            h = cfg["hstu"]
            print(f"wrote {a.out}: hstu, {len(cfg['tables'])} tables "
                  f"({sum(x['rows'] for x in cfg['tables'])} rows, {a.dtype}), {len(cfg['features'])} features, "
                  f"{h['hstu_attn_num_layers']} layers x {h['hstu_num_heads']} heads, "
                  f"dim {h['hstu_transducer_embedding_dim']}, tasks "
                  f"{[t['task_name'] for t in h['multitask_configs']]}, time buckets clamp {h['time_bucket_clamp']}")
            return
        if a.hstu_config or a.time_bucket_clamp:
            raise ExportError("--hstu-config and --time-bucket-clamp are for --from generative-recommenders")
        sd = load_state_dict(path, a.trust_checkpoint)
        if kind == "dlrm":
            if a.features or a.pooling != "sum":
                raise ExportError("--features and --pooling are for --from torchrec (dlrm: one feature per table, sum)")
            cfg, tensors = export_dlrm(sd, a.dtype, a.arch_mlp_bot, a.arch_mlp_top, a.arch_sparse_feature_size,
                                       a.arch_interaction_op, a.arch_interaction_itself, names)
        elif kind == "torchrec":
            if a.arch_mlp_bot or a.arch_mlp_top or a.arch_sparse_feature_size or a.arch_interaction_itself \
                    or a.arch_interaction_op != "dot":
                raise ExportError("the --arch-* flags are for --from dlrm (TorchRec shapes come from the weights)")
            feats = None
            if a.features:
                feats = [tuple(x.split(":", 1)) for x in a.features.split(",")]
                if any(len(x) != 2 for x in feats):
                    raise ExportError(f"--features {a.features!r}: expected table:feature,...")
            cfg, tensors = export_torchrec(sd, a.dtype, feats, names, a.pooling)
        else:
            raise ExportError(f"--from {kind}: expected dlrm, torchrec, generative-recommenders or torch-module")
        write_model(a.out, cfg, tensors)
    except ExportError as e:
        sys.exit(f"export_torch.py: error: {e}")
    t = cfg["tables"]
    print(f"wrote {a.out}: {cfg['family']}, {len(t)} tables ({sum(x['rows'] for x in t)} rows, {a.dtype}), "
          f"{len(cfg['features'])} features, bottom {cfg['bottom_mlp']}, {cfg['interaction']}, top {cfg['top_mlp']}")


if __name__ == "__main__":
    main()
