//! `ember bench history-reuse`: what reusing a user's history states costs in accuracy, before
//! any cache exists (`docs/hstu.md`, "Reusing a user's history").
//!
//! Streaming users ([`UserStream`]) come back with a few new actions and new candidates. Each
//! request is scored twice, one user a pass as MLPerf's Server sends them:
//!
//! - **fresh**: the whole history recomputed ([`HstuPredictor::run`]);
//! - **stale**: the history the user had at its previous request held as of that request (its
//!   positions, time buckets and attention divisor), only the new actions and the candidates
//!   computed now ([`HstuPredictor::run_as_of`]). This is exactly what a cache refreshed at every
//!   request of the user would serve; one that extends an entry over several requests without
//!   recomputing it is staler.
//!
//! Reported: the scores' largest and mean absolute difference, and the AUC and NE the stale
//! scores keep against the fresh ones (labels drawn from the fresh probabilities, as `bench
//! model --accuracy` draws them from f32's), with MLPerf's 99.9% verdict.

use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_embed::DType;
use ember_model::hstu::presets::{UserStream, preset};
use ember_model::hstu::{AsOf, HstuBatch, HstuModel, HstuPredictor, User};
use serde_json::json;
use std::sync::Arc;

use super::model_report::Accuracy;

#[derive(Debug, Args)]
pub struct HistoryReuseArgs {
    /// Model shape with random weights: dlrm-v3 or hstu-small.
    #[arg(long, default_value = "hstu-small")]
    preset: String,
    /// Multiplies every table's rows (dlrm-v3's item table has 1e9).
    #[arg(long, default_value_t = 1e-2)]
    rows_scale: f64,
    /// Users in the stream.
    #[arg(long, default_value_t = 16)]
    users: usize,
    /// Each user's history before the stream starts.
    #[arg(long, default_value_t = 256)]
    history: usize,
    /// Requests scored (each a returning user).
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// New actions per request: 1 to this many.
    #[arg(long, default_value_t = 8)]
    grow: usize,
    /// Candidates per request.
    #[arg(long, default_value_t = 64)]
    candidates: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// The HSTU model of preset `name` with random weights (f16 tables, rows scaled by
/// `rows_scale`) and a predictor of it on `threads` threads: the history benchmarks' model.
pub(super) fn random_model(
    name: &str,
    rows_scale: f64,
    seed: u64,
    threads: usize,
) -> Result<(Arc<HstuModel>, HstuPredictor)> {
    let cfg = preset(name, rows_scale, DType::F16)
        .with_context(|| format!("unknown --preset '{name}' (dlrm-v3, hstu-small)"))?;
    let model = Arc::new(HstuModel::random(cfg, seed, threads)?);
    let p = HstuPredictor::new(model.clone(), threads)?;
    Ok((model, p))
}

pub fn run(a: HistoryReuseArgs) -> Result<()> {
    ensure!(
        a.users > 0 && a.requests > 0,
        "--users and --requests must be at least 1"
    );
    let (model, mut p) = random_model(&a.preset, a.rows_scale, a.seed, a.threads)?;
    let mut stream = UserStream::new(model.config(), a.users, a.seed);
    // No cap on the history: a capped one drops its oldest items, and the cached prefix with them.
    let check = |user: &User| -> Result<HstuBatch> {
        Ok(model.check_users(std::slice::from_ref(user), 0)?)
    };
    let mut last: Vec<AsOf> = (0..a.users)
        .map(|u| {
            Ok(AsOf::of(
                &check(&stream.user(u, a.history, a.candidates))?,
                0,
            ))
        })
        .collect::<Result<_>>()?;
    let (mut fresh, mut stale) = (Vec::new(), Vec::new());
    let (mut appended, mut seconds, mut tokens) = (0usize, 0f64, 0usize);
    for _ in 0..a.requests {
        let (u, user) = stream.next_request(a.grow, a.candidates, usize::MAX);
        let batch = check(&user)?;
        let now = AsOf::of(&batch, 0);
        let f = p.run(&batch)?.0;
        let s = p.run_as_of(&batch, &[Some(last[u])])?.0;
        fresh.extend_from_slice(&f.scores[0]);
        stale.extend_from_slice(&s.scores[0]);
        appended += now.history - last[u].history;
        seconds += (now.query - last[u].query) as f64;
        tokens += now.history;
        last[u] = now;
    }
    let acc = Accuracy::of(fresh.len(), &fresh, &stale, a.seed);
    let n = a.requests as f64;
    let cpu = super::cpu_name();
    eprintln!(
        "{} ({}), {} requests of {} users, {:.0} history items a request on average, {:.1} new \
         actions and {:.0} s since the user's previous request, {} candidates",
        a.preset,
        cpu,
        a.requests,
        a.users,
        tokens as f64 / n,
        appended as f64 / n,
        seconds / n,
        a.candidates
    );
    eprintln!(
        "stale against fresh: scores differ by at most {:.2e} (mean {:.2e}); AUC {:.5} vs {:.5} \
         ({:.4}% kept), NE {:.5} vs {:.5} ({:.4}% kept): {}",
        acc.max_abs,
        acc.mean_abs,
        acc.auc.1,
        acc.auc.0,
        100.0 * acc.auc_kept(),
        acc.ne.1,
        acc.ne.0,
        100.0 * acc.ne_kept(),
        acc.verdict()
    );
    if a.json {
        println!(
            "{}",
            json!({
                "bench": "history-reuse", "preset": a.preset, "rows_scale": a.rows_scale,
                "cpu": cpu, "users": a.users, "requests": a.requests,
                "candidates": a.candidates, "grow": a.grow,
                "mean_history": tokens as f64 / n, "mean_appended": appended as f64 / n,
                "mean_seconds_since_previous": seconds / n,
                "scores": acc.values, "max_abs": acc.max_abs, "mean_abs": acc.mean_abs,
                "auc": {"fresh": acc.auc.0, "stale": acc.auc.1, "kept": acc.auc_kept()},
                "ne": {"fresh": acc.ne.0, "stale": acc.ne.1, "kept": acc.ne_kept()},
            })
        );
    }
    Ok(())
}
