//! [`EmbedRun`]: pools batches over a [`GpuEmbeddings`] with one variant: a batch's offsets,
//! ids and weights uploaded (checked once upstream), every launch group enqueued, the output
//! read back or left on the device for the model, launches timed with events.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use ember_embed::{CheckedView, EmbeddingCollection, Ids, KeyedJagged, Pooling};

use super::{EmbedRun, GpuEmbeddings, KernelStats, PinInfo, Variant};
use crate::device::{TIMED, dptr};
use crate::error::{CudaError, DriverCtx, Result};
use crate::kernels::{Launch, PoolConfig};
use crate::staging::fill;
use crate::tune::TuneCache;

impl EmbedRun {
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Uploads go through the copy stream; the caller makes the compute stream wait for them.
    pub(crate) fn upload_on_copy_stream(&mut self) {
        self.on_copy = true;
    }

    /// Uses `launch` for every group instead of the variant's choice (tests run every launch
    /// the tuner can pick).
    pub fn force_launch(&mut self, launch: Launch) {
        self.launches.iter_mut().for_each(|l| *l = launch);
        self.functions.clear();
        self.tuned = true;
    }

    /// Whether 64-bit ids may travel as 32-bit ones where every table allows (the default);
    /// off, the 64-bit kernels run (tests cover both).
    pub fn narrow_ids(&mut self, on: bool) {
        self.narrow_ids = on;
        self.uploaded = false;
    }

    /// Samples in the uploaded batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    pub(super) fn upload_stream(&self) -> Arc<cudarc::driver::CudaStream> {
        if self.on_copy {
            self.gpu.copy().clone()
        } else {
            self.gpu.compute().clone()
        }
    }

    /// The L2 window, for the pinning variants.
    pub fn pin_info(&self) -> Option<PinInfo> {
        self.pin
    }

    /// Validates `kj` against the collection `coll` that `emb` was uploaded from, and copies
    /// its offsets, ids and weights to the device.
    pub fn upload(
        &mut self,
        emb: &GpuEmbeddings,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
    ) -> Result<()> {
        self.upload_checked(emb, coll, kj).map(|_| ())
    }

    /// Copies the offsets, ids and weights of a batch validated against the collection `emb`
    /// was uploaded from (checked once upstream, not again) to the device.
    pub fn upload_valid(&mut self, emb: &GpuEmbeddings, batch: CheckedView<'_>) -> Result<()> {
        if batch.collection() != emb.source {
            return Err(CudaError::Input(
                "the collection is not the one these tables were uploaded from".into(),
            ));
        }
        self.stage(emb, batch.get(), None).map(|_| ())
    }

    /// Checks `kj` against `coll` (the collection `emb` was uploaded from) as it stages the
    /// batch: where ids travel as 32 bits, each id is read once, narrowed and checked in the
    /// same pass ([`EmbeddingCollection::check_view_narrowed`]), instead of once to check and
    /// again to stage. Errors are [`EmbeddingCollection::check_view`]'s.
    pub fn upload_checked<'a>(
        &mut self,
        emb: &GpuEmbeddings,
        coll: &EmbeddingCollection,
        kj: &'a KeyedJagged,
    ) -> Result<CheckedView<'a>> {
        if coll.id() != emb.source {
            return Err(CudaError::Input(
                "the collection is not the one these tables were uploaded from".into(),
            ));
        }
        let valid = self.stage(emb, kj, Some(coll))?;
        Ok(valid.expect("stage checks when given the collection"))
    }

    /// Enqueues on the upload stream the copies of a batch the caller holds in page-locked
    /// memory ([`crate::PinnedBatch`]): its 64-bit ids and offsets go to the device as they
    /// are, with no pass of the host over them. The ids are NOT checked here: the caller runs
    /// the device's check ([`crate::GpuPredictor`]) before any kernel reads them.
    pub(crate) fn upload_pinned(
        &mut self,
        emb: &GpuEmbeddings,
        batch: usize,
        offsets: &[i64],
        ids: &[i64],
    ) -> Result<()> {
        self.uploaded = false;
        if self.variant == Variant::Dedup {
            return Err(CudaError::Input(
                "the dedup variant reads the batch's offsets on the host: stage the batch \
                 (submit) instead of handing it over page-locked"
                    .into(),
            ));
        }
        if self.pooling == Pooling::WeightedSum {
            return Err(CudaError::Input(
                "weighted pooling needs per-id weights, which a page-locked batch does not carry"
                    .into(),
            ));
        }
        fits_one_launch(batch, ids.len())?;
        let gpu = self.gpu.clone();
        let stream = &self.upload_stream();
        let o = self.bufs.offsets.ensure(&gpu, offsets.len())?;
        stream
            .memcpy_htod(offsets, &mut o.slice_mut(..offsets.len()))
            .ctx("uploading offsets")?;
        let n = ids.len();
        let b = self.bufs.ids64.ensure(&gpu, n)?;
        stream
            .memcpy_htod(ids, &mut b.slice_mut(..n))
            .ctx("uploading ids")?;
        self.id64 = true;
        self.batch = batch;
        self.n_ids = n;
        self.bufs.out.ensure(&gpu, batch * emb.total_dim.max(1))?;
        self.uploaded = true;
        Ok(())
    }

    /// The device buffer the ids of [`EmbedRun::upload_pinned`] went to.
    pub(crate) fn ids64_ptr(&self) -> u64 {
        self.bufs.ids64.ptr(&self.gpu)
    }

    /// Stages `kj` and enqueues its copies; checks it against `check` when given (nothing is
    /// enqueued for a batch that fails).
    fn stage<'a>(
        &mut self,
        emb: &GpuEmbeddings,
        kj: &'a KeyedJagged,
        check: Option<&EmbeddingCollection>,
    ) -> Result<Option<CheckedView<'a>>> {
        // Until this upload completes, nothing may be launched over half-replaced buffers.
        self.uploaded = false;
        if kj.keys() != emb.names.as_slice() {
            if let Some(coll) = check {
                coll.check_view(kj)?; // names what differs
            }
            return Err(CudaError::Input(
                "the collection is not the one these tables were uploaded from".into(),
            ));
        }
        // The CPU's rule: weighted_sum needs weights, sum and mean refuse them.
        self.pooling.check_weights(kj).map_err(CudaError::Embed)?;
        let gpu = self.gpu.clone();
        let stream = &self.upload_stream();
        fits_one_launch(kj.batch_size(), kj.num_ids())?;
        // The host buffers are written below: the copies out of them must be done.
        if let Some(e) = &self.bufs.staged {
            e.synchronize().ctx("waiting for the last uploads")?;
        }
        let ctx = gpu.context().clone();
        let host = &mut self.bufs.host;
        // Every id is below its table's rows (checked upstream, or here): where all tables have
        // at most 2^32 rows, 64-bit ids travel as 32-bit ones.
        let narrow = self.narrow_ids && emb.tables.iter().all(|t| t.rows <= 1 << 32);
        let n = kj.num_ids();
        let id64 = matches!(kj.ids(), Ids::I64(_)) && !narrow;
        let mut valid = None;
        match kj.ids() {
            Ids::I64(v) if id64 => {
                if let Some(coll) = check {
                    valid = Some(coll.check_view(kj)?);
                }
                let h = host.ids64.get(&ctx, n)?;
                fill(h, v, |i| i);
                let b = self.bufs.ids64.ensure(&gpu, n)?;
                stream
                    .memcpy_htod(&*h, &mut b.slice_mut(..n))
                    .ctx("uploading ids")?;
            }
            ids => {
                let h = host.ids32.get(&ctx, n)?;
                match (check, ids) {
                    (Some(coll), _) => valid = Some(coll.check_view_narrowed(kj, h)?),
                    (None, Ids::I64(v)) => fill(h, v, |i| i as u32),
                    (None, Ids::U32(v)) => fill(h, v, |i| i),
                }
                let b = self.bufs.ids32.ensure(&gpu, n)?;
                stream
                    .memcpy_htod(&*h, &mut b.slice_mut(..n))
                    .ctx("uploading ids")?;
            }
        }
        self.id64 = id64;
        self.batch = kj.batch_size();
        self.n_ids = n;
        let n_off = kj.offsets().len();
        let offsets = host.offsets.get(&ctx, n_off)?;
        fill(offsets, kj.offsets(), |o| o as i64);
        let o = self.bufs.offsets.ensure(&gpu, n_off)?;
        stream
            .memcpy_htod(&*offsets, &mut o.slice_mut(..n_off))
            .ctx("uploading offsets")?;
        if let (Pooling::WeightedSum, Some(w)) = (self.pooling, kj.weights()) {
            let h = host.weights.get(&ctx, w.len())?;
            fill(h, w, |x| x);
            let b = self.bufs.weights.ensure(&gpu, w.len())?;
            stream
                .memcpy_htod(&*h, &mut b.slice_mut(..w.len()))
                .ctx("uploading weights")?;
        }
        let staged = match self.bufs.staged.take() {
            Some(e) => e,
            None => ctx.new_event(None).ctx("creating an event")?,
        };
        staged.record(stream).ctx("recording an event")?;
        self.bufs.staged = Some(staged);
        self.bufs
            .out
            .ensure(&gpu, self.batch * emb.total_dim.max(1))?;
        if self.variant == Variant::Dedup {
            // The batch's own offsets (the staging copy is write-combined, slow to read).
            self.prepare_dedup(emb, kj.offsets())?;
        }
        self.uploaded = true;
        Ok(valid)
    }

    pub(super) fn config(
        &self,
        emb: &GpuEmbeddings,
        g: usize,
        launch: Launch,
        id64: bool,
    ) -> PoolConfig {
        let group = &emb.groups[g];
        PoolConfig {
            dtype: group.dtype,
            shape: group.shape,
            launch,
            id64,
            pooling: self.pooling,
            // Dedup pools from compact rows, which are never renumbered.
            pin: emb.hot.is_some() && self.variant != Variant::Dedup,
        }
    }

    pub(super) fn function(
        &mut self,
        emb: &GpuEmbeddings,
        g: usize,
        launch: Launch,
        id64: bool,
    ) -> Result<CudaFunction> {
        let cfg = self.config(emb, g, launch, id64);
        self.gpu
            .function(&cfg.name(), || cfg.source(), &cfg.options(), "ember_pool")
    }

    /// The ids the pool kernel reads: the batch's, or the dedup inverse.
    pub(super) fn pool_ids(&self) -> (u64, bool) {
        let gpu = &self.gpu;
        if self.variant == Variant::Dedup {
            let d = self.dedup.as_ref().expect("prepared at upload");
            (d.inverse.ptr(gpu), false)
        } else if self.id64 {
            (self.bufs.ids64.ptr(gpu), true)
        } else {
            (self.bufs.ids32.ptr(gpu), false)
        }
    }

    /// Enqueues group `g`'s pooling with `func` and `launch`.
    pub(super) fn launch_group(
        &self,
        emb: &GpuEmbeddings,
        g: usize,
        func: &CudaFunction,
        launch: Launch,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let stream = gpu.compute();
        let group = &emb.groups[g];
        let bags = group.features.len() * self.batch;
        if bags == 0 {
            return Ok(());
        }
        let bags_per_block = (launch.block / group.shape.lanes) as usize;
        let blocks = bags.div_ceil(bags_per_block);
        let descs = match (&self.dedup, self.variant) {
            (Some(d), Variant::Dedup) => d.group_descs[g].ptr(gpu),
            _ => dptr(&group.descs, stream),
        };
        let n_feat = group.features.len() as i32;
        let batch = self.batch as i32;
        let offsets = self.bufs.offsets.ptr(gpu);
        let (ids, _) = self.pool_ids();
        let weights = self.bufs.weights.ptr(gpu);
        let out = self.bufs.out.ptr(gpu);
        let stride = emb.total_dim as i32;
        let mut b = stream.launch_builder(func);
        b.arg(&descs)
            .arg(&n_feat)
            .arg(&batch)
            .arg(&offsets)
            .arg(&ids)
            .arg(&weights)
            .arg(&out)
            .arg(&stride);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (launch.block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `ember_pool`'s signature (pointers as u64, ints as i32);
        // descriptors point into live tables; offsets, ids and weights hold the uploaded
        // (validated) batch, and `out` has batch x total_dim floats.
        unsafe { b.launch(cfg) }.ctx("launching the pooled lookup")?;
        Ok(())
    }

    /// Enqueues the pooling of the uploaded batch on the compute stream (tuning first where
    /// the variant asks for it and nothing is cached: in memory only).
    pub fn launch(&mut self, emb: &GpuEmbeddings) -> Result<()> {
        if !self.uploaded {
            return Err(CudaError::Input("no batch uploaded".into()));
        }
        // Raw driver calls (the dedup memsets) use the thread's current context.
        self.gpu
            .context()
            .bind_to_thread()
            .ctx("binding the context")?;
        if !self.tuned {
            self.tune(emb, &mut TuneCache::in_memory())?;
        }
        if self.variant == Variant::Dedup {
            self.launch_dedup(emb)?;
        }
        let (_, id64) = self.pool_ids();
        for g in 0..emb.groups.len() {
            let launch = self.launches[g];
            let func = match self.functions.get(&(g, id64)) {
                Some(f) => f.clone(),
                None => {
                    let f = self.function(emb, g, launch, id64)?;
                    self.functions.insert((g, id64), f.clone());
                    f
                }
            };
            self.launch_group(emb, g, &func, launch)?;
        }
        Ok(())
    }

    /// The pooled output of the last launch on the device (`batch x total_dim`, row-major).
    pub(crate) fn output_ptr(&self) -> u64 {
        self.bufs.out.ptr(&self.gpu)
    }

    /// Waits for the launch and copies the pooled output into `out` (`batch x total_dim`).
    pub fn download(&self, emb: &GpuEmbeddings, out: &mut [f32]) -> Result<()> {
        let need = self.batch * emb.total_dim;
        if out.len() != need {
            return Err(CudaError::Input(format!(
                "output has {} floats, the batch needs {need}",
                out.len()
            )));
        }
        if need == 0 {
            return Ok(());
        }
        let stream = self.gpu.compute();
        let buf = self.bufs.out.0.as_ref().expect("allocated at upload");
        stream
            .memcpy_dtoh(&buf.slice(..need), out)
            .ctx("downloading the pooled output")?;
        stream.synchronize().ctx("pooling")
    }

    /// Upload, launch and download in one call.
    pub fn pool(
        &mut self,
        emb: &GpuEmbeddings,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
        out: &mut [f32],
    ) -> Result<()> {
        self.upload(emb, coll, kj)?;
        self.launch(emb)?;
        self.download(emb, out)
    }

    /// Median microseconds of one whole launch (every group, and the dedup passes) of the
    /// uploaded batch, over `reps` timings of `iters` launches each.
    pub fn time(&mut self, emb: &GpuEmbeddings, iters: usize, reps: usize) -> Result<f64> {
        self.launch(emb)?;
        let stream = self.gpu.compute().clone();
        let ctx = self.gpu.context().clone();
        let mut times = Vec::new();
        for _ in 0..reps.max(1) {
            let start = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            let end = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            start.record(&stream).ctx("recording an event")?;
            for _ in 0..iters.max(1) {
                self.launch(emb)?;
            }
            end.record(&stream).ctx("recording an event")?;
            end.synchronize().ctx("timing")?;
            times.push(
                f64::from(start.elapsed_ms(&end).ctx("timing")?) * 1000.0 / iters.max(1) as f64,
            );
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Each launch group's kernel: shape, launch, registers, occupancy, tuning times.
    pub fn kernel_stats(&mut self, emb: &GpuEmbeddings) -> Result<Vec<KernelStats>> {
        let (_, id64) = self.pool_ids();
        let mut v = Vec::new();
        for (g, group) in emb.groups.iter().enumerate() {
            let launch = self.launches[g];
            let func = self.function(emb, g, launch, id64)?;
            let regs = func.num_regs().ctx("reading the register count")?;
            let local = func.local_size_bytes().ctx("reading the local memory")?;
            let blocks = func
                .occupancy_max_active_blocks_per_multiprocessor(launch.block, 0, None)
                .ctx("reading the occupancy")?;
            let choice = self.choices.get(g).copied().flatten();
            v.push(KernelStats {
                dtype: group.dtype.to_string(),
                features: group.features.len(),
                vec: group.shape.vec,
                lanes: group.shape.lanes,
                chunks: group.shape.chunks,
                block: launch.block,
                max_regs: launch.max_regs,
                prefetch: launch.prefetch,
                registers: regs,
                local_bytes: local,
                blocks_per_sm: blocks,
                occupancy: f64::from(blocks * launch.block)
                    / self.gpu.info().max_threads_per_sm.max(1) as f64,
                tuned_micros: choice.map(|c| c.micros),
                baseline_micros: choice.map(|c| c.baseline_micros),
            });
        }
        Ok(v)
    }
}

/// Refuses a batch too large for one launch. Dedup's hash table has next_pow2(2n) slots
/// numbered in 32 bits: n < 2^31.
fn fits_one_launch(batch: usize, ids: usize) -> Result<()> {
    if batch > i32::MAX as usize / 2 || ids >= 1 << 31 {
        return Err(CudaError::Input(format!(
            "a batch of {batch} samples and {ids} ids is too large for one launch (at most 2^31 \
             ids)"
        )));
    }
    Ok(())
}
