//! Feature interactions: pairwise dot products, concatenation, and the DCNv2 low-rank cross
//! network. Inputs are the bottom MLP output `x` (`[B, d]`) and the pooled embeddings (`[B, sum of
//! dims]`, features side by side); the output is the top MLP's input (`[B, top_in]`).

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use crate::config::PairOrder;
use crate::mlp::Linear;
use crate::simd::Kernels;

/// The (i, j) pairs of a dot interaction over `n` vectors, in output order.
pub fn dot_pairs(n: usize, self_interaction: bool, order: PairOrder) -> Vec<(u32, u32)> {
    let mut p = Vec::new();
    for i in 0..n as u32 {
        match order {
            PairOrder::Lower => {
                let end = if self_interaction { i + 1 } else { i };
                p.extend((0..end).map(|j| (i, j)));
            }
            PairOrder::Upper => p.extend((i + 1..n as u32).map(|j| (i, j))),
        }
    }
    p
}

/// One DCNv2 cross layer: `xl = x0 * (W (V xl) + b) + xl`.
#[derive(Debug, Clone)]
pub struct CrossLayer {
    /// `V`: `[r, N]`, no bias.
    pub v: Linear,
    /// `W`: `[N, r]` with the layer's bias `b`.
    pub w: Linear,
}

/// A built interaction.
#[derive(Debug, Clone)]
pub enum Interaction {
    Dot {
        pairs: Vec<(u32, u32)>,
        d: usize,
    },
    Cat,
    Dcn {
        layers: Vec<CrossLayer>,
    },
    /// A graph model's: its dense part is its graph ([`crate::Model::graph`]), which the
    /// predictor runs itself (it gives the model's outputs, not a top MLP's input);
    /// [`Interaction::forward`] does nothing.
    Graph,
}

/// A sample's `T`, `Z` and `T^T` buffers for the dot interaction.
type Bufs<'a> = (&'a mut Vec<f32>, &'a mut Vec<f32>, &'a mut Vec<f32>);

/// Buffers reused across calls.
#[derive(Debug, Default)]
pub struct InteractionScratch {
    // Dot: a sample's T, Z and T^T, and where each pair sits in Z.
    t: Vec<f32>,
    z: Vec<f32>,
    tt: Vec<f32>,
    zoff: Vec<usize>,
    // DCN: the running x_l, the low-rank projection, and the wide output.
    xl: Vec<f32>,
    low: Vec<f32>,
    wide: Vec<f32>,
}

impl Interaction {
    /// Runs the interaction for `batch` samples. `x` is `[batch, d]`, `pooled` is
    /// `[batch, pooled_dim]`, `out` is `[batch, top_in]`.
    pub fn forward(
        &self,
        x: &[f32],
        pooled: &[f32],
        batch: usize,
        out: &mut [f32],
        scratch: &mut InteractionScratch,
        par: Par,
    ) {
        let on = RunOn {
            par,
            kern: Kernels::selected(),
        };
        self.forward_on(x, pooled, batch, out, scratch, on)
    }

    /// [`Interaction::forward`] with the kernels named (tests run every instruction set).
    pub(crate) fn forward_on(
        &self,
        x: &[f32],
        pooled: &[f32],
        batch: usize,
        out: &mut [f32],
        scratch: &mut InteractionScratch,
        on: RunOn,
    ) {
        let RunOn { par, kern } = on;
        if batch == 0 {
            return;
        }
        let d = x.len() / batch;
        let pd = pooled.len() / batch;
        let top_in = out.len() / batch;
        match self {
            Interaction::Dot { pairs, d: dd } => {
                debug_assert_eq!(d, *dd);
                debug_assert_eq!(top_in - d, pairs.len());
                // Per sample: T = [x; pooled] as an n x d matrix, then the lower triangle of
                // Z = T T^T (`simd::Kernels::gram`, 16 dot products at a time; faer's small GEMM
                // of the whole square where the CPU has no AVX-512), then the pairs.
                let n = pd / d + 1;
                // Z's row stride: the Gram kernel writes 16 columns at a time.
                let zs = n.div_ceil(16) * 16;
                // Where each pair sits in Z: the lower triangle holds (max, min) of each pair.
                let zoff = &mut scratch.zoff;
                zoff.clear();
                zoff.extend(pairs.iter().map(|&(i, j)| {
                    let (hi, lo) = (i.max(j) as usize, i.min(j) as usize);
                    hi * zs + lo
                }));
                let zoff = &*zoff;
                let sample = |b: usize, o: &mut [f32], (t, z, tt): Bufs<'_>| {
                    // Rows n .. zs of T are only read by the Gram kernel, for entries past the
                    // triangle; they keep whatever an earlier sample left.
                    t.resize(zs * d, 0.0);
                    z.resize(n * zs, 0.0);
                    let xr = &x[b * d..(b + 1) * d];
                    t[..d].copy_from_slice(xr);
                    t[d..n * d].copy_from_slice(&pooled[b * pd..(b + 1) * pd]);
                    if !kern.gram(t, n, d, z, zs, tt) {
                        let tm = MatRef::from_row_major_slice(&t[..n * d], n, d);
                        let zm = MatMut::from_row_major_slice_with_stride_mut(z, n, n, zs);
                        matmul(zm, Accum::Replace, tm, tm.transpose(), 1.0f32, Par::Seq);
                    }
                    o[..d].copy_from_slice(xr);
                    for (slot, &at) in o[d..].iter_mut().zip(zoff) {
                        *slot = z[at];
                    }
                };
                if par.degree() > 1 && batch > 1 {
                    // Samples are independent: split them across the pool, a T and Z per task.
                    let per = batch.div_ceil(par.degree() * 2);
                    out.par_chunks_mut(per * top_in)
                        .enumerate()
                        .for_each(|(c, chunk)| {
                            let (mut t, mut z, mut tt) = (Vec::new(), Vec::new(), Vec::new());
                            for (i, o) in chunk.chunks_exact_mut(top_in).enumerate() {
                                sample(c * per + i, o, (&mut t, &mut z, &mut tt));
                            }
                        });
                } else {
                    let InteractionScratch { t, z, tt, .. } = scratch;
                    for (b, o) in out.chunks_exact_mut(top_in).enumerate() {
                        sample(b, o, (t, z, tt));
                    }
                }
            }
            Interaction::Cat => concat(x, pooled, batch, out),
            Interaction::Dcn { layers } => {
                // x0 = concat(x, pooled) lives in `out`; xl is iterated in scratch, then copied.
                concat(x, pooled, batch, out);
                let n = top_in;
                let InteractionScratch { xl, low, wide, .. } = scratch;
                xl.clear();
                xl.extend_from_slice(out);
                for layer in layers {
                    low.resize(batch * layer.v.out_dim(), 0.0);
                    wide.resize(batch * n, 0.0);
                    layer.v.forward(xl, batch, low, par);
                    layer.w.forward(low, batch, wide, par);
                    for ((l, &x0), &w) in xl.iter_mut().zip(out.iter()).zip(wide.iter()) {
                        *l += x0 * w;
                    }
                }
                out.copy_from_slice(xl);
            }
            Interaction::Graph => {}
        }
    }
}

/// Where an interaction runs: its threads and the SIMD kernels of its dot products.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunOn {
    pub par: Par,
    pub kern: Kernels,
}

/// `out[b] = [x[b], pooled[b]]`: the DCN's `x0` and the `cat` interaction.
pub(crate) fn concat(x: &[f32], pooled: &[f32], batch: usize, out: &mut [f32]) {
    let d = x.len() / batch;
    let pd = pooled.len() / batch;
    for (b, o) in out.chunks_exact_mut(d + pd).enumerate() {
        o[..d].copy_from_slice(&x[b * d..(b + 1) * d]);
        o[d..].copy_from_slice(&pooled[b * pd..(b + 1) * pd]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::normal_vec;
    use ember_embed::Isa;
    use proptest::prelude::*;

    /// facebookresearch/dlrm's definition, in f64: Z = T T^T, then the listed entries.
    fn dot_reference(
        x: &[f32],
        pooled: &[f32],
        (batch, d, n): (usize, usize, usize),
        sel: bool,
        order: PairOrder,
    ) -> Vec<f32> {
        let mut out = Vec::new();
        for b in 0..batch {
            let t: Vec<&[f32]> = (0..n)
                .map(|i| {
                    if i == 0 {
                        &x[b * d..(b + 1) * d]
                    } else {
                        let s = b * (n - 1) * d + (i - 1) * d;
                        &pooled[s..s + d]
                    }
                })
                .collect();
            let z = |i: usize, j: usize| -> f32 {
                t[i].iter()
                    .zip(t[j])
                    .map(|(a, c)| *a as f64 * *c as f64)
                    .sum::<f64>() as f32
            };
            out.extend_from_slice(t[0]);
            match order {
                PairOrder::Lower => {
                    for i in 0..n {
                        for j in 0..i + usize::from(sel) {
                            out.push(z(i, j));
                        }
                    }
                }
                PairOrder::Upper => {
                    for i in 0..n {
                        for j in i + 1..n {
                            out.push(z(i, j));
                        }
                    }
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn dot_matches_reference(batch in prop_oneof![0usize..9, 9usize..40], d in prop_oneof![1usize..40, 60usize..70], f in prop_oneof![0usize..7, 14usize..40], sel: bool, upper: bool, seed: u64, threads in 1usize..3) {
            let order = if upper { PairOrder::Upper } else { PairOrder::Lower };
            let sel = sel && !upper;
            let x = normal_vec(batch * d, 1.0, seed);
            let pooled = normal_vec(batch * f * d, 1.0, seed ^ 9);
            let pairs = dot_pairs(f + 1, sel, order);
            let top_in = d + pairs.len();
            let it = Interaction::Dot { pairs, d };
            let par = if threads == 1 { Par::Seq } else { Par::rayon(threads) };
            let want = dot_reference(&x, &pooled, (batch, d, f + 1), sel, order);
            for isa in Isa::available_all() {
                let mut out = vec![f32::NAN; batch * top_in];
                let kern = Kernels::for_isa(isa).unwrap();
                let on = RunOn { par, kern };
                it.forward_on(&x, &pooled, batch, &mut out, &mut Default::default(), on);
                prop_assert_eq!(out.len(), want.len());
                for (g, w) in out.iter().zip(&want) {
                    prop_assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()) * (d as f32).sqrt(), "{isa}: {} vs {}", g, w);
                }
            }
        }

        #[test]
        fn dcn_matches_reference(batch in 1usize..5, n in 1usize..20, r in 1usize..5, nl in 1usize..3, seed: u64) {
            let x0 = normal_vec(batch * n, 1.0, seed);
            let mut layers = Vec::new();
            let mut params = Vec::new();
            for l in 0..nl {
                let p = normal_vec(r * n * 2 + n, 0.3, seed ^ (l as u64 + 1));
                let (vw, rest) = p.split_at(r * n);
                let (ww, b) = rest.split_at(n * r);
                layers.push(CrossLayer {
                    v: Linear::new(n, r, vw.to_vec(), vec![0.0; r], false),
                    w: Linear::new(r, n, ww.to_vec(), b.to_vec(), false),
                });
                params.push((vw.to_vec(), ww.to_vec(), b.to_vec()));
            }
            // x and pooled split x0 at an arbitrary column (concat must undo it).
            let d = n.div_ceil(2);
            let x: Vec<f32> = (0..batch).flat_map(|b| x0[b * n..b * n + d].to_vec()).collect();
            let pooled: Vec<f32> = (0..batch).flat_map(|b| x0[b * n + d..(b + 1) * n].to_vec()).collect();
            let it = Interaction::Dcn { layers };
            let mut out = vec![f32::NAN; batch * n];
            it.forward(&x, &pooled, batch, &mut out, &mut Default::default(), Par::Seq);
            for b in 0..batch {
                let x0r: Vec<f64> = x0[b * n..(b + 1) * n].iter().map(|&v| v as f64).collect();
                let mut xl = x0r.clone();
                for (vw, ww, bias) in &params {
                    let v: Vec<f64> = (0..r).map(|k| (0..n).map(|i| vw[k * n + i] as f64 * xl[i]).sum()).collect();
                    let w: Vec<f64> = (0..n).map(|i| (0..r).map(|k| ww[i * r + k] as f64 * v[k]).sum::<f64>() + bias[i] as f64).collect();
                    for i in 0..n { xl[i] += x0r[i] * w[i]; }
                }
                for i in 0..n {
                    let g = out[b * n + i];
                    prop_assert!((g as f64 - xl[i]).abs() <= 1e-4 * (1.0 + xl[i].abs()), "{} vs {}", g, xl[i]);
                }
            }
        }
    }

    #[test]
    fn pair_orders_list_the_same_pairs() {
        let lower = dot_pairs(5, false, PairOrder::Lower);
        let mut upper: Vec<_> = dot_pairs(5, false, PairOrder::Upper)
            .into_iter()
            .map(|(i, j)| (j, i))
            .collect();
        assert_eq!(lower.len(), 10);
        assert_ne!(lower, upper);
        upper.sort();
        let mut l = lower.clone();
        l.sort();
        assert_eq!(l, upper);
        assert_eq!(dot_pairs(5, true, PairOrder::Lower).len(), 15);
        assert_eq!(lower[..3], [(1, 0), (2, 0), (2, 1)]);
    }
}
