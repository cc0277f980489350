//! A staged batch: per tier feature, the batch's distinct rows in a compact buffer and each id's
//! index among them (as batch deduplication builds them), stamped with a hash of the ids so that
//! pooling can check that the batch it is given is the one staged; and the recycler its buffers
//! go back to.

use crate::jagged::Ids;
use std::sync::{Arc, Mutex};

/// One feature's rows for one batch: its distinct rows, compact, and for each of its ids the index
/// of its row among them.
#[derive(Debug)]
pub(crate) struct StagedFeature {
    pub(crate) rows: Vec<u8>,
    pub(crate) inverse: Vec<u32>,
    /// Batch position of the feature's first id.
    pub(crate) start: usize,
    /// Distinct rows in `rows`, and bytes per row.
    pub(crate) n_rows: usize,
    pub(crate) stride: usize,
    /// [`ids_hash`] of the feature's ids: pooling checks the batch is the one staged.
    pub(crate) ids_hash: u64,
}

impl StagedFeature {
    /// Whether this staged feature can be pooled for `ids` (the feature's ids in the batch at
    /// `start`) over rows of `stride` bytes: same batch position, same ids, and every inverse
    /// index inside the buffer (so the kernels never read outside it).
    pub(crate) fn fits(
        &self,
        start: usize,
        ids: &Ids,
        range: std::ops::Range<usize>,
        stride: usize,
    ) -> bool {
        self.start == start
            && self.stride == stride
            && self.inverse.len() == range.len()
            && self.rows.len() == self.n_rows * stride
            && self.inverse.iter().fold(0u32, |m, &i| m.max(i)) < self.n_rows.max(1) as u32
            && (self.inverse.is_empty() || self.n_rows > 0)
            && ids_hash(ids, range) == self.ids_hash
    }
}

/// A hash of ids `range` of a batch (a multiply-xorshift fold).
pub(crate) fn ids_hash(ids: &Ids, range: std::ops::Range<usize>) -> u64 {
    let mix = |h: u64, x: u64| (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    match ids {
        Ids::U32(v) => v[range].iter().fold(0, |h, &x| mix(h, u64::from(x))),
        Ids::I64(v) => v[range].iter().fold(0, |h, &x| mix(h, x as u64)),
    }
}

/// The rows of a batch's tier features, read and checked; pool it with
/// [`crate::Pooler::run_staged`].
#[derive(Debug, Default)]
pub struct StagedBatch {
    pub(crate) feats: Vec<Option<StagedFeature>>,
    /// Where its buffers go back when it is dropped.
    pub(crate) recycle: Option<Arc<Recycler>>,
}

impl Drop for StagedBatch {
    fn drop(&mut self) {
        if let Some(pool) = &self.recycle {
            for sf in self.feats.iter_mut().flatten() {
                pool.put(
                    std::mem::take(&mut sf.rows),
                    std::mem::take(&mut sf.inverse),
                );
            }
        }
    }
}

/// Staging buffers handed back by dropped [`StagedBatch`]es. Fresh multi-megabyte buffers each
/// batch cost page faults and kernel zeroing (13% of a fully cached run's profile); reused
/// ones cost a memset.
#[derive(Debug, Default)]
pub(crate) struct Recycler {
    free: Mutex<FreeBuffers>,
}

/// Row buffers and inverse-index buffers.
#[derive(Debug, Default)]
struct FreeBuffers {
    rows: Vec<Vec<u8>>,
    inverse: Vec<Vec<u32>>,
}

impl Recycler {
    /// Buffers kept at most, of each kind.
    const KEEP: usize = 256;

    pub(crate) fn put(&self, rows: Vec<u8>, inverse: Vec<u32>) {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if f.rows.len() < Self::KEEP && rows.capacity() > 0 {
            f.rows.push(rows);
        }
        if f.inverse.len() < Self::KEEP && inverse.capacity() > 0 {
            f.inverse.push(inverse);
        }
    }

    /// A zeroed byte buffer of `len`, and an empty u32 buffer.
    pub(crate) fn take(&self, len: usize) -> (Vec<u8>, Vec<u32>) {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows = f.rows.pop().unwrap_or_default();
        let mut inverse = f.inverse.pop().unwrap_or_default();
        drop(f);
        rows.clear();
        rows.resize(len, 0);
        inverse.clear();
        (rows, inverse)
    }
}

impl StagedBatch {
    /// Whether feature `f` was staged, for a batch whose feature `f` has `ids` ids at `start`.
    pub(crate) fn feature(&self, f: usize) -> Option<&StagedFeature> {
        self.feats.get(f).and_then(Option::as_ref)
    }
    /// Bytes of staged rows.
    pub fn bytes(&self) -> usize {
        self.feats.iter().flatten().map(|s| s.rows.len()).sum()
    }
}
