//! The stager's state behind its lock: the tier tables (store, cache), the stores (as
//! `stores.rs` made them), the scratch of one batch; and the steps it repeats: applying row
//! updates, fetching a batch's missing rows from their stores, giving back the slots of dropped
//! batches, publishing the caches' size.

use super::follow::{Follower, Target};
use super::seen::SeenSlots;
use super::stats::Counters;
use super::stores::TierStore;
use crate::cache::{RowCache, Updated};
use crate::storage::RowRequest;
use crate::storage::updates::Polled;
use ember_embed::EmbeddingCollection;
use ember_embed::Result;
use ember_embed::dedup::DedupScratch;
use ember_embed::staged::Recycler;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// A table of the collection on the tier: where its rows come from, and its cache.
#[derive(Debug)]
pub(super) struct TierTable {
    /// Its store, and its index among that store's tables.
    pub(super) store: usize,
    pub(super) table: usize,
    pub(super) rows: usize,
    pub(super) row_bytes: usize,
    pub(super) cache: RowCache,
    /// Rows the pinned set holds at most.
    pub(super) pin_rows: usize,
    /// Scratch of the feature being staged.
    pub(super) scratch: TableScratch,
}

/// Scratch of one tier table's staging, reused across batches.
#[derive(Debug, Default)]
pub(super) struct TableScratch {
    pub(super) dedup: DedupScratch,
    /// The feature's ids absent from the cache (position among the feature's ids, id), and
    /// those ids alone (to deduplicate).
    pub(super) absent: Vec<(u32, u64)>,
    pub(super) absent_ids: Vec<u32>,
    /// The distinct pinned rows met.
    pub(super) seen: SeenSlots,
}

impl TierTable {
    /// Gives back one hold of each slot in `held` (entries `u32::MAX` name no slot), prefetching
    /// ahead.
    pub(super) fn release_all(&mut self, held: &[u32]) {
        for (i, &slot) in held.iter().enumerate() {
            if let Some(&ahead) = held.get(i + 16)
                && ahead != u32::MAX
            {
                self.cache.prefetch_release(ahead);
            }
            if slot != u32::MAX {
                self.cache.release(slot);
            }
        }
    }
}

/// A row to fetch: of tier table `tier`, for distinct row `slot` of feature `feature`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Miss {
    pub(super) tier: usize,
    pub(super) id: usize,
    pub(super) feature: usize,
    pub(super) slot: usize,
}

/// The requests of the misses whose table's store is `store`, each tagged with its index in
/// `misses`.
pub(super) fn miss_requests<'a>(
    tables: &'a [TierTable],
    misses: &'a [Miss],
    store: usize,
) -> impl Iterator<Item = RowRequest> + 'a {
    misses
        .iter()
        .enumerate()
        .filter(move |(_, m)| tables[m.tier].store == store)
        .map(|(i, m)| RowRequest {
            table: tables[m.tier].table,
            row: m.id,
            tag: i,
        })
}

/// What the stager's lock guards.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) tables: Vec<TierTable>,
    pub(super) stores: Vec<TierStore>,
    pub(super) misses: Vec<Miss>,
    /// The requests of one store's call.
    pub(super) requests: Vec<RowRequest>,
    /// Bumped whenever row updates are applied to the caches (`fill.rs` drops rows read
    /// across one).
    pub(super) update_gen: u64,
    /// Each tier table's index in the collection (whose tables' logs of updates say which
    /// rows changed).
    pub(super) in_coll: Vec<usize>,
}

/// Staging slots of a tier table's cache: rows of batches in flight that the policy did not keep
/// (an eighth of the cache, at least 4096 and at most 65536 rows, never more than the table).
pub(super) fn staging_slots(capacity: usize, rows: usize) -> usize {
    (capacity / 8).clamp(4096, 65536).min(rows)
}

impl Inner {
    /// Gives back the cache slots of the batches dropped since the last call (and the pinned
    /// slots held for them).
    pub(super) fn apply_releases(&mut self, recycler: &Recycler) {
        for (d, held) in recycler.take_released() {
            self.tables[d].release_all(&held);
            recycler.put_held(held);
        }
        for t in &mut self.tables {
            t.cache.reap_pins();
        }
    }

    /// Applies the updates `f` queued (see `follow.rs`): each row to its table's cache, a
    /// trimmed stream by dropping the table's cache; then a new epoch for each table touched.
    pub(super) fn apply_updates(&mut self, f: &Follower, coll: &EmbeddingCollection) {
        let polled = f.drain();
        if polled.is_empty() {
            return;
        }
        self.update_gen += 1;
        let mut touched = vec![false; self.tables.len()];
        let in_coll = self.in_coll.clone();
        let log = |d: usize| in_coll.get(d).map(|&t| coll.tables()[t].updates());
        for p in polled {
            match p {
                Polled::Rows {
                    table,
                    ids,
                    rows,
                    published_ms,
                    ..
                } => {
                    let d = match f.targets[table] {
                        Target::Cache(d) => d,
                        Target::Dram(t) => {
                            // Checked against the table's shape when the entry was read.
                            let wrote = coll.tables()[t].write_rows(&ids, &rows);
                            debug_assert!(wrote.is_ok(), "{wrote:?}");
                            match published_ms {
                                0 => f.reloaded(ids.len() as u64),
                                _ => f.applied(ids.len() as u64, 0, published_ms),
                            }
                            continue;
                        }
                    };
                    let t = &mut self.tables[d];
                    let (mut applied, mut absent) = (0, 0);
                    for (&id, row) in ids.iter().zip(rows.chunks_exact(t.row_bytes)) {
                        match t.cache.update(id, row) {
                            Updated::Absent => absent += 1,
                            Updated::InPlace | Updated::Dropped => applied += 1,
                        }
                    }
                    // A store's own copy of the rows (`--remote-fallback`) keeps them too.
                    if let TierStore::Remote(s) = &mut self.stores[t.store] {
                        s.updated(t.table, &ids, &rows);
                    }
                    if let Some(log) = log(d) {
                        log.wrote(&ids);
                    }
                    touched[d] = true;
                    f.applied(applied, absent, published_ms);
                }
                Polled::Reset { table, now_at } => {
                    // A live table is read again by the update thread (its rows follow).
                    if let Target::Cache(d) = f.targets[table] {
                        if let Some(log) = log(d) {
                            log.reset();
                        }
                        let t = &mut self.tables[d];
                        t.cache.drop_all();
                        if let TierStore::Remote(s) = &mut self.stores[t.store] {
                            s.missed_updates(
                                t.table,
                                "its update stream was trimmed past this server, so updates \
                                 were missed",
                            );
                        }
                    }
                    f.reset(table, now_at);
                }
                Polled::Bad {
                    table,
                    entry,
                    reason,
                } => f.bad(table, entry, &reason),
            }
        }
        for (t, touched) in self.tables.iter_mut().zip(touched) {
            if touched {
                t.cache.end_updates();
            }
        }
    }

    /// Stores the caches' current size in the counters' gauges.
    pub(super) fn publish_usage(&self, counters: &Counters) {
        let (bytes, rows) = self.tables.iter().fold((0, 0), |(b, r), d| {
            (b + d.cache.resident_bytes(), r + d.cache.len())
        });
        counters.cache_bytes.store(bytes as u64, Relaxed);
        counters.cache_rows.store(rows as u64, Relaxed);
    }

    /// Fetches every row in `self.misses` from its table's store (one call per store) and hands
    /// each to `land`. Returns the time spent waiting for the stores.
    pub(super) fn fetch_misses(
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
            requests.extend(miss_requests(tables, misses, s));
            if requests.is_empty() {
                continue;
            }
            let st = store.rows_mut().read(requests, &mut |r, row| {
                let m = &misses[r.tag];
                land(m, row, &mut tables[m.tier]);
            })?;
            counters.store_reads.fetch_add(st.reads, Relaxed);
            counters.store_bytes_read.fetch_add(st.bytes, Relaxed);
            waited += st.wait;
        }
        Ok(waited)
    }
}
