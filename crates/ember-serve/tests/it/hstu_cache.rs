//! An HSTU model served with a cache of users' histories (`LoadOptions::history_cache`): a
//! returning user is scored from its entry, as `run_as_of` scores it as of its previous
//! request (computed here on a model without a cache), a new user as alone; `/metrics` counts
//! the cache's hits, misses, entries and bytes under the model's name.

use crate::common;

use std::sync::Arc;

use ember_model::LoadOptions;
use ember_model::hstu::presets::UserStream;
use ember_model::hstu::{
    AsOf, Eviction, HistoryCacheConfig, HstuModel, HstuPredictor, Reuse, User,
};
use ember_model::serving::Servable;
use ember_serve::Server;
use serde_json::Value;

fn fixture() -> std::path::PathBuf {
    common::root().join("crates/ember-model/tests/fixtures/hstu_small")
}

/// User `u`'s scores from `/v1/score`, per task in the model's order (`tasks`).
async fn score(c: &reqwest::Client, url: &str, u: &User, tasks: &[String]) -> Vec<Vec<f32>> {
    let r = c
        .post(format!("{url}/v1/score"))
        .header("content-type", "application/json")
        .body(serde_json::to_string(u).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    tasks
        .iter()
        .map(|t| {
            (v["scores"][0][t].as_array().unwrap().iter())
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// The metric's value in a Prometheus text page, for the model `hstu-cached`.
fn metric(page: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{model=\"hstu-cached\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_user_is_served_from_its_entry() {
    let opts = LoadOptions {
        history_cache: Some(HistoryCacheConfig {
            bytes: 64 << 20,
            eviction: Eviction::Lru,
            reuse: Reuse::DEFAULT,
            spill: None,
            share: None,
        }),
        ..LoadOptions::default()
    };
    let s: Arc<dyn Servable> = ember_model::serving::load(&fixture(), opts).unwrap();
    let mut cfg = common::config();
    cfg.model_name = "hstu-cached".into();
    let server = Server::start_servable(s, cfg).await.unwrap();
    let url = format!("http://{}", server.addr());
    let c = reqwest::Client::new();

    let plain = Arc::new(HstuModel::load(&fixture(), LoadOptions::default()).unwrap());
    let mut p = HstuPredictor::new(plain.clone(), 1).unwrap();
    let mut stream = UserStream::new(plain.config(), 2, 3);
    let first = stream.user(0, 30, 4);
    let next = stream.user(0, 36, 5);
    let other = stream.user(1, 25, 3);
    let tasks = plain.tasks();
    // The first request fills the entry; the scores are the fresh pass's.
    let got = score(&c, &url, &first, &tasks).await;
    let a = plain.check_users(std::slice::from_ref(&first), 0).unwrap();
    let want = p.run(&a).unwrap().0.scores;
    common::assert_close(&got.concat(), &want.concat());
    // The return: as of the first request.
    let got = score(&c, &url, &next, &tasks).await;
    let b = plain.check_users(std::slice::from_ref(&next), 0).unwrap();
    let want = p.run_as_of(&b, &[Some(AsOf::of(&a, 0))]).unwrap().0.scores;
    let fresh = p.run(&b).unwrap().0.scores;
    common::assert_close(&got.concat(), &want.concat());
    assert_ne!(
        got.concat(),
        fresh.concat(),
        "the stale scores differ from fresh ones"
    );
    // Another user: a miss, as alone.
    let got = score(&c, &url, &other, &tasks).await;
    let o = plain.check_users(std::slice::from_ref(&other), 0).unwrap();
    common::assert_close(&got.concat(), &p.run(&o).unwrap().0.scores.concat());

    let page = common::get_text(&c, format!("{url}/metrics")).await;
    assert_eq!(metric(&page, "ember_history_cache_hits_total"), 1.0);
    assert_eq!(metric(&page, "ember_history_cache_misses_total"), 2.0);
    assert_eq!(metric(&page, "ember_history_cache_entries"), 2.0);
    assert!(metric(&page, "ember_history_cache_bytes") > 0.0);
    // Per-user latency, by history class: three users of 25 to 36 items, all of class 64.
    let count = |class: &str| -> f64 {
        page.lines()
            .filter(|l| l.starts_with("ember_user_request_duration_seconds_count{"))
            .filter(|l| {
                l.contains("model=\"hstu-cached\"") && l.contains(&format!("history=\"{class}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!((count("64"), count("256")), (3.0, 0.0), "{page}");
    let p99_bucket = page.lines().find(|l| {
        l.starts_with("ember_user_request_duration_seconds_bucket{") && l.contains("le=\"0.08\"")
    });
    assert!(
        p99_bucket.is_some(),
        "the per-user buckets include 80 ms: {page}"
    );
    server.shutdown().await.unwrap();
}
