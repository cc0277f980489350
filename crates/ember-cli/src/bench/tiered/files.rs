//! The row files of `bench tiered`: written once from the seed, reused by later runs of the same
//! shape (the seed is in the file's name) and layout.

use anyhow::Result;
use ember_embed::DType;
use ember_embed::rowfile::{RowFile, RowFileWriter, RowLayout};
use ember_model::random::seeded_row;
use std::path::Path;
use std::time::Instant;

/// Writes `path` with table `i`'s seeded rows (in id order, or placed by `layout`) unless a good
/// file of that shape and layout is there (the seed is in the file's name).
pub(super) fn ensure_row_file(
    path: &Path,
    i: usize,
    rows: usize,
    dim: usize,
    dtype: DType,
    seed: u64,
    layout: Option<&RowLayout>,
) -> Result<()> {
    let name = format!("t{i}");
    if let Ok(f) = RowFile::open(path) {
        let h = f.header();
        if h.name == name
            && (h.rows, h.dim, h.dtype) == (rows as u64, dim as u64, dtype)
            && f.layout() == layout
        {
            return Ok(());
        }
    }
    let t0 = Instant::now();
    let mut w = match layout {
        Some(l) => RowFileWriter::create_laid_out(path, &name, dim, dtype, l)?,
        None => RowFileWriter::create(path, &name, rows, dim, dtype)?,
    };
    const CHUNK: usize = 8192;
    let mut f32s = vec![0f32; dim];
    let mut buf = vec![0u8; CHUNK * dtype.row_bytes(dim)];
    let rb = dtype.row_bytes(dim);
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(CHUNK);
        for k in 0..n {
            let id = layout.map_or(r + k, |l| l.row_at(r + k));
            seeded_row(seed, i, id, &mut f32s);
            dtype.encode_row(&f32s, &mut buf[k * rb..(k + 1) * rb]);
        }
        w.write_rows(&buf[..n * rb])?;
        r += n;
    }
    w.finish()?;
    eprintln!(
        "wrote {} in {:.1} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
