//! `ember predict`: scores a Criteo-format file (a Criteo-shaped model), JSON lines (any
//! model: one sample a line, as `/v1/score` takes them, with an optional `label`) or a NumPy
//! `.npz` / safetensors file of the model's input arrays (any model, [`tensors`]), in batches. Rows are not kept, but each row's label and score are (8 bytes a row, for the
//! AUC): a Terabyte day of 200M rows needs 1.6 GB.
//!
//! Set up: the model and its engine (the CPU predictor, with a sharding plan or not, or a GPU's).
//! Score: batches are parsed, checked and prepared (tables on the SSD tier: their rows read)
//! `prefetch_depth` batches ahead of the engine, on a thread of their own
//! ([`ember_model::run_ahead`]). Report: AUC, log loss, samples/s, the tier's figures.

use crate::gpu_args::GpuArgs;
use crate::paths::{DEFAULT_DATA, DEFAULT_MODEL, shipped};
use crate::tier_args::TierArgs;
use crate::units::human_bytes;
use anyhow::{Context, Result, bail};
use clap::Args;
use ember_embed::DType;
use ember_model::criteo::{CriteoBatch, CriteoReader, DENSE, SPARSE};
use ember_model::eval::{auc, log_loss};
use ember_model::{Engine, Model, Prepared, StageTimes, run_ahead};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

mod hstu;
pub use hstu::{breakdown as hstu_breakdown, stage_json as hstu_stage_json};
mod tensors;

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// Model directory (config.json + model.safetensors) [default: the shipped models/default].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Data to score ('-' for stdin) [default: the shipped data/sample.tsv].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Its format: `tsv` (Criteo), `jsonl` (one `{"dense": [...], "sparse": {"F": [ids]},
    /// "label": 0}` a line, label optional), `npz` (NumPy) or `safetensors` (arrays `dense`,
    /// `<F>_lengths`, `<F>_ids` and optionally `label`, as the KServe inputs), or `auto` (by
    /// the extension: .jsonl / .ndjson / .json, .npz, .safetensors; else tsv).
    #[arg(long, value_enum, default_value_t = DataFormat::Auto)]
    format: DataFormat,
    /// Samples per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Write one score per input row, in input order, to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Re-encode the tables at load (f32, f16, bf16, int8, int4).
    #[arg(long)]
    dtype: Option<DType>,
    /// Run the dense layers (MLPs, cross net) in f32, bf16 or int8 [default: config.json's
    /// `dense_dtype`, else f32].
    #[arg(long, value_name = "DTYPE")]
    dense_dtype: Option<ember_model::DenseDType>,
    #[command(flatten)]
    tier: TierArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    plan: crate::plan::PlanArgs,
    /// HSTU models: what attention is divided by, `alone` (each user's own length: scores do
    /// not depend on batch-mates) or `batch_max` (the reference's: the batch's longest)
    /// [default: config.json's `attention_norm`, else alone].
    #[arg(long, value_name = "RULE")]
    attention_norm: Option<String>,
    /// Print a JSON object as the last line.
    #[arg(long)]
    json: bool,
}

/// How `--data` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    Auto,
    Tsv,
    Jsonl,
    Npz,
    Safetensors,
}

impl DataFormat {
    fn of(self, data: &Path) -> DataFormat {
        match self {
            DataFormat::Auto => match data.extension().and_then(|e| e.to_str()) {
                Some("jsonl" | "ndjson" | "json") => DataFormat::Jsonl,
                Some("npz") => DataFormat::Npz,
                Some("safetensors") => DataFormat::Safetensors,
                _ => DataFormat::Tsv,
            },
            f => f,
        }
    }
}

/// What scoring the file gave.
#[derive(Debug, Default)]
struct Scored {
    labels: Vec<f32>,
    scores: Vec<f32>,
    /// The forward passes' stage times, summed.
    times: StageTimes,
    /// Wall seconds, parsing included.
    wall: f64,
}

pub fn run(a: PredictArgs) -> Result<()> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let model_dir = a.model.clone().unwrap_or_else(|| shipped(DEFAULT_MODEL));
    let data = a.data.clone().unwrap_or_else(|| shipped(DEFAULT_DATA));
    if ember_model::hstu::HstuModel::is_hstu_dir(&model_dir) {
        return hstu::run(&a, &model_dir, &data);
    }
    let format = a.format.of(&data);
    let (model, mut engine) = set_up(&a, &model_dir, format)?;
    let depth = match model.stager().is_active() {
        true => a.tier.depth(&model),
        false => 0,
    };
    let scored = match format {
        DataFormat::Jsonl => score_jsonl(&a, &model, &mut *engine, &data)?,
        DataFormat::Npz | DataFormat::Safetensors => {
            score_tensors(&a, &model, &mut *engine, &data, format == DataFormat::Npz)?
        }
        _ => score_file(&a, &model, &mut *engine, &data, depth)?,
    };
    print(&a, &model, &model_dir, &data, &scored, depth);
    Ok(())
}

/// The model (Criteo-shaped for TSV) and the engine that runs it.
fn set_up(
    a: &PredictArgs,
    model_dir: &Path,
    format: DataFormat,
) -> Result<(Arc<Model>, Box<dyn Engine>)> {
    let mut model = Model::load(model_dir, a.tier.load_options(a.dtype, a.dense_dtype))
        .with_context(|| format!("loading model {}", model_dir.display()))?;
    a.tier.apply(&mut model, model_dir)?;
    let inputs = model.inputs();
    if format == DataFormat::Tsv && !inputs.is_criteo() {
        bail!(
            "model {} has {} dense and {} sparse features; Criteo data has {DENSE} and \
             {SPARSE}: give its samples as JSON lines (--format jsonl)",
            model_dir.display(),
            inputs.dense_in,
            inputs.features.len()
        );
    }
    let model = Arc::new(model);
    if !a.gpu.is_cuda() {
        let name = ember_model::dir_name(model_dir);
        if let Some((warn, line)) = crate::dense::accuracy_line(&model, &name, a.threads) {
            eprintln!("{}{line}", if warn { "warning: " } else { "" });
        }
    }
    if a.gpu.is_cuda() && a.plan.plan.is_some() {
        bail!("--plan runs on CPU worker pools; with --device cuda the model runs on one GPU");
    }
    let engine: Box<dyn Engine> = match a.gpu.is_cuda() {
        true => {
            if model.stager().is_active() {
                bail!("--device cuda needs every table in memory (no --placement ssd)");
            }
            Box::new(
                a.gpu
                    .predictor(model.clone(), model.dense_dtype(), a.batch, 1, None)?,
            )
        }
        false => Box::new(a.plan.predictor(model.clone(), a.threads)?),
    };
    Ok((model, engine))
}

/// Streams `data` through the engine, batches prepared `depth` ahead; writes scores to
/// `--out` as they come.
fn score_file(
    a: &PredictArgs,
    model: &Arc<Model>,
    engine: &mut dyn Engine,
    data: &Path,
    depth: usize,
) -> Result<Scored> {
    let (input, size) = open_data(data)?;
    let mut reader = CriteoReader::new(input, data.display().to_string());
    let mut out = open_out(a)?;
    let bar = progress(size);
    let inputs = model.inputs();
    let mut scored = Scored::default();
    let start = Instant::now();
    let mut line = String::new();
    // A parse error ends the stream and is raised after the batches before it are scored.
    let parse_err: std::sync::Mutex<Option<anyhow::Error>> = Default::default();
    let batches = std::iter::from_fn(|| {
        let mut batch = CriteoBatch::default();
        let next = reader
            .next_batch(a.batch, &mut batch)
            .map_err(anyhow::Error::from)
            .and_then(|n| Ok((n, batch.sparse(&inputs.features, &inputs.rows)?)));
        match next {
            Ok((0, _)) => None,
            Ok((_, sparse)) => Some((batch, sparse, reader.bytes_read())),
            Err(e) => {
                *parse_err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                None
            }
        }
    });
    // Checked and prepared (tier rows read) on the parsing thread, `depth` batches ahead.
    let prepare = |(mut batch, sparse, pos): (CriteoBatch, _, u64)| {
        let dense = std::mem::take(&mut batch.dense);
        let prepared = model
            .batch_owned(dense, sparse)
            .and_then(|b| model.prepare(b));
        (batch.labels, prepared, pos)
    };
    let consume = |(labels, prepared, pos): (Vec<f32>, ember_model::Result<Prepared>, u64)| {
        let prepared = prepared?;
        let s0 = scored.scores.len();
        scored.scores.resize(s0 + labels.len(), 0.0);
        let t = engine.run(&prepared, &mut scored.scores[s0..])?;
        scored.times = scored.times.plus(t);
        scored.labels.extend_from_slice(&labels);
        if let Some(w) = &mut out {
            line.clear();
            for s in &scored.scores[s0..] {
                use std::fmt::Write as _;
                let _ = writeln!(line, "{s}");
            }
            w.write_all(line.as_bytes())?;
        }
        bar.set_position(pos);
        anyhow::Ok(())
    };
    run_ahead(depth, batches, prepare, consume, |d| model.record_stall(d))?;
    if let Some(e) = parse_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    bar.finish_and_clear();
    scored.wall = start.elapsed().as_secs_f64();
    if let Some(mut w) = out {
        w.flush()?;
    }
    Ok(scored)
}

/// `data` to read (`-`: stdin), and its size when it is a file.
fn open_data(data: &Path) -> Result<(Box<dyn BufRead + Send>, Option<u64>)> {
    if data.as_os_str() == "-" {
        return Ok((Box::new(BufReader::new(std::io::stdin())), None));
    }
    let f = ember_embed::files::open_regular(data, "data file")
        .with_context(|| format!("cannot open data file {}", data.display()))?;
    let len = f.metadata().ok().map(|m| m.len());
    Ok((Box::new(BufReader::with_capacity(1 << 20, f)), len))
}

/// The `--out` file, when one is asked for.
fn open_out(a: &PredictArgs) -> Result<Option<BufWriter<std::fs::File>>> {
    a.out
        .as_ref()
        .map(|p| {
            std::fs::File::create(p)
                .map(BufWriter::new)
                .with_context(|| format!("cannot create {}", p.display()))
        })
        .transpose()
}

/// Streams JSON lines (`{"dense": [...], "sparse": {"F": [ids], ...}, "label": 0 or 1}`, the
/// label optional, one sample a line, as `/v1/score` takes them) through the engine, `--batch`
/// lines at a time; a bad line is an error naming its line number.
fn score_jsonl(
    a: &PredictArgs,
    model: &Arc<Model>,
    engine: &mut dyn Engine,
    data: &Path,
) -> Result<Scored> {
    let (input, _) = open_data(data)?;
    let spec = ember_serve::ModelSpec::of(model.clone(), "predict");
    let mut out = open_out(a)?;
    let mut scored = Scored::default();
    let (mut labelled, mut unlabelled) = (0usize, 0usize);
    let start = Instant::now();
    let mut batch: Vec<ember_model::Samples> = Vec::with_capacity(a.batch);
    let mut flush = |batch: &mut Vec<ember_model::Samples>, scored: &mut Scored| -> Result<()> {
        let parts: Vec<&ember_model::Samples> = batch.iter().collect();
        score_samples(model, engine, &parts, scored, &mut out)?;
        batch.clear();
        Ok(())
    };
    for (i, line) in input.lines().enumerate() {
        let at = || format!("{}, line {}", data.display(), i + 1);
        let line = line.with_context(at)?;
        if line.trim().is_empty() {
            continue;
        }
        let mut v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}: not a JSON object", at()))?;
        let label = v.as_object_mut().and_then(|o| o.remove("label"));
        match label.as_ref().and_then(serde_json::Value::as_f64) {
            Some(l) => {
                labelled += 1;
                scored.labels.push(l as f32);
            }
            None if label.is_some() => bail!("{}: 'label' is not a number", at()),
            None => unlabelled += 1,
        }
        let body = serde_json::to_vec(&v)?;
        let sample = ember_serve::v1::decode_json(&spec, &body).map_err(|e| {
            anyhow::anyhow!("{}: {}", at(), e.to_string().replace("sample 0: ", ""))
        })?;
        if sample.len() != 1 {
            bail!("{}: one sample a line, found {}", at(), sample.len());
        }
        let sample = ember_model::serving::into_samples(sample)
            .context("a DLRM-family model's request holds samples")?;
        batch.push(sample);
        if batch.len() == a.batch {
            flush(&mut batch, &mut scored)?;
        }
    }
    flush(&mut batch, &mut scored)?;
    if labelled > 0 && unlabelled > 0 {
        bail!("{labelled} lines have a 'label' and {unlabelled} do not: all or none");
    }
    scored.wall = start.elapsed().as_secs_f64();
    if let Some(mut w) = out {
        w.flush()?;
    }
    Ok(scored)
}

/// Scores `parts` as one batch, appending the scores to `scored` (and `out`).
fn score_samples(
    model: &Arc<Model>,
    engine: &mut dyn Engine,
    parts: &[&ember_model::Samples],
    scored: &mut Scored,
    out: &mut Option<BufWriter<std::fs::File>>,
) -> Result<()> {
    if parts.is_empty() {
        return Ok(());
    }
    let prepared = model.merge(parts).and_then(|b| model.prepare(b))?;
    let n: usize = parts.iter().map(|p| p.len()).sum();
    let s0 = scored.scores.len();
    scored.scores.resize(s0 + n, 0.0);
    let t = engine.run(&prepared, &mut scored.scores[s0..])?;
    scored.times = scored.times.plus(t);
    if let Some(w) = out {
        for s in &scored.scores[s0..] {
            writeln!(w, "{s}")?;
        }
    }
    Ok(())
}

/// The samples of a NumPy `.npz` or safetensors file of the model's input arrays (`predict`'s
/// tensor format), checked against the model, in batches of at most `batch`: the inputs
/// `serve --calibrate` calibrates int8 layers on.
pub(crate) fn read_samples(
    model: &Arc<Model>,
    path: &Path,
    batch: usize,
) -> Result<Vec<ember_model::Samples>> {
    let npz = path.extension().is_some_and(|e| e == "npz");
    let file = tensors::TensorFile::open(path, npz)?;
    let spec = ember_serve::ModelSpec::of(model.clone(), "calibrate");
    let n = file
        .check(&spec)
        .with_context(|| format!("{} does not fit the model", path.display()))?;
    let mut cursors = vec![0usize; spec.features().len()];
    let mut out = Vec::new();
    for s0 in (0..n).step_by(batch.max(1)) {
        let range = s0..(s0 + batch.max(1)).min(n);
        out.push(
            file.batch(&spec, &mut cursors, range.clone())
                .map_err(|e| anyhow::anyhow!("{}, samples {range:?}: {e}", path.display()))?,
        );
    }
    Ok(out)
}

/// Scores a NumPy `.npz` or safetensors file of the model's input arrays, `--batch` samples
/// at a time, each batch decoded as a request is.
fn score_tensors(
    a: &PredictArgs,
    model: &Arc<Model>,
    engine: &mut dyn Engine,
    data: &Path,
    npz: bool,
) -> Result<Scored> {
    if data == Path::new("-") {
        bail!("--data -: NumPy and safetensors files are read from a path, not stdin");
    }
    let start = Instant::now();
    let file = tensors::TensorFile::open(data, npz)?;
    let spec = ember_serve::ModelSpec::of(model.clone(), "predict");
    let n = file
        .check(&spec)
        .with_context(|| format!("{} does not fit the model", data.display()))?;
    let mut out = open_out(a)?;
    let mut scored = Scored {
        labels: file.labels()?.unwrap_or_default(),
        ..Scored::default()
    };
    let mut cursors = vec![0usize; spec.features().len()];
    for s0 in (0..n).step_by(a.batch) {
        let range = s0..(s0 + a.batch).min(n);
        let samples = file
            .batch(&spec, &mut cursors, range.clone())
            .map_err(|e| {
                anyhow::anyhow!(
                    "{}, samples {}..{} (sample numbers below count from {s0}): {e}",
                    data.display(),
                    range.start,
                    range.end
                )
            })?;
        score_samples(model, engine, &[&samples], &mut scored, &mut out)?;
    }
    scored.wall = start.elapsed().as_secs_f64();
    if let Some(mut w) = out {
        w.flush()?;
    }
    Ok(scored)
}

/// A progress bar for long files (stderr; hidden when it is not a terminal).
fn progress(size: Option<u64>) -> ProgressBar {
    match size {
        Some(n) if n > 16 << 20 => {
            let b = ProgressBar::new(n);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
                )
                .expect("valid template"),
            );
            b
        }
        _ => ProgressBar::hidden(),
    }
}

/// Prints the figures, and with `--json` one JSON object as the last line.
fn print(a: &PredictArgs, model: &Model, model_dir: &Path, data: &Path, s: &Scored, depth: usize) {
    let n = s.scores.len();
    let model_s = s.times.total().as_secs_f64();
    let labelled = n > 0 && s.labels.len() == n;
    let a_uc = labelled.then(|| auc(&s.labels, &s.scores)).flatten();
    let ll = labelled.then(|| log_loss(&s.labels, &s.scores));
    let on = if a.gpu.is_cuda() {
        format!("cuda:{} {}", a.gpu.gpu, a.gpu.gpu_variant)
    } else {
        format!("{} threads", a.threads)
    };
    println!(
        "model {}  data {}  ({on}, batch {})",
        model_dir.display(),
        data.display(),
        a.batch
    );
    println!("rows          {n}");
    match a_uc {
        Some(v) => println!("AUC           {v:.6}"),
        None if n == 0 => println!("AUC           n/a (no rows)"),
        None if !labelled => println!("AUC           n/a (no labels)"),
        None => println!("AUC           n/a (only one class in the labels)"),
    }
    match ll {
        Some(ll) => println!("log loss      {ll:.6}"),
        None => println!("log loss      n/a"),
    }
    println!(
        "samples/s     {:.0} end to end (parse + forward), {:.0} forward only",
        n as f64 / s.wall,
        n as f64 / model_s.max(1e-12)
    );
    if let Some(p) = &a.out {
        println!("scores        {}", p.display());
    }
    let stager = model.stager();
    let tier = stager.stats();
    if stager.is_active() {
        println!(
            "SSD tier      hit rate {:.3}, {} read from SSD in {} reads, stall {:.2} s, overlap {:.2} ({}, prefetch depth {depth})",
            tier.hit_rate(),
            human_bytes(tier.store_bytes_read as usize),
            tier.store_reads,
            tier.stall.as_secs_f64(),
            tier.overlap(),
            stager.engine().unwrap_or("none"),
        );
    }
    if a.json {
        println!(
            "{}",
            json!({
                "tier": stager.is_active().then(|| json!({
                    "hit_rate": tier.hit_rate(),
                    "ssd_bytes_read": tier.store_bytes_read,
                    "ssd_reads": tier.store_reads,
                    "stall_s": tier.stall.as_secs_f64(),
                    "overlap": tier.overlap(),
                    "prefetch_depth": depth,
                })),
                "rows": n,
                "auc": a_uc,
                "log_loss": ll,
                "samples_per_s": n as f64 / s.wall,
                "forward_samples_per_s": n as f64 / model_s.max(1e-12),
                "threads": a.threads,
                "device": if a.gpu.is_cuda() { "cuda" } else { "cpu" },
                "batch": a.batch,
            })
        );
    }
}
