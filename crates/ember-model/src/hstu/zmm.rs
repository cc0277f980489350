//! The attention kernel's inner loops (`attention/block.rs`) in AVX-512 intrinsics: the compiler
//! kept the portable loops' accumulators in an array on the stack and stored it every step
//! (measured: 20 GFLOP/s for the whole kernel against 45-55 a core with these), so the sums
//! live in zmm registers here (named, or in arrays whose indices are constants once the loops
//! are unrolled, which the compiler keeps in registers). The scores' silu, which the compiler
//! left scalar, is here too: with it, and 6 keys a step, the candidates' attention at the
//! DLRMv3 dims went from 55-60 to 66-71 GFLOP/s on one Zen 4 core (116 its measured FMA peak).

/// Query rows per attention block (the kernel's `BQ`): one row of 64 sums per key is 4 zmm.
pub const ROWS: usize = 64;

#[cfg(target_arch = "x86_64")]
pub use x86::{scores_4x16, scores_6x64, silu_scaled, values_4x64};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ROWS as BQ;
    /// The scores of 6 keys `k` against the block's [`BQ`] transposed queries `qt` (`qk` rows
    /// of [`BQ`]): an outer product per qk dim into 6 x 64 sums, 24 zmm registers, so each row
    /// of `qt` loaded serves 24 multiply-adds (with 4 keys, 16: the kernel ran 7% slower).
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_6x64(k: &[&[f32]; 6], qt: &[f32], qk: usize) -> [[f32; 64]; 6] {
        assert!(qt.len() >= qk * BQ && k.iter().all(|k| k.len() >= qk));
        let kp = k.map(|k| k.as_ptr());
        let mut c = [_mm512_setzero_ps(); 24];
        for i in 0..qk {
            // SAFETY: `i < qk`: the row of 64 values at `p` and the 6 broadcast values are in
            // bounds (asserted above).
            unsafe {
                let p = qt.as_ptr().add(i * BQ);
                let l = [0, 16, 32, 48].map(|o| _mm512_loadu_ps(p.add(o)));
                for x in 0..6 {
                    let b = _mm512_set1_ps(*kp[x].add(i));
                    for z in 0..4 {
                        c[x * 4 + z] = _mm512_fmadd_ps(b, l[z], c[x * 4 + z]);
                    }
                }
            }
        }
        let mut out = [[0f32; 64]; 6];
        for x in 0..6 {
            for z in 0..4 {
                // SAFETY: `out[x]` holds 64 values.
                unsafe { _mm512_storeu_ps(out[x].as_mut_ptr().add(16 * z), c[x * 4 + z]) };
            }
        }
        out
    }

    /// [`scores_6x64`] for 4 keys and a block of at most 16 rows (the first 16 of each row of
    /// `qt`): 4 sums, a quarter of the work of padding the block to 64 rows. (A block of 8 rows, a
    /// returning user's new actions, cost a 64-row block's scores before: half a candidates'
    /// block, on one of two threads while the other was idle.)
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_4x16(k: &[&[f32]; 4], qt: &[f32], qk: usize) -> [[f32; 16]; 4] {
        assert!((qk == 0 || qt.len() >= (qk - 1) * BQ + 16) && k.iter().all(|k| k.len() >= qk));
        let kp = k.map(|k| k.as_ptr());
        let mut c0 = _mm512_setzero_ps();
        let mut c1 = _mm512_setzero_ps();
        let mut c2 = _mm512_setzero_ps();
        let mut c3 = _mm512_setzero_ps();
        for i in 0..qk {
            // SAFETY: `i < qk`: the 16 values at `p` and the 4 broadcast values are in bounds
            // (asserted above).
            unsafe {
                let l0 = _mm512_loadu_ps(qt.as_ptr().add(i * BQ));
                c0 = _mm512_fmadd_ps(_mm512_set1_ps(*kp[0].add(i)), l0, c0);
                c1 = _mm512_fmadd_ps(_mm512_set1_ps(*kp[1].add(i)), l0, c1);
                c2 = _mm512_fmadd_ps(_mm512_set1_ps(*kp[2].add(i)), l0, c2);
                c3 = _mm512_fmadd_ps(_mm512_set1_ps(*kp[3].add(i)), l0, c3);
            }
        }
        let mut out = [[0f32; 16]; 4];
        // SAFETY: each `out[x]` holds 16 values.
        unsafe {
            _mm512_storeu_ps(out[0].as_mut_ptr(), c0);
            _mm512_storeu_ps(out[1].as_mut_ptr(), c1);
            _mm512_storeu_ps(out[2].as_mut_ptr(), c2);
            _mm512_storeu_ps(out[3].as_mut_ptr(), c3);
        }
        out
    }

    /// `attention/portable.rs`'s `values_4x64` on zmm registers, its 16 sums named. (6 rows a step, as
    /// the scores take 6 keys, measured no faster.)
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
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
        let n = hi;
        let mut c00 = _mm512_setzero_ps();
        let mut c01 = _mm512_setzero_ps();
        let mut c02 = _mm512_setzero_ps();
        let mut c03 = _mm512_setzero_ps();
        let mut c10 = _mm512_setzero_ps();
        let mut c11 = _mm512_setzero_ps();
        let mut c12 = _mm512_setzero_ps();
        let mut c13 = _mm512_setzero_ps();
        let mut c20 = _mm512_setzero_ps();
        let mut c21 = _mm512_setzero_ps();
        let mut c22 = _mm512_setzero_ps();
        let mut c23 = _mm512_setzero_ps();
        let mut c30 = _mm512_setzero_ps();
        let mut c31 = _mm512_setzero_ps();
        let mut c32 = _mm512_setzero_ps();
        let mut c33 = _mm512_setzero_ps();
        for i in 0..n {
            // SAFETY: `i < n`: the row of 64 values at `p` and the 4 broadcast values are in
            // bounds (asserted above).
            unsafe {
                let p = v.as_ptr().add(i * stride);
                let l0 = _mm512_loadu_ps(p.add(0));
                let l1 = _mm512_loadu_ps(p.add(16));
                let l2 = _mm512_loadu_ps(p.add(32));
                let l3 = _mm512_loadu_ps(p.add(48));
                let b0 = _mm512_set1_ps(*st.get_unchecked(i * BQ + r0));
                c00 = _mm512_fmadd_ps(b0, l0, c00);
                c01 = _mm512_fmadd_ps(b0, l1, c01);
                c02 = _mm512_fmadd_ps(b0, l2, c02);
                c03 = _mm512_fmadd_ps(b0, l3, c03);
                let b1 = _mm512_set1_ps(*st.get_unchecked(i * BQ + r0 + 1));
                c10 = _mm512_fmadd_ps(b1, l0, c10);
                c11 = _mm512_fmadd_ps(b1, l1, c11);
                c12 = _mm512_fmadd_ps(b1, l2, c12);
                c13 = _mm512_fmadd_ps(b1, l3, c13);
                let b2 = _mm512_set1_ps(*st.get_unchecked(i * BQ + r0 + 2));
                c20 = _mm512_fmadd_ps(b2, l0, c20);
                c21 = _mm512_fmadd_ps(b2, l1, c21);
                c22 = _mm512_fmadd_ps(b2, l2, c22);
                c23 = _mm512_fmadd_ps(b2, l3, c23);
                let b3 = _mm512_set1_ps(*st.get_unchecked(i * BQ + r0 + 3));
                c30 = _mm512_fmadd_ps(b3, l0, c30);
                c31 = _mm512_fmadd_ps(b3, l1, c31);
                c32 = _mm512_fmadd_ps(b3, l2, c32);
                c33 = _mm512_fmadd_ps(b3, l3, c33);
            }
        }
        let mut out = [[0f32; 64]; 4];
        // SAFETY: each `out[x]` holds 64 values.
        unsafe {
            _mm512_storeu_ps(out[0].as_mut_ptr().add(0), c00);
            _mm512_storeu_ps(out[0].as_mut_ptr().add(16), c01);
            _mm512_storeu_ps(out[0].as_mut_ptr().add(32), c02);
            _mm512_storeu_ps(out[0].as_mut_ptr().add(48), c03);
            _mm512_storeu_ps(out[1].as_mut_ptr().add(0), c10);
            _mm512_storeu_ps(out[1].as_mut_ptr().add(16), c11);
            _mm512_storeu_ps(out[1].as_mut_ptr().add(32), c12);
            _mm512_storeu_ps(out[1].as_mut_ptr().add(48), c13);
            _mm512_storeu_ps(out[2].as_mut_ptr().add(0), c20);
            _mm512_storeu_ps(out[2].as_mut_ptr().add(16), c21);
            _mm512_storeu_ps(out[2].as_mut_ptr().add(32), c22);
            _mm512_storeu_ps(out[2].as_mut_ptr().add(48), c23);
            _mm512_storeu_ps(out[3].as_mut_ptr().add(0), c30);
            _mm512_storeu_ps(out[3].as_mut_ptr().add(16), c31);
            _mm512_storeu_ps(out[3].as_mut_ptr().add(32), c32);
            _mm512_storeu_ps(out[3].as_mut_ptr().add(48), c33);
        }
        out
    }
    /// `dst[r] = silu(alpha * src[r]) * inv` for every `r` (a multiple of 16 of them): the
    /// kernel's step from sums to scores, as [`crate::hstu::layers::silu`] computes it, the
    /// same operations in the same order (no fused multiply-add), so bit for bit the same.
    /// (The compiler left that loop scalar: 20 scalar operations and a division a score, a
    /// third of the kernel's time.)
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn silu_scaled(src: &[f32], dst: &mut [f32], alpha: f32, inv: f32) {
        assert!(src.len() == dst.len() && src.len().is_multiple_of(16));
        let set = _mm512_set1_ps;
        let (alpha, inv) = (set(alpha), set(inv));
        for i in (0..src.len()).step_by(16) {
            // SAFETY: `i + 16 <= len` of both (asserted above).
            let a = unsafe { _mm512_loadu_ps(src.as_ptr().add(i)) };
            let x = _mm512_mul_ps(alpha, a);
            let e = exp_fast(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(set(1.0), e));
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_mul_ps(s, inv)) };
        }
    }

    /// [`crate::hstu::layers::exp_fast`] on 16 lanes, operation for operation.
    #[target_feature(enable = "avx512f")]
    fn exp_fast(x: __m512) -> __m512 {
        const SHIFTER: f32 = 12_582_912.0;
        let (mul, add, sub, set) = (_mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_set1_ps);
        // `clamp`: a NaN stays NaN (the second operand is returned where one is NaN).
        let x = _mm512_min_ps(set(88.3), _mm512_max_ps(set(-87.3), x));
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
        let bits = _mm512_sub_epi32(
            _mm512_castps_si512(t),
            _mm512_set1_epi32(SHIFTER.to_bits() as i32),
        );
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(bits, _mm512_set1_epi32(127)));
        mul(y, _mm512_castsi512_ps(bits))
    }
}
