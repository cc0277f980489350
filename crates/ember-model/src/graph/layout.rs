//! The ops that move values rather than compute them (`ops.rs` reads and dispatches them):
//! concatenation, slices and splits, reshapes, transposes, gathers, casts and expansion, each
//! by its definition in the ONNX operator spec, on [`Tensor`]s of f32 or i64.

use super::pool;
use super::tensor::{Data, Tensor, axis, broadcast, ints};

pub(super) fn concat(ts: &[&Tensor], ax: i64) -> Result<Tensor, String> {
    let first = ts.first().ok_or("Concat of nothing")?;
    let a = axis(ax, first.shape.len())?;
    for t in ts {
        if t.shape.len() != first.shape.len()
            || t.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .any(|(i, (x, y))| i != a && x != y)
            || t.kind() != first.kind()
        {
            return Err(format!(
                "Concat on axis {ax} of {:?} and {:?} ({} and {})",
                first.shape,
                t.shape,
                first.kind(),
                t.kind()
            ));
        }
    }
    let outer: usize = first.shape[..a].iter().product();
    let inner: usize = first.shape[a + 1..].iter().product();
    let mut shape = first.shape.clone();
    shape[a] = ts.iter().map(|t| t.shape[a]).sum();
    macro_rules! cat {
        ($get:ident, $make:ident, $alloc:expr) => {{
            let mut v = $alloc(shape.iter().product());
            for o in 0..outer {
                for t in ts {
                    let w = t.shape[a] * inner;
                    v.extend_from_slice(&t.$get().unwrap()[o * w..(o + 1) * w]);
                }
            }
            Tensor::$make(shape, v)
        }};
    }
    let n: usize = shape.iter().product();
    match first.data {
        Data::F32(_) if n >= PAR_MIN && rayon::current_num_threads() > 1 => {
            par_concat(ts, a, outer, inner, n).and_then(|v| Tensor::f32(shape, v))
        }
        Data::F32(_) => cat!(as_f32, f32, pool::take),
        Data::I64(_) => cat!(as_i64, i64, pool::take_i64),
    }
}

/// Concatenations of at least this many values split their outer rows over the caller's pool.
const PAR_MIN: usize = 1 << 15;

/// [`concat`] of f32 tensors (checked there) with the outer rows split over the caller's rayon
/// pool: MMoE's stack of its experts' outputs, `[B, E, D]`, ran on one thread before.
fn par_concat(
    ts: &[&Tensor],
    a: usize,
    outer: usize,
    inner: usize,
    n: usize,
) -> Result<Vec<f32>, String> {
    use rayon::prelude::*;
    let parts: Vec<(&[f32], usize)> = ts
        .iter()
        .map(|t| Ok((super::tensor::floats(t)?, t.shape[a] * inner)))
        .collect::<Result<_, String>>()?;
    let row: usize = parts.iter().map(|p| p.1).sum();
    // Every value is written below: `outer` rows of `row`.
    let mut v = pool::scratch(n);
    if row == 0 || outer == 0 {
        return Ok(v);
    }
    let per = ((1 << 13) / row).max(1);
    v.par_chunks_mut(per * row)
        .enumerate()
        .for_each(|(c, dst)| {
            for (k, out_row) in dst.chunks_mut(row).enumerate() {
                let o = c * per + k;
                let mut at = 0;
                for &(src, w) in &parts {
                    out_row[at..at + w].copy_from_slice(&src[o * w..(o + 1) * w]);
                    at += w;
                }
            }
        });
    Ok(v)
}

/// `len` elements from `start` with `step` along axis `a`.
pub(super) fn narrow(
    t: &Tensor,
    a: usize,
    start: usize,
    len: usize,
    step: usize,
) -> Result<Tensor, String> {
    let outer: usize = t.shape[..a].iter().product();
    let inner: usize = t.shape[a + 1..].iter().product();
    let d = t.shape[a];
    let mut shape = t.shape.clone();
    shape[a] = len;
    // A step of 1 takes one run of `len * inner` values per outer index (a column block of a
    // matrix: one copy a row, not one a value).
    let (run, count) = match step {
        1 => (len * inner, 1),
        _ => (inner, len),
    };
    macro_rules! pick {
        ($v:expr, $make:ident, $alloc:expr) => {{
            let mut out = $alloc(outer * len * inner);
            for o in 0..outer {
                for i in 0..count {
                    let at = (o * d + start + i * step) * inner;
                    out.extend_from_slice(&$v[at..at + run]);
                }
            }
            Tensor::$make(shape, out)
        }};
    }
    match &t.data {
        // A large block of columns (a sequence's `[B, L * D]` of `sparse`): its rows copied on
        // the pool's threads (3.3 ms on one thread for DIN's history at batch 2,048).
        Data::F32(v)
            if count == 1 && outer * run >= PAR_MIN && rayon::current_num_threads() > 1 =>
        {
            use rayon::prelude::*;
            let mut out = pool::scratch(outer * run); // every value copied below
            let per = ((1 << 14) / run.max(1)).max(1);
            out.par_chunks_mut(per * run)
                .enumerate()
                .for_each(|(c, dst)| {
                    for (k, row) in dst.chunks_mut(run).enumerate() {
                        let at = ((c * per + k) * d + start) * inner;
                        row.copy_from_slice(&v[at..at + run]);
                    }
                });
            Tensor::f32(shape, out)
        }
        Data::F32(v) => pick!(v, f32, pool::take),
        Data::I64(v) => pick!(v, i64, pool::take_i64),
    }
}

pub(super) fn slice(
    t: &Tensor,
    starts: &Tensor,
    ends: &Tensor,
    axes: Option<&Tensor>,
    steps: Option<&Tensor>,
) -> Result<Tensor, String> {
    let (s, e) = (ints(starts)?, ints(ends)?);
    let axes: Vec<i64> = match axes {
        Some(a) => ints(a)?.to_vec(),
        None => (0..s.len() as i64).collect(),
    };
    let steps: Vec<i64> = match steps {
        Some(st) => ints(st)?.to_vec(),
        None => vec![1; s.len()],
    };
    if e.len() != s.len() || axes.len() != s.len() || steps.len() != s.len() {
        return Err("Slice's starts, ends, axes and steps differ in length".into());
    }
    // Each axis narrows the last one's result; the input itself is never copied whole.
    let mut out: Option<Tensor> = None;
    for i in 0..s.len() {
        let a = axis(axes[i], t.shape.len())?;
        let src = out.as_ref().unwrap_or(t);
        let d = src.shape[a] as i64;
        if steps[i] <= 0 {
            return Err(format!(
                "Slice step {} is not supported (positive steps are)",
                steps[i]
            ));
        }
        let clampi = |v: i64| (if v < 0 { v + d } else { v }).clamp(0, d);
        let (lo, hi) = (clampi(s[i]), clampi(e[i]));
        let len = if hi > lo {
            (hi - lo + steps[i] - 1) / steps[i]
        } else {
            0
        };
        let next = narrow(src, a, lo as usize, len as usize, steps[i] as usize)?;
        if let Some(Tensor {
            data: Data::F32(v), ..
        }) = out.replace(next)
        {
            pool::give(v);
        }
    }
    Ok(out.unwrap_or_else(|| t.clone()))
}

/// The shape Reshape gives a tensor of shape `from` (`0` copies a dim unless `allowzero`, one
/// `-1` takes what is left).
pub(super) fn reshape_shape(
    from: &[usize],
    want: &[i64],
    allowzero: bool,
) -> Result<Vec<usize>, String> {
    let len: usize = from.iter().product();
    let mut shape = Vec::with_capacity(want.len());
    let mut infer = None;
    for (i, &d) in want.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                shape.push(1);
            }
            0 if !allowzero => {
                shape.push(*from.get(i).ok_or("Reshape copies a dim the input lacks")?)
            }
            d if d >= 0 => shape.push(d as usize),
            _ => return Err(format!("Reshape to {want:?}")),
        }
    }
    if let Some(i) = infer {
        let known: usize = shape.iter().product();
        if known == 0 || !len.is_multiple_of(known) {
            return Err(format!("Reshape of {from:?} to {want:?}"));
        }
        shape[i] = len / known;
    }
    if shape.iter().product::<usize>() != len {
        return Err(format!("Reshape of {from:?} to {want:?}"));
    }
    Ok(shape)
}

pub(super) fn transpose(t: &Tensor, perm: Option<&[i64]>) -> Result<Tensor, String> {
    let r = t.shape.len();
    let perm: Vec<usize> = match perm {
        Some(p) => p.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?,
        None => (0..r).rev().collect(),
    };
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return Err(format!("Transpose perm {perm:?} for rank {r}"));
    }
    let shape: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
    let mut src_strides = vec![1usize; r];
    for i in (0..r.saturating_sub(1)).rev() {
        src_strides[i] = src_strides[i + 1] * t.shape[i + 1];
    }
    let n = t.len();
    let mut idx = vec![0usize; r];
    let mut order = Vec::with_capacity(n);
    for _ in 0..n {
        order.push(
            idx.iter()
                .zip(&perm)
                .map(|(&i, &p)| i * src_strides[p])
                .sum::<usize>(),
        );
        for d in (0..r).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    match &t.data {
        Data::F32(v) => Tensor::f32(shape, order.iter().map(|&i| v[i]).collect()),
        Data::I64(v) => Tensor::i64(shape, order.iter().map(|&i| v[i]).collect()),
    }
}

pub(super) fn gather(t: &Tensor, idx: &Tensor, ax: i64) -> Result<Tensor, String> {
    let a = axis(ax, t.shape.len())?;
    let d = t.shape[a] as i64;
    let ix = ints(idx)?
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + d } else { i };
            if (0..d).contains(&j) {
                Ok(j as usize)
            } else {
                Err(format!("Gather index {i} out of range for {d}"))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outer: usize = t.shape[..a].iter().product();
    let inner: usize = t.shape[a + 1..].iter().product();
    let mut shape: Vec<usize> = t.shape[..a].to_vec();
    shape.extend(&idx.shape);
    shape.extend(&t.shape[a + 1..]);
    macro_rules! take {
        ($v:expr, $make:ident) => {{
            let mut out = Vec::with_capacity(outer * ix.len() * inner);
            for o in 0..outer {
                for &i in &ix {
                    let at = (o * d as usize + i) * inner;
                    out.extend_from_slice(&$v[at..at + inner]);
                }
            }
            Tensor::$make(shape, out)
        }};
    }
    match &t.data {
        Data::F32(v) => take!(v, f32),
        Data::I64(v) => take!(v, i64),
    }
}

/// Split into `outs` parts along `ax`: sizes from the input (opset 13+), the attribute, or
/// equal parts.
pub(super) fn split_into(
    t: &Tensor,
    sizes_in: Option<&Tensor>,
    sizes_attr: &Option<Vec<i64>>,
    ax: i64,
    outs: usize,
) -> Result<Vec<Tensor>, String> {
    let a = axis(ax, t.shape.len())?;
    let sizes = match (sizes_in, sizes_attr) {
        (Some(s), _) => ints(s)?.to_vec(),
        (None, Some(s)) => s.clone(),
        (None, None) => {
            if outs == 0 || !t.shape[a].is_multiple_of(outs) {
                return Err(format!(
                    "{} does not split into {outs} equal parts",
                    t.shape[a]
                ));
            }
            vec![(t.shape[a] / outs) as i64; outs]
        }
    };
    if sizes.len() != outs
        || sizes.iter().any(|&s| s < 0)
        || sizes.iter().sum::<i64>() != t.shape[a] as i64
    {
        return Err(format!(
            "split {sizes:?} does not cut {} into {outs} parts",
            t.shape[a]
        ));
    }
    let mut at = 0;
    sizes
        .iter()
        .map(|&s| {
            let r = narrow(t, a, at, s as usize, 1);
            at += s as usize;
            r
        })
        .collect()
}

/// Shape: dims `start .. end` of `t`'s shape (negative counted from the end, clamped).
pub(super) fn shape_of(t: &Tensor, start: i64, end: Option<i64>) -> Result<Tensor, String> {
    let r = t.shape.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (s, e) = (clampi(start), clampi(end.unwrap_or(r)));
    let v: Vec<i64> = t.shape[s..e.max(s)].iter().map(|&d| d as i64).collect();
    Tensor::i64(vec![v.len()], v)
}

/// Cast to float or int64 (truncating toward zero, as a C cast).
pub(super) fn cast(t: &Tensor, to_float: bool) -> Result<Tensor, String> {
    match (to_float, &t.data) {
        (true, Data::F32(v)) => {
            let mut out = pool::take(v.len());
            out.extend_from_slice(v);
            Tensor::f32(t.shape.clone(), out)
        }
        (true, Data::I64(v)) => {
            let mut out = pool::take(v.len());
            out.extend(v.iter().map(|&x| x as f32));
            Tensor::f32(t.shape.clone(), out)
        }
        (false, Data::I64(v)) => {
            let mut out = pool::take_i64(v.len());
            out.extend_from_slice(v);
            Tensor::i64(t.shape.clone(), out)
        }
        (false, Data::F32(v)) => {
            let mut out = pool::take_i64(v.len());
            out.extend(v.iter().map(|&x| x as i64));
            Tensor::i64(t.shape.clone(), out)
        }
    }
}

/// `v` (of `shape`) broadcast to `out` (a shape it broadcasts to), appended to `dst`: the
/// trailing dims the two share are one block, copied whole for each index of the dims before
/// them (an index of a broadcast dim reads the input's one row).
pub(super) fn broadcast_into<T: Copy>(shape: &[usize], v: &[T], out: &[usize], dst: &mut Vec<T>) {
    let r = out.len();
    let pad: Vec<usize> = std::iter::repeat_n(1, r - shape.len())
        .chain(shape.iter().copied())
        .collect();
    let mut k = r;
    while k > 0 && pad[k - 1] == out[k - 1] {
        k -= 1;
    }
    let block: usize = out[k..].iter().product();
    let mut strides = vec![0; r];
    let mut acc = 1;
    for d in (0..r).rev() {
        strides[d] = if pad[d] == 1 { 0 } else { acc };
        acc *= pad[d];
    }
    if out.contains(&0) {
        return;
    }
    // The dims before the block, an odometer over them.
    let mut idx = vec![0usize; k];
    loop {
        let at: usize = (0..k).map(|d| idx[d] * strides[d]).sum();
        dst.extend_from_slice(&v[at..at + block]);
        let mut d = k;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Expand: `t` broadcast to `shape` (numpy's rules: the result may be larger than `shape`).
pub(super) fn expand(t: &Tensor, shape: &Tensor) -> Result<Tensor, String> {
    let want = ints(shape)?
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("Expand to dim {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    let out = broadcast(&t.shape, &want)?;
    let n = out.iter().product();
    match &t.data {
        Data::F32(v) => {
            let mut dst = pool::take(n);
            broadcast_into(&t.shape, v, &out, &mut dst);
            Tensor::f32(out, dst)
        }
        Data::I64(v) => {
            let mut dst = Vec::with_capacity(n);
            broadcast_into(&t.shape, v, &out, &mut dst);
            Tensor::i64(out, dst)
        }
    }
}
