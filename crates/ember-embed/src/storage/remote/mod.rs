//! The remote tier: tables in a Redis Cluster, shared by any number of stateless servers.
//!
//! The client (connections, routing, retries, the RESP reader) is the `ember-redis` crate; its
//! types are re-exported here for the callers of `ember registry`'s operations.
//!
//! | file | what |
//! |---|---|
//! | `layout.rs` | every key, and how rows are packed into blocks (the measured choice) |
//! | `manifest.rs` | [`Manifest`]: a version's tables, shapes and block CRCs |
//! | `store.rs` | [`RedisStore`]: the [`crate::storage::RowStore`] of `remote` tables; [`RemoteRows`], what the tier asks of a remote store alone |
//! | `pooled.rs` | `EMBER.POOL`, the command of the Redis module (`crates/ember-redis-module`): its wire format, its bounds, the sums (shared by module and client); what a pooling call is ([`PoolJob`], [`PoolRemote`]) and [`pool_by_reads`], the sums from rows read whole |
//! | `pooling.rs` | [`RedisStore::pool`]: a batch's misses pooled on their nodes, partial sums added in a fixed order |
//! | `fallback.rs` | [`WithLocalCopy`]: a local row-file copy read while the cluster cannot answer |
//! | `metrics.rs` | the remote tier's metric names, and the handles a store records into |
//! | `updates.rs` | [`updates::UpdateReader`]: streaming row updates, their format and how servers follow them |
//! | `publish.rs` | [`updates::Publisher`]: writes updated rows (never recreating a lost block) and publishes them |
//! | `source.rs` | [`open_source`]: the reader as the tier's [`crate::storage::updates::UpdateSource`] |
//!
//! The tier opens these through its store factory (`tier/stores.rs`: the store, its local copy,
//! its update source) and calls the store through [`crate::storage::RowStore`] (what every
//! backend has) and [`RemoteRows`] (what only a store read over the network has).
//!
//! Pushing, verifying, listing, removing, promoting and fetching versions (`ember registry`, `ember
//! serve --from-registry`) is the model registry, the `ember-registry` crate, on top of these.
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.

mod fallback;
pub mod layout;
pub mod manifest;
pub mod metrics;
pub mod pooled;
mod pooling;
mod publish;
mod source;
mod store;
pub mod updates;

pub use ember_redis::{
    Cluster, ClusterOptions, Conn, FailKind, Failure, NodeStats, Ops, RedisError, Replies, Reply,
    slot,
};
pub use fallback::WithLocalCopy;
pub use layout::VersionState;
pub use manifest::{Manifest, ManifestTable, ModelFiles};
pub use pooled::{NodePoolStats, PoolJob, PoolRemote, pool_by_reads, pool_then_read};
pub use source::open_source;
pub use store::{
    RedisStore, RemoteRows, RemoteSource, RemoteTableSpec, read_manifest, resolve_version,
    served_version, updated_set, versions,
};
