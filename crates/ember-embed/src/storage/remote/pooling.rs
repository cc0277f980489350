//! The client's side of pooling next to the rows: [`RedisStore::pool`] sends each node one
//! `EMBER.POOL` per table of a batch (`pooled.rs` defines the command) and adds the nodes'
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

use super::pooled::{self, CallBuilder};
use super::store::RedisStore;
use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use crate::storage::{ReadStats, RowRequest, RowStore};
use ember_redis::Reply;
use redis::Value;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Whether a remote store pools a batch's misses on the nodes (`"pool_remote"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolRemote {
    /// Where the nodes have the module (`EMBER.POOL`); rows of the others are read whole.
    #[default]
    Auto,
    /// Like `auto`, and a server refuses to start when a primary lacks the module.
    On,
    /// Never: every missing row is read whole (Ember before the module).
    Off,
}

impl PoolRemote {
    pub fn name(self) -> &'static str {
        match self {
            PoolRemote::Auto => "auto",
            PoolRemote::On => "on",
            PoolRemote::Off => "off",
        }
    }
}

impl FromStr for PoolRemote {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(PoolRemote::Auto),
            "on" | "true" => Ok(PoolRemote::On),
            "off" | "false" => Ok(PoolRemote::Off),
            _ => Err(format!("'{s}' is not auto, on or off")),
        }
    }
}

impl std::fmt::Display for PoolRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One table's rows of a batch to pool: the bags, each a run of `ids` (and `weights`, one per
/// id, when `weighted`), in the caller's order.
#[derive(Debug, Clone)]
pub struct PoolJob {
    /// The table, as an index into the tables the store was opened with.
    pub table: usize,
    pub dtype: DType,
    pub dim: usize,
    pub weighted: bool,
    /// Ids per bag.
    pub bags: Vec<u32>,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

impl PoolJob {
    pub fn clear(&mut self) {
        self.bags.clear();
        self.ids.clear();
        self.weights.clear();
    }
}

/// What a pooling call did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolStats {
    /// Round trips and bytes received (partial sums, and rows read whole), and the wait.
    pub io: ReadStats,
    /// Rows summed on the nodes, and rows read whole instead (no module, a moved block).
    pub pooled_rows: u64,
    pub plain_rows: u64,
}

/// How long a node that answered it has no `EMBER.POOL` is read with plain reads before it is
/// asked again (a rolling upgrade loads the module node by node).
pub const NO_MODULE_RETRY: Duration = Duration::from_secs(10);

/// The sums of `jobs`' bags (`sums[j]`: job `j`'s bags x dim, overwritten) from rows read whole
/// through `store` and summed in bag order by the module's own code: the path of a store
/// without the module (or a local copy).
pub fn pool_by_reads<S: RowStore + ?Sized>(
    store: &mut S,
    jobs: &[PoolJob],
    sums: &mut [Vec<f32>],
) -> Result<PoolStats> {
    let mut reqs = Vec::new();
    let mut at = Vec::with_capacity(jobs.len());
    let mut bytes = 0usize;
    for (j, job) in jobs.iter().enumerate() {
        at.push(bytes);
        let rb = job.dtype.row_bytes(job.dim);
        for (k, &id) in job.ids.iter().enumerate() {
            reqs.push(RowRequest {
                table: job.table,
                row: id as usize,
                tag: bytes + k * rb,
            });
        }
        bytes += job.ids.len() * rb;
        let _ = j;
    }
    let mut rows = vec![0u8; bytes];
    let io = store.read(&mut reqs, &mut |r, row| {
        rows[r.tag..r.tag + row.len()].copy_from_slice(row);
    })?;
    let mut scratch = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let rb = job.dtype.row_bytes(job.dim);
        let base = at[j];
        sum_rows(job, sums, j, &mut scratch, |k| {
            &rows[base + k * rb..base + (k + 1) * rb]
        });
    }
    Ok(PoolStats {
        io,
        pooled_rows: 0,
        plain_rows: reqs.len() as u64,
    })
}

/// `sums[j]` = each bag of `job` summed in order over `row(k)` (its `k`-th id's row).
fn sum_rows<'r>(
    job: &PoolJob,
    sums: &mut [Vec<f32>],
    j: usize,
    scratch: &mut Vec<f32>,
    row: impl Fn(usize) -> &'r [u8],
) {
    let dim = job.dim;
    let out = &mut sums[j];
    out.clear();
    out.resize(job.bags.len() * dim, 0.0);
    scratch.resize(dim, 0.0);
    let mut k = 0;
    for (b, &n) in job.bags.iter().enumerate() {
        let acc = &mut out[b * dim..(b + 1) * dim];
        for _ in 0..n {
            let w = if job.weighted { job.weights[k] } else { 1.0 };
            pooled::add_row(job.dtype, row(k), w, acc, scratch);
            k += 1;
        }
    }
}

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

impl RedisStore {
    /// The sums of `jobs`' bags (`sums[j]`: job `j`'s bags x dim, overwritten): each node sums
    /// its rows of each bag (`EMBER.POOL`), and the partial sums are added in a fixed order (see
    /// the module documentation). A node without the module, or that no longer holds a block,
    /// has its rows read whole and summed here; a failure of the cluster (a deadline passed, a
    /// node down past its retries) fails the call, as a read would.
    pub fn pool(&mut self, jobs: &[PoolJob], sums: &mut [Vec<f32>]) -> Result<PoolStats> {
        let t0 = Instant::now();
        let mut calls = self.plan_calls(jobs, t0);
        let mut stats = PoolStats::default();
        // The module's calls, one pipeline per node.
        let mut ops = ember_redis::Ops::default();
        ops.errors_as_replies();
        let mut sent = Vec::new();
        let name = pooled::COMMAND.as_bytes();
        for (c, nc) in calls.iter().enumerate().filter(|(_, nc)| !nc.plain) {
            let job = &jobs[nc.job];
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
        let deadline = t0 + self.cluster().options().timeout;
        let mut replies = ember_redis::Replies::default();
        if !sent.is_empty() {
            let before = self.cluster().round_trips();
            self.cluster_mut()
                .run_into(&ops, true, deadline, &mut replies)?;
            stats.io.reads += self.cluster().round_trips() - before;
        }
        // Each call's answer checked: a share the node could not sum is read whole below.
        let mut partial: Vec<Option<(usize, usize)>> = vec![None; calls.len()];
        let mut arena: Vec<u8> = Vec::new();
        for (i, &c) in sent.iter().enumerate() {
            let nc = &mut calls[c];
            let want = nc.bags.len() * jobs[nc.job].dim * 4;
            match replies.get(i) {
                Reply::Bulk(b) if b.len() == want => {
                    partial[c] = Some((arena.len(), b.len()));
                    arena.extend_from_slice(b);
                    stats.io.bytes += b.len() as u64;
                    stats.pooled_rows += nc.ids.len() as u64;
                }
                Reply::Other(Value::ServerError(e)) => {
                    let text = e.to_string();
                    if text.contains("unknown command") {
                        let until = Instant::now() + NO_MODULE_RETRY;
                        self.no_module_until(nc.node, until);
                    } else {
                        // A block not where the map says: re-read the map for the next call.
                        self.cluster_mut().mark_stale();
                    }
                    metrics::counter!("ember_remote_pool_plain_total", "model" => self.model().to_string(), "why" => if text.contains("unknown command") { "no_module" } else { "refused" })
                        .increment(1);
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
        }
        // Shares read whole: one read of every such row.
        let plain: Vec<usize> = (0..calls.len()).filter(|&c| calls[c].plain).collect();
        let mut plain_rows: Vec<u8> = Vec::new();
        let mut plain_at = vec![0usize; calls.len()];
        if !plain.is_empty() {
            let mut reqs = Vec::new();
            let mut bytes = 0usize;
            for &c in &plain {
                let nc = &calls[c];
                let job = &jobs[nc.job];
                let rb = job.dtype.row_bytes(job.dim);
                plain_at[c] = bytes;
                for (k, &id) in nc.ids.iter().enumerate() {
                    reqs.push(RowRequest {
                        table: job.table,
                        row: id as usize,
                        tag: bytes + k * rb,
                    });
                }
                bytes += nc.ids.len() * rb;
            }
            plain_rows.resize(bytes, 0);
            let io = self.read(&mut reqs, &mut |r, row| {
                plain_rows[r.tag..r.tag + row.len()].copy_from_slice(row);
            })?;
            stats.io.reads += io.reads;
            stats.io.bytes += io.bytes;
            stats.plain_rows += reqs.len() as u64;
        }
        // The sums, in the fixed order.
        for (j, job) in jobs.iter().enumerate() {
            sums[j].clear();
            sums[j].resize(job.bags.len() * job.dim, 0.0);
        }
        let mut share = Vec::new();
        let mut scratch = Vec::new();
        for (c, nc) in calls.iter().enumerate() {
            let job = &jobs[nc.job];
            let dim = job.dim;
            let from: &[f32] = match partial[c] {
                Some((at, len)) => {
                    share.clear();
                    share.extend(
                        arena[at..at + len]
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    );
                    &share
                }
                None => {
                    let rb = job.dtype.row_bytes(dim);
                    let base = plain_at[c];
                    let sub = PoolJob {
                        table: job.table,
                        dtype: job.dtype,
                        dim,
                        weighted: job.weighted,
                        bags: nc.call.bag_counts(),
                        ids: Vec::new(),
                        weights: nc.weights.clone(),
                    };
                    let mut one = [std::mem::take(&mut share)];
                    sum_rows(&sub, &mut one, 0, &mut scratch, |k| {
                        &plain_rows[base + k * rb..base + (k + 1) * rb]
                    });
                    share = std::mem::take(&mut one[0]);
                    &share
                }
            };
            let out = &mut sums[nc.job];
            for (k, &b) in nc.bags.iter().enumerate() {
                let dst = &mut out[b as usize * dim..(b as usize + 1) * dim];
                for (d, &x) in dst.iter_mut().zip(&from[k * dim..(k + 1) * dim]) {
                    *d += x;
                }
            }
        }
        stats.io.wait = t0.elapsed();
        metrics::histogram!("ember_remote_fetch_seconds", "model" => self.model().to_string())
            .record(stats.io.wait.as_secs_f64());
        Ok(stats)
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
        }
        calls
    }
}
