//! [`MappedRows`]: a row file read through a plain read-only mapping, as an `mmap`-placed table
//! is read in place by the kernels; the OS pages rows in on first touch, unchecked (the header
//! and checksum table were checked at open). The SSD tier's `MapStore` (`ember-tier`) copies rows
//! out of such mappings, checking each block first.
//!
//! A mapped file must not be truncated or rewritten in place while mapped (another process doing
//! so would raise SIGBUS on access): row files are written to a temporary name and renamed into
//! place, never modified in place (`docs/ssd-tier.md`).

use super::{BLOCK, RowFile};
use crate::error::{EmbedError, Result};
use std::sync::Arc;

/// A read-only mapping of a row file, and the range of its rows that a table reads.
#[derive(Debug, Clone)]
pub struct MappedRows {
    map: Arc<memmap2::Mmap>,
    file: Arc<RowFile>,
    /// The bytes of the rows this view covers, as an offset into the mapping and a length.
    offset: usize,
    len: usize,
}

impl MappedRows {
    /// Maps `file` (every row).
    pub fn map(file: Arc<RowFile>) -> Result<Self> {
        // SAFETY: a read-only shared mapping of the descriptor whose length and header were
        // checked when `file` was opened. Row files are written to a temporary name and renamed
        // into place, never modified in place; another process truncating the file while it is
        // mapped would raise SIGBUS on access (see the module documentation).
        let map = unsafe { memmap2::Mmap::map(file.file()) }.map_err(|e| EmbedError::Io {
            path: file.path().display().to_string(),
            op: "mmap",
            cause: e.into(),
        })?;
        let offset = file.header().data_offset as usize;
        let len = file.rows() * file.row_bytes();
        let blocks_end = file.header().file_bytes() as usize;
        if map.len() < blocks_end {
            return Err(EmbedError::RowFile {
                path: file.path().display().to_string(),
                reason: format!("mapped {} bytes, the data ends at {blocks_end}", map.len()),
            });
        }
        Ok(MappedRows {
            map: Arc::new(map),
            file,
            offset,
            len,
        })
    }

    /// The rows' bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// The row file mapped.
    pub fn file(&self) -> &Arc<RowFile> {
        &self.file
    }

    /// Bytes `start .. start + len` of this view's rows, as a view of their own (no copy).
    pub(crate) fn sub(&self, start: usize, len: usize) -> MappedRows {
        debug_assert!(start + len <= self.len);
        MappedRows {
            map: self.map.clone(),
            file: self.file.clone(),
            offset: self.offset + start,
            len,
        }
    }

    /// Data blocks `first .. first + n` of the file (inside the mapping: checked at `map`).
    pub fn blocks(&self, first: u64, n: u64) -> &[u8] {
        let start = self.file.block_offset(first) as usize;
        &self.map[start..start + n as usize * BLOCK]
    }

    /// Row `r` of the file (where the file's layout put it).
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.file.row_bytes();
        let start = (self.file.header().data_offset + self.file.row_offset(r)) as usize;
        &self.map[start..start + rb]
    }
}
