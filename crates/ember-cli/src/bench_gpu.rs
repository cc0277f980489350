//! `ember bench embed --device cuda`: the embedding stage on a GPU, every variant on the same
//! tables and ids, against the device's own copy bandwidth.
//!
//! Per variant: each measured batch is uploaded (not timed), launched once untimed, then timed
//! with CUDA events over `--gpu-iters` launches; a run is the sum over the batches; medians over
//! `--runs`. The hot rows of the pinning variants come from `--profile-batches` earlier batches
//! of the same id stream (not the measured ones). Bandwidth is logical: lookups x row bytes,
//! against a device-to-device copy counted as bytes read plus bytes written (as CUDA's
//! bandwidthTest counts it).

use anyhow::{Context, Result, bail};
use ember_cuda::{GpuEmbeddings, HotPlan, TuneCache, Variant};
use ember_embed::pool::reference;
use ember_embed::{EmbeddingCollection, KeyedJagged};
use serde_json::json;

use crate::bench_embed::{EmbedArgs, Shape};
use crate::stats::{human_bytes, median};

fn variants(list: &str) -> Result<Vec<Variant>> {
    if list == "all" {
        return Ok(Variant::ALL.to_vec());
    }
    list.split(',')
        .map(|v| v.trim().parse::<Variant>().map_err(Into::into))
        .collect()
}

/// Runs the GPU benchmark on `profile` (hot-row profile) and `batches` (measured).
#[allow(clippy::too_many_arguments)]
pub fn run(
    a: &EmbedArgs,
    s: Shape,
    coll: &EmbeddingCollection,
    profile: &[KeyedJagged],
    batches: &[KeyedJagged],
    ids_desc: &str,
    unique_ratio: f64,
) -> Result<()> {
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
            "{copies} cop{} of {} of tables do not fit the GPU's {}; use fewer --tables or \
             --rows, or --variants without l2pin and combined",
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
    let pinned = if list.iter().any(|v| v.pins_l2()) {
        let plan = HotPlan::profile(coll, profile, pin_budget)?;
        let hot_rows: usize = plan.hot.iter().map(Vec::len).sum();
        // Share of the measured lookups that the pinned rows serve (one feature per table here).
        let mut hits = 0usize;
        let mut total = 0usize;
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
            "hot rows: {hot_rows} ({}) from {} profile batches; they serve {:.1}% of the measured lookups",
            human_bytes(hot_rows * row_bytes),
            profile.len(),
            100.0 * hits as f64 / total.max(1) as f64
        );
        Some((
            GpuEmbeddings::upload(&gpu, coll, Some(&plan))?,
            hits as f64 / total.max(1) as f64,
        ))
    } else {
        None
    };

    let mut cache = match &a.tune_cache {
        Some(p) => TuneCache::load(p)?,
        None => match TuneCache::default_path() {
            Some(p) => TuneCache::load(&p)?,
            None => TuneCache::in_memory(),
        },
    };
    let lookups: usize = batches.iter().map(|b| b.num_ids()).sum();
    let width = coll.total_dim();
    let mut first_out: Option<Vec<f32>> = None;
    let mut results = Vec::new();
    for &variant in &list {
        let emb = if variant.pins_l2() {
            &pinned.as_ref().expect("built above").0
        } else {
            &plain
        };
        let mut run = emb.runner(variant, a.mode)?;
        run.upload(emb, coll, &batches[0])?;
        let tune_t = std::time::Instant::now();
        run.tune(emb, &mut cache)?;
        let tune_s = tune_t.elapsed().as_secs_f64();
        // Correctness on the first batch, every variant against the CPU reference (computed
        // once).
        let mut out = vec![0f32; s.batch * width];
        run.launch(emb)?;
        run.download(emb, &mut out)?;
        if !a.no_check {
            let want = match &first_out {
                Some(w) => w.clone(),
                None => {
                    let mut w = vec![0f32; out.len()];
                    reference::pooled_lookup(coll, coll.validate(&batches[0])?, a.mode, &mut w)?;
                    w
                }
            };
            for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                if (g - w).abs() > 1e-3 * w.abs().max(1.0) {
                    bail!(
                        "{variant}: pooled output {i} is {g}, the reference {w}; not timing a wrong kernel"
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
        let secs = median(&run_secs);
        let lps = lookups as f64 / secs;
        let gbps = lps * row_bytes as f64 / 1e9;
        let kernels = run.kernel_stats(emb)?;
        results.push(json!({
            "variant": variant.name(),
            "ms_per_batch": secs * 1e3 / batches.len() as f64,
            "lookups_per_s": lps,
            "gb_per_s": gbps,
            "fraction_of_copy": gbps / copy_gbps,
            "run_seconds": run_secs,
            "tune_seconds": tune_s,
            "kernels": kernels,
            "l2_window": run.pin_info(),
        }));
    }

    println!(
        "ember bench embed --device cuda: {} tables x {} rows x dim {} {} ({}), pooling {}, batch {}, mode {}",
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
        "  {} ({}); ids {ids_desc}, unique ratio {unique_ratio:.3}; {} batches x {} runs x {} launches, medians",
        gpu.info().name,
        gpu.arch(),
        batches.len(),
        a.runs,
        a.gpu_iters
    );
    println!("  device-to-device copy {copy_gbps:.0} GB/s (read + write)");
    println!(
        "  {:<10} {:>10} {:>12} {:>9} {:>8} {:>9}",
        "variant", "ms/batch", "lookups/s", "GB/s", "% copy", "vs base"
    );
    let base = results
        .iter()
        .find(|r| r["variant"] == "baseline")
        .map(|r| r["ms_per_batch"].as_f64().unwrap_or(f64::NAN));
    for r in &results {
        let ms = r["ms_per_batch"].as_f64().unwrap_or(f64::NAN);
        println!(
            "  {:<10} {:>10.3} {:>10.1} G {:>9.0} {:>7.1}% {:>8}",
            r["variant"].as_str().unwrap_or("?"),
            ms,
            r["lookups_per_s"].as_f64().unwrap_or(0.0) / 1e9,
            r["gb_per_s"].as_f64().unwrap_or(0.0),
            100.0 * r["fraction_of_copy"].as_f64().unwrap_or(0.0),
            base.map_or("-".into(), |b| format!("{:.2}x", b / ms))
        );
    }
    if a.json {
        let mut j = json!({
            "device": gpu.info(),
            "copy_gb_per_s": copy_gbps,
            "variants": results,
            "pinned_lookup_share": pinned.as_ref().map(|p| p.1),
            "pin_budget_bytes": pin_budget,
            "profile_batches": profile.len(),
            "gpu_iters": a.gpu_iters,
        });
        crate::bench_embed::add_workload(&mut j, a, s, ids_desc, "cuda", unique_ratio);
        println!("{j}");
    }
    Ok(())
}
