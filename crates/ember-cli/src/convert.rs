//! `ember convert`: writes row files (the SSD tier's format, see `ember_tier::storage::rowfile`)
//! from a model directory's tables or from the 2-D tensors of a safetensors file.

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use ember_embed::rowfile::{RowFile, RowLayout, write_row_file, write_row_file_laid_out};
use ember_embed::trace::{load_trace, profile_path};
use ember_embed::{DType, Placement};

use ember_model::weights::row_file_path;
use ember_model::{AnyConfig, AnyModel, LoadOptions};
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
    /// Lay the rows out by this profile (an id trace, one id per line, as `pin_trace`): the
    /// hottest rows first, then the others it meets by first access, so that rows read together
    /// share blocks. Ids are unchanged. A file applies to every table converted (use --tables);
    /// a directory holds one per table, DIR/<table>.ids, as `ember serve --profile-dir` writes
    /// them from a served model's lookups.
    #[arg(long)]
    layout_profile: Option<PathBuf>,
    /// Rows placed first by heat [default: the rows the table's share of the tier's cache_mb
    /// holds, as config.json sets it (the whole budget with --safetensors)].
    #[arg(long, requires = "layout_profile")]
    layout_hot_rows: Option<usize>,
}

/// The profile of `--layout-profile`: one trace for every table, read once, or a directory of
/// one per table, each read when its table is written.
enum Profile {
    One { path: PathBuf, ids: Vec<u64> },
    PerTable { dir: PathBuf },
}

impl Profile {
    fn read(a: &ConvertArgs) -> Result<Option<Self>> {
        let Some(path) = &a.layout_profile else {
            return Ok(None);
        };
        if path.is_dir() {
            return Ok(Some(Profile::PerTable { dir: path.clone() }));
        }
        let ids = load_trace(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Some(Profile::One {
            path: path.clone(),
            ids,
        }))
    }

    /// The layout of a `rows`-row table with `hot` rows first by heat, said on stderr.
    fn layout(&self, table: &str, rows: usize, hot: usize) -> Result<RowLayout> {
        let loaded;
        let (path, ids): (PathBuf, &[u64]) = match self {
            Profile::One { path, ids } => (path.clone(), ids),
            Profile::PerTable { dir } => {
                let path = profile_path(dir, table)?;
                if !path.is_file() {
                    bail!(
                        "--layout-profile {}: no profile of table '{table}' ({} is missing; \
                         `ember serve --profile-dir` writes one per table the model looked up, \
                         or leave the table out with --tables)",
                        dir.display(),
                        path.display()
                    );
                }
                loaded =
                    load_trace(&path).with_context(|| format!("reading {}", path.display()))?;
                (path, &loaded)
            }
        };
        let (l, s) = RowLayout::from_profile(rows, ids, hot)?;
        eprintln!(
            "{table}: laid out by {}: {} hot rows by heat, {} by first access, {} unmet{}",
            path.display(),
            s.hot,
            s.warm,
            s.cold,
            if s.out_of_range > 0 {
                format!(
                    " ({} profile ids past its {rows} rows ignored)",
                    s.out_of_range
                )
            } else {
                String::new()
            }
        );
        Ok(l)
    }
}

/// Writes `bytes` (rows in id order) as `path`, laid out when a profile is given.
fn write_table(
    path: &Path,
    name: &str,
    rows: usize,
    dim: usize,
    dtype: DType,
    bytes: &[u8],
    profile: Option<(&Profile, usize)>,
) -> Result<()> {
    match profile {
        Some((p, hot)) => {
            let layout = p.layout(name, rows, hot)?;
            write_row_file_laid_out(path, name, dim, dtype, bytes, &layout)?;
        }
        None => write_row_file(path, name, rows, dim, dtype, bytes)?,
    }
    Ok(())
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
        "wrote {} ({} rows x dim {} {}, {} bytes{}{}) in {:.1} s",
        path.display(),
        h.rows,
        h.dim,
        h.dtype,
        h.file_bytes(),
        if h.laid_out() { ", laid out" } else { "" },
        if verify { ", verified" } else { "" },
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn from_model(a: &ConvertArgs, dir: &Path) -> Result<()> {
    let cfg_path = dir.join("config.json");
    let mut cfg = AnyConfig::read(&cfg_path)?;
    let names: Vec<String> = match &a.tables {
        Some(t) => t.clone(),
        None => cfg.tables().iter().map(|t| t.name.clone()).collect(),
    };
    for n in &names {
        ensure!(
            cfg.tables().iter().any(|t| &t.name == n),
            "model {} has no table '{n}' (tables: {})",
            dir.display(),
            cfg.tables()
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // Load with every table in memory, from the safetensors file (so a retrained model can be
    // converted again, and a damaged row file is never the source).
    let model = AnyModel::load(
        dir,
        LoadOptions {
            table_dtype: None,
            placement: Some(Placement::Dram),
            ..LoadOptions::default()
        },
    )
    .with_context(|| format!("loading model {}", dir.display()))?;
    std::fs::create_dir_all(dir.join("rows"))?;
    let profile = Profile::read(a)?;
    // The cache budget is shared by the tier's tables in proportion to their sizes: those
    // placed on ssd once this conversion is done, or else the ones converted.
    let on_ssd = |name: &str| match a.placement {
        Some(p) if names.iter().any(|n| n == name) => p == Placement::Ssd,
        _ => cfg
            .tables()
            .iter()
            .any(|t| t.name == name && t.placement == Placement::Ssd),
    };
    let placed_mmap = |name: &str| match a.placement {
        Some(p) => p == Placement::Mmap,
        None => cfg
            .tables()
            .iter()
            .any(|t| t.name == name && t.placement == Placement::Mmap),
    };
    if profile.is_some()
        && let Some(n) = names.iter().find(|n| placed_mmap(n))
    {
        bail!(
            "table '{n}' is placed on mmap, which reads rows in place in id order: a layout \
             (--layout-profile) needs the ssd placement (--placement ssd)"
        );
    }
    let tables = model.embeddings().tables();
    let mut share_of: Vec<_> = tables.iter().filter(|t| on_ssd(t.name())).collect();
    if share_of.is_empty() {
        share_of = tables
            .iter()
            .filter(|t| names.iter().any(|n| n == t.name()))
            .collect();
    }
    let shared_bytes: usize = share_of.iter().map(|t| t.rows() * t.stride()).sum();
    let cache_bytes = cfg.tier_mut().as_ref().map_or(1024, |t| t.cache_mb) << 20;
    for t in tables {
        if !names.iter().any(|n| n == t.name()) {
            continue;
        }
        let Some(bytes) = t.resident() else {
            bail!("table '{}' was not loaded into memory", t.name());
        };
        let t0 = Instant::now();
        let path = row_file_path(dir, t.name());
        let hot = a.layout_hot_rows.unwrap_or_else(|| {
            let share =
                cache_bytes as f64 * (t.rows() * t.stride()) as f64 / shared_bytes.max(1) as f64;
            (share / t.stride() as f64) as usize
        });
        write_table(
            &path,
            t.name(),
            t.rows(),
            t.dim(),
            t.dtype(),
            bytes,
            profile.as_ref().map(|p| (p, hot)),
        )?;
        done(&path, a.verify, t0)?;
    }
    if let Some(p) = a.placement {
        place(&mut cfg, &cfg_path, &names, p)?;
    }
    Ok(())
}

/// Sets `names`' placement to `p` in `cfg` and writes it to `cfg_path` (beside it, then renamed
/// into place).
fn place(cfg: &mut AnyConfig, cfg_path: &Path, names: &[String], p: Placement) -> Result<()> {
    for t in cfg
        .tables_mut()
        .iter_mut()
        .filter(|t| names.contains(&t.name))
    {
        t.placement = p;
    }
    let mut text = cfg.to_json();
    text.push(b'\n');
    let tmp = cfg_path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, cfg_path)?;
    eprintln!("config.json: {} table(s) placed on {p}", names.len());
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
    let profile = Profile::read(a)?;
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
        let hot = a
            .layout_hot_rows
            .unwrap_or((1024 << 20) / dtype.row_bytes(*dim).max(1));
        write_table(
            &path,
            table,
            *rows,
            *dim,
            dtype,
            &bytes,
            profile.as_ref().map(|p| (p, hot)),
        )?;
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
