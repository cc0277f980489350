//! Software prefetch of byte spans (a no-op off x86-64), and the cache level row prefetches fill.

use std::sync::OnceLock;

/// The cache level the kernels' row prefetches fill: L1 (`prefetcht0`) or L2 (`prefetcht1`).
///
/// On Intel cores a `prefetcht0` that misses holds one of the L1D's fill buffers (16 on Golden /
/// Raptor Cove) until its line lands in L1, so at most 16 lines (4 rows of 256 bytes) are in
/// flight from software prefetch, whatever the distance; a prefetch to L2 is handed to the L2's
/// own, larger miss queue, and the row's loads later hit L2. On RM1 with the production trace, an
/// Emerald Rapids VM (2 vCPUs) ran the C loop 1.07-1.16x faster with `prefetcht1` than with
/// `prefetcht0` at its best distance (medians of 25 paired passes), the ceiling of `bench embed`
/// chose L2 in 6 tunings of 6, and Ember ran at 53-81 M lookups/s into L2 against 53-60 M into
/// L1 (three alternating processes each). The AMD EPYC (Zen) VM the kernels were tuned on
/// prefetched into L1 at 0.97-1.03 of its ceiling; it was not available to measure L2 on, so it
/// keeps L1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchLevel {
    /// `prefetcht0`.
    L1,
    /// `prefetcht1`.
    L2,
}

impl PrefetchLevel {
    /// `EMBER_PREFETCH_LEVEL` (`l1` or `l2`) if set to one of them, else L2 on Intel and L1
    /// elsewhere. Read once per process.
    pub fn selected() -> PrefetchLevel {
        static SELECTED: OnceLock<PrefetchLevel> = OnceLock::new();
        *SELECTED.get_or_init(|| match std::env::var("EMBER_PREFETCH_LEVEL").as_deref() {
            Ok("l1") => PrefetchLevel::L1,
            Ok("l2") => PrefetchLevel::L2,
            _ => PrefetchLevel::for_cpu(),
        })
    }

    /// The default for this CPU: L2 on Intel, L1 elsewhere.
    pub fn for_cpu() -> PrefetchLevel {
        #[cfg(target_arch = "x86_64")]
        {
            let v = std::arch::x86_64::__cpuid(0);
            // "GenuineIntel"
            if [v.ebx, v.edx, v.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e] {
                return PrefetchLevel::L2;
            }
        }
        PrefetchLevel::L1
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            PrefetchLevel::L1 => "l1",
            PrefetchLevel::L2 => "l2",
        }
    }

    /// Whether prefetches fill L2 only (the kernels' const parameter).
    #[inline(always)]
    pub(crate) fn is_l2(self) -> bool {
        self == PrefetchLevel::L2
    }
}

/// Asks the CPU to bring the cache lines of `[p, p + len)` into L1. Never faults, whatever `p`.
#[inline(always)]
pub fn prefetch_span(p: *const u8, len: usize) {
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

/// What to prefetch of each row for one dim block: `lines` cache lines from the block's first
/// byte (a constant of each kernel instance, so the loop unrolls), then up to two more lines
/// where rows are not line-aligned or end in the scale/bias trailer of quantized formats, and
/// the trailer itself when a later block holds it.
///
/// A prefetch loop whose trip count depends on the row's address (the first version) cost 27%
/// of the gather rate on RM1 with the production trace (AMD EPYC, AVX-512), where the unrolled
/// lines cost nothing; the module's tests check that every line of every row is covered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowPrefetch {
    off: usize,
    /// Offsets of up to two more lines to prefetch (`n_extra` of them).
    extra: [usize; 2],
    n_extra: u8,
    /// Offsets of the trailer's first and last byte, when it lies past this block.
    trailer: Option<(usize, usize)>,
}

impl RowPrefetch {
    /// Rows of `stride` bytes starting at `base`, ending in `trailer` bytes of scale/bias; the
    /// block reads `len` bytes from `off`, and the kernel prefetches `lines` lines per row with
    /// [`RowPrefetch::row`], where `64 * lines >= len`.
    pub(crate) fn new(
        base: *const u8,
        stride: usize,
        trailer: usize,
        off: usize,
        len: usize,
        lines: usize,
    ) -> Self {
        assert!(64 * lines >= len, "{lines} lines cannot cover {len} bytes");
        let aligned = (base as usize).is_multiple_of(64)
            && stride.is_multiple_of(64)
            && off.is_multiple_of(64);
        // The last block's region runs on to the trailer; an earlier block's leaves it apart.
        let codes_end = stride - trailer;
        let (end, far_trailer) = if trailer == 0 {
            (off + len, None)
        } else if off + len >= codes_end {
            (stride, None)
        } else {
            (off + len, Some((codes_end, stride - 1)))
        };
        let mut extra = [0; 2];
        let mut n_extra = 0;
        // Lines past the unrolled ones that the region reaches, then its last byte (whose line
        // the others miss when the row does not start a line).
        let mut o = off + 64 * lines;
        while o < end {
            extra[n_extra] = o;
            n_extra += 1;
            o += 64;
        }
        if !aligned && end > off && (n_extra == 0 || extra[n_extra - 1] != end - 1) {
            extra[n_extra] = end - 1;
            n_extra += 1;
        }
        RowPrefetch {
            off,
            extra,
            n_extra: n_extra as u8,
            trailer: far_trailer,
        }
    }

    /// Prefetches the block of the row starting at `row`, into L2 when `L2`, else L1. `lines`
    /// must be the `lines` given to [`RowPrefetch::new`], and a constant of the caller, so that
    /// the loop unrolls.
    #[inline(always)]
    pub(crate) fn row<const L2: bool>(&self, row: *const u8, lines: usize) {
        let p = row.wrapping_add(self.off);
        for i in 0..lines {
            prefetch_line_to::<L2>(p.wrapping_add(64 * i));
        }
        if self.n_extra == 0 && self.trailer.is_none() {
            return;
        }
        if self.n_extra > 0 {
            prefetch_line_to::<L2>(row.wrapping_add(self.extra[0]));
            if self.n_extra > 1 {
                prefetch_line_to::<L2>(row.wrapping_add(self.extra[1]));
            }
        }
        if let Some((a, b)) = self.trailer {
            prefetch_line_to::<L2>(row.wrapping_add(a));
            prefetch_line_to::<L2>(row.wrapping_add(b));
        }
    }

    /// Whether [`RowPrefetch::row`] prefetches only the `lines` unrolled lines (no extra line, no
    /// trailer): kernels then run a loop of their own that calls [`RowPrefetch::lines`], so that
    /// no row pays the test.
    #[inline(always)]
    pub(crate) fn plain(&self) -> bool {
        self.n_extra == 0 && self.trailer.is_none()
    }

    /// [`RowPrefetch::row`] where [`RowPrefetch::plain`] holds: the `lines` lines only.
    #[inline(always)]
    pub(crate) fn lines<const L2: bool>(&self, row: *const u8, lines: usize) {
        let p = row.wrapping_add(self.off);
        for i in 0..lines {
            prefetch_line_to::<L2>(p.wrapping_add(64 * i));
        }
    }

    /// Every offset, relative to a row, that [`RowPrefetch::row`] prefetches (for tests).
    #[cfg(test)]
    fn offsets(&self, lines: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..lines).map(|i| self.off + 64 * i).collect();
        v.extend_from_slice(&self.extra[..self.n_extra as usize]);
        if let Some((a, b)) = self.trailer {
            v.extend([a, b]);
        }
        v
    }
}

/// Asks the CPU to bring the cache line holding `p` into L2 (`prefetcht1`) when `L2`, else into
/// L1 (`prefetcht0`). Never faults, whatever `p`.
#[inline(always)]
pub(crate) fn prefetch_line_to<const L2: bool>(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        // SAFETY: prefetch is a hint; it does not fault on any address (Intel SDM, PREFETCHh).
        unsafe {
            if L2 {
                _mm_prefetch::<_MM_HINT_T1>(p.cast())
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p.cast())
            }
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cache line that a block of any row touches (and the trailer's) is prefetched, for
    /// row strides, offsets and table bases aligned and not.
    #[test]
    fn every_line_a_block_reads_is_prefetched() {
        for stride in [4usize, 36, 64, 72, 100, 136, 160, 256, 264, 520] {
            for trailer in [0usize, 4, 8] {
                if trailer >= stride {
                    continue;
                }
                let codes = stride - trailer;
                for base in [0usize, 4, 60, 64] {
                    for off in (0..codes).step_by(13).chain([0]) {
                        for len in [1usize, 17, 64, 96, 128, 200, 256] {
                            if off + len > codes {
                                continue;
                            }
                            let lines = len.div_ceil(64);
                            let pf = RowPrefetch::new(
                                base as *const u8,
                                stride,
                                trailer,
                                off,
                                len,
                                lines,
                            );
                            // The kernels take `lines` (whole lines only) where `plain`
                            // holds, `row` elsewhere: check what they take.
                            let got = match pf.plain() {
                                true => (0..lines).map(|i| off + 64 * i).collect(),
                                false => pf.offsets(lines),
                            };
                            for r in 0..5 {
                                let row = base + r * stride;
                                let have: std::collections::HashSet<usize> =
                                    got.iter().map(|o| (row + o) / 64).collect();
                                let mut need: Vec<usize> = (off..off + len).collect();
                                need.extend(codes..stride);
                                for b in need {
                                    assert!(
                                        have.contains(&((row + b) / 64)),
                                        "stride {stride} trailer {trailer} base {base} off {off} \
                                         len {len} row {r}: byte {b} not prefetched ({got:?})"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
