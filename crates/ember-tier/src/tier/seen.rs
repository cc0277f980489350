//! The distinct stable rows of a feature being staged, noted without a branch.

/// The distinct stable slots met while staging one feature: a bit per cache slot (a few dozen
/// KiB, so it stays in the CPU's cache, where the slots' records would not), cleared after each
/// feature by walking the slots it set. Noting a slot takes no branch (whether a slot is new is
/// as unpredictable as the ids).
#[derive(Debug, Default)]
pub(super) struct SeenSlots {
    bits: Vec<u64>,
    /// The slots noted, in `set[..len]` (room for every id of the feature).
    set: Vec<u32>,
    len: usize,
}

impl SeenSlots {
    /// Readies it for a feature of `ids` ids over `slots` cache slots.
    pub(super) fn prepare(&mut self, slots: usize, ids: usize) {
        let words = slots.div_ceil(64);
        if self.bits.len() < words {
            self.bits.resize(words, 0);
        }
        if self.set.len() < ids {
            self.set.resize(ids, 0);
        }
    }

    /// Whether `slot` (below the `slots` of [`prepare`](Self::prepare)) is new to this feature
    /// (then it is noted).
    #[inline(always)]
    pub(super) fn insert(&mut self, slot: u32) -> bool {
        let (w, m) = (slot as usize / 64, 1u64 << (slot % 64));
        let word = self.bits[w];
        self.bits[w] = word | m;
        let new = word & m == 0;
        // Written always, kept only when new.
        self.set[self.len] = slot;
        self.len += usize::from(new);
        new
    }

    /// Asks the CPU to bring `slot`'s bit into cache.
    #[inline(always)]
    pub(super) fn prefetch(&self, slot: u32) {
        ember_embed::prefetch::prefetch_span(
            self.bits.as_ptr().wrapping_add(slot as usize / 64).cast(),
            8,
        );
    }

    /// Distinct slots noted.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Forgets every slot: one by one, or the whole bitset at once where they are many.
    pub(super) fn clear(&mut self) {
        if self.len * 8 > self.bits.len() {
            self.bits.fill(0);
        } else {
            for &slot in &self.set[..self.len] {
                self.bits[slot as usize / 64] = 0;
            }
        }
        self.len = 0;
    }
}
