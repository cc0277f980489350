//! Seeded random numbers for random models, benchmarks and tests.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};

/// `len` draws from N(0, std^2).
pub fn normal_vec(len: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = Normal::new(0.0f32, std).expect("std is finite and >= 0");
    (0..len).map(|_| n.sample(&mut rng)).collect()
}

/// Deterministic contents of row `row` of table `table`: uniform in [-1, 1), from `seed`.
/// Benchmarks fill tables with it and regenerate rows to check results without keeping an f32
/// copy of quantized tables.
pub fn seeded_row(seed: u64, table: usize, row: usize, out: &mut [f32]) {
    let mut x = seed
        ^ (table as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)
        ^ (row as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for v in out.iter_mut() {
        // SplitMix64.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        *v = (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_rows_are_deterministic_and_spread() {
        let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
        seeded_row(5, 1, 2, &mut a);
        seeded_row(5, 1, 2, &mut b);
        assert_eq!(a, b);
        seeded_row(5, 1, 3, &mut b);
        assert_ne!(a, b);
        assert!(a.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(a.iter().any(|&x| x < -0.5) && a.iter().any(|&x| x > 0.5));
    }
}
