//! A version's `config.json` and dense weights (a safetensors file of every tensor but the
//! tables), stored beside its tables by `ember registry push` so that a server can build the
//! version from the registry alone; their sizes and CRC-32s are in the manifest's `files`.
//!
//! [`files_of`] reads them from a model directory, [`write_files`] stores them under a version
//! and [`read_files`] reads them back, checked.

use std::os::unix::fs::FileExt;
use std::path::Path;

use ember_embed::EmbedError;
use ember_embed::storage::remote::{Manifest, ModelFiles, layout};
use ember_model::{AnyConfig, ModelError};
use ember_redis::{Cluster, call};
use redis::Value;

use crate::header::{Entry, TABLE_PREFIX, pack, read_header, write_header};

/// A version's `config.json` and dense weights (a safetensors file of every tensor but the
/// tables), as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFilesData {
    /// The model's `config.json` (without its `remote` object).
    pub config: Vec<u8>,
    /// The dense weights: a safetensors file.
    pub dense: Vec<u8>,
}

/// What `ember registry push` stores beside the tables of the model in `dir`: its `config.json`
/// (checked, without the `remote` object, which is each server's) and its dense weights.
pub fn files_of(dir: &Path) -> ember_model::Result<ModelFilesData> {
    let mut config = AnyConfig::read(&dir.join("config.json"))?;
    *config.remote_mut() = None;
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
        config: config.to_json(),
        dense: out,
    })
}

/// Stores `files` under `version`; returns what the manifest records of them.
pub(crate) fn write_files(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    files: &ModelFilesData,
) -> ember_embed::Result<ModelFiles> {
    for (name, bytes) in [("config", &files.config), ("dense", &files.dense)] {
        let key = layout::file_key(model, version, name);
        call(
            cluster,
            &key,
            redis::cmd("SET").arg(&key).arg(bytes.as_slice()),
            false,
        )?;
    }
    Ok(ModelFiles {
        config_bytes: files.config.len(),
        config_crc: crc32fast::hash(&files.config),
        dense_bytes: files.dense.len(),
        dense_crc: crc32fast::hash(&files.dense),
    })
}

/// Reads a version's `config.json` and dense weights, each checked against the manifest's size
/// and CRC-32.
pub fn read_files(
    cluster: &mut Cluster,
    manifest: &Manifest,
) -> ember_embed::Result<ModelFilesData> {
    let (model, version) = (manifest.model.as_str(), manifest.version);
    let Some(f) = manifest.files else {
        return Err(EmbedError::remote_store(
            model,
            version,
            "it was pushed without its config.json and dense weights (by an older ember): push \
             the model directory again to serve it from the registry alone",
        ));
    };
    let mut read = |name: &str, bytes: usize, crc: u32| -> ember_embed::Result<Vec<u8>> {
        let key = layout::file_key(model, version, name);
        match call(cluster, &key, redis::cmd("GET").arg(&key), true)? {
            Value::BulkString(b) if b.len() == bytes && crc32fast::hash(&b) == crc => Ok(b),
            Value::BulkString(b) => Err(EmbedError::remote_store(
                model,
                version,
                format!(
                    "{key} holds {} bytes with CRC-32 {:08x}; its manifest says {bytes} bytes \
                     with CRC-32 {crc:08x}",
                    b.len(),
                    crc32fast::hash(&b)
                ),
            )),
            _ => Err(EmbedError::remote_store(
                model,
                version,
                format!("{key} is missing"),
            )),
        }
    };
    Ok(ModelFilesData {
        config: read("config", f.config_bytes, f.config_crc)?,
        dense: read("dense", f.dense_bytes, f.dense_crc)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_model::config::ModelConfig;
    use std::path::PathBuf;

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
}
