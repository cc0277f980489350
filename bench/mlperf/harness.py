#!/usr/bin/env python3
"""MLPerf Inference DLRM-v2 on MLCommons' LoadGen against any KServe v2 / Triton gRPC server.

Each LoadGen sample is one query of 100 to 700 user-item pairs (MLPerf's quantiles, mean 270),
sent as ONE ModelInfer request with binary tensors (raw_input_contents), built and serialized once
when LoadGen loads the sample, sent asynchronously; the response callback completes the sample.

    harness.py --grpc 127.0.0.1:18111 --scenario Offline --duration 30
    harness.py --grpc 127.0.0.1:18111 --scenario Server --find-max
    harness.py --grpc 127.0.0.1:18121 --accuracy --reference-grpc 127.0.0.1:18111

See bench/mlperf/README.md for what each figure means.
"""
import argparse
import array
import collections
import datetime
import json
import os
import resource
import sys
import threading
import time
import urllib.request

import numpy as np

import dlrm_v3 as v3
import mlperf_common as mc

HERE = os.path.dirname(os.path.abspath(__file__))
OFFICIAL_MODEL = "dlrm-v2"
LATENCY_BOUND_MS = 60.0
BEST_CPU_PER_CORE = 18928.6 / 256  # MLPerf v5.1 best CPU Offline, two Xeon 6980P


def log(msg=""):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Server discovery

def model_metadata(pb, channel, name, version=""):
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelMetadata",
                               request_serializer=pb.ModelMetadataRequest.SerializeToString,
                               response_deserializer=pb.ModelMetadataResponse.FromString)
    return call(pb.ModelMetadataRequest(name=name, version=version), timeout=10)


def _as_input_tensor(t):
    from tritonclient.grpc import service_pb2 as pb
    try:
        x = pb.ModelInferRequest.InferInputTensor()
        x.ParseFromString(t.SerializeToString())
        return x
    except Exception:  # noqa: BLE001
        return None


def server_features(md):
    """ModelMetadataResponse -> [(feature, rows or None)] from its `F_ids` inputs, in order, and the
    first output's name."""
    feats = []
    names = {t.name for t in md.inputs}
    for t in md.inputs:
        if t.name.endswith("_ids") and t.name[:-4] + "_lengths" in names:
            # Ember adds `parameters` (field 4: {"rows": N}) to TensorMetadata; Triton's proto lacks it,
            # so it arrives as an unknown field: re-read the tensor as InferInputTensor, whose fields
            # 1-4 (name, datatype, shape, parameters) have the same numbers and types.
            tensor = _as_input_tensor(t)
            rows = None
            if tensor is not None and "rows" in tensor.parameters:
                p = tensor.parameters["rows"]
                if p.WhichOneof("parameter_choice") == "int64_param":
                    rows = int(p.int64_param)
            feats.append((t.name[:-4], rows))
    output = md.outputs[0].name if md.outputs else "scores"
    return feats, output


def resolve_features(args, md_feats):
    """[(feature, rows, pooling)] for the queries: rows from --model-dir, else the CSV x --rows-scale;
    never above what the server's metadata says its table holds."""
    n = len(md_feats)
    if args.pooling:
        pool = [args.pooling] * n
    elif n == len(mc.MULTI_HOT):
        pool = list(mc.MULTI_HOT)
    else:
        raise SystemExit(f"the server's model has {n} sparse features, not DLRM-v2's 26: give --pooling N")
    if args.model_dir:
        rows_by = mc.model_dir_tables(args.model_dir)
        missing = [f for f, _ in md_feats if f not in rows_by]
        if missing:
            raise SystemExit(f"--model-dir {args.model_dir}: no feature {missing[:3]} in its config.json")
        rows = [rows_by[f] for f, _ in md_feats]
        src = f"{args.model_dir}/config.json"
    else:
        csv_t = mc.read_csv_tables(args.tables_csv, args.rows_scale, args.max_rows)
        if len(csv_t) != n:
            raise SystemExit(f"the CSV has {len(csv_t)} tables, the server's model {n} features: give --model-dir")
        rows = [r for _, r, _ in csv_t]
        src = f"{os.path.relpath(args.tables_csv)} x rows-scale {args.rows_scale}" + (
            f", capped at {args.max_rows}" if args.max_rows else "")
    clamped = []
    for i, (f, mrows) in enumerate(md_feats):
        if mrows is not None and mrows < rows[i]:
            clamped.append((f, rows[i], mrows))
            rows[i] = mrows
    log(f"tables: rows from {src}")
    if clamped:
        log(f"  note: {len(clamped)} table(s) are smaller on the server than that (e.g. {clamped[0][0]}: "
            f"{clamped[0][1]:,} -> {clamped[0][2]:,} rows, from the server's metadata); ids drawn within the "
            "server's rows")
    return [(f, r, p) for (f, _), r, p in zip(md_feats, rows, pool)]


# ---------------------------------------------------------------------------------------------
# Query sample library

class QueryLibrary:
    """n synthetic queries; query i is drawn from its own seed (seed, i), so it is the same whatever
    order LoadGen loads them in. load() builds and serializes each request once."""

    def __init__(self, pb, n, seed, features, samplers, model_name, output, id_dtype, model_version=""):
        self.pb, self.n, self.seed = pb, n, seed
        self.features, self.samplers = features, samplers
        self.model_name, self.output, self.id_dtype, self.version = model_name, output, id_dtype, model_version
        self.sizes = mc.draw_query_sizes(n, seed)
        self.requests = {}
        self.build_s = 0.0

    def query(self, i):
        rng = np.random.default_rng([self.seed, 2, int(i)])
        return mc.build_query(rng, int(self.sizes[i]), self.features, self.samplers)

    def encode(self, i, model_name=None):
        dense, sparse = self.query(i)
        return mc.encode_request(self.pb, model_name or self.model_name, dense, sparse, self.output,
                                 self.id_dtype, self.version)

    def load(self, indices):
        t = time.perf_counter()
        for i in indices:
            if i not in self.requests:
                self.requests[i] = self.encode(i)
        self.build_s += time.perf_counter() - t

    def unload(self, indices):
        pass  # kept: every sample fits (performance_sample_count = the library's size)

    def pairs(self, indices):
        return int(self.sizes[list(indices)].sum())


# ---------------------------------------------------------------------------------------------
# System under test

class GrpcSut:
    """Sends each query as one ModelInfer call (pre-serialized bytes, pass-through serializers).

    Server: every query goes out when LoadGen issues it. Offline: at most --max-inflight calls are
    outstanding; a call the server refuses for load (RESOURCE_EXHAUSTED / UNAVAILABLE) is sent again
    when another completes (Offline only; in Server it is an error and the run is judged INVALID)."""

    RETRYABLE = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")

    def __init__(self, lg, channel, lib, timeout_s, ordered=None):
        self.lg, self.lib, self.timeout_s = lg, lib, timeout_s
        # dlrm-v3: LoadGen's indices are ignored; each query sent carries the stream's next request
        self.ordered = getattr(lib, "ordered", False) if ordered is None else ordered
        self.call = channel.unary_unary(mc.MODEL_INFER)  # bytes in, bytes out
        self.lock = threading.Lock()
        self.reset(accuracy=False, max_inflight=0, retry=False)

    def reset(self, accuracy, max_inflight, retry):
        self.accuracy, self.max_inflight, self.retry = accuracy, max_inflight, retry
        self.pending = collections.deque()
        self.inflight = 0
        self.records = []       # (qsl index, pairs, latency ns)
        self.errors = collections.Counter()
        self.refusals = 0
        self.keep = {}          # accuracy: response arrays kept alive, and the scores per index
        self.scores = {}
        self.window = max_inflight   # Offline: shrinks by one on a refusal, grows back after successes
        self.ok_streak = 0
        self.sent = 0

    # LoadGen callbacks
    def issue_queries(self, query_samples):
        # ordered: the stream position is taken when the query is sent (None until then), so that
        # Offline's queue goes out in the stream's order and a retried query keeps its position
        items = [(q.id, None if self.ordered else q.index) for q in query_samples]
        if self.max_inflight:
            with self.lock:
                self.pending.extend(items)
            self._pump()
        else:
            for qid, idx in items:
                self._send(qid, idx, time.perf_counter_ns())

    def flush_queries(self):
        pass

    def _pump(self):
        while True:
            with self.lock:
                if not self.pending or self.inflight >= self.window:
                    return
                qid, idx = self.pending.popleft()
                self.inflight += 1
            self._send(qid, idx, time.perf_counter_ns(), counted=True)

    def _send(self, qid, idx, t0, counted=False):
        if idx is None:
            idx = self.lib.next_position()
        self.sent += 1
        fut = self.call.future(self.lib.requests[idx], timeout=self.timeout_s)
        fut.add_done_callback(lambda f: self._done(f, qid, idx, t0, counted))

    def _done(self, fut, qid, idx, t0, counted):
        lat = time.perf_counter_ns() - t0
        exc = fut.exception()
        if exc is not None:
            code = exc.code().name if hasattr(exc, "code") else type(exc).__name__
            if self.retry and code in self.RETRYABLE:
                # refused for load: narrow the window and resend when a call completes (or shortly,
                # when none is outstanding), so that refusals do not spin client and server
                with self.lock:
                    self.refusals += 1
                    self.pending.appendleft((qid, idx))
                    self.inflight -= 1
                    self.window = max(1, self.window - 1)
                    self.ok_streak = 0
                    alone = self.inflight == 0
                if alone:
                    threading.Timer(0.005, self._pump).start()
                return
            self.errors[code] += 1
            if len(self.errors) == 1 and sum(self.errors.values()) == 1:
                log(f"  error: {code}: {exc.details() if hasattr(exc, 'details') else exc}")
            self._complete(qid, None)
        else:
            self.records.append((idx, int(self.lib.sizes[idx]), lat))
            if self.accuracy:
                scores = mc.decode_scores(self.lib.pb, fut.result())
                self.scores[idx] = scores
                if self.ordered:  # the accuracy log is matched by the position it carries
                    scores = np.concatenate([np.asarray([idx], dtype=np.float32), scores])
                self._complete(qid, scores)
            else:
                self._complete(qid, None)
        if counted:
            with self.lock:
                self.inflight -= 1
                self.ok_streak += 1
                if self.ok_streak >= 16 and self.window < self.max_inflight:
                    self.window += 1
                    self.ok_streak = 0
            self._pump()

    def _complete(self, qid, scores):
        lg = self.lg
        if scores is None:
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0)])
            return
        buf = array.array("B", np.ascontiguousarray(scores, dtype="<f4").tobytes())
        self.keep[qid] = buf
        addr, n = buf.buffer_info()
        lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, addr, n)])


class _NoLoadGen:
    """Stands in for mlperf_loadgen outside a LoadGen run (calibration)."""

    @staticmethod
    def QuerySampleResponse(*a):
        return None

    @staticmethod
    def QuerySamplesComplete(_):
        pass


def closed_loop(channel, lib, indices, seconds, inflight, timeout_s):
    """Sends the queries round-robin with at most `inflight` outstanding for `seconds` (no LoadGen, the
    SUT's Offline sender): the server's throughput in queries/s, to size LoadGen's target rate."""
    sut = GrpcSut(_NoLoadGen, channel, lib, timeout_s)
    sut.reset(accuracy=False, max_inflight=inflight, retry=True)
    t = time.perf_counter()
    sut.issue_queries([_Q(k, indices[k % len(indices)]) for k in range(1_000_000)])
    time.sleep(seconds)
    with sut.lock:
        sut.pending.clear()
    while sut.inflight > 0 and time.perf_counter() - t < seconds + timeout_s:
        time.sleep(0.002)
    wall = time.perf_counter() - t
    recs = list(sut.records)
    if not recs:
        raise SystemExit(f"the server answered none of the calibration queries ({dict(sut.errors)})")
    pairs = sum(r[1] for r in recs)
    return len(recs) / wall, pairs / wall, sut.refusals, [r[2] / 1e9 for r in recs]


class _Q:
    __slots__ = ("id", "index")

    def __init__(self, i, idx):
        self.id, self.index = i, idx


def score_all(channel, lib, indices, inflight, timeout_s):
    """Scores of each query on a server (the reference), at most `inflight` calls at a time, calls
    refused for load sent again (the Offline sender without LoadGen)."""
    sut = GrpcSut(_NoLoadGen, channel, lib, timeout_s, ordered=False)
    sut.reset(accuracy=True, max_inflight=inflight, retry=True)
    indices = list(indices)
    lib.load(indices)
    sut.issue_queries([_Q(k, i) for k, i in enumerate(indices)])
    while len(sut.records) + sum(sut.errors.values()) < len(indices):
        time.sleep(0.005)
    if sut.errors:
        raise SystemExit(f"the reference server failed {sum(sut.errors.values())} queries: {dict(sut.errors)}")
    return sut.scores


# ---------------------------------------------------------------------------------------------
# Metrics

def scrape(url):
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return mc.parse_prometheus(r.read().decode())
    except Exception as e:  # noqa: BLE001
        log(f"  metrics: cannot read {url}: {e}")
        return None


def proc_cpu_s(pid):
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def self_cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


STAGES = [
    ("decode", "ember_request_decode_seconds"),
    ("embedding", "ember_embedding_stage_seconds"),
    ("dense", "ember_dense_stage_seconds"),
    ("queue wait", "ember_queue_wait_seconds"),
]


def breakdown(before, after, queries):
    """Server-side time per stage over a run (deltas of the histograms' sums)."""
    if before is None or after is None:
        return None

    def d(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    req_s = d("ember_request_duration_seconds_sum")
    req_n = d("ember_request_duration_seconds_count")
    out = {"request_total_s": req_s, "requests": req_n, "stages": [], "counters": {}}
    for label, m in STAGES:
        s, n = d(m + "_sum"), d(m + "_count")
        if (m + "_sum") not in after:
            out["stages"].append({"stage": label, "metric": m, "missing": True})
            continue
        out["stages"].append({"stage": label, "metric": m, "seconds": s, "observations": n,
                              "per_query_ms": 1e3 * s / queries if queries else None,
                              "share_of_request": s / req_s if req_s > 0 else None})
    if req_s > 0:
        known = sum(st.get("seconds", 0.0) for st in out["stages"])
        out["stages"].append({"stage": "other (protobuf parse, encode, transport, waits)", "metric": None,
                              "seconds": max(req_s - known, 0.0),
                              "per_query_ms": 1e3 * max(req_s - known, 0.0) / queries if queries else None,
                              "share_of_request": max(req_s - known, 0.0) / req_s})
    bs, bn = d("ember_batch_size_sum"), d("ember_batch_size_count")
    if bn > 0:
        out["mean_batch_size"] = bs / bn
        out["batches"] = bn
    for name in sorted(after):
        if name.startswith(("ember_tier_", "ember_remote_", "ember_history_cache_")) and not name.endswith("_bucket"):
            out["counters"][name] = d(name)
    hits = sum(v for k, v in out["counters"].items() if "hit" in k)
    reads = sum(v for k, v in out["counters"].items() if "read" in k or "miss" in k)
    if hits + reads > 0:
        out["tier_hit_ratio"] = hits / (hits + reads)
    return out


# ---------------------------------------------------------------------------------------------
# LoadGen runs

def parse_summary(path):
    out, lines = {}, []
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return {}, ""
    es = None
    for line in text.splitlines():
        if es is not None:
            if line.strip().startswith("*"):
                es.append(line.strip().lstrip("* ").strip())
                continue
            out["Early Stopping Result"] = " | ".join(es)
            es = None
        if line.startswith("Early Stopping Result"):
            es = []
            continue
        if ":" in line and not line.startswith("="):
            k, v = line.split(":", 1)
            out.setdefault(k.strip(), v.strip())
    return out, text


KEY_LINES = ("Scenario", "Mode", "Samples per second", "Completed samples per second",
             "Scheduled samples per second", "Result is", "Min duration satisfied",
             "Min queries satisfied", "Early stopping satisfied", "Performance constraints satisfied",
             "99.00 percentile latency (ns)", "Early Stopping Result", "50.00 percentile latency (ns)",
             "Mean latency (ns)", "Max latency (ns)")


def size_latency(records):
    by = collections.defaultdict(list)
    for _, size, lat in records:
        by[size].append(lat / 1e6)
    out = []
    for size in sorted(by):
        v = np.asarray(by[size])
        out.append({"pairs": int(size), "queries": int(len(v)), "median_ms": float(np.median(v)),
                    "p99_ms": float(np.percentile(v, 99)), "max_ms": float(v.max())})
    return out


class Bench:
    def __init__(self, args, lg, pb, channel, lib):
        self.args, self.lg, self.pb, self.channel, self.lib = args, lg, pb, channel, lib
        self.sut = GrpcSut(lg, channel, lib, args.timeout)
        self.sut_h = lg.ConstructSUT(self.sut.issue_queries, self.sut.flush_queries)
        self.qsl_h = lg.ConstructQSL(lib.n, lib.n, lib.load, lib.unload)
        self.runs = []
        self.official_model = v3.OFFICIAL_MODEL if args.workload == "dlrm-v3" else OFFICIAL_MODEL

    def close(self):
        self.lg.DestroyQSL(self.qsl_h)
        self.lg.DestroySUT(self.sut_h)

    def official(self, scenario, outdir):
        """LoadGen's own mlperf.conf values for the workload in this scenario (conf_type 0: mlperf.conf only;
        the user.conf call alone does not reload it after the first run in a process)."""
        s = self.lg.TestSettings()
        empty = os.path.join(outdir, "empty.conf")
        open(empty, "w").close()
        s.FromConfig(empty, self.official_model, scenario, 0)
        return s

    def settings(self, scenario, mode, target_qps, duration_s, outdir):
        lg, a = self.lg, self.args
        off = self.official(scenario, outdir)
        notes = []
        if a.official:
            s = self.official(scenario, outdir)
            user = os.path.join(outdir, "user.conf")
            with open(user, "w") as f:
                f.write(f"{self.official_model}.{scenario}.target_qps = {target_qps}\n")
                f.write(f"{self.official_model}.{scenario}.performance_sample_count_override = {self.lib.n}\n")
            s.FromConfig(user, self.official_model, scenario, 1)
            notes.append(f"official LoadGen settings (mlperf.conf for {self.official_model}: min_duration "
                         f"{off.min_duration_ms / 1000:g} s, min_query_count {off.min_query_count}), except "
                         f"performance_sample_count = {self.lib.n}, the library's size (official "
                         f"{off.performance_sample_count_override})")
        else:
            s = lg.TestSettings()
        s.scenario = getattr(lg.TestScenario, scenario)
        s.mode = mode
        if not a.official:
            s.min_duration_ms = int(duration_s * 1000)
            s.min_query_count = 1 if scenario == "Offline" else a.min_queries
            s.performance_sample_count_override = self.lib.n
            notes.append(f"NOT the official run rules: min_duration {duration_s:g} s (official "
                         f"{off.min_duration_ms / 1000:g} s), min_query_count {s.min_query_count} (official "
                         f"{off.min_query_count}), performance_sample_count {self.lib.n} (official "
                         f"{off.performance_sample_count_override}); --official uses LoadGen's own values")
        if scenario == "Server":
            s.server_target_qps = float(target_qps)
            if not a.official:
                s.server_target_latency_ns = int(a.latency_ms * 1e6)
                s.server_target_latency_percentile = 0.99
        else:
            s.offline_expected_qps = float(target_qps)
        if not a.official:  # official runs keep LoadGen's own seeds
            s.sample_index_rng_seed = a.seed * 3 + 1
            s.schedule_rng_seed = a.seed * 5 + 2
        return s, notes

    def run(self, scenario, target_qps, duration_s, tag, accuracy=False):
        lg, a = self.lg, self.args
        outdir = os.path.join(a.out, tag)
        os.makedirs(outdir, exist_ok=True)
        mode = lg.TestMode.AccuracyOnly if accuracy else lg.TestMode.PerformanceOnly
        settings, notes = self.settings(scenario, mode, target_qps, duration_s, outdir)
        ls = lg.LogSettings()
        ls.log_output.outdir = outdir
        ls.log_output.copy_summary_to_stdout = False
        ls.enable_trace = False
        offline = scenario == "Offline"
        self.sut.reset(accuracy=accuracy, max_inflight=a.max_inflight if offline else 0, retry=offline)
        log(f"\n== {tag}: {scenario} {'AccuracyOnly' if accuracy else 'PerformanceOnly'}, target "
            f"{target_qps:.2f} samples/s, {duration_s:g} s" + (f", max {a.max_inflight} in flight" if offline else ""))
        for n in notes:
            log(f"   note: {n}")
        m0, sc0, cc0 = scrape(a.metrics_url), proc_cpu_s(a.server_pid), self_cpu_s()
        t0 = time.perf_counter()
        lg.StartTestWithLogSettings(self.sut_h, self.qsl_h, settings, ls,
                                    os.path.join(outdir, "no-audit.config"))
        wall = time.perf_counter() - t0
        m1, sc1, cc1 = scrape(a.metrics_url), proc_cpu_s(a.server_pid), self_cpu_s()
        summ, text = parse_summary(os.path.join(outdir, "mlperf_log_summary.txt"))
        recs = list(self.sut.records)
        nq = len(recs)
        nerr = sum(self.sut.errors.values())
        pairs = sum(r[1] for r in recs)
        lat = np.asarray([r[2] for r in recs]) / 1e6 if recs else np.zeros(1)
        valid_lg = summ.get("Result is")
        if offline:
            sps = float(summ.get("Samples per second", "nan"))
        else:
            sps = float(summ.get("Completed samples per second", summ.get("Scheduled samples per second", "nan")))
        p99_ns = summ.get("99.00 percentile latency (ns)")
        res = {
            "tag": tag, "scenario": scenario, "mode": "AccuracyOnly" if accuracy else "PerformanceOnly",
            "target_qps": target_qps, "duration_s": duration_s, "wall_s": wall, "official": a.official,
            "notes": notes, "outdir": outdir,
            "loadgen": {k: summ[k] for k in KEY_LINES if k in summ},
            "loadgen_result": valid_lg,
            "samples_per_s": sps,
            "pairs_per_s": sps * (pairs / nq) if nq else None,
            "server_cores": a.server_cores,
            "samples_per_s_per_core": sps / a.server_cores if a.server_cores else None,
            "p99_ms": int(p99_ns) / 1e6 if p99_ns else None,
            "client": {"queries": nq, "pairs": pairs, "errors": dict(self.sut.errors),
                       "offline_refusals_retried": self.sut.refusals,
                       "p50_ms": float(np.median(lat)), "p99_ms": float(np.percentile(lat, 99)),
                       "cpu_s": cc1 - cc0, "cpu_us_per_query": 1e6 * (cc1 - cc0) / max(nq, 1),
                       "by_size": size_latency(recs)},
            "server_cpu_s": (sc1 - sc0) if sc0 is not None and sc1 is not None else None,
            "breakdown": breakdown(m0, m1, nq),
        }
        if res["server_cpu_s"] is not None:
            res["server_cpu_us_per_query"] = 1e6 * res["server_cpu_s"] / max(nq, 1)
            res["server_cores_busy"] = res["server_cpu_s"] / wall
        res["valid"] = (valid_lg == "VALID") and nerr == 0
        if nerr:
            res["harness_note"] = (f"{nerr} queries failed ({dict(self.sut.errors)}): the harness judges the "
                                   "run INVALID whatever LoadGen says (a refused query looks fast to it)")
        self.runs.append(res)
        self.print_run(res)
        return res

    def print_run(self, r):
        a = self.args
        if r["mode"] == "AccuracyOnly":
            c = r["client"]
            log(f"   AccuracyOnly: {c['queries']} queries answered ({c['pairs']:,} pairs), "
                f"{sum(c['errors'].values())} failed; client p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms")
            return
        log("   LoadGen summary (mlperf_log_summary.txt):")
        for k in KEY_LINES:
            if k in r["loadgen"]:
                log(f"     {k} : {r['loadgen'][k]}")
        c = r["client"]
        per_core = r["samples_per_s_per_core"]
        log(f"   samples/s {r['samples_per_s']:.2f} ({(r['pairs_per_s'] or 0):,.0f} pairs/s); per server core "
            f"{per_core:.2f} ({a.server_cores} core(s){' [' + a.cores_note + ']' if a.cores_note else ''}; "
            
            + (f"beside ~{v3.B200_PER_GPU:,.0f} per B200 GPU, MLPerf v6.0: a GPU, not a CPU core)"
               if a.workload == "dlrm-v3" else f"best published CPU: {BEST_CPU_PER_CORE:.1f})"))
        p99 = f"{r['p99_ms']:.2f} ms" if r["p99_ms"] is not None else "n/a"
        log(f"   p99 latency (LoadGen) {p99}; client p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms; "
            f"{c['queries']} queries, {c['pairs']:,} pairs")
        log(f"   LoadGen: {r['loadgen_result']}; harness: {'VALID' if r['valid'] else 'INVALID'}"
            + (f" ({r['harness_note']})" if r.get("harness_note") else ""))
        if c["offline_refusals_retried"]:
            log(f"   the server refused {c['offline_refusals_retried']} calls for load; retried (Offline)")
        log(f"   client CPU {c['cpu_s']:.2f} s = {c['cpu_us_per_query']:.0f} us per query"
            + (f"; server CPU {r['server_cpu_s']:.2f} s = {r['server_cpu_us_per_query']:.0f} us per query, "
               f"{r['server_cores_busy']:.2f} cores busy" if r.get("server_cpu_s") is not None else ""))
        b = r["breakdown"]
        if b:
            log(f"   server time ({b['requests']:.0f} requests, {b.get('batches', 0):.0f} batches, mean batch "
                f"{b.get('mean_batch_size', 0):.0f} pairs):")
            for st in b["stages"]:
                if st.get("missing"):
                    log(f"     {st['stage']:<42} (no {st['metric']} on the server)")
                else:
                    sh = st["share_of_request"]
                    log(f"     {st['stage']:<42} {st['per_query_ms']:8.2f} ms/query"
                        + (f"  {100 * sh:5.1f}% of request time" if sh is not None else ""))
            for k, v in b["counters"].items():
                log(f"     {k} +{v:,.0f}")
        if c["by_size"]:
            log("   client latency by query size: " + ", ".join(
                f"{s['pairs']}: {s['median_ms']:.1f}/{s['p99_ms']:.1f} ms" for s in c["by_size"])
                + " (median/p99)")


def find_max(bench, est_qps):
    a = bench.args
    lo, hi = 0.0, est_qps * a.search_headroom
    best = None
    log(f"\n== find-max: bisection over target_qps in (0, {hi:.2f}], {a.search_steps} runs of "
        f"{a.search_duration:g} s, then a confirm run of {a.duration:g} s")
    tries = []
    for step in range(a.search_steps):
        mid = (lo + hi) / 2 if step else hi * a.search_start
        r = bench.run("Server", mid, a.search_duration, f"search-{step + 1}-{mid:.2f}")
        tries.append((mid, r["valid"], r["p99_ms"]))
        if r["valid"]:
            best, lo = (mid if best is None or mid > best else best), mid
        else:
            hi = mid
        if not r["valid"] and r["client"]["by_size"] and mid < est_qps * 0.1:
            log("   stopping: invalid at under a tenth of the closed-loop rate")
            break
    confirmed = None
    if best is not None:
        rate = best
        for k in range(a.confirm_tries):
            r = bench.run("Server", rate, a.duration, f"confirm-{k + 1}-{rate:.2f}")
            if r["valid"]:
                confirmed = r
                break
            rate *= 0.9
    log("\n== find-max result")
    for q, v, p in tries:
        log(f"   {q:8.2f} samples/s: {'VALID' if v else 'INVALID'} (p99 {p if p is None else round(p, 1)} ms)")
    if confirmed:
        log(f"   highest VALID Server rate: {confirmed['target_qps']:.2f} samples/s (confirmed over "
            f"{a.duration:g} s: {confirmed['samples_per_s']:.2f} completed samples/s, p99 "
            f"{confirmed['p99_ms']:.1f} ms; {confirmed['samples_per_s_per_core']:.2f} per server core)")
    else:
        log("   no VALID Server rate found" + (" (the search's best failed its confirm runs)" if best else ""))
    return {"tries": [{"target_qps": q, "valid": v, "p99_ms": p} for q, v, p in tries],
            "highest_valid_qps": confirmed["target_qps"] if confirmed else None,
            "confirm": confirmed["tag"] if confirmed else None}


# ---------------------------------------------------------------------------------------------
# Accuracy

def read_accuracy_log(path):
    with open(path) as f:
        entries = json.load(f)
    out = {}
    for e in entries:
        out[int(e["qsl_idx"])] = np.frombuffer(bytes.fromhex(e["data"]), dtype="<f4")
    return out


def accuracy(bench, ref_channel, args):
    if args.workload == "dlrm-v3":
        return accuracy_v3(bench, ref_channel, args)
    r = bench.run(args.scenario, args.target_qps or 1.0, 0.0, "accuracy", accuracy=True)
    acc_log = os.path.join(r["outdir"], "mlperf_log_accuracy.json")
    sut = read_accuracy_log(acc_log)
    lib = bench.lib
    idx = sorted(sut)
    log(f"\n== accuracy: {len(idx)} queries ({lib.pairs(idx):,} pairs) in {acc_log}")
    if len(idx) != lib.n:
        log(f"   note: the accuracy log has {len(idx)} of the library's {lib.n} queries")
    bad = [i for i in idx if len(sut[i]) != lib.sizes[i]]
    if bad:
        raise SystemExit(f"query {bad[0]}: {len(sut[bad[0]])} scores for {lib.sizes[bad[0]]} pairs")
    s = np.concatenate([sut[i] for i in idx])
    out = {"queries": len(idx), "pairs": int(len(s)), "sut_mean": float(s.mean()),
           "sut_range": [float(s.min()), float(s.max())]}
    if ref_channel is None:
        log("   no --reference-grpc: no f32 scores to draw labels from; only the SUT's scores are summarised")
        log(f"   SUT scores: mean {s.mean():.4f}, range [{s.min():.4f}, {s.max():.4f}]")
        return out
    t = time.perf_counter()
    ref_lib = lib
    if args.reference_model != args.model:
        ref_lib = QueryLibrary(lib.pb, lib.n, lib.seed, lib.features, lib.samplers, args.reference_model,
                               lib.output, lib.id_dtype)
    ref = score_all(ref_channel, ref_lib, idx, 2, args.timeout)
    f = np.concatenate([ref[i] for i in idx])
    labels = np.concatenate([np.random.default_rng([args.seed, 3, i]).random(len(ref[i])) < ref[i] for i in idx])
    a_sut, a_ref = mc.auc(s, labels), mc.auc(f, labels)
    ratio = a_sut / a_ref
    diff = np.abs(s.astype(np.float64) - f)
    out.update({"reference_s": time.perf_counter() - t, "positives": int(labels.sum()),
                "auc_sut": a_sut, "auc_f32": a_ref, "ratio": ratio,
                "keeps_99": bool(ratio >= 0.99), "keeps_99_9": bool(ratio >= 0.999),
                "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())})
    log(f"   labels: u < p_f32 (seeded u), {int(labels.sum()):,} positives of {len(labels):,}")
    log(f"   AUC  SUT {a_sut:.6f}   f32 reference {a_ref:.6f}   ratio {ratio:.6f} "
        f"({100 * ratio:.3f}% of f32)")
    log(f"   keeps 99%: {'yes' if ratio >= 0.99 else 'NO'};  keeps 99.9%: {'yes' if ratio >= 0.999 else 'NO'}")
    log(f"   |score - f32 score|: max {diff.max():.3e}, mean {diff.mean():.3e}")
    return out


def accuracy_v3(bench, ref_channel, args):
    """dlrm-v3: every stream request scored by the SUT under LoadGen (in the stream's order), then by
    the f32 reference server (the same requests, one at a time, in order, no cache); labels drawn
    from the reference's probabilities (u < p, u seeded by position); NE, accuracy and AUC of both."""
    lib = bench.lib
    start = lib.position()
    r = bench.run(args.scenario, args.target_qps or 1.0, 0.0, "accuracy", accuracy=True)
    acc_log = os.path.join(r["outdir"], "mlperf_log_accuracy.json")
    sut = v3.read_accuracy_log(acc_log)
    pos = sorted(sut)
    log(f"\n== accuracy: {len(pos)} requests ({lib.pairs(pos):,} candidates) in {acc_log}, stream positions "
        f"{start}.. in order")
    bad = [i for i in pos if len(sut[i]) != lib.sizes[i]]
    if bad:
        raise SystemExit(f"request {bad[0]}: {len(sut[bad[0]])} scores for {lib.sizes[bad[0]]} candidates")
    s = np.concatenate([sut[i] for i in pos])
    out = {"requests": len(pos), "candidates": int(len(s)), "sut_mean": float(s.mean())}
    if ref_channel is None:
        log("   no --reference-grpc: no f32 scores to draw labels from; only the SUT's scores are summarised")
        return out
    t = time.perf_counter()
    ref_lib = lib if args.reference_model == args.model else lib.renamed(args.reference_model)
    ref = score_all(ref_channel, ref_lib, pos, 1, args.timeout)
    f = np.concatenate([ref[i] for i in pos])
    labels = np.concatenate([np.random.default_rng([args.seed, 3, i]).random(len(ref[i])) < ref[i] for i in pos])
    m = {"auc": (mc.auc(s, labels), mc.auc(f, labels)), "ne": (v3.ne(s, labels), v3.ne(f, labels)),
         "accuracy": (v3.accuracy_rate(s, labels), v3.accuracy_rate(f, labels))}
    # kept: the SUT's share of the reference's quality (NE: lower is better, so f32 / SUT)
    kept = {"auc": m["auc"][0] / m["auc"][1], "ne": m["ne"][1] / m["ne"][0],
            "accuracy": m["accuracy"][0] / m["accuracy"][1]}
    diff = np.abs(s.astype(np.float64) - f)
    out.update({"reference_s": time.perf_counter() - t, "positives": int(labels.sum()),
                "metrics": {k: {"sut": v[0], "f32": v[1], "kept": kept[k]} for k, v in m.items()},
                "keeps_99_9": bool(min(kept.values()) >= 0.999),
                "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())})
    log(f"   labels: u < p_f32 (seeded u), {int(labels.sum()):,} positives of {len(labels):,}")
    for k, (a_s, a_f) in m.items():
        log(f"   {k:<8} SUT {a_s:.6f}   f32 reference {a_f:.6f}   kept {100 * kept[k]:.4f}%")
    log(f"   keeps 99.9% of f32 on all three: {'yes' if out['keeps_99_9'] else 'NO'}")
    log(f"   |score - f32 score|: max {diff.max():.3e}, mean {diff.mean():.3e}")
    return out


# ---------------------------------------------------------------------------------------------

def write_calibration(path, queries):
    """Queries as one .npz of the model's input arrays (`dense`, `<F>_lengths`, `<F>_ids`), the
    tensor format `ember predict` and `ember serve --calibrate` read."""
    arrays = {"dense": np.concatenate([d for d, _ in queries])}
    for f, (name, _, _) in enumerate(queries[0][1]):
        arrays[f"{name}_lengths"] = np.concatenate([sp[f][1] for _, sp in queries]).astype(np.int32)
        arrays[f"{name}_ids"] = np.concatenate([sp[f][2] for _, sp in queries]).astype(np.int64)
    np.savez(path, **arrays)
    log(f"wrote {path}: {len(queries)} queries, {len(arrays['dense']):,} pairs (seed apart from the library's)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpc", default="127.0.0.1:8081", help="the server's gRPC address HOST:PORT (system under test)")
    ap.add_argument("--model", default=None, help="model name [default: the server's only/first model per "
                    "its repository index is not read: give it, else 'dlrm-v2']")
    ap.add_argument("--model-version", default="")
    ap.add_argument("--scenario", choices=["Offline", "Server"], default="Offline")
    ap.add_argument("--target-qps", type=float, default=None,
                    help="LoadGen target (samples = queries per s) [default: measured by a short closed-loop run]")
    ap.add_argument("--duration", type=float, default=60.0, help="min_duration in seconds (official: 600)")
    ap.add_argument("--official", action="store_true", help="LoadGen's official dlrm-v2 settings (600 s ...)")
    ap.add_argument("--latency-ms", type=float, default=None,
                    help=f"Server p99 bound [default: {LATENCY_BOUND_MS:g} ms, dlrm-v3 {v3.LATENCY_BOUND_MS:g} ms]")
    ap.add_argument("--workload", choices=["dlrm-v2", "dlrm-v3"], default="dlrm-v2",
                    help="dlrm-v2: DLRM queries of 100-700 pairs; dlrm-v3: HSTU users from --users, in stream order")
    ap.add_argument("--users", default=None, metavar="STREAM.jsonl",
                    help="dlrm-v3: a streaming replay from `ember data users --returns N` (one user request a line)")
    ap.add_argument("--warm-lines", type=int, default=0,
                    help="dlrm-v3: the stream's first N lines are sent once, in order, before any measured run "
                    "(first visits fill a history cache, as the reference warms up)"),
    ap.add_argument("--min-queries", type=int, default=700,
                    help="Server min_query_count when not --official (LoadGen's early stopping needs ~700 queries to judge a p99)")
    ap.add_argument("--find-max", action="store_true", help="Server: highest VALID rate by bisection + confirm")
    ap.add_argument("--search-steps", type=int, default=5)
    ap.add_argument("--search-duration", type=float, default=15.0)
    ap.add_argument("--search-headroom", type=float, default=1.0,
                    help="upper end of the search as a multiple of the closed-loop rate")
    ap.add_argument("--search-start", type=float, default=0.5, help="first try, as a share of the upper end")
    ap.add_argument("--confirm-tries", type=int, default=2)
    ap.add_argument("--accuracy", action="store_true", help="AccuracyOnly run, then AUC against --reference-grpc")
    ap.add_argument("--reference-grpc", default=None, help="gRPC address of the f32 reference server")
    ap.add_argument("--reference-model", default=None, help="model name there [default: --model]")
    ap.add_argument("--queries", type=int, default=None,
                    help="queries in the sample library [default: 1024 (perf) / 256 (accuracy)]")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--ids", choices=["uniform", "skewed"], default="uniform")
    ap.add_argument("--locality-stats", default=mc.DEFAULT_LOCALITY)
    ap.add_argument("--locality-entry", default="0", help="entry of the stats file: index or name")
    ap.add_argument("--model-dir", default=None, help="model directory whose config.json gives the tables' rows")
    ap.add_argument("--tables-csv", default=mc.DEFAULT_CSV)
    ap.add_argument("--rows-scale", type=float, default=1.0)
    ap.add_argument("--max-rows", type=int, default=0, help="cap on CSV rows per table (0: none)")
    ap.add_argument("--pooling", type=int, default=0, help="ids per bag for every feature (default: MLPerf's)")
    ap.add_argument("--id-dtype", choices=["int32", "int64"], default="int32")
    ap.add_argument("--max-inflight", type=int, default=2, help="Offline: most calls outstanding")
    ap.add_argument("--timeout", type=float, default=30.0, help="gRPC deadline of a call, s")
    ap.add_argument("--calib-seconds", type=float, default=4.0)
    ap.add_argument("--server-cores", type=float, default=None,
                    help="cores the server used (for samples/s per core) [default: os.cpu_count()]")
    ap.add_argument("--server-pid", type=int, default=None, help="server pid (local): its CPU time per query")
    ap.add_argument("--metrics-url", default=None, help="the server's Prometheus /metrics URL")
    ap.add_argument("--out", default=None, help="output directory [default: bench/mlperf/runs/<time>-<scenario>]")
    ap.add_argument("--write-calibration", default=None, metavar="FILE.npz",
                    help="write --calibration-queries queries drawn as the library's but from another seed "
                         "(MLPerf's calibration set is apart from the measured queries) as an .npz of the "
                         "model's input arrays, for `ember serve --dense-dtype int8 --calibrate FILE`, and exit")
    ap.add_argument("--calibration-queries", type=int, default=16)
    args = ap.parse_args(argv)

    import grpc
    import mlperf_loadgen as lg
    from tritonclient.grpc import service_pb2 as pb

    v3_mode = args.workload == "dlrm-v3"
    args.model = args.model or (v3.OFFICIAL_MODEL if v3_mode else OFFICIAL_MODEL)
    if args.latency_ms is None:
        args.latency_ms = v3.LATENCY_BOUND_MS if v3_mode else LATENCY_BOUND_MS
    if v3_mode and not args.users:
        raise SystemExit("--workload dlrm-v3 needs --users STREAM.jsonl (ember data users --returns N)")
    args.reference_model = args.reference_model or args.model
    args.cores_note = ""
    if args.server_cores is None:
        args.server_cores = os.cpu_count()
        args.cores_note = "os.cpu_count(); give --server-cores for the cores the server used"
    if args.out is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        kind = "accuracy" if args.accuracy else (args.scenario + ("-findmax" if args.find_max else ""))
        args.out = os.path.join(HERE, "runs", f"{stamp}-{kind}")
    os.makedirs(args.out, exist_ok=True)
    if args.queries is None and not v3_mode:
        args.queries = 256 if args.accuracy else 1024
    if args.find_max:
        args.scenario = "Server"

    entry = None
    if args.ids == "skewed":
        if not os.path.exists(args.locality_stats):
            raise SystemExit(f"--ids skewed needs Meta's locality statistics, and {args.locality_stats} is absent "
                             "(give --locality-stats PATH, e.g. .../dlrm_datasets_2021_locality_stats.txt)")
        entries = mc.parse_locality_stats(args.locality_stats)
        e = args.locality_entry
        entry = entries[int(e)] if e.isdigit() else next((x for x in entries if x["name"] == e), None)
        if entry is None:
            raise SystemExit(f"--locality-entry {e}: not in {args.locality_stats} ({[x['name'] for x in entries]})")

    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    channel = grpc.insecure_channel(args.grpc, options=opts)
    try:
        md = model_metadata(pb, channel, args.model, args.model_version)
    except grpc.RpcError as e:
        raise SystemExit(f"{args.grpc}: ModelMetadata({args.model!r}) failed: {e.code().name}: {e.details()}")
    if v3_mode:
        lib, results = stream_library(args, pb, channel, md)
    else:
        lib, results = query_library(args, pb, channel, md, entry)
        if lib is None:
            return
    run_all(args, lg, pb, channel, opts, lib, results)


def stream_library(args, pb, channel, md):
    """dlrm-v3: the stream's requests after --warm-lines (those sent first, unmeasured)."""
    feats, output = v3.hstu_inputs(md)
    log(f"server {args.grpc}: model {md.name!r} ({md.platform}), {len(feats)} history and candidate features, "
        f"output {output!r}")
    t = time.perf_counter()
    users = v3.read_stream(args.users, 0, None if args.queries is None else args.warm_lines + args.queries)
    if args.warm_lines >= len(users):
        raise SystemExit(f"--warm-lines {args.warm_lines}: the stream has only {len(users)} lines")
    lib = v3.StreamLibrary(pb, users[args.warm_lines:], feats, args.model, output, args.model_version,
                           first=args.warm_lines)
    nbytes = sum(len(b) for b in lib.requests.values())
    log(f"library: {lib.n} user requests (stream lines {args.warm_lines}..), history {lib.history.min()}-"
        f"{lib.history.max()} items (mean {lib.history.mean():.0f}), {lib.sizes.mean():.0f} candidates a request, "
        f"requests {nbytes / 2**20:.1f} MiB, built in {time.perf_counter() - t:.2f} s")
    results = results_head(args, lib, nbytes, {"ids": f"stream {os.path.basename(args.users)}",
                                               "locality_entry": None,
                                               "history_mean": float(lib.history.mean()),
                                               "candidates_mean": float(lib.sizes.mean())})
    results["workload"] = "dlrm-v3"
    if args.warm_lines:
        warm = v3.StreamLibrary(pb, users[:args.warm_lines], feats, args.model, output, args.model_version)
        t = time.perf_counter()
        score_all(channel, warm, range(warm.n), 1, args.timeout)
        log(f"warm-up: the stream's first {warm.n} lines sent in order, one at a time, in "
            f"{time.perf_counter() - t:.1f} s (not measured)")
        results["warm_lines"] = warm.n
    return lib, results


def query_library(args, pb, channel, md, entry):
    """dlrm-v2: the synthetic query library (None when only a calibration file was asked for)."""
    md_feats, output = server_features(md)
    log(f"server {args.grpc}: model {md.name!r} ({md.platform}), {len(md_feats)} sparse features, output {output!r}")
    features = resolve_features(args, md_feats)
    samplers = [mc.IdSampler(r, args.ids, entry, salt=i) for i, (_, r, _) in enumerate(features)]
    log(f"ids: {args.ids}" + (f" (locality entry {entry['name']} of {args.locality_stats}: "
                               f"{len(entry['unique_frac'])} buckets)" if entry else ""))

    lib = QueryLibrary(pb, args.queries, args.seed, features, samplers, args.model, output, args.id_dtype,
                       args.model_version)
    if args.write_calibration:
        cal = QueryLibrary(pb, args.calibration_queries, args.seed + 1_000_003, features, samplers,
                           args.model, output, args.id_dtype, args.model_version)
        write_calibration(args.write_calibration, [cal.query(i) for i in range(cal.n)])
        return None, None

    t = time.perf_counter()
    lib.load(range(lib.n))
    nbytes = sum(len(b) for b in lib.requests.values())
    log(f"library: {lib.n} queries, {lib.pairs(range(lib.n)):,} pairs (mean {lib.sizes.mean():.1f} a query), "
        f"{sum(p for _, _, p in features)} ids a pair, requests {nbytes / 2**20:.1f} MiB "
        f"({nbytes / lib.n / 1024:.0f} KiB a query), built in {time.perf_counter() - t:.2f} s (seed {args.seed})")

    results = results_head(args, lib, nbytes, {
        "ids": args.ids, "locality_entry": entry["name"] if entry else None,
        "features": [{"name": f, "rows": r, "pooling": p} for f, r, p in features]})
    return lib, results


def results_head(args, lib, nbytes, library):
    """The results' opening: when, the command, the server and the sample library (`library`: what
    the workload adds about it)."""
    return {"started": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv,
            "args": {k: v for k, v in vars(args).items()}, "server": args.grpc, "model": args.model,
            "library": {"queries": lib.n, "pairs": lib.pairs(range(lib.n)), "request_bytes": nbytes, **library}}


def run_all(args, lg, pb, channel, opts, lib, results):
    import grpc
    est = None
    if not args.accuracy and (args.target_qps is None or args.find_max):
        qps, pps, refused, lat = closed_loop(channel, lib, list(range(lib.n)), args.calib_seconds,
                                             args.max_inflight, args.timeout)
        est = qps
        log(f"closed loop ({args.calib_seconds:g} s, {args.max_inflight} in flight): {qps:.2f} queries/s, "
            f"{pps:,.0f} pairs/s, median latency {1e3 * np.median(lat):.1f} ms"
            + (f", {refused} refused" if refused else ""))
        results["closed_loop"] = {"queries_per_s": qps, "pairs_per_s": pps, "refused": refused}

    bench = Bench(args, lg, pb, channel, lib)
    try:
        if args.accuracy:
            ref = grpc.insecure_channel(args.reference_grpc, options=opts) if args.reference_grpc else None
            results["accuracy"] = accuracy(bench, ref, args)
        elif args.find_max:
            results["find_max"] = find_max(bench, est)
        else:
            # Offline: LoadGen sizes its one query as target x duration x 1.1, so the estimate gets
            # headroom (a target under the real rate ends the run before min_duration: INVALID)
            target = args.target_qps or (est * 2.0 if args.scenario == "Offline" else est * 0.5)
            bench.run(args.scenario, target, args.duration, args.scenario.lower())
    finally:
        bench.close()
    results["runs"] = bench.runs
    if getattr(lib, "ordered", False):
        results["stream"] = {"next_position": lib.position(), "wraps": lib.wraps}
        if lib.wraps:
            log(f"   note: the stream ran out {lib.wraps} time(s) and started over: replayed users found entries "
                "newer than their requests (refused by a history cache); write a longer stream")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    import report
    with open(os.path.join(args.out, "report.html"), "w") as f:
        f.write(report.render(results))
    log(f"\nwrote {os.path.join(args.out, 'results.json')}, report.html and LoadGen's logs under {args.out}/")


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
