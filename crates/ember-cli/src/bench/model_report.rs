//! `bench model`'s report, for a model of any family: what the timed batches measured (items/s,
//! latency, the declared stages' shares, each counted stage's rate against the dense ceiling,
//! the timed layers, the accuracy kept), as text, JSON and an HTML page. Stage names, the
//! item's name and the FLOPs come from the model's signature and [`Servable::flops`]; nothing
//! here names a family.

use std::time::Duration;

use ember_bench::dense_peak::{PeakKind, measure_threads};
use ember_bench::stats::{median, quantile};
use ember_model::family::AnyPreset;
use ember_model::serving::{Outputs, Request, Servable, Times, Workload};
use ember_model::{DenseDType, DenseIsa, LayerTime};
use serde_json::{Value, json};

use super::dense_layers::{self, LayerReport};
use super::model_args::ModelArgs;

/// What was timed, for the report's first lines.
pub(super) struct Setup<'a> {
    pub name: &'a str,
    pub preset: Option<&'a AnyPreset>,
    pub model: &'a dyn Servable,
    /// What ran the batches.
    pub engine: String,
    pub args: &'a ModelArgs,
    pub workload: &'a Workload,
    pub sizes: Vec<Option<usize>>,
}

/// What the timed batches measured.
#[derive(Debug, Default)]
pub(super) struct Measured {
    /// Milliseconds of each timed batch.
    pub lat_ms: Vec<f64>,
    /// Items and output values (one per sample, one per candidate) in the timed batches.
    pub items: usize,
    pub values: usize,
    /// Wall seconds of the timed batches.
    pub wall: f64,
    /// The forward passes' times, summed (`stages` in the signature's order).
    pub times: Times,
    /// FLOPs of each counted stage, summed.
    pub flops: Vec<(&'static str, f64)>,
    /// On a GPU with batches in flight: the host's part.
    pub host: Option<HostTimes>,
    /// Reduced-precision layers: each one's time and share of the ceiling.
    pub layers: Option<LayerReport>,
    /// `--accuracy`: the timed precision against f32.
    pub accuracy: Option<Accuracy>,
}

/// Where the host thread spent a GPU loop's time, summed over the timed batches.
#[derive(Debug, Default)]
pub(super) struct HostTimes {
    /// `submit`: dense values and ids checked as they are staged in page-locked memory (one
    /// pass), the copy and forward pass enqueued.
    pub submit: Duration,
    /// `collect`: waiting for the oldest batch's outputs.
    pub wait: Duration,
}

impl Measured {
    /// Adds one timed batch: its times, items, values and FLOPs.
    pub fn add(&mut self, t: &Times, parts: &[Request], out: &Outputs, model: &dyn Servable) {
        self.times.add(t);
        self.items += parts.iter().map(|p| p.len()).sum::<usize>();
        self.values += out.scores().len();
        for p in parts {
            self.add_flops(&model.flops(&**p));
        }
    }

    pub fn add_flops(&mut self, f: &[(&'static str, f64)]) {
        for &(stage, n) in f {
            match self.flops.iter_mut().find(|(s, _)| *s == stage) {
                Some((_, x)) => *x += n,
                None => self.flops.push((stage, n)),
            }
        }
    }

    /// Each stage's share of the forward passes' wall time.
    fn shares(&self) -> Vec<(&'static str, f64)> {
        let wall = self.times.wall.as_secs_f64().max(1e-12);
        self.times
            .stages
            .iter()
            .map(|&(n, d)| (n, d.as_secs_f64() / wall))
            .collect()
    }

    /// Each counted stage's rate, GFLOP/s.
    fn rates(&self) -> Vec<(&'static str, f64)> {
        self.flops
            .iter()
            .map(|&(stage, f)| {
                let d = self
                    .times
                    .stages
                    .iter()
                    .find(|(s, _)| *s == stage)
                    .map_or(0.0, |(_, d)| d.as_secs_f64());
                (stage, f / d.max(1e-12) / 1e9)
            })
            .collect()
    }
}

/// The timed layers against the ceiling of `dtype` (none for f32 or an engine that does not
/// time them).
pub(super) fn layer_report(
    times: Vec<LayerTime>,
    items: usize,
    threads: usize,
    dtype: DenseDType,
) -> Option<LayerReport> {
    if times.is_empty() || dtype == DenseDType::F32 {
        return None;
    }
    let isa = DenseIsa::selected(dtype).ok();
    Some(dense_layers::report(times, items, threads, dtype, isa))
}

/// The timed precision's AUC and NE against f32's, labels drawn from f32's probabilities.
#[derive(Debug)]
pub(super) struct Accuracy {
    pub items: usize,
    pub values: usize,
    /// (f32, timed).
    pub auc: (f64, f64),
    pub ne: (f64, f64),
    pub max_abs: f32,
    pub mean_abs: f64,
}

impl Accuracy {
    /// `items` items' values by f32 (`p32`) and the timed precision (`low`); value `i`'s label
    /// drawn from `p32[i]` by a fixed hash of `i` and `seed`.
    pub fn of(items: usize, p32: &[f32], low: &[f32], seed: u64) -> Accuracy {
        let labels: Vec<f32> = p32
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let h = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
                ((h as f64 / (1u64 << 53) as f64) < p as f64) as u8 as f32
            })
            .collect();
        let base = labels.iter().map(|&l| l as f64).sum::<f64>() / labels.len().max(1) as f64;
        let h = -(base * base.ln() + (1.0 - base) * (1.0 - base).ln());
        let ne = |s: &[f32]| ember_model::eval::log_loss(&labels, s) / h;
        let auc = |s: &[f32]| ember_model::eval::auc(&labels, s).unwrap_or(f64::NAN);
        let diffs = p32.iter().zip(low).map(|(a, b)| (a - b).abs());
        Accuracy {
            items,
            values: labels.len(),
            auc: (auc(p32), auc(low)),
            ne: (ne(p32), ne(low)),
            max_abs: diffs.clone().fold(0f32, f32::max),
            mean_abs: diffs.map(f64::from).sum::<f64>() / labels.len().max(1) as f64,
        }
    }

    /// The share of f32's AUC kept.
    pub(super) fn auc_kept(&self) -> f64 {
        self.auc.1 / self.auc.0
    }

    /// The share of f32's NE kept (lower NE is better).
    pub(super) fn ne_kept(&self) -> f64 {
        self.ne.0 / self.ne.1
    }

    pub(super) fn verdict(&self) -> &'static str {
        let worst = self.auc_kept().min(self.ne_kept());
        if worst >= 0.999 {
            "meets MLPerf's 99.9% target"
        } else if worst >= 0.99 {
            "meets the 99% target only"
        } else {
            "MISSES MLPerf's targets"
        }
    }
}

/// The dense ceiling the counted stages are held to: its kind and, on the CPU, its rate on
/// the timed threads (measured now, 300 ms).
fn ceiling(a: &ModelArgs, m: &Measured) -> (PeakKind, Option<f64>) {
    let isa = DenseIsa::selected(a.dense_dtype).ok();
    let kind = dense_layers::peak_kind(a.dense_dtype, isa);
    if m.flops.is_empty() || a.gpu.is_cuda() {
        return (kind, None);
    }
    let peak = measure_threads(kind, a.threads, Duration::from_millis(300))
        .ok()
        .map(|p| p.ops_per_sec());
    (kind, peak)
}

/// The batches' sizes, for people.
fn batch_text(s: &Setup) -> String {
    let item = s.model.signature().item;
    match s.sizes.as_slice() {
        [None] => format!("{item}s a batch: the model's default"),
        [Some(n)] => format!("{n} {item}s a batch"),
        v if v
            .iter()
            .flatten()
            .copied()
            .eq(ember_model::presets::MLPERF_QUERY_SIZES.iter().copied()) =>
        {
            format!("MLPerf query sizes 100-700 {item}s a batch")
        }
        v => format!(
            "{item}s a batch: {}",
            v.iter()
                .map(|n| n.map_or("default".into(), |n| n.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// The shape of the synthetic items, for people.
fn workload_text(w: &Workload) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &w.pooling {
        parts.push(match p.iter().all(|&x| x == p[0]) {
            true => format!("pooling {}", p[0]),
            false => format!("pooling {} ids a sample", p.iter().sum::<usize>()),
        });
    }
    if let Some(h) = w.history {
        parts.push(format!("history {h}"));
    }
    if let Some(c) = w.candidates {
        parts.push(format!("candidates {c}"));
    }
    match parts.is_empty() {
        true => "the family's default shape".into(),
        false => parts.join(", "),
    }
}

/// Prints the report as text, and as JSON with `--json`.
pub(super) fn print(s: &Setup, m: &Measured) {
    let a = s.args;
    let sig = s.model.signature();
    let item = sig.item;
    let mut sorted = m.lat_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let q = |x: f64| quantile(&sorted, x);
    let mean = m.lat_ms.iter().sum::<f64>() / m.lat_ms.len().max(1) as f64;
    let per_s = m.items as f64 / m.wall.max(1e-12);
    let (kind, peak) = ceiling(a, m);
    println!(
        "ember bench model: {} ({}, {}; {} tables; {}; {} iters)",
        s.name,
        batch_text(s),
        workload_text(s.workload),
        a.dtype_name(),
        s.engine,
        a.iters
    );
    println!("  host        {}", super::cpu_name());
    let isa = DenseIsa::selected(a.dense_dtype).ok();
    println!(
        "  dense       {} ({})",
        a.dense_dtype,
        isa.map_or("?", |i| i.describe(a.dense_dtype))
    );
    let flops: f64 = m.flops.iter().map(|f| f.1).sum();
    if flops > 0.0 {
        println!(
            "  work        {:.2} MFLOP a {item} in the counted stages",
            flops / m.items.max(1) as f64 / 1e6
        );
    }
    println!(
        "  {item}s/s{}{per_s:.2}  ({:.0} values/s)",
        " ".repeat(10usize.saturating_sub(item.len() + 2)),
        m.values as f64 / m.wall.max(1e-12)
    );
    println!(
        "  batch ms    p50 {:.3}  p99 {:.3}  median {:.3}  mean {mean:.3}",
        q(0.5),
        q(0.99),
        median(&m.lat_ms)
    );
    println!(
        "  where the time goes (share of the forward pass){}:",
        match m.times.overlapped.is_empty() {
            true => String::new(),
            false => format!(
                "; {} ran beside the other stages, inside their share",
                m.times.overlapped.join(", ")
            ),
        }
    );
    for (name, share) in m.shares() {
        println!(
            "    {name:<12} {:5.1}%  {}",
            share * 100.0,
            "#".repeat((share * 40.0).round() as usize)
        );
    }
    let pct = |g: f64| peak.map_or("?".into(), |p| format!("{:.0}%", 100.0 * g * 1e9 / p));
    for (stage, g) in m.rates() {
        println!(
            "  {stage:<11} {g:.1} GFLOP/s ({} of the {} ceiling, {:.1} GFLOP/s on {} thread(s))",
            pct(g),
            kind.name(),
            peak.unwrap_or(f64::NAN) / 1e9,
            a.threads
        );
    }
    if let Some(h) = &m.host {
        print_gpu(m, h, a.iters);
    }
    if let Some(l) = &m.layers {
        l.print();
    }
    if let Some(acc) = &m.accuracy {
        println!(
            "  accuracy    {} keeps {:.4}% of f32's AUC ({:.5} against {:.5}) and {:.4}% of its \
             NE ({:.5} against {:.5}) on {} {item}s, {} values (labels drawn from f32's \
             probabilities): {}; |score error| max {:.2e}, mean {:.2e}",
            a.dense_dtype,
            100.0 * acc.auc_kept(),
            acc.auc.1,
            acc.auc.0,
            100.0 * acc.ne_kept(),
            acc.ne.1,
            acc.ne.0,
            acc.items,
            acc.values,
            acc.verdict(),
            acc.max_abs,
            acc.mean_abs
        );
    }
    if a.json {
        println!("{}", to_json(s, m, (q(0.5), q(0.99), mean), (kind, peak)));
    }
}

/// On a GPU with batches in flight: each stage's time per batch, and the host's.
fn print_gpu(m: &Measured, h: &HostTimes, iters: usize) {
    let per_batch = |d: Duration| d.as_secs_f64() * 1e3 / iters.max(1) as f64;
    let stages: Vec<String> = m
        .times
        .stages
        .iter()
        .map(|&(n, d)| format!("{n} {:.3}", per_batch(d)))
        .collect();
    println!(
        "  per batch, ms: GPU copy in {:.3}, {}, copy out {:.3}; host check + stage + enqueue \
         {:.3}, wait {:.3}",
        per_batch(m.times.copy_in),
        stages.join(", "),
        per_batch(m.times.copy_out),
        per_batch(h.submit),
        per_batch(h.wait)
    );
}

/// The `--json` object.
fn to_json(s: &Setup, m: &Measured, q: (f64, f64, f64), ceiling: (PeakKind, Option<f64>)) -> Value {
    let a = s.args;
    let item = s.model.signature().item;
    let secs = |d: Duration| d.as_secs_f64();
    let mut stage_s: serde_json::Map<String, Value> = m
        .times
        .stages
        .iter()
        .map(|&(n, d)| (n.to_string(), json!(secs(d))))
        .collect();
    stage_s.insert("wall".into(), json!(secs(m.times.wall)));
    let breakdown: serde_json::Map<String, Value> = m
        .shares()
        .into_iter()
        .map(|(n, x)| (n.to_string(), json!(x)))
        .collect();
    let isa = DenseIsa::selected(a.dense_dtype).ok();
    let mut j = json!({
        "model": s.name,
        "preset": s.preset.map(|p| p.name.clone()),
        "max_rows": s.preset.and_then(|p| p.max_rows),
        "table_bytes": s.preset.map(|p| p.table_bytes()),
        "rows_scale": a.rows_scale,
        "cpu": super::cpu_name(),
        "device": if a.gpu.is_cuda() { "cuda" } else { "cpu" },
        "engine": s.engine,
        "threads": a.threads,
        "iters": a.iters,
        "item": item,
        "batch": match s.sizes.as_slice() { [n] => json!(n), _ => Value::Null },
        "batch_sizes": s.sizes,
        "pooling": s.workload.pooling,
        "history": s.workload.history,
        "candidates": s.workload.candidates,
        "dtype": a.dtype_name(),
        "dense_dtype": a.dense_dtype.name(),
        "dense_isa": isa.map(|i| i.name()),
        "values": m.values,
        "values_per_s": m.values as f64 / m.wall.max(1e-12),
        "p50_ms": q.0,
        "p99_ms": q.1,
        "mean_ms": q.2,
        "stage_s": stage_s,
        "breakdown": breakdown,
        "overlapped": m.times.overlapped,
        "ceiling_kind": ceiling.0.name(),
        "ceiling_gflops": ceiling.1.map(|p| p / 1e9),
        "dense_layers": m.layers.as_ref().map(|l| l.json()),
    });
    j[format!("{item}s")] = json!(m.items);
    j[format!("{item}s_per_s")] = json!(m.items as f64 / m.wall.max(1e-12));
    for (stage, g) in m.rates() {
        j[format!("{stage}_gflops")] = json!(g);
    }
    if let Some(acc) = &m.accuracy {
        j["accuracy"] = json!({
            "items": acc.items,
            "values": acc.values,
            "auc_f32": acc.auc.0, "auc": acc.auc.1, "auc_kept": acc.auc_kept(),
            "ne_f32": acc.ne.0, "ne": acc.ne.1, "ne_kept": acc.ne_kept(),
            "max_abs_error": acc.max_abs,
            "mean_abs_error": acc.mean_abs,
        });
    }
    if let Some(h) = &m.host {
        let per_batch = |d: Duration| d.as_secs_f64() * 1e3 / a.iters.max(1) as f64;
        j["ms_per_batch"] = json!({
            "gpu_copy_in": per_batch(m.times.copy_in),
            "gpu_forward": per_batch(m.times.wall),
            "gpu_copy_out": per_batch(m.times.copy_out),
            "host_submit": per_batch(h.submit),
            "host_wait": per_batch(h.wait),
        });
    }
    j
}

/// `--report`: the stages' shares and the batch latencies.
pub(super) fn page(s: &Setup, m: &Measured) -> crate::report::Page {
    use crate::report::{Page, Plot, log_buckets};
    let a = s.args;
    let item = s.model.signature().item;
    let mut page = Page::new(format!("ember bench model: {}", s.name));
    page.param("batches", batch_text(s))
        .param("items", workload_text(s.workload))
        .param("tables", a.dtype_name())
        .param("engine", &s.engine)
        .param(
            format!("{item}s/s"),
            format!("{:.1}", m.items as f64 / m.wall.max(1e-12)),
        );
    page.figure(
        "Where the time goes",
        match m.times.overlapped.is_empty() {
            true => "Share of the forward pass's time per stage.".to_string(),
            false => format!(
                "Share of the forward pass's time per stage ({} ran beside the others, inside \
                 their share).",
                m.times.overlapped.join(", ")
            ),
        },
        Plot::Bars {
            y_label: "% of the forward pass".into(),
            bars: m
                .shares()
                .into_iter()
                .map(|(n, x)| (n.to_string(), 100.0 * x))
                .collect(),
        },
    );
    page.figure(
        "Batch latency",
        format!(
            "Latency of each of the {} batches (log scale).",
            m.lat_ms.len()
        ),
        Plot::Histogram {
            x_label: "ms per batch".into(),
            buckets: log_buckets(&m.lat_ms),
            log_x: true,
        },
    );
    if let Some(l) = &m.layers {
        l.figure(&mut page);
    }
    page
}
