//! `config.json` of an HSTU model (`"family": "hstu"`, `docs/model-format.md`): every field of
//! the reference's `DlrmHSTUConfig` (meta-recsys/generative-recommenders,
//! `modules/dlrm_hstu.py`) as `dataclasses.asdict` writes it, the tables as Ember tables, and
//! what the reference fixes in code that a config must say here (the position and time buckets,
//! where time buckets are clamped, how attention is normalised).

use crate::error::Invalid;
use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{FeatureConfig, RemoteConfig, TableConfig, TierConfig, safe_file_name};
use crate::dense::DenseDType;
use crate::error::{ModelError, Result};

/// `format` of an HSTU model's config.json.
pub const FORMAT: &str = "ember-hstu";
/// The version of it this build reads.
pub const FORMAT_VERSION: u32 = 1;

/// An HSTU model's `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HstuModelConfig {
    pub format: String,
    pub format_version: u32,
    /// Always `hstu`.
    pub family: String,
    /// The reference's `DlrmHSTUConfig` and the settings its code fixes.
    pub hstu: HstuConfig,
    pub tables: Vec<TableConfig>,
    /// Every embedding feature (the user's and the candidates') and the table it reads.
    pub features: Vec<FeatureConfig>,
    /// The precision of the dense layers (projections, MLPs): `f32` (default) or `bf16`.
    #[serde(default, skip_serializing_if = "DenseDType::is_f32")]
    pub dense_dtype: DenseDType,
    /// What attention is divided by: see [`AttentionNorm`]. Default `alone`.
    #[serde(default)]
    pub attention_norm: AttentionNorm,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<TierConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteConfig>,
}

/// The reference's `DlrmHSTUConfig`, field for field (training-only fields are read and kept,
/// and change nothing here), plus three settings its code fixes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HstuConfig {
    /// The longest sequence (contextual slots, history and candidates) a user may send.
    pub max_seq_len: usize,
    /// Training's candidate count (kept; not used at inference).
    pub max_num_candidates: usize,
    /// The most candidates a user may send.
    pub max_num_candidates_inference: usize,
    pub hstu_num_heads: usize,
    /// Per head: the width of `u` and `v` (the reference's `hidden_dim`, "linear dim").
    pub hstu_attn_linear_dim: usize,
    /// Per head: the width of `q` and `k`.
    pub hstu_attn_qk_dim: usize,
    pub hstu_attn_num_layers: usize,
    /// The tables' dim (every table the model reads has it).
    pub hstu_embedding_table_dim: usize,
    pub hstu_preprocessor_hidden_dim: usize,
    /// The model dim `D` of the STU layers.
    pub hstu_transducer_embedding_dim: usize,
    /// Normalise the attention output per head (group norm) instead of over all heads.
    pub hstu_group_norm: bool,
    pub hstu_input_dropout_ratio: f64,
    pub hstu_linear_dropout_rate: f64,
    /// Contextual features in slot order, each with its number of slots.
    pub contextual_feature_to_max_length: OrderedMap<usize>,
    /// A contextual feature is zeroed for a user whose history plus candidates is shorter.
    pub contextual_feature_to_min_uih_length: OrderedMap<usize>,
    pub candidates_weight_feature_name: String,
    pub candidates_watchtime_feature_name: String,
    pub candidates_querytime_feature_name: String,
    pub causal_multitask_weights: f64,
    /// The tasks, binary classification first (the reference requires them sorted by type).
    pub multitask_configs: Vec<TaskConfig>,
    pub user_embedding_feature_names: Vec<String>,
    pub item_embedding_feature_names: Vec<String>,
    pub uih_post_id_feature_name: String,
    pub uih_action_time_feature_name: String,
    pub uih_weight_feature_name: String,
    pub hstu_uih_feature_names: Vec<String>,
    pub hstu_candidate_feature_names: Vec<String>,
    /// `(history feature, candidate feature)` pairs whose values form one sequence.
    pub merge_uih_candidate_feature_mapping: Vec<(String, String)>,
    /// The action bits, each with an embedding (none: no action encoder).
    pub action_weights: Option<Vec<i64>>,
    pub action_embedding_init_std: f64,
    pub enable_postprocessor: bool,
    pub use_layer_norm_postprocessor: bool,
    /// Rows of the position embedding (the reference fixes 8192).
    #[serde(default = "default_position_buckets")]
    pub num_position_buckets: usize,
    /// Time buckets; the time embedding has one more row (the reference fixes 2048).
    #[serde(default = "default_time_buckets")]
    pub num_time_buckets: usize,
    /// Where time buckets are clamped: see [`TimeBucketClamp`].
    #[serde(default)]
    pub time_bucket_clamp: TimeBucketClamp,
}

fn default_position_buckets() -> usize {
    8192
}

fn default_time_buckets() -> usize {
    2048
}

/// One task of the multitask head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    pub task_name: String,
    /// Its bit in the candidates' action weights (training labels; kept).
    pub task_weight: i64,
    pub task_type: TaskType,
}

/// How a task's logit becomes its score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// `sigmoid(logit)`.
    BinaryClassification,
    /// The logit itself.
    Regression,
}

/// Where the time since the query is clamped, in buckets. The reference's two kernels differ:
/// its Triton kernel (what the published GPU runs use) clamps at `num_time_buckets`, its PyTorch
/// kernel (`ops/pytorch/pt_position.py`) at the model dim minus one (it reads the bucket count
/// from the embedding's second dimension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeBucketClamp {
    /// At `num_time_buckets` (the reference's Triton kernel).
    #[default]
    Triton,
    /// At `hstu_transducer_embedding_dim - 1` (the reference's PyTorch kernel).
    Pytorch,
}

/// What attention sums are divided by. The reference divides by the longest sequence of the
/// batch (contextual slots + the longest history + the most candidates), so a user's scores
/// change with its batch-mates; `alone` divides by the user's own length, which is what the
/// reference computes for a batch of one user, so dynamic batching never changes a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionNorm {
    /// The user's own sequence length: scores as if each user ran alone (the default).
    #[default]
    Alone,
    /// The batch's longest sequence, as the reference computes it (parity with batched runs).
    BatchMax,
}

impl AttentionNorm {
    pub fn name(self) -> &'static str {
        match self {
            AttentionNorm::Alone => "alone",
            AttentionNorm::BatchMax => "batch_max",
        }
    }
}

impl std::str::FromStr for AttentionNorm {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "alone" => Ok(AttentionNorm::Alone),
            "batch_max" | "batch-max" => Ok(AttentionNorm::BatchMax),
            _ => Err(ModelError::BadOption {
                option: "attention_norm",
                reason: format!("'{s}' is not one of alone, batch_max"),
            }),
        }
    }
}

/// A JSON object read in its written order (a Python dict's order is its meaning here: the
/// contextual features' slots follow it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OrderedMap<V>(pub Vec<(String, V)>);

impl<V> OrderedMap<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }
}

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V_<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V_<V> {
            type Value = OrderedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, V>()? {
                    if out.iter().any(|(o, _): &(String, V)| *o == k) {
                        return Err(serde::de::Error::custom(format!("key '{k}' twice")));
                    }
                    out.push((k, v));
                }
                Ok(OrderedMap(out))
            }
        }
        d.deserialize_map(V_(std::marker::PhantomData))
    }
}

impl HstuModelConfig {
    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = crate::config::read_config_text(path)?;
        let cfg: HstuModelConfig =
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

    /// The model dim `D`.
    pub fn dim(&self) -> usize {
        self.hstu.hstu_transducer_embedding_dim
    }

    /// Contextual slots before each user's history.
    pub fn contextual_slots(&self) -> usize {
        self.hstu
            .contextual_feature_to_max_length
            .0
            .iter()
            .map(|(_, n)| n)
            .sum()
    }

    /// Checks everything the forward pass relies on, naming the first problem.
    pub fn check(&self) -> std::result::Result<(), Invalid> {
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
        if self.family != "hstu" {
            return Err(Invalid(format!(
                "family is '{}', expected 'hstu'",
                self.family
            )));
        }
        if self.dense_dtype == DenseDType::Int8 {
            return Err("dense_dtype int8 is not supported for hstu models (f32 or bf16)".into());
        }
        if let Some(t) = &self.tier {
            t.options()?;
        }
        self.check_dims()?;
        self.check_tables()?;
        self.check_names()?;
        self.check_tasks()
    }

    fn check_dims(&self) -> std::result::Result<(), Invalid> {
        let h = &self.hstu;
        for (name, v) in [
            ("hstu_num_heads", h.hstu_num_heads),
            ("hstu_attn_linear_dim", h.hstu_attn_linear_dim),
            ("hstu_attn_qk_dim", h.hstu_attn_qk_dim),
            ("hstu_embedding_table_dim", h.hstu_embedding_table_dim),
            (
                "hstu_preprocessor_hidden_dim",
                h.hstu_preprocessor_hidden_dim,
            ),
            (
                "hstu_transducer_embedding_dim",
                h.hstu_transducer_embedding_dim,
            ),
            ("num_position_buckets", h.num_position_buckets),
            ("max_seq_len", h.max_seq_len),
            (
                "max_num_candidates_inference",
                h.max_num_candidates_inference,
            ),
        ] {
            if v == 0 {
                return Err(Invalid(format!("hstu.{name} must be at least 1")));
            }
            if v > 1 << 24 {
                return Err(Invalid(format!("hstu.{name} = {v} is implausibly large")));
            }
        }
        if h.num_time_buckets > 1 << 24 {
            return Err(Invalid(format!(
                "hstu.num_time_buckets = {} is implausibly large",
                h.num_time_buckets
            )));
        }
        let per_head = 2 * (h.hstu_attn_linear_dim + h.hstu_attn_qk_dim);
        if per_head
            .checked_mul(h.hstu_num_heads)
            .is_none_or(|w| w > 1 << 24)
        {
            return Err("hstu: heads x (2 linear + 2 qk dims) is implausibly large".into());
        }
        Ok(())
    }

    fn check_tables(&self) -> std::result::Result<(), Invalid> {
        let mut names = BTreeSet::new();
        for t in &self.tables {
            if !safe_file_name(&t.name) {
                return Err(Invalid(format!(
                    "table name '{}' is not usable as a file name",
                    t.name
                )));
            }
            if !names.insert(t.name.as_str()) {
                return Err(Invalid(format!("table '{}' is listed twice", t.name)));
            }
            if t.rows == 0 {
                return Err(Invalid(format!("table '{}' has no rows", t.name)));
            }
            if t.dim != self.hstu.hstu_embedding_table_dim {
                return Err(Invalid(format!(
                    "table '{}' has dim {}, but hstu_embedding_table_dim is {}",
                    t.name, t.dim, self.hstu.hstu_embedding_table_dim
                )));
            }
        }
        let mut seen = BTreeSet::new();
        for f in &self.features {
            if !names.contains(f.table.as_str()) {
                return Err(Invalid(format!(
                    "feature '{}' reads table '{}', which is not listed",
                    f.name, f.table
                )));
            }
            if !seen.insert(f.name.as_str()) {
                return Err(Invalid(format!("feature '{}' is listed twice", f.name)));
            }
        }
        Ok(())
    }

    /// The feature names the forward pass reads exist where it reads them.
    fn check_names(&self) -> std::result::Result<(), Invalid> {
        let h = &self.hstu;
        let emb: BTreeSet<&str> = self.features.iter().map(|f| f.name.as_str()).collect();
        let uih: BTreeSet<&str> = h
            .hstu_uih_feature_names
            .iter()
            .map(|s| s.as_str())
            .collect();
        let cand: BTreeSet<&str> = h
            .hstu_candidate_feature_names
            .iter()
            .map(|s| s.as_str())
            .collect();
        for n in h
            .user_embedding_feature_names
            .iter()
            .chain(&h.item_embedding_feature_names)
        {
            if !emb.contains(n.as_str()) {
                return Err(Invalid(format!(
                    "embedding feature '{n}' reads no table (add it to 'features')"
                )));
            }
        }
        for n in &h.user_embedding_feature_names {
            if !uih.contains(n.as_str()) {
                return Err(Invalid(format!(
                    "user embedding feature '{n}' is not in hstu_uih_feature_names"
                )));
            }
        }
        for n in &h.item_embedding_feature_names {
            if !cand.contains(n.as_str()) {
                return Err(Invalid(format!(
                    "item embedding feature '{n}' is not in hstu_candidate_feature_names"
                )));
            }
        }
        self.check_roles(&uih, &cand)?;
        self.check_mapping(&emb, &uih, &cand)
    }

    /// The post id, times, action bits and query time are where the forward pass reads them.
    fn check_roles(
        &self,
        uih: &BTreeSet<&str>,
        cand: &BTreeSet<&str>,
    ) -> std::result::Result<(), Invalid> {
        let h = &self.hstu;
        let need_uih = [
            ("uih_post_id_feature_name", &h.uih_post_id_feature_name),
            (
                "uih_action_time_feature_name",
                &h.uih_action_time_feature_name,
            ),
        ];
        for (what, n) in need_uih {
            if !uih.contains(n.as_str()) {
                return Err(Invalid(format!(
                    "{what} '{n}' is not in hstu_uih_feature_names"
                )));
            }
        }
        if h.action_weights.is_some() && !uih.contains(h.uih_weight_feature_name.as_str()) {
            return Err(Invalid(format!(
                "uih_weight_feature_name '{}' is not in hstu_uih_feature_names",
                h.uih_weight_feature_name
            )));
        }
        if !cand.contains(h.candidates_querytime_feature_name.as_str()) {
            return Err(Invalid(format!(
                "candidates_querytime_feature_name '{}' is not in hstu_candidate_feature_names",
                h.candidates_querytime_feature_name
            )));
        }
        if !h
            .user_embedding_feature_names
            .contains(&h.uih_post_id_feature_name)
        {
            return Err(Invalid(format!(
                "uih_post_id_feature_name '{}' is not a user embedding feature",
                h.uih_post_id_feature_name
            )));
        }
        Ok(())
    }

    /// The merge mapping pairs named features, the post id has its candidate counterpart, the
    /// contextual features are user features, and there is room for a sequence.
    fn check_mapping(
        &self,
        emb: &BTreeSet<&str>,
        uih: &BTreeSet<&str>,
        cand: &BTreeSet<&str>,
    ) -> std::result::Result<(), Invalid> {
        let h = &self.hstu;
        for (u, c) in &h.merge_uih_candidate_feature_mapping {
            if !uih.contains(u.as_str()) {
                return Err(Invalid(format!(
                    "merge mapping: '{u}' is not in hstu_uih_feature_names"
                )));
            }
            if !cand.contains(c.as_str()) {
                return Err(Invalid(format!(
                    "merge mapping: '{c}' is not in hstu_candidate_feature_names"
                )));
            }
            if emb.contains(u.as_str()) != emb.contains(c.as_str()) && emb.contains(u.as_str()) {
                return Err(Invalid(format!(
                    "merge mapping: '{u}' is an embedding feature but '{c}' is not"
                )));
            }
        }
        if !h
            .merge_uih_candidate_feature_mapping
            .iter()
            .any(|(u, c)| *u == h.uih_post_id_feature_name && emb.contains(c.as_str()))
        {
            return Err(Invalid(format!(
                "merge mapping has no candidate feature for the post id '{}'",
                h.uih_post_id_feature_name
            )));
        }
        for (k, n) in &h.contextual_feature_to_max_length.0 {
            if !h.user_embedding_feature_names.contains(k) {
                return Err(Invalid(format!(
                    "contextual feature '{k}' is not a user embedding feature"
                )));
            }
            if *n == 0 {
                return Err(Invalid(format!(
                    "contextual feature '{k}' has max length 0"
                )));
            }
        }
        for k in h.contextual_feature_to_min_uih_length.keys() {
            if h.contextual_feature_to_max_length.get(k).is_none() {
                return Err(Invalid(format!(
                    "min uih length given for '{k}', which is not contextual"
                )));
            }
        }
        for n in self.item_features() {
            if !emb.contains(n) {
                return Err(Invalid(format!("item feature '{n}' reads no table")));
            }
        }
        if h.item_embedding_feature_names.is_empty() {
            return Err("item_embedding_feature_names is empty".into());
        }
        let dims = self.contextual_slots() + 2;
        if dims > h.max_seq_len {
            return Err(Invalid(format!(
                "max_seq_len {} leaves no room for one history item and one candidate after {} \
                 contextual slots",
                h.max_seq_len,
                self.contextual_slots()
            )));
        }
        Ok(())
    }

    fn check_tasks(&self) -> std::result::Result<(), Invalid> {
        let t = &self.hstu.multitask_configs;
        if t.is_empty() {
            return Err("multitask_configs is empty".into());
        }
        if t.windows(2).any(|w| w[0].task_type > w[1].task_type) {
            return Err("multitask_configs must be sorted by task_type (binary first)".into());
        }
        let mut names = BTreeSet::new();
        for task in t {
            if !names.insert(task.task_name.as_str()) {
                return Err(Invalid(format!(
                    "task '{}' is listed twice",
                    task.task_name
                )));
            }
        }
        Ok(())
    }

    /// The history features whose embeddings are added through the "additional" MLP: those
    /// merged with an item embedding feature, other than the post id.
    pub fn additional_features(&self) -> Vec<(&str, &str)> {
        let h = &self.hstu;
        h.merge_uih_candidate_feature_mapping
            .iter()
            .filter(|(u, c)| {
                h.item_embedding_feature_names.contains(c)
                    && h.user_embedding_feature_names.contains(u)
                    && *u != h.uih_post_id_feature_name
            })
            .map(|(u, c)| (u.as_str(), c.as_str()))
            .collect()
    }

    /// The candidate feature merged with the post id.
    pub fn candidate_post_id(&self) -> &str {
        let h = &self.hstu;
        h.merge_uih_candidate_feature_mapping
            .iter()
            .find(|(u, _)| *u == h.uih_post_id_feature_name)
            .map(|(_, c)| c.as_str())
            .expect("checked")
    }

    /// The item features, in order.
    pub fn item_features(&self) -> impl Iterator<Item = &str> {
        self.hstu
            .item_embedding_feature_names
            .iter()
            .map(|s| s.as_str())
    }
}
