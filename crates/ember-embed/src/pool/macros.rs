//! Macros shared by the AVX2 and AVX-512 pooling kernels: one instance per register count and
//! weighting, and one prefetching loop.

/// Calls `$block::<F, I, N, W>(s, d0, w)` with `N` the accumulator registers `$regs` (1 to 8; more
/// take 8) and `W` whether the segment carries weights: each kernel instance unrolls for one
/// register count, and without weights adds rows instead of multiplying them by 1.
macro_rules! dispatch_block {
    ($block:ident::<$f:ty, $i:ty>($s:expr, $d0:expr, $w:expr), $regs:expr) => {
        match ($regs, $s.weights.is_some()) {
            (1, false) => $block::<$f, $i, 1, false>($s, $d0, $w),
            (2, false) => $block::<$f, $i, 2, false>($s, $d0, $w),
            (3, false) => $block::<$f, $i, 3, false>($s, $d0, $w),
            (4, false) => $block::<$f, $i, 4, false>($s, $d0, $w),
            (5, false) => $block::<$f, $i, 5, false>($s, $d0, $w),
            (6, false) => $block::<$f, $i, 6, false>($s, $d0, $w),
            (7, false) => $block::<$f, $i, 7, false>($s, $d0, $w),
            (_, false) => $block::<$f, $i, 8, false>($s, $d0, $w),
            (1, true) => $block::<$f, $i, 1, true>($s, $d0, $w),
            (2, true) => $block::<$f, $i, 2, true>($s, $d0, $w),
            (3, true) => $block::<$f, $i, 3, true>($s, $d0, $w),
            (4, true) => $block::<$f, $i, 4, true>($s, $d0, $w),
            (5, true) => $block::<$f, $i, 5, true>($s, $d0, $w),
            (6, true) => $block::<$f, $i, 6, true>($s, $d0, $w),
            (7, true) => $block::<$f, $i, 7, true>($s, $d0, $w),
            (_, true) => $block::<$f, $i, 8, true>($s, $d0, $w),
        }
    };
}

/// Runs `$add` for each `$j` in `$range`, after prefetching the row `$dist` ids ahead of it: only
/// the `$lines` whole lines where `$plain` (`RowPrefetch::plain`), the lines and any extra or
/// trailer line elsewhere, each in a loop of its own so that no row tests for extra lines. The
/// caller ends `$range` where `$j + $dist` stops being an index of `$ids`.
macro_rules! prefetch_ahead {
    ($pf:expr, $plain:expr, $lines:expr, ($ids:expr, $dist:expr, $base:expr, $stride:expr),
     $range:expr, |$j:ident| $add:expr) => {
        if $plain {
            for $j in $range {
                // SAFETY: $j + $dist < ids.len() (the caller's range ends there).
                let ahead = unsafe { $ids.get_unchecked($j + $dist) }.idx();
                $pf.lines($base.wrapping_add(ahead * $stride), $lines);
                $add;
            }
        } else {
            for $j in $range {
                // SAFETY: as above.
                let ahead = unsafe { $ids.get_unchecked($j + $dist) }.idx();
                $pf.row($base.wrapping_add(ahead * $stride), $lines);
                $add;
            }
        }
    };
}
