//! The row bytes of a cache ([`Slab`]), shared through an `Arc` with the staged batches that
//! pool cached rows in place, and the token a batch keeps while it reads stable rows without a
//! hold ([`PinEpoch`]). Who writes and who reads which bytes is the tier's cache's business
//! (`ember-tier`, `cache/slab.rs` and `cache/pins.rs`); the rules it keeps: the cache writes only
//! slots no batch holds and batches read only slots they hold (or stable slots of an epoch they
//! keep), so one thread writing one slot never aliases a read of another. Every access goes
//! through raw pointers or a reference to one row, never a reference to the whole buffer.

use std::ptr::NonNull;
use std::sync::Arc;

/// The pinned set a batch read without holding its slots (see the module documentation): kept by
/// the batch until it is pooled.
#[derive(Debug, Clone, Default)]
pub struct PinEpoch(Arc<()>);

impl PinEpoch {
    /// Whether a batch still keeps a clone of this epoch.
    #[inline]
    pub fn shared(&self) -> bool {
        if Arc::strong_count(&self.0) > 1 {
            return true;
        }
        // The last batch let its clone go (a release decrement, read above): what it read of
        // the slab happens before whatever the cache writes next.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        false
    }
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
    pub fn zeroed(len: usize) -> Self {
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
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `start .. start + n`.
    ///
    /// # Safety
    /// Nothing may write those bytes while the returned slice lives (they belong to a slot the
    /// caller holds, or the caller is the only writer and holds it off).
    #[inline]
    pub unsafe fn bytes(&self, start: usize, n: usize) -> &[u8] {
        assert!(start <= self.len && n <= self.len - start, "slab range");
        // SAFETY: in bounds (asserted); the caller rules out concurrent writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), n) }
    }

    /// Copies `src` to `start`.
    ///
    /// # Safety
    /// No one may read or write those bytes meanwhile (they belong to a slot no batch holds, and
    /// the caller is the slab's only writer).
    #[inline]
    pub unsafe fn write(&self, start: usize, src: &[u8]) {
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
