//! Step 4 of the forward pass, the STU layers, over every token of a batch or over the tokens a
//! cache of users' histories does not hold ([`Rows`]): those read their keys and values from
//! the cache's segments ([`Held`]) and compute nothing else.
//!
//! Buffers per layer: `x` and its norm hold the computed rows only (compact); the projections
//! (`uvqk`) and attention's output are over the whole token axis, their held tokens' rows left
//! unwritten: the attention kernel reads those tokens' keys and values in the cache's segments,
//! in place (copying them into `uvqk` at each layer cost 3-4 ms a layer for a user of 4,096).

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::HstuModel;
use super::attention::{self, HeldKv, Queries, Seq, Shape};
use super::entry::Segment;
use super::layers::{DenseCtx, for_rows, moments, silu};
use super::request::HstuBatch;
use super::times::HstuTimes;

/// Which of a batch's tokens a pass computes, and where their rows are in its compact buffers.
#[derive(Debug)]
pub(crate) struct Rows {
    all: bool,
    /// Compact row `k` is token `tokens[k]` (unless `all`).
    tokens: Vec<usize>,
    /// Token `t`'s compact row, `u32::MAX` where it is not computed (unless `all`).
    at: Vec<u32>,
    /// Per user: its first computed token, counted from its start.
    pub firsts: Vec<usize>,
}

impl Rows {
    /// Every token.
    pub fn all(batch: &HstuBatch) -> Rows {
        Rows {
            all: true,
            tokens: Vec::new(),
            at: Vec::new(),
            firsts: vec![0; batch.len()],
        }
    }

    /// Each user's tokens from `firsts[u]` on.
    pub fn from(batch: &HstuBatch, firsts: Vec<usize>) -> Rows {
        if firsts.iter().all(|&f| f == 0) {
            return Rows::all(batch);
        }
        let mut at = vec![u32::MAX; batch.tokens()];
        let mut tokens = Vec::new();
        for (u, &f) in batch.users().iter().zip(&firsts) {
            let (from, to) = (u.start + f, u.start + batch.len_of(u));
            for (t, a) in at[from..to].iter_mut().enumerate() {
                *a = tokens.len() as u32;
                tokens.push(from + t);
            }
        }
        Rows {
            all: false,
            tokens,
            at,
            firsts,
        }
    }

    pub fn is_all(&self) -> bool {
        self.all
    }

    /// Rows computed.
    pub fn len(&self, batch: &HstuBatch) -> usize {
        match self.all {
            true => batch.tokens(),
            false => self.tokens.len(),
        }
    }

    /// The computed tokens (unless every token is).
    pub fn tokens(&self) -> &[usize] {
        &self.tokens
    }

    /// Token `t`'s compact row, if it is computed.
    pub fn row(&self, t: usize) -> Option<usize> {
        match self.all {
            true => Some(t),
            false => match self.at[t] {
                u32::MAX => None,
                k => Some(k as usize),
            },
        }
    }

    /// The token of compact row `k`.
    pub fn token(&self, k: usize) -> usize {
        match self.all {
            true => k,
            false => self.tokens[k],
        }
    }
}

/// Keys and values a pass reads from a cache and keeps for one.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Per user: the segments that hold its first tokens, in order (empty: none).
    pub read: Vec<Vec<Arc<Segment>>>,
    /// Per user: its tokens (counted from its start) whose keys and values to keep.
    pub keep: Vec<Range<usize>>,
    /// Per user: the kept values, `[layers][kept tokens][v | k]`.
    pub kept: Vec<Vec<f32>>,
}

impl Held {
    /// Nothing read or kept.
    pub fn none() -> Held {
        Held::default()
    }
}

/// The layers' view of the users: their sequences, the rows whose attention is divided by an
/// earlier request's length instead (`(first token, end, factor)`), the rows computed.
pub(crate) struct Users<'a> {
    pub seqs: &'a [Seq],
    pub earlier: &'a [(usize, usize, f32)],
    pub rows: &'a Rows,
}

/// Buffers of the layers, reused across batches.
#[derive(Debug, Default)]
pub(crate) struct LayerScratch {
    pub xn: Vec<f32>,
    pub part: Vec<f32>,
    pub uvqk: Vec<f32>,
    pub attn: Vec<f32>,
    pub y: Vec<f32>,
    pub tmp: Vec<f32>,
}

/// The shape of the layers' projections.
pub(crate) fn shape_of(model: &HstuModel) -> Shape {
    let h = &model.config.hstu;
    Shape {
        heads: h.hstu_num_heads,
        hid: h.hstu_attn_linear_dim,
        qk: h.hstu_attn_qk_dim,
    }
}

impl HstuModel {
    /// The values a cache keeps per token: every layer's values and keys
    /// (`[layers][v | k]`).
    pub fn kv_per_token(&self) -> usize {
        self.weights.layers.len() * shape_of(self).kv_row()
    }
}

/// One pass's layers: what they read besides `x`, and where they count their time.
pub(crate) struct Layers<'a> {
    pub model: &'a HstuModel,
    pub dense: &'a mut DenseCtx,
    pub s: &'a mut LayerScratch,
    pub users: Users<'a>,
    pub held: &'a mut Held,
    pub times: &'a mut HstuTimes,
}

impl Layers<'_> {
    /// Every layer on `x` (the computed rows).
    pub fn run(&mut self, x: &mut [f32]) {
        let layers = self.model.weights.layers.len();
        for l in 0..layers {
            self.layer(l, l + 1 == layers, x);
        }
    }

    /// Layer `l`. In the last layer (`last`) only the candidates' rows are carried past the
    /// projection: the head reads no other row, so their attention, gate and output projection
    /// are skipped (the other rows of `x` are left stale).
    fn layer(&mut self, l: usize, last: bool, x: &mut [f32]) {
        let Layers {
            model,
            dense,
            s,
            users,
            held,
            times,
        } = self;
        let (seqs, rows) = (users.seqs, users.rows);
        let layer = &model.weights.layers[l];
        let d = model.config.dim();
        let m = x.len() / d;
        let tokens = seqs.last().map_or(0, |q| q.start + q.len);
        let shape = shape_of(model);
        let (w, n) = (shape.row(), shape.out_row());
        let th = dense.threads();
        // The rows carried on, as (compact row, token): every computed row, or the candidates'.
        let carried: Vec<(usize, usize)> = match last {
            false => (0..m).map(|k| (k, rows.token(k))).collect(),
            true => seqs
                .iter()
                .flat_map(|q| q.start + q.history()..q.start + q.len)
                .map(|t| (rows.row(t).expect("a candidate is computed"), t))
                .collect(),
        };
        let t = Instant::now();
        s.xn.resize(m * d, 0.0);
        for_rows(th, &mut s.xn, d, |i, y| {
            layer.input_norm.row(&x[i * d..(i + 1) * d], y)
        });
        times.pointwise += t.elapsed();
        let t = Instant::now();
        s.uvqk.resize(tokens * w, 0.0);
        if rows.is_all() {
            dense.linear(&layer.uvqk, &s.xn, d, m, &mut s.uvqk);
        } else {
            s.part.resize(m * w, 0.0);
            dense.linear(&layer.uvqk, &s.xn, d, m, &mut s.part);
            for (k, p) in s.part.chunks_exact(w).enumerate() {
                let t = rows.token(k);
                s.uvqk[t * w..(t + 1) * w].copy_from_slice(p);
            }
        }
        times.projections += t.elapsed();
        let t = Instant::now();
        keep(model, l, &s.uvqk, seqs, held);
        let kvw = shape.kv_row();
        let runs: Vec<Vec<HeldKv<'_>>> = (held.read.iter())
            .map(|segs| {
                (segs.iter())
                    .map(|seg| HeldKv {
                        kv: &seg.kv[l * seg.tokens * kvw..(l + 1) * seg.tokens * kvw],
                        tokens: seg.tokens,
                    })
                    .collect()
            })
            .collect();
        s.attn.resize(tokens * n, 0.0);
        let alpha = (1.0 / (shape.qk as f64).sqrt()) as f32;
        let queries = match (last, rows.is_all()) {
            (true, _) => Queries::Candidates,
            (false, true) => Queries::All,
            (false, false) => Queries::From(&rows.firsts),
        };
        attention::attention_of(shape, &s.uvqk, seqs, &runs, alpha, &mut s.attn, th, queries);
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
        gate_inputs(model, l, th, s, &carried);
        times.pointwise += t.elapsed();
        let t = Instant::now();
        s.tmp.resize(carried.len() * d, 0.0);
        dense.linear(&layer.output, &s.y, 3 * n, carried.len(), &mut s.tmp);
        times.projections += t.elapsed();
        let every = !last && carried.len() == m;
        let at: Vec<usize> = match every {
            true => Vec::new(),
            false => carried.iter().map(|c| c.0).collect(),
        };
        add_rows(th, x, &s.tmp, d, (!every).then_some(&at[..]));
    }
}

/// Each carried row's gate input into `s.y`: `[silu(u), attn, silu(u) * norm(attn)]` (the
/// norm over all heads, or per head with `hstu_group_norm`).
fn gate_inputs(
    model: &HstuModel,
    l: usize,
    th: usize,
    s: &mut LayerScratch,
    carried: &[(usize, usize)],
) {
    let layer = &model.weights.layers[l];
    let shape = shape_of(model);
    let (w, n) = (shape.row(), shape.out_row());
    s.y.resize(carried.len() * 3 * n, 0.0);
    let group = model.config.hstu.hstu_group_norm;
    let (attn, uvqk) = (&s.attn, &s.uvqk);
    for_rows(th, &mut s.y, 3 * n, |k, y| {
        let i = carried[k].1;
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
}

/// Layer `l`'s keys and values of the tokens `held` keeps, out of `uvqk`. (The tokens it
/// reads are read in place by the attention.)
fn keep(model: &HstuModel, l: usize, uvqk: &[f32], seqs: &[Seq], held: &mut Held) {
    let shape = shape_of(model);
    let (w, kvw) = (shape.row(), shape.kv_row());
    let (v0, k0) = (shape.v_col(0), shape.k_col(0));
    let (nv, nk) = (shape.heads * shape.hid, shape.heads * shape.qk);
    for (u, keep) in held.keep.iter().enumerate() {
        if keep.is_empty() {
            continue;
        }
        let kept = &mut held.kept[u];
        let base = l * keep.len() * kvw;
        for (j, t) in keep.clone().enumerate() {
            let row = &uvqk[(seqs[u].start + t) * w..(seqs[u].start + t + 1) * w];
            let out = &mut kept[base + j * kvw..base + (j + 1) * kvw];
            out[..nv].copy_from_slice(&row[v0..v0 + nv]);
            out[nv..].copy_from_slice(&row[k0..k0 + nk]);
        }
    }
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
