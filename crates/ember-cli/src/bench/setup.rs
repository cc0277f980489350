//! What the embedding benchmarks (`bench embed` on CPU and GPU, `bench tiered`) share: their
//! flags, the resolved shape, tables filled from a seed, the id batches, and the workload's
//! fields in their JSON reports.

use crate::units::{human_bytes, mem_available};
use anyhow::{Context, Result, bail, ensure};
use clap::{Args, ValueEnum};
use ember_bench::workload::{IdSource, WorkloadSpec, generate, unique_ratio};
use ember_embed::{
    DType, Dedup, EmbedError, EmbeddingCollection, EmbeddingTable, Isa, KeyedJagged, PagePolicy,
    PoolOptions, Pooler, Pooling, Prefetch,
};
use ember_model::random::seeded_row;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

use crate::device::Device;

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
    /// Software prefetch distance in ids (0: off), or auto: the candidate distances are timed
    /// on the first units of each row size and the fastest kept.
    #[arg(long, default_value = "auto")]
    pub(crate) prefetch: Prefetch,
    /// The memory ceiling's prefetch distance in ids [default: the fastest of several, timed
    /// on the run's batches].
    #[arg(long)]
    pub(crate) ceiling_prefetch: Option<usize>,
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
    /// Write an HTML page of plots (bench embed: lookups/s against the memory ceiling, run by
    /// run; bench tiered: hit rate and lookups/s per cache policy) to this file.
    #[arg(long, value_name = "FILE.html")]
    pub(crate) report: Option<PathBuf>,
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

impl Shape {
    /// Bytes of every table in `dtype`.
    pub(crate) fn table_bytes(&self, dtype: DType) -> Result<usize> {
        self.rows
            .checked_mul(dtype.row_bytes(self.dim))
            .and_then(|b| b.checked_mul(self.tables))
            .context("table size overflows")
    }
}

/// The flags resolved: shape, where ids come from, the kernel family.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) shape: Shape,
    pub(crate) source: IdSource,
    pub(crate) isa: Isa,
}

impl EmbedArgs {
    /// The shape (preset, then flags), where ids come from and the kernel family.
    pub(crate) fn setup(&self) -> Result<Setup> {
        let shape = resolve(self)?;
        let source: IdSource = self
            .ids
            .parse()
            .with_context(|| format!("--ids {}", self.ids))?;
        let isa = match self.isa {
            Some(i) => i.require()?,
            None => Isa::selected()?,
        };
        Ok(Setup { shape, source, isa })
    }

    /// The pooler the flags ask for.
    pub(crate) fn pooler(&self, isa: Isa) -> Result<Pooler> {
        Ok(Pooler::new(PoolOptions {
            pooling: self.mode,
            dedup: self.dedup,
            threads: self.threads,
            prefetch: self.prefetch,
            isa: Some(isa),
        })?)
    }

    /// How table memory is backed.
    pub(crate) fn pages(&self) -> PagePolicy {
        match self.huge_pages {
            OnOff::On => PagePolicy::Huge,
            OnOff::Off => PagePolicy::Small,
        }
    }
}

fn resolve(a: &EmbedArgs) -> Result<Shape> {
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

/// Refuses tables that would not fit the memory available.
pub(crate) fn check_memory(a: &EmbedArgs, s: Shape, total_bytes: usize) -> Result<()> {
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
    Ok(())
}

/// The tables `t0 ..` in memory, rows from [`seeded_row`], filled on every core; with the bytes
/// the OS backs with huge pages, when it tells.
pub(crate) fn seeded_tables(
    a: &EmbedArgs,
    s: Shape,
    pages: PagePolicy,
) -> Result<(EmbeddingCollection, Option<usize>)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut tables = Vec::with_capacity(s.tables);
    for t in 0..s.tables {
        let mut table = EmbeddingTable::zeroed(&format!("t{t}"), s.rows, s.dim, a.dtype, pages)?;
        table.fill_rows(threads, |r, out| seeded_row(a.seed, t, r, out));
        tables.push(table);
    }
    let huge: Option<usize> = tables.iter().map(|t| t.huge_page_bytes()).sum();
    Ok((EmbeddingCollection::one_feature_per_table(tables)?, huge))
}

/// [`seeded_tables`] with a progress line on stderr.
pub(crate) fn build_tables(
    a: &EmbedArgs,
    s: Shape,
    total_bytes: usize,
) -> Result<(EmbeddingCollection, Option<usize>)> {
    let t0 = Instant::now();
    eprint!(
        "building {} tables ({})... ",
        s.tables,
        human_bytes(total_bytes)
    );
    let built = seeded_tables(a, s, a.pages())?;
    eprintln!("{:.1} s", t0.elapsed().as_secs_f64());
    Ok(built)
}

/// `n` batches of the workload (weighted when the mode is).
pub(crate) fn batches(
    a: &EmbedArgs,
    s: Shape,
    source: &IdSource,
    n: usize,
) -> Result<Vec<KeyedJagged>> {
    let spec = WorkloadSpec {
        rows: vec![s.rows; s.tables],
        batch_size: s.batch,
        pooling: s.pooling,
        seed: a.seed,
    };
    let batches = generate(&spec, source, n)?;
    if a.mode != Pooling::WeightedSum {
        return Ok(batches);
    }
    Ok(batches
        .into_iter()
        .map(with_weights)
        .collect::<Result<_, _>>()?)
}

/// Distinct ids / ids of the batches.
pub(crate) fn uniq(batches: &[KeyedJagged]) -> f64 {
    unique_ratio(batches)
}

/// Adds deterministic per-id weights in [0.5, 1.5) to a batch.
fn with_weights(kj: KeyedJagged) -> Result<KeyedJagged, EmbedError> {
    let w = (0..kj.num_ids())
        .map(|i| 0.5 + ((i * 2_654_435_761) % 1000) as f32 / 1000.0)
        .collect();
    kj.with_weights(w)
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
        "prefetch": a.prefetch.to_string(),
        "row_bytes": row_bytes,
        "table_bytes": s.tables * s.rows * row_bytes,
    });
    if let (Some(j), serde_json::Value::Object(f)) = (j.as_object_mut(), fields) {
        j.extend(f);
    }
}
