//! Ember's planner: a search over column splits and placements, scored by the cost model.
//!
//! 1. **Row splits.** A table larger than `split_bytes` (default half a device) is cut into the
//!    fewest equal row ranges under it, so that any table can be placed; the baselines use the
//!    same rule.
//! 2. **Placement** of a given set of shards: greedy, costliest shard first (and, as a second
//!    order, largest first), each onto the device where the model predicts the lowest cost after
//!    adding it, among devices with memory left; repeated over a grid of balance caps (a device
//!    may hold at most `cap` x the mean bytes per device while another device still has room
//!    under it), then improved by local search (moves and swaps off the slowest device while
//!    they lower its cost). The score is the predicted cost of the slowest device.
//! 3. **Column splits** by beam search: from no splits, each step doubles the column split of one
//!    of the `branch` costliest shards on the slowest device of each plan in the beam, keeps the
//!    `beam` best children, and stops after `patience` steps without a better plan. Column parts
//!    are equal, at least 4 wide (even for int4), and must divide the dim.

use std::collections::HashSet;
use std::time::Instant;

use ember_embed::DType;

use crate::access::Reuse;
use crate::baselines::Baseline;
use crate::cost::{CostModel, Load, shard_load};
use crate::error::{PlanError, Result};
use crate::plan::{Plan, Shard, row_ranges};
use crate::spec::{DeviceSpec, TableSpec};

/// What to plan.
#[derive(Debug, Clone, Copy)]
pub struct Problem<'a> {
    pub tables: &'a [TableSpec],
    pub reuse: &'a [Reuse],
    pub devices: DeviceSpec,
    /// Samples per batch.
    pub batch: usize,
}

/// Search settings.
#[derive(Debug, Clone)]
pub struct SearchOptions {
    pub beam: usize,
    pub branch: usize,
    pub patience: usize,
    pub max_steps: usize,
    /// Balance caps tried by the greedy placement (multiples of the mean bytes per device).
    pub caps: Vec<f64>,
    /// Row-split tables larger than this (default: half a device's memory).
    pub split_bytes: Option<u64>,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            beam: 4,
            branch: 4,
            patience: 3,
            max_steps: 32,
            caps: vec![f64::INFINITY, 1.5, 1.2, 1.05],
            split_bytes: None,
        }
    }
}

/// A plan and what the search saw.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub plan: Plan,
    /// Predicted microseconds per batch of each device.
    pub predicted: Vec<f64>,
    /// Placements evaluated.
    pub candidates: usize,
    pub seconds: f64,
}

/// Row ranges of a table (the unit the column splits apply to).
#[derive(Debug, Clone)]
struct Unit {
    table: usize,
    rows: (u64, u64),
}

#[derive(Debug, Clone)]
struct Item {
    unit: usize,
    cols: (u32, u32),
    load: Load,
    bytes: u64,
    cost: f64,
}

/// A placement: the device of each item, each device's load and bytes.
#[derive(Debug, Clone)]
struct Placed {
    device: Vec<usize>,
    load: Vec<Load>,
    used: Vec<u64>,
    cost: Vec<f64>,
}

impl Placed {
    /// `items` items, none placed yet, on `devices` empty devices.
    fn new(items: usize, devices: usize) -> Placed {
        Placed {
            device: vec![0; items],
            load: vec![Load::default(); devices],
            used: vec![0; devices],
            cost: vec![0.0; devices],
        }
    }

    /// Puts item `i` on device `d` (its cost is left to the caller to update).
    fn add(&mut self, i: usize, it: &Item, d: usize) {
        self.device[i] = d;
        self.load[d] = self.load[d] + it.load;
        self.used[d] += it.bytes;
    }

    /// Takes item `i` off device `d`.
    fn remove(&mut self, it: &Item, d: usize) {
        self.load[d] = self.load[d] - it.load;
        self.used[d] -= it.bytes;
    }

    fn max(&self) -> f64 {
        self.cost.iter().copied().fold(0.0, f64::max)
    }
    fn argmax(&self) -> usize {
        (0..self.cost.len())
            .max_by(|&a, &b| self.cost[a].total_cmp(&self.cost[b]))
            .unwrap_or(0)
    }
}

/// The default row-split size: half a device.
pub fn default_split_bytes(dev: &DeviceSpec) -> u64 {
    (dev.memory_bytes / 2).max(1)
}

/// Row ranges of every table ([`row_ranges`]).
fn units(tables: &[TableSpec], split_bytes: u64) -> Vec<Unit> {
    tables
        .iter()
        .enumerate()
        .flat_map(|(table, t)| {
            row_ranges(t, split_bytes)
                .into_iter()
                .map(move |rows| Unit { table, rows })
        })
        .collect()
}

/// Whether a table of `dim` columns and `dtype` can be cut into `k` equal column parts.
fn can_split(dim: u32, dtype: DType, k: u32) -> bool {
    k >= 1
        && dim.is_multiple_of(k)
        && dim / k >= 4
        && (dtype != DType::Int4 || (dim / k).is_multiple_of(2))
}

struct Search<'a> {
    p: Problem<'a>,
    model: &'a CostModel,
    opts: &'a SearchOptions,
    units: Vec<Unit>,
    candidates: usize,
}

impl<'a> Search<'a> {
    fn items(&self, splits: &[u32]) -> Vec<Item> {
        let mut out = Vec::new();
        for (u, (unit, &k)) in self.units.iter().zip(splits).enumerate() {
            let t = &self.p.tables[unit.table];
            let w = t.dim / k;
            for part in 0..k {
                let rows = unit.rows.1 - unit.rows.0;
                let load = shard_load(t, &self.p.reuse[unit.table], rows, w, self.p.batch);
                out.push(Item {
                    unit: u,
                    cols: (part * w, (part + 1) * w),
                    load,
                    bytes: t.shard_bytes(rows, w),
                    cost: self.model.predict(&load),
                });
            }
        }
        out
    }

    /// Greedy placement of `items` in `order` under balance cap `cap`.
    fn greedy(&mut self, items: &[Item], order: &[usize], cap: f64) -> Option<Placed> {
        self.candidates += 1;
        let n = self.p.devices.count;
        let mem = self.p.devices.memory_bytes;
        let total: u64 = items.iter().map(|i| i.bytes).sum();
        let cap_bytes = if cap.is_finite() {
            (cap * total as f64 / n as f64) as u64
        } else {
            u64::MAX
        };
        let mut pl = Placed::new(items.len(), n);
        for &i in order {
            let it = &items[i];
            let fits = |d: usize| pl.used[d] + it.bytes <= mem;
            let under = (0..n).any(|d| fits(d) && pl.used[d] + it.bytes <= cap_bytes);
            let mut best: Option<(f64, usize)> = None;
            for d in 0..n {
                if !fits(d) || (under && pl.used[d] + it.bytes > cap_bytes) {
                    continue;
                }
                let c = self.model.predict(&(pl.load[d] + it.load));
                // Lowest cost after adding; among equals, the device with the least cost now.
                let key = c + 1e-9 * pl.cost[d];
                if best.is_none_or(|(b, _)| key < b) {
                    best = Some((key, d));
                }
            }
            let (_, d) = best?;
            pl.add(i, it, d);
            pl.cost[d] = self.model.predict(&pl.load[d]);
        }
        Some(pl)
    }

    /// Moves and swaps off the slowest device while they lower its cost.
    fn improve(&self, items: &[Item], pl: &mut Placed) {
        let mem = self.p.devices.memory_bytes;
        let n = self.p.devices.count;
        for _ in 0..4 * items.len() {
            let src = pl.argmax();
            let cur = pl.cost[src];
            let on_src: Vec<usize> = (0..items.len()).filter(|&i| pl.device[i] == src).collect();
            // (new max of the pair, item, dst, swap partner)
            let mut best: Option<(f64, usize, usize, Option<usize>)> = None;
            for &i in &on_src {
                let it = &items[i];
                for d in (0..n).filter(|&d| d != src) {
                    if pl.used[d] + it.bytes <= mem {
                        let a = self.model.predict(&(pl.load[src] - it.load));
                        let b = self.model.predict(&(pl.load[d] + it.load));
                        let m = a.max(b);
                        if m < cur * (1.0 - 1e-6) && best.is_none_or(|x| m < x.0) {
                            best = Some((m, i, d, None));
                        }
                    }
                }
            }
            if best.is_none() {
                for &i in &on_src {
                    let it = &items[i];
                    for (j, jt) in items.iter().enumerate() {
                        let d = pl.device[j];
                        if d == src || jt.cost >= it.cost {
                            continue;
                        }
                        if pl.used[d] + it.bytes - jt.bytes > mem
                            || pl.used[src] + jt.bytes - it.bytes > mem
                        {
                            continue;
                        }
                        let a = self.model.predict(&(pl.load[src] - it.load + jt.load));
                        let b = self.model.predict(&(pl.load[d] - jt.load + it.load));
                        let m = a.max(b);
                        if m < cur * (1.0 - 1e-6) && best.is_none_or(|x| m < x.0) {
                            best = Some((m, i, d, Some(j)));
                        }
                    }
                }
            }
            let Some((_, i, d, swap)) = best else {
                return;
            };
            pl.remove(&items[i], src);
            pl.add(i, &items[i], d);
            if let Some(j) = swap {
                pl.remove(&items[j], d);
                pl.add(j, &items[j], src);
            }
            for x in [src, d] {
                pl.cost[x] = self.model.predict(&pl.load[x]);
            }
        }
    }

    /// The placement of unsplit `items` that a table-wise plan gives, if its shards are the
    /// same row ranges.
    fn adopt(&self, items: &[Item], plan: &Plan) -> Option<Placed> {
        let n = self.p.devices.count;
        let mut pl = Placed::new(items.len(), n);
        if plan.shards.len() != items.len() {
            return None;
        }
        for (i, it) in items.iter().enumerate() {
            let u = &self.units[it.unit];
            let s = plan
                .shards
                .iter()
                .find(|s| s.table == u.table && s.rows == u.rows)?;
            pl.add(i, it, s.device);
        }
        for d in 0..n {
            pl.cost[d] = self.model.predict(&pl.load[d]);
        }
        Some(pl)
    }

    /// The best placement of the items of `splits` over the grid, improved.
    fn place(&mut self, splits: &[u32]) -> Option<(Vec<Item>, Placed)> {
        let items = self.items(splits);
        let mut by_cost: Vec<usize> = (0..items.len()).collect();
        by_cost.sort_by(|&a, &b| items[b].cost.total_cmp(&items[a].cost));
        let mut by_bytes: Vec<usize> = (0..items.len()).collect();
        by_bytes.sort_by(|&a, &b| items[b].bytes.cmp(&items[a].bytes));
        let mut best: Option<Placed> = None;
        for order in [&by_cost, &by_bytes] {
            for &cap in &self.opts.caps {
                if let Some(mut pl) = self.greedy(&items, order, cap) {
                    self.improve(&items, &mut pl);
                    if best.as_ref().is_none_or(|b| pl.max() < b.max()) {
                        best = Some(pl);
                    }
                }
            }
        }
        best.map(|b| (items, b))
    }
}

/// A candidate of the search: each unit's split count, the items they make, and their
/// placement.
type Candidate = (Vec<u32>, Vec<Item>, Placed);

/// Plans `p` with `model` (see the module docs).
pub fn plan(p: Problem<'_>, model: &CostModel, opts: &SearchOptions) -> Result<Outcome> {
    let t0 = Instant::now();
    check_problem(&p)?;
    let split = opts
        .split_bytes
        .unwrap_or_else(|| default_split_bytes(&p.devices));
    let mut s = Search {
        p,
        model,
        opts,
        units: units(p.tables, split),
        candidates: 0,
    };
    let start = vec![1u32; s.units.len()];
    let mut best = s.seed(&start, split)?;
    s.beam_search(start, &mut best);
    let (_, items, pl) = best;
    Ok(Outcome {
        plan: Plan {
            shards: s.shards(&items, &pl.device),
        },
        predicted: pl.cost,
        candidates: s.candidates,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Refuses a problem with a reuse profile missing (or extra) or no device.
fn check_problem(p: &Problem<'_>) -> Result<()> {
    if p.tables.len() != p.reuse.len() {
        return Err(PlanError::Invalid(format!(
            "{} tables but {} reuse profiles",
            p.tables.len(),
            p.reuse.len()
        )));
    }
    if p.devices.count == 0 {
        return Err(PlanError::Invalid("no devices".into()));
    }
    Ok(())
}

impl Search<'_> {
    /// The first candidate: the units unsplit (`start`), placed and improved, or the
    /// baselines' placements of them (with rows cut at `split` bytes), improved, where one is
    /// better: the search never settles for less than what a heuristic finds under the same
    /// model.
    fn seed(&mut self, start: &[u32], split: u64) -> Result<Candidate> {
        let p = self.p;
        let Some(first) = self.place(start) else {
            let total: u64 = p.tables.iter().map(TableSpec::bytes).sum();
            return Err(PlanError::NoFit(format!(
                "{total} bytes of tables do not fit {} devices of {} bytes",
                p.devices.count, p.devices.memory_bytes
            )));
        };
        let mut best = (start.to_vec(), first.0, first.1);
        for b in Baseline::GREEDY {
            if let Ok(bp) = b.plan(p.tables, &p.devices, split)
                && let Some(mut pl) = self.adopt(&best.1, &bp)
            {
                self.improve(&best.1, &mut pl);
                if pl.max() < best.2.max() {
                    best.2 = pl;
                }
            }
        }
        Ok(best)
    }

    /// A beam search over split counts from `start` (whose placement is `best`'s): each step
    /// places the children of the beam and keeps the `beam` best; it stops when no child is
    /// left, after `max_steps`, or after `patience` steps without a better one. `best` ends as
    /// the best candidate seen.
    fn beam_search(&mut self, start: Vec<u32>, best: &mut Candidate) {
        let opts = self.opts;
        let mut beam = vec![(start.clone(), best.1.clone(), best.2.clone())];
        let mut seen: HashSet<Vec<u32>> = HashSet::from([start]);
        let mut stall = 0;
        for _ in 0..opts.max_steps {
            let children = self.children(&beam, &mut seen);
            if children.is_empty() {
                break;
            }
            let mut scored: Vec<Candidate> = children
                .into_iter()
                .filter_map(|c| self.place(&c).map(|(it, pl)| (c, it, pl)))
                .collect();
            scored.sort_by(|a, b| a.2.max().total_cmp(&b.2.max()));
            scored.truncate(opts.beam.max(1));
            if let Some(top) = scored.first() {
                if top.2.max() < best.2.max() * (1.0 - 1e-6) {
                    *best = top.clone();
                    stall = 0;
                } else {
                    stall += 1;
                }
            }
            if stall >= opts.patience || scored.is_empty() {
                break;
            }
            beam = scored;
        }
    }

    /// The split counts to try next: for each candidate of `beam`, the items on its slowest
    /// device, costliest first, each with its unit split twice as many ways (where the table
    /// allows and there are devices for it), at most `branch` new ones per candidate; `seen`
    /// records every split tried.
    fn children(&self, beam: &[Candidate], seen: &mut HashSet<Vec<u32>>) -> Vec<Vec<u32>> {
        let (p, opts) = (self.p, self.opts);
        let mut children = Vec::new();
        for (splits, items, pl) in beam {
            let slow = pl.argmax();
            let mut mine: Vec<usize> = (0..items.len()).filter(|&i| pl.device[i] == slow).collect();
            mine.sort_by(|&a, &b| items[b].cost.total_cmp(&items[a].cost));
            let mut tried = 0;
            for i in mine {
                let u = items[i].unit;
                let t = &p.tables[self.units[u].table];
                let k = splits[u] * 2;
                if !can_split(t.dim, t.dtype, k) || k as usize > p.devices.count {
                    continue;
                }
                let mut child = splits.clone();
                child[u] = k;
                if seen.insert(child.clone()) {
                    children.push(child);
                    tried += 1;
                }
                if tried >= opts.branch {
                    break;
                }
            }
        }
        children
    }

    /// The plan's shards: each item on its `device`.
    fn shards(&self, items: &[Item], device: &[usize]) -> Vec<Shard> {
        items
            .iter()
            .zip(device)
            .map(|(it, &d)| {
                let u = &self.units[it.unit];
                Shard {
                    table: u.table,
                    rows: u.rows,
                    cols: it.cols,
                    device: d,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::device_loads;
    use crate::spec::test_tables as tables;
    use proptest::prelude::*;

    fn predicted_max(plan: &Plan, t: &[TableSpec], r: &[Reuse], n: usize, m: &CostModel) -> f64 {
        device_loads(&plan.shards, t, r, 512, n)
            .iter()
            .map(|l| m.predict(l))
            .fold(0.0, f64::max)
    }

    #[test]
    fn one_heavy_table_is_split_by_columns() {
        // One table does most of the work: only a column split can balance four devices.
        let t = tables(&[(100_000, 128, 80.0), (1000, 16, 1.0), (2000, 8, 2.0)]);
        let r = vec![Reuse::none(); 3];
        let dev = DeviceSpec {
            count: 4,
            memory_bytes: 1 << 30,
            bandwidth_gbps: None,
        };
        let m = CostModel::builtin();
        let p = Problem {
            tables: &t,
            reuse: &r,
            devices: dev,
            batch: 512,
        };
        let out = plan(p, &m, &SearchOptions::default()).unwrap();
        out.plan.check(&t, &dev).unwrap();
        assert_eq!(out.plan.shards.iter().filter(|s| s.table == 0).count(), 4);
        let base = Baseline::LookupGreedy.plan(&t, &dev, u64::MAX).unwrap();
        let (ours, theirs) = (
            predicted_max(&out.plan, &t, &r, 4, &m),
            predicted_max(&base, &t, &r, 4, &m),
        );
        assert!(ours < 0.4 * theirs, "{ours} vs {theirs}");
        assert!((ours - out.predicted.iter().copied().fold(0.0, f64::max)).abs() < 1e-6 * ours);
    }

    #[test]
    fn too_little_memory_is_an_error() {
        let t = tables(&[(1000, 64, 1.0)]);
        let r = vec![Reuse::none()];
        let dev = DeviceSpec {
            count: 2,
            memory_bytes: 1000,
            bandwidth_gbps: None,
        };
        let p = Problem {
            tables: &t,
            reuse: &r,
            devices: dev,
            batch: 8,
        };
        let e = plan(p, &CostModel::builtin(), &SearchOptions::default()).unwrap_err();
        assert!(e.to_string().contains("do not fit"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Plans are valid, respect memory, and are never predicted slower than the best greedy
        /// baseline under the same model.
        #[test]
        fn plans_are_valid_and_no_worse_than_baselines(
            spec in prop::collection::vec((1u64..200_000, prop::sample::select(vec![4u32, 8, 16, 32, 64, 128]), 1.0f64..100.0), 1..40),
            devices in 1usize..6,
            share in 0.4f64..1.0,
        ) {
            let t = tables(&spec);
            let r = vec![Reuse::none(); t.len()];
            let total: u64 = t.iter().map(TableSpec::bytes).sum();
            let dev = DeviceSpec { count: devices, memory_bytes: ((total as f64 * share) as u64).max(1 << 20), bandwidth_gbps: None };
            let m = CostModel::builtin();
            let p = Problem { tables: &t, reuse: &r, devices: dev, batch: 512 };
            let split = default_split_bytes(&dev);
            let Ok(out) = plan(p, &m, &SearchOptions::default()) else {
                // Only when the baselines cannot place it either.
                prop_assert!(Baseline::SizeGreedy.plan(&t, &dev, split).is_err());
                return Ok(());
            };
            prop_assert!(out.plan.check(&t, &dev).is_ok());
            let ours = predicted_max(&out.plan, &t, &r, devices, &m);
            for b in Baseline::GREEDY {
                if let Ok(bp) = b.plan(&t, &dev, split) {
                    let theirs = predicted_max(&bp, &t, &r, devices, &m);
                    prop_assert!(ours <= theirs * 1.0001, "{}: {ours} vs {theirs}", b.name());
                }
            }
        }
    }
}
