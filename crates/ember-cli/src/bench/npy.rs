//! `bench embed --save-ids`: the batches' ids as a NumPy array, so that `bench/compare_torch.py`
//! replays exactly the ids Ember was timed on.

use anyhow::Result;
use ember_embed::{Ids, KeyedJagged};
use std::io::Write;
use std::path::Path;

use super::setup::Shape;

/// Writes ids as a NumPy .npy array of shape [batches, tables, batch * pooling].
pub(super) fn save_ids(path: &Path, batches: &[KeyedJagged], s: Shape) -> Result<()> {
    let wide = matches!(batches.first().map(|b| b.ids()), Some(Ids::I64(_)));
    let descr = if wide { "<i8" } else { "<u4" };
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        batches.len(),
        s.tables,
        s.batch * s.pooling
    );
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, then \n.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for b in batches {
        match b.ids() {
            Ids::U32(v) => v.iter().try_for_each(|x| f.write_all(&x.to_le_bytes()))?,
            Ids::I64(v) => v.iter().try_for_each(|x| f.write_all(&x.to_le_bytes()))?,
        }
    }
    f.flush()?;
    Ok(())
}
