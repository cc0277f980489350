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
//! output, the costliest first. (faer's GEMM on strided blocks was tried first: its rank-1 path
//! wrote past a strided destination's last column, found by valgrind, so the kernel is Ember's
//! own.)
//!
//! Keys and values are read where they are: in the rows of `uvqk` (each value row read with the
//! row's stride: copying a key block's values together first cost 7% of a pass in `memmove`,
//! and the pass was faster without it), or, for a sequence's first tokens held by a cache of
//! its history, in the cache's segments ([`HeldKv`]), so a returning user's held keys and
//! values are not copied into `uvqk` at every layer.

mod block;
mod portable;

use rayon::prelude::*;

#[cfg(test)]
use super::layers::{exp_fast, silu};
use block::{Kernel, block};

/// Query rows per block.
pub const BQ: usize = super::zmm::ROWS;
/// Rows of a short block ([`BQ`] or fewer) whose scores are computed as such on AVX-512.
const NARROW: usize = 16;
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

    /// Values a token's keys and values take where they are held (a cache's segments,
    /// [`HeldKv`]): `[v (H x hid) | k (H x qk)]`.
    pub fn kv_row(&self) -> usize {
        self.heads * (self.hid + self.qk)
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

/// A run of a sequence's first tokens whose keys and values are held outside `uvqk` (one
/// layer's part of a cache's segment): `tokens` rows of `[v (H x hid) | k (H x qk)]`. A
/// sequence's runs follow each other from its first token.
#[derive(Debug, Clone, Copy)]
pub struct HeldKv<'a> {
    pub kv: &'a [f32],
    pub tokens: usize,
}

/// Where keys `from .. to` of a sequence are: key `j`'s row at `data[(j - from) * stride ..]`,
/// its keys at column `k` and its values at column `v` (head 0's; the others' follow).
#[derive(Debug, Clone, Copy)]
struct Span<'a> {
    from: usize,
    to: usize,
    data: &'a [f32],
    stride: usize,
    k: usize,
    v: usize,
}

impl<'a> Span<'a> {
    /// Key `j`'s row from column `col` (a head's keys or values) on, and every row after it
    /// in the span.
    #[inline(always)]
    fn at(&self, j: usize, col: usize) -> &'a [f32] {
        &self.data[(j - self.from) * self.stride + col..]
    }
}

/// The spans of sequence `s`: its held runs, then its rows of `uvqk` (`seq`).
fn spans_of<'a>(shape: Shape, seq: &'a [f32], s: Seq, held: &[HeldKv<'a>]) -> Vec<Span<'a>> {
    let (w, kvw) = (shape.row(), shape.kv_row());
    let mut spans = Vec::with_capacity(held.len() + 1);
    let mut from = 0;
    for run in held {
        assert!(
            run.kv.len() >= run.tokens * kvw,
            "a held run's rows are there"
        );
        spans.push(Span {
            from,
            to: from + run.tokens,
            data: run.kv,
            stride: kvw,
            k: shape.heads * shape.hid,
            v: 0,
        });
        from += run.tokens;
    }
    assert!(from <= s.len, "held tokens are the sequence's first");
    spans.push(Span {
        from,
        to: s.len,
        data: &seq[from * w..],
        stride: w,
        k: shape.k_col(0),
        v: shape.v_col(0),
    });
    spans
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
    attention_of(shape, uvqk, seqs, &[], alpha, out, threads, Queries::All)
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

/// [`attention`] for the rows `queries` names, sequence `k`'s first keys and values read from
/// `held[k]` (none past `held`'s end), its rows of `uvqk` there never read.
#[allow(clippy::too_many_arguments)]
pub fn attention_of(
    shape: Shape,
    uvqk: &[f32],
    seqs: &[Seq],
    held: &[Vec<HeldKv<'_>>],
    alpha: f32,
    out: &mut [f32],
    threads: usize,
    queries: Queries<'_>,
) {
    let kernel = Kernel::chosen();
    attention_with(
        kernel, shape, uvqk, seqs, held, alpha, out, threads, queries,
    )
}

/// [`attention_of`] on the inner loops `kernel` names (one the CPU has).
#[allow(clippy::too_many_arguments)]
fn attention_with(
    kernel: Kernel,
    shape: Shape,
    uvqk: &[f32],
    seqs: &[Seq],
    held: &[Vec<HeldKv<'_>>],
    alpha: f32,
    out: &mut [f32],
    threads: usize,
    queries: Queries<'_>,
) {
    let o = shape.out_row();
    // Units: (sequence, query block), each owning its rows of `out`. Sequences are in row order
    // and contiguous from row 0 (the batch's layout), so the output splits in that order.
    let mut units: Vec<(usize, usize, &mut [f32])> = Vec::new();
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
        let kept: usize = held.get(k).map_or(0, |h| h.iter().map(|r| r.tokens).sum());
        assert!(kept <= first, "a held token's row is not computed");
        rest = std::mem::take(&mut rest).split_at_mut(first * o).1;
        for i0 in (first..s.len).step_by(BQ) {
            let rows = BQ.min(s.len - i0);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(rows * o);
            units.push((k, i0, mine));
            rest = tail;
        }
        row += s.len;
    }
    // Costliest units first (a block's scores are computed for all its BQ rows, its sums for
    // its own; its rows see up to the history's end, a candidate also itself), so that a short
    // block is what is left for the last thread free.
    let cost = |&(k, i0, ref out): &(usize, usize, &mut [f32])| {
        let (s, rows): (&Seq, usize) = (&seqs[k], out.len() / o);
        (BQ + rows) * (i0 + rows).min(s.history())
    };
    units.sort_by_cached_key(|u| std::cmp::Reverse(cost(u)));
    let w = shape.row();
    let spans: Vec<Vec<Span<'_>>> = (seqs.iter().enumerate())
        .map(|(k, s)| {
            let seq = &uvqk[s.start * w..(s.start + s.len) * w];
            spans_of(shape, seq, *s, held.get(k).map_or(&[], |h| &h[..]))
        })
        .collect();
    let run = |scratch: &mut Vec<f32>, (k, i0, out): (usize, usize, &mut [f32])| {
        block(
            kernel, shape, uvqk, seqs[k], &spans[k], i0, alpha, out, scratch,
        )
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
        // Each kernel the CPU runs: the spec's values, and the chosen one's to the bit where
        // they are the same kernel.
        for kernel in Kernel::available() {
            let mut on = vec![f32::NAN; total * shape.out_row()];
            let threads = 1 + seed as usize % 2;
            attention_with(
                kernel,
                shape,
                &uvqk,
                &seqs,
                &[],
                alpha,
                &mut on,
                threads,
                Queries::All,
            );
            for (i, (g, w)) in on.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(0.05),
                    "{kernel:?} {shape:?} {lens:?} at {i}: {g} vs {w}"
                );
            }
            if kernel == Kernel::chosen() {
                assert_eq!(on, got, "{kernel:?} is the chosen kernel");
            }
        }
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
            &[],
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
            &[],
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
        held_in_place(shape, &uvqk, &seqs, &from, alpha, &want, threads);
    }

    /// As `Queries::From`, each sequence's tokens before its first row held in runs outside
    /// `uvqk` (two, or one, or none), their keys and values in `uvqk` made NaN: the rows
    /// computed match the spec, so the runs were read and those rows of `uvqk` never were.
    fn held_in_place(
        shape: Shape,
        uvqk: &[f32],
        seqs: &[Seq],
        from: &[usize],
        alpha: f32,
        want: &[f32],
        threads: usize,
    ) {
        let (w, o, kvw) = (shape.row(), shape.out_row(), shape.kv_row());
        let (nv, nk) = (shape.heads * shape.hid, shape.heads * shape.qk);
        let (v0, k0) = (shape.v_col(0), shape.k_col(0));
        let mut hidden = uvqk.to_vec();
        let mut bufs: Vec<Vec<Vec<f32>>> = Vec::new();
        for (s, &f) in seqs.iter().zip(from) {
            let held = f.min(s.len);
            let cut = [0, held / 3, held];
            let mut runs = Vec::new();
            for r in cut.windows(2).filter(|r| r[1] > r[0]) {
                let mut kv = Vec::new();
                for t in s.start + r[0]..s.start + r[1] {
                    let row = &mut hidden[t * w..(t + 1) * w];
                    kv.extend_from_slice(&row[v0..v0 + nv]);
                    kv.extend_from_slice(&row[k0..k0 + nk]);
                    row[v0..v0 + nv].fill(f32::NAN);
                    row[k0..k0 + nk].fill(f32::NAN);
                }
                assert_eq!(kv.len(), (r[1] - r[0]) * kvw);
                runs.push(kv);
            }
            bufs.push(runs);
        }
        let held: Vec<Vec<HeldKv<'_>>> = (bufs.iter())
            .map(|runs| {
                (runs.iter())
                    .map(|kv| HeldKv {
                        kv,
                        tokens: kv.len() / kvw,
                    })
                    .collect()
            })
            .collect();
        for kernel in Kernel::available() {
            let mut got = vec![f32::NAN; want.len()];
            let queries = Queries::From(from);
            attention_with(
                kernel, shape, &hidden, seqs, &held, alpha, &mut got, threads, queries,
            );
            for (s, &f) in seqs.iter().zip(from) {
                for i in s.start + f.min(s.len)..s.start + s.len {
                    let got = got[i * o..(i + 1) * o].iter();
                    for (e, (g, w)) in got.zip(&want[i * o..]).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-5 * w.abs().max(0.05),
                            "held in place, {kernel:?}: {shape:?} row {i} from {f}, at {e}: {g} vs {w}"
                        );
                    }
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

    /// The intrinsics' silu is the scalar one bit for bit, over the scores' range, the
    /// clamps' edges and beyond, and a NaN stays NaN.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_vector_silu_is_the_scalar_one_to_the_bit() {
        let (alpha, inv) = (0.088_388_35f32, 1.0 / 4617.0);
        let mut src: Vec<f32> = (0..200_000)
            .map(|i| (i as f32 - 100_000.0) * 1.37e-3)
            .collect();
        src.extend([1e4, -1e4, 87.3 / alpha, -88.3 / alpha, 0.0, -0.0, f32::NAN]);
        src.resize(src.len().next_multiple_of(16), 1.0);
        let want: Vec<f32> = src.iter().map(|&a| silu(alpha * a) * inv).collect();
        let mut tried = 0;
        for kernel in Kernel::available() {
            let mut got = vec![0f32; src.len()];
            match kernel {
                // SAFETY: `available` lists AVX-512 only where the CPU has it.
                Kernel::Avx512 => unsafe {
                    super::super::zmm::silu_scaled(&src, &mut got, alpha, inv)
                },
                // SAFETY: as above, AVX2 and FMA.
                Kernel::Avx2 => unsafe {
                    super::super::ymm::silu_scaled(&src, &mut got, alpha, inv)
                },
                Kernel::Portable => continue,
            }
            tried += 1;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{kernel:?} at {i} ({}): {g} vs {w}",
                    src[i]
                );
            }
        }
        assert_eq!(tried + 1, Kernel::available().len());
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
