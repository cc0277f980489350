//! ember-serve's integration tests, one module per subject, in one binary: six binaries each
//! linked tokio, tonic, reqwest and the server, 125 s of a cold 2-core build's unit time
//! (`cargo test --no-run --timings`, 2026-11-29) for what one link does.

mod common;

mod checks_once;
mod fuzz_decoders;
mod graph;
mod grpc;
mod hstu;
mod hstu_cache;
mod http;
mod repository;
mod restricted;
mod sequence;
mod tls;
