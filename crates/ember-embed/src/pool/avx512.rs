//! AVX-512 kernels: 16 lanes per register, up to 8 accumulator registers (128 floats) per dim
//! block, masked loads and stores for dims that are not multiples of 16, rows prefetched
//! `prefetch` ids ahead. Checked against `reference.rs` by `tests/pool_props.rs`.
#![cfg(target_arch = "x86_64")]

use super::Segment;
use crate::dtype::DType;
use crate::jagged::RowIndex;
use crate::prefetch::{PrefetchLevel, RowPrefetch};
use std::arch::x86_64::*;

const LANES: usize = 16;
const MAX_REGS: usize = 8;

/// Pools every bag of `s`.
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL, FMA and F16C; every id of `s` must be a row of `s.rows`;
/// `s.out` must point at `nbags` writable rows of `dim` floats that nothing else accesses.
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
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

/// Elements `d0 .. d0 + w` of every bag, with `N = ceil(w / 16)` accumulators, the last of
/// them partial when `T` (`w` not a multiple of 16).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn block<F: Fmt, I: RowIndex, const N: usize, const W: bool, const T: bool>(
    s: &Segment<'_, I>,
    d0: usize,
    w: usize,
) {
    debug_assert_eq!(T, !w.is_multiple_of(LANES));
    // The lanes of the last register: all 16 unless `T`.
    let tail: u16 = if T {
        (1u16 << (w % LANES)) - 1
    } else {
        u16::MAX
    };
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
        let mut acc = [_mm512_setzero_ps(); N];
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
        let scale = _mm512_set1_ps(s.scale(hi - lo));
        let vb = _mm512_set1_ps(bias);
        let out = s.out.row_ptr(bag).wrapping_add(d0);
        for (k, a) in acc.iter().enumerate() {
            let v = _mm512_mul_ps(_mm512_add_ps(*a, vb), scale);
            let m = if k == N - 1 { tail } else { u16::MAX };
            // SAFETY: the masked store writes elements d0+16k .. < d0+w of this unit's row.
            unsafe { _mm512_mask_storeu_ps(out.add(LANES * k), m, v) };
        }
    }
}

/// One row format: how 16 elements are loaded and accumulated.
trait Fmt {
    /// Twice the bytes one element takes (int4: 1).
    const BYTES_X2: usize;
    /// Bytes of scale and bias after the codes.
    const TRAILER: usize;
    /// `acc[k] += wt * row[d0 + 16k ..][..16]`, the last register (`k = N - 1`) masked by
    /// `tail` when `T`, every other load whole; quantized formats add `wt * bias` to `bias`
    /// instead of to every lane.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL + FMA + F16C; `row` points at a full row of this format of `dim` elements.
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        dim: usize,
        d0: usize,
        tail: u16,
        wt: f32,
        acc: &mut [__m512; N],
        bias: &mut f32,
    );
}

/// `a + x`, or `a + wt * x` (`vw` holding `wt`) where the segment carries weights (`W`):
/// unweighted sums add instead of multiplying by 1.
#[inline]
#[target_feature(enable = "avx512f")]
fn accumulate<const W: bool>(a: __m512, x: __m512, vw: __m512) -> __m512 {
    if W {
        _mm512_fmadd_ps(x, vw, a)
    } else {
        _mm512_add_ps(a, x)
    }
}

/// Register `k` of a block of 2-byte elements (f16, bf16) at `p`: 16 of them, or only `tail`'s
/// lanes for the last register when `T`.
///
/// # Safety
/// The lanes read (all 16, or `tail`'s) must be elements of the row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn halves<const N: usize, const T: bool>(p: *const i16, k: usize, tail: u16) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        if T && k == N - 1 {
            _mm256_maskz_loadu_epi16(tail, p.add(LANES * k))
        } else {
            _mm256_loadu_si256(p.add(LANES * k).cast())
        }
    }
}

struct F32;
struct F16;
struct Bf16;
struct Int8;
struct Int4;

impl Fmt for F32 {
    const BYTES_X2: usize = 8;
    const TRAILER: usize = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        _: usize,
        d0: usize,
        tail: u16,
        wt: f32,
        acc: &mut [__m512; N],
        _: &mut f32,
    ) {
        let p = row.cast::<f32>().wrapping_add(d0);
        let vw = _mm512_set1_ps(wt);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: masked lanes stay inside the row's d0..d0+w elements; a whole register
            // reads 16 of them. (A masked load of a whole register cost measurably on AMD Zen.)
            let x = unsafe {
                if T && k == N - 1 {
                    _mm512_maskz_loadu_ps(tail, p.add(LANES * k))
                } else {
                    _mm512_loadu_ps(p.add(LANES * k))
                }
            };
            *a = accumulate::<W>(*a, x, vw);
        }
    }
}

impl Fmt for F16 {
    const BYTES_X2: usize = 4;
    const TRAILER: usize = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        _: usize,
        d0: usize,
        tail: u16,
        wt: f32,
        acc: &mut [__m512; N],
        _: &mut f32,
    ) {
        let p = row.cast::<i16>().wrapping_add(d0);
        let vw = _mm512_set1_ps(wt);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: register k's elements are inside the row (`halves`).
            let h = unsafe { halves::<N, T>(p, k, tail) };
            *a = accumulate::<W>(*a, _mm512_cvtph_ps(h), vw);
        }
    }
}

impl Fmt for Bf16 {
    const BYTES_X2: usize = 4;
    const TRAILER: usize = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        _: usize,
        d0: usize,
        tail: u16,
        wt: f32,
        acc: &mut [__m512; N],
        _: &mut f32,
    ) {
        let p = row.cast::<i16>().wrapping_add(d0);
        let vw = _mm512_set1_ps(wt);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: register k's elements are inside the row (`halves`).
            let h = unsafe { halves::<N, T>(p, k, tail) };
            let x = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
            *a = accumulate::<W>(*a, x, vw);
        }
    }
}

impl Fmt for Int8 {
    const BYTES_X2: usize = 2;
    const TRAILER: usize = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        dim: usize,
        d0: usize,
        tail: u16,
        wt: f32,
        acc: &mut [__m512; N],
        bias: &mut f32,
    ) {
        // SAFETY: an int8 row is `dim` codes followed by f32 scale and f32 bias.
        let (scale, b) = unsafe {
            (
                row.add(dim).cast::<f32>().read_unaligned(),
                row.add(dim + 4).cast::<f32>().read_unaligned(),
            )
        };
        let vs = _mm512_set1_ps(wt * scale);
        *bias += wt * b;
        let p = row.wrapping_add(d0).cast::<i8>();
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: masked lanes stay inside the row's codes; a whole register reads 16.
            let q = unsafe {
                if T && k == N - 1 {
                    _mm_maskz_loadu_epi8(tail, p.add(LANES * k))
                } else {
                    _mm_loadu_si128(p.add(LANES * k).cast())
                }
            };
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), vs, *a);
        }
    }
}

impl Fmt for Int4 {
    const BYTES_X2: usize = 1;
    const TRAILER: usize = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn acc<const N: usize, const W: bool, const T: bool>(
        row: *const u8,
        dim: usize,
        d0: usize,
        tail: u16,
        wt: f32,
        acc: &mut [__m512; N],
        bias: &mut f32,
    ) {
        let nb = dim.div_ceil(2);
        // SAFETY: an int4 row is ceil(dim/2) code bytes followed by f16 scale and f16 bias.
        let (scale, b) = unsafe {
            let sb = row.add(nb).cast::<u32>().read_unaligned();
            let v = _mm_cvtph_ps(_mm_cvtsi32_si128(sb as i32));
            (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v)))
        };
        let vs = _mm512_set1_ps(wt * scale);
        *bias += wt * b;
        let lo_mask = _mm_set1_epi16(0x0F);
        // d0 is a multiple of 16, so register k starts at byte (d0 + 16k) / 2.
        let p = row.wrapping_add(d0 / 2).cast::<i8>();
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: loads only the code bytes of this register's elements (8 for a whole one).
            let packed = unsafe {
                if T && k == N - 1 {
                    let bytes_mask = (1u32 << tail.count_ones().div_ceil(2)) - 1;
                    _mm_maskz_loadu_epi8(bytes_mask as u16, p.add(8 * k))
                } else {
                    _mm_loadl_epi64(p.add(8 * k).cast())
                }
            };
            let w16 = _mm_cvtepu8_epi16(packed);
            let nib = _mm_or_si128(
                _mm_and_si128(w16, lo_mask),
                _mm_slli_epi16::<8>(_mm_srli_epi16::<4>(w16)),
            );
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nib)), vs, *a);
        }
    }
}
