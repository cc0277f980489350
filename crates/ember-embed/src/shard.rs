//! Tables split into shards and spread over devices: the runtime side of a sharding plan.
//!
//! A [`Shard`] is rows `rows.0 .. rows.1` and columns `cols.0 .. cols.1` of one table, placed on
//! one device. [`ShardedEmbeddings`] turns a collection and a plan into one small collection per
//! device (row ranges share the source table's memory; column ranges are copied, as a column
//! shard is a narrower table), each with its own [`Pooler`] (its own worker pool). A batch is
//! validated against the source collection, routed to each device (a row shard sees the ids in
//! its range, renumbered from 0; a column shard sees every id), pooled on all devices at once,
//! and reassembled: column shards fill their columns, row shards add their partial sums, and
//! mean pooling divides by the whole bag's length at the end. The result equals the unsharded
//! pooled lookup up to float summation order.

use serde::{Deserialize, Serialize};

use crate::alloc::PagePolicy;
use crate::checked::CheckedBatch;
use crate::collection::{CheckedView, CollectionId, EmbeddingCollection, Feature};
pub use crate::error::ShardError;
use crate::error::{EmbedError, Result};
use crate::jagged::{Ids, KeyedJagged};
use crate::pool::{PoolOptions, PoolStats, Pooler, Pooling};
use crate::table::EmbeddingTable;

/// Rows `rows.0 .. rows.1` and columns `cols.0 .. cols.1` of table `table`, on `device`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    pub table: usize,
    pub rows: (u64, u64),
    pub cols: (u32, u32),
    pub device: usize,
}

impl Shard {
    /// Rows in the shard.
    pub fn num_rows(&self) -> u64 {
        self.rows.1 - self.rows.0
    }
    /// Columns in the shard.
    pub fn num_cols(&self) -> u32 {
        self.cols.1 - self.cols.0
    }
}

/// Checks that `shards` cover each of the tables (`(rows, dim)` each) exactly once: every shard
/// non-empty and inside its table, no two overlapping, areas adding up. The message names the
/// table.
pub fn check_cover(shards: &[Shard], tables: &[(u64, u32)], names: &[String]) -> Result<()> {
    let bad = |e: ShardError| Err(EmbedError::Sharding(e));
    let name = |t: usize| names.get(t).cloned().unwrap_or_else(|| format!("#{t}"));
    let mut per: Vec<Vec<&Shard>> = vec![Vec::new(); tables.len()];
    for s in shards {
        let Some(&(rows, dim)) = tables.get(s.table) else {
            return bad(ShardError::NoTable {
                table: s.table,
                tables: tables.len(),
            });
        };
        if s.rows.0 >= s.rows.1 || s.rows.1 > rows || s.cols.0 >= s.cols.1 || s.cols.1 > dim {
            return bad(ShardError::Outside {
                rows: s.rows,
                cols: s.cols,
                table: name(s.table),
                table_rows: rows,
                dim,
            });
        }
        per[s.table].push(s);
    }
    for (t, list) in per.iter().enumerate() {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.rows.0 < b.rows.1
                    && b.rows.0 < a.rows.1
                    && a.cols.0 < b.cols.1
                    && b.cols.0 < a.cols.1
                {
                    return bad(ShardError::Overlap { table: name(t) });
                }
            }
        }
        let area: u128 = list
            .iter()
            .map(|s| u128::from(s.num_rows()) * u128::from(s.num_cols()))
            .sum();
        if area != u128::from(tables[t].0) * u128::from(tables[t].1) {
            return bad(ShardError::NotCovered { table: name(t) });
        }
    }
    Ok(())
}

/// One feature as a device sees it: the part of source feature `feature` that one shard serves.
#[derive(Debug, Clone)]
struct Route {
    feature: usize,
    rows: (u64, u64),
    cols: (usize, usize),
}

/// The shards of one device: a collection of its own (one table per shard, one feature per
/// (shard, source feature)) and its pooler.
#[derive(Debug)]
pub struct DeviceShards {
    device: usize,
    coll: EmbeddingCollection,
    routes: Vec<Route>,
    pooler: Pooler,
}

impl DeviceShards {
    /// Builds a device's collection from its shard tables (`tables[i]` holds `shards[i]`) and
    /// the source features that read each table.
    pub fn new(
        device: usize,
        tables: Vec<EmbeddingTable>,
        shards: &[Shard],
        features: &[Feature],
        opts: PoolOptions,
    ) -> Result<Self> {
        if tables.len() != shards.len() {
            return Err(EmbedError::Sharding(ShardError::Count {
                tables: tables.len(),
                shards: shards.len(),
            }));
        }
        for (t, s) in tables.iter().zip(shards) {
            if t.rows() as u64 != s.num_rows() || t.dim() as u32 != s.num_cols() {
                return Err(EmbedError::Sharding(ShardError::Shape {
                    table: t.name().to_string(),
                    rows: t.rows(),
                    dim: t.dim(),
                    shard_rows: s.rows,
                    shard_cols: s.cols,
                }));
            }
        }
        let mut feats = Vec::new();
        let mut routes = Vec::new();
        for (i, s) in shards.iter().enumerate() {
            for (f, feat) in features.iter().enumerate() {
                if feat.table == s.table {
                    feats.push(Feature {
                        name: format!("{}@r{}c{}", feat.name, s.rows.0, s.cols.0),
                        table: i,
                    });
                    routes.push(Route {
                        feature: f,
                        rows: s.rows,
                        cols: (s.cols.0 as usize, s.cols.1 as usize),
                    });
                }
            }
        }
        Ok(DeviceShards {
            device,
            coll: EmbeddingCollection::new(tables, feats)?,
            routes,
            pooler: Pooler::new(opts)?,
        })
    }

    /// The device number in the plan.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device's own collection.
    pub fn collection(&self) -> &EmbeddingCollection {
        &self.coll
    }

    /// The pooler (worker pool) of this device.
    pub fn pooler(&self) -> &Pooler {
        &self.pooler
    }

    /// This device's part of `kj` (a batch of the source collection's features): per route, the
    /// ids of its source feature inside its rows, renumbered from the shard's first row. Valid
    /// for the device's collection by construction (only ids inside a shard's rows are kept), so
    /// it is not checked again.
    pub fn route(&self, kj: &KeyedJagged) -> Result<CheckedBatch> {
        let bsz = kj.batch_size();
        let mut lengths = Vec::with_capacity(self.routes.len() * bsz);
        let weights_in = kj.weights();
        let mut weights = weights_in.map(|_| Vec::new());
        let keys = self.coll.feature_names();
        macro_rules! gather {
            ($v:expr, $ty:ty) => {{
                let v = $v;
                let mut out: Vec<$ty> = Vec::new();
                for r in &self.routes {
                    let (lo, hi) = r.rows;
                    for b in 0..bsz {
                        let bag = kj.bag(r.feature, b);
                        let before = out.len();
                        for p in bag {
                            let id = v[p] as u64;
                            if id >= lo && id < hi {
                                out.push((id - lo) as $ty);
                                if let (Some(w), Some(win)) = (weights.as_mut(), weights_in) {
                                    w.push(win[p]);
                                }
                            }
                        }
                        lengths.push(out.len() - before);
                    }
                }
                out
            }};
        }
        let ids = match kj.ids() {
            Ids::U32(v) => Ids::U32(gather!(v, u32)),
            Ids::I64(v) => Ids::I64(gather!(v, i64)),
        };
        let mut offsets = Vec::with_capacity(lengths.len() + 1);
        offsets.push(0);
        let mut sum = 0;
        for l in lengths {
            sum += l;
            offsets.push(sum);
        }
        let kj = KeyedJagged::trusted(keys, bsz, offsets, ids, weights);
        Ok(CheckedBatch::trusted(kj, self.coll.id()))
    }

    /// Pools a routed batch into `out` (`batch x collection().total_dim()`).
    pub fn pool(&self, routed: &CheckedBatch, out: &mut [f32]) -> Result<PoolStats> {
        self.pooler.run(&self.coll, routed.view(), out)
    }
}

/// A collection spread over devices by a plan (see the module docs).
#[derive(Debug)]
pub struct ShardedEmbeddings {
    /// The collection whose batches it pools.
    source: CollectionId,
    devices: Vec<DeviceShards>,
    pooling: Pooling,
    col_offsets: Vec<usize>,
    dims: Vec<usize>,
    total_dim: usize,
}

impl ShardedEmbeddings {
    /// Splits `coll`'s tables by `shards` (checked to cover every table exactly once). Each
    /// device that holds a shard gets a pooler with `opts` (so `opts.threads` threads each);
    /// `opts.pooling` is the model's pooling.
    pub fn new(coll: &EmbeddingCollection, shards: &[Shard], opts: PoolOptions) -> Result<Self> {
        let tables: Vec<(u64, u32)> = coll
            .tables()
            .iter()
            .map(|t| (t.rows() as u64, t.dim() as u32))
            .collect();
        let names: Vec<String> = coll.tables().iter().map(|t| t.name().to_string()).collect();
        check_cover(shards, &tables, &names)?;
        let mut ids: Vec<usize> = shards.iter().map(|s| s.device).collect();
        ids.sort_unstable();
        ids.dedup();
        // Devices pool plain sums (weighted where the model weighs): a row shard's mean is not
        // the bag's mean, so means are taken after reassembly.
        let dev_opts = PoolOptions {
            pooling: match opts.pooling {
                Pooling::Mean => Pooling::Sum,
                p => p,
            },
            ..opts
        };
        let mut devices = Vec::with_capacity(ids.len());
        for d in ids {
            let mine: Vec<Shard> = shards.iter().filter(|s| s.device == d).cloned().collect();
            let mut tabs = Vec::with_capacity(mine.len());
            for s in &mine {
                let t = &coll.tables()[s.table];
                let name = format!("{}@r{}c{}", t.name(), s.rows.0, s.cols.0);
                let (r0, r1) = (s.rows.0 as usize, s.rows.1 as usize);
                tabs.push(if s.cols == (0, t.dim() as u32) {
                    t.view_rows(&name, r0, r1)?
                } else {
                    t.copy_block(
                        &name,
                        r0..r1,
                        s.cols.0 as usize..s.cols.1 as usize,
                        PagePolicy::Huge,
                    )?
                });
            }
            devices.push(DeviceShards::new(
                d,
                tabs,
                &mine,
                coll.features(),
                dev_opts,
            )?);
        }
        let nf = coll.features().len();
        Ok(ShardedEmbeddings {
            source: coll.id(),
            devices,
            pooling: opts.pooling,
            col_offsets: (0..nf).map(|f| coll.col_offset(f)).collect(),
            dims: (0..nf).map(|f| coll.table_of(f).dim()).collect(),
            total_dim: coll.total_dim(),
        })
    }

    /// The devices that hold shards, in device order.
    pub fn devices(&self) -> &[DeviceShards] {
        &self.devices
    }

    /// Pools `batch` (validated against the source collection) into `out` (`batch x total_dim`),
    /// every device at once on its own pool.
    pub fn run(&self, batch: CheckedView<'_>, out: &mut [f32]) -> Result<PoolStats> {
        if batch.collection() != self.source {
            return Err(EmbedError::WrongCollection);
        }
        let kj = batch.get();
        let bsz = kj.batch_size();
        if out.len() != bsz * self.total_dim {
            return Err(EmbedError::OutputLen {
                got: out.len(),
                batch_size: bsz,
                dim: self.total_dim,
                expected: bsz * self.total_dim,
            });
        }
        // Each call has its own device outputs, so concurrent calls never share a buffer.
        let one = |d: &DeviceShards| -> Result<(PoolStats, Vec<f32>)> {
            let routed = d.route(kj)?;
            let mut buf = vec![0f32; bsz * d.coll.total_dim()];
            let st = d.pool(&routed, &mut buf)?;
            Ok((st, buf))
        };
        let results: Vec<Result<(PoolStats, Vec<f32>)>> = if self.devices.len() == 1 {
            vec![one(&self.devices[0])]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = self.devices.iter().map(|d| s.spawn(|| one(d))).collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(EmbedError::Sharding(ShardError::Panicked)))
                    })
                    .collect()
            })
        };
        let mut stats = PoolStats::default();
        let mut bufs = Vec::with_capacity(results.len());
        for r in results {
            let (st, buf) = r?;
            stats = stats.plus(st);
            bufs.push(buf);
        }
        out.fill(0.0);
        for (d, buf) in self.devices.iter().zip(&bufs) {
            let local_dim = d.coll.total_dim();
            for (lf, r) in d.routes.iter().enumerate() {
                let lo = d.coll.col_offset(lf);
                let w = r.cols.1 - r.cols.0;
                let go = self.col_offsets[r.feature] + r.cols.0;
                for b in 0..bsz {
                    let src = &buf[b * local_dim + lo..b * local_dim + lo + w];
                    let dst = &mut out[b * self.total_dim + go..b * self.total_dim + go + w];
                    dst.iter_mut().zip(src).for_each(|(o, x)| *o += x);
                }
            }
        }
        if self.pooling == Pooling::Mean {
            for (f, (&off, &dim)) in self.col_offsets.iter().zip(&self.dims).enumerate() {
                for b in 0..bsz {
                    let len = kj.length(f, b);
                    if len > 0 {
                        let s = 1.0 / len as f32;
                        out[b * self.total_dim + off..b * self.total_dim + off + dim]
                            .iter_mut()
                            .for_each(|x| *x *= s);
                    }
                }
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::pool::reference;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Random tables, a random plan (each table split into a random grid of row and column
    /// ranges on random devices) and a random batch; the sharded result must match the
    /// reference on the unsharded tables.
    fn case(seed: u64, pooling: Pooling, dtype: DType) {
        let mut rng = StdRng::seed_from_u64(seed);
        let nt = rng.random_range(1..5);
        let mut tables = Vec::new();
        let mut shards = Vec::new();
        let devices = rng.random_range(1..4);
        for t in 0..nt {
            let rows = rng.random_range(1..60usize);
            let dim = *[1usize, 3, 4, 8, 13, 16]
                .get(rng.random_range(0..6))
                .expect("in range");
            let vals: Vec<f32> = (0..rows * dim)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            tables
                .push(EmbeddingTable::from_f32(&format!("t{t}"), rows, dim, dtype, &vals).unwrap());
            // Cut points (int4 columns on even boundaries).
            let mut rcuts = vec![0u64, rows as u64];
            if rows > 1 && rng.random_bool(0.5) {
                rcuts.insert(1, rng.random_range(1..rows as u64));
            }
            let mut ccuts = vec![0u32, dim as u32];
            if dim >= 4 && rng.random_bool(0.5) {
                ccuts.insert(1, 2 * rng.random_range(1..(dim as u32).div_ceil(2)));
            }
            for r in rcuts.windows(2) {
                for c in ccuts.windows(2) {
                    shards.push(Shard {
                        table: t,
                        rows: (r[0], r[1]),
                        cols: (c[0], c[1]),
                        device: rng.random_range(0..devices),
                    });
                }
            }
        }
        let coll = EmbeddingCollection::one_feature_per_table(tables).unwrap();
        let bsz = rng.random_range(0..7);
        let mut lengths = Vec::new();
        let mut ids = Vec::new();
        for t in 0..nt {
            let rows = coll.tables()[t].rows() as u32;
            for _ in 0..bsz {
                let l = rng.random_range(0..6);
                lengths.push(l);
                ids.extend((0..l).map(|_| rng.random_range(0..rows)));
            }
        }
        let weights = (pooling == Pooling::WeightedSum)
            .then(|| ids.iter().map(|_| rng.random_range(-2.0f32..2.0)).collect());
        let kj =
            KeyedJagged::from_lengths(coll.feature_names(), bsz, &lengths, Ids::U32(ids), weights)
                .unwrap();
        let sharded = ShardedEmbeddings::new(
            &coll,
            &shards,
            PoolOptions {
                pooling,
                threads: 1 + (seed % 2) as usize,
                ..Default::default()
            },
        )
        .unwrap();
        let v = coll.check_view(&kj).unwrap();
        let mut got = vec![f32::NAN; bsz * coll.total_dim()];
        sharded.run(v, &mut got).unwrap();
        let mut want = vec![0f32; bsz * coll.total_dim()];
        reference::pooled_lookup(&coll, v, pooling, &mut want).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "seed {seed} {pooling:?} {dtype}: out[{i}] {g} vs {w}"
            );
        }
    }

    proptest! {
        #[test]
        fn sharded_pooling_matches_the_reference(seed in any::<u64>(), p in 0usize..3, d in 0usize..5) {
            let pooling = [Pooling::Sum, Pooling::Mean, Pooling::WeightedSum][p];
            case(seed, pooling, DType::ALL[d]);
        }
    }

    #[test]
    fn bad_plans_are_refused_with_the_table_named() {
        let t = EmbeddingTable::from_f32("big", 10, 4, DType::F32, &[0.5; 40]).unwrap();
        let coll = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
        let s = |rows, cols| Shard {
            table: 0,
            rows,
            cols,
            device: 0,
        };
        for (shards, want) in [
            (vec![s((0, 5), (0, 4))], "do not cover"),
            (vec![s((0, 10), (0, 4)), s((5, 10), (0, 4))], "overlap"),
            (vec![s((0, 11), (0, 4))], "outside"),
            (
                vec![Shard {
                    table: 1,
                    ..s((0, 10), (0, 4))
                }],
                "there are 1",
            ),
        ] {
            let e = ShardedEmbeddings::new(&coll, &shards, PoolOptions::default()).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            assert!(
                e.to_string().contains("big") || want == "there are 1",
                "{e}"
            );
        }
    }

    #[test]
    fn row_shards_share_memory_and_column_shards_copy_exactly() {
        let vals: Vec<f32> = (0..6 * 8).map(|i| i as f32 * 0.25 - 3.0).collect();
        for dt in DType::ALL {
            let t = EmbeddingTable::from_f32("t", 6, 8, dt, &vals).unwrap();
            let v = t.view_rows("v", 2, 5).unwrap();
            assert_eq!(v.rows(), 3);
            assert_eq!(
                v.resident().unwrap().as_ptr(),
                t.resident().unwrap()[2 * t.stride()..].as_ptr()
            );
            let c = t.copy_block("c", 1..4, 2..6, PagePolicy::Small).unwrap();
            let (mut a, mut b) = (vec![0f32; 8], vec![0f32; 4]);
            for r in 0..3 {
                t.dequantize_row(r + 1, &mut a).unwrap();
                c.dequantize_row(r, &mut b).unwrap();
                assert_eq!(&a[2..6], &b[..], "{dt}");
            }
            assert!(t.view_rows("e", 3, 3).is_err());
            assert!(t.copy_block("e", 0..7, 0..2, PagePolicy::Small).is_err());
        }
        let t = EmbeddingTable::from_f32("q", 6, 8, DType::Int4, &vals).unwrap();
        let e = t
            .copy_block("c", 0..6, 1..4, PagePolicy::Small)
            .unwrap_err();
        assert!(e.to_string().contains("byte boundaries"), "{e}");
    }
}
