//! `ember predict`: scores a file with a model of any family, in batches, through the serving
//! seam ([`ember_model::serving`]): each batch's items are decoded and checked by the model's
//! signature, merged and staged by [`ember_model::serving::Servable::prepare`] and run by a [`Runner`]. The formats:
//! JSON lines (any model: one item a line as `/v1/score` takes it, a DLRM sample with an
//! optional `label` or an HSTU user; `jsonl.rs`), and for a model of the bag form (dense
//! features and a bag of ids per sparse feature) a Criteo-format file or a NumPy `.npz` /
//! safetensors file of its input arrays ([`tensors`]). A model that gives one value per item
//! keeps each item's label and score (8 bytes an item, for the AUC: a Terabyte day of 200M rows
//! needs 1.6 GB); its scores are written one a line, other models' outputs one JSON object per
//! item.
//!
//! Set up: the model ([`TierArgs::load_any`]) and what runs it ([`runner`]: the CPU, a sharding
//! plan, or a GPU; `engines.rs` is the one place that builds a family's engine). Score: Criteo batches are
//! parsed, checked and prepared (tables on the SSD tier: their rows read) the model's prefetch
//! depth ahead of the runner, on a thread of their own ([`ember_model::run_ahead`]). Report:
//! items/s, the AUC and log loss where there are labels, the stages' shares, the tier's figures.

use crate::engines::{RunnerArgs, runner};
use crate::gpu_args::GpuArgs;
use crate::paths::{DEFAULT_DATA, DEFAULT_MODEL, shipped};
use crate::tier_args::TierArgs;
use anyhow::{Context, Result, bail};
use clap::Args;
use ember_embed::DType;
use ember_model::criteo::{CriteoBatch, CriteoReader, DENSE, SPARSE};
use ember_model::serving::{Batched, Items, Outputs, Runner, Times};
use ember_model::{Model, run_ahead};
use ember_serve::ModelSpec;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

mod jsonl;
mod report;
mod tensors;

use report::print;

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
    /// Each item's score, for a model that gives one value per item (kept for the AUC).
    scores: Vec<f32>,
    /// Items scored, and the values each output gave (more than items where an item has a run
    /// of them: an HSTU user's candidates).
    items: usize,
    values: usize,
    /// The forward passes' times, summed.
    times: Times,
    /// Wall seconds, parsing included.
    wall: f64,
}

impl Scored {
    /// Counts a batch's outputs `o` and times `t`; keeps its scores where each item has one.
    fn add(&mut self, o: &Outputs, t: &Times, one_value: bool) {
        self.items += o.items();
        self.values += o.scores().len();
        if one_value {
            self.scores.extend_from_slice(o.scores());
        }
        let s = &mut self.times;
        s.wall += t.wall;
        s.embedding += t.embedding;
        s.dense += t.dense;
        s.copy_in += t.copy_in;
        s.copy_out += t.copy_out;
        if s.stages.len() != t.stages.len() {
            s.stages = t
                .stages
                .iter()
                .map(|&(n, _)| (n, Default::default()))
                .collect();
        }
        for (a, b) in s.stages.iter_mut().zip(&t.stages) {
            a.1 += b.1;
        }
    }
}

pub fn run(a: PredictArgs) -> Result<()> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let model_dir = a.model.clone().unwrap_or_else(|| shipped(DEFAULT_MODEL));
    let data = a.data.clone().unwrap_or_else(|| shipped(DEFAULT_DATA));
    let format = a.format.of(&data);
    let model = a
        .tier
        .load_any(&model_dir, a.tier.load_options(a.dtype, a.dense_dtype))?;
    let spec = ModelSpec::of(model.clone(), "predict");
    if format != DataFormat::Jsonl {
        check_bag_form(&spec, &model_dir, &data, format)?;
    }
    let args = RunnerArgs {
        gpu: &a.gpu,
        threads: a.threads,
        batch: a.batch,
        plan: Some(&a.plan),
        attention_norm: a.attention_norm.as_deref(),
        dense: None,
        check_dense: true,
    };
    let mut runner = runner(&args, model.clone(), &ember_model::dir_name(&model_dir))?;
    let depth = match model.tier().is_active() {
        true => model.prefetch_depth(),
        false => 0,
    };
    let scored = match format {
        DataFormat::Jsonl => jsonl::score(&a, &spec, &mut *runner, &data)?,
        DataFormat::Npz | DataFormat::Safetensors => {
            score_tensors(&a, &spec, &mut *runner, &data, format == DataFormat::Npz)?
        }
        _ => score_file(&a, &spec, &mut *runner, &data, depth)?,
    };
    print(&a, &spec, &*runner, &model_dir, &data, &scored, depth);
    Ok(())
}

/// Criteo, NumPy and safetensors files hold samples of the bag form; Criteo's need its shape.
fn check_bag_form(spec: &ModelSpec, dir: &Path, data: &Path, format: DataFormat) -> Result<()> {
    let Some(inputs) = &spec.bags else {
        let item = spec.signature.item;
        bail!(
            "model {} takes {item}s as JSON lines, one {item} a line ({} is read as {}): give \
             them with --data FILE.jsonl",
            dir.display(),
            data.display(),
            format!("{format:?}").to_lowercase()
        );
    };
    if format == DataFormat::Tsv && !inputs.is_criteo() {
        bail!(
            "model {} has {} dense and {} sparse features; Criteo data has {DENSE} and \
             {SPARSE}: give its samples as JSON lines (--format jsonl)",
            dir.display(),
            inputs.dense_in,
            inputs.features.len()
        );
    }
    Ok(())
}

/// Runs one prepared batch, appending its outputs to `scored` (and `out`).
fn run_batch(
    runner: &mut dyn Runner,
    batch: &Batched,
    outputs: &mut Outputs,
    scored: &mut Scored,
    out: &mut Option<BufWriter<std::fs::File>>,
    sig: &ember_model::serving::Signature,
) -> Result<()> {
    let t = runner.run(batch, outputs)?;
    scored.add(outputs, &t, sig.one_value_per_item());
    if let Some(w) = out {
        jsonl::write_outputs(w, outputs, sig)?;
    }
    Ok(())
}

/// Streams a Criteo-format `data` through the runner, batches checked and prepared `depth`
/// ahead on the parsing thread; writes scores to `--out` as they come.
fn score_file(
    a: &PredictArgs,
    spec: &ModelSpec,
    runner: &mut dyn Runner,
    data: &Path,
    depth: usize,
) -> Result<Scored> {
    let (input, size) = open_data(data)?;
    let mut reader = CriteoReader::new(input, data.display().to_string());
    let mut out = open_out(a)?;
    let bar = progress(size);
    let model = spec.servable().clone();
    let inputs = spec
        .bags
        .clone()
        .context("a Criteo file needs a model of the bag form")?;
    let mut scored = Scored::default();
    let mut outputs = Outputs::default();
    let start = Instant::now();
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
    // Checked and prepared (tier rows read) on the parsing thread, `depth` batches ahead: one
    // id per bag.
    let prepare = |(mut batch, sparse, pos): (CriteoBatch, ember_embed::KeyedJagged, u64)| {
        let n = batch.len();
        let dense = std::mem::take(&mut batch.dense);
        let prepared = spec
            .check(n, dense, vec![1u32; n * SPARSE], sparse.ids().clone())
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(model.prepare(&[&*r])?));
        (batch.labels, prepared, pos)
    };
    let consume = |(labels, prepared, pos): (Vec<f32>, Result<Batched>, u64)| {
        let prepared = prepared?;
        run_batch(
            runner,
            &prepared,
            &mut outputs,
            &mut scored,
            &mut out,
            &spec.signature,
        )?;
        scored.labels.extend_from_slice(&labels);
        bar.set_position(pos);
        anyhow::Ok(())
    };
    run_ahead(depth, batches, prepare, consume, |d| {
        model.tier().record_stall(d)
    })?;
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
    spec: &ModelSpec,
    runner: &mut dyn Runner,
    data: &Path,
    npz: bool,
) -> Result<Scored> {
    if data == Path::new("-") {
        bail!("--data -: NumPy and safetensors files are read from a path, not stdin");
    }
    let start = Instant::now();
    let file = tensors::TensorFile::open(data, npz)?;
    let n = file
        .check(spec)
        .with_context(|| format!("{} does not fit the model", data.display()))?;
    let mut out = open_out(a)?;
    let mut outputs = Outputs::default();
    let mut scored = Scored {
        labels: file.labels()?.unwrap_or_default(),
        ..Scored::default()
    };
    let mut cursors = vec![0usize; spec.features().len()];
    for s0 in (0..n).step_by(a.batch) {
        let range = s0..(s0 + a.batch).min(n);
        let samples = file.batch(spec, &mut cursors, range.clone()).map_err(|e| {
            anyhow::anyhow!(
                "{}, samples {}..{} (sample numbers below count from {s0}): {e}",
                data.display(),
                range.start,
                range.end
            )
        })?;
        let batch = spec.servable().prepare(&[&samples as &dyn Items])?;
        run_batch(
            runner,
            &batch,
            &mut outputs,
            &mut scored,
            &mut out,
            &spec.signature,
        )?;
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
