//! [`RedisStore`]: the [`RowStore`] of tables placed `remote`. A batch's missing rows become one
//! `GETRANGE` each, sent as one pipeline per node (all nodes in parallel, [`Cluster::run`]);
//! every reply is checked for its length before any row lands.
//!
//! [`RemoteRows`]: what the tier asks of a store that reads over the network, on top of
//! [`RowStore`] (whether it answers, its nodes' counters, the row updates it is told of).
//! `RedisStore` and its local-copy fallback ([`super::WithLocalCopy`]) implement it.

use super::metrics::StoreMetrics;
use super::pool_jobs::{NodePoolStats, PoolJob, PoolRemote, pool_then_read};
use crate::storage::{ReadStats, RowRequest, RowStore};
use ember_embed::DType;
use ember_embed::{EmbedError, Result};
use ember_redis::Value;
use ember_redis::ops::{self, Ops};
use ember_redis::slot::key_slot;
use ember_redis::{Cluster, ClusterOptions, NodeStats, Replies, Reply};
use ember_registry::layout::{self, block_prefix};
use ember_registry::store_error;
use ember_registry::{ManifestTable, read_manifest, resolve_version, updated_set};
use std::collections::BTreeSet;
use std::time::Instant;

/// A [`RowStore`] that reads over the network: its failed reads are the store being unavailable
/// (`EmbedError::StoreUnavailable`), which the tier reports as its health, and it may hold a copy
/// of its rows that the row updates it follows must keep honest. The tier makes these calls on
/// its remote stores only; a local backend implements [`RowStore`] alone.
pub trait RemoteRows: RowStore {
    /// Whether the store answers now (its nodes, within the read deadline).
    fn probe(&mut self) -> Result<()>;
    /// Counters per node.
    fn node_stats(&self) -> Vec<NodeStats>;
    /// Rows `ids` of `table` were updated in the store to `rows` (read from its update
    /// stream). A store that also holds a copy of its rows keeps them; others ignore it.
    fn updated(&mut self, _table: usize, _ids: &[u64], _rows: &[u8]) {}
    /// Rows of `table` were updated in the store and this server cannot tell which (`why`):
    /// a store that also holds a copy of its rows stops serving that table from it; others
    /// ignore it.
    fn missed_updates(&mut self, _table: usize, _why: &str) {}
    /// Whether the tier should pool its misses with [`RemoteRows::pool`] (`pool_remote` is not
    /// off).
    fn pools(&self) -> bool {
        false
    }
    /// The nodes a table's rows spread over (the primaries): a bag's partial sums are at most
    /// this many.
    fn pool_nodes(&self) -> usize {
        1
    }
    /// The sums of `jobs`' bags (`sums[j]`: job `j`'s bags x dim, overwritten), pooled where the
    /// rows are where the store can (`pooling.rs`); and the rows `reqs` read whole and handed to
    /// `land` (a batch's other misses, in the same round trip where the store can). By default
    /// both from rows read whole.
    fn pool(
        &mut self,
        jobs: &[PoolJob],
        sums: &mut [Vec<f32>],
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<NodePoolStats> {
        pool_then_read(self, jobs, sums, reqs, land)
    }
}

/// Where a model's remote tables are: the cluster, the model's name in it, and the version
/// (`None`: the newest `ready` one at start).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSource {
    pub cluster: ClusterOptions,
    pub model: String,
    pub version: Option<u64>,
}

/// A table a store is opened for: its name and shape, as the model's config gives them.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTableSpec {
    pub name: String,
    pub rows: usize,
    pub dim: usize,
    pub dtype: DType,
}

#[derive(Debug)]
pub(super) struct StoreTable {
    name: String,
    /// Its blocks' key prefix (append the block number).
    prefix: Vec<u8>,
    row_bytes: usize,
    pub(super) rows_per_block: usize,
    /// Per block: the packed head of its `GETRANGE` (`heads[ends[b - 1]..ends[b]]`) and its
    /// key's slot, computed once (the key's CRC-16 was a seventh of a fetch's CPU time).
    heads: Vec<u8>,
    ends: Vec<usize>,
    slots: Vec<u16>,
}

impl StoreTable {
    fn new(
        name: &str,
        prefix: String,
        row_bytes: usize,
        rows_per_block: usize,
        blocks: usize,
    ) -> Self {
        let mut t = StoreTable {
            name: name.into(),
            prefix: prefix.clone().into_bytes(),
            row_bytes,
            rows_per_block,
            heads: Vec::new(),
            ends: Vec::with_capacity(blocks),
            slots: Vec::with_capacity(blocks),
        };
        let mut key = Vec::new();
        for b in 0..blocks {
            key.clear();
            key.extend_from_slice(prefix.as_bytes());
            key.extend_from_slice(ops::fmt_usize(&mut ops::itoa_buf(), b));
            ops::getrange_head(&key, &mut t.heads);
            t.ends.push(t.heads.len());
            t.slots.push(key_slot(&key));
        }
        t
    }

    /// The `GETRANGE` head and key slot of block `b`.
    fn head(&self, b: usize) -> (&[u8], u16) {
        let start = if b == 0 { 0 } else { self.ends[b - 1] };
        (&self.heads[start..self.ends[b]], self.slots[b])
    }

    /// Block `b`'s key slot.
    pub(super) fn slot(&self, b: usize) -> u16 {
        self.slots[b]
    }

    pub(super) fn prefix(&self) -> &[u8] {
        &self.prefix
    }
}

/// Reads rows of one version of one model from a Redis Cluster (see the module documentation).
#[derive(Debug)]
pub struct RedisStore {
    pub(super) cluster: Cluster,
    pub(super) model: String,
    pub(super) version: u64,
    tables: Vec<StoreTable>,
    ops: Ops,
    /// The last fetch's replies (rows in one arena, reused from batch to batch).
    replies: Replies,
    /// Whether batches' misses are pooled on the nodes (`pooling.rs`).
    pub(super) pooling: PoolRemote,
    /// Per node (the cluster's index): until when it is read whole, having answered that it
    /// has no `EMBER.POOL`.
    no_module: Vec<Option<Instant>>,
    /// The primaries when pooling was set.
    pub(super) primaries: usize,
    pub(super) metrics: StoreMetrics,
}

impl RedisStore {
    /// Connects, resolves the version and checks `tables` against its manifest (same names,
    /// rows, dims and dtypes).
    pub fn open(src: &RemoteSource, tables: &[RemoteTableSpec]) -> Result<Self> {
        layout::check_name("model", &src.model)?;
        let mut cluster = Cluster::connect(src.cluster.for_setup()).map_err(store_error)?;
        let version = resolve_version(&mut cluster, &src.model, src.version)?;
        let manifest = read_manifest(&mut cluster, &src.model, version)?;
        let mut out = Vec::with_capacity(tables.len());
        for t in tables {
            let bad = |reason: String| EmbedError::RemoteStore {
                model: src.model.clone(),
                version,
                reason: format!("table '{}': {reason}", t.name),
            };
            let Some(m) = manifest.table(&t.name) else {
                return Err(bad(format!(
                    "not in the store (it has {})",
                    manifest
                        .tables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            if (m.rows, m.dim, m.dtype) != (t.rows, t.dim, t.dtype) {
                return Err(bad(format!(
                    "the store has {} x {} {}, the model's config says {} x {} {}",
                    m.rows, m.dim, m.dtype, t.rows, t.dim, t.dtype
                )));
            }
            if m.row_bytes != t.dtype.row_bytes(t.dim) || m.rows_per_block == 0 {
                return Err(bad(format!(
                    "its manifest gives {} bytes per row and {} rows per block",
                    m.row_bytes, m.rows_per_block
                )));
            }
            out.push(StoreTable::new(
                &t.name,
                block_prefix(&src.model, version, &t.name),
                m.row_bytes,
                m.rows_per_block,
                m.blocks(),
            ));
        }
        cluster.set_timeout(src.cluster.timeout);
        Ok(RedisStore {
            cluster,
            model: src.model.clone(),
            version,
            tables: out,
            ops: Ops::default(),
            replies: Replies::default(),
            pooling: PoolRemote::Off,
            no_module: Vec::new(),
            primaries: 1,
            metrics: StoreMetrics::new(&src.model),
        })
    }

    /// Whether batches' misses are pooled on the nodes (`Off` when `auto` found no node with
    /// the module).
    pub fn pooling(&self) -> PoolRemote {
        self.pooling
    }

    /// Adds `GETRANGE` of request `r`'s row to `ops`.
    pub(super) fn push_getrange(&self, ops: &mut Ops, r: &RowRequest) {
        let t = &self.tables[r.table];
        let (block, in_block) = (r.row / t.rows_per_block, r.row % t.rows_per_block);
        let (head, slot) = t.head(block);
        let start = in_block * t.row_bytes;
        ops.getrange_with_head(head, slot, start, start + t.row_bytes - 1);
    }

    /// Every block's key slot, table after table.
    pub(super) fn block_slots(&self) -> Vec<u16> {
        self.tables
            .iter()
            .flat_map(|t| t.slots.iter().copied())
            .collect()
    }

    pub(super) fn table(&self, t: usize) -> &StoreTable {
        &self.tables[t]
    }

    pub(super) fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    pub(super) fn no_module_until(&mut self, node: usize, until: Instant) {
        if self.no_module.len() <= node {
            self.no_module.resize(node + 1, None);
        }
        self.no_module[node] = Some(until);
    }

    pub(super) fn lacks_module(&self, node: usize, now: Instant) -> bool {
        self.no_module
            .get(node)
            .copied()
            .flatten()
            .is_some_and(|t| t > now)
    }

    /// Per table: its rows per block and the blocks row updates rewrote since the push (for a
    /// local copy of the pushed rows to know which of its rows the store no longer holds).
    pub fn updated_blocks(&mut self) -> Result<Vec<(usize, BTreeSet<usize>)>> {
        let timeout = self.cluster.options().timeout;
        self.cluster
            .set_timeout(timeout.max(ember_redis::SETUP_TIMEOUT));
        let out = self
            .tables
            .iter()
            .map(|t| {
                updated_set(&mut self.cluster, &self.model, self.version, &t.name)
                    .map(|set| (t.rows_per_block, set))
            })
            .collect();
        self.cluster.set_timeout(timeout);
        out
    }

    /// The version served.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }
}

impl RemoteRows for RedisStore {
    /// Whether the cluster answers: an empty read of one block per table, within the deadline,
    /// which touches the nodes the rows live on.
    fn probe(&mut self) -> Result<()> {
        let mut ops = Ops::default();
        for t in self.tables.iter().filter(|t| !t.slots.is_empty()) {
            let (head, slot) = t.head(0);
            ops.getrange_with_head(head, slot, 0, 0);
        }
        let deadline = Instant::now() + self.cluster.options().timeout;
        self.cluster
            .run(&ops, true, deadline)
            .map_err(store_error)?;
        Ok(())
    }

    fn node_stats(&self) -> Vec<NodeStats> {
        self.cluster.node_stats()
    }

    fn pools(&self) -> bool {
        self.pooling != PoolRemote::Off
    }

    fn pool_nodes(&self) -> usize {
        self.primaries
    }

    fn pool(
        &mut self,
        jobs: &[PoolJob],
        sums: &mut [Vec<f32>],
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<NodePoolStats> {
        RedisStore::pool(self, jobs, sums, reqs, land)
    }
}

impl RowStore for RedisStore {
    fn engine(&self) -> &'static str {
        "redis"
    }

    fn direct(&self) -> bool {
        true
    }

    fn row_bytes(&self, table: usize) -> usize {
        self.tables[table].row_bytes
    }

    fn read(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<ReadStats> {
        if reqs.is_empty() {
            return Ok(ReadStats::default());
        }
        let t0 = Instant::now();
        self.ops.clear();
        for r in reqs.iter() {
            let t = &self.tables[r.table];
            let (block, in_block) = (r.row / t.rows_per_block, r.row % t.rows_per_block);
            let (head, slot) = t.head(block);
            let start = in_block * t.row_bytes;
            self.ops
                .getrange_with_head(head, slot, start, start + t.row_bytes - 1);
        }
        let before = self.cluster.round_trips();
        let deadline = t0 + self.cluster.options().timeout;
        let got = self
            .cluster
            .run_into(&self.ops, true, deadline, &mut self.replies);
        self.metrics
            .fetch_seconds
            .record(t0.elapsed().as_secs_f64());
        got.map_err(store_error)?;
        // Check every reply before landing any row. A row missing from a copy read during a
        // failover (a replica out of sync: seen once under heavy load, cause not pinned down) is
        // read once more from the primaries before it is reported.
        if let Err(e) = self.check(reqs, &self.replies) {
            match Instant::now() < deadline {
                true => self
                    .cluster
                    .run_into(&self.ops, false, deadline, &mut self.replies)
                    .map_err(|_| e)?,
                false => return Err(e),
            }
            self.check(reqs, &self.replies)?;
        }
        let mut bytes = 0u64;
        for (i, r) in reqs.iter().enumerate() {
            if let Reply::Bulk(b) = self.replies.get(i) {
                bytes += b.len() as u64;
                land(r, b);
            }
        }
        let after = self.cluster.round_trips();
        Ok(ReadStats {
            reads: after - before,
            bytes,
            wait: t0.elapsed(),
        })
    }
}

impl RedisStore {
    /// Whether every reply is a row of its exact length; else the error naming the first that
    /// is not.
    fn check(&self, reqs: &[RowRequest], replies: &Replies) -> Result<()> {
        for (r, v) in reqs.iter().zip(replies.iter()) {
            let t = &self.tables[r.table];
            let got = match v {
                Reply::Bulk(b) => b.len(),
                Reply::Other(Value::Nil) => 0,
                other => {
                    return Err(self.row_error(r, format!("the store answered {other:?}")));
                }
            };
            if got != t.row_bytes {
                let reason = match got {
                    0 => "missing in the store (lost with a node, or a partial push?)".to_string(),
                    n => format!(
                        "{n} bytes in the store, expected {} (lost with a node, or a partial push?)",
                        t.row_bytes
                    ),
                };
                return Err(self.row_error(r, reason));
            }
        }
        Ok(())
    }

    fn row_error(&self, r: &RowRequest, reason: String) -> EmbedError {
        EmbedError::RemoteRow {
            model: self.model.clone(),
            version: self.version,
            table: self.tables[r.table].name.clone(),
            row: r.row,
            reason,
        }
    }
}

/// What a table of a manifest looks like as a spec.
impl From<&ManifestTable> for RemoteTableSpec {
    fn from(t: &ManifestTable) -> Self {
        RemoteTableSpec {
            name: t.name.clone(),
            rows: t.rows,
            dim: t.dim,
            dtype: t.dtype,
        }
    }
}
