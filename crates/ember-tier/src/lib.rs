//! Ember's tables beyond memory: a DRAM row cache ([`RowCache`]) in front of a store that fetches
//! rows ([`RowStore`]: row files on an SSD through io_uring, `pread` or a mapping; a Redis
//! Cluster shared by servers, with row updates streamed to them and sums pooled on its nodes),
//! and the stager that reads a batch's rows through them ([`Stager`]), the next batch's while the
//! current one is pooled ([`pipeline`]).
//!
//! `ember-embed` below it has the tables, batches and kernels; the stager fills the rows view the
//! kernels pool ([`ember_embed::staged`]), so a table on the tier is pooled by the same kernels,
//! in place in its cache, as a table in memory.
//!
//! | module | what |
//! |---|---|
//! | `cache/` | [`RowCache`]: slots, policies (LRU, sampled LFU, pinned), holds, updates |
//! | `tier/` | [`Stager`]: staging a batch, the stores from the tables' placements, updates followed |
//! | [`storage`] | [`RowStore`] and its backends: row files ([`storage::FileStore`], [`storage::MapStore`]), a Redis Cluster ([`storage::remote`]) |

mod cache;
pub mod storage;
mod tier;

/// The names of the metrics the tier records (its remote store and the update streams it
/// follows), defined once where they are recorded, for a server to describe on `/metrics`.
pub mod metric_names {
    pub use crate::storage::remote::metrics::{
        FALLBACK, FALLBACK_ACTIVE, FALLBACK_ROWS, FALLBACK_STALE_TABLES, FETCH_SECONDS, POOL_PLAIN,
    };
    pub use crate::tier::{
        UPDATE_BAD, UPDATE_LAG, UPDATE_POLL_ERRORS, UPDATE_POSITION, UPDATE_RESETS, UPDATE_ROWS,
    };
}

/// A name that is none of an option's values (`'{value}' is not {expected}`): what parsing a
/// [`CachePolicy`], an [`IoMode`] or a [`storage::remote::PoolRemote`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{value}' is not {expected}")]
pub struct UnknownName {
    /// The name given.
    pub value: String,
    /// The names read, in words ("lru, lfu or pinned").
    pub expected: &'static str,
}

impl UnknownName {
    pub(crate) fn new(value: &str, expected: &'static str) -> Self {
        UnknownName {
            value: value.to_string(),
            expected,
        }
    }
}

pub use cache::{CachePolicy, Marked, RowCache, Updated};
pub use storage::{IoKind, IoMode, RowStore};
pub use tier::{
    Stager, TierOptions, TierStats, UpdateStats, hottest, pipeline, prepare_updates, run_ahead,
};
