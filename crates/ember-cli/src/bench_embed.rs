//! `ember bench embed`: the embedding-stage benchmark users run to size hardware.
//!
//! Builds the tables (huge pages by default) with deterministic random contents, generates every
//! batch's ids up front, checks the kernel against the scalar reference on the first batch (and,
//! for quantized dtypes, measures the pooled error against f32), then alternates timed runs of
//! Ember's pooled lookup and of the memory ceiling (the simplest gather-and-sum over the same rows
//! and ids) and reports medians. `--json` prints one JSON object as the last line.

use crate::device::Device;
use crate::stats::{human_bytes, median, mem_available};
use anyhow::{Context, Result, bail, ensure};
use clap::{Args, ValueEnum};
use ember_embed::ceiling::Ceiling;
use ember_embed::pool::reference;
use ember_embed::workload::{IdSource, WorkloadSpec, generate, seeded_row, unique_ratio};
use ember_embed::*;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Shapes of the CPU seed paper's models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// 32 tables x 500K rows x dim 64, pooling 80, batch 64.
    Rm1,
    /// 60 tables x 1M rows x dim 128, pooling 120, batch 64.
    Rm2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// Flags of `ember bench embed`. Flags given with a preset override the preset's values.
#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// Start from a model shape of the CPU seed paper.
    #[arg(long)]
    pub(crate) preset: Option<Preset>,
    /// Number of tables (one feature each) [default: 8].
    #[arg(long)]
    pub(crate) tables: Option<usize>,
    /// Rows per table [default: 500000].
    #[arg(long)]
    pub(crate) rows: Option<usize>,
    /// Elements per row [default: 64].
    #[arg(long)]
    pub(crate) dim: Option<usize>,
    /// Ids per bag (pooling factor) [default: 80].
    #[arg(long)]
    pub(crate) pooling: Option<usize>,
    /// Samples per batch [default: 64].
    #[arg(long)]
    pub(crate) batch: Option<usize>,
    /// Batches per timed run (each with fresh ids).
    #[arg(long, default_value_t = 100)]
    pub(crate) batches: usize,
    /// Timed runs; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub(crate) runs: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Row element type: f32, f16, bf16, int8 or int4.
    #[arg(long, default_value = "f32")]
    pub(crate) dtype: DType,
    /// Batch deduplication: on, off or auto.
    #[arg(long, default_value = "auto")]
    pub(crate) dedup: Dedup,
    /// How bags combine rows: sum, mean or weighted_sum (random weights).
    #[arg(long, default_value = "sum")]
    pub(crate) mode: Pooling,
    /// Ids: uniform, zipf:ALPHA, or a trace file (one id per line).
    #[arg(long, default_value = "uniform")]
    pub(crate) ids: String,
    /// Software prefetch distance in ids (0: off).
    #[arg(long, default_value_t = 16)]
    pub(crate) prefetch: usize,
    /// Kernel family (default: the best this CPU has, or EMBER_ISA).
    #[arg(long)]
    pub(crate) isa: Option<Isa>,
    /// Back tables with 2 MiB huge pages.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub(crate) huge_pages: OnOff,
    /// Seed of table contents and ids.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Skip the correctness check before timing.
    #[arg(long)]
    pub(crate) no_check: bool,
    /// Write the ids as a .npy array [batches, tables, batch*pooling] (for bench/compare_torch.py).
    #[arg(long)]
    pub(crate) save_ids: Option<PathBuf>,
    /// Print one JSON object as the last line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where the lookups run: cpu, or cuda (every GPU variant against the copy bandwidth).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub(crate) device: Device,
    /// GPU ordinal (--device cuda).
    #[arg(long, default_value_t = 0)]
    pub(crate) gpu: usize,
    /// GPU variants, comma-separated, or all: baseline, tuned, prefetch, l2pin, combined, dedup.
    #[arg(long, default_value = "all")]
    pub(crate) variants: String,
    /// Timed launches per batch (--device cuda).
    #[arg(long, default_value_t = 5)]
    pub(crate) gpu_iters: usize,
    /// Bytes of hot rows to pin in L2, in MiB [default: the device's persisting-L2 maximum].
    #[arg(long)]
    pub(crate) pin_mb: Option<usize>,
    /// Batches, before the measured ones, whose ids profile the hot rows (--device cuda).
    #[arg(long, default_value_t = 20)]
    pub(crate) profile_batches: usize,
    /// The autotuner's cache file [default: $EMBER_TUNE_CACHE or ~/.cache/ember/cuda-tune.json].
    #[arg(long)]
    pub(crate) tune_cache: Option<PathBuf>,
}

/// The resolved shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) tables: usize,
    pub(crate) rows: usize,
    pub(crate) dim: usize,
    pub(crate) pooling: usize,
    pub(crate) batch: usize,
}

pub(crate) fn resolve(a: &EmbedArgs) -> Result<Shape> {
    let base = match a.preset {
        None => Shape {
            tables: 8,
            rows: 500_000,
            dim: 64,
            pooling: 80,
            batch: 64,
        },
        Some(Preset::Rm1) => Shape {
            tables: 32,
            rows: 500_000,
            dim: 64,
            pooling: 80,
            batch: 64,
        },
        Some(Preset::Rm2) => Shape {
            tables: 60,
            rows: 1_000_000,
            dim: 128,
            pooling: 120,
            batch: 64,
        },
    };
    let s = Shape {
        tables: a.tables.unwrap_or(base.tables),
        rows: a.rows.unwrap_or(base.rows),
        dim: a.dim.unwrap_or(base.dim),
        pooling: a.pooling.unwrap_or(base.pooling),
        batch: a.batch.unwrap_or(base.batch),
    };
    for (name, v) in [
        ("--tables", s.tables),
        ("--rows", s.rows),
        ("--dim", s.dim),
        ("--batch", s.batch),
    ] {
        ensure!(v > 0, "{name} must be at least 1");
    }
    ensure!(
        a.batches > 0 && a.runs > 0,
        "--batches and --runs must be at least 1"
    );
    ensure!(a.threads > 0, "--threads must be at least 1");
    Ok(s)
}

pub fn run(a: EmbedArgs) -> Result<()> {
    let s = resolve(&a)?;
    let source: IdSource = a.ids.parse().with_context(|| format!("--ids {}", a.ids))?;
    let isa = match a.isa {
        Some(i) => i.require()?,
        None => Isa::selected()?,
    };
    let row_bytes = a.dtype.row_bytes(s.dim);
    let table_bytes = s
        .rows
        .checked_mul(row_bytes)
        .context("table size overflows")?;
    let total_bytes = table_bytes
        .checked_mul(s.tables)
        .context("table size overflows")?;
    if let Some(avail) = mem_available()
        && total_bytes as f64 > 0.85 * avail as f64
    {
        bail!(
            "{} tables x {} rows x dim {} {} need {}, but only {} of memory is available; \
                 use fewer --tables or --rows, or a smaller --dtype (f16, int8, int4)",
            s.tables,
            s.rows,
            s.dim,
            a.dtype,
            human_bytes(total_bytes),
            human_bytes(avail)
        );
    }
    let pages = if a.huge_pages == OnOff::On {
        PagePolicy::Huge
    } else {
        PagePolicy::Small
    };

    // Tables.
    let t0 = Instant::now();
    eprint!(
        "building {} tables ({})... ",
        s.tables,
        human_bytes(total_bytes)
    );
    let fill_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut tables = Vec::with_capacity(s.tables);
    for t in 0..s.tables {
        let mut table = EmbeddingTable::zeroed(&format!("t{t}"), s.rows, s.dim, a.dtype, pages)?;
        table.fill_rows(fill_threads, |r, out| seeded_row(a.seed, t, r, out));
        tables.push(table);
    }
    let huge: Option<usize> = tables.iter().map(|t| t.huge_page_bytes()).sum();
    let coll = EmbeddingCollection::one_feature_per_table(tables)?;
    eprintln!("{:.1} s", t0.elapsed().as_secs_f64());

    // Ids.
    let spec = WorkloadSpec {
        rows: vec![s.rows; s.tables],
        batch_size: s.batch,
        pooling: s.pooling,
        seed: a.seed,
    };
    let gpu_profile = if a.device == Device::Cuda {
        a.profile_batches
    } else {
        0
    };
    let mut batches = generate(&spec, &source, gpu_profile + a.batches)?;
    if a.mode == Pooling::WeightedSum {
        batches = batches
            .into_iter()
            .map(with_weights)
            .collect::<Result<_, _>>()?;
    }
    let profile: Vec<KeyedJagged> = batches.drain(..gpu_profile).collect();
    let validated: Vec<ValidatedBatch<'_>> = batches
        .iter()
        .map(|b| coll.validate(b))
        .collect::<Result<_, _>>()?;
    let uniq = unique_ratio(&batches);
    if let Some(path) = &a.save_ids {
        save_ids_npy(path, &batches, s).with_context(|| format!("writing {}", path.display()))?;
    }
    if a.device == Device::Cuda {
        #[cfg(feature = "cuda")]
        return crate::bench_gpu::run(&a, s, &coll, &profile, &batches, &source.describe(), uniq);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = profile;
            return Err(crate::device::no_cuda());
        }
    }

    let opts = PoolOptions {
        pooling: a.mode,
        dedup: a.dedup,
        threads: a.threads,
        prefetch_distance: a.prefetch,
        isa: Some(isa),
    };
    let pooler = Pooler::new(opts)?;
    let ceiling = Ceiling::new(a.threads, a.prefetch, isa)?;
    let mut out = vec![0f32; s.batch * coll.total_dim()];

    let quant_err = if a.no_check {
        None
    } else {
        check(&coll, &pooler, validated[0], a.mode, a.seed, &mut out)?
    };

    let lookups_per_run = batches.iter().map(|b| b.num_ids()).sum::<usize>();
    let mut ember_runs = Vec::new();
    let mut ceiling_runs = Vec::new();
    let mut dedup_stats = PoolStats::default();
    let mut sink = 0u64;
    let time_ember = |out: &mut [f32], stats: &mut PoolStats| -> Result<f64> {
        let t = Instant::now();
        for vb in &validated {
            let st = pooler.run(&coll, *vb, out)?;
            *stats = stats.plus(st);
        }
        Ok(lookups_per_run as f64 / t.elapsed().as_secs_f64())
    };
    let time_ceiling = |sink: &mut u64| -> f64 {
        let t = Instant::now();
        for b in &batches {
            *sink = sink.wrapping_add(ceiling.run(&coll, b));
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

    let lps = median(&ember_runs);
    let cps = median(&ceiling_runs);
    let gbps = lps * row_bytes as f64 / 1e9;
    let cgbps = cps * row_bytes as f64 / 1e9;
    let deduped_fraction = dedup_stats.deduped_lookups as f64 / dedup_stats.lookups.max(1) as f64;
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
        "  ids {}, unique ratio {:.3}; {} threads, isa {}, prefetch {}, dedup {} (deduplicated {:.0}% of lookups)",
        source.describe(),
        uniq,
        a.threads,
        isa,
        a.prefetch,
        a.dedup,
        100.0 * deduped_fraction
    );
    println!("  {} batches x {} runs, medians:", a.batches, a.runs);
    println!(
        "  {:<10} {:>12} {:>9} {:>11}",
        "", "lookups/s", "GB/s", "ns/lookup"
    );
    println!(
        "  {:<10} {:>10.2} M {:>9.2} {:>11.2}",
        "ember",
        lps / 1e6,
        gbps,
        1e9 / lps
    );
    println!(
        "  {:<10} {:>10.2} M {:>9.2} {:>11.2}",
        "ceiling",
        cps / 1e6,
        cgbps,
        1e9 / cps
    );
    println!("  ember / ceiling: {:.1}%", 100.0 * lps / cps);
    match quant_err {
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
            "fraction_of_ceiling": lps / cps,
            "deduped_fraction": deduped_fraction,
            "huge_page_fraction": huge_frac,
            "quant_rel_error": quant_err,
            "run_lookups_per_s": ember_runs,
            "ceiling_run_lookups_per_s": ceiling_runs,
        });
        add_workload(&mut j, &a, s, &source.describe(), isa.name(), uniq);
        println!("{j}");
    }
    Ok(())
}

/// Adds the workload's fields (shape, dtype, ids, options), which `bench embed` and `bench tiered`
/// both report, to the JSON object `j`.
pub(crate) fn add_workload(
    j: &mut serde_json::Value,
    a: &EmbedArgs,
    s: Shape,
    ids: &str,
    isa: &str,
    unique_ratio: f64,
) {
    let row_bytes = a.dtype.row_bytes(s.dim);
    let fields = json!({
        "threads": a.threads,
        "dtype": a.dtype.name(),
        "dedup": a.dedup.name(),
        "unique_ratio": unique_ratio,
        "mode": a.mode.name(),
        "tables": s.tables,
        "rows": s.rows,
        "dim": s.dim,
        "pooling": s.pooling,
        "batch": s.batch,
        "batches": a.batches,
        "runs": a.runs,
        "ids": ids,
        "isa": isa,
        "prefetch": a.prefetch,
        "row_bytes": row_bytes,
        "table_bytes": s.tables * s.rows * row_bytes,
    });
    if let (Some(j), serde_json::Value::Object(f)) = (j.as_object_mut(), fields) {
        j.extend(f);
    }
}

/// Adds deterministic per-id weights in [0.5, 1.5) to a batch.
pub(crate) fn with_weights(kj: KeyedJagged) -> Result<KeyedJagged, EmbedError> {
    let w = (0..kj.num_ids())
        .map(|i| 0.5 + ((i * 2_654_435_761) % 1000) as f32 / 1000.0)
        .collect();
    kj.with_weights(w)
}

/// Checks the kernel against the reference on one batch; for quantized dtypes also returns the
/// relative error (L2) of the pooled output against pooling the f32 source rows.
fn check(
    coll: &EmbeddingCollection,
    pooler: &Pooler,
    vb: ValidatedBatch<'_>,
    mode: Pooling,
    seed: u64,
    out: &mut [f32],
) -> Result<Option<f64>> {
    pooler.run(coll, vb, out)?;
    let mut want = vec![0f32; out.len()];
    reference::pooled_lookup(coll, vb, mode, &mut want)?;
    let kj = vb.get();
    let dim = coll.total_dim() / coll.features().len().max(1);
    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
        let (b, col) = (i / coll.total_dim(), i % coll.total_dim());
        let bag_len = kj.length(col / dim.max(1), b) as f32;
        let tol = 1e-5 * (1.0 + bag_len) * (1.0 + w.abs());
        ensure!(
            (g - w).abs() <= tol,
            "kernel result differs from the reference at sample {b}, column {col}: {g} vs {w}"
        );
    }
    let dtype = coll.tables()[0].dtype();
    if dtype == DType::F32 {
        return Ok(None);
    }
    // Pool the f32 source rows (regenerated from the seed) and compare.
    let (mut num, mut den) = (0f64, 0f64);
    let mut row = vec![0f32; dim];
    for f in 0..coll.features().len() {
        for b in 0..kj.batch_size() {
            let bag = kj.bag(f, b);
            let mut acc = vec![0f64; dim];
            for j in bag.clone() {
                seeded_row(seed, f, kj.ids().get(j) as usize, &mut row);
                let w = kj.weights().map_or(1.0, |w| f64::from(w[j]));
                acc.iter_mut()
                    .zip(&row)
                    .for_each(|(a, &x)| *a += w * f64::from(x));
            }
            let scale = if mode == Pooling::Mean && !bag.is_empty() {
                1.0 / bag.len() as f64
            } else {
                1.0
            };
            for (d, a) in acc.iter().enumerate() {
                let exact = a * scale;
                let got = f64::from(out[b * coll.total_dim() + f * dim + d]);
                num += (got - exact).powi(2);
                den += exact.powi(2);
            }
        }
    }
    Ok(Some((num / den.max(f64::MIN_POSITIVE)).sqrt()))
}

/// Writes ids as a NumPy .npy array of shape [batches, tables, batch * pooling].
fn save_ids_npy(path: &PathBuf, batches: &[KeyedJagged], s: Shape) -> Result<()> {
    let wide = matches!(batches.first().map(|b| b.ids()), Some(Ids::I64(_)));
    let descr = if wide { "<i8" } else { "<u4" };
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        batches.len(),
        s.tables,
        s.batch * s.pooling
    );
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, then \n.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for b in batches {
        match b.ids() {
            Ids::U32(v) => v.iter().try_for_each(|x| f.write_all(&x.to_le_bytes()))?,
            Ids::I64(v) => v.iter().try_for_each(|x| f.write_all(&x.to_le_bytes()))?,
        }
    }
    f.flush()?;
    Ok(())
}
