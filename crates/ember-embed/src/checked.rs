//! Owned checked inputs: the samples of one request checked against a collection when they
//! arrive ([`CheckedSamples`]), and batches that own their ids ([`CheckedBatch`]), built by
//! checking once ([`EmbeddingCollection::check`]) or by merging checked samples without checking
//! them again ([`EmbeddingCollection::merge`]). A server checks each request once, merges the
//! requests of a batch, and hands the kernels the merged batch's [`ValidatedBatch`] view.

use crate::collection::{
    CollectionId, EmbeddingCollection, ID_CHECKS, ValidatedBatch, first_out_of_range,
};
use crate::error::{EmbedError, Result};
use crate::jagged::{Ids, KeyedJagged};
use std::sync::atomic::Ordering;

/// A batch validated against a collection, owning its [`KeyedJagged`].
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedBatch {
    kj: KeyedJagged,
    coll: CollectionId,
}

impl CheckedBatch {
    /// The batch as the kernels take it.
    pub fn view(&self) -> ValidatedBatch<'_> {
        ValidatedBatch::trusted(&self.kj, self.coll)
    }

    /// The batch.
    pub fn get(&self) -> &KeyedJagged {
        &self.kj
    }

    /// Gives the batch back.
    pub fn into_inner(self) -> KeyedJagged {
        self.kj
    }

    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.kj.batch_size()
    }

    /// A batch valid for `coll` by construction.
    pub(crate) fn trusted(kj: KeyedJagged, coll: CollectionId) -> Self {
        CheckedBatch { kj, coll }
    }
}

/// The sparse inputs of `n` samples (one request), checked against a collection: for feature
/// `f` and sample `s`, `lengths[f * n + s]` ids, stored feature-major in `ids` (all of feature
/// 0's, then feature 1's, ...), every id a row of its feature's table.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedSamples {
    n: usize,
    lengths: Vec<u32>,
    ids: Vec<i64>,
    coll: CollectionId,
}

impl CheckedSamples {
    /// Samples.
    pub fn len(&self) -> usize {
        self.n
    }
    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// Ids per (feature, sample), feature-major.
    pub fn lengths(&self) -> &[u32] {
        &self.lengths
    }
    /// The ids, feature-major.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }
}

impl EmbeddingCollection {
    /// Validates an owned batch (see [`EmbeddingCollection::validate`]).
    pub fn check(&self, kj: KeyedJagged) -> Result<CheckedBatch> {
        self.validate(&kj)?;
        Ok(CheckedBatch {
            kj,
            coll: self.id(),
        })
    }

    /// Checks the sparse inputs of `n` samples (see [`CheckedSamples`]): one length per
    /// (feature, sample), lengths adding up to the ids, every id a row of its feature's table
    /// (a negative id is out of range). Errors name the feature, the sample and the id.
    pub fn check_samples(
        &self,
        n: usize,
        lengths: Vec<u32>,
        ids: Vec<i64>,
    ) -> Result<CheckedSamples> {
        ID_CHECKS.fetch_add(1, Ordering::Relaxed);
        let nf = self.features().len();
        let expected = nf.saturating_mul(n);
        if lengths.len() != expected {
            return Err(EmbedError::LengthsCount {
                got: lengths.len(),
                features: nf,
                batch_size: n,
                expected,
            });
        }
        let sum: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        if sum != ids.len() as u64 {
            return Err(EmbedError::LengthsSum {
                sum: sum as usize,
                ids: ids.len(),
            });
        }
        let mut at = 0;
        for f in 0..nf {
            let ls = &lengths[f * n..(f + 1) * n];
            let count: usize = ls.iter().map(|&l| l as usize).sum();
            let table = self.table_of(f);
            let feature_ids = &ids[at..at + count];
            // As u64, negative ids are above any row count.
            if let Some(p) = first_out_of_range(feature_ids, |x| x as u64, table.rows() as u64) {
                let mut sample = 0;
                let mut end = ls[0] as usize;
                while end <= p {
                    sample += 1;
                    end += ls[sample] as usize;
                }
                return Err(EmbedError::IdOutOfRange {
                    feature: self.features()[f].name.clone(),
                    sample,
                    id: feature_ids[p],
                    table: table.name().to_string(),
                    rows: table.rows(),
                });
            }
            at += count;
        }
        Ok(CheckedSamples {
            n,
            lengths,
            ids,
            coll: self.id(),
        })
    }

    /// Merges checked samples into one batch, feature-major, the parts' samples in order,
    /// without checking their ids again. Ids are 32-bit when every table has at most 2^32 rows
    /// (the kernels' compact id type), else 64-bit. Fails only on samples checked against
    /// another collection.
    pub fn merge(&self, parts: &[&CheckedSamples]) -> Result<CheckedBatch> {
        if parts.iter().any(|p| p.coll != self.id()) {
            return Err(EmbedError::WrongCollection);
        }
        let nf = self.features().len();
        let n: usize = parts.iter().map(|p| p.n).sum();
        let total: usize = parts.iter().map(|p| p.ids.len()).sum();
        let narrow = self
            .tables()
            .iter()
            .all(|t| t.rows() <= u32::MAX as usize + 1);
        let mut offsets = Vec::with_capacity(nf * n + 1);
        offsets.push(0);
        let (mut ids32, mut ids64) = match narrow {
            true => (Vec::with_capacity(total), Vec::new()),
            false => (Vec::new(), Vec::with_capacity(total)),
        };
        let mut starts = vec![0usize; parts.len()];
        let mut sum = 0usize;
        for f in 0..nf {
            for (p, start) in parts.iter().zip(starts.iter_mut()) {
                let mut count = 0;
                for &l in &p.lengths[f * p.n..(f + 1) * p.n] {
                    count += l as usize;
                    sum += l as usize;
                    offsets.push(sum);
                }
                let chunk = &p.ids[*start..*start + count];
                match narrow {
                    // In range of a table of at most 2^32 rows: fits in u32.
                    true => ids32.extend(chunk.iter().map(|&i| i as u32)),
                    false => ids64.extend_from_slice(chunk),
                }
                *start += count;
            }
        }
        let ids = match narrow {
            true => Ids::U32(ids32),
            false => Ids::I64(ids64),
        };
        let kj = KeyedJagged::trusted(self.feature_names(), n, offsets, ids, None);
        Ok(CheckedBatch::trusted(kj, self.id()))
    }
}
