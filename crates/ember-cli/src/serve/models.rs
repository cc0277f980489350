//! What `ember serve` serves: a repository's versions loaded as `--model` loads one directory
//! (either family), an HSTU model given with `--model`, and the line that says where a served
//! model's tables live and what runs it.

use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use ember_embed::DType;
use ember_model::serving::{Runner, Servable};
use ember_model::{Model, Pace};
use ember_serve::{LoadError, Server};

use super::{ServeArgs, runtime, serve_config, serve_until_stopped};
use crate::tier_args::TierArgs;

/// Loads a repository's model versions as `ember serve --model` would load one directory.
#[derive(Debug)]
pub(super) struct CliLoader {
    pub(super) tier: TierArgs,
    pub(super) dtype: Option<DType>,
    pub(super) dense_dtype: Option<ember_model::DenseDType>,
    pub(super) threads: usize,
}

impl ember_serve::Loader for CliLoader {
    fn load(&self, name: &str, dir: &Path, pace: Pace) -> Result<Arc<dyn Servable>, LoadError> {
        let mut opts = self.tier.load_options(self.dtype, self.dense_dtype);
        (opts.pace, opts.name) = (pace, Some(name.into()));
        let model = self
            .tier
            .load_any(dir, opts)
            // The CLI's loader adds context to the library's errors: its words, the chain once.
            .map_err(|e| LoadError::Loader(format!("{e:#}").into()))?;
        // A DLRM model's reduced-precision dense layers are checked against f32 as it loads;
        // the check's predictors are dropped before it returns.
        if let Ok(dlrm) = model.clone().into_any_arc().downcast::<Model>() {
            crate::dense::check_accuracy(&dlrm, name, self.threads);
        }
        Ok(model)
    }

    fn engine(&self, model: Arc<dyn Servable>) -> Result<Box<dyn Runner>, LoadError> {
        model.cpu_runner(self.threads).map_err(LoadError::Predictor)
    }
}

/// `--model DIR` of an HSTU model: its users batched as any model's items, on the CPU or, with
/// `--device cuda`, on one GPU (`--instances` engines sharing the model's one copy there).
pub(super) fn run_hstu(a: &ServeArgs, dir: &Path, io_threads: usize) -> anyhow::Result<()> {
    if a.plan.plan.is_some() || a.calibrate.is_some() {
        bail!(
            "an hstu model is served without a plan or a calibration (--plan shards a DLRM \
             model's tables; --calibrate fits a DLRM model's int8 layers)"
        );
    }
    let opts = a.tier.load_options(a.dtype, a.dense_dtype);
    let model = Arc::new(a.tier.load_hstu(dir, opts)?);
    let name = dir_name(dir);
    let cfg = serve_config(a, a.name.clone().unwrap_or(name))?;
    if a.gpu.is_cuda() {
        let runners: Vec<Box<dyn Runner>> =
            crate::hstu_engine::HstuEngine::gpu_instances(&a.gpu, model, a.instances, None)?
                .into_iter()
                .map(|e| Box::new(e) as Box<dyn Runner>)
                .collect();
        let rt = runtime(io_threads)?;
        let started = Server::start_runners(runners, cfg.clone());
        return serve_until_stopped(rt, a, cfg, started);
    }
    let rt = runtime(io_threads)?;
    let started = Server::start_servable(model, cfg.clone());
    serve_until_stopped(rt, a, cfg, started)
}

/// The model's name from its directory (`default` when it has none).
pub(super) fn dir_name(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "default".into())
}

/// Where a served model's tables live and what runs it: tables by placement, the row cache,
/// the forward threads, the kernels' instruction set and the device.
pub(super) fn placement_banner(a: &ServeArgs, s: &ember_serve::Served) -> String {
    let model = s.spec.servable();
    let mut by = std::collections::BTreeMap::<&str, usize>::new();
    for p in model.placements() {
        *by.entry(p).or_default() += 1;
    }
    let tables: Vec<String> = by.iter().map(|(p, n)| format!("{n} {p}")).collect();
    let tier = model.tier();
    let cache = match tier.is_active() {
        true => format!(
            "row cache {} rows ({})",
            tier.cache_rows(),
            crate::units::human_bytes(tier.counters().cache_bytes as usize)
        ),
        false => "no row cache".into(),
    };
    let isa = ember_embed::Isa::selected().map_or("?", |i| i.name());
    let dense = model.dense_dtype();
    let dense_on = ember_model::DenseIsa::selected(dense).map_or("?", |i| i.describe(dense));
    let device = match a.gpu.is_cuda() {
        true => format!("cuda:{}", a.gpu.gpu),
        false => "cpu".into(),
    };
    format!(
        "model '{}' v{}: tables {}; {cache}; {}{} forward thread(s); kernels {isa}; dense {dense} \
         ({dense_on}); device {device}",
        s.name(),
        s.version,
        tables.join(", "),
        if a.instances > 1 {
            format!("{} instances x ", a.instances)
        } else {
            String::new()
        },
        a.threads
    )
}
