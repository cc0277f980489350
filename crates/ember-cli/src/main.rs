//! The `ember` command. Libraries return typed errors; this binary turns them into messages and
//! exit codes (`run() -> anyhow::Result`, printed with `{:#}`).

mod bench_embed;
mod stats;

use clap::{Parser, Subcommand};
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
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The embedding stage: pooled lookups over every table of a batch, against the memory ceiling.
    Embed(bench_embed::EmbedArgs),
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Bench(Bench::Embed(args)) => bench_embed::run(args),
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
