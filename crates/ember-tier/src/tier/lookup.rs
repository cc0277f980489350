//! Staging one tier table's features for a batch (a task of [`super::stager::Stager::stage`],
//! run in parallel across tables): give back the slots of dropped batches, look each id up in
//! the table's cache (which deduplicates the rows it holds), hold the rows found in place, and
//! list the distinct absent rows to fetch.

use super::inner::{Miss, TableScratch, TierTable};
use super::seen::SeenSlots;
use crate::cache::{Marked, RowCache};
use ember_embed::staged::{Recycler, STABLE_ROW, StagedFeature, StagedRows, ids_hash};
use ember_embed::{Ids, KeyedJagged, RowIndex};
use std::sync::Arc;

/// What pass 1 of staging a feature fills, per id and per distinct row.
struct PassOut<'a> {
    /// Distinct evictable rows met (slots, held after the pass), each id's position among them
    /// (or [`STABLE_ROW`], or a placeholder for an absent id), each id's slot (a placeholder
    /// for an absent one), and the absent ids (position among the feature's ids, id).
    held: &'a mut Vec<u32>,
    inverse: &'a mut Vec<u32>,
    slots: &'a mut Vec<u32>,
    absent: &'a mut Vec<(u32, u64)>,
    /// Stable slots met in this pass (see [`SeenSlots`]).
    seen: &'a mut SeenSlots,
}

/// Pass 1 of staging a feature (see [`stage_table`]): each of `ids` looked up in `cache` under
/// `mark`. The first time a resident evictable id is met, its slot is appended to `held`; a
/// stable id (pinned, or in a covering cache) is read where it is, unheld, and counted once
/// (its access recorded) the first time. Returns the distinct evictable hits, the ids that hit,
/// and the ids of stable rows.
fn mark_pass<I: RowIndex>(
    cache: &mut RowCache,
    ids: &[I],
    mark: u32,
    out: PassOut<'_>,
) -> (u64, u64, usize) {
    let PassOut {
        held,
        inverse,
        slots,
        absent,
        seen,
    } = out;
    inverse.reserve(ids.len());
    slots.reserve(ids.len());
    seen.prepare(cache.capacity(), ids.len());
    let records = cache.records_access();
    if cache.covers_ids() {
        return covered_pass(cache, ids, records, inverse, slots, absent, seen);
    }
    let (mut lookup_hits, mut stable) = (0u64, 0usize);
    for (k, &id) in ids.iter().enumerate() {
        if let Some(&ahead) = ids.get(k + 32) {
            cache.prefetch(ahead.idx() as u64);
        }
        if let Some(&ahead) = ids.get(k + 16) {
            cache.prefetch_record(ahead.idx() as u64);
        }
        let id = id.idx() as u64;
        match cache.find_marked(id, mark, held.len() as u32) {
            Marked::Stable(slot) => {
                inverse.push(STABLE_ROW);
                slots.push(slot);
                stable += 1;
                // `&`, not `&&`: no branch on whether the slot is new (unpredictable).
                if seen.insert(slot) & records {
                    cache.record_access(id);
                }
            }
            Marked::First(slot) => {
                inverse.push(held.len() as u32);
                slots.push(slot);
                held.push(slot);
                lookup_hits += 1;
            }
            Marked::Again(pos) => {
                inverse.push(pos);
                slots.push(held[pos as usize]);
                lookup_hits += 1;
            }
            Marked::Absent => {
                inverse.push(u32::MAX);
                slots.push(u32::MAX);
                absent.push((k as u32, id));
            }
        }
    }
    (held.len() as u64, lookup_hits + stable as u64, stable)
}

/// [`mark_pass`] for a cache that covers every id: id `i` is in slot `i` when resident, and
/// every resident row is stable, so one bit per id answers the lookup (no map, no record).
fn covered_pass<I: RowIndex>(
    cache: &mut RowCache,
    ids: &[I],
    records: bool,
    inverse: &mut Vec<u32>,
    slots: &mut Vec<u32>,
    absent: &mut Vec<(u32, u64)>,
    seen: &mut SeenSlots,
) -> (u64, u64, usize) {
    let mut stable = 0usize;
    for (k, &id) in ids.iter().enumerate() {
        // The two bits of an id 16 ahead: the bitsets are read at random, and outgrow the
        // nearest caches across tables.
        if let Some(&ahead) = ids.get(k + 16) {
            cache.prefetch_stable(ahead.idx() as u64);
            seen.prefetch(ahead.idx() as u32);
        }
        let id = id.idx() as u64;
        match cache.stable_slot(id) {
            Some(slot) => {
                inverse.push(STABLE_ROW);
                slots.push(slot);
                stable += 1;
                if seen.insert(slot) & records {
                    cache.record_access(id);
                }
            }
            None => {
                inverse.push(u32::MAX);
                slots.push(u32::MAX);
                absent.push((k as u32, id));
            }
        }
    }
    (0, stable as u64, stable)
}

/// Tier ids in a batch from which its tables are staged in parallel.
pub(super) const PARALLEL_MIN_IDS: usize = 4096;

/// What staging tier tables counted.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    /// Ids looked up.
    pub(super) lookups: u64,
    /// Distinct rows per feature, and those found in the cache.
    pub(super) distinct: u64,
    pub(super) hits: u64,
    /// Ids whose row was found in the cache.
    pub(super) lookup_hits: u64,
}

impl Counts {
    /// Adds `other`'s counts to these.
    pub(super) fn add(&mut self, other: &Counts) {
        self.lookups += other.lookups;
        self.distinct += other.distinct;
        self.hits += other.hits;
        self.lookup_hits += other.lookup_hits;
    }
}

/// What staging one tier table's features produced.
pub(super) struct TableStaged {
    pub(super) feats: Vec<(usize, StagedFeature)>,
    pub(super) misses: Vec<Miss>,
    pub(super) counts: Counts,
}

/// Stages the features `features` of tier table `d` for batch `kj`, after giving back the slots
/// of this table in `released` (see [`super::Stager::stage`]): each feature's resident rows held
/// in place, its absent rows listed as misses to fetch.
pub(super) fn stage_table(
    d: usize,
    table: &mut TierTable,
    features: &[usize],
    released: &[(usize, Vec<u32>)],
    kj: &KeyedJagged,
    recycler: &Arc<Recycler>,
) -> TableStaged {
    let mut out = TableStaged {
        feats: Vec::with_capacity(features.len()),
        misses: Vec::new(),
        counts: Counts::default(),
    };
    for (_, held) in released.iter().filter(|(t, _)| *t == d) {
        table.release_all(held);
    }
    table.cache.reap_pins();
    for &f in features {
        let range = kj.feature_range(f);
        let mut inverse = recycler.take_inverse();
        let mut held = recycler.take_inverse();
        let mut slots = recycler.take_inverse();
        // Pass 1, over the feature's ids: the cache's own index deduplicates them (each
        // resident row's record remembers its position among the distinct rows), so no hash
        // table is built for the hits. Each id's map entry is prefetched 32 ids ahead and its
        // record 16 ahead. Absent ids are set aside, deduplicated after.
        let mark = table.cache.next_mark();
        let scratch = &mut table.scratch;
        scratch.absent.clear();
        let pass = PassOut {
            held: &mut held,
            inverse: &mut inverse,
            slots: &mut slots,
            absent: &mut scratch.absent,
            seen: &mut scratch.seen,
        };
        let (hits, lookup_hits, stable) = match kj.ids() {
            Ids::U32(v) => mark_pass(&mut table.cache, &v[range.clone()], mark, pass),
            Ids::I64(v) => mark_pass(&mut table.cache, &v[range.clone()], mark, pass),
        };
        let stable_rows = scratch.seen.len();
        scratch.seen.clear();
        out.counts.hits += hits + stable_rows as u64;
        out.counts.distinct += stable_rows as u64;
        out.counts.lookup_hits += lookup_hits;
        hold_all(&mut table.cache, &held);
        let absent = !table.scratch.absent.is_empty();
        if absent {
            list_absent(d, f, table, &mut held, &mut inverse, &mut out.misses);
        }
        let n = held.len();
        out.counts.lookups += range.len() as u64;
        out.counts.distinct += n as u64;
        out.feats.push((
            f,
            StagedFeature {
                rows: StagedRows::Slab {
                    slab: table.cache.slab().clone(),
                    tier: d,
                    held,
                    slots,
                    pins: (stable > 0).then(|| table.cache.pin_epoch()),
                },
                inverse,
                stable,
                absent,
                start: range.start,
                n_rows: n,
                stride: table.row_bytes,
                ids_hash: ids_hash(kj.ids(), range.clone()),
                remote: None,
            },
        ));
    }
    out
}

/// Pass 2 of staging a feature, over its distinct hits `held`: the holds (each slot's record
/// prefetched 32 slots ahead and, under LRU, its list neighbours 16 ahead).
fn hold_all(cache: &mut RowCache, held: &[u32]) {
    for (i, &slot) in held.iter().enumerate() {
        if let Some(&ahead) = held.get(i + 32) {
            cache.prefetch_release(ahead);
        }
        if let Some(&ahead) = held.get(i + 16) {
            cache.prefetch_neighbours(ahead);
        }
        cache.hold(slot);
    }
}

/// The ids of feature `f` of tier table `d` that pass 1 found absent (`table.scratch.absent`):
/// the distinct ones placed after the distinct hits `held` (a placeholder slot each, the
/// feature's `inverse` pointed at them), each listed once in `misses` to fetch and its access
/// recorded once, as for the hits.
fn list_absent(
    d: usize,
    f: usize,
    table: &mut TierTable,
    held: &mut Vec<u32>,
    inverse: &mut [u32],
    misses: &mut Vec<Miss>,
) {
    let TableScratch {
        dedup,
        absent,
        absent_ids,
        ..
    } = &mut table.scratch;
    // Tier tables have fewer than u32::MAX rows (checked by `tier_tables` in `stager.rs`).
    absent_ids.clear();
    absent_ids.extend(absent.iter().map(|&(_, id)| id as u32));
    dedup.build(absent_ids);
    let base = held.len();
    for (&(at, _), &u) in absent.iter().zip(&dedup.inverse) {
        inverse[at as usize] = (base + u as usize) as u32;
    }
    for (u, &id) in dedup.uniq.iter().enumerate() {
        let _ = table.cache.find(id as u64);
        held.push(u32::MAX);
        misses.push(Miss {
            tier: d,
            id,
            feature: f,
            slot: base + u,
        });
    }
}
