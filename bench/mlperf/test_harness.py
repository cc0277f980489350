"""Fast checks of the MLPerf harness's parts, no server and no LoadGen needed:
    ~/.venvs/mlperf/bin/python -m pytest -q bench/mlperf/test_harness.py
(or run it as a script: plain asserts)."""
import itertools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlrm_v3 as v3  # noqa: E402
import mlperf_common as mc  # noqa: E402


def test_query_size_draw():
    s = mc.draw_query_sizes(200_000, seed=7)
    assert set(np.unique(s)) <= set(mc.QUERY_SIZE_QUANTILES)
    assert s.min() == 100 and s.max() == 700
    assert abs(s.mean() - 270) < 2.0, s.mean()
    share = {v: float((s == v).mean()) for v in (100, 200, 700)}
    assert abs(share[100] - 0.10) < 0.005 and abs(share[200] - 0.60) < 0.005 and abs(share[700] - 0.05) < 0.005
    assert np.array_equal(mc.draw_query_sizes(50, 3), mc.draw_query_sizes(50, 3))
    assert not np.array_equal(mc.draw_query_sizes(50, 3), mc.draw_query_sizes(50, 4))


def _entry():
    if os.path.exists(mc.DEFAULT_LOCALITY):
        return mc.parse_locality_stats(mc.DEFAULT_LOCALITY)[0]
    # the shape of one entry, in case the shared file is absent
    buckets = [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, None)]
    return {"name": "synthetic", "buckets": buckets, "unique_frac": [0.5, 0.2, 0.1, 0.1, 0.05, 0.04, 0.01],
            "index_frac": [0.05, 0.05, 0.1, 0.15, 0.2, 0.2, 0.25]}


def test_id_draw_bounds():
    rng = np.random.default_rng(0)
    entry = _entry()
    for rows in (1, 2, 3, 10, 36, 17295, 200_000, 40_000_000):
        for mode in ("uniform", "skewed"):
            s = mc.IdSampler(rows, mode, entry if mode == "skewed" else None, salt=rows % 7)
            ids = s.sample(rng, 50_000)
            assert ids.dtype == np.int64
            assert ids.min() >= 0 and ids.max() < rows, (rows, mode, ids.min(), ids.max())
            if mode == "skewed" and rows > 1:
                assert s.counts.sum() == rows and (s.counts >= 1).all()


def test_skewed_is_skewed():
    rng = np.random.default_rng(1)
    entry = _entry()
    rows = 200_000
    ids = mc.IdSampler(rows, "skewed", entry).sample(rng, 400_000)
    uni = mc.IdSampler(rows, "uniform").sample(rng, 400_000)
    top = lambda x: np.sort(np.bincount(x, minlength=rows))[::-1][: rows // 100].sum() / len(x)  # noqa: E731
    assert top(ids) > 3 * top(uni), (top(ids), top(uni))  # the hottest 1% of rows take far more lookups


def auc_brute(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    tot = 0.0
    for p, n in itertools.product(pos, neg):
        tot += 1.0 if p > n else 0.5 if p == n else 0.0
    return tot / (len(pos) * len(neg))


def test_auc_against_pair_count():
    rng = np.random.default_rng(2)
    for trial in range(20):
        n = int(rng.integers(2, 300))
        scores = np.round(rng.random(n), int(rng.integers(1, 4)))  # rounding makes ties
        labels = rng.random(n) < 0.4
        if labels.all() or not labels.any():
            labels[0], labels[-1] = True, False
        assert abs(mc.auc(scores, labels) - auc_brute(scores, labels)) < 1e-12
    assert mc.auc([0.1, 0.2, 0.3], [0, 0, 1]) == 1.0
    assert mc.auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5


def test_request_round_trip():
    from tritonclient.grpc import service_pb2 as pb
    rng = np.random.default_rng(3)
    feats = [(f"t{i}", r, p) for i, (r, p) in enumerate(zip([200_000, 3, 36], [100, 1, 2]))]
    samplers = [mc.IdSampler(r) for _, r, _ in feats]
    dense, sparse = mc.build_query(rng, 123, feats, samplers)
    for dt, npdt in (("int32", np.int32), ("int64", np.int64)):
        data = mc.encode_request(pb, "dlrm-v2", dense, sparse, id_dtype=dt)
        name, t = mc.decode_request(pb, data)
        assert name == "dlrm-v2"
        assert list(t) == ["dense"] + [f"{f}_{k}" for f, _, _ in feats for k in ("lengths", "ids")]
        assert t["dense"].shape == (123, 13) and t["dense"].dtype == np.float32
        assert np.array_equal(t["dense"], dense)
        for (f, rows, pool), (_, lengths, ids) in zip(feats, sparse):
            assert t[f"{f}_lengths"].dtype == npdt and t[f"{f}_lengths"].shape == (123,)
            assert (t[f"{f}_lengths"] == pool).all()
            assert t[f"{f}_ids"].shape == (123 * pool,) and np.array_equal(t[f"{f}_ids"], ids)
            assert t[f"{f}_ids"].max() < rows
        req = pb.ModelInferRequest()
        req.ParseFromString(data)
        assert [o.name for o in req.outputs] == ["scores"] and not req.inputs[0].HasField("contents")
    # and a response decodes to its scores
    resp = pb.ModelInferResponse(model_name="dlrm-v2")
    o = resp.outputs.add()
    o.name, o.datatype = "scores", "FP32"
    o.shape.append(3)
    resp.raw_output_contents.append(np.array([0.1, 0.5, 0.9], dtype="<f4").tobytes())
    assert np.allclose(mc.decode_scores(pb, resp.SerializeToString()), [0.1, 0.5, 0.9])


def test_prometheus_parse():
    text = ('# TYPE x histogram\nember_dense_stage_seconds_sum 1.5\nember_dense_stage_seconds_count 3\n'
            'ember_dense_stage_seconds_bucket{le="0.1"} 2\nember_requests_total{protocol="grpc",status="ok"} 4\n'
            'ember_requests_total{protocol="http",status="ok"} 1\n')
    m = mc.parse_prometheus(text)
    assert m["ember_dense_stage_seconds_sum"] == 1.5 and m["ember_requests_total"] == 5
    assert "ember_dense_stage_seconds_bucket" not in m


def test_ne_and_accuracy_rate():
    rng = np.random.default_rng(4)
    y = rng.random(5000) < 0.3
    # the base rate itself has NE 1; a perfect-ish predictor far less; a constant wrong one more
    assert abs(v3.ne(np.full(5000, y.mean()), y) - 1.0) < 1e-9
    assert v3.ne(np.where(y, 0.99, 0.01), y) < 0.1
    assert v3.ne(np.full(5000, 0.9), y) > 1.0
    # by hand on four labels
    p, lab = np.array([0.9, 0.2, 0.6, 0.4]), np.array([1, 0, 0, 1])
    ll = -np.mean([np.log(0.9), np.log(0.8), np.log(0.4), np.log(0.4)])
    assert abs(v3.ne(p, lab) - ll / np.log(2)) < 1e-12
    assert v3.accuracy_rate(p, lab) == 0.5


def test_dlrm_v3_request_and_order():
    from tritonclient.grpc import service_pb2 as pb
    md = pb.ModelMetadataResponse(name="hstu")
    for n in ("item_id_lengths", "item_id_ids", "ts_lengths", "ts_values", "cand_lengths", "cand_ids",
              "ctx_lengths", "ctx_ids"):
        md.inputs.add().name = n
    for n in ("candidate_offsets", "ctr"):
        md.outputs.add().name = n
    feats, output = v3.hstu_inputs(md)
    assert feats == [("item_id", "item_id_ids"), ("ts", "ts_values"), ("cand", "cand_ids"), ("ctx", "ctx_ids")]
    assert output == "ctr"
    users = [{"uih": {"item_id": [5, 6, 7], "ts": [1, 2, 3]}, "candidates": {"cand": [9, 8]}},
             {"uih": {"item_id": [5], "ts": [4]}, "candidates": {"cand": [1]}}]
    lib = v3.StreamLibrary(pb, users, feats, "hstu", output)
    assert list(lib.history) == [3, 1] and list(lib.sizes) == [2, 1]
    name, t = mc.decode_request(pb, lib.requests[0])
    assert name == "hstu" and "ctx_lengths" not in t  # a feature the user leaves out is not sent
    assert t["item_id_lengths"].tolist() == [3] and t["item_id_ids"].tolist() == [5, 6, 7]
    assert t["ts_values"].tolist() == [1, 2, 3] and t["cand_ids"].tolist() == [9, 8]
    assert mc.decode_request(pb, lib.renamed("ref").requests[1])[0] == "ref"
    # positions go in the stream's order, wrapping (counted)
    assert [lib.next_position() for _ in range(5)] == [0, 1, 0, 1, 0] and lib.wraps == 2
    with pytest.raises(SystemExit):
        v3.hstu_inputs(pb.ModelMetadataResponse(name="dlrm"))


def test_dlrm_v3_accuracy_log_is_matched_by_position(tmp_path):
    rows = [np.array([7, 0.25, 0.5], dtype="<f4"), np.array([3, 0.75], dtype="<f4")]
    entries = [{"qsl_idx": 0, "data": r.tobytes().hex()} for r in rows]
    path = tmp_path / "acc.json"
    path.write_text(__import__("json").dumps(entries))
    got = v3.read_accuracy_log(str(path))
    assert sorted(got) == [3, 7] and got[7].tolist() == [0.25, 0.5] and got[3].tolist() == [0.75]


if __name__ == "__main__":
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            if "tmp_path" in fn.__code__.co_varnames[:fn.__code__.co_argcount]:
                import pathlib
                import tempfile
                with tempfile.TemporaryDirectory() as d:
                    fn(pathlib.Path(d))
            else:
                fn()
            print("ok", name)
