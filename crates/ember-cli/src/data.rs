//! `ember data`: Criteo-format data tools, and random models of a benchmark shape on disk.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::io::{BufWriter, Write};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum DataCmd {
    /// Write synthetic Criteo-format TSV whose labels come from a hidden teacher model.
    Synth(SynthArgs),
    /// Write a model directory of a benchmark shape (rm1: 4 GB of tables) with random weights,
    /// streamed to disk (memory stays small), for serving and swap benchmarks.
    Model(ModelArgs),
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The shape: rm1 or small.
    #[arg(long)]
    preset: String,
    /// Output directory (config.json and model.safetensors are written there).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the weights (another seed: another model of the same shape).
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
        DataCmd::Model(a) => model(a),
    }
}

/// The tensors of a DLRM of `cfg`'s shape, in file order: name, shape, and the bound of its
/// uniform values.
fn tensors(cfg: &ember_model::ModelConfig) -> Vec<(String, Vec<usize>, f32)> {
    let mut out = Vec::new();
    let mut mlp = |prefix: &str, mut k_in: usize, sizes: &[usize]| {
        for (k, &n) in sizes.iter().enumerate() {
            let bound = (3.0 / k_in as f32).sqrt();
            out.push((format!("{prefix}.{k}.weight"), vec![n, k_in], bound));
            out.push((format!("{prefix}.{k}.bias"), vec![n], 0.01));
            k_in = n;
        }
    };
    mlp("bottom_mlp", cfg.dense_in, &cfg.bottom_mlp);
    mlp("top_mlp", cfg.top_in(), &cfg.top_mlp);
    for t in &cfg.tables {
        out.push((format!("tables.{}", t.name), vec![t.rows, t.dim], 0.05));
    }
    out
}

fn model(a: ModelArgs) -> Result<()> {
    let preset = ember_model::presets::preset(&a.preset, ember_embed::DType::F32)?;
    let cfg = preset.config;
    if !matches!(cfg.interaction, ember_model::InteractionConfig::Dot { .. }) {
        anyhow::bail!("preset {} is not a dot-interaction DLRM", a.preset);
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let list = tensors(&cfg);
    // The safetensors header: every tensor's dtype, shape and byte range, in file order.
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for (name, shape, _) in &list {
        let bytes = 4 * shape.iter().product::<usize>();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    let mut h = serde_json::to_vec(&header)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let path = a.out.join("model.safetensors");
    let tmp = a.out.join(".model.safetensors.tmp");
    let f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(4 << 20, f);
    let write = |w: &mut BufWriter<std::fs::File>| -> std::io::Result<()> {
        w.write_all(&(h.len() as u64).to_le_bytes())?;
        w.write_all(&h)?;
        let mut s = a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut buf = Vec::with_capacity(1 << 20);
        for (_, shape, bound) in &list {
            let mut left = shape.iter().product::<usize>();
            while left > 0 {
                let n = left.min(1 << 18);
                buf.clear();
                for _ in 0..n {
                    // xorshift64*: uniform in [-bound, bound).
                    s ^= s >> 12;
                    s ^= s << 25;
                    s ^= s >> 27;
                    let u =
                        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
                    buf.extend_from_slice(&((u * 2.0 - 1.0) * bound).to_le_bytes());
                }
                w.write_all(&buf)?;
                left -= n;
            }
        }
        w.flush()?;
        w.get_ref().sync_all()
    };
    write(&mut w).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path)?;
    let config = serde_json::to_vec_pretty(&cfg)?;
    std::fs::write(a.out.join("config.json"), config)?;
    eprintln!(
        "wrote {} ({}, {:.2} GB of weights, seed {})",
        a.out.display(),
        a.preset,
        at as f64 / 1e9,
        a.seed
    );
    Ok(())
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
