//! A model version in the remote store as a whole, so that a server needs nothing but the store:
//!
//! - [`files_of`]: what `ember store push` stores beside the tables, the model's `config.json`
//!   and its dense weights (a safetensors file of every tensor but the tables);
//! - [`StoreModel`]: a model in the store as a server follows it: the version to serve (the
//!   promoted one, else the newest ready one) and [`StoreModel::fetch`], which writes a version
//!   as a model directory that [`crate::Model::load`] reads: `config.json` with the tables placed
//!   `remote` (those placed `ssd` or `mmap` too: their rows are in the store) or `dram`, and
//!   `model.safetensors` holding the dense weights and the `dram` tables, read from the store
//!   block by block and checked against the push's CRC-32s.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ember_embed::storage::remote::{self, Cluster, ClusterOptions, ModelFilesData};
use ember_embed::{DType, EmbedError, Placement};

use crate::config::{ModelConfig, RemoteConfig};
use crate::error::{ModelError, Result};

/// The prefix of table tensors in `model.safetensors`.
const TABLE_PREFIX: &str = "tables.";

/// A tensor of a safetensors file: name, dtype, shape and its bytes' range in the data section.
#[derive(Debug, Clone)]
struct Entry {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    range: std::ops::Range<usize>,
}

/// The entries of a safetensors header `head` (`__metadata__` left out), in data order; each
/// must lie within `data_len` bytes of data.
fn parse_header(path: &Path, head: &[u8], data_len: usize) -> Result<Vec<Entry>> {
    let bad = |reason: String| ModelError::Safetensors {
        path: path.into(),
        reason,
    };
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(head).map_err(|e| bad(format!("its header: {e}")))?;
    let sizes = |v: Option<&serde_json::Value>| -> Option<Vec<usize>> {
        v?.as_array()?
            .iter()
            .map(|x| usize::try_from(x.as_u64()?).ok())
            .collect()
    };
    let mut out = Vec::new();
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        let e = (|| {
            let [a, b] = sizes(v.get("data_offsets"))?[..] else {
                return None;
            };
            (a <= b && b <= data_len).then_some(())?;
            Some(Entry {
                name: name.clone(),
                dtype: v.get("dtype")?.as_str()?.to_string(),
                shape: sizes(v.get("shape"))?,
                range: a..b,
            })
        })();
        out.push(e.ok_or_else(|| bad(format!("tensor {name} is not a valid entry")))?);
    }
    out.sort_by_key(|e| e.range.start);
    Ok(out)
}

/// The length of a safetensors header from its first 8 bytes, bounded.
fn header_len(path: &Path, first: [u8; 8], total: u64) -> Result<usize> {
    let n = u64::from_le_bytes(first);
    match n.checked_add(8).is_some_and(|end| end <= total) && n <= 100 << 20 {
        true => Ok(n as usize),
        false => Err(ModelError::Safetensors {
            path: path.into(),
            reason: format!("a header of {n} bytes in {total} bytes"),
        }),
    }
}

/// The entries of a safetensors file, and where its data section starts.
fn read_header(path: &Path, file: &File) -> Result<(Vec<Entry>, u64)> {
    let io = |source| ModelError::Io {
        path: path.into(),
        source,
    };
    let total = file.metadata().map_err(io)?.len();
    let mut first = [0u8; 8];
    file.read_exact_at(&mut first, 0).map_err(io)?;
    let n = header_len(path, first, total)?;
    let mut head = vec![0u8; n];
    file.read_exact_at(&mut head, 8).map_err(io)?;
    let data_len = usize::try_from(total - 8 - n as u64).unwrap_or(usize::MAX);
    Ok((parse_header(path, &head, data_len)?, 8 + n as u64))
}

/// The entries of a safetensors file held in memory, and where its data section starts.
fn header_of_bytes(path: &Path, bytes: &[u8]) -> Result<(Vec<Entry>, usize)> {
    let first: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| ModelError::Safetensors {
            path: path.into(),
            reason: "shorter than its header".into(),
        })?;
    let n = header_len(path, first, bytes.len() as u64)?;
    let entries = parse_header(path, &bytes[8..8 + n], bytes.len() - 8 - n)?;
    Ok((entries, 8 + n))
}

/// A safetensors header for `entries` (their ranges packed in order), padded to 8 bytes.
fn write_header(entries: &[Entry]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    for e in entries {
        map.insert(
            e.name.clone(),
            serde_json::json!({
                "dtype": e.dtype,
                "shape": e.shape,
                "data_offsets": [e.range.start, e.range.end],
            }),
        );
    }
    let mut json = serde_json::to_vec(&map).expect("a header serializes");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out
}

/// Packs `entries`' ranges back to back in their order.
fn pack(entries: &mut [Entry]) -> usize {
    let mut at = 0;
    for e in entries {
        let len = e.range.len();
        e.range = at..at + len;
        at += len;
    }
    at
}

/// What `ember store push` stores beside the tables of the model in `dir`: its `config.json`
/// (checked, without the `remote` object, which is each server's) and its dense weights.
pub fn files_of(dir: &Path) -> Result<ModelFilesData> {
    let mut config = ModelConfig::read(&dir.join("config.json"))?;
    config.remote = None;
    let path = dir.join("model.safetensors");
    let io = |source| ModelError::Io {
        path: path.clone(),
        source,
    };
    let file = ember_embed::files::open_regular(&path, "weights file").map_err(io)?;
    let (all, data_at) = read_header(&path, &file)?;
    let mut dense: Vec<Entry> = all
        .into_iter()
        .filter(|e| !e.name.starts_with(TABLE_PREFIX))
        .collect();
    let sources: Vec<std::ops::Range<usize>> = dense.iter().map(|e| e.range.clone()).collect();
    let total = pack(&mut dense);
    let mut out = write_header(&dense);
    let head = out.len();
    out.resize(head + total, 0);
    for (e, src) in dense.iter().zip(sources) {
        file.read_exact_at(
            &mut out[head + e.range.start..head + e.range.end],
            data_at + src.start as u64,
        )
        .map_err(io)?;
    }
    Ok(ModelFilesData {
        config: serde_json::to_vec_pretty(&config).expect("a config serializes"),
        dense: out,
    })
}

/// What [`StoreModel::fetch`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    pub version: u64,
    /// Bytes of `dram` tables read from the store.
    pub table_bytes: usize,
    pub seconds: f64,
}

/// A model in the store, as a server built from the store alone follows it.
#[derive(Debug)]
pub struct StoreModel {
    cluster: Cluster,
    url: String,
    model: String,
    /// Deadline of one call reading blocks.
    timeout: Duration,
}

impl StoreModel {
    /// Connects to the cluster at `url` (`redis://host:port[,...]`) for model `model`.
    pub fn connect(url: &str, model: &str) -> Result<Self> {
        remote::layout::check_name("model", model)?;
        let mut o = ClusterOptions::parse(url).map_err(EmbedError::from)?;
        o.timeout = Duration::from_secs(5);
        o.connect_timeout = Duration::from_secs(2);
        Ok(StoreModel {
            cluster: Cluster::connect(o).map_err(EmbedError::from)?,
            url: url.into(),
            model: model.into(),
            timeout: Duration::from_secs(30),
        })
    }

    /// The model's name in the store.
    pub fn name(&self) -> &str {
        &self.model
    }

    /// The version to serve: the promoted one (`ember store promote`), else the newest ready.
    pub fn target(&mut self) -> Result<u64> {
        Ok(remote::resolve_version(
            &mut self.cluster,
            &self.model,
            None,
        )?)
    }

    /// Writes `version` as a model directory at `dir` (written beside it and renamed into place,
    /// so that `dir` is whole or absent; an existing `dir` is replaced).
    pub fn fetch(&mut self, version: u64, dir: &Path) -> Result<Fetched> {
        let start = Instant::now();
        let cl = &mut self.cluster;
        let manifest = remote::read_manifest(cl, &self.model, version)?;
        let files = remote::read_files(cl, &manifest)?;
        let from = PathBuf::from(remote::layout::file_key(&self.model, version, "config"));
        let mut config: ModelConfig =
            serde_json::from_slice(&files.config).map_err(|e| ModelError::Config {
                path: from.clone(),
                reason: e.to_string(),
            })?;
        let bad = |reason: String| ModelError::Config {
            path: from.clone(),
            reason,
        };
        config.check().map_err(bad)?;
        // The tables as pushed (their dtype may differ from the config's: `push --table-dtype`).
        let mut dram = Vec::new();
        for t in config.tables.iter_mut() {
            let Some(i) = manifest.tables.iter().position(|m| m.name == t.name) else {
                return Err(bad(format!(
                    "table '{}' is not in version {version}'s manifest",
                    t.name
                )));
            };
            let mt = &manifest.tables[i];
            if (mt.rows, mt.dim) != (t.rows, t.dim) {
                return Err(bad(format!(
                    "table '{}' is {}x{} in the config and {}x{} in the manifest",
                    t.name, t.rows, t.dim, mt.rows, mt.dim
                )));
            }
            t.dtype = mt.dtype;
            if t.placement == Placement::Dram {
                dram.push(i);
            } else {
                t.placement = Placement::Remote;
            }
        }
        if let Some(tier) = config.tier.as_mut() {
            // A path on the pushing machine.
            tier.pin_trace = None;
        }
        config.remote = Some(RemoteConfig {
            model: Some(self.model.clone()),
            version: Some(version),
            ..RemoteConfig::new(&self.url)
        });
        // model.safetensors: the dense weights, then the tables held in memory.
        let dense_path = PathBuf::from(remote::layout::file_key(&self.model, version, "dense"));
        let (mut entries, dense_at) = header_of_bytes(&dense_path, &files.dense)?;
        let sources: Vec<std::ops::Range<usize>> =
            entries.iter().map(|e| e.range.clone()).collect();
        let n_dense = entries.len();
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
        let head = write_header(&entries);
        let part = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&part);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ModelError::Io { path, source }
        };
        std::fs::create_dir_all(&part).map_err(io(&part))?;
        let weights = part.join("model.safetensors");
        let file = File::create(&weights).map_err(io(&weights))?;
        let data_len = entries.last().map_or(0, |e| e.range.end);
        file.set_len((head.len() + data_len) as u64)
            .map_err(io(&weights))?;
        file.write_all_at(&head, 0).map_err(io(&weights))?;
        let data_at = head.len() as u64;
        for (e, src) in entries[..n_dense].iter().zip(sources) {
            let bytes = &files.dense[dense_at + src.start..dense_at + src.end];
            file.write_all_at(bytes, data_at + e.range.start as u64)
                .map_err(io(&weights))?;
        }
        let mut failed: Option<std::io::Error> = None;
        let mut table_bytes = 0;
        let table_at: Vec<(usize, u64)> = dram
            .iter()
            .zip(&entries[n_dense..])
            .map(|(&i, e)| (i, data_at + e.range.start as u64))
            .collect();
        remote::read_tables(cl, &manifest, &dram, self.timeout, &mut |t, b, bytes| {
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
        })?;
        if let Some(e) = failed {
            return Err(io(&weights)(e));
        }
        file.sync_all().map_err(io(&weights))?;
        let cfg_path = part.join("config.json");
        std::fs::write(
            &cfg_path,
            serde_json::to_vec_pretty(&config).expect("a config serializes"),
        )
        .map_err(io(&cfg_path))?;
        let _ = std::fs::remove_dir_all(dir);
        std::fs::rename(&part, dir).map_err(io(dir))?;
        Ok(Fetched {
            version,
            table_bytes,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
    }

    #[test]
    fn the_dense_weights_are_every_tensor_but_the_tables_unchanged() {
        let files = files_of(&shipped()).unwrap();
        let all = std::fs::read(shipped().join("model.safetensors")).unwrap();
        let all = safetensors::SafeTensors::deserialize(&all).unwrap();
        let dense = safetensors::SafeTensors::deserialize(&files.dense).unwrap();
        let mut want: Vec<String> = all
            .names()
            .into_iter()
            .filter(|n| !n.starts_with(TABLE_PREFIX))
            .map(|n| n.to_string())
            .collect();
        let mut got: Vec<String> = dense.names().into_iter().map(|n| n.to_string()).collect();
        want.sort();
        got.sort();
        assert!(!got.is_empty());
        assert_eq!(got, want);
        for n in &got {
            let (a, b) = (all.tensor(n).unwrap(), dense.tensor(n).unwrap());
            assert_eq!(
                (a.dtype(), a.shape(), a.data()),
                (b.dtype(), b.shape(), b.data())
            );
        }
        let config: ModelConfig = serde_json::from_slice(&files.config).unwrap();
        assert!(config.remote.is_none());
        assert_eq!(config, {
            let mut c = ModelConfig::read(&shipped().join("config.json")).unwrap();
            c.remote = None;
            c
        });
    }

    #[test]
    fn headers_are_checked() {
        let p = Path::new("x");
        let entry =
            |off: &str| format!(r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":{off}}}}}"#);
        assert_eq!(
            parse_header(p, entry("[0,8]").as_bytes(), 8).unwrap()[0].range,
            0..8
        );
        for bad in ["[0,9]", "[8,0]", "[0]", "\"x\""] {
            assert!(parse_header(p, entry(bad).as_bytes(), 8).is_err(), "{bad}");
        }
        assert!(header_of_bytes(p, &[1, 2, 3]).is_err());
        assert!(header_of_bytes(p, &u64::MAX.to_le_bytes()).is_err());
        // A written header reads back (padded to 8 bytes).
        let mut e = vec![Entry {
            name: "w".into(),
            dtype: "F16".into(),
            shape: vec![3, 1],
            range: 5..11,
        }];
        assert_eq!(pack(&mut e), 6);
        let mut bytes = write_header(&e);
        assert_eq!(bytes.len() % 8, 0);
        bytes.extend_from_slice(&[0; 6]);
        let (back, at) = header_of_bytes(p, &bytes).unwrap();
        assert_eq!(
            (back[0].range.clone(), back[0].shape.clone(), at),
            (0..6, vec![3, 1], bytes.len() - 6)
        );
        assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
    }
}
