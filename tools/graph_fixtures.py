#!/usr/bin/env python3
"""Writes the graph-family fixtures under crates/ember-model/tests/fixtures/graph_*/ and checks them.

    ~/.venvs/tr/bin/python tools/graph_fixtures.py              # (re)writes all of them
    ~/.venvs/tr/bin/python tools/graph_fixtures.py --only mmoe

Environment (docs/graph-models.md): torch, numpy, safetensors, onnx, onnxruntime (the export's check
and the peer), onnxscript (torch's ONNX exporter), and torchrec's Python classes (installed
--no-deps, as docs/dlrm-v2.md says; tools/dlrm_ref.py imports them without fbgemm's native library
where it does not load). `din` needs fbgemm's native ops for its expected outputs (TorchRec's
JaggedTensor.to_padded_dense): the `tr` environment, torch 2.14.1 with fbgemm-gpu-cpu 1.9.0.

Each fixture directory is what a user gets from

    export_torch.py --from torch-module tools/graph_models.py:NAME --example example.pt --out DIR

run as a user would (the command line), plus `expected.json`: the example batch (`dense` [B, n],
`keys`, `lengths` [F * B] feature-major, `values`), the pooled embeddings the model's own
EmbeddingBagCollections give for it (`sparse` [B, sum of dims], the graph's second input) and the
model's outputs in float32 (`outputs`: {name: [B]}); with sequence features, also the graph's
`dense` input (`graph_dense`: the dense features, then each sequence's length), and `sparse` goes
on with each sequence's padded rows. The batch has 7 samples, an empty bag in every feature, a
sample with no ids at all, and (sequence features) a sequence of 12 ids, past every max_len.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "crates", "ember-model", "tests", "fixtures")


#: Each fixture's seed, fixed per name (adding a model must not redraw the others' batches).
SEEDS = {"deepfm": 40, "dlrm_dcn": 41, "mmoe": 42, "two_tower": 43, "din": 41}


def example(model, seed):
    import torch_module

    bags, seqs = torch_module.find_embeddings(model)
    ex = torch_module.random_example(bags, 13, batch=7, seed=seed, seqs=seqs)
    f = len(ex["keys"])
    lengths = ex["lengths"].reshape(f, 7).clone()
    lengths[:, 3] = 0  # a sample with no ids at all
    for i in range(f):
        lengths[i, (i + 1) % 7] = 0  # an empty bag in every feature
    for i in range(f - len(seqs), f):
        lengths[i, 5] = 12  # a sequence longer than any max_len, cut
    rows = {k: cfg.num_embeddings for _, _, fs in bags + seqs for k, cfg in fs}
    g = torch.Generator().manual_seed(seed + 100)
    ex["lengths"] = lengths.reshape(-1)
    ex["values"] = torch.cat([torch.randint(0, rows[k], (int(lengths[i].sum()),), generator=g)
                              for i, k in enumerate(ex["keys"])])
    return ex


def write(name, seed):
    import graph_models
    import torch_module

    d = os.path.join(OUT, f"graph_{name}")
    os.makedirs(d, exist_ok=True)
    model = graph_models.MODELS[name]()
    ex = example(model, seed)
    ex_path = os.path.join(d, "example.pt")
    torch.save(ex, ex_path)
    cmd = [sys.executable, os.path.join(HERE, "export_torch.py"), "--from", "torch-module",
           f"{os.path.join(HERE, 'graph_models.py')}:{name}", "--example", ex_path, "--out", d]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: export failed:\n{r.stdout}{r.stderr}")
    print(r.stdout.strip().splitlines()[-1])
    os.remove(ex_path)
    model = graph_models.MODELS[name]()
    bags, seqs = torch_module.find_embeddings(model)
    kjt = torch_module.to_kjt(ex)
    with torch.no_grad():
        out = model(ex["dense"], kjt)
        cfg = json.load(open(os.path.join(d, "config.json")))
        names = cfg["interaction"]["outputs"]
        outs = torch_module.flatten_outputs(out, names if isinstance(out, dict) else None)
        max_len = {f["name"]: f["max_len"] for f in cfg["features"] if "max_len" in f}
        dense_x, sparse = torch_module.graph_inputs(bags, seqs, ex["dense"], kjt, max_len)
    exp = {
        "dense": ex["dense"].tolist(),
        **({"graph_dense": dense_x.tolist()} if seqs else {}),
        "keys": list(ex["keys"]),
        "lengths": ex["lengths"].tolist(),
        "values": ex["values"].tolist(),
        "sparse": sparse.tolist(),
        "outputs": {n: o.reshape(-1).tolist() for n, o in zip(names, outs)},
    }
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f)
        f.write("\n")


def main():
    import graph_models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(graph_models.MODELS))
    a = ap.parse_args()
    for name in sorted(graph_models.MODELS):
        if a.only in (None, name):
            write(name, SEEDS[name])


if __name__ == "__main__":
    main()
