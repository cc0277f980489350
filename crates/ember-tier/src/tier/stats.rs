//! What the tier did: counters kept with atomics while batches are staged ([`Counters`]), read
//! as a snapshot ([`TierStats`]) without taking the staging lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Counters of the tier since it was built (or since [`super::Stager::reset_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TierStats {
    /// Batches staged.
    pub batches: u64,
    /// Ids of tier features looked up.
    pub lookups: u64,
    /// Distinct (feature, id) pairs per batch: what the cache was asked for.
    pub cache_lookups: u64,
    pub hits: u64,
    pub misses: u64,
    /// Ids whose row was in the cache (a hit counted once per occurrence in the batch).
    pub lookup_hits: u64,
    /// Read requests issued to the tier's stores: SSD block reads of row files, or round trips
    /// to a Redis Cluster.
    pub store_reads: u64,
    /// Bytes those requests moved (whole blocks for row files; for a remote store that pools,
    /// partial sums and rows read whole).
    pub store_bytes_read: u64,
    /// Missing rows pooled on the remote store's nodes (`EMBER.POOL`), and missing rows of
    /// pooled tables read whole instead (a node without the module, a block moved).
    pub pooled_rows: u64,
    pub pool_plain_rows: u64,
    /// Rows of pooled tables read whole in the background and admitted to the cache, and ids
    /// the fill dropped (its queue full, a failed read, an update applied meanwhile).
    pub fill_rows: u64,
    pub fill_dropped: u64,
    /// Time staging took (cache lookups, reads, checks, copies).
    pub stage: Duration,
    /// Of which waiting for reads.
    pub io: Duration,
    /// Time the consumer of a pipeline waited for a staged batch (all of `stage` when not
    /// pipelined).
    pub stall: Duration,
}

impl TierStats {
    /// Ids served from the cache / ids looked up: the hit rate per access, as the caching
    /// literature reports it (1 when nothing was looked up).
    pub fn lookup_hit_rate(&self) -> f64 {
        if self.lookups == 0 {
            1.0
        } else {
            self.lookup_hits as f64 / self.lookups as f64
        }
    }

    /// Hits / cache lookups, distinct rows per batch (1 when nothing was looked up): what the
    /// reads follow, since a row missing from the cache is read once per batch however often the
    /// batch uses it.
    pub fn hit_rate(&self) -> f64 {
        if self.cache_lookups == 0 {
            1.0
        } else {
            self.hits as f64 / self.cache_lookups as f64
        }
    }

    /// The share of staging time hidden behind compute: `1 - stall / stage`, in [0, 1].
    pub fn overlap(&self) -> f64 {
        if self.stage.is_zero() {
            return 0.0;
        }
        (1.0 - self.stall.as_secs_f64() / self.stage.as_secs_f64()).clamp(0.0, 1.0)
    }

    /// Field-wise difference `self - earlier`.
    pub fn since(&self, earlier: &TierStats) -> TierStats {
        TierStats {
            batches: self.batches - earlier.batches,
            lookups: self.lookups - earlier.lookups,
            cache_lookups: self.cache_lookups - earlier.cache_lookups,
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            lookup_hits: self.lookup_hits - earlier.lookup_hits,
            store_reads: self.store_reads - earlier.store_reads,
            store_bytes_read: self.store_bytes_read - earlier.store_bytes_read,
            pooled_rows: self.pooled_rows - earlier.pooled_rows,
            pool_plain_rows: self.pool_plain_rows - earlier.pool_plain_rows,
            fill_rows: self.fill_rows - earlier.fill_rows,
            fill_dropped: self.fill_dropped - earlier.fill_dropped,
            stage: self.stage.saturating_sub(earlier.stage),
            io: self.io.saturating_sub(earlier.io),
            stall: self.stall.saturating_sub(earlier.stall),
        }
    }

    /// Field-wise sum.
    pub fn plus(&self, o: &TierStats) -> TierStats {
        TierStats {
            batches: self.batches + o.batches,
            lookups: self.lookups + o.lookups,
            cache_lookups: self.cache_lookups + o.cache_lookups,
            hits: self.hits + o.hits,
            misses: self.misses + o.misses,
            lookup_hits: self.lookup_hits + o.lookup_hits,
            store_reads: self.store_reads + o.store_reads,
            store_bytes_read: self.store_bytes_read + o.store_bytes_read,
            pooled_rows: self.pooled_rows + o.pooled_rows,
            pool_plain_rows: self.pool_plain_rows + o.pool_plain_rows,
            fill_rows: self.fill_rows + o.fill_rows,
            fill_dropped: self.fill_dropped + o.fill_dropped,
            stage: self.stage + o.stage,
            io: self.io + o.io,
            stall: self.stall + o.stall,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) batches: AtomicU64,
    pub(crate) lookups: AtomicU64,
    pub(crate) cache_lookups: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) lookup_hits: AtomicU64,
    pub(crate) store_reads: AtomicU64,
    pub(crate) store_bytes_read: AtomicU64,
    pub(crate) pooled_rows: AtomicU64,
    pub(crate) pool_plain_rows: AtomicU64,
    pub(crate) fill_rows: AtomicU64,
    pub(crate) fill_dropped: AtomicU64,
    pub(crate) stage_ns: AtomicU64,
    pub(crate) io_ns: AtomicU64,
    pub(crate) stall_ns: AtomicU64,
    /// Gauges, not counters (kept by `reset_stats`): bytes and rows the caches hold, published
    /// after each batch so that readers (the server's /metrics) never wait on the staging lock.
    pub(crate) cache_bytes: AtomicU64,
    pub(crate) cache_rows: AtomicU64,
}

impl Counters {
    /// A snapshot of the counters.
    pub(crate) fn snapshot(&self) -> TierStats {
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Relaxed));
        TierStats {
            batches: self.batches.load(Relaxed),
            lookups: self.lookups.load(Relaxed),
            cache_lookups: self.cache_lookups.load(Relaxed),
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            lookup_hits: self.lookup_hits.load(Relaxed),
            store_reads: self.store_reads.load(Relaxed),
            store_bytes_read: self.store_bytes_read.load(Relaxed),
            pooled_rows: self.pooled_rows.load(Relaxed),
            pool_plain_rows: self.pool_plain_rows.load(Relaxed),
            fill_rows: self.fill_rows.load(Relaxed),
            fill_dropped: self.fill_dropped.load(Relaxed),
            stage: ns(&self.stage_ns),
            io: ns(&self.io_ns),
            stall: ns(&self.stall_ns),
        }
    }

    /// Zeroes the counters (not the gauges).
    pub(crate) fn reset(&self) {
        for a in [
            &self.batches,
            &self.lookups,
            &self.cache_lookups,
            &self.hits,
            &self.misses,
            &self.lookup_hits,
            &self.store_reads,
            &self.store_bytes_read,
            &self.pooled_rows,
            &self.pool_plain_rows,
            &self.fill_rows,
            &self.fill_dropped,
            &self.stage_ns,
            &self.io_ns,
            &self.stall_ns,
        ] {
            a.store(0, Relaxed);
        }
    }

    /// Adds `d` to a nanosecond counter.
    pub(crate) fn add_time(a: &AtomicU64, d: Duration) {
        a.fetch_add(d.as_nanos() as u64, Relaxed);
    }
}
