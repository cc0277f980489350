//! The slab: the row bytes of a cache, and its per-slot records (what each slot holds, its links
//! on the LRU list, its state). Slot `s`'s row is `row_bytes` bytes at `s * row_bytes`.
//!
//! The row bytes ([`Slab`]) are shared, through an `Arc`, with the staged batches that pool cached
//! rows in place: a batch *holds* the slots it reads (see `RowCache::get_held`), the cache never
//! writes or evicts a held slot, and the batch releases its slots once pooled. So one thread (the
//! cache's owner) writes slots no batch holds while pooling threads read slots their batch holds:
//! never the same bytes. Every access goes through raw pointers or a reference to one row, never
//! a reference to the whole buffer, so a write to one slot never aliases a read of another.

pub use ember_embed::staged::Slab;

/// "No slot" in the intrusive LRU list.
pub(super) const NIL: u32 = u32::MAX;

/// What a slot of the slab holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    /// Resident and evictable (on the policy's eviction structure unless held).
    Cached,
    /// Resident and pinned (on no eviction structure).
    Pinned,
    /// A staging slot (beyond `capacity`) lent to one batch for a row the cache did not keep;
    /// freed when the batch releases it. Not resident: no id maps to it.
    Transient,
    /// A cache slot whose row was updated while batches might read it: its id left the cache,
    /// and the slot is freed once they are done (the last hold released). No id maps to it.
    Orphan,
}

/// Per-slot metadata in one 32-byte record (two to a cache line, never across two): a lookup's
/// hold, a release and an LRU step each touch one line per slot. Kept apart (state, holds and
/// links in three arrays), a hold touched three lines and staging ran 1.5x slower.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Slot {
    /// Id held (meaningful when the slot is not free).
    pub(super) id: u64,
    /// Neighbours on the LRU list (Lru / Pinned policies; `NIL` otherwise).
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Batches holding the slot.
    pub(super) holds: u32,
    /// The last pass of `RowCache::find_marked` that saw it, and the position it was given
    /// there.
    pub(super) mark: u32,
    pub(super) pos: u32,
    pub(super) state: SlotState,
}

impl Slot {
    pub(super) const FREE: Slot = Slot {
        id: 0,
        prev: NIL,
        next: NIL,
        holds: 0,
        mark: 0,
        pos: 0,
        state: SlotState::Free,
    };
}
