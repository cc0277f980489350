#!/usr/bin/env python3
"""Converts a PyTorch DLRM to an Ember model directory (config.json + model.safetensors).

The format is docs/model-format.md. Two sources:

  # facebookresearch/dlrm: a `--save-model` checkpoint (dict with `state_dict`) or a bare state_dict,
  # with the arch flags it was trained with (they are checked against the weights)
  ~/.venvs/torch/bin/python tools/export_torch.py --from dlrm model.pt --out models/kaggle \\
      --arch-sparse-feature-size 16 --arch-mlp-bot 13-512-256-64-16 --arch-mlp-top 512-256-1 \\
      --arch-interaction-op dot

  # TorchRec DLRM or DLRM_DCN (DCN is detected from inter_arch.crossnet.* keys): a state_dict
  ~/.venvs/torch/bin/python tools/export_torch.py --from torchrec dlrm_state.pt --out models/dcn \\
      --features t_cat_0:cat_0,t_cat_1:cat_1

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
                    help="KIND is dlrm (facebookresearch/dlrm) or torchrec (DLRM / DLRM_DCN state_dict)")
    ap.add_argument("--out", required=True, help="model directory to write")
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
    a = ap.parse_args(argv)
    kind, path = a.source
    names = a.feature_names.split(",") if a.feature_names else None
    try:
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
            raise ExportError(f"--from {kind}: expected dlrm or torchrec")
        write_model(a.out, cfg, tensors)
    except ExportError as e:
        sys.exit(f"export_torch.py: error: {e}")
    t = cfg["tables"]
    print(f"wrote {a.out}: {cfg['family']}, {len(t)} tables ({sum(x['rows'] for x in t)} rows, {a.dtype}), "
          f"{len(cfg['features'])} features, bottom {cfg['bottom_mlp']}, {cfg['interaction']}, top {cfg['top_mlp']}")


if __name__ == "__main__":
    main()
