//! `ember plan calibrate` and `ember plan eval`: measuring plans with Ember's kernels.
//!
//! Both draw tasks (see [`crate::task`]), plan them, and measure every device of every plan
//! with a [`Bench`]. Calibration keeps each device's [`Load`] and measured time as a sample for
//! the cost model; evaluation compares Ember's plan with every baseline by the measured cost of
//! the slowest device.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::access::Locality;
use crate::baselines::Baseline;
use crate::cost::{CostModel, Load, device_loads};
use crate::error::Result;
use crate::measure::{Bench, MeasureOptions};
use crate::plan::{Plan, Shard};
use crate::search::{self, Problem, SearchOptions, default_split_bytes};
use crate::task::{Task, TaskOptions};

/// Settings of a calibration or evaluation run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub tasks: usize,
    pub seed: u64,
    pub task: TaskOptions,
    pub measure: MeasureOptions,
    pub search: SearchOptions,
}

/// One evaluated task.
#[derive(Debug, Clone, Serialize)]
pub struct TaskResult {
    pub index: usize,
    pub tables: usize,
    pub table_bytes: u64,
    /// Measured microseconds per batch of each of Ember's devices.
    pub ember_devices: Vec<f64>,
    /// The model's prediction of Ember's slowest device.
    pub ember_predicted: f64,
    pub ember_shards: usize,
    pub plan_seconds: f64,
    pub baselines: Vec<BaselineResult>,
}

/// One baseline's plan of a task, measured.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineResult {
    pub name: String,
    /// Measured microseconds per batch of each device (`None` where it found no placement).
    pub devices: Option<Vec<f64>>,
}

impl BaselineResult {
    /// Its slowest device.
    pub fn cost(&self) -> Option<f64> {
        self.devices.as_deref().map(max)
    }
}

impl TaskResult {
    /// Measured microseconds per batch of Ember's slowest device.
    pub fn ember(&self) -> f64 {
        max(&self.ember_devices)
    }

    /// The best baseline and its cost.
    pub fn best_baseline(&self) -> Option<(&BaselineResult, f64)> {
        self.baselines
            .iter()
            .filter_map(|b| b.cost().map(|c| (b, c)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// 1 - ember / best baseline.
    pub fn improvement(&self) -> Option<f64> {
        self.best_baseline().map(|(_, b)| 1.0 - self.ember() / b)
    }
}

/// The baselines every task is planned with (random seeded per task).
pub fn baselines(seed: u64) -> Vec<Baseline> {
    let mut v = vec![Baseline::Random(seed)];
    v.extend(Baseline::GREEDY);
    v
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// Plans task `index` with Ember and every baseline and measures each plan.
pub fn eval_task(
    index: usize,
    task: &Task,
    model: &CostModel,
    opts: &RunOptions,
    rng: &mut StdRng,
) -> Result<TaskResult> {
    let problem = Problem {
        tables: &task.tables,
        reuse: &task.reuse,
        devices: task.devices,
        batch: opts.measure.batch,
    };
    let out = search::plan(problem, model, &opts.search)?;
    out.plan.check(&task.tables, &task.devices)?;
    let split = opts
        .search
        .split_bytes
        .unwrap_or_else(|| default_split_bytes(&task.devices));
    let names: Vec<&str> = baselines(0).iter().map(|b| b.name()).collect();
    let base_plans: Vec<Option<Plan>> = baselines(opts.seed ^ index as u64)
        .into_iter()
        .map(|b| b.plan(&task.tables, &task.devices, split).ok())
        .collect();
    let mut plans = vec![&out.plan];
    plans.extend(base_plans.iter().flatten());
    let mut bench = Bench::new(task, opts.measure, rng);
    let mut costs = bench.measure(&plans, task.devices.count)?.into_iter();
    let ember_devices = costs.next().unwrap_or_default();
    let base = names
        .iter()
        .zip(&base_plans)
        .map(|(n, p)| BaselineResult {
            name: n.to_string(),
            devices: p.as_ref().and_then(|_| costs.next()),
        })
        .collect();
    Ok(TaskResult {
        index,
        tables: task.tables.len(),
        table_bytes: task.tables.iter().map(|t| t.bytes()).sum(),
        ember_devices,
        ember_predicted: max(&out.predicted),
        ember_shards: out.plan.shards.len(),
        plan_seconds: out.seconds,
        baselines: base,
    })
}

/// Runs `opts.tasks` tasks, calling `each` after each.
pub fn eval(
    stats: &[Locality],
    model: &CostModel,
    opts: &RunOptions,
    mut each: impl FnMut(&TaskResult),
) -> Result<Vec<TaskResult>> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut out = Vec::with_capacity(opts.tasks);
    for i in 0..opts.tasks {
        let task = Task::draw(&opts.task, stats, &mut rng);
        let r = eval_task(i, &task, model, opts, &mut rng)?;
        each(&r);
        out.push(r);
    }
    Ok(out)
}

/// A random plan: each unit split into 1, 2 or 4 column parts where it can be, parts on random
/// devices with room (`None` if it found none).
fn random_plan(task: &Task, split: u64, rng: &mut StdRng) -> Option<Plan> {
    let base = Baseline::Random(rng.random())
        .plan(&task.tables, &task.devices, split)
        .ok()?;
    let mut used = base.device_bytes(&task.tables, task.devices.count);
    let mut shards = Vec::new();
    for s in base.shards {
        let t = &task.tables[s.table];
        let k = [1u32, 2, 4][rng.random_range(0..3)];
        if k == 1 || !t.dim.is_multiple_of(k) || t.dim / k < 4 {
            shards.push(s);
            continue;
        }
        let w = t.dim / k;
        let part_bytes = t.shard_bytes(s.num_rows(), w);
        used[s.device] -= t.shard_bytes(s.num_rows(), t.dim);
        for p in 0..k {
            let d = rng.random_range(0..task.devices.count);
            let d = if used[d] + part_bytes <= task.devices.memory_bytes {
                d
            } else {
                s.device
            };
            used[d] += part_bytes;
            shards.push(Shard {
                cols: (p * w, (p + 1) * w),
                device: d,
                ..s.clone()
            });
        }
    }
    Some(Plan { shards })
}

/// Measures device sets for calibration: per task, a random plan with random column splits,
/// the size-greedy plan and the plan `seed_model` makes (so the samples cover both arbitrary
/// sets and the balanced sets the planner proposes). Returns each device's load and measured
/// microseconds per batch; `each` sees the task index and its samples.
pub fn calibration_samples(
    stats: &[Locality],
    seed_model: &CostModel,
    opts: &RunOptions,
    mut each: impl FnMut(usize, &[(Load, f64)]),
) -> Result<Vec<(Load, f64)>> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut out = Vec::new();
    for i in 0..opts.tasks {
        let task = Task::draw(&opts.task, stats, &mut rng);
        let split = default_split_bytes(&task.devices);
        let mut plans = Vec::new();
        plans.extend(random_plan(&task, split, &mut rng));
        plans.extend(
            Baseline::SizeGreedy
                .plan(&task.tables, &task.devices, split)
                .ok(),
        );
        let problem = Problem {
            tables: &task.tables,
            reuse: &task.reuse,
            devices: task.devices,
            batch: opts.measure.batch,
        };
        plans.extend(
            search::plan(problem, seed_model, &opts.search)
                .ok()
                .map(|o| o.plan),
        );
        let mut bench = Bench::new(&task, opts.measure, &mut rng);
        let mut mine = Vec::new();
        let refs: Vec<&Plan> = plans.iter().collect();
        let all = bench.measure(&refs, task.devices.count)?;
        for (p, costs) in plans.iter().zip(all) {
            let loads = device_loads(
                &p.shards,
                &task.tables,
                &task.reuse,
                opts.measure.batch,
                task.devices.count,
            );
            for (l, c) in loads.into_iter().zip(costs) {
                if l.shards > 0.0 {
                    mine.push((l, c));
                }
            }
        }
        each(i, &mine);
        out.extend(mine);
    }
    Ok(out)
}

/// Mean and median of the improvements (skipping tasks no baseline could place).
pub fn summary(results: &[TaskResult]) -> (f64, f64) {
    let mut v: Vec<f64> = results.iter().filter_map(TaskResult::improvement).collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (mean, median)
}
