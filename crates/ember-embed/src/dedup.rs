//! Batch deduplication: the distinct ids of a unit, the inverse index, and a compact copy of the
//! distinct rows (RecD's inverse keyed jagged tensor, TorchRec's `inverse_indices`).
//!
//! An open-addressing hash table with generation stamps (so it is never cleared between uses)
//! maps each id to its slot among the distinct ids, in first-seen order.

use crate::jagged::RowIndex;
use crate::prefetch::prefetch_span;

/// Units smaller than this are never deduplicated by `auto`.
const AUTO_MIN_IDS: usize = 256;
/// Ids sampled by `auto` to estimate reuse.
const AUTO_SAMPLE: usize = 512;
/// `auto` considers dedup when at most this fraction of the sample is distinct.
const AUTO_MAX_DISTINCT: f64 = 0.85;

/// Key of an empty slot (row ids of deduplicated tables are < `u32::MAX`).
const EMPTY: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u32,
    val: u32,
}

const EMPTY_SLOT: Slot = Slot { key: EMPTY, val: 0 };

/// Per-thread scratch, reused across calls.
#[derive(Debug, Default)]
pub struct DedupScratch {
    /// Open-addressing table; all slots are empty between calls.
    slots: Vec<Slot>,
    /// Slots filled by the current call, emptied again by `reset`.
    used: Vec<u32>,
    /// Distinct rows, first-seen order.
    pub uniq: Vec<usize>,
    /// For each id position, its index in `uniq`.
    pub inverse: Vec<u32>,
    /// Compact copy of the distinct rows (`uniq.len() x stride` bytes).
    pub rows: Vec<u8>,
}

#[inline(always)]
fn hash(k: u32) -> usize {
    (u64::from(k).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}

impl DedupScratch {
    /// Whether ids of a table with `rows` rows fit the table's 32-bit keys.
    pub fn supports(rows: usize) -> bool {
        rows < EMPTY as usize
    }

    /// Readies the table for up to `n` distinct keys; returns its mask.
    fn prepare(&mut self, n: usize) -> usize {
        let cap = (2 * n).next_power_of_two().max(64);
        if self.slots.len() < cap {
            self.slots = vec![EMPTY_SLOT; cap];
        }
        cap - 1
    }

    /// Empties the slots the last call filled.
    fn reset(&mut self) {
        for &i in &self.used {
            self.slots[i as usize] = EMPTY_SLOT;
        }
        self.used.clear();
    }

    /// Inserts `k`; returns its index among the distinct keys (`next` if new).
    #[inline(always)]
    fn insert(&mut self, mask: usize, k: u32, next: u32) -> (u32, bool) {
        let mut i = hash(k) & mask;
        loop {
            let s = self.slots[i];
            if s.key == EMPTY {
                self.slots[i] = Slot { key: k, val: next };
                self.used.push(i as u32);
                return (next, true);
            }
            if s.key == k {
                return (s.val, false);
            }
            i = (i + 1) & mask;
        }
    }

    /// Fills `uniq` and `inverse` for `ids` (each `< u32::MAX`); returns the number of distinct ids.
    pub fn build<I: RowIndex>(&mut self, ids: &[I]) -> usize {
        let mask = self.prepare(ids.len());
        self.uniq.clear();
        self.inverse.clear();
        self.inverse.reserve(ids.len());
        for &id in ids {
            let (v, new) = self.insert(mask, id.idx() as u32, self.uniq.len() as u32);
            if new {
                self.uniq.push(id.idx());
            }
            self.inverse.push(v);
        }
        self.reset();
        self.uniq.len()
    }

    /// Copies each distinct row once from `table` into `rows`, prefetching ahead.
    pub fn gather(&mut self, table: &[u8], stride: usize, prefetch: usize) {
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

    /// `auto`'s first filter: does an evenly strided sample of `ids` show any real reuse? (Without
    /// reuse dedup cannot pay; with it, `AutoDedup` measures whether it does.)
    pub fn shows_reuse<I: RowIndex>(&mut self, ids: &[I]) -> bool {
        let n = ids.len();
        if n < AUTO_MIN_IDS {
            return false;
        }
        let k = AUTO_SAMPLE.min(n);
        let mask = self.prepare(k);
        let mut distinct = 0u32;
        for s in 0..k {
            let id = ids[s * n / k];
            if self.insert(mask, id.idx() as u32, distinct).1 {
                distinct += 1;
            }
        }
        self.reset();
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
        assert!(!s.shows_reuse(&uniform));
        assert!(s.shows_reuse(&hot));
        assert!(!s.shows_reuse(&hot[..10]), "tiny units are not worth it");
    }
}
