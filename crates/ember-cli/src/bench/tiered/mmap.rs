//! The plain-mmap baselines of `bench tiered`: the row files mapped and read in place after
//! dropping them from the page cache (cold), and the same with the page cache limited to the
//! tier's cache budget (a child process in a memory cgroup), which is what an mmap of tables
//! larger than memory gets.

use anyhow::{Context, Result, ensure};
use ember_bench::disk::evict_page_cache;
use ember_embed::{EmbeddingCollection, EmbeddingTable, KeyedJagged, Pooler};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Instant;

/// What the mmap baselines read: the row files, the batches of each run (cycled), pooled by
/// `pooler` into `out_len` floats a batch.
pub(super) struct Baseline<'a> {
    pub paths: &'a [PathBuf],
    pub pooler: &'a Pooler,
    pub runs: &'a [&'a [KeyedJagged]],
    pub out_len: usize,
}

/// Times `n` runs of a plain mmap of the row files, each after dropping them from the page cache
/// and stopping after `max_secs`; returns lookups/s per run and the resident fraction before each.
/// Each run is logged as `what`, and printed as JSON with `report_runs`.
pub(super) fn cold_mmap_runs(
    b: &Baseline<'_>,
    n: usize,
    max_secs: f64,
    what: &str,
    report_runs: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let Baseline {
        paths,
        pooler,
        runs,
        out_len,
    } = *b;
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
            pooler.run(&coll, coll.check_view(kj)?, &mut out)?;
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
pub(super) fn budgeted_mmap(
    limit: usize,
    max_secs: f64,
    runs: usize,
    batch_lookups: usize,
) -> Result<Value> {
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

/// Drops the files from the page cache; returns the fraction of their pages still resident.
fn drop_page_cache(paths: &[PathBuf]) -> Result<f64> {
    let (mut resident, mut total) = (0u64, 0u64);
    for p in paths {
        let (r, t) = evict_page_cache(p)
            .with_context(|| format!("dropping {} from the page cache", p.display()))?;
        resident += r;
        total += t;
    }
    Ok(resident as f64 / total.max(1) as f64)
}
