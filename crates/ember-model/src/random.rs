//! Seeded random numbers for random models and tests.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};

/// `len` draws from N(0, std^2).
pub fn normal_vec(len: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = Normal::new(0.0f32, std).expect("std is finite and >= 0");
    (0..len).map(|_| n.sample(&mut rng)).collect()
}
