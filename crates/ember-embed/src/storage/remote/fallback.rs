//! [`WithLocalCopy`]: the store of `remote` tables that also have a local row-file copy
//! (placement `remote` with `fallback_local`). Reads go to the cluster; a read the cluster
//! cannot answer within its deadline (a node down before failover, a paused node, the whole
//! cluster down, a row missing from a partial push) is read from the local copy instead, and
//! for the next `retry_after` every read goes to the copy without trying the cluster, so that an
//! outage costs one deadline per `retry_after`, not one per batch. Then the cluster is tried
//! again, and serving goes back to it by itself once it answers.
//!
//! Sound because a `ready` version's rows never change: the copy holds the same bytes (the
//! store's `push` read them from the same model directory; the row file's header names the
//! table and shape, checked at open, and its blocks are CRC-checked as they are read).
//!
//! [`RedisStore::read`](super::RedisStore) lands no row before every reply is checked, so a
//! failed read landed nothing and all of it is read again from the copy.

use crate::error::{EmbedError, Result};
use crate::storage::{ReadStats, RowRequest, RowStore, remote::NodeStats};
use std::time::{Duration, Instant};

/// A remote store with a local copy of every one of its tables (same table order).
#[derive(Debug)]
pub struct WithLocalCopy {
    remote: Box<dyn RowStore>,
    local: Box<dyn RowStore>,
    retry_after: Duration,
    /// Until then, reads go to the copy without trying the cluster (`None`: the cluster
    /// answered the last read it was given).
    local_until: Option<Instant>,
}

impl WithLocalCopy {
    /// `remote` backed by `local` (the same tables, in the same order); after a failed read
    /// the cluster is left alone for `retry_after`.
    pub fn new(remote: Box<dyn RowStore>, local: Box<dyn RowStore>, retry_after: Duration) -> Self {
        WithLocalCopy {
            remote,
            local,
            retry_after,
            local_until: None,
        }
    }

    /// Reads go to the copy until `until` (`None`: back to the cluster); the gauge follows.
    fn set_local_until(&mut self, until: Option<Instant>) {
        if self.local_until.is_some() != until.is_some() {
            let on = f64::from(u8::from(until.is_some()));
            metrics::gauge!("ember_remote_fallback_active").set(on);
        }
        self.local_until = until;
    }
}

impl RowStore for WithLocalCopy {
    fn engine(&self) -> &'static str {
        self.remote.engine()
    }

    fn direct(&self) -> bool {
        self.remote.direct() && self.local.direct()
    }

    fn row_bytes(&self, table: usize) -> usize {
        self.remote.row_bytes(table)
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
        if self.local_until.is_none_or(|t| t0 >= t) {
            match self.remote.read(reqs, land) {
                Ok(stats) => {
                    self.set_local_until(None);
                    return Ok(stats);
                }
                Err(e) => {
                    let kind = match e {
                        EmbedError::StoreUnavailable { .. } => "unavailable",
                        EmbedError::RemoteRow { .. } => "row",
                        _ => "other",
                    };
                    metrics::counter!("ember_remote_fallback_total", "kind" => kind).increment(1);
                    self.set_local_until(Some(Instant::now() + self.retry_after));
                }
            }
        }
        metrics::counter!("ember_remote_fallback_rows_total").increment(reqs.len() as u64);
        let mut stats = self.local.read(reqs, land)?;
        // The batch waited for the failed remote read too.
        stats.wait = t0.elapsed();
        Ok(stats)
    }

    /// Ready while the copy can be read, whatever the cluster's state.
    fn probe(&mut self) -> Result<()> {
        self.local.probe()
    }

    fn remote(&self) -> bool {
        true
    }

    fn node_stats(&self) -> Vec<NodeStats> {
        self.remote.node_stats()
    }
}
