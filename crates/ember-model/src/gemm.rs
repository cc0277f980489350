//! A GEMM for the dense layers at serving batch sizes, AVX-512 only: `Y[b, o] = sum_k X[b, k] W[o, k]`
//! with `W` in PyTorch's `[out, in]` layout, never packed.
//!
//! Why not only `faer`: at batch 64 a layer's weights are touched once per batch, and right after
//! the embedding stage has streamed tens of MB through the caches they come from DRAM. `faer`
//! packs them first (a strided, latency-bound pass) and reached 50 GFLOP/s on cold weights here
//! against 85 on hot ones. This kernel reads each weight row once, sequentially (six rows at a
//! time: six streams the hardware prefetcher follows), and keeps the batch in registers: `X` is
//! transposed once per call to `XT[k, b]`, a block of up to 64 samples is four zmm registers per
//! `k`, and six weight rows x four sample vectors are 24 accumulators.

use std::arch::x86_64::*;

/// Rows of `W` per micro-kernel call.
const R: usize = 6;
/// Samples per block (4 zmm of 16 floats).
const BB: usize = 64;

/// Reusable buffers.
#[derive(Debug, Default)]
pub struct GemmScratch {
    xt: Vec<f32>,
    wpad: Vec<f32>,
}

/// `y[b * n + o] = sum_k x[b * k_dim + k] * w[o * k_dim + k]` for `b < batch`, `o < n`, on `o` rows
/// `[o_lo, o_hi)` only (the caller splits rows across threads). `xt` is the transposed batch block
/// (`[k_dim, nb * 16]`).
///
/// # Safety
/// The CPU must support AVX-512F. `w` holds `n * k_dim` values, `xt` `k_dim * nb * 16`, and
/// `out` has room for `R * nb * 16` values.
#[target_feature(enable = "avx512f")]
unsafe fn micro<const NB: usize>(w: *const f32, k_dim: usize, xt: *const f32, out: *mut f32) {
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    let stride = NB * 16;
    for k in 0..k_dim {
        // SAFETY: k < k_dim; xt row k has `stride` values; each of the R weight rows has k_dim.
        unsafe {
            let xr = xt.add(k * stride);
            let xv: [__m512; NB] = std::array::from_fn(|c| _mm512_loadu_ps(xr.add(c * 16)));
            for (r, a) in acc.iter_mut().enumerate() {
                let wb = _mm512_set1_ps(*w.add(r * k_dim + k));
                for c in 0..NB {
                    a[c] = _mm512_fmadd_ps(wb, xv[c], a[c]);
                }
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for (c, v) in a.iter().enumerate() {
            // SAFETY: out has R * NB * 16 values.
            unsafe { _mm512_storeu_ps(out.add(r * stride + c * 16), *v) };
        }
    }
}

/// Whether this kernel can run here.
pub fn available() -> bool {
    ember_embed::Isa::selected().is_ok_and(|i| i == ember_embed::Isa::Avx512)
}

/// Transposes samples `b0 .. b0 + bn` of `x` (`[batch, k_dim]`) into `xt` (`[k_dim, stride]`,
/// zero-padded to `stride` columns).
fn transpose_block(
    x: &[f32],
    k_dim: usize,
    b0: usize,
    bn: usize,
    stride: usize,
    xt: &mut Vec<f32>,
) {
    xt.clear();
    xt.resize(k_dim * stride, 0.0);
    for b in 0..bn {
        let row = &x[(b0 + b) * k_dim..(b0 + b + 1) * k_dim];
        for (k, &v) in row.iter().enumerate() {
            xt[k * stride + b] = v;
        }
    }
}

/// `y = x W^T` over rows `rows` of `W`, for every sample; writes `y[b * n + o]` for `o` in `rows`.
/// Used by [`crate::mlp::Linear`] when [`available`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_rows(
    x: &[f32],
    batch: usize,
    k_dim: usize,
    w: &[f32],
    n: usize,
    rows: std::ops::Range<usize>,
    y: YRows<'_>,
    scratch: &mut GemmScratch,
) {
    assert!(available(), "AVX-512 GEMM called without AVX-512");
    assert!(x.len() >= batch * k_dim && w.len() >= n * k_dim && rows.end <= n);
    let mut tile = [0f32; R * BB];
    let mut b0 = 0;
    while b0 < batch {
        let bn = (batch - b0).min(BB);
        let nb = bn.div_ceil(16);
        let stride = nb * 16;
        transpose_block(x, k_dim, b0, bn, stride, &mut scratch.xt);
        let mut o = rows.start;
        while o < rows.end {
            let rn = (rows.end - o).min(R);
            let wp = if rn == R {
                w[o * k_dim..].as_ptr()
            } else {
                // Tail rows: pad to R rows of zeros so the micro-kernel never reads past W.
                scratch.wpad.clear();
                scratch
                    .wpad
                    .extend_from_slice(&w[o * k_dim..(o + rn) * k_dim]);
                scratch.wpad.resize(R * k_dim, 0.0);
                scratch.wpad.as_ptr()
            };
            // SAFETY: AVX-512F is asserted above; wp has R rows of k_dim values (W has n >= o + R
            // rows, or the padded copy); xt is k_dim x stride; tile holds R * 64 values.
            unsafe {
                match nb {
                    1 => micro::<1>(wp, k_dim, scratch.xt.as_ptr(), tile.as_mut_ptr()),
                    2 => micro::<2>(wp, k_dim, scratch.xt.as_ptr(), tile.as_mut_ptr()),
                    3 => micro::<3>(wp, k_dim, scratch.xt.as_ptr(), tile.as_mut_ptr()),
                    _ => micro::<4>(wp, k_dim, scratch.xt.as_ptr(), tile.as_mut_ptr()),
                }
            }
            for r in 0..rn {
                for b in 0..bn {
                    y.set(b0 + b, o + r, tile[r * stride + b]);
                }
            }
            o += rn;
        }
        b0 += bn;
    }
}

/// The output `[batch, n]`, shared by threads that write disjoint column ranges.
#[derive(Debug, Clone, Copy)]
pub struct YRows<'a> {
    ptr: *mut f32,
    len: usize,
    n: usize,
    _life: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: threads holding copies write disjoint (row, column) cells (each thread owns a range of
// output columns, see `gemm_rows`), and the borrow of the slice outlives every copy.
unsafe impl Send for YRows<'_> {}
// SAFETY: as above.
unsafe impl Sync for YRows<'_> {}

impl<'a> YRows<'a> {
    pub fn new(y: &'a mut [f32], n: usize) -> Self {
        YRows {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            n,
            _life: std::marker::PhantomData,
        }
    }

    #[inline]
    fn set(&self, b: usize, o: usize, v: f32) {
        let i = b * self.n + o;
        assert!(i < self.len && o < self.n);
        // SAFETY: in bounds (asserted); callers write disjoint cells (see the Send impl).
        unsafe { *self.ptr.add(i) = v };
    }
}
