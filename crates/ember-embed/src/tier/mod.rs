//! The SSD tier: tables larger than memory, read from a [`crate::storage::RowStore`] (row files
//! through io_uring, `pread` or a mapping) behind a DRAM row cache ([`crate::RowCache`]), with the
//! next batch's rows read while the current one is pooled ([`pipeline`]).
//!
//! Lookups on tier tables are staged: [`Stager::stage`] finds each feature's distinct ids in the
//! batch and holds the cached ones where they lie in the cache (tables in parallel), fetches
//! every missing row of every tier table from its store in one call per store (a row file's
//! store merges neighbouring blocks and checks each block against its checksum), admits the rows
//! to the cache, and returns a [`StagedBatch`]: per feature, where each distinct row lies (held
//! cache slots, or a compact buffer) and the inverse index (as batch deduplication builds). The
//! pooling kernels then run on those rows in place ([`crate::Pooler::run_staged`]) exactly as on
//! a deduplicated in-memory unit, so tier lookups give bit-identical results to in-memory ones.
//!
//! | file | what |
//! |---|---|
//! | `options.rs` | [`TierOptions`]: budget, policy, I/O, pinning |
//! | `stats.rs` | [`TierStats`] and the atomic counters behind them |
//! | `staged.rs` | [`StagedBatch`] and the recycler of its buffers |
//! | `stager.rs` | [`Stager`]: stores, fetching misses, landing rows, pinning |
//! | `lookup.rs` | one tier table's part of a batch: releases, lookups that dedup, holds |
//! | `pipeline.rs` | [`run_ahead`] and [`pipeline`]: prefetch of the next batch |

mod inner;
mod lookup;
mod options;
mod pinning;
mod pipeline;
mod staged;
mod stager;
mod stats;

pub use options::TierOptions;
pub use pinning::hottest;
pub use pipeline::{pipeline, run_ahead};
pub use staged::StagedBatch;
pub(crate) use staged::StagedRows;
pub use stager::Stager;
pub use stats::TierStats;
