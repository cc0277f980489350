//! `ember plan`: shard tables over devices (`make`), calibrate the cost model on this machine
//! (`calibrate`), and measure the planner against the baselines (`eval`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ember_plan::access::{Locality, Reuse, read_locality};
use ember_plan::cost::{CostModel, device_loads};
use ember_plan::eval::{self, RunOptions, TaskResult};
use ember_plan::measure::MeasureOptions;
use ember_plan::search::{self, Problem, SearchOptions};
use ember_plan::spec::read_tables;
use ember_plan::task::TaskOptions;
use ember_plan::{DeviceSpec, Plan, PlanFile, TableSpec};
use serde_json::json;

use ember_bench::stats::human_bytes;

/// Meta's locality statistics, where a checkout beside `../shared` has them.
const LOCALITY: &str = "../shared/data/tables/dlrm_datasets_2021_locality_stats.txt";

#[derive(Debug, Subcommand)]
pub enum PlanCmd {
    /// Plan tables (CSV or JSON) over devices; print the plan per device, write a plan file.
    Make(MakeArgs),
    /// Measure device sets with Ember's kernels and fit the cost model (a profile file).
    Calibrate(CalibrateArgs),
    /// Plan random tasks with Ember's planner and every baseline, measure each plan's slowest
    /// device with Ember's kernels, and print the improvement over the best baseline.
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub struct MakeArgs {
    /// Tables: CSV (name/table, rows, dim, optional dtype, pooling/pooling_factor) or JSON.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    tables: Option<PathBuf>,
    /// Or the tables of a model directory (its config.json), with --pooling ids per sample.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Mean ids per sample of every table of --model.
    #[arg(long, default_value_t = 1.0)]
    pooling: f64,
    /// Number of devices.
    #[arg(long, default_value_t = 8)]
    devices: usize,
    /// Memory per device for tables (e.g. 16GiB, 512MiB, or bytes).
    #[arg(long, default_value = "16GiB")]
    memory: String,
    /// Memory bandwidth per device in GB/s (recorded in the plan file).
    #[arg(long)]
    bandwidth: Option<f64>,
    /// Samples per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Cost profile from `ember plan calibrate` [default: the built-in, uncalibrated model].
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Reuse of every table: Meta's locality statistics file (its first dataset, or
    /// --locality-dataset) [default: no reuse, every id a distinct row].
    #[arg(long)]
    locality: Option<PathBuf>,
    #[arg(long)]
    locality_dataset: Option<String>,
    /// A table's reuse from a trace of its ids (one per line), as NAME=PATH (repeatable):
    /// the histogram of how often each row appears per batch (batch x pooling ids).
    #[arg(long, value_name = "NAME=PATH")]
    trace: Vec<String>,
    /// Write the plan file here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write TorchRec ParameterSharding fields (per table) here.
    #[arg(long)]
    torchrec: Option<PathBuf>,
    /// Print a JSON object as the last line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    /// Tasks to draw.
    #[arg(long, default_value_t = 100)]
    tasks: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Samples per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Devices per task.
    #[arg(long, default_value_t = 4)]
    devices: usize,
    /// Fewest and most tables per task.
    #[arg(long, default_value_t = 10)]
    min_tables: usize,
    #[arg(long, default_value_t = 60)]
    max_tables: usize,
    /// Largest table in rows (rows are log-uniform from 1000).
    #[arg(long, default_value_t = 500_000)]
    max_rows: u64,
    /// Each device's memory as a share of the task's table bytes.
    #[arg(long, default_value_t = 0.35)]
    memory_share: f64,
    /// Timing rounds (each times every device set of every plan once over the task's 4
    /// batches; a device's cost is its median round).
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Meta's locality statistics [default: ../shared/data/tables/dlrm_datasets_2021_locality_stats.txt].
    #[arg(long)]
    locality: Option<PathBuf>,
}

impl TaskArgs {
    fn options(&self) -> Result<RunOptions> {
        if self.batch == 0 || self.devices == 0 || self.tasks == 0 || self.rounds == 0 {
            bail!("--tasks, --batch, --devices and --rounds must be at least 1");
        }
        if self.min_tables == 0 || self.min_tables > self.max_tables {
            bail!("need 1 <= --min-tables <= --max-tables");
        }
        if !(self.memory_share > 0.0 && self.memory_share.is_finite()) || self.max_rows < 1000 {
            bail!("--memory-share must be > 0 and --max-rows at least 1000");
        }
        Ok(RunOptions {
            tasks: self.tasks,
            seed: self.seed,
            task: TaskOptions {
                tables: (self.min_tables, self.max_tables),
                rows: (1e3, self.max_rows as f64),
                devices: self.devices,
                memory_share: self.memory_share,
                ..Default::default()
            },
            measure: MeasureOptions {
                batch: self.batch,
                rounds: self.rounds,
                ..Default::default()
            },
            search: SearchOptions::default(),
        })
    }

    fn stats(&self) -> Result<Vec<Locality>> {
        let p = self
            .locality
            .clone()
            .unwrap_or_else(|| PathBuf::from(LOCALITY));
        if !p.exists() {
            bail!(
                "locality statistics {} not found: pass --locality (Meta's dlrm_datasets \
                 embedding_bag/2021/locality_stats.txt)",
                p.display()
            );
        }
        Ok(read_locality(&p)?)
    }
}

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Write the profile here.
    #[arg(long, default_value = "ember-cost-profile.json")]
    out: PathBuf,
    /// Also write the measured device sets (load and microseconds) as JSON here.
    #[arg(long)]
    samples: Option<PathBuf>,
    #[command(flatten)]
    task: TaskArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Cost profile from `ember plan calibrate` [default: the built-in model].
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Also write every task's result as JSON here.
    #[arg(long)]
    json_out: Option<PathBuf>,
    #[command(flatten)]
    task: TaskArgs,
}

/// `--plan` for `predict` and `serve`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Sharding plan from `ember plan make`: each device's shards run on a worker pool of
    /// their own, all devices at once (tables matched to the model's by name, rows and dim).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Threads of each plan device's pool.
    #[arg(long, default_value_t = 1)]
    pub plan_threads: usize,
}

impl PlanArgs {
    /// The CPU predictor: sharded by the plan when one is given.
    pub fn predictor(
        &self,
        model: std::sync::Arc<ember_model::Model>,
        threads: usize,
    ) -> Result<ember_model::Predictor> {
        let Some(path) = &self.plan else {
            return Ok(ember_model::Predictor::new(model, threads)?);
        };
        if self.plan_threads == 0 {
            bail!("--plan-threads must be at least 1");
        }
        let file = PlanFile::read(path)?;
        let tables: Vec<(String, u64, u32)> = model
            .embeddings()
            .tables()
            .iter()
            .map(|t| (t.name().to_string(), t.rows() as u64, t.dim() as u32))
            .collect();
        let shards = file
            .shards_for(&tables)
            .with_context(|| format!("plan {} does not fit the model", path.display()))?;
        let p = ember_model::Predictor::with_shards(model, threads, &shards, self.plan_threads)?;
        let devs = p.sharded().map_or(0, |s| s.devices().len());
        eprintln!(
            "plan {}: {} shards on {devs} devices, {} thread(s) each",
            path.display(),
            shards.len(),
            self.plan_threads
        );
        Ok(p)
    }
}

pub fn run(cmd: PlanCmd) -> Result<()> {
    match cmd {
        PlanCmd::Make(a) => make(a),
        PlanCmd::Calibrate(a) => calibrate(a),
        PlanCmd::Eval(a) => run_eval(a),
    }
}

/// Parses `16GiB`, `512MiB`, `1.5GB`, `4096` (bytes).
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .with_context(|| format!("'{s}' is not a size (e.g. 16GiB)"))?;
    let mul = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024f64.powi(4),
        "tb" => 1e12,
        u => bail!("'{s}': unknown unit '{u}' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"),
    };
    Ok((v * mul) as u64)
}

fn model_from(profile: Option<&Path>) -> Result<CostModel> {
    Ok(match profile {
        Some(p) => CostModel::load(p)?,
        None => CostModel::builtin(),
    })
}

fn model_name(m: &CostModel) -> String {
    let kind = if m.use_boosted { "boosted" } else { "analytic" };
    format!("{kind} ({})", m.machine)
}

fn make(a: MakeArgs) -> Result<()> {
    if a.devices == 0 || a.batch == 0 {
        bail!("--devices and --batch must be at least 1");
    }
    let tables = match (&a.tables, &a.model) {
        (Some(p), _) => read_tables(p)?,
        (None, Some(dir)) => {
            let cfg = ember_model::ModelConfig::read(&dir.join("config.json"))
                .with_context(|| format!("reading the model in {}", dir.display()))?;
            let t: Vec<TableSpec> = cfg
                .tables
                .iter()
                .map(|t| TableSpec {
                    name: t.name.clone(),
                    rows: t.rows as u64,
                    dim: t.dim as u32,
                    dtype: t.dtype,
                    pooling: a.pooling,
                })
                .collect();
            ember_plan::spec::check_tables(&t).map_err(anyhow::Error::msg)?;
            t
        }
        (None, None) => bail!("give --tables or --model"),
    };
    let devices = DeviceSpec {
        count: a.devices,
        memory_bytes: parse_bytes(&a.memory)?,
        bandwidth_gbps: a.bandwidth,
    };
    let reuse = match &a.locality {
        Some(p) => {
            let stats = read_locality(p)?;
            let ds = match &a.locality_dataset {
                Some(n) => stats.iter().find(|d| &d.name == n).with_context(|| {
                    format!(
                        "no dataset {n} in {}; it has {}",
                        p.display(),
                        stats
                            .iter()
                            .map(|d| d.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?,
                None => &stats[0],
            };
            vec![Reuse::from_locality(ds, 1.0); tables.len()]
        }
        None => vec![Reuse::none(); tables.len()],
    };
    let mut reuse = reuse;
    for spec in &a.trace {
        let Some((name, path)) = spec.split_once('=') else {
            bail!("--trace {spec}: expected NAME=PATH");
        };
        let Some(i) = tables.iter().position(|t| t.name == name) else {
            bail!("--trace {spec}: no table named {name}");
        };
        let ids = ember_embed::trace::load_trace(Path::new(path))?;
        let window = (a.batch as f64 * tables[i].pooling.max(1.0)).round() as usize;
        reuse[i] = Reuse::from_trace(&ids, window);
        eprintln!(
            "{name}: reuse from {path} ({} ids, {:.2} ids per distinct row per batch)",
            ids.len(),
            reuse[i].mean_col_size()
        );
    }
    let model = model_from(a.profile.as_deref())?;
    let problem = Problem {
        tables: &tables,
        reuse: &reuse,
        devices,
        batch: a.batch,
    };
    let out = search::plan(problem, &model, &SearchOptions::default())?;
    out.plan.check(&tables, &devices)?;
    print_plan(&tables, &reuse, &devices, a.batch, &out.plan, &model);
    println!(
        "planned in {:.3} s ({} placements evaluated), cost model {}",
        out.seconds,
        out.candidates,
        model_name(&model)
    );
    let file = PlanFile {
        tables: tables.clone(),
        devices,
        batch: a.batch,
        shards: out.plan.shards.clone(),
        predicted_us: out.predicted.clone(),
        cost_model: model_name(&model),
    };
    if let Some(p) = &a.out {
        file.write(p)?;
        println!("plan file     {}", p.display());
    }
    if let Some(p) = &a.torchrec {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&out.plan.to_torchrec(&tables))?,
        )
        .with_context(|| format!("writing {}", p.display()))?;
        println!("TorchRec      {}", p.display());
    }
    if a.json {
        println!(
            "{}",
            json!({
                "devices": devices.count,
                "memory_bytes": devices.memory_bytes,
                "batch": a.batch,
                "predicted_us": out.predicted,
                "device_bytes": out.plan.device_bytes(&tables, devices.count),
                "shards": out.plan.shards.len(),
                "seconds": out.seconds,
                "cost_model": model_name(&model),
            })
        );
    }
    Ok(())
}

/// One line per device: its shards, bytes, lookups per batch, predicted time.
fn print_plan(
    tables: &[TableSpec],
    reuse: &[Reuse],
    dev: &DeviceSpec,
    batch: usize,
    plan: &Plan,
    model: &CostModel,
) {
    let bytes = plan.device_bytes(tables, dev.count);
    let loads = device_loads(&plan.shards, tables, reuse, batch, dev.count);
    println!(
        "{:<6} {:>10} {:>8} {:>12}  shards (table[rows][cols])",
        "device", "memory", "lookups", "predicted"
    );
    for (d, (b, load)) in bytes.iter().zip(&loads).enumerate() {
        let mine: Vec<_> = plan.shards.iter().filter(|s| s.device == d).collect();
        let names: Vec<String> = mine
            .iter()
            .map(|s| {
                let t = &tables[s.table];
                let mut n = t.name.clone();
                if s.rows != (0, t.rows) {
                    n += &format!("[{}..{}]", s.rows.0, s.rows.1);
                }
                if s.cols != (0, t.dim) {
                    n += &format!("[:{}..{}]", s.cols.0, s.cols.1);
                }
                n
            })
            .collect();
        println!(
            "{d:<6} {:>10} {:>8.0} {:>9.0} us  {}",
            human_bytes(*b as usize),
            load.lookups,
            model.predict(load),
            names.join(" ")
        );
    }
}

fn calibrate(a: CalibrateArgs) -> Result<()> {
    let opts = a.task.options()?;
    let stats = a.task.stats()?;
    let mut base = CostModel::builtin();
    base.batch = opts.measure.batch;
    base.threads = opts.measure.threads;
    base.machine = machine();
    eprintln!(
        "calibrating: {} tasks x 3 plans x {} devices, batch {}",
        opts.tasks, opts.task.devices, opts.measure.batch
    );
    let samples = eval::calibration_samples(&stats, &CostModel::builtin(), &opts, |i, s| {
        eprintln!("  task {:>3}: {} device sets measured", i + 1, s.len());
    })?;
    if samples.len() < 20 {
        bail!(
            "only {} device sets measured; run more --tasks",
            samples.len()
        );
    }
    if let Some(p) = &a.samples {
        std::fs::write(p, serde_json::to_string(&samples)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let m = CostModel::fit(&samples, base);
    m.save(&a.out)?;
    let h = m.held_out.expect("fit reports held-out error");
    println!(
        "device sets   {} ({} to fit, {} held out)",
        samples.len(),
        h.train,
        h.test
    );
    println!(
        "held-out MAPE analytic {:.1}%, boosted {:.1}% -> using {}",
        100.0 * h.analytic_mape,
        100.0 * h.boosted_mape,
        if m.use_boosted { "boosted" } else { "analytic" }
    );
    println!(
        "analytic coefficients (us): shard {:.3}, bag {:.5}, lookup {:.5}, hit line {:.5}, cold line (cached) {:.5}, cold line (DRAM) {:.5}; LLC {}",
        m.coef[0],
        m.coef[1],
        m.coef[2],
        m.coef[3],
        m.coef[4],
        m.coef[5],
        human_bytes(m.llc_bytes as usize)
    );
    println!("profile       {}", a.out.display());
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores")
}

fn run_eval(a: EvalArgs) -> Result<()> {
    let opts = a.task.options()?;
    let stats = a.task.stats()?;
    let model = model_from(a.profile.as_deref())?;
    println!(
        "{} tasks ({}-{} tables, {} devices, memory {:.0}% of the tables each), batch {}, cost model {}",
        opts.tasks,
        opts.task.tables.0,
        opts.task.tables.1,
        opts.task.devices,
        100.0 * opts.task.memory_share,
        opts.measure.batch,
        model_name(&model)
    );
    println!(
        "{:>4} {:>6} {:>9} {:>10} {:>10} {:>10} {:>19} {:>8} {:>9}",
        "task",
        "tables",
        "memory",
        "ember us",
        "predicted",
        "best base",
        "(which)",
        "gain",
        "plan ms"
    );
    let results = eval::eval(&stats, &model, &opts, |r: &TaskResult| {
        let (name, best) = r
            .best_baseline()
            .map_or(("none", f64::NAN), |(b, c)| (b.name.as_str(), c));
        println!(
            "{:>4} {:>6} {:>9} {:>10.0} {:>10.0} {:>10.0} {:>19} {:>7.1}% {:>9.1}",
            r.index,
            r.tables,
            human_bytes(r.table_bytes as usize),
            r.ember(),
            r.ember_predicted,
            best,
            name,
            100.0 * r.improvement().unwrap_or(f64::NAN),
            1e3 * r.plan_seconds
        );
    })?;
    let (mean, median) = eval::summary(&results);
    let wins = results
        .iter()
        .filter(|r| r.improvement().is_some_and(|g| g > 0.0))
        .count();
    let worst_plan = results.iter().map(|r| r.plan_seconds).fold(0.0, f64::max);
    let big: Vec<f64> = results
        .iter()
        .filter(|r| r.tables >= 55)
        .map(|r| r.plan_seconds)
        .collect();
    let pred_err: Vec<f64> = results
        .iter()
        .map(|r| (r.ember_predicted - r.ember()).abs() / r.ember().max(1e-9))
        .collect();
    let names = results.first().map_or(vec![], |r| {
        r.baselines.iter().map(|b| b.name.clone()).collect()
    });
    let per_base: Vec<(String, f64)> = names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let g: Vec<f64> = results
                .iter()
                .filter_map(|r| r.baselines[i].cost().map(|c| 1.0 - r.ember() / c))
                .collect();
            (name, mean_of(&g))
        })
        .collect();
    println!();
    println!(
        "improvement over the best baseline (measured slowest device): mean {:.1}%, median {:.1}%, Ember faster in {wins} of {} tasks",
        100.0 * mean,
        100.0 * median,
        results.len()
    );
    for (n, g) in &per_base {
        println!("  vs {n:<19} mean {:.1}%", 100.0 * g);
    }
    // How much any plan could gain without cutting total work: the best baseline's slowest
    // device against its mean device (a perfectly balanced plan of the same work).
    let headroom: Vec<f64> = results
        .iter()
        .filter_map(|r| {
            let (b, max) = r.best_baseline()?;
            Some(1.0 - mean_of(b.devices.as_deref()?) / max)
        })
        .collect();
    let spread: Vec<f64> = results
        .iter()
        .map(|r| r.ember() / mean_of(&r.ember_devices).max(1e-9) - 1.0)
        .collect();
    println!(
        "headroom: a perfectly balanced plan of the best baseline's work would be {:.1}% faster than it on average (Ember's devices: slowest {:.1}% above their mean)",
        100.0 * mean_of(&headroom),
        100.0 * mean_of(&spread)
    );
    println!(
        "planning time: max {:.0} ms over all tasks; max {:.0} ms over {} tasks of 55-60 tables",
        1e3 * worst_plan,
        1e3 * big.iter().copied().fold(0.0, f64::max),
        big.len()
    );
    println!(
        "cost model on Ember's plans: mean error {:.1}% (prediction vs measurement of the slowest device)",
        100.0 * mean_of(&pred_err)
    );
    if let Some(p) = &a.json_out {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&json!({
                "mean_improvement": mean,
                "median_improvement": median,
                "tasks": results,
            }))?,
        )
        .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// The mean (0 for none).
fn mean_of(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }
}
