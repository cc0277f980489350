//! The rows view that a tier fills and the kernels pool ([`crate::Pooler::run_staged`]): a
//! staged batch holds, per tier feature, where each id's row lies (a slot of the tier table's
//! cache [`Slab`], held until the batch is dropped, or a compact buffer of the batch's own when
//! the cache could not hold every row), stamped with a hash of the ids so that pooling can check
//! that the batch it is given is the one staged; and the recycler its buffers and holds go back
//! to. The tier (`ember-tier`: its stager and row caches) fills it; this crate reads it.
//!
//! The kernels read slab rows in place, without a lock, while the cache that owns the slab
//! writes other slots. That is sound only if no slot a batch names is written while the batch
//! lives: the tier promises it when it puts a feature into a batch, which is why that step
//! ([`StagedBatch::set_feature`], [`StagedBatch::features_mut`]) is `unsafe`. What a batch names
//! is checked against its slab's size before any read ([`StagedFeature::fits`]).

mod slab;

pub use slab::{PinEpoch, Slab};

use crate::jagged::Ids;
use std::sync::{Arc, Mutex};

/// The `inverse` entry of an id whose row is stable (pinned, or in a cache that covers every id):
/// only `slots` locates it (stable rows are read unheld, and not deduplicated by the stager).
pub const STABLE_ROW: u32 = u32::MAX - 1;

/// Where a staged feature's rows lie.
#[derive(Debug)]
pub enum StagedRows {
    /// Pooled in place in tier table `tier`'s cache slab: `held[i]` is the slot of the feature's
    /// distinct evictable row `i`, held by this batch until it is dropped, and `slots[k]` the
    /// slot of its id `k` (`held[inverse[k]]`, or a stable slot, read unheld while the batch
    /// keeps `pins`, the pinned set's epoch).
    Slab {
        slab: Arc<Slab>,
        tier: usize,
        held: Vec<u32>,
        slots: Vec<u32>,
        pins: Option<PinEpoch>,
    },
    /// The feature's distinct rows copied into a buffer of the batch's own (the cache had no slot
    /// free for some of them).
    Compact(Vec<u8>),
}

/// One feature's rows for one batch, and for each of its ids the index of its row among the
/// feature's distinct rows ([`STABLE_ROW`] for a stable row in a slab).
#[derive(Debug)]
pub struct StagedFeature {
    pub rows: StagedRows,
    pub inverse: Vec<u32>,
    /// Ids whose rows are stable (their `inverse` is [`STABLE_ROW`]; 0 for compact rows).
    pub stable: usize,
    /// Whether some rows were absent from the cache (their slots are known once fetched).
    pub absent: bool,
    /// Batch position of the feature's first id.
    pub start: usize,
    /// Distinct rows (`inverse` names them), and bytes per row.
    pub n_rows: usize,
    pub stride: usize,
    /// [`ids_hash`] of the feature's ids: pooling checks the batch is the one staged.
    pub ids_hash: u64,
    /// The sums of the rows missing from the cache, pooled on the remote store's nodes, per
    /// bag (`pooling.rs`): their rows in `rows` are zeros, and the pooler adds these after the
    /// kernel.
    pub remote: Option<RemoteSums>,
}

/// A feature's missing rows pooled remotely: per bag of the batch, `dim` floats; `weighted`:
/// summed with the batch's weights.
#[derive(Debug)]
pub struct RemoteSums {
    pub weighted: bool,
    pub sums: Vec<f32>,
}

impl StagedFeature {
    /// Whether this staged feature can be pooled for `ids` (the feature's ids in the batch at
    /// `start`) over rows of `stride` bytes: same batch position, same ids, and every inverse
    /// index inside the buffer (so the kernels never read outside it).
    pub fn fits(
        &self,
        start: usize,
        ids: &Ids,
        range: std::ops::Range<usize>,
        stride: usize,
    ) -> bool {
        // The inverse is read only where no row is stable (compact rows, or a slab the stager
        // deduplicated whole); stable slab rows are read through `slots` alone.
        let inverse_read = self.stable == 0;
        let rows_fit = match &self.rows {
            StagedRows::Slab {
                slab, held, slots, ..
            } => {
                let in_slab = slab.len() / stride.max(1);
                held.len() == self.n_rows
                    && slots.len() == self.inverse.len()
                    && held.iter().chain(slots).all(|&s| (s as usize) < in_slab)
            }
            StagedRows::Compact(rows) => rows.len() == self.n_rows * stride && inverse_read,
        };
        rows_fit
            && self.start == start
            && self.stride == stride
            && self.inverse.len() == range.len()
            && (!inverse_read
                || (self.inverse.iter().fold(0u32, |m, &i| m.max(i)) < self.n_rows.max(1) as u32
                    && (self.inverse.is_empty() || self.n_rows > 0)))
            && ids_hash(ids, range) == self.ids_hash
    }
}

/// A hash of ids `range` of a batch: four multiply-xorshift folds over interleaved ids, then
/// folded together (four independent chains: one would be bound by the multiply's latency, a
/// few cycles per id, on the pooler's critical path).
pub fn ids_hash(ids: &Ids, range: std::ops::Range<usize>) -> u64 {
    match ids {
        Ids::U32(v) => fold_lanes(&v[range], u64::from),
        Ids::I64(v) => fold_lanes(&v[range], |x| x as u64),
    }
}

fn fold_lanes<T: Copy>(ids: &[T], word: impl Fn(T) -> u64) -> u64 {
    let mix = |h: u64, x: u64| (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    let mut lanes = [0u64, 1, 2, 3];
    let mut quads = ids.chunks_exact(4);
    for q in &mut quads {
        for (h, &x) in lanes.iter_mut().zip(q) {
            *h = mix(*h, word(x));
        }
    }
    let tail = quads
        .remainder()
        .iter()
        .fold(ids.len() as u64, |h, &x| mix(h, word(x)));
    lanes.into_iter().fold(tail, mix)
}

/// The rows of a batch's tier features, read and checked; pool it with
/// [`crate::Pooler::run_staged`].
#[derive(Debug, Default)]
pub struct StagedBatch {
    feats: Vec<Option<StagedFeature>>,
    /// Where its buffers go back when it is dropped.
    recycle: Option<Arc<Recycler>>,
}

impl Drop for StagedBatch {
    fn drop(&mut self) {
        if let Some(pool) = &self.recycle {
            for sf in self.feats.iter_mut().flatten() {
                let inverse = std::mem::take(&mut sf.inverse);
                match &mut sf.rows {
                    StagedRows::Slab {
                        tier, held, slots, ..
                    } => {
                        pool.release(*tier, std::mem::take(held));
                        pool.put(Vec::new(), inverse);
                        pool.put(Vec::new(), std::mem::take(slots));
                    }
                    StagedRows::Compact(rows) => pool.put(std::mem::take(rows), inverse),
                }
            }
        }
    }
}

/// Staging buffers handed back by dropped [`StagedBatch`]es, and the cache slots they held.
/// Fresh multi-megabyte buffers each batch cost page faults and kernel zeroing (13% of a fully
/// cached run's profile); reused ones cost a memset. Held slots are given back to their caches
/// by the stager, under its lock, before it stages the next batch: a dropped batch never waits
/// for the stager.
#[derive(Debug, Default)]
pub struct Recycler {
    free: Mutex<FreeBuffers>,
    released: Mutex<Vec<(usize, Vec<u32>)>>,
}

/// Row buffers, and u32 buffers (inverse indices, slot lists).
#[derive(Debug, Default)]
struct FreeBuffers {
    rows: Vec<Vec<u8>>,
    inverse: Vec<Vec<u32>>,
}

impl Recycler {
    /// Buffers kept at most, of each kind.
    const KEEP: usize = 256;

    /// Slots of tier table `tier` a dropped batch held (entries `u32::MAX` name no slot).
    pub fn release(&self, tier: usize, held: Vec<u32>) {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((tier, held));
    }

    /// Every release since the last call.
    pub fn take_released(&self) -> Vec<(usize, Vec<u32>)> {
        std::mem::take(&mut *self.released.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Gives back a slot list once its slots are released.
    pub fn put_held(&self, held: Vec<u32>) {
        self.put(Vec::new(), held);
    }

    pub fn put(&self, rows: Vec<u8>, inverse: Vec<u32>) {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if f.rows.len() < Self::KEEP && rows.capacity() > 0 {
            f.rows.push(rows);
        }
        if f.inverse.len() < Self::KEEP && inverse.capacity() > 0 {
            f.inverse.push(inverse);
        }
    }

    /// An empty u32 buffer (an inverse index or a slot list).
    pub fn take_inverse(&self) -> Vec<u32> {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let mut inverse = f.inverse.pop().unwrap_or_default();
        drop(f);
        inverse.clear();
        inverse
    }

    /// A zeroed byte buffer of `len`.
    pub fn take_rows(&self, len: usize) -> Vec<u8> {
        let mut rows = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rows
            .pop()
            .unwrap_or_default();
        rows.clear();
        rows.resize(len, 0);
        rows
    }
}

impl StagedBatch {
    /// A batch of `features` features, none staged yet; its buffers and holds go back to
    /// `recycle` when it is dropped.
    pub fn new(features: usize, recycle: Arc<Recycler>) -> Self {
        StagedBatch {
            feats: (0..features).map(|_| None).collect(),
            recycle: Some(recycle),
        }
    }

    /// Puts feature `f`'s staged rows into the batch.
    ///
    /// # Safety
    /// Every slab slot that `sf` names (`held`, `slots`) holds the row it stands for, and nothing
    /// writes it until this batch is dropped: a slot the caller holds for the batch (released
    /// through the recycler on drop), or a stable slot of the epoch `sf` keeps.
    ///
    /// # Panics
    /// If `f` is not a feature of the batch.
    pub unsafe fn set_feature(&mut self, f: usize, sf: StagedFeature) {
        self.feats[f] = Some(sf);
    }

    /// The staged features, to complete them once their missing rows landed.
    ///
    /// # Safety
    /// What the caller leaves in them keeps the promise of [`Self::set_feature`].
    pub unsafe fn features_mut(&mut self) -> &mut [Option<StagedFeature>] {
        &mut self.feats
    }

    /// Whether feature `f` was staged.
    pub fn feature(&self, f: usize) -> Option<&StagedFeature> {
        self.feats.get(f).and_then(Option::as_ref)
    }
    /// Bytes of the rows staged: distinct rows per feature, whether held in a cache or copied.
    pub fn bytes(&self) -> usize {
        self.feats
            .iter()
            .flatten()
            .map(|s| match &s.rows {
                StagedRows::Slab { held, .. } => held.len() * s.stride,
                StagedRows::Compact(rows) => rows.len(),
            })
            .sum()
    }

    /// Features whose rows are pooled in place in a cache, and features staged at all.
    pub fn in_place(&self) -> (usize, usize) {
        let staged = self.feats.iter().flatten();
        let n = staged.clone().count();
        let slab = staged
            .filter(|s| matches!(s.rows, StagedRows::Slab { .. }))
            .count();
        (slab, n)
    }
}
