//! The remote tier: tables in a Redis Cluster, shared by any number of stateless servers.
//!
//! The client (connections, routing, retries, the RESP reader) is the `ember-redis` crate; its
//! types are re-exported here for the callers of `ember store`'s operations.
//!
//! | file | what |
//! |---|---|
//! | `layout.rs` | every key, and how rows are packed into blocks (the measured choice) |
//! | `manifest.rs` | [`Manifest`]: a version's tables, shapes and block CRCs |
//! | `store.rs` | [`RedisStore`]: the [`crate::storage::RowStore`] of `remote` tables |
//! | `fallback.rs` | [`WithLocalCopy`]: a local row-file copy read while the cluster cannot answer |
//! | `push.rs` | [`push`]: a model's tables as a version (resumable, verified) |
//! | `admin.rs` | [`verify`], [`list`], [`remove`]: the rest of what `ember store` runs |
//! | `files.rs` | a version's `config.json` and dense weights, stored beside its tables |
//! | `served.rs` | [`promote`]; [`read_tables`]: a version's tables read back whole, checked |
//! | `updates.rs` | [`updates::publish`] and [`updates::UpdateReader`]: streaming row updates |
//! | `source.rs` | [`open_source`]: the reader as the tier's [`crate::storage::updates::UpdateSource`] |
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.

mod admin;
mod fallback;
mod files;
pub mod layout;
mod manifest;
mod push;
mod served;
mod source;
mod store;
pub mod updates;

pub use admin::{VerifyReport, VersionListing, list, remove, verify};
pub use ember_redis::{
    Cluster, ClusterOptions, Conn, FailKind, Failure, NodeStats, Ops, RedisError, Replies, Reply,
    slot,
};
pub use fallback::WithLocalCopy;
pub use files::{ModelFilesData, read_files};
pub use layout::VersionState;
pub use manifest::{Manifest, ManifestTable, ModelFiles};
pub use push::{PushOptions, PushReport, RowSource, push};
pub use served::{promote, read_tables};
pub use source::open_source;
pub use store::{
    RedisStore, RemoteSource, RemoteTableSpec, read_manifest, resolve_version, served_version,
    versions,
};
