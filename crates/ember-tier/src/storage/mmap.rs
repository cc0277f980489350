//! Row files read through a plain read-only mapping.
//!
//! - [`MappedRows`] (`ember_embed::rowfile`): the mapping an `mmap`-placed table is read
//!   through in place by the kernels.
//! - [`MapStore`]: a [`RowStore`] over such mappings for the SSD tier (`io: mmap`): rows are
//!   copied out of the page cache, each block checked against its checksum first, with Ember's
//!   row cache, dedup and prefetch above it as for any store.
//!
//! A mapped file must not be truncated or rewritten in place while mapped (another process doing
//! so would raise SIGBUS on access): row files are written to a temporary name and renamed into
//! place, never modified in place (`docs/ssd-tier.md`).

use super::{ReadStats, RowRequest, RowStore};
use ember_embed::Result;
use ember_embed::rowfile::{BLOCK, MappedRows, RowFile};
use std::sync::Arc;
use std::time::Instant;

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
        self.maps[table].file().row_bytes()
    }

    fn read(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<ReadStats> {
        let t = Instant::now();
        let maps = &self.maps;
        reqs.sort_unstable_by_key(|r| (r.table, maps[r.table].file().position(r.row)));
        // Every block is checked once before any row lands (all or nothing, as the contract
        // asks); neighbouring rows share blocks, so the last checked range is remembered.
        let (mut checked, mut blocks): (Option<(usize, u64, u64)>, u64) = (None, 0);
        for r in reqs.iter() {
            let m = &maps[r.table];
            let (first, n) = m.file().row_blocks(r.row);
            if let Some((t, f0, end)) = checked
                && t == r.table
                && first >= f0
                && first + n <= end
            {
                continue;
            }
            m.file().verify(first, m.blocks(first, n))?;
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
