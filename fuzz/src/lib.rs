//! The fuzz targets' properties: one function per target in `checks`, the same file the stable
//! replay of the kept corpora runs (`crates/ember-cli/tests/it/fuzz_corpus.rs`), so that an
//! input is checked alike by `cargo +nightly fuzz run` and by `cargo test`.

#[path = "../../crates/ember-cli/tests/it/fuzz_corpus/checks.rs"]
pub mod checks;
