//! The definitions the kernels are checked against: plain loops, sums in f64.

use super::pack::{quant_scale, quantize};
use super::{from_bf16, to_bf16};

/// The per-row int8 quantization of activations: `s = max |x| / 127` (1 for a zero row), `q =
/// round(x * (127 / max))` ties to even, clamped to +-127. The kernels' quantizers compute
/// exactly this (the same multiply and rounding), so reference and kernels see the same codes.
pub fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    let s = quant_scale(x);
    let inv = 1.0 / s;
    for (d, &v) in q.iter_mut().zip(x) {
        *d = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    s
}

/// `y[b, o] = sum_i bf16(x[b, i]) bf16(w[o, i])` in f64, then `+ bias[o]` and the ReLU, for
/// `x` `[batch, k]`, `w` `[n, k]`.
pub fn linear_bf16(
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    (batch, n, k): (usize, usize, usize),
    relu: bool,
) -> Vec<f32> {
    let r = |v: f32| from_bf16(to_bf16(v)) as f64;
    let mut y = vec![0f32; batch * n];
    for b in 0..batch {
        for o in 0..n {
            let s: f64 = (0..k).map(|i| r(x[b * k + i]) * r(w[o * k + i])).sum();
            let v = (s + bias[o] as f64) as f32;
            y[b * n + o] = if relu { v.max(0.0) } else { v };
        }
    }
    y
}

/// `y[b, o] = (sum_i qx[b, i] qw[o, i]) sx[b] sw[o] + bias[o]`, then the ReLU: activations
/// quantized per row ([`quantize_row`]), weights per output channel (`pack::quantize` with
/// `pack::quant_scale` of the row), exact integer sums.
pub fn linear_int8(
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    (batch, n, k): (usize, usize, usize),
    relu: bool,
) -> Vec<f32> {
    let mut qx = vec![0i8; k];
    let sw: Vec<f32> = (0..n)
        .map(|o| quant_scale(&w[o * k..(o + 1) * k]))
        .collect();
    let qw: Vec<i8> = (0..n * k)
        .map(|j| quantize(w[j], sw[j / k.max(1)]))
        .collect();
    let mut y = vec![0f32; batch * n];
    for b in 0..batch {
        let sx = quantize_row(&x[b * k..(b + 1) * k], &mut qx);
        for o in 0..n {
            let acc: i64 = (0..k).map(|i| qx[i] as i64 * qw[o * k + i] as i64).sum();
            let v = (acc as f64 * sx as f64 * sw[o] as f64 + bias[o] as f64) as f32;
            y[b * n + o] = if relu { v.max(0.0) } else { v };
        }
    }
    y
}
