//! What `ember registry push` stores of a model directory beside its tables: its `config.json`,
//! its dense weights and a graph model's graph (`ember_registry::ModelFilesData`, written and
//! read back by the registry).

use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::{AnyConfig, ModelError};
use ember_registry::ModelFilesData;

use super::header::{Entry, TABLE_PREFIX, pack, read_header, write_header};

/// What `ember registry push` stores beside the tables of the model in `dir`: its `config.json`
/// (checked, without the `remote` object, which is each server's) and its dense weights.
pub fn files_of(dir: &Path) -> crate::Result<ModelFilesData> {
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
    let graph = match &config {
        AnyConfig::Dlrm(c) => match c.graph() {
            Some((file, _)) => {
                let p = dir.join(file);
                let g = std::fs::read(&p).map_err(|source| ModelError::Io { path: p, source })?;
                Some(g)
            }
            None => None,
        },
        AnyConfig::Hstu(_) => None,
    };
    Ok(ModelFilesData {
        config: config.to_json(),
        dense: out,
        graph,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
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
