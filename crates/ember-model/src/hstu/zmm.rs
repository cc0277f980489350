//! The attention kernel's two inner loops (`attention.rs`) in AVX-512 intrinsics: the compiler
//! kept the portable loops' accumulators in an array on the stack and stored it every step
//! (measured: 20 GFLOP/s for the whole kernel against 45-55 a core with these), so the 16 sums
//! live in named zmm registers here.

/// Query rows per attention block (the kernel's `BQ`): one row of 64 sums per key is 4 zmm.
pub const ROWS: usize = 64;

#[cfg(target_arch = "x86_64")]
pub use x86::{scores_4x64, values_4x64};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ROWS as BQ;
    /// [`super::scores_4x64`] on zmm registers, its 16 sums in named registers (an array of them was kept on the stack).
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_4x64(k: &[&[f32]; 4], qt: &[f32], qk: usize) -> [[f32; 64]; 4] {
        assert!(qt.len() >= qk * BQ && k.iter().all(|k| k.len() >= qk));
        let n = qk;
        let kp = k.map(|k| k.as_ptr());
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
                let p = qt.as_ptr().add(i * BQ);
                let l0 = _mm512_loadu_ps(p.add(0));
                let l1 = _mm512_loadu_ps(p.add(16));
                let l2 = _mm512_loadu_ps(p.add(32));
                let l3 = _mm512_loadu_ps(p.add(48));
                let b0 = _mm512_set1_ps(*kp[0].add(i));
                c00 = _mm512_fmadd_ps(b0, l0, c00);
                c01 = _mm512_fmadd_ps(b0, l1, c01);
                c02 = _mm512_fmadd_ps(b0, l2, c02);
                c03 = _mm512_fmadd_ps(b0, l3, c03);
                let b1 = _mm512_set1_ps(*kp[1].add(i));
                c10 = _mm512_fmadd_ps(b1, l0, c10);
                c11 = _mm512_fmadd_ps(b1, l1, c11);
                c12 = _mm512_fmadd_ps(b1, l2, c12);
                c13 = _mm512_fmadd_ps(b1, l3, c13);
                let b2 = _mm512_set1_ps(*kp[2].add(i));
                c20 = _mm512_fmadd_ps(b2, l0, c20);
                c21 = _mm512_fmadd_ps(b2, l1, c21);
                c22 = _mm512_fmadd_ps(b2, l2, c22);
                c23 = _mm512_fmadd_ps(b2, l3, c23);
                let b3 = _mm512_set1_ps(*kp[3].add(i));
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

    /// [`super::values_4x64`] on zmm registers, as [`scores_4x64`].
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
}
