//! Batches of sparse features in TorchRec's KeyedJaggedTensor layout.
//!
//! For `F` feature keys and a batch of `B` samples, `lengths[f * B + b]` is the number of ids of
//! feature `f` in sample `b` (feature-major), `offsets` is their exclusive prefix sum
//! (`F * B + 1` entries, `offsets[0] == 0`), and `values` holds the ids back to back. Example
//! (TorchRec's): two features, batch 3, lengths `[2,0,1, 1,1,3]` -> offsets `[0,2,2,3,4,5,8]`.
//! Optional `weights` carry one f32 per id for weighted pooling.
//!
//! A [`KeyedJagged`] is structurally valid by construction (lengths add up, offsets never
//! decrease, weights match, no negative id); whether each id is a row of its table is checked
//! against a model's tables by [`crate::EmbeddingCollection::check_view`].

use crate::error::{EmbedError, Result};
use std::ops::Range;

/// Flat ids of a batch: 32-bit or 64-bit, as the caller has them.
#[derive(Debug, Clone, PartialEq)]
pub enum Ids {
    U32(Vec<u32>),
    I64(Vec<i64>),
}

impl Ids {
    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            Ids::U32(v) => v.len(),
            Ids::I64(v) => v.len(),
        }
    }
    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Id at position `i`, widened.
    pub fn get(&self, i: usize) -> i64 {
        match self {
            Ids::U32(v) => i64::from(v[i]),
            Ids::I64(v) => v[i],
        }
    }

    /// The position, within `range`, of its first id that is not a row of a table of `rows`
    /// rows (a negative id is none); a branch-free scan first, the position only when one is
    /// out.
    pub fn first_out_of_range(&self, range: Range<usize>, rows: u64) -> Option<usize> {
        match self {
            Ids::U32(v) => first_out_of_range(&v[range], u64::from, rows),
            // As u64, negative ids are above any row count.
            Ids::I64(v) => first_out_of_range(&v[range], |x| x as u64, rows),
        }
    }

    /// An empty list with room for `capacity` ids: 32-bit when `narrow` (every table has at
    /// most 2^32 rows, so every valid id fits), else 64-bit.
    pub fn with_capacity(narrow: bool, capacity: usize) -> Ids {
        match narrow {
            true => Ids::U32(Vec::with_capacity(capacity)),
            false => Ids::I64(Vec::with_capacity(capacity)),
        }
    }

    /// Appends an id. A 32-bit list that is given an id that does not fit (negative, or past
    /// 2^32 - 1: out of range of every table it is for, to be refused by the check naming it)
    /// becomes 64-bit.
    pub fn push(&mut self, id: i64) {
        match self {
            Ids::U32(v) => match u32::try_from(id) {
                Ok(x) => v.push(x),
                Err(_) => {
                    let mut wide: Vec<i64> = v.iter().map(|&x| i64::from(x)).collect();
                    wide.push(id);
                    *self = Ids::I64(wide);
                }
            },
            Ids::I64(v) => v.push(id),
        }
    }

    /// The ids at positions `range`, in the same width.
    pub fn slice(&self, range: Range<usize>) -> Ids {
        match self {
            Ids::U32(v) => Ids::U32(v[range].to_vec()),
            Ids::I64(v) => Ids::I64(v[range].to_vec()),
        }
    }
}

impl From<Vec<i64>> for Ids {
    fn from(v: Vec<i64>) -> Ids {
        Ids::I64(v)
    }
}

impl From<Vec<u32>> for Ids {
    fn from(v: Vec<u32>) -> Ids {
        Ids::U32(v)
    }
}

/// The first key that appears twice: a scan for the few keys of a usual batch, a set past
/// them (linear in the number of keys, which a model may have by the million).
fn first_duplicate(keys: &[String]) -> Option<&String> {
    if keys.len() <= 32 {
        return keys
            .iter()
            .enumerate()
            .find(|(i, k)| keys[..*i].contains(k))
            .map(|(_, k)| k);
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter().find(|k| !seen.insert(k.as_str()))
}

/// A validated keyed jagged batch.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedJagged {
    keys: Vec<String>,
    batch_size: usize,
    offsets: Vec<usize>,
    ids: Ids,
    weights: Option<Vec<f32>>,
}

impl KeyedJagged {
    /// Builds a batch from per-(feature, sample) lengths.
    pub fn from_lengths(
        keys: Vec<String>,
        batch_size: usize,
        lengths: &[usize],
        ids: Ids,
        weights: Option<Vec<f32>>,
    ) -> Result<Self> {
        let expected = keys.len() * batch_size;
        if lengths.len() != expected {
            return Err(EmbedError::LengthsCount {
                got: lengths.len(),
                features: keys.len(),
                batch_size,
                expected,
            });
        }
        let mut offsets = Vec::with_capacity(expected + 1);
        let mut sum = 0usize;
        offsets.push(0);
        for &l in lengths {
            sum = sum.saturating_add(l);
            offsets.push(sum);
        }
        if sum != ids.len() {
            return Err(EmbedError::LengthsSum {
                sum,
                ids: ids.len(),
            });
        }
        Self::checked(keys, batch_size, offsets, ids, weights)
    }

    /// Builds a batch from offsets (`features x batch_size + 1` entries).
    pub fn from_offsets(
        keys: Vec<String>,
        batch_size: usize,
        offsets: Vec<usize>,
        ids: Ids,
        weights: Option<Vec<f32>>,
    ) -> Result<Self> {
        let expected = keys.len() * batch_size + 1;
        if offsets.len() != expected {
            return Err(EmbedError::OffsetsCount {
                got: offsets.len(),
                expected,
            });
        }
        if offsets[0] != 0 {
            return Err(EmbedError::OffsetsStart { first: offsets[0] });
        }
        for (i, w) in offsets.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(EmbedError::OffsetsDecreasing {
                    feature: keys[i / batch_size].clone(),
                    sample: i % batch_size,
                    from: w[0],
                    to: w[1],
                });
            }
        }
        let last = *offsets.last().expect("at least one offset");
        if last != ids.len() {
            return Err(EmbedError::OffsetsEnd {
                last,
                ids: ids.len(),
            });
        }
        Self::checked(keys, batch_size, offsets, ids, weights)
    }

    fn checked(
        keys: Vec<String>,
        batch_size: usize,
        offsets: Vec<usize>,
        ids: Ids,
        weights: Option<Vec<f32>>,
    ) -> Result<Self> {
        if let Some(k) = first_duplicate(&keys) {
            return Err(EmbedError::DuplicateKey { key: k.clone() });
        }
        if let Some(w) = &weights
            && w.len() != ids.len()
        {
            return Err(EmbedError::WeightsLen {
                weights: w.len(),
                ids: ids.len(),
            });
        }
        let kj = KeyedJagged {
            keys,
            batch_size,
            offsets,
            ids,
            weights,
        };
        if let Ids::I64(v) = &kj.ids
            && let Some(pos) = v.iter().position(|&x| x < 0)
        {
            let (feature, sample) = kj.locate(pos);
            return Err(EmbedError::NegativeId {
                feature: kj.keys[feature].clone(),
                sample,
                id: v[pos],
            });
        }
        Ok(kj)
    }

    /// A batch built from parts that were checked already (a merge of checked samples, a routed
    /// shard of a valid batch): offsets and ids consistent by construction, checked only in
    /// debug builds.
    /// Its offsets and ids, the rest dropped.
    pub(crate) fn into_buffers(self) -> (Vec<usize>, Ids) {
        (self.offsets, self.ids)
    }

    pub(crate) fn trusted(
        keys: Vec<String>,
        batch_size: usize,
        offsets: Vec<usize>,
        ids: Ids,
        weights: Option<Vec<f32>>,
    ) -> Self {
        debug_assert_eq!(offsets.len(), keys.len() * batch_size + 1);
        debug_assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
        debug_assert_eq!(offsets.last().copied(), Some(ids.len()));
        debug_assert!(weights.as_ref().is_none_or(|w| w.len() == ids.len()));
        KeyedJagged {
            keys,
            batch_size,
            offsets,
            ids,
            weights,
        }
    }

    /// The batch of samples `samples` (in that order, a sample may repeat): each feature's
    /// bags of those samples, their ids and weights copied.
    pub fn select(&self, samples: &[usize]) -> KeyedJagged {
        let b = self.batch_size;
        let mut offsets = Vec::with_capacity(self.keys.len() * samples.len() + 1);
        offsets.push(0);
        let mut ids = Ids::with_capacity(matches!(self.ids, Ids::U32(_)), samples.len());
        let mut weights = self.weights.as_ref().map(|_| Vec::new());
        for f in 0..self.keys.len() {
            for &s in samples {
                let r = self.offsets[f * b + s]..self.offsets[f * b + s + 1];
                match (&mut ids, &self.ids) {
                    (Ids::U32(o), Ids::U32(v)) => o.extend_from_slice(&v[r.clone()]),
                    (Ids::I64(o), Ids::I64(v)) => o.extend_from_slice(&v[r.clone()]),
                    (o, v) => r.clone().for_each(|i| o.push(v.get(i))),
                }
                if let (Some(o), Some(w)) = (&mut weights, &self.weights) {
                    o.extend_from_slice(&w[r.clone()]);
                }
                offsets.push(ids.len());
            }
        }
        KeyedJagged::trusted(self.keys.clone(), samples.len(), offsets, ids, weights)
    }

    /// The same batch carrying `weights` (one per id) instead of its current weights.
    pub fn with_weights(self, weights: Vec<f32>) -> Result<Self> {
        Self::checked(
            self.keys,
            self.batch_size,
            self.offsets,
            self.ids,
            Some(weights),
        )
    }

    /// The (feature index, sample) that id position `pos` belongs to.
    pub fn locate(&self, pos: usize) -> (usize, usize) {
        // The bag holding `pos` is the last one whose start is <= pos and which is non-empty.
        let bag = self.offsets.partition_point(|&o| o <= pos) - 1;
        (bag / self.batch_size.max(1), bag % self.batch_size.max(1))
    }

    /// Feature keys.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }
    /// Samples in the batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }
    /// Offsets, `features x batch_size + 1` entries.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }
    /// The flat ids.
    pub fn ids(&self) -> &Ids {
        &self.ids
    }
    /// Per-id weights, if any.
    pub fn weights(&self) -> Option<&[f32]> {
        self.weights.as_deref()
    }
    /// Id positions of feature `f`, sample `b`.
    pub fn bag(&self, f: usize, b: usize) -> Range<usize> {
        let i = f * self.batch_size + b;
        self.offsets[i]..self.offsets[i + 1]
    }
    /// Id positions of all samples of feature `f`.
    pub fn feature_range(&self, f: usize) -> Range<usize> {
        self.offsets[f * self.batch_size]..self.offsets[(f + 1) * self.batch_size]
    }
    /// Total number of ids.
    pub fn num_ids(&self) -> usize {
        self.ids.len()
    }
    /// Length of bag `(f, b)`.
    pub fn length(&self, f: usize, b: usize) -> usize {
        self.bag(f, b).len()
    }
}

/// A row id as the kernels read it.
pub trait RowIndex: Copy + Send + Sync + 'static {
    /// The row. Only called on validated ids (0 <= id < rows).
    fn idx(self) -> usize;
}

impl RowIndex for u32 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}

impl RowIndex for usize {
    #[inline(always)]
    fn idx(self) -> usize {
        self
    }
}

impl RowIndex for i64 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}

/// The position of the first id whose `key` is `rows` or more. A branch-free maximum first (it
/// vectorizes; an early-exit search does not, and cost 2% of an RM1 batch), the search only when
/// some id is out of range.
fn first_out_of_range<T: Copy>(v: &[T], key: impl Fn(T) -> u64, rows: u64) -> Option<usize> {
    let max = v.iter().fold(0u64, |m, &x| m.max(key(x)));
    if v.is_empty() || max < rows {
        return None;
    }
    v.iter().position(|&x| key(x) >= rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("f{i}")).collect()
    }

    #[test]
    fn duplicate_keys_are_found_among_few_and_many() {
        for n in [0, 1, 5, 32, 33, 1000] {
            assert_eq!(first_duplicate(&keys(n)), None, "{n}");
            if n < 2 {
                continue;
            }
            let mut k = keys(n);
            k[n - 1] = k[n / 2].clone();
            assert_eq!(first_duplicate(&k), Some(&k[n / 2]), "{n}");
        }
    }

    #[test]
    fn torchrec_example_offsets() {
        let kj = KeyedJagged::from_lengths(
            keys(2),
            3,
            &[2, 0, 1, 1, 1, 3],
            Ids::U32((0..8).collect()),
            None,
        )
        .unwrap();
        assert_eq!(kj.offsets(), &[0, 2, 2, 3, 4, 5, 8]);
        assert_eq!(kj.bag(1, 2), 5..8);
        assert_eq!(kj.feature_range(1), 3..8);
        assert_eq!(kj.locate(2), (0, 2));
        assert_eq!(kj.locate(5), (1, 2));
        let again = KeyedJagged::from_offsets(
            keys(2),
            3,
            vec![0, 2, 2, 3, 4, 5, 8],
            Ids::U32((0..8).collect()),
            None,
        )
        .unwrap();
        assert_eq!(kj, again);
    }

    #[test]
    fn select_keeps_each_chosen_samples_bags_in_order() {
        // Random lengths over 3 features and 7 samples, ids numbering the positions.
        let mut rng = 0x9e37_79b9_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (f, b) = (3, 7);
        let lengths: Vec<usize> = (0..f * b).map(|_| (next() % 4) as usize).collect();
        let n: usize = lengths.iter().sum();
        let weights: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        for narrow in [true, false] {
            let ids = match narrow {
                true => Ids::U32((0..n as u32).collect()),
                false => Ids::I64((0..n as i64).collect()),
            };
            let kj = KeyedJagged::from_lengths(keys(f), b, &lengths, ids, Some(weights.clone()))
                .unwrap();
            for samples in [vec![], vec![6], vec![4, 0, 4, 2]] {
                let got = kj.select(&samples);
                assert_eq!(got.batch_size(), samples.len());
                assert_eq!(matches!(got.ids(), Ids::U32(_)), narrow);
                for ft in 0..f {
                    for (k, &s) in samples.iter().enumerate() {
                        let want: Vec<i64> = kj.bag(ft, s).map(|i| kj.ids().get(i)).collect();
                        let have: Vec<i64> = got.bag(ft, k).map(|i| got.ids().get(i)).collect();
                        assert_eq!(have, want, "feature {ft}, sample {s}");
                        let ww: Vec<f32> = kj.bag(ft, s).map(|i| weights[i]).collect();
                        let gw: Vec<f32> =
                            got.bag(ft, k).map(|i| got.weights().unwrap()[i]).collect();
                        assert_eq!(gw, ww);
                    }
                }
            }
        }
    }

    #[test]
    fn structural_errors_name_the_problem() {
        let e =
            KeyedJagged::from_lengths(keys(2), 3, &[1, 1], Ids::U32(vec![0, 0]), None).unwrap_err();
        assert_eq!(
            e,
            EmbedError::LengthsCount {
                got: 2,
                features: 2,
                batch_size: 3,
                expected: 6
            }
        );
        let e =
            KeyedJagged::from_lengths(keys(1), 2, &[1, 2], Ids::U32(vec![0, 0]), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "lengths add up to 3 ids but 2 ids were given"
        );
        let e =
            KeyedJagged::from_lengths(keys(1), 2, &[1, 1], Ids::U32(vec![0, 0]), Some(vec![1.0]))
                .unwrap_err();
        assert_eq!(e, EmbedError::WeightsLen { weights: 1, ids: 2 });
        let e =
            KeyedJagged::from_lengths(keys(2), 2, &[1, 0, 0, 2], Ids::I64(vec![4, 5, -7]), None)
                .unwrap_err();
        assert_eq!(e.to_string(), "feature 'f1', sample 1: id -7 is negative");
        let e = KeyedJagged::from_offsets(keys(1), 3, vec![0, 2, 1, 2], Ids::U32(vec![0, 0]), None)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "offsets decrease at feature 'f0', sample 1: 2 -> 1"
        );
        let e = KeyedJagged::from_offsets(keys(1), 1, vec![1, 2], Ids::U32(vec![0, 0]), None)
            .unwrap_err();
        assert_eq!(e, EmbedError::OffsetsStart { first: 1 });
        let e = KeyedJagged::from_offsets(keys(1), 1, vec![0, 1], Ids::U32(vec![0, 0]), None)
            .unwrap_err();
        assert_eq!(e, EmbedError::OffsetsEnd { last: 1, ids: 2 });
        let e =
            KeyedJagged::from_offsets(keys(1), 2, vec![0, 1], Ids::U32(vec![0]), None).unwrap_err();
        assert_eq!(
            e,
            EmbedError::OffsetsCount {
                got: 2,
                expected: 3
            }
        );
        let e =
            KeyedJagged::from_lengths(vec!["a".into(), "a".into()], 0, &[], Ids::U32(vec![]), None)
                .unwrap_err();
        assert_eq!(e, EmbedError::DuplicateKey { key: "a".into() });
    }

    #[test]
    fn empty_batch_is_valid() {
        let kj = KeyedJagged::from_lengths(keys(3), 0, &[], Ids::I64(vec![]), None).unwrap();
        assert_eq!(kj.offsets(), &[0]);
        assert_eq!(kj.num_ids(), 0);
    }
}
