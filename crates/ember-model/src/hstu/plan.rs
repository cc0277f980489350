//! The host's share of an HSTU forward pass, written once for every engine: where each role's
//! rows sit in a token's lookups ([`Columns`]), and per batch the small per-token tables an
//! engine reads besides the embedding rows ([`TokenPlan`]: position and time-bucket rows, the
//! action encoder's inputs, the contextual slots, the users' sequences as attention sees them,
//! the candidates' rows and time features). The CPU pass (`forward.rs`, `head.rs`) and the GPU
//! pass (`ember-cuda`'s `hstu` module) both build their inputs through these functions.

use super::attention::Seq;
use super::config::{AttentionNorm, TimeBucketClamp};
use super::request::HstuBatch;
use super::{ACTION_DIM, HstuModel, TIME_FEATURES};

/// Where each role's rows are in one token's lookups (`total` values: every feature's row, in
/// the embedding collection's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    /// Values per table row (`hstu_embedding_table_dim`).
    pub td: usize,
    /// Values per token's lookups.
    pub total: usize,
    /// The post id: its column at history tokens and its candidate counterpart's.
    pub post: (usize, usize),
    /// The additional features: (history column, candidate column), in the MLP's input order.
    pub additional: Vec<(usize, usize)>,
    /// The item features' columns (at candidate tokens), in the item MLP's input order.
    pub items: Vec<usize>,
}

/// One contextual slot of one user: its token, its slot, and the column of its feature's row,
/// `None` where the user is too short for the feature (the slot is then its bias alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextualSlot {
    pub token: usize,
    pub slot: usize,
    pub col: Option<usize>,
}

/// Per batch, what an engine needs besides the lookups.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenPlan {
    /// Per token: its row of the position table.
    pub positions: Vec<u32>,
    /// Per token: its row of the time-bucket table.
    pub buckets: Vec<u32>,
    /// Values per token of the action encoder's input (0 without one).
    pub action_width: usize,
    /// `[tokens, action_width]`: the history's action embeddings, the candidates' target.
    pub actions: Vec<f32>,
    pub contextual: Vec<ContextualSlot>,
    /// The users' sequences, with what attention divides by.
    pub seqs: Vec<Seq>,
    /// The candidates' tokens, users one after another.
    pub candidate_rows: Vec<usize>,
    /// `[candidates, 2 x TIME_FEATURES.len()]`: (cos, sin) of each period's angle.
    pub time_features: Vec<f32>,
    /// User `u`'s candidates are `offsets[u] .. offsets[u + 1]`.
    pub offsets: Vec<usize>,
}

/// Time features per candidate.
pub const TIME_FEATURE_WIDTH: usize = 2 * TIME_FEATURES.len();

impl HstuModel {
    /// Where each role's rows are in a token's lookups.
    pub fn columns(&self) -> Columns {
        let r = &self.roles;
        let col = |f: usize| self.embeddings.col_offset(f);
        Columns {
            td: self.config.hstu.hstu_embedding_table_dim,
            total: self.embeddings.total_dim(),
            post: (col(r.post), col(r.candidate_post)),
            additional: r
                .additional
                .iter()
                .map(|&(a, b)| (col(a), col(b)))
                .collect(),
            items: r.items.iter().map(|&f| col(f)).collect(),
        }
    }

    /// The host's tables for `batch`, attention dividing by `norm`.
    pub fn token_plan(&self, batch: &HstuBatch, norm: AttentionNorm) -> TokenPlan {
        let tokens = batch.tokens();
        let mut plan = TokenPlan {
            positions: vec![0; tokens],
            buckets: vec![0; tokens],
            seqs: sequences(batch, norm),
            ..TokenPlan::default()
        };
        encoding_rows(self, batch, |t, p, b| {
            plan.positions[t] = p as u32;
            plan.buckets[t] = b as u32;
        });
        if let Some(a) = &self.weights.action {
            plan.action_width = a.mlp.in_dim();
            plan.actions = vec![0.0; tokens * plan.action_width];
            action_rows(self, batch, &mut plan.actions);
        }
        contextual_slots(self, batch, |s| plan.contextual.push(s));
        plan.offsets = candidate_tokens(batch, |t| {
            plan.candidate_rows.push(t);
            plan.time_features
                .extend_from_slice(&time_features(batch.times[t]));
        });
        plan
    }
}

/// A user's first tokens as a cache would hold them, computed at an earlier request of the
/// same user: its contextual slots and first `history` history items, with the positions, time
/// buckets and attention divisor of that request (`history` items, `candidates` candidates,
/// query time `query`). No token sees a later one, so a pass that gives these tokens the
/// earlier request's encodings and divisor computes exactly the states such a cache holds
/// ([`crate::hstu::HstuPredictor::run_as_of`]): the approximate reuse, measured without a cache.
/// (The contextual slot's gate, history plus candidates against the feature's minimum length,
/// is this request's.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsOf {
    /// History items of the earlier request (a prefix of this request's history).
    pub history: usize,
    /// Candidates of the earlier request.
    pub candidates: usize,
    /// The earlier request's query time (its last candidate's).
    pub query: i64,
}

impl AsOf {
    /// User `user` of `batch` as this request has it, for a later request of the same user
    /// to be scored as of this one.
    pub fn of(batch: &HstuBatch, user: usize) -> AsOf {
        let u = &batch.users()[user];
        AsOf {
            history: u.history,
            candidates: u.candidates,
            query: batch.times[u.start + batch.len_of(u) - 1],
        }
    }
}

/// Step 3's rows for every token: `f(token, position row, time-bucket row)`.
pub(crate) fn encoding_rows(
    model: &HstuModel,
    batch: &HstuBatch,
    f: impl FnMut(usize, usize, usize),
) {
    encoding_rows_as_of(model, batch, &[], f)
}

/// [`encoding_rows`], each user's first tokens as of an earlier request where `as_of` (one
/// entry per user, or empty) says so.
pub(crate) fn encoding_rows_as_of(
    model: &HstuModel,
    batch: &HstuBatch,
    as_of: &[Option<AsOf>],
    mut f: impl FnMut(usize, usize, usize),
) {
    let h = &model.config.hstu;
    let clamp = match h.time_bucket_clamp {
        TimeBucketClamp::Triton => h.num_time_buckets,
        TimeBucketClamp::Pytorch => model.config.dim() - 1,
    } as i64;
    let slots = batch.slots();
    let last_pos = h.num_position_buckets - 1;
    for (k, u) in batch.users().iter().enumerate() {
        let len = batch.len_of(u);
        let now = (slots + u.history, batch.times[u.start + len - 1]);
        let then = as_of.get(k).copied().flatten();
        for i in 0..len {
            let (high, query) = match then {
                Some(a) if i < slots + a.history => (slots + a.history, a.query),
                _ => now,
            };
            let t = u.start + i;
            let p = if i < slots {
                i
            } else {
                (high - i.min(high) + slots).min(last_pos)
            };
            let b = time_bucket(query, batch.times[t]).clamp(0, clamp) as usize;
            f(t, p, b);
        }
    }
}

/// The reference's time bucket of an event at `ts` for a query at `query`: `sqrt(max(query -
/// ts, 1e-6) / 60)` in f32, truncated (clamped by the caller).
pub fn time_bucket(query: i64, ts: i64) -> i64 {
    let delta = query.wrapping_sub(ts) as f32;
    let b = (delta.max(1e-6) / 60.0).sqrt();
    b.max(0.0) as i64
}

/// The action encoder's input rows (`out` is `[tokens, width]`, zeroed): at history tokens the
/// embedding of each action bit set, at candidates the target embedding.
pub(crate) fn action_rows(model: &HstuModel, batch: &HstuBatch, out: &mut [f32]) {
    let Some(a) = &model.weights.action else {
        return;
    };
    let width = a.mlp.in_dim();
    for u in batch.users() {
        let h0 = u.start + batch.slots();
        for t in h0..h0 + u.history {
            let row = &mut out[t * width..(t + 1) * width];
            for (k, &bit) in a.weights.iter().enumerate() {
                if batch.actions[t] & bit > 0 {
                    let r = k * ACTION_DIM..(k + 1) * ACTION_DIM;
                    row[r.clone()].copy_from_slice(&a.table[r]);
                }
            }
        }
        let c0 = h0 + u.history;
        for t in c0..c0 + u.candidates {
            out[t * width..(t + 1) * width].copy_from_slice(&a.target);
        }
    }
}

/// Calls `f` with every candidate's token, users in order; returns the users' offsets into the
/// candidates (user `u`'s are `offsets[u] .. offsets[u + 1]`).
pub(crate) fn candidate_tokens(batch: &HstuBatch, mut f: impl FnMut(usize)) -> Vec<usize> {
    let mut offsets = Vec::with_capacity(batch.len() + 1);
    offsets.push(0);
    for u in batch.users() {
        let c0 = u.start + batch.slots() + u.history;
        (c0..c0 + u.candidates).for_each(&mut f);
        offsets.push(offsets.last().unwrap() + u.candidates);
    }
    offsets
}

/// Every user's contextual slots, users in order.
pub(crate) fn contextual_slots(
    model: &HstuModel,
    batch: &HstuBatch,
    mut f: impl FnMut(ContextualSlot),
) {
    let roles = &model.roles;
    let nc = roles.contextual.len();
    for (ui, u) in batch.users().iter().enumerate() {
        for (ci, c) in roles.contextual.iter().enumerate() {
            let on = batch.contextual_on[ui * nc + ci];
            for k in 0..c.slots {
                let slot = c.first_slot + k;
                f(ContextualSlot {
                    token: u.start + slot,
                    slot,
                    col: on.then(|| model.embeddings.col_offset(c.feature)),
                });
            }
        }
    }
}

/// The batch's users as attention sees them, each with what its sums are divided by.
pub fn sequences(batch: &HstuBatch, norm: AttentionNorm) -> Vec<Seq> {
    // The reference's `max_seq_len`: contextual slots + the longest history + the most
    // candidates (not the longest sequence).
    let longest = batch.slots()
        + batch.users().iter().map(|u| u.history).max().unwrap_or(0)
        + batch
            .users()
            .iter()
            .map(|u| u.candidates)
            .max()
            .unwrap_or(0);
    batch
        .users()
        .iter()
        .map(|u| {
            let len = batch.len_of(u);
            Seq {
                start: u.start,
                len,
                candidates: u.candidates,
                norm: match norm {
                    AttentionNorm::Alone => len as f32,
                    AttentionNorm::BatchMax => longest as f32,
                },
            }
        })
        .collect()
}

/// A candidate's time features: (cos, sin) of its query time's angle in each period.
pub fn time_features(ts: i64) -> [f32; TIME_FEATURE_WIDTH] {
    let mut out = [0.0; TIME_FEATURE_WIDTH];
    for (k, (period, units)) in TIME_FEATURES.iter().enumerate() {
        let a = time_angle(ts, *period, *units);
        out[2 * k] = a.cos();
        out[2 * k + 1] = a.sin();
    }
    out
}

/// The reference's angle of `ts` within a period (`TimestampLayerNormPostprocessor`): in f32,
/// `(remainder(floor(ts / unit), units) / units) * 2 * 3.14`, with PyTorch's floor division
/// and remainder. (3.14, not pi: the reference's constant.)
#[allow(clippy::approx_constant)]
pub fn time_angle(ts: i64, unit: f32, units: f32) -> f32 {
    let since = torch_div_floor(ts as f32, unit);
    (torch_remainder(since, units) / units) * 2.0 * 3.14
}

/// `torch.div(a, b, rounding_mode="floor")` on f32, as ATen computes it.
fn torch_div_floor(a: f32, b: f32) -> f32 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut f = div.floor();
        if div - f > 0.5 {
            f += 1.0;
        }
        f
    } else {
        0.0f32.copysign(a / b)
    }
}

/// `torch.remainder(a, b)` on f32.
fn torch_remainder(a: f32, b: f32) -> f32 {
    let mut m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m += b;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_buckets_follow_the_reference_formula() {
        // sqrt(seconds / 60), truncated: 0 for the query itself, 1 at a minute, 60 at an hour.
        assert_eq!(time_bucket(1000, 1000), 0);
        assert_eq!(time_bucket(1060, 1000), 1);
        assert_eq!(time_bucket(3600, 0), 7);
        assert_eq!(time_bucket(216_000, 0), 60);
        // An event after the query is clamped at 1e-6 seconds.
        assert_eq!(time_bucket(0, 5000), 0);
    }

    #[test]
    #[allow(clippy::approx_constant)]
    fn time_angles_use_floor_division_and_remainder() {
        // 3 hours and a bit after the epoch: hour 3 of 24, day 0 of 7.
        let a = time_angle(3 * 3600 + 5, 3600.0, 24.0);
        assert!((a - 3.0 / 24.0 * 2.0 * 3.14).abs() < 1e-6);
        // Before the epoch the floor goes down and the remainder stays positive.
        let b = time_angle(-1, 3600.0, 24.0);
        assert!((b - 23.0 / 24.0 * 2.0 * 3.14).abs() < 1e-5);
        assert_eq!(torch_div_floor(-7.0, 2.0), -4.0);
        assert_eq!(torch_remainder(-7.0, 2.0), 1.0);
    }
}
