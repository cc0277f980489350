//! Linear layers and MLPs: `y = relu?(x W^T + b)` over a row-major batch.
//!
//! Batches of two or more rows run one GEMM per layer (Ember's AVX-512 kernel in `gemm.rs` for
//! layers of at least [`EMBER_GEMM_MIN_BYTES`] of weights, `faer` otherwise), then one pass that
//! adds the bias and applies the ReLU. A single row runs a GEMV (one dot product per output, split
//! across threads), which is what batch-1 latency needs: a GEMM kernel's packing costs more than
//! the work there.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use crate::simd::Kernels;

/// Which GEMM runs batches of two or more rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gemm {
    /// [`Gemm::Ember`] for layers of at least [`EMBER_GEMM_MIN_BYTES`] of weights, else faer.
    Selected,
    /// Ember's AVX-512 kernel where the CPU has AVX-512 (and `EMBER_ISA` allows it), else faer.
    Ember,
    /// faer.
    Faer,
}

/// Weights from which Ember's GEMM runs a layer. Its edge is reading weights that come cold from
/// DRAM (large layers after the embedding stage); small layers stay in cache between calls, where
/// faer's packed kernel is as fast or faster (measured: the shipped model's 188 KB-and-smaller
/// layers at batch 512 ran 1.3x faster on faer; RM1's 1.2-2 MB layers 1.2x faster on Ember's).
pub const EMBER_GEMM_MIN_BYTES: usize = 512 << 10;

/// One `nn.Linear` layer (weight `[out, in]`, row-major) with an optional ReLU.
#[derive(Debug, Clone)]
pub struct Linear {
    in_dim: usize,
    out_dim: usize,
    weight: Vec<f32>,
    bias: Vec<f32>,
    relu: bool,
    /// The weights laid out for Ember's GEMM: packed at construction when [`Gemm::Selected`]
    /// would run it, on first use when a caller forces [`Gemm::Ember`].
    #[cfg(target_arch = "x86_64")]
    packed: std::sync::OnceLock<crate::gemm::PackedW>,
    /// The weights for the bf16 and int8 kernels, packed for the dense dtype in use.
    lowp: crate::dense::pack::LowpWeights,
}

impl Linear {
    /// A layer from PyTorch's layout; the lengths must match (checked by the loader).
    pub fn new(
        in_dim: usize,
        out_dim: usize,
        weight: Vec<f32>,
        bias: Vec<f32>,
        relu: bool,
    ) -> Self {
        assert_eq!(weight.len(), in_dim * out_dim, "weight is [out, in]");
        assert_eq!(bias.len(), out_dim, "bias is [out]");
        let l = Linear {
            in_dim,
            out_dim,
            weight,
            bias,
            relu,
            #[cfg(target_arch = "x86_64")]
            packed: std::sync::OnceLock::new(),
            lowp: Default::default(),
        };
        #[cfg(target_arch = "x86_64")]
        if l.ember_selected() && ember_gemm_here() {
            l.packed();
        }
        l
    }

    /// Whether [`Gemm::Selected`] picks Ember's GEMM for this layer (where the CPU can run it).
    fn ember_selected(&self) -> bool {
        self.weight.len() * 4 >= EMBER_GEMM_MIN_BYTES
    }

    #[cfg(target_arch = "x86_64")]
    fn packed(&self) -> &crate::gemm::PackedW {
        self.packed
            .get_or_init(|| crate::gemm::PackedW::new(&self.weight, self.out_dim, self.in_dim))
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    pub fn bias(&self) -> &[f32] {
        &self.bias
    }

    pub fn relu(&self) -> bool {
        self.relu
    }

    /// The weights as bf16 tiles (packed on first use; at load for a bf16 model).
    pub(crate) fn packed_bf16(&self) -> &crate::dense::pack::PackedBf16 {
        self.lowp.bf16(&self.weight, self.out_dim, self.in_dim)
    }

    /// The weights as int8 tiles with their scales (packed on first use; at load for an int8
    /// model).
    pub(crate) fn packed_int8(&self) -> &crate::dense::pack::PackedI8 {
        self.lowp.int8(&self.weight, self.out_dim, self.in_dim)
    }

    /// int8's smoothing from a calibration's largest |input| per column (see
    /// [`crate::dense::pack::LowpWeights::set_smooth`]); `false` if the int8 weights were
    /// packed already.
    pub(crate) fn set_int8_smooth(&self, act: &[f32]) -> bool {
        self.lowp.set_smooth(&self.weight, self.in_dim, act)
    }

    /// Whether the int8 weights are packed (after which the smoothing is fixed).
    pub(crate) fn int8_packed(&self) -> bool {
        self.lowp.int8_packed()
    }

    /// `1 / s` per input of the int8 smoothing, when set.
    pub(crate) fn int8_inv_smooth(&self) -> Option<&[f32]> {
        self.lowp.inv_smooth()
    }

    /// Converts and packs the weights `dtype` runs on (done at load, not on the first batch).
    pub fn prepare(&self, dtype: crate::dense::DenseDType) {
        self.lowp
            .prepare(&self.weight, self.out_dim, self.in_dim, dtype)
    }

    /// `y = relu?(x W^T + b)` for `batch` rows: `x` is `[batch, in]`, `y` is `[batch, out]`.
    pub fn forward(&self, x: &[f32], batch: usize, y: &mut [f32], par: Par) {
        self.forward_with(x, batch, y, par, Gemm::Selected)
    }

    /// [`Linear::forward`] with the GEMM named (tests run every one).
    pub fn forward_with(&self, x: &[f32], batch: usize, y: &mut [f32], par: Par, gemm: Gemm) {
        debug_assert_eq!(x.len(), batch * self.in_dim);
        debug_assert_eq!(y.len(), batch * self.out_dim);
        if batch == 0 {
            return;
        }
        if batch == 1 {
            self.gemv(x, y, par);
            return;
        }
        let ember = match gemm {
            Gemm::Selected => self.ember_selected(),
            Gemm::Ember => true,
            Gemm::Faer => false,
        };
        if ember && ember_gemm_here() {
            #[cfg(target_arch = "x86_64")]
            crate::gemm::gemm(x, batch, &self.weight, self.packed(), y, par.degree());
        } else {
            let lhs = MatRef::from_row_major_slice(x, batch, self.in_dim);
            let rhs =
                MatRef::from_row_major_slice(&self.weight, self.out_dim, self.in_dim).transpose();
            let dst = MatMut::from_row_major_slice_mut(y, batch, self.out_dim);
            matmul(dst, Accum::Replace, lhs, rhs, 1.0f32, par);
        }
        for row in y.chunks_exact_mut(self.out_dim) {
            bias_act(row, &self.bias, self.relu);
        }
    }

    fn gemv(&self, x: &[f32], y: &mut [f32], par: Par) {
        let k = self.in_dim;
        let kern = Kernels::selected();
        let rows = |first: usize, ys: &mut [f32]| {
            kern.gemv(&self.weight[first * k..(first + ys.len()) * k], x, ys);
            bias_act(ys, &self.bias[first..first + ys.len()], self.relu);
        };
        // Split only when each thread gets a few hundred KB of weights: below that, waking the
        // pool costs more than it saves.
        let threads = par.degree();
        if threads > 1 && self.weight.len() >= 64 * 1024 {
            let chunk = self.out_dim.div_ceil(threads * 4).next_multiple_of(4);
            y.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, ys)| rows(c * chunk, ys));
        } else {
            rows(0, y);
        }
    }
}

/// Whether Ember's AVX-512 GEMM can run on this CPU.
fn ember_gemm_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::gemm::available();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// Adds `bias` to `row` and applies the ReLU if asked, in one pass.
#[inline]
pub(crate) fn bias_act(row: &mut [f32], bias: &[f32], relu: bool) {
    if relu {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v = (*v + b).max(0.0);
        }
    } else {
        for (v, &b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// A stack of [`Linear`] layers.
#[derive(Debug, Clone, Default)]
pub struct Mlp {
    layers: Vec<Linear>,
}

/// Two ping-pong buffers for the activations between layers.
#[derive(Debug, Default)]
pub struct MlpScratch {
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Mlp {
    pub fn new(layers: Vec<Linear>) -> Self {
        for w in layers.windows(2) {
            assert_eq!(w[0].out_dim, w[1].in_dim, "layer sizes must chain");
        }
        Mlp { layers }
    }

    pub fn layers(&self) -> &[Linear] {
        &self.layers
    }

    /// Multiply-adds per sample.
    pub fn macs(&self) -> usize {
        self.layers.iter().map(|l| l.in_dim * l.out_dim).sum()
    }

    /// Runs every layer on `x` (`[batch, in]`) and returns the output, which lives in `scratch`
    /// (or is `x` itself when there are no layers).
    pub fn forward<'s>(
        &self,
        x: &'s [f32],
        batch: usize,
        scratch: &'s mut MlpScratch,
        par: Par,
    ) -> &'s [f32] {
        let Some((first, rest)) = self.layers.split_first() else {
            return x;
        };
        let MlpScratch { a, b } = scratch;
        a.resize(batch * first.out_dim, 0.0);
        first.forward(x, batch, a, par);
        let (mut cur, mut next) = (a, b);
        for l in rest {
            next.resize(batch * l.out_dim, 0.0);
            l.forward(cur, batch, next, par);
            std::mem::swap(&mut cur, &mut next);
        }
        cur
    }
}

/// The plain definition, for tests: `y[b][o] = relu?(sum_i x[b][i] * w[o][i] + bias[o])` in f64.
pub fn linear_reference(l: &Linear, x: &[f32], batch: usize) -> Vec<f32> {
    let mut y = vec![0f32; batch * l.out_dim];
    for b in 0..batch {
        for o in 0..l.out_dim {
            let mut s = l.bias[o] as f64;
            for i in 0..l.in_dim {
                s += x[b * l.in_dim + i] as f64 * l.weight[o * l.in_dim + i] as f64;
            }
            let v = s as f32;
            y[b * l.out_dim + o] = if l.relu { v.max(0.0) } else { v };
        }
    }
    y
}

/// The logistic function: a model's output activation (its logit to a probability).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layer(in_dim: usize, out_dim: usize, relu: bool, seed: u64) -> Linear {
        let v = crate::random::normal_vec(in_dim * out_dim + out_dim, 0.5, seed);
        Linear::new(
            in_dim,
            out_dim,
            v[..in_dim * out_dim].to_vec(),
            v[in_dim * out_dim..].to_vec(),
            relu,
        )
    }

    fn close(got: &[f32], want: &[f32], k: usize) {
        assert_eq!(got.len(), want.len());
        let tol = 1e-5 * (k as f32).sqrt().max(1.0);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "element {i}: got {g}, want {w}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn linear_matches_reference(
            batch in prop_oneof![0usize..9, 9usize..140], in_dim in 1usize..70, out_dim in 1usize..40,
            relu: bool, seed: u64, threads in 1usize..3,
        ) {
            let l = layer(in_dim, out_dim, relu, seed);
            let x = crate::random::normal_vec(batch * in_dim, 1.0, seed ^ 1);
            let par = if threads == 1 { Par::Seq } else { Par::rayon(threads) };
            for gemm in [Gemm::Selected, Gemm::Ember, Gemm::Faer] {
                let mut y = vec![f32::NAN; batch * out_dim];
                l.forward_with(&x, batch, &mut y, par, gemm);
                close(&y, &linear_reference(&l, &x, batch), in_dim);
            }
        }
    }

    /// Every path of the GEMMs on fixed shapes (proptest may miss the 64-sample blocked path,
    /// which needs 49+ samples and 65+ inputs): batches below, at and across 16/48/64, inputs
    /// below and across the 64-input block, one row and tail rows, 1-3 threads.
    #[test]
    fn gemm_paths_match_reference_on_fixed_shapes() {
        for (k, n) in [(300, 50), (129, 13), (64, 7), (1, 12), (65, 1), (200, 6)] {
            for batch in [2, 17, 48, 49, 64, 65, 113, 130] {
                let l = layer(k, n, true, (k * n + batch) as u64);
                let x = crate::random::normal_vec(batch * k, 1.0, batch as u64);
                let want = linear_reference(&l, &x, batch);
                for threads in 1..=3 {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let par = if threads == 1 {
                        Par::Seq
                    } else {
                        Par::rayon(threads)
                    };
                    for gemm in [Gemm::Ember, Gemm::Faer] {
                        let mut y = vec![f32::NAN; batch * n];
                        pool.install(|| l.forward_with(&x, batch, &mut y, par, gemm));
                        close(&y, &want, k);
                    }
                }
            }
        }
        if !crate::gemm::available() {
            eprintln!(
                "no AVX-512 here: Gemm::Ember ran faer; its kernel is untested on this machine"
            );
        }
    }

    /// Callers sharing one pool: a worker waiting for its row chunks runs another caller's GEMM
    /// on the same thread (this panicked with "RefCell already borrowed" when the transposed block
    /// stayed borrowed across the parallel section).
    #[test]
    fn gemm_is_reentrant_on_a_shared_pool() {
        let l = std::sync::Arc::new(layer(300, 50, false, 3));
        let x = std::sync::Arc::new(crate::random::normal_vec(64 * 300, 1.0, 4));
        let want = linear_reference(&l, &x, 64);
        let pool = std::sync::Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap(),
        );
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (l, x, pool) = (l.clone(), x.clone(), pool.clone());
                std::thread::spawn(move || {
                    let mut y = vec![0f32; 64 * 50];
                    for _ in 0..40 {
                        pool.install(|| l.forward_with(&x, 64, &mut y, Par::rayon(2), Gemm::Ember));
                    }
                    y
                })
            })
            .collect();
        for h in handles {
            close(&h.join().unwrap(), &want, 300);
        }
    }

    #[test]
    fn zero_inputs_give_the_bias() {
        let l = Linear::new(0, 3, vec![], vec![0.5, -1.0, 2.0], false);
        for batch in [1, 2, 64] {
            let mut y = vec![f32::NAN; batch * 3];
            l.forward_with(&[], batch, &mut y, Par::Seq, Gemm::Ember);
            assert!(y.chunks(3).all(|r| r == [0.5, -1.0, 2.0]), "{y:?}");
        }
    }

    #[test]
    fn gemv_splits_large_layers_across_threads() {
        // Large enough to take the threaded GEMV path.
        let l = layer(300, 257, true, 7);
        let x = crate::random::normal_vec(300, 1.0, 8);
        let mut y = vec![f32::NAN; 257];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| l.forward(&x, 1, &mut y, Par::rayon(2)));
        close(&y, &linear_reference(&l, &x, 1), 300);
        assert!(y.iter().any(|&v| v > 0.0) && y.contains(&0.0));
    }

    #[test]
    fn mlp_chains_layers() {
        let m = Mlp::new(vec![layer(5, 7, true, 1), layer(7, 3, false, 2)]);
        let x = crate::random::normal_vec(4 * 5, 1.0, 3);
        let mut s = MlpScratch::default();
        let y = m.forward(&x, 4, &mut s, Par::Seq).to_vec();
        let h = linear_reference(&m.layers()[0], &x, 4);
        close(&y, &linear_reference(&m.layers()[1], &h, 4), 7);
        assert_eq!(m.macs(), 5 * 7 + 7 * 3);
    }
}
