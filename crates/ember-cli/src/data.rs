//! `ember data`: Criteo-format data tools, and random models of a benchmark shape on disk.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use ember_embed::rowfile::RowFileWriter;
use ember_embed::{DType, Placement};
use ember_model::config::TableConfig;
use ember_model::presets::RowsOptions;
use ember_model::{DenseDType, ModelConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Subcommand)]
pub enum DataCmd {
    /// Write synthetic Criteo-format TSV whose labels come from a hidden teacher model.
    Synth(SynthArgs),
    /// Write a model directory of a benchmark shape (rm1: 4 GB of tables; dlrm-v2 at full size:
    /// 204M rows, 14 GB in int4) with random weights, streamed to disk (memory stays small),
    /// tables in DRAM or on the SSD tier as they fit, for serving and benchmarks.
    Model(ModelArgs),
    /// Write synthetic users of an HSTU model (JSON lines, as `ember predict` reads them) in the
    /// shape of MLPerf DLRMv3's streaming data: a user id, a history of items with their
    /// categories, ratings, action bits and timestamps that advance, candidates sharing one query
    /// time after the last action.
    Users(UsersArgs),
}

#[derive(Debug, Args)]
pub struct UsersArgs {
    /// The HSTU model directory whose features and table sizes the users follow.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Users to write.
    #[arg(long, default_value_t = 8)]
    users: usize,
    /// History items of each user.
    #[arg(long, default_value_t = 256)]
    history: usize,
    /// Candidates of each user.
    #[arg(long, default_value_t = 64)]
    candidates: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// After each user's first request, this many returns: a random user comes back with 1 to
    /// --grow new actions and new candidates, carrying its whole history (a streaming replay
    /// for `ember loadgen --format users` and a history cache). Each user's requests are in its
    /// time order.
    #[arg(long, default_value_t = 0)]
    returns: usize,
    /// New actions a return: 1 to this many.
    #[arg(long, default_value_t = 8)]
    grow: usize,
    /// Output file (JSON lines).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The shape: rm1, small or dlrm-v2 (MLPerf DLRM-v2: 26 tables, 204M rows at full size), or
    /// an HSTU ranking model: dlrm-v3 (MLPerf DLRMv3: tables of 1e9 / 10M / 128 rows of 512 at
    /// full size) or hstu-small.
    #[arg(long)]
    preset: String,
    /// Output directory (config.json, model.safetensors and, for tables on the SSD tier,
    /// rows/NAME.rows are written there).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the weights (another seed: another model of the same shape). The directory
    /// holds the model `bench model --preset P --seed S` builds in memory: the same dense
    /// weights, and the same rows in any table dtype.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Every table's rows times this (rounded up): 1.0 is the preset's full size.
    #[arg(long, default_value_t = 1.0)]
    rows_scale: f64,
    /// Cap on each table's rows after scaling (0: none; the default is none, full size).
    #[arg(long, default_value_t = 0)]
    max_rows: usize,
    /// Table dtype: f32, f16, bf16, int8 (FBGEMM row-wise) or int4 (row-wise, f16 scale/bias).
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Dense precision written into config.json: f32, bf16 or int8.
    #[arg(long, default_value = "f32")]
    dense_dtype: DenseDType,
    /// Where the tables live: `dram` (all in model.safetensors), `ssd` (tables of at least
    /// --ssd-min-rows rows as row files on the SSD tier, the rest in DRAM), or `auto` (DRAM
    /// while they fit in --memory-budget-gb, the largest tables on the SSD tier beyond it).
    #[arg(long, default_value = "auto")]
    placement: String,
    /// With --placement ssd: tables of at least this many rows go to the SSD tier.
    #[arg(long, default_value_t = 10_000_000)]
    ssd_min_rows: usize,
    /// With --placement auto: GB of table rows kept in DRAM at most (default: 70% of the
    /// memory available now, less the row cache).
    #[arg(long)]
    memory_budget_gb: Option<f64>,
    /// The SSD tier's row cache (MiB) written into config.json when a table is on the SSD tier.
    #[arg(long, default_value_t = 2048)]
    cache_mb: usize,
    /// Threads that generate rows.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(1, |n| n.get()))]
    threads: usize,
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
        DataCmd::Users(a) => users(a),
    }
}

/// `data users`: synthetic streaming users of the model in `a.model`.
fn users(a: UsersArgs) -> Result<()> {
    let path = a.model.join("config.json");
    let cfg = ember_model::hstu::HstuModelConfig::read(&path)
        .with_context(|| format!("reading {} (an hstu model's)", path.display()))?;
    let mut users =
        ember_model::hstu::presets::synthetic_users(&cfg, a.users, a.history, a.candidates, a.seed);
    if a.returns > 0 {
        let mut s = ember_model::hstu::presets::UserStream::new(&cfg, a.users, a.seed);
        users = (0..a.users)
            .map(|u| s.user(u, a.history, a.candidates))
            .collect();
        for _ in 0..a.returns {
            users.push(s.next_request(a.grow, a.candidates, usize::MAX).1);
        }
    }
    let f =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = BufWriter::new(f);
    for u in &users {
        serde_json::to_writer(&mut w, u)?;
        w.write_all(b"\n")?;
    }
    w.flush()?;
    eprintln!(
        "wrote {} users of {} history items and {} candidates{} to {}",
        a.users,
        a.history,
        a.candidates,
        match a.returns {
            0 => String::new(),
            n => format!(", then {n} returns of 1-{} new actions each", a.grow),
        },
        a.out.display()
    );
    Ok(())
}

/// A tensor of `model.safetensors` as it is streamed: dense weights held in memory, or table
/// `t`'s rows generated as they are written.
enum Source {
    Dense(Vec<f32>),
    Table(usize),
}

/// Bytes of each table's rows.
fn table_bytes(tables: &[TableConfig]) -> Vec<u64> {
    tables
        .iter()
        .map(|t| (t.rows * t.dtype.row_bytes(t.dim)) as u64)
        .collect()
}

/// Which tables go to the SSD tier (`bytes`: each table's, [`table_bytes`]).
fn place(a: &ModelArgs, tables: &[TableConfig], bytes: &[u64]) -> Result<Vec<bool>> {
    match a.placement.as_str() {
        "dram" => Ok(vec![false; bytes.len()]),
        "ssd" => Ok(tables.iter().map(|t| t.rows >= a.ssd_min_rows).collect()),
        "auto" => {
            let budget = match a.memory_budget_gb {
                Some(gb) => (gb * 1e9) as u64,
                None => {
                    let avail = crate::units::mem_available().map_or(u64::MAX / 2, |b| b as u64);
                    ((avail as f64 * 0.7) as u64).saturating_sub((a.cache_mb as u64) << 20)
                }
            };
            let mut ssd = vec![false; bytes.len()];
            let mut dram: u64 = bytes.iter().sum();
            let mut order: Vec<usize> = (0..bytes.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(bytes[i]));
            for i in order {
                if dram <= budget {
                    break;
                }
                ssd[i] = true;
                dram -= bytes[i];
            }
            Ok(ssd)
        }
        p => anyhow::bail!("--placement '{p}' is not one of dram, ssd, auto"),
    }
}

/// Rows generated per parallel task.
const CHUNK: usize = 8192;

/// Table `t`'s rows (`seeded_row`'s, encoded in its dtype), generated on the pool `64 CHUNK`
/// rows a thread at a time and handed to `sink` in order, the bar moved along.
fn stream_table(
    pool: &rayon::ThreadPool,
    seed: u64,
    t: usize,
    table: &ember_model::config::TableConfig,
    bar: &ProgressBar,
    mut sink: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    use rayon::prelude::*;
    let (dim, dtype) = (table.dim, table.dtype);
    let rb = dtype.row_bytes(dim);
    let step = 64 * CHUNK * pool.current_num_threads();
    let mut buf = Vec::new();
    bar.set_message(table.name.clone());
    let mut r0 = 0;
    while r0 < table.rows {
        let n = step.min(table.rows - r0);
        buf.resize(n * rb, 0);
        pool.install(|| {
            buf.par_chunks_mut(CHUNK * rb)
                .enumerate()
                .for_each(|(c, chunk)| {
                    let mut tmp = vec![0f32; dim];
                    for (i, row) in chunk.chunks_exact_mut(rb).enumerate() {
                        ember_model::random::seeded_row(seed, t, r0 + c * CHUNK + i, &mut tmp);
                        dtype.encode_row(&tmp, row);
                    }
                })
        });
        sink(&buf)?;
        bar.inc(buf.len() as u64);
        r0 += n;
    }
    Ok(())
}

/// The safetensors dtype and shape of a table's tensor (`model-format.md`).
fn table_tensor(rows: usize, dim: usize, dtype: DType) -> (&'static str, Vec<usize>) {
    match dtype {
        DType::F32 => ("F32", vec![rows, dim]),
        DType::F16 => ("F16", vec![rows, dim]),
        DType::BF16 => ("BF16", vec![rows, dim]),
        DType::Int8 | DType::Int4 => ("U8", vec![rows, dtype.row_bytes(dim)]),
    }
}

/// `data model`: a preset's model directory of random weights: `model.safetensors` (the dense
/// weights and the DRAM tables), the SSD tier's row files, and `config.json`.
fn model(a: ModelArgs) -> Result<()> {
    let (tables, dense, config, bytes, ssd) =
        match ember_model::hstu::presets::PRESETS.contains(&a.preset.as_str()) {
            true => placed_hstu_config(&a)?,
            false => {
                let (cfg, bytes, ssd) = placed_config(&a)?;
                let dense = ember_model::random_dense_tensors(&cfg, a.seed)?;
                (
                    cfg.tables.clone(),
                    dense,
                    serde_json::to_vec_pretty(&cfg)?,
                    bytes,
                    ssd,
                )
            }
        };
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.max(1))
        .build()?;
    // model.safetensors: the dense weights, then the DRAM tables, streamed.
    let list = tensor_list(dense, &tables, &ssd);
    let header = safetensors_header(&list, &bytes)?;
    let total: u64 = bytes.iter().sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let t0 = Instant::now();
    let rows_from = RowMaker {
        pool: &pool,
        seed: a.seed,
        bar: &bar,
    };
    write_safetensors(&a.out, &tables, &list, &header, &rows_from)?;
    write_row_files(&a.out, &tables, &ssd, &rows_from)?;
    bar.finish_and_clear();
    std::fs::write(a.out.join("config.json"), config)?;
    print_written(&a, &tables, &bytes, &ssd, t0);
    Ok(())
}

/// The preset's config in `--dtype` and `--dense-dtype`, each table's bytes, and which tables
/// are placed on the SSD tier (with `--cache-mb` for its cache when any is).
fn placed_config(a: &ModelArgs) -> Result<(ModelConfig, Vec<u64>, Vec<bool>)> {
    let rows = RowsOptions {
        scale: a.rows_scale,
        max_rows: Some(a.max_rows),
    };
    let mut cfg = ember_model::presets::preset_with(&a.preset, a.dtype, rows)?.config;
    cfg.dense_dtype = a.dense_dtype;
    let (bytes, ssd) = place_tables(a, &mut cfg.tables, &mut cfg.tier)?;
    Ok((cfg, bytes, ssd))
}

/// Places `tables` as `--placement` says (those on the SSD tier marked so, and `tier` given
/// `--cache-mb` when any is): each table's bytes, and which are on the SSD tier.
fn place_tables(
    a: &ModelArgs,
    tables: &mut [TableConfig],
    tier: &mut Option<ember_model::config::TierConfig>,
) -> Result<(Vec<u64>, Vec<bool>)> {
    let bytes = table_bytes(tables);
    let ssd = place(a, tables, &bytes)?;
    for (t, on_ssd) in tables.iter_mut().zip(&ssd) {
        if *on_ssd {
            t.placement = Placement::Ssd;
        }
    }
    if ssd.iter().any(|&s| s) {
        tier.get_or_insert_with(Default::default).cache_mb = a.cache_mb;
    }
    Ok((bytes, ssd))
}

/// An HSTU preset's (`dlrm-v3`, `hstu-small`) tables, dense tensors and config.json, each
/// table's bytes, and which tables are placed on the SSD tier.
#[allow(clippy::type_complexity)]
fn placed_hstu_config(
    a: &ModelArgs,
) -> Result<(
    Vec<TableConfig>,
    Vec<ember_model::NamedTensor>,
    Vec<u8>,
    Vec<u64>,
    Vec<bool>,
)> {
    let mut cfg = ember_model::hstu::presets::preset(&a.preset, a.rows_scale, a.dtype)
        .expect("a preset of the list");
    if a.max_rows > 0 {
        cfg.tables
            .iter_mut()
            .for_each(|t| t.rows = t.rows.min(a.max_rows));
    }
    cfg.dense_dtype = a.dense_dtype;
    let (bytes, ssd) = place_tables(a, &mut cfg.tables, &mut cfg.tier)?;
    let dense = ember_model::hstu::random_dense_tensors(&cfg, a.seed)?;
    Ok((
        cfg.tables.clone(),
        dense,
        serde_json::to_vec_pretty(&cfg)?,
        bytes,
        ssd,
    ))
}

/// A tensor of `model.safetensors`: its name, dtype, shape, and where its bytes come from.
type Tensor = (String, &'static str, Vec<usize>, Source);

/// The tensors of `model.safetensors` in the order they are written: the dense weights of
/// `seed`, then the tables not on the SSD tier (`ssd`).
fn tensor_list(
    dense: Vec<ember_model::NamedTensor>,
    tables: &[TableConfig],
    ssd: &[bool],
) -> Vec<Tensor> {
    let mut list: Vec<Tensor> = dense
        .into_iter()
        .map(|(n, shape, v)| (n, "F32", shape, Source::Dense(v)))
        .collect();
    for (i, t) in tables.iter().enumerate() {
        if !ssd[i] {
            let (dt, shape) = table_tensor(t.rows, t.dim, t.dtype);
            list.push((format!("tables.{}", t.name), dt, shape, Source::Table(i)));
        }
    }
    list
}

/// The safetensors header of `list` (each table `bytes[i]` long), as JSON padded with spaces
/// to a multiple of 8 bytes.
fn safetensors_header(list: &[Tensor], bytes: &[u64]) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for (name, dt, shape, src) in list {
        let len = match src {
            Source::Dense(v) => 4 * v.len(),
            Source::Table(i) => bytes[*i] as usize,
        };
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut h = serde_json::to_vec(&header)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    Ok(h)
}

/// How tables' rows are made as they are written: generated on `pool` from `seed`, moving
/// `bar` along.
struct RowMaker<'a> {
    pool: &'a rayon::ThreadPool,
    seed: u64,
    bar: &'a ProgressBar,
}

/// Writes `dir/model.safetensors` (through a temporary file, renamed when complete and
/// synced): the header `h`, then the tensors of `list`.
fn write_safetensors(
    dir: &std::path::Path,
    tables: &[TableConfig],
    list: &[Tensor],
    h: &[u8],
    rows_from: &RowMaker<'_>,
) -> Result<()> {
    let path = dir.join("model.safetensors");
    let tmp = dir.join(".model.safetensors.tmp");
    let f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut w = BufWriter::with_capacity(8 << 20, f);
    let write = |w: &mut BufWriter<std::fs::File>| -> Result<()> {
        w.write_all(&(h.len() as u64).to_le_bytes())?;
        w.write_all(h)?;
        for (_, _, _, src) in list {
            match src {
                Source::Dense(v) => {
                    let le: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    w.write_all(&le)?;
                }
                Source::Table(i) => {
                    let t = &tables[*i];
                    let (pool, bar) = (rows_from.pool, rows_from.bar);
                    stream_table(pool, rows_from.seed, *i, t, bar, |b| Ok(w.write_all(b)?))?;
                }
            }
        }
        w.flush()?;
        Ok(w.get_ref().sync_all()?)
    };
    write(&mut w).with_context(|| format!("writing {}", tmp.display()))?;
    drop(w);
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// Writes the row file (`dir/rows/NAME.rows`) of each table on the SSD tier (`ssd`).
fn write_row_files(
    dir: &std::path::Path,
    tables: &[TableConfig],
    ssd: &[bool],
    rows_from: &RowMaker<'_>,
) -> Result<()> {
    if ssd.iter().any(|&s| s) {
        std::fs::create_dir_all(dir.join("rows"))?;
    }
    for (i, t) in tables.iter().enumerate().filter(|(i, _)| ssd[*i]) {
        let file = dir.join("rows").join(format!("{}.rows", t.name));
        let mut rw = RowFileWriter::create(&file, &t.name, t.rows, t.dim, t.dtype)?;
        stream_table(rows_from.pool, rows_from.seed, i, t, rows_from.bar, |b| {
            Ok(rw.write_rows(b)?)
        })?;
        rw.finish()?;
    }
    Ok(())
}

/// The line saying what was written: tables, bytes in DRAM and on the SSD tier (`bytes`,
/// `ssd`), the dense precision, the seed, and the seconds since `t0`.
fn print_written(a: &ModelArgs, tables: &[TableConfig], bytes: &[u64], ssd: &[bool], t0: Instant) {
    let total: u64 = bytes.iter().sum();
    let on_ssd: Vec<&str> = tables
        .iter()
        .zip(ssd)
        .filter(|(_, s)| **s)
        .map(|(t, _)| t.name.as_str())
        .collect();
    let ssd_bytes: u64 = bytes
        .iter()
        .zip(ssd)
        .filter(|(_, s)| **s)
        .map(|(b, _)| b)
        .sum();
    eprintln!(
        "wrote {} ({}, {} tables, {} rows of {}; {:.2} GB of tables: {:.2} GB in DRAM, {:.2} GB on the SSD tier{}; dense {}; seed {}) in {:.1}s",
        a.out.display(),
        a.preset,
        tables.len(),
        tables.iter().map(|t| t.rows).sum::<usize>(),
        a.dtype,
        total as f64 / 1e9,
        (total - ssd_bytes) as f64 / 1e9,
        ssd_bytes as f64 / 1e9,
        if on_ssd.is_empty() {
            String::new()
        } else {
            format!(" ({})", on_ssd.join(", "))
        },
        a.dense_dtype,
        a.seed,
        t0.elapsed().as_secs_f64()
    );
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
