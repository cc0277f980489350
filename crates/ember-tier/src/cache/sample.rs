//! The eviction order of the LFU policy: a dense set of the evictable slots for O(1) uniform
//! sampling (the victim is the least frequent of a few sampled residents), and [`Order`], which
//! puts the two orders (recency, sampling) behind one interface.

use super::lru::LruList;
use super::slab::Slot;

/// Residents sampled when looking for an LFU victim.
pub(super) const SAMPLES: usize = 8;
/// Seed of the victim-sampling xorshift generator (any non-zero value).
pub(super) const RNG_SEED: u64 = 0xBE54_66CF_34E9_0C6C;

/// Dense set of evictable slots, for O(1) uniform sampling (LFU).
#[derive(Debug)]
pub(super) struct SampleSet {
    pub(super) members: Vec<u32>,
    /// Index in `members` of each member slot.
    pub(super) pos: Vec<u32>,
    /// xorshift64 state.
    pub(super) rng: u64,
}

impl SampleSet {
    #[inline]
    pub(super) fn push(&mut self, slot: u32) {
        self.pos[slot as usize] = self.members.len() as u32;
        self.members.push(slot);
    }

    #[inline]
    pub(super) fn remove(&mut self, slot: u32) {
        let i = self.pos[slot as usize] as usize;
        self.members.swap_remove(i);
        if let Some(&moved) = self.members.get(i) {
            self.pos[moved as usize] = i as u32;
        }
    }

    /// Asks the CPU to bring `slot`'s position into cache (what `remove` reads first).
    #[inline(always)]
    pub(super) fn prefetch(&self, slot: u32) {
        let p = self.pos.as_ptr().wrapping_add(slot as usize);
        ember_embed::prefetch::prefetch_span(p.cast(), 4);
    }

    /// A pseudo-random member (xorshift64, multiply-shift range reduction); needs a member.
    #[inline]
    pub(super) fn sample(&mut self) -> u32 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        let n = self.members.len() as u128;
        self.members[((u128::from(x) * n) >> 64) as usize]
    }
}

/// The structure that orders the evictable (resident, unpinned) slots.
#[derive(Debug)]
pub(super) enum Order {
    /// Lru and Pinned policies.
    Recency(LruList),
    /// Lfu policy.
    Sampled(SampleSet),
}

impl Order {
    #[inline]
    pub(super) fn push(&mut self, slots: &mut [Slot], slot: u32) {
        match self {
            Order::Recency(l) => l.push_front(slots, slot),
            Order::Sampled(s) => s.push(slot),
        }
    }

    #[inline]
    pub(super) fn remove(&mut self, slots: &mut [Slot], slot: u32) {
        match self {
            Order::Recency(l) => l.unlink(slots, slot),
            Order::Sampled(s) => s.remove(slot),
        }
    }

    #[inline]
    pub(super) fn touch(&mut self, slots: &mut [Slot], slot: u32) {
        if let Order::Recency(l) = self {
            l.touch(slots, slot);
        }
    }
}
