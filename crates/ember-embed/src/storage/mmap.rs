//! Row files read through a plain read-only mapping.
//!
//! - [`MappedRows`]: the mapping an `mmap`-placed table is read through in place by the
//!   kernels; the OS pages rows in on first touch, unchecked (the header and checksum table were
//!   checked at open).
//! - [`MapStore`]: a [`RowStore`] over such mappings for the SSD tier (`io: mmap`): rows are
//!   copied out of the page cache, each block checked against its checksum first, with Ember's
//!   row cache, dedup and prefetch above it as for any store.
//!
//! A mapped file must not be truncated or rewritten in place while mapped (another process doing
//! so would raise SIGBUS on access): row files are written to a temporary name and renamed into
//! place, never modified in place (`docs/ssd-tier.md`).

use super::rowfile::{BLOCK, RowFile};
use super::{ReadStats, RowRequest, RowStore};
use crate::error::{EmbedError, Result};
use std::sync::Arc;
use std::time::Instant;

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
    fn blocks(&self, first: u64, n: u64) -> &[u8] {
        let start = self.file.block_offset(first) as usize;
        &self.map[start..start + n as usize * BLOCK]
    }

    /// Row `r` of the file (where the file's layout put it).
    fn row(&self, r: usize) -> &[u8] {
        let rb = self.file.row_bytes();
        let start = (self.file.header().data_offset + self.file.row_offset(r)) as usize;
        &self.map[start..start + rb]
    }
}

/// Row files read through mappings; see the module documentation.
#[derive(Debug)]
pub struct MapStore {
    maps: Vec<MappedRows>,
}

impl MapStore {
    /// Maps every file.
    pub fn open(files: Vec<Arc<RowFile>>) -> Result<Self> {
        Ok(MapStore {
            maps: files
                .into_iter()
                .map(MappedRows::map)
                .collect::<Result<_>>()?,
        })
    }
}

impl RowStore for MapStore {
    fn engine(&self) -> &'static str {
        "mmap"
    }

    fn direct(&self) -> bool {
        false
    }

    fn row_bytes(&self, table: usize) -> usize {
        self.maps[table].file.row_bytes()
    }

    fn read(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<ReadStats> {
        let t = Instant::now();
        let maps = &self.maps;
        reqs.sort_unstable_by_key(|r| (r.table, maps[r.table].file.position(r.row)));
        // Every block is checked once before any row lands (all or nothing, as the contract
        // asks); neighbouring rows share blocks, so the last checked range is remembered.
        let (mut checked, mut blocks): (Option<(usize, u64, u64)>, u64) = (None, 0);
        for r in reqs.iter() {
            let m = &maps[r.table];
            let (first, n) = m.file.row_blocks(r.row);
            if let Some((t, f0, end)) = checked
                && t == r.table
                && first >= f0
                && first + n <= end
            {
                continue;
            }
            m.file.verify(first, m.blocks(first, n))?;
            blocks += n;
            checked = Some((r.table, first, first + n));
        }
        for r in reqs.iter() {
            land(r, maps[r.table].row(r.row));
        }
        // The OS does not say which blocks came from the device and which from its page
        // cache: every block touched counts as a read.
        Ok(ReadStats {
            reads: blocks,
            bytes: blocks * BLOCK as u64,
            wait: t.elapsed(),
        })
    }
}
