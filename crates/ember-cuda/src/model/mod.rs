//! A whole model on the GPU: the embedding stage ([`EmbedRun`]), the MLPs through cuBLAS, the
//! interaction as a kernel, and the sigmoid on the host (one float per sample).
//!
//! A [`GpuPredictor`] keeps three slots of device buffers ([`SLOTS`]). A batch's inputs are
//! checked as the host stages them in page-locked memory, then copied on the copy stream into a
//! free slot while the compute stream still runs the batch before; the compute stream waits
//! for the copy (an event), runs the forward pass, copies the logits back (4 bytes a sample) and
//! records "done". So the host stages one batch while another copies and a third computes.
//! [`GpuPredictor::submit`] and [`GpuPredictor::collect`] expose the overlap (`bench model`
//! keeps [`GpuPredictor::capacity`] batches in flight); [`GpuPredictor::predict`] is both in one
//! call (`predict` and `serve` use it).

mod forward;
mod forward_bf16;
pub(crate) mod lt;
mod pinned;
mod predictor;

pub(crate) use forward::{grid, sgemm_xwt};
pub use pinned::PinnedBatch;
pub use predictor::SLOTS;
pub(crate) use predictor::{grow, up};

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice};
use ember_model::interaction::Interaction;
use ember_model::mlp::Linear;
use ember_model::{DenseDType, Model};

use crate::device::Gpu;
use crate::embed::{EmbedRun, GpuEmbeddings};
use crate::error::{DriverCtx, Result};
use crate::hot::HotPlan;
use crate::staging::Pinned;
use crate::tune::TuneCache;

/// A linear layer on the device: f32 weights and bias, and with bf16 dense layers their bf16
/// copies too (the f32 bias serves layers whose output stays f32).
#[derive(Debug)]
pub(crate) struct DevLinear {
    pub(crate) w: CudaSlice<f32>,
    pub(crate) b: CudaSlice<f32>,
    pub(crate) w16: Option<CudaSlice<u16>>,
    pub(crate) b16: Option<CudaSlice<u16>>,
    pub(crate) n_in: usize,
    pub(crate) n_out: usize,
    pub(crate) relu: bool,
}

impl DevLinear {
    pub(crate) fn upload(gpu: &Gpu, l: &Linear, dense: DenseDType) -> Result<DevLinear> {
        let s = gpu.compute();
        let bf16 = |v: &[f32], what| -> Result<Option<CudaSlice<u16>>> {
            match dense {
                DenseDType::Bf16 => Ok(Some(s.clone_htod(&lt::to_bf16(v)).ctx(what)?)),
                _ => Ok(None),
            }
        };
        Ok(DevLinear {
            w: s.clone_htod(l.weight()).ctx("uploading weights")?,
            b: s.clone_htod(l.bias()).ctx("uploading biases")?,
            w16: bf16(l.weight(), "uploading bf16 weights")?,
            b16: bf16(l.bias(), "uploading bf16 biases")?,
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
    dense: DenseDType,
    /// Rows of each feature's table, for the device's check of page-locked batches.
    feature_rows: CudaSlice<i64>,
}

impl GpuModel {
    /// Uploads `model` (tables with `plan`'s hot rows renumbered, when given), its dense layers
    /// in the model's own precision ([`Model::dense_dtype`]).
    pub fn upload(gpu: &Arc<Gpu>, model: Arc<Model>, plan: Option<&HotPlan>) -> Result<GpuModel> {
        let dense = model.dense_dtype();
        GpuModel::upload_dense(gpu, model, plan, dense)
    }

    /// [`GpuModel::upload`] with the dense layers in `dense`: f32 (cuBLAS SGEMM), or bf16 on
    /// tensor cores (cuBLASLt, bias and ReLU in the GEMM's epilogue, f32 accumulation; the
    /// interaction's elementwise work and the embedding stage stay f32). int8 is refused.
    pub fn upload_dense(
        gpu: &Arc<Gpu>,
        model: Arc<Model>,
        plan: Option<&HotPlan>,
        dense: DenseDType,
    ) -> Result<GpuModel> {
        if dense == DenseDType::Int8 {
            return Err(crate::error::CudaError::Input(
                "int8 dense layers do not run on the GPU: use --dense-dtype f32 or bf16".into(),
            ));
        }
        if model.graph().is_some() {
            return Err(crate::error::CudaError::Input(
                "a graph model (its dense part an ONNX graph) runs on the CPU: leave out \
                 --device cuda"
                    .into(),
            ));
        }
        let emb = GpuEmbeddings::upload(gpu, model.embeddings(), plan)?;
        let lin = |ls: &[Linear]| -> Result<Vec<DevLinear>> {
            ls.iter()
                .map(|l| DevLinear::upload(gpu, l, dense))
                .collect()
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
            Interaction::Graph => unreachable!("refused above"),
            Interaction::Dcn { layers } => DevInteraction::Dcn {
                layers: layers
                    .iter()
                    .map(|c| {
                        Ok((
                            DevLinear::upload(gpu, &c.v, dense)?,
                            DevLinear::upload(gpu, &c.w, dense)?,
                        ))
                    })
                    .collect::<Result<_>>()?,
            },
        };
        let coll = model.embeddings();
        let rows: Vec<i64> = (0..coll.features().len())
            .map(|f| coll.table_of(f).rows() as i64)
            .collect();
        let feature_rows = gpu
            .compute()
            .clone_htod(if rows.is_empty() { &[0][..] } else { &rows })
            .ctx("uploading table sizes")?;
        gpu.compute().synchronize().ctx("uploading the model")?;
        Ok(GpuModel {
            feature_rows,
            gpu: gpu.clone(),
            model,
            emb,
            bottom,
            top,
            inter,
            dense,
        })
    }

    /// The precision its dense layers run in.
    pub fn dense_dtype(&self) -> DenseDType {
        self.dense
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
    /// bf16 dense layers: their activations (ping-pong), the cross net's xl and low-rank
    /// product in bf16.
    act16: [Option<CudaSlice<u16>>; 2],
    xl16: Option<CudaSlice<u16>>,
    low16: Option<CudaSlice<u16>>,
    /// A page-locked batch checked on the device: the batch (kept alive while its copies and
    /// check run), where each feature's ids start, and the check's first bad positions.
    pinned: Option<pinned::PinnedBatch>,
    starts: Option<CudaSlice<i64>>,
    bad: Option<CudaSlice<u64>>,
    host_bad: Pinned<u64>,
    batch: usize,
    /// The batch's dense features, page-locked for the copy ([`crate::staging`]).
    host_dense: Pinned<f32>,
    /// The batch's logits, copied back on the compute stream before `done`.
    host_logits: Pinned<f32>,
    ready: CudaEvent,
    done: CudaEvent,
    /// Compute-stream marks: start, after embeddings, bottom MLP, interaction, top MLP.
    marks: [CudaEvent; 5],
    /// Marks around the batch's upload (copy stream) and the download of its logits (compute
    /// stream).
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
    /// cuBLASLt, for bf16 dense layers.
    lt: Option<lt::Lt>,
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
    to_bf16: CudaFunction,
    cross_bf16: CudaFunction,
    check: CudaFunction,
}
