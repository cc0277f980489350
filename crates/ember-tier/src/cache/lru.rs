//! The recency order of the LRU and pinned policies: an intrusive doubly linked list through the
//! slot records, so that a hit, an insert and an eviction are O(1).

use super::slab::{NIL, Slot};

/// Intrusive doubly linked list over `Slot::prev` / `Slot::next`, most recently used at `head`.
#[derive(Debug)]
pub(super) struct LruList {
    pub(super) head: u32,
    pub(super) tail: u32,
}

impl LruList {
    #[inline]
    pub(super) fn push_front(&mut self, slots: &mut [Slot], slot: u32) {
        let s = &mut slots[slot as usize];
        s.prev = NIL;
        s.next = self.head;
        if self.head == NIL {
            self.tail = slot;
        } else {
            slots[self.head as usize].prev = slot;
        }
        self.head = slot;
    }

    #[inline]
    pub(super) fn unlink(&mut self, slots: &mut [Slot], slot: u32) {
        let Slot { prev, next, .. } = slots[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            slots[next as usize].prev = prev;
        }
    }

    #[inline]
    pub(super) fn touch(&mut self, slots: &mut [Slot], slot: u32) {
        if self.head != slot {
            self.unlink(slots, slot);
            self.push_front(slots, slot);
        }
    }
}
