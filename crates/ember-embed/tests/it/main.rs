//! ember-embed's integration tests, one module per subject, in one binary: three binaries each
//! linked the crate graph, 16 s of a cold 2-core build's unit time (`cargo test --no-run
//! --timings`, 2026-11-29). The proptest regressions live beside their modules.

mod common;

mod checked;
mod pool_props;
