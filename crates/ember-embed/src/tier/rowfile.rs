//! The row file: one embedding table on disk, laid out for direct I/O and guarded by a checksum per
//! block.
//!
//! ```text
//! offset        bytes                 what
//! 0             4096                  header (below)
//! sums_offset   4 x blocks, padded    CRC-32 of every data block, in order
//!               to 4096
//! data_offset   blocks x 4096         the rows, packed back to back in the table's dtype layout
//!                                     (`row_bytes` each, as in memory), zero-padded to a block
//! ```
//!
//! Header (little-endian): magic `EMBROWS\0` (8), version u32, dtype code u32 (0 f32, 1 f16, 2 bf16,
//! 3 int8, 4 int4), rows u64, dim u64, row_bytes u64, block_bytes u64, sums_offset u64, data_offset
//! u64, data_bytes u64, sums_crc u32 (CRC-32 of the checksum table), name_len u32, the table's name
//! (UTF-8, at most 1024 bytes), zeros, and at byte 4092 the CRC-32 of bytes 0..4092.
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

use crate::alloc::{PagePolicy, RowBuf};
use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// First 8 bytes of every row file.
pub const MAGIC: [u8; 8] = *b"EMBROWS\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of one block: the unit of reads, alignment and checksums.
pub const BLOCK: usize = 4096;
/// Bytes of the header.
const HEADER: usize = 4096;
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
}

impl RowFileHeader {
    /// The layout of a table of this shape.
    fn layout(name: &str, rows: usize, dim: usize, dtype: DType) -> Result<Self> {
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
        let data_offset = sums_offset + sums_bytes;
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
        })
    }

    /// Data blocks.
    pub fn blocks(&self) -> u64 {
        self.data_bytes / self.block_bytes
    }

    /// Total file length.
    pub fn file_bytes(&self) -> u64 {
        self.data_offset + self.data_bytes
    }

    fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; HEADER];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
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
        let crc = crc32fast::hash(&h[..HEADER_CRC_AT]);
        h[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    fn decode(h: &[u8]) -> std::result::Result<Self, String> {
        if h.len() < HEADER {
            return Err(format!(
                "{} bytes, shorter than the {HEADER}-byte header (truncated, or not a row file)",
                h.len()
            ));
        }
        if h[0..8] != MAGIC {
            return Err("not a row file (bad magic; write one with `ember convert`)".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or([0; 8]));
        let version = u32_at(8);
        if version != VERSION {
            return Err(format!(
                "format version {version}, this build reads version {VERSION}"
            ));
        }
        let stored = u32_at(HEADER_CRC_AT);
        let actual = crc32fast::hash(&h[..HEADER_CRC_AT]);
        if stored != actual {
            return Err(format!(
                "header checksum mismatch (stored {stored:08x}, computed {actual:08x}): the header is damaged"
            ));
        }
        let dtype = DType::from_code(u32_at(12))
            .ok_or_else(|| format!("unknown dtype code {}", u32_at(12)))?;
        let name_len = u32_at(76) as usize;
        if name_len > MAX_NAME {
            return Err(format!("name length {name_len} is over {MAX_NAME}"));
        }
        let name = std::str::from_utf8(&h[80..80 + name_len])
            .map_err(|_| "table name is not UTF-8".to_string())?
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
        };
        // The layout is a function of the shape: anything else is a damaged or foreign file.
        let rows = usize::try_from(got.rows).map_err(|_| "row count too large".to_string())?;
        let dim = usize::try_from(got.dim).map_err(|_| "dim too large".to_string())?;
        let want = Self::layout(&got.name, rows, dim, dtype).map_err(|e| e.to_string())?;
        let want = RowFileHeader {
            sums_crc: got.sums_crc,
            ..want
        };
        if want != got {
            return Err(format!(
                "header fields are inconsistent with {rows} rows x dim {dim} {dtype}"
            ));
        }
        Ok(got)
    }
}

fn io_err(path: &Path, op: &'static str, e: std::io::Error) -> EmbedError {
    EmbedError::Io {
        path: path.display().to_string(),
        op,
        reason: e.to_string(),
    }
}

/// Writes a row file from rows given in order.
#[derive(Debug)]
pub struct RowFileWriter {
    path: PathBuf,
    tmp: PathBuf,
    /// Taken by `finish`.
    out: Option<BufWriter<File>>,
    header: RowFileHeader,
    sums: Vec<u32>,
    block: crc32fast::Hasher,
    in_block: usize,
    bytes: u64,
    finished: bool,
}

impl Drop for RowFileWriter {
    /// An unfinished file is removed: nothing half-written stays on disk.
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl RowFileWriter {
    /// Starts `path` (written as `path.tmp` until [`RowFileWriter::finish`]).
    pub fn create(path: &Path, name: &str, rows: usize, dim: usize, dtype: DType) -> Result<Self> {
        let header = RowFileHeader::layout(name, rows, dim, dtype)?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let file = File::create(&tmp).map_err(|e| io_err(&tmp, "create", e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.seek(SeekFrom::Start(header.data_offset))
            .map_err(|e| io_err(&tmp, "seek", e))?;
        Ok(RowFileWriter {
            path: path.into(),
            tmp,
            out: Some(out),
            sums: Vec::with_capacity(header.blocks() as usize),
            header,
            block: crc32fast::Hasher::new(),
            in_block: 0,
            bytes: 0,
            finished: false,
        })
    }

    /// Appends whole rows (`bytes.len()` a multiple of the row size).
    pub fn write_rows(&mut self, bytes: &[u8]) -> Result<()> {
        let rb = self.header.row_bytes;
        let room = self.header.rows * rb - self.bytes;
        if !(bytes.len() as u64).is_multiple_of(rb) || bytes.len() as u64 > room {
            return Err(EmbedError::RowFile {
                path: self.path.display().to_string(),
                reason: format!(
                    "{} bytes written: not whole {rb}-byte rows, or past the {} rows of the table",
                    bytes.len(),
                    self.header.rows
                ),
            });
        }
        if let Some(out) = self.out.as_mut() {
            out.write_all(bytes)
                .map_err(|e| io_err(&self.tmp, "write", e))?;
        }
        self.hash(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    fn hash(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = (BLOCK - self.in_block).min(bytes.len());
            self.block.update(&bytes[..n]);
            self.in_block += n;
            bytes = &bytes[n..];
            if self.in_block == BLOCK {
                let h = std::mem::replace(&mut self.block, crc32fast::Hasher::new());
                self.sums.push(h.finalize());
                self.in_block = 0;
            }
        }
    }

    /// Pads the last block, writes the checksums and the header, syncs and renames the file into
    /// place. Fails when fewer rows than the header's were written.
    pub fn finish(mut self) -> Result<()> {
        if self.bytes != self.header.rows * self.header.row_bytes {
            return Err(EmbedError::RowFile {
                path: self.path.display().to_string(),
                reason: format!(
                    "{} of {} rows written",
                    self.bytes / self.header.row_bytes,
                    self.header.rows
                ),
            });
        }
        if self.in_block > 0 {
            let pad = vec![0u8; BLOCK - self.in_block];
            if let Some(out) = self.out.as_mut() {
                out.write_all(&pad)
                    .map_err(|e| io_err(&self.tmp, "write", e))?;
            }
            self.hash(&pad);
        }
        debug_assert_eq!(self.sums.len() as u64, self.header.blocks());
        let mut sums: Vec<u8> = self.sums.iter().flat_map(|s| s.to_le_bytes()).collect();
        self.header.sums_crc = crc32fast::hash(&sums);
        sums.resize(
            (self.header.data_offset - self.header.sums_offset) as usize,
            0,
        );
        let tmp = self.tmp.clone();
        let Some(out) = self.out.take() else {
            return Err(io_err(
                &tmp,
                "write",
                std::io::Error::other("already finished"),
            ));
        };
        let e = |op| {
            let tmp = tmp.clone();
            move |e| io_err(&tmp, op, e)
        };
        let mut file = out
            .into_inner()
            .map_err(|e| e.into_error())
            .map_err(e("write"))?;
        file.seek(SeekFrom::Start(self.header.sums_offset))
            .map_err(e("seek"))?;
        file.write_all(&sums).map_err(e("write"))?;
        file.seek(SeekFrom::Start(0)).map_err(e("seek"))?;
        file.write_all(&self.header.encode()).map_err(e("write"))?;
        file.sync_all().map_err(e("sync"))?;
        std::fs::rename(&self.tmp, &self.path).map_err(e("rename"))?;
        self.finished = true;
        Ok(())
    }
}

/// Writes `bytes` (a whole table in its dtype layout) as a row file.
pub fn write_row_file(
    path: &Path,
    name: &str,
    rows: usize,
    dim: usize,
    dtype: DType,
    bytes: &[u8],
) -> Result<()> {
    let mut w = RowFileWriter::create(path, name, rows, dim, dtype)?;
    for chunk in bytes.chunks(dtype.row_bytes(dim) * 4096) {
        w.write_rows(chunk)?;
    }
    w.finish()
}

/// An open row file: header and checksums in memory, the data read on demand.
#[derive(Debug)]
pub struct RowFile {
    path: PathBuf,
    file: File,
    direct: bool,
    header: RowFileHeader,
    sums: Vec<u32>,
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
        let n = read_full_at(&file, head.as_mut(), 0).map_err(|e| io_err(path, "read", e))?;
        let header = RowFileHeader::decode(&head.as_ref()[..n]).map_err(bad)?;
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
        let n = read_full_at(&file, raw.as_mut(), header.sums_offset)
            .map_err(|e| io_err(path, "read", e))?;
        if n != sums_len {
            return Err(bad("checksum table truncated".into()));
        }
        let used = 4 * header.blocks() as usize;
        let table = &raw.as_ref()[..used];
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
        Ok(RowFile {
            path: path.into(),
            file,
            direct,
            header,
            sums,
        })
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
        let start = r as u64 * self.header.row_bytes;
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
    /// reads (references, tests); lookups go through a [`crate::tier::Stager`].
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
        let got = read_full_at(&self.file, buf.as_mut(), self.block_offset(first))
            .map_err(|e| io_err(&self.path, "read", e))?;
        self.check_len(got, n as usize * BLOCK, first)?;
        self.verify(first, &buf.as_ref()[..got])?;
        let start = r * self.row_bytes() - first as usize * BLOCK;
        out.copy_from_slice(&buf.as_ref()[start..start + self.row_bytes()]);
        Ok(())
    }

    /// Reads and checks every block (a scrub).
    pub fn verify_all(&self) -> Result<()> {
        self.scan(|_, _| {})
    }

    /// Reads every row, checked, into `out` (`rows x row_bytes` bytes).
    pub fn read_all(&self, out: &mut [u8]) -> Result<()> {
        let len = self.rows() * self.row_bytes();
        if out.len() != len {
            return Err(EmbedError::RowFile {
                path: self.path.display().to_string(),
                reason: format!("{} bytes of room for {len} bytes of rows", out.len()),
            });
        }
        self.scan(|at, bytes| {
            let end = (at + bytes.len()).min(len);
            if at < end {
                out[at..end].copy_from_slice(&bytes[..end - at]);
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
                &mut buf.as_mut()[..n * BLOCK],
                self.block_offset(b),
            )
            .map_err(|e| io_err(&self.path, "read", e))?;
            self.verify(b, &buf.as_ref()[..got])?;
            sink(b as usize * BLOCK, &buf.as_ref()[..got]);
            b += n as u64;
        }
        Ok(())
    }
}

/// Drops `path`'s clean pages from the OS page cache (`posix_fadvise(DONTNEED)`), so that the next
/// buffered or mapped read of it goes to the disk, and returns (pages still resident, pages), as
/// `mincore` reports them. Benchmarks use it for a cold start without root.
pub fn evict_page_cache(path: &Path) -> Result<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).map_err(|e| io_err(path, "open", e))?;
    let len = f.metadata().map_err(|e| io_err(path, "stat", e))?.len() as usize;
    // SAFETY: an FFI call on a descriptor that is open for the whole call; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io_err(
            path,
            "posix_fadvise",
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: a read-only shared mapping that is never read, only passed to mincore, and dropped
    // before returning.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| io_err(path, "mmap", e))?;
    let page = 4096;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes at a page-aligned address, and `vec` has one
    // byte per page of it, as mincore(2) requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io_err(path, "mincore", std::io::Error::last_os_error()));
    }
    let resident = vec.iter().filter(|&&b| b & 1 == 1).count() as u64;
    Ok((resident, pages as u64))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A page-aligned buffer, as direct I/O needs.
#[derive(Debug)]
pub(crate) struct AlignedBuf(RowBuf);

impl AlignedBuf {
    /// An anonymous mapping: page-aligned.
    pub(crate) fn new(len: usize) -> std::io::Result<Self> {
        RowBuf::new(len, PagePolicy::Small).map(AlignedBuf)
    }
    pub(crate) fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}
