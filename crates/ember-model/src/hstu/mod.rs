//! Meta's HSTU ranking model (`DlrmHSTU` of meta-recsys/generative-recommenders, MLPerf
//! DLRMv3) as an Ember model family: a user's history and candidates in, one score per
//! candidate and task out.
//!
//! - [`config`]: `config.json` (`"family": "hstu"`), every hyperparameter of the reference's
//!   `DlrmHSTUConfig`;
//! - [`request`]: users checked once and laid out as tokens (`[contextual | history |
//!   candidates]`), their embedding lookups one jagged batch through Ember's embedding stage and
//!   tiers;
//! - [`attention`]: the jagged, blocked attention kernel with the causal and target-aware masks;
//! - [`layers`]: layer norms and the reference's `Linear -> SwishLayerNorm -> Linear` blocks;
//! - [`forward`]: the forward pass on the CPU ([`HstuPredictor`]), its last step (postprocessor,
//!   item MLP, head) in `head.rs`.
//!
//! Weights are read by the names of the reference's `state_dict` (`tools/export_torch.py --from
//! generative-recommenders` writes them; `docs/model-format.md` lists them).

pub mod attention;
pub mod config;
pub mod forward;
mod head;
pub mod layers;
pub mod presets;
pub mod request;

use std::path::Path;

use ember_embed::{EmbeddingCollection, EmbeddingTable, Feature, PagePolicy, Stager, TierOptions};

pub use config::{AttentionNorm, HstuModelConfig, TaskType, TimeBucketClamp};
pub use forward::{HstuPredictor, HstuScores, HstuTimes};
pub use request::{HstuBatch, User, UserSpan};

use crate::dense::{DenseDType, DenseIsa};
use crate::error::{ModelError, Result};
use crate::mlp::Linear;
use crate::model::LoadOptions;
use crate::random::{normal_vec, seeded_row};
use crate::weights::{Reader, map_weights};
use layers::{Norm, SwishMlp};
use request::Roles;

/// The reference's fixed widths: the action embedding per action type, and the hidden width of
/// the item MLP and the prediction head.
pub const ACTION_DIM: usize = 8;
pub const HEAD_HIDDEN: usize = 512;
const LN_EPS: f32 = 1e-5;
const STU_EPS: f32 = 1e-6;

const PRE: &str = "_hstu_transducer._input_preprocessor";
const POS: &str = "_hstu_transducer._positional_encoder";
const STU: &str = "_hstu_transducer._stu_module._stu_layers";
const POST: &str = "_hstu_transducer._output_postprocessor";
const ITEM: &str = "_item_embedding_mlp";
const HEAD: &str = "_multitask_module._prediction_module";
/// The reference's `TimestampLayerNormPostprocessor` features: (seconds per unit, units per
/// period): hour of day, day of week.
pub const TIME_FEATURES: [(f32, f32); 2] = [(3600.0, 24.0), (86400.0, 7.0)];

/// One STU layer.
#[derive(Debug)]
pub struct StuLayer {
    pub input_norm: Norm,
    /// `x -> [u | v | q | k]`, with the reference's `uvqk_beta` as its bias.
    pub uvqk: Linear,
    /// Over all heads' attention outputs, or per head (group norm: one weight per head).
    pub output_norm: Norm,
    /// `[u | attn | u * norm(attn)] -> D`, no bias.
    pub output: Linear,
}

/// The action encoder: an embedding per action bit, and the candidates' one embedding.
#[derive(Debug)]
pub struct ActionEncoder {
    pub weights: Vec<i64>,
    /// `[types, ACTION_DIM]`.
    pub table: Vec<f32>,
    /// `[types x ACTION_DIM]`.
    pub target: Vec<f32>,
    pub mlp: SwishMlp,
}

/// What the transducer's output becomes before the head.
#[derive(Debug)]
pub enum Postprocessor {
    /// The time of day and week (cos, sin) appended, a linear layer, a layer norm.
    Timestamp {
        combiner: Box<Linear>,
        norm: Norm,
    },
    LayerNorm(Norm),
    /// Divided by its L2 norm (the reference's default without a postprocessor).
    L2,
}

/// The dense part of the model.
#[derive(Debug)]
pub struct HstuWeights {
    pub content: SwishMlp,
    pub additional: Option<SwishMlp>,
    pub action: Option<ActionEncoder>,
    /// `[slots, table_dim, D]` and `[slots, D]`.
    pub contextual_w: Vec<f32>,
    pub contextual_b: Vec<f32>,
    /// `[num_position_buckets, D]`, `[num_time_buckets + 1, D]`.
    pub positions: Vec<f32>,
    pub times: Vec<f32>,
    pub layers: Vec<StuLayer>,
    pub post: Postprocessor,
    pub item: SwishMlp,
    pub head: SwishMlp,
}

/// An HSTU model: its config, tables (through Ember's embedding stage and tiers) and weights.
#[derive(Debug)]
pub struct HstuModel {
    config: HstuModelConfig,
    roles: Roles,
    embeddings: EmbeddingCollection,
    stager: Stager,
    weights: HstuWeights,
}

/// Reads `name` of `shape` (a source of f32 tensors: the weights file, or random values).
type Source<'a> = dyn FnMut(&str, &[usize]) -> Result<Vec<f32>> + 'a;

impl HstuModel {
    /// Whether `dir` holds an HSTU model (its config.json says `"family": "hstu"`).
    pub fn is_hstu_dir(dir: &Path) -> bool {
        let Ok(text) = ember_embed::files::read_text(
            &dir.join("config.json"),
            "model config",
            ember_embed::files::TEXT_LIMIT,
        ) else {
            return false;
        };
        #[derive(serde::Deserialize)]
        struct Family {
            family: Option<String>,
        }
        serde_json::from_str::<Family>(&text).is_ok_and(|f| f.family.as_deref() == Some("hstu"))
    }

    /// Loads `dir/config.json` and `dir/model.safetensors`.
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<HstuModel> {
        let mut config = HstuModelConfig::read(&dir.join("config.json"))?;
        if let Some(p) = opts.placement {
            config.tables.iter_mut().for_each(|t| t.placement = p);
        }
        config.remote = opts.remote.apply(config.remote.take());
        if let (Some(r), Some(name)) = (config.remote.as_mut(), &opts.name) {
            r.model.get_or_insert_with(|| name.clone());
        }
        if let Some(d) = opts.dense_dtype {
            config.dense_dtype = d;
        }
        config.check().map_err(|reason| ModelError::Config {
            path: dir.join("config.json"),
            reason,
        })?;
        let path = dir.join("model.safetensors");
        let map = map_weights(&path)?;
        let mut r = Reader::new(&path, &map)?;
        let weights = read_dense(&config, &mut |name, shape| r.f32s(name, shape))?;
        if config.hstu_additional_empty() {
            r.allow_unused_prefix(&format!("{PRE}._additional_embedding_mlp."));
        }
        let tables = r.tables(
            &map,
            &config.tables,
            config.remote.as_ref(),
            opts.table_dtype,
            opts.pace,
        )?;
        r.check_all_used()?;
        drop(map);
        if let Some(d) = opts.table_dtype {
            config.tables.iter_mut().for_each(|t| t.dtype = d);
        }
        let tier = crate::model::tier_options(dir, config.tier.as_ref(), config.remote.as_ref())?;
        Self::assemble(config, weights, tables, tier)
    }

    /// A model of `config`'s shape with random weights (for benchmarks and `ember data model`):
    /// linear weights N(0, 1/in), norms near 1, table rows from [`seeded_row`].
    pub fn random(config: HstuModelConfig, seed: u64, threads: usize) -> Result<HstuModel> {
        config.check().map_err(|reason| ModelError::Config {
            path: "config".into(),
            reason,
        })?;
        let weights = read_dense(&config, &mut random_source(seed))?;
        let mut tables = Vec::with_capacity(config.tables.len());
        for (i, t) in config.tables.iter().enumerate() {
            let mut table =
                EmbeddingTable::zeroed(&t.name, t.rows, t.dim, t.dtype, PagePolicy::Huge)?;
            table.fill_rows(threads, |r, row| seeded_row(seed, i, r, row));
            tables.push(table);
        }
        Self::assemble(config, weights, tables, TierOptions::default())
    }

    fn assemble(
        config: HstuModelConfig,
        weights: HstuWeights,
        tables: Vec<EmbeddingTable>,
        tier: TierOptions,
    ) -> Result<HstuModel> {
        let roles = Roles::of(&config).map_err(|reason| ModelError::Config {
            path: "config".into(),
            reason,
        })?;
        let index = |name: &str| {
            config
                .tables
                .iter()
                .position(|t| t.name == name)
                .expect("checked: the table exists")
        };
        let features = roles
            .features
            .iter()
            .map(|f| Feature {
                name: f.name.clone(),
                table: index(&f.table),
            })
            .collect();
        let mut embeddings = EmbeddingCollection::new(tables, features)?;
        embeddings.prepare_updates(&tier)?;
        let stager = Stager::new(&embeddings, tier)?;
        DenseIsa::selected(config.dense_dtype)?;
        let model = HstuModel {
            config,
            roles,
            embeddings,
            stager,
            weights,
        };
        model.prepare_dense(model.config.dense_dtype);
        Ok(model)
    }

    /// Packs every dense layer's weights for `dtype` (at load; a predictor told to run another
    /// precision calls it first).
    pub fn prepare_dense(&self, dtype: DenseDType) {
        if dtype == DenseDType::F32 {
            return;
        }
        let w = &self.weights;
        let mlps = [
            Some(&w.content),
            w.additional.as_ref(),
            w.action.as_ref().map(|a| &a.mlp),
        ];
        for m in mlps.into_iter().flatten().chain([&w.item, &w.head]) {
            m.prepare(dtype);
        }
        for l in &w.layers {
            l.uvqk.prepare(dtype);
            l.output.prepare(dtype);
        }
        if let Postprocessor::Timestamp { combiner, .. } = &w.post {
            combiner.prepare(dtype);
        }
    }

    /// Lookup feature `f`'s columns in a row of a batch's lookups.
    pub(crate) fn cols(&self, f: usize) -> std::ops::Range<usize> {
        let c = self.embeddings.col_offset(f);
        c..c + self.config.hstu.hstu_embedding_table_dim
    }

    pub fn config(&self) -> &HstuModelConfig {
        &self.config
    }

    pub fn weights(&self) -> &HstuWeights {
        &self.weights
    }

    /// The embedding stage: tables and the lookup features over the token axis.
    pub fn embeddings(&self) -> &EmbeddingCollection {
        &self.embeddings
    }

    /// The tier's stager (inactive when every table is in memory).
    pub fn stager(&self) -> &Stager {
        &self.stager
    }

    /// The task names, in output order.
    pub fn tasks(&self) -> Vec<String> {
        self.config
            .hstu
            .multitask_configs
            .iter()
            .map(|t| t.task_name.clone())
            .collect()
    }

    /// Multiply-adds of the dense layers for one user: per token (the input MLPs, the
    /// projections), per candidate (the item MLP, the head) and the attention's pairs.
    pub fn macs(&self, history: usize, candidates: usize) -> (f64, f64) {
        let w = &self.weights;
        let t = (self.config.contextual_slots() + history + candidates) as f64;
        let c = candidates as f64;
        let mut token = w.content.macs() as f64;
        token += w.additional.as_ref().map_or(0, |m| m.macs()) as f64;
        token += w.action.as_ref().map_or(0, |a| a.mlp.macs()) as f64;
        let proj: usize = w
            .layers
            .iter()
            .map(|l| l.uvqk.weight().len() + l.output.weight().len())
            .sum();
        let dense = t * (token + proj as f64) + c * (w.item.macs() + w.head.macs()) as f64;
        let h = &self.config.hstu;
        let m = (self.config.contextual_slots() + history) as f64;
        let pairs = m * (m + 1.0) / 2.0 + c * (m + 1.0);
        let per_pair = (h.hstu_num_heads * (h.hstu_attn_qk_dim + h.hstu_attn_linear_dim)) as f64;
        (dense, pairs * per_pair * h.hstu_attn_num_layers as f64)
    }
}

impl HstuModelConfig {
    fn hstu_additional_empty(&self) -> bool {
        self.additional_features().is_empty()
    }
}

/// The dense tensors of [`HstuModel::random`]`(cfg, seed)` as `model.safetensors` names them
/// (the reference's names): name, shape, f32 values. `ember data model` writes them beside
/// tables of [`seeded_row`]'s rows, so that the directory loads as the same model.
pub fn random_dense_tensors(
    cfg: &HstuModelConfig,
    seed: u64,
) -> Result<Vec<crate::model::NamedTensor>> {
    cfg.check().map_err(|reason| ModelError::Config {
        path: "config".into(),
        reason,
    })?;
    let mut out = Vec::new();
    let mut src = random_source(seed);
    read_dense(cfg, &mut |name: &str, shape: &[usize]| {
        let v = src(name, shape)?;
        out.push((name.to_string(), shape.to_vec(), v.clone()));
        Ok(v)
    })?;
    Ok(out)
}

/// Normal values from a seed, for [`HstuModel::random`]: norms' weights near 1, biases near 0,
/// embeddings N(0, 0.1), linear weights N(0, 1/in).
fn random_source(seed: u64) -> impl FnMut(&str, &[usize]) -> Result<Vec<f32>> {
    let mut s = seed;
    move |name: &str, shape: &[usize]| {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let n: usize = shape.iter().product();
        let last = *shape.last().unwrap_or(&1);
        let v = if name.ends_with("bias") || name.ends_with("_beta") {
            normal_vec(n, 0.01, s)
        } else if shape.len() == 1 {
            normal_vec(n, 0.05, s)
                .into_iter()
                .map(|x| 1.0 + x)
                .collect()
        } else if name.contains("embedding") && !name.contains("mlp") {
            normal_vec(n, 0.1, s)
        } else {
            let fan_in = if name.contains("_uvqk_weight")
                || name.contains("_output_weight")
                || name.contains("contextual")
            {
                shape[shape.len() - 2]
            } else {
                last
            };
            normal_vec(n, (1.0 / fan_in.max(1) as f32).sqrt(), s)
        };
        Ok(v)
    }
}

/// The dense weights of `cfg`, each read from `src` by its reference name and shape.
fn read_dense(cfg: &HstuModelConfig, src: &mut Source<'_>) -> Result<HstuWeights> {
    let h = &cfg.hstu;
    let (td, d, hid) = (
        h.hstu_embedding_table_dim,
        cfg.dim(),
        h.hstu_preprocessor_hidden_dim,
    );
    let content = swish_mlp(
        src,
        &format!("{PRE}._content_embedding_mlp"),
        td,
        hid,
        d,
        true,
    )?;
    let n_add = cfg.additional_features().len();
    let additional = match n_add {
        0 => None,
        n => Some(swish_mlp(
            src,
            &format!("{PRE}._additional_embedding_mlp"),
            td * n,
            hid,
            d,
            true,
        )?),
    };
    let action = match &h.action_weights {
        None => None,
        Some(ws) => {
            let types = ws.len();
            Some(ActionEncoder {
                weights: ws.clone(),
                table: src(
                    &format!("{PRE}._action_encoder._action_embedding_table"),
                    &[types, ACTION_DIM],
                )?,
                target: src(
                    &format!("{PRE}._action_encoder._target_action_embedding_table"),
                    &[1, types * ACTION_DIM],
                )?,
                mlp: swish_mlp(
                    src,
                    &format!("{PRE}._action_embedding_mlp"),
                    types * ACTION_DIM,
                    hid,
                    d,
                    true,
                )?,
            })
        }
    };
    let slots = cfg.contextual_slots();
    let (contextual_w, contextual_b) = match slots {
        0 => (Vec::new(), Vec::new()),
        s => (
            src(
                &format!("{PRE}._batched_contextual_linear_weights"),
                &[s, td, d],
            )?,
            src(&format!("{PRE}._batched_contextual_linear_bias"), &[s, d])?,
        ),
    };
    let positions = src(
        &format!("{POS}._position_embeddings_weight"),
        &[h.num_position_buckets, d],
    )?;
    let times = src(
        &format!("{POS}._timestamp_embeddings_weight"),
        &[h.num_time_buckets + 1, d],
    )?;
    let layers = read_layers(cfg, src)?;
    let (post, item, head) = read_head(cfg, src)?;
    Ok(HstuWeights {
        content,
        additional,
        action,
        contextual_w,
        contextual_b,
        positions,
        times,
        layers,
        post,
        item,
        head,
    })
}

/// The STU layers of `cfg` (the reference multiplies `x @ W`: the projections are transposed
/// into [`Linear`]'s `[out, in]`).
fn read_layers(cfg: &HstuModelConfig, src: &mut Source<'_>) -> Result<Vec<StuLayer>> {
    let h = &cfg.hstu;
    let d = cfg.dim();
    let mut layers = Vec::with_capacity(h.hstu_attn_num_layers);
    let (heads, lin, qk) = (h.hstu_num_heads, h.hstu_attn_linear_dim, h.hstu_attn_qk_dim);
    let width = heads * 2 * (lin + qk);
    for l in 0..h.hstu_attn_num_layers {
        let p = format!("{STU}.{l}");
        let uvqk = src(&format!("{p}._uvqk_weight"), &[d, width])?;
        let beta = src(&format!("{p}._uvqk_beta"), &[width])?;
        let norm_dim = if h.hstu_group_norm {
            heads
        } else {
            heads * lin
        };
        let out = src(&format!("{p}._output_weight"), &[3 * heads * lin, d])?;
        layers.push(StuLayer {
            input_norm: Norm {
                weight: src(&format!("{p}._input_norm_weight"), &[d])?,
                bias: src(&format!("{p}._input_norm_bias"), &[d])?,
                eps: STU_EPS,
            },
            uvqk: Linear::new(d, width, transpose(&uvqk, d, width), beta, false),
            output_norm: Norm {
                weight: src(&format!("{p}._output_norm_weight"), &[norm_dim])?,
                bias: src(&format!("{p}._output_norm_bias"), &[norm_dim])?,
                eps: STU_EPS,
            },
            output: Linear::new(
                3 * heads * lin,
                d,
                transpose(&out, 3 * heads * lin, d),
                vec![0.0; d],
                false,
            ),
        });
    }
    Ok(layers)
}

/// The postprocessor, the item MLP and the prediction head of `cfg`.
fn read_head(
    cfg: &HstuModelConfig,
    src: &mut Source<'_>,
) -> Result<(Postprocessor, SwishMlp, SwishMlp)> {
    let h = &cfg.hstu;
    let (td, d) = (h.hstu_embedding_table_dim, cfg.dim());
    let post = if !h.enable_postprocessor {
        Postprocessor::L2
    } else {
        let norm = Norm {
            weight: src(&format!("{POST}._layer_norm.weight"), &[d])?,
            bias: src(&format!("{POST}._layer_norm.bias"), &[d])?,
            eps: LN_EPS,
        };
        if h.use_layer_norm_postprocessor {
            Postprocessor::LayerNorm(norm)
        } else {
            let k = d + 2 * TIME_FEATURES.len();
            let combiner = Box::new(Linear::new(
                k,
                d,
                src(&format!("{POST}._time_feature_combiner.weight"), &[d, k])?,
                src(&format!("{POST}._time_feature_combiner.bias"), &[d])?,
                false,
            ));
            Postprocessor::Timestamp { combiner, norm }
        }
    };
    let n_items = h.item_embedding_feature_names.len();
    let item = swish_mlp(src, ITEM, td * n_items, HEAD_HIDDEN, d, true)?;
    let tasks = h.multitask_configs.len();
    let head = swish_mlp(src, HEAD, d, HEAD_HIDDEN, tasks, false)?;
    Ok((post, item, head))
}

/// `prefix.{0,1,2}` (`Linear(i -> hid)`, `SwishLayerNorm(hid)`, `Linear(hid -> o)`), and
/// `prefix.3` (`LayerNorm(o)`) when `norm`.
fn swish_mlp(
    src: &mut Source<'_>,
    prefix: &str,
    i: usize,
    hid: usize,
    o: usize,
    norm: bool,
) -> Result<SwishMlp> {
    let first = Linear::new(
        i,
        hid,
        src(&format!("{prefix}.0.weight"), &[hid, i])?,
        src(&format!("{prefix}.0.bias"), &[hid])?,
        false,
    );
    let swish = Norm {
        weight: src(&format!("{prefix}.1.weight"), &[hid])?,
        bias: src(&format!("{prefix}.1.bias"), &[hid])?,
        eps: LN_EPS,
    };
    let second = Linear::new(
        hid,
        o,
        src(&format!("{prefix}.2.weight"), &[o, hid])?,
        src(&format!("{prefix}.2.bias"), &[o])?,
        false,
    );
    let norm = match norm {
        true => Some(Norm {
            weight: src(&format!("{prefix}.3.weight"), &[o])?,
            bias: src(&format!("{prefix}.3.bias"), &[o])?,
            eps: LN_EPS,
        }),
        false => None,
    };
    Ok(SwishMlp {
        first,
        swish,
        second,
        norm,
    })
}

/// `[r, c]` row-major -> `[c, r]` row-major (the reference multiplies `x @ W`; a [`Linear`]
/// holds `W^T`).
fn transpose(w: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut t = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = w[i * c + j];
        }
    }
    t
}
