#!/usr/bin/env python3
"""Writes the model parity fixtures under crates/ember-model/tests/fixtures/ and checks them.

    ~/.venvs/torch/bin/python tools/make_fixtures.py          # (re)writes all of them
    ~/.venvs/torch/bin/python tools/make_fixtures.py --only dlrm_dot

Each fixture directory holds an Ember model (config.json + model.safetensors) and
inputs.safetensors: `dense` F32 [B, dense_in], `lengths` I64 [F, B] (feature-major), `ids` I64
[sum of lengths] (feature-major), `logits` F32 [B] and `scores` F32 [B] (sigmoid of logits).

The models are the reference modules (facebookresearch/dlrm's DLRM_Net via tools/dlrm_ref.py's
DLRMNet, and TorchRec's real DLRM / DLRM_DCN classes) with random weights from fixed seeds, the
last Linear rescaled so that the logits span about [-2.5, 2.5]. Each is saved as a checkpoint
and exported by tools/export_torch.py's command line, exactly as a user would. The expected
outputs are the reference module's float32 outputs; the script fails unless:
  - they agree with the same module run in float64 (max |diff| < 1e-5),
  - the exported directory, read back by dlrm_ref.load_ember_model, reproduces the module in
    float64 within 1e-6 (and in float32 within 1e-5),
  - f16 / bf16 / int8 / int4 exports of the same checkpoint read back to exactly what PyTorch
    gives for those tables (FBGEMM's own unpack for int8 / int4, so the byte layout of
    docs/model-format.md is the one FBGEMM writes), and stay within quantization tolerance of
    the f32 logits.
"""

import argparse
import contextlib
import copy
import io
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_torch  # noqa: E402
from dlrm_ref import DLRMNet, load_ember_model, split_batch, to_kjt, torchrec_classes  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "ember-model", "tests", "fixtures")
B = 37

# name: (source, seed, spec). dlrm specs use DLRM_Net's arguments; torchrec tables are
# (name, rows, features).
FIXTURES = {
    "dlrm_dot": ("dlrm", 1, dict(m_spa=8, ln_emb=[7, 130, 1000, 33], ln_bot=[13, 16, 8], ln_top=[12, 1],
                                 op="dot", itself=False)),
    "dlrm_dot_self": ("dlrm", 2, dict(m_spa=12, ln_emb=[7, 130, 1000], ln_bot=[5, 12], ln_top=[16, 8, 1],
                                      op="dot", itself=True)),
    "dlrm_cat": ("dlrm", 3, dict(m_spa=[8, 12, 5, 4], ln_emb=[7, 130, 1000, 50], ln_bot=[5, 16, 8],
                                 ln_top=[16, 1], op="cat", itself=False)),
    "torchrec_dlrm": ("torchrec", 4, dict(dim=8, tables=[("t0", 7, ["f0"]), ("t1", 130, ["f1", "f2"]),
                                                          ("t2", 1000, ["f3"])],
                                          dense_in=13, dense=[16, 8], over=[16, 8, 1])),
    "torchrec_dcn": ("torchrec", 5, dict(dim=8, tables=[("t0", 7, ["f0"]), ("t1", 130, ["f1"]),
                                                         ("t2", 1000, ["f2"])],
                                         dense_in=5, dense=[16, 8], over=[16, 1], dcn=(2, 3))),
}

# Quantized copies written as fixtures too (`{name}_{dtype}`), to test Ember's reading of FBGEMM's
# row-wise bytes end to end.
QUANT_FIXTURES = {"dlrm_dot": ("int8", "int4"), "torchrec_dcn": ("int8",)}


def make_inputs(rng, dense_in, feature_rows, nonneg):
    """Random batch: dense [B, dense_in], lengths [F, B] in 0..5 (some empty), ids feature-major."""
    dense = rng.uniform(0, 3, (B, dense_in)) if nonneg else rng.normal(0, 1, (B, dense_in))
    lengths = rng.integers(0, 6, (len(feature_rows), B))
    lengths[np.arange(len(feature_rows)), 3 * np.arange(len(feature_rows)) % B] = 0
    ids = np.concatenate([rng.integers(0, rows, lengths[f].sum()) for f, rows in enumerate(feature_rows)])
    return (torch.tensor(dense, dtype=torch.float32), torch.tensor(lengths, dtype=torch.long),
            torch.tensor(ids, dtype=torch.long))


def build(source, seed, spec, rng):
    """-> (module, run(module, dense, lengths, ids) -> logits [B], last Linear, export flags, inputs)."""
    torch.manual_seed(seed)
    if source == "dlrm":
        n = len(spec["ln_emb"])
        dims = spec["m_spa"] if isinstance(spec["m_spa"], list) else [spec["m_spa"]] * n
        d = spec["ln_bot"][-1]
        num_int = d + sum(dims) if spec["op"] == "cat" else d + (n + 1) * (n + 2 * spec["itself"]) // 2
        model = DLRMNet(spec["m_spa"], spec["ln_emb"], spec["ln_bot"], [num_int] + spec["ln_top"],
                        spec["op"], spec["itself"], seed=seed)
        tables = [e.weight for e in model.emb_l]

        def run(m, dense, lengths, ids):
            return m.logits(dense, *split_batch(lengths, ids))[:, 0]

        flags = ["--arch-mlp-bot", "-".join(map(str, spec["ln_bot"])), "--arch-mlp-top",
                 "-".join(map(str, spec["ln_top"])), "--arch-interaction-op", spec["op"]]
        flags += ["--arch-interaction-itself"] if spec["itself"] else []
        flags += [] if isinstance(spec["m_spa"], list) else ["--arch-sparse-feature-size", str(spec["m_spa"])]
        feature_rows, last = spec["ln_emb"], model.top_l[-2]
    else:
        tr = torchrec_classes()
        configs = [tr.EmbeddingBagConfig(name=t, embedding_dim=spec["dim"], num_embeddings=rows, feature_names=fs)
                   for t, rows, fs in spec["tables"]]
        ebc = tr.EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
        args = dict(embedding_bag_collection=ebc, dense_in_features=spec["dense_in"],
                    dense_arch_layer_sizes=spec["dense"], over_arch_layer_sizes=spec["over"])
        if "dcn" in spec:
            model = tr.DLRM_DCN(**args, dcn_num_layers=spec["dcn"][0], dcn_low_rank_dim=spec["dcn"][1])
            with torch.no_grad():
                for b in model.inter_arch.crossnet.bias:
                    b.normal_(0, 0.1)
        else:
            model = tr.DLRM(**args)
        keys = [f for _, _, fs in spec["tables"] for f in fs]
        feature_rows = [rows for _, rows, fs in spec["tables"] for _ in fs]
        tables = [model.sparse_arch.embedding_bag_collection.embedding_bags[t].weight for t, _, _ in spec["tables"]]

        def run(m, dense, lengths, ids):
            return m(dense, to_kjt(keys, lengths, ids))[:, 0]

        flags = ["--features", ",".join(f"{t}:{f}" for t, _, fs in spec["tables"] for f in fs)]
        last = model.over_arch.model[1]
    with torch.no_grad():  # embeddings large enough that the interactions matter
        for w in tables:
            w.uniform_(-0.5, 0.5)
    inputs = make_inputs(rng, spec.get("dense_in", spec.get("ln_bot", [0])[0]), feature_rows, source == "dlrm")
    with torch.no_grad():  # rescale the last Linear: logits centred, max |logit| = 2.5
        z = run(model.eval(), *inputs).double()
        s = 2.5 / (z - z.mean()).abs().max()
        last.weight.mul_(s)
        last.bias.sub_(z.mean()).mul_(s)
    return model, run, flags, inputs


def export(argv):
    """tools/export_torch.py's command line, its summary line silenced."""
    with contextlib.redirect_stdout(io.StringIO()):
        export_torch.main(argv)


def check(what, got, want, tol):
    err = (got.double() - want.double()).abs().max().item()
    if not err <= tol:
        sys.exit(f"make_fixtures.py: FAILED {what}: max |diff| {err:.3g} > {tol:g}")
    return err


def fbgemm_tables(model_dir, dtype):
    """The tables of an exported model as PyTorch itself decodes them."""
    from safetensors.torch import load_file

    out = {}
    for name, t in load_file(os.path.join(model_dir, "model.safetensors")).items():
        if not name.startswith("tables."):
            continue
        if dtype == "int8":
            t = torch.ops.quantized.embedding_bag_byte_unpack(t)
        elif dtype == "int4":
            t = torch.ops.quantized.embedding_bag_4bit_unpack(t)
        out[name[len("tables."):]] = t.float()
    return out


def make(name, tmp):
    source, seed, spec = FIXTURES[name]
    rng = np.random.default_rng(seed)
    model, run, flags, (dense, lengths, ids) = build(source, seed, spec, rng)
    ckpt = os.path.join(tmp, f"{name}.pt")
    torch.save({"state_dict": model.state_dict()} if source == "dlrm" else model.state_dict(), ckpt)

    out = os.path.join(OUT, name)
    export(["--from", source, ckpt, "--out", out] + flags)
    with torch.inference_mode():
        logits = run(model, dense, lengths, ids)
        want64 = run(copy.deepcopy(model).double(), dense.double(), lengths, ids)
        e32 = check(f"{name}: float32 vs float64 reference", logits, want64, 1e-5)
        ember = load_ember_model(out)
        e_rt = check(f"{name}: exported model (f64) vs reference (f64)", ember.double()(dense.double(), lengths, ids),
                     want64, 1e-6)
        check(f"{name}: exported model (f32) vs reference (f32)", ember.float()(dense, lengths, ids), logits, 1e-5)
        quant = []
        for dtype, tol in (("f16", 0.05), ("bf16", 0.2), ("int8", 0.1), ("int4", 1.0)):
            qdir = os.path.join(tmp, f"{name}_{dtype}")
            export(["--from", source, ckpt, "--out", qdir, "--dtype", dtype] + flags)
            q = load_ember_model(qdir).double()
            got = q(dense.double(), lengths, ids)
            for t, w in fbgemm_tables(qdir, dtype).items():
                k = q.table_names.index(t)
                q.tables[k].data = w[:, :q.tables[k].shape[1]].double()
            check(f"{name} {dtype}: dequantized tables vs PyTorch's", got, q(dense.double(), lengths, ids), 1e-6)
            quant.append(f"{dtype} {check(f'{name} {dtype} vs f32 logits', got, want64, tol):.2g}")
            if dtype in QUANT_FIXTURES.get(name, ()):
                # Ember must read FBGEMM's bytes as FBGEMM does: the outputs to match are PyTorch's
                # on the tables FBGEMM dequantizes (set into q above).
                qout = f"{out}_{dtype}"
                shutil.rmtree(qout, ignore_errors=True)
                shutil.copytree(qdir, qout)
                ql = q.float()(dense, lengths, ids)
                save_file({"dense": dense.contiguous(), "lengths": lengths.contiguous(), "ids": ids.contiguous(),
                           "logits": ql.contiguous(), "scores": torch.sigmoid(ql).contiguous()},
                          os.path.join(qout, "inputs.safetensors"))
    save_file({"dense": dense.contiguous(), "lengths": lengths.contiguous(), "ids": ids.contiguous(),
               "logits": logits.float().contiguous(), "scores": torch.sigmoid(logits).float().contiguous()},
              os.path.join(out, "inputs.safetensors"))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"  {name}: {size / 1024:.1f} KiB, logits in [{logits.min():.2f}, {logits.max():.2f}], "
          f"{int((lengths == 0).sum())} empty bags; f32 vs f64 {e32:.2g}, round trip {e_rt:.2g}; "
          f"max |logit diff| {', '.join(quant)}")
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(FIXTURES), action="append", help="fixture(s) to write (default all)")
    a = ap.parse_args()
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only or FIXTURES:
            total += make(name, tmp)
    print(f"fixtures OK in {os.path.relpath(OUT, ROOT)} ({total / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
