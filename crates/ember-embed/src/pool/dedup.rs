//! Batch deduplication: the distinct ids of a unit, the inverse index, and a compact copy of the
//! distinct rows (RecD's inverse keyed jagged tensor, TorchRec's `inverse_indices`).
//!
//! An open-addressing hash table with generation stamps (so it is never cleared between uses)
//! maps each id to its slot among the distinct ids, in first-seen order.

use super::Index;
use crate::prefetch::prefetch_span;

/// Units smaller than this are never deduplicated by `auto`.
const AUTO_MIN_IDS: usize = 256;
/// Ids sampled by `auto` to estimate reuse.
const AUTO_SAMPLE: usize = 512;
/// `auto` deduplicates when at most this fraction of the sample is distinct.
const AUTO_MAX_DISTINCT: f64 = 0.85;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    stamp: u32,
    val: u32,
}

/// Per-thread scratch, reused across calls.
#[derive(Debug, Default)]
pub(crate) struct DedupScratch {
    slots: Vec<Slot>,
    stamp: u32,
    /// Distinct rows, first-seen order.
    pub(crate) uniq: Vec<usize>,
    /// For each id position, its index in `uniq`.
    pub(crate) inverse: Vec<u32>,
    /// Compact copy of the distinct rows (`uniq.len() x stride` bytes).
    pub(crate) rows: Vec<u8>,
}

#[inline(always)]
fn hash(k: u64) -> usize {
    (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}

impl DedupScratch {
    /// Readies a table for `n` keys; returns its mask.
    fn prepare(&mut self, n: usize) -> usize {
        let cap = (2 * n).next_power_of_two().max(64);
        if self.slots.len() < cap {
            self.slots = vec![Slot::default(); cap];
            self.stamp = 0;
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.slots.iter_mut().for_each(|s| s.stamp = 0);
            self.stamp = 1;
        }
        cap - 1
    }

    /// Inserts `k`; returns its index among the distinct keys (`next` if new).
    #[inline(always)]
    fn insert(&mut self, mask: usize, k: u64, next: u32) -> (u32, bool) {
        let mut i = hash(k) & mask;
        loop {
            let s = &mut self.slots[i];
            if s.stamp != self.stamp {
                *s = Slot {
                    key: k,
                    stamp: self.stamp,
                    val: next,
                };
                return (next, true);
            }
            if s.key == k {
                return (s.val, false);
            }
            i = (i + 1) & mask;
        }
    }

    /// Fills `uniq` and `inverse` for `ids`; returns the number of distinct ids.
    pub(crate) fn build<I: Index>(&mut self, ids: &[I]) -> usize {
        let mask = self.prepare(ids.len());
        self.uniq.clear();
        self.inverse.clear();
        self.inverse.reserve(ids.len());
        for &id in ids {
            let (v, new) = self.insert(mask, id.idx() as u64, self.uniq.len() as u32);
            if new {
                self.uniq.push(id.idx());
            }
            self.inverse.push(v);
        }
        self.uniq.len()
    }

    /// Copies each distinct row once from `table` into `rows`, prefetching ahead.
    pub(crate) fn gather(&mut self, table: &[u8], stride: usize, prefetch: usize) {
        let n = self.uniq.len();
        self.rows.resize(n * stride, 0);
        for (u, dst) in self.rows.chunks_exact_mut(stride).enumerate() {
            if prefetch > 0 && u + prefetch < n {
                prefetch_span(
                    table
                        .as_ptr()
                        .wrapping_add(self.uniq[u + prefetch] * stride),
                    stride,
                );
            }
            dst.copy_from_slice(&table[self.uniq[u] * stride..][..stride]);
        }
    }

    /// `auto`'s decision: does an evenly strided sample of `ids` show enough reuse?
    pub(crate) fn reuse_pays<I: Index>(&mut self, ids: &[I]) -> bool {
        let n = ids.len();
        if n < AUTO_MIN_IDS {
            return false;
        }
        let k = AUTO_SAMPLE.min(n);
        let mask = self.prepare(k);
        let mut distinct = 0u32;
        for s in 0..k {
            let id = ids[s * n / k];
            if self.insert(mask, id.idx() as u64, distinct).1 {
                distinct += 1;
            }
        }
        f64::from(distinct) <= AUTO_MAX_DISTINCT * k as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn inverse_index_reconstructs_ids() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut s = DedupScratch::default();
        for n in [0usize, 1, 5, 100, 3000] {
            for range in [1u32, 10, 1_000_000] {
                let ids: Vec<u32> = (0..n).map(|_| rng.random_range(0..range)).collect();
                let u = s.build(&ids);
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(u, sorted.len());
                for (i, &id) in ids.iter().enumerate() {
                    assert_eq!(s.uniq[s.inverse[i] as usize], id as usize);
                }
            }
        }
    }

    #[test]
    fn gather_copies_distinct_rows() {
        let table: Vec<u8> = (0..50u8).collect(); // 10 rows of 5 bytes
        let mut s = DedupScratch::default();
        s.build(&[7u32, 2, 7, 9]);
        s.gather(&table, 5, 2);
        assert_eq!(
            s.rows,
            [35, 36, 37, 38, 39, 10, 11, 12, 13, 14, 45, 46, 47, 48, 49]
        );
    }

    #[test]
    fn auto_sees_reuse_only_where_there_is_some() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut s = DedupScratch::default();
        let uniform: Vec<u32> = (0..5000).map(|_| rng.random_range(0..500_000)).collect();
        let hot: Vec<u32> = (0..5000).map(|_| rng.random_range(0..200)).collect();
        assert!(!s.reuse_pays(&uniform));
        assert!(s.reuse_pays(&hot));
        assert!(!s.reuse_pays(&hot[..10]), "tiny units are not worth it");
    }
}
