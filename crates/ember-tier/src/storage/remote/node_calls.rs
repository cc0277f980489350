//! The client's side of pooling next to the rows: [`RedisStore::pool`] sends each node one
//! `EMBER.POOL` per table of a batch (`ember-pool-command` defines the command) and adds the nodes'
//! partial sums; [`pool_by_reads`] is the same sums from rows read whole, for a store without
//! the module.
//!
//! The order of the sums, so that results are reproducible: a bag's rows are split by the node
//! that holds them (by the slot map); each node sums its share in bag order; the shares are
//! added into the bag in the order of the lowest slot each share's blocks hash to. For a given
//! slot map, cache content and batch the bits are the same from run to run, and across a
//! failover (a replica takes over its primary's slots whole). A node that cannot pool (no module,
//! a block moved away) has its share read as rows (`GETRANGE`) and summed by the client in the
//! same order with the same code: the same bits again.
//!
//! Versions of a row: Redis runs one command at a time, so one `EMBER.POOL` reads every block it
//! names at one instant. A bag's rows on a node are all in one call (calls are split by table and
//! node, never inside a bag), so a row that appears twice in a bag is read once at one version,
//! and a cached row (the tier's) is never also read from the node within the same bag (the tier
//! pools a row either from its cache or remotely for the whole batch).

use super::pool_jobs::{NO_MODULE_RETRY, NodePoolStats, PoolJob, PoolRemote};
use super::store::RedisStore;
use crate::storage::{RowRequest, RowStore};
use ember_embed::{EmbedError, Result};
use ember_pool_command::{self as pooled, CallBuilder, sum_rows};
use ember_redis::Value;
use ember_redis::{Ops, Reply};
use ember_registry::store_error;
use std::time::Instant;

/// One `EMBER.POOL` being built: job `job`'s rows on node `node`, the job's bags it has rows of,
/// and for the plain path the ids and weights again.
#[derive(Debug, Default)]
struct NodeCall {
    job: usize,
    node: usize,
    /// The lowest slot its blocks hash to: the order calls are added in.
    first_slot: u16,
    call: CallBuilder,
    /// The job's bag of each of the call's bags.
    bags: Vec<u32>,
    /// Per row: id and weight (to read it whole instead).
    ids: Vec<u32>,
    weights: Vec<f32>,
    /// How this call's share is had: on the node, or read whole.
    plain: bool,
}

/// One [`RemoteStore::pool`] call as it runs: its jobs, the node calls planned for them, when it
/// started (its deadline counts from there), the partial sums the nodes answered (back to back),
/// and its counters.
struct PoolCall<'a> {
    jobs: &'a [PoolJob],
    calls: Vec<NodeCall>,
    t0: Instant,
    arena: Vec<u8>,
    stats: NodePoolStats,
}

/// Where each call's share came from: `Some((at, len))` of the partial sums' arena (pooled on
/// the node), or `None` (read whole).
type Shares = Vec<Option<(usize, usize)>>;

/// The rows read whole for the calls that were: distinct rows back to back, and per call, per
/// row of the call, its index among them.
#[derive(Debug, Default)]
struct Plain {
    rows: Vec<u8>,
    index: Vec<Vec<u32>>,
    /// Each distinct row's byte offset.
    at: Vec<usize>,
    /// (table, row) -> its index among the distinct rows.
    seen: std::collections::HashMap<(usize, u32), u32>,
}

impl Plain {
    /// Adds the rows of the calls `which` picks (each distinct row once, over every call added
    /// so far) and returns the requests of the rows new to it, tagged with their byte offsets.
    fn add_calls(
        &mut self,
        jobs: &[PoolJob],
        calls: &[NodeCall],
        which: impl Fn(usize) -> bool,
    ) -> Vec<RowRequest> {
        self.index.resize(calls.len(), Vec::new());
        let mut reqs = Vec::new();
        for (c, nc) in calls.iter().enumerate().filter(|&(c, _)| which(c)) {
            let job = &jobs[nc.job];
            let rb = job.dtype.row_bytes(job.dim);
            for &id in &nc.ids {
                let next = self.at.len() as u32;
                let u = *self.seen.entry((job.table, id)).or_insert(next);
                if u == next {
                    let at = self.rows.len();
                    self.at.push(at);
                    self.rows.resize(at + rb, 0);
                    reqs.push(RowRequest {
                        table: job.table,
                        row: id as usize,
                        tag: at,
                    });
                }
                self.index[c].push(u);
            }
        }
        reqs
    }
}

impl RedisStore {
    /// Pools batches' misses on the nodes as `mode` says (off until called). With
    /// [`PoolRemote::On`], fails unless every primary has the module's command. With
    /// [`PoolRemote::Auto`], pooling stays off when no primary has it now (rows read whole and
    /// admitted to the cache, as before the module; a server restarted after the module is
    /// loaded pools), and is on when some have it (the others' rows read whole).
    pub fn set_pooling(&mut self, mode: PoolRemote) -> Result<()> {
        if mode == PoolRemote::Off {
            self.pooling = mode;
            return Ok(());
        }
        let asked = self.primaries_without_module();
        if let Ok((n, _)) = &asked {
            self.primaries = (*n).max(1);
        }
        if mode == PoolRemote::Auto {
            // A node that cannot be asked now is asked by the batches themselves.
            let none = matches!(&asked, Ok((n, l)) if l.len() == *n);
            self.pooling = if none {
                PoolRemote::Off
            } else {
                PoolRemote::Auto
            };
            return Ok(());
        }
        let (_, lacking) = asked?;
        if !lacking.is_empty() {
            return Err(EmbedError::RemoteStore {
                model: self.model.clone(),
                version: self.version,
                reason: format!(
                    "pool_remote is \"on\" but {} of the cluster's primaries have no {} ({}): load the module (redis-server --loadmodule libember_redis_module.so) or set pool_remote to \"auto\"",
                    lacking.len(),
                    pooled::COMMAND,
                    lacking.join(", ")
                ),
            });
        }
        self.pooling = mode;
        Ok(())
    }

    /// The primaries holding the tables' blocks, asked `COMMAND INFO EMBER.POOL` through the
    /// cluster's own calls (one per primary, routed by a slot it serves): how many were asked,
    /// and the addresses of those that do not know the command.
    pub fn primaries_without_module(&mut self) -> Result<(usize, Vec<String>)> {
        let mut ops = Ops::default();
        let mut nodes = Vec::new();
        let args: [&[u8]; 3] = [b"COMMAND", b"INFO", pooled::COMMAND.as_bytes()];
        for slot in self.block_slots() {
            if let Some(n) = self.cluster.primary_of(slot)
                && !nodes.contains(&n)
            {
                nodes.push(n);
                ops.command(slot, &args);
            }
        }
        let deadline = Instant::now() + ember_redis::SETUP_TIMEOUT;
        let replies = self
            .cluster
            .run(&ops, false, deadline)
            .map_err(store_error)?;
        let lacking = nodes
            .iter()
            .zip(&replies)
            .filter(|(_, v)| {
                !matches!(v, Value::Array(a) if a.first().is_some_and(|x| *x != Value::Nil))
            })
            .map(|(&n, _)| self.cluster.node_addr(n).to_string())
            .collect();
        Ok((nodes.len(), lacking))
    }

    /// The sums of `jobs`' bags (`sums[j]`: job `j`'s bags x dim, overwritten): each node sums
    /// its rows of each bag (`EMBER.POOL`), and the partial sums are added in a fixed order (see
    /// the module documentation). A node without the module, that no longer holds a block, or
    /// whose share costs fewer bytes as rows (bags of one row, a batch that repeats rows) has
    /// its rows read whole (each once) and summed here; a failure of the cluster (a deadline
    /// passed, a node down past its retries) fails the call, as a read would.
    pub fn pool(
        &mut self,
        jobs: &[PoolJob],
        sums: &mut [Vec<f32>],
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<NodePoolStats> {
        let t0 = Instant::now();
        let mut pc = PoolCall {
            jobs,
            calls: self.plan_calls(jobs, t0),
            t0,
            arena: Vec::new(),
            stats: NodePoolStats::default(),
        };
        // The rows read whole that are known now (shares planned so, and the caller's) go in
        // the same pipelines as the module's calls: one round trip per node.
        let mut plain = Plain::default();
        let planned: Vec<bool> = pc.calls.iter().map(|nc| nc.plain).collect();
        let mut own = plain.add_calls(jobs, &pc.calls, |c| planned[c]);
        let shares = self.send_calls(&mut pc, &mut own, &mut plain.rows, reqs, land)?;
        // Shares the nodes refused: read now.
        let calls = &pc.calls;
        let mut late = plain.add_calls(jobs, calls, |c| calls[c].plain && !planned[c]);
        self.read_rows(&mut late, &mut plain.rows, &mut pc.stats)?;
        add_shares(jobs, &pc.calls, &shares, &pc.arena, &plain, sums);
        pc.stats.io.wait = t0.elapsed();
        self.metrics
            .fetch_seconds
            .record(pc.stats.io.wait.as_secs_f64());
        Ok(pc.stats)
    }

    /// Reads `reqs` (tagged with their byte offsets in `rows`) into `rows`.
    fn read_rows(
        &mut self,
        reqs: &mut [RowRequest],
        rows: &mut [u8],
        stats: &mut NodePoolStats,
    ) -> Result<()> {
        if reqs.is_empty() {
            return Ok(());
        }
        let io = self.read(reqs, &mut |r, row| {
            rows[r.tag..r.tag + row.len()].copy_from_slice(row);
        })?;
        stats.io.reads += io.reads;
        stats.io.bytes += io.bytes;
        stats.plain_rows += reqs.len() as u64;
        Ok(())
    }

    /// Sends, one pipeline per node within the deadline from the call's start: the calls not
    /// marked plain (each answer's sums appended to the call's arena), the `GETRANGE`s of `own`
    /// (rows of shares read whole, into `plain`) and of `reqs` (the caller's rows, handed to
    /// `land` once every reply is checked). A call the node refused (no module, a block not
    /// there) is marked plain; an answer of any other kind fails the whole call. Rows whose
    /// replies are not rows of their length are read again through `read` (its own checks and
    /// errors).
    fn send_calls(
        &mut self,
        pc: &mut PoolCall<'_>,
        own: &mut [RowRequest],
        plain: &mut [u8],
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<Shares> {
        let mut ops = ember_redis::Ops::default();
        ops.errors_as_replies();
        let mut sent = Vec::new();
        let name = pooled::COMMAND.as_bytes();
        for (c, nc) in pc.calls.iter().enumerate().filter(|(_, nc)| !nc.plain) {
            let job = &pc.jobs[nc.job];
            let t = self.table(job.table);
            let (dim, rpb) = (job.dim.to_string(), t.rows_per_block.to_string());
            let mut args = vec![name];
            args.extend(
                nc.call
                    .args(t.prefix(), job.dtype.name(), &dim, &rpb, job.weighted),
            );
            ops.command(nc.first_slot, &args);
            sent.push(c);
        }
        for r in own.iter().chain(reqs.iter()) {
            self.push_getrange(&mut ops, r);
        }
        let mut shares: Shares = vec![None; pc.calls.len()];
        if ops.is_empty() {
            return Ok(shares);
        }
        let deadline = pc.t0 + self.cluster().options().timeout;
        let mut replies = ember_redis::Replies::default();
        let before = self.cluster().round_trips();
        self.cluster_mut()
            .run_into(&ops, true, deadline, &mut replies)
            .map_err(store_error)?;
        let stats = &mut pc.stats;
        stats.io.reads += self.cluster().round_trips() - before;
        for (i, &c) in sent.iter().enumerate() {
            self.take_share(pc, c, replies.get(i), &mut shares)?;
        }
        let stats = &mut pc.stats;
        // The rows: every reply a row of its length, else all read again through `read`.
        let at = sent.len();
        let whole = |k: usize, r: &RowRequest| matches!(replies.get(at + k), Reply::Bulk(b) if b.len() == self.row_bytes(r.table));
        let all = own.iter().chain(reqs.iter());
        if all.enumerate().all(|(k, r)| whole(k, r)) {
            for (k, r) in own.iter().enumerate() {
                if let Reply::Bulk(b) = replies.get(at + k) {
                    plain[r.tag..r.tag + b.len()].copy_from_slice(b);
                    stats.io.bytes += b.len() as u64;
                }
            }
            for (k, r) in reqs.iter().enumerate() {
                if let Reply::Bulk(b) = replies.get(at + own.len() + k) {
                    land(r, b);
                    stats.io.bytes += b.len() as u64;
                }
            }
            stats.plain_rows += own.len() as u64;
        } else {
            self.read_rows(own, plain, stats)?;
            let io = self.read(reqs, land)?;
            stats.io.reads += io.reads;
            stats.io.bytes += io.bytes;
        }
        Ok(shares)
    }

    /// Call `c`'s answer `reply`: its sums into the call's arena (and `shares`), or the call
    /// marked plain where the node refused it, or the error of an answer of any other kind.
    fn take_share(
        &mut self,
        pc: &mut PoolCall<'_>,
        c: usize,
        reply: Reply<'_>,
        shares: &mut Shares,
    ) -> Result<()> {
        let PoolCall {
            jobs,
            calls,
            arena,
            stats,
            ..
        } = pc;
        let nc = &mut calls[c];
        let want = nc.bags.len() * jobs[nc.job].dim * 4;
        match reply {
            Reply::Bulk(b) if b.len() == want => {
                shares[c] = Some((arena.len(), b.len()));
                arena.extend_from_slice(b);
                stats.io.bytes += b.len() as u64;
                stats.pooled_rows += nc.ids.len() as u64;
            }
            Reply::Other(Value::ServerError(e)) => {
                let no_module = pooled::not_run_by_the_node(e.code());
                if no_module {
                    self.no_module_until(nc.node, Instant::now() + NO_MODULE_RETRY);
                } else {
                    // A block not where the map says: re-read the map for the next call.
                    self.cluster_mut().mark_stale();
                }
                match no_module {
                    true => self.metrics.plain_no_module.increment(1),
                    false => self.metrics.plain_refused.increment(1),
                }
                nc.plain = true;
            }
            other => {
                return Err(EmbedError::StoreUnavailable {
                    store: self.cluster().name().to_string(),
                    kind: "server",
                    node: self.cluster().node_addr(nc.node).to_string(),
                    detail: format!(
                        "answered {other:?} to {}, expected {want} bytes of sums",
                        pooled::COMMAND
                    ),
                });
            }
        }
        Ok(())
    }

    /// Splits `jobs` into calls, one per (job, node), in the order their sums are added (job,
    /// then lowest slot); nodes known to lack the module (or a slot no node serves, by the map
    /// known now) are marked to be read whole.
    fn plan_calls(&mut self, jobs: &[PoolJob], now: Instant) -> Vec<NodeCall> {
        let mut calls: Vec<NodeCall> = Vec::new();
        let mut touched: Vec<usize> = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            let first = calls.len();
            let rpb = self.table(job.table).rows_per_block;
            let mut k = 0usize;
            for (b, &n) in job.bags.iter().enumerate() {
                touched.clear();
                for _ in 0..n {
                    let id = job.ids[k];
                    let w = job.weighted.then(|| job.weights[k]);
                    k += 1;
                    let block = id as usize / rpb;
                    let slot = self.table(job.table).slot(block);
                    // A slot no node serves by the known map: usize::MAX, read whole.
                    let node = self.cluster().primary_of(slot).unwrap_or(usize::MAX);
                    let c = match calls[first..].iter().position(|nc| nc.node == node) {
                        Some(p) => first + p,
                        None => {
                            calls.push(NodeCall {
                                job: j,
                                node,
                                first_slot: slot,
                                plain: node == usize::MAX || self.lacks_module(node, now),
                                ..NodeCall::default()
                            });
                            calls.len() - 1
                        }
                    };
                    let nc = &mut calls[c];
                    nc.first_slot = nc.first_slot.min(slot);
                    nc.call.row(block as u32, (id as usize % rpb) as u32, w);
                    nc.ids.push(id);
                    if let Some(w) = w {
                        nc.weights.push(w);
                    }
                    if !touched.contains(&c) {
                        touched.push(c);
                    }
                }
                for &c in &touched {
                    calls[c].call.end_bag();
                    calls[c].bags.push(b as u32);
                }
            }
            calls[first..].sort_by_key(|nc| nc.first_slot);
            // A share that costs fewer bytes as its distinct rows than as its partial sums (bags
            // of one row, rows repeated across the batch's bags) is read whole.
            let rb = job.dtype.row_bytes(job.dim);
            for nc in &mut calls[first..] {
                let mut distinct = nc.ids.clone();
                distinct.sort_unstable();
                distinct.dedup();
                if distinct.len() * rb <= nc.bags.len() * job.dim * 4 {
                    nc.plain = true;
                }
            }
        }
        calls
    }
}

/// `sums` = each job's bags, zeroed, plus every call's share (from the arena, or summed here
/// from the rows read whole), calls in their fixed order.
fn add_shares(
    jobs: &[PoolJob],
    calls: &[NodeCall],
    shares: &Shares,
    arena: &[u8],
    plain: &Plain,
    sums: &mut [Vec<f32>],
) {
    for (j, job) in jobs.iter().enumerate() {
        sums[j].clear();
        sums[j].resize(job.bags.len() * job.dim, 0.0);
    }
    let mut share = Vec::new();
    let mut scratch = Vec::new();
    for (c, nc) in calls.iter().enumerate() {
        let job = &jobs[nc.job];
        let dim = job.dim;
        match shares[c] {
            Some((at, len)) => {
                share.clear();
                share.extend(
                    arena[at..at + len]
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
            }
            None => {
                let rb = job.dtype.row_bytes(dim);
                let index = &plain.index[c];
                let weights = job.weighted.then_some(&nc.weights[..]);
                let bags = nc.call.bag_counts();
                sum_rows(
                    job.dtype,
                    dim,
                    &bags,
                    weights,
                    &mut share,
                    &mut scratch,
                    |k| {
                        let at = plain.at[index[k] as usize];
                        &plain.rows[at..at + rb]
                    },
                );
            }
        }
        let out = &mut sums[nc.job];
        for (k, &b) in nc.bags.iter().enumerate() {
            let dst = &mut out[b as usize * dim..(b as usize + 1) * dim];
            for (d, &x) in dst.iter_mut().zip(&share[k * dim..(k + 1) * dim]) {
                *d += x;
            }
        }
    }
}
