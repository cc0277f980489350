//! The seam's view of a model's tier, as a server needs it: whether any table is on the SSD or
//! remote tier, the tier's counters, and the health of its remote store. A server publishes
//! these (metrics, readiness) and probes the store through [`Model::tier`]; it sees no type of
//! the embedding stage.
//!
//! Each call reads the stager's counters when it is made (a snapshot): [`Tier::counters`]
//! without a lock, [`Tier::probe_store`] and [`Tier::store_nodes`] under the lock the next
//! batch's fetch takes, so a server calls those off its request path (every second, at a
//! scrape), not per batch.

use std::collections::HashMap;
use std::time::Duration;

use ember_tier::Stager;

use crate::error::Result;
use crate::model::Model;

/// A model's SSD / remote tier, borrowed from the model ([`Model::tier`]).
#[derive(Debug, Clone, Copy)]
pub struct Tier<'a> {
    stager: &'a Stager,
}

/// The tier's counters since the model was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TierCounters {
    /// Distinct (feature, id) lookups per batch the row cache answered.
    pub hits: u64,
    /// Distinct (feature, id) lookups per batch asked of the row cache.
    pub lookups: u64,
    /// `hits / lookups` (1 when nothing was looked up).
    pub hit_ratio: f64,
    /// Bytes read from the tier's stores: whole blocks of row files, rows of a remote store.
    pub bytes_read: u64,
    /// Requests to the stores: merged block reads of row files, round trips to a remote store.
    pub reads: u64,
    /// Time batches waited for their rows.
    pub stall: Duration,
    /// Bytes of rows the cache holds now.
    pub cache_bytes: u64,
}

/// One node of a remote store: what it answered and how it failed, since the model was loaded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreNode {
    /// The node's address.
    pub node: String,
    /// Rows it answered (one command each).
    pub rows: u64,
    /// Bytes of the rows it answered.
    pub bytes: u64,
    /// Round trips to it (one pipeline each).
    pub round_trips: u64,
    /// Failures by kind (`connect`, `timeout`, `moved`, `redirect`, `server`).
    pub errors: HashMap<&'static str, u64>,
}

impl Model {
    /// The model's tier: its counters and the health of its remote store (see [`Tier`]).
    pub fn tier(&self) -> Tier<'_> {
        Tier {
            stager: self.stager(),
        }
    }
}

impl<'a> Tier<'a> {
    /// The tier of a model whose tables `stager` stages (either family).
    pub(crate) fn of(stager: &'a Stager) -> Tier<'a> {
        Tier { stager }
    }
}

impl Tier<'_> {
    /// Whether any table is on the tier (without one, every counter stays zero).
    pub fn is_active(&self) -> bool {
        self.stager.is_active()
    }

    /// The counters so far.
    pub fn counters(&self) -> TierCounters {
        let s = self.stager.stats();
        TierCounters {
            hits: s.hits,
            lookups: s.cache_lookups,
            hit_ratio: s.hit_rate(),
            bytes_read: s.store_bytes_read,
            reads: s.store_reads,
            stall: s.stall,
            cache_bytes: self.stager.cache_usage().0 as u64,
        }
    }

    /// The share of staging time hidden behind compute: `1 - stall / stage`, in [0, 1].
    pub fn overlap(&self) -> f64 {
        self.stager.stats().overlap()
    }

    /// The I/O engine reading the SSD tier, where one does.
    pub fn engine(&self) -> Option<&'static str> {
        self.stager.engine()
    }

    /// Counts `d` as time a forward pass waited for its batch's tier rows (a pipeline that
    /// prepares batches ahead, [`crate::run_ahead`]).
    pub fn record_stall(&self, d: std::time::Duration) {
        self.stager.add_stall(d);
    }

    /// Rows the row cache holds now.
    pub fn cache_rows(&self) -> u64 {
        self.stager.cache_usage().1 as u64
    }

    /// Whether a table is read from a remote store.
    pub fn has_remote(&self) -> bool {
        self.stager.has_remote()
    }

    /// Whether the stores answered the last batch or probe (always true without a remote one):
    /// while false, the model cannot take requests.
    pub fn store_healthy(&self) -> bool {
        self.stager.store_healthy()
    }

    /// Asks the remote store whether it answers now (local row files always do), and records
    /// the answer for [`Tier::store_healthy`].
    pub fn probe_store(&self) -> Result<()> {
        Ok(self.stager.probe_stores()?)
    }

    /// The remote stores' counters, per node (none without a remote store).
    pub fn store_nodes(&self) -> Vec<StoreNode> {
        self.stager
            .remote_nodes()
            .into_iter()
            .map(|n| StoreNode {
                node: n.node,
                rows: n.commands,
                bytes: n.bytes,
                round_trips: n.round_trips,
                errors: n.errors,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::presets::preset;
    use crate::{DType, Model, TierCounters};

    #[test]
    fn a_model_without_a_tier_has_an_idle_tier_and_a_healthy_store() {
        let p = preset("small", DType::F32).unwrap();
        let m = Model::random(p.config, 7, 1).unwrap();
        let tier = m.tier();
        assert!(!tier.is_active());
        assert!(!tier.has_remote());
        assert!(tier.store_healthy());
        assert!(tier.probe_store().is_ok());
        assert!(tier.store_nodes().is_empty());
        let want = TierCounters {
            hit_ratio: 1.0,
            ..TierCounters::default()
        };
        assert_eq!(tier.counters(), want);
        assert!(m.inputs().narrow_ids);
    }
}
