//! The arithmetic of `ops.rs`'s ops on [`Tensor`]s, each by its definition in the ONNX
//! operator spec: plain loops (the linear layers, where a dense part's time goes, run on Ember's
//! kernels instead, `plan.rs`).

use rayon::prelude::*;

use super::pool;
use super::tensor::{Tensor, axis, broadcast, floats, next_row, scalar_f32, strides_in, zip_with};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    Relu,
    Sigmoid,
    Tanh,
    Exp,
    Log,
    Neg,
    Sqrt,
    Abs,
    Identity,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
}

pub use super::rows::Reduce;

pub(super) fn unary(u: Unary, t: &Tensor) -> Result<Tensor, String> {
    if u == Unary::Identity {
        return Ok(t.clone());
    }
    let f: fn(f32) -> f32 = match u {
        Unary::Relu => |v| if v > 0.0 { v } else { 0.0 },
        Unary::Sigmoid => |v| 1.0 / (1.0 + (-v).exp()),
        Unary::Tanh => f32::tanh,
        Unary::Exp => f32::exp,
        Unary::Log => f32::ln,
        Unary::Neg => |v| -v,
        Unary::Sqrt => f32::sqrt,
        Unary::Abs => f32::abs,
        Unary::Identity => |v| v,
    };
    let v = floats(t)?;
    if v.len() >= PAR_MIN && rayon::current_num_threads() > 1 {
        let mut out = pool::scratch(v.len()); // every value written below
        out.par_chunks_mut(PAR_CHUNK)
            .zip(v.par_chunks(PAR_CHUNK))
            .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &x)| *o = f(x)));
        return Tensor::f32(t.shape.clone(), out);
    }
    let mut out = pool::take(v.len());
    out.extend(v.iter().map(|&v| f(v)));
    Tensor::f32(t.shape.clone(), out)
}

pub(super) fn binary(b: Binary, x: &Tensor, y: &Tensor) -> Result<Tensor, String> {
    if let (Some(p), Some(q)) = (x.as_i64(), y.as_i64()) {
        let f = |a: i64, c: i64| match b {
            Binary::Add => a.wrapping_add(c),
            Binary::Sub => a.wrapping_sub(c),
            Binary::Mul => a.wrapping_mul(c),
            Binary::Div => a.checked_div(c).unwrap_or(0),
            Binary::Pow => a.checked_pow(c.clamp(0, 63) as u32).unwrap_or(0),
        };
        let (s, v) = zip_with((&x.shape, p), (&y.shape, q), f, Vec::new())?;
        return Tensor::i64(s, v);
    }
    let (p, q) = (x.to_f32(), y.to_f32());
    let f = |a: f32, c: f32| match b {
        Binary::Add => a + c,
        Binary::Sub => a - c,
        Binary::Mul => a * c,
        Binary::Div => a / c,
        Binary::Pow => a.powf(c),
    };
    let n = p.len().max(q.len());
    if let Some(t) = par_binary(x, y, &p, &q, f) {
        return t;
    }
    let (s, v) = zip_with((&x.shape, &p), (&y.shape, &q), f, pool::take(n))?;
    Tensor::f32(s, v)
}

/// Elementwise ops on at least this many values split them over the caller's rayon pool (below
/// it, waking the other threads costs more than the work).
pub(super) const PAR_MIN: usize = 1 << 15;
/// Values per task of a split elementwise op.
pub(super) const PAR_CHUNK: usize = 1 << 13;

/// [`binary`] over the caller's rayon pool: both operands of the output's shape or one a row
/// repeated along the other's leading dims in chunks of values, any other broadcast row by row
/// ([`par_rows`]); `None` when small or on one thread.
fn par_binary(
    x: &Tensor,
    y: &Tensor,
    p: &[f32],
    q: &[f32],
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Option<Result<Tensor, String>> {
    let n = p.len().max(q.len());
    if n < PAR_MIN || rayon::current_num_threads() == 1 {
        return None;
    }
    let shape = broadcast(&x.shape, &y.shape).ok()?;
    let ys = &y.shape[y.shape.iter().take_while(|&&d| d == 1).count()..];
    // The second operand's values: each chunk of `w` output values reads `q` from the start
    // (a row repeated; `w` a multiple of its length) or its own chunk of `q` (same shape).
    let (w, repeat) = if x.shape == y.shape {
        (PAR_CHUNK, false)
    } else if x.shape == shape && !q.is_empty() && !ys.is_empty() && shape.ends_with(ys) {
        (q.len() * (PAR_CHUNK / q.len()).max(1), true)
    } else {
        let mut out = pool::scratch(n); // par_rows writes every value
        par_rows(&shape, (&x.shape, p), (&y.shape, q), f, &mut out);
        return Some(Tensor::f32(shape, out));
    };
    let mut out = pool::scratch(n); // every chunk written below
    out.par_chunks_mut(w)
        .zip(p.par_chunks(w))
        .enumerate()
        .for_each(|(c, (o, a))| {
            let zip = |o: &mut [f32], a: &[f32], b: &[f32]| {
                o.iter_mut()
                    .zip(a.iter().zip(b))
                    .for_each(|(o, (&a, &b))| *o = f(a, b))
            };
            if repeat {
                for (o, a) in o.chunks_mut(q.len()).zip(a.chunks(q.len())) {
                    zip(o, a, q);
                }
            } else {
                zip(o, a, &q[c * w..]);
            }
        });
    Some(Tensor::f32(shape, out))
}

/// `f(a, b)` broadcast to `shape` into `out`, row by row along the last dim as `zip_with`'s
/// general case reads them (each operand's row contiguous or one value repeated), the rows
/// split over the caller's rayon pool: a gate `[B, E, 1]` times experts `[B, E, D]` ran on one
/// thread before (`docs/graph-models.md`). Every value is `f` of the same two values as there.
fn par_rows(
    shape: &[usize],
    (xs, p): (&[usize], &[f32]),
    (ys, q): (&[usize], &[f32]),
    f: impl Fn(f32, f32) -> f32 + Sync,
    out: &mut [f32],
) {
    let r = shape.len();
    let last = shape.last().copied().unwrap_or(1);
    if r == 0 || last == 0 {
        return;
    }
    let (sa, sb) = (strides_in(xs, shape), strides_in(ys, shape));
    let rows_per = (PAR_CHUNK / last).max(1);
    out.par_chunks_mut(rows_per * last)
        .enumerate()
        .for_each(|(c, o)| {
            // The first row's index and offsets, then an odometer over the leading dims.
            let mut idx = vec![0usize; r - 1];
            let (mut ia, mut ib, mut rest) = (0usize, 0usize, c * rows_per);
            for d in (0..r - 1).rev() {
                idx[d] = rest % shape[d];
                rest /= shape[d];
                ia += idx[d] * sa[d];
                ib += idx[d] * sb[d];
            }
            for row in o.chunks_mut(last) {
                match (sa[r - 1], sb[r - 1]) {
                    (0, 0) => row.fill(f(p[ia], q[ib])),
                    (0, _) => zip_row(row, &q[ib..ib + last], |y| f(p[ia], y)),
                    (_, 0) => zip_row(row, &p[ia..ia + last], |x| f(x, q[ib])),
                    _ => row
                        .iter_mut()
                        .zip(p[ia..ia + last].iter().zip(&q[ib..ib + last]))
                        .for_each(|(o, (&x, &y))| *o = f(x, y)),
                }
                next_row(&mut idx, shape, (&sa, &sb), (&mut ia, &mut ib));
            }
        });
}

fn zip_row(row: &mut [f32], src: &[f32], f: impl Fn(f32) -> f32) {
    row.iter_mut().zip(src).for_each(|(o, &v)| *o = f(v));
}

/// `alpha * op(A) op(B) + beta * C`, A and B 2-D.
pub(super) fn gemm(
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    alpha: f32,
    beta: f32,
    ta: bool,
    tb: bool,
) -> Result<Tensor, String> {
    let (av, bv) = (floats(a)?, floats(b)?);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err(format!(
            "Gemm of shapes {:?} and {:?} (both must be 2-D)",
            a.shape, b.shape
        ));
    }
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if tb {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(format!(
            "Gemm of shapes {:?} and {:?} (transA {ta}, transB {tb}): inner dims differ",
            a.shape, b.shape
        ));
    }
    let at = |i: usize, p: usize| if ta { av[p * m + i] } else { av[i * k + p] };
    let bt = |p: usize, j: usize| if tb { bv[j * k + p] } else { bv[p * n + j] };
    let mut y = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f32;
            for p in 0..k {
                s += at(i, p) * bt(p, j);
            }
            y[i * n + j] = alpha * s;
        }
    }
    if let Some(c) = c {
        let (_, cv) = zip_with(
            (&[m, n], &y),
            (&c.shape, &c.to_f32()),
            |yy, cc| yy + beta * cc,
            Vec::new(),
        )?;
        y = cv;
    }
    Tensor::f32(vec![m, n], y)
}

/// numpy's matmul for operands of rank 2 or more (batch dims broadcast).
pub(super) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let (av, bv) = (floats(a)?, floats(b)?);
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb < 2 {
        return Err(format!(
            "MatMul of shapes {:?} and {:?}: operands of rank 1 are not supported",
            a.shape, b.shape
        ));
    }
    let (m, k, k2, n) = (
        a.shape[ra - 2],
        a.shape[ra - 1],
        b.shape[rb - 2],
        b.shape[rb - 1],
    );
    if k != k2 {
        return Err(format!(
            "MatMul of shapes {:?} and {:?}: inner dims differ",
            a.shape, b.shape
        ));
    }
    let batch = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2])?;
    let nb: usize = batch.iter().product();
    // Each operand's matrix index per output batch index (broadcast over its own batch dims).
    let idx = |shape: &[usize]| -> Vec<usize> {
        let z: Vec<usize> = (0..shape.iter().product::<usize>()).collect();
        let zero = vec![0usize; nb];
        zip_with((shape, &z), (&batch, &zero), |i, _| i, Vec::new())
            .map(|(_, v)| v)
            .unwrap_or_default()
    };
    let (ia, ib) = (idx(&a.shape[..ra - 2]), idx(&b.shape[..rb - 2]));
    let mut y = vec![0.0f32; nb * m * n];
    for t in 0..nb {
        let (pa, pb) = (&av[ia[t] * m * k..][..m * k], &bv[ib[t] * k * n..][..k * n]);
        let out = &mut y[t * m * n..][..m * n];
        for i in 0..m {
            for p in 0..k {
                let x = pa[i * k + p];
                for j in 0..n {
                    out[i * n + j] += x * pb[p * n + j];
                }
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    Tensor::f32(shape, y)
}

pub(super) fn reduce(
    kind: Reduce,
    t: &Tensor,
    axes: Option<&[i64]>,
    keepdims: bool,
) -> Result<Tensor, String> {
    let v = floats(t)?;
    let r = t.shape.len();
    let on: Vec<bool> = match axes {
        Some(a) if !a.is_empty() => {
            let mut on = vec![false; r];
            for &x in a {
                on[axis(x, r)?] = true;
            }
            on
        }
        _ => vec![true; r],
    };
    let out_full: Vec<usize> = (0..r).map(|i| if on[i] { 1 } else { t.shape[i] }).collect();
    let n_out: usize = out_full.iter().product();
    let count = (t.len() / n_out.max(1)).max(1) as f32;
    let init = if kind == Reduce::Max {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    let mut acc = pool::take(n_out);
    acc.resize(n_out, init);
    let step = |a: &mut f32, x: f32| match kind {
        Reduce::Sum | Reduce::Mean => *a += x,
        Reduce::Max => *a = a.max(x),
        Reduce::L2 => *a += x * x,
    };
    let one_axis = (0..r)
        .filter(|&i| on[i] && t.shape[i] != 1)
        .collect::<Vec<_>>();
    if let [a] = one_axis[..]
        && a + 1 == r
    {
        super::rows::reduce_last(kind, v, t.shape[a], &mut acc);
        return finish_reduce(kind, acc, count, t, &on, out_full, keepdims);
    }
    if let [a] = one_axis[..] {
        // One axis: for each outer index, its rows summed into the output's row in order (the
        // same order as the general loop below, so the same sums).
        let (d, inner) = (t.shape[a], t.shape[a + 1..].iter().product::<usize>());
        let inner = inner.max(1);
        let rows = |o0: usize, part: &mut [f32]| {
            for (k, dst) in part.chunks_mut(inner).enumerate() {
                let o = o0 + k;
                for j in 0..d {
                    let src = &v[(o * d + j) * inner..][..inner];
                    dst.iter_mut().zip(src).for_each(|(a, &x)| step(a, x));
                }
            }
        };
        let acc_len = (n_out / inner) * inner;
        if v.len() >= PAR_MIN && rayon::current_num_threads() > 1 {
            // Outer indices split over the caller's pool: each output value still sums its
            // rows in order.
            let per = (PAR_CHUNK / (inner * d).max(1)).max(1);
            acc[..acc_len]
                .par_chunks_mut(per * inner)
                .enumerate()
                .for_each(|(c, part)| rows(c * per, part));
        } else {
            rows(0, &mut acc[..acc_len]);
        }
        return finish_reduce(kind, acc, count, t, &on, out_full, keepdims);
    }
    let strides = strides_in(&out_full, &t.shape);
    let mut idx = vec![0usize; r];
    let mut o = 0usize;
    for &x in v {
        step(&mut acc[o], x);
        for d in (0..r).rev() {
            idx[d] += 1;
            o += strides[d];
            if idx[d] < t.shape[d] {
                break;
            }
            o -= strides[d] * t.shape[d];
            idx[d] = 0;
        }
    }
    finish_reduce(kind, acc, count, t, &on, out_full, keepdims)
}

/// `ReduceSum(a * b, axes)` without the product written, where one operand is a gate `[B, E, 1]`
/// and the other experts `[B, E, D]` and `axes` is the experts' axis: `out[b, :] = sum over e
/// of gate[b, e] * experts[b, e, :]`, each product rounded and added in order from zero as the
/// two ops do; `None` (the two ops run) for any other shapes. Samples split over the caller's
/// rayon pool.
pub(super) fn gated_sum(
    a: &Tensor,
    b: &Tensor,
    axes: Option<&[i64]>,
    keepdims: bool,
) -> Option<Result<Tensor, String>> {
    if let ([n, d], [n2, d2]) = (a.shape.as_slice(), b.shape.as_slice())
        && (n, d) == (n2, d2)
        && matches!(axes, Some([ax]) if axis(*ax, 2).ok() == Some(1))
    {
        return Some(super::rows::row_dots(a, b, *n, *d, keepdims));
    }
    let (g, x) = match (a.shape.as_slice(), b.shape.as_slice()) {
        ([_, _, 1], [_, _, d]) if *d != 1 => (a, b),
        ([_, _, d], [_, _, 1]) if *d != 1 => (b, a),
        _ => return None,
    };
    let (bn, e, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let on_experts = matches!(axes, Some([ax]) if axis(*ax, 3).ok() == Some(1));
    if g.shape[..2] != [bn, e] || !on_experts || e == 0 || d == 0 {
        return None;
    }
    let (gv, xv) = (g.as_f32()?, x.as_f32()?);
    let mut out = pool::zeros(bn * d);
    let rows = |b0: usize, part: &mut [f32]| {
        for (k, acc) in part.chunks_mut(d).enumerate() {
            let b = b0 + k;
            for j in 0..e {
                let w = gv[b * e + j];
                let src = &xv[(b * e + j) * d..][..d];
                acc.iter_mut().zip(src).for_each(|(a, &v)| *a += w * v);
            }
        }
    };
    if xv.len() >= PAR_MIN && rayon::current_num_threads() > 1 {
        let per = (PAR_CHUNK / (e * d)).max(1);
        out.par_chunks_mut(per * d)
            .enumerate()
            .for_each(|(c, part)| rows(c * per, part));
    } else {
        rows(0, &mut out);
    }
    let shape = match keepdims {
        true => vec![bn, 1, d],
        false => vec![bn, d],
    };
    Some(Tensor::f32(shape, out))
}

/// A reduction's sums made its values (a mean divided, an L2 norm's root taken), shaped.
fn finish_reduce(
    kind: Reduce,
    mut acc: Vec<f32>,
    count: f32,
    t: &Tensor,
    on: &[bool],
    out_full: Vec<usize>,
    keepdims: bool,
) -> Result<Tensor, String> {
    match kind {
        Reduce::Mean => acc.iter_mut().for_each(|a| *a /= count),
        Reduce::L2 => acc.iter_mut().for_each(|a| *a = a.sqrt()),
        _ => {}
    }
    let shape = if keepdims {
        out_full
    } else {
        (0..on.len())
            .filter(|&i| !on[i])
            .map(|i| t.shape[i])
            .collect()
    };
    Tensor::f32(shape, acc)
}

pub(super) fn softmax(t: &Tensor, ax: i64) -> Result<Tensor, String> {
    let a = axis(ax, t.shape.len())?;
    let v = floats(t)?;
    let (d, inner) = (t.shape[a], t.shape[a + 1..].iter().product::<usize>());
    let outer: usize = t.shape[..a].iter().product();
    let mut out = pool::take(v.len());
    out.extend_from_slice(v);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * d + j) * inner + i;
            let m = (0..d).map(|j| v[at(j)]).fold(f32::NEG_INFINITY, f32::max);
            let mut s = 0.0f32;
            for j in 0..d {
                out[at(j)] = (v[at(j)] - m).exp();
                s += out[at(j)];
            }
            for j in 0..d {
                out[at(j)] /= s;
            }
        }
    }
    Tensor::f32(t.shape.clone(), out)
}

/// Clip: bounds from the inputs (opset 11+) or the attributes (older).
pub(super) fn clip(
    x: &[Option<&Tensor>],
    min: Option<f32>,
    max: Option<f32>,
) -> Result<Tensor, String> {
    let bound = |i: usize, d: Option<f32>| -> Result<Option<f32>, String> {
        match x.get(i).copied().flatten() {
            Some(t) => scalar_f32(t).map(Some),
            None => Ok(d),
        }
    };
    let t = x.first().copied().flatten().ok_or("input 0 is missing")?;
    if let Some(v) = t.as_i64() {
        let bound = |i: usize, d: Option<f32>| -> Result<Option<i64>, String> {
            match x.get(i).copied().flatten() {
                Some(b) => match super::tensor::ints(b)? {
                    [b] => Ok(Some(*b)),
                    b => Err(format!("expected one value, got {}", b.len())),
                },
                None => Ok(d.map(|d| d as i64)),
            }
        };
        let (lo, hi) = (bound(1, min)?, bound(2, max)?);
        return Ok(super::logic::clip_ints(v, &t.shape, lo, hi));
    }
    let (lo, hi) = (bound(1, min)?, bound(2, max)?);
    let v = floats(t)?;
    let mut out = pool::take(v.len());
    out.extend(v.iter().map(|&v| {
        let v = lo.map_or(v, |l| if v < l { l } else { v });
        hi.map_or(v, |h| if v > h { h } else { v })
    }));
    Tensor::f32(t.shape.clone(), out)
}
