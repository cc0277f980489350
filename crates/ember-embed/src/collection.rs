//! A model's embedding tables and the sparse features that read them.
//!
//! Each feature names one table (several features may share a table). Pooled outputs are laid out
//! one f32 row per sample, features side by side in feature order: feature `f` occupies columns
//! `col_offset(f) .. col_offset(f) + dim(table(f))`.

use crate::error::{EmbedError, Result};
use crate::jagged::{Ids, KeyedJagged};
use crate::table::EmbeddingTable;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// A sparse feature: its key and the index of the table it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feature {
    pub name: String,
    pub table: usize,
}

/// Names one collection for the life of the process, so that a batch validated against one
/// collection (or a stager built for one) is refused by every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CollectionId(u64);

impl CollectionId {
    fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        CollectionId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Tables plus the features that read them.
#[derive(Debug)]
pub struct EmbeddingCollection {
    id: CollectionId,
    tables: Vec<EmbeddingTable>,
    features: Vec<Feature>,
    col_offsets: Vec<usize>,
    total_dim: usize,
}

/// A batch whose ids have been checked against a collection's tables. Only this type reaches the
/// kernels, which therefore never see an out-of-range id; it remembers the collection it was
/// checked against, and every other collection refuses it.
#[derive(Debug, Clone, Copy)]
pub struct CheckedView<'a> {
    kj: &'a KeyedJagged,
    coll: CollectionId,
}

impl<'a> CheckedView<'a> {
    /// The underlying batch.
    pub fn get(&self) -> &'a KeyedJagged {
        self.kj
    }

    /// The collection it was checked against.
    pub fn collection(&self) -> CollectionId {
        self.coll
    }

    /// A batch known to be valid for `coll` by construction (built from checked parts).
    pub(crate) fn trusted(kj: &'a KeyedJagged, coll: CollectionId) -> Self {
        CheckedView { kj, coll }
    }
}

impl EmbeddingCollection {
    /// Builds a collection; every feature must name an existing table and keys must be unique.
    pub fn new(tables: Vec<EmbeddingTable>, features: Vec<Feature>) -> Result<Self> {
        let mut col_offsets = Vec::with_capacity(features.len());
        let mut total_dim = 0;
        let mut names = std::collections::HashSet::with_capacity(features.len());
        for f in &features {
            if f.table >= tables.len() {
                return Err(EmbedError::NoSuchTable {
                    feature: f.name.clone(),
                    table: f.table,
                    tables: tables.len(),
                });
            }
            if !names.insert(f.name.as_str()) {
                return Err(EmbedError::DuplicateKey {
                    key: f.name.clone(),
                });
            }
            col_offsets.push(total_dim);
            total_dim += tables[f.table].dim();
        }
        Ok(EmbeddingCollection {
            id: CollectionId::next(),
            tables,
            features,
            col_offsets,
            total_dim,
        })
    }

    /// One feature per table, named after the table.
    pub fn one_feature_per_table(tables: Vec<EmbeddingTable>) -> Result<Self> {
        let features = tables
            .iter()
            .enumerate()
            .map(|(i, t)| Feature {
                name: t.name().to_string(),
                table: i,
            })
            .collect();
        Self::new(tables, features)
    }

    /// This collection's identity.
    pub fn id(&self) -> CollectionId {
        self.id
    }
    /// The tables.
    pub fn tables(&self) -> &[EmbeddingTable] {
        &self.tables
    }
    /// The tables, by value (to free them one at a time).
    pub fn into_tables(self) -> Vec<EmbeddingTable> {
        self.tables
    }
    /// Makes every in-memory table live ([`EmbeddingTable::make_live`]), so that row updates
    /// can be written into it while it is read (the tier does, when it follows a store's update
    /// streams). The tables keep their shapes and the features their tables.
    pub fn make_dram_tables_live(&mut self) -> crate::Result<()> {
        for t in &mut self.tables {
            if t.placement() == crate::Placement::Dram {
                t.make_live()?;
            }
        }
        Ok(())
    }
    /// The features.
    pub fn features(&self) -> &[Feature] {
        &self.features
    }
    /// The table feature `f` reads.
    pub fn table_of(&self, f: usize) -> &EmbeddingTable {
        &self.tables[self.features[f].table]
    }
    /// First output column of feature `f`.
    pub fn col_offset(&self, f: usize) -> usize {
        self.col_offsets[f]
    }
    /// Width of one pooled output row (sum of the features' dims).
    pub fn total_dim(&self) -> usize {
        self.total_dim
    }
    /// Feature names in order.
    pub fn feature_names(&self) -> Vec<String> {
        self.features.iter().map(|f| f.name.clone()).collect()
    }

    /// Checks that the batch has this collection's features in order and that every id is a row
    /// of its feature's table. The error names the feature, the sample and the id.
    pub fn check_view<'a>(&self, kj: &'a KeyedJagged) -> Result<CheckedView<'a>> {
        self.check_names(kj)?;
        // The position of the feature's first id out of range, if any.
        let first_bad = |f: usize| {
            let range = kj.feature_range(f);
            let rows64 = self.table_of(f).rows() as u64;
            let bad = kj.ids().first_out_of_range(range.clone(), rows64);
            bad.map(|p| (f, range.start + p))
        };
        let nf = self.features.len();
        // Batches of millions of ids (a GPU's batches) are checked a feature per thread; the
        // first bad id in feature order is reported either way.
        let bad = if kj.num_ids() >= PARALLEL_CHECK_IDS && nf > 1 {
            (0..nf).into_par_iter().find_map_first(first_bad)
        } else {
            (0..nf).find_map(first_bad)
        };
        if let Some((f, pos)) = bad {
            let table = self.table_of(f);
            let (_, sample) = kj.locate(pos);
            return Err(EmbedError::IdOutOfRange {
                feature: self.features[f].name.clone(),
                sample,
                id: kj.ids().get(pos),
                table: table.name().to_string(),
                rows: table.rows(),
            });
        }
        Ok(CheckedView { kj, coll: self.id })
    }

    /// [`EmbeddingCollection::check_view`] and the ids narrowed to 32 bits into `out`, in one pass
    /// over them: each feature's ids are copied and their maximum taken together (a GPU's batch
    /// reads its millions of ids once, not once to check and again to stage). `out` must hold
    /// [`KeyedJagged::num_ids`] ids and every table at most 2^32 rows, so that a checked id fits.
    /// On a bad id the error is [`EmbeddingCollection::check_view`]'s, and `out` holds garbage.
    pub fn check_view_narrowed<'a>(
        &self,
        kj: &'a KeyedJagged,
        out: &mut [u32],
    ) -> Result<CheckedView<'a>> {
        let wide = self.tables.iter().any(|t| t.rows() as u64 > 1 << 32);
        if wide {
            return Err(EmbedError::BadOption {
                option: "ids narrowed to 32 bits",
                reason: "a table has over 2^32 rows".into(),
            });
        }
        if out.len() != kj.num_ids() {
            return Err(EmbedError::OutputLen {
                got: out.len(),
                batch_size: kj.batch_size(),
                dim: 1,
                expected: kj.num_ids(),
            });
        }
        let nf = self.features.len();
        if kj.keys().len() != nf {
            return self.check_view(kj);
        }
        // Each feature's slice of `out`, so that features go to threads without sharing.
        let mut parts = Vec::with_capacity(nf);
        let mut rest = out;
        for f in 0..nf {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(kj.feature_range(f).len());
            parts.push((f, head));
            rest = tail;
        }
        let narrow = |(f, dst): (usize, &mut [u32])| -> bool {
            let range = kj.feature_range(f);
            let max = match kj.ids() {
                Ids::U32(v) => narrow_max(&v[range], dst, u64::from),
                // As u64, negative ids are above any row count.
                Ids::I64(v) => narrow_max(&v[range], dst, |x| x as u64),
            };
            dst.is_empty() || max < self.table_of(f).rows() as u64
        };
        let ok = if kj.num_ids() >= PARALLEL_CHECK_IDS && nf > 1 {
            parts
                .into_par_iter()
                .map(narrow)
                .reduce(|| true, |a, b| a & b)
        } else {
            parts.into_iter().map(narrow).fold(true, |a, b| a & b)
        };
        match ok {
            // Names and order checked, every id in range: what validate would have found.
            true => self
                .check_names(kj)
                .map(|()| CheckedView { kj, coll: self.id }),
            // validate names the feature, the sample and the id.
            false => self.check_view(kj),
        }
    }

    /// Refuses a batch checked against another collection.
    pub(crate) fn check_own(&self, batch: CheckedView<'_>) -> Result<()> {
        if batch.coll == self.id {
            Ok(())
        } else {
            Err(EmbedError::WrongCollection)
        }
    }
}

impl EmbeddingCollection {
    /// Counts a check, and refuses a batch whose features are not this collection's, in order.
    fn check_names(&self, kj: &KeyedJagged) -> Result<()> {
        ID_CHECKS.fetch_add(1, Ordering::Relaxed);
        if kj.keys().len() != self.features.len()
            || kj
                .keys()
                .iter()
                .zip(&self.features)
                .any(|(k, f)| *k != f.name)
        {
            return Err(EmbedError::KeysMismatch {
                got: kj.keys().to_vec(),
                expected: self.feature_names(),
            });
        }
        Ok(())
    }
}

/// `dst[i] = src[i]` narrowed to 32 bits; returns the largest `key(src[i])` (0 when empty). One
/// branch-free loop: it vectorizes.
fn narrow_max<T: Copy>(src: &[T], dst: &mut [u32], key: impl Fn(T) -> u64) -> u64 {
    debug_assert_eq!(src.len(), dst.len());
    let mut max = 0u64;
    for (d, &s) in dst.iter_mut().zip(src) {
        let k = key(s);
        max = max.max(k);
        *d = k as u32;
    }
    max
}

/// Ids in a batch from which [`EmbeddingCollection::check_view`] checks features in parallel.
pub const PARALLEL_CHECK_IDS: usize = 1 << 20;

/// How many times ids were checked against a collection ([`EmbeddingCollection::check_view`],
/// [`EmbeddingCollection::check_samples`]) in this process: lets tests prove that a served
/// request's ids are checked exactly once.
pub(crate) static ID_CHECKS: AtomicU64 = AtomicU64::new(0);

/// The number of id checks so far in this process (see [`ID_CHECKS`]); for tests.
#[doc(hidden)]
pub fn id_checks() -> u64 {
    ID_CHECKS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::PagePolicy;
    use crate::dtype::DType;

    #[test]
    fn check_view_narrowed_copies_every_id_or_fails_as_check_view_does() {
        use rand::{Rng, SeedableRng};
        let c = coll();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..200 {
            let batch = rng.random_range(0..6usize);
            let mut lengths = Vec::new();
            let mut ids = Vec::new();
            for rows in [10i64, 3, 10] {
                for _ in 0..batch {
                    let n = rng.random_range(0..4usize);
                    lengths.push(n);
                    for _ in 0..n {
                        // Mostly in range; now and then past the end (negative ids are
                        // refused when the batch is built).
                        let id = match rng.random_range(0..40) {
                            0 => rows,
                            1 => 1 << 33,
                            _ => rng.random_range(0..rows),
                        };
                        ids.push(id);
                    }
                }
            }
            let kj = KeyedJagged::from_lengths(
                vec!["x".into(), "y".into(), "z".into()],
                batch,
                &lengths,
                Ids::I64(ids.clone()),
                None,
            )
            .unwrap();
            let mut out = vec![u32::MAX; kj.num_ids()];
            let fused = c.check_view_narrowed(&kj, &mut out).map(|_| ());
            let plain = c.check_view(&kj).map(|_| ());
            assert_eq!(
                fused.as_ref().map_err(|e| e.to_string()),
                plain.as_ref().map_err(|e| e.to_string()),
                "round {round}"
            );
            if plain.is_ok() {
                let want: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
                assert_eq!(out, want, "round {round}");
            }
        }
        let kj = KeyedJagged::from_lengths(
            vec!["x".into(), "y".into(), "z".into()],
            1,
            &[1, 1, 1],
            Ids::U32(vec![9, 2, 9]),
            None,
        )
        .unwrap();
        let mut short = vec![0u32; 2];
        assert!(c.check_view_narrowed(&kj, &mut short).is_err());
        let mut out = vec![0u32; 3];
        c.check_view_narrowed(&kj, &mut out).unwrap();
        assert_eq!(out, [9, 2, 9]);
    }

    fn coll() -> EmbeddingCollection {
        let a = EmbeddingTable::zeroed("a", 10, 4, DType::F32, PagePolicy::Small).unwrap();
        let b = EmbeddingTable::zeroed("b", 3, 2, DType::Int8, PagePolicy::Small).unwrap();
        let feats = vec![
            Feature {
                name: "x".into(),
                table: 0,
            },
            Feature {
                name: "y".into(),
                table: 1,
            },
            Feature {
                name: "z".into(),
                table: 0,
            },
        ];
        EmbeddingCollection::new(vec![a, b], feats).unwrap()
    }

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn layout_and_shared_tables() {
        let c = coll();
        assert_eq!(c.total_dim(), 10);
        assert_eq!(
            (c.col_offset(0), c.col_offset(1), c.col_offset(2)),
            (0, 4, 6)
        );
        assert_eq!(c.table_of(2).name(), "a");
    }

    #[test]
    fn out_of_range_ids_name_feature_sample_and_id() {
        let c = coll();
        // feature y (3 rows), sample 1 has id 3.
        let kj = KeyedJagged::from_lengths(
            keys(&["x", "y", "z"]),
            2,
            &[1, 0, 1, 2, 0, 1],
            Ids::I64(vec![9, 2, 0, 3, 5]),
            None,
        )
        .unwrap();
        let e = c.check_view(&kj).unwrap_err();
        assert_eq!(
            e.to_string(),
            "feature 'y', sample 1: id 3 is out of range for table 'b' with 3 rows"
        );
        let kj = KeyedJagged::from_lengths(
            keys(&["x", "y", "z"]),
            1,
            &[1, 0, 1],
            Ids::U32(vec![10, 5]),
            None,
        )
        .unwrap();
        let e = c.check_view(&kj).unwrap_err();
        assert_eq!(
            e,
            EmbedError::IdOutOfRange {
                feature: "x".into(),
                sample: 0,
                id: 10,
                table: "a".into(),
                rows: 10
            }
        );
        let ok = KeyedJagged::from_lengths(
            keys(&["x", "y", "z"]),
            1,
            &[1, 0, 1],
            Ids::U32(vec![9, 5]),
            None,
        )
        .unwrap();
        assert!(c.check_view(&ok).is_ok());
    }

    #[test]
    fn large_batches_checked_in_parallel_report_the_first_bad_id_in_feature_order() {
        let c = coll();
        // Three features of `per` ids each, over the parallel threshold together; feature y
        // (3 rows) and feature z (10 rows) both hold a bad id: y's is the one reported.
        let per = PARALLEL_CHECK_IDS / 2;
        let mut ids: Vec<i64> = (0..3 * per).map(|i| (i % 3) as i64).collect();
        let ok = KeyedJagged::from_lengths(
            keys(&["x", "y", "z"]),
            1,
            &[per, per, per],
            Ids::I64(ids.clone()),
            None,
        )
        .unwrap();
        assert!(c.check_view(&ok).is_ok());
        ids[2 * per + 7] = 10; // z
        ids[per + per / 2] = 5; // y
        ids[per + per - 1] = 3; // y, later
        let bad = KeyedJagged::from_lengths(
            keys(&["x", "y", "z"]),
            1,
            &[per, per, per],
            Ids::I64(ids),
            None,
        )
        .unwrap();
        assert_eq!(
            c.check_view(&bad).unwrap_err().to_string(),
            "feature 'y', sample 0: id 5 is out of range for table 'b' with 3 rows"
        );
    }

    #[test]
    fn wrong_keys_and_bad_features_are_rejected() {
        let c = coll();
        let kj = KeyedJagged::from_lengths(keys(&["x", "z", "y"]), 0, &[], Ids::U32(vec![]), None)
            .unwrap();
        assert!(matches!(
            c.check_view(&kj),
            Err(EmbedError::KeysMismatch { .. })
        ));
        let t = EmbeddingTable::zeroed("a", 1, 1, DType::F32, PagePolicy::Small).unwrap();
        let e = EmbeddingCollection::new(
            vec![t],
            vec![Feature {
                name: "q".into(),
                table: 1,
            }],
        )
        .unwrap_err();
        assert_eq!(
            e,
            EmbedError::NoSuchTable {
                feature: "q".into(),
                table: 1,
                tables: 1
            }
        );
    }
}
