//! [`GpuPredictor`]'s batches: two slots of device buffers, a batch copied into a free slot on
//! the copy stream while the compute stream runs the other, collected in order; and the
//! [`Engine`] the server and `predict` run.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaEvent, CudaSlice, DeviceRepr, ValidAsZeroBits};
use ember_model::{Batch, DenseDType, Engine, Model, ModelError, Prepared, StageTimes, sigmoid};

use super::pinned::{PinnedBatch, refusal};
use super::{DevInteraction, GpuModel, GpuPredictor, Slot};
use crate::device::{Gpu, TIMED, dptr};
use crate::embed::Variant;
use crate::error::{CudaError, DriverCtx, Result};
use crate::kernels::MODEL_SRC;
use crate::staging::{Pinned, fill};

use crate::tune::TuneCache;
use ember_embed::KeyedJagged;

/// Batches in flight at most: one staged by the host, one copying, one computing.
pub const SLOTS: usize = 3;

/// What a submit hands over: a batch checked upstream, or dense values and ids to check while
/// they are staged.
#[derive(Clone, Copy)]
enum Input<'a> {
    Checked(&'a Batch<'a>),
    Raw {
        dense: &'a [f32],
        sparse: &'a KeyedJagged,
    },
    Pinned(&'a PinnedBatch),
}

/// Grows `buf` to at least `len` elements (allocation is ordered on the compute stream; the
/// caller synchronizes before a copy stream touches a new buffer).
pub(crate) fn grow<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    buf: &mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<(u64, bool)> {
    let len = len.max(1);
    let mut grew = false;
    if buf.as_ref().is_none_or(|b| b.len() < len) {
        *buf = None;
        *buf = Some(
            gpu.compute()
                .alloc_zeros::<T>(len.next_power_of_two())
                .ctx("allocating activations")?,
        );
        grew = true;
    }
    Ok((dptr(buf.as_ref().expect("allocated"), gpu.compute()), grew))
}

/// `v` copied into `buf` (grown to hold it) on the compute stream; its address. `what` names
/// the upload in an error.
pub(crate) fn up<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &Gpu,
    buf: &mut Option<CudaSlice<T>>,
    v: &[T],
    what: &'static str,
) -> Result<u64> {
    let p = grow(gpu, buf, v.len())?.0;
    if !v.is_empty() {
        let dst = buf.as_mut().expect("grown");
        gpu.compute()
            .memcpy_htod(v, &mut dst.slice_mut(..v.len()))
            .ctx(what)?;
    }
    Ok(p)
}

/// One slot's buffers and events; its embedding run pools with `variant` and uploads on the
/// copy stream.
fn new_slot(m: &GpuModel, variant: Variant) -> Result<Slot> {
    let ctx = m.gpu.context();
    let mut run = m.emb.runner(variant, m.model.config().pooling.into())?;
    run.upload_on_copy_stream();
    // Ordering events need no clock; the stage marks do.
    let ev = || ctx.new_event(None).ctx("creating an event");
    let mark = || ctx.new_event(Some(TIMED)).ctx("creating an event");
    Ok(Slot {
        run,
        dense: None,
        act: [None, None],
        inter_out: None,
        xl: None,
        low: None,
        wide: None,
        act16: [None, None],
        xl16: None,
        low16: None,
        pinned: None,
        starts: None,
        bad: None,
        host_bad: Pinned::readable(),
        batch: 0,
        host_dense: Pinned::default(),
        host_logits: Pinned::readable(),
        ready: ev()?,
        done: ev()?,
        marks: [mark()?, mark()?, mark()?, mark()?, mark()?],
        copy_marks: [mark()?, mark()?, mark()?, mark()?],
    })
}

impl Slot {
    /// Grows the slot's device buffers for `input`, a batch of `batch` samples and `dense_len`
    /// dense values, and synchronizes the compute stream (where they are allocated) when one
    /// grew, before the copy stream touches it.
    fn grow_for(
        &mut self,
        m: &GpuModel,
        input: Input<'_>,
        batch: usize,
        dense_len: usize,
    ) -> Result<()> {
        let gpu = &m.gpu;
        let cfg = m.model.config();
        let (top_in, dense_in) = (cfg.top_in(), cfg.dense_in);
        let mut grew = grow(gpu, &mut self.dense, dense_len.max(batch * dense_in))?.1;
        let widest = m
            .bottom
            .iter()
            .chain(&m.top)
            .map(|l| l.n_out)
            .chain([dense_in, top_in])
            .max()
            .unwrap_or(1);
        for a in &mut self.act {
            grew |= grow(gpu, a, batch * widest)?.1;
        }
        grew |= grow(gpu, &mut self.inter_out, batch * top_in)?.1;
        if let DevInteraction::Dcn { layers } = &m.inter {
            let low = layers.iter().map(|(v, _)| v.n_out).max().unwrap_or(1);
            grew |= grow(gpu, &mut self.xl, batch * top_in)?.1;
            grew |= grow(gpu, &mut self.low, batch * low)?.1;
            grew |= grow(gpu, &mut self.wide, batch * top_in)?.1;
        }
        if m.dense == DenseDType::Bf16 {
            for a in &mut self.act16 {
                grew |= grow(gpu, a, batch * widest)?.1;
            }
            if let DevInteraction::Dcn { layers } = &m.inter {
                let low = layers.iter().map(|(v, _)| v.n_out).max().unwrap_or(1);
                grew |= grow(gpu, &mut self.xl16, batch * top_in)?.1;
                grew |= grow(gpu, &mut self.low16, batch * low)?.1;
            }
        }
        if let Input::Pinned(_) = input {
            let nf = cfg.features().len();
            grew |= grow(gpu, &mut self.starts, nf + 1)?.1;
            grew |= grow(gpu, &mut self.bad, 2)?.1;
        }
        if grew {
            gpu.compute().synchronize().ctx("allocating")?;
        }
        Ok(())
    }

    /// Stages the batch's `dense` values in the slot's page-locked buffer, checked as they are
    /// staged when the batch is raw (dense values first: [`Model::batch`]'s order of checks);
    /// a page-locked batch is copied as it is, from where it is.
    fn stage_dense(&mut self, m: &GpuModel, input: Input<'_>, dense: &[f32]) -> Result<()> {
        let ctx = m.gpu.context();
        match input {
            Input::Checked(_) => fill(self.host_dense.get(ctx, dense.len())?, dense, |v| v),
            Input::Raw { sparse, .. } => {
                let h = self.host_dense.get(ctx, dense.len())?;
                m.model.check_dense_into(dense, sparse.batch_size(), h)?
            }
            Input::Pinned(_) => {}
        }
        Ok(())
    }

    /// Copies the batch (its ids, a page-locked batch's feature starts, its `dense` values) to
    /// the slot's device buffers on the copy stream, after the slot's last use (`done`),
    /// between the copy marks; `ready` marks the end. The slot keeps a page-locked batch for
    /// the device's check.
    fn upload(
        &mut self,
        m: &GpuModel,
        input: Input<'_>,
        batch: usize,
        dense: &[f32],
    ) -> Result<()> {
        let gpu = &m.gpu;
        self.pinned = None;
        let copy = gpu.copy();
        copy.wait(&self.done)
            .ctx("ordering the copy after the slot's last use")?;
        self.copy_marks[0].record(copy).ctx("recording an event")?;
        match input {
            Input::Checked(b) => self.run.upload_valid(&m.emb, b.valid())?,
            Input::Raw { sparse, .. } => {
                self.run
                    .upload_checked(&m.emb, m.model.embeddings(), sparse)?;
            }
            Input::Pinned(p) => {
                let nf = m.model.config().features().len();
                self.run
                    .upload_pinned(&m.emb, batch, p.offsets()?, p.ids()?)?;
                let st = self.starts.as_mut().expect("allocated above");
                copy.memcpy_htod(p.starts()?, &mut st.slice_mut(..nf + 1))
                    .ctx("uploading feature starts")?;
                self.pinned = Some(p.clone());
            }
        }
        if !dense.is_empty() {
            let h: &[f32] = match input {
                Input::Pinned(_) => dense,
                _ => self.host_dense.get(gpu.context(), dense.len())?,
            };
            let d = self.dense.as_mut().expect("allocated above");
            copy.memcpy_htod(h, &mut d.slice_mut(..dense.len()))
                .ctx("uploading dense features")?;
        }
        self.copy_marks[1].record(copy).ctx("recording an event")?;
        self.ready.record(copy).ctx("recording an event")?;
        self.batch = batch;
        Ok(())
    }
}

impl GpuPredictor {
    /// A predictor pooling with `variant`; tuned variants tune on the first batch (choices
    /// recorded in `cache`).
    pub fn new(m: Arc<GpuModel>, variant: Variant) -> Result<GpuPredictor> {
        let gpu = m.gpu.clone();
        let slots = (0..SLOTS)
            .map(|_| new_slot(&m, variant))
            .collect::<Result<Vec<_>>>()?;
        let f = |name: &str| gpu.function("model.cu", || MODEL_SRC.to_string(), &[], name);
        let blas = CudaBlas::new(gpu.compute().clone()).map_err(|source| CudaError::Blas {
            what: "creating a handle",
            source,
        })?;
        let lt = match m.dense {
            DenseDType::Bf16 => Some(super::lt::Lt::new(&gpu)?),
            _ => None,
        };
        Ok(GpuPredictor {
            lt,
            to_bf16: f("ember_to_bf16")?,
            cross_bf16: f("ember_cross_update_bf16")?,
            check: f("ember_check_inputs")?,
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

    /// Another predictor of the same model on the device (its weights and tables are shared,
    /// not copied), pooling with the same variant and tuned choices: two of them let one
    /// batch's host work run beside another's copies and compute (`serve --instances`).
    pub fn sibling(&self) -> Result<GpuPredictor> {
        let variant = self.slots[0].run.variant();
        let mut next = GpuPredictor::new(self.m.clone(), variant)?;
        next.cache = self.cache.clone();
        Ok(next)
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

    /// Checks a batch (dense shape and values, ids in range) as it stages it in page-locked
    /// memory, each value read once ([`Model::check_dense_into`],
    /// [`ember_embed::EmbeddingCollection::check_view_narrowed`]), copies it to the device and
    /// enqueues its forward pass. At most [`GpuPredictor::capacity`] batches are in flight: one
    /// more submit is refused until the oldest is collected. Errors are [`Model::batch`]'s.
    pub fn submit(&mut self, dense: &[f32], sparse: &KeyedJagged) -> Result<()> {
        self.submit_input(Input::Raw { dense, sparse })
    }

    /// [`GpuPredictor::submit`] for a batch checked already ([`Model::batch`],
    /// [`Model::merge`]): nothing is checked again.
    pub fn submit_batch(&mut self, batch: &Batch<'_>) -> Result<()> {
        self.submit_input(Input::Checked(batch))
    }

    /// [`GpuPredictor::submit`] for a batch already in page-locked memory
    /// ([`GpuPredictor::pin`]): copied to the device as it is, checked there (no host pass
    /// over its ids or values). A bad batch is refused at [`GpuPredictor::collect`], with the
    /// host check's words, and none of its scores is returned.
    pub fn submit_pinned(&mut self, batch: &PinnedBatch) -> Result<()> {
        self.submit_input(Input::Pinned(batch))
    }

    /// Keeps at most `n` batches in flight (1 to 8; [`SLOTS`] by default), with nothing in
    /// flight. Three let the host stage one batch while another copies and a third computes;
    /// where the host does no work per batch ([`GpuPredictor::submit_pinned`]), two keep the
    /// copy engine as busy and a batch waits behind one fewer.
    pub fn set_capacity(&mut self, n: usize) -> Result<()> {
        if !(1..=8).contains(&n) {
            return Err(CudaError::Input(format!(
                "{n} batches in flight: between 1 and 8"
            )));
        }
        if !self.pending.is_empty() {
            return Err(CudaError::Input(
                "changing the batches in flight with some in flight: collect them first".into(),
            ));
        }
        let variant = self.slots[0].run.variant();
        // A new slot's run tunes on its first batch, from the predictor's cache.
        while self.slots.len() < n {
            self.slots.push(new_slot(&self.m, variant)?);
        }
        self.slots.truncate(n);
        self.next = 0;
        Ok(())
    }

    /// Batches that can be in flight at once.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn submit_input(&mut self, input: Input<'_>) -> Result<()> {
        // cuBLAS and the raw driver calls use the thread's current context.
        self.m
            .gpu
            .context()
            .bind_to_thread()
            .ctx("binding the context")?;
        if self.pending.len() == self.slots.len() {
            return Err(CudaError::Input(format!(
                "{} batches are in flight: collect one before submitting another",
                self.slots.len()
            )));
        }
        // The first slot not in flight (a failed submit leaves its slot free).
        let n = self.slots.len();
        let si = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|s| !self.pending.contains(s))
            .expect("fewer batches in flight than slots");
        match self.submit_into(si, input) {
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

    /// Copies a batch into slot `si` (checking it on the way when it is raw) and enqueues its
    /// forward pass.
    fn submit_into(&mut self, si: usize, input: Input<'_>) -> Result<()> {
        let (batch, dense) = match input {
            Input::Checked(b) => (b.len(), b.dense()),
            Input::Raw { dense, sparse } => (sparse.batch_size(), dense),
            Input::Pinned(p) => {
                p.check_fits(self.m.emb.feature_names(), self.m.model.config().dense_in)?;
                (p.batch_size(), p.dense()?)
            }
        };
        let m = self.m.clone();
        let slot = &mut self.slots[si];
        // Buffers first (growing synchronizes), then the copy stream waits until the slot's
        // previous batch is done with them.
        slot.grow_for(&m, input, batch, dense.len())?;
        // The slot's last upload read the page-locked dense buffer until `ready`.
        slot.ready
            .synchronize()
            .ctx("waiting for the last upload")?;
        slot.stage_dense(&m, input, dense)?;
        slot.upload(&m, input, batch, dense)?;
        let compute = m.gpu.compute();
        compute
            .wait(&slot.ready)
            .ctx("ordering compute after the copy")?;
        // Variants that tune do it on their first batch, all slots from one cache so that
        // they choose alike ([`GpuPredictor::tune`] does it ahead, with a cache on disk).
        slot.run.tune(&m.emb, &mut self.cache)?;
        if slot.pinned.is_some() {
            self.check_on_device(si, m.model.config().features().len())?;
        }
        match m.dense {
            DenseDType::Bf16 => self.forward_bf16(si),
            _ => self.forward(si),
        }
    }

    /// Waits for the oldest batch in flight and writes its scores (sigmoid of the logits) into
    /// `scores`; returns the GPU time of each stage.
    pub fn collect(&mut self, scores: &mut [f32]) -> Result<StageTimes> {
        let si = self
            .pending
            .pop_front()
            .ok_or_else(|| CudaError::Input("no batch in flight".into()))?;
        let slot = &mut self.slots[si];
        if scores.len() != slot.batch {
            return Err(CudaError::Input(format!(
                "output has room for {} scores, the batch has {} samples",
                scores.len(),
                slot.batch
            )));
        }
        let gpu = &self.m.gpu;
        gpu.context().bind_to_thread().ctx("binding the context")?;
        // The logits came back on the compute stream, before `done` (see forward).
        slot.done.synchronize().ctx("running the model")?;
        // A page-locked batch the device's check refused: its error, and no score.
        if let Some(p) = slot.pinned.take() {
            let bad = slot.host_bad.peek(2)?;
            if let Some(e) = refusal(&self.m.model, &p, [bad[0], bad[1]])? {
                return Err(e);
            }
        }
        if slot.batch > 0 {
            let host = slot.host_logits.peek(slot.batch)?;
            scores.copy_from_slice(host);
        }
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
            graph: Duration::ZERO,
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
