//! Macros shared by the AVX2 and AVX-512 pooling kernels: one instance per register count and
//! weighting, and one prefetching loop.

/// Calls `$block::<F, I, N, W, T>(s, d0, w)` with `N` the accumulator registers `$regs` (1 to 8;
/// more take 8), `W` whether the segment carries weights and `T` (`$tail`) whether the block's
/// last register is partial: each kernel instance unrolls for one register count, adds rows
/// instead of multiplying them by 1 without weights, and tests for a partial register nowhere
/// in its loop over rows (a per-row test of it was 2 of the loop's ~22 instructions per row).
macro_rules! dispatch_block {
    ($block:ident::<$f:ty, $i:ty>($s:expr, $d0:expr, $w:expr), $regs:expr, $tail:expr) => {
        match ($s.weights.is_some(), $tail) {
            (false, false) => dispatch_block!(@n $block::<$f, $i>($s, $d0, $w), $regs, false, false),
            (false, true) => dispatch_block!(@n $block::<$f, $i>($s, $d0, $w), $regs, false, true),
            (true, false) => dispatch_block!(@n $block::<$f, $i>($s, $d0, $w), $regs, true, false),
            (true, true) => dispatch_block!(@n $block::<$f, $i>($s, $d0, $w), $regs, true, true),
        }
    };
    (@n $block:ident::<$f:ty, $i:ty>($s:expr, $d0:expr, $w:expr), $regs:expr, $wt:literal, $t:literal) => {
        match $regs {
            1 => $block::<$f, $i, 1, $wt, $t>($s, $d0, $w),
            2 => $block::<$f, $i, 2, $wt, $t>($s, $d0, $w),
            3 => $block::<$f, $i, 3, $wt, $t>($s, $d0, $w),
            4 => $block::<$f, $i, 4, $wt, $t>($s, $d0, $w),
            5 => $block::<$f, $i, 5, $wt, $t>($s, $d0, $w),
            6 => $block::<$f, $i, 6, $wt, $t>($s, $d0, $w),
            7 => $block::<$f, $i, 7, $wt, $t>($s, $d0, $w),
            _ => $block::<$f, $i, 8, $wt, $t>($s, $d0, $w),
        }
    };
}

/// Runs `$add` for each `$j` in `$range`, after prefetching the row `$dist` ids ahead of it: only
/// the `$lines` whole lines where `$plain` (`RowPrefetch::plain`), the lines and any extra or
/// trailer line elsewhere, into L2 where `$l2` (`PrefetchLevel`), else L1; each case in a loop of
/// its own so that no row tests for either. The caller ends `$range` where `$j + $dist` stops
/// being an index of `$ids`.
macro_rules! prefetch_ahead {
    ($pf:expr, $plain:expr, $l2:expr, $lines:expr, ($ids:expr, $dist:expr, $base:expr, $stride:expr),
     $range:expr, |$j:ident| $add:expr) => {
        match ($plain, $l2) {
            (true, false) => prefetch_ahead!(@loop lines, false, $pf, $lines, ($ids, $dist, $base, $stride), $range, |$j| $add),
            (true, true) => prefetch_ahead!(@loop lines, true, $pf, $lines, ($ids, $dist, $base, $stride), $range, |$j| $add),
            (false, false) => prefetch_ahead!(@loop row, false, $pf, $lines, ($ids, $dist, $base, $stride), $range, |$j| $add),
            (false, true) => prefetch_ahead!(@loop row, true, $pf, $lines, ($ids, $dist, $base, $stride), $range, |$j| $add),
        }
    };
    (@loop $how:ident, $l2:literal, $pf:expr, $lines:expr, ($ids:expr, $dist:expr, $base:expr, $stride:expr),
     $range:expr, |$j:ident| $add:expr) => {
        for $j in $range {
            // SAFETY: $j + $dist < ids.len() (the caller's range ends there).
            let ahead = unsafe { $ids.get_unchecked($j + $dist) }.idx();
            $pf.$how::<$l2>($base.wrapping_add(ahead * $stride), $lines);
            $add;
        }
    };
}
