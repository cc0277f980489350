//! A whole model on the GPU: the embedding stage ([`EmbedRun`]), the MLPs through cuBLAS, the
//! interaction as a kernel, and the sigmoid on the host (one float per sample).
//!
//! A [`GpuPredictor`] keeps two slots of device buffers. A batch's inputs are copied on the copy
//! stream into a free slot while the compute stream still runs the previous batch; the compute
//! stream waits for the copy (an event), runs the forward pass, and records "done"; the logits
//! come back on the copy stream after that event. [`GpuPredictor::submit`] and
//! [`GpuPredictor::collect`] expose the overlap (`bench model` keeps two batches in flight);
//! [`GpuPredictor::predict`] is both in one call (`predict` and `serve` use it).

mod forward;
mod predictor;

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice};
use ember_model::Model;
use ember_model::interaction::Interaction;
use ember_model::mlp::Linear;

use crate::device::Gpu;
use crate::embed::{EmbedRun, GpuEmbeddings};
use crate::error::{DriverCtx, Result};
use crate::hot::HotPlan;
use crate::staging::Pinned;
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
    /// The batch's dense features, page-locked for the copy ([`crate::staging`]).
    host_dense: Pinned<f32>,
    ready: CudaEvent,
    done: CudaEvent,
    /// Compute-stream marks: start, after embeddings, bottom MLP, interaction, top MLP.
    marks: [CudaEvent; 5],
    /// Copy-stream marks: around the batch's upload, around the download of its logits.
    copy_marks: [CudaEvent; 4],
}

impl Drop for Slot {
    fn drop(&mut self) {
        // `host_dense` is freed after this: the slot's last upload must have read it.
        let _ = self.ready.synchronize();
    }
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
