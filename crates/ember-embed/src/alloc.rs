//! Table memory: anonymous mappings, 2 MiB aligned and advised `MADV_HUGEPAGE` when asked.
//!
//! Random row gathers over gigabytes of table miss the TLB on nearly every lookup with 4 KiB pages;
//! 2 MiB pages cover 512x more memory per TLB entry (measured here: +25% gather throughput). The
//! kernel only backs 2 MiB-aligned ranges with huge pages, so the mapping is over-allocated by
//! 2 MiB and the buffer starts at the first aligned address inside it. Whether the kernel really
//! gave huge pages (THP may be off, or memory fragmented) is read back from `/proc/self/smaps`.

use memmap2::{Advice, MmapMut};

/// Huge page size on x86-64 Linux.
pub const HUGE_PAGE: usize = 2 << 20;

/// How table memory is backed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagePolicy {
    /// Ask for transparent huge pages (the default; falls back silently to 4 KiB pages).
    Huge,
    /// Plain 4 KiB pages.
    Small,
}

/// A zero-initialised, page-aligned byte buffer.
#[derive(Debug)]
pub struct RowBuf {
    map: MmapMut,
    offset: usize,
    len: usize,
}

impl RowBuf {
    /// Maps `len` zeroed bytes. With [`PagePolicy::Huge`] and `len >= 2 MiB` the start is 2 MiB
    /// aligned and the range advised for huge pages.
    pub fn new(len: usize, policy: PagePolicy) -> std::io::Result<Self> {
        let huge = policy == PagePolicy::Huge && len >= HUGE_PAGE;
        let map_len = if huge { len + HUGE_PAGE } else { len.max(1) };
        let map = MmapMut::map_anon(map_len)?;
        let offset = if huge {
            let addr = map.as_ptr() as usize;
            addr.next_multiple_of(HUGE_PAGE) - addr
        } else {
            0
        };
        if huge {
            // Advice failing (THP compiled out) only costs speed; keep the buffer.
            let _ = map.advise_range(Advice::HugePage, offset, len);
        }
        Ok(RowBuf { map, offset, len })
    }

    /// The buffer.
    pub fn as_slice(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// The buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[self.offset..self.offset + self.len]
    }

    /// Bytes of this buffer currently backed by huge pages, if `/proc/self/smaps` can tell.
    pub fn huge_page_bytes(&self) -> Option<usize> {
        let start = self.as_slice().as_ptr() as usize;
        anon_huge_bytes_in(start, start + self.len)
    }
}

/// Sums `AnonHugePages` of the mappings in `/proc/self/smaps` that overlap `[lo, hi)` (advising a
/// sub-range splits a mapping, so the buffer may span several).
fn anon_huge_bytes_in(lo: usize, hi: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut overlaps = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            overlaps = a < hi && lo < b;
            continue;
        }
        if overlaps && let Some(rest) = line.strip_prefix("AnonHugePages:") {
            total += rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()?
                * 1024;
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_buffers_are_aligned_zeroed_and_writable() {
        let mut b = RowBuf::new(3 * HUGE_PAGE + 123, PagePolicy::Huge).unwrap();
        assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b.as_slice().len(), 3 * HUGE_PAGE + 123);
        assert!(b.as_slice().iter().step_by(4096).all(|&x| x == 0));
        b.as_mut_slice()[3 * HUGE_PAGE + 122] = 7;
        assert_eq!(b.as_slice()[3 * HUGE_PAGE + 122], 7);
        // Reading smaps works on Linux; whether THP granted pages depends on the host.
        assert!(b.huge_page_bytes().is_some());
    }

    #[test]
    fn small_buffers_work_for_both_policies() {
        for p in [PagePolicy::Huge, PagePolicy::Small] {
            let mut b = RowBuf::new(10, p).unwrap();
            b.as_mut_slice().copy_from_slice(&[1; 10]);
            assert_eq!(b.as_slice(), &[1; 10]);
            let z = RowBuf::new(0, p).unwrap();
            assert!(z.as_slice().is_empty());
        }
    }
}
