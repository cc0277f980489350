//! Ember's model registry: a model's versions in a Redis Cluster, as `ember registry` manages
//! them and as a server built from the registry alone (`ember serve --from-registry`) fetches
//! them.
//!
//! A version is a model whole: its tables, packed in blocks, its `config.json` and its dense
//! weights, and a manifest with every block's CRC-32. It is pushed (resumable, verified), then
//! `ready`; it may be promoted (the one servers serve), verified, listed and removed. What the
//! serving tier needs to read rows (the key layout, the manifest, [`RedisStore`], version
//! resolution, update streams) stays in `ember-embed`'s `storage::remote`; this crate writes
//! what it reads.
//!
//! | file | what |
//! |---|---|
//! | `push.rs` | [`push`]: a model's tables as a version (resumable, verified); [`RowSource`] |
//! | `admin.rs` | [`verify`], [`list`], [`remove`]: the rest of what `ember registry` runs |
//! | `files.rs` | a version's `config.json` and dense weights: [`files_of`] a model directory, stored beside its tables, [`read_files`] back |
//! | `served.rs` | [`promote`]; [`read_tables`]: a version's tables read back whole, checked |
//! | `fetch.rs` | [`RegistryModel`]: the version to serve, [`RegistryModel::fetch`]ed as a model directory |
//! | `header.rs` | safetensors headers read, packed and written (the dense weights, a fetched model's weights) |
//! | `version.rs` | a version's manifest and state written |
//!
//! Errors are those of the crates below: [`ember_embed::EmbedError`] (`RemoteStore`: the
//! model, the version and the reason) for the registry's operations, [`ember_model::ModelError`]
//! for reading a model directory and fetching one.
//!
//! `docs/remote-tier.md` is the user's guide: layout and its figures, commands, failure
//! semantics, sizing and a deployment sketch.
//!
//! [`RedisStore`]: ember_embed::storage::remote::RedisStore

mod admin;
mod fetch;
mod files;
mod header;
mod push;
mod served;
mod version;

pub use admin::{VerifyReport, VersionListing, list, remove, verify};
pub use fetch::{Fetched, RegistryModel};
pub use files::{ModelFilesData, files_of, read_files};
pub use push::{PushOptions, PushReport, RowSource, push};
pub use served::{promote, read_tables};
