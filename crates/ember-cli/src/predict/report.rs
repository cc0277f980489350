//! What `ember predict` prints: the figures for people, and with `--json` one JSON object as
//! the last line.

use std::path::Path;

use ember_model::eval::{auc, log_loss};
use ember_model::serving::{Runner, Times};
use ember_serve::ModelSpec;
use serde_json::json;

use super::{PredictArgs, Scored};
use crate::units::human_bytes;

/// Prints the figures, and with `--json` one JSON object as the last line.
pub(super) fn print(
    a: &PredictArgs,
    spec: &ModelSpec,
    runner: &dyn Runner,
    model_dir: &Path,
    data: &Path,
    s: &Scored,
    depth: usize,
) {
    let (n, item) = (s.items, spec.signature.item);
    let model_s = s.times.wall.as_secs_f64();
    let labelled = n > 0 && s.labels.len() == n && s.scores.len() == n;
    let a_uc = labelled.then(|| auc(&s.labels, &s.scores)).flatten();
    let ll = labelled.then(|| log_loss(&s.labels, &s.scores));
    println!(
        "model {}  data {}  ({}, batch {})",
        model_dir.display(),
        data.display(),
        runner.device(),
        a.batch
    );
    println!("rows          {n} ({item}s)");
    if s.values != n {
        println!(
            "values        {} per output ({})",
            s.values,
            spec.signature.outputs.join(", ")
        );
    }
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
        "{item}s/s{:pad$} {:.0} end to end (parse + forward), {:.0} forward only",
        "",
        n as f64 / s.wall,
        n as f64 / model_s.max(1e-12),
        pad = 10usize.saturating_sub(item.len()),
    );
    if !s.times.stages.is_empty() {
        println!("time          {}", breakdown(&s.times));
    }
    if let Some(p) = &a.out {
        println!("scores        {}", p.display());
    }
    let tier = spec.servable().tier();
    if tier.is_active() {
        let label = match tier.has_remote() {
            true => "remote tier",
            false => "SSD tier",
        };
        let c = tier.counters();
        println!(
            "{label:<13} hit rate {:.3}, {} read in {} reads, stall {:.2} s, overlap {:.2} ({}, prefetch depth {depth})",
            c.hit_ratio,
            human_bytes(c.bytes_read as usize),
            c.reads,
            c.stall.as_secs_f64(),
            tier.overlap(),
            tier.engine().unwrap_or("none"),
        );
    }
    if let Some(h) = spec.servable().history_cache() {
        println!(
            "history cache {} of {} users served from their entry ({} refused, {} uncached), {} \
             entries, {} held, {} evictions",
            h.hits,
            h.hits + h.misses + h.refused + h.uncached,
            h.refused,
            h.uncached,
            h.entries,
            human_bytes(h.bytes as usize),
            h.evictions
        );
    }
    if a.json {
        println!("{}", to_json(a, spec, s, a_uc, ll, depth));
    }
}

/// The figures as one JSON object.
fn to_json(
    a: &PredictArgs,
    spec: &ModelSpec,
    s: &Scored,
    a_uc: Option<f64>,
    ll: Option<f64>,
    depth: usize,
) -> serde_json::Value {
    let tier = spec.servable().tier();
    let c = tier.counters();
    let n = s.items;
    let model_s = s.times.wall.as_secs_f64();
    let stages: serde_json::Map<String, serde_json::Value> = s
        .times
        .stages
        .iter()
        .map(|(k, d)| (k.to_string(), json!(d.as_secs_f64())))
        .collect();
    let history = spec.servable().history_cache();
    json!({
        "history_cache": history.map(|h| json!({
            "hits": h.hits, "misses": h.misses, "refused": h.refused, "uncached": h.uncached,
            "entries": h.entries, "bytes": h.bytes, "evictions": h.evictions,
            "inserts": h.inserts, "too_large": h.too_large,
        })),
        "tier": tier.is_active().then(|| json!({
            "hit_rate": c.hit_ratio,
            "ssd_bytes_read": c.bytes_read,
            "ssd_reads": c.reads,
            "stall_s": c.stall.as_secs_f64(),
            "overlap": tier.overlap(),
            "prefetch_depth": depth,
        })),
        "rows": n,
        "item": spec.signature.item,
        "values": s.values,
        "auc": a_uc,
        "log_loss": ll,
        "samples_per_s": n as f64 / s.wall,
        "forward_samples_per_s": n as f64 / model_s.max(1e-12),
        "wall_s": s.wall,
        "stage_s": stages,
        "threads": a.threads,
        "device": if a.gpu.is_cuda() { "cuda" } else { "cpu" },
        "batch": a.batch,
    })
}

/// Each stage's share of the forward passes' time, for people.
fn breakdown(t: &Times) -> String {
    let wall = t.wall.as_secs_f64().max(1e-12);
    t.stages
        .iter()
        .map(|(k, d)| format!("{k} {:.1}%", 100.0 * d.as_secs_f64() / wall))
        .collect::<Vec<_>>()
        .join(", ")
}
