//! The ceiling loop in AVX-512 and AVX2, one instance per row size in cache lines (1 to 8) and
//! per whether the last line is partial, so that loads and prefetches unroll and nothing but the
//! rows' bytes is read.

use super::{Job, RowIndex};
use ember_embed::Isa;
use std::arch::x86_64::*;

/// Widest row (bytes) the unrolled loops take; wider rows run the portable loop.
pub(crate) const MAX_BYTES: usize = 8 * 64;

/// Runs the loop for `isa`, or `None` where it has no SIMD loop for these rows.
pub(super) fn gather<I: RowIndex>(isa: Isa, j: &Job<'_, I>) -> Option<u64> {
    if j.stride == 0 || j.stride > MAX_BYTES || isa == Isa::Scalar || !isa.available() {
        return None;
    }
    macro_rules! pick {
        ($f:ident) => {
            // SAFETY: the ISA is available (checked above); `Ceiling::gather` asserted every id
            // is a row of `rows` and the bags cover `ids` in order; the instance's line count and
            // tail flag match the stride.
            unsafe {
                match (j.stride.div_ceil(64), j.stride % 64 != 0) {
                    (1, false) => $f::<I, 1, false>(j),
                    (1, true) => $f::<I, 1, true>(j),
                    (2, false) => $f::<I, 2, false>(j),
                    (2, true) => $f::<I, 2, true>(j),
                    (3, false) => $f::<I, 3, false>(j),
                    (3, true) => $f::<I, 3, true>(j),
                    (4, false) => $f::<I, 4, false>(j),
                    (4, true) => $f::<I, 4, true>(j),
                    (5, false) => $f::<I, 5, false>(j),
                    (5, true) => $f::<I, 5, true>(j),
                    (6, false) => $f::<I, 6, false>(j),
                    (6, true) => $f::<I, 6, true>(j),
                    (7, false) => $f::<I, 7, false>(j),
                    (7, true) => $f::<I, 7, true>(j),
                    (8, false) => $f::<I, 8, false>(j),
                    _ => $f::<I, 8, true>(j),
                }
            }
        };
    }
    Some(match isa {
        Isa::Avx512 => pick!(bags_avx512),
        _ => pick!(bags_avx2),
    })
}

/// Sums the rows of one bag with `$add!(k)` in two loops: ids before `$split` first prefetch
/// the row `pf` ids ahead (with the rows' alignment and the cache level, `j.l2`, dispatched
/// once, not tested per row), the rest do not, so no id pays a test for either.
macro_rules! walk_bag {
    ($add:ident, $j:expr, $span:expr, $split:expr, $l:ident,
     ($base:expr, $stride:expr, $pf:expr, $unaligned:expr)) => {
        match ($unaligned, $j.l2) {
            (true, false) => walk_bag!(@ahead $add, $j, $span, $split, $l, ($base, $stride, $pf), true, false),
            (true, true) => walk_bag!(@ahead $add, $j, $span, $split, $l, ($base, $stride, $pf), true, true),
            (false, false) => walk_bag!(@ahead $add, $j, $span, $split, $l, ($base, $stride, $pf), false, false),
            (false, true) => walk_bag!(@ahead $add, $j, $span, $split, $l, ($base, $stride, $pf), false, true),
        }
        for k in $split..$span.end {
            $add!(k);
        }
    };
    (@ahead $add:ident, $j:expr, $span:expr, $split:expr, $l:ident,
     ($base:expr, $stride:expr, $pf:expr), $unaligned:literal, $l2:literal) => {
        for k in $span.start..$split {
            // SAFETY: k < ahead_end = n - pf.
            let id = unsafe { $j.ids.get_unchecked(k + $pf) }.idx();
            prefetch_row::<$l, $l2>($base.wrapping_add(id * $stride), $stride, $unaligned);
            $add!(k);
        }
    };
}

/// Prefetches the line at `p` into L2 (`prefetcht1`) when `L2`, else into L1.
#[inline(always)]
fn prefetch<const L2: bool>(p: *const u8) {
    // SAFETY: prefetch is a hint; it does not fault on any address (Intel SDM, PREFETCHh).
    unsafe {
        if L2 {
            _mm_prefetch::<_MM_HINT_T1>(p.cast())
        } else {
            _mm_prefetch::<_MM_HINT_T0>(p.cast())
        }
    };
}

/// Prefetches the `L` lines of the row at `r`, and the line of its last byte when rows do not
/// start lines (`unaligned`).
#[inline(always)]
fn prefetch_row<const L: usize, const L2: bool>(r: *const u8, stride: usize, unaligned: bool) {
    for i in 0..L {
        prefetch::<L2>(r.wrapping_add(64 * i));
    }
    if unaligned {
        prefetch::<L2>(r.wrapping_add(stride - 1));
    }
}

/// # Safety
/// AVX-512 F/BW; every id a row of `j.rows`; `j.bags` ascending from `j.first` to
/// `j.first + j.ids.len()`;
/// `L == ceil(stride / 64)`, `TAIL == (stride % 64 != 0)`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bags_avx512<I: RowIndex, const L: usize, const TAIL: bool>(j: &Job<'_, I>) -> u64 {
    let base = j.rows.as_ptr();
    let (n, stride, pf) = (j.ids.len(), j.stride, j.prefetch);
    let unaligned = !(base as usize).is_multiple_of(64) || TAIL;
    let tail_mask: u64 = if TAIL {
        (1u64 << (stride % 64)) - 1
    } else {
        u64::MAX
    };
    // Rows of 64 bytes or more read their partial last line as the 64 bytes that end the row, a
    // plain load, with the bytes of the line before zeroed (a masked load measured slower than
    // Ember's int8 kernel on AMD Zen); shorter rows take the masked load.
    let overlap = TAIL && stride >= 64;
    let keep = _mm512_movm_epi8(match stride % 64 {
        0 => u64::MAX,
        t => !((1u64 << (64 - t)) - 1),
    });
    // Ids before `ahead_end` prefetch the row `pf` ids ahead; a bag is cut there, and each part
    // runs a loop of its own, as is the alignment of rows (so no id pays a test for either:
    // fewer instructions per row keep more rows' loads in flight).
    let ahead_end = if pf > 0 { n.saturating_sub(pf) } else { 0 };
    let mut total = 0u64;
    for b in j.bags.windows(2) {
        let mut acc = [_mm512_setzero_si512(); L];
        let span = j.span(b);
        let split = span.end.min(ahead_end).max(span.start);
        macro_rules! add_row {
            ($k:expr) => {{
                // SAFETY: k < n (bags end at n), and the id is a row (contract).
                let r = unsafe { base.add(j.ids.get_unchecked($k).idx() * stride) };
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: line i of the row; a partial last line loads only the row's bytes
                    // (the 64 ending the row when it has that many, else masked).
                    let v = unsafe {
                        if TAIL && i == L - 1 && overlap {
                            let last = _mm512_loadu_si512(r.add(stride - 64).cast());
                            _mm512_and_si512(last, keep)
                        } else if TAIL && i == L - 1 {
                            _mm512_maskz_loadu_epi8(tail_mask, r.add(64 * i).cast())
                        } else {
                            _mm512_loadu_si512(r.add(64 * i).cast())
                        }
                    };
                    *a = _mm512_add_epi32(*a, v);
                }
            }};
        }
        walk_bag!(add_row, j, span, split, L, (base, stride, pf, unaligned));
        let mut s = acc[0];
        for a in &acc[1..] {
            s = _mm512_add_epi32(s, *a);
        }
        total = total.wrapping_add(u64::from(_mm512_reduce_add_epi32(s) as u32));
    }
    total
}

/// # Safety
/// AVX2; as [`bags_avx512`] otherwise.
#[target_feature(enable = "avx2")]
unsafe fn bags_avx2<I: RowIndex, const L: usize, const TAIL: bool>(j: &Job<'_, I>) -> u64 {
    let base = j.rows.as_ptr();
    let (n, stride, pf) = (j.ids.len(), j.stride, j.prefetch);
    let unaligned = !(base as usize).is_multiple_of(64) || TAIL;
    let tail = Avx2Tail::new(stride);
    // Rows of 64 bytes or more read their partial last line as the 64 bytes ending the row
    // (`Avx2Tail::keep_lo`, `keep_hi`).
    let overlap = TAIL && stride >= 64;
    let full = if TAIL { L - 1 } else { L };
    // As in the AVX-512 loop: a bag is cut where prefetching ends, and the alignment of rows is
    // dispatched once, so that no id pays a test for either.
    let ahead_end = if pf > 0 { n.saturating_sub(pf) } else { 0 };
    let mut total = 0u64;
    for b in j.bags.windows(2) {
        // One accumulator per half line: each load is added once (memory operand), with no
        // chain of two adds per line.
        let mut acc = [_mm256_setzero_si256(); L];
        let mut acc_hi = [_mm256_setzero_si256(); L];
        let mut odd = 0u32;
        let span = j.span(b);
        let split = span.end.min(ahead_end).max(span.start);
        macro_rules! add_row {
            ($k:expr) => {{
                // SAFETY: k < n (bags end at n), and the id is a row (contract).
                let r = unsafe { base.add(j.ids.get_unchecked($k).idx() * stride) };
                for i in 0..full {
                    // SAFETY: line i is a full line of the row.
                    let (lo, hi) = unsafe {
                        (
                            _mm256_loadu_si256(r.add(64 * i).cast()),
                            _mm256_loadu_si256(r.add(64 * i + 32).cast()),
                        )
                    };
                    acc[i] = _mm256_add_epi32(acc[i], lo);
                    acc_hi[i] = _mm256_add_epi32(acc_hi[i], hi);
                }
                if overlap {
                    let end = r.wrapping_add(stride - 64);
                    // SAFETY: the row's last 64 bytes (stride >= 64).
                    let (lo, hi) = unsafe {
                        (
                            _mm256_loadu_si256(end.cast()),
                            _mm256_loadu_si256(end.add(32).cast()),
                        )
                    };
                    let a = &mut acc[L - 1];
                    *a = _mm256_add_epi32(*a, _mm256_and_si256(lo, tail.keep_lo));
                    *a = _mm256_add_epi32(*a, _mm256_and_si256(hi, tail.keep_hi));
                } else if TAIL {
                    let mut p = r.wrapping_add(64 * (L - 1));
                    let a = &mut acc[L - 1];
                    if tail.half {
                        // SAFETY: the row has 32 more bytes at `p`.
                        *a = _mm256_add_epi32(*a, unsafe { _mm256_loadu_si256(p.cast()) });
                        p = p.wrapping_add(32);
                    }
                    // SAFETY: the mask selects the `tail.words` whole words left in the row.
                    let w = unsafe { _mm256_maskload_epi32(p.cast(), tail.mask) };
                    *a = _mm256_add_epi32(*a, w);
                    if tail.bytes > 0 {
                        let mut last = [0u8; 4];
                        // SAFETY: the row's last `tail.bytes` bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                p.add(4 * tail.words as usize),
                                last.as_mut_ptr(),
                                tail.bytes,
                            )
                        };
                        odd = odd.wrapping_add(u32::from_le_bytes(last));
                    }
                }
            }};
        }
        walk_bag!(add_row, j, span, split, L, (base, stride, pf, unaligned));
        let bag = lane_sum_avx2(&acc, &acc_hi).wrapping_add(odd);
        total = total.wrapping_add(u64::from(bag));
    }
    total
}

/// How the AVX2 loop reads the partial last line of rows of `stride` bytes (`stride % 64`
/// bytes, when not 0), set up once per call: a full 32-byte half if it reaches that far, then
/// whole words by a masked load (no fault on masked-off words), then 1-3 bytes by hand; rows
/// of 64 bytes or more instead load the 64 bytes ending the row, two plain loads, with the
/// bytes before the partial line zeroed (as in the AVX-512 loop).
#[derive(Clone, Copy)]
struct Avx2Tail {
    /// The partial line starts with a full 32-byte half.
    half: bool,
    /// Whole 4-byte words after that half, and the mask that selects them.
    words: i32,
    mask: __m256i,
    /// Bytes after those words (0 to 3).
    bytes: usize,
    /// Of the 64 bytes ending a row (low and high halves), the bytes of its partial line.
    keep_lo: __m256i,
    keep_hi: __m256i,
}

impl Avx2Tail {
    /// The tail of rows of `stride` bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn new(stride: usize) -> Avx2Tail {
        let t = stride % 64;
        let (half, rest) = if t >= 32 { (true, t - 32) } else { (false, t) };
        let words = (rest / 4) as i32;
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(words),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let first_kept = _mm256_set1_epi8((63 - t) as i8);
        let idx = _mm256_setr_epi8(
            0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29, 30, 31,
        );
        Avx2Tail {
            half,
            words,
            mask,
            bytes: rest % 4,
            keep_lo: _mm256_cmpgt_epi8(idx, first_kept),
            keep_hi: _mm256_cmpgt_epi8(_mm256_add_epi8(idx, _mm256_set1_epi8(32)), first_kept),
        }
    }
}

/// The wrapping sum of the 32-bit lanes of a bag's accumulators, `acc` and `acc_hi`.
#[target_feature(enable = "avx2")]
#[inline]
fn lane_sum_avx2<const L: usize>(acc: &[__m256i; L], acc_hi: &[__m256i; L]) -> u32 {
    let mut s = acc[0];
    for a in acc[1..].iter().chain(acc_hi) {
        s = _mm256_add_epi32(s, *a);
    }
    let h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
    let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h));
    _mm_cvtsi128_si32(h) as u32
}
