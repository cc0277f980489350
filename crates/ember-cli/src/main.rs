#![recursion_limit = "256"]
//! The `ember` command. Libraries return typed errors; this binary turns them into messages and
//! exit codes (`run() -> anyhow::Result`, printed with `{:#}`).

mod bench_embed;
#[cfg(feature = "cuda")]
mod bench_gpu;
mod bench_model;
mod bench_tiered;
mod convert;
mod data;
mod device;
mod gpu_args;
mod loadgen;
mod paths;
mod plan;
mod predict;
mod serve;
mod stats;
mod tier_args;

use clap::{Parser, Subcommand};

/// mimalloc rather than glibc's malloc: the server's request decoding makes a few hundred small
/// allocations per request, and glibc's malloc and free were a fifth of the server's CPU time
/// under load (`perf`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
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
    Bench(Bench),
    /// Score a Criteo-format file with a model: AUC, log loss, samples/s, and the scores.
    Predict(predict::PredictArgs),
    /// Serve a model: KServe v2 over HTTP, /v1/score, Prometheus /metrics, dynamic batching.
    Serve(serve::ServeArgs),
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
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The embedding stage: pooled lookups over every table of a batch, against the memory ceiling.
    Embed(bench_embed::EmbedArgs),
    /// The whole model: samples/s, batch latency and where the time goes.
    Model(bench_model::ModelArgs),
    /// The embedding stage with tables on the SSD tier, against the same tables in DRAM and a
    /// cold plain mmap, plus the disk's own random-read rate.
    Tiered(bench_tiered::TieredArgs),
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Bench(Bench::Embed(args)) => bench_embed::run(args),
        Cmd::Bench(Bench::Model(args)) => bench_model::run(args),
        Cmd::Bench(Bench::Tiered(args)) => bench_tiered::run(args),
        Cmd::Convert(args) => convert::run(args),
        Cmd::Predict(args) => predict::run(args),
        Cmd::Serve(args) => serve::run(args),
        Cmd::Loadgen(args) => loadgen::run(args),
        Cmd::Data(cmd) => data::run(cmd),
        Cmd::Plan(cmd) => plan::run(cmd),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
