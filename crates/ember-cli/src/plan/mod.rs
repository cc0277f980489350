//! `ember plan`: shard tables over devices (`make`), calibrate the cost model on this machine
//! (`calibrate`), and measure the planner against the baselines (`eval`).

mod evaluate;
mod make;

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

use crate::units::human_bytes;

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
    /// Cost model from `ember plan calibrate` [default: the built-in, uncalibrated model]
    /// (`--profile`: the old name, for one release).
    #[arg(long, visible_alias = "profile")]
    cost_model: Option<PathBuf>,
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
    /// Write the calibrated cost model here.
    #[arg(long, default_value = "ember-cost-model.json")]
    out: PathBuf,
    /// Also write the measured device sets (load and microseconds) as JSON here.
    #[arg(long)]
    samples: Option<PathBuf>,
    #[command(flatten)]
    task: TaskArgs,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Cost model from `ember plan calibrate` [default: the built-in model] (`--profile`: the
    /// old name, for one release).
    #[arg(long, visible_alias = "profile")]
    cost_model: Option<PathBuf>,
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
        PlanCmd::Make(a) => make::run(a),
        PlanCmd::Calibrate(a) => evaluate::calibrate(a),
        PlanCmd::Eval(a) => evaluate::run(a),
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

pub(super) fn model_from(profile: Option<&Path>) -> Result<CostModel> {
    Ok(match profile {
        Some(p) => CostModel::load(p)?,
        None => CostModel::builtin(),
    })
}

pub(super) fn model_name(m: &CostModel) -> String {
    let kind = if m.use_boosted { "boosted" } else { "analytic" };
    format!("{kind} ({})", m.machine)
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
