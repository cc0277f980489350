"""Sequence features for `export_torch.py --from torch-module`: TorchRec EmbeddingCollections.

An EmbeddingCollection gives each of its features as a JaggedTensor: one embedding per id of each
sample, no pooling. Ember serves such a feature with a maximum length L (`"max_len"` in its
config.json entry): its embedding stage gathers the first L rows of each sample's sequence,
zero-padded, as L side-by-side rows of the graph's `sparse` input, and gives the sequence's length
(every id the request sent, as JaggedTensor.lengths() does) as a column of `dense` after the dense
features. The graph sees what TorchRec's own calls give:

    jt.to_padded_dense(desired_length, padding_value)   [B, desired_length, dim]
    jt.lengths()                                        [B], int64

L is the largest `desired_length` the model asks of the feature on the example batch. A model that
reads a sequence any other way (values() and offsets(), to_dense()'s list of tensors,
to_padded_dense() with no length: a shape that depends on the batch) is refused, naming the call.

How: the model is first run with each EmbeddingCollection's JaggedTensors wrapped in a recorder
(`_Recorder`), which computes to_padded_dense in plain torch (fbgemm's jagged_to_padded_dense:
keep the first desired_length ids, pad the rest) and notes each length asked for; where fbgemm's
native ops load, the real model is run too and the two must agree. The graph is then exported with
each collection replaced by `_Sequences`, which reads the padded rows off `sparse` and the lengths
off `dense`.
"""

import torch

from export_torch import ExportError

#: The longest sequence Ember serves: each position is a column block of the graph's input.
MAX_LEN = 4096


def _ec_class():
    from dlrm_ref import torchrec_classes

    torchrec_classes()  # the import shim
    from torchrec.modules.embedding_modules import EmbeddingCollection

    return EmbeddingCollection


def find_sequences(model):
    """The model's EmbeddingCollections in module order: [(path, ec, [(feature, table cfg)])]."""
    ec_class = _ec_class()
    seqs = []
    for path, m in model.named_modules():
        if not isinstance(m, ec_class):
            continue
        if getattr(m, "need_indices", lambda: False)():
            raise ExportError(f"{path}: an EmbeddingCollection with need_indices=True (its ids as weights) is not "
                              "supported")
        feats = [(f, cfg) for cfg in m.embedding_configs() for f in cfg.feature_names]
        seqs.append((path, m, feats))
    return seqs


def padded(values, lengths, n, padding_value=0.0):
    """fbgemm's jagged_to_padded_dense in plain torch: [sum(lengths), D] -> [B, n, D], each sample's
    first n rows, then `padding_value`."""
    b, d = lengths.numel(), values.shape[1]
    out = torch.full((b, n, d), float(padding_value), dtype=values.dtype)
    row = torch.repeat_interleave(torch.arange(b), lengths)
    start = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(values.shape[0]) - torch.repeat_interleave(start, lengths)
    keep = pos < n
    out[row[keep], pos[keep]] = values[keep]
    return out


def _refuse(name, call):
    return ExportError(f"sequence feature {name!r}: the model calls JaggedTensor.{call}; Ember gives a sequence to "
                       "the dense part as to_padded_dense(desired_length) ([B, desired_length, dim]) and lengths() "
                       "([B]) only")


class _Recorder:
    """A JaggedTensor of an EmbeddingCollection's output that notes each length the model pads it to."""

    def __init__(self, name, jt, asked):
        self._name, self._values, self._lengths, self._asked = name, jt.values(), jt.lengths(), asked

    def to_padded_dense(self, desired_length=None, padding_value=0.0):
        if desired_length is None:
            raise ExportError(f"sequence feature {self._name!r}: to_padded_dense() without desired_length pads to the "
                              "batch's longest sequence, a shape no served graph can have; pass desired_length")
        n = int(desired_length)
        if not 1 <= n <= MAX_LEN:
            raise ExportError(f"sequence feature {self._name!r}: desired_length {n} is outside 1..{MAX_LEN}")
        self._asked[self._name] = max(self._asked.get(self._name, 0), n)
        return padded(self._values, self._lengths, n, padding_value)

    def lengths(self):
        return self._lengths

    def __getattr__(self, call):
        raise _refuse(self._name, f"{call}()")


class _Recording(torch.nn.Module):
    """Stands in for an EmbeddingCollection on the recording run: the real lookups, recorded."""

    def __init__(self, ec, asked):
        super().__init__()
        self.ec, self.asked = ec, asked

    def forward(self, features):
        return {k: _Recorder(k, jt, self.asked) for k, jt in self.ec(features).items()}


class _Padded:
    """A JaggedTensor as the graph has it: its first L rows padded with zeros, and its lengths."""

    def __init__(self, name, rows, lengths):
        self._name, self._rows, self._lengths = name, rows, lengths

    def to_padded_dense(self, desired_length=None, padding_value=0.0):
        n = int(desired_length)
        x = self._rows[:, :n]
        if padding_value != 0.0:
            inside = torch.arange(n).reshape(1, n, 1) < self._lengths.reshape(-1, 1, 1)
            x = torch.where(inside, x, torch.full_like(x, float(padding_value)))
        return x

    def lengths(self):
        return self._lengths

    def __getattr__(self, call):
        raise _refuse(self._name, f"{call}()")


class _Sequences(torch.nn.Module):
    """Stands in for one EmbeddingCollection in the exported graph: feature f's rows are columns
    [lo, lo + L * dim) of `sparse`, its lengths column `dense_in + s` of `dense`."""

    def __init__(self, holder, feats):
        super().__init__()
        self.holder, self.feats = holder, feats  # [(name, lo, max_len, dim, length column)]

    def forward(self, features):
        sparse, lengths = self.holder["sparse"], self.holder["lengths"]
        return {name: _Padded(name, sparse[:, lo:lo + n * d].reshape(-1, n, d), lengths[:, s])
                for name, lo, n, d, s in self.feats}


def _replace(model, path, module):
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def record(model, seqs, run):
    """Runs `run()` with the model's EmbeddingCollections recorded: -> (its result, {feature: L})."""
    asked = {}
    for path, m, _ in seqs:
        _replace(model, path, _Recording(m, asked))
    try:
        out = run()
    finally:
        for path, m, _ in seqs:
            _replace(model, path, m)
    for _, _, feats in seqs:
        for f, _ in feats:
            if f not in asked:
                raise ExportError(f"sequence feature {f!r}: the model never calls to_padded_dense(desired_length) on "
                                  "it, which is how Ember learns its maximum length")
    return out, asked


def stand_in(model, seqs, holder, lo, max_len):
    """Replaces each EmbeddingCollection with `_Sequences`, its columns from `lo` on."""
    s = 0
    for path, _, feats in seqs:
        cols = []
        for f, cfg in feats:
            cols.append((f, lo, max_len[f], cfg.embedding_dim, s))
            lo += max_len[f] * cfg.embedding_dim
            s += 1
        _replace(model, path, _Sequences(holder, cols))


def inputs(seqs, kjt, max_len):
    """The example's sequences as the graph takes them: (rows [B, sum of L * dim], lengths [B, S])."""
    rows, lengths = [], []
    for _, m, feats in seqs:
        out = m(kjt)
        for f, _ in feats:
            jt = out[f]
            rows.append(padded(jt.values(), jt.lengths(), max_len[f]).flatten(1))
            lengths.append(jt.lengths())
    return torch.cat(rows, dim=1), torch.stack(lengths, dim=1)


def fbgemm_loaded():
    """Whether fbgemm's native ops are there (TorchRec's own to_padded_dense runs)."""
    return hasattr(torch.ops.fbgemm, "jagged_to_padded_dense")
