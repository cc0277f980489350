//! Portable block kernels: the products the hardware kernels compute, in plain Rust on any CPU.
//!
//! bf16: the bf16 inputs and weights are widened to f32 (exactly) and each product is added to
//! an f32 sum, input by input in order, so the numbers are the same on every CPU (they differ
//! from `vdpbf16ps` / `tdpbf16ps` in the last bits: those add a pair's two products at once and
//! flush denormals). int8: signed codes times signed weights, summed exactly in i32, as the AMX
//! kernel's `tdpbssd`; no `+ 128` offset, so nothing to compensate.
//!
//! The inner loops run over the 16 outputs of a packed weight row, which LLVM vectorizes; they
//! are for correctness and for machines without AVX-512, not for speed.

use super::pack::{PackedBf16, PackedI8};
use super::{ActsBf16, ActsI8, Block, TILE, Tiles, from_bf16};

/// The sums of one row against one tile of bf16 weights (`kp / 2` rows of 16 x 2 values).
fn row_bf16(x: &[u16], wt: &[u16]) -> [f32; TILE] {
    let mut acc = [0f32; TILE];
    for (xp, wp) in x.chunks_exact(2).zip(wt.chunks_exact(2 * TILE)) {
        let (x0, x1) = (from_bf16(xp[0]), from_bf16(xp[1]));
        for (c, s) in acc.iter_mut().enumerate() {
            *s += x0 * from_bf16(wp[2 * c]);
            *s += x1 * from_bf16(wp[2 * c + 1]);
        }
    }
    acc
}

/// The sums of one row against one tile of int8 weights (`kp / 4` rows of 16 x 4 values).
fn row_i8(x: &[i8], wt: &[i8]) -> [i32; TILE] {
    let mut acc = [0i32; TILE];
    for (xq, wq) in x.chunks_exact(4).zip(wt.chunks_exact(4 * TILE)) {
        for (c, s) in acc.iter_mut().enumerate() {
            for g in 0..4 {
                *s += xq[g] as i32 * wq[4 * c + g] as i32;
            }
        }
    }
    acc
}

/// The bf16 block kernel ([`super::BlockBf16`]), portable: raw f32 sums of rows `m0 .. m0 + 16
/// mt` of `a` times output tiles `nb .. nb + nt` of `w`.
///
/// # Safety
/// `a` has `16 mt` readable rows of `w.kp()` values from row `m0` (as [`super::BlockBf16`]; no
/// CPU feature is needed). Panics unless `mt`, `nt` are 1 or 2 and `nb + nt <= w.blocks()`.
pub unsafe fn block_bf16(a: ActsBf16, w: &PackedBf16, at: Block, out: &mut Tiles) {
    at.check(w.blocks());
    let Block { m0, mt, nb, nt } = at;
    let kp = w.kp();
    for i in 0..mt {
        for r in 0..TILE {
            // SAFETY: row m0 + 16 i + r is one of the 16 mt rows from m0 that the caller
            // guarantees readable, `kp` values each.
            let x =
                unsafe { std::slice::from_raw_parts(a.ptr.add((m0 + i * TILE + r) * a.lda), kp) };
            for j in 0..nt {
                let s = row_bf16(x, w.block(nb + j));
                out[i * 2 + j][r * TILE..(r + 1) * TILE].copy_from_slice(&s);
            }
        }
    }
}

/// The int8 block kernel ([`super::BlockI8`]), portable: raw i32 sums (as bits in `out`) of
/// rows `m0 .. m0 + 16 mt` of `a`, read as **signed** codes (`a.ptr` as `*const i8`), times
/// output tiles `nb .. nb + nt` of `w`. Nothing to compensate.
///
/// # Safety
/// `a` has `16 mt` readable rows of `w.kp()` bytes from row `m0` (as [`super::BlockI8`]; no CPU
/// feature is needed). Panics unless `mt`, `nt` are 1 or 2 and `nb + nt <= w.blocks()`.
pub unsafe fn block_i8(a: ActsI8, w: &PackedI8, at: Block, out: &mut Tiles) {
    at.check(w.blocks());
    let Block { m0, mt, nb, nt } = at;
    let kp = w.kp();
    for i in 0..mt {
        for r in 0..TILE {
            // SAFETY: as in `block_bf16`, one byte per input; i8 and u8 have the same layout.
            let x = unsafe {
                std::slice::from_raw_parts(a.ptr.add((m0 + i * TILE + r) * a.lda) as *const i8, kp)
            };
            for j in 0..nt {
                let s = row_i8(x, w.block(nb + j));
                for (d, v) in out[i * 2 + j][r * TILE..(r + 1) * TILE].iter_mut().zip(s) {
                    *d = f32::from_bits(v as u32);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Checks of block kernels against sums computed from the unpacked values; shared with the
    //! hardware kernels' tests.

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::super::pack::{PackedBf16, PackedI8};
    use super::super::{
        ActsBf16, ActsI8, Block, BlockBf16, BlockI8, TILE, Tiles, from_bf16, to_bf16,
    };
    use crate::random::normal_vec;

    /// Outputs and inputs of the test layers: not multiples of a tile, of a tile step, and
    /// (300, 600) more than one chunk of the AVX-512 kernels.
    const NS: [usize; 5] = [1, 5, 16, 17, 40];
    const KS: [usize; 8] = [1, 13, 31, 33, 64, 100, 300, 600];
    /// First rows of the blocks tried, and the rows of the activation buffers.
    const M0S: [usize; 4] = [0, 1, 16, 37];
    const ROWS: usize = 37 + 32;

    /// Every block of a layer of `blocks` output tiles.
    fn blocks_of(blocks: usize, mut f: impl FnMut(Block)) {
        for mt in 1..=2 {
            for nt in 1..=2usize.min(blocks) {
                for nb in 0..=blocks - nt {
                    for m0 in M0S {
                        f(Block { m0, mt, nb, nt });
                    }
                }
            }
        }
    }

    /// Checks `kernel` on random bf16 layers of every test size: every output of every block
    /// against the f64 sum of the products, to `1e-5 * sum |x w|`. Rows are `kp` wide, or 32
    /// wider with junk after `kp` that a kernel must not read.
    pub(crate) fn check_bf16(kernel: BlockBf16) {
        let mut rng = StdRng::seed_from_u64(7);
        let mut seed = 0;
        for n in NS {
            for k in KS {
                for extra in [0, 32] {
                    seed += 1;
                    let w = PackedBf16::new(&normal_vec(n * k, 1.0, seed), n, k);
                    let (kp, lda) = (w.kp(), w.kp() + extra);
                    let mut a = vec![0u16; ROWS * lda];
                    for (m, row) in a.chunks_exact_mut(lda).enumerate() {
                        let x = normal_vec(k, 1.0, seed * 1000 + m as u64);
                        for (d, v) in row.iter_mut().zip(x) {
                            *d = to_bf16(v);
                        }
                        for d in &mut row[kp..] {
                            *d = to_bf16(rng.random_range(-1e6..1e6));
                        }
                    }
                    let acts = ActsBf16 {
                        ptr: a.as_ptr(),
                        lda,
                    };
                    blocks_of(w.blocks(), |at| {
                        let Block { m0, mt, nb, nt } = at;
                        let mut out: Tiles = [[f32::NAN; TILE * TILE]; 4];
                        // SAFETY: ROWS >= m0 + 32 rows of lda >= kp values; the kernel's CPU
                        // features are checked by the caller.
                        unsafe { kernel(acts, &w, at, &mut out) };
                        for (i, j, r, c) in tiles(mt, nt) {
                            let (row, o) = (m0 + i * TILE + r, (nb + j) * TILE + c);
                            let (mut sum, mut mag) = (0f64, 0f64);
                            for x in 0..k {
                                let p = from_bf16(a[row * lda + x]) as f64
                                    * from_bf16(w.get(o, x)) as f64;
                                sum += p;
                                mag += p.abs();
                            }
                            let got = out[i * 2 + j][r * TILE + c] as f64;
                            assert!(
                                (got - sum).abs() <= 1e-5 * mag + 1e-30,
                                "n {n} k {k} lda {lda} block m0 {m0} mt {mt} nb {nb} nt {nt}: \
                                 row {row} output {o}: {got} != {sum} (sum |xw| {mag})"
                            );
                        }
                    });
                }
            }
        }
    }

    /// Checks `kernel` on random int8 layers of every test size, exactly. With `unsigned`, the
    /// rows hold `code + 128` (VNNI) and the sums are checked with and without the layer's
    /// `comp`; else signed codes.
    pub(crate) fn check_i8(kernel: BlockI8, unsigned: bool) {
        let mut rng = StdRng::seed_from_u64(8);
        let mut seed = 100;
        for n in NS {
            for k in KS {
                for extra in [0, 64] {
                    seed += 1;
                    let w = PackedI8::new(&normal_vec(n * k, 1.0, seed), n, k);
                    let (kp, lda) = (w.kp(), w.kp() + extra);
                    let off = if unsigned { 128 } else { 0 };
                    let mut codes = vec![0i32; ROWS * lda];
                    let mut a = vec![0u8; ROWS * lda];
                    for m in 0..ROWS {
                        for x in 0..lda {
                            let c = if x < k {
                                rng.random_range(-127..=127)
                            } else {
                                0
                            };
                            codes[m * lda + x] = c;
                            a[m * lda + x] = if x < kp {
                                (c + off) as u8
                            } else {
                                rng.random()
                            };
                        }
                    }
                    let acts = ActsI8 {
                        ptr: a.as_ptr(),
                        lda,
                    };
                    blocks_of(w.blocks(), |at| {
                        let Block { m0, mt, nb, nt } = at;
                        let mut out: Tiles = [[f32::from_bits(0xdead_beef); TILE * TILE]; 4];
                        // SAFETY: as in `check_bf16`, bytes.
                        unsafe { kernel(acts, &w, at, &mut out) };
                        for (i, j, r, c) in tiles(mt, nt) {
                            let (row, o) = (m0 + i * TILE + r, (nb + j) * TILE + c);
                            let signed: i32 = (0..k)
                                .map(|x| codes[row * lda + x] * w.get(o, x) as i32)
                                .sum();
                            let raw: i32 = (0..k)
                                .map(|x| (codes[row * lda + x] + off) * w.get(o, x) as i32)
                                .sum();
                            let got = out[i * 2 + j][r * TILE + c].to_bits() as i32;
                            assert_eq!(
                                got, raw,
                                "n {n} k {k} lda {lda} block m0 {m0} mt {mt} nb {nb} nt {nt}: \
                                 row {row} output {o}"
                            );
                            if unsigned {
                                assert_eq!(got - w.comp()[o], signed, "compensated, output {o}");
                            }
                        }
                    });
                }
            }
        }
    }

    /// `(i, j, r, c)`: tile, row and column of every sum of an `mt x nt` block.
    fn tiles(mt: usize, nt: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        (0..mt).flat_map(move |i| {
            (0..nt).flat_map(move |j| {
                (0..TILE).flat_map(move |r| (0..TILE).map(move |c| (i, j, r, c)))
            })
        })
    }

    #[test]
    fn bf16_matches_direct_sums() {
        check_bf16(super::block_bf16);
    }

    #[test]
    fn i8_matches_direct_sums() {
        check_i8(super::block_i8, false);
    }

    #[test]
    #[should_panic(expected = "block of 1 x 2 tiles")]
    fn block_past_the_outputs_panics() {
        let w = PackedI8::new(&[1.0; 17 * 3], 17, 3);
        let a = vec![0u8; 16 * w.kp()];
        let mut out: Tiles = [[0.0; TILE * TILE]; 4];
        // SAFETY: 16 rows of kp bytes; the block is refused before any is read.
        unsafe {
            super::block_i8(
                ActsI8 {
                    ptr: a.as_ptr(),
                    lda: w.kp(),
                },
                &w,
                Block {
                    m0: 0,
                    mt: 1,
                    nb: 1,
                    nt: 2,
                },
                &mut out,
            )
        };
    }
}
