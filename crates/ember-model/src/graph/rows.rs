//! Reductions along a tensor's rows (its last axis), a row at a time in vector lanes: a
//! `ReduceSum` / `Mean` / `Max` / `L2` over the last axis, and `(a * b).sum(-1)` of two `[n, d]`
//! tensors without the product. Each row is reduced in [`LANES`] running values joined in order,
//! then its tail in order: the same values on any number of threads, in another order of
//! additions than one value at a time (ONNX leaves it open; PyTorch's sums are vectorized too).
//! One value at a time, DeepFM's sums over its 1,728 columns took 14 ms of a 26 ms batch (2,048,
//! 2 threads, int8; `docs/graph-models.md`).

use rayon::prelude::*;

use super::pool;
use super::tensor::{Tensor, floats};

/// A reduction's kind (ONNX's `ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceL2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    L2,
}

/// Row reductions over at least this many values split their rows over the caller's pool, in
/// tasks of about `PAR_CHUNK` values (the elementwise ops' sizes, `compute.rs`).
const PAR_MIN: usize = 1 << 15;
const PAR_CHUNK: usize = 1 << 13;

/// `kind` of each row of `v` (rows of `d` values) into `acc` (one value a row), before the
/// reduction is finished (a mean divided, a norm's root taken); the rows split over the caller's
/// pool.
pub(super) fn reduce_last(kind: Reduce, v: &[f32], d: usize, acc: &mut [f32]) {
    let rows = |o0: usize, part: &mut [f32]| {
        for (k, dst) in part.iter_mut().enumerate() {
            *dst = reduce_row(kind, &v[(o0 + k) * d..][..d]);
        }
    };
    if v.len() >= PAR_MIN && rayon::current_num_threads() > 1 {
        let per = (PAR_CHUNK / d.max(1)).max(1);
        acc.par_chunks_mut(per)
            .enumerate()
            .for_each(|(c, part)| rows(c * per, part));
    } else {
        rows(0, acc);
    }
}

/// Values a row reduction keeps running at once: a 512-bit vector of f32.
const LANES: usize = 16;

/// `kind` over `row`'s values (before [`finish_reduce`]): `LANES` running values, value `i`
/// into lane `i % LANES`, joined lane by lane in order, then the tail in order.
pub(super) fn reduce_row(kind: Reduce, row: &[f32]) -> f32 {
    let step = |a: f32, x: f32| match kind {
        Reduce::Sum | Reduce::Mean => a + x,
        Reduce::Max => a.max(x),
        Reduce::L2 => a + x * x,
    };
    let init = if kind == Reduce::Max {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    let mut lanes = [init; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l = step(*l, x);
        }
    }
    let join = |a: f32, b: f32| if kind == Reduce::Max { a.max(b) } else { a + b };
    let a = lanes.into_iter().fold(init, join);
    tail.iter().fold(a, |a, &x| step(a, x))
}

/// `Σ a[i] * b[i]` in `LANES` running sums, joined in order, then the tail in order.
pub(super) fn dot_row(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    let s = lanes.into_iter().fold(0.0, |s, l| s + l);
    ta.iter().zip(tb).fold(s, |s, (&x, &y)| s + x * y)
}

/// `(a * b).sum(1)` of two `[n, d]` tensors without the product: a dot product a row
/// (DeepFM's sum of squares, a two-tower model's score), the rows split over the caller's pool.
pub(super) fn row_dots(
    a: &Tensor,
    b: &Tensor,
    n: usize,
    d: usize,
    keepdims: bool,
) -> Result<Tensor, String> {
    let (av, bv) = (floats(a)?, floats(b)?);
    let mut out = pool::scratch(n); // every value written below
    let rows = |o0: usize, part: &mut [f32]| {
        for (k, dst) in part.iter_mut().enumerate() {
            let o = o0 + k;
            *dst = dot_row(&av[o * d..][..d], &bv[o * d..][..d]);
        }
    };
    if av.len() >= PAR_MIN && rayon::current_num_threads() > 1 {
        let per = (PAR_CHUNK / d.max(1)).max(1);
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(c, part)| rows(c * per, part));
    } else {
        rows(0, &mut out);
    }
    let shape = if keepdims { vec![n, 1] } else { vec![n] };
    Tensor::f32(shape, out)
}
