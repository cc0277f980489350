//! ember-model's integration tests, one module per subject, in one binary: four binaries each
//! linked the crate graph, 26 s of a cold 2-core build's unit time (`cargo test --no-run
//! --timings`, 2026-11-29).

mod dense_dtype;
mod hstu;
mod hstu_as_of;
mod hstu_cache;
mod parity;
mod seam;
