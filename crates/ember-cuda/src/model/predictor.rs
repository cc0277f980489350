//! [`GpuPredictor`]'s batches: two slots of device buffers, a batch copied into a free slot on
//! the copy stream while the compute stream runs the other, collected in order; and the
//! [`Engine`] the server and `predict` run.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaEvent, CudaSlice};
use ember_model::{Batch, Engine, Model, ModelError, Prepared, StageTimes, sigmoid};

use super::{DevInteraction, GpuModel, GpuPredictor, Slot};
use crate::device::{Gpu, TIMED, dptr};
use crate::embed::Variant;
use crate::error::{CudaError, DriverCtx, Result};
use crate::kernels::MODEL_SRC;
use crate::staging::{Pinned, fill};
use crate::tune::TuneCache;
use ember_embed::KeyedJagged;

/// Grows `buf` to at least `len` floats (allocation is ordered on the compute stream; the
/// caller synchronizes before a copy stream touches a new buffer).
pub(super) fn grow(gpu: &Gpu, buf: &mut Option<CudaSlice<f32>>, len: usize) -> Result<(u64, bool)> {
    let len = len.max(1);
    let mut grew = false;
    if buf.as_ref().is_none_or(|b| b.len() < len) {
        *buf = None;
        *buf = Some(
            gpu.compute()
                .alloc_zeros::<f32>(len.next_power_of_two())
                .ctx("allocating activations")?,
        );
        grew = true;
    }
    Ok((dptr(buf.as_ref().expect("allocated"), gpu.compute()), grew))
}

impl GpuPredictor {
    /// A predictor pooling with `variant`; tuned variants tune on the first batch (choices
    /// recorded in `cache`).
    pub fn new(m: Arc<GpuModel>, variant: Variant) -> Result<GpuPredictor> {
        let gpu = m.gpu.clone();
        let pooling = m.model.config().pooling.into();
        let ctx = gpu.context();
        let mut slots = Vec::new();
        for _ in 0..2 {
            let mut run = m.emb.runner(variant, pooling)?;
            run.upload_on_copy_stream();
            // Ordering events need no clock; the stage marks do.
            let ev = || ctx.new_event(None).ctx("creating an event");
            let mark = || ctx.new_event(Some(TIMED)).ctx("creating an event");
            slots.push(Slot {
                run,
                dense: None,
                act: [None, None],
                inter_out: None,
                xl: None,
                low: None,
                wide: None,
                batch: 0,
                host_dense: Pinned::default(),
                ready: ev()?,
                done: ev()?,
                marks: [mark()?, mark()?, mark()?, mark()?, mark()?],
                copy_marks: [mark()?, mark()?, mark()?, mark()?],
            });
        }
        let f = |name: &str| gpu.function("model.cu", || MODEL_SRC.to_string(), &[], name);
        let blas = CudaBlas::new(gpu.compute().clone()).map_err(|source| CudaError::Blas {
            what: "creating a handle",
            source,
        })?;
        Ok(GpuPredictor {
            bias_act: f("ember_bias_act")?,
            copy_cols: f("ember_copy_cols")?,
            dot: f("ember_dot_interact")?,
            cross: f("ember_cross_update")?,
            m,
            blas,
            slots,
            next: 0,
            pending: VecDeque::new(),
            cache: TuneCache::in_memory(),
        })
    }

    /// The model on the device (its [`Engine::model`] is the host model it came from).
    pub fn gpu_model(&self) -> &Arc<GpuModel> {
        &self.m
    }

    /// Chooses the tuned variants' launches on a representative batch, with `cache`.
    pub fn tune(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        cache: &mut TuneCache,
    ) -> Result<()> {
        let m = self.m.clone();
        let batch = m.model.batch(dense, sparse)?;
        for s in &mut self.slots {
            s.run.upload_valid(&m.emb, batch.valid())?;
            m.gpu.copy().synchronize().ctx("uploading")?;
            s.run.tune(&m.emb, cache)?;
        }
        Ok(())
    }

    /// Checks a batch (dense shape and values, ids in range), copies it to the device and
    /// enqueues its forward pass. At most two batches are in flight: a third submit is refused
    /// until the oldest is collected.
    pub fn submit(&mut self, dense: &[f32], sparse: &KeyedJagged) -> Result<()> {
        let model = self.m.model.clone();
        let batch = model.batch(dense, sparse)?;
        self.submit_batch(&batch)
    }

    /// [`GpuPredictor::submit`] for a batch checked already ([`Model::batch`],
    /// [`Model::merge`]): nothing is checked again.
    pub fn submit_batch(&mut self, batch: &Batch<'_>) -> Result<()> {
        // cuBLAS and the raw driver calls use the thread's current context.
        self.m
            .gpu
            .context()
            .bind_to_thread()
            .ctx("binding the context")?;
        if self.pending.len() == self.slots.len() {
            return Err(CudaError::Input(
                "two batches are in flight: collect one before submitting another".into(),
            ));
        }
        // The first slot not in flight (a failed submit leaves its slot free).
        let n = self.slots.len();
        let si = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|s| !self.pending.contains(s))
            .expect("fewer batches in flight than slots");
        match self.submit_into(si, batch) {
            Ok(()) => {
                self.next = (si + 1) % n;
                self.pending.push_back(si);
                Ok(())
            }
            Err(e) => {
                // Whatever was enqueued for this slot must finish before its buffers are
                // reused: its next copy waits on `done`.
                let gpu = &self.m.gpu;
                let _ = self.slots[si].done.record(gpu.compute());
                Err(e)
            }
        }
    }

    /// Copies a checked batch into slot `si` and enqueues its forward pass.
    fn submit_into(&mut self, si: usize, checked: &Batch<'_>) -> Result<()> {
        let (batch, dense) = (checked.len(), checked.dense());
        let m = self.m.clone();
        let gpu = m.gpu.clone();
        let cfg = m.model.config();
        let top_in = cfg.top_in();
        let dense_in = cfg.dense_in;
        let slot = &mut self.slots[si];
        // Buffers first (growing synchronizes), then the copy stream waits until the slot's
        // previous batch is done with them.
        let mut grew = grow(&gpu, &mut slot.dense, batch * dense_in)?.1;
        let widest = m
            .bottom
            .iter()
            .chain(&m.top)
            .map(|l| l.n_out)
            .chain([dense_in, top_in])
            .max()
            .unwrap_or(1);
        for a in &mut slot.act {
            grew |= grow(&gpu, a, batch * widest)?.1;
        }
        grew |= grow(&gpu, &mut slot.inter_out, batch * top_in)?.1;
        if let DevInteraction::Dcn { layers } = &m.inter {
            let low = layers.iter().map(|(v, _)| v.n_out).max().unwrap_or(1);
            grew |= grow(&gpu, &mut slot.xl, batch * top_in)?.1;
            grew |= grow(&gpu, &mut slot.low, batch * low)?.1;
            grew |= grow(&gpu, &mut slot.wide, batch * top_in)?.1;
        }
        if grew {
            gpu.compute().synchronize().ctx("allocating")?;
        }
        let copy = gpu.copy();
        copy.wait(&slot.done)
            .ctx("ordering the copy after the slot's last use")?;
        slot.copy_marks[0].record(copy).ctx("recording an event")?;
        slot.run.upload_valid(&m.emb, checked.valid())?;
        if !dense.is_empty() {
            // The slot's last upload read the page-locked buffer until `ready`.
            slot.ready
                .synchronize()
                .ctx("waiting for the last upload")?;
            let h = slot.host_dense.get(gpu.context(), dense.len())?;
            fill(h, dense, |v| v);
            let d = slot.dense.as_mut().expect("allocated above");
            copy.memcpy_htod(&*h, &mut d.slice_mut(..dense.len()))
                .ctx("uploading dense features")?;
        }
        slot.copy_marks[1].record(copy).ctx("recording an event")?;
        slot.ready.record(copy).ctx("recording an event")?;
        slot.batch = batch;
        let compute = gpu.compute();
        compute
            .wait(&slot.ready)
            .ctx("ordering compute after the copy")?;
        // Variants that tune do it on their first batch, both slots from one cache so that
        // they choose alike ([`GpuPredictor::tune`] does it ahead, with a cache on disk).
        slot.run.tune(&m.emb, &mut self.cache)?;
        self.forward(si)
    }

    /// Waits for the oldest batch in flight and writes its scores (sigmoid of the logits) into
    /// `scores`; returns the GPU time of each stage.
    pub fn collect(&mut self, scores: &mut [f32]) -> Result<StageTimes> {
        let si = self
            .pending
            .pop_front()
            .ok_or_else(|| CudaError::Input("no batch in flight".into()))?;
        let slot = &self.slots[si];
        if scores.len() != slot.batch {
            return Err(CudaError::Input(format!(
                "output has room for {} scores, the batch has {} samples",
                scores.len(),
                slot.batch
            )));
        }
        let gpu = &self.m.gpu;
        gpu.context().bind_to_thread().ctx("binding the context")?;
        let copy = gpu.copy();
        copy.wait(&slot.done).ctx("ordering the download")?;
        slot.copy_marks[2].record(copy).ctx("recording an event")?;
        if slot.batch > 0 {
            let logits = self.logits_buffer(si);
            copy.memcpy_dtoh(&logits.slice(..slot.batch), scores)
                .ctx("downloading scores")?;
        }
        slot.copy_marks[3].record(copy).ctx("recording an event")?;
        copy.synchronize().ctx("downloading scores")?;
        slot.done.synchronize().ctx("running the model")?;
        scores.iter_mut().for_each(|v| *v = sigmoid(*v));
        let between = |a: &CudaEvent, b: &CudaEvent| -> Result<Duration> {
            let t = a.elapsed_ms(b).ctx("reading stage times")?;
            Ok(Duration::from_secs_f64(f64::from(t.max(0.0)) / 1000.0))
        };
        let ms = |a: usize, b: usize| between(&slot.marks[a], &slot.marks[b]);
        let copy_ms = |a: usize, b: usize| between(&slot.copy_marks[a], &slot.copy_marks[b]);
        Ok(StageTimes {
            embedding: ms(0, 1)?,
            bottom_mlp: ms(1, 2)?,
            interaction: ms(2, 3)?,
            top_mlp: ms(3, 4)?,
            wall: ms(0, 4)?,
            bottom_overlapped: false,
            copy_in: copy_ms(0, 1)?,
            copy_out: copy_ms(2, 3)?,
        })
    }

    /// [`GpuPredictor::submit`] then [`GpuPredictor::collect`].
    pub fn predict(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        scores: &mut [f32],
    ) -> Result<StageTimes> {
        if !self.pending.is_empty() {
            return Err(CudaError::Input(
                "predict with batches in flight: collect them first".into(),
            ));
        }
        self.submit(dense, sparse)?;
        self.collect(scores)
    }

    /// Batches submitted and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Where the top MLP left the logits of slot `si` (its last activation buffer).
    pub(super) fn logits_buffer(&self, si: usize) -> &CudaSlice<f32> {
        let slot = &self.slots[si];
        let last = (self.m.bottom.len() + self.m.top.len()) % 2;
        // The bottom MLP starts in act[0]; each layer writes the other buffer (see forward).
        slot.act[last ^ 1].as_ref().expect("allocated at submit")
    }
}

impl Engine for GpuPredictor {
    fn model(&self) -> &Arc<Model> {
        &self.m.model
    }

    fn run(
        &mut self,
        batch: &Prepared<'_>,
        scores: &mut [f32],
    ) -> std::result::Result<StageTimes, ModelError> {
        let device = || self.device();
        if batch.staged().is_some() {
            return Err(ModelError::Input(
                "a batch with rows staged from the SSD tier cannot run on the GPU (every table \
                 must be in memory)"
                    .into(),
            ));
        }
        if !self.pending.is_empty() {
            return Err(
                CudaError::Input("run with batches in flight: collect them first".into())
                    .into_model(device()),
            );
        }
        self.submit_batch(batch.batch())
            .and_then(|()| self.collect(scores))
            .map_err(|e| e.into_model(self.device()))
    }

    fn device(&self) -> String {
        let i = self.m.gpu.info();
        format!("cuda:{} {}", i.ordinal, i.name)
    }
}
