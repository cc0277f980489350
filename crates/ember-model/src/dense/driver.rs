//! One layer through a block kernel: blocks of 32 rows x 32 outputs over the threads, each
//! block's sums finished by the fused [`Epilogue`] as soon as they leave the kernel, so that a
//! layer's output is written once, in the form the next step reads.
//!
//! Order of work: output blocks in chunks of about 1 MiB of weights ([`chunk_blocks`]: the
//! chunk stays in L2), every 32-row block against a chunk, block after block along the
//! outputs. Threads split the outputs (each reads all rows and its share of the weights) or,
//! for layers of few outputs, the rows.

use std::ops::Range;

use rayon::prelude::*;

use super::pack::{PackedBf16, PackedI8};
use super::{ActsBf16, ActsI8, Block, BlockBf16, BlockI8, DenseDType, DenseIsa, TILE, Tiles};
use crate::error::Result;

/// The kernels of one family.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    isa: DenseIsa,
    bf16: BlockBf16,
    i8: BlockI8,
}

impl Kernels {
    /// The kernels of `isa`, or `None` where this machine cannot run `dtype` on it.
    pub fn for_isa(isa: DenseIsa, dtype: DenseDType) -> Option<Kernels> {
        if !isa.available(dtype) {
            return None;
        }
        Some(match isa {
            DenseIsa::Emulated => Kernels {
                isa,
                bf16: super::emulated::block_bf16,
                i8: super::emulated::block_i8,
            },
            #[cfg(target_arch = "x86_64")]
            DenseIsa::Avx512 => Kernels {
                isa,
                bf16: if super::cpu::bf16_dot_fast() {
                    super::avx512::block_bf16
                } else {
                    super::avx512::block_bf16_fma
                },
                i8: super::avx512::block_i8,
            },
            #[cfg(target_arch = "x86_64")]
            DenseIsa::Amx => Kernels {
                isa,
                bf16: super::amx::block_bf16,
                i8: super::amx::block_i8,
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => return None,
        })
    }

    /// The kernels chosen for `dtype` in this process ([`DenseIsa::selected`]).
    pub fn selected(dtype: DenseDType) -> Result<Kernels> {
        let isa = DenseIsa::selected(dtype)?;
        Ok(Kernels::for_isa(isa, dtype).expect("selected families are available"))
    }

    pub fn isa(&self) -> DenseIsa {
        self.isa
    }

    /// Whether the int8 kernel reads `u8 = code + 128` (VNNI's unsigned-by-signed product).
    pub fn unsigned_i8(&self) -> bool {
        self.isa == DenseIsa::Avx512
    }

    /// Whether the epilogue may use AVX-512 (every family but the emulation needs it).
    fn simd(&self) -> bool {
        self.isa != DenseIsa::Emulated
    }

    /// Runs `f` with this thread's tiles configured when the kernels are AMX's.
    fn with_tiles<R>(&self, f: impl FnOnce() -> R) -> R {
        #[cfg(target_arch = "x86_64")]
        if self.isa == DenseIsa::Amx {
            // SAFETY: the Amx family is only built where `available` found the CPU's tiles and
            // the kernel's permission.
            unsafe { super::amx::configure() };
            let r = f();
            // SAFETY: as above.
            unsafe { super::amx::release() };
            return r;
        }
        f()
    }
}

/// A row-major f32 matrix written or read by threads at disjoint cells.
#[derive(Debug, Clone, Copy)]
pub struct MatF32 {
    pub ptr: *mut f32,
    pub ld: usize,
}

/// A row-major bf16 matrix (bits) written by threads at disjoint cells.
#[derive(Debug, Clone, Copy)]
pub struct MatBf16 {
    pub ptr: *mut u16,
    pub ld: usize,
}

// SAFETY: threads write disjoint (row, column) cells (each block is one task's), and the
// buffers they point into outlive the layer call that holds them.
unsafe impl Send for MatF32 {}
// SAFETY: as above.
unsafe impl Sync for MatF32 {}
// SAFETY: as above.
unsafe impl Send for MatBf16 {}
// SAFETY: as above.
unsafe impl Sync for MatBf16 {}

/// What a layer does to its sums before writing them, per output `(m, n)` with sum `v`:
/// `v += bias[n]`; with `group = (g, per)`, `v += g[m / per, n]` (a value broadcast over each
/// `per` rows: the part of a factored layer computed once a sample, `graph/factor.rs`);
/// `v = max(v, 0)` with `relu`; with `cross = (x0, xl)`, `v = x0[m, n] * v +
/// xl[m, n]` (the cross net's step; `xl` may be `f32_out` itself, read before it is written, or
/// `x0` for the first layer); then `v` written to `f32_out` and, rounded, to `bf16_out`.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue<'a> {
    pub bias: &'a [f32],
    pub group: Option<(MatF32, usize)>,
    pub relu: bool,
    pub cross: Option<(MatF32, MatF32)>,
    pub f32_out: Option<MatF32>,
    pub bf16_out: Option<MatBf16>,
}

/// The sums' scales of an int8 layer: per row of activations, per output, and the VNNI
/// compensation.
#[derive(Clone, Copy)]
struct Dequant<'a> {
    sx: &'a [f32],
    sw: &'a [f32],
    comp: Option<&'a [i32]>,
}

/// How a layer's sums become its outputs: dequantized (int8) and passed through the epilogue,
/// for `m` rows of `n` outputs.
#[derive(Clone, Copy)]
struct Finish<'a> {
    ep: &'a Epilogue<'a>,
    m: usize,
    n: usize,
    dq: Option<Dequant<'a>>,
}

/// `f` applied to rows `sel` of one tile of sums at rows `r0 ..`, outputs `c0 ..` (clipped to
/// the layer's `m`, `n`).
#[inline(always)]
fn finish_tile(
    f: &Finish<'_>,
    t: &mut [f32; TILE * TILE],
    (r0, c0): (usize, usize),
    sel: Range<usize>,
) {
    let Finish { ep, m, n, dq } = *f;
    let rows = sel.start..sel.end.min(m.saturating_sub(r0));
    let cols = n.saturating_sub(c0).min(TILE);
    if let Some(d) = dq {
        for r in rows.clone() {
            let sx = d.sx[r0 + r];
            for c in 0..TILE {
                let mut acc = t[r * TILE + c].to_bits() as i32;
                if let Some(comp) = d.comp {
                    acc -= comp[c0 + c];
                }
                t[r * TILE + c] = acc as f32 * sx * d.sw[c0 + c];
            }
        }
    }
    for r in rows {
        let row = &mut t[r * TILE..r * TILE + cols];
        for (c, v) in row.iter_mut().enumerate() {
            *v += ep.bias[c0 + c];
        }
        if let Some((g, per)) = ep.group {
            // SAFETY: row (r0 + r) / per of the group matrix holds n values (the caller's
            // contract), read only.
            unsafe {
                let gp = g.ptr.add((r0 + r) / per * g.ld + c0);
                for (c, v) in row.iter_mut().enumerate() {
                    *v += *gp.add(c);
                }
            }
        }
        if ep.relu {
            row.iter_mut().for_each(|v| *v = v.max(0.0));
        }
        let at = |mm: &MatF32| (r0 + r) * mm.ld + c0;
        if let Some((x0, xl)) = ep.cross {
            // SAFETY: this block's cells of x0, xl and the outputs (rows < m, columns < n) are
            // in their buffers (the caller's contract) and written by this task alone.
            unsafe {
                let (x, l) = (x0.ptr.add(at(&x0)), xl.ptr.add(at(&xl)));
                for (c, v) in row.iter_mut().enumerate() {
                    *v = *x.add(c) * *v + *l.add(c);
                }
            }
        }
        if let Some(out) = ep.f32_out {
            // SAFETY: as above.
            unsafe {
                let o = out.ptr.add(at(&out));
                for (c, v) in row.iter().enumerate() {
                    *o.add(c) = *v;
                }
            }
        }
        if let Some(out) = ep.bf16_out {
            // SAFETY: as above.
            unsafe {
                let o = out.ptr.add((r0 + r) * out.ld + c0);
                for (c, v) in row.iter().enumerate() {
                    *o.add(c) = round_bf16(*v);
                }
            }
        }
    }
}

/// `f32 -> bf16` bits, round to nearest even, in a form that vectorizes (NaN stays NaN).
#[inline(always)]
pub(crate) fn round_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    let r = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if v.is_nan() {
        ((b >> 16) as u16) | 0x40
    } else {
        r
    }
}

/// [`finish_tile`] in AVX-512 registers: one row of 16 outputs a step, masked at the layer's
/// last outputs. (The plain loops compiled for AVX-512 cost as much as the AMX kernel itself on
/// DLRM-v2's cross net: branches per row and scalar conversions.)
///
/// # Safety
/// The CPU has AVX-512F/BW/VL; as [`finish_tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn finish_tile_avx512(
    f: &Finish<'_>,
    t: &mut [f32; TILE * TILE],
    (r0, c0): (usize, usize),
    sel: Range<usize>,
) {
    use std::arch::x86_64::*;
    let Finish { ep, m, n, dq } = *f;
    let rows = sel.start..sel.end.min(m.saturating_sub(r0));
    let cols = n.saturating_sub(c0).min(TILE);
    if rows.is_empty() || cols == 0 {
        return;
    }
    let mask = super::lanes(cols);
    // SAFETY: every masked load and store touches columns c0 .. c0 + cols < n of rows
    // r0 .. r0 + rows < m: inside the bias (n values), the scales (padded to whole tiles),
    // and the epilogue's matrices (the caller's contract; the group matrix's rows are
    // (r0 + r) / per < ceil(m / per)); the tile has 16 x 16 values.
    unsafe {
        let bias = _mm512_maskz_loadu_ps(mask, ep.bias.as_ptr().add(c0));
        let (sw, comp) = match dq {
            Some(d) => (
                _mm512_loadu_ps(d.sw.as_ptr().add(c0)),
                d.comp
                    .map(|c| _mm512_loadu_si512(c.as_ptr().add(c0).cast())),
            ),
            None => (_mm512_setzero_ps(), None),
        };
        for r in rows {
            let tp = t.as_ptr().add(r * TILE);
            let mut v = match dq {
                Some(d) => {
                    let mut acc = _mm512_loadu_si512(tp.cast());
                    if let Some(c) = comp {
                        acc = _mm512_sub_epi32(acc, c);
                    }
                    let sx = _mm512_set1_ps(d.sx[r0 + r]);
                    _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), sx), sw)
                }
                None => _mm512_loadu_ps(tp),
            };
            v = _mm512_add_ps(v, bias);
            if let Some((g, per)) = ep.group {
                let gp = g.ptr.add((r0 + r) / per * g.ld + c0);
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, gp));
            }
            if ep.relu {
                v = _mm512_max_ps(v, _mm512_setzero_ps());
            }
            // The next block along the outputs reads and writes the same rows 32 columns on:
            // 32 rows x 2-4 matrices are more streams than the hardware prefetchers follow, so
            // ask for those lines now (a prefetch never faults, past a row's end included).
            if let Some((x0, xl)) = ep.cross {
                let xp = x0.ptr.add((r0 + r) * x0.ld + c0);
                let lp = xl.ptr.add((r0 + r) * xl.ld + c0);
                _mm_prefetch::<_MM_HINT_T0>(xp.wrapping_add(2 * TILE) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(lp.wrapping_add(2 * TILE) as *const i8);
                let x = _mm512_maskz_loadu_ps(mask, xp);
                v = _mm512_fmadd_ps(x, v, _mm512_maskz_loadu_ps(mask, lp));
            }
            if let Some(out) = ep.f32_out {
                let o = out.ptr.add((r0 + r) * out.ld + c0);
                _mm_prefetch::<_MM_HINT_T0>(o.wrapping_add(2 * TILE) as *const i8);
                _mm512_mask_storeu_ps(o, mask, v);
            }
            if let Some(out) = ep.bf16_out {
                // Round to nearest even on the bits (no AVX512_BF16 needed); NaN stays NaN.
                let b = _mm512_castps_si512(v);
                let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
                let up = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                let quiet = _mm512_or_si512(b, _mm512_set1_epi32(0x40 << 16));
                let r16 = _mm512_srli_epi32::<16>(_mm512_mask_blend_epi32(nan, up, quiet));
                let o = out.ptr.add((r0 + r) * out.ld + c0);
                _mm256_mask_storeu_epi16(o.cast(), mask, _mm512_cvtepi32_epi16(r16));
            }
        }
    }
}

/// How one layer's blocks are cut into tasks: its outputs in whole block pairs (each thread
/// reading its share of the weights) where the pairs share out evenly, else its rows where there
/// are enough. (DIN's layer of 80 outputs, 3 block pairs, split 2 : 1 on 2 threads: one thread
/// did four fifths of the sums.)
fn tasks(m: usize, blocks: usize, threads: usize) -> Vec<(Range<usize>, Range<usize>)> {
    let mp = m.next_multiple_of(TILE);
    let rows_enough = mp >= 64 * threads;
    if threads <= 1 || (blocks < 2 * threads && !rows_enough) {
        return vec![(0..mp, 0..blocks)];
    }
    let pairs = blocks.div_ceil(2);
    let even = pairs.is_multiple_of(threads) || pairs >= 4 * threads;
    if blocks >= 2 * threads && (even || !rows_enough) {
        // Outputs split in whole block pairs.
        let per = blocks.div_ceil(threads).next_multiple_of(2);
        (0..blocks.div_ceil(per))
            .map(|i| (0..mp, i * per..((i + 1) * per).min(blocks)))
            .collect()
    } else {
        let per = mp.div_ceil(threads).next_multiple_of(32);
        (0..mp.div_ceil(per))
            .map(|i| (i * per..((i + 1) * per).min(mp), 0..blocks))
            .collect()
    }
}

/// Called by a kernel after each of its `steps` tile steps as `hook(step, steps)`.
type Hook<'h> = &'h mut dyn FnMut(usize, usize);

/// A block kernel as the driver calls it: the block's sums into the tiles, the hook called
/// along.
type BlockFn<'a> = dyn Fn(Block, &mut Tiles, Hook<'_>) + Sync + 'a;

/// Finishes rows `sel` of a tile of sums at `(row, output)`.
type FinishFn<'a> = dyn Fn(&mut [f32; TILE * TILE], (usize, usize), Range<usize>) + Sync + 'a;

/// A block whose sums wait in the sums buffer `idx` (of two) to be finished.
#[derive(Clone, Copy)]
struct Pending {
    at: Block,
    idx: usize,
}

impl Pending {
    /// Finishes its rows `done .. target` (rows counted over its tiles in order), 16 at most
    /// per tile at a time.
    fn finish_rows(
        &self,
        tiles: &mut Tiles,
        finish: &FinishFn<'_>,
        done: &mut usize,
        target: usize,
    ) {
        while *done < target {
            let Block { m0, nb, nt, .. } = self.at;
            let ti = *done / TILE;
            let (i, j) = (ti / nt, ti % nt);
            let end = target.min((ti + 1) * TILE);
            let at = (m0 + i * TILE, (nb + j) * TILE);
            finish(
                &mut tiles[i * 2 + j],
                at,
                *done - ti * TILE..end - ti * TILE,
            );
            *done = end;
        }
    }

    fn rows(&self) -> usize {
        self.at.mt * self.at.nt * TILE
    }
}

/// Output blocks per chunk: a chunk's weights (at most ~1 MiB) stay in L2 while every row
/// block of the layer runs against them, block after block along the outputs. Rows then meet
/// consecutive outputs (each row written in runs of up to 4 KiB), which the prefetchers follow:
/// the layers of few inputs and many outputs (the cross net's 512 x 3456) were bound by writing
/// and re-reading their outputs one 32-column stripe at a time.
fn chunk_blocks(blocks: usize, kp_bytes: usize) -> usize {
    ((1 << 20) / (TILE * kp_bytes)).clamp(2, blocks.max(2)) & !1
}

/// Runs `block` over every block of the layer (`kp_bytes` bytes of inputs a row), each
/// block's sums finished while the next block computes (the kernel's hook spreads the previous
/// block's rows over its steps).
fn drive(
    k: &Kernels,
    m: usize,
    blocks: usize,
    kp_bytes: usize,
    threads: usize,
    block: &BlockFn<'_>,
    finish: &FinishFn<'_>,
) {
    let ncb = chunk_blocks(blocks, kp_bytes);
    let task = |(rows, outs): (Range<usize>, Range<usize>)| {
        k.with_tiles(|| {
            let [mut s0, mut s1]: [Tiles; 2] = [[[0.0; TILE * TILE]; 4]; 2];
            let mut pending: Option<Pending> = None;
            let mut idx = 0;
            let mut nc = outs.start;
            while nc < outs.end {
                let nc_end = (nc + ncb).min(outs.end);
                let mut m0 = rows.start;
                while m0 < rows.end {
                    let mt = if rows.end - m0 >= 2 * TILE { 2 } else { 1 };
                    let mut nb = nc;
                    while nb < nc_end {
                        let nt = (nc_end - nb).min(2);
                        let (out, prev) = if idx == 0 {
                            (&mut s0, &mut s1)
                        } else {
                            (&mut s1, &mut s0)
                        };
                        let mut done = 0;
                        let mut hook = |s: usize, n: usize| {
                            if let Some(p) = pending {
                                let target = if s + 1 >= n {
                                    p.rows()
                                } else {
                                    p.rows() * (s + 1) / n
                                };
                                p.finish_rows(prev, finish, &mut done, target);
                            }
                        };
                        let at = Block { m0, mt, nb, nt };
                        block(at, out, &mut hook);
                        if let Some(p) = pending {
                            p.finish_rows(prev, finish, &mut done, p.rows());
                        }
                        pending = Some(Pending { at, idx });
                        idx ^= 1;
                        nb += nt;
                    }
                    m0 += mt * TILE;
                }
                nc = nc_end;
            }
            if let Some(p) = pending {
                let mut done = 0;
                let last = if p.idx == 0 { &mut s0 } else { &mut s1 };
                p.finish_rows(last, finish, &mut done, p.rows());
            }
        })
    };
    let list = tasks(m, blocks, threads);
    if list.len() == 1 {
        list.into_iter().for_each(task);
    } else {
        list.into_par_iter().for_each(task);
    }
}

fn finisher<'a>(
    k: &'a Kernels,
    f: Finish<'a>,
) -> impl Fn(&mut [f32; TILE * TILE], (usize, usize), Range<usize>) + Sync + 'a {
    move |t, at, sel| {
        #[cfg(target_arch = "x86_64")]
        if k.simd() {
            // SAFETY: every family but the emulation runs on CPUs with AVX-512F/BW/VL.
            unsafe { finish_tile_avx512(&f, t, at, sel) };
            return;
        }
        finish_tile(&f, t, at, sel)
    }
}

/// One bf16 layer: `a` holds `m` rows (and readable padding to a multiple of 16 rows) of
/// `w.kp()` inputs; the epilogue's buffers hold `m` rows of `w.n()` outputs at their strides.
pub fn linear_bf16(
    k: &Kernels,
    a: ActsBf16,
    m: usize,
    w: &PackedBf16,
    ep: &Epilogue<'_>,
    threads: usize,
) {
    assert!(ep.bias.len() >= w.n());
    let block = |at, t: &mut Tiles, hook: Hook<'_>| {
        // SAFETY: `a` covers every block's rows (the caller's contract, rows padded to 16);
        // the family is available (Kernels are only built so) and configured by `drive`.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if k.isa == DenseIsa::Amx {
                return super::amx::block_bf16_hooked(a, w, at, t, hook);
            }
            (k.bf16)(a, w, at, t)
        }
    };
    let n = w.n();
    let finish = finisher(k, Finish { ep, m, n, dq: None });
    drive(k, m, w.blocks(), w.kp() * 2, threads, &block, &finish);
}

/// One int8 layer, as [`linear_bf16`]: `a` holds codes (`u8` = code + 128 where
/// [`Kernels::unsigned_i8`]) and `sx` the rows' scales.
pub fn linear_i8(
    k: &Kernels,
    a: ActsI8,
    sx: &[f32],
    m: usize,
    w: &PackedI8,
    ep: &Epilogue<'_>,
    threads: usize,
) {
    assert!(ep.bias.len() >= w.n() && sx.len() >= m);
    let block = |at, t: &mut Tiles, hook: Hook<'_>| {
        // SAFETY: as in `linear_bf16`.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if k.isa == DenseIsa::Amx {
                return super::amx::block_i8_hooked(a, w, at, t, hook);
            }
            (k.i8)(a, w, at, t)
        }
    };
    let dq = Dequant {
        sx,
        sw: w.scale(),
        comp: k.unsigned_i8().then_some(w.comp()),
    };
    let (n, dq) = (w.n(), Some(dq));
    let finish = finisher(k, Finish { ep, m, n, dq });
    drive(k, m, w.blocks(), w.kp(), threads, &block, &finish);
}
