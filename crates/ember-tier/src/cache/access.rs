//! Finding, holding, inserting and releasing rows: the stager's side of [`RowCache`] (the
//! lookups of a batch mark, hold and prefetch slots here; `mod.rs` keeps the cache's state,
//! its policies' bookkeeping and eviction).

use super::*;

impl RowCache {
    /// Asks the CPU to bring what a lookup of `id` reads first (its map bucket) into cache; for
    /// loops over many ids, some ids ahead of [`find`](Self::find) or
    /// [`get_held`](Self::get_held).
    #[inline(always)]
    pub fn prefetch(&self, id: u64) {
        if self.covers {
            return;
        }
        self.map.prefetch(id);
        if let Some(sketch) = &self.sketch {
            sketch.prefetch(id);
        }
    }

    /// Asks the CPU to bring the records under Lru a hold of `slot` changes (its neighbours on
    /// the list) into cache. It reads the slot's own record: bring that in first
    /// ([`prefetch_release`](Self::prefetch_release) some slots before).
    #[inline(always)]
    pub fn prefetch_neighbours(&self, slot: u32) {
        use ember_embed::prefetch::prefetch_span;
        if !matches!(self.order, Order::Recency(_)) {
            return;
        }
        if let Some(rec) = self.slots.get(slot as usize)
            && rec.state == SlotState::Cached
            && rec.holds == 0
        {
            for n in [rec.prev, rec.next] {
                if let Some(r) = self.slots.get(n as usize) {
                    prefetch_span(std::ptr::from_ref(r).cast(), size_of::<Slot>());
                }
            }
        }
    }

    /// Asks the CPU to bring what a hold or a [`release`](Self::release) of `slot` touches into
    /// cache: its record (and its place in the LFU sample set).
    #[inline(always)]
    pub fn prefetch_release(&self, slot: u32) {
        use ember_embed::prefetch::prefetch_span;
        let s = slot as usize;
        if let Some(rec) = self.slots.get(s) {
            prefetch_span(std::ptr::from_ref(rec).cast(), size_of::<Slot>());
        }
        if let Order::Sampled(set) = &self.order {
            set.prefetch(slot);
        }
    }

    /// A lookup of `id` that records the access as [`get`](Self::get) does, but neither reads
    /// the row nor changes the eviction order: the slot of `id`, if resident. Hold it with
    /// [`hold`](Self::hold) before anything else changes the cache. `find` then `hold` is
    /// [`get_held`](Self::get_held) in two steps, so that a loop over many ids can run all its
    /// lookups, then all its holds, prefetching for each the addresses it already knows.
    #[inline]
    pub fn find(&mut self, id: u64) -> Option<u32> {
        self.hot.count(id);
        if let Some(sketch) = &mut self.sketch {
            sketch.record(id);
        }
        self.map.get(&id).copied()
    }

    /// A lookup of `id`, as [`get`](Self::get), that also holds the row's slot until
    /// [`release`](Self::release): returns the slot (its row is `row_bytes()` bytes at
    /// `slot * row_bytes()` in [`slab`](Self::slab)).
    #[inline]
    pub fn get_held(&mut self, id: u64) -> Option<u32> {
        let slot = self.find(id)?;
        self.hold_slot(slot);
        Some(slot)
    }

    /// A fresh mark for a pass of [`find_marked`](Self::find_marked) (never 0; on the rare wrap
    /// of the counter every record's mark is cleared, so a mark is never met twice).
    pub fn next_mark(&mut self) -> u32 {
        self.mark = self.mark.wrapping_add(1);
        if self.mark == 0 {
            self.slots.iter_mut().for_each(|r| r.mark = 0);
            self.mark = 1;
        }
        self.mark
    }

    /// A lookup of `id` in a pass over a batch's ids that deduplicates as it goes, marked `mark`
    /// (the latest [`next_mark`](Self::next_mark)): the first time a resident id is met in the
    /// pass, its access is recorded (as [`find`](Self::find) does) and its slot remembers `pos`:
    /// [`Marked::First`], to be held with [`hold`](Self::hold) before anything else changes the
    /// cache. Every later time in the pass it returns that `pos` ([`Marked::Again`]) and records
    /// nothing. An absent id records nothing either ([`Marked::Absent`]): call
    /// [`find`](Self::find) once per distinct absent id. A stable id (pinned, or resident in a
    /// covering cache) is neither marked nor recorded ([`Marked::Stable`], every time): call
    /// [`record_access`](Self::record_access) once per distinct stable id, and keep
    /// [`pin_epoch`](Self::pin_epoch) while reading its slot. Nothing else may change the cache
    /// during a pass.
    ///
    /// # Panics
    /// If `mark` is not the latest mark.
    #[inline]
    pub fn find_marked(&mut self, id: u64, mark: u32, pos: u32) -> Marked {
        assert!(
            mark == self.mark && mark != 0,
            "find_marked with a stale mark"
        );
        if self.covers {
            // Slot `id` if resident: one bit, not the map.
            return self.stable_slot(id).map_or(Marked::Absent, Marked::Stable);
        }
        let Some(&slot) = self.map.get(&id) else {
            return Marked::Absent;
        };
        if self.stable_bit(slot) {
            return Marked::Stable(slot);
        }
        let rec = &mut self.slots[slot as usize];
        if rec.mark == mark {
            return Marked::Again(rec.pos);
        }
        rec.mark = mark;
        rec.pos = pos;
        self.hot.count(id);
        if let Some(sketch) = &mut self.sketch {
            sketch.record(id);
        }
        Marked::First(slot)
    }

    /// Asks the CPU to bring `id`'s slot record into cache, if `id` is resident. It reads the
    /// map: bring that in first ([`prefetch`](Self::prefetch) some ids before).
    #[inline(always)]
    pub fn prefetch_record(&self, id: u64) {
        if !self.covers
            && let Some(&slot) = self.map.get(&id)
            && !self.stable_bit(slot)
        {
            self.prefetch_release(slot);
        }
    }

    /// Holds resident `slot` (found by [`find`](Self::find)) until [`release`](Self::release).
    ///
    /// # Panics
    /// If no row is resident in `slot`.
    #[inline]
    pub fn hold(&mut self, slot: u32) {
        let state = self.slots.get(slot as usize).map(|r| r.state);
        assert!(
            matches!(state, Some(SlotState::Cached | SlotState::Pinned)),
            "hold of slot {slot}, which holds no resident row"
        );
        self.hold_slot(slot);
    }

    /// [`insert`](Self::insert), then holds the row's slot if `id` is resident: returns the slot.
    #[inline]
    pub fn insert_held(&mut self, id: u64, row: &[u8]) -> Option<u32> {
        if !self.insert(id, row) {
            return None;
        }
        let slot = *self.map.get(&id)?;
        self.hold_slot(slot);
        Some(slot)
    }

    /// Lends a free staging slot, holding `row` (not resident: no lookup finds it), until
    /// [`release`](Self::release). `None` when every staging slot is lent or `row` is not
    /// `row_bytes()` long.
    pub fn hold_staging(&mut self, row: &[u8]) -> Option<u32> {
        if row.len() != self.row_bytes {
            return None;
        }
        let slot = self.staging_free.pop()?;
        self.write_row(slot, row);
        self.slots[slot as usize].state = SlotState::Transient;
        self.slots[slot as usize].holds = 1;
        Some(slot)
    }

    /// The bytes of a slot (for the cache's owner: what a held slot holds).
    ///
    /// # Panics
    /// If `slot` is not a slot of the slab.
    pub fn slot_row(&self, slot: u32) -> &[u8] {
        assert!(
            (slot as usize) < self.capacity + self.reserve,
            "slot {slot} outside the slab"
        );
        self.row(slot)
    }

    /// Gives back one hold of `slot`: once no batch holds it, a cached row is evictable again (as
    /// the most recently used) and a staging slot is free.
    ///
    /// # Panics
    /// If `slot` is not held.
    pub fn release(&mut self, slot: u32) {
        let s = slot as usize;
        assert!(
            self.slots[s].holds > 0,
            "release of slot {slot}, which is not held"
        );
        self.slots[s].holds -= 1;
        if self.slots[s].holds > 0 {
            return;
        }
        match self.slots[s].state {
            SlotState::Cached => self.order.push(&mut self.slots, slot),
            SlotState::Transient => {
                self.slots[s].state = SlotState::Free;
                self.staging_free.push(slot);
            }
            SlotState::Orphan => {
                self.slots[s].state = SlotState::Free;
                if !self.covers {
                    self.free.push(slot);
                }
            }
            SlotState::Pinned | SlotState::Free => {}
        }
    }

    /// Takes a hold of a resident slot (off the eviction structure while held).
    #[inline]
    fn hold_slot(&mut self, slot: u32) {
        let s = slot as usize;
        if self.slots[s].holds == 0 && self.slots[s].state == SlotState::Cached {
            self.order.remove(&mut self.slots, slot);
        }
        self.slots[s].holds += 1;
    }

    /// Whether [`RowCache::insert`] of the absent `id` would admit it now (a free slot, or a
    /// victim the policy would drop for it), without changing anything but the sampling: for
    /// a caller that reads the row only if it would be kept (the remote tier's background fill).
    pub fn would_admit(&mut self, id: u64) -> bool {
        if self.map.contains_key(&id) {
            return false;
        }
        if self.covers {
            return u32::try_from(id).is_ok_and(|s| {
                (s as usize) < self.slots.len() && self.slots[s as usize].state == SlotState::Free
            });
        }
        if !self.free.is_empty() {
            return true;
        }
        let Some(victim) = self.victim() else {
            return false;
        };
        match &self.sketch {
            Some(sketch) => sketch.estimate(id) > sketch.estimate(self.slots[victim as usize].id),
            None => true,
        }
    }

    /// Offers `row`, read from disk after a miss of `id`; the policy decides whether to admit it
    /// and what to evict. Returns whether `id` is now resident.
    ///
    /// A row whose length is not `row_bytes()` is refused (returns `false`, changes nothing).
    /// Inserting an id already resident overwrites its bytes and returns `true` (a slot a batch
    /// holds, or a pinned slot a batch reads, keeps its bytes: rows of one table version never change). When the cache
    /// is full: Lru / Pinned evict the least recently used unpinned row; Lfu admits `id` only if
    /// its estimated frequency is strictly greater than the sampled victim's (else returns
    /// `false` and changes nothing but the sketch). If every resident row is pinned, returns
    /// `false`.
    pub fn insert(&mut self, id: u64, row: &[u8]) -> bool {
        if row.len() != self.row_bytes {
            return false;
        }
        // No sketch bump: the `get` that missed already counted this access.
        if let Some(&slot) = self.map.get(&id) {
            // A pinned slot may be read by batches that keep its epoch, unheld (`pins.rs`).
            if self.slots[slot as usize].holds == 0 && !self.read_unheld(slot) {
                self.write_row(slot, row);
                if self.slots[slot as usize].state == SlotState::Cached {
                    self.order.touch(&mut self.slots, slot);
                }
            }
            return true;
        }
        let slot = match self.free_slot(id) {
            Some(slot) => slot,
            // A covering cache puts each id in its own slot, or nowhere.
            None if self.covers => return false,
            None => {
                let Some(victim) = self.victim() else {
                    return false;
                };
                if let Some(sketch) = &self.sketch
                    && sketch.estimate(id) <= sketch.estimate(self.slots[victim as usize].id)
                {
                    return false;
                }
                self.evict(victim);
                victim
            }
        };
        self.occupy(slot, id, row, SlotState::Cached);
        true
    }
}
