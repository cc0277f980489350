//! The cost model: predicted embedding-stage time of a set of shards on one device.
//!
//! What a device does per batch is summarised by a [`Load`], a sum over its shards (so a
//! device's load is updated in O(1) as the search adds or removes a shard):
//! shards, bags (batch x shards), lookups, and the 64-byte cache lines they read, split into
//! lines of rows already read earlier in the same batch (`hit_lines`, which the reuse profile
//! predicts) and lines of a batch's distinct rows (`cold_lines`), plus the bytes the shards
//! occupy. Two models predict microseconds per batch from it:
//!
//! - **analytic**: `c0 shards + c1 bags + c2 lookups + c3 hit_lines + c4 cold_lines (1 - m) +
//!   c5 cold_lines m`, where `m = max(0, 1 - LLC / bytes)` is the share of distinct rows that
//!   the last-level cache cannot have kept from earlier batches (a device's shards compete for
//!   one cache, which is what makes the cost of a set more than the sum of its parts). The
//!   coefficients are non-negative least squares on measured device sets, weighted for relative
//!   error.
//! - **boosted** (NeuroShard's idea: learn the cost from measurements): gradient-boosted
//!   regression trees on the load's features (logs of the sums, `m`, the analytic prediction,
//!   the share of distinct lines in shards the LLC could hold)
//!   that predict the log of measured / analytic; the analytic model times that correction.
//!
//! `ember plan calibrate` measures device sets with Ember's kernels, fits both on 80% of them,
//! reports each one's error on the other 20%, and keeps the boosted model only where it predicts
//! better.

use std::path::Path;

use ember_embed::files;

use serde::{Deserialize, Serialize};

use crate::access::Reuse;
use crate::error::{PlanError, Result};
use crate::plan::Shard;
use crate::spec::TableSpec;

/// The work of a set of shards for one batch (sums over shards).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    pub shards: f64,
    pub bags: f64,
    pub lookups: f64,
    pub hit_lines: f64,
    pub cold_lines: f64,
    pub bytes: f64,
    /// Cold lines weighted by how much of their own shard the LLC could hold
    /// (`cold_lines x min(1, LLC / shard bytes)` per shard).
    #[serde(default)]
    pub cold_small: f64,
}

impl std::ops::Add for Load {
    type Output = Load;
    fn add(self, o: Load) -> Load {
        Load {
            shards: self.shards + o.shards,
            bags: self.bags + o.bags,
            lookups: self.lookups + o.lookups,
            hit_lines: self.hit_lines + o.hit_lines,
            cold_lines: self.cold_lines + o.cold_lines,
            bytes: self.bytes + o.bytes,
            cold_small: self.cold_small + o.cold_small,
        }
    }
}

impl std::ops::Sub for Load {
    type Output = Load;
    fn sub(self, o: Load) -> Load {
        Load {
            shards: self.shards - o.shards,
            bags: self.bags - o.bags,
            lookups: self.lookups - o.lookups,
            hit_lines: self.hit_lines - o.hit_lines,
            cold_lines: self.cold_lines - o.cold_lines,
            bytes: self.bytes - o.bytes,
            cold_small: self.cold_small - o.cold_small,
        }
    }
}

/// 64-byte lines read per row of `bytes` bytes (rows start anywhere, so a row that is not a
/// whole number of lines straddles one more line on average).
fn lines_per_row(bytes: usize) -> f64 {
    let b = bytes as f64;
    if bytes.is_multiple_of(64) {
        b / 64.0
    } else {
        (b / 64.0).floor() + 1.0 + ((bytes % 64) as f64 - 1.0) / 64.0
    }
}

/// The load of rows `rows` x columns `cols` of table `t` at `batch` samples per batch: a row
/// shard sees its share of the ids (ids spread evenly over rows).
pub fn shard_load(t: &TableSpec, reuse: &Reuse, rows: u64, cols: u32, batch: usize) -> Load {
    let share = rows as f64 / t.rows.max(1) as f64;
    let lookups = batch as f64 * t.pooling * share;
    let row_bytes = t.dtype.row_bytes(cols as usize);
    let lines = lines_per_row(row_bytes);
    let unique = reuse.unique_rows(lookups, rows as f64);
    Load {
        shards: 1.0,
        bags: batch as f64,
        lookups,
        hit_lines: (lookups - unique) * lines,
        cold_lines: unique * lines,
        bytes: (rows * row_bytes as u64) as f64,
        cold_small: unique
            * lines
            * (machine_llc() / (rows * row_bytes as u64).max(1) as f64).min(1.0),
    }
}

/// Each of `devices` devices' load under `shards` of `tables` (with their reuse) at `batch`.
pub fn device_loads(
    shards: &[Shard],
    tables: &[TableSpec],
    reuse: &[Reuse],
    batch: usize,
    devices: usize,
) -> Vec<Load> {
    let mut load = vec![Load::default(); devices];
    for s in shards {
        load[s.device] = load[s.device]
            + shard_load(
                &tables[s.table],
                &reuse[s.table],
                s.num_rows(),
                s.num_cols(),
                batch,
            );
    }
    load
}

/// `llc_bytes`, read once.
pub fn machine_llc() -> f64 {
    static LLC: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *LLC.get_or_init(llc_bytes)
}

/// The size of this machine's last-level cache (sysfs), or 32 MiB.
fn llc_bytes() -> f64 {
    for idx in (0..6).rev() {
        let p = format!("/sys/devices/system/cpu/cpu0/cache/index{idx}/size");
        if let Ok(s) = std::fs::read_to_string(p) {
            let s = s.trim();
            let (n, mul) = match s.strip_suffix('K') {
                Some(n) => (n, 1024.0),
                None => match s.strip_suffix('M') {
                    Some(n) => (n, 1024.0 * 1024.0),
                    None => (s, 1.0),
                },
            };
            if let Ok(v) = n.parse::<f64>() {
                return v * mul;
            }
        }
    }
    32.0 * 1024.0 * 1024.0
}

/// Held-out errors of a calibration: mean absolute percentage error on device sets not used to
/// fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeldOut {
    pub train: usize,
    pub test: usize,
    pub analytic_mape: f64,
    pub boosted_mape: f64,
}

/// A calibrated cost model (the profile file `ember plan calibrate` writes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// Where and how it was measured.
    pub machine: String,
    pub batch: usize,
    pub threads: usize,
    pub llc_bytes: f64,
    /// c0 .. c5 of the analytic model (microseconds per unit).
    pub coef: [f64; 6],
    pub boosted: Option<Gbt>,
    /// Whether predictions use the boosted correction (it predicted better on held-out sets).
    pub use_boosted: bool,
    pub held_out: Option<HeldOut>,
}

impl CostModel {
    /// An uncalibrated model: coefficients measured once on an Intel Xeon (2 cores, 33 MiB
    /// LLC) with one thread per device. `ember plan calibrate` replaces it with this
    /// machine's own.
    pub fn builtin() -> CostModel {
        CostModel {
            machine: "builtin (uncalibrated)".into(),
            batch: 512,
            threads: 1,
            llc_bytes: machine_llc(),
            coef: [2.0, 0.02, 0.004, 0.0015, 0.004, 0.02],
            boosted: None,
            use_boosted: false,
            held_out: None,
        }
    }

    fn features(&self, l: &Load) -> [f64; 6] {
        let m = self.miss(l);
        [
            l.shards,
            l.bags,
            l.lookups,
            l.hit_lines,
            l.cold_lines * (1.0 - m),
            l.cold_lines * m,
        ]
    }

    /// The share of a batch's distinct rows the LLC cannot hold from earlier batches.
    pub fn miss(&self, l: &Load) -> f64 {
        if l.bytes <= 0.0 {
            0.0
        } else {
            (1.0 - self.llc_bytes / l.bytes).max(0.0)
        }
    }

    /// The analytic prediction, microseconds per batch.
    pub fn analytic(&self, l: &Load) -> f64 {
        if l.shards <= 0.0 {
            return 0.0;
        }
        self.features(l)
            .iter()
            .zip(&self.coef)
            .map(|(x, c)| x * c)
            .sum::<f64>()
            .max(1e-3)
    }

    fn tree_features(&self, l: &Load, analytic: f64) -> [f64; 10] {
        let ln = |x: f64| (x.max(0.0) + 1.0).ln();
        [
            ln(l.shards),
            ln(l.bags),
            ln(l.lookups),
            ln(l.hit_lines),
            ln(l.cold_lines),
            ln(l.bytes),
            self.miss(l),
            ln(analytic),
            ln(l.bytes / l.shards.max(1.0)),
            l.cold_small / l.cold_lines.max(1e-9),
        ]
    }

    /// The prediction of the model in use, microseconds per batch.
    pub fn predict(&self, l: &Load) -> f64 {
        let a = self.analytic(l);
        if l.shards <= 0.0 {
            return 0.0;
        }
        match (&self.boosted, self.use_boosted) {
            (Some(g), true) => a * g.predict(&self.tree_features(l, a)).exp(),
            _ => a,
        }
    }

    /// Fits both models on `samples` (a device's load and its measured microseconds), holding
    /// out a fifth (every fifth sample) to report their errors.
    pub fn fit(samples: &[(Load, f64)], base: CostModel) -> CostModel {
        let (test, train): (Vec<_>, Vec<_>) =
            samples.iter().enumerate().partition(|(i, _)| i % 5 == 4);
        let train: Vec<(Load, f64)> = train.into_iter().map(|(_, s)| *s).collect();
        let test: Vec<(Load, f64)> = test.into_iter().map(|(_, s)| *s).collect();
        let mut m = base;
        m.boosted = None;
        m.use_boosted = false;
        // Analytic: non-negative least squares, rows weighted by 1 / y (relative error).
        let xs: Vec<[f64; 6]> = train.iter().map(|(l, _)| m.features(l)).collect();
        let ys: Vec<f64> = train.iter().map(|s| s.1).collect();
        m.coef = nnls(&xs, &ys);
        // Boosted correction of the analytic model.
        let fx: Vec<Vec<f64>> = train
            .iter()
            .map(|(l, _)| m.tree_features(l, m.analytic(l)).to_vec())
            .collect();
        let fy: Vec<f64> = train
            .iter()
            .map(|(l, y)| (y.max(1e-3) / m.analytic(l)).ln())
            .collect();
        let g = Gbt::fit(&fx, &fy, 200, 3, 0.05, 6);
        let mape = |m: &CostModel| {
            if test.is_empty() {
                return f64::NAN;
            }
            test.iter()
                .map(|(l, y)| (m.predict(l) - y).abs() / y.max(1e-3))
                .sum::<f64>()
                / test.len() as f64
        };
        let analytic_mape = mape(&m);
        m.boosted = Some(g);
        m.use_boosted = true;
        let boosted_mape = mape(&m);
        m.use_boosted = boosted_mape < analytic_mape;
        m.held_out = Some(HeldOut {
            train: train.len(),
            test: test.len(),
            analytic_mape,
            boosted_mape,
        });
        m
    }

    /// Reads a profile file.
    pub fn load(path: &Path) -> Result<CostModel> {
        let bad = |reason: String| PlanError::Profile {
            path: path.display().to_string(),
            reason,
        };
        let text = files::read_text(path, "cost model", files::TEXT_LIMIT).map_err(|source| {
            PlanError::ProfileIo {
                path: path.display().to_string(),
                source,
            }
        })?;
        let m: CostModel =
            serde_json::from_str(&text).map_err(|source| PlanError::ProfileJson {
                path: path.display().to_string(),
                source,
            })?;
        if m.coef.iter().any(|c| !c.is_finite() || *c < 0.0) || m.llc_bytes <= 0.0 {
            return Err(bad("coefficients must be finite and non-negative".into()));
        }
        Ok(m)
    }

    /// Writes a profile file.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a cost model serializes");
        std::fs::write(path, text).map_err(|source| PlanError::ProfileIo {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Non-negative least squares minimizing sum ((x.c - y) / y)^2, by coordinate descent on the
/// normal equations.
pub fn nnls(xs: &[[f64; 6]], ys: &[f64]) -> [f64; 6] {
    let mut a = [[0f64; 6]; 6];
    let mut b = [0f64; 6];
    for (x, &y) in xs.iter().zip(ys) {
        let w = 1.0 / (y * y).max(1e-9);
        for i in 0..6 {
            b[i] += w * x[i] * y;
            for j in 0..6 {
                a[i][j] += w * x[i] * x[j];
            }
        }
    }
    let mut c = [0f64; 6];
    for _ in 0..2000 {
        for j in 0..6 {
            if a[j][j] <= 0.0 {
                continue;
            }
            let r: f64 = b[j]
                - (0..6)
                    .filter(|&k| k != j)
                    .map(|k| a[j][k] * c[k])
                    .sum::<f64>();
            c[j] = (r / a[j][j]).max(0.0);
        }
    }
    c
}

/// Gradient-boosted regression trees (squared loss).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gbt {
    pub base: f64,
    pub rate: f64,
    pub trees: Vec<Vec<Node>>,
}

/// A tree node: a split on `feature < threshold` (children at `left`, `right`) or a leaf.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Node {
    Split {
        feature: usize,
        threshold: f64,
        left: usize,
        right: usize,
    },
    Leaf(f64),
}

impl Gbt {
    /// Fits `rounds` trees of depth `depth`, leaves of at least `min_leaf` samples.
    pub fn fit(
        x: &[Vec<f64>],
        y: &[f64],
        rounds: usize,
        depth: usize,
        rate: f64,
        min_leaf: usize,
    ) -> Gbt {
        let n = y.len();
        let base = if n == 0 {
            0.0
        } else {
            y.iter().sum::<f64>() / n as f64
        };
        let mut pred = vec![base; n];
        let mut trees = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let resid: Vec<f64> = y.iter().zip(&pred).map(|(a, b)| a - b).collect();
            let mut nodes = Vec::new();
            let idx: Vec<usize> = (0..n).collect();
            grow(x, &resid, idx, depth, min_leaf, &mut nodes);
            for (i, p) in pred.iter_mut().enumerate() {
                *p += rate * eval(&nodes, &x[i]);
            }
            trees.push(nodes);
        }
        Gbt { base, rate, trees }
    }

    pub fn predict(&self, x: &[f64]) -> f64 {
        self.base + self.rate * self.trees.iter().map(|t| eval(t, x)).sum::<f64>()
    }
}

fn eval(nodes: &[Node], x: &[f64]) -> f64 {
    let mut i = 0;
    loop {
        match nodes.get(i) {
            Some(Node::Split {
                feature,
                threshold,
                left,
                right,
            }) => {
                i = if x.get(*feature).copied().unwrap_or(0.0) < *threshold {
                    *left
                } else {
                    *right
                }
            }
            Some(Node::Leaf(v)) => return *v,
            None => return 0.0,
        }
    }
}

/// Grows a node over samples `idx`, returning its index in `nodes`.
// Features index columns of `x` and positions index `order` pairwise: plain loops read best.
#[allow(clippy::needless_range_loop)]
fn grow(
    x: &[Vec<f64>],
    r: &[f64],
    idx: Vec<usize>,
    depth: usize,
    min_leaf: usize,
    nodes: &mut Vec<Node>,
) -> usize {
    let me = nodes.len();
    let mean = if idx.is_empty() {
        0.0
    } else {
        idx.iter().map(|&i| r[i]).sum::<f64>() / idx.len() as f64
    };
    nodes.push(Node::Leaf(mean));
    if depth == 0 || idx.len() < 2 * min_leaf {
        return me;
    }
    let total: f64 = idx.iter().map(|&i| r[i]).sum();
    let nf = x.first().map_or(0, Vec::len);
    let mut best: Option<(f64, usize, f64)> = None;
    let mut order = idx.clone();
    for f in 0..nf {
        order.sort_by(|&a, &b| x[a][f].total_cmp(&x[b][f]));
        let mut left = 0.0;
        for k in 0..order.len() - 1 {
            left += r[order[k]];
            let nl = (k + 1) as f64;
            let nr = (order.len() - k - 1) as f64;
            if k + 1 < min_leaf || order.len() - k - 1 < min_leaf {
                continue;
            }
            let (a, b) = (x[order[k]][f], x[order[k + 1]][f]);
            if a == b {
                continue;
            }
            // Gain in squared error: sum_l^2 / n_l + sum_r^2 / n_r.
            let gain = left * left / nl + (total - left).powi(2) / nr;
            if best.is_none_or(|(g, _, _)| gain > g) {
                best = Some((gain, f, (a + b) / 2.0));
            }
        }
    }
    let Some((gain, feature, threshold)) = best else {
        return me;
    };
    if gain <= total * total / idx.len() as f64 + 1e-12 {
        return me;
    }
    let (li, ri): (Vec<usize>, Vec<usize>) =
        idx.into_iter().partition(|&i| x[i][feature] < threshold);
    let left = grow(x, r, li, depth - 1, min_leaf, nodes);
    let right = grow(x, r, ri, depth - 1, min_leaf, nodes);
    nodes[me] = Node::Split {
        feature,
        threshold,
        left,
        right,
    };
    me
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn nnls_recovers_non_negative_coefficients() {
        let mut rng = StdRng::seed_from_u64(1);
        let truth = [3.0, 0.0, 0.5, 0.01, 0.2, 1.5];
        let xs: Vec<[f64; 6]> = (0..200)
            .map(|_| std::array::from_fn(|_| rng.random_range(0.0..100.0)))
            .collect();
        let ys: Vec<f64> = xs
            .iter()
            .map(|x| x.iter().zip(&truth).map(|(a, b)| a * b).sum::<f64>() + 1.0)
            .collect();
        let c = nnls(&xs, &ys);
        for (a, b) in c.iter().zip(&truth) {
            assert!((a - b).abs() < 0.05 * (1.0 + b), "{c:?}");
        }
        assert!(c.iter().all(|&v| v >= 0.0));
    }

    #[test]
    fn boosted_trees_learn_a_step_and_a_slope() {
        let mut rng = StdRng::seed_from_u64(2);
        let x: Vec<Vec<f64>> = (0..400)
            .map(|_| vec![rng.random_range(0.0..1.0), rng.random_range(0.0..1.0)])
            .collect();
        let f = |v: &[f64]| if v[0] < 0.3 { 1.0 } else { -1.0 } + 0.5 * v[1];
        let y: Vec<f64> = x.iter().map(|v| f(v)).collect();
        let g = Gbt::fit(&x, &y, 200, 3, 0.1, 5);
        let err: f64 = (0..100)
            .map(|_| {
                let v = [rng.random_range(0.0..1.0), rng.random_range(0.0..1.0)];
                (g.predict(&v) - f(&v)).abs()
            })
            .sum::<f64>()
            / 100.0;
        assert!(err < 0.1, "{err}");
    }

    #[test]
    fn loads_add_and_the_model_fits_its_own_predictions() {
        let t = TableSpec {
            name: "t".into(),
            rows: 100_000,
            dim: 64,
            dtype: ember_embed::DType::F32,
            pooling: 10.0,
        };
        let r = Reuse::none();
        let whole = shard_load(&t, &r, 100_000, 64, 512);
        assert_eq!(whole.lookups, 5120.0);
        assert_eq!(whole.cold_lines, 5120.0 * 4.0);
        let half = shard_load(&t, &r, 50_000, 64, 512);
        assert_eq!((half + half).lookups, whole.lookups);
        assert_eq!(lines_per_row(16), 1.0 + 15.0 / 64.0);
        // Samples made by a known model are fitted back with a small held-out error.
        let truth = CostModel::builtin();
        let mut rng = StdRng::seed_from_u64(5);
        let samples: Vec<(Load, f64)> = (0..300)
            .map(|_| {
                let mut l = Load::default();
                for _ in 0..rng.random_range(1..10) {
                    let rows = rng.random_range(1000..2_000_000);
                    let dim = [4, 16, 64, 128][rng.random_range(0..4)];
                    let tt = TableSpec {
                        rows,
                        dim,
                        ..t.clone()
                    };
                    l = l + shard_load(&tt, &r, rows, dim, 512);
                }
                (l, truth.analytic(&l))
            })
            .collect();
        let m = CostModel::fit(&samples, CostModel::builtin());
        let h = m.held_out.unwrap();
        assert_eq!((h.train, h.test), (240, 60));
        assert!(h.analytic_mape < 0.02, "{h:?}");
        let dir = std::env::temp_dir().join(format!("ember-cost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        m.save(&dir.join("p.json")).unwrap();
        assert_eq!(CostModel::load(&dir.join("p.json")).unwrap(), m);
        std::fs::write(dir.join("bad.json"), "{").unwrap();
        assert!(CostModel::load(&dir.join("bad.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
