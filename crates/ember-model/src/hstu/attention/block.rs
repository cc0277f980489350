//! One block of query rows against the keys its rows see: the kernel's body, compiled once per
//! vector unit (AVX-512, AVX2 / FMA, portable), with its two steps, the scores of a key block
//! and their sums of the keys' values, on the inner loops of `zmm.rs`, `ymm.rs` or
//! `portable.rs`.

use super::portable::{axpy, dot, scores_4x64, values_4x64, values_4xn};
use super::{BK, BQ, NARROW, Seq, Shape, Span};
use crate::hstu::layers::silu;

/// Which inner loops a block runs: those in AVX-512 (`zmm.rs`) or AVX2 / FMA (`ymm.rs`)
/// intrinsics, or the portable ones (`portable.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    Portable,
    Avx2,
    Avx512,
}

impl Kernel {
    /// The widest the CPU has, as the embedding stage chose it (`EMBER_ISA` may narrow it).
    pub(super) fn chosen() -> Kernel {
        use ember_embed::Isa;
        match Isa::selected().unwrap_or(Isa::Scalar) {
            Isa::Avx512 => Kernel::Avx512,
            Isa::Avx2 => Kernel::Avx2,
            _ => Kernel::Portable,
        }
    }

    /// Every kernel this CPU runs (the tests check each).
    #[cfg(test)]
    pub(super) fn available() -> Vec<Kernel> {
        use ember_embed::Isa;
        let mut k = vec![Kernel::Portable];
        if Isa::Avx2.require().is_ok() {
            k.push(Kernel::Avx2);
        }
        if Isa::Avx512.require().is_ok() {
            k.push(Kernel::Avx512);
        }
        k
    }
}

/// Query rows `i0 ..` (`out.len() / out_row` of them) of sequence `s`, all heads: on the widest
/// vector unit the CPU has (the same code, compiled for it).
#[allow(clippy::too_many_arguments)]
pub(super) fn block(
    kernel: Kernel,
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    spans: &[Span<'_>],
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    match kernel {
        Kernel::Avx512 => {
            // SAFETY: `Kernel::Avx512` is chosen (or run by the tests) only where the CPU has
            // AVX-512 F, VL, BW and DQ (`Isa`'s check).
            return unsafe { block_avx512(shape, uvqk, s, spans, i0, alpha, out, scratch) };
        }
        Kernel::Avx2 => {
            // SAFETY: as above, AVX2 and FMA.
            return unsafe { block_avx2(shape, uvqk, s, spans, i0, alpha, out, scratch) };
        }
        Kernel::Portable => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernel;
    block_portable::<false, PORTABLE>(shape, uvqk, s, spans, i0, alpha, out, scratch)
}

/// [`block_portable`] compiled for AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F, VL, BW and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx512(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    spans: &[Span<'_>],
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    block_portable::<true, AVX512>(shape, uvqk, s, spans, i0, alpha, out, scratch)
}

/// [`block_portable`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx2(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    spans: &[Span<'_>],
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    block_portable::<true, AVX2>(shape, uvqk, s, spans, i0, alpha, out, scratch)
}

/// Which inner loops a block runs ([`block_portable`]'s `VEC`): the portable ones, or those in
/// AVX2 / FMA (`ymm.rs`) or AVX-512 (`zmm.rs`) intrinsics.
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

/// The block, in portable code (vectorised by the compiler for the caller's target, with fused
/// multiply-adds where `FMA`): for each head, the block's queries transposed once (`qk` rows of
/// [`BQ`]); then for each key block, 4 keys at a time (6 on AVX-512) against all the block's
/// rows (an outer product per qk dim into register accumulators), silu, scale and mask applied
/// as the scores are stored key-major; then for 4 rows at a time their scores times the keys'
/// values, 64 output columns at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block_portable<const FMA: bool, const VEC: u8>(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    spans: &[Span<'_>],
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let (w, o) = (shape.row(), shape.out_row());
    let rows = out.len() / o;
    let i1 = i0 + rows;
    let m = s.history();
    // Keys any row of the block may see: up to the diagonal for history rows, the whole
    // history for candidate rows (their own key is added after).
    let key_end = i1.min(m);
    out.fill(0.0);
    let (qk, hid) = (shape.qk, shape.hid);
    // Scores key-major (BK keys of BQ rows), the queries transposed (qk dims of BQ rows).
    scratch.resize(BK * BQ + qk * BQ, 0.0);
    let (st, qt) = scratch.split_at_mut(BK * BQ);
    let inv = 1.0 / s.norm;
    let seq = &uvqk[s.start * w..(s.start + s.len) * w];
    // Rows whose scores are computed: a short block's 16 where the CPU has AVX-512, else the
    // whole block's (the rows past its last are padding, copies of its last row).
    let lanes = match VEC == AVX512 && rows <= NARROW {
        true => NARROW,
        false => BQ,
    };
    // A row's keys: `j <= i` in the history, every key for a candidate.
    let lim = |i: usize, j0: usize, cols: usize| {
        if i < m {
            (i + 1).saturating_sub(j0).min(cols)
        } else {
            cols
        }
    };
    for h in 0..shape.heads {
        let (qc, kc, vc) = (shape.q_col(h), shape.k_col(h), shape.v_col(h));
        for r in 0..lanes {
            let i = i0 + r.min(rows - 1);
            for a in 0..qk {
                qt[a * BQ + r] = seq[i * w + qc + a];
            }
        }
        // Key blocks within each span, up to the last key any row sees.
        let blocks = spans.iter().flat_map(|sp| {
            (sp.from..sp.to.min(key_end))
                .step_by(BK)
                .map(move |j0| (sp, j0, BK.min(sp.to.min(key_end) - j0)))
        });
        for (sp, j0, cols) in blocks {
            let (kc, vc) = (sp.k + h * qk, sp.v + h * hid);
            key_scores::<FMA, VEC>(
                &Block {
                    span: sp,
                    lanes,
                    i0,
                    m,
                    alpha,
                    inv,
                },
                st,
                qt,
                kc,
                qk,
                j0,
                cols,
            );
            let vs = sp.at(j0, vc);
            for r0 in (0..rows).step_by(4) {
                let n = 4.min(rows - r0);
                let hi = (r0..r0 + n)
                    .map(|r| lim(i0 + r, j0, cols))
                    .max()
                    .unwrap_or(0);
                for e0 in (0..hid).step_by(64) {
                    let width = 64.min(hid - e0);
                    let acc = row_values::<FMA, VEC>(st, r0, n, &vs[e0..], sp.stride, hi, width);
                    for (x, accx) in acc.iter().enumerate().take(n) {
                        let dst = &mut out[(r0 + x) * o + h * hid + e0..][..width];
                        dst.iter_mut().zip(accx).for_each(|(d, a)| *d += a);
                    }
                }
            }
        }
        // Candidates see themselves.
        for i in i0.max(m)..i1 {
            let qi = &seq[i * w + qc..][..qk];
            let ki = &seq[i * w + kc..][..qk];
            let p = silu(alpha * dot(qi, ki)) * inv;
            let oi = &mut out[(i - i0) * o + h * hid..][..hid];
            axpy(p, &seq[i * w + vc..][..hid], oi);
        }
    }
}

/// What a block's inner steps share: where the keys are, the block's first row, the user's
/// history length, the score scale and what sums are divided by.
struct Block<'a> {
    span: &'a Span<'a>,
    /// The rows whose scores are computed ([`BQ`] or [`NARROW`]).
    lanes: usize,
    i0: usize,
    m: usize,
    alpha: f32,
    inv: f32,
}

/// Keys `j0 .. j0 + cols` (their qk values at column `kc`) against the block's transposed
/// queries `qt`: their scores, key-major in `st`, after silu, scale and the causal mask.
#[inline(always)]
fn key_scores<const FMA: bool, const VEC: u8>(
    b: &Block<'_>,
    st: &mut [f32],
    qt: &[f32],
    kc: usize,
    qk: usize,
    j0: usize,
    cols: usize,
) {
    let Block {
        span,
        lanes,
        i0,
        m,
        alpha,
        inv,
    } = *b;
    // Keys a step: 6 on AVX-512 for a whole block (24 sums in registers), else 4.
    let group = match VEC == AVX512 && lanes == BQ {
        true => 6,
        false => 4,
    };
    for jg in (0..cols).step_by(group) {
        // The step's keys, the last repeated past the block's end (its sums are dropped).
        let key = |x: usize| &span.at(j0 + (jg + x).min(cols - 1), kc)[..qk];
        // Key `jg + x`'s sums of the step into `st`: silu, scale and the causal mask.
        let mut finish = |x: usize, accx: &[f32]| {
            let j = jg + x;
            if j >= cols {
                return;
            }
            let dst = &mut st[j * BQ..j * BQ + lanes];
            match VEC {
                // SAFETY: `VEC` is `AVX512` only in `block_avx512`, where the CPU has AVX-512 F.
                #[cfg(target_arch = "x86_64")]
                AVX512 => unsafe { crate::hstu::zmm::silu_scaled(&accx[..lanes], dst, alpha, inv) },
                // SAFETY: `VEC` is `AVX2` only in `block_avx2`, where the CPU has AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                AVX2 => unsafe { crate::hstu::ymm::silu_scaled(&accx[..lanes], dst, alpha, inv) },
                _ => {
                    for (d, &a) in dst.iter_mut().zip(accx) {
                        *d = silu(alpha * a) * inv;
                    }
                }
            }
            // History rows before this key do not see it.
            let hidden = (j0 + j)
                .saturating_sub(i0)
                .min(m.saturating_sub(i0))
                .min(lanes);
            dst[..hidden].fill(0.0);
        };
        match VEC {
            #[cfg(target_arch = "x86_64")]
            AVX512 if lanes == NARROW => {
                // SAFETY: `VEC` is `AVX512` only in `block_avx512`, which runs where the CPU
                // has AVX-512 F.
                let acc =
                    unsafe { crate::hstu::zmm::scores_4x16(&std::array::from_fn(key), qt, qk) };
                acc.iter().enumerate().for_each(|(x, a)| finish(x, a));
            }
            #[cfg(target_arch = "x86_64")]
            AVX512 => {
                // SAFETY: as above.
                let acc =
                    unsafe { crate::hstu::zmm::scores_6x64(&std::array::from_fn(key), qt, qk) };
                acc.iter().enumerate().for_each(|(x, a)| finish(x, a));
            }
            #[cfg(target_arch = "x86_64")]
            AVX2 => {
                // SAFETY: `VEC` is `AVX2` only in `block_avx2`, which runs where the CPU has
                // AVX2 and FMA.
                let acc =
                    unsafe { crate::hstu::ymm::scores_4x64(&std::array::from_fn(key), qt, qk) };
                acc.iter().enumerate().for_each(|(x, a)| finish(x, a));
            }
            _ => {
                let acc = scores_4x64::<FMA>(&std::array::from_fn(key), qt, qk);
                acc.iter().enumerate().for_each(|(x, a)| finish(x, a));
            }
        }
    }
}

/// Rows `r0 .. r0 + n` (at most 4) of the scores `st` times the values of `hi` keys, `width`
/// of them at `v[j * stride ..]`: on the inner loops `VEC` names where `width` is 64.
#[inline(always)]
fn row_values<const FMA: bool, const VEC: u8>(
    st: &[f32],
    r0: usize,
    n: usize,
    v: &[f32],
    stride: usize,
    hi: usize,
    width: usize,
) -> [[f32; 64]; 4] {
    match (width, VEC) {
        // SAFETY: `VEC` is `AVX512` only in `block_avx512`, where the CPU has AVX-512 F.
        #[cfg(target_arch = "x86_64")]
        (64, AVX512) => unsafe { crate::hstu::zmm::values_4x64(st, r0, v, stride, hi) },
        // SAFETY: `VEC` is `AVX2` only in `block_avx2`, where the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        (64, AVX2) => unsafe { crate::hstu::ymm::values_4x64(st, r0, v, stride, hi) },
        (64, _) => values_4x64::<FMA>(st, r0, v, stride, hi),
        _ => values_4xn(st, r0, n, v, stride, hi, width),
    }
}
