//! Software prefetch of byte spans (a no-op off x86-64).

/// Asks the CPU to bring the cache lines of `[p, p + len)` into L1. Never faults, whatever `p`.
#[inline(always)]
pub(crate) fn prefetch_span(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let mut a = p as usize & !63;
        let last = (p as usize).wrapping_add(len.max(1) - 1);
        while a <= last {
            // SAFETY: prefetch is a hint; it does not fault on any address (Intel SDM, PREFETCHh).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(a as *const i8) };
            a += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// What to prefetch of each row for one dim block: the block's bytes, and the scale/bias trailer
/// of quantized rows (one span when they are close).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowPrefetch {
    off: usize,
    len: usize,
    trailer: Option<usize>,
}

impl RowPrefetch {
    /// Rows of `stride` bytes ending in `trailer` bytes of scale/bias; the block reads
    /// `len` bytes from `off`.
    pub(crate) fn new(stride: usize, trailer: usize, off: usize, len: usize) -> Self {
        let trailer_at = stride - trailer;
        if trailer == 0 {
            RowPrefetch {
                off,
                len,
                trailer: None,
            }
        } else if off + len + 64 >= trailer_at {
            RowPrefetch {
                off,
                len: stride - off,
                trailer: None,
            }
        } else {
            RowPrefetch {
                off,
                len,
                trailer: Some(trailer_at),
            }
        }
    }

    /// Prefetches the span of the row starting at `row`.
    #[inline(always)]
    pub(crate) fn row(&self, row: *const u8) {
        prefetch_span(row.wrapping_add(self.off), self.len);
        if let Some(t) = self.trailer {
            prefetch_span(row.wrapping_add(t), 8);
        }
    }
}
