//! `ember data`: Criteo-format data tools.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::io::{BufWriter, Write};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum DataCmd {
    /// Write synthetic Criteo-format TSV whose labels come from a hidden teacher model.
    Synth(SynthArgs),
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Rows to write.
    #[arg(long)]
    rows: u64,
    /// Output file ('-' for stdout).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the rows (the teacher is the same for every seed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(cmd: DataCmd) -> Result<()> {
    match cmd {
        DataCmd::Synth(a) => synth(a),
    }
}

fn synth(a: SynthArgs) -> Result<()> {
    let ctr = if a.out.as_os_str() == "-" {
        let mut w = BufWriter::new(std::io::stdout().lock());
        let ctr = ember_model::synth::write_synth(&mut w, a.rows, a.seed)?;
        w.flush()?;
        ctr
    } else {
        let f = std::fs::File::create(&a.out)
            .with_context(|| format!("cannot create {}", a.out.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        ember_model::synth::write_synth(&mut w, a.rows, a.seed)
            .and_then(|c| w.flush().map(|()| c))
            .with_context(|| format!("writing {}", a.out.display()))?
    };
    eprintln!(
        "wrote {} rows to {} (seed {}, {:.1}% positive)",
        a.rows,
        a.out.display(),
        a.seed,
        ctr * 100.0
    );
    Ok(())
}
