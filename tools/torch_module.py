"""`export_torch.py --from torch-module FILE.py:FACTORY`: any PyTorch recommendation model whose
sparse part is TorchRec EmbeddingBagCollections (pooled features) and EmbeddingCollections
(sequence features, torch_sequences.py), split into Ember tables and a dense ONNX graph.

The model is what FACTORY() returns (an nn.Module; `--state STATE.pt` loads a state_dict into it),
called as TorchRec's models are: `model(dense_features [B, n], sparse_features KeyedJaggedTensor)`.
Its outputs are a tensor, a tuple of tensors or a dict of them (a multi-task model's heads), each
[B] or [B, 1].

What is written (docs/graph-models.md):
- the tables of every EmbeddingBagCollection and EmbeddingCollection in the model, as
  `tables.{name}` in --dtype;
- `dense.onnx`: the rest of the model, taking `dense` [B, n] and `sparse` [B, sum of the features'
  dims], the pooled embeddings of every feature side by side (each EBC's KeyedTensor values, the
  EBCs in module order), and giving one output per head. With sequence features, `sparse` goes on
  with each sequence's max_len rows and `dense` with each sequence's length (torch_sequences.py);
- config.json: an `ember-dlrm` config of family "graph" whose interaction is the graph:
  {"format": "ember-dlrm", "family": "graph", "dense_in", "interaction": {"kind": "graph",
  "file": "dense.onnx", "outputs": [names]}, "tables", "features", "pooling"} (no bottom_mlp /
  top_mlp: the graph is the whole dense part), so that everything Ember does with a DLRM model
  (placements and tiers, row updates, the registry, serving) it does with this one.

How the graph is cut out: each EmbeddingBagCollection is replaced by a module that returns a
KeyedTensor over its columns of `sparse`, and the model is exported with torch.onnx.export (the
torch.export-based exporter, `dynamo=True`; the batch dimension dynamic). Before anything is
written the graph is run (onnxruntime where installed, else onnx's reference evaluator) on the
example inputs' pooled embeddings and checked against the model itself within --rtol.

Refused, naming why: neither an EmbeddingBagCollection nor an EmbeddingCollection, a sequence read
other than by to_padded_dense(desired_length) and lengths(), weighted bags (per-id weights), tables
pooled differently (Ember pools a model's features one way), a feature name used twice, outputs
that are not [B] / [B, 1] tensors, a graph that does not match the model on the example.
"""

import importlib.util
import io
import json
import os
import sys

import torch

from export_torch import ExportError, encode_table
import torch_sequences
from torch_sequences import find_sequences


def load_factory(spec):
    """`FILE.py:FACTORY` -> the nn.Module FACTORY() returns, in eval mode."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ExportError(f"--from torch-module {spec!r}: expected FILE.py:FACTORY")
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such file")
    mspec = importlib.util.spec_from_file_location(f"_ember_user_model_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(mspec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        mspec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 (the user's file: its error is reported, named)
        raise ExportError(f"{path}: importing it failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    factory = getattr(mod, name, None)
    if not callable(factory):
        raise ExportError(f"{path} has no callable {name!r}")
    try:
        model = factory()
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"{spec}: calling it failed: {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"{spec}: returned {type(model).__name__}, not an nn.Module")
    return model.eval()


def _tr():
    """TorchRec's classes (imported without its native fbgemm library, as tools/dlrm_ref.py does)."""
    from dlrm_ref import torchrec_classes

    ns = torchrec_classes()
    from torchrec.modules.embedding_modules import EmbeddingCollection
    from torchrec.sparse.jagged_tensor import KeyedTensor

    ns.EmbeddingCollection = EmbeddingCollection
    ns.KeyedTensor = KeyedTensor
    return ns


def find_bags(model):
    """The model's EmbeddingBagCollections in module order: [(path, ebc, [(feature, table cfg)])];
    its EmbeddingCollections are torch_sequences.find_sequences'."""
    tr = _tr()
    bags, seen = [], set()
    for path, m in model.named_modules():
        if not isinstance(m, tr.EmbeddingBagCollection):
            continue
        if getattr(m, "is_weighted", lambda: False)():
            raise ExportError(f"{path}: a weighted EmbeddingBagCollection (per-id weights) is not supported")
        feats = []
        for cfg in m.embedding_bag_configs():
            for f in cfg.feature_names:
                if f in seen:
                    raise ExportError(f"feature {f!r} is read by two tables; Ember's feature names are unique")
                seen.add(f)
                feats.append((f, cfg))
        bags.append((path, m, feats))
    return bags


def find_embeddings(model):
    """(bags, sequences): the model's EmbeddingBagCollections and EmbeddingCollections, each in
    module order; refused if it has neither or a feature is read twice."""
    bags, seqs = find_bags(model), find_sequences(model)
    if not bags and not seqs:
        raise ExportError("the model has no torchrec EmbeddingBagCollection or EmbeddingCollection: nothing for "
                          "Ember's tables")
    seen = set()
    for _, _, feats in bags + seqs:
        for f, _ in feats:
            if f in seen:
                raise ExportError(f"feature {f!r} is read by two tables; Ember's feature names are unique")
            seen.add(f)
    return bags, seqs


def _pooling(bags):
    tr = _tr()
    names = {tr.PoolingType.SUM: "sum", tr.PoolingType.MEAN: "mean"}
    kinds = {"sum": None} if not bags else {}
    for path, _, feats in bags:
        for _, cfg in feats:
            if cfg.pooling not in names:
                raise ExportError(f"{path}: table {cfg.name!r} pools by {cfg.pooling}; Ember pools by sum or mean")
            kinds.setdefault(names[cfg.pooling], cfg.name)
    if len(kinds) > 1:
        raise ExportError(f"tables pool differently ({', '.join(f'{t}: {k}' for k, t in kinds.items())}); "
                          "Ember pools every feature of a model one way")
    return next(iter(kinds))


class _PooledBags(torch.nn.Module):
    """Stands in for one EmbeddingBagCollection: its KeyedTensor is columns [lo, hi) of `sparse`."""

    def __init__(self, holder, keys, dims, lo):
        super().__init__()
        self.holder, self.keys, self.dims, self.lo = holder, keys, dims, lo

    def forward(self, features):
        values = self.holder["sparse"][:, self.lo:self.lo + sum(self.dims)]
        return _tr().KeyedTensor(keys=self.keys, length_per_key=self.dims, values=values)


class _Dense(torch.nn.Module):
    """The model with its bags and sequences stood in for: (dense, sparse) -> its outputs as a
    tuple. `dense`'s columns from `dense_in` on are the sequences' lengths (torch_sequences.py)."""

    def __init__(self, model, holder, kjt, names, dense_in):
        super().__init__()
        self.model, self.holder, self.kjt, self.names, self.dense_in = model, holder, kjt, names, dense_in

    def forward(self, dense, sparse):
        self.holder["sparse"] = sparse
        self.holder["lengths"] = dense[:, self.dense_in:].to(torch.int64)
        out = self.model(dense[:, :self.dense_in], self.kjt)
        return tuple(o.reshape(o.shape[0], -1) for o in flatten_outputs(out, self.names))


def flatten_outputs(out, names=None):
    """A model's outputs as a list of tensors ([B] or [B, 1] each), in `names`' order for a dict."""
    if isinstance(out, torch.Tensor):
        outs = [out]
    elif isinstance(out, (tuple, list)):
        outs = list(out)
    elif isinstance(out, dict):
        outs = [out[k] for k in (names or list(out))]
    else:
        raise ExportError(f"the model returned {type(out).__name__}; expected a tensor, a tuple or a dict of them")
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor) or o.dim() not in (1, 2) or (o.dim() == 2 and o.shape[1] != 1):
            what = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            raise ExportError(f"output {i} is {what}; each output must be [B] or [B, 1] (one score per sample)")
    return outs


def output_names(out, given):
    if given:
        return given
    if isinstance(out, dict):
        return [str(k) for k in out]
    if isinstance(out, torch.Tensor):
        return ["score"]
    return [f"output_{i}" for i in range(len(out))]


def pooled(bags, kjt):
    """The real bags' pooled embeddings of `kjt`, side by side: [B, sum of dims]."""
    parts = []
    for _, m, _ in bags:
        kt = m(kjt)
        parts.append(kt.values())
    return torch.cat(parts, dim=1)


def random_example(bags, dense_in, batch=8, seed=0, seqs=()):
    """An example batch drawn at random: dense ~ N(0, 1), 0-3 ids per (feature, sample) of a bag,
    0-12 per sequence, some empty."""
    g = torch.Generator().manual_seed(seed)
    feats = [(f, cfg.num_embeddings) for _, _, fs in bags + list(seqs) for f, cfg in fs]
    nb = sum(len(fs) for _, _, fs in bags)
    lengths = torch.cat([torch.randint(0, 4, (nb, batch), generator=g),
                         torch.randint(0, 13, (len(feats) - nb, batch), generator=g)])
    values = torch.cat([torch.randint(0, rows, (int(lengths[i].sum()),), generator=g)
                        for i, (_, rows) in enumerate(feats)])
    return {"dense": torch.randn(batch, dense_in, generator=g), "keys": [f for f, _ in feats],
            "lengths": lengths.reshape(-1), "values": values}


def bench_shape(model, model_dir):
    """A benchmark's view of a model and the directory exported from it: (bags, seqs, config, keys,
    rows, per), `keys` the features in config order, `rows` their tables' rows, `per` their ids a
    sample (1 a bag, max_len a sequence: a full history, as `ember bench graph --whole` draws)."""
    bags, seqs = find_embeddings(model)
    keys = [f for _, _, fs in bags + seqs for f, _ in fs]
    rows = [cfg.num_embeddings for _, _, fs in bags + seqs for _, cfg in fs]
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    per = [f.get("max_len", 1) for f in config["features"]]
    return bags, seqs, config, keys, rows, per


def read_example(path):
    try:
        ex = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ExportError(f"{path}: cannot load ({type(e).__name__}: {e})") from None
    need = {"dense", "keys", "lengths", "values"}
    if not isinstance(ex, dict) or not need <= set(ex):
        raise ExportError(f"{path}: expected a dict with {sorted(need)} (dense [B, n]; keys [F]; lengths [F * B], "
                          "feature-major; values: the ids)")
    return ex


def to_kjt(ex):
    return _tr().KeyedJaggedTensor.from_lengths_sync(keys=list(ex["keys"]), values=ex["values"].long(),
                                                     lengths=ex["lengths"].long())


def _run_onnx(data, feeds):
    try:
        import onnxruntime as ort

        s = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        have = {i.name for i in s.get_inputs()}
        return s.run(None, {k: v for k, v in feeds.items() if k in have}), "onnxruntime"
    except ImportError:
        import onnx
        from onnx.reference import ReferenceEvaluator

        r = ReferenceEvaluator(onnx.load_from_string(data))
        return r.run(None, {k: v for k, v in feeds.items() if k in r.input_names}), "onnx.reference"


def export_module(spec, state=None, example=None, dtype="f32", names=None, rtol=1e-5, trust=False,
                  dense_in=None):
    """-> (config, tensors, onnx bytes, report): everything `--from torch-module` writes."""
    from export_torch import load_state_dict

    model = load_factory(spec)
    if state:
        sd = load_state_dict(state, trust)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise ExportError(f"{state} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    bags, seqs = find_embeddings(model)
    pooling = _pooling(bags)
    ex = read_example(example) if example else None
    feats = [f for _, _, fs in bags + seqs for f, _ in fs]
    if ex is None:
        if dense_in is None:
            raise ExportError("give --example INPUTS.pt, or --dense-in N to draw a random example batch (the "
                              "width of the dense features cannot be read off an arbitrary model)")
        ex = random_example(bags, dense_in, seqs=seqs)
    if list(ex["keys"]) != feats:
        raise ExportError(f"the example's keys {list(ex['keys'])} are not the model's features {feats} in order "
                          "(pooled features, then sequence features)")
    kjt = to_kjt(ex)
    dense = ex["dense"].float()
    with torch.no_grad():
        want, max_len = _reference(model, seqs, dense, kjt)
        names = output_names(want, names)
        want = [o.reshape(-1) for o in flatten_outputs(want, names if isinstance(want, dict) else None)]
        if len(names) != len(want):
            raise ExportError(f"{len(names)} output names for {len(want)} outputs")
        dense_x, sparse = graph_inputs(bags, seqs, dense, kjt, max_len)
    holder = {}
    lo = 0
    for path, m, fs in bags:
        dims = [cfg.embedding_dim for _, cfg in fs]
        parent, _, leaf = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, leaf, _PooledBags(holder, [f for f, _ in fs], dims, lo))
        lo += sum(dims)
    torch_sequences.stand_in(model, seqs, holder, lo, max_len)
    wrapped = _Dense(model, holder, kjt, names if isinstance(names, list) else None, dense.shape[1])
    data, how = _export_onnx(wrapped, dense_x, sparse, names)
    got, runner = _run_onnx(data, {"dense": dense_x.numpy(), "sparse": sparse.numpy()})
    report = []
    for n, w, g in zip(names, want, got):
        g = torch.from_numpy(g).reshape(-1)
        err = ((g - w).abs() / w.abs().clamp_min(1e-6)).max().item() if w.numel() else 0.0
        report.append((n, err))
        if not err <= rtol:
            raise ExportError(f"output {n!r}: the graph ({runner}) is {err:.2e} from the model (relative), more "
                              f"than --rtol {rtol:g}: the model does something the export cannot carry")
    tables, tensors = _tables(bags, seqs, dtype)
    features = [{"name": f, "table": cfg.name} for _, _, fs in bags for f, cfg in fs]
    features += [{"name": f, "table": cfg.name, "max_len": max_len[f]} for _, _, fs in seqs for f, cfg in fs]
    config = {
        "format": "ember-dlrm",
        "format_version": 1,
        "family": "graph",
        "dense_in": int(dense.shape[1]),
        "interaction": {"kind": "graph", "file": "dense.onnx", "outputs": names},
        "tables": tables,
        "features": features,
        "pooling": pooling,
    }
    return config, tensors, data, {"exporter": how, "checked_with": runner, "errors": report, "example": ex,
                                   "expected": want, "max_len": max_len}


def graph_inputs(bags, seqs, dense, kjt, max_len):
    """The example as the graph takes it: (dense [B, n + sequences], sparse [B, pooled rows, then
    each sequence's max_len rows]); torch_sequences.py says why."""
    sparse = pooled(bags, kjt) if bags else torch.zeros(dense.shape[0], 0)
    if not seqs:
        return dense, sparse
    rows, lengths = torch_sequences.inputs(seqs, kjt, max_len)
    return torch.cat([dense, lengths.float()], dim=1), torch.cat([sparse, rows], dim=1)


def _reference(model, seqs, dense, kjt):
    """The model's outputs on the example, and each sequence feature's maximum length. With
    sequences, the run that learns the lengths computes to_padded_dense in plain torch; where
    fbgemm's native ops load, TorchRec's own run must give the same."""
    if not seqs:
        return model(dense, kjt), {}
    out, max_len = torch_sequences.record(model, seqs, lambda: model(dense, kjt))
    if torch_sequences.fbgemm_loaded():
        real = model(dense, kjt)
        for i, (a, b) in enumerate(zip(flatten_outputs(out), flatten_outputs(real))):
            if not torch.allclose(a, b, rtol=1e-6, atol=0):
                raise ExportError(f"output {i}: TorchRec's JaggedTensor and the export's stand-in disagree "
                                  f"({(a - b).abs().max().item():.2e}); please report this model")
    return out, max_len


def _tables(bags, seqs, dtype):
    """-> (config.json's tables, their tensors): every collection's tables, names unique."""
    tables, tensors = [], {}
    weights = [(cfg.name, m.embedding_bags[cfg.name].weight) for _, m, _ in bags for cfg in m.embedding_bag_configs()]
    weights += [(cfg.name, m.embeddings[cfg.name].weight) for _, m, _ in seqs for cfg in m.embedding_configs()]
    for name, w in weights:
        if f"tables.{name}" in tensors:
            raise ExportError(f"table name {name!r} is used twice")
        tables.append({"name": name, "rows": int(w.shape[0]), "dim": int(w.shape[1]), "dtype": dtype})
        tensors[f"tables.{name}"] = encode_table(w, dtype)
    return tables, tensors


def _export_onnx(wrapped, dense, sparse, names):
    """-> (the ONNX model's bytes, which exporter made it)."""
    import warnings

    b = torch.export.Dim("batch", min=1)
    errors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prog = torch.onnx.export(wrapped, (dense, sparse), dynamo=True, input_names=["dense", "sparse"],
                                     output_names=names, dynamic_shapes=({0: b}, {0: b}), verbose=False)
            return prog.model_proto.SerializeToString(), "torch.onnx.export(dynamo=True)"
        except Exception as e:  # noqa: BLE001 (the legacy exporter is tried next; both errors are shown)
            errors.append(f"dynamo: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        try:
            f = io.BytesIO()
            axes = {n: {0: "batch"} for n in ["dense", "sparse"] + list(names)}
            torch.onnx.export(wrapped, (dense, sparse), f, dynamo=False, input_names=["dense", "sparse"],
                              output_names=names, dynamic_axes=axes, opset_version=17)
            return f.getvalue(), "torch.onnx.export(dynamo=False)"
        except Exception as e:  # noqa: BLE001
            errors.append(f"torchscript: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    raise ExportError("the dense part cannot be exported to ONNX: " + "; ".join(errors))


def write(out, config, tensors, data):
    from export_torch import write_model

    write_model(out, config, tensors)
    with open(os.path.join(out, config["interaction"]["file"]), "wb") as f:
        f.write(data)

