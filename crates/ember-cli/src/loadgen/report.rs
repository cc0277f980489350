//! `loadgen --report FILE.html`: the measurements as plots.

use super::{Bucket, LoadgenArgs, Phase, Run};
use crate::report::{Page, Plot, Series};

/// The page of one measurement (`runs` of one), or of a `--find-max` search (`best`: the
/// fastest run that met the objective, if any).
pub(super) fn page(a: &LoadgenArgs, runs: &[Run], best: Option<Option<&Run>>) -> Page {
    let mut p = Page::new(format!("ember loadgen: model '{}'", a.model));
    p.param("url", a.url.as_deref().unwrap_or("(default)"))
        .param("protocol", &a.protocol)
        .param("format", &a.format)
        .param("samples per request", a.samples_per_request)
        .param("pooling", a.pooling)
        .param("seconds per measurement", a.duration);
    let shown = match best {
        Some(b) => search_section(&mut p, a, runs, b),
        None => runs.first(),
    };
    if let Some(r) = shown {
        run_section(&mut p, r);
    }
    p
}

/// A `--find-max` search's objective, its best rate and its latency / throughput curve over
/// `runs`; returns the run to show in detail (`best`, else the last).
fn search_section<'r>(
    p: &mut Page,
    a: &LoadgenArgs,
    runs: &'r [Run],
    b: Option<&'r Run>,
) -> Option<&'r Run> {
    p.param("p99 objective (ms)", a.slo_p99_ms);
    if let Some(b) = b {
        p.param(
            "highest rate meeting it (requests/s)",
            format!("{:.0}", b.achieved_qps),
        );
    }
    let mut by_rate: Vec<&Run> = runs.iter().collect();
    by_rate.sort_by(|x, y| x.achieved_qps.total_cmp(&y.achieved_qps));
    let curve = |f: fn(&Run) -> f64| by_rate.iter().map(|r| (r.achieved_qps, f(r))).collect();
    p.figure(
        "Latency against throughput",
        "Each point is one measurement of the search (answered requests per second, and \
         the latency of the answered); the red line is the p99 objective.",
        Plot::Lines {
            x_label: "answered requests/s".into(),
            y_label: "latency (ms)".into(),
            series: vec![
                Series {
                    name: "p99".into(),
                    points: curve(|r| r.p99_ms),
                },
                Series {
                    name: "p50".into(),
                    points: curve(|r| r.p50_ms),
                },
            ],
            hline: Some((format!("objective {} ms", a.slo_p99_ms), a.slo_p99_ms)),
        },
    );
    b.or(runs.last())
}

/// One measurement: its rates and counts, its latency histogram, and its timeline and phases
/// where it has them.
fn run_section(p: &mut Page, r: &Run) {
    p.param("offered (requests/s)", format!("{:.0}", r.offered_qps))
        .param("answered (requests/s)", format!("{:.0}", r.achieved_qps))
        .param(
            "p50 / p99 / p999 (ms)",
            format!("{:.2} / {:.2} / {:.2}", r.p50_ms, r.p99_ms, r.p999_ms),
        )
        .param(
            "refused / errors / sent",
            format!("{} / {} / {}", r.refused, r.errors, r.sent),
        );
    p.figure(
        "Latency histogram",
        format!(
            "Latencies of the {} answered requests at {:.0} requests/s offered (log scale, 8 \
             buckets a decade).",
            r.ok, r.offered_qps
        ),
        Plot::Histogram {
            x_label: "latency (ms)".into(),
            buckets: r.latency_histogram_ms.clone(),
            log_x: true,
        },
    );
    if let Some(t) = &r.timeline {
        timeline(p, t);
    }
    if !r.phases.is_empty() {
        phases(p, &r.phases);
    }
}

/// The p50 and p99 of each `--timeline` interval.
fn timeline(p: &mut Page, t: &[Bucket]) {
    let line = |f: fn(&Bucket) -> f64| t.iter().map(|b| (b.t, f(b))).collect();
    p.figure(
        "Over time",
        "Each interval of --timeline, by the requests' scheduled times.",
        Plot::Lines {
            x_label: "seconds into the measurement".into(),
            y_label: "latency (ms)".into(),
            series: vec![
                Series {
                    name: "p99".into(),
                    points: line(|b| b.p99_ms),
                },
                Series {
                    name: "p50".into(),
                    points: line(|b| b.p50_ms),
                },
            ],
            hline: None,
        },
    );
}

/// The p99 of each `--phases` phase.
fn phases(p: &mut Page, phases: &[Phase]) {
    p.figure(
        "p99 per phase",
        "Each --phases phase on its own.",
        Plot::Bars {
            y_label: "p99 latency (ms)".into(),
            bars: phases
                .iter()
                .map(|ph| {
                    (
                        format!("{:.0}/s for {:.0} s", ph.offered_qps, ph.secs),
                        ph.p99_ms,
                    )
                })
                .collect(),
        },
    );
}
