//! `bench model`'s dense-layer table: each bf16 / int8 layer's time and GFLOP/s (or GOP/s), and
//! its share of the dense ceiling, the CPU's dot-product peak measured in the same run by a
//! plain loop of back-to-back tile or vector dot products ([`ember_bench::dense_peak`]).

use std::time::Duration;

use ember_bench::dense_peak::{Peak, PeakKind, measure_threads};
use ember_model::{DenseDType, DenseIsa, LayerTime};
use serde_json::{Value, json};

/// The peak a layer of `dtype` on `isa` is held to.
pub fn peak_kind(dtype: DenseDType, isa: Option<DenseIsa>) -> PeakKind {
    match (dtype, isa) {
        (DenseDType::Bf16, Some(DenseIsa::Amx)) => PeakKind::AmxBf16,
        (DenseDType::Int8, Some(DenseIsa::Amx)) => PeakKind::AmxInt8,
        (DenseDType::Bf16, Some(DenseIsa::Avx512)) if ember_model::dense::cpu::bf16_dot_fast() => {
            PeakKind::Avx512Bf16
        }
        (DenseDType::Int8, Some(DenseIsa::Avx512)) => PeakKind::Avx512Vnni,
        _ => PeakKind::fma32(),
    }
}

/// The layers with their rates, and the ceiling they are measured against.
#[derive(Debug)]
pub struct LayerReport {
    pub peak: Option<Peak>,
    pub kind: PeakKind,
    /// `(layer, ops per second)` over the timed batches.
    pub layers: Vec<(LayerTime, f64)>,
}

/// Measures the ceiling on `threads` threads (200 ms) and rates each layer of `times`, which
/// ran on `samples` samples in all.
pub fn report(
    times: Vec<LayerTime>,
    samples: usize,
    threads: usize,
    dtype: DenseDType,
    isa: Option<DenseIsa>,
) -> LayerReport {
    let kind = peak_kind(dtype, isa);
    let peak = measure_threads(kind, threads, Duration::from_millis(200)).ok();
    let layers = times
        .into_iter()
        .map(|t| {
            let rate = t.ops_per_sample() * samples as f64 / t.time.as_secs_f64().max(1e-12);
            (t, rate)
        })
        .collect();
    LayerReport { peak, kind, layers }
}

impl LayerReport {
    /// The text table.
    pub fn print(&self) {
        let unit = self.kind.unit();
        match &self.peak {
            Some(p) => println!(
                "  dense layers (ceiling: {} {}, {:.0} {unit} on {} thread(s), measured now)",
                self.kind.name(),
                self.kind.instruction(),
                p.gops(),
                p.threads
            ),
            None => println!(
                "  dense layers (no ceiling: {} unavailable)",
                self.kind.name()
            ),
        }
        for (t, rate) in &self.layers {
            let share = self.peak.as_ref().map_or(String::new(), |p| {
                format!("{:5.1}% of ceiling", 100.0 * p.share(*rate))
            });
            println!(
                "    {:<10} {:>5} x {:<5} {:>9.3} ms {:>8.0} {unit}  {share}",
                t.name,
                t.in_dim,
                t.out_dim,
                t.time.as_secs_f64() * 1e3,
                rate / 1e9,
            );
        }
    }

    /// The report page's figure: each layer's share of the ceiling.
    pub fn figure(&self, page: &mut crate::report::Page) {
        let Some(p) = &self.peak else {
            return;
        };
        page.figure(
            "Dense layers against the ceiling",
            format!(
                "Each {} layer's {} as a share of the {} peak measured in the same run ({:.0} \
                 {} on {} thread(s)).",
                self.layers.first().map_or("", |_| "bf16 / int8"),
                self.kind.unit(),
                self.kind.instruction(),
                p.gops(),
                self.kind.unit(),
                p.threads
            ),
            crate::report::Plot::Bars {
                y_label: "% of the ceiling".into(),
                bars: self
                    .layers
                    .iter()
                    .map(|(t, rate)| (t.name.clone(), 100.0 * p.share(*rate)))
                    .collect(),
            },
        );
    }

    /// The JSON form.
    pub fn json(&self) -> Value {
        json!({
            "ceiling": self.peak.as_ref().map(|p| json!({
                "kind": self.kind.name(),
                "instruction": self.kind.instruction(),
                "threads": p.threads,
                "gops": p.gops(),
            })),
            "layers": self.layers.iter().map(|(t, rate)| json!({
                "name": t.name,
                "in": t.in_dim,
                "out": t.out_dim,
                "ms": t.time.as_secs_f64() * 1e3,
                "gops": rate / 1e9,
                "share_of_ceiling": self.peak.as_ref().map(|p| p.share(*rate)),
            })).collect::<Vec<_>>(),
        })
    }
}
