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
//! blocks of [`BQ`] query rows against blocks of [`BK`] keys (transposed once, then in cache
//! while the block's rows read them): the rows' scores against the key block (silu, scale, mask)
//! in a `BQ x BK` buffer, then their sums of the keys' values. No `L x L` matrix exists, keys past the
//! causal diagonal are never read, and the candidates' rows read only the history's keys plus
//! their own. Work is split over (user, query block) units, which own disjoint rows of the
//! output. (faer's GEMM on strided blocks was tried first: its rank-1 path wrote past a strided
//! destination's last column, found by valgrind, so the kernel is Ember's own.)

use rayon::prelude::*;

#[cfg(test)]
use super::layers::exp_fast;
use super::layers::silu;

/// Query rows per block.
pub const BQ: usize = super::zmm::ROWS;
/// Keys per block (a multiple of 32).
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
/// on the calling thread (`threads` 1) or the calling rayon pool.
pub fn attention(
    shape: Shape,
    uvqk: &[f32],
    seqs: &[Seq],
    alpha: f32,
    out: &mut [f32],
    threads: usize,
) {
    attention_of(shape, uvqk, seqs, alpha, out, threads, Queries::All)
}

/// Which rows' attention a pass needs (the rows it does not compute are left as they were).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queries<'a> {
    /// Every token's.
    All,
    /// The candidates' only (the last layer: nothing reads another row of its output).
    Candidates,
    /// Sequence `k`'s rows from its row `from[k]` on (its earlier rows' keys and values held
    /// by a cache of its history).
    From(&'a [usize]),
}

/// [`attention`] for the rows `queries` names.
pub fn attention_of(
    shape: Shape,
    uvqk: &[f32],
    seqs: &[Seq],
    alpha: f32,
    out: &mut [f32],
    threads: usize,
    queries: Queries<'_>,
) {
    let o = shape.out_row();
    // Units: (sequence, query block), each owning its rows of `out`. Sequences are in row order
    // and contiguous from row 0 (the batch's layout), so the output splits in that order.
    let mut units: Vec<(Seq, usize, &mut [f32])> = Vec::new();
    let mut rest: &mut [f32] = out;
    let mut row = 0;
    if let Queries::From(from) = queries {
        assert_eq!(from.len(), seqs.len(), "one first row per sequence");
    }
    for (k, s) in seqs.iter().enumerate() {
        assert_eq!(s.start, row, "sequences are contiguous from row 0");
        let first = match queries {
            Queries::All => 0,
            Queries::Candidates => s.history(),
            Queries::From(from) => from[k].min(s.len),
        };
        rest = std::mem::take(&mut rest).split_at_mut(first * o).1;
        for i0 in (first..s.len).step_by(BQ) {
            let rows = BQ.min(s.len - i0);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(rows * o);
            units.push((*s, i0, mine));
            rest = tail;
        }
        row += s.len;
    }
    // Longest units first: the last query blocks of long histories have the most keys.
    units.sort_by_key(|(s, i0, _)| std::cmp::Reverse((i0 + BQ).min(s.history())));
    let run = |scratch: &mut Vec<f32>, (s, i0, out): (Seq, usize, &mut [f32])| {
        block(shape, uvqk, s, i0, alpha, out, scratch)
    };
    match threads {
        // One thread: not rayon's global pool, which a one-thread predictor has no pool instead of.
        0 | 1 => {
            let mut scratch = Vec::new();
            units.into_iter().for_each(|u| run(&mut scratch, u));
        }
        _ => units.into_par_iter().for_each_init(Vec::new, run),
    }
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
    block_portable::<false, PORTABLE>(shape, uvqk, s, i0, alpha, out, scratch)
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
    block_portable::<true, AVX512>(shape, uvqk, s, i0, alpha, out, scratch)
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
    block_portable::<true, AVX2>(shape, uvqk, s, i0, alpha, out, scratch)
}

/// Which inner loops a block runs ([`block_portable`]'s `VEC`): the portable ones, or those in
/// AVX2 / FMA (`ymm.rs`) or AVX-512 (`zmm.rs`) intrinsics.
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

/// The block, in portable code (vectorised by the compiler for the caller's target, with fused
/// multiply-adds where `FMA`): for each head, the block's queries transposed once (`qk` rows of
/// [`BQ`]); then for each key block, 4 keys at a time against all the block's rows (an outer
/// product per qk dim into 16 register accumulators), silu, scale and mask applied as the scores
/// are stored key-major; then for 2 rows at a time their scores times the keys' values, 64
/// output columns at a time.
#[inline(always)]
fn block_portable<const FMA: bool, const VEC: u8>(
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
    let (qk, hid) = (shape.qk, shape.hid);
    // Scores key-major (BK keys of BQ rows), the queries transposed (qk dims of BQ rows).
    scratch.resize(BK * BQ + qk * BQ + BK * hid, 0.0);
    let (st, rest) = scratch.split_at_mut(BK * BQ);
    let (qt, vb) = rest.split_at_mut(qk * BQ);
    let inv = 1.0 / s.norm;
    let seq = &uvqk[s.start * w..(s.start + s.len) * w];
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
        for r in 0..BQ {
            let i = i0 + r.min(rows - 1);
            for a in 0..qk {
                qt[a * BQ + r] = seq[i * w + qc + a];
            }
        }
        for j0 in (0..key_end).step_by(BK) {
            let cols = BK.min(key_end - j0);
            key_scores::<FMA, VEC>(
                &Block {
                    seq,
                    w,
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
            // The block's values, contiguous.
            for j in 0..cols {
                vb[j * hid..(j + 1) * hid].copy_from_slice(&seq[(j0 + j) * w + vc..][..hid]);
            }
            for r0 in (0..rows).step_by(4) {
                let n = 4.min(rows - r0);
                let hi = (r0..r0 + n)
                    .map(|r| lim(i0 + r, j0, cols))
                    .max()
                    .unwrap_or(0);
                for e0 in (0..hid).step_by(64) {
                    let width = 64.min(hid - e0);
                    let acc = row_values::<FMA, VEC>(st, r0, n, &vb[e0..], hid, hi, width);
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

/// What a block's inner steps share: the user's rows of `uvqk` (`seq`, `w` values a row), the
/// block's first row, the user's history length, the score scale and what sums are divided by.
struct Block<'a> {
    seq: &'a [f32],
    w: usize,
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
        seq,
        w,
        i0,
        m,
        alpha,
        inv,
    } = *b;
    for jg in (0..cols).step_by(4) {
        let k: [&[f32]; 4] = std::array::from_fn(|x| {
            let j = j0 + (jg + x).min(cols - 1);
            &seq[j * w + kc..][..qk]
        });
        let acc = match VEC {
            // SAFETY: `VEC` is `AVX512` only in `block_avx512`, which runs where the CPU has
            // AVX-512 F.
            #[cfg(target_arch = "x86_64")]
            AVX512 => unsafe { super::zmm::scores_4x64(&k, qt, qk) },
            // SAFETY: `VEC` is `AVX2` only in `block_avx2`, which runs where the CPU has AVX2
            // and FMA.
            #[cfg(target_arch = "x86_64")]
            AVX2 => unsafe { super::ymm::scores_4x64(&k, qt, qk) },
            _ => scores_4x64::<FMA>(&k, qt, qk),
        };
        for (x, accx) in acc.iter().enumerate() {
            let j = jg + x;
            if j >= cols {
                break;
            }
            let dst: &mut [f32; BQ] = (&mut st[j * BQ..(j + 1) * BQ]).try_into().expect("BQ rows");
            for r in 0..BQ {
                dst[r] = silu(alpha * accx[r]) * inv;
            }
            // History rows before this key do not see it.
            let hidden = (j0 + j)
                .saturating_sub(i0)
                .min(m.saturating_sub(i0))
                .min(BQ);
            dst[..hidden].fill(0.0);
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
        (64, AVX512) => unsafe { super::zmm::values_4x64(st, r0, v, stride, hi) },
        // SAFETY: `VEC` is `AVX2` only in `block_avx2`, where the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        (64, AVX2) => unsafe { super::ymm::values_4x64(st, r0, v, stride, hi) },
        (64, _) => values_4x64::<FMA>(st, r0, v, stride, hi),
        _ => values_4xn(st, r0, n, v, stride, hi, width),
    }
}

/// `a * b + c`, fused where the caller's target has FMA (`FMA`), else two roundings.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// Scores of 4 keys `k` against the block's [`BQ`] transposed queries `qt` (`qk` rows of
/// [`BQ`]): an outer product per qk dim into 4 x 64 sums.
#[inline(always)]
fn scores_4x64<const FMA: bool>(k: &[&[f32]; 4], qt: &[f32], qk: usize) -> [[f32; BQ]; 4] {
    let mut acc = [[0f32; BQ]; 4];
    for a in 0..qk {
        let q: &[f32; BQ] = qt[a * BQ..(a + 1) * BQ].try_into().expect("BQ rows");
        for x in 0..4 {
            let kv = k[x][a];
            for r in 0..BQ {
                acc[x][r] = madd::<FMA>(kv, q[r], acc[x][r]);
            }
        }
    }
    acc
}

/// Rows `r0 .. r0 + 4` of the scores `st` (key-major, [`BQ`] rows a key) times the
/// values of `hi` keys, 64 of them at `v[j * stride ..]`: 16 accumulators in registers. (Rows
/// past the block's last read the padding rows' scores, which are finite; the caller drops
/// them.)
#[inline(always)]
fn values_4x64<const FMA: bool>(
    st: &[f32],
    r0: usize,
    v: &[f32],
    stride: usize,
    hi: usize,
) -> [[f32; 64]; 4] {
    let mut acc = [[0f32; 64]; 4];
    for j in 0..hi {
        let vj: &[f32; 64] = v[j * stride..j * stride + 64]
            .try_into()
            .expect("64 values");
        let p: &[f32; 4] = st[j * BQ + r0..j * BQ + r0 + 4].try_into().expect("4 rows");
        for x in 0..4 {
            for e in 0..64 {
                acc[x][e] = madd::<FMA>(p[x], vj[e], acc[x][e]);
            }
        }
    }
    acc
}

/// [`values_4x64`] for a last piece of `width < 64` values.
#[inline(always)]
fn values_4xn(
    st: &[f32],
    r0: usize,
    n: usize,
    v: &[f32],
    stride: usize,
    hi: usize,
    width: usize,
) -> [[f32; 64]; 4] {
    let mut acc = [[0f32; 64]; 4];
    for j in 0..hi {
        let vj = &v[j * stride..j * stride + width];
        for (x, accx) in acc.iter_mut().enumerate().take(n) {
            let p = st[j * BQ + r0 + x];
            for (a, &ve) in accx.iter_mut().zip(vj) {
                *a += p * ve;
            }
        }
    }
    acc
}

/// `<a, b>`.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += a * x`.
#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += a * x);
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
        attention(shape, &uvqk, &seqs, alpha, &mut got, 1 + seed as usize % 2);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(0.05),
                "{shape:?} {lens:?} at {i}: {g} vs {w}"
            );
        }
        // The candidates' rows only: the same values there, every other row untouched.
        let o = shape.out_row();
        let mut cand = vec![f32::NAN; total * o];
        let threads = 2 - seed as usize % 2;
        attention_of(
            shape,
            &uvqk,
            &seqs,
            alpha,
            &mut cand,
            threads,
            Queries::Candidates,
        );
        for s in &seqs {
            for i in s.start..s.start + s.len {
                let (c, g) = (&cand[i * o..(i + 1) * o], &got[i * o..(i + 1) * o]);
                match i >= s.start + s.history() {
                    true => assert_eq!(c, g, "{shape:?} {lens:?} row {i}"),
                    false => assert!(c.iter().all(|v| v.is_nan()), "{lens:?} row {i}"),
                }
            }
        }
        // Each sequence's rows from a first row on (0, inside its history or candidates, or
        // past its end): the same values there, its earlier rows untouched.
        let from: Vec<usize> = (seqs.iter().enumerate())
            .map(|(k, s)| (k * 7 + seed as usize * 3) % (s.len + 2))
            .collect();
        let mut part = vec![f32::NAN; total * o];
        attention_of(
            shape,
            &uvqk,
            &seqs,
            alpha,
            &mut part,
            threads,
            Queries::From(&from),
        );
        for (s, &f) in seqs.iter().zip(&from) {
            for i in s.start..s.start + s.len {
                let (c, g) = (&part[i * o..(i + 1) * o], &got[i * o..(i + 1) * o]);
                match i >= s.start + f {
                    true => assert_eq!(c, g, "{shape:?} {lens:?} row {i} from {f}"),
                    false => assert!(c.iter().all(|v| v.is_nan()), "{lens:?} row {i}"),
                }
            }
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
    fn exp_fast_is_within_2_ulp_of_exp() {
        let mut worst = 0f64;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3 + 1.7e-4;
            let (got, want) = (exp_fast(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 2.5e-7, "{worst}");
        assert!(exp_fast(-1e4) >= 0.0 && exp_fast(1e4).is_finite());
        assert!((silu(-100.0)).abs() < 1e-30 && (silu(30.0) - 30.0).abs() < 1e-5);
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let shape = Shape {
            heads: 2,
            hid: 4,
            qk: 3,
        };
        let mut out: Vec<f32> = Vec::new();
        attention(shape, &[], &[], 0.5, &mut out, 2);
        assert!(out.is_empty());
    }
}
