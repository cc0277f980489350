//! The remote tier: tables in a Redis Cluster, shared by any number of stateless servers.
//!
//! | file | what |
//! |---|---|
//! | `layout.rs` | every key, and how rows are packed into blocks (the measured choice) |
//! | `slot.rs` | the cluster's key slot (CRC-16) |
//! | `cluster.rs` | [`Cluster`]: routing, one pipeline per node, deadlines, bounded retries, failover |
//! | `manifest.rs` | [`Manifest`]: a version's tables, shapes and block CRCs |
//! | `store.rs` | [`RedisStore`]: the [`crate::storage::RowStore`] of `remote` tables |
//! | `admin.rs` | [`push`], [`verify`], [`list`], [`remove`]: what `ember store` runs |
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.

mod admin;
mod cluster;
pub mod layout;
mod manifest;
pub mod slot;
mod store;

pub use admin::{
    PushOptions, PushReport, VerifyReport, VersionListing, list, push, remove, verify,
};
pub use cluster::{Cluster, ClusterOptions, FailKind, NodeStats, Ops};
pub use layout::VersionState;
pub use manifest::{Manifest, ManifestTable};
pub use store::{
    RedisStore, RemoteSource, RemoteTableSpec, read_manifest, resolve_version, versions,
};
