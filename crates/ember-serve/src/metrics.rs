//! Prometheus metrics (`GET /metrics`): the names, their buckets, and the process-wide recorder.

use std::sync::OnceLock;
use std::time::Instant;

use ember_model::metric_names as names;
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Requests answered, by `protocol` (`http` or `grpc`) and `status` (`ok`, the error's label, or
/// `cancelled` when the client went away first).
pub const REQUESTS: &str = "ember_requests_total";
/// Requests being handled now.
pub const IN_FLIGHT: &str = "ember_requests_in_flight";
/// Requests waiting for a batch now.
pub const QUEUE_DEPTH: &str = "ember_queue_depth";
/// Seconds from arrival to the answer, per request.
pub const REQUEST_SECONDS: &str = "ember_request_duration_seconds";
/// Seconds from a request's start to its refusal for load (503 / RESOURCE_EXHAUSTED).
pub const REFUSAL_SECONDS: &str = "ember_refusal_seconds";
/// Seconds from arrival to the answer, per user of an HSTU request (a request of `k` users
/// counts `k` times), by `model` and `history` (the bucket of the user's history length:
/// `64`, `256`, `1024`, `4096`, `16384`, `+Inf`); its p99 is each history class's per-user p99.
pub const ITEM_SECONDS: &str = "ember_user_request_duration_seconds";
/// Seconds a request waited in the queue before its batch started.
pub const QUEUE_WAIT: &str = "ember_queue_wait_seconds";
/// Histogram: a request's tensors decoded and checked (ids against their tables), by protocol.
pub const DECODE_SECONDS: &str = "ember_request_decode_seconds";
/// Seconds of the embedding stage, per batch.
pub const EMBEDDING_STAGE: &str = "ember_embedding_stage_seconds";
/// Seconds of the dense stage (MLPs and interaction not overlapped with the embedding stage), per
/// batch.
pub const DENSE_STAGE: &str = "ember_dense_stage_seconds";
/// Samples per batch.
pub const BATCH_SIZE: &str = "ember_batch_size";
/// Connections open now.
pub const CONNECTIONS_OPEN: &str = "ember_connections_open";
/// Connections closed, by `reason`: `client` (the client closed it), `error`, `idle_timeout`,
/// `header_timeout` (a request head too slow), `evicted` (closed to make room for a new one at
/// the connection cap), `shutdown`, `grace_expired` (still open when the stop's grace ran out).
pub const CONNECTIONS_CLOSED: &str = "ember_connections_closed_total";
/// Connections refused, by `reason`: `max_connections` (at the cap with none idle),
/// `fd_exhausted` (the OS had no descriptor left), `accept_error`.
pub const CONNECTIONS_REFUSED: &str = "ember_connections_refused_total";
/// Requests refused before they were queued, by `reason`: `body_too_large` (from
/// `Content-Length`), `header_too_large`, `slow_body` (below the minimum rate), `overloaded`
/// (its expected wait was over its deadline or the queue-delay bound), `queue_full`,
/// `inflight_bytes` (over the in-flight body budget).
pub const REQUESTS_REFUSED: &str = "ember_requests_refused_total";
/// Bytes of request bodies held now (each until its request is answered).
pub const INFLIGHT_BYTES: &str = "ember_inflight_body_bytes";
/// SSD tier: distinct (feature, id) lookups the row cache answered, and all it was asked.
pub const TIER_HITS: &str = "ember_tier_cache_hits_total";
pub const TIER_LOOKUPS: &str = "ember_tier_cache_lookups_total";
/// SSD tier: hits / lookups since the start.
pub const TIER_HIT_RATIO: &str = "ember_tier_cache_hit_ratio";
/// Tier: bytes the tier read from its stores (SSD blocks of row files, or rows from Redis).
pub const TIER_BYTES: &str = "ember_tier_store_read_bytes_total";
/// Tier: requests the tier sent to its stores (SSD block reads, or Redis round trips).
pub const TIER_READS: &str = "ember_tier_store_reads_total";
/// Deprecated alias of [`TIER_BYTES`], published with the same value; removed in the next
/// release.
pub const TIER_BYTES_DEPRECATED: &str = "ember_tier_ssd_read_bytes_total";
/// Deprecated alias of [`TIER_READS`], published with the same value; removed in the next
/// release.
pub const TIER_READS_DEPRECATED: &str = "ember_tier_ssd_reads_total";
/// SSD tier: seconds batches waited for their rows since the start (a cumulative gauge). Counted
/// when rows are read inline (`prefetch_depth` 0); with a forward thread, waiting for rows and
/// waiting for requests look alike, and are not counted.
pub const TIER_STALL: &str = "ember_tier_stall_seconds";
/// HSTU history cache: users served from their entry, users without one, users whose entry
/// was refused (a history that changed, past the staleness bound, damaged), entries evicted.
pub const HISTORY_HITS: &str = "ember_history_cache_hits_total";
pub const HISTORY_MISSES: &str = "ember_history_cache_misses_total";
pub const HISTORY_REFUSED: &str = "ember_history_cache_refused_total";
pub const HISTORY_EVICTIONS: &str = "ember_history_cache_evictions_total";
/// HSTU history cache, shared tier (`--history-share`): entries read from the cluster, written
/// to it, and calls that failed (the user recomputed).
pub const HISTORY_SHARED_HITS: &str = "ember_history_cache_shared_hits_total";
pub const HISTORY_SHARED_WRITES: &str = "ember_history_cache_shared_writes_total";
pub const HISTORY_SHARE_ERRORS: &str = "ember_history_cache_share_errors_total";
/// HSTU history cache: bytes and entries (users) held now.
pub const HISTORY_BYTES: &str = "ember_history_cache_bytes";
pub const HISTORY_ENTRIES: &str = "ember_history_cache_entries";
/// SSD tier: bytes of rows the cache holds now.
pub const TIER_CACHE_BYTES: &str = "ember_tier_cache_bytes";

/// Remote tier: one batch's fetch from the cluster, retries included (recorded by the store).
pub const REMOTE_FETCH_SECONDS: &str = names::FETCH_SECONDS;
/// Remote tier, per node: rows (commands) answered, bytes of rows, round trips (pipelines).
pub const REMOTE_ROWS: &str = "ember_remote_rows_total";
pub const REMOTE_BYTES: &str = "ember_remote_bytes_total";
pub const REMOTE_ROUND_TRIPS: &str = "ember_remote_round_trips_total";
/// Remote tier, per node: failures by kind (connect, timeout, moved, redirect, server).
pub const REMOTE_ERRORS: &str = "ember_remote_errors_total";
/// Remote tier: 1 while the store answered the last batch or probe, else 0.
pub const REMOTE_UP: &str = "ember_remote_up";
/// Requests by model, version and status (`ok` or the error's label).
pub const MODEL_REQUESTS: &str = "ember_model_requests_total";
/// 1 while a model's version serves, 0 once it is unloaded or replaced.
pub const MODEL_READY: &str = "ember_model_ready";
/// Loads of a model's versions, by outcome (`ok`, `failed`).
pub const MODEL_LOADS: &str = "ember_model_loads_total";
/// Seconds the last successful load of a model's version took (read, build, warm).
pub const MODEL_LOAD_SECONDS: &str = "ember_model_last_load_seconds";

const SECONDS: [f64; 16] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2e-3, 4e-3, 6e-3, 8e-3, 10e-3, 15e-3, 25e-3, 50e-3,
    100e-3, 1.0,
];
/// Buckets of per-user latency: an HSTU user takes tens of ms to seconds.
const USER_SECONDS: [f64; 16] = [
    5e-3, 10e-3, 20e-3, 40e-3, 60e-3, 80e-3, 100e-3, 150e-3, 200e-3, 300e-3, 500e-3, 750e-3, 1.0,
    2.0, 5.0, 10.0,
];
const SIZES: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// The process-wide recorder (installed on first use) and its renderer.
pub fn handle() -> &'static PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), &SIZES))
            // A full name wins over the suffix's buckets.
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(ITEM_SECONDS.into()), &USER_SECONDS)
            })
            .expect("bucket lists are not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (an embedding application's); then this
        // server's metrics go there and /metrics renders an empty page.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        spawn_upkeep(handle.clone(), UPKEEP_EVERY);
        handle
    })
}

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The exporter keeps every histogram sample until its upkeep folds them into the buckets, and
/// a recorder built by hand (as here, so that no HTTP listener of its own starts) gets no upkeep
/// task: without this thread a server nobody scrapes grew by ~100 bytes per request (+200 MiB
/// in an hour's soak at 600 requests/s).
fn spawn_upkeep(handle: PrometheusHandle, every: std::time::Duration) {
    let started = std::thread::Builder::new()
        .name("ember-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                handle.run_upkeep();
            }
        });
    if let Err(e) = started {
        tracing::warn!("no metrics upkeep thread ({e}); histograms fold only when scraped");
    }
}

/// Describes every metric (its help line, and its unit where it has one), family by family.
fn describe() {
    describe_requests();
    describe_tier();
    describe_history();
    describe_remote();
    describe_updates();
    describe_models();
}

/// Requests, connections, the queue and the batches' stages.
fn describe_requests() {
    describe_counter!(REQUESTS, "Requests answered, by protocol and status");
    describe_gauge!(IN_FLIGHT, "Requests being handled now");
    describe_gauge!(QUEUE_DEPTH, "Requests waiting for a batch now");
    describe_gauge!(CONNECTIONS_OPEN, "Connections open now");
    describe_counter!(CONNECTIONS_CLOSED, "Connections closed, by reason");
    describe_counter!(CONNECTIONS_REFUSED, "Connections refused, by reason");
    describe_counter!(
        REQUESTS_REFUSED,
        "Requests refused before they were queued, by reason"
    );
    describe_gauge!(
        INFLIGHT_BYTES,
        Unit::Bytes,
        "Bytes of request bodies held now (each until its request is answered)"
    );
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "Arrival to answer, per request"
    );
    describe_histogram!(
        REFUSAL_SECONDS,
        Unit::Seconds,
        "Arrival to a 503 / RESOURCE_EXHAUSTED answer, per request refused for load"
    );
    describe_histogram!(
        QUEUE_WAIT,
        Unit::Seconds,
        "Wait in the batching queue, per request"
    );
    describe_histogram!(
        DECODE_SECONDS,
        Unit::Seconds,
        "Request tensors decoded and checked (ids against their tables), per request"
    );
    describe_histogram!(
        ITEM_SECONDS,
        Unit::Seconds,
        "Arrival to answer, per user of an HSTU request, by history length"
    );
    describe_histogram!(EMBEDDING_STAGE, Unit::Seconds, "Embedding stage, per batch");
    describe_histogram!(DENSE_STAGE, Unit::Seconds, "Dense stage, per batch");
    describe_histogram!(BATCH_SIZE, Unit::Count, "Samples per batch");
}

/// The HSTU history cache.
fn describe_history() {
    describe_counter!(
        HISTORY_HITS,
        "HSTU history cache: users served from their entry"
    );
    describe_counter!(HISTORY_MISSES, "HSTU history cache: users with no entry");
    describe_counter!(
        HISTORY_REFUSED,
        "HSTU history cache: users whose entry was not used (history changed, past the staleness bound, damaged)"
    );
    describe_counter!(HISTORY_EVICTIONS, "HSTU history cache: entries evicted");
    describe_counter!(
        HISTORY_SHARED_HITS,
        "HSTU history cache: entries read from the shared tier"
    );
    describe_counter!(
        HISTORY_SHARED_WRITES,
        "HSTU history cache: entries written to the shared tier"
    );
    describe_counter!(
        HISTORY_SHARE_ERRORS,
        "HSTU history cache: shared-tier calls that failed (users recomputed)"
    );
    describe_gauge!(
        HISTORY_BYTES,
        Unit::Bytes,
        "HSTU history cache: bytes held now"
    );
    describe_gauge!(HISTORY_ENTRIES, "HSTU history cache: users held now");
}

/// The SSD tier: its row cache, its reads, the batches' waits.
fn describe_tier() {
    describe_counter!(
        TIER_HITS,
        "SSD tier: distinct lookups served by the row cache"
    );
    describe_counter!(
        TIER_LOOKUPS,
        "SSD tier: distinct lookups asked of the row cache"
    );
    describe_gauge!(
        TIER_HIT_RATIO,
        "SSD tier: row cache hits / lookups since start"
    );
    describe_counter!(
        TIER_BYTES,
        Unit::Bytes,
        "Tier: bytes the tier read from its stores: SSD blocks or Redis rows"
    );
    describe_counter!(
        TIER_READS,
        "Tier: requests the tier read from its stores: SSD blocks or Redis round trips"
    );
    describe_counter!(
        TIER_BYTES_DEPRECATED,
        Unit::Bytes,
        "Deprecated: use ember_tier_store_read_bytes_total; removed in the next release"
    );
    describe_counter!(
        TIER_READS_DEPRECATED,
        "Deprecated: use ember_tier_store_reads_total; removed in the next release"
    );
    describe_gauge!(
        TIER_STALL,
        Unit::Seconds,
        "SSD tier: seconds batches waited for rows, since start"
    );
    describe_gauge!(
        TIER_CACHE_BYTES,
        Unit::Bytes,
        "SSD tier: bytes of rows cached"
    );
}

/// The remote tier: its fetches and its nodes.
fn describe_remote() {
    describe_histogram!(
        REMOTE_FETCH_SECONDS,
        Unit::Seconds,
        "Remote tier: one batch's fetch of missing rows, retries included"
    );
    describe_counter!(REMOTE_ROWS, "Remote tier: rows fetched, by node");
    describe_counter!(
        REMOTE_BYTES,
        Unit::Bytes,
        "Remote tier: bytes of rows fetched, by node"
    );
    describe_counter!(REMOTE_ROUND_TRIPS, "Remote tier: pipelines sent, by node");
    describe_counter!(REMOTE_ERRORS, "Remote tier: failures, by node and kind");
    describe_gauge!(REMOTE_UP, "Remote tier: 1 while the store answers, else 0");
    describe_counter!(
        names::POOL_PLAIN,
        "Remote tier: shares read whole instead of pooled on their node, by why (no_module, refused)"
    );
    describe_counter!(
        names::FALLBACK,
        "Remote tier: fetches that failed and went to the local copy, by kind"
    );
    describe_gauge!(
        names::FALLBACK_ACTIVE,
        "Remote tier: 1 while batches are read from the local copy"
    );
    describe_counter!(
        names::FALLBACK_ROWS,
        "Remote tier: rows read from the local copy"
    );
    describe_counter!(
        names::FALLBACK_STALE_TABLES,
        "Remote tier: tables the local copy stopped serving"
    );
}

/// Row updates read from the remote tables' streams (recorded by the embedding stage).
fn describe_updates() {
    describe_counter!(
        names::UPDATE_ROWS,
        "Row updates read from the stream, by outcome (applied: the row was cached; absent: not)"
    );
    describe_histogram!(
        names::UPDATE_LAG,
        Unit::Seconds,
        "Row updates: from publish (the publisher's clock) to applied in this server's cache"
    );
    describe_counter!(
        names::UPDATE_RESETS,
        "Update streams trimmed past this server's position (the table's cache was dropped)"
    );
    describe_counter!(
        names::UPDATE_BAD,
        "Update stream entries that were not well-formed updates (skipped)"
    );
    describe_counter!(
        names::UPDATE_POLL_ERRORS,
        "Failed reads of the update streams (retried)"
    );
    describe_gauge!(
        names::UPDATE_POSITION,
        "Position in each table's update stream: its last entry's milliseconds"
    );
}

/// The served models: requests per version, readiness, loads.
fn describe_models() {
    describe_counter!(
        MODEL_REQUESTS,
        "Inference requests by model, the version that answered, and status"
    );
    describe_gauge!(MODEL_READY, "1 while the model's version serves");
    describe_counter!(MODEL_LOADS, "Loads of a model's versions, by outcome");
    describe_gauge!(
        MODEL_LOAD_SECONDS,
        Unit::Seconds,
        "Time the last successful load of a model version took (read, build, warm)"
    );
}

/// The tier's and the history cache's metrics of one served model: registered once, when its
/// batcher is made (after the recorder), then set after each batch with neither a registry
/// lookup nor an allocation.
pub(crate) struct ModelMetrics {
    tier: Option<TierGauges>,
    history: Option<HistoryGauges>,
}

struct TierGauges {
    hits: metrics::Counter,
    lookups: metrics::Counter,
    hit_ratio: metrics::Gauge,
    bytes: metrics::Counter,
    reads: metrics::Counter,
    bytes_deprecated: metrics::Counter,
    reads_deprecated: metrics::Counter,
    stall: metrics::Gauge,
    cache_bytes: metrics::Gauge,
}

struct HistoryGauges {
    hits: metrics::Counter,
    misses: metrics::Counter,
    refused: metrics::Counter,
    evictions: metrics::Counter,
    bytes: metrics::Gauge,
    entries: metrics::Gauge,
    shared_hits: metrics::Counter,
    shared_writes: metrics::Counter,
    share_errors: metrics::Counter,
}

impl ModelMetrics {
    /// The metrics of the model served as `name`, or `None` when it has neither tables on
    /// the tier nor a history cache (nothing is published then).
    pub(crate) fn of(
        name: &str,
        model: &dyn ember_model::serving::Servable,
    ) -> Option<ModelMetrics> {
        let l = [("model", name.to_string())];
        let tier = model.tier().is_active().then(|| TierGauges {
            hits: metrics::counter!(TIER_HITS, &l),
            lookups: metrics::counter!(TIER_LOOKUPS, &l),
            hit_ratio: metrics::gauge!(TIER_HIT_RATIO, &l),
            bytes: metrics::counter!(TIER_BYTES, &l),
            reads: metrics::counter!(TIER_READS, &l),
            bytes_deprecated: metrics::counter!(TIER_BYTES_DEPRECATED, &l),
            reads_deprecated: metrics::counter!(TIER_READS_DEPRECATED, &l),
            stall: metrics::gauge!(TIER_STALL, &l),
            cache_bytes: metrics::gauge!(TIER_CACHE_BYTES, &l),
        });
        let history = model.history_cache().map(|_| HistoryGauges {
            hits: metrics::counter!(HISTORY_HITS, &l),
            misses: metrics::counter!(HISTORY_MISSES, &l),
            refused: metrics::counter!(HISTORY_REFUSED, &l),
            evictions: metrics::counter!(HISTORY_EVICTIONS, &l),
            bytes: metrics::gauge!(HISTORY_BYTES, &l),
            entries: metrics::gauge!(HISTORY_ENTRIES, &l),
            shared_hits: metrics::counter!(HISTORY_SHARED_HITS, &l),
            shared_writes: metrics::counter!(HISTORY_SHARED_WRITES, &l),
            share_errors: metrics::counter!(HISTORY_SHARE_ERRORS, &l),
        });
        (tier.is_some() || history.is_some()).then_some(ModelMetrics { tier, history })
    }

    /// Publishes the tier's and the history cache's counters now.
    pub(crate) fn record(&self, model: &dyn ember_model::serving::Servable) {
        if let Some(g) = &self.tier {
            let s = model.tier().counters();
            g.hits.absolute(s.hits);
            g.lookups.absolute(s.lookups);
            g.hit_ratio.set(s.hit_ratio);
            g.bytes.absolute(s.bytes_read);
            g.reads.absolute(s.reads);
            g.bytes_deprecated.absolute(s.bytes_read);
            g.reads_deprecated.absolute(s.reads);
            g.stall.set(s.stall.as_secs_f64());
            g.cache_bytes.set(s.cache_bytes as f64);
        }
        if let (Some(g), Some(s)) = (&self.history, model.history_cache()) {
            g.hits.absolute(s.hits);
            g.misses.absolute(s.misses);
            g.refused.absolute(s.refused);
            g.evictions.absolute(s.evictions);
            g.bytes.set(s.bytes as f64);
            g.entries.set(s.entries as f64);
            g.shared_hits.absolute(s.shared_hits);
            g.shared_writes.absolute(s.shared_writes);
            g.share_errors.absolute(s.share_errors);
        }
    }
}

/// Publishes the remote store's counters per node and whether it answers, for the model served
/// as `name` (nothing without one). Called by the store probe every second and at each scrape,
/// not per batch: it takes the tier's lock, which the next batch's fetch holds.
pub fn record_store(name: &str, tier: ember_model::Tier<'_>) {
    if !tier.has_remote() {
        return;
    }
    let m = || name.to_string();
    metrics::gauge!(REMOTE_UP, "model" => m()).set(if tier.store_healthy() { 1.0 } else { 0.0 });
    for n in tier.store_nodes() {
        let node = || n.node.clone();
        metrics::counter!(REMOTE_ROWS, "model" => m(), "node" => node()).absolute(n.rows);
        metrics::counter!(REMOTE_BYTES, "model" => m(), "node" => node()).absolute(n.bytes);
        metrics::counter!(REMOTE_ROUND_TRIPS, "model" => m(), "node" => node())
            .absolute(n.round_trips);
        for (kind, count) in n.errors {
            metrics::counter!(REMOTE_ERRORS, "model" => m(), "node" => node(), "kind" => kind)
                .absolute(count);
        }
    }
}

/// Marks `version` of `model` as serving or not.
pub fn model_ready(model: &str, version: u64, ready: bool) {
    let (m, v) = (model.to_string(), version.to_string());
    metrics::gauge!(MODEL_READY, "model" => m, "version" => v).set(if ready { 1.0 } else { 0.0 });
}

/// Counts a load of a version of `model`, and its time when it succeeded.
pub fn model_load(model: &str, ok: bool, seconds: f64) {
    let outcome = if ok { "ok" } else { "failed" };
    metrics::counter!(MODEL_LOADS, "model" => model.to_string(), "outcome" => outcome).increment(1);
    if ok {
        metrics::gauge!(MODEL_LOAD_SECONDS, "model" => model.to_string()).set(seconds);
    }
}

/// The counter of requests `version` of `model` answered with scores.
pub fn model_requests_ok(model: &str, version: u64) -> metrics::Counter {
    metrics::counter!(
        MODEL_REQUESTS,
        "model" => model.to_string(),
        "version" => version.to_string(),
        "status" => "ok"
    )
}

/// Counts a request answered by `version` of `model`: on `ok` (its registered counter, from
/// [`model_requests_ok`]) when it succeeded, else by the error's label.
pub fn model_request(
    ok: &metrics::Counter,
    model: &str,
    version: &str,
    err: Option<&crate::ServeError>,
) {
    let Some(e) = err else {
        ok.increment(1);
        return;
    };
    metrics::counter!(
        MODEL_REQUESTS,
        "model" => model.to_string(),
        "version" => version.to_string(),
        "status" => e.label()
    )
    .increment(1);
}

/// Counts a request refused before a handler took it (it gets no duration).
pub fn count_refused_request(protocol: &'static str, e: &crate::ServeError) {
    metrics::counter!(REQUESTS, "protocol" => protocol, "status" => e.label()).increment(1);
}

/// One request being handled: raises `ember_requests_in_flight` while alive, and counts the
/// request in `ember_requests_total` with its duration when it ends. A request dropped before
/// it was answered (the client went away or gave up at its deadline) counts as `cancelled`.
#[derive(Debug)]
pub struct Tracked {
    protocol: &'static str,
    start: Instant,
    done: bool,
}

impl Tracked {
    pub fn new(protocol: &'static str) -> Self {
        metrics::gauge!(IN_FLIGHT).increment(1.0);
        Tracked {
            protocol,
            start: Instant::now(),
            done: false,
        }
    }

    /// Records the answer: success, or the error sent back.
    pub fn finish(mut self, err: Option<&crate::ServeError>) {
        self.record(err.map_or("ok", |e| e.label()));
    }

    fn record(&mut self, status: &'static str) {
        self.done = true;
        metrics::counter!(REQUESTS, "protocol" => self.protocol, "status" => status).increment(1);
        let took = self.start.elapsed().as_secs_f64();
        metrics::histogram!(REQUEST_SECONDS).record(took);
        if status == "resource_exhausted" {
            metrics::histogram!(REFUSAL_SECONDS).record(took);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.done {
            self.record("cancelled");
        }
        metrics::gauge!(IN_FLIGHT).decrement(1.0);
    }
}

/// Records how long decoding one request of `protocol` took.
pub fn decoded(protocol: &'static str, since: std::time::Instant) {
    metrics::histogram!(DECODE_SECONDS, "protocol" => protocol)
        .record(since.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_recorder_comes_with_its_upkeep_thread() {
        super::handle();
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        };
        // A new thread names itself once it runs: look for up to 2 s.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !names().iter().any(|n| n == "ember-metrics") {
            assert!(
                std::time::Instant::now() < end,
                "no upkeep thread among {:?}",
                names()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
