//! How the tier runs: the cache budget and policy, how row files are read, and the pinned set.

use crate::cache::CachePolicy;
use crate::storage::IoMode;
use crate::storage::remote::{PoolRemote, RemoteSource};
use ember_embed::EmbeddingCollection;
use ember_embed::Placement;
use ember_embed::Result;
use std::sync::Arc;

/// How the tier runs.
#[derive(Debug, Clone)]
pub struct TierOptions {
    /// DRAM budget of the row cache, shared by the tier tables in proportion to their sizes.
    pub cache_bytes: usize,
    pub policy: CachePolicy,
    pub io: IoMode,
    /// Reads in flight at most.
    pub queue_depth: usize,
    /// With [`CachePolicy::Pinned`]: the share of each table's cache held by the pinned hot set
    /// (the rest is LRU). `None`: all of it with a `pin_trace` (measured best on the production
    /// trace: 1.0 beat 0.9 and 0.75), 0.9 without one, so that an LRU part caches rows until the
    /// first refresh from live counts.
    pub pin_fraction: Option<f64>,
    /// An id trace to profile for the initial pinned set: each table pins its most frequent ids
    /// (those below its row count). Without one, the pinned policy starts from live counts.
    pub pin_trace: Option<Arc<Vec<u64>>>,
    /// Re-pin the hottest rows from live access counts every this many staged batches (0: never;
    /// the pinned policy without a trace uses 64).
    pub refresh_batches: usize,
    /// Where tables placed `remote` are: the cluster, the model's name, the version.
    pub remote: Option<RemoteSource>,
    /// Staging slots per tier table, on top of the cache budget: rows of batches in flight that
    /// the policy did not keep are lent one, so that they too are pooled in place. `None`: an
    /// eighth of the table's cache, at least 4096 and at most 65536 rows (never more than the
    /// table). A batch that finds none free copies its rows instead (the same result).
    pub staging_rows: Option<usize>,
    /// With remote tables: follow their update streams and apply each update to the cache
    /// (`crate::storage::remote::updates`; on by default).
    pub follow_updates: bool,
    /// With remote tables: pool a batch's misses on the nodes that hold them (the `EMBER.POOL`
    /// module) where the nodes have it (`auto`, the default), requiring it (`on`), or never
    /// (`off`: rows read whole). See the `ember-pool-command` crate.
    pub pool_remote: PoolRemote,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions {
            cache_bytes: 1 << 30,
            policy: CachePolicy::Lfu,
            io: IoMode::Auto,
            queue_depth: 128,
            pin_fraction: None,
            pin_trace: None,
            refresh_batches: 0,
            remote: None,
            staging_rows: None,
            follow_updates: true,
            pool_remote: PoolRemote::Auto,
        }
    }
}

/// Makes every in-memory table of `coll` live
/// ([`EmbeddingCollection::make_dram_tables_live`]) when `opts` follows the update streams of a
/// store `coll` reads tables from: a [`crate::Stager`] started with `opts` then writes updates
/// into them too. Answers whether it did.
pub fn prepare_updates(coll: &mut EmbeddingCollection, opts: &TierOptions) -> Result<bool> {
    let from_store = coll
        .tables()
        .iter()
        .any(|t| t.placement() == Placement::Remote);
    if !(opts.follow_updates && opts.remote.is_some() && from_store) {
        return Ok(false);
    }
    coll.make_dram_tables_live()?;
    Ok(true)
}
