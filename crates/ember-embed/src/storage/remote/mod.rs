//! The remote tier: tables in a Redis Cluster, shared by any number of stateless servers.
//!
//! | file | what |
//! |---|---|
//! | `layout.rs` | every key, and how rows are packed into blocks (the measured choice) |
//! | `slot.rs` | the cluster's key slot (CRC-16) |
//! | `options.rs` | [`ClusterOptions`] (the `redis://` URL, timeouts, retries) and how calls fail |
//! | `ops.rs` | [`Ops`]: a call's commands, packed |
//! | `resp.rs` | [`Conn`]: a node's connection (RESP2, parsed in place, bounded by a deadline); [`Replies`] |
//! | `wire.rs` | a node's state and counters; `CLUSTER SLOTS` read into ranges |
//! | `cluster.rs` | [`Cluster`]: routing, one pipeline per node, deadlines, bounded retries, failover |
//! | `manifest.rs` | [`Manifest`]: a version's tables, shapes and block CRCs |
//! | `store.rs` | [`RedisStore`]: the [`crate::storage::RowStore`] of `remote` tables |
//! | `fallback.rs` | [`WithLocalCopy`]: a local row-file copy read while the cluster cannot answer |
//! | `push.rs` | [`push`]: a model's tables as a version (resumable, verified) |
//! | `admin.rs` | [`verify`], [`list`], [`remove`]: the rest of what `ember store` runs |
//! | `files.rs` | a version's `config.json` and dense weights, stored beside its tables |
//! | `served.rs` | [`promote`]; [`read_tables`]: a version's tables read back whole, checked |
//! | `updates.rs` | [`updates::publish`] and [`updates::UpdateReader`]: streaming row updates |
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.

mod admin;
mod cluster;
mod fallback;
mod files;
pub mod layout;
mod manifest;
mod ops;
mod options;
mod push;
mod resp;
mod served;
pub mod slot;
mod store;
pub mod updates;
mod wire;

pub use admin::{VerifyReport, VersionListing, list, remove, verify};
pub use cluster::Cluster;
pub use fallback::WithLocalCopy;
pub use files::{ModelFilesData, read_files};
pub use layout::VersionState;
pub use manifest::{Manifest, ManifestTable, ModelFiles};
pub use ops::Ops;
pub use options::{ClusterOptions, FailKind, Failure};
pub use push::{PushOptions, PushReport, RowSource, push};
pub use resp::{Conn, Replies, Reply};
pub use served::{promote, read_tables};
pub use store::{
    RedisStore, RemoteSource, RemoteTableSpec, read_manifest, resolve_version, served_version,
    versions,
};
pub use wire::NodeStats;
