//! A model directory of either family, for the tools that handle its config and tables but
//! not its forward pass (`ember registry push` and the registry's fetch, `ember convert`):
//! [`AnyConfig`] is its `config.json` (a DLRM-family [`ModelConfig`] or an
//! [`HstuModelConfig`], told apart by `"family"`), [`AnyModel`] the model loaded.

use crate::error::Invalid;
use std::path::Path;

use ember_embed::{DType, EmbeddingCollection};

use crate::config::{
    ModelConfig, RemoteConfig, TableConfig, TierConfig, is_hstu_family, read_config_text,
};
use crate::error::{ModelError, Result};
use crate::hstu::{HstuModel, HstuModelConfig};
use crate::model::{LoadOptions, Model};
use crate::presets::RowsOptions;

/// A `config.json` of either family.
#[derive(Debug, Clone, PartialEq)]
pub enum AnyConfig {
    Dlrm(Box<ModelConfig>),
    Hstu(Box<HstuModelConfig>),
}

impl AnyConfig {
    /// Reads and checks the config at `path`, whichever family it is.
    pub fn read(path: &Path) -> Result<AnyConfig> {
        let text = read_config_text(path)?;
        match is_hstu_family(&text) {
            true => Ok(AnyConfig::Hstu(Box::new(HstuModelConfig::read(path)?))),
            false => Ok(AnyConfig::Dlrm(Box::new(ModelConfig::read(path)?))),
        }
    }

    /// Parses and checks a config held in memory (`from` names it in errors).
    pub fn from_slice(bytes: &[u8], from: &Path) -> Result<AnyConfig> {
        let json = |source| ModelError::ConfigJson {
            path: from.into(),
            source,
        };
        let text = std::str::from_utf8(bytes).unwrap_or("");
        let cfg = match is_hstu_family(text) {
            true => AnyConfig::Hstu(Box::new(serde_json::from_slice(bytes).map_err(json)?)),
            false => AnyConfig::Dlrm(Box::new(serde_json::from_slice(bytes).map_err(json)?)),
        };
        cfg.check().map_err(|Invalid(reason)| ModelError::Config {
            path: from.into(),
            reason,
        })?;
        Ok(cfg)
    }

    pub fn check(&self) -> std::result::Result<(), Invalid> {
        match self {
            AnyConfig::Dlrm(c) => c.check(),
            AnyConfig::Hstu(c) => c.check(),
        }
    }

    pub fn tables(&self) -> &[TableConfig] {
        match self {
            AnyConfig::Dlrm(c) => &c.tables,
            AnyConfig::Hstu(c) => &c.tables,
        }
    }

    pub fn tables_mut(&mut self) -> &mut Vec<TableConfig> {
        match self {
            AnyConfig::Dlrm(c) => &mut c.tables,
            AnyConfig::Hstu(c) => &mut c.tables,
        }
    }

    /// The remote tier's settings (each server's own: the registry stores configs without).
    pub fn remote_mut(&mut self) -> &mut Option<RemoteConfig> {
        match self {
            AnyConfig::Dlrm(c) => &mut c.remote,
            AnyConfig::Hstu(c) => &mut c.remote,
        }
    }

    pub fn tier_mut(&mut self) -> &mut Option<TierConfig> {
        match self {
            AnyConfig::Dlrm(c) => &mut c.tier,
            AnyConfig::Hstu(c) => &mut c.tier,
        }
    }

    /// The config as `config.json` holds it.
    pub fn to_json(&self) -> Vec<u8> {
        match self {
            AnyConfig::Dlrm(c) => serde_json::to_vec_pretty(c),
            AnyConfig::Hstu(c) => serde_json::to_vec_pretty(c),
        }
        .expect("a config serializes")
    }
}

/// A loaded model of either family.
#[derive(Debug)]
pub enum AnyModel {
    Dlrm(Box<Model>),
    Hstu(Box<HstuModel>),
}

impl AnyModel {
    /// Loads the model in `dir`, whichever family it is.
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<AnyModel> {
        Ok(match HstuModel::is_hstu_dir(dir) {
            true => AnyModel::Hstu(Box::new(HstuModel::load(dir, opts)?)),
            false => AnyModel::Dlrm(Box::new(Model::load(dir, opts)?)),
        })
    }

    /// Its tables and features.
    pub fn embeddings(&self) -> &EmbeddingCollection {
        match self {
            AnyModel::Dlrm(m) => m.embeddings(),
            AnyModel::Hstu(m) => m.embeddings(),
        }
    }
}

/// A preset of either family (`rm1`, `small`, `dlrm-v2`; `dlrm-v3`, `hstu-small`), to build
/// with random weights.
#[derive(Debug, Clone)]
pub struct AnyPreset {
    pub name: String,
    pub config: AnyConfig,
    /// Ids per bag of each feature a synthetic sample has unless asked otherwise (a DLRM
    /// preset's: 80, or MLPerf's multi-hot sizes); `None` where the inputs are not bags.
    pub pooling: Option<Vec<usize>>,
    /// The cap on rows per table that built it (`None`: no cap).
    pub max_rows: Option<usize>,
}

/// Every preset's name, both families'.
pub fn preset_names() -> Vec<&'static str> {
    let mut v = crate::presets::PRESETS.to_vec();
    v.extend_from_slice(&crate::hstu::presets::PRESETS);
    v
}

impl AnyPreset {
    /// The preset `name` with tables of `dtype`, rows scaled and capped as `rows` says.
    pub fn new(name: &str, dtype: DType, rows: RowsOptions) -> Result<AnyPreset> {
        if crate::hstu::presets::PRESETS.contains(&name) {
            if rows.max_rows.is_some_and(|m| m > 0) {
                return Err(ModelError::BadOption {
                    option: "max-rows",
                    reason: format!("caps a DLRM preset's tables; scale {name}'s with rows-scale"),
                });
            }
            if !(rows.scale.is_finite() && rows.scale > 0.0) {
                return Err(ModelError::BadOption {
                    option: "rows-scale",
                    reason: format!("{} is not a positive number", rows.scale),
                });
            }
            let cfg =
                crate::hstu::presets::preset(name, rows.scale, dtype).expect("a name of the list");
            return Ok(AnyPreset {
                name: name.into(),
                config: AnyConfig::Hstu(Box::new(cfg)),
                pooling: None,
                max_rows: None,
            });
        }
        let p = crate::presets::preset_with(name, dtype, rows).map_err(|e| match e {
            ModelError::BadOption {
                option: "preset", ..
            } => ModelError::BadOption {
                option: "preset",
                reason: format!(
                    "unknown preset '{name}' (known: {})",
                    preset_names().join(", ")
                ),
            },
            e => e,
        })?;
        Ok(AnyPreset {
            name: p.name.into(),
            config: AnyConfig::Dlrm(Box::new(p.config)),
            pooling: Some(p.pooling),
            max_rows: p.max_rows,
        })
    }

    /// Bytes of its tables.
    pub fn table_bytes(&self) -> usize {
        self.config
            .tables()
            .iter()
            .map(|t| t.rows * t.dtype.row_bytes(t.dim))
            .sum()
    }

    /// The model with random weights from `seed` (built on `threads` threads), dense layers
    /// in f32 (`crate::serving::servable` serves it).
    pub fn build(&self, seed: u64, threads: usize) -> Result<AnyModel> {
        Ok(match &self.config {
            AnyConfig::Dlrm(c) => {
                AnyModel::Dlrm(Box::new(Model::random((**c).clone(), seed, threads)?))
            }
            AnyConfig::Hstu(c) => {
                AnyModel::Hstu(Box::new(HstuModel::random((**c).clone(), seed, threads)?))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    #[test]
    fn either_family_reads_and_round_trips() {
        for (name, hstu) in [("hstu_small", true), ("dlrm_dot", false)] {
            let path = fixture(name).join("config.json");
            let c = AnyConfig::read(&path).unwrap();
            assert_eq!(matches!(c, AnyConfig::Hstu(_)), hstu, "{name}");
            assert!(!c.tables().is_empty());
            let back = AnyConfig::from_slice(&c.to_json(), &path).unwrap();
            assert_eq!(back, c, "{name}");
            let m = AnyModel::load(&fixture(name), LoadOptions::default()).unwrap();
            assert_eq!(m.embeddings().tables().len(), c.tables().len(), "{name}");
        }
        // A config of neither shape names the file.
        let err = AnyConfig::from_slice(b"{\"family\": \"hstu\"}", Path::new("x/config.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("x/config.json"), "{err}");
    }
}
