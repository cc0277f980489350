//! `ember bench tiered`: the embedding stage with every table on the SSD tier, side by side in one
//! run with the same tables fully in DRAM, with a plain mmap of the same row files after dropping
//! them from the page cache, and with the disk's own random-read rate.
//!
//! Set up: write the row files (reused when a file of the same shape and seed exists) and
//! generate every batch's ids. Measure: the disk's random 4 KiB read rate with direct I/O; for
//! each cache policy, warm the cache on `--warmup-batches` batches and time `--runs` runs of
//! `--batches` fresh batches each, staged `--prefetch-depth` batches ahead; the DRAM tables
//! (rebuilt from the seed) on the same batches, checked bit for bit against the tier's output;
//! the cold mmap ([`mmap`]). Report: medians of the runs ([`report`]).

mod files;
mod layout;
mod mmap;
mod pairs;
mod policies;
mod report;

use crate::units::{human_bytes, mem_available};
use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_bench::disk::random_read_rate;
use ember_bench::stats::median;
use ember_bench::workload::IdSource;
use ember_embed::rowfile::{BLOCK, RowFile};
use ember_embed::trace::load_trace;
use ember_embed::{EmbeddingCollection, KeyedJagged, Pooler};
use ember_tier::storage::io::IoEngine;
use ember_tier::{CachePolicy, IoMode};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::setup::{self, EmbedArgs, OnOff, Shape};
use pairs::run_dram;
pub(crate) use pairs::{WarmPairs, batches_before, run_tier};
use policies::{Files, Peers, measure_policies};
use report::{Disk, Report};

#[derive(Debug, Args)]
pub struct TieredArgs {
    #[command(flatten)]
    embed: EmbedArgs,
    /// Directory of the row files (written once, reused by later runs with the same shape).
    #[arg(long, default_value = "ember-tier-bench")]
    dir: PathBuf,
    /// DRAM budget of the row cache, MiB.
    #[arg(long, default_value_t = 1024)]
    cache_mb: usize,
    /// Cache policies to run, comma-separated (lru, lfu, pinned).
    #[arg(long, value_delimiter = ',', default_value = "lru,lfu,pinned")]
    policies: Vec<CachePolicy>,
    /// Batches staged ahead of the one being pooled (0: no overlap).
    #[arg(long, default_value_t = 1)]
    prefetch_depth: usize,
    /// How row files are read: auto, uring or pread (direct I/O), or mmap (through the page cache).
    #[arg(long, default_value = "auto")]
    io: IoMode,
    /// Reads in flight at most.
    #[arg(long, default_value_t = 128)]
    queue_depth: usize,
    /// Profile for the pinned policy's hot set [default: the --ids trace when it is one; else the
    /// pinned set is refreshed from live counts].
    #[arg(long)]
    pin_trace: Option<PathBuf>,
    /// Share of each table's cache the pinned policy pins, the rest being LRU [default: 1 with a
    /// pin trace, 0.9 without].
    #[arg(long)]
    pin_fraction: Option<f64>,
    /// Batches that warm the cache before timing [default: --batches x --runs].
    #[arg(long)]
    warmup_batches: Option<usize>,
    /// Timed runs of the cold mmap (each after dropping the files from the page cache).
    #[arg(long, default_value_t = 2)]
    mmap_runs: usize,
    /// Skip the DRAM baseline (it needs the tables' size in free memory).
    #[arg(long)]
    no_dram: bool,
    /// Skip the cold-mmap baseline.
    #[arg(long)]
    no_mmap: bool,
    /// Also time the mmap with only the cache's memory: a child process in a memory cgroup of
    /// --cache-mb (+32 MiB), so that its page cache gets the tier's budget, as when tables are
    /// larger than memory (needs root and cgroup v1's memory controller; skipped with a note
    /// otherwise).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    mmap_budget: OnOff,
    /// Longest an mmap run may take, in seconds: a run stops after the batch that crosses it and
    /// reports the lookups it did per second (a budgeted mmap can thrash for hours).
    #[arg(long, default_value_t = 60.0)]
    mmap_max_secs: f64,
    /// (internal) Run only the cold-mmap timing, inside this memory cgroup.
    #[arg(long, hide = true)]
    mmap_child: Option<PathBuf>,
    /// Seconds of the disk random-read measurement.
    #[arg(long, default_value_t = 3.0)]
    disk_secs: f64,
    /// Cache policies to run again on row files laid out by a profile (hot rows first, the rest
    /// by first access; comma-separated; empty to skip).
    #[arg(long, value_delimiter = ',', default_value = "pinned")]
    layout_policies: Vec<CachePolicy>,
    /// Profile the laid-out files are placed by (an id trace) [default: the --ids trace when it is
    /// one; without either the layout is skipped].
    #[arg(long)]
    layout_profile: Option<PathBuf>,
    /// Rows placed first by heat [default: the rows each table's share of --cache-mb holds].
    #[arg(long)]
    layout_hot_rows: Option<usize>,
}

/// The batches: warm-up ones, then `runs` runs of `batches` timed ones.
struct Batches {
    warmup: Vec<KeyedJagged>,
    timed: Vec<KeyedJagged>,
    /// Lookups in one timed run.
    lookups_per_run: usize,
}

impl Batches {
    fn runs(&self, batches: usize) -> Vec<&[KeyedJagged]> {
        self.timed.chunks(batches).collect()
    }
}

/// Runs `bench tiered`: sets up the files and batches, measures the disk, the tier under each
/// policy, DRAM and mmap, then prints the report (and writes `--report`).
pub fn run(t: TieredArgs) -> Result<()> {
    let a = &t.embed;
    let setup::Setup {
        shape: s,
        source,
        isa,
    } = a.setup()?;
    ensure!(
        !t.policies.is_empty(),
        "--policies needs at least one policy"
    );
    let paths = row_files(&t, s, None)?;
    let work = batches(&t, s, &source)?;
    let pin_trace = pin_trace(&t, &source)?;
    let pooler = a.pooler(isa)?;
    let runs = work.runs(a.batches);
    let shape = (s.batch * s.tables * s.dim, work.lookups_per_run);
    if let Some(cg) = &t.mmap_child {
        return mmap_child(&t, cg, &paths, &pooler, &runs, shape);
    }
    let disk = measure_disk(&t, &paths)?;
    // The DRAM tables first: each tier run is paired with a DRAM run of the same batches.
    let laid = layout::laid_out_files(&t, s, &source)?;
    let dram_coll = dram_tables(&t, s)?;
    let peers = Peers {
        disk_iops: disk.iops,
        dram: dram_coll.as_ref(),
    };
    let mut sets: Vec<Files<'_>> = vec![(&paths, &t.policies, None)];
    if let Some(l) = &laid {
        sets.push((&l.paths, &t.layout_policies, Some(l)));
    }
    let (mut policies, mut outs) = (Vec::new(), Vec::new());
    for files in sets {
        let (p, o) = measure_policies(&t, s, files, &pooler, &work, pin_trace.clone(), &peers)?;
        policies.extend(p);
        outs.extend(o);
    }
    let (dram, checked) = measure_dram(
        dram_coll.as_ref(),
        s,
        &pooler,
        &runs,
        work.lookups_per_run,
        &outs,
    )?;
    drop(dram_coll);
    let (mmap, mmap_budget) = measure_mmap(&t, &paths, &pooler, &runs, shape)?;
    let report = Report {
        policies,
        dram,
        checked,
        mmap,
        mmap_budget,
        disk,
        warmup: work.warmup.len(),
        ids: source.describe(),
        uniq: setup::uniq(&work.timed),
        isa,
        total_bytes: s.tables * s.rows * a.dtype.row_bytes(s.dim),
        cache_bytes: t.cache_mb << 20,
    };
    report.print(&t, s);
    if let Some(path) = &t.embed.report {
        report.page(&t, s).write(path)?;
    }
    Ok(())
}

/// The pinned policy's profile: `--pin-trace`, else the `--ids` trace when it is one (`None`:
/// the pinned set is refreshed from live counts).
fn pin_trace(t: &TieredArgs, source: &IdSource) -> Result<Option<Arc<Vec<u64>>>> {
    Ok(match (&t.pin_trace, source) {
        (Some(p), _) => Some(Arc::new(load_trace(p)?)),
        (None, IdSource::Trace { ids, .. }) => Some(ids.clone()),
        _ => None,
    })
}

/// The cold mmap's runs: lookups/s of each, and the resident fraction before each.
type MmapRuns = (Vec<f64>, Vec<f64>);

/// The mmap baselines (none with `--no-mmap`): the cold mmap's runs (lookups/s and the
/// resident fraction before each), and with `--mmap-budget on` the budgeted mmap child's JSON
/// (skipped, saying why, where it cannot run). `shape`: (floats of a batch's output, lookups
/// of a run).
fn measure_mmap(
    t: &TieredArgs,
    paths: &[PathBuf],
    pooler: &Pooler,
    runs: &[&[KeyedJagged]],
    shape: (usize, usize),
) -> Result<(Option<MmapRuns>, Option<Value>)> {
    if t.no_mmap || t.mmap_runs == 0 {
        return Ok((None, None));
    }
    let base = mmap::Baseline {
        paths,
        pooler,
        runs,
        out_len: shape.0,
    };
    let mmap = mmap::cold_mmap_runs(&base, t.mmap_runs, t.mmap_max_secs, "mmap (cold)", false)?;
    let mut mmap_budget = None;
    if t.mmap_budget == OnOff::On {
        let batch_lookups = shape.1 / t.embed.batches;
        match mmap::budgeted_mmap(
            (t.cache_mb << 20) + (32 << 20),
            t.mmap_max_secs,
            t.mmap_runs,
            batch_lookups,
        ) {
            Ok(v) => mmap_budget = Some(v),
            Err(e) => eprintln!("mmap with the cache budget: skipped ({e:#})"),
        }
    }
    Ok((Some(mmap), mmap_budget))
}

/// The row files, written where missing: in id order, or placed by a layout (whose tag ends
/// their names, so that another layout writes other files).
fn row_files(
    t: &TieredArgs,
    s: Shape,
    layout: Option<(&ember_embed::rowfile::RowLayout, &str)>,
) -> Result<Vec<PathBuf>> {
    let a = &t.embed;
    std::fs::create_dir_all(&t.dir).with_context(|| format!("creating {}", t.dir.display()))?;
    let tag = layout.map_or("", |(_, tag)| tag);
    let paths: Vec<PathBuf> = (0..s.tables)
        .map(|i| {
            t.dir.join(format!(
                "t{i}-{}x{}-{}-seed{}{tag}.rows",
                s.rows, s.dim, a.dtype, a.seed
            ))
        })
        .collect();
    for (i, p) in paths.iter().enumerate() {
        let l = layout.map(|(l, _)| l);
        files::ensure_row_file(p, i, s.rows, s.dim, a.dtype, a.seed, l)?;
    }
    Ok(paths)
}

/// Warm-up batches, then `runs` sets of timed batches.
fn batches(t: &TieredArgs, s: Shape, source: &IdSource) -> Result<Batches> {
    let a = &t.embed;
    let warm = t.warmup_batches.unwrap_or(a.batches * a.runs);
    let mut warmup = setup::batches(a, s, source, warm + a.batches * a.runs)?;
    let timed = warmup.split_off(warm);
    let lookups_per_run = timed[..a.batches].iter().map(|b| b.num_ids()).sum();
    Ok(Batches {
        warmup,
        timed,
        lookups_per_run,
    })
}

/// The child of the budgeted mmap run: joins the cgroup, then times as the parent does.
fn mmap_child(
    t: &TieredArgs,
    cg: &std::path::Path,
    paths: &[PathBuf],
    pooler: &Pooler,
    runs: &[&[KeyedJagged]],
    shape: (usize, usize),
) -> Result<()> {
    std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
        .with_context(|| format!("joining {}", cg.display()))?;
    println!("timing");
    std::io::Write::flush(&mut std::io::stdout())?;
    let base = mmap::Baseline {
        paths,
        pooler,
        runs,
        out_len: shape.0,
    };
    let (lps, resident) =
        mmap::cold_mmap_runs(&base, t.mmap_runs, t.mmap_max_secs, "mmap (budget)", true)?;
    println!(
        "{}",
        json!({"run_lookups_per_s": lps, "resident_fraction_before": resident})
    );
    Ok(())
}

/// The disk's own rate, with the engine the tier uses (io_uring or pread; for `--io mmap`, the
/// engine `auto` picks).
fn measure_disk(t: &TieredArgs, paths: &[PathBuf]) -> Result<Disk> {
    let opened: Vec<RowFile> = paths
        .iter()
        .map(|p| RowFile::open(p))
        .collect::<Result<_, _>>()?;
    let mode = match t.io {
        IoMode::Mmap => IoMode::Auto,
        m => m,
    };
    let mut engine = IoEngine::new(mode, t.queue_depth).context("starting I/O")?;
    let files: Vec<&std::fs::File> = opened.iter().map(|f| f.file()).collect();
    let lens: Vec<u64> = opened.iter().map(|f| f.header().file_bytes()).collect();
    eprint!(
        "disk: random {BLOCK}-byte direct reads, {} in flight... ",
        t.queue_depth
    );
    let (iops, bytes_per_s) =
        random_read_rate(&mut engine, &files, &lens, BLOCK, t.disk_secs, t.embed.seed)
            .context("measuring the disk")?;
    eprintln!(
        "{:.0} reads/s, {:.0} MB/s ({})",
        iops,
        bytes_per_s / 1e6,
        engine.kind()
    );
    Ok(Disk {
        iops,
        bytes_per_s,
        direct: opened.iter().all(|f| f.direct()) && t.io != IoMode::Mmap,
    })
}

/// The same tables built in memory from the seed (`None`, saying why, when `--no-dram` or when
/// they do not fit the memory available; the cache is allowed for).
fn dram_tables(t: &TieredArgs, s: Shape) -> Result<Option<EmbeddingCollection>> {
    let a = &t.embed;
    if t.no_dram {
        return Ok(None);
    }
    let total_bytes = s.tables * s.rows * a.dtype.row_bytes(s.dim);
    let need = total_bytes + (t.cache_mb << 20);
    if let Some(avail) = mem_available()
        && need as f64 > 0.85 * avail as f64
    {
        eprintln!(
            "dram: skipped, {} of tables and {} of cache but {} of memory available",
            human_bytes(total_bytes),
            human_bytes(t.cache_mb << 20),
            human_bytes(avail)
        );
        return Ok(None);
    }
    let t0 = Instant::now();
    let (coll, _) = setup::seeded_tables(a, s, a.pages())?;
    eprintln!(
        "dram: built {} in {:.1} s",
        human_bytes(total_bytes),
        t0.elapsed().as_secs_f64()
    );
    Ok(Some(coll))
}

/// The DRAM tables on the same batches as the tier: lookups/s
/// per run, and whether every policy's output equalled theirs bit for bit (skipped, saying why,
/// when the tables do not fit the memory available).
fn measure_dram(
    coll: Option<&EmbeddingCollection>,
    s: Shape,
    pooler: &Pooler,
    runs: &[&[KeyedJagged]],
    lookups_per_run: usize,
    outs: &[(String, Vec<f32>)],
) -> Result<(Option<Vec<f64>>, Option<bool>)> {
    let Some(coll) = coll else {
        return Ok((None, None));
    };
    let mut out = vec![0f32; s.batch * s.tables * s.dim];
    // Warm-up, then the same timed batches as the tier.
    run_dram(coll, pooler, runs[0], &mut out)?;
    let mut lps = Vec::new();
    for batches in runs {
        let t0 = Instant::now();
        run_dram(coll, pooler, batches, &mut out)?;
        lps.push(lookups_per_run as f64 / t0.elapsed().as_secs_f64());
    }
    let mut checked = None;
    if !outs.is_empty() {
        // Each policy's output on the last batch of its first run, against DRAM's.
        let last = runs[0].last().context("no batches")?;
        pooler.run(coll, coll.check_view(last)?, &mut out)?;
        for (policy, tier_out) in outs {
            let same = tier_out.len() == out.len()
                && tier_out
                    .iter()
                    .zip(&out)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
            ensure!(
                same,
                "the tier's pooled output ({policy}) differs from the DRAM tables'"
            );
        }
        checked = Some(true);
    }
    eprintln!("dram: {:.2} M lookups/s", median(&lps) / 1e6);
    Ok((Some(lps), checked))
}
