//! `ember bench model --device cuda`: the GPU loop. Batches are handed over page-locked and
//! checked on the device (`--gpu-inputs pinned`, as PyTorch's side pins its inputs), or checked
//! and staged by the host (`staged`, as `serve` runs them); several are in flight, and the host's
//! own time per batch is reported beside the GPU's stage times.

use super::load::Load;
use super::model_report::{HostTimes, Inputs, Report};
use anyhow::Result;
use ember_model::{Model, StageTimes};
use std::sync::Arc;
use std::time::Instant;

/// Where a GPU batch's inputs start (`--gpu-inputs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum GpuInputs {
    Pinned,
    Staged,
}

/// What the GPU loop needs of `bench model`'s flags.
pub(super) struct GpuLoop<'a> {
    pub gpu: &'a crate::gpu_args::GpuArgs,
    pub dense_dtype: ember_model::DenseDType,
    pub inputs: GpuInputs,
    pub in_flight: Option<usize>,
    pub warmup: usize,
    pub iters: usize,
}

impl GpuLoop<'_> {
    /// `--in-flight`, else 2 with pinned inputs (the copy engine is the limit: a third batch
    /// only waits) and 3 with staged ones (the host stages one while another copies and a
    /// third computes).
    pub fn in_flight(&self) -> usize {
        self.in_flight.unwrap_or(match self.inputs {
            GpuInputs::Pinned => 2,
            GpuInputs::Staged => 3,
        })
    }
}

/// The GPU loop: one batch is staged by the host while another is copied in and a third
/// computes; a batch's latency runs from its submit to its collect. Stage times are GPU times
/// (events).
pub(super) fn measure_gpu(
    a: &GpuLoop<'_>,
    model: Arc<Model>,
    batches: &[Inputs],
    load: &Load,
) -> Result<(Report, Vec<f32>, crate::gpu_args::GpuPredictor)> {
    let profile: Vec<_> = batches.iter().map(|(_, kj)| kj).collect();
    // Tuned on the largest batch at the features' mean ids per bag.
    let mean_pooling = load.pooling.iter().sum::<usize>() / load.pooling.len().max(1);
    let mut gp = a.gpu.predictor(
        model.clone(),
        a.dense_dtype,
        load.max_batch(),
        mean_pooling.max(1),
        Some(&profile),
    )?;
    gp.set_capacity(a.in_flight())?;
    let mut scores = vec![0f32; load.max_batch()];
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
    let total = start.elapsed().as_secs_f64();
    Ok((
        Report {
            lat_ms,
            samples,
            stages,
            total,
            host: Some(host),
            layers: None,
            accuracy: None,
        },
        scores,
        gp,
    ))
}
