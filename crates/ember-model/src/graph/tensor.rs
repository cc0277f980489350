//! A graph's values: row-major tensors of f32 (what the model computes) or i64 (shapes, axes,
//! indices), with the shape arithmetic of ONNX's ops (broadcasting, axes counted from the end).

/// A row-major tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Tensor {
    pub fn f32(shape: Vec<usize>, v: Vec<f32>) -> Result<Tensor, String> {
        check_len(&shape, v.len())?;
        Ok(Tensor {
            shape,
            data: Data::F32(v),
        })
    }

    pub fn i64(shape: Vec<usize>, v: Vec<i64>) -> Result<Tensor, String> {
        check_len(&shape, v.len())?;
        Ok(Tensor {
            shape,
            data: Data::I64(v),
        })
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            Data::I64(_) => None,
        }
    }

    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(v) => Some(v),
            Data::F32(_) => None,
        }
    }

    /// The values as f32 (i64 converted), for ops that mix a float with an int constant.
    pub fn to_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match &self.data {
            Data::F32(v) => std::borrow::Cow::Borrowed(v),
            Data::I64(v) => std::borrow::Cow::Owned(v.iter().map(|&x| x as f32).collect()),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self.data {
            Data::F32(_) => "float",
            Data::I64(_) => "int64",
        }
    }

    /// The same values with another shape of as many elements.
    pub fn reshaped(self, shape: Vec<usize>) -> Result<Tensor, String> {
        check_len(&shape, self.len())?;
        Ok(Tensor {
            shape,
            data: self.data,
        })
    }
}

fn check_len(shape: &[usize], n: usize) -> Result<(), String> {
    let want = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match want {
        Some(w) if w == n => Ok(()),
        _ => Err(format!(
            "{n} values do not fill a tensor of shape {shape:?}"
        )),
    }
}

/// `axis` of a rank-`rank` tensor, negative counted from the end.
pub fn axis(axis: i64, rank: usize) -> Result<usize, String> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// The shape two operands broadcast to (numpy's rules, as ONNX's elementwise ops use them).
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// Row-major strides of `shape` as seen from the broadcast shape `out` (0 where broadcast).
pub fn strides_in(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let mut s = vec![0; out.len()];
    let mut stride = 1;
    for i in (0..shape.len()).rev() {
        let o = i + out.len() - shape.len();
        s[o] = if shape[i] == 1 { 0 } else { stride };
        stride *= shape[i];
    }
    s
}

/// `f(a[i], b[i])` over the broadcast shape of `a` and `b`, into `out` (an empty buffer; its
/// room is reused).
pub fn zip_with<T: Copy, U>(
    a: (&[usize], &[T]),
    b: (&[usize], &[T]),
    f: impl Fn(T, T) -> U,
    mut out: Vec<U>,
) -> Result<(Vec<usize>, Vec<U>), String> {
    let shape = broadcast(a.0, b.0)?;
    let n: usize = shape.iter().product();
    out.clear();
    out.reserve(n);
    if a.0 == b.0 {
        out.extend(a.1.iter().zip(b.1).map(|(&x, &y)| f(x, y)));
    } else if b.1.len() == 1 {
        out.extend(a.1.iter().map(|&x| f(x, b.1[0])));
    } else if a.1.len() == 1 {
        out.extend(b.1.iter().map(|&y| f(a.1[0], y)));
    } else if a.0 == shape.as_slice() && trailing(b.0, &shape) {
        // `b` repeats along `a`'s leading dims (a bias row, a scale per column).
        for row in a.1.chunks_exact(b.1.len()) {
            out.extend(row.iter().zip(b.1).map(|(&x, &y)| f(x, y)));
        }
    } else if b.0 == shape.as_slice() && trailing(a.0, &shape) {
        for row in b.1.chunks_exact(a.1.len()) {
            out.extend(a.1.iter().zip(row).map(|(&x, &y)| f(x, y)));
        }
    } else if n > 0 {
        // Row by row along the last dim (each operand's is contiguous or one value repeated),
        // an odometer over the others moving both operands' offsets.
        let (sa, sb) = (strides_in(a.0, &shape), strides_in(b.0, &shape));
        let r = shape.len();
        let last = shape[r - 1];
        let mut idx = vec![0usize; r - 1];
        let (mut ia, mut ib) = (0usize, 0usize);
        for _ in 0..n / last {
            match (sa[r - 1], sb[r - 1]) {
                (0, 0) => out.extend((0..last).map(|_| f(a.1[ia], b.1[ib]))),
                (0, _) => out.extend(b.1[ib..ib + last].iter().map(|&y| f(a.1[ia], y))),
                (_, 0) => out.extend(a.1[ia..ia + last].iter().map(|&x| f(x, b.1[ib]))),
                _ => out.extend(
                    a.1[ia..ia + last]
                        .iter()
                        .zip(&b.1[ib..ib + last])
                        .map(|(&x, &y)| f(x, y)),
                ),
            }
            next_row(&mut idx, &shape, (&sa, &sb), (&mut ia, &mut ib));
        }
    }
    Ok((shape, out))
}

/// Moves an odometer over the leading dims of `shape` (all but the last; `idx` holds them) one
/// row on, with two operands' offsets `ia` and `ib` at their strides `sa` and `sb`.
pub fn next_row(
    idx: &mut [usize],
    shape: &[usize],
    (sa, sb): (&[usize], &[usize]),
    (ia, ib): (&mut usize, &mut usize),
) {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        *ia += sa[d];
        *ib += sb[d];
        if idx[d] < shape[d] {
            return;
        }
        *ia -= sa[d] * shape[d];
        *ib -= sb[d] * shape[d];
        idx[d] = 0;
    }
}

/// Whether `s` (leading 1s aside) is the last dims of `full`: its values repeat whole along the
/// others.
fn trailing(s: &[usize], full: &[usize]) -> bool {
    let s = &s[s.iter().take_while(|&&d| d == 1).count()..];
    !s.is_empty() && s.iter().product::<usize>() > 0 && full.ends_with(s)
}

pub fn floats(t: &Tensor) -> Result<&[f32], String> {
    t.as_f32()
        .ok_or_else(|| format!("expected a float tensor, got {}", t.kind()))
}

pub fn ints(t: &Tensor) -> Result<&[i64], String> {
    t.as_i64()
        .ok_or_else(|| format!("expected an int64 tensor, got {}", t.kind()))
}

pub fn scalar_f32(t: &Tensor) -> Result<f32, String> {
    match t.to_f32().as_ref() {
        [v] => Ok(*v),
        v => Err(format!("expected one value, got {}", v.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[4, 1, 3], &[5, 1]).unwrap(), vec![4, 5, 3]);
        assert_eq!(broadcast(&[], &[2, 3]).unwrap(), vec![2, 3]);
        assert!(broadcast(&[2, 3], &[4]).is_err());
        // [2, 1, 3] + [2, 1]: out [2, 2, 3]; checked against the index formula.
        let a: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let b = vec![10.0f32, 20.0];
        let (shape, v) =
            zip_with((&[2, 1, 3], &a), (&[2, 1], &b), |x, y| x + y, Vec::new()).unwrap();
        assert_eq!(shape, vec![2, 2, 3]);
        for i in 0..2 {
            for j in 0..2 {
                for k in 0..3 {
                    assert_eq!(v[(i * 2 + j) * 3 + k], a[i * 3 + k] + b[j]);
                }
            }
        }
    }

    #[test]
    fn a_wrong_length_or_axis_is_refused() {
        assert!(Tensor::f32(vec![2, 3], vec![0.0; 5]).is_err());
        assert_eq!(axis(-1, 3).unwrap(), 2);
        assert!(axis(3, 3).is_err());
        assert!(axis(-4, 3).is_err());
    }
}
