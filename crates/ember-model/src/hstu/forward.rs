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
use std::time::{Duration, Instant};

use ember_embed::{Dedup, PoolOptions, Pooler, Pooling, StagedBatch};

use super::HstuModel;
use super::attention::{self, Queries, Seq, Shape};
use super::config::AttentionNorm;
pub use super::head::HstuScores;
use super::head::{HeadScratch, head};
use super::layers::{DenseCtx, for_rows, moments, silu};
use super::plan::{self, AsOf};
use super::request::HstuBatch;
use crate::dense::{DenseDType, DenseIsa};
use crate::error::{ModelError, Result};

/// Where a forward pass spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HstuTimes {
    /// The embedding lookups (staging from a tier included when it ran inline).
    pub lookups: Duration,
    /// The input MLPs, the contextual slots and the encodings.
    pub preprocess: Duration,
    /// The STU layers' two projections.
    pub projections: Duration,
    pub attention: Duration,
    /// The STU layers' norms and elementwise work.
    pub pointwise: Duration,
    /// Postprocessor, item MLP and head.
    pub head: Duration,
    pub wall: Duration,
}

impl HstuTimes {
    pub fn plus(self, o: HstuTimes) -> HstuTimes {
        HstuTimes {
            lookups: self.lookups + o.lookups,
            preprocess: self.preprocess + o.preprocess,
            projections: self.projections + o.projections,
            attention: self.attention + o.attention,
            pointwise: self.pointwise + o.pointwise,
            head: self.head + o.head,
            wall: self.wall + o.wall,
        }
    }
}

/// Buffers reused across batches.
#[derive(Debug, Default)]
struct Scratch {
    emb: Vec<f32>,
    input: Vec<f32>,
    x: Vec<f32>,
    tmp: Vec<f32>,
    xn: Vec<f32>,
    uvqk: Vec<f32>,
    attn: Vec<f32>,
    y: Vec<f32>,
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
        let HstuPredictor {
            model,
            pooler,
            dense,
            norm,
            s,
        } = self;
        let on = On {
            batch,
            staged,
            norm: *norm,
            as_of,
        };
        let pooler_ref: &Pooler = pooler;
        pooler.install(|| forward(model, pooler_ref, dense, s, on))
    }
}

/// What one pass runs on: the batch, its staged rows, the divisor, and the users' tokens held
/// as of an earlier request (empty: none).
struct On<'a> {
    batch: &'a HstuBatch,
    staged: Option<&'a StagedBatch>,
    norm: AttentionNorm,
    as_of: &'a [Option<AsOf>],
}

/// The layers' view of the users: their sequences, and the rows whose attention is divided by
/// an earlier request's length instead (`(first token, end, factor)`).
struct Users<'a> {
    seqs: &'a [Seq],
    earlier: &'a [(usize, usize, f32)],
}

/// The whole pass; see the module's doc for the steps.
fn forward(
    model: &HstuModel,
    pooler: &Pooler,
    dense: &mut DenseCtx,
    s: &mut Scratch,
    on: On<'_>,
) -> Result<(HstuScores, HstuTimes)> {
    let (batch, staged, norm) = (on.batch, on.staged, on.norm);
    let start = Instant::now();
    let mut times = HstuTimes::default();
    let coll = model.embeddings();
    let tokens = batch.tokens();
    s.emb.clear();
    s.emb.resize(tokens * coll.total_dim(), 0.0);
    let view = batch.lookups.view();
    match staged {
        Some(st) => pooler.run_staged(coll, view, st, &mut s.emb)?,
        None => pooler.run(coll, view, &mut s.emb)?,
    };
    times.lookups = start.elapsed();
    let t = Instant::now();
    inputs(model, dense, s, batch);
    contextual(model, s, batch);
    encodings(model, s, batch, on.as_of);
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
    let users = Users {
        seqs: &seqs,
        earlier: &earlier,
    };
    let layers = model.weights.layers.len();
    for l in 0..layers {
        let queries = match l + 1 == layers {
            true => Queries::Candidates,
            false => Queries::All,
        };
        stu_layer(model, l, dense, s, &users, queries, &mut times);
    }
    let t = Instant::now();
    let scores = head(model, dense, &s.x, &s.emb, batch, &mut s.head);
    times.head = t.elapsed();
    times.wall = start.elapsed();
    Ok((scores, times))
}

/// Step 2 for every token: `x = content(post) + additional(merged) + action(bits)` (the
/// contextual slots' rows are overwritten by [`contextual`]).
fn inputs(model: &HstuModel, dense: &mut DenseCtx, s: &mut Scratch, batch: &HstuBatch) {
    let (roles, w) = (&model.roles, &model.weights);
    let tokens = batch.tokens();
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
        s.input.resize(tokens * width, 0.0);
        plan::action_rows(model, batch, &mut s.input);
        s.tmp.resize(tokens * d, 0.0);
        a.mlp.forward(dense, &s.input, width, tokens, &mut s.tmp);
        s.x.iter_mut().zip(&s.tmp).for_each(|(x, a)| *x += a);
    }
}

/// Step 2 for the contextual slots: `bias[s] + row @ W[s]`, the row zeroed for a user shorter
/// than the feature's minimum (or without the value).
fn contextual(model: &HstuModel, s: &mut Scratch, batch: &HstuBatch) {
    let w = &model.weights;
    let td = model.config.hstu.hstu_embedding_table_dim;
    let total = model.embeddings().total_dim();
    let d = model.config.dim();
    plan::contextual_slots(model, batch, |c| {
        let (t, slot) = (c.token, c.slot);
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
fn encodings(model: &HstuModel, s: &mut Scratch, batch: &HstuBatch, as_of: &[Option<AsOf>]) {
    let w = &model.weights;
    let d = model.config.dim();
    let alpha = (d as f64).sqrt() as f32;
    plan::encoding_rows_as_of(model, batch, as_of, |t, p, b| {
        let x = &mut s.x[t * d..(t + 1) * d];
        let pe = &w.positions[p * d..(p + 1) * d];
        let te = &w.times[b * d..(b + 1) * d];
        for ((x, &pv), &tv) in x.iter_mut().zip(pe).zip(te) {
            *x = *x * alpha + (tv + pv);
        }
    });
}

/// Step 4, layer `l`. In the last layer (`queries` [`Queries::Candidates`]) only the
/// candidates' rows are carried past the projection: the head reads no other row, so their
/// attention, gate and output projection are skipped (every token's keys and values are still
/// computed, the candidates attend to them); the other rows of `x` are left stale.
fn stu_layer(
    model: &HstuModel,
    l: usize,
    dense: &mut DenseCtx,
    s: &mut Scratch,
    users: &Users<'_>,
    queries: Queries,
    times: &mut HstuTimes,
) {
    let seqs = users.seqs;
    let h = &model.config.hstu;
    let layer = &model.weights.layers[l];
    let d = model.config.dim();
    let tokens = s.x.len() / d;
    let shape = Shape {
        heads: h.hstu_num_heads,
        hid: h.hstu_attn_linear_dim,
        qk: h.hstu_attn_qk_dim,
    };
    let (w, n) = (shape.row(), shape.out_row());
    let th = dense.threads();
    // The rows carried on: every token, or the candidates' rows in token order.
    let rows: Vec<usize> = match queries {
        Queries::All => Vec::new(),
        Queries::Candidates => seqs
            .iter()
            .flat_map(|q| q.start + q.history()..q.start + q.len)
            .collect(),
    };
    let all = queries == Queries::All;
    let carried = if all { tokens } else { rows.len() };
    let row_of = |k: usize| if all { k } else { rows[k] };
    let t = Instant::now();
    s.xn.resize(tokens * d, 0.0);
    let x = &s.x;
    for_rows(th, &mut s.xn, d, |i, y| {
        layer.input_norm.row(&x[i * d..(i + 1) * d], y)
    });
    times.pointwise += t.elapsed();
    let t = Instant::now();
    s.uvqk.resize(tokens * w, 0.0);
    dense.linear(&layer.uvqk, &s.xn, d, tokens, &mut s.uvqk);
    times.projections += t.elapsed();
    let t = Instant::now();
    s.attn.resize(tokens * n, 0.0);
    let alpha = (1.0 / (shape.qk as f64).sqrt()) as f32;
    attention::attention_of(shape, &s.uvqk, seqs, alpha, &mut s.attn, th, queries);
    if queries == Queries::All {
        // Rows held as of an earlier request: its length divided them (`out = sum / n`).
        for &(from, to, factor) in users.earlier {
            s.attn[from * n..to * n]
                .iter_mut()
                .for_each(|a| *a *= factor);
        }
    }
    times.attention += t.elapsed();
    let t = Instant::now();
    // Each carried row's gate input: `[silu(u), attn, silu(u) * norm(attn)]`.
    s.y.resize(carried * 3 * n, 0.0);
    let group = h.hstu_group_norm;
    let (attn, uvqk) = (&s.attn, &s.uvqk);
    for_rows(th, &mut s.y, 3 * n, |k, y| {
        let i = row_of(k);
        let (a, u) = (&attn[i * n..(i + 1) * n], &uvqk[i * w..i * w + n]);
        y[..n].iter_mut().zip(u).for_each(|(y, &u)| *y = silu(u));
        y[n..2 * n].copy_from_slice(a);
        let (u, z) = y.split_at_mut(2 * n);
        let u = &u[..n];
        if group {
            let hid = shape.hid;
            for hd in 0..shape.heads {
                let r = hd * hid..(hd + 1) * hid;
                let (mean, rstd) = moments(&a[r.clone()], layer.output_norm.eps);
                let (gw, gb) = (layer.output_norm.weight[hd], layer.output_norm.bias[hd]);
                for ((z, &a), &u) in z[r.clone()].iter_mut().zip(&a[r.clone()]).zip(&u[r]) {
                    *z = u * ((a - mean) * rstd * gw + gb);
                }
            }
        } else {
            layer.output_norm.row(a, z);
            z.iter_mut().zip(u).for_each(|(z, &u)| *z *= u);
        }
    });
    times.pointwise += t.elapsed();
    let t = Instant::now();
    s.tmp.resize(carried * d, 0.0);
    dense.linear(&layer.output, &s.y, 3 * n, carried, &mut s.tmp);
    times.projections += t.elapsed();
    add_rows(th, &mut s.x, &s.tmp, d, (!all).then_some(&rows[..]));
}

/// The residual: `x += out`, every row (`rows` `None`), or row `rows[k]` of `x` by row `k` of
/// `out`.
fn add_rows(th: usize, x: &mut [f32], out: &[f32], d: usize, rows: Option<&[usize]>) {
    match rows {
        None => for_rows(th, x, d, |i, x| {
            x.iter_mut()
                .zip(&out[i * d..(i + 1) * d])
                .for_each(|(x, y)| *x += y)
        }),
        Some(rows) => {
            for (k, &i) in rows.iter().enumerate() {
                x[i * d..(i + 1) * d]
                    .iter_mut()
                    .zip(&out[k * d..(k + 1) * d])
                    .for_each(|(x, y)| *x += y);
            }
        }
    }
}
