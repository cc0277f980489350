//! ember-cli's integration tests, one module per subject, in one binary (the remote tier's and
//! the reliability tests, which start clusters and servers of their own, stay binaries of their
//! own): ten binaries each linked the whole crate graph, 53 s of a cold 2-core build's unit
//! time (`cargo test --no-run --timings`, 2026-11-29).

mod common;

mod architecture;
mod cli;
mod error_messages;
mod fuzz_corpus;
mod hstu_cli;
mod model_cli;
mod plan_cli;
mod predict_tensors;
mod readme;
mod report_html;
mod serve_cli;
mod tier_cli;
mod tls_cli;
