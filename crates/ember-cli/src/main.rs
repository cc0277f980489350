#![recursion_limit = "256"]
//! The `ember` command. Libraries return typed errors; this binary turns them into messages and
//! exit codes (`run() -> anyhow::Result`, printed with `{:#}`).

mod bench;
mod convert;
mod data;
mod dense;
mod device;
mod engines;
mod gpu_args;
mod hstu_engine;
mod loadgen;
mod logging;
mod paths;
mod plan;
mod predict;
mod registry;
mod report;
mod serve;
mod tier_args;
mod units;

use clap::{Parser, Subcommand};

/// mimalloc rather than glibc's malloc: the server's request decoding makes a few hundred small
/// allocations per request, and glibc's malloc and free were a fifth of the server's CPU time
/// under load (`perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc v3's `mimalloc.h` (the version `libmimalloc-sys` builds;
/// its Rust bindings name no constant for it).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Memory freed goes back to the OS at once rather than after mimalloc's default 1 s delay,
/// which only runs on the next allocation of the same thread: after a burst of large requests
/// the server's RSS stayed ~200 MB above its steady level for as long as it was idle; with no
/// delay it returns to within ~16 MB in a second, at no measured cost in throughput or p99
/// (`ember loadgen` at 12K requests/s and at 1.3K requests/s of 256 samples). Each purge is a
/// `madvise` that waits for every other core running the server to flush its TLB (`perf sched`
/// caught one taking 9.9 ms on this VM); `MIMALLOC_PURGE_DELAY` in the environment is left to
/// mimalloc (one `bench/swap.sh` run with 1000: steady p99 2.5 ms against 3.3-4.4 ms in runs
/// without it; not measured enough to change the default).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return; // the user's own setting, which mimalloc reads at start
    }
    // SAFETY: sets one of mimalloc's global integer options, which it reads at each purge; no
    // pointer is passed.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
}
use std::process::ExitCode;

/// Ember: an inference engine for deep learning recommendation models.
#[derive(Debug, Parser)]
#[command(name = "ember", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Benchmarks that size hardware and compare Ember with its peers.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Score a Criteo-format file with a model: AUC, log loss, samples/s, and the scores.
    Predict(predict::PredictArgs),
    /// Serve a model: KServe v2 over HTTP, /v1/score, Prometheus /metrics, dynamic batching.
    Serve(Box<serve::ServeArgs>),
    /// Open-loop load on a KServe v2 server: achieved rate and latency percentiles, or the
    /// highest rate within a p99 objective (--find-max).
    Loadgen(loadgen::LoadgenArgs),
    /// Write tables as row files for the SSD tier (from a model directory or a safetensors file).
    Convert(convert::ConvertArgs),
    /// Sharding planner: plan tables over devices, calibrate its cost model, evaluate it.
    #[command(subcommand)]
    Plan(plan::PlanCmd),
    /// Data tools: synthetic Criteo-format data.
    #[command(subcommand)]
    Data(data::DataCmd),
    /// The model registry in a Redis Cluster: push a model, list, verify, promote and remove
    /// versions, publish row updates (`ember store` still works, for one release).
    #[command(subcommand, visible_alias = "store")]
    Registry(registry::RegistryCmd),
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The README's check (tests/it/readme.rs): the command line parses; nothing runs.
    if std::env::var_os("EMBER_PARSE_ONLY").is_some() {
        return Ok(());
    }
    match cli.cmd {
        Cmd::Bench(cmd) => bench::run(cmd),
        Cmd::Convert(args) => convert::run(args),
        Cmd::Predict(args) => predict::run(args),
        Cmd::Serve(args) => serve::run(*args),
        Cmd::Loadgen(args) => loadgen::run(args),
        Cmd::Data(cmd) => data::run(cmd),
        Cmd::Plan(cmd) => plan::run(cmd),
        Cmd::Registry(cmd) => registry::run(cmd),
    }
}

fn main() -> ExitCode {
    tune_allocator();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes, outermost first, joined by `: `, down to the first error of Ember's
/// libraries: such an error says its causes in its own message (the rule of
/// `docs/architecture.md`, "Errors", which ember-cli's `error_messages` test checks on every
/// error type), so its sources would repeat it. What is left out is chosen by type, never by
/// the text.
fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&cause.to_string());
        if says_its_causes(cause) {
            break;
        }
    }
    out
}

/// Whether `e` is an error type of Ember's libraries that has causes (its message then holds
/// them).
fn says_its_causes(e: &(dyn std::error::Error + 'static)) -> bool {
    #[cfg(feature = "cuda")]
    if e.is::<ember_cuda::CudaError>() {
        return true;
    }
    e.is::<ember_embed::EmbedError>()
        || e.is::<ember_model::ModelError>()
        || e.is::<ember_plan::PlanError>()
        || e.is::<ember_plan::spec::SpecError>()
        || e.is::<ember_serve::ServeError>()
        || e.is::<ember_serve::ServerError>()
        || e.is::<ember_serve::LoadError>()
        || e.is::<ember_bench::dense_peak::Unavailable>()
}

#[cfg(test)]
mod report_tests {
    use super::report;

    #[test]
    fn the_chain_stops_at_the_first_ember_error() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "not a model directory");
        let lib = ember_model::ModelError::Io {
            path: "/m".into(),
            source: io,
        };
        let e = anyhow::Error::new(lib).context("loading model /m");
        assert_eq!(report(&e), "loading model /m: /m: not a model directory");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(report(&plain), "outer: inner");
        // A foreign error's causes are printed; a message that merely contains its cause's
        // text is no reason to leave the cause out.
        let io = std::io::Error::other("disk full");
        let e = anyhow::Error::new(io).context("writing /out: disk full");
        assert_eq!(report(&e), "writing /out: disk full: disk full");
        // Down to the first Ember error, whatever wraps it.
        let embed = ember_embed::EmbedError::TraceIo {
            path: "/t".into(),
            cause: std::io::Error::other("gone").into(),
        };
        let e = anyhow::Error::new(ember_model::ModelError::from(embed)).context("predict");
        assert_eq!(report(&e), "predict: id trace /t: gone");
    }
}
