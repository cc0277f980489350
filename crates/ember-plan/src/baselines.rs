//! The heuristics a planner is measured against (NeuroShard's and TorchRec's table-wise
//! greedy baselines). Each sorts tables by a key, largest first, and puts each on the device
//! with the smallest sum of that key so far among those with room; `random` puts each on a
//! random device with room. Tables larger than `split_bytes` are first split into equal row
//! shards (the same for every method), so that a table larger than a device can be placed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{PlanError, Result};
use crate::plan::{Plan, Shard, row_ranges, shard_bytes};
use crate::spec::{DeviceSpec, TableSpec};

/// A baseline heuristic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    Random(u64),
    /// Table bytes.
    SizeGreedy,
    /// Embedding dim.
    DimGreedy,
    /// dim x pooling.
    LookupGreedy,
    /// dim x pooling x log10(rows).
    SizeLookupGreedy,
}

impl Baseline {
    pub const GREEDY: [Baseline; 4] = [
        Baseline::SizeGreedy,
        Baseline::DimGreedy,
        Baseline::LookupGreedy,
        Baseline::SizeLookupGreedy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Baseline::Random(_) => "random",
            Baseline::SizeGreedy => "size-greedy",
            Baseline::DimGreedy => "dim-greedy",
            Baseline::LookupGreedy => "lookup-greedy",
            Baseline::SizeLookupGreedy => "size-lookup-greedy",
        }
    }

    /// The key of a shard of `rows` rows of table `t`.
    fn key(self, t: &TableSpec, rows: u64) -> f64 {
        let dim = f64::from(t.dim);
        match self {
            Baseline::Random(_) => 0.0,
            Baseline::SizeGreedy => t.shard_bytes(rows, t.dim) as f64,
            Baseline::DimGreedy => dim,
            Baseline::LookupGreedy => dim * t.pooling,
            Baseline::SizeLookupGreedy => dim * t.pooling * (rows.max(1) as f64).log10().max(1e-9),
        }
    }

    /// Places `tables` on `dev`.
    pub fn plan(self, tables: &[TableSpec], dev: &DeviceSpec, split_bytes: u64) -> Result<Plan> {
        let mut units: Vec<Shard> = tables
            .iter()
            .enumerate()
            .flat_map(|(i, t)| {
                row_ranges(t, split_bytes)
                    .into_iter()
                    .map(move |rows| Shard {
                        table: i,
                        rows,
                        cols: (0, t.dim),
                        device: 0,
                    })
            })
            .collect();
        let key = |s: &Shard| self.key(&tables[s.table], s.rows.1 - s.rows.0);
        if !matches!(self, Baseline::Random(_)) {
            units.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.table.cmp(&b.table)));
        }
        let mut load = vec![0f64; dev.count];
        let mut used = vec![0u64; dev.count];
        let mut rng = match self {
            Baseline::Random(seed) => Some(StdRng::seed_from_u64(seed)),
            _ => None,
        };
        for u in &mut units {
            let b = shard_bytes(u, &tables[u.table]);
            let fits: Vec<usize> = (0..dev.count)
                .filter(|&d| used[d] + b <= dev.memory_bytes)
                .collect();
            let d = match &mut rng {
                Some(rng) if !fits.is_empty() => fits[rng.random_range(0..fits.len())],
                _ => fits
                    .iter()
                    .copied()
                    .min_by(|&x, &y| load[x].total_cmp(&load[y]).then(x.cmp(&y)))
                    .ok_or_else(|| {
                        PlanError::NoFit(format!(
                            "{}: a shard of {} ({b} bytes) fits no device",
                            self.name(),
                            tables[u.table].name
                        ))
                    })?,
            };
            u.device = d;
            used[d] += b;
            load[d] += key(u);
        }
        Ok(Plan { shards: units })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::test_tables as tables;
    use proptest::prelude::*;

    #[test]
    fn size_greedy_balances_bytes() {
        let t = tables(&[(100, 8, 1.0), (100, 8, 1.0), (50, 8, 1.0), (50, 8, 1.0)]);
        let dev = DeviceSpec {
            count: 2,
            memory_bytes: 1 << 20,
            bandwidth_gbps: None,
        };
        let p = Baseline::SizeGreedy.plan(&t, &dev, u64::MAX).unwrap();
        p.check(&t, &dev).unwrap();
        assert_eq!(p.device_bytes(&t, 2), vec![4800, 4800]);
    }

    #[test]
    fn oversize_tables_are_split_by_rows_and_no_fit_is_an_error() {
        let t = tables(&[(1000, 16, 2.0), (10, 16, 1.0)]);
        let dev = DeviceSpec {
            count: 4,
            memory_bytes: 20_000,
            bandwidth_gbps: None,
        };
        let p = Baseline::LookupGreedy.plan(&t, &dev, 16_000).unwrap();
        p.check(&t, &dev).unwrap();
        assert!(p.shards.iter().filter(|s| s.table == 0).count() >= 4);
        let tiny = DeviceSpec {
            memory_bytes: 100,
            ..dev
        };
        let e = Baseline::SizeGreedy
            .plan(&t, &tiny, 100)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fits no device"), "{e}");
    }

    proptest! {
        /// Every baseline gives a valid plan whenever tables fit with room to spare.
        #[test]
        fn baselines_give_valid_plans(
            spec in prop::collection::vec((1u64..5000, prop::sample::select(vec![4u32, 8, 16, 32, 64, 128]), 0.0f64..100.0), 1..60),
            devices in 1usize..8,
            seed in any::<u64>(),
        ) {
            let t = tables(&spec);
            let total: u64 = t.iter().map(TableSpec::bytes).sum();
            let dev = DeviceSpec { count: devices, memory_bytes: total, bandwidth_gbps: None };
            for b in Baseline::GREEDY.into_iter().chain([Baseline::Random(seed)]) {
                let p = b.plan(&t, &dev, total).unwrap();
                prop_assert!(p.check(&t, &dev).is_ok(), "{}", b.name());
            }
        }
    }
}
