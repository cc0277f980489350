//! The tier under each cache policy, `bench tiered`'s main measurement: a stager per policy,
//! warmed on the warm-up batches, then timed run by run, each run paired with a DRAM run of
//! the same batches.

use anyhow::Result;
use ember_bench::stats::median;
use ember_embed::{EmbeddingCollection, EmbeddingTable, Pooler};
use ember_tier::{CachePolicy, Stager, TierOptions, TierStats};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::layout::Laid;
use super::pairs::{WarmPairs, batches_before, run_tier};
use super::setup::Shape;
use super::{Batches, TieredArgs};
use crate::units::human_bytes;

/// Each policy's pooled output on the last batch of its first run, with the policy's name.
pub(super) type Outputs = Vec<(String, Vec<f32>)>;

/// The row files a set of policies runs on: their paths, the policies, and the layout that
/// placed their rows (`None`: id order).
pub(super) type Files<'a> = (&'a [PathBuf], &'a [CachePolicy], Option<&'a Laid>);

/// What the tier's runs are held against: the disk's random-read rate, and the tables in DRAM
/// (each tier run is paired with a DRAM run of the same batches).
pub(super) struct Peers<'a> {
    pub(super) disk_iops: f64,
    pub(super) dram: Option<&'a EmbeddingCollection>,
}

/// The tier once per policy: a JSON object of figures each, and each policy's output on the
/// last batch of its first run (checked against DRAM's later).
pub(super) fn measure_policies(
    t: &TieredArgs,
    s: Shape,
    (paths, policies, laid): Files<'_>,
    pooler: &Pooler,
    work: &Batches,
    pin_trace: Option<Arc<Vec<u64>>>,
    peers: &Peers<'_>,
) -> Result<(Vec<Value>, Outputs)> {
    let coll = EmbeddingCollection::one_feature_per_table(
        paths
            .iter()
            .map(|p| EmbeddingTable::open_row_file(p))
            .collect::<Result<_, _>>()?,
    )?;
    let set = PolicySet {
        t,
        s,
        coll: &coll,
        laid,
        pooler,
        work,
        pin_trace,
        peers,
    };
    let mut results = Vec::new();
    let mut outs = Vec::new();
    for &policy in policies {
        results.push(set.measure(policy, &mut outs)?);
    }
    Ok((results, outs))
}

/// What every policy of a set runs on: the options and shape, the tables on the tier (and the
/// layout of their files), the pooler, the batches, the pinned policy's profile, the peers.
struct PolicySet<'a> {
    t: &'a TieredArgs,
    s: Shape,
    coll: &'a EmbeddingCollection,
    laid: Option<&'a Laid>,
    pooler: &'a Pooler,
    work: &'a Batches,
    pin_trace: Option<Arc<Vec<u64>>>,
    peers: &'a Peers<'a>,
}

/// What a policy's timed runs gave: lookups/s of each run, each run's ratio to its DRAM run,
/// and the tier's counters over them all.
struct Timed {
    lps: Vec<f64>,
    ratios: Vec<f64>,
    stats: TierStats,
}

impl PolicySet<'_> {
    /// One policy: its stager set up and warmed, its timed runs, its figures (printed in
    /// short, returned as JSON); its output on the last batch of its first run goes to `outs`.
    fn measure(&self, policy: CachePolicy, outs: &mut Outputs) -> Result<Value> {
        let label = match self.laid {
            Some(_) => format!("{policy}, laid out"),
            None => policy.name().to_string(),
        };
        let (stager, setup_s, mut out) = self.warm(policy, &label)?;
        let timed = self.timed(&stager, &mut out, &label, outs)?;
        stager.check_invariants(self.t.cache_mb << 20);
        Ok(self.figures(policy, &label, &stager, timed, setup_s))
    }

    /// A stager of `policy` and the seconds it took to set up, warmed on the warm-up batches
    /// (its counters then reset); with the output buffer of a batch.
    fn warm(&self, policy: CachePolicy, label: &str) -> Result<(Stager, f64, Vec<f32>)> {
        let (t, s) = (self.t, self.s);
        let opts = TierOptions {
            cache_bytes: t.cache_mb << 20,
            policy,
            io: t.io,
            queue_depth: t.queue_depth,
            pin_trace: self.pin_trace.clone(),
            pin_fraction: t.pin_fraction,
            ..TierOptions::default()
        };
        let t0 = Instant::now();
        let stager = Stager::new(self.coll, opts)?;
        let setup_s = t0.elapsed().as_secs_f64();
        let mut out = vec![0f32; s.batch * s.tables * s.dim];
        let t0 = Instant::now();
        let warmup = &self.work.warmup;
        run_tier(
            &stager,
            self.coll,
            self.pooler,
            warmup,
            t.prefetch_depth,
            &mut out,
            &mut None,
        )?;
        eprintln!(
            "{label}: setup {setup_s:.1} s, warm-up {} batches {:.1} s, hit rate {:.3}",
            warmup.len(),
            t0.elapsed().as_secs_f64(),
            stager.stats().hit_rate()
        );
        stager.reset_stats();
        Ok((stager, setup_s, out))
    }

    /// The timed runs of `stager`, each against a DRAM run of the same batches (see
    /// `WarmPairs`); the output on the last batch of the first run goes to `outs`.
    fn timed(
        &self,
        stager: &Stager,
        out: &mut [f32],
        label: &str,
        outs: &mut Outputs,
    ) -> Result<Timed> {
        let work = self.work;
        let runs = work.runs(self.t.embed.batches);
        let pairs = WarmPairs {
            stager,
            coll: self.coll,
            dram: self.peers.dram,
            pooler: self.pooler,
            depth: self.t.prefetch_depth,
            lookups_per_run: work.lookups_per_run,
        };
        let mut timed = Timed {
            lps: Vec::new(),
            ratios: Vec::new(),
            stats: TierStats::default(),
        };
        for (r, batches) in runs.iter().enumerate() {
            let before = batches_before(&work.warmup, &runs, r);
            let mut keep = (r == 0).then(Vec::new);
            let pair = pairs.run(before, batches, out, &mut keep)?;
            timed.lps.push(pair.tier);
            timed.stats = timed.stats.plus(&pair.stats);
            if let Some(d) = pair.dram {
                timed.ratios.push(pair.tier / d);
            }
            if let Some(k) = keep {
                outs.push((label.to_string(), k));
            }
        }
        Ok(timed)
    }

    /// A policy's figures over its timed runs, printed in short and returned as JSON.
    fn figures(
        &self,
        policy: CachePolicy,
        label: &str,
        stager: &Stager,
        timed: Timed,
        setup_s: f64,
    ) -> Value {
        let Timed {
            lps,
            ratios,
            stats: st,
        } = timed;
        let lookups_per_run = self.work.lookups_per_run;
        let secs: f64 = lps.iter().map(|l| lookups_per_run as f64 / l).sum();
        let (cached_bytes, _) = stager.cache_usage();
        let vs_dram = (!ratios.is_empty()).then(|| median(&ratios));
        let row_bytes = self.t.embed.dtype.row_bytes(self.s.dim) as f64;
        let useful = st.misses as f64 * row_bytes / (st.store_bytes_read as f64).max(1.0);
        eprintln!(
            "{label}: {:.2} M lookups/s (median of {}){}, hit rate {:.3} (per lookup {:.3}), {} read, {:.3} of it rows used",
            median(&lps) / 1e6,
            lps.len(),
            vs_dram.map_or(String::new(), |r| format!(
                " = {r:.3}x DRAM (median of run pairs)"
            )),
            st.hit_rate(),
            st.lookup_hit_rate(),
            human_bytes(st.store_bytes_read as usize),
            useful
        );
        json!({
            "policy": policy.name(),
            "label": label,
            "layout": self.laid.map(|l| json!({
                "profile": l.profile,
                "hot_rows": l.hot_rows,
                "hot": l.summary.hot,
                "warm": l.summary.warm,
                "cold": l.summary.cold,
            })),
            "rows_read": st.misses,
            "useful_bytes_per_byte_read": useful,
            "lookups_per_s": median(&lps),
            "run_lookups_per_s": lps,
            "vs_dram_paired": vs_dram,
            "batches_staged": st.batches,
            "run_vs_dram": ratios,
            "hit_rate": st.hit_rate(),
            "lookup_hit_rate": st.lookup_hit_rate(),
            "ssd_bytes_read": st.store_bytes_read,
            "ssd_reads": st.store_reads,
            "ssd_reads_per_s": st.store_reads as f64 / secs,
            "fraction_of_disk_ceiling": st.store_reads as f64 / secs / self.peers.disk_iops,
            "overlap": st.overlap(),
            "stall_s": st.stall.as_secs_f64(),
            "stage_s": st.stage.as_secs_f64(),
            "io_wait_s": st.io.as_secs_f64(),
            "cache_bytes_used": cached_bytes,
            "setup_s": setup_s,
        })
    }
}
