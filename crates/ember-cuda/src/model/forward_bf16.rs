//! The forward pass with bf16 dense layers on tensor cores ([`super::lt`]): what PyTorch's
//! `torch.autocast(dtype=torch.bfloat16)` runs in bf16, with the bias and ReLU in each GEMM's
//! epilogue.
//!
//! - The dense features are cast to bf16 on the device (one pass).
//! - An MLP's layers read and write bf16; the last layer of the bottom MLP writes f32 (the
//!   interaction reads it), and so does the top MLP's last (the logits).
//! - The interaction runs in f32 as on the f32 path (dot, cat), its output cast to bf16 for the
//!   top MLP. The cross net keeps `x_0` and `x_l` in f32: `V x_l` reads a bf16 copy of `x_l`
//!   and writes bf16, `W (.) + b` writes f32 with its bias in the epilogue, and one kernel does
//!   the elementwise step, `x_l += x_0 * w`, writing the bf16 copy that the next GEMM reads in
//!   the same pass.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::forward::grid;
use super::lt::{LtCall, Out};
use super::{DevInteraction, DevLinear, GpuPredictor};
use crate::device::dptr;
use crate::error::{CudaError, DriverCtx, Result};

impl GpuPredictor {
    /// Enqueues slot `si`'s forward pass, dense layers in bf16, on the compute stream.
    pub(super) fn forward_bf16(&mut self, si: usize) -> Result<()> {
        let m = self.m.clone();
        let gpu = &m.gpu;
        let stream = gpu.compute();
        let cfg = m.model.config();
        let (top_in, d, pd) = (cfg.top_in(), cfg.bottom_out(), m.emb.total_dim());
        let pooled = self.embedding_stage(si)?;
        let slot = &self.slots[si];
        let batch = slot.batch;
        let p = |b: &Option<CudaSlice<f32>>| dptr(b.as_ref().expect("allocated"), stream);
        let p16 = |b: &Option<CudaSlice<u16>>| dptr(b.as_ref().expect("allocated"), stream);
        let (acts, a16) = (
            [p(&slot.act[0]), p(&slot.act[1])],
            [p16(&slot.act16[0]), p16(&slot.act16[1])],
        );
        let (dense, inter_out) = (p(&slot.dense), p(&slot.inter_out));
        let dcn = matches!(m.inter, DevInteraction::Dcn { .. });
        let (xl, low16, wide, xl16) = match dcn {
            true => (
                p(&slot.xl),
                p16(&slot.low16),
                p(&slot.wide),
                p16(&slot.xl16),
            ),
            false => (0, 0, 0, 0),
        };
        // Bottom MLP: bf16 from the cast dense features; its last layer writes f32 into act[0].
        let mut x = dense;
        if let Some((last, rest)) = m.bottom.split_last() {
            self.cast(dense, a16[0], batch * cfg.dense_in)?;
            let mut cur = a16[0];
            for (k, l) in rest.iter().enumerate() {
                let out = a16[(k + 1) % 2];
                self.linear16(l, cur, batch, out, Out::Bf16)?;
                cur = out;
            }
            self.linear16(last, cur, batch, acts[0], Out::F32)?;
            x = acts[0];
        }
        self.slots[si].marks[2]
            .record(stream)
            .ctx("recording an event")?;
        // The interaction, f32, then the top MLP's input in bf16.
        let top16 = match &m.inter {
            DevInteraction::Dot { .. } => {
                self.dot_interaction(x, pooled, inter_out, batch)?;
                self.cast(inter_out, a16[1], batch * top_in)?;
                a16[1]
            }
            DevInteraction::Cat => {
                self.copy_cols(x, d, inter_out, top_in, 0, batch)?;
                self.copy_cols(pooled, pd, inter_out, top_in, d, batch)?;
                self.cast(inter_out, a16[1], batch * top_in)?;
                a16[1]
            }
            DevInteraction::Dcn { layers } => {
                // x0 = [x, pooled] in inter_out; x_l starts as x0, in f32 and in bf16.
                self.copy_cols(x, d, inter_out, top_in, 0, batch)?;
                self.copy_cols(pooled, pd, inter_out, top_in, d, batch)?;
                self.copy_cols(inter_out, top_in, xl, top_in, 0, batch)?;
                self.cast(inter_out, xl16, batch * top_in)?;
                for (v, w) in layers {
                    self.linear16(v, xl16, batch, low16, Out::Bf16)?;
                    self.linear16(w, low16, batch, wide, Out::F32)?;
                    self.cross_step(xl, inter_out, wide, xl16, batch * top_in)?;
                }
                xl16
            }
        };
        self.slots[si].marks[3]
            .record(stream)
            .ctx("recording an event")?;
        // Top MLP: bf16 layers; the last writes the f32 logits where `finish` reads them.
        let logits = acts[self.logits_index()];
        if let Some((last, rest)) = m.top.split_last() {
            // Ping-pong between the two bf16 buffers, never over the layer's own input.
            let mut cur = top16;
            for l in rest {
                let out = if cur == a16[0] { a16[1] } else { a16[0] };
                self.linear16(l, cur, batch, out, Out::Bf16)?;
                cur = out;
            }
            self.linear16(last, cur, batch, logits, Out::F32)?;
        } else {
            return Err(CudaError::Input("a model without a top MLP".into()));
        }
        self.finish(si)
    }

    /// One layer through cuBLASLt: bf16 `x` -> `y` of `out`, bias (of `out`'s type) and ReLU
    /// in the epilogue.
    fn linear16(&mut self, l: &DevLinear, x: u64, batch: usize, y: u64, out: Out) -> Result<()> {
        let stream = self.m.gpu.compute().clone();
        let (w16, b16) = match (&l.w16, &l.b16) {
            (Some(w), Some(b)) => (w, b),
            _ => {
                return Err(CudaError::Input(
                    "the model was uploaded with f32 dense layers only".into(),
                ));
            }
        };
        let bias = match out {
            Out::Bf16 => dptr(b16, &stream),
            Out::F32 => dptr(&l.b, &stream),
        };
        let call = LtCall {
            n_out: l.n_out,
            n_in: l.n_in,
            batch,
            w: dptr(w16, &stream),
            bias,
            x,
            y,
            out,
            relu: l.relu,
        };
        let lt = self.lt.as_mut().ok_or_else(|| {
            CudaError::Input("bf16 dense layers without a cuBLASLt handle".into())
        })?;
        lt.linear(&stream, &call)
    }

    /// `y = bf16(x)` over `total` values.
    fn cast(&self, x: u64, y: u64, total: usize) -> Result<()> {
        if total == 0 {
            return Ok(());
        }
        let stream = self.m.gpu.compute();
        let total = total as i64;
        let mut b = stream.launch_builder(&self.to_bf16);
        b.arg(&x).arg(&y).arg(&total);
        // SAFETY: x holds `total` floats and y `total` bf16 values (sized at submit).
        unsafe { b.launch(grid(total)) }.ctx("launching a cast to bf16")?;
        Ok(())
    }

    /// The cross net's elementwise step: `xl += x0 * wide`, `xl16 = bf16(xl)`.
    fn cross_step(&self, xl: u64, x0: u64, wide: u64, xl16: u64, total: usize) -> Result<()> {
        if total == 0 {
            return Ok(());
        }
        let stream = self.m.gpu.compute();
        let total = total as i64;
        let mut b = stream.launch_builder(&self.cross_bf16);
        b.arg(&xl).arg(&x0).arg(&wide).arg(&xl16).arg(&total);
        // SAFETY: four [batch, top_in] buffers (three f32, one bf16), as the kernel reads.
        unsafe { b.launch(grid(total)) }.ctx("launching the cross update")?;
        Ok(())
    }
}
