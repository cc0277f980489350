//! `ember convert`: writes row files (the SSD tier's format, see `ember_embed::storage::rowfile`)
//! from a model directory's tables or from the 2-D tensors of a safetensors file.

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use ember_embed::storage::{RowFile, write_row_file};
use ember_embed::{DType, Placement};
use ember_model::config::ModelConfig;
use ember_model::weights::row_file_path;
use ember_model::{LoadOptions, Model};
use safetensors::{Dtype as StDtype, SafeTensors};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// Model directory: writes DIR/rows/NAME.rows for its tables.
    #[arg(
        long,
        conflicts_with = "safetensors",
        required_unless_present = "safetensors"
    )]
    model: Option<PathBuf>,
    /// Tables to convert (comma-separated names) [default: all].
    #[arg(long, value_delimiter = ',')]
    tables: Option<Vec<String>>,
    /// Also set these tables' placement in config.json: ssd or mmap (dram keeps them in memory).
    #[arg(long)]
    placement: Option<Placement>,
    /// A safetensors file: writes OUT/NAME.rows for each 2-D f32, f16 or bf16 tensor (a leading
    /// `tables.` is dropped from the name; f32 and bf16 subnormals are flushed to zero, as the
    /// model loader does). Use this for tables larger than memory: `--model` loads every table.
    #[arg(long, requires = "out")]
    safetensors: Option<PathBuf>,
    /// Output directory for --safetensors.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Read every written file back and check all its blocks.
    #[arg(long)]
    verify: bool,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    match (&a.model, &a.safetensors) {
        (Some(dir), _) => from_model(&a, dir),
        (None, Some(file)) => {
            from_safetensors(&a, file, a.out.as_deref().unwrap_or(Path::new(".")))
        }
        (None, None) => bail!("give --model DIR or --safetensors FILE --out DIR"),
    }
}

fn done(path: &Path, verify: bool, t0: Instant) -> Result<()> {
    let f = RowFile::open(path)?;
    if verify {
        f.verify_all()?;
    }
    let h = f.header();
    eprintln!(
        "wrote {} ({} rows x dim {} {}, {} bytes{}) in {:.1} s",
        path.display(),
        h.rows,
        h.dim,
        h.dtype,
        h.file_bytes(),
        if verify { ", verified" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn from_model(a: &ConvertArgs, dir: &Path) -> Result<()> {
    let cfg_path = dir.join("config.json");
    let mut cfg = ModelConfig::read(&cfg_path)?;
    let names: Vec<String> = match &a.tables {
        Some(t) => t.clone(),
        None => cfg.tables.iter().map(|t| t.name.clone()).collect(),
    };
    for n in &names {
        ensure!(
            cfg.tables.iter().any(|t| &t.name == n),
            "model {} has no table '{n}' (tables: {})",
            dir.display(),
            cfg.tables
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // Load with every table in memory, from the safetensors file (so a retrained model can be
    // converted again, and a damaged row file is never the source).
    let model = Model::load(
        dir,
        LoadOptions {
            table_dtype: None,
            placement: Some(Placement::Dram),
            ..LoadOptions::default()
        },
    )
    .with_context(|| format!("loading model {}", dir.display()))?;
    std::fs::create_dir_all(dir.join("rows"))?;
    for t in model.embeddings().tables() {
        if !names.iter().any(|n| n == t.name()) {
            continue;
        }
        let Some(bytes) = t.resident() else {
            bail!("table '{}' was not loaded into memory", t.name());
        };
        let t0 = Instant::now();
        let path = row_file_path(dir, t.name());
        write_row_file(&path, t.name(), t.rows(), t.dim(), t.dtype(), bytes)?;
        done(&path, a.verify, t0)?;
    }
    if let Some(p) = a.placement {
        for t in cfg.tables.iter_mut().filter(|t| names.contains(&t.name)) {
            t.placement = p;
        }
        let text = serde_json::to_string_pretty(&cfg)? + "\n";
        let tmp = dir.join("config.json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &cfg_path)?;
        eprintln!("config.json: {} table(s) placed on {p}", names.len());
    }
    Ok(())
}

fn from_safetensors(a: &ConvertArgs, file: &Path, out: &Path) -> Result<()> {
    let f = ember_embed::files::open_regular(file, "weights file")
        .with_context(|| format!("opening {}", file.display()))?;
    // SAFETY: read-only mapping used only while the tensors are written out; the file is not
    // modified in place by Ember (see ember_model::weights).
    let map =
        unsafe { memmap2::Mmap::map(&f) }.with_context(|| format!("mapping {}", file.display()))?;
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| anyhow::anyhow!("{}: not a safetensors file: {e}", file.display()))?;
    std::fs::create_dir_all(out)?;
    let mut n = 0;
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    for name in names {
        let t = st.tensor(&name)?;
        let table = name.strip_prefix("tables.").unwrap_or(&name);
        if !ember_model::config::safe_file_name(table) {
            eprintln!("skipping {name}: the name cannot be a file name");
            continue;
        }
        if let Some(only) = &a.tables
            && !only.iter().any(|o| o == table)
        {
            continue;
        }
        let dtype = match t.dtype() {
            StDtype::F32 => DType::F32,
            StDtype::F16 => DType::F16,
            StDtype::BF16 => DType::BF16,
            other => {
                eprintln!(
                    "skipping {name}: dtype {other:?} (row files from safetensors take f32, f16 or bf16)"
                );
                continue;
            }
        };
        let [rows, dim] = t.shape() else {
            eprintln!("skipping {name}: shape {:?} is not [rows, dim]", t.shape());
            continue;
        };
        let t0 = Instant::now();
        let path = out.join(format!("{table}.rows"));
        // Subnormals read as zero, as when the model loads the table into memory, so that the tier
        // and DRAM pool the same bytes.
        let bytes = match dtype {
            DType::F32 | DType::BF16 => ember_model::weights::flush_bytes(t.data(), dtype),
            _ => t.data().to_vec(),
        };
        write_row_file(&path, table, *rows, *dim, dtype, &bytes)?;
        done(&path, a.verify, t0)?;
        n += 1;
    }
    ensure!(
        n > 0,
        "{} has no 2-D f32/f16/bf16 tensor to convert",
        file.display()
    );
    Ok(())
}
