//! The HSTU family behind the seam: an item is a user ([`User`]: its history's and its
//! candidates' features), a request a list of them; the outputs are one FP32 run per task,
//! one score per candidate, with `candidate_offsets` saying where each user's run starts.
//!
//! Inputs: for every history feature and every candidate feature `F` (the model's own names),
//! `F_lengths` (values per user) and `F_ids` (a feature looked up in a table) or `F_values`
//! (a plain integer feature: timestamps, action weights, ratings). A request's users are
//! checked when it arrives (errors name the user and the feature); its batch is checked again
//! when requests merge (the token layout spans the batch), which costs a pass over the ids,
//! small beside the forward pass.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_embed::{Lengths, StagedBatch};

use super::{
    Batched, InputColumns, InputKind, InputSpec, Items, Outputs, Request, Runner, Servable,
    Signature, Times, Workload,
};
use crate::dense::{DenseDType, DenseIsa};
use crate::error::{ModelError, Result};
use crate::hstu::{CacheStats, HstuBatch, HstuModel, HstuPredictor, HstuScores, HstuTimes, User};
use crate::tier::Tier;

/// The output of where each user's candidates start.
pub const OFFSETS: &str = "candidate_offsets";

/// The most tokens (history and candidates, all users together) a tool merges into one batch.
pub const BATCH_TOKENS: usize = 1 << 16;

/// A synthetic user's history items and candidates unless asked otherwise.
const DEFAULT_HISTORY: usize = 256;
const DEFAULT_CANDIDATES: usize = 64;

const STAGES: [&str; 6] = [
    "lookups",
    "preprocess",
    "projections",
    "attention",
    "pointwise",
    "head",
];

/// A request's users, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Users(pub Vec<User>);

impl Items for Users {
    fn len(&self) -> usize {
        self.0.len()
    }
    /// Its history and candidate tokens (the contextual slots left out).
    fn weight(&self) -> usize {
        self.0.iter().map(User::tokens).sum()
    }
    /// Each user's history bucket: the least of [`HISTORY_CLASSES`] at or over its history's
    /// length (its longest history feature), `"+Inf"` past the last.
    fn classes(&self) -> Vec<&'static str> {
        self.0
            .iter()
            .map(|u| history_class(u.uih.values().map(Vec::len).max().unwrap_or(0)))
            .collect()
    }
    fn pieces(&self, max: usize) -> Box<dyn Iterator<Item = Request> + Send + '_> {
        Box::new(
            self.0
                .chunks(max.max(1))
                .map(|c| Box::new(Users(c.to_vec())) as Request),
        )
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The history buckets of per-user latency metrics (upper bounds, in history items).
pub const HISTORY_CLASSES: [(usize, &str); 6] = [
    (64, "64"),
    (256, "256"),
    (1024, "1024"),
    (4096, "4096"),
    (16384, "16384"),
    (usize::MAX, "+Inf"),
];

/// The bucket of a history of `n` items.
fn history_class(n: usize) -> &'static str {
    HISTORY_CLASSES
        .iter()
        .find(|(most, _)| n <= *most)
        .map_or("+Inf", |c| c.1)
}

/// A merged batch, its tier rows staged.
struct Prepared {
    batch: HstuBatch,
    staged: Option<StagedBatch>,
    staging: Duration,
}

impl HstuModel {
    /// The table rows of each lookup feature, by name.
    fn lookup_rows(&self) -> BTreeMap<&str, u64> {
        self.roles
            .features
            .iter()
            .enumerate()
            .map(|(f, l)| (l.name.as_str(), self.embeddings().table_of(f).rows() as u64))
            .collect()
    }

    /// Every history feature, then every candidate feature, each with whether a user must give it.
    fn input_features(&self) -> Vec<(&str, bool)> {
        let h = &self.config().hstu;
        let req = |f: &String, list: &[String]| list.contains(f);
        let uih = h
            .hstu_uih_feature_names
            .iter()
            .map(|f| (f.as_str(), req(f, &self.roles.required_history)));
        let cand = h
            .hstu_candidate_feature_names
            .iter()
            .map(|f| (f.as_str(), req(f, &self.roles.required_candidates)));
        uih.chain(cand).collect()
    }
}

impl Servable for HstuModel {
    fn signature(&self) -> Signature {
        let rows = self.lookup_rows();
        let mut inputs = Vec::new();
        for (name, required) in self.input_features() {
            let r = rows.get(name).copied();
            inputs.push(InputSpec {
                name: format!("{name}_lengths"),
                kind: InputKind::Lengths,
                required,
            });
            inputs.push(InputSpec {
                name: match r {
                    Some(_) => format!("{name}_ids"),
                    None => format!("{name}_values"),
                },
                kind: InputKind::Values {
                    lengths: inputs.len() - 1,
                    rows: r,
                },
                required,
            });
        }
        Signature {
            inputs,
            outputs: self.tasks(),
            offsets: Some(OFFSETS.into()),
            item: "user",
            stages: STAGES.to_vec(),
            narrow_values: false,
        }
    }

    fn check(&self, c: InputColumns) -> Result<Request> {
        let features = self.input_features();
        let n_uih = self.config().hstu.hstu_uih_feature_names.len();
        let mut users = vec![User::default(); c.n];
        let lengths = match c.lengths {
            Lengths::Each(v) => v,
            Lengths::Ones => vec![1; c.n * features.len()],
        };
        if lengths.len() != c.n * features.len() || !c.floats.is_empty() {
            return Err(ModelError::Input(format!(
                "{} users need {} lengths ({} per feature) and no float inputs; got {} and {}",
                c.n,
                c.n * features.len(),
                c.n,
                lengths.len(),
                c.floats.len()
            )));
        }
        let mut at = 0usize;
        for (k, &(name, _)) in features.iter().enumerate() {
            let lengths = &lengths[k * c.n..(k + 1) * c.n];
            if !c.present.get(2 * k).copied().unwrap_or(true) {
                continue;
            }
            for (u, &l) in users.iter_mut().zip(lengths) {
                let v: Vec<i64> = (at..at + l as usize).map(|i| c.values.get(i)).collect();
                at += l as usize;
                match k < n_uih {
                    true => u.uih.insert(name.to_string(), v),
                    false => u.candidates.insert(name.to_string(), v),
                };
            }
        }
        if at != c.values.len() {
            return Err(ModelError::Input(format!(
                "the lengths add up to {at} values but {} were given",
                c.values.len()
            )));
        }
        self.check_users(&users, 0)?;
        Ok(Box::new(Users(users)))
    }

    fn check_json(&self, body: &[u8]) -> Option<Result<Request>> {
        Some(self.users_json(body).and_then(|users| {
            self.check_users(&users, 0)?;
            Ok(Box::new(Users(users)) as Request)
        }))
    }

    fn prepare(&self, parts: &[&dyn Items]) -> Result<Batched> {
        let mut users = Vec::new();
        for p in parts {
            let u = p
                .as_any()
                .downcast_ref::<Users>()
                .ok_or_else(|| ModelError::Input("a request of another model's family".into()))?;
            users.extend_from_slice(&u.0);
        }
        let batch = self.check_users(&users, 0)?;
        let t = Instant::now();
        // With a cache of histories the pass stages only the rows it computes.
        let staged = match self.stager().is_active() && self.history_cache().is_none() {
            true => Some(
                self.stager()
                    .stage(self.embeddings(), batch.lookups.view())?,
            ),
            false => None,
        };
        Ok(Box::new(Prepared {
            batch,
            staged,
            staging: t.elapsed(),
        }))
    }

    fn prefetch_depth(&self) -> usize {
        0
    }

    fn max_batch_weight(&self) -> usize {
        BATCH_TOKENS
    }

    fn warm_request(&self, most: usize, seed: u64) -> Request {
        let h = &self.config().hstu;
        let candidates = h.max_num_candidates_inference.clamp(1, 8);
        let room = h
            .max_seq_len
            .saturating_sub(self.config().contextual_slots() + candidates);
        let mut users = self.random_users(most.clamp(1, 2), room.min(64), candidates, seed);
        if self.history_cache().is_some() {
            // Without their contextual ids warm users are never cached: they take no place
            // from the users served.
            for u in &mut users {
                for c in &self.roles.contextual {
                    u.uih.remove(&self.roles.features[c.feature].name);
                }
            }
        }
        Box::new(Users(users))
    }

    fn synthetic(&self, w: &Workload, seed: u64) -> Result<Request> {
        if w.pooling.is_some() {
            return Err(Workload::unused("pooling", "user"));
        }
        // The defaults, within what the model takes; a length asked for is checked as given.
        let h = &self.config().hstu;
        let candidates = w
            .candidates
            .unwrap_or(DEFAULT_CANDIDATES.min(h.max_num_candidates_inference.max(1)));
        let room = h
            .max_seq_len
            .saturating_sub(self.config().contextual_slots() + candidates);
        let history = w.history.unwrap_or(DEFAULT_HISTORY.min(room));
        let users = crate::hstu::presets::synthetic_users(
            self.config(),
            w.items.unwrap_or(1),
            history,
            candidates,
            seed,
        );
        self.check_users(&users, 0)?;
        Ok(Box::new(Users(users)))
    }

    fn flops(&self, items: &dyn Items) -> Vec<(&'static str, f64)> {
        let Some(users) = items.as_any().downcast_ref::<Users>() else {
            return Vec::new();
        };
        let (p, a) = users.0.iter().fold((0.0, 0.0), |(p, a), u| {
            let f = self.layer_flops(u);
            (p + f.0, a + f.1)
        });
        vec![(STAGES[2], p), (STAGES[3], a)]
    }

    /// The users' forward passes in MFLOP (the dense layers' and the attention's, from the
    /// model's dims): a user's grows with its history's square and with its history times its
    /// candidates. Users served from the history cache cost less than this; the admission
    /// model's fitted rate per MFLOP follows the hit rate.
    fn cost(&self, items: &dyn Items) -> u64 {
        let Some(users) = items.as_any().downcast_ref::<Users>() else {
            return items.len() as u64;
        };
        let name = &self.config().hstu.uih_post_id_feature_name;
        let cand = &self.config().hstu.candidates_querytime_feature_name;
        let flops: f64 = users
            .0
            .iter()
            .map(|u| {
                let n = u.uih.get(name).map_or(0, Vec::len);
                let c = u.candidates.get(cand).map_or(0, Vec::len);
                let (dense, attention) = self.macs(n, c);
                2.0 * (dense + attention)
            })
            .sum();
        ((flops / 1e6).ceil() as u64).max(u64::from(!users.0.is_empty()))
    }

    fn tier(&self) -> Tier<'_> {
        Tier::of(self.stager())
    }

    fn parameters(&self) -> Vec<(&'static str, String)> {
        let dtype = self.config().dense_dtype;
        let kernels = DenseIsa::selected(dtype).map_or("?", |i| i.describe(dtype));
        vec![
            ("family", "hstu".into()),
            ("dense_dtype", dtype.name().to_string()),
            ("dense_kernels", kernels.to_string()),
            (
                "attention_norm",
                self.config().attention_norm.name().to_string(),
            ),
        ]
    }

    fn placements(&self) -> Vec<&'static str> {
        self.config()
            .tables
            .iter()
            .map(|t| t.placement.name())
            .collect()
    }

    fn dense_dtype(&self) -> DenseDType {
        self.config().dense_dtype
    }

    fn history_cache(&self) -> Option<CacheStats> {
        HstuModel::history_cache(self).map(|c| c.stats())
    }

    fn cpu_runner(self: Arc<Self>, threads: usize) -> Result<Box<dyn Runner>> {
        let p = HstuPredictor::new(self, threads.max(1))?;
        Ok(Box::new(HstuRunner::new(p)))
    }

    fn release(self: Arc<Self>, pause: Duration) -> Option<Arc<dyn Servable>> {
        match Arc::try_unwrap(self) {
            Ok(m) => {
                m.release(pause);
                None
            }
            Err(held) => Some(held),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl HstuModel {
    /// Users of a JSON body: one user object, an array of them, or one per line.
    fn users_json(&self, body: &[u8]) -> Result<Vec<User>> {
        let bad = |i: usize, e: serde_json::Error| ModelError::Input(format!("user {i}: {e}"));
        let text = body.trim_ascii();
        if text.first() == Some(&b'[') {
            let values: Vec<serde_json::Value> = serde_json::from_slice(text)
                .map_err(|e| ModelError::Input(format!("not a JSON array of users: {e}")))?;
            return values
                .into_iter()
                .enumerate()
                .map(|(i, v)| serde_json::from_value(v).map_err(|e| bad(i, e)))
                .collect();
        }
        text.split(|&b| b == b'\n')
            .filter(|l| !l.trim_ascii().is_empty())
            .enumerate()
            .map(|(i, l)| serde_json::from_slice(l).map_err(|e| bad(i, e)))
            .collect()
    }

    /// `n` random users of any HSTU config, `history` items and `candidates` candidates each:
    /// ids in their tables, history times in order, candidates' query times after them, action
    /// bits and small integers elsewhere, one value per contextual feature.
    pub fn random_users(
        &self,
        n: usize,
        history: usize,
        candidates: usize,
        seed: u64,
    ) -> Vec<User> {
        let rows = self.lookup_rows();
        let roles = &self.roles;
        let h = &self.config().hstu;
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = move |below: u64| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % below.max(1)) as i64
        };
        let contextual: Vec<&str> = roles
            .contextual
            .iter()
            .map(|c| roles.features[c.feature].name.as_str())
            .collect();
        (0..n)
            .map(|_| {
                let mut u = User::default();
                let t0 = 1_704_067_200 + next(86_400);
                let times: Vec<i64> = (0..history as i64).map(|k| t0 + 60 * k).collect();
                let query = t0 + 60 * history as i64 + 1;
                for f in &h.hstu_uih_feature_names {
                    let len = match contextual.contains(&f.as_str()) {
                        true => 1,
                        false => history,
                    };
                    let v = match (f, rows.get(f.as_str())) {
                        (f, _) if *f == roles.action_time => times.clone(),
                        (_, Some(&r)) => (0..len).map(|_| next(r)).collect(),
                        (f, None) if Some(f) == roles.action_weight.as_ref() => {
                            (0..len).map(|_| next(32)).collect()
                        }
                        _ => (0..len).map(|_| next(5)).collect(),
                    };
                    u.uih.insert(f.clone(), v);
                }
                for f in &h.hstu_candidate_feature_names {
                    let v = match (f, rows.get(f.as_str())) {
                        (f, _) if *f == roles.query_time => vec![query; candidates],
                        (_, Some(&r)) => (0..candidates).map(|_| next(r)).collect(),
                        _ => (0..candidates).map(|_| next(5)).collect(),
                    };
                    u.candidates.insert(f.clone(), v);
                }
                u
            })
            .collect()
    }
}

/// An [`HstuPredictor`] as a [`Runner`].
#[derive(Debug)]
pub struct HstuRunner {
    predictor: HstuPredictor,
    servable: Arc<dyn Servable>,
}

impl HstuRunner {
    pub fn new(predictor: HstuPredictor) -> Self {
        let servable = predictor.model().clone();
        HstuRunner {
            predictor,
            servable,
        }
    }

    /// The predictor (to set its precision or attention rule).
    pub fn predictor_mut(&mut self) -> &mut HstuPredictor {
        &mut self.predictor
    }
}

impl Runner for HstuRunner {
    fn servable(&self) -> &Arc<dyn Servable> {
        &self.servable
    }

    fn run(&mut self, batch: &Batched, out: &mut Outputs) -> Result<Times> {
        let p = &mut self.predictor;
        run_staged_users(batch, out, |users, staged| p.run_served(users, staged))
    }

    fn device(&self) -> String {
        format!("cpu ({} threads)", self.predictor.threads())
    }
}

/// Runs a batch this family's [`Servable::prepare`] made with `pass` (its users and their
/// staged tier rows in, scores and times out), writing `out`: the one step of every HSTU
/// runner, this crate's and those built outside it (a GPU's). The staging's time counts as
/// lookups.
pub fn run_staged_users(
    batch: &Batched,
    out: &mut Outputs,
    pass: impl FnOnce(&HstuBatch, Option<&StagedBatch>) -> Result<(HstuScores, HstuTimes)>,
) -> Result<Times> {
    let p = batch
        .downcast_ref::<Prepared>()
        .ok_or_else(|| ModelError::Input("a batch of another model's family".into()))?;
    let (scores, mut t) = pass(&p.batch, p.staged.as_ref())?;
    t.lookups += p.staging;
    t.wall += p.staging;
    out.reset(scores.tasks.len());
    for (o, s) in out.values.iter_mut().zip(scores.scores) {
        *o = s;
    }
    out.counts
        .extend(scores.offsets.windows(2).map(|w| (w[1] - w[0]) as u32));
    Ok(times(&t))
}

/// [`HstuTimes`] as the seam's [`Times`].
fn times(t: &HstuTimes) -> Times {
    Times {
        wall: t.wall,
        embedding: t.lookups,
        dense: t.wall.saturating_sub(t.lookups),
        copy_in: Duration::ZERO,
        copy_out: Duration::ZERO,
        stages: STAGES
            .into_iter()
            .zip([
                t.lookups,
                t.preprocess,
                t.projections,
                t.attention,
                t.pointwise,
                t.head,
            ])
            .collect(),
        overlapped: Vec::new(),
    }
}
