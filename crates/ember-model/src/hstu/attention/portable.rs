//! The attention kernel's inner loops (`attention/block.rs`) in portable code, vectorised by the
//! compiler for the caller's target: what runs where neither `zmm.rs` (AVX-512) nor `ymm.rs`
//! (AVX2 / FMA) does.

use super::BQ;

/// `a * b + c`, fused where the caller's target has FMA (`FMA`), else two roundings.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// Scores of 4 keys `k` against the block's [`BQ`] transposed queries `qt` (`qk` rows of
/// [`BQ`]): an outer product per qk dim into 4 x 64 sums.
#[inline(always)]
pub(super) fn scores_4x64<const FMA: bool>(
    k: &[&[f32]; 4],
    qt: &[f32],
    qk: usize,
) -> [[f32; BQ]; 4] {
    let mut acc = [[0f32; BQ]; 4];
    for a in 0..qk {
        let q: &[f32; BQ] = qt[a * BQ..(a + 1) * BQ].try_into().expect("BQ rows");
        for x in 0..4 {
            let kv = k[x][a];
            for r in 0..BQ {
                acc[x][r] = madd::<FMA>(kv, q[r], acc[x][r]);
            }
        }
    }
    acc
}

/// Rows `r0 .. r0 + 4` of the scores `st` (key-major, [`BQ`] rows a key) times the
/// values of `hi` keys, 64 of them at `v[j * stride ..]`: 16 accumulators in registers. (Rows
/// past the block's last read the padding rows' scores, which are finite; the caller drops
/// them.)
#[inline(always)]
pub(super) fn values_4x64<const FMA: bool>(
    st: &[f32],
    r0: usize,
    v: &[f32],
    stride: usize,
    hi: usize,
) -> [[f32; 64]; 4] {
    let mut acc = [[0f32; 64]; 4];
    for j in 0..hi {
        let vj: &[f32; 64] = v[j * stride..j * stride + 64]
            .try_into()
            .expect("64 values");
        let p: &[f32; 4] = st[j * BQ + r0..j * BQ + r0 + 4].try_into().expect("4 rows");
        for x in 0..4 {
            for e in 0..64 {
                acc[x][e] = madd::<FMA>(p[x], vj[e], acc[x][e]);
            }
        }
    }
    acc
}

/// [`values_4x64`] for a last piece of `width < 64` values.
#[inline(always)]
pub(super) fn values_4xn(
    st: &[f32],
    r0: usize,
    n: usize,
    v: &[f32],
    stride: usize,
    hi: usize,
    width: usize,
) -> [[f32; 64]; 4] {
    let mut acc = [[0f32; 64]; 4];
    for j in 0..hi {
        let vj = &v[j * stride..j * stride + width];
        for (x, accx) in acc.iter_mut().enumerate().take(n) {
            let p = st[j * BQ + r0 + x];
            for (a, &ve) in accx.iter_mut().zip(vj) {
                *a += p * ve;
            }
        }
    }
    acc
}

/// `<a, b>`.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += a * x`.
#[inline(always)]
pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += a * x);
}
