//! `ember bench embed`: the embedding-stage benchmark users run to size hardware.
//!
//! Set up: the tables (huge pages by default) with deterministic random contents, and every
//! batch's ids up front. Measure: check the kernel against the scalar reference on the first
//! batch (and, for quantized dtypes, the pooled error against f32), then alternate timed runs of
//! Ember's pooled lookup and of the memory ceiling (the simplest gather-and-sum over the same
//! rows and ids). Report: medians, printed as text, and with `--json` as one JSON object on the
//! last line. `--device cuda` runs every GPU variant instead ([`super::gpu`]).

use crate::units::human_bytes;
use anyhow::Result;
use ember_bench::ceiling::Ceiling;
use ember_bench::stats::median;
use ember_embed::{CheckedView, EmbeddingCollection, Isa, PoolStats, Prefetch, PrefetchLevel};
use serde_json::json;
use std::time::Instant;

use super::check::check;
use super::setup::{self, EmbedArgs, Shape};
use crate::device::Device;

/// What one `bench embed` measured.
#[derive(Debug)]
struct Report {
    /// Lookups per second of each timed run, Ember's and the ceiling's.
    ember_runs: Vec<f64>,
    ceiling_runs: Vec<f64>,
    /// Lookups that went through deduplicated units / all lookups.
    deduped_fraction: f64,
    /// Pooled error of a quantized dtype against pooling the f32 rows (`None` for f32 or when
    /// the check was skipped).
    quant_err: Option<f64>,
    /// The prefetch distance the ceiling tuned itself to, and the cache level.
    ceiling_prefetch: usize,
    ceiling_level: PrefetchLevel,
    /// Each feature's prefetch distance at the end (`None`: `auto` still exploring).
    ember_prefetch: Vec<Option<usize>>,
}

pub fn run(a: EmbedArgs) -> Result<()> {
    let setup::Setup {
        shape: s,
        source,
        isa,
    } = a.setup()?;
    let total_bytes = s.table_bytes(a.dtype)?;
    setup::check_memory(&a, s, total_bytes)?;
    let (coll, huge) = setup::build_tables(&a, s, total_bytes)?;
    let gpu_profile = match a.device {
        Device::Cuda => a.profile_batches,
        Device::Cpu => 0,
    };
    let mut batches = setup::batches(&a, s, &source, gpu_profile + a.batches)?;
    let profile: Vec<_> = batches.drain(..gpu_profile).collect();
    let validated: Vec<CheckedView<'_>> = batches
        .iter()
        .map(|b| coll.check_view(b))
        .collect::<Result<_, _>>()?;
    let uniq = setup::uniq(&batches);
    if let Some(path) = &a.save_ids {
        use anyhow::Context;
        super::npy::save_ids(path, &batches, s)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.device == Device::Cuda {
        return super::gpu::run(&a, s, &coll, &profile, &batches, &source.describe(), uniq);
    }
    let report = measure(&a, s, isa, &coll, &validated)?;
    let setting = Setting {
        s,
        isa,
        ids: source.describe(),
        uniq,
        huge,
        total_bytes,
    };
    print(&report, &a, &setting);
    if let Some(path) = &a.report {
        page(&report, &a, &setting).write(path)?;
    }
    Ok(())
}

/// What a run measured besides its arguments: the tables' shape and bytes (and how many of
/// them sit on huge pages), the CPU's kernels, the ids and their unique ratio.
struct Setting {
    s: Shape,
    isa: Isa,
    ids: String,
    uniq: f64,
    huge: Option<usize>,
    total_bytes: usize,
}

/// `--report`: Ember against the memory ceiling, as medians and run by run.
fn page(r: &Report, a: &EmbedArgs, setting: &Setting) -> crate::report::Page {
    let Setting {
        s, isa, ref ids, ..
    } = *setting;
    use crate::report::{Page, Plot, Series};
    let mut p = Page::new("ember bench embed");
    p.param(
        "tables x rows x dim",
        format!("{} x {} x {}", s.tables, s.rows, s.dim),
    )
    .param("dtype", a.dtype)
    .param("pooling, batch", format!("{}, {}", s.pooling, s.batch))
    .param("ids", ids)
    .param("threads, isa", format!("{}, {isa}", a.threads));
    let (lps, cps) = (median(&r.ember_runs), median(&r.ceiling_runs));
    p.param("ember / ceiling", format!("{:.1}%", 100.0 * lps / cps));
    p.figure(
        "Lookups/s against the memory ceiling",
        "Medians of the timed runs: Ember's pooled lookup, and the simplest gather-and-sum over \
         the same rows and ids (the machine's ceiling for this access pattern), alternated in \
         one run. PyTorch's figure comes from bench/compare_torch.py.",
        Plot::Bars {
            y_label: "million lookups/s".into(),
            bars: vec![
                ("ember".into(), lps / 1e6),
                ("memory ceiling".into(), cps / 1e6),
            ],
        },
    );
    let runs = |v: &[f64]| {
        v.iter()
            .enumerate()
            .map(|(i, x)| (i as f64 + 1.0, x / 1e6))
            .collect()
    };
    p.figure(
        "Run by run",
        "Each timed run (alternating): a shared machine's drift shows here.",
        Plot::Lines {
            x_label: "run".into(),
            y_label: "million lookups/s".into(),
            series: vec![
                Series {
                    name: "ember".into(),
                    points: runs(&r.ember_runs),
                },
                Series {
                    name: "memory ceiling".into(),
                    points: runs(&r.ceiling_runs),
                },
            ],
            hline: None,
        },
    );
    p
}

/// Checks the kernel, then alternates timed runs of Ember and of the ceiling.
fn measure(
    a: &EmbedArgs,
    s: Shape,
    isa: Isa,
    coll: &EmbeddingCollection,
    validated: &[CheckedView<'_>],
) -> Result<Report> {
    let pooler = a.pooler(isa)?;
    let start_distance = match (a.ceiling_prefetch, a.prefetch) {
        (Some(d), _) | (None, Prefetch::Ids(d)) => d,
        (None, Prefetch::Auto) => 16,
    };
    let mut ceiling = Ceiling::new(a.threads, start_distance, isa)?;
    let mut out = vec![0f32; s.batch * coll.total_dim()];
    let quant_err = match a.no_check {
        true => None,
        false => check(coll, &pooler, validated[0], a.mode, a.seed, &mut out)?,
    };
    // The ceiling's prefetch distance: the fastest on these batches, whatever Ember's is.
    let ceiling_prefetch = match a.ceiling_prefetch {
        Some(d) => d,
        None => ceiling.tune(coll, &validated[..validated.len().min(20)], 2),
    };
    let lookups_per_run = validated.iter().map(|b| b.get().num_ids()).sum::<usize>();
    let (mut ember_runs, mut ceiling_runs) = (Vec::new(), Vec::new());
    let mut dedup_stats = PoolStats::default();
    let mut sink = 0u64;
    let time_ember = |out: &mut [f32], stats: &mut PoolStats| -> Result<f64> {
        let t = Instant::now();
        for vb in validated {
            let st = pooler.run(coll, *vb, out)?;
            *stats = stats.plus(st);
        }
        Ok(lookups_per_run as f64 / t.elapsed().as_secs_f64())
    };
    let time_ceiling = |sink: &mut u64| -> f64 {
        let t = Instant::now();
        for b in validated {
            *sink = sink.wrapping_add(ceiling.run(coll, *b));
        }
        lookups_per_run as f64 / t.elapsed().as_secs_f64()
    };
    // Warm-up: one run of each (first-touch effects, thread start, branch predictors).
    time_ember(&mut out, &mut PoolStats::default())?;
    time_ceiling(&mut sink);
    for r in 0..a.runs {
        // Alternate which goes first so drift on a shared machine hits both alike.
        if r % 2 == 0 {
            ember_runs.push(time_ember(&mut out, &mut dedup_stats)?);
            ceiling_runs.push(time_ceiling(&mut sink));
        } else {
            ceiling_runs.push(time_ceiling(&mut sink));
            ember_runs.push(time_ember(&mut out, &mut dedup_stats)?);
        }
    }
    std::hint::black_box(sink);
    std::hint::black_box(&out);
    Ok(Report {
        ember_runs,
        ceiling_runs,
        deduped_fraction: dedup_stats.deduped_lookups as f64 / dedup_stats.lookups.max(1) as f64,
        quant_err,
        ceiling_prefetch,
        ceiling_level: ceiling.prefetch_level(),
        ember_prefetch: pooler.prefetch_distances(coll),
    })
}

/// Prints the report as text, and as JSON with `--json`.
fn print(r: &Report, a: &EmbedArgs, setting: &Setting) {
    let Setting {
        s,
        isa,
        ref ids,
        uniq,
        huge,
        total_bytes,
    } = *setting;
    let row_bytes = a.dtype.row_bytes(s.dim);
    let lps = median(&r.ember_runs);
    let cps = median(&r.ceiling_runs);
    let gbps = lps * row_bytes as f64 / 1e9;
    let cgbps = cps * row_bytes as f64 / 1e9;
    let huge_frac = huge.map(|h| h as f64 / total_bytes.max(1) as f64);
    println!(
        "ember bench embed: {} tables x {} rows x dim {} {} ({}, huge pages {}), pooling {}, batch {}, mode {}",
        s.tables,
        s.rows,
        s.dim,
        a.dtype,
        human_bytes(total_bytes),
        huge_frac.map_or("unknown".into(), |f| format!("{:.0}%", 100.0 * f)),
        s.pooling,
        s.batch,
        a.mode.name()
    );
    println!(
        "  ids {ids}, unique ratio {uniq:.3}; {} threads, isa {isa}, prefetch {} into {}, dedup {} (deduplicated {:.0}% of lookups)",
        a.threads,
        distances(a.prefetch, &r.ember_prefetch),
        PrefetchLevel::selected().name(),
        a.dedup,
        100.0 * r.deduped_fraction
    );
    println!("  {} batches x {} runs, medians:", a.batches, a.runs);
    println!(
        "  {:<10} {:>12} {:>9} {:>11}",
        "", "lookups/s", "GB/s", "ns/lookup"
    );
    for (name, lps, gbps) in [("ember", lps, gbps), ("ceiling", cps, cgbps)] {
        println!(
            "  {:<10} {:>10.2} M {:>9.2} {:>11.2}",
            name,
            lps / 1e6,
            gbps,
            1e9 / lps
        );
    }
    println!(
        "  ember / ceiling: {:.1}% (ceiling: bags summed in registers, prefetch {} ids into {}{})",
        100.0 * lps / cps,
        r.ceiling_prefetch,
        r.ceiling_level.name(),
        match a.ceiling_prefetch {
            Some(_) => String::new(),
            None => format!(
                ", the fastest of {:?} into l1 or l2",
                ember_bench::ceiling::TUNED_DISTANCES
            ),
        }
    );
    match r.quant_err {
        Some(e) => println!(
            "  check: matches the reference; pooled {} vs f32 relative error {:.4}%",
            a.dtype,
            100.0 * e
        ),
        None if !a.no_check => println!("  check: matches the reference"),
        None => {}
    }
    if a.json {
        let mut j = json!({
            "lookups_per_s": lps,
            "gb_per_s": gbps,
            "ns_per_lookup": 1e9 / lps,
            "ceiling_lookups_per_s": cps,
            "ceiling_gb_per_s": cgbps,
            "ceiling_prefetch": r.ceiling_prefetch,
            "ceiling_prefetch_level": r.ceiling_level.name(),
            "prefetch_per_feature": r.ember_prefetch,
            "prefetch_level": PrefetchLevel::selected().name(),
            "fraction_of_ceiling": lps / cps,
            "deduped_fraction": r.deduped_fraction,
            "huge_page_fraction": huge_frac,
            "quant_rel_error": r.quant_err,
            "run_lookups_per_s": r.ember_runs,
            "ceiling_run_lookups_per_s": r.ceiling_runs,
        });
        setup::add_workload(&mut j, a, s, ids, isa.name(), uniq);
        println!("{j}");
    }
}

/// `--prefetch` as run: the fixed distance, or `auto` with the distances features settled on
/// ("auto (64 ids x 30, 48 ids x 2)").
fn distances(p: Prefetch, per_feature: &[Option<usize>]) -> String {
    if p != Prefetch::Auto {
        return p.to_string();
    }
    let mut counts = std::collections::BTreeMap::new();
    for d in per_feature {
        *counts.entry(*d).or_insert(0usize) += 1;
    }
    let mut parts: Vec<(Option<usize>, usize)> = counts.into_iter().collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    let parts: Vec<String> = parts
        .iter()
        .map(|(d, n)| match d {
            Some(d) => format!("{d} ids x {n}"),
            None => format!("exploring x {n}"),
        })
        .collect();
    format!("auto ({})", parts.join(", "))
}
