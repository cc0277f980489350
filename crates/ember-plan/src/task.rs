//! Planning tasks like NeuroShard's: a random set of tables, each with a pooling factor and a
//! reuse profile, and devices with a memory cap.
//!
//! - 10 to 60 tables (uniform), dims drawn from {4, 8, 16, 32, 64, 128}, f32;
//! - rows log-uniform in `rows` (default 1K to 500K: scaled down from production's millions so
//!   that a task's tables fit this machine's memory twice over; well above the last-level cache);
//! - pooling factor: log-normal (sigma 1) around the mean ids per sample per table of a dataset
//!   drawn from Meta's locality statistics, clamped to 1 .. 8x that mean;
//! - reuse: the same dataset's column-size histogram, scaled per table by 2^U(-1.5, 1.5) (some
//!   tables hotter than the dataset's average, some colder);
//! - devices: 4, each capped at `memory_share` (default 35%) of the task's table bytes, so
//!   memory binds (the four devices hold 1.4x the tables).

use rand::Rng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, LogNormal};

use ember_embed::{DType, Ids, KeyedJagged};

use crate::access::{Locality, Reuse};
use crate::spec::{DeviceSpec, TableSpec};

/// How tasks are drawn.
#[derive(Debug, Clone)]
pub struct TaskOptions {
    pub tables: (usize, usize),
    pub dims: Vec<u32>,
    pub rows: (f64, f64),
    pub devices: usize,
    pub memory_share: f64,
}

impl Default for TaskOptions {
    fn default() -> Self {
        TaskOptions {
            tables: (10, 60),
            dims: vec![4, 8, 16, 32, 64, 128],
            rows: (1e3, 5e5),
            devices: 4,
            memory_share: 0.35,
        }
    }
}

/// One planning task.
#[derive(Debug, Clone)]
pub struct Task {
    pub tables: Vec<TableSpec>,
    pub reuse: Vec<Reuse>,
    pub devices: DeviceSpec,
}

impl Task {
    /// Draws a task.
    pub fn draw(opts: &TaskOptions, stats: &[Locality], rng: &mut StdRng) -> Task {
        let n = rng.random_range(opts.tables.0..=opts.tables.1.max(opts.tables.0));
        let mut tables = Vec::with_capacity(n);
        let mut reuse = Vec::with_capacity(n);
        let (lr0, lr1) = (opts.rows.0.ln(), opts.rows.1.ln());
        for i in 0..n {
            let ds = &stats[rng.random_range(0..stats.len())];
            let mean = ds.mean_pooling().max(1.0);
            let sigma = 1.0f64;
            let ln = LogNormal::new(mean.ln() - sigma * sigma / 2.0, sigma).expect("valid");
            let pooling = ln.sample(rng).clamp(1.0, 8.0 * mean).round();
            tables.push(TableSpec {
                name: format!("t{i}"),
                rows: rng.random_range(lr0..=lr1).exp().round() as u64,
                dim: opts.dims[rng.random_range(0..opts.dims.len())],
                dtype: DType::F32,
                pooling,
            });
            reuse.push(Reuse::from_locality(
                ds,
                2f64.powf(rng.random_range(-1.5..1.5)),
            ));
        }
        let total: u64 = tables.iter().map(TableSpec::bytes).sum();
        Task {
            tables,
            reuse,
            devices: DeviceSpec {
                count: opts.devices,
                memory_bytes: ((total as f64 * opts.memory_share) as u64).max(1 << 20),
                bandwidth_gbps: None,
            },
        }
    }

    /// `count` batches of `batch` samples, one feature per table (named after it): bag lengths
    /// uniform in 0 ..= 2 x pooling (mean the pooling factor), ids with the table's reuse.
    pub fn batches(&self, batch: usize, count: usize, rng: &mut StdRng) -> Vec<KeyedJagged> {
        let keys: Vec<String> = self.tables.iter().map(|t| t.name.clone()).collect();
        // Ids of every batch drawn together, so hot rows recur from batch to batch.
        let mut lengths = vec![Vec::with_capacity(self.tables.len() * batch); count];
        let mut ids = vec![Vec::new(); count];
        for (t, r) in self.tables.iter().zip(&self.reuse) {
            let hi = (2.0 * t.pooling).round() as usize;
            let mut per = Vec::with_capacity(count);
            for l in lengths.iter_mut() {
                let ls: Vec<usize> = (0..batch).map(|_| rng.random_range(0..=hi)).collect();
                per.push(ls.iter().sum::<usize>());
                l.extend(ls);
            }
            let all = r.generate(per.iter().sum(), t.rows, rng);
            let mut at = 0;
            for (k, n) in per.into_iter().enumerate() {
                ids[k].extend_from_slice(&all[at..at + n]);
                at += n;
            }
        }
        lengths
            .into_iter()
            .zip(ids)
            .map(|(l, i)| {
                KeyedJagged::from_lengths(keys.clone(), batch, &l, Ids::U32(i), None)
                    .expect("lengths and ids agree by construction")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::parse_locality;
    use rand::SeedableRng;

    #[test]
    fn tasks_follow_their_options_and_batches_their_tables() {
        let stats = parse_locality(
            "a_t10_bs100.pt\nAvg # of indices: 20000\nAvg # of unique cols: 5000\nHistogram of col sizes:\n(0, 1]: 0.5\n(1, 2]: 0.3\n(2, 4]: 0.2\n",
        )
        .unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let opts = TaskOptions {
            rows: (100.0, 2000.0),
            ..Default::default()
        };
        for _ in 0..20 {
            let t = Task::draw(&opts, &stats, &mut rng);
            assert!((10..=60).contains(&t.tables.len()));
            assert!(t.tables.iter().all(|x| opts.dims.contains(&x.dim)
                && (100..=2000).contains(&x.rows)
                && (1.0..=160.0).contains(&x.pooling)));
            let total: u64 = t.tables.iter().map(TableSpec::bytes).sum();
            assert!(t.devices.memory_bytes as f64 >= 0.35 * total as f64 - 1.0);
            let b = t.batches(16, 2, &mut rng);
            assert_eq!(b.len(), 2);
            for kj in &b {
                assert_eq!(kj.keys().len(), t.tables.len());
                for (f, tab) in t.tables.iter().enumerate() {
                    let r = kj.feature_range(f);
                    assert!((r.start..r.end).all(|p| (kj.ids().get(p) as u64) < tab.rows));
                }
            }
        }
    }
}
