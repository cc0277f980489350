//! The attention kernel's two inner loops (`attention/block.rs`) in AVX2 / FMA intrinsics, for the
//! CPUs without AVX-512 (AMD Zen 2 / 3, older Xeons). The portable loops compiled for AVX2 ran
//! the whole kernel at 14.5 GFLOP/s a core on an AMD EPYC (Zen 3) at 4,096 history items x
//! 2,048 candidates: the compiler kept their 4 x 64 sums on the stack. A 4 x 64 block is 32 ymm
//! sums, twice the register file, so it runs here as four tiles of 2 x 32 (8 sums, 4 loads and
//! 2 broadcasts in registers), each a pass over the shared dimension.

#[cfg(target_arch = "x86_64")]
pub use x86::{scores_4x64, silu_scaled, values_4x64};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::zmm::ROWS as BQ;

    /// `out[x][c] = sum_i a[x][i * a_step] * b[i * b_step + c]` for the tile's two rows `x`,
    /// `c < 32`, `i < n`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; for every `i < n`, `a[0][i * a_step]`, `a[1][i * a_step]` and
    /// `b[i * b_step .. i * b_step + 32]` are readable; both outputs hold 32 values.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_2x32(
        [a0, a1]: [*const f32; 2],
        a_step: usize,
        b: *const f32,
        b_step: usize,
        n: usize,
        [out0, out1]: [&mut [f32]; 2],
    ) {
        let mut c00 = _mm256_setzero_ps();
        let mut c01 = _mm256_setzero_ps();
        let mut c02 = _mm256_setzero_ps();
        let mut c03 = _mm256_setzero_ps();
        let mut c10 = _mm256_setzero_ps();
        let mut c11 = _mm256_setzero_ps();
        let mut c12 = _mm256_setzero_ps();
        let mut c13 = _mm256_setzero_ps();
        for i in 0..n {
            // SAFETY: `i < n`: the caller made these reads valid.
            unsafe {
                let p = b.add(i * b_step);
                let l0 = _mm256_loadu_ps(p);
                let l1 = _mm256_loadu_ps(p.add(8));
                let l2 = _mm256_loadu_ps(p.add(16));
                let l3 = _mm256_loadu_ps(p.add(24));
                let x0 = _mm256_broadcast_ss(&*a0.add(i * a_step));
                let x1 = _mm256_broadcast_ss(&*a1.add(i * a_step));
                c00 = _mm256_fmadd_ps(x0, l0, c00);
                c01 = _mm256_fmadd_ps(x0, l1, c01);
                c02 = _mm256_fmadd_ps(x0, l2, c02);
                c03 = _mm256_fmadd_ps(x0, l3, c03);
                c10 = _mm256_fmadd_ps(x1, l0, c10);
                c11 = _mm256_fmadd_ps(x1, l1, c11);
                c12 = _mm256_fmadd_ps(x1, l2, c12);
                c13 = _mm256_fmadd_ps(x1, l3, c13);
            }
        }
        assert!(out0.len() >= 32 && out1.len() >= 32);
        // SAFETY: each output holds 32 values (asserted).
        unsafe {
            let (o0, o1) = (out0.as_mut_ptr(), out1.as_mut_ptr());
            _mm256_storeu_ps(o0, c00);
            _mm256_storeu_ps(o0.add(8), c01);
            _mm256_storeu_ps(o0.add(16), c02);
            _mm256_storeu_ps(o0.add(24), c03);
            _mm256_storeu_ps(o1, c10);
            _mm256_storeu_ps(o1.add(8), c11);
            _mm256_storeu_ps(o1.add(16), c12);
            _mm256_storeu_ps(o1.add(24), c13);
        }
    }

    /// Scores of 4 keys `k` (their `qk` values) against the block's 64 transposed queries `qt`
    /// (`qk` rows of 64): `out[x][r] = sum_a k[x][a] * qt[a * 64 + r]`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores_4x64(k: &[&[f32]; 4], qt: &[f32], qk: usize) -> [[f32; 64]; 4] {
        assert!(qt.len() >= qk * BQ && k.iter().all(|k| k.len() >= qk));
        let mut out = [[0f32; 64]; 4];
        if qk == 0 {
            return out;
        }
        let [o0, o1, o2, o3] = &mut out;
        for (x, (p, q)) in [(o0, o1), (o2, o3)].into_iter().enumerate() {
            let a = [k[2 * x].as_ptr(), k[2 * x + 1].as_ptr()];
            let (p0, p1) = p.split_at_mut(32);
            let (q0, q1) = q.split_at_mut(32);
            // SAFETY: AVX2 and FMA (the caller's promise); keys' values `a < qk` and query rows
            // `a * 64 + 32h .. + 32` for `a < qk`, `h < 2` are in bounds (asserted above).
            unsafe {
                tile_2x32(a, 1, qt.as_ptr(), BQ, qk, [p0, q0]);
                tile_2x32(a, 1, qt.as_ptr().add(32), BQ, qk, [p1, q1]);
            }
        }
        out
    }

    /// Rows `r0 .. r0 + 4` of the scores `st` (key-major, 64 rows a key) times the values of
    /// `hi` keys, 64 of them at `v[j * stride ..]`: `out[x][e] = sum_j st[j * 64 + r0 + x] *
    /// v[j * stride + e]`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn values_4x64(
        st: &[f32],
        r0: usize,
        v: &[f32],
        stride: usize,
        hi: usize,
    ) -> [[f32; 64]; 4] {
        assert!(
            hi == 0 || ((hi - 1) * stride + 64 <= v.len() && (hi - 1) * BQ + r0 + 4 <= st.len())
        );
        let mut out = [[0f32; 64]; 4];
        if hi == 0 {
            return out;
        }
        let [o0, o1, o2, o3] = &mut out;
        for (x, (p, q)) in [(o0, o1), (o2, o3)].into_iter().enumerate() {
            // SAFETY: `st[r0 + 2x + 1 + (hi - 1) * 64]` is in bounds (asserted, `hi > 0`).
            let a = unsafe { [st.as_ptr().add(r0 + 2 * x), st.as_ptr().add(r0 + 2 * x + 1)] };
            let (p0, p1) = p.split_at_mut(32);
            let (q0, q1) = q.split_at_mut(32);
            // SAFETY: AVX2 and FMA (the caller's promise); scores `j * 64 + r0 + 2x (+1)` and
            // values `j * stride + 32h .. + 32` for `j < hi`, `h < 2` are in bounds (asserted).
            unsafe {
                tile_2x32(a, BQ, v.as_ptr(), stride, hi, [p0, q0]);
                tile_2x32(a, BQ, v.as_ptr().add(32), stride, hi, [p1, q1]);
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use rand::{Rng, SeedableRng};

        fn random(n: usize, rng: &mut rand::rngs::StdRng) -> Vec<f32> {
            (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
        }

        #[test]
        #[cfg_attr(not(ember_avx2), ignore = "this CPU has no AVX2 / FMA")]
        fn both_loops_match_plain_sums_on_odd_lengths() {
            let mut rng = rand::rngs::StdRng::seed_from_u64(5);
            for qk in [0, 1, 3, 17, 128] {
                let keys: Vec<Vec<f32>> = (0..4).map(|_| random(qk, &mut rng)).collect();
                let qt = random(qk * BQ, &mut rng);
                let k: [&[f32]; 4] = std::array::from_fn(|x| keys[x].as_slice());
                // SAFETY: the cfg says the CPU has AVX2 and FMA.
                let got = unsafe { scores_4x64(&k, &qt, qk) };
                for x in 0..4 {
                    for r in 0..BQ {
                        let want: f32 = (0..qk).map(|a| keys[x][a] * qt[a * BQ + r]).sum();
                        assert!(
                            (got[x][r] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{qk} {x} {r}"
                        );
                    }
                }
            }
            for (hi, stride, r0) in [(0, 64, 0), (1, 64, 0), (5, 70, 60), (33, 128, 12)] {
                let st = random(hi.max(1) * BQ, &mut rng);
                let v = random(hi.max(1) * stride, &mut rng);
                // SAFETY: as above.
                let got = unsafe { values_4x64(&st, r0, &v, stride, hi) };
                for x in 0..4 {
                    for e in 0..64 {
                        let want: f32 = (0..hi)
                            .map(|j| st[j * BQ + r0 + x] * v[j * stride + e])
                            .sum();
                        assert!(
                            (got[x][e] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{hi} {x} {e}"
                        );
                    }
                }
            }
        }
    }
    /// `dst[r] = silu(alpha * src[r]) * inv` for every `r` (a multiple of 8 of them): the
    /// kernel's step from sums to scores, as [`crate::hstu::layers::silu`] computes it, the
    /// same operations in the same order (no fused multiply-add), so bit for bit the same.
    /// (The compiler left that loop scalar: 20 scalar operations and a division a score, a
    /// third of the kernel's time.)
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_scaled(src: &[f32], dst: &mut [f32], alpha: f32, inv: f32) {
        assert!(src.len() == dst.len() && src.len().is_multiple_of(8));
        let set = _mm256_set1_ps;
        let (alpha, inv) = (set(alpha), set(inv));
        for i in (0..src.len()).step_by(8) {
            // SAFETY: `i + 8 <= len` of both (asserted above).
            let a = unsafe { _mm256_loadu_ps(src.as_ptr().add(i)) };
            let x = _mm256_mul_ps(alpha, a);
            let e = exp_fast(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(set(1.0), e));
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_mul_ps(s, inv)) };
        }
    }

    /// [`crate::hstu::layers::exp_fast`] on 8 lanes, operation for operation.
    #[target_feature(enable = "avx2,fma")]
    fn exp_fast(x: __m256) -> __m256 {
        const SHIFTER: f32 = 12_582_912.0;
        let (mul, add, sub, set) = (_mm256_mul_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_set1_ps);
        // `clamp`: a NaN stays NaN (the second operand is returned where one is NaN).
        let x = _mm256_min_ps(set(88.3), _mm256_max_ps(set(-87.3), x));
        let t = add(mul(x, set(std::f32::consts::LOG2_E)), set(SHIFTER));
        let n = sub(t, set(SHIFTER));
        let r = add(
            sub(x, mul(n, set(0.693_359_4))),
            mul(n, set(2.121_944_4e-4)),
        );
        let mut p = set(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = add(mul(p, r), set(c));
        }
        let y = add(add(mul(mul(p, r), r), r), set(1.0));
        let bits = _mm256_sub_epi32(
            _mm256_castps_si256(t),
            _mm256_set1_epi32(SHIFTER.to_bits() as i32),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(bits, _mm256_set1_epi32(127)));
        mul(y, _mm256_castsi256_ps(bits))
    }
}
