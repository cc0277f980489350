//! Stable rows read without a hold.
//!
//! A pinned row stays where it is until the pinned set is replaced ([`RowCache::pin`]), and in a
//! cache whose capacity covers every id below its bound ([`RowCache::covers_ids`]: id `i` lives
//! in slot `i`, and nothing is ever evicted) every resident row stays where it is. Such a row is
//! *stable*: a staged batch may read it in place without the hold (a write to the slot's record
//! at staging and another at release) that an evictable row needs. A lookup tells a stable slot
//! by one bit ([`RowCache::find_marked`] returns [`super::Marked::Stable`]; a covering cache
//! reads no map at all), and the batch keeps a clone of the cache's [`PinEpoch`] instead, until
//! it is pooled.
//!
//! When the pinned set is replaced while batches still share the epoch, every slot pinned under
//! it is first held on their behalf (so none is overwritten or evicted while they may read it),
//! and a new epoch begins. [`RowCache::reap_pins`] gives those holds back once no batch shares
//! the old epoch any more. A stable row is never rewritten while its epoch is shared.

use super::RowCache;
pub use ember_embed::staged::PinEpoch;

impl RowCache {
    /// Whether cache slot `slot` holds a stable row (one bit read, not the slot's record).
    #[inline(always)]
    pub(super) fn stable_bit(&self, slot: u32) -> bool {
        self.stable_bits
            .get(slot as usize / 64)
            .is_some_and(|w| w >> (slot % 64) & 1 == 1)
    }

    /// Sets or clears slot `slot`'s stable bit.
    pub(super) fn set_stable_bit(&mut self, slot: u32, on: bool) {
        let (w, b) = (slot as usize / 64, slot % 64);
        if on {
            self.stable_bits[w] |= 1 << b;
        } else {
            self.stable_bits[w] &= !(1 << b);
        }
    }

    /// Slot of `id` if it is resident in a cache that covers every id (slot `id`): one bit read.
    /// `None` when absent, or when the cache does not cover its ids (then use
    /// [`find_marked`](Self::find_marked)).
    #[inline(always)]
    pub fn stable_slot(&self, id: u64) -> Option<u32> {
        let slot = u32::try_from(id).ok()?;
        (self.covers && self.stable_bit(slot)).then_some(slot)
    }

    /// Asks the CPU to bring the bit [`stable_slot`](Self::stable_slot) reads for `id` into
    /// cache.
    #[inline(always)]
    pub fn prefetch_stable(&self, id: u64) {
        let w = (id / 64) as usize;
        ember_embed::prefetch::prefetch_span(self.stable_bits.as_ptr().wrapping_add(w).cast(), 8);
    }

    /// Whether a lookup records its access (live counts for [`take_hot`](Self::take_hot), or
    /// the sketch under Lfu): if not, [`record_access`](Self::record_access) does nothing.
    pub fn records_access(&self) -> bool {
        self.hot.is_on() || self.sketch.is_some()
    }

    /// The current pinned set's epoch: a batch that reads pinned slots it does not hold keeps a
    /// clone until it is pooled (see the module documentation).
    pub fn pin_epoch(&self) -> PinEpoch {
        self.pin_epoch.clone()
    }

    /// Records an access of the resident stable `id` (the live counts of
    /// [`take_hot`](Self::take_hot), the sketch under Lfu), as [`find_marked`](Self::find_marked)
    /// does the first time it meets an id in a pass; it does not for stable ids
    /// ([`super::Marked::Stable`]), whose caller records each once.
    #[inline]
    pub fn record_access(&mut self, id: u64) {
        self.hot.count(id);
        if let Some(sketch) = &mut self.sketch {
            sketch.record(id);
        }
    }

    /// Whether a batch may be reading stable rows unheld (it keeps the current epoch or one
    /// not yet reaped): a stable row's bytes are not rewritten meanwhile.
    pub(super) fn stable_rows_read(&self) -> bool {
        self.pin_epoch.shared() || !self.retired.is_empty()
    }

    /// Whether a batch may be reading `slot` unheld: it is stable, and a batch keeps an epoch.
    pub(super) fn read_unheld(&self, slot: u32) -> bool {
        self.stable_bit(slot) && self.stable_rows_read()
    }

    /// Ends the current epoch: `slots` (held for its batches) are given back once no batch
    /// keeps it or an earlier one ([`reap_pins`](Self::reap_pins)), and a new epoch begins.
    pub(super) fn retire_epoch(&mut self, slots: Vec<u32>) {
        let old = std::mem::take(&mut self.pin_epoch);
        self.retired.push_back((old, slots));
    }

    /// Before the pinned set changes: if batches still share the current epoch or an earlier
    /// one, holds every pinned slot for them and starts a new epoch (with the slots of rows
    /// updated under it).
    pub(super) fn retire_pins(&mut self) {
        // Batches of this epoch or of an earlier one not yet reaped may read the pinned rows.
        let shared = self.stable_rows_read();
        if !shared && self.retiring.is_empty() {
            return;
        }
        let mut slots = std::mem::take(&mut self.retiring);
        if shared {
            slots.extend_from_slice(&self.pinned);
            for &slot in &self.pinned {
                self.slots[slot as usize].holds += 1;
            }
        }
        self.retire_epoch(slots);
    }

    /// Gives back the holds taken for batches of earlier epochs, oldest first, up to the first
    /// epoch a batch still shares (a slot retired under an epoch may also be read by batches of
    /// the epochs before it).
    pub fn reap_pins(&mut self) {
        while let Some((epoch, _)) = self.retired.front() {
            if epoch.shared() {
                break;
            }
            let (_, slots) = self.retired.pop_front().expect("front exists");
            for slot in slots {
                self.release(slot);
            }
        }
    }

    /// Appends `slot` to the pinned list.
    pub(super) fn push_pinned(&mut self, slot: u32) {
        self.pin_pos[slot as usize] = self.pinned.len() as u32;
        self.pinned.push(slot);
    }

    /// Takes pinned `slot` off the pinned list (constant time).
    pub(super) fn remove_pinned(&mut self, slot: u32) {
        let at = self.pin_pos[slot as usize] as usize;
        debug_assert_eq!(self.pinned[at], slot);
        self.pinned.swap_remove(at);
        if let Some(&moved) = self.pinned.get(at) {
            self.pin_pos[moved as usize] = at as u32;
        }
    }
}
