//! Staging one tier table's features for a batch (a task of [`super::stager::Stager::stage`],
//! run in parallel across tables): give back the slots of dropped batches, look each id up in
//! the table's cache (which deduplicates the rows it holds), hold the rows found in place, and
//! list the distinct absent rows to fetch.

use super::inner::{Miss, TableScratch, TierTable};
use super::staged::{Recycler, StagedFeature, StagedRows, ids_hash};
use crate::cache::{Marked, RowCache};
use crate::jagged::{Ids, KeyedJagged, RowIndex};
use std::sync::Arc;

/// Pass 1 of staging a feature (see [`stage_table`]): each of `ids` looked up in `cache` under
/// `mark`. The first time a resident id is met, its slot is appended to `held`; every id's
/// position among the distinct rows is appended to `inverse` (absent ids get a placeholder, and
/// their position in `ids` and id go to `absent`). Returns the distinct hits and the ids that hit.
fn mark_pass<I: RowIndex>(
    cache: &mut RowCache,
    ids: &[I],
    mark: u32,
    held: &mut Vec<u32>,
    inverse: &mut Vec<u32>,
    absent: &mut Vec<(u32, u64)>,
) -> (u64, u64) {
    inverse.reserve(ids.len());
    let mut lookup_hits = 0u64;
    for (k, &id) in ids.iter().enumerate() {
        if let Some(&ahead) = ids.get(k + 32) {
            cache.prefetch(ahead.idx() as u64);
        }
        if let Some(&ahead) = ids.get(k + 16) {
            cache.prefetch_record(ahead.idx() as u64);
        }
        let id = id.idx() as u64;
        match cache.find_marked(id, mark, held.len() as u32) {
            Marked::First(slot) => {
                inverse.push(held.len() as u32);
                held.push(slot);
                lookup_hits += 1;
            }
            Marked::Again(pos) => {
                inverse.push(pos);
                lookup_hits += 1;
            }
            Marked::Absent => {
                inverse.push(u32::MAX);
                absent.push((k as u32, id));
            }
        }
    }
    (held.len() as u64, lookup_hits)
}

/// Tier ids in a batch from which its tables are staged in parallel.
pub(super) const PARALLEL_MIN_IDS: usize = 4096;

/// What staging one tier table's features produced.
pub(super) struct TableStaged {
    pub(super) feats: Vec<(usize, StagedFeature)>,
    pub(super) misses: Vec<Miss>,
    pub(super) lookups: u64,
    pub(super) distinct: u64,
    pub(super) hits: u64,
    pub(super) lookup_hits: u64,
}

/// Stages the features `features` of tier table `d` for batch `kj`, after giving back the slots
/// of this table in `released` (see [`Stager::stage`]): each feature's resident rows held in
/// place, its absent rows listed as misses to fetch.
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
        lookups: 0,
        distinct: 0,
        hits: 0,
        lookup_hits: 0,
    };
    for (_, held) in released.iter().filter(|(t, _)| *t == d) {
        table.release_all(held);
    }
    for &f in features {
        let range = kj.feature_range(f);
        let mut inverse = recycler.take_inverse();
        let mut held = recycler.take_inverse();
        // Pass 1, over the feature's ids: the cache's own index deduplicates them (each
        // resident row's record remembers its position among the distinct rows), so no hash
        // table is built for the hits. Each id's map entry is prefetched 32 ids ahead and its
        // record 16 ahead. Absent ids are set aside, deduplicated after.
        let mark = table.cache.next_mark();
        let TableScratch {
            dedup,
            absent,
            absent_ids,
        } = &mut table.scratch;
        absent.clear();
        let (hits, lookup_hits) = match kj.ids() {
            Ids::U32(v) => mark_pass(
                &mut table.cache,
                &v[range.clone()],
                mark,
                &mut held,
                &mut inverse,
                absent,
            ),
            Ids::I64(v) => mark_pass(
                &mut table.cache,
                &v[range.clone()],
                mark,
                &mut held,
                &mut inverse,
                absent,
            ),
        };
        out.hits += hits;
        out.lookup_hits += lookup_hits;
        // Pass 2, over the distinct hits: the holds (each slot's record 32 slots ahead and,
        // under LRU, its list neighbours 16 ahead).
        for i in 0..held.len() {
            if let Some(&ahead) = held.get(i + 32) {
                table.cache.prefetch_release(ahead);
            }
            if let Some(&ahead) = held.get(i + 16) {
                table.cache.prefetch_neighbours(ahead);
            }
            table.cache.hold(held[i]);
        }
        // The absent ids: distinct ones after the hits, each fetched once.
        if !absent.is_empty() {
            // Tier tables have fewer than u32::MAX rows (checked in `Stager::new`).
            absent_ids.clear();
            absent_ids.extend(absent.iter().map(|&(_, id)| id as u32));
            dedup.build(absent_ids);
            let base = held.len();
            for (&(at, _), &u) in absent.iter().zip(&dedup.inverse) {
                inverse[at as usize] = (base + u as usize) as u32;
            }
            for (u, &id) in dedup.uniq.iter().enumerate() {
                // Records the access of each distinct absent id once, as for the hits.
                let _ = table.cache.find(id as u64);
                held.push(u32::MAX);
                out.misses.push(Miss {
                    tier: d,
                    id,
                    feature: f,
                    slot: base + u,
                });
            }
        }
        let n = held.len();
        out.lookups += range.len() as u64;
        out.distinct += n as u64;
        out.feats.push((
            f,
            StagedFeature {
                rows: StagedRows::Slab {
                    slab: table.cache.slab().clone(),
                    tier: d,
                    held,
                    slots: recycler.take_inverse(),
                },
                inverse,
                start: range.start,
                n_rows: n,
                stride: table.row_bytes,
                ids_hash: ids_hash(kj.ids(), range.clone()),
            },
        ));
    }
    out
}
