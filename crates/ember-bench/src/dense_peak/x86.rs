//! The dense ceiling's loops, in `asm!` (AMX intrinsics are unstable). Each chunk is one block:
//! set up the sources and zero the accumulators, run the loop, and (AMX) release the tiles, so
//! nothing is assumed about register or tile state between blocks.

use super::PeakKind;
use std::arch::asm;

/// Loop iterations per AMX chunk (4 tile instructions each: ~64 cycles at one per 16).
const AMX_ITERS: u64 = 2048;
/// Loop iterations per AVX-512 chunk (one instruction per accumulator each).
const AVX_ITERS: u64 = 4096;
/// `imul` chain iterations per clock chunk.
pub(super) const CLOCK_ITERS: u64 = 1024;
/// Cycles one `imul` chain iteration takes: 8 dependent `imul r64, r64` of 3 cycles.
pub(super) const CLOCK_CYCLES_PER_ITER: u64 = 8 * 3;

pub(super) fn instructions_per_chunk(kind: PeakKind) -> u64 {
    match kind {
        PeakKind::AmxBf16 | PeakKind::AmxInt8 => 4 * AMX_ITERS,
        PeakKind::Avx512Bf16 => AVX_ACC_BF16 * AVX_ITERS,
        PeakKind::Avx512Vnni | PeakKind::Fma32 | PeakKind::Fma32Avx2 => AVX_ACC * AVX_ITERS,
    }
}

/// Runs one chunk of `kind`'s loop.
///
/// # Safety
///
/// The CPU runs `kind`'s instructions: AVX-512F (and AVX512_BF16 / AVX512_VNNI) for the
/// AVX-512 kinds; AMX-TILE/BF16/INT8 with Linux's tile permission granted for AMX.
pub(super) unsafe fn chunk(kind: PeakKind) {
    // SAFETY: the caller guarantees the features each arm's loop needs.
    unsafe {
        match kind {
            PeakKind::AmxBf16 => amx_bf16(AMX_ITERS),
            PeakKind::AmxInt8 => amx_int8(AMX_ITERS),
            // bf16 1.0 in both halves of each dword: finite sums, no denormals.
            PeakKind::Avx512Bf16 => vdpbf16ps(AVX_ITERS, 0x3f80_3f80, 0x3f80_3f80),
            // Mixed bytes (u8 x i8): i32 sums wrap harmlessly.
            PeakKind::Avx512Vnni => vpdpbusd(AVX_ITERS, 0x5a3c_7f11, 0x1b2d_4e63),
            // 1e-3 (f32) times 1e-3: sums grow slowly, stay normal and finite.
            PeakKind::Fma32 => vfmadd231ps(AVX_ITERS, 0x3a83_126f, 0x3a83_126f),
            // As `Fma32`, on ymm.
            PeakKind::Fma32Avx2 => vfmadd231ps_ymm(AVX_ITERS, 0x3a83_126f, 0x3a83_126f),
        }
    }
}

/// The tile configuration: palette 1, tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const TILE_CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1; // palette 1
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // colsb[t] = 64 bytes (little-endian u16)
        c[48 + t] = 16; // rows[t] = 16
        t += 1;
    }
    TileConfig(c)
};

/// A source tile's 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileData([u8; 1024]);

/// bf16 0.0078125 (0x3c00) in every element: small, normal (for `tdpbf16ps`).
static BF16_TILE: TileData = {
    let mut d = [0u8; 1024];
    let mut i = 0;
    while i < 1024 {
        d[i + 1] = 0x3c;
        i += 2;
    }
    TileData(d)
};
/// int8 1 in every byte (for `tdpbssd`).
static INT8_TILE: TileData = TileData([1u8; 1024]);

/// `$op` on tiles: C = tmm0-3 (zeroed), A = tmm4-5, B = tmm6-7 (loaded from `$data`),
/// four independent `$op` per iteration (2 x 2 blocking, as a GEMM kernel does).
macro_rules! amx_loop {
    ($name:ident, $op:literal, $data:ident) => {
        /// # Safety
        ///
        /// AMX (TILE and this instruction's family) is present and Linux granted this
        /// process the tile permission.
        unsafe fn $name(iters: u64) {
            // SAFETY: AMX is usable (the caller's contract); the config and the source
            // tile are 64-byte aligned statics of 64 and 1024 bytes, read with a 64-byte
            // row stride (16 rows = 1024 bytes); the block writes no memory and ends with
            // `tilerelease`, leaving no tile state behind.
            unsafe {
                asm!(
                    "ldtilecfg [{cfg}]",
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "tileloadd tmm4, [{src} + {stride} * 1]",
                    "tileloadd tmm5, [{src} + {stride} * 1]",
                    "tileloadd tmm6, [{src} + {stride} * 1]",
                    "tileloadd tmm7, [{src} + {stride} * 1]",
                    "2:",
                    concat!($op, " tmm0, tmm4, tmm6"),
                    concat!($op, " tmm1, tmm4, tmm7"),
                    concat!($op, " tmm2, tmm5, tmm6"),
                    concat!($op, " tmm3, tmm5, tmm7"),
                    "dec {n}",
                    "jnz 2b",
                    "tilerelease",
                    cfg = in(reg) TILE_CONFIG.0.as_ptr(),
                    src = in(reg) $data.0.as_ptr(),
                    stride = in(reg) 64usize,
                    n = inout(reg) iters => _,
                    options(nostack, readonly),
                );
            }
        }
    };
}

amx_loop!(amx_bf16, "tdpbf16ps", BF16_TILE);
amx_loop!(amx_int8, "tdpbssd", INT8_TILE);

/// `$op zmm_acc, zmm14, zmm15` on the independent accumulators `$acc` (zmm registers
/// among 0-13, an assembler `.irp` list; zeroed first), zmm14 / zmm15 broadcast from `a` and
/// `b`. Only zmm0-15, and `vzeroupper` at the end: no upper register state is left dirty
/// (dirty zmm16-31 would keep the core in AVX-512 mode after the measurement).
macro_rules! avx_loop {
    ($name:ident, $op:literal, $acc:literal) => {
        /// # Safety
        ///
        /// AVX-512F and this instruction's extension are present.
        #[target_feature(enable = "avx512f")]
        unsafe fn $name(iters: u64, a: u32, b: u32) {
            // SAFETY: the caller guarantees the instructions; the block touches only the
            // registers it names (zmm0-15 declared clobbered) and no memory.
            unsafe {
                asm!(
                    "vpbroadcastd zmm14, {a:e}",
                    "vpbroadcastd zmm15, {b:e}",
                    concat!(".irp r,", $acc),
                    "vpxord zmm\\r, zmm\\r, zmm\\r",
                    ".endr",
                    "2:",
                    concat!(".irp r,", $acc),
                    concat!($op, " zmm\\r, zmm14, zmm15"),
                    ".endr",
                    "dec {n}",
                    "jnz 2b",
                    "vzeroupper",
                    a = in(reg) a,
                    b = in(reg) b,
                    n = inout(reg) iters => _,
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                    out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                    out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                    out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                    options(nostack, nomem),
                );
            }
        }
    };
}

// Accumulators: the fastest count of 4-14 on Sapphire / Emerald Rapids. `vpdpbusd` (latency
// 5, two per cycle) needs ten or more; `vfmadd231ps` (4, two per cycle) eight; `vdpbf16ps`
// (one per two cycles) runs best with ten.
const AVX_ACC_BF16: u64 = 10;
const AVX_ACC: u64 = 14;
avx_loop!(vdpbf16ps, "vdpbf16ps", "0,1,2,3,4,5,6,7,8,9");
avx_loop!(vpdpbusd, "vpdpbusd", "0,1,2,3,4,5,6,7,8,9,10,11,12,13");
avx_loop!(
    vfmadd231ps,
    "vfmadd231ps",
    "0,1,2,3,4,5,6,7,8,9,10,11,12,13"
);

/// `vfmadd231ps ymm_acc, ymm14, ymm15` on the 14 independent accumulators ymm0-13 (zeroed
/// first), ymm14 / ymm15 broadcast from `a` and `b`; `vzeroupper` at the end. Zen 3 runs two
/// FMAs a cycle of latency 4: eight or more accumulators keep both pipes busy.
///
/// # Safety
///
/// AVX2 and FMA are present.
#[target_feature(enable = "avx2,fma")]
unsafe fn vfmadd231ps_ymm(iters: u64, a: u32, b: u32) {
    // SAFETY: the caller guarantees the instructions; the block touches only the registers it
    // names (ymm0-15 declared clobbered) and no memory.
    unsafe {
        asm!(
            "vmovd xmm14, {a:e}",
            "vbroadcastss ymm14, xmm14",
            "vmovd xmm15, {b:e}",
            "vbroadcastss ymm15, xmm15",
            ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13",
            "vxorps ymm\\r, ymm\\r, ymm\\r",
            ".endr",
            "2:",
            ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13",
            "vfmadd231ps ymm\\r, ymm14, ymm15",
            ".endr",
            "dec {n}",
            "jnz 2b",
            "vzeroupper",
            a = in(reg) a,
            b = in(reg) b,
            n = inout(reg) iters => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
            out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
            options(nostack, nomem),
        );
    }
}

/// `iters` x 8 dependent `imul r64, r64` (3 cycles each on every Intel and AMD core since
/// 2008), for the clock estimate.
pub(super) fn imul_chain(iters: u64) {
    // SAFETY: baseline x86-64 instructions on two named registers; no memory.
    unsafe {
        asm!(
            "2:",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "imul {x}, {x}",
            "dec {n}",
            "jnz 2b",
            x = inout(reg) 1u64 => _,
            n = inout(reg) iters => _,
            options(nostack, nomem),
        );
    }
}
