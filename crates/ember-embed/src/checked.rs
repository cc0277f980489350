//! Owned checked inputs: the samples of one request checked against a collection when they
//! arrive ([`CheckedSamples`]), and batches that own their ids ([`CheckedBatch`]), built by
//! checking once ([`EmbeddingCollection::check`]) or by merging checked samples without checking
//! them again ([`EmbeddingCollection::merge`]). A server checks each request once, merges the
//! requests of a batch, and hands the kernels the merged batch's [`CheckedView`] view.

use crate::collection::{CheckedView, CollectionId, EmbeddingCollection, ID_CHECKS};
use crate::error::{EmbedError, Result};
use crate::jagged::{Ids, KeyedJagged};
use std::borrow::Cow;
use std::sync::atomic::Ordering;

/// A batch validated against a collection, owning its [`KeyedJagged`].
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedBatch {
    kj: KeyedJagged,
    coll: CollectionId,
}

impl CheckedBatch {
    /// The batch as the kernels take it.
    pub fn view(&self) -> CheckedView<'_> {
        CheckedView::trusted(&self.kj, self.coll)
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

    /// The batch of samples `samples` (in that order), still valid for its collection: every
    /// id it holds was checked.
    pub fn select(&self, samples: &[usize]) -> CheckedBatch {
        for &s in samples {
            assert!(
                s < self.kj.batch_size(),
                "sample {s} of {}",
                self.kj.batch_size()
            );
        }
        CheckedBatch::trusted(self.kj.select(samples), self.coll)
    }

    /// A batch valid for `coll` by construction.
    pub(crate) fn trusted(kj: KeyedJagged, coll: CollectionId) -> Self {
        CheckedBatch { kj, coll }
    }

    /// Its offsets and ids, emptied, for a later [`EmbeddingCollection::merge_reusing`] to
    /// fill without allocating.
    pub fn into_buffers(self) -> MergeBuffers {
        let (mut offsets, mut ids) = self.kj.into_buffers();
        offsets.clear();
        match &mut ids {
            Ids::U32(v) => v.clear(),
            Ids::I64(v) => v.clear(),
        }
        MergeBuffers { offsets, ids }
    }
}

/// The buffers of a merged batch, kept to be filled again (a batch's ids are megabytes: a fresh
/// allocation per batch costs its page faults wherever the allocator returns freed memory to
/// the OS at once).
#[derive(Debug, Clone, PartialEq)]
pub struct MergeBuffers {
    offsets: Vec<usize>,
    ids: Ids,
}

impl MergeBuffers {
    /// Bytes they hold.
    pub fn capacity_bytes(&self) -> usize {
        self.offsets.capacity() * std::mem::size_of::<usize>()
            + match &self.ids {
                Ids::U32(v) => v.capacity() * 4,
                Ids::I64(v) => v.capacity() * 8,
            }
    }
}

/// Ids per (feature, sample) of a request, feature-major: each given, or one id in every bag
/// (a Criteo row: each categorical column is one id), which costs nothing per sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Lengths {
    Each(Vec<u32>),
    Ones,
}

impl From<Vec<u32>> for Lengths {
    fn from(v: Vec<u32>) -> Lengths {
        Lengths::Each(v)
    }
}

impl Lengths {
    /// Ids of the bags at `range`.
    fn sum(&self, range: std::ops::Range<usize>) -> usize {
        match self {
            Lengths::Each(v) => v[range].iter().map(|&l| l as usize).sum(),
            Lengths::Ones => range.len(),
        }
    }
}

/// The sparse inputs of `n` samples (one request), checked against a collection: for feature
/// `f` and sample `s`, `lengths[f * n + s]` ids, stored feature-major in `ids` (all of feature
/// 0's, then feature 1's, ...), every id a row of its feature's table.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedSamples {
    n: usize,
    /// Features.
    nf: usize,
    lengths: Lengths,
    /// 32-bit when the collection's tables all fit ([`EmbeddingCollection::narrow_ids`]).
    ids: Ids,
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
    /// Ids per (feature, sample), feature-major (made when the bags all hold one id).
    pub fn lengths(&self) -> Cow<'_, [u32]> {
        match &self.lengths {
            Lengths::Each(v) => Cow::Borrowed(v),
            Lengths::Ones => Cow::Owned(vec![1; self.nf * self.n]),
        }
    }
    /// The ids, feature-major: 32-bit when every table of the collection has at most 2^32
    /// rows, else 64-bit.
    pub fn ids(&self) -> &Ids {
        &self.ids
    }

    /// Lengths of feature `f`'s bags at samples `range`, appended to `out` as running sums
    /// from `*sum` (the offsets a batch keeps).
    fn push_offsets(
        &self,
        f: usize,
        range: std::ops::Range<usize>,
        sum: &mut usize,
        out: &mut Vec<usize>,
    ) {
        let at = f * self.n;
        match &self.lengths {
            Lengths::Each(v) => {
                for &l in &v[at + range.start..at + range.end] {
                    *sum += l as usize;
                    out.push(*sum);
                }
            }
            Lengths::Ones => {
                out.extend((1..=range.len()).map(|i| *sum + i));
                *sum += range.len();
            }
        }
    }

    /// The samples in pieces of at most `max` (at least 1), in order, each still checked: a
    /// request larger than a batch runs as several. Each piece is copied out when it is asked
    /// for, so the pieces cost one piece's memory at a time.
    pub fn pieces(&self, max: usize) -> Pieces<'_> {
        let mut starts = Vec::with_capacity(self.nf);
        let mut at = 0usize;
        for f in 0..self.nf {
            starts.push(at);
            at += self.lengths.sum(f * self.n..(f + 1) * self.n);
        }
        Pieces {
            of: self,
            max: max.max(1),
            next: 0,
            starts,
        }
    }
}

/// The values of `ranges` of `v`, back to back.
fn gather<T: Copy>(v: &[T], ranges: &[std::ops::Range<usize>], total: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(total);
    for r in ranges {
        out.extend_from_slice(&v[r.clone()]);
    }
    out
}

/// The pieces of [`CheckedSamples::pieces`].
#[derive(Debug)]
pub struct Pieces<'a> {
    of: &'a CheckedSamples,
    max: usize,
    /// First sample of the next piece.
    next: usize,
    /// Per feature, where the next piece's ids start.
    starts: Vec<usize>,
}

impl Iterator for Pieces<'_> {
    type Item = CheckedSamples;

    fn next(&mut self) -> Option<CheckedSamples> {
        let s = self.of;
        if self.next >= s.n {
            return None;
        }
        let (a, b) = (self.next, (self.next + self.max).min(s.n));
        let k = b - a;
        let mut lengths = match s.lengths {
            Lengths::Each(_) => Lengths::Each(Vec::with_capacity(s.nf * k)),
            Lengths::Ones => Lengths::Ones,
        };
        let mut ranges = Vec::with_capacity(s.nf);
        for (f, start) in self.starts.iter_mut().enumerate() {
            let bags = f * s.n + a..f * s.n + b;
            let count = s.lengths.sum(bags.clone());
            if let (Lengths::Each(out), Lengths::Each(all)) = (&mut lengths, &s.lengths) {
                out.extend_from_slice(&all[bags]);
            }
            ranges.push(*start..*start + count);
            *start += count;
        }
        let total = ranges.iter().map(|r| r.len()).sum();
        let ids = match &s.ids {
            Ids::U32(v) => Ids::U32(gather(v, &ranges, total)),
            Ids::I64(v) => Ids::I64(gather(v, &ranges, total)),
        };
        self.next = b;
        Some(CheckedSamples {
            n: k,
            nf: s.nf,
            lengths,
            ids,
            coll: s.coll,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.of.n - self.next).div_ceil(self.max);
        (left, Some(left))
    }
}

impl EmbeddingCollection {
    /// Validates an owned batch (see [`EmbeddingCollection::check_view`]).
    pub fn check(&self, kj: KeyedJagged) -> Result<CheckedBatch> {
        self.check_view(&kj)?;
        Ok(CheckedBatch {
            kj,
            coll: self.id(),
        })
    }

    /// Whether every table has at most 2^32 rows: ids then fit in 32 bits (the kernels'
    /// compact id type, and how checked samples keep them).
    pub fn narrow_ids(&self) -> bool {
        self.tables()
            .iter()
            .all(|t| t.rows() <= u32::MAX as usize + 1)
    }

    /// Checks the sparse inputs of `n` samples (see [`CheckedSamples`]): one length per
    /// (feature, sample), lengths adding up to the ids, every id a row of its feature's table
    /// (a negative id is out of range). Errors name the feature, the sample and the id. The ids
    /// are kept 32-bit when the collection's are ([`EmbeddingCollection::narrow_ids`]); build
    /// them so ([`Ids::with_capacity`]) to spare the conversion.
    pub fn check_samples(
        &self,
        n: usize,
        lengths: impl Into<Lengths>,
        ids: impl Into<Ids>,
    ) -> Result<CheckedSamples> {
        ID_CHECKS.fetch_add(1, Ordering::Relaxed);
        let (lengths, ids) = (lengths.into(), ids.into());
        let nf = self.features().len();
        let expected = nf.saturating_mul(n);
        if let Lengths::Each(v) = &lengths
            && v.len() != expected
        {
            return Err(EmbedError::LengthsCount {
                got: v.len(),
                features: nf,
                batch_size: n,
                expected,
            });
        }
        let sum = lengths.sum(0..expected);
        if sum != ids.len() {
            return Err(EmbedError::LengthsSum {
                sum,
                ids: ids.len(),
            });
        }
        let mut at = 0;
        for f in 0..nf {
            let count = lengths.sum(f * n..(f + 1) * n);
            let table = self.table_of(f);
            let rows = table.rows() as u64;
            if let Some(p) = ids.first_out_of_range(at..at + count, rows) {
                let sample = match &lengths {
                    Lengths::Each(v) => {
                        let ls = &v[f * n..(f + 1) * n];
                        let mut sample = 0;
                        let mut end = ls[0] as usize;
                        while end <= p {
                            sample += 1;
                            end += ls[sample] as usize;
                        }
                        sample
                    }
                    Lengths::Ones => p,
                };
                return Err(EmbedError::IdOutOfRange {
                    feature: self.features()[f].name.clone(),
                    sample,
                    id: ids.get(at + p),
                    table: table.name().to_string(),
                    rows: table.rows(),
                });
            }
            at += count;
        }
        // Every id is in range: on a narrow collection they all fit in 32 bits.
        let ids = match ids {
            Ids::I64(v) if self.narrow_ids() => Ids::U32(v.into_iter().map(|x| x as u32).collect()),
            ids => ids,
        };
        Ok(CheckedSamples {
            n,
            nf,
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
        self.merge_reusing(parts, None)
    }

    /// [`EmbeddingCollection::merge`] into `reuse`'s buffers, where given (grown as needed).
    pub fn merge_reusing(
        &self,
        parts: &[&CheckedSamples],
        reuse: Option<MergeBuffers>,
    ) -> Result<CheckedBatch> {
        if parts.iter().any(|p| p.coll != self.id()) {
            return Err(EmbedError::WrongCollection);
        }
        let nf = self.features().len();
        let n: usize = parts.iter().map(|p| p.n).sum();
        let total: usize = parts.iter().map(|p| p.ids.len()).sum();
        let narrow = self.narrow_ids();
        let (mut offsets, ids) = match reuse {
            Some(b) => (b.offsets, Some(b.ids)),
            None => (Vec::new(), None),
        };
        offsets.clear();
        offsets.reserve(nf * n + 1);
        offsets.push(0);
        let (mut ids32, mut ids64) = match ids {
            Some(Ids::U32(v)) => (v, Vec::new()),
            Some(Ids::I64(v)) => (Vec::new(), v),
            None => (Vec::new(), Vec::new()),
        };
        ids32.clear();
        ids64.clear();
        match narrow {
            true => ids32.reserve(total),
            false => ids64.reserve(total),
        }
        let mut starts = vec![0usize; parts.len()];
        let mut sum = 0usize;
        for f in 0..nf {
            for (p, start) in parts.iter().zip(starts.iter_mut()) {
                let before = sum;
                p.push_offsets(f, 0..p.n, &mut sum, &mut offsets);
                let count = sum - before;
                let r = *start..*start + count;
                match (&p.ids, narrow) {
                    (Ids::U32(v), true) => ids32.extend_from_slice(&v[r]),
                    // In range of a table of at most 2^32 rows: fits in u32.
                    (Ids::I64(v), true) => ids32.extend(v[r].iter().map(|&i| i as u32)),
                    (Ids::U32(v), false) => ids64.extend(v[r].iter().map(|&i| i64::from(i))),
                    (Ids::I64(v), false) => ids64.extend_from_slice(&v[r]),
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
