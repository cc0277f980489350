//! The comparison and boolean ops (a sequence feature's mask: `arange(L) < lengths`, then
//! `Where` or a cast to float), each by its definition in the ONNX operator spec. A boolean is
//! held as an int64 0 or 1, as a bool initializer is read (`onnx.rs`).

use super::pool;
use super::tensor::{Data, Tensor, broadcast, zip_with};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cmp {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    Equal,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Logic {
    And,
    Or,
    Xor,
}

/// `Less`, `Greater`, ..., `Equal`: broadcast, a boolean per pair. Two int64 operands compare
/// as integers, any other pair as f32 (a float against an int constant).
pub(super) fn compare(c: Cmp, x: &Tensor, y: &Tensor) -> Result<Tensor, String> {
    fn test<T: PartialOrd>(c: Cmp) -> impl Fn(T, T) -> i64 {
        move |a, b| {
            i64::from(match c {
                Cmp::Less => a < b,
                Cmp::LessOrEqual => a <= b,
                Cmp::Greater => a > b,
                Cmp::GreaterOrEqual => a >= b,
                Cmp::Equal => a == b,
            })
        }
    }
    let n = broadcast(&x.shape, &y.shape)?.iter().product();
    let out = pool::take_i64(n);
    let (s, v) = match (x.as_i64(), y.as_i64()) {
        (Some(p), Some(q)) => zip_with((&x.shape, p), (&y.shape, q), test(c), out)?,
        _ => {
            let (p, q) = (x.to_f32(), y.to_f32());
            zip_with((&x.shape, &p), (&y.shape, &q), test(c), out)?
        }
    };
    Tensor::i64(s, v)
}

/// `Not`: 1 where the input is 0, else 0.
pub(super) fn not(x: &Tensor) -> Result<Tensor, String> {
    let mut v = pool::take_i64(x.len());
    v.extend(truth(x)?.map(|b| i64::from(!b)));
    Tensor::i64(x.shape.clone(), v)
}

/// `And`, `Or`, `Xor`: broadcast.
pub(super) fn logic(l: Logic, x: &Tensor, y: &Tensor) -> Result<Tensor, String> {
    let (p, q): (Vec<bool>, Vec<bool>) = (truth(x)?.collect(), truth(y)?.collect());
    let f = |a: bool, b: bool| {
        i64::from(match l {
            Logic::And => a && b,
            Logic::Or => a || b,
            Logic::Xor => a != b,
        })
    };
    let (s, v) = zip_with((&x.shape, &p), (&y.shape, &q), f, Vec::new())?;
    Tensor::i64(s, v)
}

/// `Where(cond, x, y)`: `x` where `cond`, else `y`, the three broadcast together; `x` and `y` of
/// one type.
pub(super) fn select(cond: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor, String> {
    let out = broadcast(&broadcast(&cond.shape, &x.shape)?, &y.shape)?;
    if let Some(t) = select_direct(cond, x, y, &out) {
        return t;
    }
    let c = spread(&cond.shape, &truth(cond)?.collect::<Vec<bool>>(), &out)?;
    fn pick<T: Copy + Default>(c: &[bool], p: Vec<T>, q: Vec<T>) -> Vec<T> {
        c.iter()
            .zip(p.into_iter().zip(q))
            .map(|(&c, (a, b))| if c { a } else { b })
            .collect()
    }
    match (&x.data, &y.data) {
        (Data::F32(p), Data::F32(q)) => {
            let (p, q) = (spread(&x.shape, p, &out)?, spread(&y.shape, q, &out)?);
            Tensor::f32(out, pick(&c, p, q))
        }
        (Data::I64(p), Data::I64(q)) => {
            let (p, q) = (spread(&x.shape, p, &out)?, spread(&y.shape, q, &out)?);
            Tensor::i64(out, pick(&c, p, q))
        }
        _ => Err(format!(
            "Where of a {} and a {} (its two branches must be of one type)",
            x.kind(),
            y.kind()
        )),
    }
}

/// [`select`] of floats where each operand is whole (of the output's shape) or one value (a
/// masked fill, `Where(mask, -1e9, x)`): one pass into a kept buffer, no operand copied to the
/// output's shape first. (Those copies, allocated and freed each run, were 11-20% of DIN's int8
/// graph on 2 threads: the allocator's purge of freed memory waits on the other core.)
fn select_direct(
    cond: &Tensor,
    x: &Tensor,
    y: &Tensor,
    out: &[usize],
) -> Option<Result<Tensor, String>> {
    let fits = |t: &Tensor| t.shape == out || t.len() == 1;
    let (Data::F32(p), Data::F32(q)) = (&x.data, &y.data) else {
        return None;
    };
    if !(fits(cond) && fits(x) && fits(y)) {
        return None;
    }
    let n: usize = out.iter().product();
    let at = |len: usize, i: usize| if len == 1 { 0 } else { i };
    let mut v = pool::scratch(n); // every value written below
    for (i, o) in v.iter_mut().enumerate() {
        let c = match &cond.data {
            Data::I64(c) => c[at(c.len(), i)] != 0,
            Data::F32(c) => c[at(c.len(), i)] != 0.0,
        };
        *o = if c {
            p[at(p.len(), i)]
        } else {
            q[at(q.len(), i)]
        };
    }
    Some(Tensor::f32(out.to_vec(), v))
}

/// `v` (of `shape`) broadcast to `out`, a shape it broadcasts to.
fn spread<T: Copy + Default>(shape: &[usize], v: &[T], out: &[usize]) -> Result<Vec<T>, String> {
    let n = out.iter().product();
    let (_, v) = zip_with(
        (shape, v),
        (out, &vec![T::default(); n]),
        |a, _| a,
        Vec::new(),
    )?;
    Ok(v)
}

/// `Cast(to=BOOL)`: 1 where the input is not 0.
pub(super) fn to_bool(x: &Tensor) -> Result<Tensor, String> {
    let mut v = pool::take_i64(x.len());
    v.extend(truth(x)?.map(i64::from));
    Tensor::i64(x.shape.clone(), v)
}

/// `Clip` of an int64 tensor (`lengths.clamp(min=1)`): bounds from the inputs, int64 as well.
pub(super) fn clip_ints(x: &[i64], shape: &[usize], lo: Option<i64>, hi: Option<i64>) -> Tensor {
    let v = x
        .iter()
        .map(|&v| {
            let v = lo.map_or(v, |l| v.max(l));
            hi.map_or(v, |h| v.min(h))
        })
        .collect();
    Tensor {
        shape: shape.to_vec(),
        data: Data::I64(v),
    }
}

fn truth(x: &Tensor) -> Result<Box<dyn Iterator<Item = bool> + '_>, String> {
    Ok(match &x.data {
        Data::I64(v) => Box::new(v.iter().map(|&v| v != 0)),
        Data::F32(v) => Box::new(v.iter().map(|&v| v != 0.0)),
    })
}
