//! A model directory to and from the registry (`ember-registry`): what `ember registry push`
//! stores of a model directory beside its tables ([`files_of`]), and a version fetched back as a
//! model directory that [`crate::Model::load`] reads ([`RegistryModel`]), for a server built from
//! the registry alone (`ember serve --from-registry`).
//!
//! | file | what |
//! |---|---|
//! | `files.rs` | [`files_of`]: a model directory's `config.json` (checked, without its `remote` object) and dense weights |
//! | `fetch.rs` | [`RegistryModel`]: the version to serve, [`RegistryModel::fetch`]ed as a model directory |
//! | `header.rs` | safetensors headers read, packed and written (the dense weights, a fetched model's weights) |

mod fetch;
mod files;
mod header;

pub use fetch::{Fetched, RegistryModel};
pub use files::files_of;
