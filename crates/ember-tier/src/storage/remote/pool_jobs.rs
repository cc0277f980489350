//! What a call pooling on the nodes is, seen from the tier: whether a store pools
//! ([`PoolRemote`]), one table's rows of a batch to pool ([`PoolJob`]), what a call did
//! ([`NodePoolStats`]), and the sums from rows read whole through any [`RowStore`]
//! ([`pool_by_reads`]: a node without the module, or the local copy), summed by the command's own
//! code (`ember_pool_command::sum_rows`) so that the bits do not depend on which side summed.

use crate::storage::{ReadStats, RowRequest, RowStore};
use ember_embed::{DType, Result};
use ember_pool_command::sum_rows;
use std::str::FromStr;
use std::time::Duration;

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
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(PoolRemote::Auto),
            "on" | "true" => Ok(PoolRemote::On),
            "off" | "false" => Ok(PoolRemote::Off),
            _ => Err(crate::UnknownName::new(s, "auto, on or off")),
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

/// What a call pooling on the nodes did (the kernel's own are [`ember_embed::PoolStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodePoolStats {
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
) -> Result<NodePoolStats> {
    let mut reqs = Vec::new();
    let mut at = Vec::with_capacity(jobs.len());
    let mut bytes = 0usize;
    for job in jobs {
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
    }
    let mut rows = vec![0u8; bytes];
    let io = store.read(&mut reqs, &mut |r, row| {
        rows[r.tag..r.tag + row.len()].copy_from_slice(row);
    })?;
    let mut scratch = Vec::new();
    for ((job, &base), out) in jobs.iter().zip(&at).zip(sums.iter_mut()) {
        let rb = job.dtype.row_bytes(job.dim);
        let weights = job.weighted.then_some(&job.weights[..]);
        sum_rows(
            job.dtype,
            job.dim,
            &job.bags,
            weights,
            out,
            &mut scratch,
            |k| &rows[base + k * rb..base + (k + 1) * rb],
        );
    }
    Ok(NodePoolStats {
        io,
        pooled_rows: 0,
        plain_rows: reqs.len() as u64,
    })
}

/// [`pool_by_reads`], then `reqs` read and handed to `land`: a pooling call of a store that
/// cannot do both in one round trip.
pub fn pool_then_read<S: RowStore + ?Sized>(
    store: &mut S,
    jobs: &[PoolJob],
    sums: &mut [Vec<f32>],
    reqs: &mut [RowRequest],
    land: &mut dyn FnMut(&RowRequest, &[u8]),
) -> Result<NodePoolStats> {
    let mut st = pool_by_reads(store, jobs, sums)?;
    let io = store.read(reqs, land)?;
    st.io.reads += io.reads;
    st.io.bytes += io.bytes;
    st.io.wait += io.wait;
    Ok(st)
}
