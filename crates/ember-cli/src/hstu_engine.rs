//! Where an HSTU model runs for `predict` and `bench model`: the CPU predictor, or with
//! `--device cuda` the GPU one (`ember_cuda::GpuHstuPredictor`: tables in HBM, linear layers
//! through cuBLAS / cuBLASLt, Ember's attention kernels).

use std::sync::Arc;

use anyhow::Result;
use ember_model::DenseDType;
use ember_model::hstu::{
    AttentionNorm, HstuBatch, HstuModel, HstuPredictor, HstuScores, HstuTimes,
};

use crate::gpu_args::GpuArgs;

/// A predictor on the CPU or on a GPU.
#[derive(Debug)]
pub enum HstuEngine {
    Cpu(Box<HstuPredictor>),
    #[cfg(feature = "cuda")]
    Gpu(Box<ember_cuda::GpuHstuPredictor>),
}

impl HstuEngine {
    /// `model` on `gpu.device`: linear layers in `dense`, attention divided by `norm` (else as
    /// the model's config says), `threads` CPU threads (the CPU's pass, or the host's share).
    pub fn new(
        gpu: &GpuArgs,
        model: Arc<HstuModel>,
        threads: usize,
        dense: DenseDType,
        norm: Option<AttentionNorm>,
    ) -> Result<HstuEngine> {
        if gpu.is_cuda() {
            return Self::gpu(gpu, model, dense, norm);
        }
        let mut p = HstuPredictor::new(model, threads)?;
        p.set_dense_dtype(dense)?;
        if let Some(n) = norm {
            p.set_attention_norm(n);
        }
        Ok(HstuEngine::Cpu(Box::new(p)))
    }

    #[cfg(feature = "cuda")]
    fn gpu(
        gpu: &GpuArgs,
        model: Arc<HstuModel>,
        dense: DenseDType,
        norm: Option<AttentionNorm>,
    ) -> Result<HstuEngine> {
        let variant: ember_cuda::Variant = gpu.gpu_variant.parse()?;
        if variant.pins_l2() {
            anyhow::bail!(
                "--gpu-variant {variant} is not supported for hstu models (baseline, tuned, \
                 prefetch or dedup)"
            );
        }
        let dev = crate::device::open_gpu(gpu.gpu)?;
        let m = Arc::new(ember_cuda::GpuHstu::upload(&dev, model, dense)?);
        let mut p = ember_cuda::GpuHstuPredictor::new(m, variant)?;
        if let Some(n) = norm {
            p.set_attention_norm(n);
        }
        Ok(HstuEngine::Gpu(Box::new(p)))
    }

    #[cfg(not(feature = "cuda"))]
    fn gpu(
        _: &GpuArgs,
        _: Arc<HstuModel>,
        _: DenseDType,
        _: Option<AttentionNorm>,
    ) -> Result<HstuEngine> {
        Err(crate::device::no_cuda())
    }

    /// Scores a checked batch; where the time went.
    pub fn run(&mut self, batch: &HstuBatch) -> Result<(HstuScores, HstuTimes)> {
        Ok(match self {
            HstuEngine::Cpu(p) => p.run(batch)?,
            #[cfg(feature = "cuda")]
            HstuEngine::Gpu(p) => p.run(batch)?,
        })
    }

    /// What runs the pass, for people: "cpu, N threads" or the GPU's attention kernel.
    pub fn describe(&self) -> String {
        match self {
            HstuEngine::Cpu(p) => {
                format!("cpu, {} threads, dense {}", p.threads(), p.dense_dtype())
            }
            #[cfg(feature = "cuda")]
            HstuEngine::Gpu(p) => format!(
                "cuda ({}), dense {}, attention on {}",
                p.gpu_model().gpu().info().name,
                p.gpu_model().dense_dtype(),
                if p.tensor_core_attention() {
                    "tensor cores (bf16)"
                } else {
                    "CUDA cores (f32)"
                }
            ),
        }
    }

    pub fn is_gpu(&self) -> bool {
        !matches!(self, HstuEngine::Cpu(_))
    }
}
