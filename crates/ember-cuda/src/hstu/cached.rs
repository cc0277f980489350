//! [`GpuHstuPredictor::run_cached`]: the pass with a cache of users' histories, step for step as
//! the CPU's (`ember_model::hstu::reuse`). A user whose entry the cache lets stand computes only
//! its tokens past the entry (new history items and candidates: their lookups, inputs,
//! projections, and attention against the held keys and values); every user's slots and
//! history are kept for its next request.
//!
//! - **The cache is the model's** ([`HistoryCache`], host memory): it decides what each user
//!   reuses (the same checks, staleness bound, row-update log, disk and shared tiers as on the
//!   CPU) and holds the entries; a GPU and a CPU engine read each other's entries.
//! - **The device keeps copies of segments** (`held.rs`, in HBM): a segment uploaded for one
//!   request, or computed by one, stays on the device under a byte budget, least recently used
//!   out first, keyed by the host segment it copies (segments never change; a dropped one's
//!   copy is dropped at the next insert). A returning user's keys and values are then copied
//!   device to device each layer, not sent over PCIe.
//! - **The pass** (`forward.rs` with a `Sel`, `sel.rs`): the computed tokens' rows are compact in the
//!   norms, the MLPs and the GEMMs; the projections and attention keep the batch's token layout,
//!   the held tokens' `v` and `k` put there from their segments each layer (`hstu_kv`), the
//!   computed rows scattered beside them (`hstu_scatter`), attention's query tiles starting at
//!   each user's first computed token. The kept tokens' `v` and `k` are taken into a new device
//!   segment each layer, and downloaded for the host's entry after the pass.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use ember_model::hstu::cache::{Plan, epochs};
use ember_model::hstu::{AttentionNorm, CacheUse, HistoryCache, HstuBatch, HstuScores, HstuTimes};

use super::held::lock;
use super::ops::grid;
use super::predictor::GpuHstuPredictor;
use super::sel::{Piece, Sel};
use crate::device::dptr;
use crate::error::{CudaError, DriverCtx, Result};

/// One user's share of a cached pass: its plan, what it keeps (its tokens, counted from its
/// start, and the device segment they go to).
struct UserPass {
    plan: Plan,
    keep: Range<usize>,
    kept: Option<Arc<CudaSlice<f32>>>,
}

/// A cached pass's users, its selection, and every device segment it reads or writes (alive
/// until the pass is done).
struct Planned {
    users: Vec<UserPass>,
    sel: Sel,
    alive: Vec<Arc<CudaSlice<f32>>>,
}

impl GpuHstuPredictor {
    /// Scores `batch` with `cache` (see the module's doc): what each user reused is in the
    /// [`CacheUse`]. Each user's own length is the divisor (`attention_norm` `alone`).
    pub fn run_cached(
        &mut self,
        batch: &HstuBatch,
        cache: &HistoryCache,
    ) -> Result<(HstuScores, HstuTimes, CacheUse)> {
        if self.norm != AttentionNorm::Alone {
            return Err(CudaError::Input(
                "a cache of histories needs attention_norm alone (a batch's longest length \
                 changes with its users)"
                    .into(),
            ));
        }
        let start = Instant::now();
        let model = self.m.model.clone();
        // Before any row is read: an update landing during the pass is newer than the entry.
        let now = epochs(&model);
        let planned = self.plan_users(batch, cache)?;
        let plan = (planned.sel).compact(
            model.token_plan(batch, AttentionNorm::Alone),
            batch.tokens(),
        );
        // The pass ends with the stream synchronized: the kept segments are written.
        let (scores, mut times) = self.pass(batch, &plan, Some(&planned.sel))?;
        drop(planned.alive);
        let mut used = CacheUse {
            computed_tokens: planned.sel.tokens.len(),
            ..CacheUse::default()
        };
        for (u, up) in planned.users.into_iter().enumerate() {
            used.count(&up.plan, batch.slots());
            self.keep_entry(batch, u, up, cache, &now)?;
        }
        times.wall = start.elapsed();
        Ok((scores, times, used))
    }

    /// Each user's plan from `cache`, its held segments on the device (copied up where the
    /// device holds none) and a device segment for what it keeps.
    fn plan_users(&self, batch: &HstuBatch, cache: &HistoryCache) -> Result<Planned> {
        let m = self.m.clone();
        let s = m.gpu.compute().clone();
        let per_token = m.model.kv_per_token();
        let mut out = Planned {
            users: Vec::with_capacity(batch.len()),
            sel: Sel::default(),
            alive: Vec::new(),
        };
        for (u, span) in batch.users().iter().enumerate() {
            let plan = cache.plan(&m.model, batch, u);
            let (first, read, keep) = plan.tokens(batch, u);
            let mut row = span.start;
            for seg in &read {
                let copy = lock(&m.held).get(seg);
                let buf = match copy {
                    Some(b) => b,
                    None => {
                        // Shared before its copy has landed: another engine's pass that reads
                        // it is queued after the copy, because every engine of a model runs on
                        // the device's one compute stream. Engines on streams of their own would
                        // need an event here.
                        let b = Arc::new(s.clone_htod(&seg.kv).ctx("uploading a held segment")?);
                        lock(&m.held).put(seg, b.clone(), m.held_budget);
                        b
                    }
                };
                out.sel.held.push(Piece {
                    ptr: dptr(&buf, &s),
                    n: seg.tokens,
                    row,
                });
                row += seg.tokens;
                out.alive.push(buf);
            }
            let kept = match keep.is_empty() {
                true => None,
                false => {
                    let buf = Arc::new(
                        s.alloc_zeros::<f32>(keep.len() * per_token)
                            .ctx("allocating a kept segment")?,
                    );
                    out.sel.kept.push(Piece {
                        ptr: dptr(&buf, &s),
                        n: keep.len(),
                        row: span.start + keep.start,
                    });
                    Some(buf)
                }
            };
            out.sel.firsts.push(first);
            (out.sel.tokens).extend(span.start + first..span.start + batch.len_of(span));
            out.users.push(UserPass { plan, keep, kept });
        }
        Ok(out)
    }

    /// User `u`'s entry after the pass: the segments it read and the one it kept (downloaded
    /// for the host, its device copy kept), as of `now`'s epochs.
    fn keep_entry(
        &self,
        batch: &HstuBatch,
        u: usize,
        up: UserPass,
        cache: &HistoryCache,
        now: &[u64],
    ) -> Result<()> {
        let (Some(buf), Some(_)) = (up.kept, up.plan.key()) else {
            return Ok(());
        };
        let m = &self.m;
        let mut kv = vec![0.0f32; buf.len()];
        (m.gpu.compute())
            .memcpy_dtoh(&*buf, &mut kv)
            .ctx("downloading kept keys and values")?;
        if let Some(seg) = cache.keep_pass(batch, u, &up.plan, up.keep.len(), kv, now) {
            lock(&m.held).put(&seg, buf, m.held_budget);
        }
        Ok(())
    }

    /// `dst[rows[k]] = src[k]` for `n` rows of `w` values.
    pub(super) fn scatter(&self, src: u64, w: usize, rows: u64, n: usize, dst: u64) -> Result<()> {
        let total = (n * w) as i64;
        if total == 0 {
            return Ok(());
        }
        let (w_i, n_i) = (w as i32, n as i32);
        let s = self.m.gpu.compute();
        let mut b = s.launch_builder(&self.k.scatter);
        b.arg(&src).arg(&w_i).arg(&rows).arg(&n_i).arg(&dst);
        // SAFETY: src [n, w]; rows n distinct rows of dst [_, w] (the batch's tokens).
        unsafe { b.launch(grid(total)) }.ctx("launching a scatter")?;
        Ok(())
    }

    /// Layer `layer`'s keys and values between `pieces` (addresses, `(n, row)` pairs, count:
    /// [`Sel::upload_pieces`]) and `uvqk` (`[_, w]`): into `uvqk` with `to_uvqk`, else out.
    pub(super) fn kv(
        &self,
        pieces: (u64, u64, usize),
        layer: usize,
        heads: usize,
        uvqk: u64,
        w: usize,
        to_uvqk: bool,
    ) -> Result<()> {
        let (segs, meta, n) = pieces;
        if n == 0 {
            return Ok(());
        }
        let (layer_i, heads_i, w_i, to_i) = (layer as i32, heads as i32, w as i32, to_uvqk as i32);
        let s = self.m.gpu.compute();
        let mut b = s.launch_builder(&self.k.kv);
        b.arg(&segs)
            .arg(&meta)
            .arg(&layer_i)
            .arg(&heads_i)
            .arg(&uvqk)
            .arg(&w_i)
            .arg(&to_i);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 64, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: segs holds n addresses of live device segments ([layers][tokens][kv], kept
        // alive by `run_cached` until the stream is synchronized), meta n (tokens, row) pairs
        // with row + tokens <= the rows of uvqk [_, w].
        unsafe { b.launch(cfg) }.ctx("launching the keys and values' copy")?;
        Ok(())
    }
}
