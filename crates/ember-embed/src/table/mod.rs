//! Embedding tables: `rows` rows of `dim` elements of one [`DType`], row-major, packed back to back
//! (`stride = dtype.row_bytes(dim)`), placed in one of three ways ([`Placement`]):
//!
//! - `dram`: in memory, in a [`RowBuf`] (huge pages by default);
//! - `mmap`: a plain read-only mapping of a row file's data, paged in by the OS on first touch;
//! - `ssd`: in a row file read by a `ember_tier::RowStore` through a `ember_tier::Stager`
//!   and its cache;
//!   such a table has no resident bytes, and lookups must be staged first;
//! - `remote`: in a Redis Cluster (`ember_tier::storage::remote`), read like `ssd` through the
//!   stager and its cache; the table holds only its shape.

mod live;
mod updates;
pub use updates::UpdateLog;

use crate::alloc::{PagePolicy, RowBuf};
use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use crate::rowfile::{MappedRows, RowFile};
use live::LiveRows;
pub use live::RowsRef;
use rayon::prelude::*;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

/// Where a table's rows live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// In memory.
    #[default]
    Dram,
    /// A plain mapping of the row file (the OS page cache is the cache).
    Mmap,
    /// The SSD tier: a row file, direct I/O, Ember's row cache.
    Ssd,
    /// A Redis Cluster, behind Ember's row cache.
    Remote,
}

impl Placement {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Dram => "dram",
            Placement::Mmap => "mmap",
            Placement::Ssd => "ssd",
            Placement::Remote => "remote",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Serialized as its name (`"dram"`, `"mmap"`, `"ssd"`, `"remote"`), as `config.json` writes it.
impl serde::Serialize for Placement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Placement {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "dram" => Ok(Placement::Dram),
            "mmap" => Ok(Placement::Mmap),
            "ssd" => Ok(Placement::Ssd),
            "remote" => Ok(Placement::Remote),
            _ => Err(EmbedError::BadOption {
                option: "placement",
                reason: format!("'{s}' is not dram, mmap, ssd or remote"),
            }),
        }
    }
}

#[derive(Debug)]
pub(crate) enum Storage {
    /// Bytes `offset .. offset + len` of a buffer (several tables may share one: row views).
    Memory {
        buf: Arc<RowBuf>,
        offset: usize,
        len: usize,
    },
    /// A plain mapping of a row file (several tables may share one: row views).
    Mapped(MappedRows),
    Disk(Arc<RowFile>),
    /// Rows in a remote store: nothing here but the shape, and optionally a local row-file copy
    /// read while the store cannot answer.
    Remote(Option<Arc<RowFile>>),
    /// In memory, rewritten by row updates while it serves (the `live` module).
    Live(LiveRows),
}

/// One embedding table.
#[derive(Debug)]
pub struct EmbeddingTable {
    name: String,
    rows: usize,
    dim: usize,
    dtype: DType,
    stride: usize,
    pub(crate) data: Storage,
    /// Its row updates (live tables, or rows of the tier's cache).
    updates: UpdateLog,
}

impl EmbeddingTable {
    /// A table of zeros.
    pub fn zeroed(
        name: &str,
        rows: usize,
        dim: usize,
        dtype: DType,
        pages: PagePolicy,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(EmbedError::BadTable {
                table: name.into(),
                reason: "dim must be at least 1".into(),
            });
        }
        let stride = dtype.row_bytes(dim);
        let bytes = rows
            .checked_mul(stride)
            .ok_or_else(|| EmbedError::BadTable {
                table: name.into(),
                reason: format!("{rows} rows x {stride} bytes overflows"),
            })?;
        let data = RowBuf::new(bytes, pages).map_err(|e| EmbedError::Alloc {
            table: name.into(),
            bytes,
            cause: e.into(),
        })?;
        Ok(EmbeddingTable {
            name: name.into(),
            rows,
            dim,
            dtype,
            stride,
            updates: UpdateLog::default(),
            data: Storage::Memory {
                buf: Arc::new(data),
                offset: 0,
                len: bytes,
            },
        })
    }

    /// A table on the tier read from the row file at `path`, checked at open (see
    /// [`crate::rowfile`]): an `ssd` table, or the local copy of a `remote` one (see
    /// [`Self::remote_with_copy`]). Lookups go through a `ember_tier::Stager`.
    pub fn open_row_file(path: &Path) -> Result<Self> {
        let file = Arc::new(RowFile::open(path)?);
        Ok(Self::over_file(file.clone(), Storage::Disk(file)))
    }

    /// A table whose rows live in a remote store (placement `remote`): only its shape is held
    /// here; lookups go through a `ember_tier::Stager` opened with the store's address.
    pub fn remote(name: &str, rows: usize, dim: usize, dtype: DType) -> Result<Self> {
        if dim == 0 {
            return Err(EmbedError::BadTable {
                table: name.into(),
                reason: "dim must be at least 1".into(),
            });
        }
        Ok(EmbeddingTable {
            name: name.into(),
            rows,
            dim,
            dtype,
            stride: dtype.row_bytes(dim),
            data: Storage::Remote(None),
            updates: UpdateLog::default(),
        })
    }

    /// A table placed `remote` with a local copy of its rows: `copy` (an `ssd` table opened from
    /// the row file) is read while the store cannot answer.
    pub fn remote_with_copy(copy: EmbeddingTable) -> Result<Self> {
        let Storage::Disk(file) = copy.data else {
            return Err(EmbedError::BadTable {
                table: copy.name,
                reason: "a remote table's local copy must be a row file opened for the ssd tier"
                    .into(),
            });
        };
        Ok(EmbeddingTable {
            data: Storage::Remote(Some(file)),
            ..copy
        })
    }

    /// A table read through a plain read-only mapping of the row file at `path` (the header and
    /// checksum table are checked at open; the rows are not, as the OS pages them in unseen).
    /// A file laid out by a profile (`ember convert --layout-profile`) is refused: the kernels
    /// read a mapped table's rows in place, by id.
    pub fn map_row_file(path: &Path) -> Result<Self> {
        let file = Arc::new(RowFile::open(path)?);
        if file.layout().is_some() {
            return Err(EmbedError::RowFile {
                path: path.display().to_string(),
                reason: "its rows are laid out by a profile (format version 2), and the mmap \
                         placement reads rows in place in id order: place the table on ssd, or \
                         write the file again without --layout-profile"
                    .into(),
            });
        }
        let rows = MappedRows::map(file.clone())?;
        Ok(Self::over_file(file, Storage::Mapped(rows)))
    }

    /// A table of `placement` from the row file at `path` (`dram` reads the whole file into
    /// memory, checking every block).
    pub fn from_row_file(path: &Path, placement: Placement, pages: PagePolicy) -> Result<Self> {
        match placement {
            Placement::Ssd | Placement::Remote => Self::open_row_file(path),
            Placement::Mmap => Self::map_row_file(path),
            Placement::Dram => {
                let f = RowFile::open_with(path, false)?;
                let mut t = Self::zeroed(
                    f.header().name.as_str(),
                    f.rows(),
                    f.dim(),
                    f.dtype(),
                    pages,
                )?;
                if let Some(buf) = t.fresh_bytes_mut() {
                    f.read_all(buf)?;
                }
                Ok(t)
            }
        }
    }

    fn over_file(file: Arc<RowFile>, data: Storage) -> Self {
        EmbeddingTable {
            name: file.header().name.clone(),
            rows: file.rows(),
            dim: file.dim(),
            dtype: file.dtype(),
            stride: file.row_bytes(),
            data,
            updates: UpdateLog::default(),
        }
    }

    /// Builds a table from `rows x dim` f32 values (row-major), quantizing to `dtype`.
    pub fn from_f32(
        name: &str,
        rows: usize,
        dim: usize,
        dtype: DType,
        values: &[f32],
    ) -> Result<Self> {
        let expected = rows * dim;
        if values.len() != expected {
            return Err(EmbedError::TableValues {
                table: name.into(),
                got: values.len(),
                rows,
                dim,
                expected,
            });
        }
        let mut t = Self::zeroed(name, rows, dim, dtype, PagePolicy::Huge)?;
        t.fill_rows(1, |r, out| {
            out.copy_from_slice(&values[r * dim..(r + 1) * dim])
        });
        Ok(t)
    }

    /// Builds a table from its stored bytes (`rows x dtype.row_bytes(dim)`, the layout of
    /// [`DType`]), as read from a weights file.
    pub fn from_bytes(
        name: &str,
        rows: usize,
        dim: usize,
        dtype: DType,
        bytes: &[u8],
    ) -> Result<Self> {
        let mut t = Self::zeroed(name, rows, dim, dtype, PagePolicy::Huge)?;
        if bytes.len() != t.bytes() {
            return Err(EmbedError::BadTable {
                table: name.into(),
                reason: format!(
                    "{} bytes given, {rows} rows x {} bytes per {} row = {} expected",
                    bytes.len(),
                    t.stride,
                    dtype.name(),
                    t.bytes()
                ),
            });
        }
        if let Some(buf) = t.fresh_bytes_mut() {
            buf.copy_from_slice(bytes);
        }
        Ok(t)
    }

    /// Fills every row from `f(row, &mut f32 row)` on `threads` threads, encoding into the dtype.
    pub fn fill_rows<F>(&mut self, threads: usize, f: F)
    where
        F: Fn(usize, &mut [f32]) + Sync,
    {
        let (dim, dtype, stride) = (self.dim, self.dtype, self.stride);
        const CHUNK: usize = 4096;
        let body = |(c, chunk): (usize, &mut [u8])| {
            let mut tmp = vec![0f32; dim];
            for (i, row) in chunk.chunks_exact_mut(stride).enumerate() {
                f(c * CHUNK + i, &mut tmp);
                dtype.encode_row(&tmp, row);
            }
        };
        let Some(data) = self.fresh_bytes_mut() else {
            return;
        };
        if threads <= 1 {
            data.chunks_mut(CHUNK * stride).enumerate().for_each(body);
        } else {
            match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
                Ok(pool) => pool.install(|| {
                    data.par_chunks_mut(CHUNK * stride)
                        .enumerate()
                        .for_each(body)
                }),
                Err(_) => data.chunks_mut(CHUNK * stride).enumerate().for_each(body),
            }
        }
    }

    /// The bytes of an in-memory table nobody else shares yet (right after it was made), to
    /// fill; `None` for a shared or tiered table.
    pub fn fresh_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.data {
            Storage::Memory { buf, offset, len } => {
                Arc::get_mut(buf).map(|b| &mut b.as_mut_slice()[*offset..*offset + *len])
            }
            _ => None,
        }
    }

    /// Rows `start .. end` as a table of their own named `name`, sharing this table's memory
    /// (no copy). In-memory and mapped tables only: the SSD tier's are refused.
    pub fn view_rows(&self, name: &str, start: usize, end: usize) -> Result<EmbeddingTable> {
        let bad = |reason: String| EmbedError::BadTable {
            table: self.name.clone(),
            reason,
        };
        if start >= end || end > self.rows {
            return Err(bad(format!(
                "rows {start}..{end} are empty or outside its {} rows",
                self.rows
            )));
        }
        let (o, l) = (start * self.stride, (end - start) * self.stride);
        let data = match &self.data {
            Storage::Memory { buf, offset, .. } => Storage::Memory {
                buf: buf.clone(),
                offset: offset + o,
                len: l,
            },
            Storage::Mapped(m) => Storage::Mapped(m.sub(o, l)),
            Storage::Disk(_) | Storage::Remote(_) | Storage::Live(_) => {
                return Err(bad(format!(
                    "a table placed {}{} cannot be split into row views",
                    self.placement(),
                    if self.is_live() { " and live" } else { "" }
                )));
            }
        };
        Ok(EmbeddingTable {
            name: name.into(),
            rows: end - start,
            dim: self.dim,
            dtype: self.dtype,
            stride: self.stride,
            data,
            updates: UpdateLog::default(),
        })
    }

    /// Rows `rows` and columns `cols` copied into a new in-memory table named `name`. Float rows
    /// are decoded and re-encoded (exact); int8 and int4 rows keep their bytes and their row's
    /// scale and bias, so int4 column ranges must start on an even column and end on one (or at
    /// the last column).
    pub fn copy_block(
        &self,
        name: &str,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        pages: PagePolicy,
    ) -> Result<EmbeddingTable> {
        let bad = |reason: String| EmbedError::BadTable {
            table: self.name.clone(),
            reason,
        };
        if rows.start >= rows.end
            || rows.end > self.rows
            || cols.start >= cols.end
            || cols.end > self.dim
        {
            return Err(bad(format!(
                "block rows {rows:?} cols {cols:?} is empty or outside {} x {}",
                self.rows, self.dim
            )));
        }
        if self.dtype == DType::Int4
            && (!cols.start.is_multiple_of(2)
                || (!cols.end.is_multiple_of(2) && cols.end != self.dim))
        {
            return Err(bad(format!(
                "int4 columns {cols:?} do not start and end on byte boundaries"
            )));
        }
        let Some(src) = self.resident() else {
            return Err(bad(
                "a table on the SSD tier cannot be copied into shards".into()
            ));
        };
        let width = cols.end - cols.start;
        let mut t = Self::zeroed(name, rows.end - rows.start, width, self.dtype, pages)?;
        let (stride, dtype, dim) = (self.stride, self.dtype, self.dim);
        let out_stride = t.stride;
        let Some(dst) = t.fresh_bytes_mut() else {
            return Err(bad("a new table's memory is shared".into()));
        };
        let mut row = vec![0f32; dim];
        for (i, r) in rows.enumerate() {
            let s = &src[r * stride..(r + 1) * stride];
            let d = &mut dst[i * out_stride..(i + 1) * out_stride];
            match dtype {
                DType::F32 | DType::F16 | DType::BF16 => {
                    dtype.decode_row(s, &mut row);
                    dtype.encode_row(&row[cols.clone()], d);
                }
                DType::Int8 => {
                    d[..width].copy_from_slice(&s[cols.clone()]);
                    d[width..].copy_from_slice(&s[dim..]);
                }
                DType::Int4 => {
                    let (b0, nb) = (cols.start / 2, width.div_ceil(2));
                    d[..nb].copy_from_slice(&s[b0..b0 + nb]);
                    if width % 2 == 1 {
                        d[nb - 1] &= 0x0f;
                    }
                    d[nb..].copy_from_slice(&s[dim.div_ceil(2)..]);
                }
            }
        }
        Ok(t)
    }

    /// Table name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Bytes from one row to the next.
    pub fn stride(&self) -> usize {
        self.stride
    }
    /// Size of the table in bytes.
    pub fn bytes(&self) -> usize {
        self.rows * self.stride
    }
    /// Where the rows live.
    pub fn placement(&self) -> Placement {
        match self.data {
            Storage::Memory { .. } | Storage::Live(_) => Placement::Dram,
            Storage::Mapped(_) => Placement::Mmap,
            Storage::Disk(_) => Placement::Ssd,
            Storage::Remote(_) => Placement::Remote,
        }
    }
    /// All rows as bytes, when addressable (`dram` and `mmap`; `None` on the SSD tier).
    pub fn resident(&self) -> Option<&[u8]> {
        match &self.data {
            Storage::Memory { buf, offset, len } => Some(&buf.as_slice()[*offset..*offset + *len]),
            Storage::Mapped(m) => Some(m.bytes()),
            Storage::Disk(_) | Storage::Remote(_) | Storage::Live(_) => None,
        }
    }
    /// All rows as bytes, when addressable: like [`Self::resident`], and a live table's under
    /// its read lock (held while the answer is borrowed).
    pub fn rows_ref(&self) -> Option<RowsRef<'_>> {
        match &self.data {
            Storage::Live(l) => Some(l.read()),
            _ => self.resident().map(RowsRef::plain),
        }
    }
    /// The row file behind an `mmap` or `ssd` table, or the local copy of a `remote` one.
    pub fn row_file(&self) -> Option<&Arc<RowFile>> {
        match &self.data {
            Storage::Memory { .. } | Storage::Remote(None) | Storage::Live(_) => None,
            Storage::Mapped(m) => Some(m.file()),
            Storage::Disk(file) | Storage::Remote(Some(file)) => Some(file),
        }
    }
    /// Copies the encoded bytes of row `r` into `out` (`stride` bytes), from memory or, on the
    /// SSD tier, by a checked synchronous read.
    pub fn read_row(&self, r: usize, out: &mut [u8]) -> Result<()> {
        if r >= self.rows || out.len() != self.stride {
            return Err(EmbedError::BadTable {
                table: self.name.clone(),
                reason: format!(
                    "row {r} of {} into {} bytes (rows are {})",
                    self.rows,
                    out.len(),
                    self.stride
                ),
            });
        }
        match &self.data {
            Storage::Disk(f) => return f.read_row(r, out),
            Storage::Remote(_) => {
                return Err(EmbedError::NotStaged {
                    table: self.name.clone(),
                });
            }
            _ => {}
        }
        if let Some(all) = self.rows_ref() {
            out.copy_from_slice(&all[r * self.stride..(r + 1) * self.stride]);
        }
        Ok(())
    }
    /// Row `r` decoded to f32 into `out` (`out.len() == dim`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        match self.rows_ref() {
            Some(all) if r < self.rows => {
                self.dtype
                    .decode_row(&all[r * self.stride..(r + 1) * self.stride], out);
                Ok(())
            }
            _ => {
                let mut buf = vec![0u8; self.stride];
                self.read_row(r, &mut buf)?;
                self.dtype.decode_row(&buf, out);
                Ok(())
            }
        }
    }
    /// Bytes currently backed by huge pages, when the OS tells (in-memory tables).
    pub fn huge_page_bytes(&self) -> Option<usize> {
        match &self.data {
            Storage::Memory { buf, .. } => buf.huge_page_bytes(),
            Storage::Live(l) => l.huge_page_bytes(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_f32_round_trips_f32_and_rejects_wrong_lengths() {
        let vals: Vec<f32> = (0..15).map(|i| i as f32 * 0.5 - 3.0).collect();
        let t = EmbeddingTable::from_f32("t", 5, 3, DType::F32, &vals).unwrap();
        let mut row = [0f32; 3];
        t.dequantize_row(4, &mut row).unwrap();
        assert_eq!(row, [3.0, 3.5, 4.0]);
        let e = EmbeddingTable::from_f32("t", 5, 4, DType::F32, &vals).unwrap_err();
        assert!(e.to_string().contains("15 values given"), "{e}");
        let e = EmbeddingTable::zeroed("z", 5, 0, DType::F32, PagePolicy::Small).unwrap_err();
        assert!(e.to_string().contains("dim must be at least 1"), "{e}");
    }

    #[test]
    fn parallel_fill_matches_serial_fill() {
        for dt in DType::ALL {
            let mut a = EmbeddingTable::zeroed("a", 10_000, 7, dt, PagePolicy::Small).unwrap();
            let mut b = EmbeddingTable::zeroed("b", 10_000, 7, dt, PagePolicy::Small).unwrap();
            let f = |r: usize, out: &mut [f32]| {
                out.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (r * 7 + i) as f32 * 1e-3)
            };
            a.fill_rows(1, f);
            b.fill_rows(2, f);
            assert_eq!(a.resident(), b.resident(), "{dt}");
            assert_eq!(a.bytes(), 10_000 * dt.row_bytes(7));
        }
    }
}
