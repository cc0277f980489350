#!/usr/bin/env python3
"""ONNX Runtime running a graph model whole (its embedding bags as graph ops) against Ember's
`bench graph --whole`, same batch sizes and thread counts, alternating, medians
(docs/graph-models.md).

    EMBER_GRAPH_ROWS=100000 ~/.venvs/graph/bin/python bench/onnx_whole.py \\
        --factory tools/graph_models.py:mmoe_large --model DIR [--batch 256,2048] [--threads 1,2] [--reps 3]

One id per (feature, sample), as `ember bench graph --whole --ids-per-bag 1` draws them: each
EmbeddingBagCollection is replaced by a module that gathers its tables' rows by the ids
(`[B, features]`), which is what a bag of one id pools to, and the whole model is exported with
torch.onnx.export (tables as initializers, external data). A sequence feature has max_len ids a
sample (a full history, as Ember's side draws): its EmbeddingCollection becomes a gather of
`[B, max_len]` ids, padded as the model reads it, with the lengths a third input. Ember's side is
the model directory that `export_torch.py --from torch-module` wrote from the same factory and
EMBER_GRAPH_ROWS.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from timing import ms_per_call  # noqa: E402


class Gathered(torch.nn.Module):
    """An EmbeddingBagCollection for bags of one id: its KeyedTensor from the ids' rows."""

    def __init__(self, ebc, holder, lo):
        super().__init__()
        self.keys, self.dims, self.tables = [], [], torch.nn.ParameterList()
        for cfg in ebc.embedding_bag_configs():
            for f in cfg.feature_names:
                self.keys.append(f)
                self.dims.append(cfg.embedding_dim)
                self.tables.append(ebc.embedding_bags[cfg.name].weight)
        self.holder, self.lo = holder, lo

    def forward(self, features):
        import torch_module

        ids = self.holder["ids"]
        rows = [t[ids[:, self.lo + i]] for i, t in enumerate(self.tables)]
        return torch_module._tr().KeyedTensor(keys=self.keys, length_per_key=self.dims, values=torch.cat(rows, 1))


class GatheredSequences(torch.nn.Module):
    """An EmbeddingCollection for full sequences: each feature's `[B, max_len, dim]` rows gathered
    by its ids, with its lengths (column `s` of the `lengths` input)."""

    def __init__(self, ec, holder, lo, s, max_len):
        super().__init__()
        self.feats, self.tables = [], torch.nn.ParameterList()
        for cfg in ec.embedding_configs():
            for f in cfg.feature_names:
                self.feats.append((f, lo, s, max_len[f]))
                self.tables.append(ec.embeddings[cfg.name].weight)
                lo, s = lo + max_len[f], s + 1
        self.holder = holder

    def forward(self, features):
        from torch_sequences import _Padded

        ids, lengths = self.holder["ids"], self.holder["lengths"]
        return {f: _Padded(f, t[ids[:, lo:lo + n]], lengths[:, s])
                for (f, lo, s, n), t in zip(self.feats, self.tables)}


class Whole(torch.nn.Module):
    def __init__(self, model, holder, kjt):
        super().__init__()
        self.model, self.holder, self.kjt = model, holder, kjt

    def forward(self, dense, ids, lengths=None):
        import torch_module

        self.holder["ids"], self.holder["lengths"] = ids, lengths
        out = self.model(dense, self.kjt)
        return tuple(o.reshape(o.shape[0], -1) for o in torch_module.flatten_outputs(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factory", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="256,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ember", default=os.path.join(HERE, "..", "target", "release", "ember"))
    ap.add_argument("--dense-dtype", default="int8")
    a = ap.parse_args()
    import onnxruntime as ort
    import torch_module

    model = torch_module.load_factory(a.factory)
    bags, seqs, config, keys, rows, per = torch_module.bench_shape(model, a.model)
    dense_in = config["dense_in"]
    max_len = {f["name"]: f["max_len"] for f in config["features"] if "max_len" in f}

    def draw(n, gen):
        """`n` samples' ids `[n, sum of per]` (a feature's columns side by side)."""
        return torch.cat([gen(r, (n, p)) for r, p in zip(rows, per)], 1)

    def kjt_of(ids):
        n = ids.shape[0]
        cols = torch.split(ids, per, 1)
        return torch_module.to_kjt({"keys": keys, "values": torch.cat([c.reshape(-1) for c in cols]),
                                    "lengths": torch.cat([torch.full((n,), p) for p in per])})

    # The model's own scores on a small batch, to check the whole-model graph against.
    g = torch.Generator().manual_seed(5)
    check_ids = draw(4, lambda r, s: torch.randint(0, r, s, generator=g))
    check_dense = torch.rand(4, dense_in, generator=g)
    with torch.no_grad():
        want = [o.reshape(-1) for o in torch_module.flatten_outputs(model(check_dense, kjt_of(check_ids)))]
    holder, lo, s = {}, 0, 0
    for path, m, fs in bags + seqs:
        parent, _, leaf = path.rpartition(".")
        seq = any(f in max_len for f, _ in fs)
        stand_in = GatheredSequences(m, holder, lo, s, max_len) if seq else Gathered(m, holder, lo)
        setattr(model.get_submodule(parent) if parent else model, leaf, stand_in)
        lo += sum(max_len.get(f, 1) for f, _ in fs)
        s += len(fs) if seq else 0
    whole = Whole(model, holder, kjt_of(torch.zeros(2, sum(per), dtype=torch.long))).eval()
    b = torch.export.Dim("batch", min=1)
    x = (torch.rand(2, dense_in), torch.zeros(2, sum(per), dtype=torch.long))
    names = ["dense", "ids"]
    if seqs:
        x, names = x + (torch.full((2, len(max_len)), 1, dtype=torch.long),), names + ["lengths"]
    path = os.path.join(tempfile.mkdtemp(), "whole.onnx")
    with torch.no_grad():
        prog = torch.onnx.export(whole, x, dynamo=True, input_names=names,
                                 dynamic_shapes=tuple({0: b} for _ in x), external_data=True)
    prog.save(path, external_data=True)
    batches = [int(v) for v in a.batch.split(",")]
    threads = [int(v) for v in a.threads.split(",")]
    rng = np.random.default_rng(3)
    full = np.array([max_len[f["name"]] for f in config["features"] if "max_len" in f], dtype=np.int64)
    feeds = {n: {"dense": rng.uniform(-1, 1, (n, dense_in)).astype(np.float32),
                 "ids": draw(n, lambda r, s: torch.from_numpy(rng.integers(0, r, s))).numpy().astype(np.int64),
                 **({"lengths": np.tile(full, (n, 1))} if seqs else {})} for n in batches}
    sessions = {}
    for t in threads:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = t, 1
        sessions[t] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    check = {"dense": check_dense.numpy(), "ids": check_ids.numpy()}
    if seqs:
        check["lengths"] = np.tile(full, (4, 1))
    got = sessions[threads[0]].run(None, check)
    for w, o in zip(want, got):
        err = float(((torch.from_numpy(o).reshape(-1) - w).abs() / w.abs().clamp_min(1e-6)).max())
        if not err <= 1e-4:
            sys.exit(f"the whole-model graph is {err:.2e} from the model (relative): not a fair peer")
    res = {}
    for _ in range(a.reps):
        r = subprocess.run([a.ember, "bench", "graph", "--whole", "--model", a.model, "--batch", a.batch, "--threads",
                            a.threads, "--rounds", "1", "--dense-dtype", a.dense_dtype, "--json"],
                           capture_output=True, text=True, check=True)
        for c in json.loads(r.stdout.strip().splitlines()[-1])["cells"]:
            res.setdefault(("ember", c["batch"], c["threads"]), []).append(c["ms"])
        for t, s in sessions.items():
            for n in batches:
                res.setdefault(("ort", n, t), []).append(ms_per_call(lambda: s.run(None, feeds[n])))
    print(f"{a.factory}: ONNX Runtime {ort.__version__} (whole model, f32) against Ember {a.dense_dtype} "
          f"(--whole); ms a batch, medians of {a.reps} reps")
    print("| batch | threads | ONNX Runtime | Ember | Ember / ORT |")
    print("|---|---|---|---|---|")
    for n in batches:
        for t in threads:
            o, e = float(np.median(res[("ort", n, t)])), float(np.median(res[("ember", n, t)]))
            print(f"| {n} | {t} | {o:.2f} | {e:.2f} | {o / e:.2f}x |")


if __name__ == "__main__":
    main()
