//! A whole model on the GPU: the embedding stage ([`EmbedRun`]), the MLPs through cuBLAS, the
//! interaction as a kernel, and the sigmoid on the host (one float per sample).
//!
//! A [`GpuPredictor`] keeps two slots of device buffers. A batch's inputs are copied on the copy
//! stream into a free slot while the compute stream still runs the previous batch; the compute
//! stream waits for the copy (an event), runs the forward pass, and records "done"; the logits
//! come back on the copy stream after that event. [`GpuPredictor::submit`] and
//! [`GpuPredictor::collect`] expose the overlap (`bench model` keeps two batches in flight);
//! [`GpuPredictor::predict`] is both in one call (`predict` and `serve` use it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use ember_embed::KeyedJagged;
use ember_model::interaction::Interaction;
use ember_model::mlp::Linear;
use ember_model::{Batch, Engine, Model, ModelError, Prepared, StageTimes, sigmoid};

use crate::device::{Gpu, TIMED, dptr};
use crate::embed::{EmbedRun, GpuEmbeddings, Variant};
use crate::error::{CudaError, DriverCtx, Result};
use crate::hot::HotPlan;
use crate::kernels::MODEL_SRC;
use crate::tune::TuneCache;

/// A linear layer on the device.
#[derive(Debug)]
struct DevLinear {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
    n_in: usize,
    n_out: usize,
    relu: bool,
}

impl DevLinear {
    fn upload(gpu: &Gpu, l: &Linear) -> Result<DevLinear> {
        let s = gpu.compute();
        Ok(DevLinear {
            w: s.clone_htod(l.weight()).ctx("uploading weights")?,
            b: s.clone_htod(l.bias()).ctx("uploading biases")?,
            n_in: l.in_dim(),
            n_out: l.out_dim(),
            relu: l.relu(),
        })
    }
}

#[derive(Debug)]
enum DevInteraction {
    Dot {
        pairs: CudaSlice<i32>,
        n_pairs: usize,
        d: usize,
    },
    Cat,
    Dcn {
        layers: Vec<(DevLinear, DevLinear)>,
    },
}

/// A model's weights and tables on one device.
#[derive(Debug)]
pub struct GpuModel {
    gpu: Arc<Gpu>,
    model: Arc<Model>,
    emb: GpuEmbeddings,
    bottom: Vec<DevLinear>,
    top: Vec<DevLinear>,
    inter: DevInteraction,
}

impl GpuModel {
    /// Uploads `model` (tables with `plan`'s hot rows renumbered, when given).
    pub fn upload(gpu: &Arc<Gpu>, model: Arc<Model>, plan: Option<&HotPlan>) -> Result<GpuModel> {
        let emb = GpuEmbeddings::upload(gpu, model.embeddings(), plan)?;
        let lin = |ls: &[Linear]| -> Result<Vec<DevLinear>> {
            ls.iter().map(|l| DevLinear::upload(gpu, l)).collect()
        };
        let bottom = lin(model.bottom_mlp().layers())?;
        let top = lin(model.top_mlp().layers())?;
        let inter = match model.interaction() {
            Interaction::Dot { pairs, d } => {
                let flat: Vec<i32> = pairs
                    .iter()
                    .flat_map(|&(i, j)| [i as i32, j as i32])
                    .collect();
                let n_pairs = pairs.len();
                let flat = if flat.is_empty() { vec![0, 0] } else { flat };
                DevInteraction::Dot {
                    pairs: gpu
                        .compute()
                        .clone_htod(&flat)
                        .ctx("uploading interaction pairs")?,
                    n_pairs,
                    d: *d,
                }
            }
            Interaction::Cat => DevInteraction::Cat,
            Interaction::Dcn { layers } => DevInteraction::Dcn {
                layers: layers
                    .iter()
                    .map(|c| Ok((DevLinear::upload(gpu, &c.v)?, DevLinear::upload(gpu, &c.w)?)))
                    .collect::<Result<_>>()?,
            },
        };
        gpu.compute().synchronize().ctx("uploading the model")?;
        Ok(GpuModel {
            gpu: gpu.clone(),
            model,
            emb,
            bottom,
            top,
            inter,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn embeddings(&self) -> &GpuEmbeddings {
        &self.emb
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

/// Device buffers and events of one batch in flight.
#[derive(Debug)]
struct Slot {
    run: EmbedRun,
    dense: Option<CudaSlice<f32>>,
    /// MLP activations (ping-pong), interaction output, DCN scratch, logits.
    act: [Option<CudaSlice<f32>>; 2],
    inter_out: Option<CudaSlice<f32>>,
    xl: Option<CudaSlice<f32>>,
    low: Option<CudaSlice<f32>>,
    wide: Option<CudaSlice<f32>>,
    batch: usize,
    ready: CudaEvent,
    done: CudaEvent,
    /// Compute-stream marks: start, after embeddings, bottom MLP, interaction, top MLP.
    marks: [CudaEvent; 5],
}

/// Grows `buf` to at least `len` floats (allocation is ordered on the compute stream; the
/// caller synchronizes before a copy stream touches a new buffer).
fn grow(gpu: &Gpu, buf: &mut Option<CudaSlice<f32>>, len: usize) -> Result<(u64, bool)> {
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

/// Runs a [`GpuModel`]'s forward pass; one per concurrent caller.
#[derive(Debug)]
pub struct GpuPredictor {
    m: Arc<GpuModel>,
    blas: CudaBlas,
    slots: Vec<Slot>,
    next: usize,
    /// Slots submitted and not yet collected, oldest first.
    pending: VecDeque<usize>,
    /// Tuned choices shared by the slots when tuning happens on the first batch.
    cache: TuneCache,
    bias_act: CudaFunction,
    copy_cols: CudaFunction,
    dot: CudaFunction,
    cross: CudaFunction,
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
                ready: ev()?,
                done: ev()?,
                marks: [mark()?, mark()?, mark()?, mark()?, mark()?],
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

    pub fn model(&self) -> &Arc<GpuModel> {
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
        slot.run.upload_valid(&m.emb, checked.valid())?;
        if !dense.is_empty() {
            let d = slot.dense.as_mut().expect("allocated above");
            copy.memcpy_htod(dense, &mut d.slice_mut(..dense.len()))
                .ctx("uploading dense features")?;
        }
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
        if slot.batch > 0 {
            let logits = self.logits_buffer(si);
            copy.memcpy_dtoh(&logits.slice(..slot.batch), scores)
                .ctx("downloading scores")?;
        }
        copy.synchronize().ctx("downloading scores")?;
        slot.done.synchronize().ctx("running the model")?;
        scores.iter_mut().for_each(|v| *v = sigmoid(*v));
        let ms = |a: usize, b: usize| -> Result<Duration> {
            let t = slot.marks[a]
                .elapsed_ms(&slot.marks[b])
                .ctx("reading stage times")?;
            Ok(Duration::from_secs_f64(f64::from(t.max(0.0)) / 1000.0))
        };
        Ok(StageTimes {
            embedding: ms(0, 1)?,
            bottom_mlp: ms(1, 2)?,
            interaction: ms(2, 3)?,
            top_mlp: ms(3, 4)?,
            wall: ms(0, 4)?,
            bottom_overlapped: false,
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
    fn logits_buffer(&self, si: usize) -> &CudaSlice<f32> {
        let slot = &self.slots[si];
        let last = (self.m.bottom.len() + self.m.top.len()) % 2;
        // The bottom MLP starts in act[0]; each layer writes the other buffer (see forward).
        slot.act[last ^ 1].as_ref().expect("allocated at submit")
    }

    /// Enqueues slot `si`'s forward pass on the compute stream.
    fn forward(&mut self, si: usize) -> Result<()> {
        let m = self.m.clone();
        let gpu = &m.gpu;
        let stream = gpu.compute();
        let slot = &mut self.slots[si];
        let batch = slot.batch;
        slot.marks[0].record(stream).ctx("recording an event")?;
        slot.run.launch(&m.emb)?;
        slot.marks[1].record(stream).ctx("recording an event")?;
        let pooled = slot.run.output_ptr();
        let p = |b: &Option<CudaSlice<f32>>| dptr(b.as_ref().expect("allocated"), stream);
        let acts = [p(&slot.act[0]), p(&slot.act[1])];
        let mut cur = p(&slot.dense);
        let mut which = 0usize;
        // Bottom MLP: layer k writes act[k % 2] (so the output of layer k is read by k + 1).
        for l in &m.bottom {
            let out = acts[which];
            self.linear(l, cur, batch, out)?;
            cur = out;
            which ^= 1;
        }
        let slot = &self.slots[si];
        slot.marks[2].record(stream).ctx("recording an event")?;
        let cfg = m.model.config();
        let top_in = cfg.top_in();
        let d = cfg.bottom_out();
        let pd = m.emb.total_dim();
        let inter_out = p(&slot.inter_out);
        let x = cur;
        let top_input = match &m.inter {
            DevInteraction::Dot { pairs, n_pairs, d } => {
                let n = pd / d + 1;
                let smem = n * d * 4;
                let use_smem = i32::from(smem <= 48 * 1024);
                let (pairs, n_pairs_i, d_i, n_i, top_in_i) = (
                    dptr(pairs, stream),
                    *n_pairs as i32,
                    *d as i32,
                    n as i32,
                    top_in as i32,
                );
                if batch > 0 {
                    let mut b = stream.launch_builder(&self.dot);
                    b.arg(&x)
                        .arg(&pooled)
                        .arg(&d_i)
                        .arg(&n_i)
                        .arg(&pairs)
                        .arg(&n_pairs_i)
                        .arg(&inter_out)
                        .arg(&top_in_i)
                        .arg(&use_smem);
                    let cfg = LaunchConfig {
                        grid_dim: (batch as u32, 1, 1),
                        block_dim: (128, 1, 1),
                        shared_mem_bytes: if use_smem == 1 { smem as u32 } else { 0 },
                    };
                    // SAFETY: arguments match ember_dot_interact; x is [batch, d], pooled
                    // [batch, (n-1) d], inter_out [batch, top_in], pairs 2 x n_pairs ints < n.
                    unsafe { b.launch(cfg) }.ctx("launching the dot interaction")?;
                }
                inter_out
            }
            DevInteraction::Cat => {
                self.copy_cols(x, d, inter_out, top_in, 0, batch)?;
                self.copy_cols(pooled, pd, inter_out, top_in, d, batch)?;
                inter_out
            }
            DevInteraction::Dcn { layers } => {
                // x0 = [x, pooled] in inter_out; xl iterates in its own buffer.
                self.copy_cols(x, d, inter_out, top_in, 0, batch)?;
                self.copy_cols(pooled, pd, inter_out, top_in, d, batch)?;
                let xl = p(&slot.xl);
                let (low, wide) = (p(&slot.low), p(&slot.wide));
                self.copy_cols(inter_out, top_in, xl, top_in, 0, batch)?;
                for (v, w) in layers {
                    self.gemm(v, xl, batch, low)?;
                    self.gemm(w, low, batch, wide)?;
                    let total = (batch * top_in) as i64;
                    let n = top_in as i32;
                    let bias = dptr(&w.b, stream);
                    if total > 0 {
                        let mut b = stream.launch_builder(&self.cross);
                        b.arg(&xl)
                            .arg(&inter_out)
                            .arg(&wide)
                            .arg(&bias)
                            .arg(&n)
                            .arg(&total);
                        // SAFETY: four [batch, top_in] / [top_in] buffers, as the kernel reads.
                        unsafe { b.launch(grid(total)) }.ctx("launching the cross update")?;
                    }
                }
                xl
            }
        };
        let slot = &self.slots[si];
        slot.marks[3].record(stream).ctx("recording an event")?;
        cur = top_input;
        for l in &m.top {
            let out = acts[which];
            self.linear(l, cur, batch, out)?;
            cur = out;
            which ^= 1;
        }
        debug_assert_eq!(cur, acts[which ^ 1]);
        let slot = &self.slots[si];
        slot.marks[4].record(stream).ctx("recording an event")?;
        slot.done.record(stream).ctx("recording an event")?;
        Ok(())
    }

    /// `y = x W^T` (row-major `[batch, in] -> [batch, out]`) through cuBLAS's column-major
    /// SGEMM: `y^T = W x^T`, with `W` read transposed from its row-major `[out, in]` layout.
    fn gemm(&self, l: &DevLinear, x: u64, batch: usize, y: u64) -> Result<()> {
        if batch == 0 {
            return Ok(());
        }
        let stream = self.m.gpu.compute();
        let w = dptr(&l.w, stream);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: w holds out x in floats, x holds batch x in, y holds batch x out (sized at
        // submit); the handle runs on the compute stream that orders every use.
        unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                l.n_out as i32,
                batch as i32,
                l.n_in as i32,
                &alpha,
                w as *const f32,
                l.n_in as i32,
                x as *const f32,
                l.n_in as i32,
                &beta,
                y as *mut f32,
                l.n_out as i32,
            )
        }
        .map_err(|source| CudaError::Blas {
            what: "SGEMM",
            source,
        })
    }

    /// A linear layer with its bias and activation.
    fn linear(&self, l: &DevLinear, x: u64, batch: usize, y: u64) -> Result<()> {
        self.gemm(l, x, batch, y)?;
        let total = (batch * l.n_out) as i64;
        if total == 0 {
            return Ok(());
        }
        let stream = self.m.gpu.compute();
        let bias = dptr(&l.b, stream);
        let n = l.n_out as i32;
        let relu = i32::from(l.relu);
        let mut b = stream.launch_builder(&self.bias_act);
        b.arg(&y).arg(&bias).arg(&n).arg(&total).arg(&relu);
        // SAFETY: y holds batch x n_out floats, bias n_out.
        unsafe { b.launch(grid(total)) }.ctx("launching bias and activation")?;
        Ok(())
    }

    fn copy_cols(
        &self,
        src: u64,
        width: usize,
        dst: u64,
        dst_stride: usize,
        col: usize,
        batch: usize,
    ) -> Result<()> {
        let total = (batch * width) as i64;
        if total == 0 {
            return Ok(());
        }
        let stream = self.m.gpu.compute();
        let (w, ds, c, b_) = (width as i32, dst_stride as i32, col as i32, batch as i32);
        let mut b = stream.launch_builder(&self.copy_cols);
        b.arg(&src).arg(&w).arg(&dst).arg(&ds).arg(&c).arg(&b_);
        // SAFETY: src is [batch, width], dst [batch, dst_stride] with col + width <= stride.
        unsafe { b.launch(grid(total)) }.ctx("launching a column copy")?;
        Ok(())
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

fn grid(total: i64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((total as u64).div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
