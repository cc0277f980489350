//! The id hashing of the cache: one folded 128-bit multiply per word, a fixed seed (iteration
//! order is deterministic), shared by the id -> slot map, the live counts and the sketch.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// Odd 64-bit multipliers and seeds (digits of pi / golden ratio) for hashing.
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
const MAP_SEED: u64 = 0x243F_6A88_85A3_08D3;

/// Multiplies as 128 bits and folds the halves: a fast, well-mixing 64-bit hash step.
#[inline]
pub(super) fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Hasher for `u64` ids (one folded multiply per word).
#[derive(Debug, Clone, Copy)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = fold_mul(self.0 ^ u64::from(b), MUL);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = fold_mul(self.0 ^ n, MUL);
    }
}

/// Builds [`IdHasher`]s (fixed seed: iteration order is deterministic).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct IdBuildHasher;

impl BuildHasher for IdBuildHasher {
    type Hasher = IdHasher;

    #[inline]
    fn build_hasher(&self) -> IdHasher {
        IdHasher(MAP_SEED)
    }
}

pub(super) type IdMap<V> = HashMap<u64, V, IdBuildHasher>;
