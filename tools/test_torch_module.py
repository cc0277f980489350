"""Tests of `export_torch.py --from torch-module` (tools/torch_module.py): what it writes, and what
it refuses, each refusal naming why. Needs the graph environment (docs/graph-models.md):

    ~/.venvs/graph/bin/python -m pytest tools/test_torch_module.py -q
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")


def export(tmp_path, source, factory="build", *extra):
    """Runs the export command line on a model file written from `source`: (returncode, output)."""
    f = tmp_path / "model.py"
    f.write_text(source)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(HERE, "export_torch.py"), "--from", "torch-module",
                        f"{f}:{factory}", "--out", str(out), *extra], capture_output=True, text=True,
                       cwd=HERE)
    return r.returncode, r.stdout + r.stderr, out


HEADER = """
    import sys, torch
    from torch import nn
    sys.path.insert(0, %r)
    from dlrm_ref import torchrec_classes
    TR = torchrec_classes()

    def ebc(pooling=None, weighted=False, names=("t0", "t1"), features=None):
        kw = {} if pooling is None else {"pooling": pooling}
        cfgs = [TR.EmbeddingBagConfig(name=n, embedding_dim=4, num_embeddings=10,
                                      feature_names=(features or {}).get(n, [f"f_{n}"]), **kw) for n in names]
        return TR.EmbeddingBagCollection(tables=cfgs, is_weighted=weighted, device=torch.device("cpu"))

    def mixed():
        cfg = lambda n, p: TR.EmbeddingBagConfig(name=n, embedding_dim=4, num_embeddings=10,
                                                 feature_names=[f"f_{n}"], pooling=p)
        return TR.EmbeddingBagCollection(tables=[cfg("t0", TR.PoolingType.SUM), cfg("t1", TR.PoolingType.MEAN)],
                                         device=torch.device("cpu"))

    class Net(nn.Module):
        def __init__(self, bags, heads=1):
            super().__init__()
            self.bags = bags
            self.top = nn.Linear(3 + 8, heads)

        def forward(self, dense_features, sparse_features):
            return torch.sigmoid(self.top(torch.cat([dense_features, self.bags(sparse_features).values()], 1)))
""" % HERE
HEADER = textwrap.dedent(HEADER)


def test_a_model_exports_with_its_tables_and_graph(tmp_path):
    rc, out, d = export(tmp_path, HEADER + "\ndef build():\n    return Net(ebc()).eval()\n", "build",
                        "--dense-in", "3", "--dtype", "bf16")
    assert rc == 0, out
    cfg = json.load(open(d / "config.json"))
    assert cfg["family"] == "graph" and cfg["dense_in"] == 3 and cfg["interaction"]["outputs"] == ["score"]
    assert [t["name"] for t in cfg["tables"]] == ["t0", "t1"] and {t["dtype"] for t in cfg["tables"]} == {"bf16"}
    assert [f["name"] for f in cfg["features"]] == ["f_t0", "f_t1"]
    assert (d / "dense.onnx").stat().st_size > 0 and (d / "model.safetensors").stat().st_size > 0
    assert "largest relative error" in out


@pytest.mark.parametrize("body,why", [
    ("def build():\n    return nn.Linear(3, 1)\n", "no torchrec EmbeddingBagCollection or EmbeddingCollection"),
    ("def build():\n    return Net(mixed()).eval()\n", "pool differently"),
    ("def build():\n    return Net(ebc(weighted=True)).eval()\n", "weighted"),
    ("def build():\n    return Net(ebc(), heads=2).eval()\n", "each output must be [B] or [B, 1]"),
    ("def build():\n    return 3\n", "not an nn.Module"),
])
def test_what_cannot_be_exported_is_refused_saying_why(tmp_path, body, why):
    rc, out, d = export(tmp_path, HEADER + "\n" + body, "build", "--dense-in", "3")
    assert rc != 0 and why in out, out
    assert not (d / "config.json").exists(), "nothing is written"


def test_a_model_the_graph_cannot_carry_is_refused(tmp_path):
    # The output depends on Python state that changes between calls: the export's trace bakes in
    # another value than the model's own call, and the check on the example catches it.
    body = ("class Counting(Net):\n"
            "    calls = 0\n"
            "    def forward(self, dense_features, sparse_features):\n"
            "        Counting.calls += 1\n"
            "        return super().forward(dense_features, sparse_features) * (1.0 / Counting.calls)\n"
            "def build():\n    return Counting(ebc()).eval()\n")
    rc, out, d = export(tmp_path, HEADER + "\n" + body, "build", "--dense-in", "3")
    assert rc != 0 and "from the model" in out and "--rtol" in out, out
    assert not (d / "config.json").exists()


def test_an_unknown_factory_or_file_is_named(tmp_path):
    rc, out, _ = export(tmp_path, HEADER, "nope", "--dense-in", "3")
    assert rc != 0 and "no callable 'nope'" in out
    r = subprocess.run([sys.executable, os.path.join(HERE, "export_torch.py"), "--from", "torch-module",
                        "missing.py:build", "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=HERE)
    assert r.returncode != 0 and "missing.py: no such file" in r.stderr


def test_the_example_must_list_the_models_features(tmp_path):
    ex = tmp_path / "ex.pt"
    torch.save({"dense": torch.zeros(2, 3), "keys": ["f_t1", "f_t0"], "lengths": torch.ones(4, dtype=torch.long),
                "values": torch.zeros(4, dtype=torch.long)}, ex)
    rc, out, _ = export(tmp_path, HEADER + "\ndef build():\n    return Net(ebc()).eval()\n", "build",
                        "--example", str(ex))
    assert rc != 0 and "not the model's features" in out, out


SEQ = HEADER + textwrap.dedent("""
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    def ec(name="hist", dim=4, rows=10):
        return EmbeddingCollection(tables=[EmbeddingConfig(name=name, embedding_dim=dim, num_embeddings=rows,
                                                           feature_names=[name])], device=torch.device("cpu"))

    class Seq(nn.Module):
        \"\"\"A pooled bag and a sequence read by `read(jt)` ([B, 5, 4] -> mean over positions).\"\"\"
        def __init__(self, read):
            super().__init__()
            self.bags, self.seq, self.read = ebc(names=("t0",)), ec(), read
            self.top = nn.Linear(3 + 4 + 4, 1)

        def forward(self, dense_features, sparse_features):
            x = self.read(self.seq(sparse_features)["hist"])
            return torch.sigmoid(self.top(torch.cat([dense_features, self.bags(sparse_features).values(), x], 1)))
""")


def test_a_sequence_feature_exports_with_its_max_len(tmp_path):
    # A padding value other than 0 and lengths() both reach the graph; the sequence's max_len is
    # the longest desired_length the model asks for.
    body = ("def read(jt):\n"
            "    x = jt.to_padded_dense(5, padding_value=-1.0)\n"
            "    y = jt.to_padded_dense(3)\n"
            "    n = jt.lengths().clamp(min=1).unsqueeze(1).float()\n"
            "    return x.sum(1) / n + y.mean(1)\n"
            "def build():\n    return Seq(read).eval()\n")
    rc, out, d = export(tmp_path, SEQ + body, "build", "--dense-in", "3")
    assert rc == 0, out
    cfg = json.load(open(d / "config.json"))
    assert cfg["features"] == [{"name": "f_t0", "table": "t0"}, {"name": "hist", "table": "hist", "max_len": 5}]
    assert [t["name"] for t in cfg["tables"]] == ["t0", "hist"]
    import onnx
    g = onnx.load(str(d / "dense.onnx")).graph
    dims = {i.name: [x.dim_value or x.dim_param for x in i.type.tensor_type.shape.dim] for i in g.input}
    assert dims == {"dense": ["batch", 4], "sparse": ["batch", 4 + 5 * 4]}, dims


@pytest.mark.parametrize("read,why", [
    ("jt.values().sum(0, keepdim=True).expand(jt.lengths().shape[0], 4)", "JaggedTensor.values()"),
    ("torch.stack([t.sum(0) for t in jt.to_dense()])", "JaggedTensor.to_dense()"),
    ("jt.to_padded_dense().sum(1)", "without desired_length"),
    ("jt.lengths().float().unsqueeze(1).expand(-1, 4)", "never calls to_padded_dense"),
])
def test_a_sequence_read_another_way_is_refused_saying_why(tmp_path, read, why):
    body = f"def build():\n    return Seq(lambda jt: {read}).eval()\n"
    rc, out, d = export(tmp_path, SEQ + body, "build", "--dense-in", "3")
    assert rc != 0 and why in out and "'hist'" in out, out
    assert not (d / "config.json").exists(), "nothing is written"
