//! `ember plan calibrate` (fit the cost model on this machine's measurements, with its held-out
//! error) and `ember plan eval` (Ember's plans against the baselines on generated tasks,
//! measured side by side).

use super::*;

pub(super) fn calibrate(a: CalibrateArgs) -> Result<()> {
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

/// `plan eval`: Ember's plans against the baselines on generated tasks, a line per task as it
/// is measured, then the summary (and `--json-out`).
pub(super) fn run(a: EvalArgs) -> Result<()> {
    let opts = a.task.options()?;
    let stats = a.task.stats()?;
    let model = model_from(a.cost_model.as_deref())?;
    print_header(&opts, &model);
    let results = eval::eval(&stats, &model, &opts, print_task)?;
    let (mean, median) = eval::summary(&results);
    println!();
    print_gains(&results, mean, median);
    print_balance_and_times(&results);
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

/// What the tasks are, and the table's column heads.
fn print_header(opts: &RunOptions, model: &CostModel) {
    println!(
        "{} tasks ({}-{} tables, {} devices, memory {:.0}% of the tables each), batch {}, cost model {}",
        opts.tasks,
        opts.task.tables.0,
        opts.task.tables.1,
        opts.task.devices,
        100.0 * opts.task.memory_share,
        opts.measure.batch,
        model_name(model)
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
}

/// One task's line: its tables, Ember's measured and predicted slowest device, the best
/// baseline's, the gain and the planning time.
fn print_task(r: &TaskResult) {
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
}

/// The improvement over the best baseline (`mean`, `median`), the tasks Ember won, and the
/// mean improvement over each baseline.
fn print_gains(results: &[TaskResult], mean: f64, median: f64) {
    let wins = results
        .iter()
        .filter(|r| r.improvement().is_some_and(|g| g > 0.0))
        .count();
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
    println!(
        "improvement over the best baseline (measured slowest device): mean {:.1}%, median {:.1}%, Ember faster in {wins} of {} tasks",
        100.0 * mean,
        100.0 * median,
        results.len()
    );
    for (n, g) in &per_base {
        println!("  vs {n:<19} mean {:.1}%", 100.0 * g);
    }
}

/// The headroom a balanced plan would have, the planning times, and the cost model's error on
/// Ember's plans.
fn print_balance_and_times(results: &[TaskResult]) {
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
}

/// The mean (0 for none).
fn mean_of(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}
