"""The parts of the MLPerf DLRM-v2 harness that need no server and no LoadGen: the query-size
draw, the id draws (uniform, or skewed from Meta's locality statistics), the request encoding
(KServe v2 / Triton ModelInferRequest with raw_input_contents), the response decoding, AUC, and
the Prometheus text parser. harness.py drives them; test_harness.py checks them."""
import csv
import math
import os
import re

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_CSV = os.path.join(REPO, "data", "tables", "mlperf_dlrm_dcnv2_tables.csv")
DEFAULT_LOCALITY = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "tables",
                                                 "dlrm_datasets_2021_locality_stats.txt"))

# MLPerf DLRM-v2: the 5% quantiles of the number of user-item pairs in a query (mean 270) and the
# fixed multi-hot size of each of the 26 sparse features (214 ids a pair).
QUERY_SIZE_QUANTILES = [100, 100] + [200] * 12 + [300, 300, 400, 500, 600, 700]
MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DENSE_IN = 13
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def draw_query_sizes(n, seed):
    """n query sizes, each one of the 20 quantiles at random (uniformly): MLPerf's distribution."""
    rng = np.random.default_rng([seed, 1])
    q = np.asarray(QUERY_SIZE_QUANTILES, dtype=np.int64)
    return q[rng.integers(0, len(q), size=n)]


def read_csv_tables(path=DEFAULT_CSV, rows_scale=1.0, max_rows=0):
    """The CSV's tables -> [(name, rows, pooling)]: rows = ceil(rows * F), capped at max_rows (0: no cap)."""
    out = []
    with open(path) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            rows = int(math.ceil(int(r["rows"]) * rows_scale))
            if max_rows:
                rows = min(rows, max_rows)
            out.append((r["table"], max(rows, 1), int(r["pooling_factor"])))
    return out


def model_dir_tables(model_dir):
    """config.json of an Ember model directory -> {feature name: table rows}, in the model's order."""
    import json
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    rows = {t["name"]: int(t["rows"]) for t in cfg["tables"]}
    feats = cfg.get("features") or [{"name": t["name"], "table": t["name"]} for t in cfg["tables"]]
    return {f["name"]: rows[f["table"]] for f in feats}


# ---------------------------------------------------------------------------------------------
# Locality statistics (Meta's dlrm_datasets, "Locality stats after processing ...")

def parse_locality_stats(path):
    """The file's entries -> [{"name", "avg_indices", "avg_unique", "buckets": [(lo, hi)],
    "unique_frac": [...], "index_frac": [...]}]. unique_frac[k]: the share of rows touched whose
    access count lies in bucket k; index_frac[k]: the share of all lookups that go to those rows."""
    entries, cur, section = [], None, None
    bucket_re = re.compile(r"^\((\d+), (\d+)\]: ([0-9.]+)$|^\((\d+)\+: ([0-9.]+)$")
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            if line.endswith(".pt") or line.endswith(".pt:"):
                cur = {"name": line.rstrip(":"), "buckets": [], "unique_frac": [], "index_frac": []}
                entries.append(cur)
                section = None
                continue
            if cur is None:
                continue
            if line.startswith("Avg # of indices:"):
                cur["avg_indices"] = float(line.split(":")[1])
            elif line.startswith("Avg # of unique cols:"):
                cur["avg_unique"] = float(line.split(":")[1])
            elif line.startswith("Histogram of col sizes"):
                section = "unique"
            elif line.startswith("Ratio of index distribution"):
                section = "index"
            elif section and (m := bucket_re.match(line)):
                if m.group(1) is not None:
                    lo, hi, v = int(m.group(1)), int(m.group(2)), float(m.group(3))
                else:
                    lo, hi, v = int(m.group(4)), None, float(m.group(5))
                if section == "unique":
                    cur["buckets"].append((lo, hi))
                    cur["unique_frac"].append(v)
                else:
                    cur["index_frac"].append(v)
    good = [e for e in entries if e["unique_frac"] and len(e["unique_frac"]) == len(e["index_frac"])]
    if not good:
        raise ValueError(f"{path}: no locality entries found (expected 'Histogram of col sizes' and "
                         "'Ratio of index distribution' sections)")
    return good


class IdSampler:
    """Draws ids of one table of `rows` rows.

    uniform: every row alike. skewed: the table's rows split into the locality entry's buckets of
    access count (the hottest bucket first, each bucket a share of the rows as `unique_frac`
    says), a lookup picks a bucket with probability `index_frac` and a row within it uniformly;
    rows are then scattered over the table by a fixed permutation (id = (a * r + b) mod rows), so
    hot rows are not neighbours in memory."""

    def __init__(self, rows, mode="uniform", entry=None, salt=0):
        self.rows = int(rows)
        self.mode = mode
        if mode == "uniform":
            return
        if mode != "skewed" or entry is None:
            raise ValueError("skewed ids need a locality entry")
        uf = np.asarray(entry["unique_frac"], dtype=np.float64)
        xf = np.asarray(entry["index_frac"], dtype=np.float64)
        keep = xf > 0
        uf, xf = uf[keep][::-1], xf[keep][::-1]           # hottest bucket first
        uf = np.maximum(uf, 1e-9)
        uf, xf = uf / uf.sum(), xf / xf.sum()
        n = len(uf)
        if self.rows < n:                                  # tiny table: the hottest buckets, one row each
            uf, xf = np.ones(self.rows), xf[: self.rows] / xf[: self.rows].sum()
            counts = np.ones(self.rows, dtype=np.int64)
        else:
            counts = np.maximum(np.floor(uf * self.rows).astype(np.int64), 1)
            counts[-1] += self.rows - counts.sum()         # the coldest bucket takes the rest
            while counts[-1] < 1:                          # rounding overshot: take from the biggest
                i = int(np.argmax(counts[:-1]))
                counts[i] -= 1
                counts[-1] += 1
        self.counts = counts
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self.cum = np.cumsum(xf)
        self.cum[-1] = 1.0
        # a multiplier coprime with rows makes r -> (a r + b) mod rows a permutation
        a = 2654435761 + 2 * salt
        while math.gcd(a, self.rows) != 1:
            a += 1
        self.a, self.b = a % self.rows if self.rows > 1 else 1, (salt * 40503) % self.rows

    def sample(self, rng, n):
        if self.mode == "uniform":
            return rng.integers(0, self.rows, size=n, dtype=np.int64)
        k = np.searchsorted(self.cum, rng.random(n), side="right")
        k = np.minimum(k, len(self.counts) - 1)
        r = self.starts[k] + np.floor(rng.random(n) * self.counts[k]).astype(np.int64)
        r = np.minimum(r, self.rows - 1)
        return (r * self.a + self.b) % self.rows


# ---------------------------------------------------------------------------------------------
# Queries and their requests

def build_query(rng, n_pairs, features, samplers):
    """One query of n_pairs pairs: (dense float32 [n, 13], [(name, lengths int32 [n], ids [sum])])."""
    dense = rng.random((n_pairs, DENSE_IN), dtype=np.float32)
    sparse = []
    for (name, _rows, pooling), s in zip(features, samplers):
        lengths = np.full(n_pairs, pooling, dtype=np.int32)
        ids = s.sample(rng, n_pairs * pooling)
        sparse.append((name, lengths, ids))
    return dense, sparse


def encode_request(pb, model_name, dense, sparse, output="scores", id_dtype="int32", model_version="",
                   request_id=""):
    """ModelInferRequest bytes: `dense` FP32 [N, 13], `F_lengths` / `F_ids` INT32 or INT64, every tensor
    as raw_input_contents (little-endian), asking for `output`."""
    np_dt, kserve_dt = (np.int32, "INT32") if id_dtype == "int32" else (np.int64, "INT64")
    req = pb.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
    n = dense.shape[0]
    t = req.inputs.add()
    t.name, t.datatype = "dense", "FP32"
    t.shape.extend([n, dense.shape[1]])
    req.raw_input_contents.append(np.ascontiguousarray(dense, dtype="<f4").tobytes())
    for name, lengths, ids in sparse:
        t = req.inputs.add()
        t.name, t.datatype = f"{name}_lengths", kserve_dt
        t.shape.append(len(lengths))
        req.raw_input_contents.append(np.ascontiguousarray(lengths, dtype=np_dt).tobytes())
        t = req.inputs.add()
        t.name, t.datatype = f"{name}_ids", kserve_dt
        t.shape.append(len(ids))
        req.raw_input_contents.append(np.ascontiguousarray(ids, dtype=np_dt).tobytes())
    if output:
        req.outputs.add().name = output
    return req.SerializeToString()


_NP = {"FP32": "<f4", "FP64": "<f8", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "UINT8": "u1"}


def decode_request(pb, data):
    """ModelInferRequest bytes -> (model_name, {input name: numpy array of its shape})."""
    req = pb.ModelInferRequest()
    req.ParseFromString(data)
    out = {}
    for t, raw in zip(req.inputs, req.raw_input_contents):
        out[t.name] = np.frombuffer(raw, dtype=_NP[t.datatype]).reshape(list(t.shape))
    return req.model_name, out


def decode_scores(pb, data):
    """ModelInferResponse bytes -> float32 scores of its first output (raw or typed contents)."""
    resp = pb.ModelInferResponse()
    resp.ParseFromString(data)
    if resp.raw_output_contents:
        dt = _NP.get(resp.outputs[0].datatype, "<f4") if resp.outputs else "<f4"
        return np.frombuffer(resp.raw_output_contents[0], dtype=dt).astype(np.float32)
    return np.asarray(resp.outputs[0].contents.fp32_contents, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# AUC

def auc(scores, labels):
    """ROC AUC by ranks (Mann-Whitney U), ties given their average rank. labels: 0/1."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average rank (1-based) of each run of equal scores
    bounds = np.flatnonzero(np.diff(ss)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(ss)]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# ---------------------------------------------------------------------------------------------
# Prometheus text

_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEnaNInf]+)")


def parse_prometheus(text):
    """Prometheus text -> {metric name (with _sum/_count/_bucket suffixes): summed value over labels},
    plus {name + labels: value} under the key '_raw'."""
    agg, raw = {}, {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if not m:
            continue
        name, labels, val = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(val)
        except ValueError:
            continue
        raw[name + labels] = v
        if name.endswith("_bucket"):
            continue
        agg[name] = agg.get(name, 0.0) + v
    agg["_raw"] = raw
    return agg
