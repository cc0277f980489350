//! `ember bench model --device cuda` for a GPU engine that keeps batches in flight (a DLRM
//! model's `GpuPredictor`, which takes a batch's dense values and ids as they are, not through
//! the seam's one-batch-at-a-time [`Runner`]). Batches are handed over page-locked and checked
//! on the device (`--gpu-inputs pinned`, as PyTorch's side pins its inputs), or checked and
//! staged by the host (`staged`, as `serve` runs them); several are in flight, and the host's
//! own time per batch is reported beside the GPU's stage times. Models whose GPU engine runs a
//! batch at a time take `model.rs`'s loop.

use super::model_args::{Built, GpuInputs, GpuLoop, ModelArgs, sizes};
use super::model_report::{HostTimes, Measured};
use anyhow::Result;
use ember_embed::KeyedJagged;
use ember_model::presets::random_batch_pooled;
use ember_model::serving::{EngineRunner, Runner, Times, Workload};
use ember_model::{Model, StageTimes};
use std::sync::Arc;
use std::time::Instant;

/// One input batch: dense values and sparse ids.
type Inputs = (Vec<f32>, KeyedJagged);

/// Distinct batches cycled through.
const DISTINCT_BATCHES: usize = 32;

/// With `--device cuda`, a model whose GPU engine keeps batches in flight, and synthetic
/// batches: the pipelined loop's measurements and the engine (for the accuracy check); else
/// `None`.
pub(super) fn pipelined(
    gl: &GpuLoop<'_>,
    b: &Built,
    a: &ModelArgs,
) -> Result<Option<(Measured, Box<dyn Runner>)>> {
    if !gl.gpu.is_cuda() || a.requests.is_some() {
        return Ok(None);
    }
    let Ok(model) = b.model.clone().into_any_arc().downcast::<Model>() else {
        return Ok(None);
    };
    let features = model.config().features().len();
    let pooling = match (a.pooling, b.preset.as_ref().and_then(|p| p.pooling.clone())) {
        (Some(n), _) => vec![n; features],
        (None, Some(p)) => p,
        (None, None) => vec![1; features],
    };
    let sizes: Vec<usize> = sizes(a).into_iter().map(|n| n.unwrap_or(64)).collect();
    let distinct = DISTINCT_BATCHES.div_ceil(sizes.len()) * sizes.len();
    let batches: Vec<Inputs> = (0..distinct.min(gl.warmup + gl.iters))
        .map(|i| {
            let seed = a.seed ^ (i as u64 + 1) << 8;
            random_batch_pooled(model.config(), sizes[i % sizes.len()], &pooling, seed)
        })
        .collect();
    let max_batch = sizes.iter().copied().max().unwrap_or(1);
    let (mut m, gp) = measure_gpu(gl, model.clone(), &batches, &pooling, max_batch)?;
    // The family's count for one sample, times the samples timed.
    let one = Workload {
        items: Some(1),
        pooling: Some(pooling.clone()),
        ..Workload::default()
    };
    let per_sample = b.model.flops(&*b.model.synthetic(&one, 0)?);
    let n = m.items as f64;
    m.add_flops(
        &per_sample
            .iter()
            .map(|&(s, f)| (s, f * n))
            .collect::<Vec<_>>(),
    );
    Ok(Some((m, Box::new(EngineRunner::new(Box::new(gp))))))
}

/// The GPU loop: one batch is staged by the host while another is copied in and a third
/// computes; a batch's latency runs from its submit to its collect. Stage times are GPU times
/// (events).
fn measure_gpu(
    a: &GpuLoop<'_>,
    model: Arc<Model>,
    batches: &[Inputs],
    pooling: &[usize],
    max_batch: usize,
) -> Result<(Measured, crate::gpu_args::GpuPredictor)> {
    let profile: Vec<_> = batches.iter().map(|(_, kj)| kj).collect();
    // Tuned on the largest batch at the features' mean ids per bag.
    let mean_pooling = pooling.iter().sum::<usize>() / pooling.len().max(1);
    let mut gp = a.gpu.predictor(
        model.clone(),
        a.dense_dtype,
        max_batch,
        mean_pooling.max(1),
        Some(&profile),
    )?;
    gp.set_capacity(a.in_flight())?;
    let mut scores = vec![0f32; max_batch];
    // Page-locked copies of the batches, made ahead and not timed.
    let pinned = match a.inputs {
        GpuInputs::Pinned => batches
            .iter()
            .map(|(d, s)| gp.pin(d, s))
            .collect::<Result<Vec<_>, _>>()?,
        GpuInputs::Staged => Vec::new(),
    };
    let submit = |gp: &mut crate::gpu_args::GpuPredictor, i: usize| -> Result<()> {
        let i = i % batches.len();
        match pinned.get(i) {
            Some(p) => gp.submit_pinned(p)?,
            None => gp.submit(&batches[i].0, &batches[i].1)?,
        }
        Ok(())
    };
    for i in 0..a.warmup {
        let n = batches[i % batches.len()].1.batch_size();
        submit(&mut gp, i)?;
        gp.collect(&mut scores[..n])?;
    }
    let mut lat_ms = Vec::with_capacity(a.iters);
    let mut stages = StageTimes::default();
    let mut host = HostTimes::default();
    let mut samples = 0;
    // Each batch in flight: when it was submitted and its samples.
    let mut submitted = std::collections::VecDeque::new();
    let mut collect = |gp: &mut crate::gpu_args::GpuPredictor,
                       host: &mut HostTimes,
                       n: usize|
     -> Result<StageTimes> {
        let t = Instant::now();
        let st = gp.collect(&mut scores[..n])?;
        host.wait += t.elapsed();
        Ok(st)
    };
    let start = Instant::now();
    for i in 0..a.iters {
        let s = &batches[(a.warmup + i) % batches.len()].1;
        if gp.in_flight() == gp.capacity() {
            let (t, n): (Instant, usize) = submitted.pop_front().expect("one per submit");
            stages = stages.plus(collect(&mut gp, &mut host, n)?);
            lat_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let t = Instant::now();
        submitted.push_back((t, s.batch_size()));
        samples += s.batch_size();
        submit(&mut gp, a.warmup + i)?;
        host.submit += t.elapsed();
    }
    while gp.in_flight() > 0 {
        let (t, n) = submitted.pop_front().expect("one per submit");
        stages = stages.plus(collect(&mut gp, &mut host, n)?);
        lat_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut m = Measured {
        lat_ms,
        items: samples,
        values: samples,
        wall: start.elapsed().as_secs_f64(),
        host: Some(host),
        ..Measured::default()
    };
    m.times.add(&Times::from(stages));
    Ok((m, gp))
}
