//! A version's `config.json` and dense weights (a safetensors file of every tensor but the
//! tables), stored beside its tables by `ember store push` so that a server can build the
//! version from the store alone; their sizes and CRC-32s are in the manifest's `files`.

use super::layout;
use super::manifest::{Manifest, ModelFiles};
use super::store::store_err;
use crate::error::Result;
use ember_redis::{Cluster, call};
use redis::Value;

/// A version's `config.json` and dense weights (a safetensors file of every tensor but the
/// tables), as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFilesData {
    pub config: Vec<u8>,
    pub dense: Vec<u8>,
}

/// Stores `files` under `version`; returns what the manifest records of them.
pub(crate) fn write_files(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    files: &ModelFilesData,
) -> Result<ModelFiles> {
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
pub fn read_files(cluster: &mut Cluster, manifest: &Manifest) -> Result<ModelFilesData> {
    let (model, version) = (manifest.model.as_str(), manifest.version);
    let Some(f) = manifest.files else {
        return Err(store_err(
            model,
            version,
            "it was pushed without its config.json and dense weights (by an older ember): push \
             the model directory again to serve it from the store alone",
        ));
    };
    let mut read = |name: &str, bytes: usize, crc: u32| -> Result<Vec<u8>> {
        let key = layout::file_key(model, version, name);
        match call(cluster, &key, redis::cmd("GET").arg(&key), true)? {
            Value::BulkString(b) if b.len() == bytes && crc32fast::hash(&b) == crc => Ok(b),
            Value::BulkString(b) => Err(store_err(
                model,
                version,
                format!(
                    "{key} holds {} bytes with CRC-32 {:08x}; its manifest says {bytes} bytes \
                     with CRC-32 {crc:08x}",
                    b.len(),
                    crc32fast::hash(&b)
                ),
            )),
            _ => Err(store_err(model, version, format!("{key} is missing"))),
        }
    };
    Ok(ModelFilesData {
        config: read("config", f.config_bytes, f.config_crc)?,
        dense: read("dense", f.dense_bytes, f.dense_crc)?,
    })
}
