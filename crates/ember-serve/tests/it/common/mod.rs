//! Helpers shared by the server's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_model::{Engine, Ids, KeyedJagged};
use ember_model::{LoadOptions, Model, Predictor};
use ember_serve::{BatchConfig, ServeConfig, Server};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model() -> Arc<Model> {
    Arc::new(Model::load(&root().join("models/default"), LoadOptions::default()).unwrap())
}

pub fn config() -> ServeConfig {
    ServeConfig {
        http: "127.0.0.1:0".parse().unwrap(),
        batch: BatchConfig {
            max_batch: 64,
            max_delay: Duration::from_micros(500),
            queue: 256,
            max_queue_delay: None,
            instances: 1,
        },
        ..ServeConfig::default()
    }
}

pub async fn start(cfg: ServeConfig) -> (Server, String, Arc<Model>) {
    let m = model();
    let s = Server::start(m.clone(), cfg).await.unwrap();
    let url = format!("http://{}", s.addr());
    (s, url, m)
}

/// One request's samples in the model's inputs: dense `[n, 13]`, per feature lengths and ids.
pub struct Req {
    pub n: usize,
    pub dense: Vec<f32>,
    /// Per feature: lengths, ids.
    pub sparse: Vec<(Vec<i64>, Vec<i64>)>,
}

pub fn random_req(m: &Model, n: usize, seed: u64) -> Req {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let dense = (0..n * 13).map(|_| (next() % 800) as f32 / 100.0).collect();
    let inputs = m.inputs();
    let feats = m.config().features();
    let sparse = (0..inputs.features.len())
        .map(|f| {
            let rows = inputs.rows[f] as u64;
            // 0-2 ids a bag; 0 to twice max_len a sequence (cut past max_len).
            let most = feats[f].max_len.map_or(3, |l| 2 * l as u64 + 1);
            let lengths: Vec<i64> = (0..n).map(|_| (next() % most) as i64).collect();
            let total: i64 = lengths.iter().sum();
            let ids = (0..total).map(|_| (next() % rows) as i64).collect();
            (lengths, ids)
        })
        .collect();
    Req { n, dense, sparse }
}

pub fn direct(m: &Arc<Model>, r: &Req) -> Vec<f32> {
    let mut p = Predictor::new(m.clone(), 1).unwrap();
    let lengths: Vec<usize> = r
        .sparse
        .iter()
        .flat_map(|(l, _)| l.iter().map(|&x| x as usize))
        .collect();
    let ids: Vec<i64> = r.sparse.iter().flat_map(|(_, i)| i.clone()).collect();
    let kj =
        KeyedJagged::from_lengths(m.feature_names(), r.n, &lengths, Ids::I64(ids), None).unwrap();
    let mut out = vec![0.0; r.n];
    p.score(&r.dense, &kj, &mut out).unwrap();
    out
}

/// `r` as a KServe v2 JSON request of model `m`'s inputs (`dense`, then per feature its
/// lengths and ids, all INT64).
pub fn kserve_body(m: &Model, r: &Req) -> serde_json::Value {
    use serde_json::json;
    let mut inputs =
        vec![json!({"name": "dense", "shape": [r.n, 13], "datatype": "FP32", "data": r.dense})];
    for (f, (l, ids)) in m.feature_names().iter().zip(&r.sparse) {
        inputs.push(
            json!({"name": format!("{f}_lengths"), "shape": [r.n], "datatype": "INT64", "data": l}),
        );
        inputs.push(json!({"name": format!("{f}_ids"), "shape": [ids.len()], "datatype": "INT64", "data": ids}));
    }
    json!({ "inputs": inputs })
}

pub fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5, "{g} vs {w}");
    }
}

/// The `scores` output of a KServe JSON answer.
pub fn scores_of(v: &serde_json::Value) -> Vec<f32> {
    v["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// GET `url`'s body as text (e.g. `/metrics`).
pub async fn get_text(c: &reqwest::Client, url: String) -> String {
    c.get(url).send().await.unwrap().text().await.unwrap()
}

/// How long a test waits for a state before it fails, naming it (generous: a loaded machine
/// is slow, not wrong).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Waits until the default model's batcher holds at least `n` requests (its own count, not
/// the process-wide gauge other tests also move), polling; fails after [`PATIENCE`].
pub async fn wait_queued(s: &Server, n: usize) {
    let served = s.repository().get_default(None).unwrap();
    let start = Instant::now();
    while served.batcher.queued() < n {
        assert!(
            start.elapsed() < PATIENCE,
            "the batcher holds {} requests, not {n}",
            served.batcher.queued()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
