//! The real cost of a set of shards: their pooled lookups run with Ember's kernels.
//!
//! A [`Bench`] holds one task's batches and materializes each shard as a table of its own (a
//! row range of a table is a table of those rows; a column range a table of that width), filled
//! with non-zero values so that every page is really backed. One device is measured at a time:
//! its shards in one collection, on one pooler (one thread by default: a device's worker), the
//! task's batches routed to it beforehand. All device sets of the plans being compared are timed
//! in turn, round after round, and each one's cost is its median over the rounds (see
//! [`Bench::measure`]): this machine is a shared VM whose speed drifts, and timing one plan after
//! another let the drift decide comparisons.

use std::collections::HashMap;
use std::time::Instant;

use ember_embed::shard::DeviceShards;
use ember_embed::{
    CheckedBatch, Dedup, EmbeddingTable, Feature, KeyedJagged, PagePolicy, PoolOptions, Pooling,
    Shard,
};
use rand::rngs::StdRng;

use crate::error::{PlanError, Result};
use crate::plan::Plan;
use crate::task::Task;

/// How measurements run.
#[derive(Debug, Clone, Copy)]
pub struct MeasureOptions {
    /// Samples per batch.
    pub batch: usize,
    /// Distinct batches per task.
    pub batches: usize,
    /// Timed passes over the batches.
    pub rounds: usize,
    /// Threads of a device's pool.
    pub threads: usize,
}

impl Default for MeasureOptions {
    fn default() -> Self {
        MeasureOptions {
            batch: 512,
            batches: 4,
            rounds: 9,
            threads: 1,
        }
    }
}

/// One task's batches and materialized shards.
#[derive(Debug)]
pub struct Bench<'a> {
    task: &'a Task,
    opts: MeasureOptions,
    batches: Vec<KeyedJagged>,
    features: Vec<Feature>,
    tables: HashMap<Shard, EmbeddingTable>,
}

fn err(e: ember_embed::EmbedError) -> PlanError {
    PlanError::Measure(e)
}

impl<'a> Bench<'a> {
    pub fn new(task: &'a Task, opts: MeasureOptions, rng: &mut StdRng) -> Bench<'a> {
        Bench {
            task,
            opts,
            batches: task.batches(opts.batch, opts.batches.max(1), rng),
            features: task
                .tables
                .iter()
                .enumerate()
                .map(|(i, t)| Feature {
                    name: t.name.clone(),
                    table: i,
                })
                .collect(),
            tables: HashMap::new(),
        }
    }

    /// A table holding shard `s` (made once, then shared).
    fn table(&mut self, s: &Shard) -> Result<EmbeddingTable> {
        let key = Shard {
            device: 0,
            ..s.clone()
        };
        if !self.tables.contains_key(&key) {
            let spec = &self.task.tables[s.table];
            let mut t = EmbeddingTable::zeroed(
                &spec.name,
                s.num_rows() as usize,
                s.num_cols() as usize,
                spec.dtype,
                PagePolicy::Huge,
            )
            .map_err(err)?;
            t.fill_rows(1, |r, out| {
                out.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = ((r * 7 + i) % 61) as f32 * 0.01 - 0.3)
            });
            self.tables.insert(key.clone(), t);
        }
        let t = &self.tables[&key];
        t.view_rows(t.name(), 0, t.rows()).map_err(err)
    }

    /// One device set, ready to time: its collection and its part of every batch.
    fn prepare(&mut self, shards: &[Shard]) -> Result<Option<(DeviceShards, Vec<CheckedBatch>)>> {
        if shards.is_empty() {
            return Ok(None);
        }
        let tables = shards
            .iter()
            .map(|s| self.table(s))
            .collect::<Result<Vec<_>>>()?;
        let dev = DeviceShards::new(
            0,
            tables,
            shards,
            &self.features,
            PoolOptions {
                pooling: Pooling::Sum,
                dedup: Dedup::Off,
                threads: self.opts.threads,
                ..Default::default()
            },
        )
        .map_err(err)?;
        let routed = self
            .batches
            .iter()
            .map(|b| dev.route(b))
            .collect::<ember_embed::Result<Vec<_>>>()
            .map_err(err)?;
        Ok(Some((dev, routed)))
    }

    /// Microseconds per batch of each device of each plan: the median over `rounds` rounds, each
    /// round timing every device set once in turn (so that the machine's slow drifts touch all
    /// plans alike); a device set's turn pools its last batch untimed (its rows come back into
    /// the cache, as on a device of its own), then times every batch.
    pub fn measure(&mut self, plans: &[&Plan], devices: usize) -> Result<Vec<Vec<f64>>> {
        let mut sets = Vec::new();
        for (p, plan) in plans.iter().enumerate() {
            for d in 0..devices {
                let mine: Vec<Shard> = plan
                    .shards
                    .iter()
                    .filter(|s| s.device == d)
                    .cloned()
                    .collect();
                if let Some(set) = self.prepare(&mine)? {
                    sets.push((p, d, set));
                }
            }
        }
        let mut times = vec![Vec::with_capacity(self.opts.rounds); sets.len()];
        let mut out = vec![0f32; 0];
        for round in 0..=self.opts.rounds {
            for (k, (_, _, (dev, routed))) in sets.iter().enumerate() {
                out.resize(self.opts.batch * dev.collection().total_dim(), 0.0);
                if let Some(last) = routed.last() {
                    dev.pool(last, &mut out).map_err(err)?;
                }
                let t0 = Instant::now();
                for r in routed {
                    dev.pool(r, &mut out).map_err(err)?;
                }
                if round > 0 {
                    times[k].push(t0.elapsed().as_secs_f64() * 1e6 / routed.len() as f64);
                }
            }
        }
        std::hint::black_box(&out);
        let mut res = vec![vec![0.0; devices]; plans.len()];
        for ((p, d, _), mut t) in sets.iter().map(|(p, d, s)| (*p, *d, s)).zip(times) {
            t.sort_by(f64::total_cmp);
            res[p][d] = t[t.len() / 2];
        }
        Ok(res)
    }
}
