//! `ember bench embed --device cuda`: the embedding stage on a GPU, every variant on the same
//! tables and ids, against the device's own copy bandwidth.
//!
//! Set up: the device, its copy bandwidth, the tables uploaded (plain, and renumbered with the
//! hot rows in one region for the pinning variants, profiled on `--profile-batches` earlier
//! batches of the same id stream). Measure, per variant: tune, check the first batch against the
//! CPU reference, then each measured batch uploaded (not timed), launched once untimed, and
//! timed with CUDA events over `--gpu-iters` launches; a run is the sum over the batches;
//! medians over `--runs`. Report: bandwidth is logical (lookups x row bytes), against a
//! device-to-device copy counted as bytes read plus bytes written (as CUDA's bandwidthTest
//! counts it).

use anyhow::Result;
use ember_embed::{EmbeddingCollection, KeyedJagged};

use super::setup::{EmbedArgs, Shape};

/// Without CUDA support: the error saying how to build with it.
#[cfg(not(feature = "cuda"))]
pub fn run(
    _: &EmbedArgs,
    _: Shape,
    _: &EmbeddingCollection,
    _: &[KeyedJagged],
    _: &[KeyedJagged],
    _: &str,
    _: f64,
) -> Result<()> {
    Err(crate::device::no_cuda())
}

/// Runs the GPU benchmark on `profile` (hot-row profile) and `batches` (measured).
#[cfg(feature = "cuda")]
pub fn run(
    a: &EmbedArgs,
    s: Shape,
    coll: &EmbeddingCollection,
    profile: &[KeyedJagged],
    batches: &[KeyedJagged],
    ids_desc: &str,
    unique_ratio: f64,
) -> Result<()> {
    let report = cuda::Bench::set_up(a, s, coll, profile, batches)?.measure(a, s, coll, batches)?;
    report.print(a, s, batches.len(), profile.len(), ids_desc, unique_ratio);
    Ok(())
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::units::human_bytes;
    use anyhow::{Context, Result, bail};
    use ember_bench::stats::median;
    use ember_cuda::{Gpu, GpuEmbeddings, HotPlan, TuneCache, Variant};
    use ember_embed::pool::reference;
    use ember_embed::{EmbeddingCollection, KeyedJagged};
    use serde_json::{Value, json};
    use std::sync::Arc;

    use super::super::setup::{self, EmbedArgs, Shape};

    /// The device and the tables on it.
    pub(super) struct Bench {
        gpu: Arc<Gpu>,
        variants: Vec<Variant>,
        copy_gbps: f64,
        plain: GpuEmbeddings,
        /// The tables with their hot rows renumbered, and the share of measured lookups the
        /// pinned rows serve (pinning variants only).
        pinned: Option<(GpuEmbeddings, f64)>,
        pin_budget: usize,
        cache: TuneCache,
    }

    /// Each variant's figures, as the JSON report carries them.
    pub(super) struct Report {
        results: Vec<Value>,
    }

    fn variants(list: &str) -> Result<Vec<Variant>> {
        if list == "all" {
            return Ok(Variant::ALL.to_vec());
        }
        list.split(',')
            .map(|v| v.trim().parse::<Variant>().map_err(Into::into))
            .collect()
    }

    impl Bench {
        pub(super) fn set_up(
            a: &EmbedArgs,
            s: Shape,
            coll: &EmbeddingCollection,
            profile: &[KeyedJagged],
            batches: &[KeyedJagged],
        ) -> Result<Bench> {
            let mut list = variants(&a.variants)?;
            let gpu = crate::device::open_gpu(a.gpu)?;
            if gpu.info().max_persisting_l2_bytes == 0 && list.iter().any(|v| v.pins_l2()) {
                eprintln!(
                    "{} has no persisting L2 (or it is partitioned): skipping l2pin and combined",
                    gpu.info().name
                );
                list.retain(|v| !v.pins_l2());
            }
            let row_bytes = a.dtype.row_bytes(s.dim);
            let table_bytes = s.tables * s.rows * row_bytes;
            // The pinning variants read their own renumbered copy of the tables.
            let copies = if list.iter().any(|v| v.pins_l2()) {
                2
            } else {
                1
            };
            if (copies * table_bytes) as f64 > 0.85 * gpu.info().memory_bytes as f64 {
                bail!(
                    "{copies} cop{} of {} of tables do not fit the GPU's {}; use fewer --tables \
                     or --rows, or --variants without l2pin and combined",
                    if copies == 1 { "y" } else { "ies" },
                    human_bytes(table_bytes),
                    human_bytes(gpu.info().memory_bytes)
                );
            }
            let copy_gbps = gpu
                .copy_bandwidth(1 << 30)
                .context("measuring copy bandwidth")?;
            eprintln!("device-to-device copy: {copy_gbps:.0} GB/s (read + write)");
            let t = std::time::Instant::now();
            let plain = GpuEmbeddings::upload(&gpu, coll, None)?;
            eprintln!(
                "uploaded {} in {:.1} s ({} launch group(s))",
                human_bytes(plain.device_bytes()),
                t.elapsed().as_secs_f64(),
                plain.groups()
            );
            let pin_budget = a
                .pin_mb
                .map_or(gpu.info().max_persisting_l2_bytes, |mb| mb << 20);
            let pinned = match list.iter().any(|v| v.pins_l2()) {
                true => Some(pin_hot_rows(
                    &gpu, coll, profile, batches, pin_budget, row_bytes,
                )?),
                false => None,
            };
            let cache = match &a.tune_cache {
                Some(p) => TuneCache::load(p)?,
                None => match TuneCache::default_path() {
                    Some(p) => TuneCache::load(&p)?,
                    None => TuneCache::in_memory(),
                },
            };
            Ok(Bench {
                gpu,
                variants: list,
                copy_gbps,
                plain,
                pinned,
                pin_budget,
                cache,
            })
        }

        /// Every variant: tuned, checked against the CPU reference, timed.
        pub(super) fn measure(
            mut self,
            a: &EmbedArgs,
            s: Shape,
            coll: &EmbeddingCollection,
            batches: &[KeyedJagged],
        ) -> Result<ReportWith> {
            let mut first_out: Option<Vec<f32>> = None;
            let mut results = Vec::new();
            for variant in self.variants.clone() {
                results.push(self.measure_one(variant, a, s, coll, batches, &mut first_out)?);
            }
            Ok(ReportWith {
                report: Report { results },
                bench: self,
            })
        }

        fn measure_one(
            &mut self,
            variant: Variant,
            a: &EmbedArgs,
            s: Shape,
            coll: &EmbeddingCollection,
            batches: &[KeyedJagged],
            first_out: &mut Option<Vec<f32>>,
        ) -> Result<Value> {
            let emb = match variant.pins_l2() {
                true => &self.pinned.as_ref().expect("built at set-up").0,
                false => &self.plain,
            };
            let mut run = emb.runner(variant, a.mode)?;
            run.upload(emb, coll, &batches[0])?;
            let tune_t = std::time::Instant::now();
            run.tune(emb, &mut self.cache)?;
            let tune_s = tune_t.elapsed().as_secs_f64();
            // Correctness on the first batch, every variant against the CPU reference
            // (computed once).
            let mut out = vec![0f32; s.batch * coll.total_dim()];
            run.launch(emb)?;
            run.download(emb, &mut out)?;
            if !a.no_check {
                let want = match first_out {
                    Some(w) => w.clone(),
                    None => {
                        let mut w = vec![0f32; out.len()];
                        reference::pooled_lookup(
                            coll,
                            coll.check_view(&batches[0])?,
                            a.mode,
                            &mut w,
                        )?;
                        w
                    }
                };
                for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                    if (g - w).abs() > 1e-3 * w.abs().max(1.0) {
                        bail!(
                            "{variant}: pooled output {i} is {g}, the reference {w}; not timing \
                             a wrong kernel"
                        );
                    }
                }
                first_out.get_or_insert(want);
            }
            let mut run_secs = Vec::new();
            for _ in 0..a.runs {
                let mut total = 0.0;
                for kj in batches {
                    run.upload(emb, coll, kj)?;
                    total += run.time(emb, a.gpu_iters, 1)? / 1e6;
                }
                run_secs.push(total);
            }
            let lookups: usize = batches.iter().map(|b| b.num_ids()).sum();
            let secs = median(&run_secs);
            let lps = lookups as f64 / secs;
            let gbps = lps * a.dtype.row_bytes(s.dim) as f64 / 1e9;
            Ok(json!({
                "variant": variant.name(),
                "ms_per_batch": secs * 1e3 / batches.len() as f64,
                "lookups_per_s": lps,
                "gb_per_s": gbps,
                "fraction_of_copy": gbps / self.copy_gbps,
                "run_seconds": run_secs,
                "tune_seconds": tune_s,
                "kernels": run.kernel_stats(emb)?,
                "l2_window": run.pin_info(),
            }))
        }
    }

    /// The hot rows of `profile` pinned within `budget`, and the share of the measured lookups
    /// they serve.
    fn pin_hot_rows(
        gpu: &Arc<Gpu>,
        coll: &EmbeddingCollection,
        profile: &[KeyedJagged],
        batches: &[KeyedJagged],
        budget: usize,
        row_bytes: usize,
    ) -> Result<(GpuEmbeddings, f64)> {
        let plan = HotPlan::profile(coll, profile, budget)?;
        let hot_rows: usize = plan.hot.iter().map(Vec::len).sum();
        // Share of the measured lookups that the pinned rows serve (one feature per table).
        let (mut hits, mut total) = (0usize, 0usize);
        let sets: Vec<std::collections::HashSet<u32>> = plan
            .hot
            .iter()
            .map(|h| h.iter().copied().collect())
            .collect();
        for kj in batches {
            for (f, set) in sets.iter().enumerate() {
                for j in kj.feature_range(f) {
                    total += 1;
                    hits += usize::from(set.contains(&(kj.ids().get(j) as u32)));
                }
            }
        }
        eprintln!(
            "hot rows: {hot_rows} ({}) from {} profile batches; they serve {:.1}% of the measured \
             lookups",
            human_bytes(hot_rows * row_bytes),
            profile.len(),
            100.0 * hits as f64 / total.max(1) as f64
        );
        Ok((
            GpuEmbeddings::upload(gpu, coll, Some(&plan))?,
            hits as f64 / total.max(1) as f64,
        ))
    }

    /// The report and the set-up it was measured on.
    pub(super) struct ReportWith {
        report: Report,
        bench: Bench,
    }

    impl ReportWith {
        pub(super) fn print(
            &self,
            a: &EmbedArgs,
            s: Shape,
            batches: usize,
            profile: usize,
            ids_desc: &str,
            unique_ratio: f64,
        ) {
            let (b, results) = (&self.bench, &self.report.results);
            let table_bytes = s.tables * s.rows * a.dtype.row_bytes(s.dim);
            println!(
                "ember bench embed --device cuda: {} tables x {} rows x dim {} {} ({}), pooling \
                 {}, batch {}, mode {}",
                s.tables,
                s.rows,
                s.dim,
                a.dtype,
                human_bytes(table_bytes),
                s.pooling,
                s.batch,
                a.mode.name()
            );
            println!(
                "  {} ({}); ids {ids_desc}, unique ratio {unique_ratio:.3}; {batches} batches x {} \
                 runs x {} launches, medians",
                b.gpu.info().name,
                b.gpu.arch(),
                a.runs,
                a.gpu_iters
            );
            println!(
                "  device-to-device copy {:.0} GB/s (read + write)",
                b.copy_gbps
            );
            println!(
                "  {:<10} {:>10} {:>12} {:>9} {:>8} {:>9}",
                "variant", "ms/batch", "lookups/s", "GB/s", "% copy", "vs base"
            );
            let base = results
                .iter()
                .find(|r| r["variant"] == "baseline")
                .map(|r| r["ms_per_batch"].as_f64().unwrap_or(f64::NAN));
            for r in results {
                let ms = r["ms_per_batch"].as_f64().unwrap_or(f64::NAN);
                println!(
                    "  {:<10} {:>10.3} {:>10.1} G {:>9.0} {:>7.1}% {:>8}",
                    r["variant"].as_str().unwrap_or("?"),
                    ms,
                    r["lookups_per_s"].as_f64().unwrap_or(0.0) / 1e9,
                    r["gb_per_s"].as_f64().unwrap_or(0.0),
                    100.0 * r["fraction_of_copy"].as_f64().unwrap_or(0.0),
                    base.map_or("-".into(), |base| format!("{:.2}x", base / ms))
                );
            }
            if a.json {
                let mut j = json!({
                    "device": b.gpu.info(),
                    "copy_gb_per_s": b.copy_gbps,
                    "variants": results,
                    "pinned_lookup_share": b.pinned.as_ref().map(|p| p.1),
                    "pin_budget_bytes": b.pin_budget,
                    "profile_batches": profile,
                    "gpu_iters": a.gpu_iters,
                });
                setup::add_workload(&mut j, a, s, ids_desc, "cuda", unique_ratio);
                println!("{j}");
            }
        }
    }
}
