//! Access profiles: how often a batch touches the same row of a table.
//!
//! Meta's locality statistics (`../shared/data/tables/dlrm_datasets_2021_locality_stats.txt`)
//! give, per dataset, a histogram of "column sizes": for each row touched by a batch, how many of
//! the batch's ids name it. A table's [`Reuse`] is such a histogram times a scale (a table hotter
//! or colder than the dataset average). It yields the expected number of distinct rows of a
//! batch (what the cost model needs) and generates ids with that reuse (what the measurements
//! need). A reuse profile can also be taken from a trace file of one table's ids.

use std::path::Path;

use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

pub use crate::error::LocalityError;
use crate::error::{PlanError, Result};

/// One dataset of a locality statistics file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Locality {
    pub name: String,
    /// Ids per batch, over all tables.
    pub indices: f64,
    /// Distinct rows per batch, over all tables.
    pub unique: f64,
    /// Samples per batch and tables (from the name, e.g. `fbgemm_t856_bs65536`).
    pub batch: f64,
    pub tables: f64,
    /// `(lo, hi, p)`: the fraction `p` of touched rows is touched more than `lo` and at most
    /// `hi` times (`hi` infinite for the last bucket).
    pub col_sizes: Vec<(f64, f64, f64)>,
}

impl Locality {
    /// Mean ids per sample per table.
    pub fn mean_pooling(&self) -> f64 {
        self.indices / (self.batch * self.tables)
    }
}

/// Reads every dataset of a locality statistics file.
pub fn read_locality(path: &Path) -> Result<Vec<Locality>> {
    let limit = ember_embed::files::TEXT_LIMIT;
    let text = ember_embed::files::read_text(path, "locality stats", limit).map_err(|source| {
        PlanError::SpecIo {
            path: path.display().to_string(),
            source,
        }
    })?;
    parse_locality(&text).map_err(|cause| PlanError::Locality {
        path: path.display().to_string(),
        cause,
    })
}

/// Parses the text of a locality statistics file.
pub fn parse_locality(text: &str) -> std::result::Result<Vec<Locality>, LocalityError> {
    let mut out: Vec<Locality> = Vec::new();
    let mut in_hist = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let num = |s: &str| {
            s.trim()
                .parse::<f64>()
                .map_err(|_| LocalityError::NotNumber {
                    line: i + 1,
                    value: s.trim().to_string(),
                })
        };
        if line.ends_with(".pt") {
            let field = |key: &str| {
                line.split(['_', '.'])
                    .find_map(|p| p.strip_prefix(key).and_then(|n| n.parse::<f64>().ok()))
            };
            out.push(Locality {
                name: line.trim_end_matches(".pt").to_string(),
                indices: 0.0,
                unique: 0.0,
                batch: field("bs").unwrap_or(65536.0),
                tables: field("t").unwrap_or(856.0),
                col_sizes: Vec::new(),
            });
            in_hist = false;
            continue;
        }
        let Some(cur) = out.last_mut() else {
            continue;
        };
        if let Some(v) = line.strip_prefix("Avg # of indices:") {
            cur.indices = num(v)?;
        } else if let Some(v) = line.strip_prefix("Avg # of unique cols:") {
            cur.unique = num(v)?;
        } else if line.starts_with("Histogram of col sizes") {
            in_hist = true;
        } else if in_hist && line.starts_with('(') {
            let (range, p) = line
                .split_once("]:")
                .or_else(|| line.split_once("+:"))
                .ok_or(LocalityError::NotBucket { line: i + 1 })?;
            let range = range.trim_start_matches('(');
            let (lo, hi) = match range.split_once(',') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(range)?, f64::INFINITY),
            };
            cur.col_sizes.push((lo, hi, num(p)?));
        } else if in_hist {
            in_hist = false;
        }
    }
    out.retain(|l| !l.col_sizes.is_empty() && l.indices > 0.0);
    if out.is_empty() {
        return Err(LocalityError::NoHistogram);
    }
    Ok(out)
}

/// A table's reuse: a column-size histogram and a scale on the column sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reuse {
    pub col_sizes: Vec<(f64, f64, f64)>,
    pub scale: f64,
}

impl Reuse {
    /// Every id names a distinct row.
    pub fn none() -> Reuse {
        Reuse {
            col_sizes: vec![(0.0, 1.0, 1.0)],
            scale: 1.0,
        }
    }

    /// A dataset's histogram, scaled.
    pub fn from_locality(l: &Locality, scale: f64) -> Reuse {
        Reuse {
            col_sizes: l.col_sizes.clone(),
            scale,
        }
    }

    /// The histogram of how often each row appears in windows of `window` consecutive ids of a
    /// trace (one window per batch).
    pub fn from_trace(ids: &[u64], window: usize) -> Reuse {
        let window = window.max(1);
        let mut counts = std::collections::HashMap::new();
        let mut buckets = [0f64; 17];
        let mut rows = 0f64;
        for w in ids.chunks(window) {
            counts.clear();
            for &id in w {
                *counts.entry(id).or_insert(0u64) += 1;
            }
            for &c in counts.values() {
                let k = (64 - (c - 1).leading_zeros()) as usize; // c in (2^(k-1), 2^k]
                buckets[k.min(16)] += 1.0;
                rows += 1.0;
            }
        }
        if rows == 0.0 {
            return Reuse::none();
        }
        let col_sizes = buckets
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let lo = if k == 0 {
                    0.0
                } else {
                    (1u64 << (k - 1)) as f64
                };
                let hi = if k == 16 {
                    f64::INFINITY
                } else {
                    (1u64 << k) as f64
                };
                (lo, hi, n / rows)
            })
            .collect();
        Reuse {
            col_sizes,
            scale: 1.0,
        }
    }

    /// A bucket's typical column size before scaling.
    fn bucket_size(lo: f64, hi: f64) -> f64 {
        if hi.is_infinite() {
            lo * 2.0
        } else {
            ((lo + 1.0).max(1.0) + hi) / 2.0
        }
    }

    /// Mean ids per distinct row of a batch (at least 1).
    pub fn mean_col_size(&self) -> f64 {
        let (mut s, mut p) = (0.0, 0.0);
        for &(lo, hi, q) in &self.col_sizes {
            s += q * (Self::bucket_size(lo, hi) * self.scale).max(1.0);
            p += q;
        }
        if p > 0.0 { (s / p).max(1.0) } else { 1.0 }
    }

    /// Expected distinct rows among `lookups` ids of a table of `rows` rows.
    pub fn unique_rows(&self, lookups: f64, rows: f64) -> f64 {
        (lookups / self.mean_col_size()).min(rows).min(lookups)
    }

    /// `n` ids of a table of `rows` rows with this reuse: rows drawn at random, each repeated a
    /// column size drawn from the histogram, shuffled.
    pub fn generate(&self, n: usize, rows: u64, rng: &mut impl Rng) -> Vec<u32> {
        let total: f64 = self.col_sizes.iter().map(|b| b.2).sum();
        let rows = rows.clamp(1, u64::from(u32::MAX));
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let mut u = rng.random_range(0.0..total.max(1e-12));
            let mut pick = self.col_sizes.last().copied().unwrap_or((0.0, 1.0, 1.0));
            for &b in &self.col_sizes {
                if u < b.2 {
                    pick = b;
                    break;
                }
                u -= b.2;
            }
            let (lo, hi) = (
                pick.0.floor() as u64 + 1,
                pick.1.min(pick.0 * 2.0 + 1.0) as u64,
            );
            let c = rng.random_range(lo..=hi.max(lo)) as f64;
            let c = ((c * self.scale).round() as usize).max(1);
            let row = rng.random_range(0..rows) as u32;
            out.extend(std::iter::repeat_n(row, c.min(n - out.len())));
        }
        out.shuffle(rng);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const SAMPLE: &str = "fbgemm_t856_bs65536.pt\nLocality stats after processing 1 batches of size 65536\nAvg # of indices: 887017990\nAvg # of unique cols: 128435723\nAvg col size: 6.9\nHistogram of col sizes:\n(0, 1]: 0.473\n(1, 2]: 0.152\n(2, 4]: 0.139\n(4, 8]: 0.112\n(8, 16]: 0.072\n(16, 32]: 0.032\n(32, 64]: 0.011\n(64, 128]: 0.005\n(128, 256]: 0.002\n(256, 512]: 0.001\n(32768+: 0.000\n[0, 1, 2]\nRatio of index distribution at different column sizes:\n(0, 1]: 0.069\n";

    #[test]
    fn parses_meta_locality_stats() {
        let l = parse_locality(SAMPLE).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].col_sizes.len(), 11);
        assert_eq!(l[0].col_sizes[10].1, f64::INFINITY);
        assert_eq!((l[0].batch, l[0].tables), (65536.0, 856.0));
        assert!((l[0].mean_pooling() - 15.81).abs() < 0.01);
        // The histogram's mean is near the file's own "Avg col size" (6.9).
        let m = Reuse::from_locality(&l[0], 1.0).mean_col_size();
        assert!((4.0..10.0).contains(&m), "{m}");
        assert!(parse_locality("nothing here").is_err());
    }

    #[test]
    #[cfg_attr(
        not(ember_shared),
        ignore = "needs ../shared/data beside the repository (not here when built)"
    )]
    fn the_shared_files_parse_where_present() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tables");
        let p = dir.join("dlrm_datasets_2021_locality_stats.txt");
        assert!(
            p.exists(),
            "{} not found: this test reads ../shared/data beside the repository (it is built as ignored where that is absent; --include-ignored runs it anyway)",
            p.display()
        );
        let l = read_locality(&p).unwrap();
        assert_eq!(l.len(), 17);
        assert!(l.iter().all(|d| d.col_sizes.len() == 17));
        let l = read_locality(&dir.join("dlrm_datasets_2022_locality_stats.txt")).unwrap();
        assert!(l.len() >= 10);
    }

    #[test]
    fn generated_ids_have_the_reuse_they_promise() {
        let l = parse_locality(SAMPLE).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        for scale in [0.25, 1.0, 4.0] {
            let r = Reuse::from_locality(&l[0], scale);
            let ids = r.generate(200_000, 1 << 30, &mut rng);
            assert_eq!(ids.len(), 200_000);
            let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len() as f64;
            let want = r.unique_rows(200_000.0, f64::from(1u32 << 30));
            assert!(
                (distinct / want - 1.0).abs() < 0.2,
                "scale {scale}: {distinct} distinct, predicted {want}"
            );
            // From the trace back to a histogram: about the same mean column size.
            let back = Reuse::from_trace(
                &ids.iter().map(|&i| u64::from(i)).collect::<Vec<_>>(),
                200_000,
            );
            let (a, b) = (back.mean_col_size(), r.mean_col_size());
            assert!((a / b - 1.0).abs() < 0.35, "scale {scale}: {a} vs {b}");
        }
        // A small table caps the distinct rows.
        assert_eq!(Reuse::none().unique_rows(1000.0, 10.0), 10.0);
    }
}
