//! HSTU's pointwise attention over jagged sequences, with the causal and target-aware masks.
//!
//! **The spec.** For one user's sequence of `L` tokens whose last `c` are candidates (`M = L -
//! c` tokens of contextual slots and history before them), and each head `h`:
//!
//! ```text
//! out[i, h] = sum over j with valid(i, j) of  silu(alpha * <q[i, h], k[j, h]>) / n * v[j, h]
//! valid(i, j) = (i == j) or min(i, M) > min(j, M)
//! ```
//!
//! so a history token sees itself and every token before it, and a candidate sees the whole
//! history and itself, never another candidate. `alpha = 1 / sqrt(qk_dim)`; `n` is the user's
//! own length `L` ([`crate::hstu::AttentionNorm::Alone`]) or the batch's longest sequence as
//! the reference computes it (`BatchMax`). This is the reference's `pytorch_hstu_mha` with
//! `_get_valid_attn_mask(causal=True, num_targets, contextual_seq_len=0, max_attn_len=0)`.
//!
//! [`reference`] is the spec in f64, the test oracle. [`attention`] is the kernel: per user,
//! blocks of [`BQ`] query rows against blocks of [`BK`] keys (which stay in cache while the
//! block's rows read them): a row's scores against a key block (silu, scale, mask) in a buffer of
//! `BK` values, then their sum of the keys' values. No `L x L` matrix exists, keys past the
//! causal diagonal are never read, and the candidates' rows read only the history's keys plus
//! their own. Work is split over (user, query block) units, which own disjoint rows of the
//! output. (faer's GEMM on strided blocks was tried first: its rank-1 path wrote past a strided
//! destination's last column, found by valgrind, so the kernel is Ember's own.)

use rayon::prelude::*;

use super::layers::silu;

/// Query rows per block.
pub const BQ: usize = 64;
/// Keys per block.
pub const BK: usize = 256;

/// Where a batch's projections are and how they are laid out: `uvqk` holds `T` rows of
/// `[u (H x hid) | v (H x hid) | q (H x qk) | k (H x qk)]`.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub heads: usize,
    /// Per head: the width of `u` and `v`.
    pub hid: usize,
    /// Per head: the width of `q` and `k`.
    pub qk: usize,
}

impl Shape {
    /// Values per row of `uvqk`.
    pub fn row(&self) -> usize {
        self.heads * 2 * (self.hid + self.qk)
    }

    pub fn v_col(&self, h: usize) -> usize {
        self.heads * self.hid + h * self.hid
    }

    pub fn q_col(&self, h: usize) -> usize {
        2 * self.heads * self.hid + h * self.qk
    }

    pub fn k_col(&self, h: usize) -> usize {
        2 * self.heads * self.hid + self.heads * self.qk + h * self.qk
    }

    /// Values per row of the output (`H x hid`).
    pub fn out_row(&self) -> usize {
        self.heads * self.hid
    }
}

/// One user's sequence in a batch: its first token's row, its length, its candidates, and what
/// its sums are divided by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seq {
    pub start: usize,
    pub len: usize,
    pub candidates: usize,
    pub norm: f32,
}

impl Seq {
    /// Tokens before the candidates (`M`).
    pub fn history(&self) -> usize {
        self.len - self.candidates
    }
}

/// The spec, in f64: `out` (`[T, H x hid]`) for `uvqk` (`[T, shape.row()]`).
pub fn reference(shape: Shape, uvqk: &[f32], seqs: &[Seq], alpha: f32, out: &mut [f32]) {
    let (w, o) = (shape.row(), shape.out_row());
    out.fill(0.0);
    for s in seqs {
        let m = s.history();
        for h in 0..shape.heads {
            for i in 0..s.len {
                let mut acc = vec![0f64; shape.hid];
                for j in 0..s.len {
                    if !(i == j || i.min(m) > j.min(m)) {
                        continue;
                    }
                    let (qi, kj) = ((s.start + i) * w, (s.start + j) * w);
                    let dot: f64 = (0..shape.qk)
                        .map(|a| {
                            uvqk[qi + shape.q_col(h) + a] as f64
                                * uvqk[kj + shape.k_col(h) + a] as f64
                        })
                        .sum();
                    let x = alpha as f64 * dot;
                    let p = x / (1.0 + (-x).exp()) / s.norm as f64;
                    for (e, a) in acc.iter_mut().enumerate() {
                        *a += p * uvqk[kj + shape.v_col(h) + e] as f64;
                    }
                }
                for (e, a) in acc.iter().enumerate() {
                    out[(s.start + i) * o + h * shape.hid + e] = *a as f32;
                }
            }
        }
    }
}

/// The blocked kernel: `out` (`[T, H x hid]`, every row of every sequence written) for `uvqk`,
/// on `threads` threads of the calling pool.
pub fn attention(shape: Shape, uvqk: &[f32], seqs: &[Seq], alpha: f32, out: &mut [f32]) {
    let o = shape.out_row();
    // Units: (sequence, query block), each owning its rows of `out`. Sequences are in row order
    // and contiguous from row 0 (the batch's layout), so the output splits in that order.
    let mut units: Vec<(Seq, usize, &mut [f32])> = Vec::new();
    let mut rest: &mut [f32] = out;
    let mut row = 0;
    for s in seqs {
        assert_eq!(s.start, row, "sequences are contiguous from row 0");
        for i0 in (0..s.len).step_by(BQ) {
            let rows = BQ.min(s.len - i0);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(rows * o);
            units.push((*s, i0, mine));
            rest = tail;
        }
        row += s.len;
    }
    // Longest units first: the last query blocks of long histories have the most keys.
    units.sort_by_key(|(s, i0, _)| std::cmp::Reverse((i0 + BQ).min(s.history())));
    units
        .into_par_iter()
        .for_each_init(Vec::new, |scratch: &mut Vec<f32>, (s, i0, out)| {
            block(shape, uvqk, s, i0, alpha, out, scratch)
        });
}

/// Query rows `i0 ..` (`out.len() / out_row` of them) of sequence `s`, all heads: on the widest
/// vector unit the CPU has (the same code, compiled for it).
fn block(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use ember_embed::Isa;
        match Isa::selected().unwrap_or(Isa::Scalar) {
            // SAFETY: `Isa::selected` picked AVX-512 only where the CPU has it (F, VL, BW, DQ).
            Isa::Avx512 => return unsafe { block_avx512(shape, uvqk, s, i0, alpha, out, scratch) },
            // SAFETY: as above, AVX2 and FMA.
            Isa::Avx2 => return unsafe { block_avx2(shape, uvqk, s, i0, alpha, out, scratch) },
            _ => {}
        }
    }
    block_portable(shape, uvqk, s, i0, alpha, out, scratch)
}

/// [`block_portable`] compiled for AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F, VL, BW and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
unsafe fn block_avx512(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    block_portable(shape, uvqk, s, i0, alpha, out, scratch)
}

/// [`block_portable`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
    i0: usize,
    alpha: f32,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    block_portable(shape, uvqk, s, i0, alpha, out, scratch)
}

/// The block, in portable code: for each head and key block, each query row's scores against
/// the block's keys (silu, scale, mask), then their sum of the keys' values.
#[inline(always)]
fn block_portable(
    shape: Shape,
    uvqk: &[f32],
    s: Seq,
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
    scratch.resize(BK, 0.0);
    let inv = 1.0 / s.norm;
    let seq = &uvqk[s.start * w..(s.start + s.len) * w];
    for h in 0..shape.heads {
        let (qc, kc, vc) = (shape.q_col(h), shape.k_col(h), shape.v_col(h));
        for j0 in (0..key_end).step_by(BK) {
            let cols = BK.min(key_end - j0);
            for r in 0..rows {
                let i = i0 + r;
                // A history row sees keys `j <= i`; a candidate row every history key.
                let lim = if i < m {
                    (i + 1).saturating_sub(j0).min(cols)
                } else {
                    cols
                };
                if lim == 0 {
                    continue;
                }
                let qi = &seq[i * w + qc..][..shape.qk];
                let p = &mut scratch[..lim];
                for (j, pj) in p.iter_mut().enumerate() {
                    let kj = &seq[(j0 + j) * w + kc..][..shape.qk];
                    *pj = silu(alpha * dot(qi, kj)) * inv;
                }
                let oi = &mut out[r * o + h * shape.hid..][..shape.hid];
                for (j, &pj) in p.iter().enumerate() {
                    axpy(pj, &seq[(j0 + j) * w + vc..][..shape.hid], oi);
                }
            }
        }
        // Candidates see themselves.
        for i in i0.max(m)..i1 {
            let qi = &seq[i * w + qc..][..shape.qk];
            let ki = &seq[i * w + kc..][..shape.qk];
            let p = silu(alpha * dot(qi, ki)) * inv;
            let oi = &mut out[(i - i0) * o + h * shape.hid..][..shape.hid];
            axpy(p, &seq[i * w + vc..][..shape.hid], oi);
        }
    }
}

/// `<a, b>` in 16 lanes (vectorised by the compiler for the caller's target).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a * x`.
#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::normal_vec;

    fn check(shape: Shape, lens: &[(usize, usize)], norm_max: bool, seed: u64) {
        let total: usize = lens.iter().map(|l| l.0).sum();
        let uvqk = normal_vec(total * shape.row(), 1.0, seed);
        let longest = lens.iter().map(|l| l.0).max().unwrap_or(0) as f32;
        let mut start = 0;
        let seqs: Vec<Seq> = lens
            .iter()
            .map(|&(len, candidates)| {
                let s = Seq {
                    start,
                    len,
                    candidates,
                    norm: if norm_max { longest } else { len as f32 },
                };
                start += len;
                s
            })
            .collect();
        let alpha = 1.0 / (shape.qk as f32).sqrt();
        let mut want = vec![f32::NAN; total * shape.out_row()];
        reference(shape, &uvqk, &seqs, alpha, &mut want);
        let mut got = vec![f32::NAN; total * shape.out_row()];
        attention(shape, &uvqk, &seqs, alpha, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(0.05),
                "{shape:?} {lens:?} at {i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn blocked_kernel_matches_the_spec_on_odd_shapes() {
        let shapes = [
            Shape {
                heads: 1,
                hid: 3,
                qk: 5,
            },
            Shape {
                heads: 3,
                hid: 6,
                qk: 5,
            },
            Shape {
                heads: 2,
                hid: 17,
                qk: 9,
            },
        ];
        for (k, shape) in shapes.into_iter().enumerate() {
            // Batch 1, a one-token history, candidates only after a history, blocks crossed
            // by the candidate boundary, several users.
            check(shape, &[(2, 1)], false, k as u64);
            check(shape, &[(1, 1)], false, 10 + k as u64);
            check(shape, &[(BQ + 3, 1)], false, 20 + k as u64);
            check(
                shape,
                &[(BQ * 2 + 5, 20), (7, 3), (BK + 70, BQ + 1)],
                true,
                30 + k as u64,
            );
            check(shape, &[(BK * 2 + 1, 5), (3, 2)], false, 40 + k as u64);
        }
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let shape = Shape {
            heads: 2,
            hid: 4,
            qk: 3,
        };
        let mut out: Vec<f32> = Vec::new();
        attention(shape, &[], &[], 0.5, &mut out);
        assert!(out.is_empty());
    }
}
