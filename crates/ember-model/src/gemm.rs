//! A GEMM for the dense layers at serving batch sizes, AVX-512 only: `Y[b, o] = sum_k X[b, k] W[o, k]`
//! with `W` in PyTorch's `[out, in]` layout, packed once when the layer is built ([`PackedW`]).
//!
//! Why not only `faer`: at batch 64 a layer's weights are touched once per batch, and right after
//! the embedding stage has streamed tens of MB through the caches they come from DRAM. `faer`
//! packs them on every call (a strided, latency-bound pass). This kernel packs them once, at load,
//! in the exact order it reads them, so a call is one sequential stream of weights, prefetched a
//! little at every step. It keeps the batch in registers: `X` is transposed once per call to
//! `XT[k, b]` (16 inputs at a time), a block of up to 64 samples is four zmm registers per `k`,
//! and six weight rows x four sample vectors are 24 accumulators. Measured on the RM1 layers at
//! batch 64 (`benches/dense.rs`, medians of 100-200 calls; 2048x256, 592x768, 768x384): 577 /
//! 472 / 312 us on hot caches (116-123 GFLOP/s, 77-81% of the core's measured FMA peak of 152)
//! and 723 / 622 / 417 us with the caches flushed before each call, where faer took 1238 / 1186
//! / 854 us (1.7-2.0x). Batches of fewer than 49 samples (the tail of a batch) read `W` in place
//! with the generic kernel.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

/// Rows of `W` per micro-kernel call.
const RMAX: usize = 6;
/// Inputs per block of the 64-sample path: the block of `xt` in use (64 x 64 floats, 16 KB) stays
/// in L1. Measured against unblocked: equal on hot weights, 1.1-1.3x on cold ones.
const KC: usize = 64;

/// Per-thread buffers of the workers.
#[derive(Debug, Default)]
struct GemmScratch {
    wpad: Vec<f32>,
    acc: Vec<f32>,
}

impl GemmScratch {
    /// Rows `first .. first + rn` of `w` (`k_dim` wide), zero-padded to `RMAX` rows in `wpad` when
    /// `rn < RMAX`, so that a micro-kernel reading `RMAX` rows never reads past `w`.
    fn rows_ptr(&mut self, w: &[f32], first: usize, rn: usize, k_dim: usize) -> *const f32 {
        if rn == RMAX {
            return w[first * k_dim..(first + RMAX) * k_dim].as_ptr();
        }
        self.wpad.clear();
        self.wpad
            .extend_from_slice(&w[first * k_dim..(first + rn) * k_dim]);
        self.wpad.resize(RMAX * k_dim, 0.0);
        self.wpad.as_ptr()
    }
}

thread_local! {
    static SCRATCH: RefCell<GemmScratch> = RefCell::new(GemmScratch::default());
    // The calling thread's transposed block; kept, since a fresh 512 KB buffer per call costs its
    // page faults (measured: 10-20% of a cold 2048x256 layer).
    static XT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One register tile: `out[r * NB * 16 + b] = sum_k w[r * k_dim + k] * xt[k * NB * 16 + b]` for
/// `R` weight rows and `NB * 16` (transposed) samples, over the whole input width.
///
/// # Safety
/// The CPU must support AVX-512F. `w` points at `R` rows of `k_dim` values, `xt` at `k_dim` rows
/// of `NB * 16`, and `out` has room for `R * NB * 16` values.
#[target_feature(enable = "avx512f")]
unsafe fn micro<const R: usize, const NB: usize>(
    w: *const f32,
    k_dim: usize,
    xt: *const f32,
    out: *mut f32,
) {
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

/// [`micro`] for six rows and 64 samples, on one block of [`PackedW`]: input `k` of the six rows
/// is `w[6 k .. 6 k + 6]`. Every accumulator is a named local: the array form of the generic
/// kernel made LLVM spill four of the 24 accumulators to the stack in the inner loop (seen in the
/// disassembly), which cost a quarter of the throughput.
///
/// Runs inputs `0 .. kc` of the block (the caller offsets `xt` to the block's first input),
/// adding to the partial sums in `out` when `accumulate`, and prefetches `6 kc` weights from
/// `next_w`, one line every few steps.
///
/// # Safety
/// The CPU must support AVX-512F. `w` points at `6 kc` values, `xt` at `kc` rows of 64 values,
/// `out` at 6 x 64 values; `next_w` is only prefetched.
#[target_feature(enable = "avx512f")]
unsafe fn micro_6x64(
    w: *const f32,
    kc: usize,
    xt: *const f32,
    out: *mut f32,
    accumulate: bool,
    next_w: *const f32,
) {
    macro_rules! zero {
        ($($a:ident),*) => { $(let mut $a = _mm512_setzero_ps();)* };
    }
    zero!(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23);
    zero!(a30, a31, a32, a33, a40, a41, a42, a43, a50, a51, a52, a53);
    if accumulate {
        // SAFETY: out holds the 6 x 64 partial sums of the previous k block.
        unsafe {
            macro_rules! load {
                ($($i:expr => $a:ident),*) => { $($a = _mm512_loadu_ps(out.add($i * 16));)* };
            }
            load!(0 => a00, 1 => a01, 2 => a02, 3 => a03, 4 => a10, 5 => a11, 6 => a12, 7 => a13);
            load!(8 => a20, 9 => a21, 10 => a22, 11 => a23, 12 => a30, 13 => a31, 14 => a32);
            load!(15 => a33, 16 => a40, 17 => a41, 18 => a42, 19 => a43, 20 => a50, 21 => a51);
            load!(22 => a52, 23 => a53);
        }
    }
    macro_rules! row {
        ($r:expr, $k:expr, $x0:ident, $x1:ident, $x2:ident, $x3:ident, $a0:ident, $a1:ident, $a2:ident, $a3:ident) => {{
            // SAFETY: $k < kc, and the caller guarantees `w` has 6 kc values.
            let wb = unsafe { _mm512_set1_ps(*w.add($k * 6 + $r)) };
            $a0 = _mm512_fmadd_ps(wb, $x0, $a0);
            $a1 = _mm512_fmadd_ps(wb, $x1, $a1);
            $a2 = _mm512_fmadd_ps(wb, $x2, $a2);
            $a3 = _mm512_fmadd_ps(wb, $x3, $a3);
        }};
    }
    for k in 0..kc {
        // One prefetch per step, the weights `next_w` is ahead of this step's: spread over the
        // loop, they keep a few lines in flight instead of a burst of 24 stalling the loads
        // (measured: cold layers 1.07-1.1x faster than prefetching the next block up front).
        // Several steps share a line; the repeats hit lines already requested. Prefetch never
        // faults.
        _mm_prefetch::<_MM_HINT_T0>(next_w.wrapping_add(6 * k) as *const i8);
        // SAFETY: as above.
        let (x0, x1, x2, x3) = unsafe {
            let xr = xt.add(k * 64);
            (
                _mm512_loadu_ps(xr),
                _mm512_loadu_ps(xr.add(16)),
                _mm512_loadu_ps(xr.add(32)),
                _mm512_loadu_ps(xr.add(48)),
            )
        };
        row!(0, k, x0, x1, x2, x3, a00, a01, a02, a03);
        row!(1, k, x0, x1, x2, x3, a10, a11, a12, a13);
        row!(2, k, x0, x1, x2, x3, a20, a21, a22, a23);
        row!(3, k, x0, x1, x2, x3, a30, a31, a32, a33);
        row!(4, k, x0, x1, x2, x3, a40, a41, a42, a43);
        row!(5, k, x0, x1, x2, x3, a50, a51, a52, a53);
    }
    let all = [
        a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33, a40, a41,
        a42, a43, a50, a51, a52, a53,
    ];
    for (i, v) in all.iter().enumerate() {
        // SAFETY: out has 6 * 64 values.
        unsafe { _mm512_storeu_ps(out.add(i * 16), *v) };
    }
}

/// A layer's weights re-laid, once, in the order the 64-sample kernel reads them: for each block
/// of [`KC`] inputs, for each tile of six output rows, for each input of the block, the six rows'
/// weights (rows past `n` are zero). One sequential stream instead of six rows read in place.
/// Read in place, six rows `k_dim` floats apart (8 KB for RM1's 2048-wide layer) fall in the same
/// L1 sets, and a block's 256-byte row segments are too short for the hardware prefetcher: the
/// packed stream ran RM1's layers 1.08-1.21x faster on hot caches and 1.18-1.31x on cold ones
/// than the same kernel reading `W` in place (`benches/dense.rs`). It costs a second copy of the
/// layer's weights.
#[derive(Debug, Clone)]
pub struct PackedW {
    data: Vec<f32>,
    n: usize,
    k_dim: usize,
}

impl PackedW {
    /// Packs `w` (`[n, k_dim]`, row-major).
    pub fn new(w: &[f32], n: usize, k_dim: usize) -> Self {
        assert_eq!(w.len(), n * k_dim, "weight is [n, k_dim]");
        let tiles = n.div_ceil(RMAX);
        let mut data = Vec::with_capacity(tiles * RMAX * k_dim);
        let mut k0 = 0;
        while k0 < k_dim {
            let kc = KC.min(k_dim - k0);
            for t in 0..tiles {
                for k in k0..k0 + kc {
                    for r in t * RMAX..(t + 1) * RMAX {
                        data.push(if r < n { w[r * k_dim + k] } else { 0.0 });
                    }
                }
            }
            k0 += kc;
        }
        PackedW { data, n, k_dim }
    }

    /// The block of tile `t` for inputs `k0 .. k0 + kc` (`k0` a multiple of [`KC`]).
    fn block(&self, k0: usize, t: usize) -> &[f32] {
        let kc = KC.min(self.k_dim - k0);
        let at = k0 * self.n.div_ceil(RMAX) * RMAX + t * kc * RMAX;
        &self.data[at..at + kc * RMAX]
    }
}

/// Whether this kernel can run here.
pub fn available() -> bool {
    ember_embed::Isa::selected().is_ok_and(|i| i == ember_embed::Isa::Avx512)
}

/// `dst[c * dst_stride + r] = src[r * src_stride + c]` for a 16 x 16 block.
///
/// # Safety
/// The CPU must support AVX-512F; `src` has 16 rows of 16 readable values at `src_stride`, `dst`
/// 16 rows of 16 writable values at `dst_stride`.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_16x16(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    // SAFETY: 16 rows of 16 values each, per the contract.
    let r: [__m512; 16] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(src.add(i * src_stride)) });
    // Interleave pairs of rows (32-bit), then pairs of pairs (64-bit), then 128-bit lanes twice.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let u: [__m512; 16] = std::array::from_fn(|i| {
        // i = 4q + j: pairs (t[4q], t[4q+2]) and (t[4q+1], t[4q+3]), lo and hi 64-bit halves.
        let (q, j) = (i / 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[4 * q + j / 2]),
            _mm512_castps_pd(t[4 * q + j / 2 + 2]),
        );
        _mm512_castpd_ps(if j % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    // Now u[4q + j], 128-bit lane L, holds rows 4q .. 4q + 4 of column 4L + j. Two rounds of
    // 128-bit lane shuffles gather each column's four lanes into one register.
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (h, p, j) = (i / 8, (i / 4) % 2, i % 4);
        let (a, b) = (u[8 * h + j], u[8 * h + 4 + j]);
        if p == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    for i in 0..16 {
        let (p2, j) = (i / 4, i % 4);
        let (a, b) = (v[4 * (p2 % 2) + j], v[8 + 4 * (p2 % 2) + j]);
        let w = if p2 < 2 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        };
        // SAFETY: 16 rows of 16 values each, per the contract.
        unsafe { _mm512_storeu_ps(dst.add(i * dst_stride), w) };
    }
}

/// `dst[c * dst_stride + r] = src[r * src_stride + c]` for `r < rows`, `c < cols`.
///
/// # Safety
/// AVX-512F; `src` and `dst` cover the block at their strides.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose(
    src: *const f32,
    rows: usize,
    cols: usize,
    src_stride: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    let (r16, c16) = (rows / 16 * 16, cols / 16 * 16);
    for r in (0..r16).step_by(16) {
        for c in (0..c16).step_by(16) {
            // SAFETY: the 16 x 16 block at (r, c) is inside both buffers.
            unsafe {
                transpose_16x16(
                    src.add(r * src_stride + c),
                    src_stride,
                    dst.add(c * dst_stride + r),
                    dst_stride,
                )
            };
        }
    }
    // Edges: the columns right of c16 for every row, and the rows below r16.
    for r in 0..rows {
        let c_from = if r < r16 { c16 } else { 0 };
        for c in c_from..cols {
            // SAFETY: r < rows, c < cols.
            unsafe { *dst.add(c * dst_stride + r) = *src.add(r * src_stride + c) };
        }
    }
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
    assert!(x.len() >= (b0 + bn) * k_dim);
    // SAFETY: AVX-512F (callers are behind `available`); the source block is rows b0 .. b0 + bn
    // of x (asserted), the destination k_dim rows of `stride >= bn` values.
    unsafe {
        transpose(
            x[b0 * k_dim..].as_ptr(),
            bn,
            k_dim,
            k_dim,
            xt.as_mut_ptr(),
            stride,
        )
    };
}

/// `y = x W^T` (`x`: `[batch, k_dim]`, `w`: `[n, k_dim]`, `y`: `[batch, n]`; `packed` is `w`
/// packed, and gives `n` and `k_dim`). Batches run in blocks of 64 samples (from `packed`; a last block of fewer reads `w` in
/// place); each block is transposed once, then its rows of `W` are split across `threads` workers
/// of the current rayon pool, which share the transposed block.
/// Used by [`crate::mlp::Linear`] when [`available`].
pub fn gemm(x: &[f32], batch: usize, w: &[f32], packed: &PackedW, y: &mut [f32], threads: usize) {
    let (n, k_dim) = (packed.n, packed.k_dim);
    assert!(available(), "AVX-512 GEMM called without AVX-512");
    assert!(x.len() >= batch * k_dim && w.len() >= n * k_dim && y.len() >= batch * n);
    if k_dim == 0 {
        y[..batch * n].fill(0.0);
        return;
    }
    // Take the buffer out rather than hold the borrow across the parallel section: a rayon
    // worker waiting for its row chunks may run another caller's `gemm` on this thread.
    let mut xt = XT.with(|b| std::mem::take(&mut *b.borrow_mut()));
    gemm_blocks(x, batch, w, packed, y, threads, &mut xt);
    XT.with(|b| *b.borrow_mut() = xt);
}

fn gemm_blocks(
    x: &[f32],
    batch: usize,
    w: &[f32],
    packed: &PackedW,
    y: &mut [f32],
    threads: usize,
    xt: &mut Vec<f32>,
) {
    let (n, k_dim) = (packed.n, packed.k_dim);
    let yr = YRows::new(y, n);
    let mut b0 = 0;
    while b0 < batch {
        let bn = (batch - b0).min(64);
        let stride = bn.div_ceil(16) * 16;
        transpose_block(x, k_dim, b0, bn, stride, xt);
        let block = Block {
            xt,
            w,
            packed,
            b0,
            bn,
        };
        let run = |rows: Range<usize>| SCRATCH.with(|s| block.rows(rows, yr, &mut s.borrow_mut()));
        if threads > 1 && n >= 12 {
            let chunk = n.div_ceil(threads).next_multiple_of(6);
            (0..n.div_ceil(chunk))
                .into_par_iter()
                .for_each(|c| run(c * chunk..((c + 1) * chunk).min(n)));
        } else {
            run(0..n);
        }
        b0 += bn;
    }
}

/// One block of at most 64 samples, transposed.
struct Block<'a> {
    xt: &'a [f32],
    w: &'a [f32],
    packed: &'a PackedW,
    b0: usize,
    bn: usize,
}

impl Block<'_> {
    /// Rows `rows` of `W` against the block.
    fn rows(&self, rows: Range<usize>, y: YRows<'_>, scratch: &mut GemmScratch) {
        match self.bn.div_ceil(16) {
            1 => self.tiles::<1>(rows, y, scratch),
            2 => self.tiles::<2>(rows, y, scratch),
            3 => self.tiles::<3>(rows, y, scratch),
            _ => self.block_6x64(rows, y, scratch),
        }
    }

    /// Up to 48 samples: the generic micro-kernel over the whole input width.
    fn tiles<const NB: usize>(&self, rows: Range<usize>, y: YRows<'_>, scratch: &mut GemmScratch) {
        let (k_dim, stride) = (self.packed.k_dim, NB * 16);
        let mut tile = [0f32; RMAX * 64];
        let mut o = rows.start;
        while o < rows.end {
            let rn = (rows.end - o).min(RMAX);
            let wp = scratch.rows_ptr(self.w, o, rn, k_dim);
            // SAFETY: AVX-512F is asserted by `gemm`; wp has RMAX rows of k_dim values; xt is
            // k_dim x stride; tile holds RMAX * 64 >= RMAX * stride values.
            unsafe { micro::<RMAX, NB>(wp, k_dim, self.xt.as_ptr(), tile.as_mut_ptr()) };
            y.write_transposed(&tile, rn, self.bn, stride, self.b0, o);
            o += rn;
        }
    }

    /// 49..=64 samples (64 columns of `xt`) through rows `rows` of `W` (`rows.start` a multiple
    /// of six), in blocks of [`KC`] inputs so that the block of `xt` in use stays in L1; partial
    /// sums live in `scratch.acc`.
    fn block_6x64(&self, rows: Range<usize>, y: YRows<'_>, scratch: &mut GemmScratch) {
        let (k_dim, b0, bn) = (self.packed.k_dim, self.b0, self.bn);
        let n_rows = rows.len();
        if n_rows == 0 {
            return;
        }
        assert!(rows.start.is_multiple_of(RMAX) && rows.end <= self.packed.n);
        let (t0, tiles) = (rows.start / RMAX, n_rows.div_ceil(RMAX));
        scratch.acc.resize(tiles * RMAX * 64, 0.0);
        let mut k0 = 0;
        while k0 < k_dim {
            let kc = KC.min(k_dim - k0);
            for t in 0..tiles {
                let wb = self.packed.block(k0, t0 + t);
                // Two blocks ahead in the packed stream (the next tiles'; measured against one
                // block and four, cold: 1.05x and equal).
                let next = wb.as_ptr().wrapping_add(2 * RMAX * kc);
                // SAFETY: AVX-512F (checked by `gemm`); `wb` holds 6 kc weights; xt has k_dim rows
                // of 64, of which rows k0 .. k0 + kc <= k_dim are read; acc has 6 * 64 values per
                // tile; `next` is only prefetched.
                unsafe {
                    micro_6x64(
                        wb.as_ptr(),
                        kc,
                        self.xt.as_ptr().add(k0 * 64),
                        scratch.acc.as_mut_ptr().add(t * RMAX * 64),
                        k0 > 0,
                        next,
                    )
                };
            }
            k0 += kc;
        }
        // acc is [n_rows, 64]: transpose it into columns rows of samples b0 .. b0 + bn of y.
        y.write_transposed(&scratch.acc, n_rows, bn, 64, b0, rows.start);
    }
}

/// The output `[batch, n]`, shared by threads that write disjoint column ranges.
#[derive(Debug, Clone, Copy)]
struct YRows<'a> {
    ptr: *mut f32,
    len: usize,
    n: usize,
    _life: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: threads holding copies write disjoint (row, column) cells (each thread owns a range of
// output columns, see `gemm`), and the borrow of the slice outlives every copy.
unsafe impl Send for YRows<'_> {}
// SAFETY: as above.
unsafe impl Sync for YRows<'_> {}

impl<'a> YRows<'a> {
    fn new(y: &'a mut [f32], n: usize) -> Self {
        YRows {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            n,
            _life: std::marker::PhantomData,
        }
    }

    /// `y[b0 + b][o0 + r] = src[r * src_stride + b]` for `r < rows`, `b < samples`.
    fn write_transposed(
        &self,
        src: &[f32],
        rows: usize,
        samples: usize,
        src_stride: usize,
        b0: usize,
        o0: usize,
    ) {
        if rows == 0 || samples == 0 {
            return;
        }
        assert!(src.len() >= (rows - 1) * src_stride + samples);
        assert!(o0 + rows <= self.n && (b0 + samples - 1) * self.n + o0 + rows <= self.len);
        // SAFETY: AVX-512F (only `gemm` builds YRows, behind `available`); both blocks are in
        // bounds (asserted); the cells written are this caller's (see the Send impl).
        unsafe {
            transpose(
                src.as_ptr(),
                rows,
                samples,
                src_stride,
                self.ptr.add(b0 * self.n + o0),
                self.n,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_matches_the_definition() {
        if !available() {
            eprintln!("no AVX-512: transpose not tested here");
            return;
        }
        for (rows, cols) in [
            (16, 16),
            (1, 1),
            (17, 33),
            (64, 2048 / 8),
            (5, 16),
            (16, 5),
            (48, 31),
        ] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 7.0).collect();
            let mut dst = vec![f32::NAN; cols * (rows + 3)];
            // SAFETY: AVX-512F checked; src is rows x cols, dst cols x (rows + 3).
            unsafe { transpose(src.as_ptr(), rows, cols, cols, dst.as_mut_ptr(), rows + 3) };
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        dst[c * (rows + 3) + r],
                        src[r * cols + c],
                        "{rows}x{cols} at ({r}, {c})"
                    );
                }
            }
            // Padding columns untouched.
            assert!((0..cols).all(|c| dst[c * (rows + 3) + rows].is_nan()));
        }
    }
}
