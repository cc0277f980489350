//! What runs a model of any family as the flags ask (`--device`, `--threads`, `--plan`,
//! `--attention-norm`, a dense precision): its family's engine on that device, as a
//! [`Runner`]. The one place in the tools that builds a family's engine: `predict` and
//! `bench model` name no family (`serve` builds its runners through the same seam).

use std::sync::Arc;

use anyhow::{Result, bail};
use ember_model::hstu::HstuModel;
use ember_model::serving::{EngineRunner, Items, Runner, Servable};
use ember_model::{DenseDType, Engine, Model, Predictor};

use crate::gpu_args::GpuArgs;
use crate::hstu_engine::HstuEngine;
use crate::plan::PlanArgs;

/// The flags that choose an engine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunnerArgs<'a> {
    pub gpu: &'a GpuArgs,
    pub threads: usize,
    /// The most items a GPU engine is sized for.
    pub batch: usize,
    /// `--plan`: a DLRM model's tables sharded over worker pools.
    pub plan: Option<&'a PlanArgs>,
    /// What an HSTU model's attention is divided by [default: the model's].
    pub attention_norm: Option<&'a str>,
    /// The dense layers' precision [default: the model's own].
    pub dense: Option<DenseDType>,
    /// Check reduced-precision dense layers against f32 first and say so (a DLRM model on the
    /// CPU).
    pub check_dense: bool,
}

/// The runner of `model` (named `name` in messages) that `a` asks for.
pub(crate) fn runner(
    a: &RunnerArgs<'_>,
    model: Arc<dyn Servable>,
    name: &str,
) -> Result<Box<dyn Runner>> {
    let model = match model.into_any_arc().downcast::<HstuModel>() {
        Ok(hstu) => {
            if a.plan.is_some_and(|p| p.plan.is_some()) {
                bail!(
                    "--plan shards a DLRM model's tables over worker pools; an hstu model runs on one pool"
                );
            }
            let norm = a.attention_norm.map(str::parse).transpose()?;
            let dense = a.dense.unwrap_or(hstu.config().dense_dtype);
            return Ok(Box::new(HstuEngine::new(
                a.gpu, hstu, a.threads, dense, norm,
            )?));
        }
        Err(other) => other
            .downcast::<Model>()
            .map_err(|_| anyhow::anyhow!("a model of a family these tools cannot run"))?,
    };
    if a.attention_norm.is_some() {
        bail!(
            "--attention-norm sets what an hstu model's attention is divided by; this model has no attention"
        );
    }
    Ok(Box::new(EngineRunner::new(dlrm_engine(a, &model, name)?)))
}

/// A DLRM-family model's engine: the CPU predictor (with a sharding plan or not) or a GPU's;
/// on the CPU, reduced-precision dense layers are checked against f32 first when asked.
fn dlrm_engine(a: &RunnerArgs<'_>, model: &Arc<Model>, name: &str) -> Result<Box<dyn Engine>> {
    let dense = a.dense.unwrap_or(model.dense_dtype());
    if a.check_dense
        && !a.gpu.is_cuda()
        && let Some((warn, line)) = crate::dense::accuracy_line(model, name, a.threads)
    {
        eprintln!("{}{line}", if warn { "warning: " } else { "" });
    }
    let planned = a.plan.is_some_and(|p| p.plan.is_some());
    if a.gpu.is_cuda() && planned {
        bail!("--plan runs on CPU worker pools; with --device cuda the model runs on one GPU");
    }
    Ok(match (a.gpu.is_cuda(), a.plan) {
        (true, _) => {
            if model.stager().is_active() {
                bail!("--device cuda needs every table in memory (no --placement ssd)");
            }
            Box::new(a.gpu.predictor(model.clone(), dense, a.batch, 1, None)?)
        }
        (false, plan) => {
            let mut p = match plan {
                Some(plan) => plan.predictor(model.clone(), a.threads)?,
                None => Predictor::new(model.clone(), a.threads)?,
            };
            if dense != p.dense().0 {
                p.set_dense_dtype(dense)?;
            }
            Box::new(p)
        }
    })
}

/// Calibrates `model`'s int8 dense layers on `requests` where its family has a calibration
/// (a DLRM model's smoothing, once, before its int8 weights are packed); else nothing.
pub(crate) fn calibrate_int8(
    model: &Arc<dyn Servable>,
    requests: &[&dyn Items],
    threads: usize,
) -> Result<()> {
    let Ok(m) = model.clone().into_any_arc().downcast::<Model>() else {
        return Ok(());
    };
    if m.graph().is_some() {
        // Its int8 layers quantize each batch's activations as they run.
        return Ok(());
    }
    let samples: Vec<ember_model::Samples> = requests
        .iter()
        .filter_map(|r| r.as_any().downcast_ref::<ember_model::Samples>().cloned())
        .collect();
    let batch = samples.iter().map(|s| s.len()).max().unwrap_or(1);
    Predictor::calibrate_int8_samples(&m, threads, &samples, batch)?;
    Ok(())
}
