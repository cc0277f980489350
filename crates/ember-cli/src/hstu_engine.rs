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

/// An HSTU model on the device, shared by its engines.
#[cfg(feature = "cuda")]
type GpuModel = Arc<ember_cuda::GpuHstu>;

/// No model is ever on a device in a build without CUDA.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
enum GpuModel {}

/// `model`'s weights and tables copied to `gpu.device`, its linear layers in `dense`.
#[cfg(feature = "cuda")]
fn upload(gpu: &GpuArgs, model: Arc<HstuModel>, dense: DenseDType) -> Result<GpuModel> {
    let dev = crate::device::open_gpu(gpu.gpu)?;
    Ok(Arc::new(ember_cuda::GpuHstu::upload(&dev, model, dense)?))
}

#[cfg(not(feature = "cuda"))]
fn upload(_: &GpuArgs, _: Arc<HstuModel>, _: DenseDType) -> Result<GpuModel> {
    Err(crate::device::no_cuda())
}

/// A history cache divides each user's attention by its own length, so `--attention-norm
/// batch_max` is refused with one; a model whose config says batch_max gets no cache at all
/// (`HstuModel::set_history_cache`).
fn refuse_batch_max_with_cache(model: &HstuModel, norm: Option<AttentionNorm>) -> Result<()> {
    if model.history_cache().is_some() && norm == Some(AttentionNorm::BatchMax) {
        anyhow::bail!(
            "--history-cache-mb needs --attention-norm alone (a batch's longest length \
             changes with its users)"
        );
    }
    Ok(())
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
        refuse_batch_max_with_cache(&model, norm)?;
        let pass = if gpu.is_cuda() {
            let m = upload(gpu, model, dense)?;
            Self::on_gpu(gpu, &m, norm)?
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

    /// `serve --device cuda`: `instances` engines of `model` on `gpu.device`, sharing its one
    /// copy on the device (weights, tables), each with buffers and a kernel launch sequence of
    /// its own, so one batch's host work (checks, the token plan) runs beside another's pass.
    /// With a history cache the engines share it and its segments' copies on the device. A
    /// model with tables on a tier or int8 layers is refused here, before anything is served.
    pub fn gpu_instances(
        gpu: &GpuArgs,
        model: Arc<HstuModel>,
        instances: usize,
        norm: Option<AttentionNorm>,
    ) -> Result<Vec<HstuEngine>> {
        refuse_batch_max_with_cache(&model, norm)?;
        let servable: Arc<dyn Servable> = model.clone();
        let dense = model.config().dense_dtype;
        let m = upload(gpu, model, dense)?;
        (0..instances.max(1))
            .map(|_| {
                Ok(HstuEngine {
                    pass: Self::on_gpu(gpu, &m, norm)?,
                    servable: servable.clone(),
                })
            })
            .collect()
    }

    #[cfg(feature = "cuda")]
    fn on_gpu(gpu: &GpuArgs, m: &GpuModel, norm: Option<AttentionNorm>) -> Result<Pass> {
        let variant: ember_cuda::Variant = gpu.gpu_variant.parse()?;
        if variant.pins_l2() {
            anyhow::bail!(
                "--gpu-variant {variant} is not supported for hstu models (baseline, tuned, \
                 prefetch or dedup)"
            );
        }
        let mut p = ember_cuda::GpuHstuPredictor::new(m.clone(), variant)?;
        if let Some(n) = norm {
            p.set_attention_norm(n);
        }
        Ok(Pass::Gpu(Box::new(p)))
    }

    #[cfg(not(feature = "cuda"))]
    fn on_gpu(_: &GpuArgs, m: &GpuModel, _: Option<AttentionNorm>) -> Result<Pass> {
        match *m {}
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
                    format!(
                        "tensor cores (bf16, kernel {})",
                        p.attention_kernel().name()
                    )
                } else {
                    "CUDA cores (f32)".to_string()
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
