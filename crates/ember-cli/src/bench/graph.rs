//! `ember bench graph`: a graph model's dense part (`dense.onnx`) on Ember's graph runtime, per
//! batch size and thread count, on random inputs of the widths its config declares. The peer,
//! ONNX Runtime on the same file, is `bench/compare_onnx.py`, which runs this with `--json` and
//! alternates.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use ember_model::DenseDType;
use ember_model::graph::{Graph, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;

#[derive(Debug, Args)]
pub struct GraphArgs {
    /// A graph model directory (config.json with `"family": "graph"`, dense.onnx).
    #[arg(long)]
    model: PathBuf,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "256,2048")]
    batch: Vec<usize>,
    /// Thread counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Timed rounds per cell (the median is reported); each round runs for about 0.2 s.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The linear layers' precision: f32, bf16 or int8 (int8 is not calibrated here).
    #[arg(long, default_value = "f32")]
    dense_dtype: String,
    /// Also score this many random samples in f32 and in --dense-dtype and report what the
    /// lower precision keeps of f32's AUC per output (labels drawn from f32's probabilities).
    #[arg(long, default_value_t = 0)]
    accuracy: usize,
    /// Time the whole model from ids (the tables pooled by Ember's embedding stage, then the
    /// graph), not the dense part alone: ids drawn uniformly from each table.
    #[arg(long)]
    whole: bool,
    /// With --whole: ids per (feature, sample).
    #[arg(long, default_value_t = 1)]
    ids_per_bag: usize,
    /// Print one JSON object on the last line.
    #[arg(long)]
    json: bool,
    /// Also print each step of the dense part (its op, or a linear layer on Ember's kernels)
    /// with its mean time per run and share, slowest first (with --whole: the graph's steps
    /// inside the whole model's runs).
    #[arg(long)]
    profile: bool,
}

/// The timed rounds' steps ([`Graph::profile_take`]), the 12 slowest.
fn print_profile(g: &Graph, batch: usize, threads: usize) {
    let steps = g.profile_take();
    println!("  steps, batch {batch}, {threads} thread(s) (mean a run, share of the steps' time):");
    for (what, t, share) in steps.iter().take(12) {
        println!(
            "    {:8.3} ms {:5.1}%  {what}",
            t.as_secs_f64() * 1e3,
            share * 100.0
        );
    }
}

/// The graph's inputs as config.json declares them.
struct Widths {
    dense_in: usize,
    /// Each sequence feature's max_len (its length is a column of `dense` after `dense_in`).
    seqs: Vec<usize>,
    /// The pooled (and padded sequence) rows side by side.
    sparse: usize,
}

impl Widths {
    fn dense(&self) -> usize {
        self.dense_in + self.seqs.len()
    }

    /// `b` samples of `dense`: values uniform in [-1, 1), then each sequence's length uniform
    /// in 0..=max_len.
    fn random_dense(&self, rng: &mut StdRng, b: usize) -> Vec<f32> {
        let mut v = Vec::with_capacity(b * self.dense());
        for _ in 0..b {
            v.extend((0..self.dense_in).map(|_| rng.random_range(-1.0f32..1.0)));
            v.extend(self.seqs.iter().map(|&l| rng.random_range(0..=l) as f32));
        }
        v
    }
}

/// The graph's input widths and its file, from config.json.
fn widths(model: &std::path::Path) -> Result<(Widths, String)> {
    let c = ember_model::ModelConfig::read(&model.join("config.json"))?;
    let Some((file, _)) = c.graph() else {
        anyhow::bail!(
            "{}: not a graph model (its interaction is not \"graph\"); `ember bench model` \
             runs any model",
            model.display()
        );
    };
    let w = Widths {
        dense_in: c.dense_in,
        seqs: c.features().iter().filter_map(|f| f.max_len).collect(),
        sparse: c.pooled_width(),
    };
    Ok((w, file.to_string()))
}

pub fn run(a: GraphArgs) -> Result<()> {
    let (w, file) = widths(&a.model)?;
    let mut g = Graph::load(&a.model.join(&file))?;
    let dtype: DenseDType = a
        .dense_dtype
        .parse()
        .map_err(|e| anyhow::anyhow!("--dense-dtype: {e}"))?;
    g.set_dense_dtype(dtype)?;
    let (lin, ops) = g.steps();
    let cpu = super::cpu_name();
    if !a.json {
        println!(
            "graph {}: {lin} linear layers on Ember's kernels ({}), {ops} other ops; {cpu}",
            a.model.display(),
            dtype.name()
        );
    }
    let raw = match a.whole {
        true => whole(&a, dtype)?,
        false => dense_only(&a, &g, &w)?,
    };
    let mut cells = Vec::new();
    for (batch, threads, ms) in raw {
        let mut sorted = ms.clone();
        sorted.sort_by(f64::total_cmp);
        let med = sorted[sorted.len() / 2];
        if !a.json {
            println!(
                "  batch {batch:>5}, {threads} thread(s): {med:8.3} ms a batch, {:>10.0} samples/s",
                batch as f64 / med * 1e3
            );
        }
        cells.push(json!({"batch": batch, "threads": threads, "ms": med, "rounds_ms": ms}));
    }
    let acc = match a.accuracy {
        0 => None,
        n => Some(accuracy(&a, &file, &w, dtype, n)?),
    };
    if a.json {
        println!(
            "{}",
            json!({"cpu": cpu, "dtype": dtype.name(), "linear_layers": lin, "ops": ops, "cells": cells,
                   "accuracy": acc})
        );
    }
    Ok(())
}

/// The dense part alone on random inputs: (batch, threads, rounds' ms) per cell.
fn dense_only(a: &GraphArgs, g: &Graph, w: &Widths) -> Result<Vec<(usize, usize, Vec<f64>)>> {
    let mut rng = StdRng::seed_from_u64(1);
    let mut cells = Vec::new();
    for &batch in &a.batch {
        let dense = w.random_dense(&mut rng, batch);
        let sparse: Vec<f32> = (0..batch * w.sparse)
            .map(|_| rng.random_range(-0.5..0.5))
            .collect();
        let inputs = [
            (
                "dense",
                Tensor::f32(vec![batch, w.dense()], dense).map_err(anyhow::Error::msg)?,
            ),
            (
                "sparse",
                Tensor::f32(vec![batch, w.sparse], sparse).map_err(anyhow::Error::msg)?,
            ),
        ];
        let given: Vec<(&str, &Tensor)> = inputs
            .iter()
            .filter(|(n, _)| g.inputs().contains(n))
            .map(|(n, t)| (*n, t))
            .collect();
        for &threads in &a.threads {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()?;
            let ms = pool.install(|| -> Result<Vec<f64>> {
                g.run(&given, threads)?; // warm-up
                let t = Instant::now();
                g.run(&given, threads)?;
                let iters = ((0.2 / t.elapsed().as_secs_f64().max(1e-6)) as usize).clamp(1, 10_000);
                if a.profile {
                    Graph::profile_start();
                }
                (0..a.rounds)
                    .map(|_| {
                        let t = Instant::now();
                        for _ in 0..iters {
                            g.run(&given, threads)?;
                        }
                        Ok(t.elapsed().as_secs_f64() * 1e3 / iters as f64)
                    })
                    .collect::<Result<Vec<f64>>>()
                    .inspect(|_| {
                        if a.profile {
                            print_profile(g, batch, threads);
                        }
                    })
            })?;
            cells.push((batch, threads, ms));
        }
    }
    Ok(cells)
}

/// `--whole`: the model from ids, per thread count and batch size: (batch, threads, rounds' ms).
fn whole(a: &GraphArgs, dtype: DenseDType) -> Result<Vec<(usize, usize, Vec<f64>)>> {
    use ember_model::serving::Outputs;
    use ember_model::{Engine, LoadOptions, Model, Predictor};
    let opts = LoadOptions {
        dense_dtype: Some(dtype),
        ..LoadOptions::default()
    };
    let m = std::sync::Arc::new(Model::load(&a.model, opts)?);
    let mut cells = Vec::new();
    let mut out = Outputs::default();
    for &threads in &a.threads {
        let mut p = Predictor::new(m.clone(), threads)?;
        let inputs = m.inputs();
        let rows: Vec<u64> = inputs.rows.iter().map(|&r| r as u64).collect();
        let keys = inputs.features.clone();
        // Ids per sample: --ids-per-bag for a pooled feature, max_len for a sequence (a full
        // history, as a long-time user's).
        let per: Vec<usize> = m
            .config()
            .features()
            .iter()
            .map(|f| f.max_len.unwrap_or(a.ids_per_bag))
            .collect();
        let mut rng = StdRng::seed_from_u64(3);
        for &batch in &a.batch {
            let dense: Vec<f32> = (0..batch * m.config().dense_in)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let ids: Vec<i64> = rows
                .iter()
                .zip(&per)
                .flat_map(|(&r, &p)| (0..batch * p).map(move |_| r))
                .map(|r| rng.random_range(0..r) as i64)
                .collect();
            let lengths: Vec<usize> = per
                .iter()
                .flat_map(|&p| std::iter::repeat_n(p, batch))
                .collect();
            let kj = ember_embed::KeyedJagged::from_lengths(
                keys.clone(),
                batch,
                &lengths,
                ids.into(),
                None,
            )?;
            let mut score = || p.score_outputs(&dense, &kj, &mut out).map(|_| ());
            score()?; // warm-up
            let t = Instant::now();
            score()?;
            let iters = ((0.2 / t.elapsed().as_secs_f64().max(1e-6)) as usize).clamp(1, 10_000);
            if a.profile {
                Graph::profile_start();
            }
            let ms = (0..a.rounds)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        score()?;
                    }
                    Ok(t.elapsed().as_secs_f64() * 1e3 / iters as f64)
                })
                .collect::<Result<Vec<f64>>>()?;
            if let Some(g) = m.graph().filter(|_| a.profile) {
                print_profile(g, batch, threads);
            }
            cells.push((batch, threads, ms));
        }
    }
    Ok(cells)
}

/// Per output: the AUC `dtype` keeps of f32's and the largest |difference|, over `n` random
/// samples (batches of 256, 2 threads), labels drawn from f32's scores clamped to [0, 1].
fn accuracy(
    a: &GraphArgs,
    file: &str,
    w: &Widths,
    dtype: DenseDType,
    n: usize,
) -> Result<serde_json::Value> {
    use ember_model::eval::auc;
    let reference = Graph::load(&a.model.join(file))?;
    let mut low = Graph::load(&a.model.join(file))?;
    low.set_dense_dtype(dtype)?;
    let outs = reference.outputs().len();
    let (mut f, mut l) = (vec![Vec::new(); outs], vec![Vec::new(); outs]);
    let mut rng = StdRng::seed_from_u64(7);
    for start in (0..n).step_by(256) {
        let b = 256.min(n - start);
        let dense = w.random_dense(&mut rng, b);
        let sparse: Vec<f32> = (0..b * w.sparse)
            .map(|_| rng.random_range(-0.5..0.5))
            .collect();
        let d = Tensor::f32(vec![b, w.dense()], dense).map_err(anyhow::Error::msg)?;
        let s = Tensor::f32(vec![b, w.sparse], sparse).map_err(anyhow::Error::msg)?;
        let given: Vec<(&str, &Tensor)> = [("dense", &d), ("sparse", &s)]
            .into_iter()
            .filter(|(name, _)| reference.inputs().contains(name))
            .collect();
        let (x, y) = (reference.run(&given, 2)?, low.run(&given, 2)?);
        for (k, (x, y)) in x.iter().zip(&y).enumerate() {
            f[k].extend_from_slice(x.as_f32().context("a float output")?);
            l[k].extend_from_slice(y.as_f32().context("a float output")?);
        }
    }
    let mut per = Vec::new();
    for (k, name) in reference.outputs().iter().enumerate() {
        let labels: Vec<f32> = f[k]
            .iter()
            .map(|&p| f32::from(rng.random::<f32>() < p.clamp(0.0, 1.0)))
            .collect();
        let (af, al) = (auc(&labels, &f[k]), auc(&labels, &l[k]));
        let max_abs = f[k]
            .iter()
            .zip(&l[k])
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        let kept = af.zip(al).map(|(af, al)| al / af);
        if !a.json {
            match kept {
                Some(r) => println!(
                    "  accuracy, {name}: {} keeps {:.4}% of f32's AUC over {n} samples \
                     (largest |difference| {max_abs:.2e})",
                    dtype.name(),
                    r * 100.0
                ),
                None => println!("  accuracy, {name}: labels of one class only; no AUC"),
            }
        }
        per.push(json!({"output": name, "auc_kept": kept, "max_abs": max_abs}));
    }
    Ok(json!(per))
}
