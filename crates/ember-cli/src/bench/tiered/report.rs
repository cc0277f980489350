//! What `bench tiered` measured, and how it is printed: the tier under each cache policy, the
//! same tables in DRAM, the cold and the memory-budgeted mmap, and the disk's own rate, side by
//! side, as text and (with `--json`) as one JSON object on the last line.

use ember_bench::stats::median;

use crate::units::human_bytes;
use ember_embed::Isa;
use ember_embed::rowfile::BLOCK;
use serde_json::{Value, json};

use super::TieredArgs;
use crate::bench::setup::{self, Shape};

/// The disk's own random-read rate, and whether the tier's files bypass the page cache.
#[derive(Debug, Clone, Copy)]
pub(super) struct Disk {
    pub(super) iops: f64,
    pub(super) bytes_per_s: f64,
    pub(super) direct: bool,
}

/// Everything one run measured.
#[derive(Debug)]
pub(super) struct Report {
    /// One JSON object per cache policy (lookups/s, hit rates, reads, overlap...).
    pub(super) policies: Vec<Value>,
    /// Lookups/s of each DRAM run, when the DRAM baseline ran.
    pub(super) dram: Option<Vec<f64>>,
    /// Whether every policy's output equalled the DRAM tables' bit for bit.
    pub(super) checked: Option<bool>,
    /// Lookups/s of each cold-mmap run, and the resident fraction before each.
    pub(super) mmap: Option<(Vec<f64>, Vec<f64>)>,
    /// The budgeted mmap child's JSON.
    pub(super) mmap_budget: Option<Value>,
    pub(super) disk: Disk,
    pub(super) warmup: usize,
    pub(super) ids: String,
    pub(super) uniq: f64,
    pub(super) isa: Isa,
    pub(super) total_bytes: usize,
    pub(super) cache_bytes: usize,
}

impl Report {
    /// `--report`: hit rates and lookups/s per cache policy, beside DRAM and mmap.
    pub(super) fn page(&self, t: &TieredArgs, s: Shape) -> crate::report::Page {
        use crate::report::{Page, Plot};
        let a = &t.embed;
        let mut p = Page::new("ember bench tiered");
        p.param(
            "tables x rows x dim",
            format!("{} x {} x {}", s.tables, s.rows, s.dim),
        )
        .param("dtype", a.dtype)
        .param("pooling, batch", format!("{}, {}", s.pooling, s.batch))
        .param("ids", &self.ids)
        .param("table bytes", human_bytes(self.total_bytes))
        .param("row cache", human_bytes(self.cache_bytes));
        let name = |v: &Value| format!("tier {}", v["label"].as_str().unwrap_or("?"));
        let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        p.figure(
            "Hit rate per cache policy",
            "Distinct rows of a batch found in the row cache (what SSD reads follow).",
            Plot::Bars {
                y_label: "hit rate".into(),
                bars: self
                    .policies
                    .iter()
                    .map(|v| (name(v), f(v, "hit_rate")))
                    .collect(),
            },
        );
        p.figure(
            "Hit rate per id",
            "Lookups (ids, repeats counted) served from the row cache.",
            Plot::Bars {
                y_label: "hit rate per id".into(),
                bars: self
                    .policies
                    .iter()
                    .map(|v| (name(v), f(v, "lookup_hit_rate")))
                    .collect(),
            },
        );
        let mut bars: Vec<(String, f64)> = self
            .policies
            .iter()
            .map(|v| (name(v), f(v, "lookups_per_s") / 1e6))
            .collect();
        if let Some(d) = &self.dram {
            bars.push(("dram".into(), median(d) / 1e6));
        }
        if let Some((m, _)) = &self.mmap {
            bars.push(("cold mmap".into(), median(m) / 1e6));
        }
        p.figure(
            "Lookups/s",
            "Medians per policy, beside the same tables in DRAM (the ceiling the tier aims at) \
             and a cold mmap of the same files (what the OS page cache alone gives).",
            Plot::Bars {
                y_label: "million lookups/s".into(),
                bars,
            },
        );
        p
    }

    /// Prints the run: its setup, a line per policy beside DRAM and mmap, the ratios, and
    /// with `--json` one JSON object.
    pub(super) fn print(&self, t: &TieredArgs, s: Shape) {
        let sm = self.summary();
        self.print_setup(t, s);
        self.print_table(&sm);
        self.print_ratios(&sm);
        if t.embed.json {
            println!("{}", self.json(t, s, &sm));
        }
    }

    /// The best policies and the baselines' medians.
    fn summary(&self) -> Summary {
        let best = best_of(self.policies.iter());
        // Today's row-ordered files against the laid-out ones, each at its best policy.
        let best_rows = best_of(self.policies.iter().filter(|p| p["layout"].is_null()));
        let best_laid = best_of(self.policies.iter().filter(|p| !p["layout"].is_null()));
        let layout_ratio = match (
            best_laid["lookups_per_s"].as_f64(),
            best_rows["lookups_per_s"].as_f64(),
        ) {
            (Some(l), Some(r)) if r > 0.0 => Some(l / r),
            _ => None,
        };
        let best_lps = best["lookups_per_s"].as_f64().unwrap_or(0.0);
        let budget_lps: Option<f64> = self.mmap_budget.as_ref().and_then(|j: &Value| {
            let v: Vec<f64> = j["run_lookups_per_s"]
                .as_array()?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            (!v.is_empty()).then(|| median(&v))
        });
        Summary {
            best,
            best_rows,
            best_laid,
            layout_ratio,
            best_lps,
            dram_lps: self.dram.as_ref().map(|v| median(v)),
            mmap_lps: self.mmap.as_ref().map(|(v, _)| median(v)),
            budget_lps,
            budget_bound: self
                .mmap_budget
                .as_ref()
                .and_then(|j| j["upper_bound_lookups_per_s"].as_f64()),
        }
    }

    /// The lines that say what ran: tables, ids, threads and I/O, the disk's ceiling, and
    /// what the columns mean.
    fn print_setup(&self, t: &TieredArgs, s: Shape) {
        let a = &t.embed;
        println!(
            "ember bench tiered: {} tables x {} rows x dim {} {} ({} on {}), cache {} MiB, pooling {}, batch {}, mode {}",
            s.tables,
            s.rows,
            s.dim,
            a.dtype,
            human_bytes(self.total_bytes),
            t.dir.display(),
            t.cache_mb,
            s.pooling,
            s.batch,
            a.mode.name()
        );
        println!(
            "  ids {}, unique ratio {:.3}; {} threads, isa {}, prefetch {}, dedup {}; I/O {} ({}), queue depth {}, prefetch depth {}",
            self.ids,
            self.uniq,
            a.threads,
            self.isa,
            a.prefetch,
            a.dedup,
            t.io.name(),
            if self.disk.direct {
                "O_DIRECT"
            } else {
                "buffered"
            },
            t.queue_depth,
            t.prefetch_depth
        );
        println!(
            "  disk ceiling: {:.0} random {BLOCK}-byte reads/s ({:.0} MB/s)",
            self.disk.iops,
            self.disk.bytes_per_s / 1e6
        );
        println!(
            "  hit rate: distinct rows per batch found in the cache (what reads follow); per id: lookups served from the cache"
        );
        println!(
            "  {} warm-up batches, then {} runs x {} batches, medians:",
            self.warmup, a.runs, a.batches
        );
        println!("  used: bytes of the rows the cache lacked, per byte read from the disk");
    }

    /// A line per policy, then DRAM's and mmap's.
    fn print_table(&self, sm: &Summary) {
        println!(
            "  {:<24} {:>12} {:>9} {:>9} {:>10} {:>12} {:>10} {:>6} {:>8}",
            "",
            "lookups/s",
            "hit rate",
            "per id",
            "SSD reads/s",
            "% of disk",
            "SSD bytes",
            "used",
            "overlap"
        );
        for p in &self.policies {
            println!(
                "  {:<24} {:>10.3} M {:>9.3} {:>9.3} {:>10.0} {:>11.1}% {:>10} {:>6.3} {:>8.2}",
                format!("tier {}", p["label"].as_str().unwrap_or("?")),
                p["lookups_per_s"].as_f64().unwrap_or(0.0) / 1e6,
                p["hit_rate"].as_f64().unwrap_or(0.0),
                p["lookup_hit_rate"].as_f64().unwrap_or(0.0),
                p["ssd_reads_per_s"].as_f64().unwrap_or(0.0),
                100.0 * p["fraction_of_disk_ceiling"].as_f64().unwrap_or(0.0),
                human_bytes(p["ssd_bytes_read"].as_u64().unwrap_or(0) as usize),
                p["useful_bytes_per_byte_read"].as_f64().unwrap_or(0.0),
                p["overlap"].as_f64().unwrap_or(0.0)
            );
        }
        if let Some(d) = sm.dram_lps {
            println!("  {:<24} {:>10.3} M", "dram", d / 1e6);
        }
        if let Some(m) = sm.mmap_lps {
            println!("  {:<24} {:>10.3} M", "mmap (cold)", m / 1e6);
        }
        if let Some(m) = sm.budget_lps {
            println!(
                "  {:<24} {:>10.3} M   (cold, page cache limited to the cache budget)",
                "mmap (budget)",
                m / 1e6
            );
        }
        if let Some(m) = sm.budget_bound {
            println!(
                "  {:<24} < {:>8.4} M   (cold, page cache limited to the cache budget; stopped before its runs finished)",
                "mmap (budget)",
                m / 1e6
            );
        }
    }

    /// The best policies against each other and against DRAM and mmap, and the check.
    fn print_ratios(&self, sm: &Summary) {
        if let Some(r) = sm.layout_ratio {
            println!(
                "  best laid out ({}) / best in id order ({}): {r:.2}x; rows used per byte read {:.3} against {:.3}",
                sm.best_laid["label"].as_str().unwrap_or("?"),
                sm.best_rows["label"].as_str().unwrap_or("?"),
                sm.best_laid["useful_bytes_per_byte_read"]
                    .as_f64()
                    .unwrap_or(0.0),
                sm.best_rows["useful_bytes_per_byte_read"]
                    .as_f64()
                    .unwrap_or(0.0),
            );
        }
        if let Some(d) = sm.dram_lps {
            println!(
                "  best tier ({}) / dram: {:.3}x",
                sm.best["label"].as_str().unwrap_or("?"),
                sm.best_lps / d
            );
        }
        if let Some(r) = sm.best["vs_dram_paired"].as_f64() {
            println!(
                "  best tier / dram, each tier run against a DRAM run of the same batches just before it: {r:.3}x (median of pairs)"
            );
        }
        if let Some(m) = sm.mmap_lps {
            println!("  best tier / cold mmap: {:.2}x", sm.best_lps / m);
        }
        if let Some(m) = sm.budget_lps {
            println!(
                "  best tier / mmap with the same memory: {:.2}x",
                sm.best_lps / m
            );
        }
        if let Some(m) = sm.budget_bound {
            println!(
                "  best tier / mmap with the same memory: more than {:.0}x",
                sm.best_lps / m
            );
        }
        if self.checked == Some(true) {
            println!("  check: every policy's pooled output equals the DRAM tables' bit for bit");
        }
    }

    /// The `--json` object: the best policy's figures, every policy's, the baselines', the
    /// ratios and the workload.
    fn json(&self, t: &TieredArgs, s: Shape, sm: &Summary) -> Value {
        let a = &t.embed;
        let row_bytes = a.dtype.row_bytes(s.dim);
        let best_lps = sm.best_lps;
        let mut j = json!({
            "lookups_per_s": best_lps,
            "gb_per_s": best_lps * row_bytes as f64 / 1e9,
            "ns_per_lookup": 1e9 / best_lps.max(1e-9),
            "policy": sm.best["policy"],
            "label": sm.best["label"],
            "best_id_order": sm.best_rows["label"],
            "best_laid_out": sm.best_laid["label"],
            "ratio_layout_to_id_order": sm.layout_ratio,
            "hit_rate": sm.best["hit_rate"],
            "lookup_hit_rate": sm.best["lookup_hit_rate"],
            "ssd_bytes_read": sm.best["ssd_bytes_read"],
            "overlap": sm.best["overlap"],
            "policies": self.policies,
            "dram_lookups_per_s": sm.dram_lps,
            "dram_run_lookups_per_s": self.dram,
            "mmap_cold_lookups_per_s": sm.mmap_lps,
            "mmap_cold_run_lookups_per_s": self.mmap.as_ref().map(|(v, _)| v.clone()),
            "mmap_resident_fraction_before": self.mmap.as_ref().map(|(_, r)| r.clone()),
            "ratio_to_dram": sm.dram_lps.map(|d| best_lps / d),
            "ratio_to_dram_paired": sm.best["vs_dram_paired"],
            "ratio_to_mmap_cold": sm.mmap_lps.map(|m| best_lps / m),
            "mmap_budget_lookups_per_s": sm.budget_lps,
            "mmap_budget_run_lookups_per_s": self.mmap_budget.as_ref().map(|j| j["run_lookups_per_s"].clone()),
            "ratio_to_mmap_budget": sm.budget_lps.map(|m| best_lps / m),
            "mmap_budget_upper_bound_lookups_per_s": sm.budget_bound,
            "ratio_to_mmap_budget_at_least": sm.budget_bound.map(|m| best_lps / m),
            "disk_reads_per_s": self.disk.iops,
            "disk_bytes_per_s": self.disk.bytes_per_s,
            "direct_io": self.disk.direct,
            "io": t.io.name(),
            "queue_depth": t.queue_depth,
            "prefetch_depth": t.prefetch_depth,
            "cache_bytes": self.cache_bytes,
            "warmup_batches": self.warmup,
            "checked_against_dram": self.checked,
        });
        setup::add_workload(&mut j, a, s, &self.ids, self.isa.name(), self.uniq);
        j
    }
}

/// What the printed lines and the JSON compare: the best policy (and the best on files in id
/// order and laid out), and the baselines' medians.
struct Summary {
    best: Value,
    best_rows: Value,
    best_laid: Value,
    /// Best laid out / best in id order, lookups/s.
    layout_ratio: Option<f64>,
    best_lps: f64,
    dram_lps: Option<f64>,
    mmap_lps: Option<f64>,
    /// The budgeted mmap's median, or the bound it stayed under when stopped early.
    budget_lps: Option<f64>,
    budget_bound: Option<f64>,
}

/// The policy entry with the most lookups/s (`Null` when there is none).
fn best_of<'a>(policies: impl Iterator<Item = &'a Value>) -> Value {
    policies
        .max_by(|x, y| {
            x["lookups_per_s"]
                .as_f64()
                .partial_cmp(&y["lookups_per_s"].as_f64())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .cloned()
        .unwrap_or(Value::Null)
}
