//! The id -> slot map of a cache: open addressing with linear probing in one array of 16-byte
//! buckets (four to a cache line), at most half full, so a lookup is one cache line nearly
//! always and can be software-prefetched ([`SlotMap::prefetch`]) a few ids ahead, which a general
//! hash map does not offer. Removal shifts the following entries back (no tombstones), so
//! probe lengths stay short under constant churn.
//!
//! Where every id is known to lie below a bound (a table's row count) and an array of one `u32`
//! per possible id is no larger than the buckets, the map is that array instead
//! ([`SlotMap::for_ids_below`]): a lookup is one 4-byte read, and the whole index is 4x to 8x
//! smaller, so more of it stays in the CPU's caches (the stager's lookups are random reads).

use super::hash::fold_mul;
use ember_embed::alloc::PageArray;

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

/// The slot of an id absent from a dense map.
const NO_SLOT: u32 = u32::MAX;

/// An id -> slot map for at most a fixed number of entries (see the module documentation).
#[derive(Debug)]
pub(super) struct SlotMap {
    buckets: Vec<Bucket>,
    mask: usize,
    /// The slot of each id below its length (`NO_SLOT`: absent), when the map is dense (then
    /// `buckets` is empty).
    dense: Option<PageArray<u32>>,
    len: usize,
    max: usize,
}

/// Counts one more of the `len` mapped ids.
///
/// # Panics
/// If the map would hold more than its capacity `max`.
#[inline]
fn count_new(len: &mut usize, max: usize) {
    assert!(*len < max, "slot map over its capacity {max}");
    *len += 1;
}

impl SlotMap {
    /// A map for up to `max` entries.
    pub(super) fn with_capacity(max: usize) -> Self {
        let n = Self::buckets_for(max);
        SlotMap {
            buckets: vec![Bucket { id: EMPTY, slot: 0 }; n],
            mask: n - 1,
            dense: None,
            len: 0,
            max,
        }
    }

    fn buckets_for(max: usize) -> usize {
        (2 * max).next_power_of_two().max(8)
    }

    /// A map for up to `max` entries of ids below `bound`: dense (one `u32` per possible id)
    /// where that takes no more memory than the buckets would.
    pub(super) fn for_ids_below(max: usize, bound: usize) -> Self {
        let bucket_bytes = Self::buckets_for(max) * size_of::<Bucket>();
        if bound.saturating_mul(size_of::<u32>()) > bucket_bytes {
            return Self::with_capacity(max);
        }
        SlotMap {
            buckets: Vec::new(),
            mask: 0,
            dense: Some(PageArray::filled(bound, NO_SLOT)),
            len: 0,
            max,
        }
    }

    /// Whether the map is a dense array (ids below a bound).
    pub(super) fn is_dense(&self) -> bool {
        self.dense.is_some()
    }

    #[inline(always)]
    fn home(&self, id: u64) -> usize {
        fold_mul(id, MUL) as usize & self.mask
    }

    /// Asks the CPU to bring `id`'s bucket (or dense entry) into cache.
    #[inline(always)]
    pub(super) fn prefetch(&self, id: u64) {
        let p = match &self.dense {
            Some(d) => d.as_ptr().wrapping_add(id as usize).cast(),
            None => self.buckets.as_ptr().wrapping_add(self.home(id)).cast(),
        };
        ember_embed::prefetch::prefetch_span(p, 4);
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
        if let Some(d) = &self.dense {
            return usize::try_from(*id)
                .ok()
                .and_then(|i| d.get(i))
                .filter(|&&s| s != NO_SLOT);
        }
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
    /// If `id` is `u64::MAX` (or, for a dense map, not below its bound), if `slot` is
    /// `u32::MAX`, or if the map would hold more than its capacity.
    #[inline]
    pub(super) fn insert(&mut self, id: u64, slot: u32) {
        assert_ne!(slot, NO_SLOT, "slot {NO_SLOT} cannot be mapped");
        if let Some(d) = &mut self.dense {
            let bound = d.len();
            let e = usize::try_from(id)
                .ok()
                .and_then(|i| d.get_mut(i))
                .unwrap_or_else(|| panic!("id {id} is not below the map's bound {bound}"));
            if *e == NO_SLOT {
                count_new(&mut self.len, self.max);
            }
            *e = slot;
            return;
        }
        assert_ne!(id, EMPTY, "id {EMPTY} cannot be cached");
        let mut i = self.home(id);
        loop {
            let b = &mut self.buckets[i];
            if b.id == id {
                b.slot = slot;
                return;
            }
            if b.id == EMPTY {
                *b = Bucket { id, slot };
                count_new(&mut self.len, self.max);
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `id`, returning its slot.
    pub(super) fn remove(&mut self, id: &u64) -> Option<u32> {
        if let Some(d) = &mut self.dense {
            let e = usize::try_from(*id).ok().and_then(|i| d.get_mut(i))?;
            let slot = std::mem::replace(e, NO_SLOT);
            if slot == NO_SLOT {
                return None;
            }
            self.len -= 1;
            return Some(slot);
        }
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

    /// Every (id, slot) pair, in bucket (dense: id) order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let dense = self.dense.iter().flat_map(|d| {
            d.iter()
                .enumerate()
                .filter(|&(_, &s)| s != NO_SLOT)
                .map(|(i, &s)| (i as u64, s))
        });
        let hashed = self
            .buckets
            .iter()
            .filter(|b| b.id != EMPTY)
            .map(|b| (b.id, b.slot));
        dense.chain(hashed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Applies random inserts and removes of ids below 40 to `m` (capacity 24) and to a
    /// `HashMap`; they agree at every step (`get` is asked up to `probe`).
    fn agrees_with_hash_map(
        mut m: SlotMap,
        ops: Vec<(bool, u64, u32)>,
        probe: u64,
    ) -> Result<(), TestCaseError> {
        let mut want: HashMap<u64, u32> = HashMap::new();
        for (ins, id, slot) in ops {
            if ins && (want.len() < 24 || want.contains_key(&id)) {
                m.insert(id, slot);
                want.insert(id, slot);
            } else {
                prop_assert_eq!(m.remove(&id), want.remove(&id));
            }
            prop_assert_eq!(m.len(), want.len());
            for k in 0..probe {
                prop_assert_eq!(m.get(&k), want.get(&k));
            }
        }
        let mut got: Vec<(u64, u32)> = m.iter().collect();
        got.sort_unstable();
        let mut exp: Vec<(u64, u32)> = want.into_iter().collect();
        exp.sort_unstable();
        prop_assert_eq!(got, exp);
        Ok(())
    }

    proptest! {
        /// Random inserts and removes over a small id range (long probe chains, wrap-around)
        /// agree with `HashMap` at every step.
        #[test]
        fn matches_hash_map(ops in prop::collection::vec((any::<bool>(), 0u64..40, 0..NO_SLOT), 0..400)) {
            agrees_with_hash_map(SlotMap::with_capacity(24), ops, 40)?;
        }

        /// A dense map agrees with `HashMap` as the hashed one does (ids past its bound are
        /// absent).
        #[test]
        fn dense_matches_hash_map(ops in prop::collection::vec((any::<bool>(), 0u64..40, 0u32..1000), 0..400)) {
            let m = SlotMap::for_ids_below(24, 40);
            prop_assert!(m.is_dense());
            agrees_with_hash_map(m, ops, 45)?;
        }
    }

    #[test]
    fn dense_only_where_no_larger_and_ids_beyond_the_bound_refused() {
        // 1000 entries: 2048 buckets of 16 bytes = 32 KiB, room for 8192 dense ids.
        assert!(SlotMap::for_ids_below(1000, 8192).is_dense());
        assert!(!SlotMap::for_ids_below(1000, 8193).is_dense());
        let mut m = SlotMap::for_ids_below(4, 10);
        assert!(m.get(&10).is_none() && m.get(&u64::MAX).is_none() && m.remove(&99).is_none());
        assert!(std::panic::catch_unwind(move || m.insert(10, 0)).is_err());
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
