//! Subnormal floats flushed to zero while Ember computes (the MXCSR's FTZ and DAZ bits, as
//! oneDNN and TensorRT run).
//!
//! Why: a product of two small numbers can land below f32's normal range (1.2e-38), and every
//! FMA that produces or reads such a subnormal takes a microcode assist of ~100 cycles. A trained
//! model's never-seen embedding rows decay toward zero under weight decay: half of the shipped
//! default model's table entries sit near 1e-38, and a batch of requests with uniformly random
//! ids ran its interaction and top MLP 50-100x slower (13 ms for 120 samples instead of 0.3 ms).
//! Flushing changes results only by values below 1.2e-38.
//!
//! [`FlushDenormals`] sets both bits on the calling thread and restores the caller's mode when
//! dropped; Ember's pool threads set them once at start.

/// Flush-to-zero (results) and denormals-are-zero (inputs) bits of the MXCSR.
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn get_mxcsr() -> u32 {
    let mut v: u32 = 0;
    // SAFETY: STMXCSR stores the 32-bit MXCSR to the given address, a live local of that size.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags)) };
    v
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn set_mxcsr(v: u32) {
    // SAFETY: LDMXCSR loads the MXCSR from a live local; `v` only ever comes from `get_mxcsr`
    // with the FTZ/DAZ bits changed, so no reserved bit is set (which would fault).
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, preserves_flags)) };
}

/// While alive, subnormals flush to zero on this thread.
#[derive(Debug)]
pub struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushDenormals {
    /// Sets FTZ and DAZ on the calling thread (a no-op off x86-64).
    pub fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let saved = get_mxcsr();
            set_mxcsr(saved | FTZ_DAZ);
            FlushDenormals { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushDenormals {}
    }

    /// Sets FTZ and DAZ on the calling thread for good (for threads Ember owns).
    pub fn forever() {
        std::mem::forget(Self::new());
    }
}

impl Default for FlushDenormals {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        set_mxcsr(self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn product(a: f32, b: f32) -> f32 {
        std::hint::black_box(a) * std::hint::black_box(b)
    }

    #[test]
    fn subnormals_flush_only_inside_the_guard() {
        let (a, b) = (1e-20f32, 1e-20f32);
        assert!(
            product(a, b).is_subnormal(),
            "1e-40 is subnormal by default"
        );
        {
            let _g = FlushDenormals::new();
            #[cfg(target_arch = "x86_64")]
            {
                assert_eq!(product(a, b), 0.0);
                // Inputs too: a subnormal reads as zero.
                assert_eq!(product(std::hint::black_box(1e-40f32), 1e30), 0.0);
            }
            // Normal results are untouched.
            assert_eq!(product(3.0, 0.5), 1.5);
        }
        assert!(
            product(a, b).is_subnormal(),
            "the caller's mode is restored"
        );
    }
}

#[cfg(test)]
mod pool_tests {
    use crate::pool::{PoolOptions, Pooler};

    #[test]
    fn work_run_by_a_pooler_flushes_subnormals_on_every_thread() {
        for threads in [1, 2] {
            let p = Pooler::new(PoolOptions {
                threads,
                ..PoolOptions::default()
            })
            .unwrap();
            let (a, b) = (
                std::hint::black_box(1e-20f32),
                std::hint::black_box(1e-20f32),
            );
            let inside = p.install(|| {
                let (x, y) = rayon::join(
                    || std::hint::black_box(a) * b,
                    || std::hint::black_box(a) * b,
                );
                [x, y]
            });
            #[cfg(target_arch = "x86_64")]
            assert_eq!(inside, [0.0, 0.0], "{threads} threads");
            #[cfg(not(target_arch = "x86_64"))]
            let _ = inside;
            assert!(
                (std::hint::black_box(a) * b).is_subnormal(),
                "caller's mode restored"
            );
        }
    }
}
