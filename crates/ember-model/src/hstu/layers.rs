//! The small layers of the HSTU model: layer norms (plain and "swish"), the reference's
//! recurring `Linear -> SwishLayerNorm -> Linear [-> LayerNorm]` block, and the one call that
//! runs a linear layer in the dense precision in use (f32 on faer / Ember's GEMM, bf16 on the
//! AMX / AVX-512 / emulated kernels of [`crate::dense`]).

use faer::Par;

use crate::dense::driver::Kernels;
use crate::dense::{DenseDType, DenseIsa, from_bf16, to_bf16};
use crate::lowp::{self, Input, LowpScratch};
use crate::mlp::Linear;
use std::collections::HashMap;

/// `torch.nn.functional.layer_norm` over the last dim, with weight and bias.
#[derive(Debug, Clone)]
pub struct Norm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub eps: f32,
}

impl Norm {
    pub fn dim(&self) -> usize {
        self.weight.len()
    }

    /// Normalises `x` (one row) into `y`.
    #[inline]
    pub fn row(&self, x: &[f32], y: &mut [f32]) {
        let (mean, rstd) = moments(x, self.eps);
        for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(&self.weight).zip(&self.bias) {
            *y = (x - mean) * rstd * w + b;
        }
    }

    /// Normalises every row of `x` (`[m, dim]`) in place.
    pub fn rows_in_place(&self, x: &mut [f32]) {
        let d = self.dim();
        for r in x.chunks_exact_mut(d) {
            let (mean, rstd) = moments(r, self.eps);
            for ((v, &w), &b) in r.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * rstd * w + b;
            }
        }
    }

    /// `x * sigmoid(layer_norm(x))` on every row of `x` in place (the reference's
    /// `SwishLayerNorm`).
    pub fn swish_rows_in_place(&self, x: &mut [f32]) {
        let d = self.dim();
        for r in x.chunks_exact_mut(d) {
            let (mean, rstd) = moments(r, self.eps);
            for ((v, &w), &b) in r.iter_mut().zip(&self.weight).zip(&self.bias) {
                let n = (*v - mean) * rstd * w + b;
                *v *= sigmoid(n);
            }
        }
    }
}

/// Runs `f(row index, row)` on every row of `x` (rows of `width` values): on the calling rayon
/// pool in pieces of 64 rows when `threads > 1` and there are 256 rows or more, else in order
/// on this thread (a one-thread predictor has no pool of its own).
pub fn for_rows(
    threads: usize,
    x: &mut [f32],
    width: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    use rayon::prelude::*;
    if width == 0 {
        return;
    }
    let rows = x.len() / width;
    if threads > 1 && rows >= 256 {
        x.par_chunks_mut(64 * width)
            .enumerate()
            .for_each(|(c, piece)| {
                for (i, r) in piece.chunks_exact_mut(width).enumerate() {
                    f(c * 64 + i, r);
                }
            });
    } else {
        for (i, r) in x.chunks_exact_mut(width).enumerate() {
            f(i, r);
        }
    }
}

/// Mean and `1 / sqrt(var + eps)` of `x` (biased variance, as PyTorch), summed in f64.
#[inline]
pub fn moments(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len().max(1) as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean as f32, (1.0 / (var + eps as f64).sqrt()) as f32)
}

/// `1 / (1 + e^-x)` with [`exp_fast`] (within 2 ulp of `e^x`): it vectorises with the loop
/// that calls it, where the library's `expf` is a scalar call (with it, the STU layers' silu
/// alone took 26-32% of a 1,024 x 512 user on an AMD EPYC, and 3% with this).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_fast(-x))
}

/// `x * sigmoid(x)`, as [`sigmoid`]: also attention's silu, vectorised with its loops.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp_fast(-x))
}

/// `e^x` in f32 within 2 ulp (Cephes' `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`,
/// times `2^n` built in the exponent bits), branch-free and free of float-to-int conversions so
/// that it vectorises: `n` is rounded by adding 1.5 x 2^23, which leaves it in the low mantissa
/// bits. Clamped to the finite range (`e^-87.3` to `e^88.3`).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = x.clamp(-87.3, 88.3);
    let t = x * std::f32::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let bits = t
        .to_bits()
        .wrapping_sub(SHIFTER.to_bits())
        .wrapping_add(127)
        << 23;
    y * f32::from_bits(bits)
}

/// `Linear -> SwishLayerNorm -> Linear [-> LayerNorm]`: the reference's content, action,
/// additional and item MLPs (with the last norm) and its prediction head (without).
#[derive(Debug)]
pub struct SwishMlp {
    pub first: Linear,
    pub swish: Norm,
    pub second: Linear,
    pub norm: Option<Norm>,
}

impl SwishMlp {
    pub fn in_dim(&self) -> usize {
        self.first.in_dim()
    }

    pub fn out_dim(&self) -> usize {
        self.second.out_dim()
    }

    /// Multiply-adds per row.
    pub fn macs(&self) -> usize {
        self.first.weight().len() + self.second.weight().len()
    }

    /// Runs `m` rows of `x` (at stride `ldx`) into `y` (`[m, out]`).
    pub fn forward(&self, d: &mut DenseCtx, x: &[f32], ldx: usize, m: usize, y: &mut [f32]) {
        let mut h = std::mem::take(&mut d.hidden);
        h.resize(m * self.first.out_dim(), 0.0);
        d.linear(&self.first, x, ldx, m, &mut h);
        let (hid, out) = (self.first.out_dim(), self.second.out_dim());
        for_rows(d.threads, &mut h, hid, |_, r| {
            self.swish.swish_rows_in_place(r)
        });
        d.linear(&self.second, &h, hid, m, y);
        if let Some(n) = &self.norm {
            for_rows(d.threads, &mut y[..m * out], out, |_, r| n.rows_in_place(r));
        }
        d.hidden = h;
    }

    pub(crate) fn prepare(&self, dtype: DenseDType) {
        self.first.prepare(dtype);
        self.second.prepare(dtype);
    }
}

/// What a linear layer runs with: the precision, its kernels, buffers and threads.
#[derive(Debug)]
pub struct DenseCtx {
    pub dtype: DenseDType,
    kernels: Option<Kernels>,
    lowp: LowpScratch,
    threads: usize,
    /// A contiguous copy of a strided f32 input.
    gather: Vec<f32>,
    /// A [`SwishMlp`]'s hidden rows.
    hidden: Vec<f32>,
    /// Per layer (by address: the predictor's model outlives this context), its weights rounded
    /// to bf16 and held as f32: the bf16 layers on a CPU without a bf16 unit ([`Self::linear`]).
    rounded: HashMap<usize, Linear>,
}

impl DenseCtx {
    pub fn new(dtype: DenseDType, threads: usize) -> crate::Result<DenseCtx> {
        let kernels = match dtype {
            DenseDType::F32 => None,
            d => Some(Kernels::selected(d)?),
        };
        Ok(DenseCtx {
            dtype,
            kernels,
            lowp: LowpScratch::default(),
            threads,
            gather: Vec::new(),
            hidden: Vec::new(),
            rounded: HashMap::new(),
        })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn par(&self) -> Par {
        if self.threads > 1 {
            Par::rayon(self.threads)
        } else {
            Par::Seq
        }
    }

    /// `y = x W^T + b` for `m` rows of `x` at stride `ldx` (`y` is `[m, out]`, dense).
    ///
    /// bf16 on a CPU without a bf16 unit (the emulated kernels): the rows and the weights are
    /// rounded to bf16 and multiplied by the f32 GEMM. A product of two bf16 values is exact in
    /// f32, so this computes the emulation's products, and its f32 sums in the GEMM's order
    /// (as the hardware kernels' order differs from the emulation's); the emulation's own loops
    /// ran the projections at a fifth of the f32 GEMM's speed on an AMD EPYC (Zen 3).
    pub fn linear(&mut self, l: &Linear, x: &[f32], ldx: usize, m: usize, y: &mut [f32]) {
        let (k, n) = (l.in_dim(), l.out_dim());
        debug_assert!(ldx >= k && y.len() >= m * n);
        if m == 0 {
            return;
        }
        debug_assert!(x.len() >= (m - 1) * ldx + k);
        match (self.dtype, &self.kernels) {
            (DenseDType::F32, _) | (_, None) => {
                let par = self.par();
                if ldx == k {
                    l.forward(&x[..m * k], m, &mut y[..m * n], par);
                } else {
                    self.gather.clear();
                    for r in 0..m {
                        self.gather.extend_from_slice(&x[r * ldx..r * ldx + k]);
                    }
                    l.forward(&self.gather, m, &mut y[..m * n], par);
                }
            }
            (DenseDType::Bf16, Some(kern)) if kern.isa() == DenseIsa::Emulated => {
                let par = self.par();
                let Self {
                    rounded, gather, ..
                } = self;
                let w = rounded
                    .entry(l as *const Linear as usize)
                    .or_insert_with(|| {
                        let w = l.weight().iter().map(|&v| from_bf16(to_bf16(v))).collect();
                        Linear::new(k, n, w, l.bias().to_vec(), l.relu())
                    });
                gather.clear();
                for r in 0..m {
                    let row = &x[r * ldx..r * ldx + k];
                    gather.extend(row.iter().map(|&v| from_bf16(to_bf16(v))));
                }
                w.forward(gather, m, &mut y[..m * n], par);
            }
            (_, Some(kern)) => {
                let run = lowp::Exec {
                    kernels: *kern,
                    dtype: DenseDType::Bf16,
                    threads: self.threads,
                };
                let input = Input::F32(x, ldx);
                lowp::mlp(run, std::slice::from_ref(l), input, m, y, &mut self.lowp);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bf16 layer, on whichever kernels this CPU runs (the f32 GEMM over bf16-rounded values
    /// where it has no bf16 unit), gives the sums of the bf16-rounded products, to f32 rounding:
    /// odd dims, a strided input, one row and several, repeated (the rounded weights cached).
    #[test]
    fn a_bf16_layer_sums_the_bf16_products() {
        let round = |v: f32| from_bf16(to_bf16(v)) as f64;
        for (k, n, m, ldx, relu) in [
            (37, 29, 5, 40, false),
            (64, 16, 1, 64, true),
            (3, 5, 9, 7, false),
        ] {
            let w = crate::random::normal_vec(k * n, 1.0, 3);
            let b = crate::random::normal_vec(n, 1.0, 4);
            let x = crate::random::normal_vec(m * ldx, 1.0, 5);
            let l = Linear::new(k, n, w.clone(), b.clone(), relu);
            l.prepare(DenseDType::Bf16);
            let mut d = DenseCtx::new(DenseDType::Bf16, 2).unwrap();
            for _ in 0..2 {
                let mut y = vec![f32::NAN; m * n];
                d.linear(&l, &x, ldx, m, &mut y);
                for r in 0..m {
                    for o in 0..n {
                        let terms = (0..k).map(|i| round(x[r * ldx + i]) * round(w[o * k + i]));
                        let (sum, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                        let want = sum + b[o] as f64;
                        let want = if relu { want.max(0.0) } else { want };
                        let got = y[r * n + o] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + size),
                            "{k}x{n} row {r} out {o}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn layer_norm_matches_its_definition_in_f64() {
        let x: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 101) as f32 * 0.13 - 5.0)
            .collect();
        let w: Vec<f32> = (0..37).map(|i| 0.5 + i as f32 * 0.01).collect();
        let b: Vec<f32> = (0..37).map(|i| i as f32 * -0.02).collect();
        let n = Norm {
            weight: w.clone(),
            bias: b.clone(),
            eps: 1e-5,
        };
        let mut y = vec![0.0; 37];
        n.row(&x, &mut y);
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / 37.0;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 37.0;
        for i in 0..37 {
            let want = (x[i] as f64 - mean) / (var + 1e-5).sqrt() * w[i] as f64 + b[i] as f64;
            assert!((y[i] as f64 - want).abs() < 1e-5, "{i}: {} vs {want}", y[i]);
        }
        let mut s = x.clone();
        n.swish_rows_in_place(&mut s);
        for i in 0..37 {
            let want = x[i] * sigmoid(y[i]);
            assert!((s[i] - want).abs() < 1e-5 * want.abs().max(1.0));
        }
    }
}
