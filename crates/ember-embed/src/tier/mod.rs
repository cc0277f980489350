//! The SSD tier: tables larger than memory in row files ([`rowfile`]), a DRAM row cache in front
//! of them ([`cache`]), batched direct reads ([`io`]), and a pipeline that reads batch N+1's missing
//! rows while batch N is pooled ([`pipeline`]).
//!
//! Lookups on tier tables are staged: [`Stager::stage`] finds each feature's distinct ids in the
//! batch, copies the cached ones, reads every missing row of every tier table in one batched
//! submission (the distinct blocks, adjacent ones merged into one read), checks each block against
//! its checksum, admits the rows to the cache, and returns a [`StagedBatch`]: per feature, a compact
//! buffer of its distinct rows and the inverse index (as batch deduplication builds). The pooling
//! kernels then run on that buffer ([`crate::Pooler::run_staged`]) exactly as on a deduplicated
//! in-memory unit, so tier lookups give bit-identical results to in-memory ones.

pub mod cache;
pub mod io;
pub mod rowfile;

use crate::collection::{EmbeddingCollection, ValidatedBatch};
use crate::error::{EmbedError, Result};
use crate::jagged::{Ids, KeyedJagged};
use crate::pool::dedup::DedupScratch;
use crate::table::Placement;
pub use cache::{CachePolicy, RowCache};
use io::{IoEngine, Read};
pub use io::{IoKind, IoMode};
use rowfile::{BLOCK, RowFile};
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest single read when merging adjacent blocks.
const MAX_READ: usize = 256 << 10;

/// How the tier runs.
#[derive(Debug, Clone)]
pub struct TierOptions {
    /// DRAM budget of the row cache, shared by the tier tables in proportion to their sizes.
    pub cache_bytes: usize,
    pub policy: CachePolicy,
    pub io: IoMode,
    /// Reads in flight at most.
    pub queue_depth: usize,
    /// With [`CachePolicy::Pinned`]: the share of each table's cache held by the pinned hot set
    /// (the rest is LRU). `None`: all of it with a `pin_trace` (measured best on the production
    /// trace: 1.0 beat 0.9 and 0.75), 0.9 without one, so that an LRU part caches rows until the
    /// first refresh from live counts.
    pub pin_fraction: Option<f64>,
    /// An id trace to profile for the initial pinned set: each table pins its most frequent ids
    /// (those below its row count). Without one, the pinned policy starts from live counts.
    pub pin_trace: Option<Arc<Vec<u64>>>,
    /// Re-pin the hottest rows from live access counts every this many staged batches (0: never;
    /// the pinned policy without a trace uses 64).
    pub refresh_batches: usize,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions {
            cache_bytes: 1 << 30,
            policy: CachePolicy::Lfu,
            io: IoMode::Auto,
            queue_depth: 128,
            pin_fraction: None,
            pin_trace: None,
            refresh_batches: 0,
        }
    }
}

/// Counters of the tier since it was built (or since [`Stager::reset_stats`]).
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
    /// Read requests issued and bytes they read (whole blocks).
    pub ssd_reads: u64,
    pub ssd_bytes_read: u64,
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
            ssd_reads: self.ssd_reads - earlier.ssd_reads,
            ssd_bytes_read: self.ssd_bytes_read - earlier.ssd_bytes_read,
            stage: self.stage.saturating_sub(earlier.stage),
            io: self.io.saturating_sub(earlier.io),
            stall: self.stall.saturating_sub(earlier.stall),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    lookups: AtomicU64,
    cache_lookups: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    lookup_hits: AtomicU64,
    ssd_reads: AtomicU64,
    ssd_bytes_read: AtomicU64,
    stage_ns: AtomicU64,
    io_ns: AtomicU64,
    stall_ns: AtomicU64,
    /// Gauges, not counters (kept by `reset_stats`): bytes and rows the caches hold, published
    /// after each batch so that readers (the server's /metrics) never wait on the staging lock.
    cache_bytes: AtomicU64,
    cache_rows: AtomicU64,
}

/// One feature's rows for one batch: its distinct rows, compact, and for each of its ids the index
/// of its row among them.
#[derive(Debug)]
pub(crate) struct StagedFeature {
    pub(crate) rows: Vec<u8>,
    pub(crate) inverse: Vec<u32>,
    /// Batch position of the feature's first id.
    pub(crate) start: usize,
    /// Distinct rows in `rows`, and bytes per row.
    pub(crate) n_rows: usize,
    pub(crate) stride: usize,
    /// [`ids_hash`] of the feature's ids: pooling checks the batch is the one staged.
    pub(crate) ids_hash: u64,
}

impl StagedFeature {
    /// Whether this staged feature can be pooled for `ids` (the feature's ids in the batch at
    /// `start`) over rows of `stride` bytes: same batch position, same ids, and every inverse
    /// index inside the buffer (so the kernels never read outside it).
    pub(crate) fn fits(
        &self,
        start: usize,
        ids: &Ids,
        range: std::ops::Range<usize>,
        stride: usize,
    ) -> bool {
        self.start == start
            && self.stride == stride
            && self.inverse.len() == range.len()
            && self.rows.len() == self.n_rows * stride
            && self.inverse.iter().fold(0u32, |m, &i| m.max(i)) < self.n_rows.max(1) as u32
            && (self.inverse.is_empty() || self.n_rows > 0)
            && ids_hash(ids, range) == self.ids_hash
    }
}

/// A hash of ids `range` of a batch (a multiply-xorshift fold).
pub(crate) fn ids_hash(ids: &Ids, range: std::ops::Range<usize>) -> u64 {
    let mix = |h: u64, x: u64| (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    match ids {
        Ids::U32(v) => v[range].iter().fold(0, |h, &x| mix(h, u64::from(x))),
        Ids::I64(v) => v[range].iter().fold(0, |h, &x| mix(h, x as u64)),
    }
}

/// The rows of a batch's tier features, read and checked; pool it with
/// [`crate::Pooler::run_staged`].
#[derive(Debug, Default)]
pub struct StagedBatch {
    pub(crate) feats: Vec<Option<StagedFeature>>,
    /// Where its buffers go back when it is dropped.
    recycle: Option<Arc<BufPool>>,
}

impl Drop for StagedBatch {
    fn drop(&mut self) {
        if let Some(pool) = &self.recycle {
            for sf in self.feats.iter_mut().flatten() {
                pool.put(
                    std::mem::take(&mut sf.rows),
                    std::mem::take(&mut sf.inverse),
                );
            }
        }
    }
}

/// Staging buffers handed back by dropped [`StagedBatch`]es. Fresh multi-megabyte buffers each
/// batch cost page faults and kernel zeroing (13% of a fully cached run's profile); reused
/// ones cost a memset.
#[derive(Debug, Default)]
struct BufPool {
    free: Mutex<FreeBufs>,
}

/// Row buffers and inverse-index buffers.
#[derive(Debug, Default)]
struct FreeBufs {
    rows: Vec<Vec<u8>>,
    inverse: Vec<Vec<u32>>,
}

impl BufPool {
    /// Buffers kept at most, of each kind.
    const KEEP: usize = 256;

    fn put(&self, rows: Vec<u8>, inverse: Vec<u32>) {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if f.rows.len() < Self::KEEP && rows.capacity() > 0 {
            f.rows.push(rows);
        }
        if f.inverse.len() < Self::KEEP && inverse.capacity() > 0 {
            f.inverse.push(inverse);
        }
    }

    /// A zeroed byte buffer of `len`, and an empty u32 buffer.
    fn take(&self, len: usize) -> (Vec<u8>, Vec<u32>) {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows = f.rows.pop().unwrap_or_default();
        let mut inverse = f.inverse.pop().unwrap_or_default();
        drop(f);
        rows.clear();
        rows.resize(len, 0);
        inverse.clear();
        (rows, inverse)
    }
}

impl StagedBatch {
    /// Whether feature `f` was staged, for a batch whose feature `f` has `ids` ids at `start`.
    pub(crate) fn feature(&self, f: usize) -> Option<&StagedFeature> {
        self.feats.get(f).and_then(Option::as_ref)
    }
    /// Bytes of staged rows.
    pub fn bytes(&self) -> usize {
        self.feats.iter().flatten().map(|s| s.rows.len()).sum()
    }
}

#[derive(Debug)]
struct DiskTable {
    file: Arc<RowFile>,
    cache: RowCache,
    /// Rows the pinned set holds at most.
    pin_rows: usize,
}

#[derive(Debug, Clone, Copy)]
struct Miss {
    disk: usize,
    id: usize,
    feature: usize,
    slot: usize,
    /// Where its bytes land in the read buffer (set when reads are planned).
    at: usize,
}

#[derive(Debug)]
struct Inner {
    disk: Vec<DiskTable>,
    /// `None` when no table is on the tier.
    io: Option<IoEngine>,
    dedup: DedupScratch,
    misses: Vec<Miss>,
    /// Occurrences of each distinct id of the feature being staged.
    occurrences: Vec<u32>,
    reads: Vec<Read>,
    /// First block of each read.
    read_blocks: Vec<u64>,
}

/// Stages lookups of a collection's `ssd` tables (see the module documentation). One per
/// collection; it can be shared (`stage` takes `&self` and serializes on a lock).
#[derive(Debug)]
pub struct Stager {
    inner: Mutex<Inner>,
    bufs: Arc<BufPool>,
    /// For each table of the collection, its index among the tier tables.
    by_table: Vec<Option<usize>>,
    counters: Counters,
    opts: TierOptions,
    io_kind: Option<IoKind>,
    direct: bool,
}

impl Stager {
    /// A stager for `coll`'s `ssd` tables (it may have none: staging is then free). The cache
    /// budget is shared by the tables in proportion to their sizes; pinned rows are read now.
    pub fn new(coll: &EmbeddingCollection, opts: TierOptions) -> Result<Self> {
        let pin_fraction =
            opts.pin_fraction
                .unwrap_or(if opts.pin_trace.is_some() { 1.0 } else { 0.9 });
        if !(0.0..=1.0).contains(&pin_fraction) {
            return Err(EmbedError::BadOption {
                option: "pin_fraction",
                reason: format!("{pin_fraction} is not in [0, 1]"),
            });
        }
        let mut by_table = vec![None; coll.tables().len()];
        let mut files = Vec::new();
        for (t, table) in coll.tables().iter().enumerate() {
            if table.placement() != Placement::Ssd {
                continue;
            }
            let Some(file) = table.row_file() else {
                continue;
            };
            if !DedupScratch::supports(table.rows()) {
                return Err(EmbedError::BadTable {
                    table: table.name().into(),
                    reason: format!(
                        "{} rows: the SSD tier takes tables of fewer than 2^32 - 1 rows",
                        table.rows()
                    ),
                });
            }
            by_table[t] = Some(files.len());
            files.push(file.clone());
        }
        // No engine (no ring, no thread pool) for a collection with nothing on the tier.
        let io = match files.is_empty() {
            true => None,
            false => Some(IoEngine::new(opts.io, opts.queue_depth).map_err(|e| {
                EmbedError::BadOption {
                    option: "io",
                    reason: format!("could not start {} I/O: {e}", opts.io.name()),
                }
            })?),
        };
        let total: usize = files.iter().map(|f| f.rows() * f.row_bytes()).sum();
        let direct = files.iter().all(|f| f.direct());
        let mut opts = opts;
        if opts.policy == CachePolicy::Pinned
            && opts.pin_trace.is_none()
            && opts.refresh_batches == 0
        {
            opts.refresh_batches = 64;
        }
        let live = opts.policy == CachePolicy::Pinned && opts.refresh_batches > 0;
        let mut disk = Vec::with_capacity(files.len());
        for file in files {
            let share = if total == 0 {
                0.0
            } else {
                (file.rows() * file.row_bytes()) as f64 / total as f64
            };
            let capacity =
                ((opts.cache_bytes as f64 * share) as usize / file.row_bytes()).min(file.rows());
            let pin_rows = match opts.policy {
                CachePolicy::Pinned => (capacity as f64 * pin_fraction) as usize,
                _ => 0,
            };
            let mut cache = RowCache::new(opts.policy, capacity, file.row_bytes());
            cache.set_track_hot(live);
            disk.push(DiskTable {
                cache,
                file,
                pin_rows,
            });
        }
        let stager = Stager {
            bufs: Arc::default(),
            io_kind: io.as_ref().map(IoEngine::kind),
            inner: Mutex::new(Inner {
                disk,
                io,
                dedup: DedupScratch::default(),
                misses: Vec::new(),
                occurrences: Vec::new(),
                reads: Vec::new(),
                read_blocks: Vec::new(),
            }),
            by_table,
            counters: Counters::default(),
            opts,
            direct,
        };
        if let Some(trace) = &stager.opts.pin_trace
            && stager.opts.policy == CachePolicy::Pinned
        {
            let mut inner = stager.lock();
            for d in 0..inner.disk.len() {
                let hot = hottest(trace, inner.disk[d].file.rows(), inner.disk[d].pin_rows);
                inner.pin(d, &hot, &stager.counters)?;
            }
            inner.publish_usage(&stager.counters);
        }
        Ok(stager)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any table is on the tier.
    pub fn is_active(&self) -> bool {
        self.by_table.iter().any(Option::is_some)
    }

    /// The options.
    pub fn options(&self) -> &TierOptions {
        &self.opts
    }

    /// The I/O engine in use (`None` when no table is on the tier).
    pub fn io_kind(&self) -> Option<IoKind> {
        self.io_kind
    }

    /// Whether every tier file is read with direct I/O (bypassing the page cache).
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    /// Cache budget in bytes actually held by rows (at most the configured budget), and resident
    /// rows, over all tier tables.
    pub fn cache_usage(&self) -> (usize, usize) {
        let c = &self.counters;
        (
            c.cache_bytes.load(Relaxed) as usize,
            c.cache_rows.load(Relaxed) as usize,
        )
    }

    /// Counters so far.
    pub fn stats(&self) -> TierStats {
        let c = &self.counters;
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Relaxed));
        TierStats {
            batches: c.batches.load(Relaxed),
            lookups: c.lookups.load(Relaxed),
            cache_lookups: c.cache_lookups.load(Relaxed),
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            lookup_hits: c.lookup_hits.load(Relaxed),
            ssd_reads: c.ssd_reads.load(Relaxed),
            ssd_bytes_read: c.ssd_bytes_read.load(Relaxed),
            stage: ns(&c.stage_ns),
            io: ns(&c.io_ns),
            stall: ns(&c.stall_ns),
        }
    }

    /// Adds time a consumer waited for staged rows.
    pub fn add_stall(&self, d: Duration) {
        self.counters
            .stall_ns
            .fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// Reads the rows of `batch`'s tier features (see the module documentation).
    pub fn stage(
        &self,
        coll: &EmbeddingCollection,
        batch: ValidatedBatch<'_>,
    ) -> Result<StagedBatch> {
        let t0 = Instant::now();
        let kj = batch.get();
        let nf = coll.features().len();
        let mut staged = StagedBatch {
            feats: (0..nf).map(|_| None).collect(),
            recycle: Some(self.bufs.clone()),
        };
        if !self.is_active() {
            return Ok(staged);
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let same = self.by_table.len() == coll.tables().len()
            && coll
                .tables()
                .iter()
                .zip(&self.by_table)
                .all(|(t, d)| match d {
                    Some(d) => t
                        .row_file()
                        .is_some_and(|f| Arc::ptr_eq(f, &inner.disk[*d].file)),
                    None => t.placement() != Placement::Ssd,
                });
        if !same {
            return Err(EmbedError::BadOption {
                option: "stager",
                reason: "staging a batch of a collection other than the stager's".into(),
            });
        }
        inner.misses.clear();
        let (mut lookups, mut distinct, mut hits, mut lookup_hits) = (0u64, 0u64, 0u64, 0u64);
        for f in 0..nf {
            let Some(d) = self.by_table[coll.features()[f].table] else {
                continue;
            };
            let range = kj.feature_range(f);
            let n = match kj.ids() {
                Ids::U32(v) => inner.dedup.build(&v[range.clone()]),
                Ids::I64(v) => inner.dedup.build(&v[range.clone()]),
            };
            lookups += range.len() as u64;
            distinct += n as u64;
            let disk = &mut inner.disk[d];
            let rb = disk.file.row_bytes();
            let (mut rows, mut inverse) = self.bufs.take(n * rb);
            inverse.extend_from_slice(&inner.dedup.inverse);
            let occurrences = &mut inner.occurrences;
            occurrences.clear();
            occurrences.resize(n, 0);
            inner
                .dedup
                .inverse
                .iter()
                .for_each(|&u| occurrences[u as usize] += 1);
            for (slot, &id) in inner.dedup.uniq.iter().enumerate() {
                match disk.cache.get(id as u64) {
                    Some(row) => {
                        rows[slot * rb..(slot + 1) * rb].copy_from_slice(row);
                        hits += 1;
                        lookup_hits += u64::from(occurrences[slot]);
                    }
                    None => inner.misses.push(Miss {
                        disk: d,
                        id,
                        feature: f,
                        slot,
                        at: 0,
                    }),
                }
            }
            staged.feats[f] = Some(StagedFeature {
                rows,
                inverse,
                start: range.start,
                n_rows: n,
                stride: rb,
                ids_hash: ids_hash(kj.ids(), range.clone()),
            });
        }
        let io = inner.read_misses(&self.counters, |m, row, disk| {
            if let Some(sf) = staged.feats[m.feature].as_mut() {
                let rb = row.len();
                sf.rows[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row);
            }
            disk.cache.insert(m.id as u64, row);
        })?;
        let c = &self.counters;
        let batches = c.batches.fetch_add(1, Relaxed) + 1;
        c.lookups.fetch_add(lookups, Relaxed);
        c.cache_lookups.fetch_add(distinct, Relaxed);
        c.hits.fetch_add(hits, Relaxed);
        c.misses.fetch_add(distinct - hits, Relaxed);
        c.lookup_hits.fetch_add(lookup_hits, Relaxed);
        c.io_ns.fetch_add(io.as_nanos() as u64, Relaxed);
        if self.opts.policy == CachePolicy::Pinned
            && self.opts.refresh_batches > 0
            && batches.is_multiple_of(self.opts.refresh_batches as u64)
        {
            for d in 0..inner.disk.len() {
                let k = inner.disk[d].pin_rows;
                let hot: Vec<usize> = inner.disk[d]
                    .cache
                    .take_hot(k)
                    .into_iter()
                    .map(|i| i as usize)
                    .collect();
                inner.pin(d, &hot, &self.counters)?;
            }
        }
        inner.publish_usage(c);
        c.stage_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        Ok(staged)
    }

    /// Zeroes the counters (the cache keeps its rows).
    pub fn reset_stats(&self) {
        let c = &self.counters;
        for a in [
            &c.batches,
            &c.lookups,
            &c.cache_lookups,
            &c.hits,
            &c.misses,
            &c.lookup_hits,
            &c.ssd_reads,
            &c.ssd_bytes_read,
            &c.stage_ns,
            &c.io_ns,
            &c.stall_ns,
        ] {
            a.store(0, Relaxed);
        }
    }

    /// Checks the caches' invariants (tests): budget, pinned residency, internal consistency.
    pub fn check_invariants(&self, budget: usize) {
        let inner = self.lock();
        let used: usize = inner.disk.iter().map(|d| d.cache.resident_bytes()).sum();
        assert!(used <= budget, "cache holds {used} bytes, budget {budget}");
        inner.disk.iter().for_each(|d| d.cache.check_invariants());
    }

    /// Whether `row` of collection table `table` is pinned (tests).
    pub fn is_pinned(&self, table: usize, row: u64) -> bool {
        match self.by_table.get(table).copied().flatten() {
            Some(d) => self.lock().disk[d].cache.is_pinned(row),
            None => false,
        }
    }
}

impl Inner {
    /// Stores the caches' current size in the counters' gauges.
    fn publish_usage(&self, counters: &Counters) {
        let (bytes, rows) = self.disk.iter().fold((0, 0), |(b, r), d| {
            (b + d.cache.resident_bytes(), r + d.cache.len())
        });
        counters.cache_bytes.store(bytes as u64, Relaxed);
        counters.cache_rows.store(rows as u64, Relaxed);
    }

    /// Reads every row in `self.misses` (merged into block reads), checks the blocks, and hands
    /// each row to `land`. Returns the time spent waiting for reads.
    fn read_misses(
        &mut self,
        counters: &Counters,
        mut land: impl FnMut(&Miss, &[u8], &mut DiskTable),
    ) -> Result<Duration> {
        if self.misses.is_empty() {
            return Ok(Duration::ZERO);
        }
        let disk = &self.disk;
        self.misses
            .sort_unstable_by_key(|m| (m.disk, m.id as u64 * disk[m.disk].file.row_bytes() as u64));
        self.reads.clear();
        self.read_blocks.clear();
        let mut buf_len = 0usize;
        // Current read: disk, first block, blocks.
        let mut cur: Option<(usize, u64, u64)> = None;
        let flush = |cur: Option<(usize, u64, u64)>,
                     reads: &mut Vec<Read>,
                     blocks: &mut Vec<u64>,
                     buf_len: &mut usize| {
            if let Some((d, first, n)) = cur {
                let len = n as usize * BLOCK;
                reads.push(Read {
                    file: d,
                    offset: disk[d].file.block_offset(first),
                    len,
                });
                blocks.push(first);
                *buf_len += len;
            }
        };
        for m in self.misses.iter_mut() {
            let file = &disk[m.disk].file;
            let (first, n) = file.row_blocks(m.id);
            let extend = match cur {
                Some((d, f0, k)) => {
                    d == m.disk
                        && first <= f0 + k
                        && ((first + n).max(f0 + k) - f0) as usize * BLOCK <= MAX_READ
                }
                None => false,
            };
            if extend {
                if let Some((_, f0, k)) = cur.as_mut() {
                    *k = (first + n).max(*f0 + *k) - *f0;
                }
            } else {
                flush(cur, &mut self.reads, &mut self.read_blocks, &mut buf_len);
                cur = Some((m.disk, first, n));
            }
            // Offset of the row in the read buffer: the current read starts at `buf_len`.
            let (_, f0, _) = cur.unwrap_or((0, first, n));
            m.at = buf_len + (m.id * file.row_bytes() - f0 as usize * BLOCK);
        }
        flush(cur, &mut self.reads, &mut self.read_blocks, &mut buf_len);
        let files: Vec<&File> = disk.iter().map(|d| d.file.file()).collect();
        let t = Instant::now();
        let Some(io) = self.io.as_mut() else {
            return Err(EmbedError::BadOption {
                option: "io",
                reason: "rows to read but no table on the tier".into(),
            });
        };
        let buf = io.read(&files, &self.reads).map_err(|e| {
            let r = self.reads[e.index.min(self.reads.len() - 1)];
            EmbedError::Io {
                path: disk[r.file].file.path().display().to_string(),
                op: "read",
                reason: format!("{} bytes at offset {}: {}", r.len, r.offset, e.error),
            }
        })?;
        let waited = t.elapsed();
        let mut at = 0;
        for (r, &first) in self.reads.iter().zip(&self.read_blocks) {
            disk[r.file].file.verify(first, &buf[at..at + r.len])?;
            at += r.len;
        }
        counters
            .ssd_reads
            .fetch_add(self.reads.len() as u64, Relaxed);
        counters.ssd_bytes_read.fetch_add(at as u64, Relaxed);
        for m in &self.misses {
            let rb = self.disk[m.disk].file.row_bytes();
            land(m, &buf[m.at..m.at + rb], &mut self.disk[m.disk]);
        }
        Ok(waited)
    }

    /// Pins `ids` (hottest first) in tier table `d`: rows already cached are copied, the others
    /// read in chunks of at most `PIN_CHUNK` rows (bounded I/O buffers).
    fn pin(&mut self, d: usize, ids: &[usize], counters: &Counters) -> Result<()> {
        const PIN_CHUNK: usize = 16 << 10;
        let rb = self.disk[d].file.row_bytes();
        let mut rows = vec![0u8; ids.len() * rb];
        self.misses.clear();
        for (slot, &id) in ids.iter().enumerate() {
            match self.disk[d].cache.get(id as u64) {
                Some(row) => rows[slot * rb..(slot + 1) * rb].copy_from_slice(row),
                None => self.misses.push(Miss {
                    disk: d,
                    id,
                    feature: 0,
                    slot,
                    at: 0,
                }),
            }
        }
        let missing = std::mem::take(&mut self.misses);
        for chunk in missing.chunks(PIN_CHUNK) {
            self.misses.clear();
            self.misses.extend_from_slice(chunk);
            let io = self.read_misses(counters, |m, row, _| {
                rows[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row)
            })?;
            counters.io_ns.fetch_add(io.as_nanos() as u64, Relaxed);
        }
        self.misses.clear();
        let cache = &mut self.disk[d].cache;
        cache.pin(
            ids.iter()
                .enumerate()
                .map(|(slot, &id)| (id as u64, &rows[slot * rb..(slot + 1) * rb])),
        );
        Ok(())
    }
}

/// The `k` most frequent ids below `rows` in `trace`, most frequent first (ties: smaller id).
pub fn hottest(trace: &[u64], rows: usize, k: usize) -> Vec<usize> {
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for &id in trace.iter().filter(|&&i| i < rows as u64) {
        *counts.entry(id).or_default() += 1;
    }
    let mut v: Vec<(u64, u32)> = counts.into_iter().collect();
    v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().take(k).map(|(id, _)| id as usize).collect()
}

/// Stages each item's batch `depth` batches ahead of `consume`, on a thread of its own, so that
/// reads overlap the consumer's compute (depth 0: staged inline, no overlap). `consume` gets every
/// item in order with its staged rows or the error staging it raised; the first error `consume`
/// returns stops the pipeline. Time `consume` waits for a batch is counted as the stager's stall.
pub fn pipeline<T, E, I>(
    stager: &Stager,
    coll: &EmbeddingCollection,
    depth: usize,
    items: I,
    batch_of: impl Fn(&T) -> &KeyedJagged + Sync,
    mut consume: impl FnMut(T, Result<StagedBatch>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E>
where
    T: Send,
    I: IntoIterator<Item = T> + Send,
    I::IntoIter: Send,
{
    let stage = |item: &T| {
        coll.validate(batch_of(item))
            .and_then(|b| stager.stage(coll, b))
    };
    if depth == 0 {
        for item in items {
            let t = Instant::now();
            let st = stage(&item);
            stager.add_stall(t.elapsed());
            consume(item, st)?;
        }
        return Ok(());
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(depth - 1);
    let items = items.into_iter();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let stage = &stage;
        let stop = &stop;
        s.spawn(move || {
            for item in items {
                let st = stage(&item);
                // Checked before blocking on the next item too (the loop's `next`); an iterator
                // that blocks forever (an idle stdin) still delays the end after an error.
                if stop.load(Relaxed) {
                    break;
                }
                if tx.send((item, st)).is_err() {
                    break;
                }
            }
        });
        let result = loop {
            let t = Instant::now();
            let Ok((item, st)) = rx.recv() else {
                break Ok(());
            };
            stager.add_stall(t.elapsed());
            if let Err(e) = consume(item, st) {
                stop.store(true, Relaxed);
                break Err(e);
            }
        };
        // Unblocks the staging thread (its next send fails) before the scope joins it.
        drop(rx);
        result
    })
}
