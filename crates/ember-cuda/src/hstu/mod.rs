//! An HSTU model (Meta's generative recommender, MLPerf DLRMv3) on the GPU: the CPU pass of
//! `ember_model::hstu::forward` step for step, every token of a batch on the device at once.
//!
//! - Lookups: the batch's token lookups (one keyed jagged batch, bags of 0 or 1 ids) through
//!   the GPU embedding stage ([`EmbedRun`]), the tables in HBM.
//! - The host computes only the small per-token tables of [`TokenPlan`] (positions, time
//!   buckets, action inputs, contextual slots, sequences, candidates' rows and time features)
//!   and uploads them with the ids.
//! - Linear layers: cuBLAS SGEMM in f32; in bf16, cuBLASLt on tensor cores with the bias in
//!   the epilogue (f32 accumulation, f32 outputs; activations cast to bf16 before each GEMM).
//! - Attention: Ember's kernels (`kernels/hstu.cu`), jagged, the causal and target-aware masks
//!   applied per element, no `L x L` matrix: f32 on CUDA cores, or bf16 on tensor cores
//!   (`mma.sync`) with the scores kept in registers between the two products.
//! - Norms, SiLU, the output assembly, the residual, the head's gathers: one kernel each.
//!
//! Parity: `tests/hstu_gpu.rs` checks f32 and bf16 scores against the CPU predictor.

mod cached;
mod forward;
mod held;
mod ops;
mod predictor;
mod sel;

pub use predictor::{AttentionKernel, GpuHstuPredictor};

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use ember_model::DenseDType;
use ember_model::hstu::layers::{Norm, SwishMlp};
use ember_model::hstu::{Columns, HstuModel, Postprocessor};

use crate::device::Gpu;
use crate::embed::GpuEmbeddings;
use crate::error::{CudaError, DriverCtx, Result};
use crate::model::DevLinear;

/// Query rows per attention block.
const TILE: usize = 64;
/// Rows past the last token in the bf16 copy of the projections: a tile's loads stay inside.
const PAD_ROWS: usize = TILE;

/// A layer norm on the device.
#[derive(Debug)]
struct DevNorm {
    w: CudaSlice<f32>,
    b: CudaSlice<f32>,
    eps: f32,
}

impl DevNorm {
    fn upload(gpu: &Gpu, n: &Norm) -> Result<DevNorm> {
        let s = gpu.compute();
        Ok(DevNorm {
            w: s.clone_htod(&n.weight).ctx("uploading a norm")?,
            b: s.clone_htod(&n.bias).ctx("uploading a norm")?,
            eps: n.eps,
        })
    }
}

/// `Linear -> SwishLayerNorm -> Linear [-> LayerNorm]`.
#[derive(Debug)]
struct DevMlp {
    first: DevLinear,
    swish: DevNorm,
    second: DevLinear,
    norm: Option<DevNorm>,
}

impl DevMlp {
    fn upload(gpu: &Gpu, m: &SwishMlp, dense: DenseDType) -> Result<DevMlp> {
        Ok(DevMlp {
            first: DevLinear::upload(gpu, &m.first, dense)?,
            swish: DevNorm::upload(gpu, &m.swish)?,
            second: DevLinear::upload(gpu, &m.second, dense)?,
            norm: m
                .norm
                .as_ref()
                .map(|n| DevNorm::upload(gpu, n))
                .transpose()?,
        })
    }
}

#[derive(Debug)]
struct DevLayer {
    input_norm: DevNorm,
    uvqk: DevLinear,
    output_norm: DevNorm,
    output: DevLinear,
}

#[derive(Debug)]
enum DevPost {
    Timestamp {
        combiner: Box<DevLinear>,
        norm: DevNorm,
    },
    LayerNorm(DevNorm),
    L2,
}

/// An [`HstuModel`]'s tables and weights on one device.
#[derive(Debug)]
pub struct GpuHstu {
    /// Where each role's rows are in a token's lookups.
    cols: Columns,
    gpu: Arc<Gpu>,
    model: Arc<HstuModel>,
    emb: GpuEmbeddings,
    dense: DenseDType,
    content: DevMlp,
    additional: Option<DevMlp>,
    action: Option<DevMlp>,
    ctx_w: CudaSlice<f32>,
    ctx_b: CudaSlice<f32>,
    positions: CudaSlice<f32>,
    times: CudaSlice<f32>,
    layers: Vec<DevLayer>,
    post: DevPost,
    item: DevMlp,
    head: DevMlp,
    /// Column pairs of the gathers: the post id, the additional features, the item features.
    post_pairs: CudaSlice<i32>,
    add_pairs: CudaSlice<i32>,
    item_pairs: CudaSlice<i32>,
    /// Device copies of the history cache's segments (`cached.rs`), and the bytes they may take.
    held: Mutex<held::DevHeld>,
    held_budget: usize,
}

impl GpuHstu {
    /// Uploads `model`'s tables (all in memory: HBM holds them) and its dense weights, the
    /// linear layers in `dense` (f32, or bf16 on tensor cores; int8 is refused).
    pub fn upload(gpu: &Arc<Gpu>, model: Arc<HstuModel>, dense: DenseDType) -> Result<GpuHstu> {
        if dense == DenseDType::Int8 {
            return Err(CudaError::Input(
                "int8 dense layers are not supported for hstu models (f32 or bf16)".into(),
            ));
        }
        if model.stager().is_active() {
            return Err(CudaError::Input(
                "an hstu model on the GPU needs its tables in memory (they are uploaded to the \
                 device); this one has tables on a tier"
                    .into(),
            ));
        }
        let emb = GpuEmbeddings::upload(gpu, model.embeddings(), None)?;
        let w = model.weights();
        let s = gpu.compute();
        let up = |v: &[f32]| s.clone_htod(v).ctx("uploading weights");
        let cols = model.columns();
        let pairs = |p: &[(usize, Option<usize>)]| -> Result<CudaSlice<i32>> {
            let mut v: Vec<i32> = p
                .iter()
                .flat_map(|&(a, b)| [a as i32, b.map_or(-1, |b| b as i32)])
                .collect();
            if v.is_empty() {
                v.push(-1);
            }
            s.clone_htod(&v).ctx("uploading columns")
        };
        let add: Vec<_> = cols.additional.iter().map(|&(a, b)| (a, Some(b))).collect();
        let items: Vec<_> = cols.items.iter().map(|&a| (a, None)).collect();
        let mlp = |m: &SwishMlp| DevMlp::upload(gpu, m, dense);
        let post = match &w.post {
            Postprocessor::Timestamp { combiner, norm } => DevPost::Timestamp {
                combiner: Box::new(DevLinear::upload(gpu, combiner, dense)?),
                norm: DevNorm::upload(gpu, norm)?,
            },
            Postprocessor::LayerNorm(n) => DevPost::LayerNorm(DevNorm::upload(gpu, n)?),
            Postprocessor::L2 => DevPost::L2,
        };
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(DevLayer {
                    input_norm: DevNorm::upload(gpu, &l.input_norm)?,
                    uvqk: DevLinear::upload(gpu, &l.uvqk, dense)?,
                    output_norm: DevNorm::upload(gpu, &l.output_norm)?,
                    output: DevLinear::upload(gpu, &l.output, dense)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let g = GpuHstu {
            gpu: gpu.clone(),
            dense,
            content: mlp(&w.content)?,
            additional: w.additional.as_ref().map(mlp).transpose()?,
            action: w.action.as_ref().map(|a| mlp(&a.mlp)).transpose()?,
            ctx_w: up(nonempty(&w.contextual_w))?,
            ctx_b: up(nonempty(&w.contextual_b))?,
            positions: up(&w.positions)?,
            times: up(&w.times)?,
            layers,
            post,
            item: mlp(&w.item)?,
            head: mlp(&w.head)?,
            post_pairs: pairs(&[(cols.post.0, Some(cols.post.1))])?,
            cols,
            add_pairs: pairs(&add)?,
            item_pairs: pairs(&items)?,
            emb,
            held: Mutex::default(),
            held_budget: 0,
            model,
        };
        s.synchronize().ctx("uploading the model")?;
        // With a cache of histories, its segments' copies take up to as much device memory as
        // the cache takes host memory, and at most half of what is free once the model is up.
        let held_budget = match g.model.history_cache() {
            Some(c) => {
                let (free, _) =
                    cudarc::driver::result::mem_get_info().ctx("reading free memory")?;
                c.config().bytes.min(free / 2)
            }
            None => 0,
        };
        Ok(GpuHstu { held_budget, ..g })
    }

    pub fn model(&self) -> &Arc<HstuModel> {
        &self.model
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn dense_dtype(&self) -> DenseDType {
        self.dense
    }

    /// Bytes of the tables on the device.
    pub fn table_bytes(&self) -> usize {
        self.emb.device_bytes()
    }

    /// Device memory the history cache's segment copies hold now, and may hold.
    pub fn held_bytes(&self) -> (usize, usize) {
        (held::lock(&self.held).bytes(), self.held_budget)
    }
}

fn nonempty(v: &[f32]) -> &[f32] {
    if v.is_empty() { &[0.0] } else { v }
}
