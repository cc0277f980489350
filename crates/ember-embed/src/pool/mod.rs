//! The table-batched pooled lookup (EmbeddingBag / SparseLengthsSum over every feature at once).
//!
//! Specification (see [`mod@reference`] for it as code): for every feature `f` and sample `b`,
//! `out[b, col(f)..col(f)+dim(f)]` is the sum (or mean, or weighted sum) of the rows of `f`'s table
//! selected by the bag's ids; empty bags give zeros. `out` is `batch_size x total_dim` f32,
//! row-major: the features' pooled vectors side by side, ready for the feature interaction.
//!
//! How it runs: the work is cut into units of (feature, block of consecutive bags); each unit's
//! ids are contiguous in the batch, so the kernel walks them in order and software-prefetches the
//! row a distance ahead, across bag boundaries (fixed, or measured per row size: `distance.rs`).
//! Units run on a rayon pool of `threads` threads (inline when 1). With dedup, a unit first
//! collects its distinct ids, copies each distinct row once into a compact per-thread buffer,
//! and pools from that buffer through the inverse index (RecD's inverse keyed jagged tensor).
//! The kernel family (AVX-512, AVX2, scalar) is chosen once when the [`Pooler`] is built.

pub mod reference;

// The kernels' shared macros (`dispatch_block!`, `prefetch_ahead!`).
#[macro_use]
mod macros;

mod auto;
mod avx2;
mod avx512;
#[cfg(all(test, unix))]
mod bounds;
mod distance;
mod resident;
mod scalar;
mod segment;
mod staged;
mod units;

use crate::collection::{CheckedView, EmbeddingCollection};
use crate::dedup::DedupScratch;
use crate::error::{EmbedError, Result};
use crate::isa::Isa;
use crate::jagged::{Ids, KeyedJagged, RowIndex};
use crate::staged::StagedBatch;
use crate::table::Placement;
use auto::AutoDedup;
use distance::AutoPrefetch;
pub use distance::{CANDIDATES as PREFETCH_CANDIDATES, Prefetch};
use rayon::prelude::*;
use resident::UnitChoice;
use segment::OutPtr;
pub(crate) use segment::{OutRows, Rows, Segment};
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use units::{Call, Unit, plan_units};

/// How the rows of a bag are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// Sum of the rows.
    Sum,
    /// Sum divided by the bag's length (zeros for an empty bag).
    Mean,
    /// Sum of the rows times their per-id weights (the batch must carry weights).
    WeightedSum,
}

impl Pooling {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Sum => "sum",
            Pooling::Mean => "mean",
            Pooling::WeightedSum => "weighted_sum",
        }
    }

    /// Whether `kj`'s weights suit this pooling: `weighted_sum` needs them (unless the batch has
    /// no ids), `sum` and `mean` refuse them rather than silently ignore them. Every backend
    /// (the CPU poolers, the GPU runner) applies this one rule.
    pub fn check_weights(self, kj: &KeyedJagged) -> Result<()> {
        match (self, kj.weights().is_some()) {
            (Pooling::WeightedSum, false) if kj.num_ids() > 0 => Err(EmbedError::MissingWeights),
            (Pooling::Sum | Pooling::Mean, true) => Err(EmbedError::UnexpectedWeights {
                pooling: self.name(),
            }),
            _ => Ok(()),
        }
    }
}

impl FromStr for Pooling {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "sum" => Ok(Pooling::Sum),
            "mean" => Ok(Pooling::Mean),
            "weighted_sum" | "weighted" => Ok(Pooling::WeightedSum),
            _ => Err(EmbedError::BadOption {
                option: "pooling",
                reason: format!("'{s}' is not sum, mean or weighted_sum"),
            }),
        }
    }
}

/// Whether distinct ids are gathered once per (feature, bag block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// Always gather every id.
    Off,
    /// Always deduplicate (tables of fewer than 2^32 - 1 rows; larger ones run directly).
    On,
    /// Deduplicate where it is measured to pay: features whose ids show reuse time both paths
    /// and keep the faster (see `pool/auto.rs`).
    Auto,
}

impl Dedup {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Dedup::Off => "off",
            Dedup::On => "on",
            Dedup::Auto => "auto",
        }
    }
}

impl fmt::Display for Dedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dedup {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(Dedup::Off),
            "on" => Ok(Dedup::On),
            "auto" => Ok(Dedup::Auto),
            _ => Err(EmbedError::BadOption {
                option: "dedup",
                reason: format!("'{s}' is not on, off or auto"),
            }),
        }
    }
}

/// Options of a [`Pooler`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolOptions {
    pub pooling: Pooling,
    pub dedup: Dedup,
    /// Worker threads (1 runs on the calling thread).
    pub threads: usize,
    /// How many ids ahead rows are software-prefetched: a number (0 disables prefetch) or
    /// measured per row size ([`Prefetch::Auto`], the default).
    pub prefetch: Prefetch,
    /// Kernel family; `None` takes [`Isa::selected`].
    pub isa: Option<Isa>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            pooling: Pooling::Sum,
            dedup: Dedup::Auto,
            threads: 1,
            prefetch: Prefetch::Auto,
            isa: None,
        }
    }
}

/// What one call did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolStats {
    /// Ids pooled.
    pub lookups: usize,
    /// Work units run.
    pub units: usize,
    /// Units that were deduplicated.
    pub deduped_units: usize,
    /// Ids in deduplicated units.
    pub deduped_lookups: usize,
    /// Distinct rows gathered in deduplicated units.
    pub unique_rows: usize,
}

impl PoolStats {
    /// Field-wise sum.
    pub fn plus(self, o: PoolStats) -> PoolStats {
        PoolStats {
            lookups: self.lookups + o.lookups,
            units: self.units + o.units,
            deduped_units: self.deduped_units + o.deduped_units,
            deduped_lookups: self.deduped_lookups + o.deduped_lookups,
            unique_rows: self.unique_rows + o.unique_rows,
        }
    }
}

/// Runs pooled lookups with fixed options, a thread pool and per-thread scratch buffers, so that
/// a call allocates nothing once warm.
#[derive(Debug)]
pub struct Pooler {
    opts: PoolOptions,
    isa: Isa,
    pool: Option<rayon::ThreadPool>,
    scratch: Vec<Mutex<DedupScratch>>,
    auto: AutoDedup,
    distance: AutoPrefetch,
}

impl Pooler {
    /// Checks the options and starts the thread pool.
    pub fn new(opts: PoolOptions) -> Result<Self> {
        if opts.threads == 0 {
            return Err(EmbedError::BadOption {
                option: "threads",
                reason: "must be at least 1".into(),
            });
        }
        let isa = match opts.isa {
            Some(i) => i.require()?,
            None => Isa::selected()?,
        };
        let pool = if opts.threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(opts.threads)
                    .thread_name(|i| format!("ember-pool-{i}"))
                    .start_handler(|_| crate::fpmode::FlushDenormals::forever())
                    .build()
                    .map_err(|e| EmbedError::ThreadPool {
                        threads: opts.threads,
                        cause: crate::Cause::new(e),
                    })?,
            )
        } else {
            // One thread: work runs on the caller's thread, and what it hands to `rayon::join`
            // runs on rayon's global pool, whose threads flush subnormals too from here on.
            // (Otherwise they inherit the mode of whichever thread happened to start them.)
            rayon::broadcast(|_| crate::fpmode::FlushDenormals::forever());
            None
        };
        let scratch = (0..opts.threads)
            .map(|_| Mutex::new(Default::default()))
            .collect();
        Ok(Pooler {
            opts,
            isa,
            pool,
            scratch,
            auto: AutoDedup::default(),
            distance: AutoPrefetch::default(),
        })
    }

    /// The options.
    pub fn options(&self) -> &PoolOptions {
        &self.opts
    }

    /// The kernel family in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The prefetch distance each feature of `coll` runs at: the fixed one, or with
    /// [`Prefetch::Auto`] the one measured fastest so far for its table's row size (`None`
    /// while still exploring).
    pub fn prefetch_distances(&self, coll: &EmbeddingCollection) -> Vec<Option<usize>> {
        (0..coll.features().len())
            .map(|f| match self.opts.prefetch {
                Prefetch::Ids(n) => Some(n),
                Prefetch::Auto => self.distance.current(coll.table_of(f).stride()),
            })
            .collect()
    }

    /// Runs `f` on this pooler's thread pool (on the calling thread when it has one thread, and
    /// then `rayon::join` inside uses rayon's global pool), so that other work (a model's dense
    /// layers) shares the pool, and `rayon::join` can run it beside [`Pooler::run`]. Subnormals
    /// flush to zero inside (see [`crate::FlushDenormals`]).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => {
                let _flush = crate::fpmode::FlushDenormals::new();
                f()
            }
        }
    }

    /// Pools `batch` into `out` (`batch_size x coll.total_dim()` floats). Tables on the SSD tier
    /// need [`Pooler::run_staged`].
    pub fn run(
        &self,
        coll: &EmbeddingCollection,
        batch: CheckedView<'_>,
        out: &mut [f32],
    ) -> Result<PoolStats> {
        self.run_inner(coll, batch, None, out)
    }

    /// Pools `batch` into `out`, reading the SSD tier's tables from `staged` (what
    /// `ember_tier::Stager::stage` returned for this batch) and the others from memory.
    pub fn run_staged(
        &self,
        coll: &EmbeddingCollection,
        batch: CheckedView<'_>,
        staged: &StagedBatch,
        out: &mut [f32],
    ) -> Result<PoolStats> {
        self.run_inner(coll, batch, Some(staged), out)
    }

    fn run_inner(
        &self,
        coll: &EmbeddingCollection,
        batch: CheckedView<'_>,
        staged: Option<&StagedBatch>,
        out: &mut [f32],
    ) -> Result<PoolStats> {
        coll.check_own(batch)?;
        let kj = batch.get();
        check_call(coll, kj, self.opts.pooling, out)?;
        // Every feature reads either resident rows or rows staged for exactly this batch shape.
        for f in 0..coll.features().len() {
            let table = coll.table_of(f);
            if matches!(table.placement(), Placement::Dram | Placement::Mmap) {
                continue;
            }
            let range = kj.feature_range(f);
            match staged.and_then(|s| s.feature(f)) {
                Some(sf) if sf.fits(range.start, kj.ids(), range.clone(), table.stride()) => {
                    // Sums pooled remotely were weighted as this pooling weighs.
                    let weighs =
                        self.opts.pooling == Pooling::WeightedSum && kj.weights().is_some();
                    if let Some(r) = &sf.remote
                        && (r.weighted != weighs || r.sums.len() != kj.batch_size() * table.dim())
                    {
                        return Err(EmbedError::BadOption {
                            option: "pooling",
                            reason: format!(
                                "table '{}' was pooled on its store {} weights, this pooling is {:?}",
                                table.name(),
                                if r.weighted { "with" } else { "without" },
                                self.opts.pooling
                            ),
                        });
                    }
                }
                _ => {
                    return Err(EmbedError::NotStaged {
                        table: table.name().into(),
                    });
                }
            }
        }
        let units = plan_units(coll.features().len(), kj.batch_size(), self.opts.threads);
        let out = OutPtr(out.as_mut_ptr());
        let call = Call {
            coll,
            kj,
            staged,
            out,
        };
        let run_one = |u: &Unit| -> PoolStats {
            let slot = rayon::current_thread_index().unwrap_or(0) % self.scratch.len();
            let mut scratch = self.scratch[slot].lock().unwrap_or_else(|p| p.into_inner());
            match kj.ids() {
                Ids::U32(v) => self.run_unit(&call, v, u, &mut scratch),
                Ids::I64(v) => self.run_unit(&call, v, u, &mut scratch),
            }
        };
        let total = match &self.pool {
            None => units
                .iter()
                .map(run_one)
                .fold(PoolStats::default(), PoolStats::plus),
            Some(p) => p.install(|| {
                units
                    .par_iter()
                    .map(run_one)
                    .reduce(PoolStats::default, PoolStats::plus)
            }),
        };
        if let Some(s) = staged {
            self.add_remote_sums(coll, kj, s, out);
        }
        Ok(total)
    }

    /// Adds the sums of rows pooled on a remote store's nodes (`ember-tier` staged them, with
    /// zeros in their place for the kernel) to each bag of their features, divided by the bag's
    /// length under mean pooling.
    fn add_remote_sums(
        &self,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
        staged: &StagedBatch,
        out: OutPtr,
    ) {
        let (bsz, width) = (kj.batch_size(), coll.total_dim());
        for f in 0..coll.features().len() {
            let Some(r) = staged.feature(f).and_then(|sf| sf.remote.as_ref()) else {
                continue;
            };
            let (dim, col) = (coll.table_of(f).dim(), coll.col_offset(f));
            for b in 0..bsz {
                let n = kj.bag(f, b).len();
                let scale = if self.opts.pooling == Pooling::Mean && n > 0 {
                    1.0 / n as f32
                } else {
                    1.0
                };
                // SAFETY: `check_call` checked `out` holds bsz x width floats, and every unit
                // (which wrote through the same pointer) has finished.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(out.0.add(b * width + col), dim) };
                for (d, &x) in dst.iter_mut().zip(&r.sums[b * dim..(b + 1) * dim]) {
                    *d += x * scale;
                }
            }
        }
    }

    /// Pools one unit of `call` (whose ids are `all_ids`) and returns what it did.
    fn run_unit<I: RowIndex>(
        &self,
        call: &Call<'_>,
        all_ids: &[I],
        u: &Unit,
        scratch: &mut DedupScratch,
    ) -> PoolStats {
        let Call {
            coll,
            kj,
            staged,
            out,
        } = *call;
        let table = coll.table_of(u.feature);
        let bsz = kj.batch_size();
        let bags = &kj.offsets()[u.feature * bsz + u.b0..=u.feature * bsz + u.b1];
        let (base, end) = (bags[0], bags[bags.len() - 1]);
        let ids = &all_ids[base..end];
        let weights = match self.opts.pooling {
            Pooling::WeightedSum => kj.weights().map(|w| &w[base..end]),
            _ => None,
        };
        let width = coll.total_dim();
        let out = OutRows {
            // The unit's first output row; offset stays inside `out` (checked by check_call).
            ptr: out
                .0
                .wrapping_add(u.b0 * width + coll.col_offset(u.feature)),
            stride: width,
            dim: table.dim(),
        };
        let mut stats = PoolStats {
            units: 1,
            lookups: ids.len(),
            ..Default::default()
        };
        // A live table's read lock is held while this unit pools (row updates wait for it).
        let resident = table.rows_ref();
        let (candidate, distance) = self.prefetch_choice(table.stride(), resident.is_some(), ids);
        let direct = Segment {
            rows: Rows::of(resident.as_deref().unwrap_or(&[])),
            stride: table.stride(),
            dim: table.dim(),
            dtype: table.dtype(),
            ids,
            weights,
            bags,
            base,
            out,
            mean: self.opts.pooling == Pooling::Mean,
            prefetch: distance,
        };
        let Some(rows) = resident.as_deref() else {
            // A table on the tier: run_inner checked that it was staged for this batch.
            if let Some(sf) = staged.and_then(|s| s.feature(u.feature)) {
                let unit = staged::StagedUnit {
                    sf,
                    local: base - sf.start..end - sf.start,
                    feature: u.feature,
                    whole: u.b0 == 0 && u.b1 == bsz,
                };
                self.run_staged_unit(&direct, unit, scratch, &mut stats);
            }
            return stats;
        };
        let (dedup, timed) = self.dedup_choice(u.feature, ids, table.rows(), scratch);
        let choice = UnitChoice {
            dedup,
            timed,
            candidate,
        };
        self.pool_resident(&direct, rows, u.feature, choice, scratch, &mut stats);
        stats
    }

    /// The prefetch distance of a unit of `ids` over rows of `stride` bytes, and with `auto`
    /// on a unit in memory (`resident`) worth a clock read, the candidate timed (units on the
    /// tier are not timed: they pool from staged rows).
    #[inline]
    fn prefetch_choice<I>(
        &self,
        stride: usize,
        resident: bool,
        ids: &[I],
    ) -> (Option<usize>, usize) {
        match self.opts.prefetch {
            Prefetch::Ids(n) => (None, n),
            Prefetch::Auto if resident && ids.len() >= distance::MIN_TIMED_IDS => {
                let (i, d) = self.distance.choose(stride);
                (Some(i), d)
            }
            Prefetch::Auto => (None, self.distance.untimed(stride)),
        }
    }

    fn kernel<I: RowIndex>(&self, seg: &Segment<'_, I>) {
        debug_assert!(
            seg.ids
                .iter()
                .all(|i| (i.idx() + 1) * seg.stride <= seg.rows.len())
        );
        match self.isa {
            Isa::Scalar => scalar::pool_segment(seg),
            // SAFETY: the Pooler was built only after `Isa::require` confirmed the CPU features;
            // every id of the segment is a row of `seg.rows` (ids validated against the table, or
            // inverse indices into the compact buffer), and `seg.out` rows are this unit's alone.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::pool_segment(seg) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::pool_segment(seg) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => scalar::pool_segment(seg),
        }
    }
}

/// Checks what every implementation needs before touching memory.
pub(crate) fn check_call(
    coll: &EmbeddingCollection,
    kj: &KeyedJagged,
    pooling: Pooling,
    out: &[f32],
) -> Result<()> {
    let expected = kj.batch_size() * coll.total_dim();
    if out.len() != expected {
        return Err(EmbedError::OutputLen {
            got: out.len(),
            batch_size: kj.batch_size(),
            dim: coll.total_dim(),
            expected,
        });
    }
    pooling.check_weights(kj)
}

/// Pools one batch with default options on the calling thread (convenience for one-off calls;
/// build a [`Pooler`] to reuse threads and buffers).
pub fn pooled_lookup(
    coll: &EmbeddingCollection,
    batch: CheckedView<'_>,
    pooling: Pooling,
    out: &mut [f32],
) -> Result<PoolStats> {
    Pooler::new(PoolOptions {
        pooling,
        ..Default::default()
    })?
    .run(coll, batch, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_cover_every_bag_once() {
        for (f, b, t) in [
            (1, 1, 2),
            (3, 10, 2),
            (32, 64, 2),
            (2, 64, 4),
            (5, 3, 8),
            (4, 0, 2),
            (1, 64, 1),
        ] {
            let units = plan_units(f, b, t);
            let mut seen = vec![0u8; f * b];
            for u in &units {
                assert!(u.b0 < u.b1 && u.b1 <= b);
                (u.b0..u.b1).for_each(|s| seen[u.feature * b + s] += 1);
            }
            assert!(seen.iter().all(|&c| c == 1), "{f} {b} {t}");
            if t > 1 && b > 0 {
                assert!(units.len() >= t.min(f * b), "{f} {b} {t}: {}", units.len());
            }
        }
    }
}
