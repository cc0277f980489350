//! The remote tier at each cache size and policy (`bench remote`'s main measurement): a
//! stager warmed on the warm-up batches, then timed run by run, each run paired with a DRAM
//! run of the same batches and the first checked against DRAM bit for bit.

use anyhow::{Result, ensure};
use ember_bench::stats::{median, quantile};
use ember_embed::{EmbeddingCollection, KeyedJagged, Pooler};
use ember_tier::storage::remote::RemoteSource;
use ember_tier::{CachePolicy, Stager, TierOptions, TierStats};
use serde_json::{Value as Json, json};

use super::RemoteArgs;
use crate::bench::tiered::{WarmPairs, batches_before, run_tier};

/// What every cache size and policy of the remote tier runs on: the options, the remote
/// tables and where their rows are, the pinned policy's profile, DRAM's tables and output on
/// the first run's last batch (`want`), the pooler, the batches, the tables' bytes.
pub(super) struct TierBench<'a> {
    pub(super) r: &'a RemoteArgs,
    pub(super) coll: EmbeddingCollection,
    pub(super) src: RemoteSource,
    pub(super) pin_trace: Option<std::sync::Arc<Vec<u64>>>,
    pub(super) dram: &'a EmbeddingCollection,
    pub(super) pooler: &'a Pooler,
    pub(super) warmup: &'a [KeyedJagged],
    pub(super) runs: &'a [&'a [KeyedJagged]],
    pub(super) lookups_per_run: usize,
    pub(super) want: &'a [f32],
    pub(super) total: usize,
}

/// What one cache size and policy's timed runs gave: lookups/s of each run and its ratio to
/// its DRAM run, DRAM's seconds over them, the tier's counters and its fetch times (seconds).
struct Timed {
    lps: Vec<f64>,
    ratios: Vec<f64>,
    dram_secs: f64,
    stats: TierStats,
    samples: Vec<f32>,
}

impl TierBench<'_> {
    /// Every cache size and policy: a JSON object of figures each, and the most rows fetched
    /// per batch at the smallest cache size (what the ceiling loop fetches).
    pub(super) fn measure_all(&self, out: &mut [f32]) -> Result<(Vec<Json>, Option<f64>)> {
        let fractions = &self.r.cache_fractions;
        let smallest = fractions.iter().copied().fold(f64::MAX, f64::min);
        let mut results = Vec::new();
        let mut smallest_misses = None;
        for &fraction in fractions {
            ensure!(fraction >= 0.0, "cache fractions must not be negative");
            for &policy in &self.r.policies {
                let (res, misses_per_batch) = self.measure(fraction, policy, out)?;
                if fraction == smallest {
                    smallest_misses = Some(
                        smallest_misses.map_or(misses_per_batch, |x: f64| x.max(misses_per_batch)),
                    );
                }
                results.push(res);
            }
        }
        Ok((results, smallest_misses))
    }

    /// One cache size (`fraction` of the tables) and policy: a stager warmed on the warm-up
    /// batches, then the timed runs; its figures, and the rows it fetched per batch.
    fn measure(&self, fraction: f64, policy: CachePolicy, out: &mut [f32]) -> Result<(Json, f64)> {
        let cache_bytes = (self.total as f64 * fraction) as usize;
        let opts = TierOptions {
            cache_bytes,
            policy,
            pin_trace: self.pin_trace.clone(),
            remote: Some(self.src.clone()),
            ..TierOptions::default()
        };
        let stager = Stager::new(&self.coll, opts)?;
        let depth = self.r.prefetch_depth;
        run_tier(
            &stager,
            &self.coll,
            self.pooler,
            self.warmup,
            depth,
            out,
            &mut None,
        )?;
        stager.reset_stats();
        stager.take_fetch_samples();
        let timed = self.timed(&stager, policy, out)?;
        Ok(self.figures(fraction, cache_bytes, policy, timed))
    }

    /// The timed runs of `stager`, each against a DRAM run of the same batches (see
    /// `WarmPairs`: as this machine's speed drifts between runs, DRAM measured once moved
    /// 2.6x); the tier's counters and fetch samples cover the timed runs only. The first run's
    /// output is checked bit for bit against DRAM's.
    fn timed(&self, stager: &Stager, policy: CachePolicy, out: &mut [f32]) -> Result<Timed> {
        let lookups_per_run = self.lookups_per_run;
        let pairs = WarmPairs {
            stager,
            coll: &self.coll,
            dram: Some(self.dram),
            pooler: self.pooler,
            depth: self.r.prefetch_depth,
            lookups_per_run,
        };
        let mut t = Timed {
            lps: Vec::new(),
            ratios: Vec::new(),
            dram_secs: 0.0,
            stats: TierStats::default(),
            samples: Vec::new(),
        };
        for (k, batches) in self.runs.iter().enumerate() {
            let before = batches_before(self.warmup, self.runs, k);
            let pair = pairs.run(before, batches, out, &mut None)?;
            let dram_run = pair.dram.expect("paired with DRAM");
            t.dram_secs += lookups_per_run as f64 / dram_run;
            t.stats = t.stats.plus(&pair.stats);
            t.samples.extend(stager.take_fetch_samples());
            t.lps.push(pair.tier);
            t.ratios.push(pair.tier / dram_run);
            if k == 0 {
                ensure!(
                    out.iter()
                        .zip(self.want)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "the remote tier's pooled output ({policy}) differs from DRAM's"
                );
            }
        }
        Ok(t)
    }

    /// A cache size and policy's figures over its timed runs, printed in short and returned as
    /// JSON, with the rows it fetched per batch.
    fn figures(
        &self,
        fraction: f64,
        cache_bytes: usize,
        policy: CachePolicy,
        t: Timed,
    ) -> (Json, f64) {
        let st = t.stats;
        let mut fetch: Vec<f64> = t.samples.iter().map(|&x| x as f64).collect();
        fetch.sort_by(f64::total_cmp);
        let batches_timed = (self.runs.len() * self.r.embed.batches) as f64;
        let misses_per_batch = st.misses as f64 / batches_timed;
        let fetch_rate = st.misses as f64 / st.io.as_secs_f64().max(1e-9);
        let m = median(&t.lps);
        let vs_dram = median(&t.ratios);
        // Where a batch's time goes: the staging thread's work beside the DRAM pooling of
        // the same batches (staging runs beside the tier's own pooling).
        let stage_us = st.stage.as_secs_f64() * 1e6 / batches_timed;
        let dram_us = t.dram_secs * 1e6 / batches_timed;
        eprintln!(
            "cache {:.0}% {policy}: {:.2} M lookups/s ({:.2}x DRAM, median of run pairs), staging {stage_us:.0} us/batch (DRAM pooling {dram_us:.0} us/batch), hit rate {:.3}, {:.0} rows fetched per batch at {:.0} rows/s, fetch p50 {:.2} ms p99 {:.2} ms",
            fraction * 100.0,
            m / 1e6,
            vs_dram,
            st.hit_rate(),
            misses_per_batch,
            fetch_rate,
            quantile(&fetch, 0.5) * 1e3,
            quantile(&fetch, 0.99) * 1e3,
        );
        let res = json!({
            "cache_fraction": fraction,
            "cache_bytes": cache_bytes,
            "policy": policy.name(),
            "lookups_per_s": m,
            "run_lookups_per_s": t.lps,
            "vs_dram": vs_dram,
            "run_vs_dram": t.ratios,
            "hit_rate": st.hit_rate(),
            "lookup_hit_rate": st.lookup_hit_rate(),
            "rows_fetched_per_batch": misses_per_batch,
            "fetch_rows_per_s": fetch_rate,
            "fetch_p50_s": quantile(&fetch, 0.5),
            "fetch_p99_s": quantile(&fetch, 0.99),
            "round_trips": st.store_reads,
            "bytes_fetched": st.store_bytes_read,
            "stall_s": st.stall.as_secs_f64(),
            "stage_us_per_batch": stage_us,
            "dram_us_per_batch": dram_us,
            "distinct_per_batch": st.cache_lookups as f64 / batches_timed,
            "checked_against_dram": true,
        });
        (res, misses_per_batch)
    }
}
