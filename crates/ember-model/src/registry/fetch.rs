//! [`RegistryModel`]: a model in the registry as a server built from the registry alone follows
//! it: the version to serve (the promoted one, else the newest ready one) and
//! [`RegistryModel::fetch`], which writes a version as a model directory that
//! `crate::Model::load` reads: `config.json` with the tables placed `remote` (those placed
//! `ssd` or `mmap` too: their rows are in the registry) or `dram`, and `model.safetensors`
//! holding the dense weights and the `dram` tables, read from the registry block by block and
//! checked against the push's CRC-32s.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::AnyConfig;
use crate::config::{RemoteConfig, TableConfig};
use crate::{ModelError, Result};
use ember_embed::{DType, Placement};
use ember_redis::{Cluster, ClusterOptions};
use ember_registry::{self as registry, Manifest, layout, read_files, read_tables, store_error};

use super::header::{Entry, TABLE_PREFIX, header_of_bytes, pack, write_header};

/// What [`RegistryModel::fetch`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    /// The version fetched.
    pub version: u64,
    /// Bytes of `dram` tables read from the registry.
    pub table_bytes: usize,
    /// Seconds the fetch took.
    pub seconds: f64,
}

/// A model in the registry, as a server built from the registry alone follows it.
#[derive(Debug)]
pub struct RegistryModel {
    cluster: Cluster,
    url: String,
    model: String,
    /// Deadline of one call reading blocks.
    timeout: Duration,
}

impl RegistryModel {
    /// Connects to the cluster at `url` (`redis://host:port[,...]`) for model `model`.
    pub fn connect(url: &str, model: &str) -> Result<Self> {
        layout::check_name("model", model)?;
        let mut o = ClusterOptions::parse(url).map_err(store_error)?;
        o.timeout = Duration::from_secs(5);
        o.connect_timeout = Duration::from_secs(2);
        Ok(RegistryModel {
            cluster: Cluster::connect(o).map_err(store_error)?,
            url: url.into(),
            model: model.into(),
            timeout: Duration::from_secs(30),
        })
    }

    /// The model's name in the registry.
    pub fn name(&self) -> &str {
        &self.model
    }

    /// The version to serve: the promoted one (`ember registry promote`), else the newest ready.
    pub fn target(&mut self) -> Result<u64> {
        Ok(registry::resolve_version(
            &mut self.cluster,
            &self.model,
            None,
        )?)
    }

    /// Writes `version` as a model directory at `dir` (written beside it and renamed into place,
    /// so that `dir` is whole or absent; an existing `dir` is replaced).
    pub fn fetch(&mut self, version: u64, dir: &Path) -> Result<Fetched> {
        let start = Instant::now();
        let manifest = registry::read_manifest(&mut self.cluster, &self.model, version)?;
        let files = read_files(&mut self.cluster, &manifest)?;
        let (config, dram) = self.config_of(&manifest, &files.config)?;
        let dense_path = PathBuf::from(layout::file_key(&self.model, version, "dense"));
        let weights = Weights::plan(&manifest, dram, &dense_path, &files.dense)?;
        let part = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&part);
        std::fs::create_dir_all(&part).map_err(io_err(&part))?;
        let weights_path = part.join("model.safetensors");
        let table_bytes = self.write_weights(&manifest, &weights, &files.dense, &weights_path)?;
        let cfg_path = part.join("config.json");
        std::fs::write(&cfg_path, config.to_json()).map_err(io_err(&cfg_path))?;
        if let AnyConfig::Dlrm(c) = &config
            && let Some((file, _)) = c.graph()
        {
            let Some(g) = &files.graph else {
                return Err(ModelError::Config {
                    path: cfg_path,
                    reason: format!(
                        "a graph model pushed without its graph ({file}): push the model \
                         directory again"
                    ),
                });
            };
            let p = part.join(file);
            std::fs::write(&p, g).map_err(io_err(&p))?;
        }
        let _ = std::fs::remove_dir_all(dir);
        std::fs::rename(&part, dir).map_err(io_err(dir))?;
        Ok(Fetched {
            version,
            table_bytes,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// The config a server loads `manifest`'s version with, from the one pushed (`pushed`,
    /// checked): the tables as pushed and placed from the registry ([`place_tables`]), no pin
    /// trace (a path on the pushing machine), and a `remote` object naming this registry and
    /// version. Returns it and the manifest's indices of the tables held in memory.
    fn config_of(&self, manifest: &Manifest, pushed: &[u8]) -> Result<(AnyConfig, Vec<usize>)> {
        let version = manifest.version;
        let from = PathBuf::from(layout::file_key(&self.model, version, "config"));
        let bad = |reason: String| ModelError::Config {
            path: from.clone(),
            reason,
        };
        let mut config = AnyConfig::from_slice(pushed, &from)?;
        let dram = place_tables(config.tables_mut(), manifest).map_err(bad)?;
        if let Some(tier) = config.tier_mut().as_mut() {
            tier.pin_trace = None;
        }
        *config.remote_mut() = Some(RemoteConfig {
            model: Some(self.model.clone()),
            version: Some(version),
            ..RemoteConfig::new(&self.url)
        });
        Ok((config, dram))
    }

    /// Writes `model.safetensors` at `path` as `weights` lays it out: its header, the dense
    /// tensors copied from `dense` (the dense weights as pushed), then the tables held in
    /// memory, read from the registry. Returns the bytes of tables read.
    fn write_weights(
        &mut self,
        manifest: &Manifest,
        weights: &Weights,
        dense: &[u8],
        path: &Path,
    ) -> Result<usize> {
        let head = write_header(&weights.entries);
        let file = File::create(path).map_err(io_err(path))?;
        let data_len = weights.entries.last().map_or(0, |e| e.range.end);
        file.set_len((head.len() + data_len) as u64)
            .map_err(io_err(path))?;
        file.write_all_at(&head, 0).map_err(io_err(path))?;
        let data_at = head.len() as u64;
        let at = weights.dense_at;
        for (e, src) in weights.entries.iter().zip(&weights.sources) {
            let bytes = &dense[at + src.start..at + src.end];
            file.write_all_at(bytes, data_at + e.range.start as u64)
                .map_err(io_err(path))?;
        }
        let table_bytes = self.read_tables_into(manifest, weights, &file, path, data_at)?;
        file.sync_all().map_err(io_err(path))?;
        Ok(table_bytes)
    }

    /// Reads the tables held in memory from the registry, block by block and checked (see
    /// [`read_tables`]), into `file` at `path`, whose data section starts at `data_at`. Returns
    /// the bytes read.
    fn read_tables_into(
        &mut self,
        manifest: &Manifest,
        weights: &Weights,
        file: &File,
        path: &Path,
        data_at: u64,
    ) -> Result<usize> {
        let table_at: Vec<(usize, u64)> = weights
            .dram
            .iter()
            .zip(&weights.entries[weights.sources.len()..])
            .map(|(&i, e)| (i, data_at + e.range.start as u64))
            .collect();
        let mut failed: Option<std::io::Error> = None;
        let mut table_bytes = 0;
        let sink = &mut |t: usize, b: usize, bytes: &[u8]| {
            let Some(&(_, at)) = table_at.iter().find(|e| e.0 == t) else {
                return;
            };
            let mt = &manifest.tables[t];
            let off = at + (mt.block_rows(b).start * mt.row_bytes) as u64;
            table_bytes += bytes.len();
            if let Err(e) = file.write_all_at(bytes, off)
                && failed.is_none()
            {
                failed = Some(e);
            }
        };
        read_tables(
            &mut self.cluster,
            manifest,
            &weights.dram,
            self.timeout,
            sink,
        )?;
        match failed {
            Some(e) => Err(io_err(path)(e)),
            None => Ok(table_bytes),
        }
    }
}

/// The layout of a fetched version's `model.safetensors`: the dense weights as pushed, then the
/// tables held in memory.
#[derive(Debug)]
struct Weights {
    /// Every tensor, packed in order: the dense ones, then one per table in `dram`.
    entries: Vec<Entry>,
    /// Each dense tensor's bytes in the data section of the dense weights as pushed.
    sources: Vec<Range<usize>>,
    /// Where that data section starts.
    dense_at: usize,
    /// The manifest's index of each table held in memory.
    dram: Vec<usize>,
}

impl Weights {
    /// The layout for `manifest`'s version: the dense weights `dense` (read from `dense_path`
    /// in the registry; their header checked), then the tables `dram` (indices into the
    /// manifest's), each as a tensor of its rows in their own encoding.
    fn plan(
        manifest: &Manifest,
        dram: Vec<usize>,
        dense_path: &Path,
        dense: &[u8],
    ) -> Result<Self> {
        let (mut entries, dense_at) = header_of_bytes(dense_path, dense)?;
        let sources = entries.iter().map(|e| e.range.clone()).collect();
        for &i in &dram {
            let mt = &manifest.tables[i];
            let (dtype, cols) = match mt.dtype {
                DType::F32 => ("F32", mt.dim),
                DType::F16 => ("F16", mt.dim),
                DType::BF16 => ("BF16", mt.dim),
                DType::Int8 | DType::Int4 => ("U8", mt.row_bytes),
            };
            entries.push(Entry {
                name: format!("{TABLE_PREFIX}{}", mt.name),
                dtype: dtype.into(),
                shape: vec![mt.rows, cols],
                range: 0..mt.bytes(),
            });
        }
        pack(&mut entries);
        Ok(Weights {
            entries,
            sources,
            dense_at,
            dram,
        })
    }
}

/// Gives a config's `tables` their dtype as pushed (it may differ from the config's: `push
/// --table-dtype`) and their placement from the registry: `dram` ones stay held in memory, the
/// others are read `remote`. Returns the manifest's indices of the `dram` ones; an error says
/// which table does not match the manifest.
fn place_tables(
    tables: &mut [TableConfig],
    manifest: &Manifest,
) -> std::result::Result<Vec<usize>, String> {
    let version = manifest.version;
    let mut dram = Vec::new();
    for t in tables.iter_mut() {
        let Some(i) = manifest.tables.iter().position(|m| m.name == t.name) else {
            return Err(format!(
                "table '{}' is not in version {version}'s manifest",
                t.name
            ));
        };
        let mt = &manifest.tables[i];
        if (mt.rows, mt.dim) != (t.rows, t.dim) {
            return Err(format!(
                "table '{}' is {}x{} in the config and {}x{} in the manifest",
                t.name, t.rows, t.dim, mt.rows, mt.dim
            ));
        }
        t.dtype = mt.dtype;
        if t.placement == Placement::Dram {
            dram.push(i);
        } else {
            t.placement = Placement::Remote;
        }
    }
    Ok(dram)
}

/// The error of an I/O operation on `path`.
fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + use<> {
    let path = path.to_path_buf();
    move |source| ModelError::Io { path, source }
}
