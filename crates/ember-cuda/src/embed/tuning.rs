//! The tuned variants' choice of launch per group: from the autotuner's cache when it knows this
//! device, group and workload class, else by timing the candidates ([`crate::tune`]'s grids) on
//! the uploaded batch.

use cudarc::driver::sys;

use super::{EmbedRun, GpuEmbeddings, Variant};
use crate::device::TIMED;
use crate::error::{CudaError, DriverCtx, Result};
use crate::kernels::Launch;
use crate::tune::{self, TuneCache, TuneChoice};

impl EmbedRun {
    /// Chooses each group's launch for the tuned variants: from `cache` when it knows this
    /// device, group and workload class, else by timing the candidates on the uploaded batch
    /// (and recording the winner in `cache`).
    pub fn tune(&mut self, emb: &GpuEmbeddings, cache: &mut TuneCache) -> Result<()> {
        if self.tuned {
            return Ok(());
        }
        if !self.uploaded {
            return Err(CudaError::Input(
                "upload a representative batch before tuning".into(),
            ));
        }
        let combined = self.variant == Variant::Combined;
        let device = format!(
            "{} sm_{}{}",
            self.gpu.info().name,
            self.gpu.info().compute_capability.0,
            self.gpu.info().compute_capability.1
        );
        let mean_bag = self.n_ids as f64 / (self.batch * emb.feat_table.len()).max(1) as f64;
        self.choices = vec![None; emb.groups.len()];
        for g in 0..emb.groups.len() {
            let (_, id64) = self.pool_ids();
            let dims: Vec<usize> = emb.groups[g]
                .features
                .iter()
                .map(|&f| emb.feat_dim[f])
                .collect();
            let key = tune::key(
                &device,
                &self.config(emb, g, Launch::BASELINE, id64),
                &dims,
                self.batch,
                mean_bag,
                combined,
            );
            let choice = match cache.get(&key) {
                Some(c) => *c,
                None => {
                    let baseline = self.time_group(emb, g, Launch::BASELINE, id64)?;
                    let mut best = (Launch::BASELINE, baseline);
                    // Candidates that compile to the same registers and block as one already
                    // timed are the same kernel: skipped.
                    let mut seen = std::collections::HashSet::new();
                    for l in tune::occupancy_grid(1) {
                        if let Some(t) = self.try_time(emb, g, l, id64, &mut seen)?
                            && t < best.1
                        {
                            best = (l, t);
                        }
                    }
                    if combined {
                        for l in tune::prefetch_grid(best.0) {
                            if let Some(t) = self.try_time(emb, g, l, id64, &mut seen)?
                                && t < best.1
                            {
                                best = (l, t);
                            }
                        }
                    }
                    let c = TuneChoice {
                        launch: best.0,
                        micros: best.1,
                        baseline_micros: baseline,
                    };
                    cache.insert(key, c);
                    c
                }
            };
            self.launches[g] = choice.launch;
            self.choices[g] = Some(choice);
        }
        self.tuned = true;
        Ok(())
    }

    /// Times a candidate; `None` when it is a kernel already timed (same block, registers and
    /// prefetch depth) or cannot launch (too many registers for the block).
    pub(super) fn try_time(
        &mut self,
        emb: &GpuEmbeddings,
        g: usize,
        l: Launch,
        id64: bool,
        seen: &mut std::collections::HashSet<(u32, i32, u32)>,
    ) -> Result<Option<f64>> {
        let regs = self
            .function(emb, g, l, id64)?
            .num_regs()
            .ctx("reading the register count")?;
        if !seen.insert((l.block, regs, l.prefetch)) {
            return Ok(None);
        }
        match self.time_group(emb, g, l, id64) {
            Ok(t) => Ok(Some(t)),
            Err(CudaError::Driver { source, .. })
                if source.0 == sys::cudaError_enum::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Median microseconds of one launch of group `g` with `launch` (after a warm-up).
    pub(super) fn time_group(
        &mut self,
        emb: &GpuEmbeddings,
        g: usize,
        launch: Launch,
        id64: bool,
    ) -> Result<f64> {
        let func = self.function(emb, g, launch, id64)?;
        let stream = self.gpu.compute().clone();
        let ctx = self.gpu.context().clone();
        if self.variant == Variant::Dedup {
            self.launch_dedup(emb)?;
        }
        self.launch_group(emb, g, &func, launch)?;
        let mut times = Vec::new();
        for _ in 0..5 {
            let start = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            let end = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            start.record(&stream).ctx("recording an event")?;
            for _ in 0..4 {
                self.launch_group(emb, g, &func, launch)?;
            }
            end.record(&stream).ctx("recording an event")?;
            end.synchronize().ctx("timing a launch")?;
            times.push(f64::from(start.elapsed_ms(&end).ctx("timing a launch")?) * 1000.0 / 4.0);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}
