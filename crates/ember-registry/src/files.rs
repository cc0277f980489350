//! A version's `config.json` and dense weights (a safetensors file of every tensor but the
//! tables), and a graph model's graph (its `dense.onnx`), stored beside its tables by `ember
//! registry push` so that a server can build the version from the registry alone; their sizes
//! and CRC-32s are in the manifest's `files`.
//!
//! `ember_model::registry::files_of` reads them from a model directory, [`write_files`] stores
//! them under a version and [`read_files`] reads them back, checked.

use crate::layout;
use crate::manifest::{Manifest, ModelFiles};
use crate::store_error;
use ember_embed::EmbedError;
use ember_redis::Value;
use ember_redis::{Cluster, call};

/// A version's `config.json` and dense weights (a safetensors file of every tensor but the
/// tables), as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFilesData {
    /// The model's `config.json` (without its `remote` object).
    pub config: Vec<u8>,
    /// The dense weights: a safetensors file.
    pub dense: Vec<u8>,
    /// A graph model's dense part: the ONNX file its config names.
    pub graph: Option<Vec<u8>>,
}

/// Stores `files` under `version`; returns what the manifest records of them.
pub fn write_files(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    files: &ModelFilesData,
) -> ember_embed::Result<ModelFiles> {
    let graph = files.graph.as_ref().map(|g| ("graph", g));
    for (name, bytes) in [("config", &files.config), ("dense", &files.dense)]
        .into_iter()
        .chain(graph)
    {
        let key = layout::file_key(model, version, name);
        call(
            cluster,
            &key,
            ember_redis::cmd("SET").arg(&key).arg(bytes.as_slice()),
            false,
        )
        .map_err(store_error)?;
    }
    Ok(ModelFiles {
        config_bytes: files.config.len(),
        config_crc: crc32fast::hash(&files.config),
        dense_bytes: files.dense.len(),
        dense_crc: crc32fast::hash(&files.dense),
        graph_bytes: files.graph.as_ref().map(Vec::len),
        graph_crc: files.graph.as_deref().map(crc32fast::hash),
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
        match call(cluster, &key, ember_redis::cmd("GET").arg(&key), true).map_err(store_error)? {
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
        graph: match (f.graph_bytes, f.graph_crc) {
            (Some(bytes), Some(crc)) => Some(read("graph", bytes, crc)?),
            _ => None,
        },
    })
}
