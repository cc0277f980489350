//! Pooling a unit of a table in memory: directly from the table's rows, or from the distinct
//! rows gathered once into the thread's compact buffer (dedup); timed where `auto` chooses the
//! dedup or the prefetch distance by measurement.

use super::{Dedup, PoolStats, Pooler, Rows, Segment};
use crate::dedup::DedupScratch;
use crate::jagged::RowIndex;

/// How a unit in memory runs: deduplicated or not, timed for `auto`'s dedup choice or not,
/// and the prefetch candidate its time is recorded for (`None`: not timed for the distance).
#[derive(Debug, Clone, Copy)]
pub(super) struct UnitChoice {
    pub(super) dedup: bool,
    pub(super) timed: bool,
    pub(super) candidate: Option<usize>,
}

impl Pooler {
    /// Whether feature `f`'s unit of `ids` over a table of `n_rows` rows is deduplicated, and
    /// whether it is timed for `auto`'s choice.
    #[inline]
    pub(super) fn dedup_choice<I: RowIndex>(
        &self,
        f: usize,
        ids: &[I],
        n_rows: usize,
        scratch: &mut DedupScratch,
    ) -> (bool, bool) {
        let dedupable = !ids.is_empty() && DedupScratch::supports(n_rows);
        match self.opts.dedup {
            Dedup::Off => (false, false),
            Dedup::On => (dedupable, false),
            Dedup::Auto if dedupable => self.auto.choose(f, || scratch.shows_reuse(ids)),
            Dedup::Auto => (false, false),
        }
    }

    /// Pools feature `f`'s unit `direct` over its table's `rows` in memory, directly or
    /// through the distinct rows gathered in `scratch`, and records its time where `choice`
    /// says it is timed.
    #[inline]
    pub(super) fn pool_resident<I: RowIndex>(
        &self,
        direct: &Segment<'_, I>,
        rows: &[u8],
        f: usize,
        choice: UnitChoice,
        scratch: &mut DedupScratch,
        stats: &mut PoolStats,
    ) {
        let UnitChoice {
            dedup,
            timed,
            candidate,
        } = choice;
        let ids = direct.ids;
        let start = (timed || candidate.is_some()).then(std::time::Instant::now);
        if dedup {
            let n_unique = scratch.build(ids);
            scratch.gather(rows, direct.stride, direct.prefetch);
            stats.deduped_units += 1;
            stats.deduped_lookups += ids.len();
            stats.unique_rows += n_unique;
            // The compact rows are cache-resident: no prefetch.
            self.kernel(&direct.over(Rows::of(&scratch.rows), &scratch.inverse, 0));
        } else {
            self.kernel(direct);
        }
        if let Some(t) = start {
            let ns = t.elapsed().as_nanos() as f64 / ids.len() as f64;
            if timed {
                self.auto.record(f, dedup, ns);
            }
            // A deduplicated unit pools from a compact buffer: its time says little of the
            // distance.
            if let (Some(i), false) = (candidate, dedup) {
                self.distance.record(direct.stride, i, ns);
            }
        }
    }
}
