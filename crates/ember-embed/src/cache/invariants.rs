//! The cache's internal invariants, checked by tests (and by the tier's property tests after
//! every batch).

use super::RowCache;
use super::sample::Order;
use super::sketch::COUNTER_MAX;
use super::slab::{NIL, SlotState};

impl RowCache {
    /// Checks the internal invariants and panics with a message if one fails (for tests):
    /// map / slot consistency, `len() <= capacity()`, the eviction structure (LRU list or LFU
    /// sample set) holds exactly the unpinned residents, every pinned id is resident, the live
    /// count table respects its bound.
    pub fn check_invariants(&self) {
        let cap = self.capacity;
        let total = cap + self.reserve;
        assert_eq!(self.slab.len(), total * self.row_bytes, "slab size");
        assert_eq!(self.slots.len(), total, "slots length");
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
        let count = |st: SlotState| self.slots.iter().filter(|r| r.state == st).count();
        let (cached, pinned) = (count(SlotState::Cached), count(SlotState::Pinned));
        // The eviction structure holds the cached slots no batch holds.
        let evictable = (0..cap)
            .filter(|&s| self.slots[s].state == SlotState::Cached && self.slots[s].holds == 0)
            .count();
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
        match &self.order {
            Order::Recency(l) => {
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
            Order::Sampled(s) => {
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
        assert!(
            self.hot.len() <= self.hot.limit(),
            "live counts over their bound"
        );
    }
}
