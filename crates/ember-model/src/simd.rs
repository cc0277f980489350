//! GEMV rows for the dense layers at batch 1, and the Gram matrix of the dot interaction, per
//! instruction set, chosen once at start-up (the embedding stage's choice, [`Isa::selected`], so
//! `EMBER_ISA` steers both).
//!
//! The GEMV kernel computes four outputs per pass over `x`, so each `x` load feeds four FMAs
//! and four independent accumulator chains hide the FMA latency. Tails use masked loads (AVX-512)
//! or a scalar loop (AVX2).
//!
//! The Gram kernel (AVX-512 only; other sets use faer) computes the lower triangle of `T T^T`
//! from `T` and its transpose: four rows of `T` broadcast against 16 or 32 columns of `T^T` per
//! input, in blocks that stop at the diagonal, with no horizontal sums. At RM1's shape (33 vectors
//! of 64 per sample, batch 64) the interaction took 171-196 us against 214-221 us with faer's
//! small GEMM of the whole square (`benches/dense.rs`, `dot_interaction`; `EMBER_ISA=avx2` runs
//! faer). A first version that dotted one row against 16 others and summed the 16 accumulators
//! with a transposing reduction was no faster than faer: the shuffles cost as much as the FMAs.

use std::sync::OnceLock;

use ember_embed::Isa;

/// `y[o] = dot(w[o*k .. (o+1)*k], x)` for every `o` in `0..y.len()`.
type GemvFn = unsafe fn(w: &[f32], x: &[f32], y: &mut [f32]);

/// `z[i * zs + j] = dot(t_i, t_j)` for `j <= i < n`, `t_i = t[i * d .. (i + 1) * d]`; the rest
/// of each row of `z` up to the next multiple of 16 gets unspecified values.
type GramFn = unsafe fn(t: &[f32], n: usize, d: usize, z: &mut [f32], zs: usize, tt: &mut Vec<f32>);

/// The kernels of one instruction set.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// The set these kernels were built for (tests check it).
    #[cfg_attr(not(test), allow(dead_code))]
    isa: Isa,
    gemv: GemvFn,
    gram: Option<GramFn>,
}

impl Kernels {
    /// The kernels for `isa`; `None` if this CPU lacks it.
    pub fn for_isa(isa: Isa) -> Option<Kernels> {
        if !isa.available() {
            return None;
        }
        Some(match isa {
            Isa::Scalar => Kernels {
                isa,
                gemv: scalar::gemv,
                gram: None,
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Kernels {
                isa,
                gemv: avx2::gemv,
                gram: None,
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Kernels {
                isa,
                gemv: avx512::gemv,
                gram: Some(avx512::gram),
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => return None,
        })
    }

    /// The kernels of the selected instruction set.
    pub fn selected() -> Kernels {
        static K: OnceLock<Kernels> = OnceLock::new();
        *K.get_or_init(|| {
            let isa = Isa::selected().unwrap_or(Isa::Scalar);
            Kernels::for_isa(isa).unwrap_or(Kernels {
                isa: Isa::Scalar,
                gemv: scalar::gemv,
                gram: None,
            })
        })
    }

    #[cfg(test)]
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `y[o] = dot(w[o*k..(o+1)*k], x)` with `k = x.len()`.
    #[inline]
    pub fn gemv(&self, w: &[f32], x: &[f32], y: &mut [f32]) {
        assert!(
            w.len() >= y.len() * x.len(),
            "weight too short for the output"
        );
        // SAFETY: the CPU supports the kernel; `w` holds `y.len()` rows of `x.len()` values
        // (asserted above), which is all the kernel reads.
        unsafe { (self.gemv)(w, x, y) }
    }

    /// Whether this set has a Gram kernel ([`Kernels::gram`] returns `false` otherwise).
    #[cfg(test)]
    pub fn has_gram(&self) -> bool {
        self.gram.is_some()
    }

    /// The lower triangle of `T T^T` for the `n x d` row-major `T` in `t`:
    /// `z[i * zs + j] = dot(t_i, t_j)` for `j <= i < n`. `t` must hold `ceil(n / 16) * 16` rows
    /// (the rows past `n` are read, whatever they hold, and only feed entries past the triangle)
    /// and `zs >= ceil(n / 16) * 16`; entries of `z` right of the diagonal are overwritten with
    /// unspecified values. Returns `false` (and leaves `z` alone) if this set has no Gram kernel.
    /// `tt` is scratch (it holds `T` transposed).
    pub fn gram(
        &self,
        t: &[f32],
        n: usize,
        d: usize,
        z: &mut [f32],
        zs: usize,
        tt: &mut Vec<f32>,
    ) -> bool {
        let Some(g) = self.gram else {
            return false;
        };
        let n16 = n.div_ceil(16) * 16;
        assert!(t.len() >= n16 * d, "t must hold ceil(n / 16) * 16 rows");
        assert!(
            zs >= n16 && z.len() >= n * zs,
            "z must be n rows of at least ceil(n / 16) * 16"
        );
        // SAFETY: the CPU supports the kernel; t holds n16 rows of d and z n rows of zs >= n16
        // (asserted), which bound every load and store of the kernel.
        unsafe { g(t, n, d, z, zs, tt) };
        true
    }
}

mod scalar {
    /// 16 independent accumulators, which the compiler keeps in vector registers.
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        const L: usize = 16;
        let mut acc = [0f32; L];
        let n = a.len() / L * L;
        for (x, y) in a[..n].chunks_exact(L).zip(b[..n].chunks_exact(L)) {
            for i in 0..L {
                acc[i] += x[i] * y[i];
            }
        }
        let mut s: f32 = a[n..].iter().zip(&b[n..]).map(|(x, y)| x * y).sum();
        s += acc.iter().sum::<f32>();
        s
    }

    pub(super) unsafe fn gemv(w: &[f32], x: &[f32], y: &mut [f32]) {
        let k = x.len();
        for (o, v) in y.iter_mut().enumerate() {
            // SAFETY: a safe function in an unsafe signature (the kernel table's type).
            *v = unsafe { dot(&w[o * k..(o + 1) * k], x) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `b.len() >= a.len()`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads 8 floats at i < i + 8 <= n of both slices.
        unsafe {
            while i + 16 <= n {
                acc0 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(i + 8)),
                    _mm256_loadu_ps(pb.add(i + 8)),
                    acc1,
                );
                i += 16;
            }
            if i + 8 <= n {
                acc0 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
                i += 8;
            }
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        for j in i..n {
            s += a[j] * b[j];
        }
        s
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `w.len() >= y.len() * x.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemv(w: &[f32], x: &[f32], y: &mut [f32]) {
        let k = x.len();
        let body = k / 8 * 8;
        let px = x.as_ptr();
        let mut o = 0;
        while o + 4 <= y.len() {
            let r: [&[f32]; 4] = std::array::from_fn(|j| &w[(o + j) * k..(o + j + 1) * k]);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < body {
                // SAFETY: i + 8 <= body <= k, the length of x and of each row r[j].
                unsafe {
                    let xv = _mm256_loadu_ps(px.add(i));
                    for j in 0..4 {
                        acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(r[j].as_ptr().add(i)), xv, acc[j]);
                    }
                }
                i += 8;
            }
            for j in 0..4 {
                let mut s = hsum(acc[j]);
                for t in body..k {
                    s += r[j][t] * x[t];
                }
                y[o + j] = s;
            }
            o += 4;
        }
        for (oo, v) in y.iter_mut().enumerate().skip(o) {
            // SAFETY: same CPU features; the row is k long.
            *v = unsafe { dot(&w[oo * k..(oo + 1) * k], x) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[inline]
    fn tail_mask(rem: usize) -> __mmask16 {
        ((1u32 << rem) - 1) as __mmask16
    }

    /// # Safety
    /// The CPU must support AVX-512F; `b.len() >= a.len()`.
    #[target_feature(enable = "avx512f")]
    unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: full loads read i..i+16 <= n; the masked load reads only lanes below n - i.
        unsafe {
            while i + 32 <= n {
                acc0 =
                    _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
                acc1 = _mm512_fmadd_ps(
                    _mm512_loadu_ps(pa.add(i + 16)),
                    _mm512_loadu_ps(pb.add(i + 16)),
                    acc1,
                );
                i += 32;
            }
            if i + 16 <= n {
                acc0 =
                    _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
                i += 16;
            }
            if i < n {
                let m = tail_mask(n - i);
                acc1 = _mm512_fmadd_ps(
                    _mm512_maskz_loadu_ps(m, pa.add(i)),
                    _mm512_maskz_loadu_ps(m, pb.add(i)),
                    acc1,
                );
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    /// # Safety
    /// The CPU must support AVX-512F; `w.len() >= y.len() * x.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gemv(w: &[f32], x: &[f32], y: &mut [f32]) {
        let k = x.len();
        let body = k / 16 * 16;
        let m = tail_mask(k - body);
        let px = x.as_ptr();
        let mut o = 0;
        while o + 4 <= y.len() {
            let r: [*const f32; 4] =
                std::array::from_fn(|j| w[(o + j) * k..(o + j + 1) * k].as_ptr());
            let mut acc = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            // SAFETY: full loads read i..i+16 <= body <= k of x and of each k-long row; the masked
            // loads read only the k - body tail lanes.
            unsafe {
                while i < body {
                    let xv = _mm512_loadu_ps(px.add(i));
                    for j in 0..4 {
                        acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(r[j].add(i)), xv, acc[j]);
                    }
                    i += 16;
                }
                if body < k {
                    let xv = _mm512_maskz_loadu_ps(m, px.add(body));
                    for j in 0..4 {
                        acc[j] =
                            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, r[j].add(body)), xv, acc[j]);
                    }
                }
            }
            for j in 0..4 {
                y[o + j] = _mm512_reduce_add_ps(acc[j]);
            }
            o += 4;
        }
        for (oo, v) in y.iter_mut().enumerate().skip(o) {
            // SAFETY: same CPU features; the row is k long.
            *v = unsafe { dot(&w[oo * k..(oo + 1) * k], x) };
        }
    }

    /// # Safety
    /// The CPU must support AVX-512F; `t` holds `ceil(n / 16) * 16` rows of `d`, `z` holds `n`
    /// rows of `zs >= ceil(n / 16) * 16`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gram(
        t: &[f32],
        n: usize,
        d: usize,
        z: &mut [f32],
        zs: usize,
        tt: &mut Vec<f32>,
    ) {
        let n16 = n.div_ceil(16) * 16;
        if tt.len() < d * n16 {
            tt.resize(d * n16, 0.0);
        }
        // SAFETY: t holds n16 rows of d (contract), tt d rows of n16 (just sized).
        unsafe { crate::gemm::transpose(t.as_ptr(), n16, d, d, tt.as_mut_ptr(), n16) };
        let mut i0 = 0;
        while i0 < n {
            let rows = (n - i0).min(4);
            // Column blocks covering j <= i0 + rows - 1.
            let blocks = (i0 + rows - 1) / 16 + 1;
            let mut jb = 0;
            while jb < blocks {
                // SAFETY: rows i0 .. i0 + 4 <= n16 of t (i0 is a multiple of 4 below n <= n16,
                // a multiple of 16), columns jb * 16 .. (jb + JB) * 16 <= n16 of tt, and the
                // stores go to rows below n of z, columns below n16 <= zs (contract).
                unsafe {
                    let at = GramTile { i0, rows, jb };
                    if jb + 2 <= blocks {
                        gram_tile::<2>(t, d, tt, n16, at, z, zs);
                        jb += 2;
                    } else {
                        gram_tile::<1>(t, d, tt, n16, at, z, zs);
                        jb += 1;
                    }
                }
            }
            i0 += 4;
        }
    }

    /// Which sums a [`gram_tile`] computes: rows `i0 .. i0 + rows` (`rows <= 4`) of the output,
    /// from column block `jb` (16 columns a block).
    #[derive(Clone, Copy)]
    struct GramTile {
        i0: usize,
        rows: usize,
        jb: usize,
    }

    /// `z[i][16 jb ..][..16 JB] = sum_c t[i][c] tt[c][16 jb ..][..16 JB]` for the rows of `at`:
    /// four rows broadcast against `JB` vectors of `tt` per input, `4 JB` independent
    /// accumulators.
    ///
    /// # Safety
    /// AVX-512F; `t` holds rows `i0 .. i0 + 4` of `d`, `tt` is `d x n16` with
    /// `16 (jb + JB) <= n16`, and `z` has rows `i0 .. i0 + rows` of `zs >= 16 (jb + JB)`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn gram_tile<const JB: usize>(
        t: &[f32],
        d: usize,
        tt: &[f32],
        n16: usize,
        at: GramTile,
        z: &mut [f32],
        zs: usize,
    ) {
        let GramTile { i0, rows, jb } = at;
        let (pt, ptt) = (
            t.as_ptr().wrapping_add(i0 * d),
            tt.as_ptr().wrapping_add(jb * 16),
        );
        let mut acc = [[_mm512_setzero_ps(); JB]; 4];
        for c in 0..d {
            // SAFETY: c < d; the contract bounds the rows and columns read.
            unsafe {
                let mut tv = [_mm512_setzero_ps(); JB];
                for (q, v) in tv.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(ptt.add(c * n16 + q * 16));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*pt.add(r * d + c));
                    for q in 0..JB {
                        a[q] = _mm512_fmadd_ps(w, tv[q], a[q]);
                    }
                }
            }
        }
        let pz = z.as_mut_ptr();
        for (r, a) in acc.iter().enumerate().take(rows) {
            for (q, v) in a.iter().enumerate() {
                // SAFETY: row i0 + r < i0 + rows of z, columns 16 (jb + q) .. + 16 <= zs.
                unsafe { _mm512_storeu_ps(pz.add((i0 + r) * zs + (jb + q) * 16), *v) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::normal_vec;
    use proptest::prelude::*;

    fn dot_ref(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    proptest! {
        #[test]
        fn kernels_match_reference(k in 0usize..150, rows in 0usize..11, seed: u64) {
            let w = normal_vec(rows * k, 1.0, seed);
            let x = normal_vec(k, 1.0, seed ^ 5);
            for isa in Isa::available_all() {
                let kern = Kernels::for_isa(isa).unwrap();
                let mut y = vec![f32::NAN; rows];
                kern.gemv(&w, &x, &mut y);
                for o in 0..rows {
                    let r = &w[o * k..(o + 1) * k];
                    let want = dot_ref(r, &x);
                    let tol = 1e-5 * (1.0 + (k as f64).sqrt() * 2.0);
                    prop_assert!((y[o] as f64 - want).abs() <= tol, "{isa} gemv row {o}: {} vs {want}", y[o]);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn gram_matches_reference(n in 0usize..50, d in 1usize..80, seed: u64) {
            let n16 = n.div_ceil(16) * 16;
            // Rows past n hold values that must not reach the triangle.
            let t = normal_vec(n16 * d, 1.0, seed);
            for isa in Isa::available_all() {
                let kern = Kernels::for_isa(isa).unwrap();
                let zs = n16 + 3;
                let mut z = vec![f32::NAN; n * zs];
                if !kern.gram(&t, n, d, &mut z, zs, &mut Vec::new()) {
                    continue;
                }
                for i in 0..n {
                    for j in 0..=i {
                        let want = dot_ref(&t[i * d..(i + 1) * d], &t[j * d..(j + 1) * d]);
                        let tol = 1e-5 * (1.0 + (d as f64).sqrt() * 2.0);
                        prop_assert!((z[i * zs + j] as f64 - want).abs() <= tol, "{isa} gram ({i}, {j}): {} vs {want}", z[i * zs + j]);
                    }
                    // Past the padded width, nothing written.
                    prop_assert!(z[i * zs + n16..(i + 1) * zs].iter().all(|v| v.is_nan()));
                }
            }
        }
    }

    #[test]
    fn avx512_has_a_gram_kernel() {
        if let Some(k) = Kernels::for_isa(Isa::Avx512) {
            assert!(k.has_gram());
        } else {
            eprintln!("no AVX-512 here: the Gram kernel is not tested on this machine");
        }
    }

    #[test]
    fn every_listed_isa_has_kernels() {
        for isa in Isa::available_all() {
            assert_eq!(Kernels::for_isa(isa).unwrap().isa(), isa);
        }
        assert!(Kernels::for_isa(Isa::Scalar).is_some());
    }
}
