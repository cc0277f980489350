//! `config.json`: the architecture of a model directory (see `docs/model-format.md`).

use crate::error::Invalid;
use ember_embed::files;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use ember_embed::{DType, Placement, Pooling};
use serde::{Deserialize, Serialize};

use crate::dense::DenseDType;
use crate::error::{ModelError, Result};

mod stores;
pub use stores::{RemoteConfig, RemoteOverride, TierConfig};

/// The longest sequence feature (`FeatureConfig::max_len`): each position is a feature of the
/// embedding stage (`crate::sequence`).
pub const MAX_SEQUENCE_LEN: usize = 4096;

/// The value of `format`.
pub const FORMAT: &str = "ember-dlrm";
/// The only `format_version` this build reads.
pub const FORMAT_VERSION: u32 = 1;
/// The output of a DLRM or DCNv2 model: one probability per sample.
pub const SCORES: &str = "scores";

/// A model's architecture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub format: String,
    pub format_version: u32,
    /// Where the model came from (`dlrm`, `torchrec_dlrm`, `torchrec_dlrm_dcn`); informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    pub dense_in: usize,
    /// Output sizes of the bottom MLP (ReLU after every layer); empty in a graph model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bottom_mlp: Vec<usize>,
    pub interaction: InteractionConfig,
    /// Output sizes of the top MLP (ReLU after every layer but the last, which has size 1);
    /// empty in a graph model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_mlp: Vec<usize>,
    pub tables: Vec<TableConfig>,
    /// Sparse features in input order; default one per table, named after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<FeatureConfig>>,
    #[serde(default)]
    pub pooling: PoolingName,
    /// The precision of the dense layers (MLPs, cross net): `f32` (the default: exact), `bf16`
    /// or `int8` (see `docs/dense-precision.md`). `--dense-dtype` overrides it.
    #[serde(default, skip_serializing_if = "DenseDType::is_f32")]
    pub dense_dtype: DenseDType,
    /// How tables placed on the SSD tier are cached and read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierConfig>,
    /// Where tables placed `remote` live (a Redis Cluster); they are cached as `tier` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteConfig>,
}

/// One embedding table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    pub name: String,
    pub rows: usize,
    pub dim: usize,
    pub dtype: DType,
    /// `dram` (default), `mmap`, `ssd` or `remote`: where the rows live. `mmap` and `ssd` read
    /// `rows/NAME.rows` in the model directory (written by `ember convert`); `remote` reads the
    /// cluster of the `remote` object (rows pushed by `ember registry push`).
    #[serde(default, skip_serializing_if = "is_dram")]
    pub placement: Placement,
}

fn is_dram(p: &Placement) -> bool {
    *p == Placement::Dram
}

/// A sparse feature and the table it reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureConfig {
    pub name: String,
    pub table: String,
    /// A sequence feature (a graph model's; TorchRec's `EmbeddingCollection`): the graph gets
    /// each sample's first `max_len` rows, unpooled, and the sequence's length
    /// (`crate::sequence`). Absent: a pooled feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
}

/// How pooled embeddings and the bottom MLP output meet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum InteractionConfig {
    /// Pairwise dot products (facebookresearch/dlrm `dot`, TorchRec `InteractionArch`).
    Dot {
        #[serde(default)]
        self_interaction: bool,
        #[serde(default)]
        pair_order: PairOrder,
    },
    /// Concatenation (facebookresearch/dlrm `cat`). A struct variant so that unknown fields are
    /// refused (serde ignores them on unit variants of tagged enums).
    Cat {},
    /// DCNv2 low-rank cross network (TorchRec `DLRM_DCN`).
    Dcn { layers: usize, low_rank: usize },
    /// A graph model's whole dense part (`docs/graph-models.md`): an ONNX graph taking
    /// `dense` (`[n, dense_in]`) and `sparse` (every feature's pooled row side by side,
    /// `[n, sum of dims]`) and giving `outputs`, one value per sample each; `bottom_mlp` and
    /// `top_mlp` are empty.
    Graph {
        /// The ONNX file, in the model directory.
        file: String,
        /// The graph's outputs, in order: the model's named outputs.
        outputs: Vec<String>,
    },
}

/// The order in which dot-interaction pairs are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairOrder {
    /// `for i in 0..n, j in 0..i`: facebookresearch/dlrm.
    #[default]
    Lower,
    /// `for i in 0..n, j in i+1..n`: TorchRec (`triu_indices(offset=1)`).
    Upper,
}

/// `pooling` as written in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolingName {
    #[default]
    Sum,
    Mean,
}

impl From<PoolingName> for Pooling {
    fn from(p: PoolingName) -> Pooling {
        match p {
            PoolingName::Sum => Pooling::Sum,
            PoolingName::Mean => Pooling::Mean,
        }
    }
}

/// Whether a config.json's text says `"family": "hstu"` (an HSTU model, which
/// [`crate::hstu::HstuModel`] reads).
/// A `config.json`'s text (a regular file, within the size limit of text files).
pub(crate) fn read_config_text(path: &Path) -> Result<String> {
    ember_embed::files::read_text(path, "model config", files::TEXT_LIMIT).map_err(|source| {
        ModelError::Io {
            path: path.into(),
            source,
        }
    })
}

pub(crate) fn is_hstu_family(text: &str) -> bool {
    family_of(text).as_deref() == Some("hstu")
}

/// A config text's `family`, if it parses as JSON and names one.
fn family_of(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Family {
        family: Option<String>,
    }
    serde_json::from_str::<Family>(text).ok()?.family
}

/// Whether `name` can be used as a file name inside a directory (no separators, not `.`/`..`).
pub fn safe_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

impl ModelConfig {
    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = read_config_text(path)?;
        if is_hstu_family(&text) {
            return Err(ModelError::Config {
                path: path.into(),
                reason: "an HSTU model (family hstu): `ember predict` and `ember bench model` run \
                         it, `ember registry push` and `ember convert` take it; `ember serve` \
                         does not serve HSTU models yet"
                    .into(),
            });
        }
        let cfg: ModelConfig =
            serde_json::from_str(&text).map_err(|source| ModelError::ConfigJson {
                path: path.into(),
                source,
            })?;
        cfg.check().map_err(|Invalid(reason)| ModelError::Config {
            path: path.into(),
            reason,
        })?;
        Ok(cfg)
    }

    /// The features, explicit or one per table.
    pub fn features(&self) -> Vec<FeatureConfig> {
        match &self.features {
            Some(f) => f.clone(),
            None => self
                .tables
                .iter()
                .map(|t| FeatureConfig {
                    name: t.name.clone(),
                    table: t.name.clone(),
                    max_len: None,
                })
                .collect(),
        }
    }

    /// The table index each feature reads.
    pub fn feature_tables(&self) -> std::result::Result<Vec<usize>, Invalid> {
        // By name, once: linear in the model's size (a config may have 10^6 features).
        let index: HashMap<&str, usize> = self
            .tables
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        self.features()
            .iter()
            .map(|f| {
                index.get(f.table.as_str()).copied().ok_or_else(|| {
                    Invalid(format!(
                        "feature '{}' reads unknown table '{}'",
                        f.name, f.table
                    ))
                })
            })
            .collect()
    }

    /// Whether the dense part is an ONNX graph (`InteractionConfig::Graph`).
    pub fn is_graph(&self) -> bool {
        matches!(self.interaction, InteractionConfig::Graph { .. })
    }

    /// The graph's file and outputs, in a graph model.
    pub fn graph(&self) -> Option<(&str, &[String])> {
        match &self.interaction {
            InteractionConfig::Graph { file, outputs } => Some((file, outputs)),
            _ => None,
        }
    }

    /// The model's outputs: a graph model's named ones, else `scores`.
    pub fn output_names(&self) -> Vec<String> {
        match self.graph() {
            Some((_, outputs)) => outputs.to_vec(),
            None => vec![SCORES.into()],
        }
    }

    /// Values of a sample's pooled row: its features' table dims added up, times `max_len` for a
    /// sequence feature (0 for a config whose features name unknown tables, which
    /// [`ModelConfig::check`] refuses).
    pub fn pooled_width(&self) -> usize {
        let feats = self.features();
        self.feature_tables().map_or(0, |t| {
            t.iter()
                .zip(&feats)
                .map(|(&i, f)| self.tables[i].dim * f.max_len.unwrap_or(1))
                .sum()
        })
    }

    /// Output size of the bottom MLP.
    pub fn bottom_out(&self) -> usize {
        self.bottom_mlp.last().copied().unwrap_or(self.dense_in)
    }

    /// Input size of the top MLP, which the interaction determines (0 for a config that
    /// [`ModelConfig::check`] refuses).
    pub fn top_in(&self) -> usize {
        self.top_in_checked().unwrap_or(0)
    }

    /// [`ModelConfig::top_in`], `None` on overflow or a feature naming no table.
    pub fn top_in_checked(&self) -> Option<usize> {
        let d = self.bottom_out();
        let dims: Vec<usize> = self
            .feature_tables()
            .ok()?
            .iter()
            .map(|&i| self.tables[i].dim)
            .collect();
        let n = dims.len().checked_add(1)?;
        match self.interaction {
            InteractionConfig::Dot {
                self_interaction, ..
            } => {
                let m = if self_interaction { n + 1 } else { n - 1 };
                d.checked_add(n.checked_mul(m)? / 2)
            }
            // A graph's inputs, side by side.
            InteractionConfig::Cat {} | InteractionConfig::Graph { .. } => {
                dims.iter().try_fold(d, |a, &b| a.checked_add(b))
            }
            InteractionConfig::Dcn { .. } => n.checked_mul(d),
        }
    }

    /// Checks everything that can be checked without the weights.
    pub fn check(&self) -> std::result::Result<(), Invalid> {
        self.check_format()?;
        self.check_layer_sizes()?;
        self.check_tables()?;
        if let Some(t) = &self.tier {
            t.options()?;
        }
        self.check_feature_names()?;
        self.check_sequences()?;
        let tables = self.feature_tables()?;
        self.check_overflow()?;
        self.check_interaction(&tables)
    }

    /// The file's format and version are the ones this build reads.
    fn check_format(&self) -> std::result::Result<(), Invalid> {
        if self.format != FORMAT {
            return Err(Invalid(format!(
                "format is '{}', expected '{FORMAT}'",
                self.format
            )));
        }
        if self.format_version != FORMAT_VERSION {
            return Err(Invalid(format!(
                "format_version {} is not supported (this build reads {FORMAT_VERSION})",
                self.format_version
            )));
        }
        Ok(())
    }

    /// No layer (nor the dense input) is empty, and the top MLP ends in the logit.
    fn check_layer_sizes(&self) -> std::result::Result<(), Invalid> {
        if self.dense_in == 0 {
            return Err("dense_in must be at least 1".into());
        }
        if let Some(i) = self.bottom_mlp.iter().position(|&s| s == 0) {
            return Err(Invalid(format!("bottom_mlp[{i}] is 0")));
        }
        if let Some(i) = self.top_mlp.iter().position(|&s| s == 0) {
            return Err(Invalid(format!("top_mlp[{i}] is 0")));
        }
        if self.is_graph() {
            if !self.bottom_mlp.is_empty() || !self.top_mlp.is_empty() {
                return Err(
                    "a graph model's dense part is its graph: bottom_mlp and top_mlp \
                            must be empty"
                        .into(),
                );
            }
            return Ok(());
        }
        if self.top_mlp.last() != Some(&1) {
            return Err(Invalid(format!(
                "top_mlp must end in a layer of size 1 (the logit), got {:?}",
                self.top_mlp
            )));
        }
        Ok(())
    }

    /// At least one table; each non-empty, named once, by a name that can name its row file.
    fn check_tables(&self) -> std::result::Result<(), Invalid> {
        if self.tables.is_empty() {
            return Err("a model needs at least one table".into());
        }
        let mut table_names = HashSet::with_capacity(self.tables.len());
        for t in &self.tables {
            if t.rows == 0 || t.dim == 0 {
                return Err(Invalid(format!(
                    "table '{}' has {} rows x dim {}: both must be at least 1",
                    t.name, t.rows, t.dim
                )));
            }
            if !table_names.insert(t.name.as_str()) {
                return Err(Invalid(format!("table name '{}' appears twice", t.name)));
            }
            if !safe_file_name(&t.name) {
                return Err(Invalid(format!(
                    "table name '{}' cannot name a file (rows/NAME.rows): no '/', '\\', NUL, or '.'/'..'",
                    t.name
                )));
            }
        }
        Ok(())
    }

    /// At least one sparse feature, each named once.
    fn check_feature_names(&self) -> std::result::Result<(), Invalid> {
        let feats = self.features();
        if feats.is_empty() {
            return Err("a model needs at least one sparse feature".into());
        }
        let mut feature_names = HashSet::with_capacity(feats.len());
        for f in &feats {
            if !feature_names.insert(f.name.as_str()) {
                return Err(Invalid(format!("feature name '{}' appears twice", f.name)));
            }
        }
        Ok(())
    }

    /// Sequence features (a `max_len`) only in a graph model, each `max_len` in
    /// 1..=[`MAX_SEQUENCE_LEN`].
    pub(crate) fn check_sequences(&self) -> std::result::Result<(), Invalid> {
        let graph = matches!(self.interaction, InteractionConfig::Graph { .. });
        for f in self.features() {
            match f.max_len {
                Some(_) if !graph => {
                    return Err(Invalid(format!(
                        "feature '{}' has a max_len (a sequence feature), which only a graph \
                         model (interaction kind \"graph\") takes",
                        f.name
                    )));
                }
                Some(l) if !(1..=MAX_SEQUENCE_LEN).contains(&l) => {
                    return Err(Invalid(format!(
                        "feature '{}': max_len {l} is outside 1..={MAX_SEQUENCE_LEN}",
                        f.name
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// No table's bytes, the interaction's output size, nor any layer's weight count overflows.
    fn check_overflow(&self) -> std::result::Result<(), Invalid> {
        for t in &self.tables {
            t.rows
                .checked_mul(t.dtype.row_bytes(t.dim))
                .ok_or_else(|| {
                    format!(
                        "table '{}': {} rows x dim {} overflows",
                        t.name, t.rows, t.dim
                    )
                })?;
        }
        let top_in = self
            .top_in_checked()
            .ok_or("the interaction's output size (the top MLP input) overflows")?;
        for (name, sizes, first) in [
            ("bottom_mlp", &self.bottom_mlp, self.dense_in),
            ("top_mlp", &self.top_mlp, top_in),
        ] {
            let mut k_in = first;
            for (i, &out) in sizes.iter().enumerate() {
                k_in.checked_mul(out)
                    .ok_or_else(|| format!("{name}[{i}]: {k_in} x {out} weights overflow"))?;
                k_in = out;
            }
        }
        Ok(())
    }

    /// The interaction's own options, and the equal dims that `dot` and `dcn` need of the
    /// features' `tables` and the bottom MLP.
    fn check_interaction(&self, tables: &[usize]) -> std::result::Result<(), Invalid> {
        let d = self.bottom_out();
        match self.interaction {
            InteractionConfig::Dot {
                self_interaction,
                pair_order,
            } => {
                if self_interaction && pair_order == PairOrder::Upper {
                    return Err("self_interaction is only defined with pair_order 'lower'".into());
                }
                self.check_equal_dims(tables, d, "dot")?;
            }
            InteractionConfig::Cat {} => {}
            InteractionConfig::Graph {
                ref file,
                ref outputs,
            } => check_graph_names(file, outputs)?,
            InteractionConfig::Dcn { layers, low_rank } => {
                if layers == 0 || low_rank == 0 {
                    return Err("dcn needs layers >= 1 and low_rank >= 1".into());
                }
                self.check_equal_dims(tables, d, "dcn")?;
            }
        }
        Ok(())
    }

    fn check_equal_dims(
        &self,
        tables: &[usize],
        d: usize,
        kind: &str,
    ) -> std::result::Result<(), Invalid> {
        for (f, &t) in tables.iter().enumerate() {
            let dim = self.tables[t].dim;
            if dim != d {
                return Err(Invalid(format!(
                    "interaction '{kind}' needs every embedding dim equal to the bottom MLP output ({d}), \
                     but feature '{}' reads table '{}' of dim {dim}",
                    self.features()[f].name,
                    self.tables[t].name
                )));
            }
        }
        Ok(())
    }
}

/// A graph's file is a file name in the model directory, and its outputs are named, each once.
fn check_graph_names(file: &str, outputs: &[String]) -> std::result::Result<(), Invalid> {
    if !safe_file_name(file) {
        return Err(Invalid(format!(
            "interaction.file {file:?} is not a file name in the model directory"
        )));
    }
    if outputs.is_empty() {
        return Err("interaction.outputs is empty: a graph model gives at least one output".into());
    }
    let mut seen = HashSet::new();
    for o in outputs {
        if o.is_empty() || o.contains(|c: char| c.is_control()) {
            return Err(Invalid(format!(
                "interaction.outputs: {o:?} cannot name an output"
            )));
        }
        if !seen.insert(o.as_str()) {
            return Err(Invalid(format!("interaction.outputs: {o:?} appears twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "format": "ember-dlrm", "format_version": 1, "dense_in": 4,
            "bottom_mlp": [8], "interaction": {"kind": "dot"}, "top_mlp": [5, 1],
            "tables": [{"name": "a", "rows": 10, "dim": 8, "dtype": "f32"},
                       {"name": "b", "rows": 3, "dim": 8, "dtype": "int8"}],
            "features": null
        })
    }

    fn check(v: serde_json::Value) -> std::result::Result<ModelConfig, Invalid> {
        let c: ModelConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
        c.check().map(|()| c)
    }

    #[test]
    fn top_in_follows_the_interaction() {
        let c = check(base()).unwrap();
        assert_eq!(c.top_in(), 8 + 3);
        let mut v = base();
        v["interaction"] = serde_json::json!({"kind": "dot", "self_interaction": true});
        assert_eq!(check(v).unwrap().top_in(), 8 + 6);
        let mut v = base();
        v["interaction"] = serde_json::json!({"kind": "cat"});
        assert_eq!(check(v).unwrap().top_in(), 24);
        let mut v = base();
        v["interaction"] = serde_json::json!({"kind": "dcn", "layers": 2, "low_rank": 3});
        assert_eq!(check(v).unwrap().top_in(), 24);
    }

    /// `dense_dtype`: f32 when absent, each name read, left out of the file when f32 (written
    /// otherwise, and read back the same); an unknown value refused naming it and the names.
    #[test]
    fn dense_dtype_is_read_and_written_by_name() {
        let c = check(base()).unwrap();
        assert_eq!(c.dense_dtype, DenseDType::F32);
        assert!(
            serde_json::to_value(&c)
                .unwrap()
                .get("dense_dtype")
                .is_none()
        );
        for want in DenseDType::ALL {
            let mut v = base();
            v["dense_dtype"] = serde_json::json!(want.name());
            let c = check(v).unwrap();
            assert_eq!(c.dense_dtype, want);
            let written = serde_json::to_value(&c).unwrap();
            match want {
                DenseDType::F32 => assert!(written.get("dense_dtype").is_none(), "{written}"),
                _ => assert_eq!(written["dense_dtype"], want.name(), "{written}"),
            }
            let back: ModelConfig = serde_json::from_value(written).unwrap();
            assert_eq!(back, c);
        }
        for bad in [serde_json::json!("fp8"), serde_json::json!(8)] {
            let mut v = base();
            v["dense_dtype"] = bad.clone();
            let e = check(v).unwrap_err().0;
            assert!(e.contains(&bad.to_string().replace('"', "")), "{bad}: {e}");
            if bad.is_string() {
                assert!(
                    ["f32", "bf16", "int8"].iter().all(|n| e.contains(n)),
                    "{bad}: {e}"
                );
            }
        }
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            (
                "/interaction",
                serde_json::json!({"kind": "cat", "layers": 3}),
                "unknown field",
            ),
            (
                "/interaction",
                serde_json::json!({"kind": "dot", "pair_order": "upper", "self_interaction": true}),
                "self_interaction",
            ),
            (
                "/interaction",
                serde_json::json!({"kind": "dcn", "layers": 0, "low_rank": 3}),
                "layers >= 1",
            ),
            ("/top_mlp", serde_json::json!([5, 2]), "size 1"),
            ("/bottom_mlp", serde_json::json!([7]), "dim 8"),
            ("/tables/1/dim", serde_json::json!(5), "dim 5"),
            ("/tables/1/name", serde_json::json!("a"), "appears twice"),
            ("/tables/1/dtype", serde_json::json!("int3"), "int3"),
            ("/dense_in", serde_json::json!(0), "dense_in"),
            ("/format_version", serde_json::json!(2), "format_version 2"),
            (
                "/features",
                serde_json::json!([{"name": "x", "table": "zz"}]),
                "unknown table 'zz'",
            ),
            ("/tables/0/rows", serde_json::json!(usize::MAX), "overflows"),
        ];
        for (ptr, val, want) in cases {
            let mut v = base();
            *v.pointer_mut(ptr).unwrap_or_else(|| panic!("{ptr}")) = val;
            let e = check(v).unwrap_err().0;
            assert!(e.contains(want), "{ptr}: {e}");
        }
        let mut v = base();
        v["interaction"] = serde_json::json!({"kind": "dcn", "layers": 1, "low_rank": 1});
        v["dense_in"] = serde_json::json!(1usize << 40);
        v["bottom_mlp"] = serde_json::json!([1usize << 40]);
        v["tables"][0]["dim"] = serde_json::json!(1usize << 40);
        v["tables"][1]["dim"] = serde_json::json!(1usize << 40);
        let e = check(v).unwrap_err().0;
        assert!(e.contains("overflow"), "{e}");
    }
}
