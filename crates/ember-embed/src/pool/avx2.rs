//! AVX2 kernels: 8 lanes per register, up to 8 accumulators (64 floats) per dim block. AVX2 has
//! no byte-masked loads, so the last partial register of a row is copied through a small zeroed
//! stack buffer. Checked against `reference.rs` by `tests/pool_props.rs`.
#![cfg(target_arch = "x86_64")]

use super::Segment;
use crate::dtype::DType;
use crate::jagged::RowIndex;
use crate::prefetch::{PrefetchLevel, RowPrefetch};
use std::arch::x86_64::*;

const LANES: usize = 8;
const MAX_REGS: usize = 8;

/// Pools every bag of `s`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; every id of `s` must be a row of `s.rows`; `s.out` must
/// point at `nbags` writable rows of `dim` floats that nothing else accesses.
pub(crate) unsafe fn pool_segment<I: RowIndex>(s: &Segment<'_, I>) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match s.dtype {
            DType::F32 => run::<F32, I>(s),
            DType::F16 => run::<F16, I>(s),
            DType::BF16 => run::<Bf16, I>(s),
            DType::Int8 => run::<Int8, I>(s),
            DType::Int4 => run::<Int4, I>(s),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<F: Fmt, I: RowIndex>(s: &Segment<'_, I>) {
    let mut d0 = 0;
    while d0 < s.dim {
        let w = (s.dim - d0).min(LANES * MAX_REGS);
        // SAFETY: forwarded from `pool_segment`; `d0 + w <= dim`.
        unsafe {
            dispatch_block!(
                block::<F, I>(s, d0, w),
                w.div_ceil(LANES),
                !w.is_multiple_of(LANES)
            )
        }
        d0 += w;
    }
}

/// Elements `d0 .. d0 + w` of every bag, with `N = ceil(w / 8)` accumulators, the last of them
/// partial when `T` (`w` not a multiple of 8).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<F: Fmt, I: RowIndex, const N: usize, const W: bool, const T: bool>(
    s: &Segment<'_, I>,
    d0: usize,
    w: usize,
) {
    debug_assert_eq!(T, !w.is_multiple_of(LANES));
    let tail = w % LANES;
    let base = s.rows.as_ptr();
    // Lines of a full block: a constant of this instance, so the prefetch unrolls.
    let lines = (N * LANES * F::BYTES_X2).div_ceil(2 * 64);
    let pf = RowPrefetch::new(
        base,
        s.stride,
        F::TRAILER,
        F::BYTES_X2 * d0 / 2,
        (F::BYTES_X2 * w).div_ceil(2),
        lines,
    );
    let (ids, stride, dist) = (s.ids, s.stride, s.prefetch);
    let plain = pf.plain();
    let l2 = PrefetchLevel::selected().is_l2();
    // Ids before `ahead_end` have a row `dist` ids ahead to prefetch; the loop over a bag is cut
    // there, so that neither half tests per id (fewer instructions per row keep more rows'
    // loads in flight).
    let ahead_end = match dist {
        0 => 0,
        d => ids.len().saturating_sub(d),
    };
    for bag in 0..s.nbags() {
        let (lo, hi) = s.bag(bag);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut bias = 0f32;
        let add = |j: usize, acc: &mut _, bias: &mut f32| {
            // SAFETY: lo <= j < hi <= ids.len(), and the id is a row of `rows` (contract).
            let row = unsafe { base.add(ids.get_unchecked(j).idx() * stride) };
            let wt = match s.weights {
                // SAFETY: weights, when present, have one entry per id.
                Some(ws) if W => unsafe { *ws.get_unchecked(j) },
                _ => 1.0,
            };
            // SAFETY: `row` starts a full row; F reads only elements d0..d0+w and the trailer.
            unsafe { F::acc::<N, W, T>(row, s.dim, d0, tail, wt, acc, bias) };
        };
        let mid = hi.min(ahead_end).max(lo);
        // mid <= ahead_end: j + dist < ids.len() throughout.
        prefetch_ahead!(
            pf,
            plain,
            l2,
            lines,
            (ids, dist, base, stride),
            lo..mid,
            |j| { add(j, &mut acc, &mut bias) }
        );
        for j in mid..hi {
            add(j, &mut acc, &mut bias);
        }
        let scale = _mm256_set1_ps(s.scale(hi - lo));
        let vb = _mm256_set1_ps(bias);
        let out = s.out.row_ptr(bag).wrapping_add(d0);
        for (k, a) in acc.iter().enumerate() {
            let v = _mm256_mul_ps(_mm256_add_ps(*a, vb), scale);
            if T && k == N - 1 {
                let mut tmp = [0f32; LANES];
                // SAFETY: `tmp` holds 8 floats.
                unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), v) };
                // SAFETY: writes the `tail` last elements of this block of this unit's row.
                unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), out.add(LANES * k), tail) };
            } else {
                // SAFETY: writes elements d0+8k .. d0+8k+8 <= d0+w of this unit's row.
                unsafe { _mm256_storeu_ps(out.add(LANES * k), v) };
            }
        }
    }
}

/// Copies `n` bytes from `p` into a zeroed 32-byte buffer.
///
/// # Safety
/// `p` must be readable for `n <= 32` bytes.
#[inline(always)]
unsafe fn partial(p: *const u8, n: usize) -> [u8; 32] {
    let mut b = [0u8; 32];
    // SAFETY: caller's contract; `n <= 32`.
    unsafe { std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), n) };
    b
}

/// One row format.
trait Fmt {
    /// Twice the bytes one element takes (int4: 1).
    const BYTES_X2: usize;
    /// Bytes of scale and bias after the codes.
    const TRAILER: usize;
    /// `acc[k] += wt * row[d0 + 8k ..][..8]`; the last register holds `tail` elements when `T`.
    /// Quantized formats add `wt * bias` to `bias`.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C; `row` points at a full row of this format of `dim` elements.
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        dim: usize,
        d0: usize,
        tail: usize,
        wt: f32,
        acc: &mut [__m256; N],
        bias: &mut f32,
    );
}

/// `a + x`, or `a + wt * x` (`vw` holding `wt`) where the segment carries weights (`W`):
/// unweighted sums add instead of multiplying by 1.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn accumulate<const W: bool>(a: __m256, x: __m256, vw: __m256) -> __m256 {
    if W {
        _mm256_fmadd_ps(x, vw, a)
    } else {
        _mm256_add_ps(a, x)
    }
}

struct F32;
struct F16;
struct Bf16;
struct Int8;
struct Int4;

/// Loads register `k` of a block: all 8 lanes, or where `T` and `k` is the last register, `tail`
/// elements of `bytes_x2 / 2` bytes each through a stack buffer; `load` turns 8 elements' bytes
/// into lanes.
///
/// # Safety
/// The bytes of the register's elements must be readable.
#[inline(always)]
unsafe fn lanes<const N: usize, const T: bool>(
    p: *const u8,
    k: usize,
    tail: usize,
    bytes_x2: usize,
    load: impl Fn(*const u8) -> __m256,
) -> __m256 {
    let at = p.wrapping_add(k * LANES * bytes_x2 / 2);
    if T && k == N - 1 {
        // SAFETY: the tail's bytes belong to the row (caller's contract).
        let b = unsafe { partial(at, (tail * bytes_x2).div_ceil(2)) };
        load(b.as_ptr())
    } else {
        load(at)
    }
}

impl Fmt for F32 {
    const BYTES_X2: usize = 8;
    const TRAILER: usize = 0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        _: usize,
        d0: usize,
        tail: usize,
        wt: f32,
        acc: &mut [__m256; N],
        _: &mut f32,
    ) {
        let p = row.wrapping_add(4 * d0);
        let vw = _mm256_set1_ps(wt);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads this register's elements of the row (or a zero-padded copy).
            let x = unsafe { lanes::<N, T>(p, k, tail, 8, |q| _mm256_loadu_ps(q.cast())) };
            *a = accumulate::<W>(*a, x, vw);
        }
    }
}

impl Fmt for F16 {
    const BYTES_X2: usize = 4;
    const TRAILER: usize = 0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        _: usize,
        d0: usize,
        tail: usize,
        wt: f32,
        acc: &mut [__m256; N],
        _: &mut f32,
    ) {
        let p = row.wrapping_add(2 * d0);
        let vw = _mm256_set1_ps(wt);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads this register's elements of the row (or a zero-padded copy).
            let x = unsafe {
                lanes::<N, T>(p, k, tail, 4, |q| {
                    _mm256_cvtph_ps(_mm_loadu_si128(q.cast()))
                })
            };
            *a = accumulate::<W>(*a, x, vw);
        }
    }
}

impl Fmt for Bf16 {
    const BYTES_X2: usize = 4;
    const TRAILER: usize = 0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        _: usize,
        d0: usize,
        tail: usize,
        wt: f32,
        acc: &mut [__m256; N],
        _: &mut f32,
    ) {
        let p = row.wrapping_add(2 * d0);
        let vw = _mm256_set1_ps(wt);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads this register's elements of the row (or a zero-padded copy).
            let x = unsafe {
                lanes::<N, T>(p, k, tail, 4, |q| {
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                        _mm_loadu_si128(q.cast()),
                    )))
                })
            };
            *a = accumulate::<W>(*a, x, vw);
        }
    }
}

impl Fmt for Int8 {
    const BYTES_X2: usize = 2;
    const TRAILER: usize = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        dim: usize,
        d0: usize,
        tail: usize,
        wt: f32,
        acc: &mut [__m256; N],
        bias: &mut f32,
    ) {
        // SAFETY: an int8 row is `dim` codes followed by f32 scale and f32 bias.
        let (scale, b) = unsafe {
            (
                row.add(dim).cast::<f32>().read_unaligned(),
                row.add(dim + 4).cast::<f32>().read_unaligned(),
            )
        };
        let vs = _mm256_set1_ps(wt * scale);
        *bias += wt * b;
        let p = row.wrapping_add(d0);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads this register's codes (or a zero-padded copy).
            let x = unsafe {
                lanes::<N, T>(p, k, tail, 2, |q| {
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(q.cast())))
                })
            };
            *a = _mm256_fmadd_ps(x, vs, *a);
        }
    }
}

impl Fmt for Int4 {
    const BYTES_X2: usize = 1;
    const TRAILER: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        dim: usize,
        d0: usize,
        tail: usize,
        wt: f32,
        acc: &mut [__m256; N],
        bias: &mut f32,
    ) {
        let nb = dim.div_ceil(2);
        // SAFETY: an int4 row is ceil(dim/2) code bytes followed by f16 scale and f16 bias.
        let (scale, b) = unsafe {
            let sb = row.add(nb).cast::<u32>().read_unaligned();
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(sb as i32));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v)))
        };
        let vs = _mm256_set1_ps(wt * scale);
        *bias += wt * b;
        let lo_mask = _mm_set1_epi16(0x0F);
        let p = row.wrapping_add(d0 / 2);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads this register's 4 code bytes (or a zero-padded copy).
            let x = unsafe {
                lanes::<N, T>(p, k, tail, 1, |q| {
                    let w16 =
                        _mm_cvtepu8_epi16(_mm_cvtsi32_si128(q.cast::<i32>().read_unaligned()));
                    let nib = _mm_or_si128(
                        _mm_and_si128(w16, lo_mask),
                        _mm_slli_epi16::<8>(_mm_srli_epi16::<4>(w16)),
                    );
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib))
                })
            };
            *a = _mm256_fmadd_ps(x, vs, *a);
        }
    }
}
