//! [`FileStore`]: rows of row files read through the I/O engine (io_uring or `pread`, direct I/O
//! where the filesystem allows it).
//!
//! A call plans its reads first: the requests are sorted by file and offset, each row's blocks
//! found, and blocks that touch or overlap merged into one read of at most [`MAX_READ`] bytes (so
//! neighbouring rows cost one request). The engine runs every read of the call at once, each read
//! is checked block by block against the file's checksums, and only then is any row landed.

use super::io::{IoEngine, IoMode, Read};
use super::{ReadStats, RowRequest, RowStore};
use ember_embed::rowfile::{BLOCK, RowFile};
use ember_embed::{EmbedError, Result};
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

/// Largest single read when merging adjacent blocks.
pub(crate) const MAX_READ: usize = 256 << 10;

/// Row files read through an [`IoEngine`]; see the module documentation.
#[derive(Debug)]
pub struct FileStore {
    files: Vec<Arc<RowFile>>,
    io: IoEngine,
    /// The planned reads of the current call, and the first block of each.
    reads: Vec<Read>,
    read_blocks: Vec<u64>,
    /// For each (sorted) request, where its row starts in the engine's buffer.
    at: Vec<usize>,
}

impl FileStore {
    /// A store over `files` with an engine of `mode` keeping up to `depth` reads in flight.
    pub fn new(files: Vec<Arc<RowFile>>, mode: IoMode, depth: usize) -> std::io::Result<Self> {
        Ok(FileStore {
            files,
            io: IoEngine::new(mode, depth)?,
            reads: Vec::new(),
            read_blocks: Vec::new(),
            at: Vec::new(),
        })
    }

    /// Plans the reads of `reqs` (sorted by file and offset): fills `reads`, `read_blocks` and
    /// `at`, and returns the bytes the reads will fill.
    fn plan(&mut self, reqs: &[RowRequest]) -> usize {
        let files = &self.files;
        let (reads, blocks, ats) = (&mut self.reads, &mut self.read_blocks, &mut self.at);
        reads.clear();
        blocks.clear();
        ats.clear();
        let mut buf_len = 0usize;
        // The read being grown: file, first block, blocks.
        let mut cur: Option<(usize, u64, u64)> = None;
        let mut flush = |cur: Option<(usize, u64, u64)>, buf_len: &mut usize| {
            if let Some((f, first, n)) = cur {
                let len = n as usize * BLOCK;
                reads.push(Read {
                    file: f,
                    offset: files[f].block_offset(first),
                    len,
                });
                blocks.push(first);
                *buf_len += len;
            }
        };
        for r in reqs {
            let file = &files[r.table];
            let (first, n) = file.row_blocks(r.row);
            let extend = match cur {
                Some((f, f0, k)) => {
                    f == r.table
                        && first <= f0 + k
                        && ((first + n).max(f0 + k) - f0) as usize * BLOCK <= MAX_READ
                }
                None => false,
            };
            if extend {
                if let Some((_, f0, k)) = cur.as_mut() {
                    *k = (first + n).max(*f0 + *k) - *f0;
                }
            } else {
                flush(cur, &mut buf_len);
                cur = Some((r.table, first, n));
            }
            // Offset of the row in the buffer: the current read starts at `buf_len`.
            let (_, f0, _) = cur.unwrap_or((0, first, n));
            ats.push(buf_len + (file.row_offset(r.row) - f0 * BLOCK as u64) as usize);
        }
        flush(cur, &mut buf_len);
        buf_len
    }
}

impl RowStore for FileStore {
    fn engine(&self) -> &'static str {
        self.io.kind().name()
    }

    fn direct(&self) -> bool {
        self.files.iter().all(|f| f.direct())
    }

    fn row_bytes(&self, table: usize) -> usize {
        self.files[table].row_bytes()
    }

    fn read(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<ReadStats> {
        if reqs.is_empty() {
            return Ok(ReadStats::default());
        }
        let files = &self.files;
        reqs.sort_unstable_by_key(|r| (r.table, files[r.table].row_offset(r.row)));
        let total = self.plan(reqs);
        let FileStore {
            files,
            io,
            reads,
            read_blocks,
            at,
        } = self;
        let fds: Vec<&File> = files.iter().map(|f| f.file()).collect();
        let t = Instant::now();
        let buf = io.read(&fds, reads).map_err(|e| {
            let r = reads[e.index.min(reads.len() - 1)];
            EmbedError::ReadAt {
                path: files[r.file].path().display().to_string(),
                len: r.len,
                offset: r.offset,
                cause: e.error.into(),
            }
        })?;
        let wait = t.elapsed();
        let mut pos = 0;
        for (r, &first) in reads.iter().zip(read_blocks.iter()) {
            files[r.file].verify(first, &buf[pos..pos + r.len])?;
            pos += r.len;
        }
        debug_assert_eq!(pos, total);
        for (r, &a) in reqs.iter().zip(at.iter()) {
            land(r, &buf[a..a + files[r.table].row_bytes()]);
        }
        Ok(ReadStats {
            reads: reads.len() as u64,
            bytes: total as u64,
            wait,
        })
    }
}
