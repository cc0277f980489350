//! The cache's internal invariants, checked by tests (and by the tier's property tests after
//! every batch).

use super::RowCache;
use super::lru::LruList;
use super::sample::{Order, SampleSet};
use super::sketch::COUNTER_MAX;
use super::slab::{NIL, SlotState};

impl RowCache {
    /// Checks the internal invariants and panics with a message if one fails (for tests):
    /// map / slot consistency, `len() <= capacity()`, the eviction structure (LRU list or LFU
    /// sample set) holds exactly the unpinned residents, every pinned id is resident, the live
    /// count table respects its bound.
    pub fn check_invariants(&self) {
        let total = self.capacity + self.reserve;
        assert_eq!(self.slab.len(), total * self.row_bytes, "slab size");
        assert_eq!(self.slots.len(), total, "slots length");
        self.check_slots();
        self.check_staging_free();
        self.check_capacity();
        self.check_map();
        self.check_pins();
        self.check_order();
        assert!(
            self.hot.len() <= self.hot.limit(),
            "live counts over their bound"
        );
    }

    /// Each slot's state agrees with its holds and its stable bit; staging slots (past the
    /// capacity) are free or transient.
    fn check_slots(&self) {
        let cap = self.capacity;
        for (s, rec) in self.slots.iter().enumerate() {
            let (st, h) = (rec.state, rec.holds);
            if s >= cap {
                assert!(
                    matches!(st, SlotState::Free | SlotState::Transient),
                    "staging slot {s} is {st:?}"
                );
                assert_eq!(
                    st == SlotState::Transient,
                    h > 0,
                    "staging slot {s} holds {h}"
                );
            } else {
                assert_ne!(st, SlotState::Transient, "cache slot {s} is a staging slot");
                let resident = matches!(st, SlotState::Cached | SlotState::Pinned);
                let stable = st == SlotState::Pinned || (self.covers && resident);
                assert_eq!(
                    self.stable_bit(s as u32),
                    stable,
                    "cache slot {s} is {st:?} but its stable bit disagrees"
                );
                assert!(
                    st != SlotState::Free || h == 0,
                    "free slot {s} held {h} times"
                );
                // An orphan is freed by its last release: it is always held.
                assert!(st != SlotState::Orphan || h > 0, "orphan slot {s} not held");
            }
        }
    }

    /// The staging free list holds exactly the free staging slots.
    fn check_staging_free(&self) {
        let cap = self.capacity;
        assert_eq!(
            self.staging_free.len(),
            self.slots[cap..]
                .iter()
                .filter(|r| r.state == SlotState::Free)
                .count(),
            "free staging slots"
        );
        for &slot in &self.staging_free {
            assert!(
                slot as usize >= cap,
                "staging free list holds cache slot {slot}"
            );
            assert_eq!(
                self.slots[slot as usize].state,
                SlotState::Free,
                "lent staging slot {slot} on the free list"
            );
        }
    }

    /// The residents fit the capacity and its byte budget; resident, free and orphan slots
    /// add up to the capacity (a covering cache keeps no free list).
    fn check_capacity(&self) {
        let cap = self.capacity;
        assert!(self.len() <= cap, "len {} > capacity {cap}", self.len());
        assert!(
            self.resident_bytes() <= cap * self.row_bytes,
            "resident bytes over budget"
        );
        let orphans = self.slots[..cap]
            .iter()
            .filter(|r| r.state == SlotState::Orphan)
            .count();
        if self.covers {
            assert!(self.free.is_empty(), "a covering cache keeps no free list");
        } else {
            assert_eq!(
                self.len() + self.free.len() + orphans,
                cap,
                "resident + free + orphans != capacity"
            );
        }
    }

    /// Every mapped id is in its own slot below the capacity; every slot on the free list is
    /// free.
    fn check_map(&self) {
        let cap = self.capacity;
        for (id, slot) in self.map.iter() {
            let s = slot as usize;
            assert!(s < cap, "id {id} maps to slot {slot} >= capacity");
            assert!(
                !self.covers || u64::from(slot) == id,
                "covering cache holds id {id} in slot {slot}"
            );
            assert_ne!(
                self.slots[s].state,
                SlotState::Free,
                "id {id} maps to free slot {slot}"
            );
            assert_eq!(
                self.slots[s].id, id,
                "slot {slot} holds {} not {id}",
                self.slots[s].id
            );
        }
        for &slot in &self.free {
            assert_eq!(
                self.slots[slot as usize].state,
                SlotState::Free,
                "free slot {slot} in use"
            );
        }
    }

    /// The slot states agree with the map's size; the pinned list holds exactly the pinned
    /// slots, each resident, at its recorded position.
    fn check_pins(&self) {
        let cap = self.capacity;
        let count = |st: SlotState| self.slots.iter().filter(|r| r.state == st).count();
        let (cached, pinned) = (count(SlotState::Cached), count(SlotState::Pinned));
        assert_eq!(
            cached + pinned,
            self.len(),
            "slot states disagree with the map"
        );
        assert_eq!(pinned, self.pinned.len(), "pinned slot list length");
        assert!(pinned <= cap, "more pinned rows than capacity");
        for (at, &slot) in self.pinned.iter().enumerate() {
            let s = slot as usize;
            assert_eq!(
                self.slots[s].state,
                SlotState::Pinned,
                "pinned list slot {slot} not pinned"
            );
            assert_eq!(
                self.pin_pos[s] as usize, at,
                "pinned slot {slot}'s position"
            );
            assert_eq!(
                self.map.get(&self.slots[s].id),
                Some(&slot),
                "pinned slot {slot} not resident"
            );
        }
    }

    /// The eviction structure (LRU list or LFU sample set) holds exactly the cached slots no
    /// batch holds.
    fn check_order(&self) {
        let cap = self.capacity;
        let evictable = (0..cap)
            .filter(|&s| self.slots[s].state == SlotState::Cached && self.slots[s].holds == 0)
            .count();
        match &self.order {
            Order::Recency(l) => self.check_lru(l, evictable),
            Order::Sampled(s) => self.check_sampled(s, evictable),
        }
    }

    /// The LRU list links exactly the `evictable` slots, both ways; no sketch is kept.
    fn check_lru(&self, l: &LruList, evictable: usize) {
        let (mut seen, mut prev, mut cur) = (0usize, NIL, l.head);
        while cur != NIL {
            assert!(
                seen < evictable,
                "LRU list longer than the evictable residents"
            );
            let c = cur as usize;
            assert_eq!(
                self.slots[c].state,
                SlotState::Cached,
                "LRU list holds slot {cur}"
            );
            assert_eq!(self.slots[c].holds, 0, "LRU list holds held slot {cur}");
            assert_eq!(self.slots[c].prev, prev, "LRU prev link of slot {cur}");
            seen += 1;
            prev = cur;
            cur = self.slots[c].next;
        }
        assert_eq!(l.tail, prev, "LRU tail");
        assert_eq!(seen, evictable, "LRU list misses evictable residents");
        assert!(self.sketch.is_none(), "sketch outside Lfu");
    }

    /// The LFU sample set holds exactly the `evictable` slots at their positions; a sketch is
    /// kept (unless the cache covers its table) with its counters in range.
    fn check_sampled(&self, s: &SampleSet, evictable: usize) {
        assert_eq!(s.members.len(), evictable, "sample set size");
        for (i, &slot) in s.members.iter().enumerate() {
            assert_eq!(
                self.slots[slot as usize].state,
                SlotState::Cached,
                "sampled {slot}"
            );
            assert_eq!(
                self.slots[slot as usize].holds, 0,
                "sampled held slot {slot}"
            );
            assert_eq!(
                s.pos[slot as usize] as usize, i,
                "sample position of {slot}"
            );
        }
        // A covering cache never evicts nor refuses a row: it keeps no sketch.
        assert_eq!(self.sketch.is_none(), self.covers, "Lfu keeps a sketch");
        if let Some(sketch) = &self.sketch {
            assert!(
                sketch.counters().all(|&c| c <= COUNTER_MAX),
                "sketch counter"
            );
        }
    }
}
