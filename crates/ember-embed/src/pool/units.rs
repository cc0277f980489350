//! How one pooling call is cut into units of work over the threads: [`plan_units`], and what
//! every unit of the call shares ([`Call`]).

use super::segment::OutPtr;
use crate::collection::EmbeddingCollection;
use crate::jagged::KeyedJagged;
use crate::staged::StagedBatch;

/// What every unit of one pooling call reads and writes: the tables, the batch, the rows the
/// tier staged for it, and the output.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub coll: &'a EmbeddingCollection,
    pub kj: &'a KeyedJagged,
    pub staged: Option<&'a StagedBatch>,
    pub out: OutPtr,
}

/// A work unit: bags `b0..b1` of one feature.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unit {
    pub feature: usize,
    pub b0: usize,
    pub b1: usize,
}

/// Units for `threads` threads: whole features when there are enough of them to keep every
/// thread busy, otherwise features cut into bag blocks (about four units per thread).
pub(super) fn plan_units(features: usize, batch: usize, threads: usize) -> Vec<Unit> {
    if batch == 0 {
        return Vec::new();
    }
    let blocks = if threads <= 1 || features >= 4 * threads {
        1
    } else {
        (4 * threads).div_ceil(features).min(batch)
    };
    let block = batch.div_ceil(blocks);
    let mut units = Vec::with_capacity(features * blocks);
    for f in 0..features {
        let mut b0 = 0;
        while b0 < batch {
            let b1 = (b0 + block).min(batch);
            units.push(Unit { feature: f, b0, b1 });
            b0 = b1;
        }
    }
    units
}
