//! Element types of embedding rows and their byte layouts.
//!
//! | dtype | row layout (D = dim)                                             | bytes per row |
//! |-------|-----------------------------------------------------------------|---------------|
//! | f32   | D little-endian f32                                              | 4 D           |
//! | f16   | D IEEE half                                                      | 2 D           |
//! | bf16  | D bfloat16                                                       | 2 D           |
//! | int8  | D uint8 codes, then f32 scale, f32 bias (FBGEMM "8-bit rowwise") | D + 8         |
//! | int4  | ceil(D/2) bytes, two codes per byte (low nibble first), then f16 scale, f16 bias (FBGEMM "4-bit rowwise") | ceil(D/2) + 4 |
//!
//! A quantized element decodes as `code * scale + bias`. Rows are packed back to back with no
//! padding, exactly as FBGEMM's `embedding_bag_byte_prepack` / `embedding_bag_4bit_prepack` store
//! them, so that tables can later be mapped straight from files.

use crate::error::{EmbedError, Result};
use half::{bf16, f16};
use std::fmt;
use std::str::FromStr;

/// Element type of an embedding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Int8,
    Int4,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 5] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Int8,
        DType::Int4,
    ];

    /// Bytes one row of `dim` elements occupies.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            DType::F32 => 4 * dim,
            DType::F16 | DType::BF16 => 2 * dim,
            DType::Int8 => dim + 8,
            DType::Int4 => dim.div_ceil(2) + 4,
        }
    }

    /// The stable number of the dtype in binary formats (row-file headers) and kernel
    /// configurations (`DT` of the CUDA kernels): f32 0, f16 1, bf16 2, int8 3, int4 4.
    pub fn code(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::Int8 => 3,
            DType::Int4 => 4,
        }
    }

    /// The dtype numbered `code` by [`DType::code`].
    pub fn from_code(code: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// The name used on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Int8 => "int8",
            DType::Int4 => "int4",
        }
    }

    /// Whether rows carry a scale and bias after the codes.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::Int8 | DType::Int4)
    }

    /// Encodes one f32 row into `dst` (`dst.len() == self.row_bytes(src.len())`), quantizing
    /// where the dtype asks for it.
    pub fn encode_row(self, src: &[f32], dst: &mut [u8]) {
        debug_assert_eq!(dst.len(), self.row_bytes(src.len()));
        match self {
            DType::F32 => {
                for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                    d.copy_from_slice(&s.to_le_bytes());
                }
            }
            DType::F16 => {
                for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&f16::from_f32(*s).to_le_bytes());
                }
            }
            DType::BF16 => {
                for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&bf16::from_f32(*s).to_le_bytes());
                }
            }
            DType::Int8 => crate::quant::quantize_int8_row(src, dst),
            DType::Int4 => crate::quant::quantize_int4_row(src, dst),
        }
    }

    /// Decodes one row of `dst.len()` elements from `src` (the plain, obviously correct way).
    pub fn decode_row(self, src: &[u8], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), self.row_bytes(dst.len()));
        match self {
            DType::F32 => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
            }
            DType::F16 => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
                }
            }
            DType::BF16 => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
                }
            }
            DType::Int8 => crate::quant::dequantize_int8_row(src, dst),
            DType::Int4 => crate::quant::dequantize_int4_row(src, dst),
        }
    }
}

/// Serialized as its name (`"f32"`, `"int8"`, ...), as config files and plans write it.
impl serde::Serialize for DType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for DType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(DType::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "int8" | "i8" | "uint8" => Ok(DType::Int8),
            "int4" | "i4" | "uint4" => Ok(DType::Int4),
            _ => Err(EmbedError::UnknownDType(s.to_string())),
        }
    }
}
