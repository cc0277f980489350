//! `ember bench model`: the whole forward pass of a preset model with random weights, batch
//! latency percentiles and where the time goes.
//!
//! Set up: the model and 32 distinct input batches (ids differ between consecutive batches, as
//! in serving; with `--batch-sizes`, batch `i` has the `i`-th size of the list, cycled, and the
//! distinct batches are a whole number of cycles). Measure: `--warmup` untimed batches, then
//! `--iters` timed ones, each checked, prepared and run as a server runs one
//! ([`Engine::score`]); on a GPU, up to three batches in flight.
//! Report: samples/s, p50/p99 per batch, the stages' shares, as text and with `--json` as JSON.

use super::load::{BatchSizes, Load};
use super::model_gpu::{GpuInputs, GpuLoop, measure_gpu};
use super::model_report::{HostTimes, Inputs, Report};
use crate::units::{human_bytes, mem_available};
use anyhow::{Result, bail};
use clap::Args;
use ember_bench::stats::{median, quantile};
use ember_embed::DType;
use ember_model::presets::{Preset, RowsOptions, dense_macs, preset_with, random_batch_pooled};
use ember_model::{Engine, Model, Predictor, StageTimes};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Model shape: rm1 (dense 2048 -> 256-64, 32 tables x 500K x 64, pooling 80, dot, top
    /// 768-384-1), small (the same with 8 tables x 10K rows) or dlrm-v2 (MLPerf DLRM-v2,
    /// TorchRec's DLRM_DCN: dense 13 -> 512-256-128, 26 tables x dim 128 with MLPerf's rows
    /// and multi-hot sizes, a 3-layer rank-512 cross net, top 1024-1024-512-256-1); or an HSTU
    /// ranking model: dlrm-v3 (MLPerf DLRMv3: 5 STU layers, 4 heads x 128, dim 512, tables 1e9 /
    /// 10M / 128 rows of 512, scaled by --rows-scale) or hstu-small (dims 64, 2 layers).
    #[arg(long, default_value = "rm1")]
    pub(crate) preset: String,
    /// An HSTU model directory to time instead of a preset (its tables in their own dtype).
    #[arg(long, value_name = "DIR")]
    pub(crate) model: Option<std::path::PathBuf>,
    /// HSTU: the users to score, one JSON user a line (as `ember predict` reads them)
    /// [default: 8 synthetic streaming users of --history items and --candidates candidates].
    #[arg(long, value_name = "FILE")]
    pub(crate) users: Option<std::path::PathBuf>,
    /// HSTU: history items of each synthetic user.
    #[arg(long, default_value_t = 256)]
    pub(crate) history: usize,
    /// HSTU: candidates of each synthetic user.
    #[arg(long, default_value_t = 64)]
    pub(crate) candidates: usize,
    /// HSTU: what attention is divided by, alone or batch_max [default: the model's].
    #[arg(long, value_name = "RULE")]
    pub(crate) attention_norm: Option<String>,
    /// HSTU: users scored in one forward pass (MLPerf's Server scenario sends one; a GPU
    /// wants several).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) users_per_batch: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Batch sizes to cycle through instead of --batch: `mlperf` (MLPerf DLRM-v2's query
    /// sizes: 100 to 700 samples, 270 on average) or a list such as 100,200,700.
    #[arg(long, value_name = "mlperf|N,N,...", conflicts_with = "batch")]
    batch_sizes: Option<BatchSizes>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 300)]
    pub(crate) iters: usize,
    /// Untimed batches first.
    #[arg(long, default_value_t = 30)]
    pub(crate) warmup: usize,
    /// Ids per bag of every feature [default: the preset's: 80 for rm1 and small, MLPerf's
    /// multi-hot size of each feature (1 to 100, 214 a sample) for dlrm-v2].
    #[arg(long)]
    pooling: Option<usize>,
    /// Multiplies every table's rows by F (rounded up), before --max-rows.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub(crate) rows_scale: f64,
    /// Caps each table's rows, 0 for no cap [default: 200000 for dlrm-v2, whose five 40M-row
    /// tables would be 102 GB; none for rm1 and small].
    #[arg(long, value_name = "N")]
    max_rows: Option<usize>,
    /// Table dtype: f32, f16, bf16, int8, int4.
    #[arg(long, default_value = "f32")]
    pub(crate) dtype: DType,
    /// Dense layers' precision: f32, bf16 or int8 (on AMX tiles, AVX-512 BF16 / VNNI or an
    /// emulation, whichever the CPU has; `EMBER_DENSE_ISA` picks one).
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    pub(crate) dense_dtype: ember_model::DenseDType,
    /// After timing, score this many more random samples with the dense layers in f32 and in
    /// --dense-dtype, draw each sample's label from its f32 probability, and report the AUC
    /// --dense-dtype keeps (MLPerf's targets: 99% / 99.9% of f32's) and the scores' errors.
    #[arg(long, value_name = "SAMPLES", default_value_t = 0)]
    pub(crate) accuracy: usize,
    /// Seed of weights and inputs.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Print a JSON object as the last line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write an HTML page of plots (where the time goes, the batch latency histogram).
    #[arg(long, value_name = "FILE.html")]
    report: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub(crate) gpu: crate::gpu_args::GpuArgs,
    /// With --device cuda, where each batch starts. pinned: in page-locked memory made ahead and
    /// not timed (as PyTorch's side of bench/compare_torch_dlrm.py pins its inputs), copied as
    /// it is and checked on the device; staged: in ordinary memory, checked and staged by the
    /// host in one pass, as `serve` runs a batch.
    #[arg(long, value_enum, default_value_t = GpuInputs::Pinned)]
    gpu_inputs: GpuInputs,
    /// With --device cuda, batches in flight at most [default: 2 with pinned inputs (the copy
    /// engine is the limit: a third only waits), 3 with staged ones (the host stages one while
    /// another copies and a third computes)].
    #[arg(long, value_name = "N")]
    in_flight: Option<usize>,
}

/// Distinct input batches cycled through (ids differ between consecutive batches, as in serving).
const DISTINCT_BATCHES: usize = 32;

impl ModelArgs {
    fn gpu_loop(&self) -> GpuLoop<'_> {
        GpuLoop {
            gpu: &self.gpu,
            dense_dtype: self.dense_dtype,
            inputs: self.gpu_inputs,
            in_flight: self.in_flight,
            warmup: self.warmup,
            iters: self.iters,
        }
    }
}

pub fn run(a: ModelArgs) -> Result<()> {
    if a.batch == 0 || a.iters == 0 {
        bail!("--batch and --iters must be at least 1");
    }
    let rows = RowsOptions {
        scale: a.rows_scale,
        max_rows: a.max_rows,
    };
    // Built with f32 dense layers, switched to --dense-dtype by the timed predictor (after
    // int8's calibration on the workload's inputs).
    let p = preset_with(&a.preset, a.dtype, rows)?;
    let load = Load::new(a.batch, a.batch_sizes.as_ref(), a.pooling, &p);
    if load.sizes.is_empty() {
        bail!("--batch-sizes lists no size");
    }
    let (model, batches) = set_up(&a, &p, &load)?;
    if a.dense_dtype == ember_model::DenseDType::Int8 && !a.gpu.is_cuda() {
        // int8's smoothing calibrated on inputs like the timed ones (4 fresh batches).
        let batch = load.max_batch().min(512);
        let inputs = |i: usize| {
            random_batch_pooled(&p.config, batch, &load.pooling, 0xca1b ^ (i as u64) << 16)
        };
        Predictor::calibrate_int8(&model, a.threads, 4, inputs)?;
    }
    let (mut report, scores, gpu) = match a.gpu.is_cuda() {
        true => {
            let (r, s, g) = measure_gpu(&a.gpu_loop(), model.clone(), &batches, &load)?;
            (r, s, Some(g))
        }
        false => {
            let (r, s) = measure_cpu(&a, model.clone(), &batches, &load)?;
            (r, s, None)
        }
    };
    if a.accuracy > 0 && a.dense_dtype != ember_model::DenseDType::F32 {
        let batch = load.max_batch();
        let inputs = |i: usize| {
            random_batch_pooled(&p.config, batch, &load.pooling, 0xacc ^ (i as u64) << 20)
        };
        let n = a.accuracy.div_ceil(batch);
        let t = Instant::now();
        let acc = match gpu {
            // The GPU's scores against the CPU's f32 ones.
            Some(mut g) => ember_model::accuracy::dense_accuracy_of(
                &model,
                &mut g,
                a.dense_dtype,
                a.threads.max(rayon::current_num_threads()),
                n,
                inputs,
                a.seed,
            )?,
            None => ember_model::accuracy::dense_accuracy(
                &model,
                a.dense_dtype,
                a.threads,
                n,
                inputs,
                a.seed,
            )?,
        };
        eprintln!(
            "accuracy: {} samples in {:.1}s",
            acc.samples,
            t.elapsed().as_secs_f64()
        );
        report.accuracy = Some(acc);
    }
    if scores.iter().any(|s| !s.is_finite()) {
        bail!("non-finite scores: {scores:?}");
    }
    print(&report, &a, &p, &load);
    if let Some(path) = &a.report {
        page(&report, &a, &p, &load).write(path)?;
    }
    Ok(())
}

/// `--report`: the stages' shares and the batch latencies.
fn page(r: &Report, a: &ModelArgs, p: &Preset, load: &Load) -> crate::report::Page {
    use crate::report::{Page, Plot, log_buckets};
    let mut page = Page::new(format!("ember bench model: preset {}", p.name));
    let samples_per_s = r.samples as f64 / r.total;
    page.param(
        "batch, pooling, dtype",
        format!(
            "{}, {}, {}",
            load.batch_text(),
            load.pooling_text(),
            a.dtype
        ),
    )
    .param("device", if a.gpu.is_cuda() { "cuda" } else { "cpu" })
    .param("threads", a.threads)
    .param("samples/s", format!("{samples_per_s:.0}"));
    let st = r.stages.total().as_secs_f64();
    let share = |d: Duration| 100.0 * d.as_secs_f64() / st;
    page.figure(
        "Where the time goes",
        format!(
            "Share of the forward pass's time per stage{}.",
            if r.stages.bottom_overlapped {
                " (the bottom MLP ran beside the embedding stage, inside its share)"
            } else {
                ""
            }
        ),
        Plot::Bars {
            y_label: "% of the forward pass".into(),
            bars: vec![
                ("embedding".into(), share(r.stages.embedding)),
                ("bottom MLP".into(), share(r.stages.bottom_mlp)),
                ("interaction".into(), share(r.stages.interaction)),
                ("top MLP".into(), share(r.stages.top_mlp)),
            ],
        },
    );
    page.figure(
        "Batch latency",
        format!(
            "Latency of each of the {} batches (log scale).",
            r.lat_ms.len()
        ),
        Plot::Histogram {
            x_label: "ms per batch".into(),
            buckets: log_buckets(&r.lat_ms),
            log_x: true,
        },
    );
    if let Some(l) = &r.layers {
        l.figure(&mut page);
    }
    page
}

/// The model with random weights, and the input batches.
fn set_up(a: &ModelArgs, p: &Preset, load: &Load) -> Result<(Arc<Model>, Vec<Inputs>)> {
    let table_bytes = table_bytes(p);
    if let Some(avail) = mem_available()
        && table_bytes > avail
    {
        bail!(
            "preset {} needs {} of tables but only {} is available; try --dtype int8 or \
             --max-rows",
            p.name,
            human_bytes(table_bytes),
            human_bytes(avail)
        );
    }
    let build = Instant::now();
    let model = Arc::new(Model::random(p.config.clone(), a.seed, a.threads.max(2))?);
    eprintln!(
        "built {} ({} of {} tables) in {:.1}s",
        p.name,
        human_bytes(model.table_bytes()),
        a.dtype,
        build.elapsed().as_secs_f64()
    );
    // Whole cycles of the sizes, so that batch i of the run has size i % cycle.
    let cycle = load.sizes.len();
    let distinct = DISTINCT_BATCHES.div_ceil(cycle) * cycle;
    let batches = (0..distinct.min(a.warmup + a.iters))
        .map(|i| {
            let seed = a.seed ^ (i as u64 + 1) << 8;
            random_batch_pooled(&p.config, load.sizes[i % cycle], &load.pooling, seed)
        })
        .collect();
    Ok((model, batches))
}

fn table_rows(p: &Preset) -> usize {
    p.config.tables.iter().map(|t| t.rows).sum()
}

fn table_bytes(p: &Preset) -> usize {
    p.config
        .tables
        .iter()
        .map(|t| t.rows * t.dtype.row_bytes(t.dim))
        .sum()
}

/// The CPU loop: one batch at a time, as the server's batcher runs them.
fn measure_cpu(
    a: &ModelArgs,
    model: Arc<Model>,
    batches: &[Inputs],
    load: &Load,
) -> Result<(Report, Vec<f32>)> {
    let mut pred = Predictor::new(model, a.threads)?;
    pred.set_dense_dtype(a.dense_dtype)?;
    let mut scores = vec![0f32; load.max_batch()];
    for i in 0..a.warmup {
        let (d, s) = &batches[i % batches.len()];
        pred.score(d, s, &mut scores[..s.batch_size()])?;
    }
    pred.time_layers();
    let mut lat_ms = Vec::with_capacity(a.iters);
    let mut stages = StageTimes::default();
    let mut samples = 0;
    let start = Instant::now();
    for i in 0..a.iters {
        let (d, s) = &batches[(a.warmup + i) % batches.len()];
        let t = Instant::now();
        let st = pred.score(d, s, &mut scores[..s.batch_size()])?;
        lat_ms.push(t.elapsed().as_secs_f64() * 1e3);
        stages = stages.plus(st);
        samples += s.batch_size();
    }
    let total = start.elapsed().as_secs_f64();
    let (dtype, isa) = pred.dense();
    let layers = (dtype != ember_model::DenseDType::F32)
        .then(|| super::dense_layers::report(pred.layer_times(), samples, a.threads, dtype, isa));
    Ok((
        Report {
            lat_ms,
            samples,
            stages,
            total,
            host: None,
            layers,
            accuracy: None,
        },
        scores,
    ))
}

/// Prints the report as text, and as JSON with `--json`.
fn print(r: &Report, a: &ModelArgs, p: &Preset, load: &Load) {
    let f = figures(r);
    print_setup(a, p, load);
    print_times(r, &f);
    if let Some(acc) = &r.accuracy {
        print_accuracy(acc);
    }
    if let Some(h) = &r.host {
        print_gpu_stages(&r.stages, h, a.iters);
    }
    if a.json {
        println!("{}", to_json(r, a, p, load, &f));
    }
}

/// What the text and the JSON both give of a report.
struct Figures {
    samples_per_s: f64,
    /// Batch latency quantiles, ms.
    p50: f64,
    p99: f64,
    /// Each stage's share of the forward pass's wall time; with threads > 1 the bottom MLP ran
    /// beside the embedding stage (inside its share), so the four add up to more than 100%.
    parts: [(&'static str, f64); 4],
}

/// The report's throughput, latency quantiles and stage shares.
fn figures(r: &Report) -> Figures {
    let mut sorted = r.lat_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let stages = &r.stages;
    let st = stages.total().as_secs_f64();
    let share = |d: std::time::Duration| d.as_secs_f64() / st;
    Figures {
        samples_per_s: r.samples as f64 / r.total,
        p50: quantile(&sorted, 0.5),
        p99: quantile(&sorted, 0.99),
        parts: [
            ("embedding", share(stages.embedding)),
            ("bottom_mlp", share(stages.bottom_mlp)),
            ("interaction", share(stages.interaction)),
            ("top_mlp", share(stages.top_mlp)),
        ],
    }
}

/// The lines that say what ran: the preset, its batches and device, the model's tables and
/// dense work, the dense precision and its kernels.
fn print_setup(a: &ModelArgs, p: &Preset, load: &Load) {
    let on = match a.gpu.is_cuda() {
        true => format!(
            "cuda:{} {}, {} dense, {} inputs, {} batches in flight",
            a.gpu.gpu,
            a.gpu.gpu_variant,
            a.dense_dtype,
            match a.gpu_inputs {
                GpuInputs::Pinned => "pinned (checked on the device)",
                GpuInputs::Staged => "staged (checked by the host)",
            },
            a.gpu_loop().in_flight()
        ),
        false => format!("{} threads", a.threads),
    };
    println!(
        "ember bench model: preset {} ({}, {}, {} tables, {on}, {} iters)",
        p.name,
        load.batch_text(),
        load.pooling_text(),
        a.dtype,
        a.iters
    );
    println!(
        "  model       {} tables, {} rows{} ({}); dense layers {:.2} M multiply-adds a sample",
        p.config.tables.len(),
        table_rows(p),
        p.max_rows
            .map_or_else(String::new, |cap| format!(", at most {cap} per table")),
        human_bytes(table_bytes(p)),
        dense_macs(&p.config) as f64 / 1e6
    );
    let dense_isa = ember_model::DenseIsa::selected(a.dense_dtype).ok();
    println!(
        "  dense       {} ({})",
        a.dense_dtype,
        dense_isa.map_or("?", |i| i.describe(a.dense_dtype))
    );
}

/// Throughput, batch latencies, where the time goes, and the dense layers' times.
fn print_times(r: &Report, f: &Figures) {
    println!("  samples/s   {:.0}", f.samples_per_s);
    println!(
        "  batch ms    p50 {:.3}  p99 {:.3}  median {:.3}",
        f.p50,
        f.p99,
        median(&r.lat_ms)
    );
    println!(
        "  where the time goes (share of the forward pass){}:",
        if r.stages.bottom_overlapped {
            "; the bottom MLP ran on one thread beside the embedding stage, inside its share"
        } else {
            ""
        }
    );
    for (name, s) in f.parts {
        println!(
            "    {name:<12} {:5.1}%  {}",
            s * 100.0,
            "#".repeat((s * 40.0).round() as usize)
        );
    }
    if let Some(l) = &r.layers {
        l.print();
    }
}

/// `--accuracy`: the dense dtype's AUC against f32's, and the score errors.
fn print_accuracy(acc: &ember_model::accuracy::DenseAccuracy) {
    println!(
        "  accuracy    {} keeps {:.4}% of f32's AUC ({:.5} against {:.5}; labels drawn from f32's \
         probabilities, {} samples): {}; |score error| max {:.2e}, mean {:.2e}",
        acc.dtype,
        100.0 * acc.ratio(),
        acc.auc,
        acc.auc_f32,
        acc.samples,
        if acc.meets(0.999) {
            "meets MLPerf's 99.9% target"
        } else if acc.meets(0.99) {
            "meets the 99% target only"
        } else {
            "MISSES MLPerf's targets"
        },
        acc.max_abs,
        acc.mean_abs
    );
}

/// On a GPU: each stage's time per batch over `iters` batches, and the host's.
fn print_gpu_stages(stages: &StageTimes, h: &HostTimes, iters: usize) {
    let per_batch = |d: Duration| d.as_secs_f64() * 1e3 / iters as f64;
    println!(
        "  per batch, ms: GPU copy in {:.3}, embedding {:.3}, bottom MLP {:.3}, interaction \
         {:.3}, top MLP {:.3}, copy out {:.3}; host check + stage + enqueue {:.3}, \
         wait {:.3}",
        per_batch(stages.copy_in),
        per_batch(stages.embedding),
        per_batch(stages.bottom_mlp),
        per_batch(stages.interaction),
        per_batch(stages.top_mlp),
        per_batch(stages.copy_out),
        per_batch(h.submit),
        per_batch(h.wait)
    );
}

/// The `--json` object of the report.
fn to_json(r: &Report, a: &ModelArgs, p: &Preset, load: &Load, f: &Figures) -> serde_json::Value {
    let stages = &r.stages;
    let per_batch = |d: Duration| d.as_secs_f64() * 1e3 / a.iters as f64;
    let (parts, samples_per_s, p50, p99) = (f.parts, f.samples_per_s, f.p50, f.p99);
    let macs = dense_macs(&p.config);
    let dense_isa = ember_model::DenseIsa::selected(a.dense_dtype).ok();
    json!({
        "preset": p.name,
        "batch": (load.sizes.len() == 1).then_some(load.sizes[0]),
        "batch_sizes": &load.sizes,
        "samples": r.samples,
        "threads": a.threads,
        "device": if a.gpu.is_cuda() { "cuda" } else { "cpu" },
        "gpu_variant": a.gpu.is_cuda().then_some(&a.gpu.gpu_variant),
        "iters": a.iters,
        "pooling": load
            .uniform_pooling()
            .map_or_else(|| json!(load.pooling), |n| json!(n)),
        "ids_per_sample": load.pooling.iter().sum::<usize>(),
        "rows_scale": a.rows_scale,
        "max_rows": p.max_rows,
        "table_rows": table_rows(p),
        "dense_macs_per_sample": macs,
        "dtype": a.dtype.name(),
        "dense_dtype": a.dense_dtype.name(),
        "dense_isa": dense_isa.map(|i| i.name()),
        "dense_layers": r.layers.as_ref().map(|l| l.json()),
        "accuracy": r.accuracy.as_ref().map(|acc| json!({
            "samples": acc.samples,
            "auc_f32": acc.auc_f32,
            "auc": acc.auc,
            "ratio": acc.ratio(),
            "max_abs_error": acc.max_abs,
            "mean_abs_error": acc.mean_abs,
        })),
        "samples_per_s": samples_per_s,
        "p50_ms": p50,
        "p99_ms": p99,
        "mean_ms": r.lat_ms.iter().sum::<f64>() / r.lat_ms.len() as f64,
        "bottom_mlp_overlapped": stages.bottom_overlapped,
        "breakdown": {
            "embedding": parts[0].1,
            "bottom_mlp": parts[1].1,
            "interaction": parts[2].1,
            "top_mlp": parts[3].1,
        },
        "table_bytes": table_bytes(p),
        "ms_per_batch": r.host.as_ref().map(|h| json!({
            "gpu_copy_in": per_batch(stages.copy_in),
            "gpu_embedding": per_batch(stages.embedding),
            "gpu_bottom_mlp": per_batch(stages.bottom_mlp),
            "gpu_interaction": per_batch(stages.interaction),
            "gpu_top_mlp": per_batch(stages.top_mlp),
            "gpu_forward": per_batch(stages.wall),
            "gpu_copy_out": per_batch(stages.copy_out),
            "host_submit": per_batch(h.submit),
            "host_wait": per_batch(h.wait),
        })),
    })
}
