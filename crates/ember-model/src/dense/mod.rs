//! Dense layers in reduced precision: `y = epilogue(x W^T)` with `x` in bf16 or int8, for the
//! MLPs and the DCNv2 cross net.
//!
//! The spec, then the reference, then the variants, as the embedding kernels are laid out:
//! - **bf16**: inputs and weights rounded to bfloat16 (round to nearest even), products summed in
//!   f32. [`reference::linear_bf16`] is the definition in f64.
//! - **int8**: weights quantized symmetrically per output channel (`sw[n] = max |W[n, :]| / 127`),
//!   activations per row at run time (`sx[m] = max |x[m, :]| / 127`), products summed exactly in
//!   i32, then `y = acc * sx[m] * sw[n]`. [`reference::linear_int8`] is the definition.
//! - Then the epilogue, fused into the kernel so that a layer's output is written once: bias,
//!   ReLU, the cross net's `x0 * v + xl`, and the conversion to the next layer's input
//!   ([`Epilogue`]).
//!
//! Variants ([`DenseIsa`], chosen once per process in [`cpu`]): AMX tiles ([`amx`]), AVX-512
//! BF16 / VNNI ([`avx512`]) and a portable emulation ([`emulated`]) that computes the same
//! products. Weights are converted and packed once, at load ([`pack`]), in the layout of AMX's B
//! tiles, which is also one zmm register per (pair or quad of inputs, 16 outputs) for AVX-512.
//! [`driver`] splits a layer into blocks over threads and runs the epilogue.

pub mod acts;
#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod cpu;
pub mod driver;
pub mod emulated;
pub mod pack;
pub mod reference;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

pub use cpu::DenseIsa;

/// The precision of a model's dense layers (MLPs and cross net); tables have their own dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseDType {
    /// f32 throughout: PyTorch's numbers to rounding.
    #[default]
    F32 = 0,
    /// bfloat16 inputs and weights, f32 sums.
    Bf16 = 1,
    /// int8 weights (per output channel) and activations (per row, at run time), i32 sums.
    Int8 = 2,
}

impl DenseDType {
    pub const ALL: [DenseDType; 3] = [DenseDType::F32, DenseDType::Bf16, DenseDType::Int8];

    pub fn name(self) -> &'static str {
        match self {
            DenseDType::F32 => "f32",
            DenseDType::Bf16 => "bf16",
            DenseDType::Int8 => "int8",
        }
    }

    /// Whether the value is the default (config files leave it out).
    pub fn is_f32(&self) -> bool {
        *self == DenseDType::F32
    }
}

impl fmt::Display for DenseDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DenseDType {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(DenseDType::F32),
            "bf16" | "bfloat16" => Ok(DenseDType::Bf16),
            "int8" | "i8" => Ok(DenseDType::Int8),
            _ => Err(ModelError::BadOption {
                option: "dense_dtype",
                reason: format!("'{s}' is not one of f32, bf16, int8"),
            }),
        }
    }
}

/// Rows per tile, and outputs per tile: kernels produce 16 x 16 blocks of sums.
pub const TILE: usize = 16;
/// Inputs per tile step: 32 bf16 or 64 int8 values are one 64-byte tile row.
pub const fn k_step(dtype: DenseDType) -> usize {
    match dtype {
        DenseDType::Int8 => 64,
        _ => 32,
    }
}

/// The mask of the first `n` of 16 lanes (all 16 for `n >= 16`): a row's last, partial
/// register in the AVX-512 loops.
#[inline(always)]
pub(crate) fn lanes(n: usize) -> u16 {
    if n >= 16 { 0xffff } else { (1u16 << n) - 1 }
}

/// `f32 -> bf16` bits, round to nearest even (NaN kept a quiet NaN), as PyTorch's and the
/// hardware's `vcvtneps2bf16`.
#[inline]
pub fn to_bf16(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// `bf16` bits -> f32 (exact).
#[inline]
pub fn from_bf16(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The raw sums of one block of a kernel: `mt x nt` tiles of 16 x 16 (row-major within a
/// tile), tile `(i, j)` at `[i * 2 + j]`. f32 for bf16, i32 for int8 (read through
/// `f32::to_bits` / `from_bits` by the int8 epilogue).
pub type Tiles = [[f32; TILE * TILE]; 4];

/// Where a bf16 kernel reads its inputs: rows of `lda` values (bf16 bits), inputs `k .. kp` of
/// each row zero, and at least `16 * mt` readable rows from any block's first row (buffers are
/// padded to a multiple of 32 rows; the padding rows' sums are computed and dropped).
#[derive(Debug, Clone, Copy)]
pub struct ActsBf16 {
    pub ptr: *const u16,
    pub lda: usize,
}

/// Where an int8 kernel reads its inputs, as [`ActsBf16`]: `i8` values, or `u8` (the value
/// plus 128) for the VNNI kernel, whose instruction multiplies unsigned by signed bytes.
#[derive(Debug, Clone, Copy)]
pub struct ActsI8 {
    pub ptr: *const u8,
    pub lda: usize,
}

// SAFETY: the pointers are read only, by kernels that run while the buffer they point into is
// borrowed by the caller of the driver, which outlives every worker.
unsafe impl Send for ActsBf16 {}
// SAFETY: as above.
unsafe impl Sync for ActsBf16 {}
// SAFETY: as above.
unsafe impl Send for ActsI8 {}
// SAFETY: as above.
unsafe impl Sync for ActsI8 {}

/// Which sums a block kernel computes: rows `m0 .. m0 + 16 mt` of the activations against
/// output tiles `nb .. nb + nt` of the weights (`mt`, `nt` in 1..=2), into tiles `(i, j)` of
/// [`Tiles`] for `i < mt`, `j < nt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The first row.
    pub m0: usize,
    /// Row tiles of 16.
    pub mt: usize,
    /// The first output tile.
    pub nb: usize,
    /// Output tiles of 16.
    pub nt: usize,
}

impl Block {
    /// Panics unless the block fits a kernel (`mt`, `nt` in 1..=2) and a layer of `blocks`
    /// output tiles: the parts of a kernel's contract that do not depend on the activations.
    #[inline]
    pub fn check(self, blocks: usize) {
        let Block { mt, nt, nb, .. } = self;
        assert!(
            (1..=2).contains(&mt) && (1..=2).contains(&nt) && nb + nt <= blocks,
            "block of {mt} x {nt} tiles at output block {nb} of {blocks}"
        );
    }
}

/// A bf16 block kernel: the [`Block`] `at` of `a` against `w`, over all of `w`'s (padded)
/// inputs; writes the raw f32 sums to `out`.
///
/// # Safety
/// The CPU runs the kernel's family (and, for AMX, this thread's tile configuration is
/// [`amx::configure`]d); `a` has `16 mt` readable rows of `w.kp()` values from row `m0`.
pub type BlockBf16 = unsafe fn(a: ActsBf16, w: &pack::PackedBf16, at: Block, out: &mut Tiles);

/// An int8 block kernel, as [`BlockBf16`]: i32 sums, as bits in `out`.
///
/// # Safety
/// As [`BlockBf16`]; `a` holds `u8` values when the kernel is the VNNI one.
pub type BlockI8 = unsafe fn(a: ActsI8, w: &pack::PackedI8, at: Block, out: &mut Tiles);

#[cfg(test)]
mod tests;
