//! Block kernels on AVX-512 for CPUs without AMX: `vdpbf16ps` (AVX512_BF16) for bf16,
//! `vpdpbusd` (AVX512_VNNI) for int8, and a bf16 kernel on plain f32 FMAs (AVX-512F).
//!
//! A packed 64-byte weight row ([`super::pack`]) is one zmm register: for bf16, 16 outputs x 2
//! inputs; for int8, 16 outputs x 4 inputs. Multiplied by the same pair (quad) of one row's
//! inputs broadcast to the 16 lanes, it adds that step to 16 sums of the row, one output per
//! lane. A pass keeps `R` rows x `NT` output tiles of 16 sums in registers (16 accumulators:
//! 8 rows x 2 tiles, or 16 rows x 1 tile), loads the `NT` weight registers of an input step once
//! and broadcasts each row's step once (`vbroadcastss` from memory, a load-port uop), so a step
//! is `NT` weight loads, `R` broadcasts and `R NT` dot products. A block (32 rows) takes
//! `32 / R` passes over the same weights.
//!
//! The inputs are cut in chunks ([`KC`], [`KC_FMA`]) and every pass of a block runs on one
//! chunk before the next, adding to the sums kept in `out`, so that the passes after the first
//! read the chunk's weights and inputs from L1 instead of streaming them again from L2.
//!
//! Measured on one core of this Sapphire Rapids machine (a timing loop during development: M =
//! 256, layers 512 x 3456 and 3456 x 512, blocks of 32 x 32 in the driver's order, on thread
//! CPU time):
//! - int8 [`block_i8`]: 690-705 / 720-736 GOP/s, 90-96% of `vpdpbusd`'s peak (two a cycle,
//!   measured 0.167 ns apart: 767 GOP/s).
//! - bf16 [`block_bf16`]: 87 GFLOP/s on both layers, 98% of what `vdpbf16ps` gives on this
//!   core: one every 2.15 cycles (0.716 ns; latency 8 cycles), not two a cycle, so 89 GFLOP/s
//!   at most.
//! - bf16 [`block_bf16_fma`]: 125-128 / 120-124 GFLOP/s (1.4x), 70% of the f32 FMA peak (two a
//!   cycle, 178 GFLOP/s). It needs AVX-512F only. The products of two bf16 values are exact in
//!   f32 and it adds them input by input, so its sums are bit for bit those of
//!   [`super::emulated`].
//!
//! Other register blockings of the dot-product kernels, same layers: two passes of 16 rows x 1
//! tile instead of 8 x 2 (a broadcast per dot product instead of per two): int8 572 / 601,
//! bf16 85.5; passes of 4 rows x 2 tiles (8 accumulators, too few to cover the latency): int8
//! 413 / 456, bf16 83.
//!
//! So on Intel cores the FMA kernel is the faster bf16 one. On AMD Zen 4, where a zmm
//! `vdpbf16ps` (64 flops) should issue as often as a zmm FMA (32 flops), [`block_bf16`] should
//! be the faster (not measured: no such machine here).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::pack::{PackedBf16, PackedI8};
use super::{ActsBf16, ActsI8, Block, TILE, Tiles};

/// Inputs per chunk of the dot-product kernels (a multiple of 64, the int8 tile step): a chunk
/// of a block is 16 KiB of int8 weights and 16 KiB of inputs (32 KiB each for bf16). Measured
/// (GOP/s on the 512 x 3456 / 3456 x 512 layers): int8 with chunks of 64: 605-621 / 619-623,
/// 128: 657-667 / 677-685, 256: 673-700 / 695-720, 512: 691-705 / 721-736, none: 626-724 /
/// 712-736 (the wide layer's runs vary most without chunks); bf16 86.5-87.8 for all (bound by
/// `vdpbf16ps`).
const KC: usize = 512;

/// Inputs per chunk of [`block_bf16_fma`] (a multiple of 32): the chunk's inputs widened to f32
/// (32 rows, 16 KiB) and its weights (8 KiB) stay in L1. Measured (GFLOP/s, same layers): 64:
/// 125 / 124, 128: 126 / 123, 256: 114 / 116.
const KC_FMA: usize = 128;

/// 16 sums (f32, or i32 as bits).
type Acc = __m512;

/// How a block's packed weights are laid out and walked: `kp` padded inputs, `g` inputs per
/// step (2 for bf16, 4 for int8), chunks of `kc_max` inputs, output tiles `wstride` bytes apart.
#[derive(Clone, Copy)]
struct Walk {
    kp: usize,
    g: usize,
    kc_max: usize,
    wstride: usize,
}

/// `vdpbf16ps` on bit patterns.
///
/// # Safety
/// The CPU supports AVX512_BF16 (and F).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn dp_bf16(acc: Acc, x: __m512i, w: __m512i) -> Acc {
    // SAFETY: `__m512i` and `__m512bh` are both 64-byte vectors of plain bits; any pattern is a
    // valid value of either.
    let (x, w) = unsafe {
        (
            std::mem::transmute::<__m512i, __m512bh>(x),
            std::mem::transmute::<__m512i, __m512bh>(w),
        )
    };
    _mm512_dpbf16_ps(acc, x, w)
}

/// `vpdpbusd`: unsigned bytes of `x` times signed bytes of `w`, four to a lane, added to the
/// lane's i32 sum (kept as the bits of `acc`).
///
/// # Safety
/// The CPU supports AVX512_VNNI (and F).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dp_u8i8(acc: Acc, x: __m512i, w: __m512i) -> Acc {
    _mm512_castsi512_ps(_mm512_dpbusd_epi32(_mm512_castps_si512(acc), x, w))
}

/// One pass of a block: rows `0 .. R` from `a` (row `r` at `a + r lda` elements of `T`) against
/// `NT` weight tiles (tile `j` at `w[j]`), over `steps` input steps of 64 bytes of weights and
/// 4 bytes of each row; adds `dp(acc, broadcast(row step), weights)`. Writes the sums of row
/// `r`, tile `j` to `out[j][r * 16 ..]`, adding them to what is there when `accumulate`.
///
/// The accumulators are an array indexed by constants only (the loops over `R` and `NT` are
/// unrolled), which LLVM keeps in registers (checked in the disassembly): 16 of them, `NT`
/// weights and a broadcast.
///
/// # Safety
/// The CPU runs `dp`'s instructions (the caller's target features include them); each of the
/// `R` rows has `4 steps` readable bytes from `a`, each `w[j]` has `64 steps` readable bytes,
/// each `out[j]` has room for `16 R` sums.
#[inline(always)]
unsafe fn pass<T, const R: usize, const NT: usize>(
    a: *const T,
    lda: usize,
    w: [*const u8; NT],
    steps: usize,
    out: [*mut f32; NT],
    accumulate: bool,
    dp: impl Fn(Acc, __m512i, __m512i) -> Acc,
) {
    // SAFETY: for the whole body: target features are the caller's; reads and writes stay within
    // the ranges the caller guarantees (row r: bytes 4 s .. 4 s + 4 for s < steps; weights:
    // bytes 64 s .. 64 s + 64; out: 16 sums per row).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NT]; R];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(out[j].add(r * TILE));
                }
            }
        }
        let rows: [*const u8; R] = std::array::from_fn(|r| a.add(r * lda) as *const u8);
        for s in 0..steps {
            let wv: [__m512i; NT] =
                std::array::from_fn(|j| _mm512_loadu_si512(w[j].add(s * 64) as *const __m512i));
            for r in 0..R {
                let x = _mm512_set1_epi32((rows[r].add(s * 4) as *const i32).read_unaligned());
                for j in 0..NT {
                    acc[r][j] = dp(acc[r][j], x, wv[j]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                _mm512_storeu_ps(out[j].add(r * TILE), *v);
            }
        }
    }
}

/// Runs a block (`mt` x `NT` tiles) as passes of `R` rows x `NT` tiles over chunks of the
/// inputs. `a` is the block's first row, `w` the first tile's weights, laid out as `walk` says.
///
/// # Safety
/// As [`pass`], for all `16 mt` rows and `NT` tiles over `kp` inputs; `R` divides 16, `kc_max`
/// and `kp` are multiples of `g`.
#[inline(always)]
unsafe fn block<T, const R: usize, const NT: usize>(
    a: *const T,
    lda: usize,
    mt: usize,
    w: *const u8,
    walk: Walk,
    out: &mut Tiles,
    dp: impl Fn(Acc, __m512i, __m512i) -> Acc + Copy,
) {
    let Walk {
        kp,
        g,
        kc_max,
        wstride,
    } = walk;
    let mut k0 = 0;
    while k0 < kp {
        let kc = kc_max.min(kp - k0);
        for i in 0..mt {
            for r0 in (0..TILE).step_by(R) {
                // SAFETY: rows 16 i + r0 .. + R of the block, inputs k0 .. k0 + kc, tiles j < NT
                // from step k0 / g: within the ranges the caller guarantees; tile (i, j) of `out`
                // has 256 sums, rows r0 .. r0 + R of it are the 16 R from `16 r0`.
                unsafe {
                    let wj: [*const u8; NT] =
                        std::array::from_fn(|j| w.add(j * wstride + k0 / g * 64));
                    let oj: [*mut f32; NT] =
                        std::array::from_fn(|j| out[i * 2 + j].as_mut_ptr().add(r0 * TILE));
                    let rows = a.add((i * TILE + r0) * lda + k0);
                    pass::<T, R, NT>(rows, lda, wj, kc / g, oj, k0 > 0, dp);
                }
            }
        }
        k0 += kc;
    }
}

/// The bf16 block kernel ([`super::BlockBf16`]) on `vdpbf16ps`: raw f32 sums of rows `m0 ..
/// m0 + 16 mt` of `a` times output tiles `nb .. nb + nt` of `w`.
///
/// `vdpbf16ps` adds both products of a pair to the sum in one step, with denormal inputs and
/// results flushed to zero, so sums differ from the emulation's in the last bits.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VL and BF16; `a` has `16 mt` readable rows of `w.kp()` values
/// from row `m0` (as [`super::BlockBf16`]). Panics unless `mt`, `nt` are 1 or 2 and `nb + nt <=
/// w.blocks()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn block_bf16(a: ActsBf16, w: &PackedBf16, at: Block, out: &mut Tiles) {
    // SAFETY: the caller's contract, and this function's target features.
    unsafe { bf16_dp(a, w, at, out, KC) }
}

/// [`block_bf16`] with chunks of `kc_max` inputs (a multiple of 32).
///
/// # Safety
/// As [`block_bf16`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn bf16_dp(a: ActsBf16, w: &PackedBf16, at: Block, out: &mut Tiles, kc_max: usize) {
    at.check(w.blocks());
    let Block { m0, mt, nb, nt } = at;
    let kp = w.kp();
    let wp = w.block(nb).as_ptr() as *const u8;
    let wstride = TILE * kp * 2;
    let dp = |acc, x, w| {
        // SAFETY: this kernel's target features include AVX512_BF16.
        unsafe { dp_bf16(acc, x, w) }
    };
    // SAFETY: the caller guarantees the rows; the weights of tiles nb .. nb + nt are `w`'s
    // (checked above), `kp * 2` bytes per output, tiles `wstride` bytes apart.
    unsafe {
        let ap = a.ptr.add(m0 * a.lda);
        let walk = Walk {
            kp,
            g: 2,
            kc_max,
            wstride,
        };
        if nt == 2 {
            block::<u16, 8, 2>(ap, a.lda, mt, wp, walk, out, dp);
        } else {
            block::<u16, 16, 1>(ap, a.lda, mt, wp, walk, out, dp);
        }
    }
}

/// The bf16 block kernel ([`super::BlockBf16`]) on f32 FMAs (AVX-512F only): the sums of
/// [`block_bf16`], computed as [`super::emulated::block_bf16`] does (bit for bit the same).
///
/// Per chunk of [`KC_FMA`] inputs, the block's rows are widened to f32 into a stack buffer
/// (16 KiB); a pass of `R` rows x `NT` tiles then, per pair of inputs, splits each of the `NT`
/// packed weight rows into the f32 weights of the even and odd input (a shift and a mask) and
/// runs `2 R NT` FMAs with the rows' inputs broadcast from the buffer: first the even input's
/// FMAs of every row, then the odd one's, so that the two FMAs of an accumulator are not
/// back to back (measured 2-3% faster than pairing them). The weight split costs 2 operations
/// per `2 R` FMAs; splitting the chunk's weights once into a second buffer instead was slower
/// (measured 104-118 GFLOP/s against 123-126).
///
/// # Safety
/// The CPU supports AVX-512F; `a` has `16 mt` readable rows of `w.kp()` values from row `m0` (as
/// [`super::BlockBf16`]). Panics unless `mt`, `nt` are 1 or 2 and `nb + nt <= w.blocks()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn block_bf16_fma(a: ActsBf16, w: &PackedBf16, at: Block, out: &mut Tiles) {
    // SAFETY: the caller's contract, and this function's target features.
    unsafe { bf16_fma(a, w, at, out, KC_FMA) }
}

/// [`block_bf16_fma`] with chunks of `kc_max` inputs (a multiple of 32, at most
/// [`KC_FMA`]).
///
/// # Safety
/// As [`block_bf16_fma`].
#[target_feature(enable = "avx512f")]
unsafe fn bf16_fma(a: ActsBf16, w: &PackedBf16, at: Block, out: &mut Tiles, kc_max: usize) {
    at.check(w.blocks());
    let Block { m0, mt, nb, nt } = at;
    assert!(kc_max <= KC_FMA && kc_max.is_multiple_of(32));
    let kp = w.kp();
    let wp = w.block(nb).as_ptr() as *const u8;
    let wstride = TILE * kp * 2;
    let mut xf = [MaybeUninit::<f32>::uninit(); 2 * TILE * KC_FMA];
    let xf = xf.as_mut_ptr() as *mut f32;
    let mut k0 = 0;
    while k0 < kp {
        let kc = kc_max.min(kp - k0);
        // SAFETY: rows m0 .. m0 + 16 mt of `a` have kp >= k0 + kc values (the caller's
        // contract); `xf` has room for 32 rows of kc <= KC_FMA values.
        unsafe { widen(a.ptr.add(m0 * a.lda + k0), a.lda, TILE * mt, kc, xf) };
        for i in 0..mt {
            for r0 in (0..TILE).step_by(if nt == 2 { 8 } else { 16 }) {
                // SAFETY: rows 16 i + r0 .. of `xf` were written above, kc values each; the
                // weights of tiles nb .. nb + nt (checked) from pair k0 / 2 have kc / 2 rows of
                // 64 bytes; tile (i, j) of `out` has 256 sums, rows r0 .. r0 + R are the 16 R
                // from `16 r0`.
                unsafe {
                    let x = xf.add((i * TILE + r0) * kc);
                    let mut o = |j: usize| out[i * 2 + j].as_mut_ptr().add(r0 * TILE);
                    let wj = |j: usize| wp.add(j * wstride + k0 * 32);
                    if nt == 2 {
                        pass_fma::<8, 2>(x, kc, [wj(0), wj(1)], kc / 2, [o(0), o(1)], k0 > 0);
                    } else {
                        pass_fma::<16, 1>(x, kc, [wj(0)], kc / 2, [o(0)], k0 > 0);
                    }
                }
            }
        }
        k0 += kc;
    }
}

/// `dst[r kc + x] = f32(a[r lda + x])` for `r < rows`, `x < kc` (a multiple of 16).
///
/// # Safety
/// The CPU supports AVX-512F; `a` has `rows` readable rows of `kc` values, `lda` apart; `dst`
/// has room for `rows kc` values.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn widen(a: *const u16, lda: usize, rows: usize, kc: usize, dst: *mut f32) {
    for r in 0..rows {
        for x in (0..kc).step_by(16) {
            // SAFETY: x + 16 <= kc values of row r, and of row r of `dst`.
            unsafe {
                let v = _mm256_loadu_si256(a.add(r * lda + x) as *const __m256i);
                let f = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v));
                _mm512_storeu_si512(dst.add(r * kc + x) as *mut __m512i, f);
            }
        }
    }
}

/// One pass of [`bf16_fma`]: rows `0 .. R` of f32 inputs from `x` (`ldx` apart) against `NT`
/// packed bf16 weight tiles (tile `j` at `w[j]`), over `pairs` pairs of inputs. Writes (or adds,
/// when `accumulate`) the sums of row `r`, tile `j` to `out[j][r * 16 ..]`.
///
/// # Safety
/// The CPU supports AVX-512F (the caller's target features); each of the `R` rows of `x` has
/// `2 pairs` values, each `w[j]` has `64 pairs` bytes, each `out[j]` room for `16 R` sums.
#[inline(always)]
unsafe fn pass_fma<const R: usize, const NT: usize>(
    x: *const f32,
    ldx: usize,
    w: [*const u8; NT],
    pairs: usize,
    out: [*mut f32; NT],
    accumulate: bool,
) {
    // SAFETY: for the whole body: target features are the caller's; reads and writes stay in the
    // ranges the caller guarantees (row r: values 2 p, 2 p + 1 for p < pairs; weights: bytes
    // 64 p .. 64 p + 64; out: 16 sums per row).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NT]; R];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(out[j].add(r * TILE));
                }
            }
        }
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        for p in 0..pairs {
            let wv: [__m512i; NT] =
                std::array::from_fn(|j| _mm512_loadu_si512(w[j].add(p * 64) as *const __m512i));
            // Even inputs are the low halves of the 32-bit lanes, odd ones the high halves.
            let we: [__m512; NT] =
                std::array::from_fn(|j| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wv[j])));
            let wo: [__m512; NT] =
                std::array::from_fn(|j| _mm512_castsi512_ps(_mm512_and_si512(wv[j], high)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x0 = _mm512_set1_ps(*x.add(r * ldx + 2 * p));
                for (v, w) in row.iter_mut().zip(we) {
                    *v = _mm512_fmadd_ps(x0, w, *v);
                }
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let x1 = _mm512_set1_ps(*x.add(r * ldx + 2 * p + 1));
                for (v, w) in row.iter_mut().zip(wo) {
                    *v = _mm512_fmadd_ps(x1, w, *v);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                _mm512_storeu_ps(out[j].add(r * TILE), *v);
            }
        }
    }
}

/// The int8 block kernel ([`super::BlockI8`]) on `vpdpbusd`: raw i32 sums (as bits in `out`)
/// of rows `m0 .. m0 + 16 mt` of `a`, read as `u8` (code + 128), times the signed weights of
/// output tiles `nb .. nb + nt` of `w`. The sums include `128 * sum(w)` per output
/// ([`PackedI8::comp`]), which the caller subtracts.
///
/// # Safety
/// The CPU supports AVX-512 F/BW/VL and VNNI; `a` has `16 mt` readable rows of `w.kp()` bytes
/// from row `m0` (as [`super::BlockI8`]). Panics unless `mt`, `nt` are 1 or 2 and `nb + nt <=
/// w.blocks()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn block_i8(a: ActsI8, w: &PackedI8, at: Block, out: &mut Tiles) {
    // SAFETY: the caller's contract, and this function's target features.
    unsafe { i8_dp(a, w, at, out, KC) }
}

/// [`block_i8`] with chunks of `kc_max` inputs (a multiple of 64).
///
/// # Safety
/// As [`block_i8`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn i8_dp(a: ActsI8, w: &PackedI8, at: Block, out: &mut Tiles, kc_max: usize) {
    at.check(w.blocks());
    let Block { m0, mt, nb, nt } = at;
    let kp = w.kp();
    let wp = w.block(nb).as_ptr() as *const u8;
    let wstride = TILE * kp;
    let dp = |acc, x, w| {
        // SAFETY: this kernel's target features include AVX512_VNNI.
        unsafe { dp_u8i8(acc, x, w) }
    };
    // SAFETY: as in `bf16_dp`, one byte per input.
    unsafe {
        let ap = a.ptr.add(m0 * a.lda);
        let walk = Walk {
            kp,
            g: 4,
            kc_max,
            wstride,
        };
        if nt == 2 {
            block::<u8, 8, 2>(ap, a.lda, mt, wp, walk, out, dp);
        } else {
            block::<u8, 16, 1>(ap, a.lda, mt, wp, walk, out, dp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::emulated::tests::{check_bf16, check_i8};
    use super::super::pack::PackedBf16;
    use super::super::{ActsBf16, Block, TILE, Tiles, to_bf16};
    use crate::random::normal_vec;

    #[test]
    #[cfg_attr(
        not(ember_avx512_bf16),
        ignore = "needs AVX512_BF16: none on the machine that built the tests"
    )]
    fn bf16_matches_direct_sums() {
        check_bf16(super::block_bf16);
    }

    #[test]
    #[cfg_attr(
        not(ember_avx512),
        ignore = "needs AVX-512 F/BW/VL: none on the machine that built the tests"
    )]
    fn bf16_fma_matches_direct_sums() {
        check_bf16(super::block_bf16_fma);
    }

    #[test]
    #[cfg_attr(
        not(ember_avx512_vnni),
        ignore = "needs AVX512_VNNI: none on the machine that built the tests"
    )]
    fn i8_matches_direct_sums() {
        check_i8(super::block_i8, true);
    }

    /// The FMA kernel adds the same exact products in the same order as the emulation.
    #[test]
    #[cfg_attr(
        not(ember_avx512),
        ignore = "needs AVX-512 F/BW/VL: none on the machine that built the tests"
    )]
    fn bf16_fma_is_the_emulation_bit_for_bit() {
        for (n, k) in [(40, 600), (17, 33), (32, 513)] {
            let w = PackedBf16::new(&normal_vec(n * k, 1.0, 3), n, k);
            // Small values too, so that some products and sums are denormal.
            let a: Vec<u16> = normal_vec(64 * w.kp(), 1.0, 4)
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let scale = if i % 3 == 0 { 1e-19 } else { 1.0 };
                    if i % w.kp() >= k {
                        0
                    } else {
                        to_bf16(v * scale)
                    }
                })
                .collect();
            let acts = ActsBf16 {
                ptr: a.as_ptr(),
                lda: w.kp(),
            };
            for (mt, nt, m0, nb) in [(2, 2, 0, 0), (1, 2, 32, 0), (2, 1, 17, 1), (1, 1, 48, 0)] {
                let mut got: Tiles = [[f32::NAN; TILE * TILE]; 4];
                let mut want: Tiles = [[f32::NAN; TILE * TILE]; 4];
                let at = Block { m0, mt, nb, nt };
                // SAFETY: 64 >= m0 + 16 mt rows of kp values; AVX-512F is present.
                unsafe {
                    super::block_bf16_fma(acts, &w, at, &mut got);
                    super::super::emulated::block_bf16(acts, &w, at, &mut want);
                }
                for t in (0..mt).flat_map(|i| (0..nt).map(move |j| i * 2 + j)) {
                    let (g, e) = (got[t].map(f32::to_bits), want[t].map(f32::to_bits));
                    assert_eq!(g, e, "n {n} k {k} block {mt}x{nt} m0 {m0} nb {nb} tile {t}");
                }
            }
        }
    }
}
