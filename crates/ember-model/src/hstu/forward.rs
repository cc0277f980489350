//! The HSTU forward pass on the CPU, jagged throughout: a batch is its users' tokens one after
//! another (`[contextual | history | candidates]` per user), every layer runs over all of them
//! at once, and only attention looks at where one user ends.
//!
//! The steps and the reference's modules they follow (meta-recsys/generative-recommenders):
//!
//! 1. lookups: every token's rows through the embedding stage (`request.rs`);
//! 2. inputs (`ContextualPreprocessor`): the content MLP of the post id's row, plus the
//!    additional MLP of the other merged features' rows, plus the action MLP of the action
//!    embeddings (the history's action bits, the candidates' one target embedding); the
//!    contextual slots get `bias[s] + row @ W[s]` instead (zeroed for users shorter than the
//!    feature's minimum);
//! 3. encodings (`HSTUPositionalEncoder`): `x * sqrt(D) + (time[bucket] + position[p])`;
//! 4. STU layers: `u, v, q, k = split(layer_norm(x) @ W_uvqk + b)`, `u = silu(u)`, the
//!    attention of [`super::attention`], then `x += [u | a | u * norm(a)] @ W_out`; the last
//!    layer carries only the candidates' rows past its projection (all a later step reads);
//! 5. the candidates' rows, the postprocessor (time of day and week, linear, layer norm), times
//!    the item MLP of the candidates' item rows, into the head; a sigmoid per binary task
//!    ([`super::head`]).

use std::sync::Arc;
use std::time::Instant;

use ember_embed::{CheckedBatch, Dedup, PoolOptions, Pooler, Pooling, StagedBatch};

use super::HstuModel;
use super::config::AttentionNorm;
pub use super::head::HstuScores;
use super::head::{HeadScratch, head};
use super::layers::DenseCtx;
use super::plan::{self, AsOf};
use super::request::HstuBatch;
use super::stu::{Held, LayerScratch, Layers, Rows, Users};
pub use super::times::HstuTimes;
use crate::dense::{DenseDType, DenseIsa};
use crate::error::{ModelError, Result};

/// Buffers reused across batches.
#[derive(Debug, Default)]
struct Scratch {
    emb: Vec<f32>,
    input: Vec<f32>,
    x: Vec<f32>,
    tmp: Vec<f32>,
    layers: LayerScratch,
    head: HeadScratch,
}

/// Runs an [`HstuModel`] on the CPU.
#[derive(Debug)]
pub struct HstuPredictor {
    model: Arc<HstuModel>,
    pooler: Pooler,
    dense: DenseCtx,
    norm: AttentionNorm,
    s: Scratch,
}

impl HstuPredictor {
    /// A predictor on `threads` threads, in the model's dense precision and attention norm.
    pub fn new(model: Arc<HstuModel>, threads: usize) -> Result<HstuPredictor> {
        if threads == 0 {
            return Err(ModelError::BadOption {
                option: "threads",
                reason: "must be at least 1".into(),
            });
        }
        let pooler = Pooler::new(PoolOptions {
            pooling: Pooling::Sum,
            dedup: Dedup::Auto,
            threads,
            ..PoolOptions::default()
        })?;
        let dtype = model.config().dense_dtype;
        let norm = model.config().attention_norm;
        Ok(HstuPredictor {
            dense: DenseCtx::new(dtype, threads)?,
            model,
            pooler,
            norm,
            s: Scratch::default(),
        })
    }

    /// Runs the dense layers in `dtype` from now on (f32 or bf16).
    pub fn set_dense_dtype(&mut self, dtype: DenseDType) -> Result<()> {
        if dtype == DenseDType::Int8 {
            return Err(ModelError::BadOption {
                option: "dense_dtype",
                reason: "int8 is not supported for hstu models (f32 or bf16)".into(),
            });
        }
        DenseIsa::selected(dtype)?;
        self.model.prepare_dense(dtype);
        self.dense = DenseCtx::new(dtype, self.dense.threads())?;
        Ok(())
    }

    pub fn dense_dtype(&self) -> DenseDType {
        self.dense.dtype
    }

    /// What attention is divided by.
    pub fn attention_norm(&self) -> AttentionNorm {
        self.norm
    }

    /// What attention is divided by from now on.
    pub fn set_attention_norm(&mut self, norm: AttentionNorm) {
        self.norm = norm;
    }

    pub fn model(&self) -> &Arc<HstuModel> {
        &self.model
    }

    pub fn threads(&self) -> usize {
        self.dense.threads()
    }

    /// Stages `batch`'s tier rows (nothing when every table is in memory).
    pub fn stage(&self, batch: &HstuBatch) -> Result<Option<StagedBatch>> {
        let m = &self.model;
        Ok(match m.stager().is_active() {
            true => Some(m.stager().stage(m.embeddings(), batch.lookups.view())?),
            false => None,
        })
    }

    /// Scores `batch`, staging its tier rows first (their time is in `lookups`).
    pub fn run(&mut self, batch: &HstuBatch) -> Result<(HstuScores, HstuTimes)> {
        let t0 = Instant::now();
        let staged = self.stage(batch)?;
        let (scores, mut times) = self.run_staged(batch, staged.as_ref())?;
        let st = t0.elapsed().saturating_sub(times.wall);
        times.lookups += st;
        times.wall += st;
        Ok((scores, times))
    }

    /// Scores `batch` whose tier rows were staged (`staged` from [`HstuPredictor::stage`]).
    pub fn run_staged(
        &mut self,
        batch: &HstuBatch,
        staged: Option<&StagedBatch>,
    ) -> Result<(HstuScores, HstuTimes)> {
        self.pass(batch, staged, &[])
    }

    /// Scores `batch` with each user's first tokens as a cache computed at an earlier request
    /// would hold them (`as_of`, one entry per user; `None` computes the user afresh): the
    /// scores a cache of history states reused without recomputing would give, to measure
    /// against [`HstuPredictor::run`]. Each user's own length is the divisor (`alone`).
    pub fn run_as_of(
        &mut self,
        batch: &HstuBatch,
        as_of: &[Option<AsOf>],
    ) -> Result<(HstuScores, HstuTimes)> {
        let bad = |reason: String| ModelError::BadOption {
            option: "as_of",
            reason,
        };
        if as_of.len() != batch.users().len() {
            return Err(bad(format!(
                "{} entries for {} users",
                as_of.len(),
                batch.users().len()
            )));
        }
        if self.norm != AttentionNorm::Alone {
            return Err(bad("needs attention_norm alone".into()));
        }
        for (k, (a, u)) in as_of.iter().zip(batch.users()).enumerate() {
            if let Some(a) = a.filter(|a| a.history > u.history) {
                return Err(bad(format!(
                    "user {k}: {} earlier history items, {} now",
                    a.history, u.history
                )));
            }
        }
        let staged = self.stage(batch)?;
        self.pass(batch, staged.as_ref(), as_of)
    }

    fn pass(
        &mut self,
        batch: &HstuBatch,
        staged: Option<&StagedBatch>,
        as_of: &[Option<AsOf>],
    ) -> Result<(HstuScores, HstuTimes)> {
        let rows = Rows::all(batch);
        self.pass_rows(batch, None, staged, as_of, &rows, &mut Held::none())
    }

    /// A pass computing `rows` only (their lookups `lookups`, `None`: the batch's own): the
    /// other tokens' keys and values read from `held`, which keeps those it names.
    pub(crate) fn pass_rows(
        &mut self,
        batch: &HstuBatch,
        lookups: Option<&CheckedBatch>,
        staged: Option<&StagedBatch>,
        as_of: &[Option<AsOf>],
        rows: &Rows,
        held: &mut Held,
    ) -> Result<(HstuScores, HstuTimes)> {
        let HstuPredictor {
            model,
            pooler,
            dense,
            norm,
            s,
        } = self;
        let on = On {
            batch,
            lookups: lookups.unwrap_or(&batch.lookups),
            staged,
            norm: *norm,
            as_of,
            rows,
        };
        let pooler_ref: &Pooler = pooler;
        pooler.install(|| forward(model, pooler_ref, dense, s, on, held))
    }
}

/// What one pass runs on: the batch, the lookups of the rows it computes and their staged
/// rows, the divisor, the users' tokens held as of an earlier request (empty: none), and the
/// rows it computes.
struct On<'a> {
    batch: &'a HstuBatch,
    lookups: &'a CheckedBatch,
    staged: Option<&'a StagedBatch>,
    norm: AttentionNorm,
    as_of: &'a [Option<AsOf>],
    rows: &'a Rows,
}

/// The whole pass; see the module's doc for the steps.
fn forward(
    model: &HstuModel,
    pooler: &Pooler,
    dense: &mut DenseCtx,
    s: &mut Scratch,
    on: On<'_>,
    held: &mut Held,
) -> Result<(HstuScores, HstuTimes)> {
    let (batch, staged, norm, rows) = (on.batch, on.staged, on.norm, on.rows);
    let start = Instant::now();
    let mut times = HstuTimes::default();
    let coll = model.embeddings();
    let m = rows.len(batch);
    s.emb.clear();
    s.emb.resize(m * coll.total_dim(), 0.0);
    let view = on.lookups.view();
    match staged {
        Some(st) => pooler.run_staged(coll, view, st, &mut s.emb)?,
        None => pooler.run(coll, view, &mut s.emb)?,
    };
    times.lookups = start.elapsed();
    let t = Instant::now();
    inputs(model, dense, s, batch, rows);
    contextual(model, s, batch, rows);
    encodings(model, s, batch, on.as_of, rows);
    times.preprocess = t.elapsed();
    let seqs = plan::sequences(batch, norm);
    let earlier: Vec<(usize, usize, f32)> = (seqs.iter().zip(on.as_of))
        .filter_map(|(q, a)| {
            let a = (*a)?;
            let cached = batch.slots() + a.history;
            let then = (cached + a.candidates) as f32;
            Some((q.start, q.start + cached, q.norm / then))
        })
        .collect();
    let mut layers = Layers {
        model,
        dense,
        s: &mut s.layers,
        users: Users {
            seqs: &seqs,
            earlier: &earlier,
            rows,
        },
        held,
        times: &mut times,
    };
    layers.run(&mut s.x);
    let t = Instant::now();
    let at = |t: usize| rows.row(t).expect("a candidate is computed");
    let scores = head(model, dense, &s.x, &s.emb, batch, &at, &mut s.head);
    times.head = t.elapsed();
    times.wall = start.elapsed();
    Ok((scores, times))
}

/// Step 2 for every computed row: `x = content(post) + additional(merged) + action(bits)` (the
/// contextual slots' rows are overwritten by [`contextual`]).
fn inputs(
    model: &HstuModel,
    dense: &mut DenseCtx,
    s: &mut Scratch,
    batch: &HstuBatch,
    rows: &Rows,
) {
    let (roles, w) = (&model.roles, &model.weights);
    let tokens = rows.len(batch);
    let td = model.config.hstu.hstu_embedding_table_dim;
    let total = model.embeddings().total_dim();
    let d = model.config.dim();
    // The merged post id: the history's row at history tokens, the candidate's at candidates
    // (the other is an empty bag, zeros).
    let merged = |s: &mut Scratch, pairs: &[(usize, usize)]| {
        s.input.clear();
        s.input.resize(tokens * td * pairs.len(), 0.0);
        let cols: Vec<_> = pairs
            .iter()
            .map(|&(a, b)| (model.cols(a), model.cols(b)))
            .collect();
        for (row, out) in s
            .emb
            .chunks_exact(total)
            .zip(s.input.chunks_exact_mut(td * pairs.len()))
        {
            for (k, (ca, cb)) in cols.iter().enumerate() {
                for ((o, x), y) in out[k * td..(k + 1) * td]
                    .iter_mut()
                    .zip(&row[ca.clone()])
                    .zip(&row[cb.clone()])
                {
                    *o = x + y;
                }
            }
        }
    };
    merged(s, &[(roles.post, roles.candidate_post)]);
    s.x.resize(tokens * d, 0.0);
    w.content.forward(dense, &s.input, td, tokens, &mut s.x);
    if let Some(mlp) = &w.additional {
        merged(s, &roles.additional);
        s.tmp.resize(tokens * d, 0.0);
        mlp.forward(dense, &s.input, mlp.in_dim(), tokens, &mut s.tmp);
        s.x.iter_mut().zip(&s.tmp).for_each(|(x, a)| *x += a);
    }
    if let Some(a) = &w.action {
        let width = a.mlp.in_dim();
        s.input.clear();
        s.input.resize(batch.tokens() * width, 0.0);
        plan::action_rows(model, batch, &mut s.input);
        if !rows.is_all() {
            for (k, &t) in rows.tokens().iter().enumerate() {
                s.input.copy_within(t * width..(t + 1) * width, k * width);
            }
            s.input.truncate(tokens * width);
        }
        s.tmp.resize(tokens * d, 0.0);
        a.mlp.forward(dense, &s.input, width, tokens, &mut s.tmp);
        s.x.iter_mut().zip(&s.tmp).for_each(|(x, a)| *x += a);
    }
}

/// Step 2 for the contextual slots: `bias[s] + row @ W[s]`, the row zeroed for a user shorter
/// than the feature's minimum (or without the value).
fn contextual(model: &HstuModel, s: &mut Scratch, batch: &HstuBatch, rows: &Rows) {
    let w = &model.weights;
    let td = model.config.hstu.hstu_embedding_table_dim;
    let total = model.embeddings().total_dim();
    let d = model.config.dim();
    plan::contextual_slots(model, batch, |c| {
        let Some(t) = rows.row(c.token) else {
            return;
        };
        let slot = c.slot;
        let out = &mut s.x[t * d..(t + 1) * d];
        out.copy_from_slice(&w.contextual_b[slot * d..(slot + 1) * d]);
        let Some(col) = c.col else {
            return;
        };
        let row = &s.emb[t * total + col..t * total + col + td];
        let wm = &w.contextual_w[slot * td * d..(slot + 1) * td * d];
        for (i, &xi) in row.iter().enumerate() {
            for (o, &wij) in out.iter_mut().zip(&wm[i * d..(i + 1) * d]) {
                *o += xi * wij;
            }
        }
    });
}

/// Step 3: `x = x * sqrt(D) + (time[bucket] + position[p])` for every token (the first tokens
/// of a user in `as_of` encoded as of its earlier request).
fn encodings(
    model: &HstuModel,
    s: &mut Scratch,
    batch: &HstuBatch,
    as_of: &[Option<AsOf>],
    rows: &Rows,
) {
    let w = &model.weights;
    let d = model.config.dim();
    let alpha = (d as f64).sqrt() as f32;
    plan::encoding_rows_as_of(model, batch, as_of, |t, p, b| {
        let Some(t) = rows.row(t) else {
            return;
        };
        let x = &mut s.x[t * d..(t + 1) * d];
        let pe = &w.positions[p * d..(p + 1) * d];
        let te = &w.times[b * d..(b + 1) * d];
        for ((x, &pv), &tv) in x.iter_mut().zip(pe).zip(te) {
            *x = *x * alpha + (tv + pv);
        }
    });
}
