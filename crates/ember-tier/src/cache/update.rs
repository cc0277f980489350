//! Row updates: new bytes for a resident row, applied so that no batch ever reads a torn row.
//!
//! A row no batch may be reading (no hold, and not a stable row while a batch keeps an epoch)
//! is rewritten where it is. Otherwise its id leaves the cache at once (the next lookup misses
//! and fetches the new row from the store, which has it before the update is published), and the
//! old slot becomes an *orphan*: batches that hold it, or that read it unheld under the current
//! or an earlier epoch, go on reading the old bytes whole; the slot is freed when the last of
//! them is done. Call [`RowCache::end_updates`] after a round of updates, before the next batch
//! is staged: it starts a new epoch, so that the orphans wait only for the batches before.

use super::RowCache;
use super::slab::SlotState;

/// What [`RowCache::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updated {
    /// The id was not resident: nothing to do (the next lookup reads the store).
    Absent,
    /// Rewritten in place.
    InPlace,
    /// Batches might be reading the old bytes: the id left the cache (see the module
    /// documentation).
    Dropped,
}

impl RowCache {
    /// Applies new bytes `row` to resident `id` (see the module documentation).
    ///
    /// # Panics
    /// If `row` is not `row_bytes()` long.
    pub fn update(&mut self, id: u64, row: &[u8]) -> Updated {
        assert_eq!(
            row.len(),
            self.row_bytes,
            "update of a row of the wrong length"
        );
        let Some(&slot) = self.map.get(&id) else {
            return Updated::Absent;
        };
        let read_unheld = self.read_unheld(slot);
        if self.slots[slot as usize].holds == 0 && !read_unheld {
            self.write_row(slot, row);
            return Updated::InPlace;
        }
        self.leave(id, slot, read_unheld);
        Updated::Dropped
    }

    /// Ends a round of [`update`](Self::update)s: the orphans read unheld wait for the batches
    /// of the current epoch (and earlier ones), and a new epoch begins for the batches after.
    pub fn end_updates(&mut self) {
        if self.retiring.is_empty() {
            return;
        }
        let slots = std::mem::take(&mut self.retiring);
        self.retire_epoch(slots);
    }

    /// Drops every resident row (the stream of updates was trimmed past what this cache has
    /// applied, so it cannot tell which rows are stale), then [`end_updates`](Self::end_updates).
    /// Slots batches may read become orphans.
    pub fn drop_all(&mut self) {
        let resident: Vec<(u64, u32)> = self.map.iter().collect();
        for (id, slot) in resident {
            self.leave(id, slot, self.read_unheld(slot));
        }
        self.end_updates();
    }

    /// `id` (in `slot`) leaves the cache: the slot is free at once if no batch may read it,
    /// else an orphan (held for the current epoch's batches when they read it unheld).
    fn leave(&mut self, id: u64, slot: u32, read_unheld: bool) {
        let s = slot as usize;
        self.map.remove(&id);
        match self.slots[s].state {
            SlotState::Cached if self.slots[s].holds == 0 => {
                self.order.remove(&mut self.slots, slot);
            }
            SlotState::Pinned => self.remove_pinned(slot),
            _ => {}
        }
        self.set_stable_bit(slot, false);
        if self.slots[s].holds == 0 && !read_unheld {
            self.slots[s].state = SlotState::Free;
            if !self.covers {
                self.free.push(slot);
            }
            return;
        }
        self.slots[s].state = SlotState::Orphan;
        if read_unheld {
            self.slots[s].holds += 1;
            self.retiring.push(slot);
        }
    }
}
