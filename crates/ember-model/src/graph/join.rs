//! A join whose parts are computed into it ([`Kind::Joined`](super::plan::Kind), from
//! `Plan::joined_ops`): a `Concat` of values and of `Add` / `Sub` / `Mul` / `Div` results that
//! only it reads, each result written into its slot of the output, never apart (DIN's `[q, k,
//! q * k, q - k]`, `docs/graph-models.md`).

use super::compute::{Binary, PAR_MIN, binary};
use super::layout::concat;
use super::pool;
use super::tensor::{Data, Tensor, axis};

/// One part of a join: input `i` as it is, or `op` of inputs `a` and `b`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Part {
    Copy(usize),
    Op(Binary, usize, usize),
}

/// A [`Kind::Joined`](super::plan::Kind) step: the join of `parts` on `ax`, each op part computed
/// into its slot. Where an op's two operands differ in shape (a broadcast) or a part is not
/// float, the parts are computed apart and joined: the same values either way.
pub(super) fn joined(args: &[Option<&Tensor>], ax: i64, parts: &[Part]) -> Result<Tensor, String> {
    let arg = |i: usize| {
        args.get(i)
            .copied()
            .flatten()
            .ok_or("an input of the join is missing")
    };
    let floats = |i: usize| arg(i).ok().and_then(|t| t.as_f32());
    let direct = parts.iter().all(|p| match *p {
        Part::Copy(i) => floats(i).is_some(),
        Part::Op(_, a, b) => {
            let shape = |i: usize| arg(i).ok().map(|t| &t.shape);
            floats(a).is_some() && floats(b).is_some() && shape(a) == shape(b)
        }
    }) && !parts.is_empty();
    if !direct {
        return apart(args, ax, parts);
    }
    // Each part's shape (an op's: its operands'), checked as Concat checks them.
    let shape_of = |p: &Part| match *p {
        Part::Copy(i) | Part::Op(_, i, _) => arg(i).map(|t| t.shape.clone()),
    };
    let shapes = parts.iter().map(shape_of).collect::<Result<Vec<_>, _>>()?;
    let first = &shapes[0];
    let a = axis(ax, first.len())?;
    if shapes.iter().any(|s| {
        s.len() != first.len()
            || s.iter()
                .zip(first)
                .enumerate()
                .any(|(i, (x, y))| i != a && x != y)
    }) {
        return Err(format!("Concat on axis {ax} of {shapes:?}"));
    }
    let outer: usize = first[..a].iter().product();
    let inner: usize = first[a + 1..].iter().product();
    let widths: Vec<usize> = shapes.iter().map(|s| s[a] * inner).collect();
    let row: usize = widths.iter().sum();
    let mut shape = first.clone();
    shape[a] = shapes.iter().map(|s| s[a]).sum();
    let n = outer * row;
    let mut v = pool::scratch(n); // every value written below: `outer` rows of `row`
    let f = apply;
    let fill = |o: usize, dst: &mut [f32]| {
        let mut at = 0;
        for (p, &w) in parts.iter().zip(&widths) {
            let out = &mut dst[at..at + w];
            let src = |i: usize| &floats(i).expect("checked above")[o * w..(o + 1) * w];
            match *p {
                Part::Copy(i) => out.copy_from_slice(src(i)),
                Part::Op(b, x, y) => out
                    .iter_mut()
                    .zip(src(x).iter().zip(src(y)))
                    .for_each(|(o, (&x, &y))| *o = f(b, x, y)),
            }
            at += w;
        }
    };
    if row == 0 || outer == 0 {
        return Tensor::f32(shape, v);
    }
    if n >= PAR_MIN && rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        let per = ((1 << 13) / row).max(1);
        v.par_chunks_mut(per * row)
            .enumerate()
            .for_each(|(c, dst)| {
                for (k, r) in dst.chunks_mut(row).enumerate() {
                    fill(c * per + k, r);
                }
            });
    } else {
        for (o, r) in v.chunks_mut(row).enumerate() {
            fill(o, r);
        }
    }
    Tensor::f32(shape, v)
}

/// [`joined`] with the ops' results made apart (their buffers back to the pool after) and the
/// inputs as they are: where an op's operands broadcast.
fn apart(args: &[Option<&Tensor>], ax: i64, parts: &[Part]) -> Result<Tensor, String> {
    let arg = |i: usize| {
        args.get(i)
            .copied()
            .flatten()
            .ok_or("an input of the join is missing")
    };
    // The ops' results made apart (their buffers back to the pool after), the inputs as
    // they are.
    let mut made = Vec::with_capacity(parts.len());
    for p in parts {
        made.push(match *p {
            Part::Copy(_) => None,
            Part::Op(b, x, y) => Some(binary(b, arg(x)?, arg(y)?)?),
        });
    }
    let refs = parts
        .iter()
        .zip(&made)
        .map(|(p, m)| match (p, m) {
            (_, Some(t)) => Ok(t),
            (Part::Copy(i) | Part::Op(_, i, _), None) => arg(*i),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out = concat(&refs, ax);
    for t in made.into_iter().flatten() {
        if let Data::F32(v) = t.data {
            pool::give(v);
        }
    }
    out
}

/// Row `o` of the join of `parts` on the last axis, every part `d` wide and every value they
/// read of one shape (`[.., d]`, checked by the caller: `Factored::fits`), written by the
/// function returned: the join's rows one at a time, for a layer that quantizes each as it is
/// written (`factor.rs`). The values [`joined`] gives, row for row.
pub(super) fn filler<'a>(
    args: &[Option<&'a Tensor>],
    parts: &[Part],
    d: usize,
) -> Result<impl Fn(usize, &mut [f32]) + Sync + 'a, String> {
    let floats = |i: usize| {
        args.get(i)
            .copied()
            .flatten()
            .and_then(|t| t.as_f32())
            .ok_or("an input of the join is missing or not float")
    };
    let mut srcs: Vec<(Option<Binary>, &'a [f32], &'a [f32])> = Vec::with_capacity(parts.len());
    for p in parts {
        srcs.push(match *p {
            Part::Copy(i) => (None, floats(i)?, floats(i)?),
            Part::Op(b, x, y) => (Some(b), floats(x)?, floats(y)?),
        });
    }
    Ok(move |o: usize, dst: &mut [f32]| {
        for ((b, x, y), out) in srcs.iter().zip(dst.chunks_exact_mut(d)) {
            let (x, y) = (&x[o * d..(o + 1) * d], &y[o * d..(o + 1) * d]);
            match b {
                None => out.copy_from_slice(x),
                Some(b) => out
                    .iter_mut()
                    .zip(x.iter().zip(y))
                    .for_each(|(o, (&x, &y))| *o = apply(*b, x, y)),
            }
        }
    })
}

/// `b` of two values, as the elementwise op computes it.
#[inline(always)]
fn apply(b: Binary, x: f32, y: f32) -> f32 {
    match b {
        Binary::Add => x + y,
        Binary::Sub => x - y,
        Binary::Mul => x * y,
        Binary::Div => x / y,
        Binary::Pow => x.powf(y),
    }
}
