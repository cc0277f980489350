//! `ember bench tiered`: the embedding stage with every table on the SSD tier, side by side in one
//! run with the same tables fully in DRAM, with a plain mmap of the same row files after dropping
//! them from the page cache, and with the disk's own random-read rate.
//!
//! Steps: write the row files (reused when a file of the same shape and seed exists), generate
//! every batch's ids, measure the disk's random 4 KiB read rate with direct I/O, then for each
//! cache policy: warm the cache on `--warmup-batches` batches, and time `--runs` runs of
//! `--batches` fresh batches each, staged `--prefetch-depth` batches ahead. Then the DRAM tables
//! (rebuilt from the seed) on the same batches, checked bit for bit against the tier's output, and
//! last the cold mmap. Medians of the runs are reported; `--json` prints one JSON object last.

use crate::bench_embed::{EmbedArgs, OnOff, add_workload, resolve, with_weights};
use crate::stats::{human_bytes, median, mem_available};
use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_embed::tier::io::{IoEngine, random_read_rate};
use ember_embed::tier::rowfile::{BLOCK, RowFile, RowFileWriter, evict_page_cache};
use ember_embed::tier::{CachePolicy, IoMode, Stager, TierOptions, pipeline};
use ember_embed::workload::{IdSource, WorkloadSpec, generate, seeded_row, unique_ratio};
use ember_embed::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

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
    /// I/O engine: auto, uring or pread.
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
}

pub fn run(t: TieredArgs) -> Result<()> {
    let a = &t.embed;
    let s = resolve(a)?;
    ensure!(
        !t.policies.is_empty(),
        "--policies needs at least one policy"
    );
    let source: IdSource = a.ids.parse().with_context(|| format!("--ids {}", a.ids))?;
    let isa = match a.isa {
        Some(i) => i.require()?,
        None => Isa::selected()?,
    };
    let row_bytes = a.dtype.row_bytes(s.dim);
    let total_bytes = s.tables * s.rows * row_bytes;
    let cache_bytes = t.cache_mb << 20;

    // Row files.
    std::fs::create_dir_all(&t.dir).with_context(|| format!("creating {}", t.dir.display()))?;
    let paths: Vec<PathBuf> = (0..s.tables)
        .map(|i| {
            t.dir.join(format!(
                "t{i}-{}x{}-{}-seed{}.rows",
                s.rows, s.dim, a.dtype, a.seed
            ))
        })
        .collect();
    for (i, p) in paths.iter().enumerate() {
        ensure_row_file(p, i, s.rows, s.dim, a.dtype, a.seed)?;
    }

    // Ids: warm-up batches, then `runs` sets of timed batches.
    let warm = t.warmup_batches.unwrap_or(a.batches * a.runs);
    let spec = WorkloadSpec {
        rows: vec![s.rows; s.tables],
        batch_size: s.batch,
        pooling: s.pooling,
        seed: a.seed,
    };
    let mut all = generate(&spec, &source, warm + a.batches * a.runs)?;
    if a.mode == Pooling::WeightedSum {
        all = all
            .into_iter()
            .map(with_weights)
            .collect::<Result<_, _>>()?;
    }
    let timed = all.split_off(warm);
    let warmup = all;
    let runs: Vec<&[KeyedJagged]> = timed.chunks(a.batches).collect();
    let lookups_per_run = runs[0].iter().map(|b| b.num_ids()).sum::<usize>();
    let uniq = unique_ratio(&timed);
    let pin_trace: Option<Arc<Vec<u64>>> = match (&t.pin_trace, &source) {
        (Some(p), _) => Some(Arc::new(workload::load_trace(p)?)),
        (None, IdSource::Trace { ids, .. }) => Some(ids.clone()),
        _ => None,
    };
    let pool_opts = PoolOptions {
        pooling: a.mode,
        dedup: a.dedup,
        threads: a.threads,
        prefetch_distance: a.prefetch,
        isa: Some(isa),
    };
    let pooler = Pooler::new(pool_opts)?;
    let width = s.tables * s.dim;
    let shape = (s.batch * width, lookups_per_run);

    if let Some(cg) = &t.mmap_child {
        // The child of the budgeted mmap run: join the cgroup, then time as the parent does.
        std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
            .with_context(|| format!("joining {}", cg.display()))?;
        println!("timing");
        std::io::Write::flush(&mut std::io::stdout())?;
        let (lps, resident) = cold_mmap_runs(
            &paths,
            &pooler,
            &runs,
            t.mmap_runs,
            shape,
            t.mmap_max_secs,
            "mmap (budget)",
            true,
        )?;
        println!(
            "{}",
            json!({"run_lookups_per_s": lps, "resident_fraction_before": resident})
        );
        return Ok(());
    }

    // The disk's own rate, with the engine the tier uses.
    let opened: Vec<RowFile> = paths
        .iter()
        .map(|p| RowFile::open(p))
        .collect::<Result<_, _>>()?;
    let mut engine = IoEngine::new(t.io, t.queue_depth).context("starting I/O")?;
    let files: Vec<&std::fs::File> = opened.iter().map(|f| f.file()).collect();
    let lens: Vec<u64> = opened.iter().map(|f| f.header().file_bytes()).collect();
    eprint!(
        "disk: random {BLOCK}-byte direct reads, {} in flight... ",
        t.queue_depth
    );
    let (disk_iops, disk_bps) =
        random_read_rate(&mut engine, &files, &lens, BLOCK, t.disk_secs, a.seed)
            .context("measuring the disk")?;
    eprintln!(
        "{:.0} reads/s, {:.0} MB/s ({})",
        disk_iops,
        disk_bps / 1e6,
        engine.kind()
    );
    let direct = opened.iter().all(|f| f.direct());
    drop(engine);
    drop(opened);

    // The tier, once per policy.
    let tier_coll = EmbeddingCollection::one_feature_per_table(
        paths
            .iter()
            .map(|p| EmbeddingTable::open_ssd(p))
            .collect::<Result<_, _>>()?,
    )?;
    let mut policy_results = Vec::new();
    // Each policy's output on the last batch of its first run, checked against DRAM's.
    let mut outs: Vec<(CachePolicy, Vec<f32>)> = Vec::new();
    for &policy in &t.policies {
        let opts = TierOptions {
            cache_bytes,
            policy,
            io: t.io,
            queue_depth: t.queue_depth,
            pin_trace: pin_trace.clone(),
            pin_fraction: t.pin_fraction,
            ..TierOptions::default()
        };
        let t0 = Instant::now();
        let stager = Stager::new(&tier_coll, opts)?;
        let setup_s = t0.elapsed().as_secs_f64();
        let mut out = vec![0f32; s.batch * width];
        let t0 = Instant::now();
        run_tier(
            &stager,
            &tier_coll,
            &pooler,
            &warmup,
            t.prefetch_depth,
            &mut out,
            &mut None,
        )?;
        eprintln!(
            "{policy}: setup {setup_s:.1} s, warm-up {} batches {:.1} s, hit rate {:.3}",
            warmup.len(),
            t0.elapsed().as_secs_f64(),
            stager.stats().hit_rate()
        );
        stager.reset_stats();
        let mut lps = Vec::new();
        for (r, batches) in runs.iter().enumerate() {
            let mut keep = (r == 0).then(Vec::new);
            let t0 = Instant::now();
            run_tier(
                &stager,
                &tier_coll,
                &pooler,
                batches,
                t.prefetch_depth,
                &mut out,
                &mut keep,
            )?;
            lps.push(lookups_per_run as f64 / t0.elapsed().as_secs_f64());
            if let Some(k) = keep {
                outs.push((policy, k));
            }
        }
        stager.check_invariants(cache_bytes);
        let st = stager.stats();
        let secs: f64 = lps.iter().map(|l| lookups_per_run as f64 / l).sum();
        let (cached_bytes, _) = stager.cache_usage();
        eprintln!(
            "{policy}: {:.2} M lookups/s (median of {}), hit rate {:.3} (per lookup {:.3}), {} read",
            median(&lps) / 1e6,
            lps.len(),
            st.hit_rate(),
            st.lookup_hit_rate(),
            human_bytes(st.ssd_bytes_read as usize)
        );
        policy_results.push(json!({
            "policy": policy.name(),
            "lookups_per_s": median(&lps),
            "run_lookups_per_s": lps,
            "hit_rate": st.hit_rate(),
            "lookup_hit_rate": st.lookup_hit_rate(),
            "ssd_bytes_read": st.ssd_bytes_read,
            "ssd_reads": st.ssd_reads,
            "ssd_reads_per_s": st.ssd_reads as f64 / secs,
            "fraction_of_disk_ceiling": st.ssd_reads as f64 / secs / disk_iops,
            "overlap": st.overlap(),
            "stall_s": st.stall.as_secs_f64(),
            "stage_s": st.stage.as_secs_f64(),
            "io_wait_s": st.io.as_secs_f64(),
            "cache_bytes_used": cached_bytes,
            "setup_s": setup_s,
        }));
    }
    drop(tier_coll);

    // DRAM: the same tables built in memory from the seed.
    let mut dram = None;
    let mut check = None;
    if !t.no_dram {
        if let Some(avail) = mem_available()
            && total_bytes as f64 > 0.85 * avail as f64
        {
            eprintln!(
                "dram: skipped, {} of tables but {} of memory available",
                human_bytes(total_bytes),
                human_bytes(avail)
            );
        } else {
            let t0 = Instant::now();
            let pages = if a.huge_pages == OnOff::On {
                PagePolicy::Huge
            } else {
                PagePolicy::Small
            };
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mut tables = Vec::with_capacity(s.tables);
            for i in 0..s.tables {
                let mut tb =
                    EmbeddingTable::zeroed(&format!("t{i}"), s.rows, s.dim, a.dtype, pages)?;
                tb.fill_rows(threads, |r, out| seeded_row(a.seed, i, r, out));
                tables.push(tb);
            }
            let coll = EmbeddingCollection::one_feature_per_table(tables)?;
            eprintln!(
                "dram: built {} in {:.1} s",
                human_bytes(total_bytes),
                t0.elapsed().as_secs_f64()
            );
            let mut out = vec![0f32; s.batch * width];
            // Warm-up, then the same timed batches as the tier.
            run_dram(&coll, &pooler, runs[0], &mut out)?;
            let mut lps = Vec::new();
            for batches in &runs {
                let t0 = Instant::now();
                run_dram(&coll, &pooler, batches, &mut out)?;
                lps.push(lookups_per_run as f64 / t0.elapsed().as_secs_f64());
            }
            if !outs.is_empty() {
                // Each policy's output on the last batch of its first run, against DRAM's.
                let last = runs[0].last().context("no batches")?;
                pooler.run(&coll, coll.validate(last)?, &mut out)?;
                for (policy, tier_out) in &outs {
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
                check = Some(true);
            }
            eprintln!("dram: {:.2} M lookups/s", median(&lps) / 1e6);
            dram = Some(lps);
        }
    }

    // Cold mmap: the files dropped from the page cache before each run.
    let mut mmap = None;
    let mut mmap_budget = None;
    if !t.no_mmap && t.mmap_runs > 0 {
        mmap = Some(cold_mmap_runs(
            &paths,
            &pooler,
            &runs,
            t.mmap_runs,
            shape,
            t.mmap_max_secs,
            "mmap (cold)",
            false,
        )?);
        if t.mmap_budget == OnOff::On {
            let batch_lookups = lookups_per_run / a.batches;
            match budgeted_mmap(
                cache_bytes + (32 << 20),
                t.mmap_max_secs,
                t.mmap_runs,
                batch_lookups,
            ) {
                Ok(v) => mmap_budget = Some(v),
                Err(e) => eprintln!("mmap with the cache budget: skipped ({e:#})"),
            }
        }
    }

    // Report.
    let best = policy_results
        .iter()
        .max_by(|x, y| {
            x["lookups_per_s"]
                .as_f64()
                .partial_cmp(&y["lookups_per_s"].as_f64())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned()
        .unwrap_or(Value::Null);
    let best_lps = best["lookups_per_s"].as_f64().unwrap_or(0.0);
    let dram_lps = dram.as_ref().map(|v| median(v));
    let mmap_lps = mmap.as_ref().map(|(v, _)| median(v));
    let budget_lps: Option<f64> = mmap_budget.as_ref().and_then(|j: &Value| {
        let v: Vec<f64> = j["run_lookups_per_s"]
            .as_array()?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        (!v.is_empty()).then(|| median(&v))
    });
    let budget_bound: Option<f64> = mmap_budget
        .as_ref()
        .and_then(|j| j["upper_bound_lookups_per_s"].as_f64());
    println!(
        "ember bench tiered: {} tables x {} rows x dim {} {} ({} on {}), cache {} MiB, pooling {}, batch {}, mode {}",
        s.tables,
        s.rows,
        s.dim,
        a.dtype,
        human_bytes(total_bytes),
        t.dir.display(),
        t.cache_mb,
        s.pooling,
        s.batch,
        a.mode.name()
    );
    println!(
        "  ids {}, unique ratio {:.3}; {} threads, isa {}, prefetch {}, dedup {}; I/O {} ({}), queue depth {}, prefetch depth {}",
        source.describe(),
        uniq,
        a.threads,
        isa,
        a.prefetch,
        a.dedup,
        t.io.name(),
        if direct { "O_DIRECT" } else { "buffered" },
        t.queue_depth,
        t.prefetch_depth
    );
    println!(
        "  disk ceiling: {:.0} random {BLOCK}-byte reads/s ({:.0} MB/s)",
        disk_iops,
        disk_bps / 1e6
    );
    println!(
        "  hit rate: distinct rows per batch found in the cache (what reads follow); per id: lookups served from the cache"
    );
    println!(
        "  {} warm-up batches, then {} runs x {} batches, medians:",
        warmup.len(),
        a.runs,
        a.batches
    );
    println!(
        "  {:<14} {:>12} {:>9} {:>9} {:>10} {:>12} {:>10} {:>8}",
        "", "lookups/s", "hit rate", "per id", "SSD reads/s", "% of disk", "SSD bytes", "overlap"
    );
    for p in &policy_results {
        println!(
            "  {:<14} {:>10.3} M {:>9.3} {:>9.3} {:>10.0} {:>11.1}% {:>10} {:>8.2}",
            format!("tier {}", p["policy"].as_str().unwrap_or("?")),
            p["lookups_per_s"].as_f64().unwrap_or(0.0) / 1e6,
            p["hit_rate"].as_f64().unwrap_or(0.0),
            p["lookup_hit_rate"].as_f64().unwrap_or(0.0),
            p["ssd_reads_per_s"].as_f64().unwrap_or(0.0),
            100.0 * p["fraction_of_disk_ceiling"].as_f64().unwrap_or(0.0),
            human_bytes(p["ssd_bytes_read"].as_u64().unwrap_or(0) as usize),
            p["overlap"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(d) = dram_lps {
        println!("  {:<14} {:>10.3} M", "dram", d / 1e6);
    }
    if let Some(m) = mmap_lps {
        println!("  {:<14} {:>10.3} M", "mmap (cold)", m / 1e6);
    }
    if let Some(m) = budget_lps {
        println!(
            "  {:<14} {:>10.3} M   (cold, page cache limited to the cache budget)",
            "mmap (budget)",
            m / 1e6
        );
    }
    if let Some(m) = budget_bound {
        println!(
            "  {:<14} < {:>8.4} M   (cold, page cache limited to the cache budget; stopped before its runs finished)",
            "mmap (budget)",
            m / 1e6
        );
    }
    if let Some(d) = dram_lps {
        println!("  best tier / dram: {:.3}x", best_lps / d);
    }
    if let Some(m) = mmap_lps {
        println!("  best tier / cold mmap: {:.2}x", best_lps / m);
    }
    if let Some(m) = budget_lps {
        println!(
            "  best tier / mmap with the same memory: {:.2}x",
            best_lps / m
        );
    }
    if let Some(m) = budget_bound {
        println!(
            "  best tier / mmap with the same memory: more than {:.0}x",
            best_lps / m
        );
    }
    if check == Some(true) {
        println!("  check: every policy's pooled output equals the DRAM tables' bit for bit");
    }
    if a.json {
        let mut j = json!({
            "lookups_per_s": best_lps,
            "gb_per_s": best_lps * row_bytes as f64 / 1e9,
            "ns_per_lookup": 1e9 / best_lps.max(1e-9),
            "policy": best["policy"],
            "hit_rate": best["hit_rate"],
            "lookup_hit_rate": best["lookup_hit_rate"],
            "ssd_bytes_read": best["ssd_bytes_read"],
            "overlap": best["overlap"],
            "policies": policy_results,
            "dram_lookups_per_s": dram_lps,
            "dram_run_lookups_per_s": dram,
            "mmap_cold_lookups_per_s": mmap_lps,
            "mmap_cold_run_lookups_per_s": mmap.as_ref().map(|(v, _)| v.clone()),
            "mmap_resident_fraction_before": mmap.as_ref().map(|(_, r)| r.clone()),
            "ratio_to_dram": dram_lps.map(|d| best_lps / d),
            "ratio_to_mmap_cold": mmap_lps.map(|m| best_lps / m),
            "mmap_budget_lookups_per_s": budget_lps,
            "mmap_budget_run_lookups_per_s": mmap_budget.as_ref().map(|j| j["run_lookups_per_s"].clone()),
            "ratio_to_mmap_budget": budget_lps.map(|m| best_lps / m),
            "mmap_budget_upper_bound_lookups_per_s": budget_bound,
            "ratio_to_mmap_budget_at_least": budget_bound.map(|m| best_lps / m),
            "disk_reads_per_s": disk_iops,
            "disk_bytes_per_s": disk_bps,
            "direct_io": direct,
            "io": t.io.name(),
            "queue_depth": t.queue_depth,
            "prefetch_depth": t.prefetch_depth,
            "cache_bytes": cache_bytes,
            "warmup_batches": warmup.len(),
            "checked_against_dram": check,
        });
        add_workload(&mut j, a, s, &source.describe(), isa.name(), uniq);
        println!("{j}");
    }
    Ok(())
}

/// Pools `batches` through the tier, `depth` batches staged ahead; keeps the last output in
/// `keep` when asked.
fn run_tier(
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
            pooler.run_staged(coll, coll.validate(kj)?, &staged, out)?;
            Ok(())
        },
    )?;
    if let Some(k) = keep {
        *k = out.to_vec();
    }
    Ok(())
}

/// Times `n` runs of a plain mmap of the row files, each after dropping them from the page cache;
/// returns lookups/s per run and the resident fraction before each.
#[allow(clippy::too_many_arguments)]
fn cold_mmap_runs(
    paths: &[PathBuf],
    pooler: &Pooler,
    runs: &[&[KeyedJagged]],
    n: usize,
    (out_len, _): (usize, usize),
    max_secs: f64,
    what: &str,
    report_runs: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let (mut lps, mut resident) = (Vec::new(), Vec::new());
    for r in 0..n {
        let batches = runs[r % runs.len()];
        resident.push(drop_page_cache(paths)?);
        let coll = EmbeddingCollection::one_feature_per_table(
            paths
                .iter()
                .map(|p| EmbeddingTable::map_row_file(p))
                .collect::<Result<_, _>>()?,
        )?;
        let mut out = vec![0f32; out_len];
        let t0 = Instant::now();
        let (mut done, mut n) = (0usize, 0usize);
        for kj in batches.iter() {
            pooler.run(&coll, coll.validate(kj)?, &mut out)?;
            done += kj.num_ids();
            n += 1;
            if t0.elapsed().as_secs_f64() > max_secs {
                break;
            }
        }
        lps.push(done as f64 / t0.elapsed().as_secs_f64());
        if report_runs {
            println!("{}", json!({ "run": lps[r] }));
            std::io::Write::flush(&mut std::io::stdout())?;
        }
        eprintln!(
            "{what} run {r}: {:.3} M lookups/s ({n} of {} batches in {:.1} s)",
            lps[r] / 1e6,
            batches.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok((lps, resident))
}

/// Runs this benchmark again as a child in a new memory cgroup limited to `limit` bytes, timing
/// only the cold mmap; returns its JSON.
/// The child gets `max_secs` per run after it starts timing; one that has not finished by then
/// (a single thrashing batch can take many minutes) is stopped, and the result is an upper bound:
/// `{"upper_bound_lookups_per_s": one batch's lookups / the time it ran}`.
fn budgeted_mmap(limit: usize, max_secs: f64, runs: usize, batch_lookups: usize) -> Result<Value> {
    let groups = std::fs::read_to_string("/proc/self/cgroup")?;
    let rel = groups
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            ctl.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .context("no cgroup v1 memory controller in /proc/self/cgroup")?;
    let cg = PathBuf::from("/sys/fs/cgroup/memory")
        .join(rel.trim_start_matches('/'))
        .join(format!("ember-bench-{}", std::process::id()));
    std::fs::create_dir_all(&cg).with_context(|| format!("creating {}", cg.display()))?;
    let result = (|| -> Result<Value> {
        std::fs::write(cg.join("memory.limit_in_bytes"), limit.to_string())
            .context("setting memory.limit_in_bytes")?;
        let mut args: Vec<String> = std::env::args().skip(1).collect();
        args.extend(["--mmap-child".into(), cg.display().to_string()]);
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        // The child prints "timing" when it starts, one {"run": lookups/s} line per finished run,
        // then its JSON.
        let mut started: Option<Instant> = None;
        let mut done_runs: Vec<f64> = Vec::new();
        let mut last = String::new();
        // A run stops after the batch that crosses `max_secs`: allow twice that per run.
        let budget = std::time::Duration::from_secs_f64(2.0 * max_secs * runs as f64 + 10.0);
        loop {
            match rx.recv_timeout(std::time::Duration::from_millis(200)) {
                Ok((at, line)) => {
                    if line == "timing" {
                        started.get_or_insert(at);
                    } else if let Some(v) = serde_json::from_str::<Value>(&line)
                        .ok()
                        .and_then(|j| j["run"].as_f64())
                    {
                        done_runs.push(v);
                    } else {
                        last = line;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if let Some(t0) = started
                && t0.elapsed() > budget
                && last.is_empty()
            {
                let _ = child.kill();
                let _ = child.wait();
                let secs = t0.elapsed().as_secs_f64();
                if !done_runs.is_empty() {
                    eprintln!(
                        "mmap (budget): stopped after {secs:.0} s; {} of {runs} runs finished",
                        done_runs.len()
                    );
                    return Ok(json!({ "run_lookups_per_s": done_runs }));
                }
                eprintln!(
                    "mmap (budget): stopped after {secs:.0} s before one run finished: under \
                     {:.4} M lookups/s",
                    batch_lookups as f64 / secs / 1e6
                );
                return Ok(json!({ "upper_bound_lookups_per_s": batch_lookups as f64 / secs }));
            }
        }
        let status = child.wait()?;
        ensure!(status.success(), "the child failed ({status})");
        Ok(serde_json::from_str(&last)?)
    })();
    // The child has exited: the group is empty and can go.
    let _ = std::fs::remove_dir(&cg);
    result
}

fn run_dram(
    coll: &EmbeddingCollection,
    pooler: &Pooler,
    batches: &[KeyedJagged],
    out: &mut [f32],
) -> Result<()> {
    for kj in batches {
        pooler.run(coll, coll.validate(kj)?, out)?;
    }
    Ok(())
}

/// Writes `path` with table `i`'s seeded rows unless a good file of that shape is there (the
/// seed is in the file's name).
fn ensure_row_file(
    path: &Path,
    i: usize,
    rows: usize,
    dim: usize,
    dtype: DType,
    seed: u64,
) -> Result<()> {
    let name = format!("t{i}");
    if let Ok(f) = RowFile::open(path) {
        let h = f.header();
        if h.name == name && (h.rows, h.dim, h.dtype) == (rows as u64, dim as u64, dtype) {
            return Ok(());
        }
    }
    let t0 = Instant::now();
    let mut w = RowFileWriter::create(path, &name, rows, dim, dtype)?;
    const CHUNK: usize = 8192;
    let mut f32s = vec![0f32; dim];
    let mut buf = vec![0u8; CHUNK * dtype.row_bytes(dim)];
    let rb = dtype.row_bytes(dim);
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(CHUNK);
        for k in 0..n {
            seeded_row(seed, i, r + k, &mut f32s);
            dtype.encode_row(&f32s, &mut buf[k * rb..(k + 1) * rb]);
        }
        w.write_rows(&buf[..n * rb])?;
        r += n;
    }
    w.finish()?;
    eprintln!(
        "wrote {} in {:.1} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Drops the files from the page cache; returns the fraction of their pages still resident.
fn drop_page_cache(paths: &[PathBuf]) -> Result<f64> {
    let (mut resident, mut total) = (0u64, 0u64);
    for p in paths {
        let (r, t) = evict_page_cache(p)?;
        resident += r;
        total += t;
    }
    Ok(resident as f64 / total.max(1) as f64)
}
