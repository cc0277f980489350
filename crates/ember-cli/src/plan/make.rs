//! `ember plan make`: tables (a spec file or a model's config) and devices in, a plan out, with
//! its predicted costs against the baselines' and the TorchRec fields when asked.

use super::*;

/// `plan make`: plans the tables over the devices, prints the plan, and writes what was asked
/// (`--out`, `--torchrec`, `--json`).
pub(super) fn run(a: MakeArgs) -> Result<()> {
    if a.devices == 0 || a.batch == 0 {
        bail!("--devices and --batch must be at least 1");
    }
    let tables = tables_of(&a)?;
    let devices = DeviceSpec {
        count: a.devices,
        memory_bytes: parse_bytes(&a.memory)?,
        bandwidth_gbps: a.bandwidth,
    };
    let reuse = reuse_of(&a, &tables)?;
    let model = model_from(a.cost_model.as_deref())?;
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
    write_outputs(&a, &tables, devices, &out, &model)
}

/// The tables to plan: `--tables`' spec file, or the tables of `--model`'s config (each with
/// `--pooling`).
fn tables_of(a: &MakeArgs) -> Result<Vec<TableSpec>> {
    match (&a.tables, &a.model) {
        (Some(p), _) => Ok(read_tables(p)?),
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
            Ok(t)
        }
        (None, None) => bail!("give --tables or --model"),
    }
}

/// Each table's reuse: `--locality`'s dataset (the first, or `--locality-dataset`) for every
/// table, or none; then each `--trace NAME=PATH` for its table.
fn reuse_of(a: &MakeArgs, tables: &[TableSpec]) -> Result<Vec<Reuse>> {
    let mut reuse = match &a.locality {
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
    Ok(reuse)
}

/// Writes the plan file (`--out`) and TorchRec's fields (`--torchrec`), and prints the plan as
/// JSON with `--json`.
fn write_outputs(
    a: &MakeArgs,
    tables: &[TableSpec],
    devices: DeviceSpec,
    out: &search::Outcome,
    model: &CostModel,
) -> Result<()> {
    let file = PlanFile {
        tables: tables.to_vec(),
        devices,
        batch: a.batch,
        shards: out.plan.shards.clone(),
        predicted_us: out.predicted.clone(),
        cost_model: model_name(model),
    };
    if let Some(p) = &a.out {
        file.write(p)?;
        println!("plan file     {}", p.display());
    }
    if let Some(p) = &a.torchrec {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&out.plan.to_torchrec(tables))?,
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
                "device_bytes": out.plan.device_bytes(tables, devices.count),
                "shards": out.plan.shards.len(),
                "seconds": out.seconds,
                "cost_model": model_name(model),
            })
        );
    }
    Ok(())
}

/// One line per device: its shards, bytes, lookups per batch, predicted time.
pub(super) fn print_plan(
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
