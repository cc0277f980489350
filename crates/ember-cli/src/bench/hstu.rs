//! `ember bench model` for an HSTU model (`--preset dlrm-v3 | hstu-small`, or `--model DIR`
//! of family hstu): per-user latency, one user per forward pass as MLPerf's Server scenario
//! sends them, and where the time goes.
//!
//! Set up: the model (a preset with random weights, tables scaled by `--rows-scale`, or a model
//! directory) and its users (`--users FILE`, else 8 synthetic streaming users of `--history`
//! items and `--candidates` candidates); the dense ceiling of the precision in use, measured
//! now on as many threads. Measure: `--warmup` untimed users, then `--iters` timed ones, each
//! checked and scored alone, cycling through the users. Report: users/s, p50/p99 per user, the
//! stages' shares, the projections' and attention's GFLOP/s as shares of the ceiling, and with
//! `--accuracy N` the AUC and NE that `--dense-dtype` keeps against f32 on N synthetic users.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ember_bench::dense_peak::{PeakKind, measure_threads};
use ember_bench::stats::quantile;
use ember_model::hstu::presets::{preset, synthetic_users};
use ember_model::hstu::{HstuModel, HstuPredictor, HstuTimes, User};
use ember_model::{DenseDType, DenseIsa, LoadOptions};
use serde_json::json;

use super::model::ModelArgs;
use crate::hstu_engine::HstuEngine;

/// Synthetic users cycled through when no `--users` file is given.
const DISTINCT_USERS: usize = 8;

/// Whether `a` asks for an HSTU model.
pub fn wants(a: &ModelArgs) -> bool {
    ember_model::hstu::presets::PRESETS.contains(&a.preset.as_str())
        || a.model.as_deref().is_some_and(HstuModel::is_hstu_dir)
}

pub fn run(a: &ModelArgs) -> Result<()> {
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if a.users_per_batch == 0 {
        bail!("--users-per-batch must be at least 1");
    }
    let (model, users) = set_up(a)?;
    let norm = a.attention_norm.as_deref().map(str::parse).transpose()?;
    let mut p = HstuEngine::new(&a.gpu, model.clone(), a.threads, a.dense_dtype, norm)?;
    let (kind, peak) = match p.is_gpu() {
        true => (PeakKind::Fma32, None),
        false => ceiling(a.dense_dtype, a.threads),
    };
    let per = a.users_per_batch;
    let group = |k: usize| -> Vec<User> {
        (0..per)
            .map(|j| users[(k * per + j) % users.len()].clone())
            .collect()
    };
    for i in 0..a.warmup {
        score(&model, &mut p, &group(i))?;
    }
    let mut lat = Vec::with_capacity(a.iters);
    let mut times = HstuTimes::default();
    let (mut tokens, mut cands, mut flops) = (0usize, 0usize, (0f64, 0f64));
    let batches: Vec<Vec<User>> = (0..a.iters).map(|i| group(a.warmup + i)).collect();
    let start = Instant::now();
    for g in &batches {
        let t = Instant::now();
        let (n, c, st) = score(&model, &mut p, g)?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        times = times.plus(st);
        tokens += n;
        cands += c;
        for u in g {
            let f = layer_flops(&model, u);
            flops = (flops.0 + f.0, flops.1 + f.1);
        }
    }
    let wall = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let r = Measured {
        engine: p.describe(),
        per,
        lat,
        times,
        wall,
        tokens,
        candidates: cands,
        flops,
        peak,
        kind,
    };
    let acc = match a.accuracy {
        0 => None,
        n => Some(accuracy(a, &model, n, &mut p)?),
    };
    print(a, &model, &r, acc.as_ref());
    Ok(())
}

/// The model and the users to time.
fn set_up(a: &ModelArgs) -> Result<(Arc<HstuModel>, Vec<User>)> {
    let model = match &a.model {
        Some(dir) => HstuModel::load(dir, LoadOptions::default())
            .with_context(|| format!("loading model {}", dir.display()))?,
        None => {
            let cfg = preset(&a.preset, a.rows_scale, a.dtype)
                .with_context(|| format!("unknown hstu preset '{}'", a.preset))?;
            let bytes: usize = cfg
                .tables
                .iter()
                .map(|t| t.rows * t.dtype.row_bytes(t.dim))
                .sum();
            eprintln!(
                "building {} (tables {} rows, {}) with random weights",
                a.preset,
                cfg.tables
                    .iter()
                    .map(|t| t.rows.to_string())
                    .collect::<Vec<_>>()
                    .join(" / "),
                crate::units::human_bytes(bytes)
            );
            HstuModel::random(cfg, a.seed, a.threads.max(2))?
        }
    };
    let users = match &a.users {
        Some(path) => read_users(path)?,
        None => synthetic_users(
            model.config(),
            DISTINCT_USERS,
            a.history,
            a.candidates,
            a.seed,
        ),
    };
    if users.is_empty() {
        bail!("no users to score");
    }
    Ok((Arc::new(model), users))
}

/// A users file: one JSON user a line.
pub fn read_users(path: &std::path::Path) -> Result<Vec<User>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(n, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}: user {} (line {})", path.display(), n + 1, n + 1))
        })
        .collect()
}

/// Users scored in one pass: their tokens, candidates and the pass's times.
fn score(
    model: &HstuModel,
    p: &mut HstuEngine,
    users: &[User],
) -> Result<(usize, usize, HstuTimes)> {
    let batch = model.check_users(users, 0)?;
    let (s, t) = p.run(&batch)?;
    if s.scores.iter().flatten().any(|v| !v.is_finite()) {
        bail!("non-finite scores");
    }
    Ok((batch.tokens(), batch.candidates(), t))
}

/// FLOPs of one user's projections and attention (a multiply-add is two).
fn layer_flops(model: &HstuModel, u: &User) -> (f64, f64) {
    let h = &model.config().hstu;
    let n = u
        .uih
        .get(&h.uih_post_id_feature_name)
        .map_or(0, |v| v.len());
    let c = u
        .candidates
        .get(&h.candidates_querytime_feature_name)
        .map_or(0, |v| v.len());
    let t = (model.config().contextual_slots() + n + c) as f64;
    let proj: usize = model
        .weights()
        .layers
        .iter()
        .map(|l| l.uvqk.weight().len() + l.output.weight().len())
        .sum();
    let (_, attn_macs) = model.macs(n, c);
    (2.0 * t * proj as f64, 2.0 * attn_macs)
}

/// The instruction the dense layers run on and its peak with `threads` threads.
fn ceiling(dtype: DenseDType, threads: usize) -> (PeakKind, Option<f64>) {
    let kind = match (dtype, DenseIsa::selected(dtype)) {
        (DenseDType::F32, _) => PeakKind::fma32(),
        (_, Ok(DenseIsa::Amx)) => PeakKind::AmxBf16,
        (_, Ok(DenseIsa::Avx512)) if std::arch::is_x86_feature_detected!("avx512bf16") => {
            PeakKind::Avx512Bf16
        }
        _ => PeakKind::fma32(),
    };
    let peak = measure_threads(kind, threads, Duration::from_millis(300))
        .ok()
        .map(|p| p.ops_per_sec());
    (kind, peak)
}

struct Measured {
    /// What ran the pass.
    engine: String,
    /// Users a pass.
    per: usize,
    /// Milliseconds a pass.
    lat: Vec<f64>,
    times: HstuTimes,
    wall: f64,
    tokens: usize,
    candidates: usize,
    /// Projections' and attention's FLOPs over the timed users.
    flops: (f64, f64),
    peak: Option<f64>,
    kind: PeakKind,
}

/// The timed engine's AUC and NE (bf16 or f32, CPU or GPU) against the CPU's f32 pass on `n`
/// synthetic users, labels drawn from f32's probabilities of the first task.
struct Accuracy {
    candidates: usize,
    auc: (f64, f64),
    ne: (f64, f64),
    max_abs: f32,
}

fn accuracy(
    a: &ModelArgs,
    model: &Arc<HstuModel>,
    n: usize,
    low: &mut HstuEngine,
) -> Result<Accuracy> {
    let users = synthetic_users(model.config(), n, a.history, a.candidates, a.seed ^ 0xacc);
    // The reference: the CPU's f32 pass (also when the engine timed is a GPU's).
    let mut f32p = HstuPredictor::new(model.clone(), a.threads)?;
    f32p.set_dense_dtype(DenseDType::F32)?;
    if let Some(n) = &a.attention_norm {
        f32p.set_attention_norm(n.parse()?);
    }
    let (mut p32, mut plow) = (Vec::new(), Vec::new());
    for (i, u) in users.iter().enumerate() {
        let b = model.check_users(std::slice::from_ref(u), i)?;
        p32.extend_from_slice(&f32p.run(&b)?.0.scores[0]);
        plow.extend_from_slice(&low.run(&b)?.0.scores[0]);
    }
    // Labels drawn from f32's probabilities, by a fixed hash of the candidate's index.
    let labels: Vec<f32> = p32
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let h = (i as u64 ^ a.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
            ((h as f64 / (1u64 << 53) as f64) < p as f64) as u8 as f32
        })
        .collect();
    let ne = |s: &[f32]| {
        let base = labels.iter().map(|&l| l as f64).sum::<f64>() / labels.len() as f64;
        let h = -(base * base.ln() + (1.0 - base) * (1.0 - base).ln());
        ember_model::eval::log_loss(&labels, s) / h
    };
    let auc = |s: &[f32]| ember_model::eval::auc(&labels, s).unwrap_or(f64::NAN);
    let max_abs = p32
        .iter()
        .zip(&plow)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    Ok(Accuracy {
        candidates: labels.len(),
        auc: (auc(&p32), auc(&plow)),
        ne: (ne(&p32), ne(&plow)),
        max_abs,
    })
}

fn print(a: &ModelArgs, model: &HstuModel, r: &Measured, acc: Option<&Accuracy>) {
    let q = |x: f64| quantile(&r.lat, x);
    let mean = r.lat.iter().sum::<f64>() / r.lat.len() as f64;
    let users = r.lat.len() * r.per;
    let users_per_s = users as f64 / r.wall;
    let sum = |d: Duration| d.as_secs_f64();
    let gflops = |f: f64, d: Duration| f / sum(d).max(1e-12) / 1e9;
    let (gp, ga) = (
        gflops(r.flops.0, r.times.projections),
        gflops(r.flops.1, r.times.attention),
    );
    let share = |g: f64| r.peak.map(|p| g * 1e9 / p);
    let cpu = super::cpu_name();
    eprintln!(
        "{} on {}, host {cpu}, attention divided by: {}",
        a.model
            .as_ref()
            .map_or(a.preset.clone(), |d| d.display().to_string()),
        r.engine,
        a.attention_norm
            .as_deref()
            .unwrap_or(model.config().attention_norm.name()),
    );
    eprintln!(
        "{users} users in passes of {} ({} tokens, {} candidates): {:.2} users/s, per pass p50 {:.2} ms, p99 {:.2} ms, mean {:.2} ms",
        r.per,
        r.tokens,
        r.candidates,
        users_per_s,
        q(0.5),
        q(0.99),
        mean
    );
    eprintln!("{}", breakdown(&r.times));
    let pct = |s: Option<f64>| s.map_or("?".into(), |s| format!("{:.0}%", 100.0 * s));
    eprintln!(
        "projections {gp:.1} GFLOP/s ({} of the {} ceiling, {:.1} GFLOP/s), attention {ga:.1} GFLOP/s ({})",
        pct(share(gp)),
        r.kind.name(),
        r.peak.unwrap_or(f64::NAN) / 1e9,
        pct(share(ga)),
    );
    if let Some(acc) = acc {
        eprintln!(
            "accuracy on {} candidates (labels drawn from the CPU's f32 scores): AUC f32 {:.5}, {} {:.5} ({:.3}%); NE f32 {:.5}, {} {:.5} ({:.3}%); max |score diff| {:.2e}",
            acc.candidates,
            acc.auc.0,
            a.dense_dtype,
            acc.auc.1,
            100.0 * acc.auc.1 / acc.auc.0,
            acc.ne.0,
            a.dense_dtype,
            acc.ne.1,
            100.0 * acc.ne.0 / acc.ne.1,
            acc.max_abs
        );
    }
    if a.json {
        let mut j = json!({
            "model": a.model.as_ref().map_or(a.preset.clone(), |d| d.display().to_string()),
            "cpu": cpu,
            "threads": a.threads,
            "dense_dtype": a.dense_dtype.name(),
            "engine": r.engine,
            "users_per_batch": r.per,
            "users_timed": users,
            "users_per_s": users_per_s,
            "candidates_per_s": r.candidates as f64 / r.wall,
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
            "mean_ms": mean,
            "stage_s": stage_json(&r.times),
            "projections_gflops": gp,
            "attention_gflops": ga,
            "ceiling_gflops": r.peak.map(|p| p / 1e9),
            "ceiling_kind": r.kind.name(),
        });
        if let Some(acc) = acc {
            j["accuracy"] = json!({
                "candidates": acc.candidates,
                "auc_f32": acc.auc.0, "auc": acc.auc.1,
                "ne_f32": acc.ne.0, "ne": acc.ne.1,
                "max_abs_diff": acc.max_abs,
            });
        }
        println!("{j}");
    }
}

/// Where the time went, for people.
fn breakdown(t: &HstuTimes) -> String {
    let wall = t.wall.as_secs_f64().max(1e-12);
    let pct = |d: std::time::Duration| 100.0 * d.as_secs_f64() / wall;
    format!(
        "time: lookups {:.1}%, preprocess {:.1}%, projections {:.1}%, attention {:.1}%, \
         pointwise {:.1}%, head {:.1}%",
        pct(t.lookups),
        pct(t.preprocess),
        pct(t.projections),
        pct(t.attention),
        pct(t.pointwise),
        pct(t.head)
    )
}

/// The stage times in seconds, as JSON.
fn stage_json(t: &HstuTimes) -> serde_json::Value {
    serde_json::json!({
        "lookups": t.lookups.as_secs_f64(),
        "preprocess": t.preprocess.as_secs_f64(),
        "projections": t.projections.as_secs_f64(),
        "attention": t.attention.as_secs_f64(),
        "pointwise": t.pointwise.as_secs_f64(),
        "head": t.head.as_secs_f64(),
        "wall": t.wall.as_secs_f64(),
    })
}
