//! Batches handed over in page-locked memory and checked on the device.
//!
//! [`GpuPredictor::submit`] reads every id on the host twice over: once to check it, once to
//! narrow it into page-locked memory (one pass, fused). A caller that already keeps its inputs
//! in page-locked memory (PyTorch's `pin_memory()`; a loader that decodes into such buffers)
//! should not pay even that: [`GpuPredictor::pin`] makes a [`PinnedBatch`] once, and
//! [`GpuPredictor::submit_pinned`] copies it to the device as it is, with no host pass over
//! its ids or values. The device then checks it before any kernel reads a table
//! (`ember_check_inputs`): an id not below its table's rows is replaced by row 0 and its
//! position kept, a dense value that is not finite is kept likewise. [`GpuPredictor::collect`]
//! then refuses the batch with the error the host's check would have given, word for word, and
//! returns no score of it.

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use ember_embed::{EmbedError, Ids, KeyedJagged};
use ember_model::ModelError;

use super::GpuPredictor;
use crate::error::{CudaError, DriverCtx, Result};
use crate::staging::{Pinned, fill};

/// A batch in page-locked memory, laid out as the device reads it. Immutable once made; a slot
/// in flight keeps it alive (it is reference-counted).
#[derive(Debug, Clone)]
pub struct PinnedBatch(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    batch: usize,
    dense: Pinned<f32>,
    n_dense: usize,
    ids: Pinned<i64>,
    n_ids: usize,
    offsets: Pinned<i64>,
    /// Where each feature's ids start, and the end: `features + 1` values.
    starts: Pinned<i64>,
    /// The offsets on the host, to name the sample of a bad id.
    host_offsets: Vec<usize>,
    keys: Vec<String>,
}

impl PinnedBatch {
    /// Samples.
    pub fn batch_size(&self) -> usize {
        self.0.batch
    }

    /// Refuses a batch pinned for another model's shape (its features or dense width).
    pub(super) fn check_fits(&self, features: &[String], dense_in: usize) -> Result<()> {
        let i = &self.0;
        if i.keys != features || i.n_dense != i.batch * dense_in {
            return Err(CudaError::Input(
                "the page-locked batch was made for another model's features or dense width".into(),
            ));
        }
        Ok(())
    }

    pub(super) fn dense(&self) -> Result<&[f32]> {
        self.0.dense.peek(self.0.n_dense)
    }

    pub(super) fn ids(&self) -> Result<&[i64]> {
        self.0.ids.peek(self.0.n_ids)
    }

    pub(super) fn offsets(&self) -> Result<&[i64]> {
        self.0.offsets.peek(self.0.host_offsets.len())
    }

    pub(super) fn starts(&self) -> Result<&[i64]> {
        self.0.starts.peek(self.0.keys.len() + 1)
    }
}

/// `u64::MAX`: no bad position was found.
const NONE_BAD: u64 = u64::MAX;

impl GpuPredictor {
    /// Copies `dense` and `sparse` once into page-locked memory laid out as the device reads
    /// them (ids as 64 bits). Only their shape is checked here (the features are the model's,
    /// in order; one row of dense values per sample; no per-id weights): ids and values are
    /// checked on the device at each [`GpuPredictor::submit_pinned`].
    pub fn pin(&self, dense: &[f32], sparse: &KeyedJagged) -> Result<PinnedBatch> {
        let model = &self.m.model;
        let names = model.feature_names();
        if sparse.keys() != names.as_slice() {
            return Err(EmbedError::KeysMismatch {
                got: sparse.keys().to_vec(),
                expected: names,
            }
            .into());
        }
        if sparse.weights().is_some() {
            return Err(CudaError::Input(
                "a page-locked batch carries no per-id weights: submit it instead".into(),
            ));
        }
        let batch = sparse.batch_size();
        let dense_in = model.config().dense_in;
        if dense.len() != batch * dense_in {
            return Err(ModelError::Input(format!(
                "dense has {} values; {batch} samples of {dense_in} dense features need {}",
                dense.len(),
                batch * dense_in
            ))
            .into());
        }
        let ctx = self.m.gpu.context();
        let mut p_dense = Pinned::default();
        fill(p_dense.get(ctx, dense.len())?, dense, |v| v);
        let mut p_ids = Pinned::default();
        let h = p_ids.get(ctx, sparse.num_ids())?;
        match sparse.ids() {
            Ids::I64(v) => fill(h, v, |i| i),
            Ids::U32(v) => fill(h, v, i64::from),
        }
        let mut p_offsets = Pinned::default();
        fill(
            p_offsets.get(ctx, sparse.offsets().len())?,
            sparse.offsets(),
            |o| o as i64,
        );
        let nf = names.len();
        let starts: Vec<i64> = (0..=nf)
            .map(|f| sparse.offsets()[f * batch] as i64)
            .collect();
        let mut p_starts = Pinned::default();
        fill(p_starts.get(ctx, starts.len())?, &starts, |v| v);
        Ok(PinnedBatch(Arc::new(Inner {
            batch,
            dense: p_dense,
            n_dense: dense.len(),
            ids: p_ids,
            n_ids: sparse.num_ids(),
            offsets: p_offsets,
            starts: p_starts,
            host_offsets: sparse.offsets().to_vec(),
            keys: sparse.keys().to_vec(),
        })))
    }

    /// Enqueues the device's check of slot `si`'s inputs (its ids, in the embedding run's
    /// 64-bit buffer, and its dense values), ahead of the forward pass on the compute stream.
    pub(super) fn check_on_device(&mut self, si: usize, nf: usize) -> Result<()> {
        let gpu = self.m.gpu.clone();
        let stream = gpu.compute();
        let slot = &mut self.slots[si];
        let bad_ptr = crate::device::dptr(slot.bad.as_ref().expect("allocated at submit"), stream);
        // All ones: no bad position yet.
        // SAFETY: `bad` holds 2 u64 on this device; the stream orders the set before the check.
        unsafe { cudarc::driver::result::memset_d8_async(bad_ptr, 0xff, 16, stream.cu_stream()) }
            .ctx("clearing the input check")?;
        let ids = slot.run.ids64_ptr();
        let starts = crate::device::dptr(slot.starts.as_ref().expect("allocated"), stream);
        let rows = crate::device::dptr(&self.m.feature_rows, stream);
        let dense = crate::device::dptr(slot.dense.as_ref().expect("allocated"), stream);
        let n_dense = (slot.batch * self.m.model.config().dense_in) as i64;
        let nf_i = nf as i32;
        let mut b = stream.launch_builder(&self.check);
        b.arg(&ids)
            .arg(&starts)
            .arg(&rows)
            .arg(&nf_i)
            .arg(&dense)
            .arg(&n_dense)
            .arg(&bad_ptr);
        let cfg = LaunchConfig {
            grid_dim: (64, nf as u32 + 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: ids holds starts[nf] 64-bit ids, starts nf + 1 values, rows nf, dense n_dense
        // floats, bad 2 u64, all on this device and sized at submit.
        unsafe { b.launch(cfg) }.ctx("launching the input check")?;
        Ok(())
    }
}

/// The error of a batch the device refused: `bad` is `[first bad id position, first non-finite
/// dense value]` (`NONE_BAD` where none), `None` when it passed. Dense values first, then ids,
/// as [`ember_model::Model::batch`] checks them, with its words.
pub(super) fn refusal(
    model: &ember_model::Model,
    batch: &PinnedBatch,
    bad: [u64; 2],
) -> Result<Option<CudaError>> {
    let inner = &batch.0;
    if bad[1] != NONE_BAD {
        let i = bad[1] as usize;
        let n = model.config().dense_in.max(1);
        let v = batch.dense()?[i];
        return Ok(Some(
            ModelError::Input(format!(
                "dense feature {} of sample {} is {v} (must be finite)",
                i % n,
                i / n
            ))
            .into(),
        ));
    }
    if bad[0] == NONE_BAD {
        return Ok(None);
    }
    let pos = bad[0] as usize;
    let starts = batch.starts()?;
    let f = starts.partition_point(|&s| s as usize <= pos) - 1;
    // The bag holding `pos`: the last offset of feature f at or before it.
    let offs = &inner.host_offsets[f * inner.batch..=(f + 1) * inner.batch];
    let sample = offs.partition_point(|&o| o <= pos) - 1;
    let coll = model.embeddings();
    let table = coll.table_of(f);
    Ok(Some(
        EmbedError::IdOutOfRange {
            feature: inner.keys[f].clone(),
            sample,
            id: batch.ids()?[pos],
            table: table.name().to_string(),
            rows: table.rows(),
        }
        .into(),
    ))
}
