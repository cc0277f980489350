//! AMX tile kernels: `tdpbf16ps` (bf16 pairs, f32 sums) and `tdpbssd` (int8 quads, i32 sums),
//! through stable `asm!` (Rust's AMX intrinsics are unstable on the toolchain here).
//!
//! One tile configuration serves both: eight tiles of 16 rows x 64 bytes. Tiles 0-3 hold a
//! block's sums (2 x 2 tiles of 16 x 16), 4-5 two tiles of activations (rows `m0 .. m0 + 32`,
//! one tile step of inputs), 6-7 two tiles of packed weights (outputs `16 nb .. 16 nb + 32`).
//! Each step loads four tiles and issues four dot products: every loaded tile feeds two.
//!
//! The tile registers are per-thread state that the compiler never touches, so each instruction
//! is its own `asm!` statement; a thread must [`configure`] before its first block and should
//! [`release`] after its last (a released thread's context switches do not save 8 KiB of tiles).

use std::arch::asm;

use super::pack::{PackedBf16, PackedI8};
use super::{ActsBf16, ActsI8, Block, TILE, Tiles};

/// The 64-byte tile configuration: palette 1, tiles 0-7 of 16 rows x 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row (u16, little-endian)
        c[48 + t] = 16; // rows
        t += 1;
    }
    TileConfig(c)
};

/// Loads the tile configuration on this thread (and zeroes its tiles).
///
/// # Safety
/// The CPU has AMX-TILE and this process has the kernel's permission
/// ([`super::cpu::amx_permitted`]).
pub unsafe fn configure() {
    // SAFETY: the caller guarantees AMX is usable; CONFIG is a valid 64-byte, 64-aligned
    // palette-1 configuration.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) &CONFIG, options(nostack, readonly)) };
}

/// Releases this thread's tiles (back to the init state).
///
/// # Safety
/// As [`configure`].
pub unsafe fn release() {
    // SAFETY: the caller guarantees AMX is usable.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// `tileloadd tmm{T}, [p + stride]`: 16 rows of 64 bytes, `stride` bytes apart.
///
/// # Safety
/// The tiles are configured; 16 rows of 64 bytes at `p`, `stride` apart, are readable.
#[inline(always)]
unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    // SAFETY: per the contract.
    unsafe {
        asm!("tileloadd tmm{t}, [{p} + {s} * 1]", t = const T, p = in(reg) p, s = in(reg) stride,
             options(nostack, readonly))
    };
}

/// `tilestored [p + stride], tmm{T}`.
///
/// # Safety
/// The tiles are configured; 16 rows of 64 bytes at `p`, `stride` apart, are writable.
#[inline(always)]
unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
    // SAFETY: per the contract.
    unsafe {
        asm!("tilestored [{p} + {s} * 1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride,
             options(nostack))
    };
}

/// `tilezero tmm{T}`.
///
/// # Safety
/// The tiles are configured.
#[inline(always)]
unsafe fn zero<const T: u8>() {
    // SAFETY: per the contract.
    unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) };
}

/// `C += A . B` on tiles: `tdpbf16ps` when `BF16`, else `tdpbssd`.
///
/// # Safety
/// The tiles are configured.
#[inline(always)]
unsafe fn dot<const BF16: bool, const C: u8, const A: u8, const B: u8>() {
    // SAFETY: per the contract; tile-register only.
    unsafe {
        if BF16 {
            asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nostack, nomem));
        } else {
            asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nostack, nomem));
        }
    }
}

/// The shared loop: `steps` tile steps of `MT` activation tiles (`a`, rows `lda` bytes apart,
/// advancing 64 bytes a step) against `NT` weight tiles (`b0`, `b1`: sequential 1 KiB tiles),
/// `hook(step, steps)` after each step's dot products, then the sums stored to `out`.
///
/// # Safety
/// Tiles configured; `a` readable for `16 MT` rows of `64 steps` bytes at `lda`; `b0` (and
/// `b1` when `NT` = 2) readable for `steps` KiB.
#[inline(always)]
unsafe fn run<const BF16: bool, const MT: usize, const NT: usize>(
    a: *const u8,
    lda: usize,
    [b0, b1]: [*const u8; 2],
    steps: usize,
    out: &mut Tiles,
    hook: &mut dyn FnMut(usize, usize),
) {
    // SAFETY: per the contract; every pointer offset stays inside the ranges it names.
    unsafe {
        zero::<0>();
        if NT == 2 {
            zero::<1>();
        }
        if MT == 2 {
            zero::<2>();
            if NT == 2 {
                zero::<3>();
            }
        }
        let a1 = a.add(TILE * lda);
        for s in 0..steps {
            load::<4>(a.add(s * 64), lda);
            load::<6>(b0.add(s * 1024), 64);
            dot::<BF16, 0, 4, 6>();
            if NT == 2 {
                load::<7>(b1.add(s * 1024), 64);
                dot::<BF16, 1, 4, 7>();
            }
            if MT == 2 {
                load::<5>(a1.add(s * 64), lda);
                dot::<BF16, 2, 5, 6>();
                if NT == 2 {
                    dot::<BF16, 3, 5, 7>();
                }
            }
            // The vector units finish the previous block while the tile unit works.
            hook(s, steps);
        }
        store::<0>(out[0].as_mut_ptr().cast(), 64);
        if NT == 2 {
            store::<1>(out[1].as_mut_ptr().cast(), 64);
        }
        if MT == 2 {
            store::<2>(out[2].as_mut_ptr().cast(), 64);
            if NT == 2 {
                store::<3>(out[3].as_mut_ptr().cast(), 64);
            }
        }
    }
}

/// [`run`] for the block `at`: `a` at the block's first row (`lda` bytes a row), `b` the
/// weights of output blocks `nb`, `nb + 1` (the same one twice when `nt` is 1).
///
/// # Safety
/// As [`run`].
#[inline(always)]
unsafe fn run_block<const BF16: bool>(
    a: *const u8,
    lda: usize,
    at: Block,
    b: [*const u8; 2],
    steps: usize,
    out: &mut Tiles,
    hook: &mut dyn FnMut(usize, usize),
) {
    // SAFETY: the caller's contract.
    unsafe {
        match (at.mt, at.nt) {
            (2, 2) => run::<BF16, 2, 2>(a, lda, b, steps, out, hook),
            (2, _) => run::<BF16, 2, 1>(a, lda, b, steps, out, hook),
            (_, 2) => run::<BF16, 1, 2>(a, lda, b, steps, out, hook),
            _ => run::<BF16, 1, 1>(a, lda, b, steps, out, hook),
        }
    }
}

/// The bf16 block kernel ([`super::BlockBf16`]) on AMX tiles.
///
/// # Safety
/// See [`super::BlockBf16`]: this thread is [`configure`]d.
pub unsafe fn block_bf16(a: ActsBf16, w: &PackedBf16, at: Block, out: &mut Tiles) {
    // SAFETY: the caller's contract.
    unsafe { block_bf16_hooked(a, w, at, out, &mut |_, _| {}) }
}

/// [`block_bf16`], calling `hook(step, steps)` after each tile step's dot products: the caller
/// finishes the previous block's sums there, on the vector units, while the tile unit computes
/// (measured: finishing after the block instead cost as much time as the block's dot products
/// on DLRM-v2's 512-input layers; the first read of sums just stored from tiles stalls).
///
/// # Safety
/// As [`block_bf16`].
pub unsafe fn block_bf16_hooked(
    a: ActsBf16,
    w: &PackedBf16,
    at: Block,
    out: &mut Tiles,
    hook: &mut dyn FnMut(usize, usize),
) {
    let b0 = w.block(at.nb).as_ptr().cast::<u8>();
    let b1 = if at.nt == 2 {
        w.block(at.nb + 1).as_ptr().cast()
    } else {
        b0
    };
    // SAFETY: the caller's contract: 16 mt rows of kp bf16 values from row m0; the blocks
    // hold kp / 32 tiles each.
    unsafe {
        let ap = a.ptr.add(at.m0 * a.lda).cast::<u8>();
        run_block::<true>(ap, a.lda * 2, at, [b0, b1], w.kp() / 32, out, hook)
    }
}

/// The int8 block kernel ([`super::BlockI8`]) on AMX tiles: signed activations.
///
/// # Safety
/// See [`super::BlockI8`]: this thread is [`configure`]d; `a` holds `i8` codes.
pub unsafe fn block_i8(a: ActsI8, w: &PackedI8, at: Block, out: &mut Tiles) {
    // SAFETY: the caller's contract.
    unsafe { block_i8_hooked(a, w, at, out, &mut |_, _| {}) }
}

/// [`block_i8`] with a hook per tile step, as [`block_bf16_hooked`].
///
/// # Safety
/// As [`block_i8`].
pub unsafe fn block_i8_hooked(
    a: ActsI8,
    w: &PackedI8,
    at: Block,
    out: &mut Tiles,
    hook: &mut dyn FnMut(usize, usize),
) {
    let b0 = w.block(at.nb).as_ptr().cast::<u8>();
    let b1 = if at.nt == 2 {
        w.block(at.nb + 1).as_ptr().cast()
    } else {
        b0
    };
    // SAFETY: as in `block_bf16_hooked`, with kp int8 values a row and kp / 64 tiles a block.
    unsafe {
        let ap = a.ptr.add(at.m0 * a.lda);
        run_block::<false>(ap, a.lda, at, [b0, b1], w.kp() / 64, out, hook)
    }
}
