//! In-memory tables whose rows change while they serve (streaming row updates,
//! `ember_tier::storage::remote::updates`): the buffer is behind a reader-writer lock, so that a
//! reader (one pooling unit: one feature over a range of bags) sees every row entirely old or
//! entirely new, and a writer rewrites rows only while no unit reads the table.
//!
//! A table becomes live with [`crate::EmbeddingTable::make_live`] (before it is shared). Its
//! bytes are then reached only through [`crate::EmbeddingTable::rows_ref`], which holds the read lock
//! as long as the bytes are borrowed; `resident()` answers `None`, so no caller can hold them
//! unlocked. Readers hold the lock for one unit (microseconds to a millisecond); a writer waits
//! for the units in flight and holds it for one copy of the rows it writes.

use super::{EmbeddingTable, Storage};
use crate::alloc::{PagePolicy, RowBuf};
use crate::error::{EmbedError, Result};
use std::ops::Deref;
use std::sync::Arc;
use std::sync::{RwLock, RwLockReadGuard};

/// The rows of a live table.
#[derive(Debug)]
pub(crate) struct LiveRows {
    buf: RwLock<RowBuf>,
    offset: usize,
    len: usize,
}

/// A table's bytes, borrowed: plainly, or under a live table's read lock (released when this is
/// dropped).
pub struct RowsRef<'a>(Borrow<'a>);

enum Borrow<'a> {
    Plain(&'a [u8]),
    Locked {
        guard: RwLockReadGuard<'a, RowBuf>,
        offset: usize,
        len: usize,
    },
}

impl<'a> RowsRef<'a> {
    pub(crate) fn plain(b: &'a [u8]) -> Self {
        RowsRef(Borrow::Plain(b))
    }
}

impl Deref for RowsRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Borrow::Plain(b) => b,
            Borrow::Locked { guard, offset, len } => &guard.as_slice()[*offset..*offset + *len],
        }
    }
}

impl std::fmt::Debug for RowsRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let locked = matches!(self.0, Borrow::Locked { .. });
        write!(f, "RowsRef({} bytes, locked: {locked})", self.len())
    }
}

impl LiveRows {
    /// Bytes `offset .. offset + len` of `buf`.
    pub(crate) fn new(buf: RowBuf, offset: usize, len: usize) -> Self {
        LiveRows {
            buf: RwLock::new(buf),
            offset,
            len,
        }
    }

    /// The rows under the read lock (a writer that panicked left whole rows: the lock's poison
    /// is ignored).
    pub(crate) fn read(&self) -> RowsRef<'_> {
        RowsRef(Borrow::Locked {
            guard: self.buf.read().unwrap_or_else(|p| p.into_inner()),
            offset: self.offset,
            len: self.len,
        })
    }

    /// Writes each of `rows` (`stride` bytes each) at its row of `at` (checked by the caller)
    /// under the write lock.
    pub(crate) fn write(&self, at: &[u64], rows: &[u8], stride: usize) {
        let mut buf = self.buf.write().unwrap_or_else(|p| p.into_inner());
        let all = &mut buf.as_mut_slice()[self.offset..self.offset + self.len];
        for (&r, row) in at.iter().zip(rows.chunks_exact(stride)) {
            let o = r as usize * stride;
            all[o..o + stride].copy_from_slice(row);
        }
    }

    pub(crate) fn huge_page_bytes(&self) -> Option<usize> {
        self.buf
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .huge_page_bytes()
    }
}

impl EmbeddingTable {
    /// Makes an in-memory table live: row updates may then rewrite it while it serves
    /// ([`Self::write_rows`]), and its bytes are read only through [`Self::rows_ref`]. A table
    /// sharing its memory with row views gets a copy of its own. Other placements are refused.
    pub fn make_live(&mut self) -> Result<()> {
        let data = std::mem::replace(&mut self.data, Storage::Remote(None));
        self.data = match data {
            Storage::Memory { buf, offset, len } => match Arc::try_unwrap(buf) {
                Ok(buf) => Storage::Live(LiveRows::new(buf, offset, len)),
                Err(shared) => {
                    let mut own =
                        RowBuf::new(len, PagePolicy::Huge).map_err(|e| EmbedError::Alloc {
                            table: self.name().to_string(),
                            bytes: len,
                            cause: e.into(),
                        })?;
                    own.as_mut_slice()
                        .copy_from_slice(&shared.as_slice()[offset..offset + len]);
                    Storage::Live(LiveRows::new(own, 0, len))
                }
            },
            live @ Storage::Live(_) => live,
            other => {
                self.data = other;
                return Err(EmbedError::BadTable {
                    table: self.name().to_string(),
                    reason: format!(
                        "a table placed {} cannot take row updates",
                        self.placement()
                    ),
                });
            }
        };
        Ok(())
    }
    /// Its row updates: which rows were rewritten since an epoch.
    pub fn updates(&self) -> &super::UpdateLog {
        &self.updates
    }

    /// Whether [`Self::make_live`] made it live.
    pub fn is_live(&self) -> bool {
        matches!(self.data, Storage::Live(_))
    }
    /// Rewrites rows `ids` of a live table with `rows` (`ids.len()` rows in the table's
    /// encoding), under its write lock: a pooling unit sees each row entirely old or new.
    pub fn write_rows(&self, ids: &[u64], rows: &[u8]) -> Result<()> {
        let bad = |reason: String| EmbedError::BadTable {
            table: self.name().to_string(),
            reason,
        };
        let Storage::Live(live) = &self.data else {
            return Err(bad("not live: row updates rewrite live tables only".into()));
        };
        if rows.len() != ids.len() * self.stride() {
            return Err(bad(format!(
                "{} bytes for {} rows of {} bytes",
                rows.len(),
                ids.len(),
                self.stride()
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id >= self.rows() as u64) {
            return Err(bad(format!("row {id} is outside its {} rows", self.rows())));
        }
        live.write(ids, rows, self.stride());
        self.updates().wrote(ids);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        DType, EmbeddingCollection, EmbeddingTable, Ids, KeyedJagged, PoolOptions, Pooler,
    };
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    const ROWS: usize = 2000;

    /// Table version `k`: element `j` of row `r` is `k + r / 4096 + j / 64` (distinct rows;
    /// the versions differ in every element, in f16 too).
    fn version(k: usize, dim: usize) -> Vec<f32> {
        (0..ROWS * dim)
            .map(|i| k as f32 + (i / dim) as f32 / 4096.0 + (i % dim) as f32 / 64.0)
            .collect()
    }

    /// A writer rewrites the whole table between two versions without pause while pooling
    /// threads pool bags of one row each: every pooled row is one version's whole row. Odd and
    /// even dims, f32 and f16 (whose rows are not a multiple of the vector width).
    #[test]
    fn pooling_a_live_table_sees_whole_rows_while_it_is_rewritten() {
        for (dim, dtype) in [(16, DType::F32), (7, DType::F32), (33, DType::F16)] {
            let src: Vec<Vec<f32>> = (1..=2).map(|k| version(k, dim)).collect();
            let (mut v, mut enc) = (Vec::new(), Vec::new());
            for src in &src {
                let t = EmbeddingTable::from_f32("x", ROWS, dim, dtype, src).unwrap();
                enc.push(t.resident().unwrap().to_vec());
                // The rows as the table holds them (f16 rounds).
                let mut dec = vec![0f32; ROWS * dim];
                for (r, row) in dec.chunks_exact_mut(dim).enumerate() {
                    t.dequantize_row(r, row).unwrap();
                }
                v.push(dec);
            }
            let mut t = EmbeddingTable::from_f32("t", ROWS, dim, dtype, &src[0]).unwrap();
            t.make_live().unwrap();
            assert!(t.is_live() && t.resident().is_none() && t.rows_ref().is_some());
            let coll = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
            let ids: Vec<u64> = (0..ROWS as u64).collect();
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let writer = s.spawn(|| {
                    let mut n = 0usize;
                    while !stop.load(Relaxed) {
                        // In pieces of 100 rows, as update entries arrive.
                        for (i, r) in ids
                            .chunks(100)
                            .zip(enc[n % 2].chunks(100 * coll.tables()[0].stride()))
                        {
                            coll.tables()[0].write_rows(i, r).unwrap();
                            // Entries arrive apart (a writer taking the lock back to back would
                            // starve the readers: updates are applied once per batch).
                            std::thread::sleep(std::time::Duration::from_micros(20));
                        }
                        n += 1;
                    }
                    n
                });
                let pooler = Pooler::new(PoolOptions {
                    threads: 2,
                    ..Default::default()
                })
                .unwrap();
                let kj = KeyedJagged::from_lengths(
                    vec!["t".into()],
                    ROWS,
                    &vec![1; ROWS],
                    Ids::U32((0..ROWS as u32).rev().collect()),
                    None,
                )
                .unwrap();
                // The writer stops even when an assertion below fails.
                struct Stop<'a>(&'a AtomicBool);
                impl Drop for Stop<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Relaxed);
                    }
                }
                let _stop = Stop(&stop);
                let mut out = vec![0f32; ROWS * dim];
                for _ in 0..300 {
                    pooler
                        .run(&coll, coll.check_view(&kj).unwrap(), &mut out)
                        .unwrap();
                    for (b, row) in out.chunks_exact(dim).enumerate() {
                        let r = ROWS - 1 - b;
                        let whole = |k: usize| row == &v[k][r * dim..(r + 1) * dim];
                        assert!(whole(0) || whole(1), "dim {dim}: row {r} is torn: {row:?}");
                    }
                }
                stop.store(true, Relaxed);
                assert!(writer.join().unwrap() > 0);
            });
        }
    }

    /// A live table refuses writes that do not fit it; other placements refuse to go live.
    #[test]
    fn writes_are_checked_and_only_memory_tables_go_live() {
        let mut t = EmbeddingTable::from_f32("t", 4, 2, DType::F32, &[0.0; 8]).unwrap();
        let row = 1f32.to_le_bytes().repeat(2);
        let err = t.write_rows(&[0], &row).unwrap_err().to_string();
        assert!(err.contains("not live"), "{err}");
        t.make_live().unwrap();
        t.write_rows(&[3], &row).unwrap();
        let mut back = [0f32; 2];
        t.dequantize_row(3, &mut back).unwrap();
        assert_eq!(back, [1.0, 1.0]);
        let err = t.write_rows(&[4], &row).unwrap_err().to_string();
        assert!(err.contains("row 4 is outside its 4 rows"), "{err}");
        let err = t.write_rows(&[1, 2], &row).unwrap_err().to_string();
        assert!(err.contains("8 bytes for 2 rows of 8 bytes"), "{err}");
        assert!(t.view_rows("v", 0, 2).is_err());
        let mut r = EmbeddingTable::remote("r", 4, 2, DType::F32).unwrap();
        let err = r.make_live().unwrap_err().to_string();
        assert!(
            err.contains("placed remote cannot take row updates"),
            "{err}"
        );
        // A table sharing its memory with a row view gets a copy of its own.
        let mut s = EmbeddingTable::from_f32("s", 4, 2, DType::F32, &[2.0; 8]).unwrap();
        let view = s.view_rows("v", 0, 2).unwrap();
        s.make_live().unwrap();
        s.write_rows(&[0], &row).unwrap();
        assert_eq!(&view.resident().unwrap()[..4], &2f32.to_le_bytes());
    }
}
