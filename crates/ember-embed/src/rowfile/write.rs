//! Writing a row file: rows streamed in order, checksummed per block, the header and checksum
//! table written last, the file synced and renamed into place.

use super::{BLOCK, RowFileHeader, RowLayout, io_err};
use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Writes a row file from rows given in order: in id order, or, for a file with a layout
/// ([`RowFileWriter::create_laid_out`]), in the layout's order.
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
    /// The rows' positions, written at `finish` (a laid-out file).
    slots: Option<Vec<u8>>,
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
        Self::start(path, name, rows, dim, dtype, None)
    }

    /// Starts `path` as a file laid out by `layout` (version 2): [`RowFileWriter::write_rows`]
    /// then takes the rows in the layout's order, `layout.row_at(0)` first.
    pub fn create_laid_out(
        path: &Path,
        name: &str,
        dim: usize,
        dtype: DType,
        layout: &RowLayout,
    ) -> Result<Self> {
        Self::start(path, name, layout.rows(), dim, dtype, Some(layout))
    }

    fn start(
        path: &Path,
        name: &str,
        rows: usize,
        dim: usize,
        dtype: DType,
        layout: Option<&RowLayout>,
    ) -> Result<Self> {
        let header = RowFileHeader::for_shape(name, rows, dim, dtype, layout.is_some())?;
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
            slots: layout.map(|l| l.slots().iter().flat_map(|s| s.to_le_bytes()).collect()),
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
        if let Some(mut slots) = self.slots.take() {
            self.header.layout_crc = crc32fast::hash(&slots);
            slots.resize(
                (self.header.data_offset - self.header.layout_offset) as usize,
                0,
            );
            file.seek(SeekFrom::Start(self.header.layout_offset))
                .map_err(e("seek"))?;
            file.write_all(&slots).map_err(e("write"))?;
        }
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

/// Writes `bytes` (a whole table in its dtype layout, rows in id order) as a row file laid out by
/// `layout`: each block of the data is gathered from the rows it holds.
pub fn write_row_file_laid_out(
    path: &Path,
    name: &str,
    dim: usize,
    dtype: DType,
    bytes: &[u8],
    layout: &RowLayout,
) -> Result<()> {
    let rb = dtype.row_bytes(dim);
    if bytes.len() != layout.rows() * rb {
        return Err(EmbedError::RowFile {
            path: path.display().to_string(),
            reason: format!(
                "{} bytes of rows for a layout of {} rows of {rb} bytes",
                bytes.len(),
                layout.rows()
            ),
        });
    }
    let mut w = RowFileWriter::create_laid_out(path, name, dim, dtype, layout)?;
    let mut chunk = Vec::with_capacity(rb * 4096);
    for ids in layout.order().chunks(4096) {
        chunk.clear();
        for &id in ids {
            chunk.extend_from_slice(&bytes[id as usize * rb..(id as usize + 1) * rb]);
        }
        w.write_rows(&chunk)?;
    }
    w.finish()
}
