//! `ember predict` for an HSTU model (`"family": "hstu"`): users in, one JSON line of scores out
//! per user.
//!
//! Input: JSON lines, one user each, `{"uih": {feature: [values]}, "candidates": {feature:
//! [values]}}` keyed by the model's own feature names. Output (`--out`): one line per user, in
//! input order, `{"scores": {task: [one per candidate]}}`. Users are scored in batches of at
//! most `--batch` users and [`TOKEN_BUDGET`] tokens. A bad line stops the run with an error that
//! names its line (as "user N") and the feature.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ember_model::hstu::{HstuScores, HstuTimes, User};
use serde_json::json;

use super::PredictArgs;
use crate::hstu_engine::HstuEngine;

/// The most tokens (the sum of the users' sequence lengths) one batch holds.
pub const TOKEN_BUDGET: usize = 1 << 16;

/// Scores `data` (users, JSON lines) with the HSTU model in `model_dir`.
pub fn run(a: &PredictArgs, model_dir: &Path, data: &Path) -> Result<()> {
    if a.data.is_none() {
        bail!("an hstu model scores users: give them with --data users.jsonl (one user a line)");
    }
    let model = Arc::new(
        a.tier
            .load_hstu(model_dir, a.tier.load_options(a.dtype, a.dense_dtype))?,
    );
    let norm = a.attention_norm.as_deref().map(str::parse).transpose()?;
    let dense = model.config().dense_dtype;
    let mut predictor = HstuEngine::new(&a.gpu, model.clone(), a.threads, dense, norm)?;
    let (input, _) = super::open_data(data)?;
    let mut out = super::open_out(a)?;
    let start = Instant::now();
    let (mut users, mut cands, mut times) = (0usize, 0usize, HstuTimes::default());
    let mut batch: Vec<User> = Vec::new();
    let (mut tokens, mut first) = (0usize, 1usize);
    let slots = model.config().contextual_slots();
    let mut flush = |batch: &mut Vec<User>, first: usize| -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let checked = model.check_users(batch, first)?;
        let (scores, t) = predictor.run(&checked)?;
        times = times.plus(t);
        users += batch.len();
        cands += checked.candidates();
        if let Some(w) = &mut out {
            write_scores(w, &scores)?;
        }
        batch.clear();
        Ok(())
    };
    for (n, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", data.display()))?;
        if line.trim().is_empty() {
            bail!(
                "{}: line {} is empty (one user a line)",
                data.display(),
                n + 1
            );
        }
        let user: User = serde_json::from_str(&line)
            .with_context(|| format!("{}: user {} (line {})", data.display(), n + 1, n + 1))?;
        let len = slots
            + user.uih.values().map(|v| v.len()).max().unwrap_or(0)
            + user.candidates.values().map(|v| v.len()).max().unwrap_or(0);
        if !batch.is_empty() && (batch.len() >= a.batch || tokens + len > TOKEN_BUDGET) {
            flush(&mut batch, first)?;
            tokens = 0;
        }
        if batch.is_empty() {
            first = n + 1;
        }
        tokens += len;
        batch.push(user);
    }
    flush(&mut batch, first)?;
    let wall = start.elapsed().as_secs_f64();
    let norm = a
        .attention_norm
        .as_deref()
        .unwrap_or(model.config().attention_norm.name());
    eprintln!(
        "{users} users, {cands} candidates in {wall:.3} s: {:.1} users/s, {:.0} candidates/s \
         ({}, attention divided by: {norm})",
        users as f64 / wall,
        cands as f64 / wall,
        predictor.describe(),
    );
    eprintln!("{}", breakdown(&times));
    if a.json {
        println!(
            "{}",
            json!({
                "users": users,
                "candidates": cands,
                "wall_s": wall,
                "users_per_s": users as f64 / wall,
                "stage_s": stage_json(&times),
            })
        );
    }
    Ok(())
}

/// One line per user: `{"scores": {task: [...]}}`.
fn write_scores(w: &mut dyn Write, s: &HstuScores) -> Result<()> {
    for u in 0..s.offsets.len() - 1 {
        let mut obj = serde_json::Map::new();
        for (t, name) in s.tasks.iter().enumerate() {
            obj.insert(name.clone(), json!(s.user(t, u)));
        }
        writeln!(w, "{}", json!({ "scores": obj }))?;
    }
    Ok(())
}

/// Where the time went, for people.
pub fn breakdown(t: &HstuTimes) -> String {
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
pub fn stage_json(t: &HstuTimes) -> serde_json::Value {
    json!({
        "lookups": t.lookups.as_secs_f64(),
        "preprocess": t.preprocess.as_secs_f64(),
        "projections": t.projections.as_secs_f64(),
        "attention": t.attention.as_secs_f64(),
        "pointwise": t.pointwise.as_secs_f64(),
        "head": t.head.as_secs_f64(),
        "wall": t.wall.as_secs_f64(),
    })
}
