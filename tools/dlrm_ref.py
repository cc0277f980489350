"""Reference PyTorch models for Ember's parity checks and training scripts (import, do not run).

- `DLRMNet`: facebookresearch/dlrm's `DLRM_Net` (dlrm_s_pytorch.py) on one CPU: the same
  construction arguments (`m_spa, ln_emb, ln_bot, ln_top` with the interaction size already
  prepended to `ln_top`), the same initialisation distributions, the same state_dict keys
  (`emb_l.{i}.weight`, `bot_l.{2k}.*`, `top_l.{2k}.*`) and the same forward: `forward(dense_x,
  lS_o, lS_i)` returns probabilities (the top MLP ends in Sigmoid); `logits(...)` stops before it.
- `DLRMDCN`: TorchRec's `DLRM_DCN` (torchrec.models.dlrm, the MLPerf DLRM-v2 model) in plain
  PyTorch, without torchrec: the same modules and state_dict keys (`dense_arch.model._mlp.{i}.
  _linear.*`, `sparse_arch.embedding_bag_collection.embedding_bags.{table}.weight`,
  `inter_arch.crossnet.{V_kernels,W_kernels,bias}.{l}`, `over_arch.model.0._mlp.{i}._linear.*`,
  `over_arch.model.1.*`), TorchRec's initialisation and the same forward; it takes dlrm's
  per-table offsets and indices instead of a KeyedJaggedTensor.
- `torchrec_classes()`: the *real* TorchRec classes (`DLRM`, `DLRM_DCN`, `EmbeddingBagCollection`,
  `EmbeddingBagConfig`, `KeyedJaggedTensor`, ...) from the installed torchrec package. `import
  torchrec` fails where fbgemm_gpu's native library does not load (ABI mismatch with the installed
  torch), so its packages are registered without running their `__init__.py`; the modules these
  models need are pure Python. No mirror is used.
- `EmberRefModel` / `load_ember_model(dir)`: a direct PyTorch transcription of
  docs/model-format.md (any interaction, pooling, features sharing tables, f16/bf16 tables
  upcast, int8/int4 tables dequantised from their FBGEMM row-wise bytes). `forward(dense,
  lengths, ids)` takes Ember's batch layout and returns logits.
- `read_criteo(path, table_rows)`: the Criteo TSV reader of docs/model-format.md, vectorised.

Batch layout shared by the scripts: `dense` [B, dense_in] float, `lengths` int64 [F, B]
(feature-major), `ids` int64 flat, feature-major (feature 0's bags for samples 0..B, then
feature 1, ...). `split_batch` turns it into dlrm's per-table offsets and indices, `to_kjt` into
a TorchRec KeyedJaggedTensor.
"""

import json
import importlib
import logging
import os
import sys
import types

import numpy as np
import torch
from torch import nn

SITE = os.path.dirname(os.path.dirname(torch.__file__))


class DLRMNet(nn.Module):
    """facebookresearch/dlrm `DLRM_Net` (single device, no QR/MD embeddings).

    m_spa: embedding dim (int, or one per table as dlrm's MD path passes); ln_emb: rows per
    table; ln_bot: bottom MLP sizes including the input (e.g. [13, 64, 16]); ln_top: top MLP
    sizes including the interaction size (e.g. [367, 128, 64, 1]).
    """

    def __init__(self, m_spa, ln_emb, ln_bot, ln_top, arch_interaction_op="dot",
                 arch_interaction_itself=False, seed=0):
        super().__init__()
        if arch_interaction_op not in ("dot", "cat"):
            raise ValueError(f"--arch-interaction-op={arch_interaction_op} is not supported")
        self.arch_interaction_op = arch_interaction_op
        self.arch_interaction_itself = arch_interaction_itself
        rng = np.random.default_rng(seed)
        dims = list(m_spa) if isinstance(m_spa, (list, tuple)) else [m_spa] * len(ln_emb)
        self.emb_l = nn.ModuleList()
        for n, m in zip(ln_emb, dims):
            w = rng.uniform(-np.sqrt(1 / n), np.sqrt(1 / n), size=(n, m)).astype(np.float32)
            self.emb_l.append(nn.EmbeddingBag(n, m, mode="sum", _weight=torch.from_numpy(w)))
        self.bot_l = self._mlp(ln_bot, -1, rng)
        self.top_l = self._mlp(ln_top, len(ln_top) - 2, rng)

    @staticmethod
    def _mlp(ln, sigmoid_layer, rng):
        layers = []
        for i in range(len(ln) - 1):
            n, m = int(ln[i]), int(ln[i + 1])
            lin = nn.Linear(n, m, bias=True)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(rng.normal(0.0, np.sqrt(2 / (m + n)), size=(m, n))))
                lin.bias.copy_(torch.from_numpy(rng.normal(0.0, np.sqrt(1 / m), size=m)))
            layers += [lin, nn.Sigmoid() if i == sigmoid_layer else nn.ReLU()]
        return nn.Sequential(*layers)

    def interact_features(self, x, ly):
        if self.arch_interaction_op == "cat":
            return torch.cat([x] + ly, dim=1)
        batch_size, d = x.shape
        t = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
        z = torch.bmm(t, torch.transpose(t, 1, 2))
        _, ni, nj = z.shape
        offset = 1 if self.arch_interaction_itself else 0
        li = torch.tensor([i for i in range(ni) for j in range(i + offset)], dtype=torch.long)
        lj = torch.tensor([j for i in range(nj) for j in range(i + offset)], dtype=torch.long)
        return torch.cat([x, z[:, li, lj]], dim=1)

    def logits(self, dense_x, lS_o, lS_i):
        """The forward pass without the final Sigmoid: [B, 1]."""
        x = self.bot_l(dense_x)
        ly = [emb(idx, off) for emb, off, idx in zip(self.emb_l, lS_o, lS_i)]
        return self.top_l[:-1](self.interact_features(x, ly))

    def forward(self, dense_x, lS_o, lS_i):
        return self.top_l[-1](self.logits(dense_x, lS_o, lS_i))


class _Perceptron(nn.Module):
    """torchrec.modules.mlp.Perceptron with ReLU: `_linear` then relu."""

    def __init__(self, n, m):
        super().__init__()
        self._linear = nn.Linear(n, m)

    def forward(self, x):
        return torch.relu(self._linear(x))


class _MLP(nn.Module):
    """torchrec.modules.mlp.MLP(activation="relu"): a ReLU after every layer."""

    def __init__(self, n, sizes):
        super().__init__()
        self._mlp = nn.Sequential(*[_Perceptron(a, b) for a, b in zip([n] + list(sizes[:-1]), sizes)])

    def forward(self, x):
        return self._mlp(x)


class _LowRankCrossNet(nn.Module):
    """torchrec.modules.crossnet.LowRankCrossNet: x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l.

    V_kernels[l]: [r, N], W_kernels[l]: [N, r] (xavier_normal), bias[l]: [N] (zeros).
    """

    def __init__(self, n, layers, rank):
        super().__init__()
        self.V_kernels = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(torch.empty(rank, n)))
                                          for _ in range(layers))
        self.W_kernels = nn.ParameterList(nn.Parameter(nn.init.xavier_normal_(torch.empty(n, rank)))
                                          for _ in range(layers))
        self.bias = nn.ParameterList(nn.Parameter(torch.zeros(n)) for _ in range(layers))

    def forward(self, x0):
        x = x0
        for v, w, b in zip(self.V_kernels, self.W_kernels, self.bias):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x


class DLRMDCN(nn.Module):
    """TorchRec `DLRM_DCN` (torchrec.models.dlrm) in plain PyTorch, on one device.

    dense_in: dense features (13); rows: rows per table (one feature per table, named as
    `names`, default t0..); dim: embedding dim, equal to dense_arch[-1]; dense_arch: the bottom
    MLP's sizes (512, 256, 128); over_arch: the top's, ending in 1 (1024, 1024, 512, 256, 1);
    dcn_layers, dcn_rank: the low-rank cross net (3, 512).

    Modules, parameter names and initialisation are TorchRec's: DenseArch (MLP, ReLU after
    every layer), SparseArch (an EmbeddingBagCollection: one sum EmbeddingBag per table, uniform
    in +-sqrt(1/rows)), InteractionDCNArch (the cross net over concat([dense_out, pooled_0..])),
    OverArch (MLP with ReLU, then a Linear without activation). `logits(...)` is TorchRec's
    `DLRM_DCN.forward` ([B, 1]); `forward(...)` adds the sigmoid (DLRMTrain's prediction).
    Inputs are dlrm's: dense [B, dense_in], per-table offsets and indices.
    """

    def __init__(self, dense_in, rows, dim, dense_arch, over_arch, dcn_layers, dcn_rank, names=None, seed=0):
        super().__init__()
        if dense_arch[-1] != dim:
            raise ValueError(f"DLRM_DCN needs the dense arch to end in the embedding dim {dim}, got {dense_arch}")
        if over_arch[-1] != 1:
            raise ValueError(f"the over arch must end in 1 output, got {over_arch}")
        names = list(names or [f"t{i}" for i in range(len(rows))])
        if len(names) != len(rows):
            raise ValueError(f"{len(names)} table names for {len(rows)} tables")
        n = dim * (len(rows) + 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.dense_arch = nn.Module()
            self.dense_arch.model = _MLP(dense_in, dense_arch)
            self.sparse_arch = nn.Module()
            self.sparse_arch.embedding_bag_collection = nn.Module()
            bags = nn.ModuleDict()
            for name, r in zip(names, rows):
                bag = nn.EmbeddingBag(r, dim, mode="sum")
                nn.init.uniform_(bag.weight, -(1 / r) ** 0.5, (1 / r) ** 0.5)
                bags[name] = bag
            self.sparse_arch.embedding_bag_collection.embedding_bags = bags
            self.inter_arch = nn.Module()
            self.inter_arch.crossnet = _LowRankCrossNet(n, dcn_layers, dcn_rank)
            self.over_arch = nn.Module()
            self.over_arch.model = nn.Sequential(_MLP(n, over_arch[:-1]), nn.Linear(over_arch[-2], over_arch[-1]))
        self.bags = list(bags.values())

    def logits(self, dense_x, lS_o, lS_i):
        """TorchRec's DLRM_DCN.forward: logits [B, 1]."""
        x = self.dense_arch.model(dense_x)
        ly = [bag(idx, off) for bag, off, idx in zip(self.bags, lS_o, lS_i)]
        # InteractionDCNArch: cat((dense.unsqueeze(1), sparse [B, F, D]), 1).reshape(B, -1).
        return self.over_arch.model(self.inter_arch.crossnet(torch.cat([x] + ly, dim=1)))

    def forward(self, dense_x, lS_o, lS_i):
        return torch.sigmoid(self.logits(dense_x, lS_o, lS_i))


def torchrec_classes():
    """The installed torchrec's real classes, imported without `torchrec/__init__.py`.

    Returns a namespace with DLRM, DLRM_DCN, EmbeddingBagCollection, EmbeddingBagConfig,
    PoolingType and KeyedJaggedTensor.
    """
    root = os.path.join(SITE, "torchrec")
    if not os.path.isdir(root):
        raise ImportError("torchrec is not installed: pip install torchrec")
    try:  # fbgemm's native ops where they load (a torch it was built for): JaggedTensor's need them
        import fbgemm_gpu  # noqa: F401
    except Exception:  # noqa: BLE001 (missing, or built for another torch: its package is stubbed below)
        pass
    for pkg in ["fbgemm_gpu", "torchrec", "torchrec.models", "torchrec.modules", "torchrec.sparse",
                "torchrec.datasets", "torchrec.distributed", "torchrec.distributed.test_utils"]:
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [os.path.join(SITE, *pkg.split("."))]
            sys.modules[pkg] = mod
    # torchrec's models import ModelInput (a test helper, for their *Wrapper classes) from
    # torchrec.distributed.test_utils, which imports fbgemm's native ops; the models themselves
    # do not need it, so a placeholder stands in when that import fails.
    for name in ["torchrec.distributed.test_utils.model_input", "torchrec.distributed.test_utils.test_input"]:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 (fbgemm's native library missing or built for another torch)
                stub = types.ModuleType(name)
                stub.ModelInput = type("ModelInput", (), {})
                sys.modules[name] = stub
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # torchrec's is_fx_tracing notice
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return types.SimpleNamespace(DLRM=DLRM, DLRM_DCN=DLRM_DCN, EmbeddingBagCollection=EmbeddingBagCollection,
                                 EmbeddingBagConfig=EmbeddingBagConfig, PoolingType=PoolingType,
                                 KeyedJaggedTensor=KeyedJaggedTensor)


def split_batch(lengths, ids):
    """Ember batch layout -> dlrm's (lS_o, lS_i): per-feature offsets and indices."""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    ids = torch.as_tensor(ids, dtype=torch.long)
    per_feature = lengths.sum(dim=1).tolist()
    lS_i = list(torch.split(ids, per_feature))
    lS_o = [torch.cumsum(row, 0) - row for row in lengths]
    return lS_o, lS_i


def to_kjt(keys, lengths, ids):
    """Ember batch layout -> TorchRec KeyedJaggedTensor (its layout is the same, key-major)."""
    kjt = torchrec_classes().KeyedJaggedTensor
    return kjt.from_lengths_sync(keys=list(keys), values=torch.as_tensor(ids, dtype=torch.long),
                                 lengths=torch.as_tensor(lengths, dtype=torch.long).reshape(-1))


# ---------------------------------------------------------------------------------------------
# Ember model directories


TABLE_STORAGE = {"f32": (torch.float32, 0), "f16": (torch.float16, 0), "bf16": (torch.bfloat16, 0),
                 "int8": (torch.uint8, 8), "int4": (torch.uint8, 4)}


def dequantize_table(t, table):
    """A `tables.{name}` tensor as stored in model.safetensors -> float32 [rows, dim]."""
    dtype, dim = table["dtype"], table["dim"]
    if dtype not in TABLE_STORAGE:
        raise ValueError(f"table {table['name']!r}: unknown dtype {dtype!r}")
    storage, extra = TABLE_STORAGE[dtype]
    want = (storage, [table["rows"], ((dim + 1) // 2 if dtype == "int4" else dim) + extra])
    if (t.dtype, list(t.shape)) != want:
        raise ValueError(f"tables.{table['name']}: {t.dtype} {list(t.shape)}, expected {want[0]} {want[1]}")
    if dtype in ("f32", "f16", "bf16"):
        return t.float()
    b = t.numpy()
    if dtype == "int8":
        scale = b[:, dim:dim + 4].copy().view("<f4")
        bias = b[:, dim + 4:dim + 8].copy().view("<f4")
        codes = b[:, :dim].astype(np.float32)
    elif dtype == "int4":
        nb = (dim + 1) // 2
        scale = b[:, nb:nb + 2].copy().view("<f2").astype(np.float32)
        bias = b[:, nb + 2:nb + 4].copy().view("<f2").astype(np.float32)
        packed = b[:, :nb]
        codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(len(b), -1)[:, :dim].astype(np.float32)
    return torch.from_numpy(codes * scale + bias)


class EmberRefModel(nn.Module):
    """docs/model-format.md in PyTorch. `forward(dense, lengths, ids)` -> logits [B]."""

    def __init__(self, cfg, tensors):
        super().__init__()
        self.cfg = cfg
        inter = cfg["interaction"]
        self.kind = inter["kind"]
        used = set()

        def get(name):
            if name not in tensors:
                raise ValueError(f"model.safetensors has no tensor {name!r}")
            used.add(name)
            return tensors[name]

        self.table_names = [t["name"] for t in cfg["tables"]]
        feats = cfg.get("features") or [{"name": t, "table": t} for t in self.table_names]
        self.feature_tables = [self.table_names.index(f["table"]) for f in feats]
        self.mode = cfg.get("pooling", "sum")
        self.tables = nn.ParameterList(
            nn.Parameter(dequantize_table(get(f"tables.{t['name']}"), t), requires_grad=False) for t in cfg["tables"])

        def linears(prefix, n):
            return nn.ModuleList(self._linear(get, f"{prefix}.{k}") for k in range(n))

        self.bottom = linears("bottom_mlp", len(cfg["bottom_mlp"]))
        self.top = linears("top_mlp", len(cfg["top_mlp"]))
        if self.kind == "dot":
            n = len(feats) + 1
            if inter.get("pair_order", "lower") == "upper":
                pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
            else:
                off = 1 if inter.get("self_interaction", False) else 0
                pairs = [(i, j) for i in range(n) for j in range(i + off)]
            self.register_buffer("li", torch.tensor([p[0] for p in pairs], dtype=torch.long))
            self.register_buffer("lj", torch.tensor([p[1] for p in pairs], dtype=torch.long))
        elif self.kind == "dcn":
            self.cross = nn.ParameterList()
            for l in range(inter["layers"]):
                for part in ("V", "W", "bias"):
                    self.cross.append(nn.Parameter(get(f"crossnet.{l}.{part}").float(), requires_grad=False))
        if set(tensors) != used:
            raise ValueError(f"model.safetensors has tensors the config does not use: {sorted(set(tensors) - used)}")

    @staticmethod
    def _linear(get, name):
        w = get(f"{name}.weight")
        lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(get(f"{name}.bias"))
        return lin

    def forward(self, dense, lengths, ids):
        x = dense.to(self.top[0].weight.dtype)
        for lin in self.bottom:
            x = torch.relu(lin(x))
        lS_o, lS_i = split_batch(lengths, ids)
        ly = [nn.functional.embedding_bag(idx, self.tables[t], off, mode=self.mode)
              for t, off, idx in zip(self.feature_tables, lS_o, lS_i)]
        if self.kind == "dot":
            t = torch.stack([x] + ly, dim=1)
            z = torch.bmm(t, t.transpose(1, 2))
            r = torch.cat([x, z[:, self.li, self.lj]], dim=1)
        elif self.kind == "cat":
            r = torch.cat([x] + ly, dim=1)
        else:
            x0 = r = torch.cat([x] + ly, dim=1)
            for l in range(len(self.cross) // 3):
                v, w, b = self.cross[3 * l:3 * l + 3]
                r = x0 * ((r @ v.T) @ w.T + b) + r
        for k, lin in enumerate(self.top):
            r = lin(r)
            if k + 1 < len(self.top):
                r = torch.relu(r)
        return r[:, 0]


def load_ember_model(model_dir):
    """An Ember model directory -> EmberRefModel (eval mode, float32; `.double()` works)."""
    from safetensors.torch import load_file

    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    return EmberRefModel(cfg, tensors).eval()


# ---------------------------------------------------------------------------------------------
# Criteo TSV

CRITEO_COLUMNS = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
_HEX = np.full(256, 255, dtype=np.uint8)
for _c in b"0123456789":
    _HEX[_c] = _c - ord("0")
for _c in b"abcdef":
    _HEX[_c] = _HEX[_c - 32] = _c - ord("a") + 10


def _parse_digits(cells, base, max_digits):
    """cells: bytes array 'S' [N, K] -> (values uint64 [N, K], bad mask, negative mask).

    Empty cells read 0; base 10 allows a leading '-' or '+' (as Rust's i64 parsing does).
    """
    n, k = cells.shape
    width = max(cells.dtype.itemsize, 1)
    raw = np.frombuffer(np.ascontiguousarray(cells).tobytes(), dtype=np.uint8).reshape(n, k, width)
    length = (raw != 0).sum(axis=2)
    neg = raw[:, :, 0] == ord("-")
    sign = (neg | (raw[:, :, 0] == ord("+"))) if base == 10 else np.zeros((n, k), bool)
    digits = _HEX[raw]
    digits[:, :, 0] = np.where(sign, 0, digits[:, :, 0])
    bad = ((digits >= base) & (np.arange(width) < length[:, :, None])).any(axis=2)
    bad |= (length - sign > max_digits) | (sign & (length == 1))
    val = np.zeros((n, k), dtype=np.uint64)
    for pos in range(width):
        live = (pos < length) & ~bad
        val = np.where(live, val * np.uint64(base) + digits[:, :, pos].astype(np.uint64), val)
    return val, bad, neg & sign


def read_criteo(path, table_rows):
    """Reads a Criteo TSV as docs/model-format.md says.

    table_rows: the 26 features' table sizes (feature i reads column C(i+1)). As Ember's reader: a
    trailing '\r' is dropped, integers may carry a sign, hex values have at most 16 digits. Returns
    (dense float32 [N, 13] = ln(max(x, 0) + 1), ids int64 [N, 26] = int(hex, 16) % rows,
    labels float32 [N]). Raises ValueError naming the line and column of a bad field.
    """
    if len(table_rows) != 26:
        raise ValueError(f"read_criteo needs 26 table sizes, got {len(table_rows)}")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    rows = [line.removesuffix(b"\r").split(b"\t") for line in lines]
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    if (counts > 40).any():
        i = int(np.argmax(counts > 40))
        raise ValueError(f"{path}: line {i + 1}: {counts[i]} fields, a Criteo row has at most 40")
    cells = np.array([r + [b""] * (40 - len(r)) for r in rows], dtype="S") if rows else np.zeros((0, 40), "S1")

    def fail(mask, col0):
        i, j = np.argwhere(mask)[0]
        col = col0 + j
        raise ValueError(f"{path}: line {i + 1}, column {col + 1} ({CRITEO_COLUMNS[col]}): "
                         f"cannot parse {cells[i, col].decode(errors='replace')!r}")

    label = cells[:, 0]
    bad = (label != b"0") & (label != b"1")
    if bad.any():
        fail(bad[:, None], 0)
    ints, bad, neg = _parse_digits(cells[:, 1:14], 10, 19)
    if bad.any():
        fail(bad, 1)
    dense = np.log1p(np.where(neg, 0, ints).astype(np.float64)).astype(np.float32)
    hexes, bad, _ = _parse_digits(cells[:, 14:40], 16, 16)
    if bad.any():
        fail(bad, 14)
    ids = (hexes % np.asarray(table_rows, dtype=np.uint64)).astype(np.int64)
    return dense, ids, (label == b"1").astype(np.float32)


def auc_logloss(labels, scores):
    """(ROC AUC, log loss) with scikit-learn."""
    from sklearn.metrics import log_loss, roc_auc_score

    scores = np.clip(np.asarray(scores, dtype=np.float64), 1e-7, 1 - 1e-7)
    return roc_auc_score(labels, scores), log_loss(labels, scores, labels=[0, 1])
