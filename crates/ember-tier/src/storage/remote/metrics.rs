//! The remote tier's metric names, defined once (the server describes them on `/metrics`), and
//! the handles a store records into: registered when it opens, so that a batch records its
//! figures with neither a registry lookup nor an allocation. (A store opened before a recorder
//! is installed records nothing: the server installs its recorder before it loads a model.)

use metrics::{Counter, Gauge, Histogram};

/// One batch's fetch from the cluster, retries included.
pub const FETCH_SECONDS: &str = "ember_remote_fetch_seconds";
/// Rows of shares read whole instead of pooled on their node, by `why` (`no_module`: the node
/// has no `EMBER.POOL`; `refused`: the node refused the call).
pub const POOL_PLAIN: &str = "ember_remote_pool_plain_total";
/// Failures of the cluster that sent reads to the local copy, by `kind`.
pub const FALLBACK: &str = "ember_remote_fallback_total";
/// 1 while reads go to the local copy, else 0.
pub const FALLBACK_ACTIVE: &str = "ember_remote_fallback_active";
/// Rows read from the local copy.
pub const FALLBACK_ROWS: &str = "ember_remote_fallback_rows_total";
/// Tables whose local copy became unusable (rows updated in the cluster since it was taken).
pub const FALLBACK_STALE_TABLES: &str = "ember_remote_fallback_stale_tables_total";

/// A [`super::RedisStore`]'s handles.
#[derive(Debug)]
pub(super) struct StoreMetrics {
    pub fetch_seconds: Histogram,
    pub plain_no_module: Counter,
    pub plain_refused: Counter,
}

impl StoreMetrics {
    pub fn new(model: &str) -> Self {
        let m = model.to_string();
        StoreMetrics {
            fetch_seconds: metrics::histogram!(FETCH_SECONDS, "model" => m.clone()),
            plain_no_module: metrics::counter!(POOL_PLAIN, "model" => m.clone(), "why" => "no_module"),
            plain_refused: metrics::counter!(POOL_PLAIN, "model" => m, "why" => "refused"),
        }
    }
}

/// A [`super::WithLocalCopy`]'s handles (the failures' counter by kind is looked up when a
/// failure happens: not per batch).
#[derive(Debug)]
pub(super) struct FallbackMetrics {
    pub active: Gauge,
    pub rows: Counter,
    pub stale_tables: Counter,
}

impl FallbackMetrics {
    pub fn new(model: &str) -> Self {
        let m = model.to_string();
        FallbackMetrics {
            active: metrics::gauge!(FALLBACK_ACTIVE, "model" => m.clone()),
            rows: metrics::counter!(FALLBACK_ROWS, "model" => m.clone()),
            stale_tables: metrics::counter!(FALLBACK_STALE_TABLES, "model" => m),
        }
    }
}
