//! The SSD tier: tables larger than memory, read from a [`crate::storage::RowStore`] (row files
//! through io_uring, `pread` or a mapping; a remote store) behind a DRAM row cache
//! ([`crate::RowCache`]), with the next batch's rows read while the current one is pooled
//! ([`pipeline`]).
//!
//! Lookups on tier tables are staged: [`Stager::stage`] looks each id of each feature up in the
//! table's cache (tables in parallel). A *stable* row (pinned, or resident in a cache whose
//! capacity covers the whole table, where id `i` lives in slot `i` and nothing is evicted) is
//! read where it lies without a hold: one bit per id says so, and the batch keeps the pinned
//! set's epoch instead. Every other cached row is deduplicated and held. The stager then fetches
//! every missing row of every tier table from its store in one call per store (a row file's
//! store merges neighbouring blocks and checks each block against its checksum), admits the rows
//! to the cache, and returns a [`StagedBatch`]: per feature, each id's slot in the cache's slab
//! (or, where the cache could not hold every row, a compact buffer and the inverse index). The
//! pooling kernels then run on those rows in place ([`ember_embed::Pooler::run_staged`]) exactly as on
//! an in-memory unit, so tier lookups give bit-identical results to in-memory ones.
//!
//! A remote store that pools on its nodes (`pool_remote`, the `EMBER.POOL` module) changes one
//! step: a pooled table's missing rows are summed per bag on the nodes that hold them instead of
//! fetched (`pooling.rs`), and the pooler adds those sums after its kernel. Results then equal
//! in-memory ones within the rounding of a sum in another order, not bit for bit.
//!
//! | file | what |
//! |---|---|
//! | `options.rs` | [`TierOptions`]: budget, policy, I/O, pinning |
//! | `stats.rs` | [`TierStats`] and the atomic counters behind them |
//! | `staged.rs` | [`StagedBatch`] and the recycler of its buffers |
//! | `stager.rs` | [`Stager`]: the tier tables and their caches, staging a batch, pinning |
//! | `stores.rs` | the stores, from the tables' placements (remote: its local copy, its updates) |
//! | `inner.rs` | the state behind the stager's lock: updates applied, misses fetched from stores |
//! | `land.rs` | fetched rows landed: in the cache's slots, or a feature's compact buffer |
//! | `pooling.rs` | a batch's misses of tables whose remote store pools: summed on the nodes |
//! | `fill.rs` | the background fill of those tables' caches: rows the policy admits, read whole |
//! | `lookup.rs` | one tier table's part of a batch: releases, lookups that dedup, holds |
//! | `seen.rs` | the distinct stable rows of a feature, noted without a branch |
//! | `follow.rs` | following an update source (`crate::storage::updates`), applied between batches |
//! | `live.rs` | what a model served from a store follows, in-memory tables included |
//! | `pipeline.rs` | [`run_ahead`] and [`pipeline`]: prefetch of the next batch |

mod fill;
mod follow;
mod inner;
mod land;
mod live;
mod lookup;
mod node_sums;
mod options;
mod pinning;
mod pipeline;
mod seen;

mod stager;
mod stats;
mod stores;

pub use follow::{
    UPDATE_BAD, UPDATE_LAG, UPDATE_POLL_ERRORS, UPDATE_POSITION, UPDATE_RESETS, UPDATE_ROWS,
    UpdateStats,
};
pub use options::{TierOptions, prepare_updates};
pub use pinning::hottest;
pub use pipeline::{pipeline, run_ahead};

pub use stager::Stager;
pub use stats::TierStats;
