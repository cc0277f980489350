//! Ember's model registry: a model's versions in a Redis Cluster, their layout and how they are
//! read and written: the one owner of what is in the store. `ember registry` manages versions
//! through it, the serving tier (`ember-tier`'s remote store) reads rows and follows updates
//! through it, and a server built from the registry alone (`ember serve --from-registry`)
//! fetches a version through it (`ember_model::registry`: a model directory to and from the
//! registry).
//!
//! A version is a model whole: its tables, packed in blocks, its `config.json` and its dense
//! weights, and a manifest with every block's CRC-32. It is pushed (resumable, verified), then
//! `ready`; it may be promoted (the one servers serve), verified, listed and removed; row updates
//! are written into its blocks and published to every server.
//!
//! | file | what |
//! |---|---|
//! | `layout.rs` | every key, and how rows are packed into blocks (the measured choice) |
//! | `manifest.rs` | [`Manifest`]: a version's tables, shapes and block CRCs |
//! | `read.rs` | [`versions`], [`served_version`], [`resolve_version`], [`read_manifest`], [`updated_set`]: what a version is, read |
//! | `push.rs` | [`push`]: a model's tables as a version (resumable, verified); [`RowSource`] |
//! | `admin.rs` | [`verify`], [`list`], [`remove`]: the rest of what `ember registry` runs |
//! | `files.rs` | a version's `config.json` and dense weights: [`write_files`] beside its tables, [`read_files`] back |
//! | `served.rs` | [`promote`]; [`read_tables`]: a version's tables read back whole, checked |
//! | `updates.rs` | row updates: the stream entry's format, [`Publisher`] (rows written, never recreating a lost block, then published) |
//! | `version.rs` | a version's manifest and state written |
//!
//! Errors are [`ember_embed::EmbedError`]'s (`RemoteStore`: the model, the version and the
//! reason; `StoreUnavailable`: the cluster could not answer, see [`store_error`]).
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.

mod admin;
mod files;
pub mod layout;
pub mod manifest;
mod push;
mod read;
mod served;
pub mod updates;
mod version;

pub use admin::{VerifyReport, VersionListing, list, remove, verify};
pub use files::{ModelFilesData, read_files, write_files};
pub use layout::VersionState;
pub use manifest::{Manifest, ManifestTable, ModelFiles};
pub use push::{PushOptions, PushReport, RowSource, push};
pub use read::{read_manifest, resolve_version, served_version, updated_set, versions};
pub use served::{promote, read_tables};
pub use updates::{PublishReport, Publisher, publish};

use ember_redis::RedisError;

/// A cluster's error as the registry and the tier report it: unavailable ([`ember_embed::EmbedError::StoreUnavailable`],
/// a 503, its `kind` the metrics' label) or a bad `redis://` URL. (A function, not a `From`:
/// neither error type is this crate's.)
pub fn store_error(e: RedisError) -> ember_embed::EmbedError {
    use ember_embed::EmbedError;
    match e {
        RedisError::Unavailable { store, failure } => EmbedError::StoreUnavailable {
            store,
            kind: failure.kind.name(),
            node: failure.node,
            detail: failure.detail,
        },
        RedisError::BadUrl { reason } => EmbedError::BadOption {
            option: "redis",
            reason,
        },
    }
}
