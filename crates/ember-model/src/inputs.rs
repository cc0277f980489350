//! The first half of the seam a server (or `predict`, or a benchmark) sees: inputs checked
//! against a model exactly once, then batched and prepared for an [`crate::Engine`].
//!
//! ```text
//! request ──check_samples──> Samples ─┐
//! request ──check_samples──> Samples ─┼─merge──> Batch ──prepare──> Prepared ──Engine::run──> scores
//! (dense, KeyedJagged) ──────batch────┘          (checked)    (tier rows staged)
//! ```
//!
//! - [`Model::check_samples`] checks one request's samples when they arrive (dense shape and
//!   finiteness, one length per (feature, sample), every id a row of its table), so that one bad
//!   request is refused alone and never fails the batch it would have joined; errors name the
//!   input, the sample and the value.
//! - [`Model::merge`] joins checked requests into one [`Batch`] without checking them again.
//! - [`Model::batch`] / [`Model::batch_owned`] check a whole batch at once (`predict`,
//!   benchmarks, tests).
//! - [`Model::prepare`] stages the batch's rows from the SSD tier, if any table is there; it may
//!   run on another thread, one or more batches ahead of the engine ([`crate::run_ahead`]).
//!
//! Nothing after this point checks ids again: the types carry the proof.

use rayon::prelude::*;
use std::borrow::Cow;
use std::time::{Duration, Instant};

use ember_embed::{
    CheckedBatch, CheckedSamples, CheckedView, EmbedError, Ids, KeyedJagged, Lengths, StagedBatch,
};

use crate::error::{ModelError, Result};
use crate::model::{BatchBuffers, Model};

/// What a model takes: what a request must match.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    /// Dense features per sample.
    pub dense_in: usize,
    /// Sparse feature names, in the model's order.
    pub features: Vec<String>,
    /// Rows of the table each feature reads (ids run from 0 to rows - 1).
    pub rows: Vec<usize>,
    /// Whether every table has at most 2^32 rows: checked samples then keep their ids 32-bit,
    /// and a decoder that builds them so ([`Ids::with_capacity`]) spares the conversion.
    pub narrow_ids: bool,
}

impl Inputs {
    /// Whether the model takes Criteo rows (13 dense, 26 sparse features).
    pub fn is_criteo(&self) -> bool {
        self.dense_in == crate::criteo::DENSE && self.features.len() == crate::criteo::SPARSE
    }
}

/// The inputs of one request's samples, checked against a model: `dense` is `[n, dense_in]`
/// and finite; for feature `f`, sample `s` has `lengths()[f * n + s]` ids, stored feature-major
/// in `ids()`, each a row of the feature's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    dense: Vec<f32>,
    sparse: CheckedSamples,
}

impl Samples {
    /// Samples.
    pub fn len(&self) -> usize {
        self.sparse.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sparse.is_empty()
    }
    /// Dense features, sample after sample.
    pub fn dense(&self) -> &[f32] {
        &self.dense
    }
    /// Ids per (feature, sample), feature-major.
    pub fn lengths(&self) -> Cow<'_, [u32]> {
        self.sparse.lengths()
    }
    /// The ids, feature-major (32-bit when every table has at most 2^32 rows).
    pub fn ids(&self) -> &Ids {
        self.sparse.ids()
    }

    /// The samples in pieces of at most `max`, in order, each still checked (a request larger
    /// than a batch runs as several). Each piece is copied out when it is asked for.
    pub fn pieces(&self, max: usize) -> impl Iterator<Item = Samples> + '_ {
        let max = max.max(1);
        let width = self.dense.len().checked_div(self.len()).unwrap_or(0);
        self.sparse
            .pieces(max)
            .zip(
                self.dense
                    .chunks(max.saturating_mul(width.max(1)))
                    .chain(std::iter::repeat(&[][..])),
            )
            .map(|(sparse, dense)| Samples {
                dense: dense.to_vec(),
                sparse,
            })
    }
}

/// The sparse half of a batch: borrowed from the caller, or owned (a merge of requests).
#[derive(Debug)]
enum Sparse<'a> {
    Borrowed(CheckedView<'a>),
    Owned(CheckedBatch),
}

/// A batch of a model's inputs, checked: dense `[n, dense_in]` finite values, and sparse ids in
/// range (borrowed from the caller or owned).
#[derive(Debug)]
pub struct Batch<'a> {
    dense: Cow<'a, [f32]>,
    sparse: Sparse<'a>,
}

impl Batch<'_> {
    /// Samples.
    pub fn len(&self) -> usize {
        self.sparse().batch_size()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Dense features, sample after sample.
    pub fn dense(&self) -> &[f32] {
        &self.dense
    }
    /// The sparse features.
    pub fn sparse(&self) -> &KeyedJagged {
        self.valid().get()
    }
    /// The sparse features as the embedding stage takes them.
    pub fn valid(&self) -> CheckedView<'_> {
        match &self.sparse {
            Sparse::Borrowed(v) => *v,
            Sparse::Owned(c) => c.view(),
        }
    }
}

impl Batch<'_> {
    /// Its buffers, where it owns them (a merged batch), for the next merge.
    pub fn into_buffers(self) -> Option<BatchBuffers> {
        match (self.dense, self.sparse) {
            (Cow::Owned(dense), Sparse::Owned(c)) => Some(BatchBuffers {
                dense,
                sparse: c.into_buffers(),
            }),
            _ => None,
        }
    }
}

/// A batch ready for an engine: checked, and its rows on the SSD tier staged.
#[derive(Debug)]
pub struct Prepared<'a> {
    batch: Batch<'a>,
    staged: Option<StagedBatch>,
    staging: Duration,
}

impl<'a> Prepared<'a> {
    /// The batch.
    pub fn batch(&self) -> &Batch<'a> {
        &self.batch
    }
    /// The batch, its staged rows dropped.
    pub fn into_batch(self) -> Batch<'a> {
        self.batch
    }
    /// Samples.
    pub fn len(&self) -> usize {
        self.batch.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }
    /// The staged tier rows (`None` when no table is on the tier).
    pub fn staged(&self) -> Option<&StagedBatch> {
        self.staged.as_ref()
    }
    /// How long staging took.
    pub fn staging_time(&self) -> Duration {
        self.staging
    }
}

impl Model {
    /// What the model takes: dense width, features and their tables' sizes.
    pub fn inputs(&self) -> Inputs {
        let coll = self.embeddings();
        Inputs {
            dense_in: self.config().dense_in,
            features: self.feature_names(),
            rows: match self.sequences() {
                Some(s) => s.rows().to_vec(),
                None => (0..coll.features().len())
                    .map(|f| coll.table_of(f).rows())
                    .collect(),
            },
            narrow_ids: coll.narrow_ids(),
        }
    }

    /// Checks one request's `n` samples (see [`Samples`]); errors name the input, the sample
    /// and the value, as a client should read them.
    pub fn check_samples(
        &self,
        n: usize,
        dense: Vec<f32>,
        lengths: impl Into<Lengths>,
        ids: impl Into<Ids>,
    ) -> Result<Samples> {
        let dense_in = self.config().dense_in;
        if dense.len() != n.saturating_mul(dense_in) {
            return Err(ModelError::Input(format!(
                "dense has {} values; {n} samples of {dense_in} dense features need {}",
                dense.len(),
                n.saturating_mul(dense_in)
            )));
        }
        check_finite(&dense, dense_in)?;
        let (lengths, ids) = (lengths.into(), ids.into());
        let Some(seqs) = self.sequences() else {
            let sparse = self
                .embeddings()
                .check_samples(n, lengths, ids)
                .map_err(request_error)?;
            return Ok(Samples { dense, sparse });
        };
        let nf = seqs.names().len();
        if let Lengths::Each(v) = &lengths
            && v.len() != nf.saturating_mul(n)
        {
            return Err(request_error(EmbedError::LengthsCount {
                got: v.len(),
                features: nf,
                batch_size: n,
                expected: nf.saturating_mul(n),
            }));
        }
        let s = seqs.spread(
            n,
            |i| match &lengths {
                Lengths::Each(v) => v[i] as usize,
                Lengths::Ones => 1,
            },
            &ids,
        )?;
        let sparse = self
            .embeddings()
            .check_samples(n, s.lengths, s.ids)
            .map_err(request_error)?;
        Ok(Samples {
            dense: seqs.widen(&dense, dense_in, &s.seq_lengths),
            sparse,
        })
    }

    /// Joins checked requests into one batch, their samples in order, without checking them
    /// again.
    pub fn merge(&self, parts: &[&Samples]) -> Result<Batch<'static>> {
        self.merge_reusing(parts, None)
    }

    /// [`Model::merge`] into the buffers of a batch merged before ([`Batch::into_buffers`]).
    pub fn merge_reusing(
        &self,
        parts: &[&Samples],
        reuse: Option<BatchBuffers>,
    ) -> Result<Batch<'static>> {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        let (mut dense, sparse_bufs) = match reuse {
            Some(b) => (b.dense, Some(b.sparse)),
            None => (Vec::new(), None),
        };
        dense.clear();
        dense.reserve(n * self.dense_width());
        for p in parts {
            dense.extend_from_slice(&p.dense);
        }
        let sparse: Vec<&CheckedSamples> = parts.iter().map(|p| &p.sparse).collect();
        Ok(Batch {
            dense: Cow::Owned(dense),
            sparse: Sparse::Owned(self.embeddings().merge_reusing(&sparse, sparse_bufs)?),
        })
    }

    /// Checks a batch borrowed from the caller: `dense` (`[B, dense_in]`, finite) and `sparse`
    /// (the model's features, batch `B`, ids in range).
    pub fn batch<'a>(&self, dense: &'a [f32], sparse: &'a KeyedJagged) -> Result<Batch<'a>> {
        self.check_dense(dense, sparse.batch_size())?;
        if self.sequences().is_some() {
            return self.spread_batch(dense, sparse);
        }
        Ok(Batch {
            dense: Cow::Borrowed(dense),
            sparse: Sparse::Borrowed(self.embeddings().check_view(sparse)?),
        })
    }

    /// [`Model::batch`] for a batch the caller hands over.
    pub fn batch_owned(&self, dense: Vec<f32>, sparse: KeyedJagged) -> Result<Batch<'static>> {
        self.check_dense(&dense, sparse.batch_size())?;
        if self.sequences().is_some() {
            return self.spread_batch(&dense, &sparse);
        }
        Ok(Batch {
            dense: Cow::Owned(dense),
            sparse: Sparse::Owned(self.embeddings().check(sparse)?),
        })
    }

    /// [`Model::batch`] of a model with sequence features: the batch spread over the embedding
    /// stage's features (`sequence.rs`), its dense rows widened by the sequences' lengths.
    fn spread_batch(&self, dense: &[f32], sparse: &KeyedJagged) -> Result<Batch<'static>> {
        let seqs = self.sequences().expect("a model with sequence features");
        if sparse.keys() != seqs.names() {
            return Err(EmbedError::KeysMismatch {
                expected: seqs.names().to_vec(),
                got: sparse.keys().to_vec(),
            }
            .into());
        }
        if sparse.weights().is_some() {
            return Err(ModelError::Input(
                "per-id weights are not taken by a model with sequence features".into(),
            ));
        }
        let n = sparse.batch_size();
        let off = sparse.offsets();
        let s = seqs.spread(n, |i| off[i + 1] - off[i], sparse.ids())?;
        let lengths: Vec<usize> = s.lengths.iter().map(|&l| l as usize).collect();
        let kj =
            KeyedJagged::from_lengths(self.embeddings().feature_names(), n, &lengths, s.ids, None)?;
        Ok(Batch {
            dense: Cow::Owned(seqs.widen(dense, self.config().dense_in, &s.seq_lengths)),
            sparse: Sparse::Owned(self.embeddings().check(kj)?),
        })
    }

    /// Stages the batch's rows on the SSD tier (nothing when no table is there), and records its
    /// lookups when [`Model::record_accesses`] asked for it.
    pub fn prepare<'a>(&self, batch: Batch<'a>) -> Result<Prepared<'a>> {
        if let Some(r) = self.recorder() {
            r.record(self.embeddings(), batch.valid());
        }
        let t = Instant::now();
        let staged = match self.stager().is_active() {
            true => Some(self.stager().stage(self.embeddings(), batch.valid())?),
            false => None,
        };
        Ok(Prepared {
            batch,
            staged,
            staging: t.elapsed(),
        })
    }

    /// [`Model::batch`]'s check of the dense values, copying them into `dst` in the same pass
    /// (a GPU stages its batch in page-locked memory: each value is read once, not once to
    /// check and again to copy). `dst` must be as long as `dense`; on an error it holds garbage.
    pub fn check_dense_into(&self, dense: &[f32], batch: usize, dst: &mut [f32]) -> Result<()> {
        if dst.len() != dense.len() {
            return Err(ModelError::Input(format!(
                "staging {} dense values into room for {}",
                dense.len(),
                dst.len()
            )));
        }
        let copy = |(d, s): (&mut [f32], &[f32])| {
            d.copy_from_slice(s);
            s.chunks(64)
                .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
        };
        let finite = if dense.len() >= ember_embed::PARALLEL_CHECK_IDS {
            dst.par_chunks_mut(1 << 16)
                .zip(dense.par_chunks(1 << 16))
                .map(copy)
                .reduce(|| true, |a, b| a & b)
        } else {
            copy((dst, dense))
        };
        match finite {
            // The shape's check and the finite value's name.
            true => self.check_dense_shape(dense, batch),
            false => self.check_dense(dense, batch),
        }
    }

    /// Dense values of a batch of `batch` samples: a multiple of `dense_in`, one row per
    /// sample, finite.
    fn check_dense(&self, dense: &[f32], batch: usize) -> Result<()> {
        self.check_dense_shape(dense, batch)?;
        check_finite(dense, self.config().dense_in)
    }

    /// A multiple of `dense_in` values, one row per sample of `batch`.
    fn check_dense_shape(&self, dense: &[f32], batch: usize) -> Result<()> {
        let n = self.config().dense_in;
        if !dense.len().is_multiple_of(n) {
            return Err(ModelError::Input(format!(
                "dense has {} values, not a multiple of the model's {n} dense features",
                dense.len()
            )));
        }
        if dense.len() / n != batch {
            return Err(ModelError::Input(format!(
                "dense has {} samples but the sparse features have {batch}",
                dense.len() / n
            )));
        }
        Ok(())
    }
}

/// Refuses a dense value that is not finite, naming its feature and sample. A branch-free scan
/// first (it vectorizes; an early-exit search does not), the position only when some value is
/// not finite.
fn check_finite(dense: &[f32], dense_in: usize) -> Result<()> {
    let finite = |d: &[f32]| {
        d.chunks(64)
            .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
    };
    // Millions of values (a GPU's batches): a slice per thread.
    let all_finite = if dense.len() >= ember_embed::PARALLEL_CHECK_IDS {
        dense.par_chunks(1 << 16).all(finite)
    } else {
        finite(dense)
    };
    if !all_finite && let Some(i) = dense.iter().position(|v| !v.is_finite()) {
        let n = dense_in.max(1);
        return Err(ModelError::Input(format!(
            "dense feature {} of sample {} is {} (must be finite)",
            i % n,
            i / n,
            dense[i]
        )));
    }
    Ok(())
}

/// A request's sparse inputs refused by the embedding stage, said as the client sent them.
fn request_error(e: EmbedError) -> ModelError {
    ModelError::Input(match e {
        EmbedError::LengthsCount {
            got,
            features,
            batch_size,
            expected,
        } => format!(
            "{got} lengths for {batch_size} samples of {features} sparse features (need {expected})"
        ),
        EmbedError::LengthsSum { sum, ids } => {
            format!("the lengths add up to {sum} ids but {ids} ids were sent")
        }
        EmbedError::IdOutOfRange {
            feature,
            sample,
            id,
            rows,
            ..
        } => format!(
            "{feature}: id {id} of sample {sample} is out of range (the table has {rows} rows)"
        ),
        e => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::check_finite;

    #[test]
    fn non_finite_dense_values_are_named_below_and_above_the_parallel_threshold() {
        for n in [13 * 5, ember_embed::PARALLEL_CHECK_IDS + 13 * 7] {
            let n = n - n % 13;
            let mut dense: Vec<f32> = (0..n).map(|i| (i % 17) as f32 - 8.0).collect();
            assert!(check_finite(&dense, 13).is_ok(), "n = {n}");
            let at = n - 13 + 4; // the last sample, feature 4
            dense[at] = f32::NAN;
            dense[n - 1] = f32::INFINITY;
            let e = check_finite(&dense, 13).unwrap_err().to_string();
            let last = n / 13 - 1;
            let want = format!("dense feature 4 of sample {last} is NaN (must be finite)");
            assert!(e.ends_with(&want), "n = {n}: {e}");
        }
    }
}
