"""Models of users' own, written with TorchRec's classes, for `export_torch.py --from torch-module`
(and its fixtures, tools/graph_fixtures.py). Each factory builds its model with seeded random
weights; `--state` would load trained ones.

    deepfm     TorchRec's SimpleDeepFMNN (a DeepFM, its factorization machine and deep arch)
    mmoe       a multi-task model: 3 shared experts, a softmax gate and a tower per task (ctr, cvr)
    two_tower  a user tower and an item tower over their own EmbeddingBagCollections; the score is
               the sigmoid of their (L2-normalised, scaled) dot product
    dlrm_dcn   TorchRec's DLRM_DCN (the low-rank cross net), through the ONNX route
    din        sequence features (an EmbeddingCollection): the candidate's attention over the user's
               item history, and the mean of a category history

Every dim differs between them (a mix-up fails a test) and the sizes are small (fixtures ship).
"""

import torch
from torch import nn

from dlrm_ref import torchrec_classes

TR = torchrec_classes()
from torchrec.models.deepfm import SimpleDeepFMNN  # noqa: E402 (after the import shim)
from torchrec.modules.mlp import MLP  # noqa: E402

DENSE_IN = 13


def _ebc(tables, dim, rows, features=None, seed=0):
    torch.manual_seed(seed)
    cfgs = [TR.EmbeddingBagConfig(name=t, embedding_dim=dim if isinstance(dim, int) else dim[i],
                                  num_embeddings=rows[i], feature_names=(features or {}).get(t, [f"f_{t}"]))
            for i, t in enumerate(tables)]
    ebc = TR.EmbeddingBagCollection(tables=cfgs, device=torch.device("cpu"))
    for cfg in cfgs:
        nn.init.uniform_(ebc.embedding_bags[cfg.name].weight, -0.5, 0.5)
    return ebc


def deepfm():
    ebc = _ebc(["t0", "t1", "t2"], 8, [50, 31, 17], features={"t0": ["f_t0", "f_t0b"]}, seed=1)
    torch.manual_seed(11)
    return SimpleDeepFMNN(num_dense_features=DENSE_IN, embedding_bag_collection=ebc, hidden_layer_size=20,
                          deep_fm_dimension=6).eval()


class MMoE(nn.Module):
    """Shared-bottom experts mixed per task by a softmax gate (Ma et al., KDD 2018)."""

    def __init__(self, ebc, dense_in, experts=3, expert_dim=12, tasks=("ctr", "cvr")):
        super().__init__()
        self.ebc = ebc
        d = sum(c.embedding_dim * len(c.feature_names) for c in ebc.embedding_bag_configs())
        self.dense = MLP(dense_in, [16, 10])
        n = d + 10
        self.experts = nn.ModuleList(MLP(n, [24, expert_dim]) for _ in range(experts))
        self.gates = nn.ModuleDict({t: nn.Linear(n, experts) for t in tasks})
        self.towers = nn.ModuleDict({t: nn.Sequential(MLP(expert_dim, [7]), nn.Linear(7, 1)) for t in tasks})
        self.tasks = list(tasks)

    def forward(self, dense_features, sparse_features):
        x = torch.cat([self.dense(dense_features), self.ebc(sparse_features).values()], dim=1)
        e = torch.stack([m(x) for m in self.experts], dim=1)  # [B, E, D]
        out = {}
        for t in self.tasks:
            g = torch.softmax(self.gates[t](x), dim=1).unsqueeze(2)  # [B, E, 1]
            out[t] = torch.sigmoid(self.towers[t]((g * e).sum(dim=1)))
        return out


def mmoe():
    ebc = _ebc(["u", "ad", "ctx", "cat"], [6, 9, 4, 5], [40, 60, 9, 23], seed=2)
    torch.manual_seed(12)
    return MMoE(ebc, DENSE_IN).eval()


class TwoTower(nn.Module):
    """A user tower and an item tower, scored by the cosine of their outputs times a temperature."""

    def __init__(self, user_ebc, item_ebc, dense_in, out=11, user=(18,), item=(15,)):
        super().__init__()
        self.user_ebc, self.item_ebc = user_ebc, item_ebc
        du = sum(c.embedding_dim * len(c.feature_names) for c in user_ebc.embedding_bag_configs())
        di = sum(c.embedding_dim * len(c.feature_names) for c in item_ebc.embedding_bag_configs())
        self.user = MLP(du + dense_in, [*user, out], activation=nn.ReLU)
        self.item = nn.Sequential(MLP(di, list(item)), nn.Linear(item[-1], out))
        self.scale = nn.Parameter(torch.tensor(4.0))

    def forward(self, dense_features, sparse_features):
        u = self.user(torch.cat([dense_features, self.user_ebc(sparse_features).values()], dim=1))
        i = self.item(self.item_ebc(sparse_features).values())
        u = u / u.norm(dim=1, keepdim=True).clamp_min(1e-6)
        i = i / i.norm(dim=1, keepdim=True).clamp_min(1e-6)
        return torch.sigmoid(self.scale * (u * i).sum(dim=1))


def two_tower():
    user = _ebc(["user_id", "user_geo"], [7, 3], [45, 8], seed=3)
    item = _ebc(["item_id", "item_cat"], [7, 4], [70, 13], seed=4)
    torch.manual_seed(13)
    return TwoTower(user, item, DENSE_IN).eval()


def dlrm_dcn():
    ebc = _ebc(["c0", "c1", "c2", "c3"], 4, [20, 33, 14, 9], seed=5)
    torch.manual_seed(14)
    m = TR.DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=DENSE_IN, dense_arch_layer_sizes=[10, 4],
                    over_arch_layer_sizes=[9, 1], dcn_num_layers=2, dcn_low_rank_dim=3,
                    dense_device=torch.device("cpu"))
    return Sigmoid(m).eval()


class Sigmoid(nn.Module):
    """TorchRec's DLRM models give logits; served models give probabilities."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, dense_features, sparse_features):
        return torch.sigmoid(self.model(dense_features, sparse_features))


class DIN(nn.Module):
    """Target attention over the user's recent items (Zhou et al., "Deep Interest Network", KDD
    2018): the candidate item attends over the item-history sequence (an MLP of [q, k, q*k, q-k],
    padded positions masked by the sequence's lengths), plus the mean of a category-history
    sequence over its ids (sum of the first `cats_len` over the sequence's full length)."""

    def __init__(self, ebc, items, cats, dense_in, items_len=6, cats_len=4, dense=(12, 8), att=(10,),
                 top=(16, 6)):
        super().__init__()
        self.ebc, self.items, self.cats = ebc, items, cats  # EmbeddingCollections: one dim each
        self.items_len, self.cats_len = items_len, cats_len
        d_item, d_cat = items.embedding_dim(), cats.embedding_dim()
        d_bags = sum(c.embedding_dim * len(c.feature_names) for c in ebc.embedding_bag_configs())
        self.dense = MLP(dense_in, list(dense))
        self.att = nn.Sequential(MLP(4 * d_item, list(att)), nn.Linear(att[-1], 1))
        self.top = nn.Sequential(MLP(dense[-1] + d_bags + d_item + d_cat, list(top)), nn.Linear(top[-1], 1))

    def forward(self, dense_features, sparse_features):
        bags = self.ebc(sparse_features).to_dict()
        seqs = {**self.items(sparse_features), **self.cats(sparse_features)}
        items = seqs["hist_items"].to_padded_dense(self.items_len)  # [B, L, D]
        n = seqs["hist_items"].lengths()
        q = bags["target"].unsqueeze(1).expand_as(items)
        a = self.att(torch.cat([q, items, q * items, q - items], dim=2)).squeeze(2)  # [B, L]
        mask = torch.arange(self.items_len).unsqueeze(0) < n.unsqueeze(1)
        a = torch.softmax(a.masked_fill(~mask, -1e9), dim=1) * mask  # no history: no interest
        interest = (a.unsqueeze(2) * items).sum(dim=1)
        cats = seqs["hist_cats"].to_padded_dense(self.cats_len).sum(dim=1)
        cats = cats / seqs["hist_cats"].lengths().clamp(min=1).unsqueeze(1).float()
        x = torch.cat([self.dense(dense_features), self.ebc(sparse_features).values(), interest, cats], dim=1)
        return torch.sigmoid(self.top(x))


def _ec(table, dim, rows, seed):
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    torch.manual_seed(seed)
    cfg = EmbeddingConfig(name=table, embedding_dim=dim, num_embeddings=rows, feature_names=[table])
    ec = EmbeddingCollection(tables=[cfg], device=torch.device("cpu"))
    nn.init.uniform_(ec.embeddings[table].weight, -0.5, 0.5)
    return ec


def din():
    ebc = _ebc(["user", "target", "ctx"], [5, 8, 3], [40, 70, 9], features={"target": ["target"]}, seed=8)
    items, cats = _ec("hist_items", 8, 70, seed=9), _ec("hist_cats", 5, 13, seed=10)
    torch.manual_seed(15)
    return DIN(ebc, items, cats, DENSE_IN).eval()


MODELS = {"deepfm": deepfm, "mmoe": mmoe, "two_tower": two_tower, "dlrm_dcn": dlrm_dcn, "din": din}


# ---- benchmark sizes (bench/compare_onnx.py, bench/compare_torch_graph.py; not fixtures) ----

import os  # noqa: E402

#: Rows of each table of the benchmark models (`EMBER_GRAPH_ROWS`, default 100): the dense part's
#: speed does not depend on it, the whole model's embedding stage does.
ROWS = int(os.environ.get("EMBER_GRAPH_ROWS", "100"))


def dcn_mlperf():
    """DLRM_DCN at MLPerf DLRM-v2's dense dims (13 dense features -> 512-256-128, 26 features
    of dim 128, 3 cross layers of rank 512, over arch 1024-1024-512-256-1); tables of ROWS rows."""
    names = [f"c{i}" for i in range(26)]
    ebc = _ebc(names, 128, [ROWS] * 26, seed=6)
    torch.manual_seed(15)
    m = TR.DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=DENSE_IN,
                    dense_arch_layer_sizes=[512, 256, 128], over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
                    dcn_num_layers=3, dcn_low_rank_dim=512, dense_device=torch.device("cpu"))
    return _spread(Sigmoid(m).eval(), [m.over_arch.model[-1]])


def mmoe_large():
    """The MMoE above at a production-like width: 8 features of dim 64, 4 experts of 512-256,
    gates and towers (256-1) for ctr, cvr and dwell."""
    ebc = _ebc([f"s{i}" for i in range(8)], 64, [ROWS] * 8, seed=7)
    torch.manual_seed(16)
    m = MMoE(ebc, DENSE_IN, experts=4, expert_dim=256, tasks=("ctr", "cvr", "dwell"))
    m.experts = nn.ModuleList(MLP(512 + 10, [512, 256]) for _ in range(4))
    m.towers = nn.ModuleDict({t: nn.Sequential(MLP(256, [256]), nn.Linear(256, 1)) for t in m.tasks})
    return _spread(m.eval(), [m.towers[t][-1] for t in m.tasks])


def deepfm_large():
    """TorchRec's SimpleDeepFMNN at a production-like width: 26 features of dim 64 (the factorization
    machine over them and the dense arch's output), its deep part 1,728 -> 512, the dense arch
    13 -> 512 -> 64."""
    ebc = _ebc([f"c{i}" for i in range(26)], 64, [ROWS] * 26, seed=21)
    torch.manual_seed(22)
    m = SimpleDeepFMNN(num_dense_features=DENSE_IN, embedding_bag_collection=ebc, hidden_layer_size=512,
                       deep_fm_dimension=512).eval()
    return _spread(m, [m.over_arch.model[0]])


def two_tower_large():
    """The two-tower model above at a production-like width: 4 user and 4 item features of dim 64,
    towers 512-256-128."""
    user = _ebc([f"u{i}" for i in range(4)], 64, [ROWS] * 4, seed=23)
    item = _ebc([f"i{i}" for i in range(4)], 64, [ROWS] * 4, seed=24)
    torch.manual_seed(25)
    return TwoTower(user, item, DENSE_IN, out=128, user=(512, 256), item=(512, 256)).eval()


def din_large():
    """The DIN above at the paper's widths (Zhou et al. 2018: attention MLP 80-40, top MLP
    200-80): bags of dim 64 (user, target item) and 16 (context), histories of 50 items (dim 64)
    and 50 categories (dim 16), dense arch 256-64."""
    ebc = _ebc(["user", "target", "ctx"], [64, 64, 16], [ROWS] * 3, features={"target": ["target"]}, seed=17)
    items, cats = _ec("hist_items", 64, ROWS, seed=18), _ec("hist_cats", 16, ROWS, seed=19)
    torch.manual_seed(20)
    m = DIN(ebc, items, cats, DENSE_IN, items_len=50, cats_len=50, dense=(256, 64), att=(80, 40), top=(200, 80))
    return _spread(m.eval(), [m.top[-1]], seqs={"hist_items": 50, "hist_cats": 50})


def _spread(model, heads, std=1.5, seqs=None):
    """Scales each head's last Linear so that its logits spread as a trained model's do (std
    `std` on random inputs): with PyTorch's default init the scores sit within +-0.002 of 0.49,
    where an AUC says nothing of what a lower precision keeps. `seqs`: each sequence feature's
    length on the random inputs."""
    g = torch.Generator().manual_seed(0)
    dense = torch.rand(512, DENSE_IN, generator=g) * 2 - 1
    logits = {}
    hooks = [h.register_forward_hook(lambda mod, i, o: logits.__setitem__(mod, o)) for h in heads]
    bags = [m for m in model.modules() if isinstance(m, TR.EmbeddingBagCollection)]
    keys = [f for b in bags for c in b.embedding_bag_configs() for f in c.feature_names]
    rows = {f: c.num_embeddings for b in bags for c in b.embedding_bag_configs() for f in c.feature_names}
    from torchrec.modules.embedding_modules import EmbeddingCollection

    per = {k: 1 for k in keys}
    for ec in (m for m in model.modules() if isinstance(m, EmbeddingCollection)):
        for c in ec.embedding_configs():
            for f in c.feature_names:
                keys.append(f)
                rows[f], per[f] = c.num_embeddings, seqs[f]
    lengths = torch.cat([torch.full((512,), per[k]) for k in keys])
    values = torch.cat([torch.randint(0, rows[k], (512 * per[k],), generator=g) for k in keys])
    kjt = TR.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    with torch.no_grad():
        model(dense, kjt)
        for h in heads:
            out = logits[h]
            scale = std / out.std().clamp_min(1e-9)
            h.weight.mul_(scale)
            h.bias.copy_(h.bias * scale - out.mean() * scale)
    for k in hooks:
        k.remove()
    return model


BENCH = {"dcn_mlperf": dcn_mlperf, "mmoe_large": mmoe_large, "din_large": din_large, "deepfm_large": deepfm_large,
         "two_tower_large": two_tower_large}
