//! The row file: one embedding table on disk, laid out for direct I/O and guarded by a checksum per
//! block.
//!
//! ```text
//! offset        bytes                 what
//! 0             4096                  header (below)
//! sums_offset   4 x blocks, padded    CRC-32 of every data block, in order
//!               to 4096
//! layout_offset 4 x rows, padded      version 2 only: the position of every row in the data, u32
//!               to 4096               in id order (see [`layout`])
//! data_offset   blocks x 4096         the rows, packed back to back in the table's dtype layout
//!                                     (`row_bytes` each, as in memory), zero-padded to a block;
//!                                     in id order (version 1) or in the layout's order
//! ```
//!
//! Header (little-endian): magic `EMBROWS\0` (8), version u32, dtype code u32 (0 f32, 1 f16, 2 bf16,
//! 3 int8, 4 int4), rows u64, dim u64, row_bytes u64, block_bytes u64, sums_offset u64, data_offset
//! u64, data_bytes u64, sums_crc u32 (CRC-32 of the checksum table), name_len u32, the table's name
//! (UTF-8, at most 1024 bytes); in version 2, at byte 1104 layout_offset u64 and at 1112
//! layout_crc u32 (CRC-32 of the 4 x rows bytes of positions); zeros, and at byte 4092 the CRC-32
//! of bytes 0..4092. A file without a layout is written as version 1, which every build reads.
//!
//! The block (4096 bytes) is the unit of every read and of the checksums: the data region starts
//! block-aligned, so a read of the blocks covering a row is aligned in offset and length as
//! `O_DIRECT` requires, and every block read is checked before any row of it is used. Rows are not
//! padded: a row of a power-of-two size never crosses a block, any other may cost a two-block read
//! (padding rows to a power of two would cost up to 2x the disk instead).
//!
//! A file is written to `PATH.tmp`, synced, then renamed, so a crash never leaves a half-written
//! file under the final name; a truncated, extended or damaged file is refused at open (length,
//! header and checksum-table CRCs) or at read (block CRC).

mod aligned;
pub mod layout;
mod mapped;
mod read;
mod write;

pub use crate::error::{HeaderError, LayoutError};
pub use aligned::{AlignedBuf, read_full_at};
pub use layout::{LayoutSummary, RowLayout};
pub use mapped::MappedRows;
pub use read::RowFile;
pub use write::{RowFileWriter, write_row_file, write_row_file_laid_out};

use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use std::path::Path;

/// First 8 bytes of every row file.
pub const MAGIC: [u8; 8] = *b"EMBROWS\0";
/// The format version of a file whose rows are in id order (written by every build).
pub const VERSION: u32 = 1;
/// The format version of a file that carries a [`RowLayout`].
pub const VERSION_LAID_OUT: u32 = 2;
/// Where version 2 keeps its layout fields (past the longest name).
const LAYOUT_AT: usize = 80 + MAX_NAME;
/// Bytes of one block: the unit of reads, alignment and checksums.
pub const BLOCK: usize = 4096;
/// Bytes of the header.
pub(crate) const HEADER: usize = 4096;
/// Position of the header's own CRC.
const HEADER_CRC_AT: usize = HEADER - 4;
/// Longest table name stored.
const MAX_NAME: usize = 1024;

/// Largest dim a row file takes (a 64 MiB f32 row; keeps every size computation far from
/// overflow).
const MAX_DIM: usize = 1 << 24;

/// What the header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowFileHeader {
    pub name: String,
    pub dtype: DType,
    pub rows: u64,
    pub dim: u64,
    pub row_bytes: u64,
    pub block_bytes: u64,
    pub sums_offset: u64,
    pub data_offset: u64,
    pub data_bytes: u64,
    pub sums_crc: u32,
    /// Where the rows' positions start (0: no layout, the rows are in id order).
    pub layout_offset: u64,
    /// CRC-32 of the positions.
    pub layout_crc: u32,
}

impl RowFileHeader {
    /// Where everything lies in the file of a table of this shape (`laid_out`: with a section of
    /// row positions).
    pub(crate) fn for_shape(
        name: &str,
        rows: usize,
        dim: usize,
        dtype: DType,
        laid_out: bool,
    ) -> Result<Self> {
        let bad = |reason: String| EmbedError::BadTable {
            table: name.into(),
            reason,
        };
        if dim == 0 {
            return Err(bad("dim must be at least 1".into()));
        }
        if name.len() > MAX_NAME {
            return Err(bad(format!("name longer than {MAX_NAME} bytes")));
        }
        if dim > MAX_DIM {
            return Err(bad(format!("dim {dim} is over {MAX_DIM}")));
        }
        let row_bytes = dtype.row_bytes(dim) as u64;
        let overflow = || bad(format!("{rows} rows x {row_bytes} bytes overflows"));
        let bytes = (rows as u64).checked_mul(row_bytes).ok_or_else(overflow)?;
        let blocks = bytes.div_ceil(BLOCK as u64);
        let sums_offset = HEADER as u64;
        let sums_bytes = blocks
            .checked_mul(4)
            .ok_or_else(overflow)?
            .div_ceil(BLOCK as u64)
            * BLOCK as u64;
        if laid_out && rows > layout::MAX_LAYOUT_ROWS {
            return Err(bad(format!(
                "{rows} rows: a layout covers at most {}",
                layout::MAX_LAYOUT_ROWS
            )));
        }
        let layout_offset = if laid_out {
            sums_offset + sums_bytes
        } else {
            0
        };
        let layout_bytes = if laid_out {
            (rows as u64 * 4).div_ceil(BLOCK as u64) * BLOCK as u64
        } else {
            0
        };
        let data_offset = sums_offset + sums_bytes + layout_bytes;
        let data_bytes = blocks.checked_mul(BLOCK as u64).ok_or_else(overflow)?;
        data_offset.checked_add(data_bytes).ok_or_else(overflow)?;
        Ok(RowFileHeader {
            name: name.into(),
            dtype,
            rows: rows as u64,
            dim: dim as u64,
            row_bytes,
            block_bytes: BLOCK as u64,
            sums_offset,
            data_offset,
            data_bytes,
            sums_crc: 0,
            layout_offset,
            layout_crc: 0,
        })
    }

    /// Whether the file carries a layout (version 2).
    pub fn laid_out(&self) -> bool {
        self.layout_offset != 0
    }

    /// Data blocks.
    pub fn blocks(&self) -> u64 {
        self.data_bytes / self.block_bytes
    }

    /// Total file length.
    pub fn file_bytes(&self) -> u64 {
        self.data_offset + self.data_bytes
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HEADER];
        h[0..8].copy_from_slice(&MAGIC);
        let version = if self.laid_out() {
            VERSION_LAID_OUT
        } else {
            VERSION
        };
        h[8..12].copy_from_slice(&version.to_le_bytes());
        h[12..16].copy_from_slice(&self.dtype.code().to_le_bytes());
        let fields = [
            self.rows,
            self.dim,
            self.row_bytes,
            self.block_bytes,
            self.sums_offset,
            self.data_offset,
            self.data_bytes,
        ];
        for (i, v) in fields.iter().enumerate() {
            h[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        h[72..76].copy_from_slice(&self.sums_crc.to_le_bytes());
        h[76..80].copy_from_slice(&(self.name.len() as u32).to_le_bytes());
        h[80..80 + self.name.len()].copy_from_slice(self.name.as_bytes());
        if self.laid_out() {
            h[LAYOUT_AT..LAYOUT_AT + 8].copy_from_slice(&self.layout_offset.to_le_bytes());
            h[LAYOUT_AT + 8..LAYOUT_AT + 12].copy_from_slice(&self.layout_crc.to_le_bytes());
        }
        let crc = crc32fast::hash(&h[..HEADER_CRC_AT]);
        h[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    pub(crate) fn decode(h: &[u8]) -> std::result::Result<Self, HeaderError> {
        if h.len() < HEADER {
            return Err(HeaderError::Short {
                len: h.len(),
                header: HEADER,
            });
        }
        if h[0..8] != MAGIC {
            return Err(HeaderError::Magic);
        }
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or([0; 8]));
        let version = u32_at(8);
        if version != VERSION && version != VERSION_LAID_OUT {
            return Err(HeaderError::Version {
                found: version,
                reads: (VERSION, VERSION_LAID_OUT),
            });
        }
        let laid_out = version == VERSION_LAID_OUT;
        let stored = u32_at(HEADER_CRC_AT);
        let actual = crc32fast::hash(&h[..HEADER_CRC_AT]);
        if stored != actual {
            return Err(HeaderError::Checksum { stored, actual });
        }
        let dtype = DType::from_code(u32_at(12)).ok_or(HeaderError::DType { code: u32_at(12) })?;
        let name_len = u32_at(76) as usize;
        if name_len > MAX_NAME {
            return Err(HeaderError::NameLength {
                len: name_len,
                max: MAX_NAME,
            });
        }
        let name = std::str::from_utf8(&h[80..80 + name_len])
            .map_err(|_| HeaderError::NameNotUtf8)?
            .to_string();
        let got = RowFileHeader {
            name,
            dtype,
            rows: u64_at(16),
            dim: u64_at(24),
            row_bytes: u64_at(32),
            block_bytes: u64_at(40),
            sums_offset: u64_at(48),
            data_offset: u64_at(56),
            data_bytes: u64_at(64),
            sums_crc: u32_at(72),
            layout_offset: if laid_out { u64_at(LAYOUT_AT) } else { 0 },
            layout_crc: if laid_out { u32_at(LAYOUT_AT + 8) } else { 0 },
        };
        // The layout is a function of the shape: anything else is a damaged or foreign file.
        let too_large = |what| HeaderError::TooLarge { what };
        let rows = usize::try_from(got.rows).map_err(|_| too_large("row count"))?;
        let dim = usize::try_from(got.dim).map_err(|_| too_large("dim"))?;
        let want = Self::for_shape(&got.name, rows, dim, dtype, laid_out)
            .map_err(|e| HeaderError::Shape(Box::new(e)))?;
        let want = RowFileHeader {
            sums_crc: got.sums_crc,
            layout_crc: got.layout_crc,
            ..want
        };
        if want != got {
            return Err(HeaderError::Inconsistent {
                rows,
                dim,
                dtype: dtype.name(),
            });
        }
        Ok(got)
    }
}

pub(crate) fn io_err(path: &Path, op: &'static str, e: std::io::Error) -> EmbedError {
    EmbedError::Io {
        path: path.display().to_string(),
        op,
        cause: e.into(),
    }
}
