//! The server on a bad day: slow clients, idle floods, descriptor exhaustion, overload, big
//! requests, stops with stuck clients, files that are not files. Each check starts `ember serve`
//! as a user would and asserts the behaviour (what is refused, closed, answered, how much
//! memory), not just that nothing crashed.
//!
//! `cargo test -p ember-cli --test reliability` runs the short checks (part of CI). The figures
//! (10,000 idle connections, 5x overload for a minute, an hour's soak at 80% of the highest
//! rate, 16 MiB requests) are `#[ignore]`d: `bench/reliability.sh` runs them on a release build
//! and prints what they measured (`bench/reliability.sh soak` for the hour).

mod clients;
mod connections;
mod figures;
mod memory;
mod overload;
mod reads;
mod sampler;
mod server;
mod shutdown;
