//! `ember registry update`: new rows of a served table, written to the registry and published
//! on the table's update stream, which every server follows (see
//! `docs/remote-tier.md#row-updates`).
//!
//! The rows come from a safetensors file holding `ids` (a 1-D tensor of u64 / i64 / u32 / i32
//! row ids) and `rows` (a 2-D f32 tensor, one row of the table's dim per id), encoded to the
//! table's dtype in the registry, and published in entries of at most `--chunk-rows` rows.

use anyhow::{Context, Result, bail};
use clap::Args;
use ember_embed::EmbeddingTable;
use safetensors::{Dtype as StDtype, SafeTensors};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct UpdateArgs {
    #[command(flatten)]
    cluster: super::ClusterArgs,
    /// The model's name in the registry.
    #[arg(long)]
    model: String,
    /// The version to update [default: the newest ready one].
    #[arg(long)]
    version: Option<u64>,
    /// The table.
    #[arg(long)]
    table: String,
    /// A safetensors file with `ids` (1-D integers) and `rows` (2-D f32, ids x dim).
    #[arg(long)]
    rows: PathBuf,
    /// Rows per stream entry.
    #[arg(long, default_value_t = 4096)]
    chunk_rows: usize,
    /// Entries the stream keeps about (older ones are trimmed; a server that falls further
    /// behind drops its cache of the table).
    #[arg(long, default_value_t = ember_registry::updates::DEFAULT_MAX_LEN)]
    max_len: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// The ids and f32 rows of an update file.
fn read_file(path: &Path) -> Result<(Vec<u64>, Vec<f32>, usize)> {
    let bytes = ember_embed::files::read_limited(path, "the update file", 16 << 30)
        .with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{}: not a safetensors file", path.display()))?;
    let named = |name: &str| {
        st.tensor(name).with_context(|| {
            format!(
                "{}: no tensor '{name}' (want 'ids' and 'rows')",
                path.display()
            )
        })
    };
    let ids_t = named("ids")?;
    let rows_t = named("rows")?;
    if ids_t.shape().len() != 1 {
        bail!(
            "{}: 'ids' has shape {:?}, want 1-D",
            path.display(),
            ids_t.shape()
        );
    }
    let data = ids_t.data();
    let le = |b: &[u8]| {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        w
    };
    let wide: Vec<i128> = match ids_t.dtype() {
        StDtype::U64 => data
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(le(b)).into())
            .collect(),
        StDtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(le(b)).into())
            .collect(),
        StDtype::U32 => data
            .chunks_exact(4)
            .map(|b| u64::from_le_bytes(le(b)).into())
            .collect(),
        StDtype::I32 => data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()).into())
            .collect(),
        d => bail!("{}: 'ids' is {d:?}, want an integer type", path.display()),
    };
    let ids: Vec<u64> = wide
        .into_iter()
        .map(|v| {
            u64::try_from(v).with_context(|| format!("{}: id {v} is negative", path.display()))
        })
        .collect::<Result<_>>()?;
    if rows_t.dtype() != StDtype::F32 || rows_t.shape().len() != 2 || rows_t.shape()[0] != ids.len()
    {
        bail!(
            "{}: 'rows' is {:?} {:?}, want f32 of shape [{}, dim]",
            path.display(),
            rows_t.dtype(),
            rows_t.shape(),
            ids.len()
        );
    }
    let dim = rows_t.shape()[1];
    let vals = rows_t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Ok((ids, vals, dim))
}

pub fn run(a: UpdateArgs) -> Result<()> {
    if a.chunk_rows == 0 || a.chunk_rows > ember_registry::updates::MAX_ENTRY_ROWS {
        bail!(
            "--chunk-rows must be 1 to {}",
            ember_registry::updates::MAX_ENTRY_ROWS
        );
    }
    let (ids, vals, dim) = read_file(&a.rows)?;
    if ids.is_empty() {
        bail!("{}: no rows", a.rows.display());
    }
    let mut cl = a.cluster.connect()?;
    let version = ember_registry::resolve_version(&mut cl, &a.model, a.version)?;
    let manifest = ember_registry::read_manifest(&mut cl, &a.model, version)?;
    let Some(t) = manifest.table(&a.table) else {
        bail!("model '{}' v{version} has no table '{}'", a.model, a.table);
    };
    if dim != t.dim {
        bail!(
            "{}: rows of dim {dim}, table '{}' has dim {}",
            a.rows.display(),
            a.table,
            t.dim
        );
    }
    // Encoded in the table's own encoding, as the registry holds it.
    let encoded = EmbeddingTable::from_f32(&a.table, ids.len(), dim, t.dtype, &vals)?;
    let bytes = encoded.resident().expect("built in memory");
    let rb = t.row_bytes;
    let publisher = ember_registry::updates::Publisher::new(&a.model, version, t);
    let t0 = std::time::Instant::now();
    let mut entries = Vec::new();
    for (chunk, rows) in ids
        .chunks(a.chunk_rows)
        .zip(bytes.chunks(a.chunk_rows * rb))
    {
        entries.push(publisher.publish(&mut cl, chunk, rows, a.max_len)?.entry);
    }
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": a.model, "version": version, "table": a.table, "rows": ids.len(),
                "entries": entries, "seconds": secs,
            })
        );
    } else {
        println!(
            "updated {} rows of {}/v{version}/{} in {} entries ({:.3} s); last entry {}",
            ids.len(),
            a.model,
            a.table,
            entries.len(),
            secs,
            entries.last().map_or("-", String::as_str)
        );
    }
    Ok(())
}
