//! A version's manifest: what was pushed (tables, shapes, encodings, block layout) and a CRC-32
//! of every block, stored as JSON at `ember:<model>:v<N>:manifest`. Servers check their tables
//! against it before serving; `ember registry push` verifies what landed against its CRCs.

use ember_embed::DType;
use ember_embed::{EmbedError, Result};
use serde::{Deserialize, Serialize};

/// The value of `format`.
pub const FORMAT: &str = "ember-remote";
/// The `format_version` this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One table of a version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestTable {
    pub name: String,
    pub rows: usize,
    pub dim: usize,
    pub dtype: DType,
    /// Bytes per row (`dtype.row_bytes(dim)`).
    pub row_bytes: usize,
    /// Rows per block value.
    pub rows_per_block: usize,
    /// CRC-32 of each block's bytes (empty until the push has verified them).
    #[serde(default)]
    pub block_crcs: Vec<u32>,
}

impl ManifestTable {
    pub fn blocks(&self) -> usize {
        self.rows.div_ceil(self.rows_per_block.max(1))
    }

    /// Rows of block `b`.
    pub fn block_rows(&self, b: usize) -> std::ops::Range<usize> {
        let start = b * self.rows_per_block;
        start..(start + self.rows_per_block).min(self.rows)
    }

    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }
}

/// A version of a model in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub model: String,
    pub version: u64,
    /// Seconds since the Unix epoch when the push started.
    pub created_unix: u64,
    pub tables: Vec<ManifestTable>,
    /// The model's `config.json` and dense weights, stored beside the tables so that a server
    /// can build the version from the store alone (`None`: pushed without them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<ModelFiles>,
}

/// Sizes and CRC-32s of a version's `config.json` (key `ember:<model>:v<N>:config`) and dense
/// weights (a safetensors file of every tensor but the tables, key `ember:<model>:v<N>:dense`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFiles {
    pub config_bytes: usize,
    pub config_crc: u32,
    pub dense_bytes: usize,
    pub dense_crc: u32,
    /// A graph model's graph (key `ember:<model>:v<N>:graph`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_crc: Option<u32>,
}

impl Manifest {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a manifest serializes")
    }

    pub fn from_json(model: &str, version: u64, bytes: &[u8]) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| EmbedError::RemoteStore {
            model: model.into(),
            version,
            reason: format!("its manifest is not valid: {e}"),
        })?;
        if m.format != FORMAT || m.format_version != FORMAT_VERSION {
            return Err(EmbedError::RemoteStore {
                model: model.into(),
                version,
                reason: format!(
                    "its manifest is {} version {}; this build reads {FORMAT} version {FORMAT_VERSION}",
                    m.format, m.format_version
                ),
            });
        }
        Ok(m)
    }

    pub fn table(&self, name: &str) -> Option<&ManifestTable> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Bytes of rows over all tables.
    pub fn bytes(&self) -> usize {
        self.tables.iter().map(ManifestTable::bytes).sum()
    }
}
