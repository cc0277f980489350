//! The [`Stager`]: for each batch, every tier feature's distinct ids (deduplicated once per
//! batch), the cached rows held where they lie in the cache's slab, every missing row of every
//! tier table fetched from its store in one call per store and admitted to the cache (or, when
//! the policy does not keep it, lent a staging slot), and a [`StagedBatch`] returned that pools
//! every row in place and releases its slots when dropped. A feature whose rows the cache cannot
//! all hold (every slot held or pinned, the staging slots all lent) is copied into a buffer of
//! its own instead: the same result, one copy more. The pinned
//! policy's hot set is loaded here too (from a trace at start, from live counts every
//! `refresh_batches` batches). The stores themselves are made by `stores.rs`.

use super::fill::Filler;
use super::follow::{Follower, UpdateStats};
use super::inner::{Inner, TableScratch, TierTable, staging_slots};
use super::land::{Overflow, compact, fill_slots, land_row};
use super::lookup::{Counts, PARALLEL_MIN_IDS, TableStaged, stage_table};
use super::node_sums::{PoolingParts, pool_misses, pooled_tables};
use super::options::TierOptions;
use super::pinning::hottest;
use super::stats::{Counters, TierStats};
use super::stores::{Home, Stores, TierStore, open_stores};
use crate::cache::{CachePolicy, RowCache};
use ember_embed::KeyedJagged;
use ember_embed::Placement;
use ember_embed::dedup::DedupScratch;
use ember_embed::staged::{Recycler, StagedBatch, StagedRows};
use ember_embed::{CheckedView, CollectionId, EmbeddingCollection};
use ember_embed::{EmbedError, Result};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Stages lookups of a collection's `ssd` and `remote` tables (see the module documentation).
/// One per collection; it can be shared (`stage` takes `&self` and serializes on a lock).
#[derive(Debug)]
pub struct Stager {
    inner: Arc<Mutex<Inner>>,
    recycler: Arc<Recycler>,
    /// The collection it stages for.
    collection: CollectionId,
    /// For each table of the collection, its index among the tier tables.
    by_table: Vec<Option<usize>>,
    /// For each tier table, the collection's features that look it up.
    features_of: Vec<Vec<usize>>,
    counters: Arc<Counters>,
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
    /// Per tier table: whether its store pools misses on its nodes (fixed at start).
    pooled: Vec<bool>,
    /// The background fill of pooled tables' caches (`fill.rs`).
    filler: Option<Filler>,
    /// The remote tables' update streams, followed (declared last: its thread stops first).
    follower: Option<Follower>,
}

/// Fetch times kept at most.
const FETCH_SAMPLES: usize = 1 << 20;

/// The share of each pinned cache that its hot set holds ([`TierOptions::pin_fraction`] or its
/// default), checked to be in [0, 1].
fn pin_fraction(opts: &TierOptions) -> Result<f64> {
    let default = if opts.pin_trace.is_some() { 1.0 } else { 0.9 };
    let pin_fraction = opts.pin_fraction.unwrap_or(default);
    if !(0.0..=1.0).contains(&pin_fraction) {
        return Err(EmbedError::BadOption {
            option: "pin_fraction",
            reason: format!("{pin_fraction} is not in [0, 1]"),
        });
    }
    Ok(pin_fraction)
}

/// The tables of `coll` on the tier, in tier order: their indices in `coll` (those placed `ssd`,
/// read through their row file, and those placed `remote`). Refuses a table of too many rows
/// for the tier's deduplication.
fn tier_tables(coll: &EmbeddingCollection) -> Result<Vec<usize>> {
    let mut tier = Vec::new();
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
        if placement == Placement::Remote || table.row_file().is_some() {
            tier.push(t);
        }
    }
    Ok(tier)
}

/// `opts` as the stager runs them: the pinned policy without a trace re-pins from live counts
/// every 64 batches unless told how often.
fn with_refresh(mut opts: TierOptions) -> TierOptions {
    if opts.policy == CachePolicy::Pinned && opts.pin_trace.is_none() && opts.refresh_batches == 0 {
        opts.refresh_batches = 64;
    }
    opts
}

/// The tier tables, their rows where `homes` says, each with its cache: the budget shared in
/// proportion to the tables' sizes, `pin_fraction` of a pinned cache held by its hot set, and
/// its staging slots.
fn tier_caches(homes: &[Home], opts: &TierOptions, pin_fraction: f64) -> Vec<TierTable> {
    let total: usize = homes.iter().map(|h| h.rows * h.row_bytes).sum();
    let live = opts.policy == CachePolicy::Pinned && opts.refresh_batches > 0;
    let mut tables = Vec::with_capacity(homes.len());
    for &Home {
        store,
        table,
        rows,
        row_bytes,
    } in homes
    {
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
        let reserve = opts
            .staging_rows
            .unwrap_or_else(|| staging_slots(capacity, rows))
            .min(rows);
        // Ids were checked against the table's rows: the cache may index them directly.
        let mut cache =
            RowCache::with_reserve(opts.policy, capacity, reserve, row_bytes).with_id_bound(rows);
        cache.set_track_hot(live);
        tables.push(TierTable {
            store,
            table,
            rows,
            row_bytes,
            cache,
            pin_rows,
            scratch: TableScratch::default(),
        });
    }
    tables
}

impl Stager {
    /// A stager for `coll`'s `ssd` and `remote` tables (it may have none: staging is then free),
    /// their stores opened as `opts` asks (`stores.rs`). The cache budget is shared by the tables
    /// in proportion to their sizes; pinned rows are read now.
    pub fn new(coll: &EmbeddingCollection, opts: TierOptions) -> Result<Self> {
        let pin_fraction = pin_fraction(&opts)?;
        let tier = tier_tables(coll)?;
        let Stores {
            stores,
            homes,
            follower,
            fill,
        } = open_stores(coll, &tier, &opts)?;
        let opts = with_refresh(opts);
        let tables = tier_caches(&homes, &opts, pin_fraction);
        let mut stager = Stager::assemble(coll, &tier, tables, stores, follower, opts);
        if let Some((store, index)) = fill {
            let f = Filler::start(store, index, stager.inner.clone(), stager.counters.clone())
                .map_err(|e| EmbedError::BadOption {
                    option: "pool_remote",
                    reason: format!("starting the cache's fill thread: {e}"),
                })?;
            stager.filler = Some(f);
        }
        stager.pin_from_trace()?;
        Ok(stager)
    }

    /// The stager of `coll`'s tier tables `tier` (their indices in `coll`; `tables`, their
    /// caches; `stores`, where their rows are), unpinned.
    fn assemble(
        coll: &EmbeddingCollection,
        tier: &[usize],
        tables: Vec<TierTable>,
        stores: Vec<TierStore>,
        follower: Option<Follower>,
        opts: TierOptions,
    ) -> Self {
        let mut by_table = vec![None; coll.tables().len()];
        for (d, &t) in tier.iter().enumerate() {
            by_table[t] = Some(d);
        }
        let mut features_of = vec![Vec::new(); tier.len()];
        for (f, feature) in coll.features().iter().enumerate() {
            if let Some(d) = by_table[feature.table] {
                features_of[d].push(f);
            }
        }
        Stager {
            recycler: Arc::default(),
            engines: stores.iter().map(|s| s.rows().engine()).collect(),
            direct: stores.iter().all(|s| s.rows().direct()),
            remote: stores.iter().any(|s| matches!(s, TierStore::Remote(_))),
            healthy: AtomicBool::new(true),
            fetch_samples: Mutex::default(),
            pooled: pooled_tables(&tables, &stores),
            filler: None,
            follower,
            inner: Arc::new(Mutex::new(Inner {
                tables,
                stores,
                misses: Vec::new(),
                requests: Vec::new(),
                update_gen: 0,
                in_coll: tier.to_vec(),
            })),
            collection: coll.id(),
            features_of,
            by_table,
            counters: Arc::default(),
            opts,
        }
    }

    /// Pins each tier table's rows most frequent in the options' trace (the pinned policy with a
    /// `pin_trace`; nothing otherwise).
    fn pin_from_trace(&self) -> Result<()> {
        let Some(trace) = &self.opts.pin_trace else {
            return Ok(());
        };
        if self.opts.policy != CachePolicy::Pinned {
            return Ok(());
        }
        let mut inner = self.lock();
        for d in 0..inner.tables.len() {
            let hot = hottest(trace, inner.tables[d].rows, inner.tables[d].pin_rows);
            inner.pin(d, &hot, &self.counters)?;
        }
        inner.publish_usage(&self.counters);
        Ok(())
    }

    /// The state behind the lock (a panic while it was held leaves it as it was).
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
    pub fn stage(&self, coll: &EmbeddingCollection, batch: CheckedView<'_>) -> Result<StagedBatch> {
        let t0 = Instant::now();
        let mut staged = StagedBatch::new(coll.features().len(), self.recycler.clone());
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
        if let Some(f) = &self.follower {
            inner.apply_updates(f, coll);
        }
        let counts = self.look_up(inner, coll, batch.get(), &mut staged);
        // Rows of features the cache could not hold entirely: (feature, its distinct rows).
        let mut overflow = Overflow::new();
        let mut io = Duration::ZERO;
        if self.pooled.contains(&true) {
            let parts = PoolingParts {
                pooled: &self.pooled,
                recycler: &self.recycler,
                counters: &self.counters,
                filler: self.filler.as_ref(),
            };
            let got = pool_misses(&parts, inner, coll, batch.get(), &mut staged, &mut overflow);
            let down = matches!(got, Err(EmbedError::StoreUnavailable { .. }));
            self.healthy.store(!down, Relaxed);
            io += got?;
        }
        io += self.fetch(inner, &mut staged, &mut overflow)?;
        self.complete(inner, &mut staged, &mut overflow);
        self.finish_batch(inner, counts, io)?;
        Counters::add_time(&self.counters.stage_ns, t0.elapsed());
        Ok(staged)
    }

    /// Looks the ids of batch `kj` up in every tier table's cache: fills `staged` with each tier
    /// feature's rows found (held in place), lists the rows to fetch in `inner.misses`, and
    /// returns what it counted.
    fn look_up(
        &self,
        inner: &mut Inner,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
        staged: &mut StagedBatch,
    ) -> Counts {
        inner.misses.clear();
        let released = self.recycler.take_released();
        let outs = self.stage_tables(inner, coll, kj, &released);
        for (_, held) in released {
            self.recycler.put_held(held);
        }
        let mut counts = Counts::default();
        for out in outs {
            counts.add(&out.counts);
            inner.misses.extend(out.misses);
            for (f, sf) in out.feats {
                // SAFETY: `lookup` held every evictable slot `sf` names for this batch (released
                // through the recycler when it is dropped) and took stable slots under the
                // pinned epoch `sf` keeps; the cache writes neither meanwhile.
                unsafe { staged.set_feature(f, sf) };
            }
        }
        counts
    }

    /// Stages each tier table's features for batch `kj` ([`stage_table`]), after giving back
    /// its slots in `released`. The tables are staged in parallel when the batch is large
    /// enough to pay for it (each table's cache is its own): the rows of a batch that misses
    /// nothing are ready sooner, and a pooler on many threads is not held back by one staging
    /// thread. The misses of every table are then fetched together, in one call per store.
    fn stage_tables(
        &self,
        inner: &mut Inner,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
        released: &[(usize, Vec<u32>)],
    ) -> Vec<TableStaged> {
        let tier_ids: usize = (0..coll.features().len())
            .filter(|&f| self.by_table[coll.features()[f].table].is_some())
            .map(|f| kj.feature_range(f).len())
            .sum();
        let stage = |(d, table): (usize, &mut TierTable)| {
            stage_table(d, table, &self.features_of[d], released, kj, &self.recycler)
        };
        let parallel = self.features_of.len() > 1
            && tier_ids >= PARALLEL_MIN_IDS
            && rayon::current_num_threads() > 1;
        if parallel {
            use rayon::prelude::*;
            inner.tables.par_iter_mut().enumerate().map(stage).collect()
        } else {
            inner.tables.iter_mut().enumerate().map(stage).collect()
        }
    }

    /// Fetches the batch's misses from their stores (one call per store), each row landed for
    /// `staged` ([`land_row`]; rows that found no slot in `overflow`), and records whether the
    /// remote store answered. Returns the time spent waiting for the stores.
    fn fetch(
        &self,
        inner: &mut Inner,
        staged: &mut StagedBatch,
        overflow: &mut Overflow,
    ) -> Result<Duration> {
        let recycler = &*self.recycler;
        let io = inner.fetch_misses(&self.counters, |m, row, table| {
            land_row(m, row, table, staged, overflow, recycler);
        });
        if self.remote {
            let down = matches!(io, Err(EmbedError::StoreUnavailable { .. }));
            self.healthy.store(!down, Relaxed);
        }
        io
    }

    /// Completes each tier feature of `staged` once its misses landed: every id pointed at its
    /// row's slot, or, for a feature with rows in `overflow`, its rows copied into one buffer.
    fn complete(&self, inner: &mut Inner, staged: &mut StagedBatch, overflow: &mut Overflow) {
        // SAFETY: a feature is completed with slots its misses landed in (held for the batch
        // by `land_row`) or turned into a compact buffer of its own; no slot is left unheld.
        for (f, sf) in unsafe { staged.features_mut() }.iter_mut().enumerate() {
            let Some(sf) = sf else { continue };
            let StagedRows::Slab { tier, .. } = sf.rows else {
                continue;
            };
            match overflow.iter_mut().find(|(g, _)| *g == f) {
                None if sf.absent => fill_slots(sf),
                None => {}
                Some((_, rows)) => {
                    let rows = std::mem::take(rows);
                    compact(sf, rows, &mut inner.tables[tier].cache, &self.recycler);
                }
            }
        }
    }

    /// Counts the batch (`counts`, and `io`, its wait for missing rows), re-pins the hottest
    /// rows every `refresh_batches` batches under the pinned policy, and publishes the caches'
    /// size.
    fn finish_batch(&self, inner: &mut Inner, counts: Counts, io: Duration) -> Result<()> {
        if !io.is_zero() {
            let mut samples = self.fetch_samples.lock().unwrap_or_else(|p| p.into_inner());
            if samples.len() < FETCH_SAMPLES {
                samples.push(io.as_secs_f32());
            }
        }
        let c = &self.counters;
        let batches = c.batches.fetch_add(1, Relaxed) + 1;
        c.lookups.fetch_add(counts.lookups, Relaxed);
        c.cache_lookups.fetch_add(counts.distinct, Relaxed);
        c.hits.fetch_add(counts.hits, Relaxed);
        c.misses.fetch_add(counts.distinct - counts.hits, Relaxed);
        c.lookup_hits.fetch_add(counts.lookup_hits, Relaxed);
        Counters::add_time(&c.io_ns, io);
        if self.opts.policy == CachePolicy::Pinned
            && self.opts.refresh_batches > 0
            && batches.is_multiple_of(self.opts.refresh_batches as u64)
        {
            self.refresh_pins(inner)?;
        }
        inner.publish_usage(c);
        Ok(())
    }

    /// Pins each tier table's hottest rows by its live access counts.
    fn refresh_pins(&self, inner: &mut Inner) -> Result<()> {
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
        Ok(())
    }

    /// Each batch's wait for its missing rows since the last call, seconds (batches that had
    /// misses only).
    pub fn take_fetch_samples(&self) -> Vec<f32> {
        std::mem::take(&mut *self.fetch_samples.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What following the remote tables' update streams did (`None`: not following).
    pub fn update_stats(&self) -> Option<UpdateStats> {
        self.follower.as_ref().map(Follower::stats)
    }

    /// Publish-to-applied lags of the updates applied since the last call, seconds.
    pub fn take_update_lags(&self) -> Vec<f32> {
        self.follower
            .as_ref()
            .map(Follower::take_lags)
            .unwrap_or_default()
    }

    /// Whether a table is read from a remote store.
    pub fn has_remote(&self) -> bool {
        self.remote
    }

    /// Whether the stores answered the last batch or probe (always true without a remote one).
    pub fn store_healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    /// Asks every remote store whether it answers now (its nodes; local files always do), and
    /// records the answer for [`Stager::store_healthy`].
    pub fn probe_stores(&self) -> Result<()> {
        let mut inner = self.lock();
        let r = inner.stores.iter_mut().try_for_each(|s| match s {
            TierStore::Remote(s) => s.probe(),
            TierStore::Local(_) => Ok(()),
        });
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
            .flat_map(|s| match s {
                TierStore::Remote(s) => s.node_stats(),
                TierStore::Local(_) => Vec::new(),
            })
            .collect()
    }

    /// Checks the caches' invariants (tests): budget, pinned residency, internal consistency.
    pub fn check_invariants(&self, budget: usize) {
        let inner = self.lock();
        let used: usize = inner.tables.iter().map(|d| d.cache.resident_bytes()).sum();
        assert!(used <= budget, "cache holds {used} bytes, budget {budget}");
        inner.tables.iter().for_each(|d| d.cache.check_invariants());
    }

    /// Cache and staging slots held by staged batches not yet dropped (tests).
    pub fn held_slots(&self) -> usize {
        let mut inner = self.lock();
        inner.apply_releases(&self.recycler);
        inner.tables.iter().map(|d| d.cache.held_slots()).sum()
    }

    /// Whether `row` of collection table `table` is pinned (tests).
    pub fn is_pinned(&self, table: usize, row: u64) -> bool {
        match self.by_table.get(table).copied().flatten() {
            Some(d) => self.lock().tables[d].cache.is_pinned(row),
            None => false,
        }
    }
}
