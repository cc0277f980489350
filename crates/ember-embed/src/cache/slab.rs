//! The slab: the row bytes of a cache, and its per-slot records (what each slot holds, its links
//! on the LRU list, its state). Slot `s`'s row is `row_bytes` bytes at `s * row_bytes`.
//!
//! The row bytes ([`Slab`]) are shared, through an `Arc`, with the staged batches that pool cached
//! rows in place: a batch *holds* the slots it reads (see `RowCache::get_held`), the cache never
//! writes or evicts a held slot, and the batch releases its slots once pooled. So one thread (the
//! cache's owner) writes slots no batch holds while pooling threads read slots their batch holds:
//! never the same bytes. Every access goes through raw pointers or a reference to one row, never
//! a reference to the whole buffer, so a write to one slot never aliases a read of another.

use std::ptr::NonNull;

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

/// Row bytes of a cache: one zeroed mapping of fixed length, on 2 MiB pages where the kernel
/// grants them (rows are read at random, as tables are), that never moves (see the module
/// documentation for who reads and writes which bytes).
#[derive(Debug)]
pub struct Slab {
    /// Owns the mapping; never borrowed after `ptr` is taken from it.
    _buf: crate::alloc::RowBuf,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the slab is plain bytes; the cache writes only slots no batch holds and batches read only
// slots they hold (module documentation), so sharing it between threads never races on a byte.
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Slab {
    /// `len` zeroed bytes (untouched rows cost no memory).
    ///
    /// # Panics
    /// If the mapping cannot be made (out of address space).
    pub(super) fn zeroed(len: usize) -> Self {
        let mut buf = crate::alloc::RowBuf::new(len, crate::alloc::PagePolicy::Huge)
            .unwrap_or_else(|e| panic!("cannot map a row cache of {len} bytes: {e}"));
        let ptr = NonNull::new(buf.as_mut_slice().as_mut_ptr()).expect("mappings are non-null");
        Slab {
            _buf: buf,
            ptr,
            len,
        }
    }

    /// Start of the bytes (valid for [`Slab::len`] bytes while the slab lives).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `start .. start + n`.
    ///
    /// # Safety
    /// Nothing may write those bytes while the returned slice lives (they belong to a slot the
    /// caller holds, or the caller is the only writer and holds it off).
    pub(super) unsafe fn bytes(&self, start: usize, n: usize) -> &[u8] {
        assert!(start <= self.len && n <= self.len - start, "slab range");
        // SAFETY: in bounds (asserted); the caller rules out concurrent writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), n) }
    }

    /// Copies `src` to `start`.
    ///
    /// # Safety
    /// No one may read or write those bytes meanwhile (they belong to a slot no batch holds, and
    /// the caller is the slab's only writer).
    pub(super) unsafe fn write(&self, start: usize, src: &[u8]) {
        assert!(
            start <= self.len && src.len() <= self.len - start,
            "slab range"
        );
        // SAFETY: in bounds (asserted), `src` is another allocation's bytes, and the caller rules
        // out concurrent access to the destination.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(start), src.len())
        };
    }
}
