//! `ember bench model`: the whole forward pass of a model of any family (a preset with random
//! weights or a model directory), batch latency percentiles and where the time goes, through
//! the serving seam ([`ember_model::serving`]) as a server runs a batch.
//!
//! Set up: the model ([`AnyPreset`] or [`serving::load`]) and up to 32 distinct batches of its
//! items: synthetic ones the family draws ([`Servable::synthetic`]: `--batch` items, `--pooling`,
//! `--history`, `--candidates`) or the requests of a JSON-lines file, one request a line as
//! `/v1/score` takes it; with `--batch-sizes`, batch `i` has the `i`-th size of the list, cycled.
//! The runner: [`crate::engines::runner`] for the device and dense precision asked. Measure:
//! `--warmup` untimed batches, then `--iters` timed ones, each merged and staged
//! ([`Servable::prepare`]) and run ([`Runner::run`]). Report (`model_report.rs`): items/s,
//! p50/p99 per batch, the declared stages' shares, each stage's rate against the dense ceiling
//! where the family counts its FLOPs, the timed layers, and with `--accuracy` what the dense
//! precision keeps of f32's AUC and NE.

use super::model_args::{Built, ModelArgs, sizes};
use super::model_report::{self as report, Accuracy, Measured, Setup};
use crate::engines::{RunnerArgs, calibrate_int8, runner};
use crate::gpu_args::GpuArgs;
use crate::units::{human_bytes, mem_available};
use anyhow::{Context, Result, bail};
use ember_embed::DType;
use ember_model::family::AnyPreset;
use ember_model::presets::RowsOptions;
use ember_model::serving::{self, Items, Outputs, Request, Runner, Servable, Workload};
use ember_model::{DenseDType, LoadOptions};
use std::sync::Arc;
use std::time::Instant;

/// Distinct batches cycled through (ids differ between consecutive batches, as in serving).
const DISTINCT_BATCHES: usize = 32;

/// Synthetic batches of the accuracy check, at most this many items each.
const ACCURACY_BATCH: usize = 512;

pub fn run(a: ModelArgs) -> Result<()> {
    if a.iters == 0 || a.batch == Some(0) {
        bail!("--batch and --iters must be at least 1");
    }
    let built = set_up(&a)?;
    let model = built.model.clone();
    let workload = workload(&a, &built);
    let batches = batches(&a, &model, &workload)?;
    if a.dense_dtype == DenseDType::Int8 && !a.gpu.is_cuda() {
        // int8's smoothing calibrated on inputs like the timed ones (4 batches).
        let parts: Vec<&dyn Items> = batches.iter().take(4).flatten().map(|r| &**r).collect();
        calibrate_int8(&model, &parts, a.threads)?;
    }
    let (mut measured, mut timed) = match super::model_gpu::pipelined(&a.gpu_loop(), &built, &a)? {
        Some(m) => m,
        None => {
            if a.gpu_inputs.is_some() || a.in_flight.is_some() {
                bail!(
                    "--gpu-inputs and --in-flight drive a GPU engine that keeps batches in \
                     flight; this model's runs one batch at a time"
                );
            }
            let mut r = runner(&a.runner_args(a.dense_dtype), model.clone(), &built.name)?;
            (measure(&a, &mut *r, &batches)?, r)
        }
    };
    if a.accuracy > 0 {
        let t = Instant::now();
        let acc = accuracy(&a, &built, &workload, &mut *timed)?;
        eprintln!(
            "accuracy: {} {}s in {:.1}s",
            acc.items,
            model.signature().item,
            t.elapsed().as_secs_f64()
        );
        measured.accuracy = Some(acc);
    }
    let setup = Setup {
        name: &built.name,
        preset: built.preset.as_ref(),
        model: &*model,
        engine: timed.device(),
        args: &a,
        workload: &workload,
        sizes: sizes(&a),
    };
    report::print(&setup, &measured);
    if let Some(path) = &a.report {
        report::page(&setup, &measured).write(path)?;
    }
    Ok(())
}

/// The model: a preset with random weights (dense layers in f32, switched by the runner) or
/// a model directory.
fn set_up(a: &ModelArgs) -> Result<Built> {
    if let Some(dir) = &a.model {
        let opts = LoadOptions {
            table_dtype: a.dtype,
            ..LoadOptions::default()
        };
        let model =
            serving::load(dir, opts).with_context(|| format!("loading model {}", dir.display()))?;
        return Ok(Built {
            model,
            name: dir.display().to_string(),
            preset: None,
        });
    }
    let rows = RowsOptions {
        scale: a.rows_scale,
        max_rows: a.max_rows,
    };
    let p = AnyPreset::new(&a.preset, a.dtype.unwrap_or(DType::F32), rows)?;
    let bytes = p.table_bytes();
    if let Some(avail) = mem_available()
        && bytes > avail
    {
        bail!(
            "preset {} needs {} of tables but only {} is available; try --dtype int8, \
             --rows-scale or --max-rows",
            p.name,
            human_bytes(bytes),
            human_bytes(avail)
        );
    }
    let t = Instant::now();
    let model = serving::servable(p.build(a.seed, a.threads.max(2))?);
    eprintln!(
        "built {} ({} of tables, {} rows) with random weights in {:.1}s",
        p.name,
        human_bytes(bytes),
        p.config
            .tables()
            .iter()
            .map(|t| t.rows.to_string())
            .collect::<Vec<_>>()
            .join(" / "),
        t.elapsed().as_secs_f64()
    );
    Ok(Built {
        model,
        name: p.name.clone(),
        preset: Some(p),
    })
}

/// The synthetic items' shape the flags ask for (a preset's pooling by default).
fn workload(a: &ModelArgs, b: &Built) -> Workload {
    Workload {
        items: None,
        pooling: a
            .pooling
            .map(|n| vec![n])
            .or_else(|| b.preset.as_ref().and_then(|p| p.pooling.clone())),
        history: a.history,
        candidates: a.candidates,
    }
}

/// The distinct batches, each a list of checked requests to merge.
fn batches(a: &ModelArgs, model: &Arc<dyn Servable>, w: &Workload) -> Result<Vec<Vec<Request>>> {
    let sizes = sizes(a);
    let cycle = sizes.len();
    let distinct = (DISTINCT_BATCHES.div_ceil(cycle) * cycle).min(a.warmup + a.iters);
    let Some(path) = &a.requests else {
        return (0..distinct)
            .map(|i| {
                let w = Workload {
                    items: sizes[i % cycle],
                    ..w.clone()
                };
                Ok(vec![model.synthetic(&w, a.seed ^ (i as u64 + 1) << 8)?])
            })
            .collect();
    };
    if *w != Workload::default() {
        bail!("--pooling, --history and --candidates shape synthetic items, not a --requests file");
    }
    let requests = read_requests(model, path)?;
    // Consecutive requests, cycled, until each batch has its items.
    let mut next = (0..).map(|k| k % requests.len());
    Ok((0..distinct)
        .map(|i| {
            let want = sizes[i % cycle].unwrap_or(1);
            let (mut parts, mut items) = (Vec::new(), 0);
            while items < want {
                let r: &Request = &requests[next.next().expect("endless")];
                items += r.len();
                parts.push(r.pieces(r.len()).next().expect("a request has items"));
            }
            parts
        })
        .collect())
}

/// A JSON-lines file of requests, each checked (errors name the line).
fn read_requests(model: &Arc<dyn Servable>, path: &std::path::Path) -> Result<Vec<Request>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let spec = ember_serve::ModelSpec::of(model.clone(), "bench");
    let requests: Vec<Request> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            ember_serve::v1::decode_json_any(&spec, l.as_bytes())
                .with_context(|| format!("{}, line {}", path.display(), n + 1))
        })
        .collect::<Result<_>>()?;
    if requests.iter().all(|r| r.is_empty()) {
        bail!("{}: no requests to time", path.display());
    }
    Ok(requests.into_iter().filter(|r| !r.is_empty()).collect())
}

/// The loop: each batch merged, staged and run on this thread, one at a time, as a server's
/// batching thread runs it.
fn measure(a: &ModelArgs, r: &mut dyn Runner, batches: &[Vec<Request>]) -> Result<Measured> {
    let model = r.servable().clone();
    let mut out = Outputs::default();
    let run = |r: &mut dyn Runner, parts: &[Request], out: &mut Outputs| -> Result<_> {
        let refs: Vec<&dyn Items> = parts.iter().map(|p| &**p).collect();
        let batch = model.prepare(&refs)?;
        Ok(r.run(&batch, out)?)
    };
    for i in 0..a.warmup {
        run(r, &batches[i % batches.len()], &mut out)?;
    }
    r.time_layers();
    let mut m = Measured::default();
    let start = Instant::now();
    for i in 0..a.iters {
        let parts = &batches[(a.warmup + i) % batches.len()];
        let t = Instant::now();
        let times = run(r, parts, &mut out)?;
        m.lat_ms.push(t.elapsed().as_secs_f64() * 1e3);
        m.add(&times, parts, &out, &*model);
    }
    m.wall = start.elapsed().as_secs_f64();
    m.layers = report::layer_report(r.layer_times(), m.items, a.threads, a.dense_dtype);
    Ok(m)
}

/// `--accuracy N`: N synthetic items scored by the timed runner and by an f32 one on the CPU;
/// each value's label drawn from its f32 probability (the first output's).
fn accuracy(a: &ModelArgs, b: &Built, w: &Workload, timed: &mut dyn Runner) -> Result<Accuracy> {
    let cpu = GpuArgs::cpu();
    let f32_args = RunnerArgs {
        gpu: &cpu,
        ..a.runner_args(DenseDType::F32)
    };
    let mut reference = runner(&f32_args, b.model.clone(), &b.name)?;
    let per = sizes(a).into_iter().flatten().max().unwrap_or(1);
    let per = per.clamp(1, ACCURACY_BATCH).min(a.accuracy);
    let (mut p32, mut low) = (Vec::new(), Vec::new());
    let (mut items, mut k) = (0, 0u64);
    let mut out = Outputs::default();
    while items < a.accuracy {
        let w = Workload {
            items: Some(per.min(a.accuracy - items)),
            ..w.clone()
        };
        let req = b.model.synthetic(&w, a.seed ^ 0xacc ^ k << 20)?;
        k += 1;
        items += req.len();
        reference.run_request(&*req, &mut out)?;
        p32.extend_from_slice(out.scores());
        timed.run_request(&*req, &mut out)?;
        low.extend_from_slice(out.scores());
    }
    Ok(Accuracy::of(items, &p32, &low, a.seed))
}
