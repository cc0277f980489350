"""MLPerf DLRMv3 (Meta's HSTU generative ranker) on LoadGen: the parts of harness.py's `--workload
dlrm-v3` mode that need no server and no LoadGen.

A LoadGen sample is one request of one user (its whole history and its candidates), a line of a
streaming replay written by `ember data users --returns N` (each user's first request, then the
returns in time order). As in MLCommons' reference (recommendation/dlrm_v3, whose
StreamingQuerySampler "determines the execution order, not the QSL or input query ID"), the system
under test ignores LoadGen's sample index and sends the stream's requests in the stream's order:
the k-th query LoadGen issues carries the stream's k-th request, so users come back in timestamp
order and a history cache sees what a live feed would. Responses carry the request's position
first (`[position, scores...]` as float32, as the reference's `[ts_idx, query_idx, preds...]`), so
that an accuracy log is matched by position, not by LoadGen's index (what TEST08 checks).
"""
import json
import threading

import numpy as np

OFFICIAL_MODEL = "dlrm-v3"
# mlperf.conf: dlrm-v3.Server.target_latency = 80 (ms), at the 99th percentile.
LATENCY_BOUND_MS = 80.0
# MLPerf Inference v6.0, DLRMv3 Offline, 8x B200: about 1,300 samples/s per GPU (the figure;
# no H200 or CPU result published).
B200_PER_GPU = 1300.0


def read_stream(path, start=0, count=None):
    """The stream's lines from `start` (at most `count`) -> [user dict]."""
    users = []
    with open(path) as f:
        for k, line in enumerate(f):
            if k < start:
                continue
            if count is not None and len(users) >= count:
                break
            line = line.strip()
            if line:
                users.append(json.loads(line))
    if not users:
        raise SystemExit(f"{path}: no users from line {start}")
    return users


def hstu_inputs(md):
    """ModelMetadataResponse -> ([(feature, values input name)], first task output name). Every
    `F_lengths` input pairs with `F_ids` or `F_values`; the offsets output is not a task."""
    names = [t.name for t in md.inputs]
    feats = []
    for n in names:
        if n.endswith("_lengths"):
            f = n[: -len("_lengths")]
            v = next((x for x in (f + "_ids", f + "_values") if x in names), None)
            if v is None:
                raise SystemExit(f"the server's model has {n} but neither {f}_ids nor {f}_values")
            feats.append((f, v))
    if not feats:
        raise SystemExit("the server's model has no F_lengths inputs: not an HSTU model (dlrm-v3 needs one)")
    tasks = [t.name for t in md.outputs if t.name != "candidate_offsets"]
    if not tasks:
        raise SystemExit("the server's model declares no task output")
    return feats, tasks[0]


def encode_user(pb, model_name, user, feats, output, model_version="", request_id=""):
    """One user -> ModelInferRequest bytes: for each of the model's features the user gives (in
    its history or its candidates), `F_lengths` INT64 [1] and `F_ids` / `F_values` INT64 [len]."""
    req = pb.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
    given = {**user.get("uih", {}), **user.get("candidates", {})}
    for f, values_name in feats:
        if f not in given:
            continue
        v = np.asarray(given[f], dtype="<i8")
        t = req.inputs.add()
        t.name, t.datatype = f"{f}_lengths", "INT64"
        t.shape.append(1)
        req.raw_input_contents.append(np.asarray([len(v)], dtype="<i8").tobytes())
        t = req.inputs.add()
        t.name, t.datatype = values_name, "INT64"
        t.shape.append(len(v))
        req.raw_input_contents.append(v.tobytes())
    req.outputs.add().name = output
    return req.SerializeToString()


def user_shape(user, post_id=None):
    """(history items, candidates) of a stream line: the longest feature of each side."""
    def longest(m):
        return max((len(v) for v in m.values()), default=0)
    return longest(user.get("uih", {})), longest(user.get("candidates", {}))


class StreamLibrary:
    """LoadGen's query sample library for dlrm-v3: the stream's requests, built and serialized
    once. `sizes` are candidates per request (what `pairs` counts: user-item pairs scored), and
    `next_position()` hands out the stream's positions in order (the SUT's order), wrapping at
    the end (counted in `wraps`: a replayed user then finds entries newer than its request)."""

    ordered = True

    def __init__(self, pb, users, feats, model_name, output, model_version="", first=0):
        self.pb, self.model_name, self.output, self.version = pb, model_name, output, model_version
        self.feats, self.first = feats, first
        shapes = [user_shape(u) for u in users]
        self.history = np.asarray([h for h, _ in shapes], dtype=np.int64)
        self.sizes = np.asarray([c for _, c in shapes], dtype=np.int64)
        self.n = len(users)
        self.requests = {i: encode_user(pb, model_name, u, feats, output, model_version, f"s{first + i}")
                         for i, u in enumerate(users)}
        self.build_s = 0.0
        self._lock = threading.Lock()
        self._next = 0
        self.wraps = 0

    def load(self, indices):
        pass  # every request is built when the library is made

    def unload(self, indices):
        pass

    def pairs(self, indices):
        return int(self.sizes[list(indices)].sum())

    def next_position(self):
        with self._lock:
            k = self._next
            self._next += 1
            if self._next == self.n:
                self._next = 0
                self.wraps += 1
            return k

    def renamed(self, model_name):
        """The same requests for a server that names the model `model_name` (a reference server)."""
        import copy
        out = copy.copy(self)
        out.model_name = model_name
        out.requests = {}
        for i, data in self.requests.items():
            req = self.pb.ModelInferRequest()
            req.ParseFromString(data)
            req.model_name = model_name
            out.requests[i] = req.SerializeToString()
        return out

    def position(self):
        with self._lock:
            return self._next


def ne(p, y):
    """Normalized entropy (lower is better): the mean log loss over that of always predicting the
    labels' base rate."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(y, dtype=np.float64)
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    base = np.clip(y.mean(), 1e-7, 1 - 1e-7)
    h = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    return float(ll / h)


def accuracy_rate(p, y):
    """The share of labels that p > 0.5 predicts."""
    return float(np.mean((np.asarray(p) > 0.5) == (np.asarray(y) > 0)))


def read_accuracy_log(path):
    """mlperf_log_accuracy.json -> {stream position: scores}, matched by the position each
    response carries first (not by qsl_idx, which the ordered SUT does not follow)."""
    with open(path) as f:
        entries = json.load(f)
    out = {}
    for e in entries:
        v = np.frombuffer(bytes.fromhex(e["data"]), dtype="<f4")
        out[int(v[0])] = v[1:]
    return out
