//! The id -> slot map of a cache: open addressing with linear probing in one array of 16-byte
//! buckets (four to a cache line), at most half full, so a lookup is one cache line nearly
//! always and can be software-prefetched ([`SlotMap::prefetch`]) a few ids ahead, which a general
//! hash map does not offer. Removal shifts the following entries back (no tombstones), so
//! probe lengths stay short under constant churn.

use super::hash::fold_mul;

/// The id no bucket may hold: marks an empty bucket.
const EMPTY: u64 = u64::MAX;
/// Multiplier of the bucket hash.
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, Copy)]
#[repr(C, align(16))]
struct Bucket {
    id: u64,
    slot: u32,
}

/// An id -> slot map for at most a fixed number of entries (see the module documentation).
#[derive(Debug)]
pub(super) struct SlotMap {
    buckets: Vec<Bucket>,
    mask: usize,
    len: usize,
    max: usize,
}

impl SlotMap {
    /// A map for up to `max` entries.
    pub(super) fn with_capacity(max: usize) -> Self {
        let n = (2 * max).next_power_of_two().max(8);
        SlotMap {
            buckets: vec![Bucket { id: EMPTY, slot: 0 }; n],
            mask: n - 1,
            len: 0,
            max,
        }
    }

    #[inline(always)]
    fn home(&self, id: u64) -> usize {
        fold_mul(id, MUL) as usize & self.mask
    }

    /// Asks the CPU to bring `id`'s bucket into cache.
    #[inline(always)]
    pub(super) fn prefetch(&self, id: u64) {
        let p = self.buckets.as_ptr().wrapping_add(self.home(id));
        crate::prefetch::prefetch_span(p.cast(), 16);
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bucket index holding `id`, if any.
    #[inline]
    fn find(&self, id: u64) -> Option<usize> {
        let mut i = self.home(id);
        loop {
            let b = self.buckets[i];
            if b.id == id {
                return Some(i);
            }
            if b.id == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub(super) fn get(&self, id: &u64) -> Option<&u32> {
        if *id == EMPTY {
            return None;
        }
        self.find(*id).map(|i| &self.buckets[i].slot)
    }

    pub(super) fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    /// Maps `id` to `slot` (replacing its slot if present).
    ///
    /// # Panics
    /// If `id` is `u64::MAX`, or the map would hold more than its capacity.
    #[inline]
    pub(super) fn insert(&mut self, id: u64, slot: u32) {
        assert_ne!(id, EMPTY, "id {EMPTY} cannot be cached");
        let mut i = self.home(id);
        loop {
            let b = &mut self.buckets[i];
            if b.id == id {
                b.slot = slot;
                return;
            }
            if b.id == EMPTY {
                assert!(
                    self.len < self.max,
                    "slot map over its capacity {}",
                    self.max
                );
                *b = Bucket { id, slot };
                self.len += 1;
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `id`, returning its slot.
    pub(super) fn remove(&mut self, id: &u64) -> Option<u32> {
        if *id == EMPTY {
            return None;
        }
        let mut hole = self.find(*id)?;
        let slot = self.buckets[hole].slot;
        self.len -= 1;
        // Backward shift: move each following entry whose home does not lie strictly between
        // the hole and it (cyclically) into the hole.
        let mut i = hole;
        loop {
            i = (i + 1) & self.mask;
            let b = self.buckets[i];
            if b.id == EMPTY {
                break;
            }
            let home = self.home(b.id);
            let dist_entry = i.wrapping_sub(home) & self.mask;
            let dist_hole = i.wrapping_sub(hole) & self.mask;
            if dist_entry >= dist_hole {
                self.buckets[hole] = b;
                hole = i;
            }
        }
        self.buckets[hole].id = EMPTY;
        Some(slot)
    }

    /// Every (id, slot) pair, in bucket order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &u32)> {
        self.buckets
            .iter()
            .filter(|b| b.id != EMPTY)
            .map(|b| (&b.id, &b.slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Random inserts and removes over a small id range (long probe chains, wrap-around)
        /// agree with `HashMap` at every step.
        #[test]
        fn matches_hash_map(ops in prop::collection::vec((any::<bool>(), 0u64..40, any::<u32>()), 0..400)) {
            let mut m = SlotMap::with_capacity(24);
            let mut want: HashMap<u64, u32> = HashMap::new();
            for (ins, id, slot) in ops {
                if ins && (want.len() < 24 || want.contains_key(&id)) {
                    m.insert(id, slot);
                    want.insert(id, slot);
                } else {
                    prop_assert_eq!(m.remove(&id), want.remove(&id));
                }
                prop_assert_eq!(m.len(), want.len());
                for k in 0..40 {
                    prop_assert_eq!(m.get(&k), want.get(&k));
                }
            }
            let mut got: Vec<(u64, u32)> = m.iter().map(|(&a, &b)| (a, b)).collect();
            got.sort_unstable();
            let mut exp: Vec<(u64, u32)> = want.into_iter().collect();
            exp.sort_unstable();
            prop_assert_eq!(got, exp);
        }
    }

    #[test]
    fn full_map_and_the_reserved_id() {
        let mut m = SlotMap::with_capacity(3);
        (0..3).for_each(|i| m.insert(i * 1000, i as u32));
        assert_eq!(m.get(&2000), Some(&2));
        assert!(std::panic::catch_unwind(move || m.insert(7, 0)).is_err());
        let m = SlotMap::with_capacity(0);
        assert!(m.is_empty() && m.get(&u64::MAX).is_none());
    }
}
