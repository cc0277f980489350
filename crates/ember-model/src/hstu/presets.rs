//! HSTU model shapes to benchmark with random weights, and synthetic users in the shape of
//! MLPerf DLRMv3's streaming data.
//!
//! - `dlrm-v3`: MLPerf DLRMv3 (the reference's `get_hstu_configs("streaming-...")` and
//!   `get_embedding_table_config`): 5 STU layers, 4 heads, attention dims 128 / 128, table and
//!   model dim 512, preprocessor hidden 256, tables `item_id` 1e9 x 512, `user_id` 10M x 512,
//!   `item_category_id` 128 x 512 in fp16, one binary task, up to 2,048 candidates;
//! - `hstu-small`: the same layout at dims 64 (tables 100K / 10K / 128 rows), for quick runs.
//!
//! [`synthetic_users`] draws users as the streaming data set has them: a user id (the
//! contextual feature), a history of items (each with its fixed category) whose timestamps
//! advance by irregular gaps, action bitmasks over the five action weights, and candidates
//! sharing one query time after the last action. [`UserStream`] makes the same users come back
//! with their histories grown by a few actions, as a feed asks again.

use ember_embed::{DType, Placement};

use super::config::{
    AttentionNorm, HstuConfig, HstuModelConfig, OrderedMap, TaskConfig, TaskType, TimeBucketClamp,
};
use super::request::User;
use crate::config::{FeatureConfig, TableConfig};
use crate::dense::DenseDType;

/// The preset names.
pub const PRESETS: [&str; 2] = ["dlrm-v3", "hstu-small"];

/// The streaming layout's feature names.
const UIH: [&str; 7] = [
    "user_id",
    "item_id",
    "item_rating",
    "action_timestamp",
    "item_weights",
    "dummy_watch_time",
    "item_category_id",
];
const CANDIDATES: [&str; 6] = [
    "item_candidate_id",
    "item_candidate_rating",
    "item_query_time",
    "item_action_weights",
    "item_dummy_watchtime",
    "item_candidate_category_id",
];

/// Preset `name` with every table's rows multiplied by `rows_scale` (at least 1 row, the
/// category table kept whole) in `dtype`; `None` for an unknown name.
pub fn preset(name: &str, rows_scale: f64, dtype: DType) -> Option<HstuModelConfig> {
    let (dim, hidden, heads, attn, layers, rows) = match name {
        "dlrm-v3" => (512, 256, 4, 128, 5, [1_000_000_000usize, 10_000_000, 128]),
        "hstu-small" => (64, 64, 2, 32, 2, [100_000, 10_000, 128]),
        _ => return None,
    };
    let scaled = |r: usize| ((r as f64 * rows_scale).ceil() as usize).max(1);
    let table = |name: &str, rows: usize| TableConfig {
        name: name.into(),
        rows,
        dim,
        dtype,
        placement: Placement::Dram,
    };
    let tables = vec![
        table("item_id", scaled(rows[0])),
        table("item_category_id", rows[2]),
        table("user_id", scaled(rows[1])),
    ];
    let features = [
        ("item_id", "item_id"),
        ("item_candidate_id", "item_id"),
        ("item_category_id", "item_category_id"),
        ("item_candidate_category_id", "item_category_id"),
        ("user_id", "user_id"),
    ]
    .into_iter()
    .map(|(f, t)| FeatureConfig {
        name: f.into(),
        table: t.into(),
        max_len: None,
    })
    .collect();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let merge = UIH[1..]
        .iter()
        .zip(&CANDIDATES)
        .map(|(u, c)| (u.to_string(), c.to_string()));
    let hstu = HstuConfig {
        max_seq_len: 16384,
        max_num_candidates: 32,
        max_num_candidates_inference: 2048,
        hstu_num_heads: heads,
        hstu_attn_linear_dim: attn,
        hstu_attn_qk_dim: attn,
        hstu_attn_num_layers: layers,
        hstu_embedding_table_dim: dim,
        hstu_preprocessor_hidden_dim: hidden,
        hstu_transducer_embedding_dim: dim,
        hstu_group_norm: false,
        hstu_input_dropout_ratio: 0.2,
        hstu_linear_dropout_rate: 0.1,
        contextual_feature_to_max_length: OrderedMap(vec![("user_id".into(), 1)]),
        contextual_feature_to_min_uih_length: OrderedMap(vec![("user_id".into(), 20)]),
        candidates_weight_feature_name: "item_action_weights".into(),
        candidates_watchtime_feature_name: "item_rating".into(),
        candidates_querytime_feature_name: "item_query_time".into(),
        causal_multitask_weights: 0.2,
        multitask_configs: vec![TaskConfig {
            task_name: "rating".into(),
            task_weight: 1,
            task_type: TaskType::BinaryClassification,
        }],
        user_embedding_feature_names: names(&["item_id", "user_id", "item_category_id"]),
        item_embedding_feature_names: names(&["item_candidate_id", "item_candidate_category_id"]),
        uih_post_id_feature_name: "item_id".into(),
        uih_action_time_feature_name: "action_timestamp".into(),
        uih_weight_feature_name: "item_weights".into(),
        hstu_uih_feature_names: names(&UIH),
        hstu_candidate_feature_names: names(&CANDIDATES),
        // The reference's streaming pairs, in its order (ratings and watch times included).
        merge_uih_candidate_feature_mapping: merge.collect(),
        action_weights: Some(vec![1, 2, 4, 8, 16]),
        action_embedding_init_std: 5.0,
        enable_postprocessor: true,
        use_layer_norm_postprocessor: false,
        num_position_buckets: 8192,
        num_time_buckets: 2048,
        time_bucket_clamp: TimeBucketClamp::Triton,
    };
    Some(HstuModelConfig {
        format: super::config::FORMAT.into(),
        format_version: super::config::FORMAT_VERSION,
        family: "hstu".into(),
        hstu,
        tables,
        features,
        dense_dtype: DenseDType::F32,
        attention_norm: AttentionNorm::Alone,
        tier: None,
        remote: None,
    })
}

/// A small deterministic generator (splitmix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A user's state in a stream: who, the history so far, the time of its last action.
#[derive(Debug, Clone)]
struct StreamUser {
    id: i64,
    items: Vec<i64>,
    actions: Vec<i64>,
    times: Vec<i64>,
    ratings: Vec<i64>,
}

/// Users of the streaming layout (`dlrm-v3`, `hstu-small`) for `cfg`'s table sizes: `n` users
/// with `history` items and `candidates` candidates each.
pub fn synthetic_users(
    cfg: &HstuModelConfig,
    n: usize,
    history: usize,
    candidates: usize,
    seed: u64,
) -> Vec<User> {
    let mut s = UserStream::new(cfg, n, seed);
    (0..n).map(|u| s.user(u, history, candidates)).collect()
}

/// Streaming users: each call of [`UserStream::next_request`] picks a user, grows its history
/// by a few actions (time advancing), and asks for new candidates.
#[derive(Debug, Clone)]
pub struct UserStream {
    rng: Rng,
    items: u64,
    categories: u64,
    users: Vec<StreamUser>,
}

/// 2024-01-01T00:00:00Z, where synthetic histories start (each user at its own offset).
const EPOCH: i64 = 1_704_067_200;

impl UserStream {
    /// `n` users of `cfg`'s tables (`item_id`, `item_category_id`, `user_id`), with distinct
    /// user ids where the table has `n` rows.
    pub fn new(cfg: &HstuModelConfig, n: usize, seed: u64) -> UserStream {
        let rows = |t: &str| {
            cfg.tables
                .iter()
                .find(|x| x.name == t)
                .map_or(1, |x| x.rows) as u64
        };
        let mut rng = Rng(seed ^ 0x5EED_0F05_7AEA_0001);
        let user_rows = rows("user_id");
        // Distinct ids while the table has rows for them (users are distinct people).
        let mut taken = std::collections::HashSet::new();
        let users = (0..n)
            .map(|k| StreamUser {
                id: loop {
                    let id = rng.below(user_rows) as i64;
                    if taken.insert(id) || k as u64 >= user_rows {
                        break id;
                    }
                },
                items: Vec::new(),
                actions: Vec::new(),
                times: Vec::new(),
                ratings: Vec::new(),
            })
            .collect();
        UserStream {
            rng,
            items: rows("item_id"),
            categories: rows("item_category_id"),
            users,
        }
    }

    /// An item id, skewed: a quarter of draws from the hottest 1% of items.
    fn item(&mut self) -> i64 {
        let hot = (self.items / 100).max(1);
        match self.rng.below(4) {
            0 => self.rng.below(hot) as i64,
            _ => self.rng.below(self.items) as i64,
        }
    }

    /// The item's category: fixed per item.
    fn category(&self, item: i64) -> i64 {
        ((item as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as i64 % self.categories as i64
    }

    /// Appends `k` actions to user `u`'s history.
    fn grow(&mut self, u: usize, k: usize) {
        let mut t = match self.users[u].times.last() {
            Some(&t) => t,
            None => EPOCH - self.rng.below(200 * 86_400) as i64,
        };
        for _ in 0..k {
            // Gaps from seconds to days: exponential with a mean of two hours, sometimes a week.
            let mean = if self.rng.below(20) == 0 {
                7.0 * 86_400.0
            } else {
                7_200.0
            };
            t += (-(1.0 - self.rng.unit()).ln() * mean) as i64 + 1;
            let item = self.item();
            let action = 1 + self.rng.below(31) as i64;
            let rating = 1 + self.rng.below(5) as i64;
            let su = &mut self.users[u];
            su.items.push(item);
            su.actions.push(action);
            su.times.push(t);
            su.ratings.push(rating);
        }
    }

    /// User `u` as a request with `history` items (grown to it, or its last `history`) and
    /// `candidates` new candidates.
    pub fn user(&mut self, u: usize, history: usize, candidates: usize) -> User {
        let have = self.users[u].items.len();
        if have < history {
            self.grow(u, history - have);
        }
        self.request(u, history, candidates)
    }

    /// The next request of a feed: a random user comes back with `1 ..= grow` new actions and
    /// `candidates` new candidates; its request carries its whole history, capped at `max`.
    pub fn next_request(&mut self, grow: usize, candidates: usize, max: usize) -> (usize, User) {
        let u = self.rng.below(self.users.len() as u64) as usize;
        let k = 1 + self.rng.below(grow.max(1) as u64) as usize;
        self.grow(u, k);
        let n = self.users[u].items.len().min(max);
        (u, self.request(u, n, candidates))
    }

    fn request(&mut self, u: usize, history: usize, candidates: usize) -> User {
        let last = self.users[u].times.last().copied().unwrap_or(EPOCH);
        let query = last + 1 + self.rng.below(3_600) as i64;
        let cand: Vec<i64> = (0..candidates).map(|_| self.item()).collect();
        let ccat: Vec<i64> = cand.iter().map(|&i| self.category(i)).collect();
        let cratings: Vec<i64> = (0..candidates)
            .map(|_| 1 + self.rng.below(5) as i64)
            .collect();
        let cactions: Vec<i64> = (0..candidates).map(|_| self.rng.below(32) as i64).collect();
        let su = &self.users[u];
        let from = su.items.len() - history.min(su.items.len());
        let items = su.items[from..].to_vec();
        let cats: Vec<i64> = items.iter().map(|&i| self.category(i)).collect();
        let n = items.len();
        let mut uih = std::collections::BTreeMap::new();
        uih.insert("user_id".to_string(), vec![su.id]);
        uih.insert("item_id".to_string(), items);
        uih.insert("item_rating".to_string(), su.ratings[from..].to_vec());
        uih.insert("action_timestamp".to_string(), su.times[from..].to_vec());
        uih.insert("item_weights".to_string(), su.actions[from..].to_vec());
        uih.insert("dummy_watch_time".to_string(), vec![0; n]);
        uih.insert("item_category_id".to_string(), cats);
        let mut c = std::collections::BTreeMap::new();
        c.insert("item_candidate_id".to_string(), cand);
        c.insert("item_candidate_rating".to_string(), cratings);
        c.insert("item_query_time".to_string(), vec![query; candidates]);
        c.insert("item_action_weights".to_string(), cactions);
        c.insert("item_dummy_watchtime".to_string(), vec![0; candidates]);
        c.insert("item_candidate_category_id".to_string(), ccat);
        User { uih, candidates: c }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hstu::HstuModel;

    #[test]
    fn presets_check_and_their_users_are_accepted() {
        for name in PRESETS {
            let cfg = preset(name, 1e-6, DType::F16).unwrap();
            cfg.check().unwrap();
            assert!(cfg.tables.iter().all(|t| t.rows >= 1));
        }
        let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
        let model = HstuModel::random(cfg.clone(), 3, 1).unwrap();
        let users = synthetic_users(&cfg, 5, 30, 7, 1);
        let batch = model.check_users(&users, 0).unwrap();
        assert_eq!(batch.candidates(), 35);
        // Histories grow and time advances.
        let mut s = UserStream::new(&cfg, 3, 9);
        let a = s.user(1, 10, 2);
        let mut last = None;
        for _ in 0..20 {
            let (u, r) = s.next_request(4, 3, 1000);
            if u == 1 {
                last = Some(r);
            }
        }
        if let Some(b) = last {
            let (ta, tb) = (&a.uih["action_timestamp"], &b.uih["action_timestamp"]);
            assert!(tb.len() > ta.len() && tb.last() > ta.last());
            assert_eq!(&tb[..ta.len()], &ta[..]);
        }
        assert!(model.check_users(&[s.user(0, 64, 3)], 0).is_ok());
    }
}
