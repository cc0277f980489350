//! The [`Stager`]: for each batch, every tier feature's distinct ids (deduplicated once per
//! batch), the cached rows held where they lie in the cache's slab, every missing row of every
//! tier table fetched from its store in one call per store and admitted to the cache (or, when
//! the policy does not keep it, lent a staging slot), and a [`StagedBatch`] returned that pools
//! every row in place and releases its slots when dropped. A feature whose rows the cache cannot
//! all hold (every slot held or pinned, the staging slots all lent) is copied into a buffer of
//! its own instead: the same result, one copy more. The pinned
//! policy's hot set is loaded here too (from a trace at start, from live counts every
//! `refresh_batches` batches).

use super::follow::{Follower, UpdateStats};
use super::inner::{Inner, TableScratch, TierTable, staging_slots};
use super::live::{follow, live_tables};
use super::lookup::{PARALLEL_MIN_IDS, TableStaged, copy_stable, stage_table};
use super::options::TierOptions;
use super::pinning::hottest;
use super::staged::{Recycler, StagedBatch, StagedFeature, StagedRows};
use super::stats::{Counters, TierStats};
use crate::cache::{CachePolicy, RowCache};
use crate::collection::{CollectionId, EmbeddingCollection, ValidatedBatch};
use crate::dedup::DedupScratch;
use crate::error::{EmbedError, Result};
use crate::storage::remote::{self, RedisStore, RemoteTableSpec, WithLocalCopy};
use crate::storage::updates::FollowedTable;
use crate::storage::{RowStore, open_row_files};
use crate::table::Placement;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// For each tier table, the collection's features that look it up.
    features_of: Vec<Vec<usize>>,
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
    /// The remote tables' update streams, followed (declared last: its thread stops first).
    follower: Option<Follower>,
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
        // Local row-file copies of the remote tables (all of them or none).
        let mut copies = Vec::new();
        // The tier table of each remote table.
        let mut remote_tier = Vec::new();
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
                    remote_tier.push(shapes.len() - 1);
                    if let Some(copy) = table.row_file() {
                        copies.push(copy.clone());
                    }
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
        let mut follower = None;
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
            let mut store = Box::new(RedisStore::open(src, &remote)?);
            // Before any row is read (the pinned set below): no update published from here on
            // is missed.
            if opts.follow_updates {
                let followed = remote
                    .iter()
                    .zip(&remote_tier)
                    .map(|(t, &d)| FollowedTable {
                        name: t.name.clone(),
                        rows: t.rows,
                        row_bytes: shapes[d].3,
                    })
                    .collect();
                let (in_coll, live) = live_tables(coll);
                let opened = remote::open_source(src, store.version(), followed, &live)?;
                follower = Some(follow(coll, opened, &remote_tier, &in_coll)?);
            }
            match copies.len() {
                0 => stores.push(store),
                n if n == remote.len() => {
                    let local = open_row_files(copies, opts.io, opts.queue_depth)?;
                    let retry = src.cluster.down_for;
                    // After the stream positions: an update is in these sets or followed.
                    let updated = store.updated_blocks()?;
                    let names = remote.iter().map(|t| t.name.clone()).collect();
                    let copy = WithLocalCopy::new(store, local, retry);
                    let copy = copy.with_updated_blocks(&src.model, names, updated);
                    stores.push(Box::new(copy));
                }
                n => {
                    return Err(EmbedError::BadOption {
                        option: "fallback_local",
                        reason: format!(
                            "{n} of the {} remote tables have a local copy: all or none must",
                            remote.len()
                        ),
                    });
                }
            }
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
            let reserve = opts
                .staging_rows
                .unwrap_or_else(|| staging_slots(capacity, rows))
                .min(rows);
            // Ids were checked against the table's rows: the cache may index them directly.
            let mut cache = RowCache::with_reserve(opts.policy, capacity, reserve, row_bytes)
                .with_id_bound(rows);
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
        let stager = Stager {
            recycler: Arc::default(),
            engines: stores.iter().map(|s| s.engine()).collect(),
            direct: stores.iter().all(|s| s.direct()),
            remote: stores.iter().any(|s| s.remote()),
            healthy: AtomicBool::new(true),
            fetch_samples: Mutex::default(),
            follower,
            inner: Mutex::new(Inner {
                tables,
                stores,
                misses: Vec::new(),
                requests: Vec::new(),
            }),
            collection: coll.id(),
            features_of: {
                let mut of = vec![Vec::new(); by_table.iter().flatten().count()];
                for (f, feature) in coll.features().iter().enumerate() {
                    if let Some(d) = by_table[feature.table] {
                        of[d].push(f);
                    }
                }
                of
            },
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
        if let Some(f) = &self.follower {
            inner.apply_updates(f, coll);
        }
        inner.misses.clear();
        // The tier tables are staged in parallel when the batch is large enough to pay for it
        // (each table's cache is its own): the rows of a batch that misses nothing are ready
        // sooner, and a pooler on many threads is not held back by one staging thread. The
        // misses of every table are then fetched together, in one call per store.
        let released = self.recycler.take_released();
        let tier_ids: usize = (0..nf)
            .filter(|&f| self.by_table[coll.features()[f].table].is_some())
            .map(|f| kj.feature_range(f).len())
            .sum();
        let stage_table = |(d, table): (usize, &mut TierTable)| {
            stage_table(
                d,
                table,
                &self.features_of[d],
                &released,
                kj,
                &self.recycler,
            )
        };
        let parallel = self.features_of.len() > 1
            && tier_ids >= PARALLEL_MIN_IDS
            && rayon::current_num_threads() > 1;
        let outs: Vec<TableStaged> = if parallel {
            use rayon::prelude::*;
            inner
                .tables
                .par_iter_mut()
                .enumerate()
                .map(stage_table)
                .collect()
        } else {
            inner
                .tables
                .iter_mut()
                .enumerate()
                .map(stage_table)
                .collect()
        };
        for (_, held) in released {
            self.recycler.put_held(held);
        }
        let (mut lookups, mut distinct, mut hits, mut lookup_hits) = (0u64, 0u64, 0u64, 0u64);
        for out in outs {
            lookups += out.lookups;
            distinct += out.distinct;
            hits += out.hits;
            lookup_hits += out.lookup_hits;
            inner.misses.extend(out.misses);
            for (f, sf) in out.feats {
                staged.feats[f] = Some(sf);
            }
        }
        // Rows of features the cache could not hold entirely: (feature, its distinct rows).
        let mut overflow: Vec<(usize, Vec<u8>)> = Vec::new();
        let io = inner.fetch_misses(&self.counters, |m, row, table| {
            let Some(StagedFeature {
                rows: StagedRows::Slab { held, .. },
                ..
            }) = staged.feats[m.feature].as_mut()
            else {
                return;
            };
            let slot = table
                .cache
                .insert_held(m.id as u64, row)
                .or_else(|| table.cache.hold_staging(row));
            match slot {
                Some(slot) => held[m.slot] = slot,
                None => {
                    let rb = row.len();
                    let k = match overflow.iter().position(|(f, _)| *f == m.feature) {
                        Some(k) => k,
                        None => {
                            overflow.push((m.feature, self.recycler.take_rows(held.len() * rb)));
                            overflow.len() - 1
                        }
                    };
                    overflow[k].1[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row);
                }
            }
        });
        if self.remote {
            let down = matches!(io, Err(EmbedError::StoreUnavailable { .. }));
            self.healthy.store(!down, Relaxed);
        }
        let io = io?;
        for (f, sf) in staged.feats.iter_mut().enumerate() {
            let Some(sf) = sf else { continue };
            let StagedRows::Slab {
                held, tier, slots, ..
            } = &mut sf.rows
            else {
                continue;
            };
            match overflow.iter().position(|(g, _)| *g == f) {
                None if sf.absent => {
                    // Every row has a slot now: the fetched rows' slots, for pooling straight
                    // from the slab.
                    for (s, &x) in slots.iter_mut().zip(&sf.inverse) {
                        if *s == u32::MAX {
                            *s = held[x as usize];
                        }
                    }
                }
                None => {}
                Some(k) => {
                    // Copy the held rows beside the ones that found no slot, and let go of the
                    // slots at once.
                    let mut rows = std::mem::take(&mut overflow[k].1);
                    let cache = &mut inner.tables[*tier].cache;
                    let rb = sf.stride;
                    for (i, &slot) in held.iter().enumerate() {
                        if slot != u32::MAX {
                            rows[i * rb..(i + 1) * rb].copy_from_slice(cache.slot_row(slot));
                            cache.release(slot);
                        }
                    }
                    self.recycler.put_held(std::mem::take(held));
                    let slots = std::mem::take(slots);
                    copy_stable(sf, &slots, &mut rows, cache);
                    self.recycler.put(Vec::new(), slots);
                    sf.rows = StagedRows::Compact(rows);
                }
            }
        }
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
