//! Where the files shipped in the repository are: relative to the working directory first (a
//! checkout's root), then relative to this crate's source (a `cargo run` from anywhere inside the
//! checkout).

use std::path::PathBuf;

/// The shipped default model directory.
pub const DEFAULT_MODEL: &str = "models/default";
/// The shipped sample of Criteo-format data.
pub const DEFAULT_DATA: &str = "data/sample.tsv";

/// `rel` under the working directory if it exists there, else under the checkout root.
pub fn shipped(rel: &str) -> PathBuf {
    let here = PathBuf::from(rel);
    if here.exists() {
        return here;
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    if repo.exists() { repo } else { here }
}
