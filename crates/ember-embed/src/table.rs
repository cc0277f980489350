//! Embedding tables: `rows` rows of `dim` elements of one [`DType`], row-major, packed back to back
//! (`stride = dtype.row_bytes(dim)`), in a [`RowBuf`] (huge pages by default).

use crate::alloc::{PagePolicy, RowBuf};
use crate::dtype::DType;
use crate::error::{EmbedError, Result};
use rayon::prelude::*;

/// One embedding table.
#[derive(Debug)]
pub struct EmbeddingTable {
    name: String,
    rows: usize,
    dim: usize,
    dtype: DType,
    stride: usize,
    data: RowBuf,
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
            reason: e.to_string(),
        })?;
        Ok(EmbeddingTable {
            name: name.into(),
            rows,
            dim,
            dtype,
            stride,
            data,
        })
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
        t.data.as_mut_slice().copy_from_slice(bytes);
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
        let data = self.data.as_mut_slice();
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
    /// All rows as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_slice()
    }
    /// The encoded bytes of row `r`. Panics when `r >= rows` (ids are validated before lookups).
    pub fn row_bytes(&self, r: usize) -> &[u8] {
        &self.data.as_slice()[r * self.stride..(r + 1) * self.stride]
    }
    /// Row `r` decoded to f32 into `out` (`out.len() == dim`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        self.dtype.decode_row(self.row_bytes(r), out);
    }
    /// Bytes currently backed by huge pages, when the OS tells.
    pub fn huge_page_bytes(&self) -> Option<usize> {
        self.data.huge_page_bytes()
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
        t.dequantize_row(4, &mut row);
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
            assert_eq!(a.as_bytes(), b.as_bytes(), "{dt}");
            assert_eq!(a.bytes(), 10_000 * dt.row_bytes(7));
        }
    }
}
