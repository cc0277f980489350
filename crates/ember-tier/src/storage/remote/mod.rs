//! The remote tier: tables in a Redis Cluster, shared by any number of stateless servers.
//!
//! The client (connections, routing, retries, the RESP reader) is the `ember-redis` crate; its
//! types are re-exported here for the callers of `ember registry`'s operations.
//!
//! | file | what |
//! |---|---|
//! | `store.rs` | [`RedisStore`]: the [`crate::storage::RowStore`] of `remote` tables; [`RemoteRows`], what the tier asks of a remote store alone |
//! | `pool_jobs.rs` | what a pooling call is ([`PoolJob`], [`PoolRemote`]) and [`pool_by_reads`], the sums from rows read whole (a node without the module, the local copy) |
//! | `node_calls.rs` | [`RedisStore::pool`]: a batch's misses pooled on their nodes with `EMBER.POOL` (its definition is the `ember-pool-command` crate), partial sums added in a fixed order |
//! | `fallback.rs` | [`WithLocalCopy`]: a local row-file copy read while the cluster cannot answer |
//! | `metrics.rs` | the remote tier's metric names, and the handles a store records into |
//! | `updates.rs` | [`updates::UpdateReader`]: how servers follow the streams of row updates |
//! | `source.rs` | [`open_source`]: the reader as the tier's [`crate::storage::updates::UpdateSource`] |
//!
//! The tier opens these through its store factory (`tier/stores.rs`: the store, its local copy,
//! its update source) and calls the store through [`crate::storage::RowStore`] (what every
//! backend has) and [`RemoteRows`] (what only a store read over the network has).
//!
//! What is in the store and how it is laid out (every key, the manifest, the versions and their
//! states, the update streams' entries) is the model registry's, the `ember-registry` crate: its
//! one owner, which writes it (pushes, promotions, row updates) and reads it, for its commands and
//! for this tier.
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.

mod fallback;
pub mod metrics;
mod node_calls;
mod pool_jobs;
mod source;
mod store;
pub mod updates;

pub use ember_redis::{
    Cluster, ClusterOptions, Conn, FailKind, Failure, NodeStats, Ops, RedisError, Replies, Reply,
    slot,
};
pub use fallback::WithLocalCopy;
pub use pool_jobs::{
    NO_MODULE_RETRY, NodePoolStats, PoolJob, PoolRemote, pool_by_reads, pool_then_read,
};
pub use source::open_source;
pub use store::{RedisStore, RemoteRows, RemoteSource, RemoteTableSpec};
