"""Meta's HSTU ranking model (generative-recommenders' `DlrmHSTU`, MLPerf DLRMv3) on CPU, for Ember's
import tool and parity fixtures (import, do not run).

The reference is not vendored: it is imported at run time from a generative-recommenders checkout,
found through $GR_ROOT, else PYTHONPATH, else /work/gr (the directory that holds the
`generative_recommenders` package). Environment used to write Ember's fixtures:

    python3 -m venv ~/.venvs/hstu
    ~/.venvs/hstu/bin/pip install torch torchrec numpy safetensors
    # torch 2.15.0, torchrec 1.9.2 (pulls fbgemm-gpu 1.9.0 and triton 3.9.0), numpy 2.4.6,
    # safetensors 0.8.0; the reference also needs `triton` importable (it comes with torch's
    # default Linux wheel), nothing else on the DlrmHSTU path (no gin, no pandas).

Also checked with torch 2.14.1 + fbgemm-gpu-cpu 1.9.0 + torchrec 1.9.2 (installed --no-deps, with
tensordict, torchmetrics 1.0.3, tqdm, pyre-extensions) + triton 3.8.0, where fbgemm's native CPU
ops load: tools/hstu_fixtures.py writes byte-identical fixtures in both environments.

What importing this module does (all of it in `_setup()`, idempotent):

1. fbgemm_gpu. The reference calls `torch.ops.fbgemm.*`, and torchrec imports fbgemm_gpu. The
   native library only loads when fbgemm_gpu was built for the installed torch (fbgemm-gpu 1.9.0
   from PyPI needs the NVIDIA driver's libnvidia-ml; fbgemm-gpu-cpu 1.9.0 is built for torch
   2.14 and fails on 2.15 with an undefined c10 symbol). So `import fbgemm_gpu` is tried; if it
   fails, a bare `fbgemm_gpu` package (the installed directory, its `__init__.py` not run) is put
   in sys.modules so that torchrec's pure-Python modules import.
2. fbgemm ops. Each op the reference's forward pass and dlrm_v3's collate call is probed on a tiny
   CPU input; one that is missing or fails gets a plain-PyTorch implementation registered with
   torch.library under fbgemm's own schema (same argument names, so keyword calls work):
   asynchronous_complete_cumsum, jagged_to_padded_dense, dense_to_jagged (one jagged dimension,
   which is all the reference uses), reorder_batched_ad_lengths, reorder_batched_ad_indices
   (no broadcast). `SHIMMED` lists the ops that were replaced. With torch 2.14.1 +
   fbgemm-gpu-cpu 1.9.0 the native ops load and agree with these exactly (checked on random
   inputs, and the fixtures come out bit-identical), but the native jagged_to_padded_dense /
   dense_to_jagged have no float64 kernel, so the probe also runs float64 and, failing, those two
   get these implementations for the CPU key.
3. torchrec. When fbgemm_gpu loaded natively, `import torchrec` is used as is. Otherwise
   `torchrec/__init__.py` (it imports torchrec.distributed, which loads fbgemm .so files) is not
   run: torchrec and its subpackages are registered as bare packages and only the pure-Python
   modules the reference needs are imported (torchrec.sparse.jagged_tensor,
   torchrec.modules.embedding_configs / embedding_modules); `torchrec.KeyedJaggedTensor` is set
   on the bare package because dlrm_hstu.py does `from torchrec import KeyedJaggedTensor`.
   dlrm_v3's dataset.py compiles its collate with torch.jit.script at import, which needs every
   fbgemm op torchrec's KeyedJaggedTensor names; without the native library it is imported with
   torch.jit.script replaced by the identity for the duration of that import (the collate then
   runs eagerly, with the shims).
4. Kernels. `HammerModule.hammer_kernel()` defaults to TRITON (TRITON_CC in inference);
   `build_model` sets `_hammer_kernel = HammerKernel.PYTORCH` on every module.

Entry points:

- `build_model(config) -> DlrmHSTU`: `config` is the CONFIG.json of `tools/export_torch.py --from
  generative-recommenders` ({"hstu_config": dataclasses.asdict(DlrmHSTUConfig), "tables": {name:
  {"num_embeddings", "embedding_dim", "feature_names"}}}) or an Ember `config.json`
  ("format": "ember-hstu"). is_inference=True, eval mode, PyTorch kernels, the
  EmbeddingCollection (the reference builds it on the meta device) materialized on CPU as FP32
  tables. Every string of the config is interned (sys.intern) before DlrmHSTUConfig is built:
  DlrmHSTU.__init__ picks the "additional embedding features" with `uih_feature_name is not
  self._hstu_configs.uih_post_id_feature_name`, an identity test on strings; with strings
  parsed from JSON (distinct objects) it would be True for the post-id feature itself and add it
  to the additional-embedding MLP. Interned, `is not` behaves as `!=`, the intended meaning, and
  what Ember implements.
- `load(state_pt, config)`: build_model + load_state_dict(strict=True) (a path or a state_dict).
  DlrmHSTU hard-codes 8192 position and 2048 + 1 timestamp rows; a state_dict with other sizes is
  taken as it is (`resize_positional`): both kernels read the sizes from the tables.
- `load_ember(dir)`: an exported Ember directory read back into the reference (tables decoded
  from their stored dtype). `time_bucket_clamp: pytorch` is the PyTorch kernel's clamp (the
  embedding dim - 1); `triton` runs the positional encoder on the reference's Triton kernel
  (`use_triton_time_buckets`), which on CPU needs TRITON_INTERPRET=1 set before import; Triton's
  interpreter then gets the compiler's meaning of `and` on tensors (`_interpreter_bool_ops`),
  without which the kernel's `mask_rows and mask_cols` drops the row mask and corrupts memory.
- `run(model, users) -> {task_name: [per-user list of scores]}`: `users` as in users.jsonl,
  `{"uih": {feature: [ints]}, "candidates": {feature: [ints]}}` keyed by hstu_uih_feature_names /
  hstu_candidate_feature_names. Each user becomes a (uih, candidates) pair of KeyedJaggedTensors
  of batch size 1 as dlrm_v3's datasets build them, batched with dlrm_v3's own `collate_fn`
  (kjt_batch_func); the model's mt_target_preds ([num_tasks, total_candidates]: sigmoid for
  binary tasks, raw for regression) is split per user.
- `to_float64(model)`: a float64 copy. torchrec's EmbeddingCollection casts its lookups to
  float32 (`.float()`), which a float64 model cannot take; the copy casts them to float64.
  Note the reference's PyTorch kernels still compute LayerNorm / SwishLayerNorm / the STU
  norm-mul and the timestamp features in float32 inside a float64 model.
"""

import contextlib
import copy
import dataclasses
import importlib.util
import logging
import os
import sys
import types
import warnings

import torch

SITE = os.path.dirname(os.path.dirname(torch.__file__))


def _site_of(top):
    """The directory holding package `top`: torch's site-packages, else the first of sys.path
    (a GPU machine's packages unpacked beside torch's, on PYTHONPATH)."""
    for d in [SITE] + [p for p in sys.path if p]:
        if os.path.isdir(os.path.join(d, top)):
            return d
    return SITE

GR_ROOT = os.environ.get("GR_ROOT", "/work/gr")
SHIMMED = []  # fbgemm ops given a plain-PyTorch implementation
NATIVE_FBGEMM = None  # whether fbgemm_gpu's native library loaded
_READY = False
_LIB = None


# ---------------------------------------------------------------------------------------------
# fbgemm ops in plain PyTorch


def _cumsum(t_in):
    out = torch.zeros(t_in.numel() + 1, dtype=t_in.dtype, device=t_in.device)
    out[1:] = torch.cumsum(t_in.reshape(-1), 0)
    return out


def _jagged_to_padded_dense(values, offsets, max_lengths, padding_value=0.0):
    if len(offsets) != 1 or len(max_lengths) != 1:
        raise NotImplementedError("jagged_to_padded_dense shim: one jagged dimension only")
    off = offsets[0].long()
    n = int(max_lengths[0])
    b = off.numel() - 1
    lengths = (off[1:] - off[:-1]).clamp(min=0)
    out = torch.full((b, n) + tuple(values.shape[1:]), padding_value, dtype=values.dtype, device=values.device)
    col = torch.arange(n, device=values.device).view(1, n)
    mask = col < lengths.view(-1, 1)  # [B, N]
    src = (off[:-1].view(-1, 1) + col)[mask]
    out[mask] = values[src]
    return out


def _dense_to_jagged(dense, x_offsets, total_L=None):
    if len(x_offsets) != 1:
        raise NotImplementedError("dense_to_jagged shim: one jagged dimension only")
    off = x_offsets[0].long()
    n = dense.shape[1]
    total = int(off[-1]) if total_L is None else int(total_L)
    lengths = (off[1:] - off[:-1]).clamp(min=0, max=n)
    col = torch.arange(n, device=dense.device).view(1, n)
    mask = col < lengths.view(-1, 1)
    dst = (off[:-1].view(-1, 1) + col)[mask]
    out = torch.zeros((total,) + tuple(dense.shape[2:]), dtype=dense.dtype, device=dense.device)
    out[dst] = dense[mask]
    return out, [x_offsets[0]]


def _ad_segments(batch_offsets, num_ads_in_batch, num_features):
    """(cat position, reordered position) of every (batch b, feature t, ad i) segment."""
    bo = [int(x) for x in batch_offsets.tolist()]
    cat, reo = [], []
    for b in range(len(bo) - 1):
        n_b = bo[b + 1] - bo[b]
        for t in range(num_features):
            for i in range(n_b):
                cat.append(num_features * bo[b] + t * n_b + i)
                reo.append(t * num_ads_in_batch + bo[b] + i)
    return cat, reo


def _reorder_batched_ad_lengths(cat_ad_lengths, batch_offsets, num_ads_in_batch, broadcast_lengths=False,
                                max_batch_size=0):
    if broadcast_lengths:
        raise NotImplementedError("reorder_batched_ad_lengths shim: broadcast_lengths is not supported")
    n = int(num_ads_in_batch)
    t = cat_ad_lengths.numel() // n if n else 0
    cat, reo = _ad_segments(batch_offsets, n, t)
    out = torch.empty_like(cat_ad_lengths)
    out[torch.tensor(reo, dtype=torch.long)] = cat_ad_lengths[torch.tensor(cat, dtype=torch.long)]
    return out


def _reorder_batched_ad_indices(cat_ad_offsets, cat_ad_indices, reordered_cat_ad_offsets, batch_offsets,
                                num_ads_in_batch, broadcast_indices=False, num_indices_after_broadcast=-1):
    if broadcast_indices:
        raise NotImplementedError("reorder_batched_ad_indices shim: broadcast_indices is not supported")
    n = int(num_ads_in_batch)
    t = (cat_ad_offsets.numel() - 1) // n if n else 0
    cat, reo = _ad_segments(batch_offsets, n, t)
    co, ro = cat_ad_offsets.tolist(), reordered_cat_ad_offsets.tolist()
    out = torch.empty(int(ro[-1]) if ro else 0, dtype=cat_ad_indices.dtype, device=cat_ad_indices.device)
    for c, r in zip(cat, reo):
        out[int(ro[r]):int(ro[r + 1])] = cat_ad_indices[int(co[c]):int(co[c + 1])]
    return out


SHIMS = {
    "asynchronous_complete_cumsum": ("asynchronous_complete_cumsum(Tensor t_in) -> Tensor", _cumsum,
                                     lambda: (torch.tensor([1, 2]),)),
    # float64 too: the float64 check runs through them (fbgemm-gpu-cpu 1.9.0 has no Double kernels)
    "jagged_to_padded_dense": ("jagged_to_padded_dense(Tensor values, Tensor[] offsets, SymInt[] max_lengths, "
                               "float padding_value=0.) -> Tensor", _jagged_to_padded_dense,
                               lambda: [(torch.ones(3, 2, dtype=dt), [torch.tensor([0, 1, 3])], [2], 0.0)
                                        for dt in (torch.float32, torch.float64, torch.int64)]),
    "dense_to_jagged": ("dense_to_jagged(Tensor dense, Tensor[] x_offsets, SymInt? total_L=None) -> (Tensor, Tensor[])",
                        _dense_to_jagged, lambda: [(torch.ones(2, 2, 2, dtype=dt), [torch.tensor([0, 1, 3])], 3)
                                                   for dt in (torch.float32, torch.float64)]),
    "reorder_batched_ad_lengths": ("reorder_batched_ad_lengths(Tensor cat_ad_lengths, Tensor batch_offsets, "
                                   "SymInt num_ads_in_batch, bool broadcast_lengths=False, SymInt max_batch_size=0) "
                                   "-> Tensor", _reorder_batched_ad_lengths,
                                   lambda: (torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2], dtype=torch.int32), 2)),
    "reorder_batched_ad_indices": ("reorder_batched_ad_indices(Tensor cat_ad_offsets, Tensor cat_ad_indices, "
                                   "Tensor reordered_cat_ad_offsets, Tensor batch_offsets, SymInt num_ads_in_batch, "
                                   "bool broadcast_indices=False, SymInt num_indices_after_broadcast=-1) -> Tensor",
                                   _reorder_batched_ad_indices,
                                   lambda: (torch.tensor([0, 1, 2, 3, 4]), torch.tensor([5, 6, 7, 8]),
                                            torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 1, 2], dtype=torch.int32),
                                            2)),
}


def _op_works(name):
    try:
        op = getattr(torch.ops.fbgemm, name)
        probes = SHIMS[name][2]()
        for args in probes if isinstance(probes, list) else [probes]:
            op(*args)
        return True
    except Exception:
        return False


def _install_shims():
    global _LIB
    for name, (schema, fn, _) in SHIMS.items():
        if _op_works(name):
            continue
        try:
            getattr(torch.ops.fbgemm, name)
            defined = True
        except (AttributeError, RuntimeError):
            defined = False
        if _LIB is None:
            _LIB = torch.library.Library("fbgemm", "FRAGMENT")  # noqa: TOR901
        if not defined:
            _LIB.define(schema)
        # CompositeExplicitAutograd covers CPU (and meta tracing is not needed here); a native
        # op that exists but fails on CPU (or on float64) gets this kernel for the CPU key.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            _LIB.impl(name, fn, "CompositeExplicitAutograd" if not defined else "CPU")
        if not _op_works(name):
            raise RuntimeError(f"could not install a working torch.ops.fbgemm.{name}")
        SHIMMED.append(name)


# ---------------------------------------------------------------------------------------------
# imports


def _bare_package(name):
    mod = types.ModuleType(name)
    mod.__path__ = [os.path.join(_site_of(name.split(".")[0]), *name.split("."))]
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _setup():
    global _READY, NATIVE_FBGEMM
    if _READY:
        return
    logging.disable(logging.CRITICAL)  # fbgemm_gpu logs a version warning and the load error
    try:
        import fbgemm_gpu  # noqa: F401  (loads the native ops when they match this torch)
        NATIVE_FBGEMM = True
    except Exception:
        NATIVE_FBGEMM = False
    finally:
        logging.disable(logging.NOTSET)
    if not NATIVE_FBGEMM:
        for k in [k for k in sys.modules if k == "fbgemm_gpu" or k.startswith("fbgemm_gpu.")]:
            del sys.modules[k]
        if os.path.isdir(os.path.join(_site_of("fbgemm_gpu"), "fbgemm_gpu")):
            _bare_package("fbgemm_gpu")
        else:
            sys.modules["fbgemm_gpu"] = types.ModuleType("fbgemm_gpu")
    _install_shims()
    if not os.path.isdir(os.path.join(_site_of("torchrec"), "torchrec")):
        raise ImportError("torchrec is not installed: pip install torchrec")
    if NATIVE_FBGEMM:
        import torchrec  # noqa: F401
    else:
        for pkg in ["torchrec", "torchrec.modules", "torchrec.sparse", "torchrec.distributed",
                    "torchrec.datasets", "torchrec.models"]:
            if pkg not in sys.modules:
                _bare_package(pkg)
        logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
        from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor
        import torchrec.modules.embedding_configs  # noqa: F401
        import torchrec.modules.embedding_modules  # noqa: F401

        sys.modules["torchrec"].KeyedJaggedTensor = KeyedJaggedTensor
        sys.modules["torchrec"].JaggedTensor = JaggedTensor
    if "GR_ROOT" in os.environ or importlib.util.find_spec("generative_recommenders") is None:
        root = GR_ROOT
        if not os.path.isdir(os.path.join(root, "generative_recommenders")):
            raise ImportError(f"generative_recommenders not found under {root} (set GR_ROOT or PYTHONPATH)")
        if root not in sys.path:
            sys.path.insert(0, root)
    root_level = logging.getLogger().level
    with contextlib.redirect_stdout(sys.stderr):  # a print() about Triton autotune configs
        import generative_recommenders.modules.dlrm_hstu  # noqa: F401

    # dataset.py scripts its collate (kjt_batch_func) with torch.jit.script at import, which
    # compiles KeyedJaggedTensor and so needs the schema of every fbgemm op torchrec's
    # jagged_tensor.py names (segment_sum_csr, permute_2D_sparse_data, ...). Without the native
    # library it is imported with torch.jit.script as the identity: the same function, run eagerly.
    script = torch.jit.script
    if not NATIVE_FBGEMM:
        torch.jit.script = lambda fn=None, *a, **k: fn
    try:
        import generative_recommenders.dlrm_v3.datasets.dataset  # noqa: F401 (its collate_fn)
    finally:
        torch.jit.script = script

    logging.getLogger().setLevel(root_level)  # dataset.py calls logging.basicConfig(level=INFO)
    logging.getLogger("generative_recommenders.modules.dlrm_hstu").setLevel(logging.WARNING)
    _READY = True


def versions():
    """The versions that matter for the reference outputs."""
    _setup()
    import importlib.metadata as md

    out = {"torch": torch.__version__}
    for dist in ("torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "triton", "numpy", "safetensors"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    out["fbgemm_native"] = NATIVE_FBGEMM
    out["fbgemm_shimmed"] = list(SHIMMED)
    return out


def ref():
    """The reference's classes and functions, after _setup()."""
    _setup()
    from generative_recommenders.common import HammerKernel
    from generative_recommenders.dlrm_v3.datasets.dataset import collate_fn
    from generative_recommenders.modules.dlrm_hstu import DlrmHSTU, DlrmHSTUConfig
    from generative_recommenders.modules.multitask_module import MultitaskTaskType, TaskConfig
    from torchrec.modules.embedding_configs import DataType, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return types.SimpleNamespace(DlrmHSTU=DlrmHSTU, DlrmHSTUConfig=DlrmHSTUConfig, TaskConfig=TaskConfig,
                                 MultitaskTaskType=MultitaskTaskType, HammerKernel=HammerKernel,
                                 EmbeddingConfig=EmbeddingConfig, EmbeddingCollection=EmbeddingCollection,
                                 DataType=DataType, KeyedJaggedTensor=KeyedJaggedTensor, collate_fn=collate_fn)


# ---------------------------------------------------------------------------------------------
# config


def _intern(x):
    if isinstance(x, str):
        return sys.intern(x)
    if isinstance(x, dict):
        return {_intern(k): _intern(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_intern(v) for v in x)
    return x


def task_type(value):
    """0 / 1 / "binary_classification" / "regression" / "BINARY_CLASSIFICATION" -> MultitaskTaskType."""
    mtt = ref().MultitaskTaskType
    if isinstance(value, bool):
        raise ValueError(f"task_type {value!r}: expected 0, 1 or a name")
    if isinstance(value, int) or isinstance(value, mtt):
        return mtt(int(value))
    if isinstance(value, str):
        key = value.strip().upper()
        if key.startswith("MULTITASKTASKTYPE."):
            key = key.split(".", 1)[1]
        if key in mtt.__members__:
            return mtt[key]
    raise ValueError(f"task_type {value!r}: expected 0 (binary_classification), 1 (regression) or a name")


def task_type_name(value):
    return task_type(value).name.lower()


def hstu_config(fields):
    """A dict of DlrmHSTUConfig fields (dataclasses.asdict form) -> DlrmHSTUConfig, strings interned."""
    r = ref()
    known = {f.name for f in dataclasses.fields(r.DlrmHSTUConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"unknown DlrmHSTUConfig fields: {', '.join(unknown)}")
    f = _intern(copy.deepcopy(dict(fields)))
    if "multitask_configs" in f:
        tasks = []
        for t in f["multitask_configs"]:
            if not isinstance(t, dict) or set(t) != {"task_name", "task_weight", "task_type"}:
                raise ValueError(f"multitask_configs entry {t!r}: expected task_name, task_weight, task_type")
            tasks.append(r.TaskConfig(task_name=t["task_name"], task_weight=int(t["task_weight"]),
                                      task_type=task_type(t["task_type"])))
        f["multitask_configs"] = tasks
    if "merge_uih_candidate_feature_mapping" in f:
        pairs = []
        for p in f["merge_uih_candidate_feature_mapping"]:
            if len(p) != 2:
                raise ValueError(f"merge_uih_candidate_feature_mapping entry {p!r}: expected [uih, candidate]")
            pairs.append((p[0], p[1]))
        f["merge_uih_candidate_feature_mapping"] = pairs
    for k in ("contextual_feature_to_max_length", "contextual_feature_to_min_uih_length"):
        if k in f:
            f[k] = {name: int(v) for name, v in f[k].items()}
    return r.DlrmHSTUConfig(**f)


def split_config(config):
    """CONFIG.json or Ember config.json -> (DlrmHSTUConfig fields, {table: (rows, dim, [features])})."""
    if config.get("format") == "ember-hstu":
        fields = {k: v for k, v in config["hstu"].items()
                  if k not in ("num_position_buckets", "num_time_buckets", "time_bucket_clamp")}
        feats = {}
        for f in config["features"]:
            feats.setdefault(f["table"], []).append(f["name"])
        tables = {t["name"]: (int(t["rows"]), int(t["dim"]), feats.get(t["name"], [])) for t in config["tables"]}
        return fields, tables
    if set(config) - {"hstu_config", "tables"} or "hstu_config" not in config or "tables" not in config:
        raise ValueError(f"expected {{'hstu_config': ..., 'tables': ...}}, got keys {sorted(config)}")
    tables = {}
    for name, t in config["tables"].items():
        if not isinstance(t, dict) or set(t) - {"num_embeddings", "embedding_dim", "feature_names", "name"}:
            raise ValueError(f"table {name!r}: expected num_embeddings, embedding_dim, feature_names; got {t!r}")
        tables[name] = (int(t["num_embeddings"]), int(t["embedding_dim"]), list(t["feature_names"]))
    return config["hstu_config"], tables


POS = "_hstu_transducer._positional_encoder._position_embeddings_weight"
TS = "_hstu_transducer._positional_encoder._timestamp_embeddings_weight"


def resize_positional(model, num_position_buckets, num_time_buckets):
    """Gives the positional encoder tables of other sizes than DlrmHSTU's hard-coded 8192 / 2048 + 1
    rows (new rows random, kept rows unchanged). The PyTorch kernel reads the sizes from the tables
    (positions clamp at rows - 1), so the forward pass is the reference's own."""
    enc = model._hstu_transducer._positional_encoder
    for attr, rows in (("_position_embeddings_weight", num_position_buckets),
                       ("_timestamp_embeddings_weight", num_time_buckets + 1)):
        old = getattr(enc, attr)
        if old.shape[0] == rows:
            continue
        new = torch.empty(rows, old.shape[1], dtype=old.dtype).uniform_(-(1.0 / rows) ** 0.5, (1.0 / rows) ** 0.5)
        k = min(rows, old.shape[0])
        new[:k] = old.detach()[:k]
        setattr(enc, attr, torch.nn.Parameter(new))
    return model


def build_model(config, seed=None):
    """CONFIG.json (or Ember config.json) dict -> DlrmHSTU (inference, eval, PyTorch kernels, CPU)."""
    r = ref()
    fields, tables = split_config(config)
    cfg = hstu_config(fields)
    emb = {sys.intern(n): r.EmbeddingConfig(num_embeddings=rows, embedding_dim=dim, name=sys.intern(n),
                                            data_type=r.DataType.FP32,
                                            feature_names=[sys.intern(x) for x in feats])
           for n, (rows, dim, feats) in tables.items()}
    if seed is not None:
        torch.manual_seed(seed)
    model = r.DlrmHSTU(hstu_configs=cfg, embedding_tables=emb, is_inference=True)
    ec = model._embedding_collection
    ec.to_empty(device=torch.device("cpu"))
    ec._device = torch.device("cpu")
    with torch.no_grad():
        for p in ec.parameters():
            p.uniform_(-0.01, 0.01)
    model.recursive_setattr("_hammer_kernel", r.HammerKernel.PYTORCH)
    model.recursive_setattr("_use_triton_cc", False)
    for m in model.modules():
        if hasattr(m, "hammer_kernel") and m.hammer_kernel() != r.HammerKernel.PYTORCH:
            raise RuntimeError(f"{type(m).__name__} still uses {m.hammer_kernel()}")
    if config.get("format") == "ember-hstu":
        resize_positional(model, int(config["hstu"]["num_position_buckets"]), int(config["hstu"]["num_time_buckets"]))
    return model.eval()


def load(state_pt, config):
    """A DlrmHSTU state_dict (path or dict) + its CONFIG.json dict -> the loaded model. Positional
    tables of other sizes than DlrmHSTU's 8192 / 2049 rows are taken as they are (resize_positional)."""
    model = build_model(config)
    sd = torch.load(state_pt, map_location="cpu", weights_only=True) if isinstance(state_pt, (str, os.PathLike)) \
        else state_pt
    if POS in sd and TS in sd:
        resize_positional(model, sd[POS].shape[0], sd[TS].shape[0] - 1)
    model.load_state_dict(sd, strict=True)
    return model


def _interpreter_bool_ops():
    """Triton's interpreter (3.8, 3.9) runs `a and b` as Python's `and`; Triton's compiler
    (CodeGenerator.visit_BoolOp) makes it an elementwise logical_and of the tensor operands, constexpr
    operands short-circuiting. The position kernel masks its loads and stores with
    `(rows < seq_len) and (cols < D)`: interpreted as is, the row mask is dropped and the last
    sequence writes past the end of its buffers (heap corruption). This gives the interpreter the
    compiler's semantics; it changes Triton's interpreter, not the reference's kernel."""
    import ast

    import triton.language as tl
    import triton.runtime.interpreter as interp

    if getattr(interp.ASTTransformer, "_ember_bool_ops", False):
        return

    def bool_op(is_and, *thunks):
        dynamic, value = [], None
        for thunk in thunks:
            value = thunk()
            if isinstance(value, tl.tensor):
                dynamic.append(value)
            elif bool(value) is (not is_and):
                return value
        if not dynamic:
            return value
        out = dynamic[-1]
        for v in reversed(dynamic[:-1]):
            out = v.logical_and(out) if is_and else v.logical_or(out)
        return out

    def visit_BoolOp(self, node):
        node = self.generic_visit(node)
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        call = ast.Call(func=ast.Name(id="_ember_interp_bool_op", ctx=ast.Load()),
                        args=[ast.Constant(value=isinstance(node.op, ast.And))]
                        + [ast.Lambda(args=no_args, body=v) for v in node.values], keywords=[])
        return ast.copy_location(call, node)

    interp._ember_interp_bool_op = bool_op  # the interpreter copies its globals into the kernel's
    interp.ASTTransformer.visit_BoolOp = visit_BoolOp
    probe = ast.unparse(interp.ASTTransformer().visit(ast.parse("x = a and b")))
    if "_ember_interp_bool_op" not in probe:  # Triton 3.8's visit_Assign does not visit the value
        assign = interp.ASTTransformer.visit_Assign

        def visit_Assign(self, node):
            node.value = self.visit(node.value)
            return assign(self, node)

        interp.ASTTransformer.visit_Assign = visit_Assign
    interp.ASTTransformer._ember_bool_ops = True
    interp.InterpretedFunction.rewritten_fn.clear()


def use_triton_time_buckets(model):
    """Runs the positional encoder on the reference's Triton kernel (ops/triton/triton_position.py),
    whose time buckets saturate at num_time_buckets (the timestamp table's rows - 1) rather than at
    the embedding dim - 1 as its PyTorch kernel does; everything else stays on the PyTorch kernels.
    Without a GPU this needs Triton's CPU interpreter: TRITON_INTERPRET=1 in the environment before
    this module is imported (the kernels are decorated at import); interpreted, the kernel's
    autotuner is cut to its first config (benchmarking configs needs a GPU; they only change block
    sizes) and the interpreter is given the compiler's `and` (_interpreter_bool_ops)."""
    r = ref()
    import generative_recommenders.ops.triton.triton_position as tp

    kernel = tp._add_timestamp_position_embeddings_kernel
    if type(getattr(kernel, "fn", None)).__name__ == "InterpretedFunction":
        _interpreter_bool_ops()
        type(kernel.fn).rewritten_fn.pop(kernel.fn.fn, None)
        kernel.configs = kernel.configs[:1]
    elif not torch.cuda.is_available():
        raise RuntimeError("the Triton position kernel needs a GPU or TRITON_INTERPRET=1 set before hstu_ref is "
                           "imported")
    model._hstu_transducer._positional_encoder._hammer_kernel = r.HammerKernel.TRITON
    return model


def load_ember(model_dir):
    """An Ember model directory (config.json + model.safetensors) -> the reference model
    (`time_bucket_clamp: triton` runs the positional encoder on the Triton kernel, see
    use_triton_time_buckets)."""
    import json

    from safetensors.torch import load_file

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dlrm_ref import dequantize_table

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    clamp = config["hstu"].get("time_bucket_clamp")
    if clamp not in ("pytorch", "triton"):
        raise ValueError(f"{model_dir}: time_bucket_clamp {clamp!r}: expected pytorch or triton")
    model = build_model(config)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    sd = model.state_dict()
    new = {}
    for t in config["tables"]:
        key = f"_embedding_collection.embeddings.{t['name']}.weight"
        new[key] = dequantize_table(tensors.pop(f"tables.{t['name']}"), t)
    for k, v in tensors.items():
        new[k] = v
    for k, v in sd.items():  # buffers are not exported: the model's own (rebuilt from the config)
        if k not in new:
            new[k] = v
    model.load_state_dict(new, strict=True)
    if clamp == "triton":
        use_triton_time_buckets(model)
    return model


def to_float64(model):
    """A float64 copy whose EmbeddingCollection returns float64 lookups."""
    m = copy.deepcopy(model).double()
    ec = m._embedding_collection
    forward = ec.forward

    def forward64(features):
        out = forward(features)
        return {k: type(v)(values=v.values().double(), lengths=v.lengths(), weights=v.weights_or_none())
                for k, v in out.items()}

    ec.forward = forward64
    return m


# ---------------------------------------------------------------------------------------------
# inputs and outputs


def user_kjts(cfg, user):
    """One users.jsonl record -> (uih, candidates) KeyedJaggedTensors of batch size 1."""
    kjt = ref().KeyedJaggedTensor

    def one(keys, feats, what):
        if not isinstance(feats, dict):
            raise ValueError(f"{what}: expected an object of feature -> [ints]")
        missing = [k for k in keys if k not in feats]
        extra = sorted(set(feats) - set(keys))
        if missing or extra:
            raise ValueError(f"{what}: missing features {missing}, unknown features {extra}")
        vals = []
        for k in keys:
            v = feats[k]
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise ValueError(f"{what}.{k}: expected a list of integers")
            vals.extend(v)
        return kjt(keys=list(keys), lengths=torch.tensor([len(feats[k]) for k in keys], dtype=torch.long),
                   values=torch.tensor(vals, dtype=torch.long))

    ctx = cfg.contextual_feature_to_max_length
    uih = user["uih"]
    n = len(uih.get(cfg.uih_post_id_feature_name, []))
    bad = [k for k in cfg.hstu_uih_feature_names if k not in ctx and k in uih and len(uih[k]) != n]
    if bad:
        raise ValueError(f"uih features {bad} do not have the history length {n} of {cfg.uih_post_id_feature_name}")
    cand = user["candidates"]
    c = len(cand.get(cfg.hstu_candidate_feature_names[0], []))
    bad = [k for k in cfg.hstu_candidate_feature_names if k in cand and len(cand[k]) != c]
    if bad or c == 0:
        raise ValueError(f"candidate features must all have the same, non-zero length (got {c}, differing: {bad})")
    return (one(cfg.hstu_uih_feature_names, uih, "uih"),
            one(cfg.hstu_candidate_feature_names, cand, "candidates"))


def batch(model, users):
    """users -> (uih KJT, candidates KJT) of batch size len(users), via dlrm_v3's collate_fn."""
    cfg = model._hstu_configs
    s = ref().collate_fn([user_kjts(cfg, u) for u in users])
    return s.uih_features_kjt, s.candidates_features_kjt


@torch.no_grad()
def run(model, users):
    """-> {task_name: [[score per candidate] per user]} (mt_target_preds split per user)."""
    uih, cand = batch(model, users)
    out = model(uih_features=uih, candidates_features=cand)
    preds = out[3]
    tasks = [t.task_name for t in model._multitask_configs]
    if preds.dim() == 1:
        preds = preds.view(1, -1)
    counts = [len(u["candidates"][model._hstu_configs.hstu_candidate_feature_names[0]]) for u in users]
    if tuple(preds.shape) != (len(tasks), sum(counts)):
        raise RuntimeError(f"mt_target_preds has shape {tuple(preds.shape)}, expected {(len(tasks), sum(counts))}")
    per_user = torch.split(preds, counts, dim=1)
    return {t: [p[i].tolist() for p in per_user] for i, t in enumerate(tasks)}
