//! The [`Stager`]: for each batch, every tier feature's distinct ids (deduplicated once per
//! batch), the cached rows copied, every missing row of every tier table fetched from its store
//! in one call per store, admitted to the cache, and a [`StagedBatch`] returned. The pinned
//! policy's hot set is loaded here too (from a trace at start, from live counts every
//! `refresh_batches` batches).

use super::options::TierOptions;
use super::staged::{Recycler, StagedBatch, StagedFeature, ids_hash};
use super::stats::{Counters, TierStats};
use crate::cache::{CachePolicy, RowCache};
use crate::collection::{CollectionId, EmbeddingCollection, ValidatedBatch};
use crate::dedup::DedupScratch;
use crate::error::{EmbedError, Result};
use crate::jagged::Ids;
use crate::storage::remote::{RedisStore, RemoteTableSpec};
use crate::storage::{RowRequest, RowStore, open_row_files};
use crate::table::Placement;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A table of the collection on the tier: where its rows come from, and its cache.
#[derive(Debug)]
struct TierTable {
    /// Its store, and its index among that store's tables.
    store: usize,
    table: usize,
    rows: usize,
    row_bytes: usize,
    cache: RowCache,
    /// Rows the pinned set holds at most.
    pin_rows: usize,
}

/// A row to fetch: of tier table `tier`, for slot `slot` of feature `feature`'s staged rows.
#[derive(Debug, Clone, Copy)]
struct Miss {
    tier: usize,
    id: usize,
    feature: usize,
    slot: usize,
}

#[derive(Debug)]
struct Inner {
    tables: Vec<TierTable>,
    stores: Vec<Box<dyn RowStore>>,
    dedup: DedupScratch,
    misses: Vec<Miss>,
    /// Occurrences of each distinct id of the feature being staged.
    occurrences: Vec<u32>,
    /// The requests of one store's call.
    requests: Vec<RowRequest>,
}

/// Stages lookups of a collection's `ssd` tables (see the module documentation). One per
/// collection; it can be shared (`stage` takes `&self` and serializes on a lock).
#[derive(Debug)]
pub struct Stager {
    inner: Mutex<Inner>,
    recycler: Arc<Recycler>,
    /// The collection it stages for.
    collection: CollectionId,
    /// For each table of the collection, its index among the tier tables.
    by_table: Vec<Option<usize>>,
    counters: Counters,
    opts: TierOptions,
    /// Engines of the stores, and whether all bypass the page cache (fixed at start).
    engines: Vec<&'static str>,
    direct: bool,
    /// Whether a store reads over the network, and whether it answered last time.
    remote: bool,
    healthy: AtomicBool,
    /// Each batch's wait for its missing rows, seconds (batches with misses; the newest
    /// [`FETCH_SAMPLES`] at most), for percentiles.
    fetch_samples: Mutex<Vec<f32>>,
}

/// Fetch times kept at most.
const FETCH_SAMPLES: usize = 1 << 20;

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
        let mut remote = Vec::new();
        // (store, index in that store, rows, row bytes), in tier-table order.
        let mut shapes: Vec<(usize, usize, usize, usize)> = Vec::new();
        let file_store = 0;
        let remote_store = usize::from(
            coll.tables()
                .iter()
                .any(|t| t.placement() == Placement::Ssd),
        );
        for (t, table) in coll.tables().iter().enumerate() {
            let placement = table.placement();
            if !matches!(placement, Placement::Ssd | Placement::Remote) {
                continue;
            }
            if !DedupScratch::supports(table.rows()) {
                return Err(EmbedError::BadTable {
                    table: table.name().into(),
                    reason: format!(
                        "{} rows: the {placement} tier takes tables of fewer than 2^32 - 1 rows",
                        table.rows()
                    ),
                });
            }
            match placement {
                Placement::Ssd => {
                    let Some(file) = table.row_file() else {
                        continue;
                    };
                    shapes.push((file_store, files.len(), file.rows(), file.row_bytes()));
                    files.push(file.clone());
                }
                _ => {
                    shapes.push((remote_store, remote.len(), table.rows(), table.stride()));
                    remote.push(RemoteTableSpec {
                        name: table.name().into(),
                        rows: table.rows(),
                        dim: table.dim(),
                        dtype: table.dtype(),
                    });
                }
            }
            by_table[t] = Some(shapes.len() - 1);
        }
        let total: usize = shapes.iter().map(|s| s.2 * s.3).sum();
        // No store (no ring, no thread pool, no connection) for what has no table.
        let mut stores: Vec<Box<dyn RowStore>> = Vec::new();
        if !files.is_empty() {
            stores.push(open_row_files(files, opts.io, opts.queue_depth)?);
        }
        if !remote.is_empty() {
            let Some(src) = &opts.remote else {
                return Err(EmbedError::BadOption {
                    option: "redis",
                    reason: format!(
                        "table '{}' is placed remote: give the cluster (--redis redis://host:port)",
                        remote[0].name
                    ),
                });
            };
            stores.push(Box::new(RedisStore::open(src, &remote)?));
        }
        let mut opts = opts;
        if opts.policy == CachePolicy::Pinned
            && opts.pin_trace.is_none()
            && opts.refresh_batches == 0
        {
            opts.refresh_batches = 64;
        }
        let live = opts.policy == CachePolicy::Pinned && opts.refresh_batches > 0;
        let mut tables = Vec::with_capacity(shapes.len());
        for (store, table, rows, row_bytes) in shapes {
            let share = if total == 0 {
                0.0
            } else {
                (rows * row_bytes) as f64 / total as f64
            };
            let capacity = ((opts.cache_bytes as f64 * share) as usize / row_bytes).min(rows);
            let pin_rows = match opts.policy {
                CachePolicy::Pinned => (capacity as f64 * pin_fraction) as usize,
                _ => 0,
            };
            let mut cache = RowCache::new(opts.policy, capacity, row_bytes);
            cache.set_track_hot(live);
            tables.push(TierTable {
                store,
                table,
                rows,
                row_bytes,
                cache,
                pin_rows,
            });
        }
        let stager = Stager {
            recycler: Arc::default(),
            engines: stores.iter().map(|s| s.engine()).collect(),
            direct: stores.iter().all(|s| s.direct()),
            remote: stores.iter().any(|s| s.remote()),
            healthy: AtomicBool::new(true),
            fetch_samples: Mutex::default(),
            inner: Mutex::new(Inner {
                tables,
                stores,
                dedup: DedupScratch::default(),
                misses: Vec::new(),
                occurrences: Vec::new(),
                requests: Vec::new(),
            }),
            collection: coll.id(),
            by_table,
            counters: Counters::default(),
            opts,
        };
        if let Some(trace) = &stager.opts.pin_trace
            && stager.opts.policy == CachePolicy::Pinned
        {
            let mut inner = stager.lock();
            for d in 0..inner.tables.len() {
                let hot = hottest(trace, inner.tables[d].rows, inner.tables[d].pin_rows);
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

    /// The engine its rows are read with (`io_uring`, `pread`, `mmap`; `None` when no table is
    /// on the tier).
    pub fn engine(&self) -> Option<&'static str> {
        self.engines.first().copied()
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
        self.counters.snapshot()
    }

    /// Adds time a consumer waited for staged rows.
    pub fn add_stall(&self, d: Duration) {
        Counters::add_time(&self.counters.stall_ns, d);
    }

    /// Zeroes the counters (the cache keeps its rows).
    pub fn reset_stats(&self) {
        self.counters.reset();
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
            recycle: Some(self.recycler.clone()),
        };
        if !self.is_active() {
            return Ok(staged);
        }
        if coll.id() != self.collection || batch.collection() != self.collection {
            return Err(EmbedError::BadOption {
                option: "stager",
                reason: "staging a batch of a collection other than the stager's".into(),
            });
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
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
            let table = &mut inner.tables[d];
            let rb = table.row_bytes;
            let (mut rows, mut inverse) = self.recycler.take(n * rb);
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
                match table.cache.get(id as u64) {
                    Some(row) => {
                        rows[slot * rb..(slot + 1) * rb].copy_from_slice(row);
                        hits += 1;
                        lookup_hits += u64::from(occurrences[slot]);
                    }
                    None => inner.misses.push(Miss {
                        tier: d,
                        id,
                        feature: f,
                        slot,
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
        let io = inner.fetch_misses(&self.counters, |m, row, table| {
            if let Some(sf) = staged.feats[m.feature].as_mut() {
                let rb = row.len();
                sf.rows[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row);
            }
            table.cache.insert(m.id as u64, row);
        });
        if self.remote {
            let down = matches!(io, Err(EmbedError::StoreUnavailable { .. }));
            self.healthy.store(!down, Relaxed);
        }
        let io = io?;
        if !inner.misses.is_empty() {
            let mut samples = self.fetch_samples.lock().unwrap_or_else(|p| p.into_inner());
            if samples.len() < FETCH_SAMPLES {
                samples.push(io.as_secs_f32());
            }
        }
        let c = &self.counters;
        let batches = c.batches.fetch_add(1, Relaxed) + 1;
        c.lookups.fetch_add(lookups, Relaxed);
        c.cache_lookups.fetch_add(distinct, Relaxed);
        c.hits.fetch_add(hits, Relaxed);
        c.misses.fetch_add(distinct - hits, Relaxed);
        c.lookup_hits.fetch_add(lookup_hits, Relaxed);
        Counters::add_time(&c.io_ns, io);
        if self.opts.policy == CachePolicy::Pinned
            && self.opts.refresh_batches > 0
            && batches.is_multiple_of(self.opts.refresh_batches as u64)
        {
            for d in 0..inner.tables.len() {
                let k = inner.tables[d].pin_rows;
                let hot: Vec<usize> = inner.tables[d]
                    .cache
                    .take_hot(k)
                    .into_iter()
                    .map(|i| i as usize)
                    .collect();
                inner.pin(d, &hot, &self.counters)?;
            }
        }
        inner.publish_usage(c);
        Counters::add_time(&c.stage_ns, t0.elapsed());
        Ok(staged)
    }

    /// Each batch's wait for its missing rows since the last call, seconds (batches that had
    /// misses only).
    pub fn take_fetch_samples(&self) -> Vec<f32> {
        std::mem::take(&mut *self.fetch_samples.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether a table is read from a remote store.
    pub fn has_remote(&self) -> bool {
        self.remote
    }

    /// Whether the stores answered the last batch or probe (always true without a remote one).
    pub fn store_healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    /// Asks every store whether it answers now (a remote store's nodes), and records the answer
    /// for [`Stager::store_healthy`].
    pub fn probe_stores(&self) -> Result<()> {
        let mut inner = self.lock();
        let r = inner.stores.iter_mut().try_for_each(|s| s.probe());
        if self.remote {
            self.healthy.store(r.is_ok(), Relaxed);
        }
        r
    }

    /// Counters per node of the remote stores.
    pub fn remote_nodes(&self) -> Vec<crate::storage::remote::NodeStats> {
        self.lock()
            .stores
            .iter()
            .flat_map(|s| s.node_stats())
            .collect()
    }

    /// Checks the caches' invariants (tests): budget, pinned residency, internal consistency.
    pub fn check_invariants(&self, budget: usize) {
        let inner = self.lock();
        let used: usize = inner.tables.iter().map(|d| d.cache.resident_bytes()).sum();
        assert!(used <= budget, "cache holds {used} bytes, budget {budget}");
        inner.tables.iter().for_each(|d| d.cache.check_invariants());
    }

    /// Whether `row` of collection table `table` is pinned (tests).
    pub fn is_pinned(&self, table: usize, row: u64) -> bool {
        match self.by_table.get(table).copied().flatten() {
            Some(d) => self.lock().tables[d].cache.is_pinned(row),
            None => false,
        }
    }
}

impl Inner {
    /// Stores the caches' current size in the counters' gauges.
    fn publish_usage(&self, counters: &Counters) {
        let (bytes, rows) = self.tables.iter().fold((0, 0), |(b, r), d| {
            (b + d.cache.resident_bytes(), r + d.cache.len())
        });
        counters.cache_bytes.store(bytes as u64, Relaxed);
        counters.cache_rows.store(rows as u64, Relaxed);
    }

    /// Fetches every row in `self.misses` from its table's store (one call per store) and hands
    /// each to `land`. Returns the time spent waiting for the stores.
    fn fetch_misses(
        &mut self,
        counters: &Counters,
        mut land: impl FnMut(&Miss, &[u8], &mut TierTable),
    ) -> Result<Duration> {
        let mut waited = Duration::ZERO;
        if self.misses.is_empty() {
            return Ok(waited);
        }
        let Inner {
            tables,
            stores,
            misses,
            requests,
            ..
        } = self;
        for (s, store) in stores.iter_mut().enumerate() {
            requests.clear();
            requests.extend(
                misses
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| tables[m.tier].store == s)
                    .map(|(i, m)| RowRequest {
                        table: tables[m.tier].table,
                        row: m.id,
                        tag: i,
                    }),
            );
            if requests.is_empty() {
                continue;
            }
            let st = store.read(requests, &mut |r, row| {
                let m = &misses[r.tag];
                land(m, row, &mut tables[m.tier]);
            })?;
            counters.ssd_reads.fetch_add(st.reads, Relaxed);
            counters.ssd_bytes_read.fetch_add(st.bytes, Relaxed);
            waited += st.wait;
        }
        Ok(waited)
    }

    /// Pins `ids` (hottest first) in tier table `d`: rows already cached are copied, the others
    /// fetched in chunks of at most `PIN_CHUNK` rows (bounded buffers).
    fn pin(&mut self, d: usize, ids: &[usize], counters: &Counters) -> Result<()> {
        const PIN_CHUNK: usize = 16 << 10;
        let rb = self.tables[d].row_bytes;
        let mut rows = vec![0u8; ids.len() * rb];
        self.misses.clear();
        for (slot, &id) in ids.iter().enumerate() {
            match self.tables[d].cache.get(id as u64) {
                Some(row) => rows[slot * rb..(slot + 1) * rb].copy_from_slice(row),
                None => self.misses.push(Miss {
                    tier: d,
                    id,
                    feature: 0,
                    slot,
                }),
            }
        }
        let missing = std::mem::take(&mut self.misses);
        for chunk in missing.chunks(PIN_CHUNK) {
            self.misses.clear();
            self.misses.extend_from_slice(chunk);
            let io = self.fetch_misses(counters, |m, row, _| {
                rows[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row)
            })?;
            Counters::add_time(&counters.io_ns, io);
        }
        self.misses.clear();
        let cache = &mut self.tables[d].cache;
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
