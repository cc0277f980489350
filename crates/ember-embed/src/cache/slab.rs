//! The slab's per-slot records: what each slot of the row slab holds (its id, its links on the
//! LRU list) and in which state it is. The row bytes themselves are one `Vec<u8>` of
//! `capacity * row_bytes` in [`super::RowCache`], slot `s` at `s * row_bytes`.

/// "No slot" in the intrusive LRU list.
pub(super) const NIL: u32 = u32::MAX;

/// What a slot of the slab holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    /// Resident and evictable (on the policy's eviction structure).
    Cached,
    /// Resident and pinned (on no eviction structure).
    Pinned,
}

/// Per-slot metadata: 16 bytes, so an LRU step touches one cache line per slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    /// Id held (meaningful when the slot is not free).
    pub(super) id: u64,
    /// Neighbours on the LRU list (Lru / Pinned policies; `NIL` otherwise).
    pub(super) prev: u32,
    pub(super) next: u32,
}
