//! The forward pass a [`GpuPredictor`] enqueues for a slot on the compute stream: the
//! embedding stage's launches, the MLPs through cuBLAS SGEMM plus a bias-and-activation kernel,
//! the interaction kernels, with events marking the stages.

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::{DevInteraction, DevLinear, GpuPredictor};
use crate::device::dptr;
use crate::error::{CudaError, DriverCtx, Result};

impl GpuPredictor {
    /// Enqueues slot `si`'s forward pass on the compute stream.
    pub(super) fn forward(&mut self, si: usize) -> Result<()> {
        let m = self.m.clone();
        let gpu = &m.gpu;
        let stream = gpu.compute();
        let pooled = self.embedding_stage(si)?;
        let slot = &self.slots[si];
        let batch = slot.batch;
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
            DevInteraction::Dot { .. } => {
                self.dot_interaction(x, pooled, inter_out, batch)?;
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
        self.finish(si)
    }

    /// Slot `si`'s embedding stage on the compute stream, between the marks of its start and
    /// end; returns where the pooled rows are (`[batch, total_dim]` f32).
    pub(super) fn embedding_stage(&mut self, si: usize) -> Result<u64> {
        let stream = self.m.gpu.compute().clone();
        let slot = &mut self.slots[si];
        slot.marks[0].record(&stream).ctx("recording an event")?;
        slot.run.launch(&self.m.emb)?;
        slot.marks[1].record(&stream).ctx("recording an event")?;
        Ok(slot.run.output_ptr())
    }

    /// Where the logits of a batch are left: the activation buffer `act[k]` that the last
    /// layer writes when the bottom MLP starts in `act[0]` and each layer writes the other.
    pub(super) fn logits_index(&self) -> usize {
        ((self.m.bottom.len() + self.m.top.len()) % 2) ^ 1
    }

    /// The end of slot `si`'s forward pass: the logits (left in `act[logits_index]`) copied
    /// back, then "done".
    pub(super) fn finish(&mut self, si: usize) -> Result<()> {
        let gpu = self.m.gpu.clone();
        let stream = gpu.compute();
        let li = self.logits_index();
        let slot = &mut self.slots[si];
        let batch = slot.batch;
        slot.marks[4].record(stream).ctx("recording an event")?;
        // The logits (4 bytes a sample) come back on this stream: on the copy stream they would
        // queue behind the next batch's uploads.
        slot.copy_marks[2]
            .record(stream)
            .ctx("recording an event")?;
        if batch > 0 {
            let logits = slot.act[li].as_ref().expect("allocated at submit");
            let host = slot.host_logits.get(gpu.context(), batch)?;
            stream
                .memcpy_dtoh(&logits.slice(..batch), host)
                .ctx("downloading scores")?;
        }
        if slot.pinned.is_some() {
            // The device's check of the inputs: where it found a bad id or value, if anywhere.
            let bad = slot.bad.as_ref().expect("allocated at submit");
            let host = slot.host_bad.get(gpu.context(), 2)?;
            stream
                .memcpy_dtoh(&bad.slice(..2), host)
                .ctx("downloading the input check")?;
        }
        slot.copy_marks[3]
            .record(stream)
            .ctx("recording an event")?;
        slot.done.record(stream).ctx("recording an event")?;
        Ok(())
    }

    /// The dot interaction of `x` (the bottom MLP's `[batch, d]` output) and `pooled` into
    /// `inter_out` (`[batch, top_in]`), f32.
    pub(super) fn dot_interaction(
        &self,
        x: u64,
        pooled: u64,
        inter_out: u64,
        batch: usize,
    ) -> Result<()> {
        let DevInteraction::Dot { pairs, n_pairs, d } = &self.m.inter else {
            return Err(CudaError::Input("not a dot interaction".into()));
        };
        let stream = self.m.gpu.compute();
        let top_in = self.m.model.config().top_in();
        let pd = self.m.emb.total_dim();
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
        Ok(())
    }

    fn gemm(&self, l: &DevLinear, x: u64, batch: usize, y: u64) -> Result<()> {
        sgemm_xwt(&self.blas, self.m.gpu.compute(), l, x, batch, y)
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

    pub(super) fn copy_cols(
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

/// `y = x W^T` (row-major `[rows, in] -> [rows, out]`) through cuBLAS's column-major SGEMM:
/// `y^T = W x^T`, with `W` read transposed from its row-major `[out, in]` layout. Nothing for
/// no rows. `blas` runs on `stream`.
pub(crate) fn sgemm_xwt(
    blas: &CudaBlas,
    stream: &CudaStream,
    l: &DevLinear,
    x: u64,
    rows: usize,
    y: u64,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let w = dptr(&l.w, stream);
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: w holds out x in floats, x holds rows x in, y holds rows x out (the callers size
    // them); the handle runs on the stream that orders every use.
    unsafe {
        cudarc::cublas::result::sgemm(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            l.n_out as i32,
            rows as i32,
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

pub(crate) fn grid(total: i64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((total as u64).div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
