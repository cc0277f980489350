//! The forward pass with a cache of users' histories ([`super::cache`]): a user whose entry the
//! cache lets stand computes only its tokens past the entry (new history items and
//! candidates: their lookups, inputs, projections, attention against the held keys and
//! values); every user's slots and history are kept for its next request. What a cached pass
//! on any device reads of a user's entry and keeps after it ([`Plan::tokens`],
//! [`HistoryCache::keep_pass`]) is here too.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::cache::{Entry, HistoryCache, Plan, Segment, epochs, fingerprint};
use super::config::AttentionNorm;
use super::forward::{HstuPredictor, HstuScores, HstuTimes};
use super::plan::AsOf;
use super::request::HstuBatch;
use super::stu::{Held, Rows};
use crate::error::{ModelError, Result};

/// What one cached pass reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheUse {
    /// Users whose entry was read.
    pub hits: usize,
    /// Tokens read from entries (not computed).
    pub held_tokens: usize,
    /// Tokens computed.
    pub computed_tokens: usize,
}

impl HstuPredictor {
    /// Scores a served batch: through the model's cache of users' histories where it has one
    /// (the batch then staged by the pass itself, only the rows it computes), else as
    /// [`HstuPredictor::run_staged`] with `staged`.
    pub fn run_served(
        &mut self,
        batch: &HstuBatch,
        staged: Option<&ember_embed::StagedBatch>,
    ) -> Result<(HstuScores, HstuTimes)> {
        match self.model().history_cache().cloned() {
            Some(cache) => self.run_cached(batch, &cache).map(|(s, t, _)| (s, t)),
            None => self.run_staged(batch, staged),
        }
    }

    /// Scores `batch` with `cache` (see the module's doc): what each user reused is in the
    /// [`CacheUse`]. Each user's own length is the divisor (`attention_norm` `alone`).
    pub fn run_cached(
        &mut self,
        batch: &HstuBatch,
        cache: &HistoryCache,
    ) -> Result<(HstuScores, HstuTimes, CacheUse)> {
        if self.attention_norm() != AttentionNorm::Alone {
            return Err(ModelError::BadOption {
                option: "history_cache",
                reason: "needs attention_norm alone (a batch's longest length changes with its \
                         users)"
                    .into(),
            });
        }
        let model = self.model().clone();
        let per_token = model.kv_per_token();
        let slots = batch.slots();
        // Before any row is read: an update landing during the pass is newer than the entry.
        let now = epochs(&model);
        let mut held = Held::none();
        let mut firsts = Vec::with_capacity(batch.len());
        let mut plans = Vec::with_capacity(batch.len());
        for u in 0..batch.len() {
            let plan = cache.plan(&model, batch, u);
            let (first, read, keep) = plan.tokens(batch, u);
            held.kept.push(vec![0.0; keep.len() * per_token]);
            held.keep.push(keep);
            held.read.push(read);
            firsts.push(first);
            plans.push(plan);
        }
        let rows = Rows::from(batch, firsts);
        let t0 = Instant::now();
        let lookups = (!rows.is_all()).then(|| batch.lookups.select(rows.tokens()));
        let view = lookups.as_ref().unwrap_or(&batch.lookups);
        let staged = match model.stager().is_active() {
            true => Some(model.stager().stage(model.embeddings(), view.view())?),
            false => None,
        };
        let staging = t0.elapsed();
        let (scores, mut times) = self.pass_rows(
            batch,
            lookups.as_ref(),
            staged.as_ref(),
            &[],
            &rows,
            &mut held,
        )?;
        times.lookups += staging;
        times.wall += staging;
        let mut used = CacheUse {
            computed_tokens: rows.len(batch),
            ..CacheUse::default()
        };
        // Each user's entry from now on: the segments it read, and the one it kept.
        let kept = held.keep.into_iter().zip(held.kept);
        for ((u, plan), (keep, kv)) in plans.iter().enumerate().zip(kept) {
            used.count(plan, slots);
            if !keep.is_empty() {
                cache.keep_pass(batch, u, plan, keep.len(), kv, &now);
            }
        }
        Ok((scores, times, used))
    }
}

impl CacheUse {
    /// Counts a user of `slots` contextual slots under `plan`: a hit and its held tokens where
    /// it reuses its entry.
    pub fn count(&mut self, plan: &Plan, slots: usize) {
        if let Plan::Reuse { entry, .. } = plan {
            self.hits += 1;
            self.held_tokens += slots + entry.history;
        }
    }
}

impl Plan {
    /// What a pass does with user `u` of `batch` under this plan, its tokens counted from its
    /// start: its first computed token (past the slots and history its entry holds), the
    /// segments it reads, and the tokens whose keys and values it keeps (its computed slots
    /// and history; none without a key). Every engine's cached pass takes it from here.
    pub fn tokens(&self, batch: &HstuBatch, u: usize) -> (usize, Vec<Arc<Segment>>, Range<usize>) {
        let (first, read) = match self {
            Plan::Reuse { entry, .. } => (batch.slots() + entry.history, entry.segments.clone()),
            _ => (0, Vec::new()),
        };
        let keep = match self {
            Plan::Uncached => 0..0,
            _ => first..batch.slots() + batch.users()[u].history,
        };
        (first, read, keep)
    }

    /// The user's key in the cache (none: not cached).
    pub fn key(&self) -> Option<u64> {
        match self {
            Plan::Uncached => None,
            Plan::Fresh { key } | Plan::Reuse { key, .. } => Some(*key),
        }
    }
}

impl HistoryCache {
    /// After a pass under `plan`: user `u`'s entry from now on, the segments its entry held
    /// and then the one it kept (`tokens` tokens' values `kv`, as of this request), with the
    /// tables' epochs `now` taken before the pass read any row. Returns the kept segment;
    /// nothing for a user without a key.
    pub fn keep_pass(
        &self,
        batch: &HstuBatch,
        u: usize,
        plan: &Plan,
        tokens: usize,
        kv: Vec<f32>,
        now: &[u64],
    ) -> Option<Arc<Segment>> {
        let key = plan.key()?;
        let (_, mut segments, _) = plan.tokens(batch, u);
        let seg = Arc::new(Segment {
            tokens,
            as_of: AsOf::of(batch, u),
            kv,
        });
        segments.push(seg.clone());
        let history = batch.users()[u].history;
        let entry = Entry {
            history,
            fingerprint: fingerprint(batch, u, history),
            epochs: now.to_vec(),
            segments,
        };
        self.insert(key, entry);
        Some(seg)
    }
}
