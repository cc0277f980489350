//! `--report FILE.html`: one self-contained HTML page of plots (inline SVG drawn by `plotters`,
//! no script, no fonts or styles fetched), with the figures beside them as a table, for people
//! who would rather look than read. Each command that takes `--report` builds a [`Page`] of
//! [`Figure`]s from the results it prints.

use anyhow::{Context, Result};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// Pixel size of every plot.
const SIZE: (u32, u32) = (760, 380);

/// A series of points on a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One plot of a page.
#[derive(Debug, Clone)]
pub enum Plot {
    /// Lines over a numeric x axis; `hline` draws a labelled horizontal line (an objective).
    Lines {
        x_label: String,
        y_label: String,
        series: Vec<Series>,
        hline: Option<(String, f64)>,
    },
    /// One bar per label (shares, rates, hit ratios).
    Bars {
        y_label: String,
        bars: Vec<(String, f64)>,
    },
    /// Counts of values in buckets `[lo, hi)`, drawn over a log x axis when `log_x`.
    Histogram {
        x_label: String,
        buckets: Vec<(f64, f64, u64)>,
        log_x: bool,
    },
}

/// A titled plot with a line of explanation.
#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub note: String,
    pub plot: Plot,
}

/// A report: a title, the run's parameters, figures, and the printed text as the record.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub title: String,
    pub params: Vec<(String, String)>,
    pub figures: Vec<Figure>,
}

impl Page {
    pub fn new(title: impl Into<String>) -> Page {
        Page {
            title: title.into(),
            ..Page::default()
        }
    }

    pub fn param(&mut self, k: impl Into<String>, v: impl ToString) -> &mut Page {
        self.params.push((k.into(), v.to_string()));
        self
    }

    pub fn figure(&mut self, title: impl Into<String>, note: impl Into<String>, plot: Plot) {
        self.figures.push(Figure {
            title: title.into(),
            note: note.into(),
            plot,
        });
    }

    /// The page as HTML.
    pub fn html(&self) -> Result<String> {
        let mut h = String::new();
        let t = esc(&self.title);
        write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
             <style>body{{font-family:sans-serif;max-width:820px;margin:2em auto;color:#222}}\
             table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;\
             text-align:right}}th{{text-align:left}}figure{{margin:2em 0}}\
             figcaption{{color:#555}}</style></head><body>\n<h1>{t}</h1>\n<table class=\"params\">"
        )?;
        for (k, v) in &self.params {
            write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v))?;
        }
        h.push_str("</table>\n");
        for (i, f) in self.figures.iter().enumerate() {
            let svg = render(&f.plot).with_context(|| format!("drawing '{}'", f.title))?;
            writeln!(
                h,
                "<figure class=\"plot\" id=\"plot-{i}\"><h2>{}</h2>{svg}<figcaption>{}\
                 </figcaption>{}</figure>",
                esc(&f.title),
                esc(&f.note),
                table(&f.plot)
            )?;
        }
        writeln!(
            h,
            "<p><small>ember {} report</small></p></body></html>",
            env!("CARGO_PKG_VERSION")
        )?;
        Ok(h)
    }

    /// Writes the page to `path` (whole, or not at all: a temporary file renamed).
    pub fn write(&self, path: &Path) -> Result<()> {
        let html = self.html()?;
        let tmp = path.with_extension("html.tmp");
        std::fs::write(&tmp, html).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report: {}", path.display());
        Ok(())
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The plotted numbers as a table (the page's record, and for screen readers).
fn table(p: &Plot) -> String {
    let mut t = String::from("<details><summary>numbers</summary><table>");
    match p {
        Plot::Lines {
            x_label,
            y_label,
            series,
            ..
        } => {
            let _ = write!(
                t,
                "<tr><th>series</th><th>{}</th><th>{}</th></tr>",
                esc(x_label),
                esc(y_label)
            );
            for s in series {
                for (x, y) in &s.points {
                    let _ = write!(
                        t,
                        "<tr><th>{}</th><td>{x:.4}</td><td>{y:.4}</td></tr>",
                        esc(&s.name)
                    );
                }
            }
        }
        Plot::Bars { y_label, bars } => {
            let _ = write!(t, "<tr><th></th><th>{}</th></tr>", esc(y_label));
            for (k, v) in bars {
                let _ = write!(t, "<tr><th>{}</th><td>{v:.4}</td></tr>", esc(k));
            }
        }
        Plot::Histogram {
            x_label, buckets, ..
        } => {
            let _ = write!(t, "<tr><th>{}</th><th>count</th></tr>", esc(x_label));
            for (lo, hi, n) in buckets {
                let _ = write!(t, "<tr><th>[{lo:.4}, {hi:.4})</th><td>{n}</td></tr>");
            }
        }
    }
    t.push_str("</table></details>");
    t
}

/// A plot as an `<svg>` element.
fn render(p: &Plot) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        match p {
            Plot::Lines {
                x_label,
                y_label,
                series,
                hline,
            } => lines(&root, x_label, y_label, series, hline.as_ref())?,
            Plot::Bars { y_label, bars } => bar_chart(&root, y_label, bars)?,
            Plot::Histogram {
                x_label,
                buckets,
                log_x,
            } => histogram(&root, x_label, buckets, *log_x)?,
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn err<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Every plot's frame: margins and room for the axis labels.
fn frame<'a, 'b>(root: &'a Area<'b>) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.margin(12).x_label_area_size(40).y_label_area_size(64);
    b
}

/// `[lo, hi]` padded so that a flat or single-point range still has room.
fn span(lo: f64, hi: f64) -> (f64, f64) {
    match (lo.is_finite(), hi.is_finite()) {
        (true, true) if hi > lo => (lo, hi + (hi - lo) * 0.08),
        (true, true) => (
            lo - 1.0_f64.max(lo.abs() * 0.1),
            hi + 1.0_f64.max(hi.abs() * 0.1),
        ),
        _ => (0.0, 1.0),
    }
}

fn lines(
    root: &Area<'_>,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    hline: Option<&(String, f64)>,
) -> Result<()> {
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let fin = |v: f64| v.is_finite();
    let (x0, x1) = pts()
        .map(|p| p.0)
        .filter(|v| fin(*v))
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (mut y0, mut y1) = pts()
        .map(|p| p.1)
        .filter(|v| fin(*v))
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    if let Some((_, h)) = hline {
        y0 = y0.min(*h);
        y1 = y1.max(*h);
    }
    let (x0, x1) = span(x0, x1);
    let (_, y1) = span(y0.min(0.0), y1);
    let mut chart = frame(root)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| fin(p.0) && fin(p.1))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(err)?;
    }
    if let Some((name, h)) = hline {
        let c = RED.mix(0.7);
        chart
            .draw_series(LineSeries::new(vec![(x0, *h), (x1, *h)], c.stroke_width(1)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn bar_chart(root: &Area<'_>, y_label: &str, bars: &[(String, f64)]) -> Result<()> {
    let top = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let (_, top) = span(0.0, top);
    let n = bars.len().max(1);
    let mut chart = frame(root)
        // A segmented 0..=k axis has k + 1 slots: one per bar.
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..top)
        .map_err(err)?;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let c = Palette99::pick(i).to_rgba();
            let v = if v.is_finite() { *v } else { 0.0 };
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), v),
                ],
                c.filled(),
            );
            r.set_margin(0, 0, 12, 12);
            r
        }))
        .map_err(err)?;
    Ok(())
}

fn histogram(
    root: &Area<'_>,
    x_label: &str,
    buckets: &[(f64, f64, u64)],
    log_x: bool,
) -> Result<()> {
    let top = buckets.iter().map(|b| b.2).max().unwrap_or(0) as f64;
    let (_, top) = span(0.0, top);
    let lo = buckets.iter().map(|b| b.0).fold(f64::MAX, f64::min);
    let hi = buckets.iter().map(|b| b.1).fold(f64::MIN, f64::max);
    let (lo, hi) = if buckets.is_empty() {
        (0.1, 1.0)
    } else {
        (lo, hi)
    };
    if log_x && lo > 0.0 {
        buckets_on(root, (lo..hi).log_scale(), top, x_label, buckets)
    } else {
        let (lo, hi) = span(lo, hi);
        buckets_on(root, lo..hi, top, x_label, buckets)
    }
}

/// The histogram's bars over an x axis of either scale.
fn buckets_on<X>(
    root: &Area<'_>,
    x: X,
    top: f64,
    x_label: &str,
    buckets: &[(f64, f64, u64)],
) -> Result<()>
where
    X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let mut chart = frame(root).build_cartesian_2d(x, 0.0..top).map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("count")
        .draw()
        .map_err(err)?;
    let bar = |b: &(f64, f64, u64)| {
        Rectangle::new([(b.0, 0.0), (b.1, b.2 as f64)], BLUE.mix(0.6).filled())
    };
    chart.draw_series(buckets.iter().map(bar)).map_err(err)?;
    Ok(())
}

/// Log-spaced buckets (8 a decade) of positive values, empty buckets between the first and the
/// last kept (a histogram with gaps shows them).
pub fn log_buckets(values: &[f64]) -> Vec<(f64, f64, u64)> {
    let per_decade = 8.0;
    let key = |v: f64| (v.log10() * per_decade).floor() as i64;
    let pos: Vec<f64> = values
        .iter()
        .copied()
        .filter(|v| *v > 0.0 && v.is_finite())
        .collect();
    let (Some(k0), Some(k1)) = (
        pos.iter().map(|&v| key(v)).min(),
        pos.iter().map(|&v| key(v)).max(),
    ) else {
        return Vec::new();
    };
    let mut counts = vec![0u64; (k1 - k0 + 1) as usize];
    for v in pos {
        counts[(key(v) - k0) as usize] += 1;
    }
    let edge = |k: i64| 10f64.powf(k as f64 / per_decade);
    counts
        .into_iter()
        .enumerate()
        .map(|(i, n)| (edge(k0 + i as i64), edge(k0 + i as i64 + 1), n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_buckets_count_every_positive_value_once() {
        let vals = [0.5, 0.51, 1.0, 1.2, 9.9, 10.0, 250.0, 0.0, -1.0, f64::NAN];
        let b = log_buckets(&vals);
        assert_eq!(b.iter().map(|x| x.2).sum::<u64>(), 7);
        for v in vals.iter().filter(|v| **v > 0.0) {
            let hits = b.iter().filter(|(lo, hi, _)| lo <= v && v < hi).count();
            assert_eq!(hits, 1, "{v} in {b:?}");
        }
        assert!(b.windows(2).all(|w| (w[0].1 - w[1].0).abs() < 1e-9));
        assert!(log_buckets(&[]).is_empty());
    }

    #[test]
    fn a_page_has_one_svg_per_figure_and_escapes_text() {
        let mut p = Page::new("a <test>");
        p.param("k", "v&w");
        p.figure(
            "lines",
            "n",
            Plot::Lines {
                x_label: "x".into(),
                y_label: "y".into(),
                series: vec![Series {
                    name: "s".into(),
                    points: vec![(1.0, 2.0), (2.0, 3.0)],
                }],
                hline: Some(("slo".into(), 2.5)),
            },
        );
        p.figure(
            "bars",
            "n",
            Plot::Bars {
                y_label: "y".into(),
                bars: vec![("a".into(), 1.0), ("b".into(), f64::NAN)],
            },
        );
        p.figure(
            "one point",
            "n",
            Plot::Lines {
                x_label: "x".into(),
                y_label: "y".into(),
                series: vec![Series {
                    name: "s".into(),
                    points: vec![(5.0, 5.0)],
                }],
                hline: None,
            },
        );
        p.figure(
            "hist",
            "n",
            Plot::Histogram {
                x_label: "ms".into(),
                buckets: log_buckets(&[1.0, 2.0, 3.0, 40.0]),
                log_x: true,
            },
        );
        p.figure(
            "empty",
            "n",
            Plot::Histogram {
                x_label: "ms".into(),
                buckets: vec![],
                log_x: true,
            },
        );
        let h = p.html().unwrap();
        assert_eq!(h.matches("<svg").count(), 5, "{h}");
        assert!(h.contains("a &lt;test&gt;") && h.contains("v&amp;w"));
        // Self-contained: nothing fetched (the SVG namespace is a name, not a link).
        assert!(!h.contains(" src=") && !h.contains("href=") && !h.contains("<script"));
    }
}
