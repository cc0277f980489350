//! The HSTU model's dense part and how it is read: every weight by the name the reference's
//! `state_dict` gives it (`docs/model-format.md`, "HSTU models"), from the weights file or from
//! a seeded random source (the same names and order, so `ember data model` writes what
//! [`super::HstuModel::random`] builds).

use super::config::HstuModelConfig;
use super::layers::{Norm, SwishMlp};
use super::{ACTION_DIM, HEAD_HIDDEN, TIME_FEATURES};
use crate::error::Invalid;
use crate::error::{ModelError, Result};
use crate::mlp::Linear;
use crate::random::normal_vec;

const LN_EPS: f32 = 1e-5;
const STU_EPS: f32 = 1e-6;

pub(crate) const PRE: &str = "_hstu_transducer._input_preprocessor";
const POS: &str = "_hstu_transducer._positional_encoder";
const STU: &str = "_hstu_transducer._stu_module._stu_layers";
const POST: &str = "_hstu_transducer._output_postprocessor";
const ITEM: &str = "_item_embedding_mlp";
const HEAD: &str = "_multitask_module._prediction_module";
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

/// Reads `name` of `shape` (a source of f32 tensors: the weights file, or random values).
pub(crate) type Source<'a> = dyn FnMut(&str, &[usize]) -> Result<Vec<f32>> + 'a;

/// The dense tensors of [`HstuModel::random`]`(cfg, seed)` as `model.safetensors` names them
/// (the reference's names): name, shape, f32 values. `ember data model` writes them beside
/// tables of [`seeded_row`]'s rows, so that the directory loads as the same model.
pub fn random_dense_tensors(
    cfg: &HstuModelConfig,
    seed: u64,
) -> Result<Vec<crate::model::NamedTensor>> {
    cfg.check().map_err(|Invalid(reason)| ModelError::Config {
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
pub(crate) fn random_source(seed: u64) -> impl FnMut(&str, &[usize]) -> Result<Vec<f32>> {
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
pub(crate) fn read_dense(cfg: &HstuModelConfig, src: &mut Source<'_>) -> Result<HstuWeights> {
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
