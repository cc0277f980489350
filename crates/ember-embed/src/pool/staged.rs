//! Pooling a unit of a table on the tier, from what the stager staged for its batch: rows held
//! in place in a cache's slab (read through each id's slot), or a compact buffer of the batch's
//! own (read through the inverse index).

use super::{Dedup, PoolStats, Pooler, Rows, Segment};
use crate::dedup::DedupScratch;
use crate::jagged::RowIndex;
use crate::staged::{StagedFeature, StagedRows};

/// Where a unit of a table on the tier sits in what was staged: ids `local` of the staged
/// feature `sf` (feature `feature` of the collection); `whole` when the unit is the whole
/// feature.
pub(super) struct StagedUnit<'a> {
    pub sf: &'a StagedFeature,
    pub local: std::ops::Range<usize>,
    pub feature: usize,
    pub whole: bool,
}

impl Pooler {
    /// Pools the unit `direct`, placed as `unit` says, from the staged rows.
    pub(super) fn run_staged_unit<I: RowIndex>(
        &self,
        direct: &Segment<'_, I>,
        unit: StagedUnit<'_>,
        scratch: &mut DedupScratch,
        stats: &mut PoolStats,
    ) {
        let StagedUnit {
            sf,
            local,
            feature: f,
            whole,
        } = unit;
        let n = local.len();
        let stride = direct.stride;
        let inverse = &sf.inverse[local.clone()];
        let (slab, held, slots) = match &sf.rows {
            StagedRows::Slab {
                slab, held, slots, ..
            } => (slab, held, &slots[local]),
            // The compact rows are cache-resident: no prefetch.
            StagedRows::Compact(rows) => {
                return self.kernel(&direct.over(Rows::of(rows), inverse, 0));
            }
        };
        // SAFETY: the stager took `held` and `slots` from slots this batch holds until it is
        // dropped (after this call), or from stable slots (pinned, or of a cache that covers
        // every id) of the epoch the batch keeps, and the cache writes neither; the batch's
        // `Arc` keeps the slab alive.
        let rows = unsafe { Rows::of_slab(slab) };
        // Where the stager deduplicated the whole feature (no stable row), its distinct rows are
        // known: gather them once into the thread's compact buffer where that pays. Stable rows
        // are not deduplicated by the stager (that would cost it a write per id): the unit's
        // slots are then deduplicated here, as a table in memory deduplicates its ids. Else each
        // id is pooled from its slot, prefetching as for a table.
        let known = sf.stable == 0;
        let may = n > 0 && (whole || !known);
        let (dedup, timed) = match self.opts.dedup {
            Dedup::Off => (false, false),
            Dedup::On => (may, false),
            Dedup::Auto if may && known => self.auto.choose(f, || held.len() * 100 < n * 85),
            Dedup::Auto if may => self.auto.choose(f, || scratch.shows_reuse(slots)),
            Dedup::Auto => (false, false),
        };
        let start = timed.then(std::time::Instant::now);
        if dedup {
            let distinct = if known {
                gather_slots(rows, held, stride, direct.prefetch, &mut scratch.rows);
                held.len()
            } else {
                scratch.build(slots);
                let uniq = &scratch.uniq;
                gather_slots(rows, uniq, stride, direct.prefetch, &mut scratch.rows);
                uniq.len()
            };
            let inverse = if known { inverse } else { &scratch.inverse };
            stats.deduped_units += 1;
            stats.deduped_lookups += n;
            stats.unique_rows += distinct;
            self.kernel(&direct.over(Rows::of(&scratch.rows), inverse, 0));
        } else {
            self.kernel(&direct.over(rows, slots, direct.prefetch));
        }
        if let Some(t) = start {
            self.auto
                .record(f, dedup, t.elapsed().as_nanos() as f64 / n as f64);
        }
    }
}

/// Copies the rows of `held` (slots of `rows`) into `out`, one after another, prefetching ahead.
fn gather_slots<J: RowIndex>(
    rows: Rows<'_>,
    held: &[J],
    stride: usize,
    prefetch: usize,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.resize(held.len() * stride, 0);
    for (u, dst) in out.chunks_exact_mut(stride).enumerate() {
        if prefetch > 0
            && let Some(&ahead) = held.get(u + prefetch)
        {
            crate::prefetch::prefetch_span(
                rows.as_ptr().wrapping_add(ahead.idx() * stride),
                stride,
            );
        }
        // SAFETY: `held` are slots the batch holds or stable slots of its epoch (the caller's
        // contract with `rows`), which nothing writes while it lives.
        dst.copy_from_slice(unsafe { rows.bytes(held[u].idx() * stride, stride) });
    }
}
