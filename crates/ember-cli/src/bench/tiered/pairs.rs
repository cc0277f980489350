//! The tier's runs against the same tables in DRAM, pair by pair (`bench tiered` and `bench
//! remote`): [`run_tier`], [`WarmPairs`] and the batches each timed run is warmed on.

use anyhow::Result;
use ember_embed::{EmbeddingCollection, KeyedJagged, Pooler};
use ember_tier::pipeline;
use ember_tier::{Stager, TierStats};
use std::time::Instant;

/// Pools `batches` through the tier, `depth` batches staged ahead; keeps the last output in
/// `keep` when asked (`bench remote` runs its tier through it too).
pub(crate) fn run_tier(
    stager: &Stager,
    coll: &EmbeddingCollection,
    pooler: &Pooler,
    batches: &[KeyedJagged],
    depth: usize,
    out: &mut [f32],
    keep: &mut Option<Vec<f32>>,
) -> Result<()> {
    pipeline(
        stager,
        coll,
        depth,
        batches.iter(),
        |b| *b,
        |kj, staged| -> Result<()> {
            let staged = staged?;
            pooler.run_staged(coll, coll.check_view(kj)?, &staged, out)?;
            Ok(())
        },
    )?;
    if let Some(k) = keep {
        *k = out.to_vec();
    }
    Ok(())
}

pub(super) fn run_dram(
    coll: &EmbeddingCollection,
    pooler: &Pooler,
    batches: &[KeyedJagged],
    out: &mut [f32],
) -> Result<()> {
    for kj in batches {
        pooler.run(coll, coll.check_view(kj)?, out)?;
    }
    Ok(())
}

/// The batches run, untimed, before timed run `k`: the run before it, or the warm-up's tail.
pub(crate) fn batches_before<'a>(
    warmup: &'a [KeyedJagged],
    runs: &[&'a [KeyedJagged]],
    k: usize,
) -> &'a [KeyedJagged] {
    match k {
        0 => &warmup[warmup.len().saturating_sub(runs[0].len())..],
        _ => runs[k - 1],
    }
}

/// A tier timed against the same tables in DRAM, run pair by run pair (`bench tiered` and
/// `bench remote`): this machine's speed drifts between runs, so ratios are taken per pair.
pub(crate) struct WarmPairs<'a> {
    pub stager: &'a Stager,
    pub coll: &'a EmbeddingCollection,
    /// The same tables in DRAM (`None`: the tier alone).
    pub dram: Option<&'a EmbeddingCollection>,
    pub pooler: &'a Pooler,
    pub depth: usize,
    pub lookups_per_run: usize,
}

/// What one pair measured.
pub(crate) struct Pair {
    /// Lookups/s of the DRAM run and of the tier run.
    pub dram: Option<f64>,
    pub tier: f64,
    /// The tier's counters over its timed run only.
    pub stats: TierStats,
}

impl WarmPairs<'_> {
    /// Times `batches` in DRAM, then through the tier. So that neither side starts on CPU
    /// caches the other filled, each first runs `before` untimed (as in a steady stream of
    /// batches; without DRAM the tier's previous run already was `before`). The fetch samples
    /// of the tier's untimed run are dropped. The tier's output is left in `out`, and kept in
    /// `keep` when asked.
    pub(crate) fn run(
        &self,
        before: &[KeyedJagged],
        batches: &[KeyedJagged],
        out: &mut [f32],
        keep: &mut Option<Vec<f32>>,
    ) -> Result<Pair> {
        let per_s = |t0: Instant| self.lookups_per_run as f64 / t0.elapsed().as_secs_f64();
        let dram = match self.dram {
            Some(d) => {
                run_dram(d, self.pooler, before, out)?;
                let t0 = Instant::now();
                run_dram(d, self.pooler, batches, out)?;
                let lps = per_s(t0);
                let (s, c, p) = (self.stager, self.coll, self.pooler);
                run_tier(s, c, p, before, self.depth, out, &mut None)?;
                self.stager.take_fetch_samples();
                Some(lps)
            }
            None => None,
        };
        let at = self.stager.stats();
        let t0 = Instant::now();
        run_tier(
            self.stager,
            self.coll,
            self.pooler,
            batches,
            self.depth,
            out,
            keep,
        )?;
        Ok(Pair {
            dram,
            tier: per_s(t0),
            stats: self.stager.stats().since(&at),
        })
    }
}
