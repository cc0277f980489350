//! `ember registry` (alias `ember store`, kept for one release): a model's versions in the
//! registry, a Redis Cluster (see `docs/remote-tier.md`), through `ember-registry`.
//!
//! - `push`: uploads a model directory's tables as a new version (pipelined, parallel across the
//!   nodes, resumable, verified), with a progress bar;
//! - `ls`: models and versions with their sizes and states;
//! - `verify`: reads a version back and checks every block's CRC;
//! - `rm`: removes a version in bounded steps (never the promoted one);
//! - `promote`: the version every server built from the registry serves (`ember serve
//!   --from-registry`);
//! - `update`: new rows of a table, published to every server (`registry/update.rs`).

mod update;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ember_embed::DType;
use ember_model::LoadOptions;
use ember_registry::{PushOptions, PushReport};
use ember_tier::storage::remote::{Cluster, ClusterOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Duration;

/// The subcommands of `ember registry`.
#[derive(Debug, Subcommand)]
pub enum RegistryCmd {
    /// Upload a model directory's tables as a version (resumes an interrupted push of the same
    /// tables).
    #[command(disable_version_flag = true)]
    Push(PushArgs),
    /// List models and their versions.
    Ls(ClusterArgs),
    /// Read a version back and check every block against its CRC-32.
    #[command(disable_version_flag = true)]
    Verify(VersionArgs),
    /// Remove a version (never served again from the first step; safe to run again).
    #[command(disable_version_flag = true)]
    Rm(VersionArgs),
    /// Write new rows of a table and publish them to every server following the version.
    #[command(disable_version_flag = true)]
    Update(update::UpdateArgs),
    /// Serve this version: every server started with --from-registry loads it, warms it and swaps
    /// it in without a pause; servers started later serve it.
    #[command(disable_version_flag = true)]
    Promote(VersionArgs),
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The cluster: redis://[user:password@]host:port[,host:port...].
    #[arg(long, value_name = "URL")]
    redis: String,
    /// Deadline of one round of commands, seconds.
    #[arg(long, default_value_t = 30.0)]
    timeout_s: f64,
}

impl ClusterArgs {
    pub(crate) fn connect(&self) -> Result<Cluster> {
        let mut o = ClusterOptions::parse(&self.redis)?;
        if self.timeout_s.is_nan() || self.timeout_s <= 0.0 {
            bail!("--timeout-s must be positive");
        }
        o.timeout = Duration::from_secs_f64(self.timeout_s);
        o.connect_timeout = Duration::from_secs(2);
        Cluster::connect(o).with_context(|| format!("connecting to {}", self.redis))
    }
}

#[derive(Debug, Args)]
pub struct PushArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The model directory (config.json and model.safetensors, or row files of `ember convert`).
    #[arg(long)]
    model: PathBuf,
    /// The model's name in the registry [default: the directory's name].
    #[arg(long)]
    name: Option<String>,
    /// The version to push [default: resume an interrupted push of the same tables, else the
    /// newest version + 1].
    #[arg(long)]
    version: Option<u64>,
    /// Encode the tables in this dtype (f32, f16, bf16, int8, int4) before pushing.
    #[arg(long)]
    table_dtype: Option<DType>,
    /// MiB of blocks written per round (one pipeline per node).
    #[arg(long, default_value_t = 32)]
    window_mb: usize,
    /// Replicas that must acknowledge each round (0: do not wait).
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct VersionArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The model's name in the registry.
    #[arg(long)]
    model: String,
    /// The version.
    #[arg(long)]
    version: u64,
}

pub fn run(cmd: RegistryCmd) -> Result<()> {
    match cmd {
        RegistryCmd::Push(a) => push(a),
        RegistryCmd::Ls(a) => ls(a),
        RegistryCmd::Verify(a) => verify(a),
        RegistryCmd::Rm(a) => rm(a),
        RegistryCmd::Update(a) => update::run(a),
        RegistryCmd::Promote(a) => promote(a),
    }
}

fn push(a: PushArgs) -> Result<()> {
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| ember_model::dir_name(&a.model));
    // Tables come from the directory as it places them (row files stay on disk), except those
    // placed remote, which are read from the safetensors file.
    let config = ember_model::AnyConfig::read(&a.model.join("config.json"))
        .with_context(|| format!("reading {}", a.model.join("config.json").display()))?;
    let placement = config
        .tables()
        .iter()
        .any(|t| t.placement == ember_embed::Placement::Remote)
        .then_some(ember_embed::Placement::Dram);
    let model = ember_model::AnyModel::load(
        &a.model,
        LoadOptions {
            table_dtype: a.table_dtype,
            placement,
            ..LoadOptions::default()
        },
    )
    .with_context(|| format!("loading model {}", a.model.display()))?;
    let tables: Vec<&ember_embed::EmbeddingTable> = model.embeddings().tables().iter().collect();
    let mut cluster = a.cluster.connect()?;
    let total: u64 = tables.iter().map(|t| t.bytes() as u64).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("pushing {name}"));
    // The config and dense weights go with the tables: a server can build the version from
    // the registry alone (`ember serve --from-registry`).
    let files = ember_model::registry::files_of(&a.model)
        .with_context(|| format!("reading the dense weights of {}", a.model.display()))?;
    let opts = PushOptions {
        version: a.version,
        window_bytes: a.window_mb.max(1) << 20,
        round_timeout: Duration::from_secs_f64(a.cluster.timeout_s),
        replicas: a.replicas,
        files: Some(files),
    };
    let rep = ember_registry::push(&mut cluster, &name, &tables, &opts, &mut |done, _| {
        bar.set_position(done)
    })
    .with_context(|| format!("pushing {name} to {}", a.cluster.redis))?;
    bar.finish_and_clear();
    print_push(&name, &rep, a.json, a.replicas);
    Ok(())
}

/// Prints what `push` did: a line (and a warning when rounds went unreplicated), or JSON.
fn print_push(name: &str, rep: &PushReport, json: bool, replicas: u32) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "model": name,
                "version": rep.version,
                "resumed": rep.resumed,
                "tables": rep.tables,
                "rows": rep.rows,
                "bytes": rep.bytes,
                "bytes_written": rep.bytes_written,
                "blocks": rep.blocks,
                "blocks_skipped": rep.blocks_skipped,
                "seconds": rep.seconds,
                "verify_seconds": rep.verify_seconds,
                "rows_per_s": rep.rows as f64 / rep.seconds.max(1e-9),
                "unreplicated_rounds": rep.unreplicated_rounds,
            })
        );
    } else {
        println!(
            "{name} version {} is ready: {} tables, {} rows, {} in {} blocks{} in {:.2} s ({:.0} rows/s, {:.0} MB/s), verified (reading back took {:.2} s of it)",
            rep.version,
            rep.tables,
            rep.rows,
            crate::units::human_bytes(rep.bytes),
            rep.blocks,
            if rep.resumed {
                format!(
                    " (resumed: {} blocks were already there)",
                    rep.blocks_skipped
                )
            } else {
                String::new()
            },
            rep.seconds,
            rep.rows as f64 / rep.seconds.max(1e-9),
            rep.bytes_written as f64 / rep.seconds.max(1e-9) / 1e6,
            rep.verify_seconds,
        );
        if rep.unreplicated_rounds > 0 {
            eprintln!(
                "warning: {} rounds were not acknowledged by {} replica(s) in time: a failover \
                 now could lose rows (they would be refused, never served as zeros; `ember \
                 registry verify` checks)",
                rep.unreplicated_rounds, replicas
            );
        }
    }
}

fn ls(a: ClusterArgs) -> Result<()> {
    let mut cluster = a.connect()?;
    let all = ember_registry::list(&mut cluster)?;
    if all.is_empty() {
        println!("no models in {}", cluster.name());
        return Ok(());
    }
    println!(
        "{:<24} {:>8} {:<9} {:>7} {:>12} {:>10}  SERVED",
        "MODEL", "VERSION", "STATE", "TABLES", "ROWS", "SIZE"
    );
    for (m, versions) in all {
        let promoted = ember_registry::served_version(&mut cluster, &m)?;
        let served = ember_registry::resolve_version(&mut cluster, &m, None).ok();
        for v in versions {
            println!(
                "{:<24} {:>8} {:<9} {:>7} {:>12} {:>10}  {}",
                m,
                v.version,
                v.state.name(),
                v.tables,
                v.rows,
                crate::units::human_bytes(v.bytes),
                match (served == Some(v.version), promoted.is_some()) {
                    (true, true) => "yes (promoted)",
                    (true, false) => "yes (newest ready)",
                    _ => "",
                }
            );
        }
    }
    Ok(())
}

fn verify(a: VersionArgs) -> Result<()> {
    let mut cluster = a.cluster.connect()?;
    let timeout = Duration::from_secs_f64(a.cluster.timeout_s);
    let rep = ember_registry::verify(&mut cluster, &a.model, a.version, timeout)?;
    if rep.bad.is_empty() {
        println!(
            "{} version {}: {} blocks, {} verified",
            a.model,
            a.version,
            rep.blocks,
            crate::units::human_bytes(rep.bytes)
        );
        if !rep.updated.is_empty() {
            println!(
                "{} of them rewritten by row updates since the push (ember registry update): their \
                 length checked, not the push's CRC",
                rep.updated.len()
            );
        }
        return Ok(());
    }
    for (t, b, what) in rep.bad.iter().take(20) {
        match t.starts_with('(') {
            true => eprintln!("{t}: {what}"),
            false => eprintln!("table '{t}' block {b}: {what}"),
        }
    }
    bail!(
        "{} version {}: {} of {} blocks are missing or damaged (push it again under a new version)",
        a.model,
        a.version,
        rep.bad.len(),
        rep.blocks
    )
}

fn rm(a: VersionArgs) -> Result<()> {
    let mut cluster = a.cluster.connect()?;
    let timeout = Duration::from_secs_f64(a.cluster.timeout_s);
    let n = ember_registry::remove(&mut cluster, &a.model, a.version, timeout)?;
    println!("{} version {} removed ({n} blocks)", a.model, a.version);
    Ok(())
}

fn promote(a: VersionArgs) -> Result<()> {
    let mut cluster = a.cluster.connect()?;
    let before = ember_registry::promote(&mut cluster, &a.model, a.version)?;
    match before {
        Some(b) if b == a.version => println!("{} version {} was already promoted", a.model, b),
        Some(b) => println!(
            "{} version {} promoted (was version {b}): servers started with --from-registry \
             swap it in",
            a.model, a.version
        ),
        None => println!(
            "{} version {} promoted: servers started with --from-registry swap it in",
            a.model, a.version
        ),
    }
    Ok(())
}
