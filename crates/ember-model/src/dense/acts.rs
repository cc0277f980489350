//! Activations in the kernels' input forms: f32 rows rounded to bf16, or quantized to int8 per
//! row with their scales; rows padded to the packed weights' input width with zeros (zero
//! codes) and to a multiple of 16 rows.

use rayon::prelude::*;

use super::TILE;
use super::driver::round_bf16;

/// `x` (`m` rows of `k` f32 at stride `ldx`) as bf16 rows of `ld` values (inputs past `k` zero)
/// in `dst`, sized to `m` rounded up to 16 rows.
pub fn to_bf16_rows(x: &[f32], m: usize, k: usize, ldx: usize, dst: &mut Vec<u16>, ld: usize) {
    dst.resize(m.next_multiple_of(TILE) * ld, 0);
    let per = rows_per_thread(m);
    if per < m {
        // Rows are independent: split them over the current pool.
        dst[..m * ld]
            .par_chunks_mut(per * ld)
            .enumerate()
            .for_each(|(c, d)| {
                let rows = d.len() / ld;
                to_bf16_seq(&x[c * per * ldx..], (rows, k, ldx), d, ld)
            });
        return;
    }
    to_bf16_seq(x, (m, k, ldx), dst, ld);
}

/// Rows per task when a pass over `m` rows is split over the current rayon pool (`m` itself
/// when it runs on one thread: a pool of one, or too few rows to pay for waking the others).
fn rows_per_thread(m: usize) -> usize {
    let th = rayon::current_num_threads();
    if th > 1 && m >= 64 {
        m.div_ceil(th)
    } else {
        m.max(1)
    }
}

fn to_bf16_seq(x: &[f32], (m, k, ldx): (usize, usize, usize), dst: &mut [u16], ld: usize) {
    #[cfg(target_arch = "x86_64")]
    if ember_embed::Isa::selected().is_ok_and(|i| i == ember_embed::Isa::Avx512) {
        // SAFETY: AVX-512 is available (the embedding stage's check).
        unsafe { to_bf16_avx512(x, (m, k, ldx), dst, ld) };
        return;
    }
    to_bf16_plain(x, (m, k, ldx), dst, ld);
}

/// [`to_bf16_plain`] compiled for AVX-512 (vectorized).
///
/// # Safety
/// The CPU has AVX-512F/BW/VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn to_bf16_avx512(x: &[f32], dims: (usize, usize, usize), dst: &mut [u16], ld: usize) {
    to_bf16_plain(x, dims, dst, ld)
}

#[inline(always)]
fn to_bf16_plain(x: &[f32], (m, k, ldx): (usize, usize, usize), dst: &mut [u16], ld: usize) {
    for r in 0..m {
        let (src, d) = (&x[r * ldx..r * ldx + k], &mut dst[r * ld..(r + 1) * ld]);
        for (o, &v) in d.iter_mut().zip(src) {
            *o = round_bf16(v);
        }
        d[k..].fill(0);
    }
}

/// `m` rows of `k` f32 values, the first at `x[0]`, the next `ld` values on.
#[derive(Debug, Clone, Copy)]
pub struct RowsF32<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub k: usize,
    pub ld: usize,
}

/// How rows are quantized: `unsigned` stores `code + 128` (the VNNI kernel's input); `smooth`,
/// where set, multiplies input `i` by `smooth[i]` first (the inverse of SmoothQuant's scales).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quant<'a> {
    pub unsigned: bool,
    pub smooth: Option<&'a [f32]>,
}

/// `rows` quantized per row as `q` says (`reference::quantize_row`'s codes) into `dst` (rows of
/// `ld` bytes, inputs past `k` zero codes, sized to `m` rounded up to 16 rows), scales into
/// `sx`.
pub fn quantize_rows(
    rows: RowsF32<'_>,
    q: Quant<'_>,
    dst: &mut Vec<u8>,
    ld: usize,
    sx: &mut Vec<f32>,
) {
    let RowsF32 { x, m, k, ld: ldx } = rows;
    split_rows(m, (dst, ld), sx, |first, d, s| {
        let part = RowsF32 {
            x: &x[first * ldx..],
            m: s.len(),
            k,
            ld: ldx,
        };
        quantize_seq(part, q, d, ld, s)
    });
}

/// `dst` sized to `m` rows (rounded up to 16) of `ld` bytes and `sx` to `m` scales, then
/// `run(first row, its rows' bytes, their scales)` on parts of the rows split over the current
/// pool (rows are independent), or on all of them on one thread.
fn split_rows(
    m: usize,
    (dst, ld): (&mut Vec<u8>, usize),
    sx: &mut Vec<f32>,
    run: impl Fn(usize, &mut [u8], &mut [f32]) + Sync,
) {
    dst.resize(m.next_multiple_of(TILE) * ld, 0);
    sx.resize(m, 0.0);
    let per = rows_per_thread(m);
    if per < m {
        dst[..m * ld]
            .par_chunks_mut(per * ld)
            .zip(sx[..m].par_chunks_mut(per))
            .enumerate()
            .for_each(|(c, (d, s))| run(c * per, d, s));
    } else {
        run(0, &mut dst[..m * ld], &mut sx[..m]);
    }
}

/// `m` rows of `k` values quantized as [`quantize_rows`] does, each row written by `fill(row,
/// values)` into a small buffer and quantized from there: rows that never exist whole in memory
/// (a join's parts computed as they are read, `graph/factor.rs`). The same codes and scales as
/// [`quantize_rows`] on the filled rows.
pub fn quantize_filled(
    (m, k): (usize, usize),
    fill: &(dyn Fn(usize, &mut [f32]) + Sync),
    q: Quant<'_>,
    dst: &mut Vec<u8>,
    ld: usize,
    sx: &mut Vec<f32>,
) {
    /// Rows filled at a time: a few KB, in L1 when quantized.
    const STEP: usize = 16;
    split_rows(m, (dst, ld), sx, |first, d, s| {
        let mut buf = vec![0f32; STEP * k];
        for (c, (dc, sc)) in d.chunks_mut(STEP * ld).zip(s.chunks_mut(STEP)).enumerate() {
            let rows = sc.len();
            for (r, row) in buf.chunks_exact_mut(k.max(1)).take(rows).enumerate() {
                fill(first + c * STEP + r, &mut row[..k]);
            }
            let filled = RowsF32 {
                x: &buf,
                m: rows,
                k,
                ld: k,
            };
            quantize_seq(filled, q, dc, ld, sc);
        }
    });
}

fn quantize_seq(rows: RowsF32<'_>, q: Quant<'_>, dst: &mut [u8], ld: usize, sx: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if ember_embed::Isa::selected().is_ok_and(|i| i == ember_embed::Isa::Avx512) {
        // SAFETY: AVX-512 is available (the embedding stage's check).
        unsafe { quantize_avx512(rows, q, dst, ld, sx) };
        return;
    }
    quantize_plain(rows, q, dst, ld, sx);
}

/// [`quantize_plain`] compiled for AVX-512 (vectorized).
///
/// # Safety
/// The CPU has AVX-512F/BW/VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_avx512(
    rows: RowsF32<'_>,
    q: Quant<'_>,
    dst: &mut [u8],
    ld: usize,
    sx: &mut [f32],
) {
    use std::arch::x86_64::*;
    let RowsF32 { x, m, k, ld: ldx } = rows;
    let Quant {
        unsigned,
        smooth: inv_s,
    } = q;
    let bias = if unsigned { 128u8 } else { 0 };
    assert!((m == 0 || x.len() >= (m - 1) * ldx + k) && dst.len() >= m * ld && ld >= k);
    assert!(inv_s.is_none_or(|v| v.len() >= k));
    let ones = [1f32; 16];
    // `1 / s` for inputs `i .. i + 16` (masked), or ones.
    let smooth = |inv: Option<&[f32]>, i: usize, mask: __mmask16| match inv {
        // SAFETY: inv has k values (asserted) and the mask keeps i + lane < k.
        Some(v) => unsafe { _mm512_maskz_loadu_ps(mask, v.as_ptr().add(i)) },
        // SAFETY: 16 values.
        None => unsafe { _mm512_loadu_ps(ones.as_ptr()) },
    };
    for r in 0..m {
        let src = &x[r * ldx..r * ldx + k];
        // SAFETY: every load reads `src[i .. i + 16]` masked to `i + 16 <= k` values, every
        // store writes `d[i ..]` masked likewise; `d` has `ld >= k` bytes (asserted).
        unsafe {
            let mut mx = _mm512_setzero_ps();
            let mut i = 0;
            while i < k {
                let mask = super::lanes(k - i);
                let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
                let v = _mm512_mul_ps(v, smooth(inv_s, i, mask));
                // max(|v|, mx): a NaN value leaves mx as it was, as f32::max does.
                mx = _mm512_max_ps(_mm512_abs_ps(v), mx);
                i += 16;
            }
            let top = _mm512_reduce_max_ps(mx);
            let s = if top > 0.0 && top.is_finite() {
                top / 127.0
            } else {
                1.0
            };
            let inv = _mm512_set1_ps(1.0 / s);
            let d = dst.as_mut_ptr().add(r * ld);
            let (lo, hi, b) = (
                _mm512_set1_epi32(-127),
                _mm512_set1_epi32(127),
                _mm512_set1_epi32(bias as i32),
            );
            let mut i = 0;
            while i < k {
                let mask = super::lanes(k - i);
                let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
                let v = _mm512_mul_ps(v, smooth(inv_s, i, mask));
                // Round to nearest even (the default rounding mode), as `round_ties_even`.
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
                let q = _mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(q, hi), lo), b);
                _mm_mask_storeu_epi8(d.add(i).cast(), mask, _mm512_cvtepi32_epi8(q));
                i += 16;
            }
            std::slice::from_raw_parts_mut(d.add(k), ld - k).fill(bias);
            sx[r] = s;
        }
    }
}

/// The portable quantizer: the reference's codes ([`super::reference::quantize_row`]) of each
/// row (times `1 / s` first when smoothed).
pub(crate) fn quantize_plain(
    rows: RowsF32<'_>,
    q: Quant<'_>,
    dst: &mut [u8],
    ld: usize,
    sx: &mut [f32],
) {
    let RowsF32 { x, m, k, ld: ldx } = rows;
    let Quant { unsigned, smooth } = q;
    let bias = if unsigned { 128u8 } else { 0 };
    let (mut row, mut q) = (vec![0f32; k], vec![0i8; k]);
    for r in 0..m {
        let src = &x[r * ldx..r * ldx + k];
        match smooth {
            Some(v) => row
                .iter_mut()
                .zip(src.iter().zip(v))
                .for_each(|(o, (a, b))| *o = a * b),
            None => row.copy_from_slice(src),
        }
        sx[r] = super::reference::quantize_row(&row, &mut q);
        let d = &mut dst[r * ld..(r + 1) * ld];
        for (o, &c) in d.iter_mut().zip(&q) {
            *o = (c as u8).wrapping_add(bias);
        }
        d[k..].fill(bias);
    }
}

/// Zeroes inputs `k .. ld` of the first `m` rows of a bf16 buffer (what a layer of `k`
/// outputs leaves unwritten in the next layer's padded input).
pub fn zero_pad_bf16(buf: &mut [u16], m: usize, k: usize, ld: usize) {
    if k < ld {
        for r in 0..m {
            buf[r * ld + k..(r + 1) * ld].fill(0);
        }
    }
}
