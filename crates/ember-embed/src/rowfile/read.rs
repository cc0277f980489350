//! Reading a row file: opened with its length, header and checksum table checked; rows and
//! blocks read on demand and checked against their checksums.

use super::aligned::{AlignedBuf, read_full_at};
use super::{BLOCK, HEADER, RowFileHeader, RowLayout, io_err};
use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// An open row file: header and checksums in memory, the data read on demand.
#[derive(Debug)]
pub struct RowFile {
    path: PathBuf,
    file: File,
    direct: bool,
    header: RowFileHeader,
    sums: Vec<u32>,
    /// Where each row lies in the data (version 2); `None`: row `r` is at position `r`.
    layout: Option<RowLayout>,
}

impl RowFile {
    /// Opens `path` for direct I/O (bypassing the page cache; buffered where the filesystem
    /// refuses `O_DIRECT`, e.g. tmpfs) and checks its length, header and checksum table.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, true)
    }

    /// As [`RowFile::open`], choosing whether to ask for direct I/O.
    pub fn open_with(path: &Path, direct: bool) -> Result<Self> {
        let bad = |reason: String| EmbedError::RowFile {
            path: path.display().to_string(),
            reason,
        };
        // A FIFO or device would block or never end: refused before it is opened.
        crate::files::check_regular(path, "row file").map_err(|e| io_err(path, "open", e))?;
        let (file, direct) = match direct {
            true => match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (
                    File::open(path).map_err(|e| io_err(path, "open", e))?,
                    false,
                ),
                Err(e) => return Err(io_err(path, "open", e)),
            },
            false => (
                File::open(path).map_err(|e| io_err(path, "open", e))?,
                false,
            ),
        };
        let len = file.metadata().map_err(|e| io_err(path, "stat", e))?.len();
        let mut head = AlignedBuf::new(HEADER).map_err(|e| io_err(path, "allocate", e))?;
        let n = read_full_at(&file, head.bytes_mut(), 0).map_err(|e| io_err(path, "read", e))?;
        let header = RowFileHeader::decode(&head.bytes()[..n]).map_err(|cause| {
            EmbedError::RowFileHeader {
                path: path.display().to_string(),
                cause,
            }
        })?;
        if len != header.file_bytes() {
            return Err(bad(format!(
                "{len} bytes on disk, but its header describes {} ({} rows x {} bytes in {} \
                 blocks): {}",
                header.file_bytes(),
                header.rows,
                header.row_bytes,
                header.blocks(),
                if len < header.file_bytes() {
                    "truncated (an interrupted copy?)"
                } else {
                    "extra bytes after the data"
                }
            )));
        }
        let sums_len = (header.data_offset - header.sums_offset) as usize;
        let mut raw = AlignedBuf::new(sums_len).map_err(|e| io_err(path, "allocate", e))?;
        let n = read_full_at(&file, raw.bytes_mut(), header.sums_offset)
            .map_err(|e| io_err(path, "read", e))?;
        if n != sums_len {
            return Err(bad("checksum table truncated".into()));
        }
        let used = 4 * header.blocks() as usize;
        let table = &raw.bytes()[..used];
        let crc = crc32fast::hash(table);
        if crc != header.sums_crc {
            return Err(bad(format!(
                "checksum table damaged (stored CRC {:08x}, computed {crc:08x})",
                header.sums_crc
            )));
        }
        let sums = table
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let layout = match header.laid_out() {
            true => Some(Self::read_layout(path, &file, &header)?),
            false => None,
        };
        Ok(RowFile {
            path: path.into(),
            file,
            direct,
            header,
            sums,
            layout,
        })
    }

    /// Reads and checks the positions of a version-2 file (their CRC, and that they are a
    /// permutation of the rows).
    fn read_layout(path: &Path, file: &File, h: &RowFileHeader) -> Result<RowLayout> {
        let bad = |reason: String| EmbedError::RowFile {
            path: path.display().to_string(),
            reason,
        };
        let len = (h.data_offset - h.layout_offset) as usize;
        let used = 4 * h.rows as usize;
        let mut raw = AlignedBuf::new(len).map_err(|e| io_err(path, "allocate the layout", e))?;
        let n = read_full_at(file, raw.bytes_mut(), h.layout_offset)
            .map_err(|e| io_err(path, "read the layout", e))?;
        if n != len {
            return Err(bad("layout truncated".into()));
        }
        let bytes = &raw.bytes()[..used];
        let crc = crc32fast::hash(bytes);
        if crc != h.layout_crc {
            return Err(bad(format!(
                "layout damaged (stored CRC {:08x}, computed {crc:08x})",
                h.layout_crc
            )));
        }
        let slots: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        RowLayout::from_slots(&slots).map_err(|cause| EmbedError::RowFileLayout {
            path: path.display().to_string(),
            cause,
        })
    }

    /// Where the rows lie, when not in id order (a version-2 file).
    pub fn layout(&self) -> Option<&RowLayout> {
        self.layout.as_ref()
    }

    /// The position of row `r` in the data.
    #[inline]
    pub fn position(&self, r: usize) -> usize {
        match &self.layout {
            Some(l) => l.position(r),
            None => r,
        }
    }

    /// Byte offset of row `r` within the data.
    #[inline]
    pub fn row_offset(&self, r: usize) -> u64 {
        self.position(r) as u64 * self.header.row_bytes
    }

    /// The header.
    pub fn header(&self) -> &RowFileHeader {
        &self.header
    }
    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The open file (direct I/O when [`RowFile::direct`]).
    pub fn file(&self) -> &File {
        &self.file
    }
    /// Whether reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }
    /// Rows of the table.
    pub fn rows(&self) -> usize {
        self.header.rows as usize
    }
    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.header.dim as usize
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.header.dtype
    }
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.header.row_bytes as usize
    }

    /// The first block and the number of blocks holding row `r`.
    pub fn row_blocks(&self, r: usize) -> (u64, u64) {
        let start = self.row_offset(r);
        let first = start / BLOCK as u64;
        let last = (start + self.header.row_bytes - 1) / BLOCK as u64;
        (first, last - first + 1)
    }

    /// File offset of data block `b`.
    pub fn block_offset(&self, b: u64) -> u64 {
        self.header.data_offset + b * BLOCK as u64
    }

    /// Checks `bytes`, read from data blocks `first..`, against their checksums.
    pub fn verify(&self, first: u64, bytes: &[u8]) -> Result<()> {
        for (i, blk) in bytes.chunks(BLOCK).enumerate() {
            let b = first + i as u64;
            let stored = self.sums.get(b as usize).copied();
            let actual = crc32fast::hash(blk);
            if blk.len() != BLOCK || stored != Some(actual) {
                return Err(EmbedError::Corrupt {
                    path: self.path.display().to_string(),
                    block: b,
                    offset: self.block_offset(b),
                    len: blk.len(),
                    stored: stored.unwrap_or(0),
                    actual,
                });
            }
        }
        Ok(())
    }

    /// A read that returned fewer bytes than asked: the file shrank after it was opened.
    fn check_len(&self, got: usize, want: usize, block: u64) -> Result<()> {
        if got == want {
            return Ok(());
        }
        Err(EmbedError::RowFile {
            path: self.path.display().to_string(),
            reason: format!(
                "short read at block {block}: {got} of {want} bytes (the file was truncated after \
                 it was opened)"
            ),
        })
    }

    /// Reads row `r` (checked) into `out` (`row_bytes` long), synchronously. For occasional
    /// reads (references, tests); lookups go through a `ember_tier::Stager`.
    pub fn read_row(&self, r: usize, out: &mut [u8]) -> Result<()> {
        if r >= self.rows() || out.len() != self.row_bytes() {
            return Err(EmbedError::RowFile {
                path: self.path.display().to_string(),
                reason: format!(
                    "row {r} of {} (into {} bytes, rows are {})",
                    self.rows(),
                    out.len(),
                    self.row_bytes()
                ),
            });
        }
        let (first, n) = self.row_blocks(r);
        let mut buf =
            AlignedBuf::new(n as usize * BLOCK).map_err(|e| io_err(&self.path, "allocate", e))?;
        let got = read_full_at(&self.file, buf.bytes_mut(), self.block_offset(first))
            .map_err(|e| io_err(&self.path, "read", e))?;
        self.check_len(got, n as usize * BLOCK, first)?;
        self.verify(first, &buf.bytes()[..got])?;
        let start = (self.row_offset(r) - first * BLOCK as u64) as usize;
        out.copy_from_slice(&buf.bytes()[start..start + self.row_bytes()]);
        Ok(())
    }

    /// Reads and checks every block (a scrub).
    pub fn verify_all(&self) -> Result<()> {
        self.scan(|_, _| {})
    }

    /// Reads every row, checked, into `out` (`rows x row_bytes` bytes), in id order whatever the
    /// file's layout.
    pub fn read_all(&self, out: &mut [u8]) -> Result<()> {
        let len = self.rows() * self.row_bytes();
        if out.len() != len {
            return Err(EmbedError::RowFile {
                path: self.path.display().to_string(),
                reason: format!("{} bytes of room for {len} bytes of rows", out.len()),
            });
        }
        let Some(layout) = &self.layout else {
            return self.scan(|at, bytes| {
                let end = (at + bytes.len()).min(len);
                if at < end {
                    out[at..end].copy_from_slice(&bytes[..end - at]);
                }
            });
        };
        // Laid out: each whole row of a chunk goes to its id's place. A row may straddle two
        // chunks, so its first part waits in `part`.
        let rb = self.row_bytes();
        let mut part: Vec<u8> = Vec::with_capacity(rb);
        self.scan(|at, bytes| {
            let end = (at + bytes.len()).min(len);
            let mut pos = at;
            while pos < end {
                let p = pos / rb;
                let within = pos - p * rb;
                let take = (rb - within).min(end - pos);
                let src = &bytes[pos - at..pos - at + take];
                let id = layout.row_at(p);
                if within == 0 && take == rb {
                    out[id * rb..(id + 1) * rb].copy_from_slice(src);
                } else {
                    part.extend_from_slice(src);
                    if part.len() == rb {
                        out[id * rb..(id + 1) * rb].copy_from_slice(&part);
                        part.clear();
                    }
                }
                pos += take;
            }
        })
    }

    /// Reads every data block in order, 4 MiB at a time, checks it, and hands it to `sink` with
    /// its position in the data.
    fn scan(&self, mut sink: impl FnMut(usize, &[u8])) -> Result<()> {
        const CHUNK: usize = 1024;
        let mut buf =
            AlignedBuf::new(CHUNK * BLOCK).map_err(|e| io_err(&self.path, "allocate", e))?;
        let blocks = self.header.blocks();
        let mut b = 0;
        while b < blocks {
            let n = (blocks - b).min(CHUNK as u64) as usize;
            let got = read_full_at(
                &self.file,
                &mut buf.bytes_mut()[..n * BLOCK],
                self.block_offset(b),
            )
            .map_err(|e| io_err(&self.path, "read", e))?;
            self.verify(b, &buf.bytes()[..got])?;
            sink(b as usize * BLOCK, &buf.bytes()[..got]);
            b += n as u64;
        }
        Ok(())
    }
}
