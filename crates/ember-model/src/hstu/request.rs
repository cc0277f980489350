//! A request to an HSTU model: users, each a history of actions and the candidates to score,
//! checked once and laid out as the model's token axis.
//!
//! Each user's tokens are `[contextual slots | history | candidates]`, as the reference's
//! preprocessor lays them out. The embedding lookups are one keyed jagged batch over that axis
//! (one "sample" per token): a feature has one id at each token where it has a value (the post
//! id and the additional features at history tokens, their candidate counterparts and the item
//! features at candidate tokens, a contextual feature at its slots) and none elsewhere, so the
//! embedding stage (with its tiers) gathers every row a token needs, and a token's empty bags
//! read as zeros.

use crate::error::Invalid;
use std::collections::BTreeMap;

use ember_embed::{CheckedBatch, EmbedError, Ids, KeyedJagged};
use serde::{Deserialize, Serialize};

use super::HstuModel;
use crate::error::{ModelError, Result};

/// One user: its history's features and its candidates' features, each a list of integers,
/// keyed by the model's own feature names (`hstu_uih_feature_names`,
/// `hstu_candidate_feature_names`). A line of `ember predict`'s users file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub uih: BTreeMap<String, Vec<i64>>,
    pub candidates: BTreeMap<String, Vec<i64>>,
}

impl User {
    /// Its history items and candidates: the longest feature of each side (a checked user's
    /// features agree).
    pub fn tokens(&self) -> usize {
        let longest = |m: &BTreeMap<String, Vec<i64>>| m.values().map(Vec::len).max().unwrap_or(0);
        longest(&self.uih) + longest(&self.candidates)
    }
}

/// Where one user's tokens are in a checked batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserSpan {
    /// Its first token.
    pub start: usize,
    /// History items.
    pub history: usize,
    /// Candidates.
    pub candidates: usize,
}

/// Users checked against a model: the lookups over the token axis (ids checked against the
/// tables), each token's timestamp and action bits, each user's span.
#[derive(Debug)]
pub struct HstuBatch {
    pub(crate) lookups: CheckedBatch,
    pub(crate) users: Vec<UserSpan>,
    /// Per token: its time (0 at contextual slots, the action time in the history, the query
    /// time at candidates).
    pub(crate) times: Vec<i64>,
    /// Per token: the history's action bits (0 elsewhere).
    pub(crate) actions: Vec<i64>,
    /// Per user and contextual feature: whether the user is long enough for it.
    pub(crate) contextual_on: Vec<bool>,
    /// Contextual slots per user.
    pub(crate) slots: usize,
}

impl HstuBatch {
    /// Users in the batch.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Tokens in the batch (the sum of the users' sequence lengths).
    pub fn tokens(&self) -> usize {
        self.times.len()
    }

    /// Candidates in the batch.
    pub fn candidates(&self) -> usize {
        self.users.iter().map(|u| u.candidates).sum()
    }

    pub fn users(&self) -> &[UserSpan] {
        &self.users
    }

    /// Contextual slots before each user's history.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The user's sequence length (contextual slots, history, candidates).
    pub fn len_of(&self, u: &UserSpan) -> usize {
        self.slots + u.history + u.candidates
    }

    /// The token lookups (tools and benchmarks: the tier stages them).
    pub fn lookups(&self) -> &CheckedBatch {
        &self.lookups
    }
}

/// An error about user `u`'s feature `f`.
fn bad(u: usize, side: &str, f: &str, what: impl std::fmt::Display) -> ModelError {
    ModelError::Input(format!("user {u}: {side} feature '{f}': {what}"))
}

impl HstuModel {
    /// Checks `users` (numbered from `first` in errors) and lays them out as one batch. Every
    /// problem is an input error naming the user and the feature: a missing or unknown feature,
    /// lengths that disagree, a history or candidate list over the model's maximum, timestamps
    /// out of order, an id outside its table.
    pub fn check_users(&self, users: &[User], first: usize) -> Result<HstuBatch> {
        let roles = &self.roles;
        let slots = self.config.contextual_slots();
        let mut spans = Vec::with_capacity(users.len());
        let mut start = 0usize;
        for (i, u) in users.iter().enumerate() {
            let span = self.check_user(u, first + i, start)?;
            start += slots + span.history + span.candidates;
            spans.push(span);
        }
        let tokens = start;
        let nf = roles.features.len();
        let mut lengths = vec![0usize; nf * tokens];
        let mut ids = Ids::with_capacity(self.embeddings.narrow_ids(), tokens * 2);
        let mut contextual_on = Vec::with_capacity(users.len() * roles.contextual.len());
        for (f, feat) in roles.features.iter().enumerate() {
            let lens = &mut lengths[f * tokens..(f + 1) * tokens];
            for (u, span) in users.iter().zip(&spans) {
                let (values, at) = match feat.side {
                    Side::History => (&u.uih[&feat.name], span.start + slots),
                    Side::Candidate => {
                        (&u.candidates[&feat.name], span.start + slots + span.history)
                    }
                    Side::Contextual { first_slot } => match u.uih.get(&feat.name) {
                        Some(v) => (v, span.start + first_slot),
                        None => continue,
                    },
                };
                for (k, &id) in values.iter().enumerate() {
                    lens[at + k] = 1;
                    ids.push(id);
                }
            }
        }
        for (u, span) in users.iter().zip(&spans) {
            // The reference compares the history plus the candidates, without the slots.
            let len = span.history + span.candidates;
            for c in &roles.contextual {
                let present = u
                    .uih
                    .get(&roles.features[c.feature].name)
                    .is_some_and(|v| !v.is_empty());
                contextual_on.push(present && len >= c.min_len);
            }
        }
        let keys = roles.features.iter().map(|f| f.name.clone()).collect();
        let kj = KeyedJagged::from_lengths(keys, tokens, &lengths, ids, None)
            .map_err(|e| name_user(e, &spans, first))?;
        let lookups = self
            .embeddings
            .check(kj)
            .map_err(|e| name_user(e, &spans, first))?;
        let mut times = vec![0i64; tokens];
        let mut actions = vec![0i64; tokens];
        for (u, span) in users.iter().zip(&spans) {
            let h0 = span.start + slots;
            let c0 = h0 + span.history;
            times[h0..c0].copy_from_slice(&u.uih[&roles.action_time]);
            times[c0..c0 + span.candidates].copy_from_slice(&u.candidates[&roles.query_time]);
            if let Some(a) = &roles.action_weight {
                actions[h0..c0].copy_from_slice(&u.uih[a]);
            }
        }
        Ok(HstuBatch {
            lookups,
            users: spans,
            times,
            actions,
            contextual_on,
            slots,
        })
    }

    /// One user's lengths, names and times; its span if they hold.
    fn check_user(&self, u: &User, n: usize, start: usize) -> Result<UserSpan> {
        let h = &self.config.hstu;
        let roles = &self.roles;
        for f in u.uih.keys() {
            if !h.hstu_uih_feature_names.contains(f) {
                return Err(bad(n, "history", f, "not a history feature of this model"));
            }
        }
        for f in u.candidates.keys() {
            if !h.hstu_candidate_feature_names.contains(f) {
                return Err(bad(
                    n,
                    "candidate",
                    f,
                    "not a candidate feature of this model",
                ));
            }
        }
        for f in &roles.required_history {
            if !u.uih.contains_key(f) {
                return Err(bad(n, "history", f, "missing"));
            }
        }
        for f in &roles.required_candidates {
            if !u.candidates.contains_key(f) {
                return Err(bad(n, "candidate", f, "missing"));
            }
        }
        let (history, candidates) = self.check_lengths(u, n)?;
        self.check_times(u, n)?;
        Ok(UserSpan {
            start,
            history,
            candidates,
        })
    }
    /// One user's lengths: every history feature as long as the post id's (a contextual one at
    /// most its slots), every candidate feature as long as the query times, within the model's
    /// maxima. Its (history, candidates).
    fn check_lengths(&self, u: &User, n: usize) -> Result<(usize, usize)> {
        let h = &self.config.hstu;
        let roles = &self.roles;
        let history = u.uih[&h.uih_post_id_feature_name].len();
        let candidates = u.candidates[&roles.query_time].len();
        for (f, v) in &u.uih {
            if let Some(max) = h.contextual_feature_to_max_length.get(f) {
                if v.len() > *max {
                    return Err(bad(
                        n,
                        "history",
                        f,
                        format!(
                            "{} values for a contextual feature of at most {max}",
                            v.len()
                        ),
                    ));
                }
            } else if v.len() != history {
                return Err(bad(
                    n,
                    "history",
                    f,
                    format!(
                        "{} values, but the history ('{}') has {history}",
                        v.len(),
                        h.uih_post_id_feature_name
                    ),
                ));
            }
        }
        for (f, v) in &u.candidates {
            if v.len() != candidates {
                return Err(bad(
                    n,
                    "candidate",
                    f,
                    format!(
                        "{} values, but '{}' has {candidates}",
                        v.len(),
                        roles.query_time
                    ),
                ));
            }
        }
        if candidates == 0 {
            return Err(bad(
                n,
                "candidate",
                &roles.query_time,
                "no candidates to score",
            ));
        }
        if candidates > h.max_num_candidates_inference {
            return Err(bad(
                n,
                "candidate",
                &roles.query_time,
                format!(
                    "{candidates} candidates, over the model's max_num_candidates_inference {}",
                    h.max_num_candidates_inference
                ),
            ));
        }
        let len = self.config.contextual_slots() + history + candidates;
        if len > h.max_seq_len {
            return Err(bad(
                n,
                "history",
                &h.uih_post_id_feature_name,
                format!(
                    "{history} items and {candidates} candidates make a sequence of {len}, over the \
                 model's max_seq_len {}",
                    h.max_seq_len
                ),
            ));
        }
        Ok((history, candidates))
    }

    /// One user's times: the history's in order, the candidates' query times not before it.
    fn check_times(&self, u: &User, n: usize) -> Result<()> {
        let roles = &self.roles;
        let times = &u.uih[&roles.action_time];
        if let Some(k) = times.windows(2).position(|w| w[1] < w[0]) {
            return Err(bad(
                n,
                "history",
                &roles.action_time,
                format!(
                    "timestamps out of order at item {}: {} after {}",
                    k + 1,
                    times[k + 1],
                    times[k]
                ),
            ));
        }
        if let Some(&last) = times.last() {
            let q = &u.candidates[&roles.query_time];
            if let Some(k) = q.iter().position(|&t| t < last) {
                return Err(bad(
                    n,
                    "candidate",
                    &roles.query_time,
                    format!(
                        "query time {} of candidate {k} is before the last action ({last})",
                        q[k]
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The user a lookup error's token belongs to, named in its message.
fn name_user(e: EmbedError, spans: &[UserSpan], first: usize) -> ModelError {
    let user_of = |token: usize| {
        spans
            .partition_point(|s| s.start <= token)
            .saturating_sub(1)
            + first
    };
    match e {
        EmbedError::IdOutOfRange {
            feature,
            sample,
            id,
            table,
            rows,
        } => ModelError::Input(format!(
            "user {}: feature '{feature}': id {id} is not a row of table '{table}' ({rows} rows)",
            user_of(sample)
        )),
        EmbedError::NegativeId {
            feature,
            sample,
            id,
        } => ModelError::Input(format!(
            "user {}: feature '{feature}': id {id} is negative",
            user_of(sample)
        )),
        e => e.into(),
    }
}

/// Which tokens a lookup feature has ids at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    History,
    Candidate,
    /// At slots `first_slot ..` of its max length.
    Contextual {
        first_slot: usize,
    },
}

/// A feature the forward pass looks up.
#[derive(Debug, Clone)]
pub(crate) struct LookupFeature {
    pub name: String,
    pub table: String,
    pub side: Side,
}

/// A contextual feature: its lookup feature, first slot, slots and the sequence length below
/// which it is zeroed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Contextual {
    pub feature: usize,
    pub first_slot: usize,
    pub slots: usize,
    pub min_len: usize,
}

/// What each named feature is to the forward pass, worked out once from the config.
#[derive(Debug, Clone)]
pub(crate) struct Roles {
    /// The lookup features, in the embedding collection's order.
    pub features: Vec<LookupFeature>,
    /// The post id at history tokens and its candidate counterpart.
    pub post: usize,
    pub candidate_post: usize,
    /// The additional features' (history, candidate) lookups.
    pub additional: Vec<(usize, usize)>,
    pub contextual: Vec<Contextual>,
    /// The item features' lookups (at candidate tokens), in the item MLP's input order.
    pub items: Vec<usize>,
    pub action_time: String,
    pub action_weight: Option<String>,
    pub query_time: String,
    pub required_history: Vec<String>,
    pub required_candidates: Vec<String>,
}

impl Roles {
    pub(crate) fn of(cfg: &super::HstuModelConfig) -> std::result::Result<Roles, Invalid> {
        let h = &cfg.hstu;
        let table_of = |name: &str| -> std::result::Result<String, Invalid> {
            cfg.features
                .iter()
                .find(|f| f.name == name)
                .map(|f| f.table.clone())
                .ok_or_else(|| Invalid(format!("feature '{name}' reads no table")))
        };
        let mut features: Vec<LookupFeature> = Vec::new();
        let mut add = |name: &str, side: Side| -> std::result::Result<usize, Invalid> {
            if let Some(i) = features.iter().position(|f| f.name == name) {
                if features[i].side != side {
                    return Err(Invalid(format!(
                        "feature '{name}' is used at two kinds of tokens"
                    )));
                }
                return Ok(i);
            }
            features.push(LookupFeature {
                name: name.into(),
                table: table_of(name)?,
                side,
            });
            Ok(features.len() - 1)
        };
        let mut contextual = Vec::new();
        let mut slot = 0;
        for (k, n) in &h.contextual_feature_to_max_length.0 {
            let feature = add(k, Side::Contextual { first_slot: slot })?;
            contextual.push(Contextual {
                feature,
                first_slot: slot,
                slots: *n,
                min_len: h
                    .contextual_feature_to_min_uih_length
                    .get(k)
                    .copied()
                    .unwrap_or(0),
            });
            slot += n;
        }
        let post = add(&h.uih_post_id_feature_name, Side::History)?;
        let candidate_post = add(cfg.candidate_post_id(), Side::Candidate)?;
        let mut additional = Vec::new();
        for (u, c) in cfg.additional_features() {
            additional.push((add(u, Side::History)?, add(c, Side::Candidate)?));
        }
        let mut items = Vec::new();
        for n in cfg.item_features() {
            items.push(add(n, Side::Candidate)?);
        }
        let action_weight = h
            .action_weights
            .as_ref()
            .map(|_| h.uih_weight_feature_name.clone());
        let mut required_history: Vec<String> = vec![h.uih_action_time_feature_name.clone()];
        required_history.extend(action_weight.clone());
        let mut required_candidates = vec![h.candidates_querytime_feature_name.clone()];
        for f in &features {
            match f.side {
                Side::History => required_history.push(f.name.clone()),
                Side::Candidate => required_candidates.push(f.name.clone()),
                Side::Contextual { .. } => {}
            }
        }
        required_history.dedup();
        required_candidates.dedup();
        Ok(Roles {
            features,
            post,
            candidate_post,
            additional,
            contextual,
            items,
            action_time: h.uih_action_time_feature_name.clone(),
            action_weight,
            query_time: h.candidates_querytime_feature_name.clone(),
            required_history,
            required_candidates,
        })
    }
}
