//! Where an HSTU model runs for `predict` and `bench model`: the CPU predictor, or with
//! `--device cuda` the GPU one (`ember_cuda::GpuHstuPredictor`: tables in HBM, linear layers
//! through cuBLAS / cuBLASLt, Ember's attention kernels); either is a [`Runner`] of the serving
//! seam.

use std::sync::Arc;

use anyhow::Result;
use ember_model::DenseDType;
use ember_model::hstu::{AttentionNorm, HstuModel, HstuPredictor};
use ember_model::serving::{Batched, Outputs, Runner, Servable, Times};

use crate::gpu_args::GpuArgs;

/// A predictor on the CPU or on a GPU, and the model it runs.
#[derive(Debug)]
pub struct HstuEngine {
    pass: Pass,
    servable: Arc<dyn Servable>,
}

#[derive(Debug)]
enum Pass {
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
        let servable: Arc<dyn Servable> = model.clone();
        if model.history_cache().is_some() && norm == Some(AttentionNorm::BatchMax) {
            anyhow::bail!(
                "--history-cache-mb needs --attention-norm alone (a batch's longest length \
                 changes with its users)"
            );
        }
        let pass = if gpu.is_cuda() {
            if model.history_cache().is_some() {
                anyhow::bail!(
                    "--history-cache-mb runs on the CPU; --device cuda has no history cache yet"
                );
            }
            Self::gpu(gpu, model, dense, norm)?
        } else {
            let mut p = HstuPredictor::new(model, threads)?;
            p.set_dense_dtype(dense)?;
            if let Some(n) = norm {
                p.set_attention_norm(n);
            }
            Pass::Cpu(Box::new(p))
        };
        Ok(HstuEngine { pass, servable })
    }

    #[cfg(feature = "cuda")]
    fn gpu(
        gpu: &GpuArgs,
        model: Arc<HstuModel>,
        dense: DenseDType,
        norm: Option<AttentionNorm>,
    ) -> Result<Pass> {
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
        Ok(Pass::Gpu(Box::new(p)))
    }

    #[cfg(not(feature = "cuda"))]
    fn gpu(
        _: &GpuArgs,
        _: Arc<HstuModel>,
        _: DenseDType,
        _: Option<AttentionNorm>,
    ) -> Result<Pass> {
        Err(crate::device::no_cuda())
    }

    /// What runs the pass, for people: "cpu, N threads" or the GPU's attention kernel.
    pub fn describe(&self) -> String {
        match &self.pass {
            Pass::Cpu(p) => {
                format!("cpu, {} threads, dense {}", p.threads(), p.dense_dtype())
            }
            #[cfg(feature = "cuda")]
            Pass::Gpu(p) => format!(
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
}

impl Runner for HstuEngine {
    fn servable(&self) -> &Arc<dyn Servable> {
        &self.servable
    }

    /// A batch from the model's [`Servable::prepare`]; on a GPU its tables are in HBM, so a
    /// batch with tier rows staged (tables on the SSD or remote tier) is refused.
    fn run(&mut self, batch: &Batched, out: &mut Outputs) -> ember_model::Result<Times> {
        let pass = &mut self.pass;
        ember_model::serving::run_staged_users(batch, out, |users, staged| match pass {
            Pass::Cpu(p) => p.run_served(users, staged),
            #[cfg(feature = "cuda")]
            Pass::Gpu(p) => {
                if staged.is_some() {
                    return Err(ember_model::ModelError::BadOption {
                        option: "device",
                        reason: "--device cuda needs every table in memory".into(),
                    });
                }
                let device = format!("cuda ({})", p.gpu_model().gpu().info().name);
                p.run(users).map_err(|e| e.into_model(device))
            }
        })
    }

    fn device(&self) -> String {
        self.describe()
    }
}
