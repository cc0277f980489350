//! A graph model (the `graph_mmoe` fixture: TorchRec tables under a multi-gate mixture of
//! experts with two heads, its dense part `dense.onnx`) on the Redis Cluster tier and on the SSD
//! tier, as a user puts its tables there: `ember registry push` (the graph stored beside the
//! config, and the version fetched from the registry alone as `serve --from-registry` builds
//! it), `ember convert --placement ssd`; `ember predict` must give both heads exactly as with the
//! tables in memory; and rows published with `ember registry update` reach a serving replica,
//! whose scores become exactly those of a server started after the update.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ember_model::registry::RegistryModel;
use rand::{Rng, SeedableRng};

/// A copy of fixture `name` in `dir/name` (the name the registry gives it) with its batch as
/// `samples.jsonl` (the form `ember predict` and `/v1/score` read).
fn fixture_copy(dir: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ember-model/tests/fixtures")
        .join(name);
    let dst = dir.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["config.json", "model.safetensors", "dense.onnx"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let exp = expected(name);
    let dense: Vec<Vec<f32>> = serde_json::from_value(exp["dense"].clone()).unwrap();
    let keys: Vec<String> = serde_json::from_value(exp["keys"].clone()).unwrap();
    let lengths: Vec<usize> = serde_json::from_value(exp["lengths"].clone()).unwrap();
    let values: Vec<i64> = serde_json::from_value(exp["values"].clone()).unwrap();
    let n = dense.len();
    // Key-major bags, as a KeyedJaggedTensor holds them.
    let mut bags = vec![serde_json::Map::new(); n];
    let mut at = 0;
    for (k, key) in keys.iter().enumerate() {
        for (i, bag) in bags.iter_mut().enumerate() {
            let l = lengths[k * n + i];
            bag.insert(key.clone(), serde_json::json!(values[at..at + l]));
            at += l;
        }
    }
    let lines: Vec<String> = dense
        .iter()
        .zip(bags)
        .map(|(d, s)| serde_json::json!({"dense": d, "sparse": s}).to_string())
        .collect();
    std::fs::write(dst.join("samples.jsonl"), lines.join("\n") + "\n").unwrap();
    dst
}

/// `ember registry push` of `model` to the cluster at `url`, no replicas.
fn push(url: &str, model: &str) {
    crate::ok(&[
        "registry",
        "push",
        "--redis",
        url,
        "--model",
        model,
        "--replicas",
        "0",
    ]);
}

/// Fixture `name`'s `expected.json` (`tools/graph_fixtures.py`).
fn expected(name: &str) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ember-model/tests/fixtures")
        .join(name)
        .join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `ember predict` of the model's samples with `extra` flags: the scores file's text.
fn predict(model: &Path, out: &Path, extra: &[&str]) -> String {
    crate::predict_file(model, "samples.jsonl", out, extra)
}

/// Per sample, its heads' scores, from `ember predict`'s lines or a `/v1/score` answer.
fn heads(v: &[serde_json::Value]) -> Vec<(f64, f64)> {
    v.iter()
        .map(|s| (s["ctr"].as_f64().unwrap(), s["cvr"].as_f64().unwrap()))
        .collect()
}

fn predicted(text: &str) -> Vec<(f64, f64)> {
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["scores"].clone())
        .collect();
    heads(&lines)
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn graph_model_tables_on_the_redis_and_ssd_tiers_score_as_in_memory_and_take_updates() {
    let Some(c) = super::cluster(0) else { return };
    let url = c.url();
    let tmp = std::env::temp_dir().join(format!("ember-graph-tiers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let model = fixture_copy(&tmp, "graph_mmoe");
    let m = model.to_str().unwrap();
    let dram = predict(&model, &tmp.join("dram.jsonl"), &[]);
    assert_eq!(predicted(&dram).len(), 7, "{dram}");

    let out = crate::ok(&[
        "registry",
        "push",
        "--redis",
        &url,
        "--model",
        m,
        "--replicas",
        "0",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(j["model"].as_str(), Some("graph_mmoe"), "{out}");
    assert_eq!(j["tables"].as_u64(), Some(4), "{out}");

    // Every table read from the cluster.
    let remote = predict(
        &model,
        &tmp.join("remote.jsonl"),
        &["--placement", "remote", "--redis", &url],
    );
    assert_eq!(remote, dram, "scores with the tables on the Redis tier");

    // The version fetched from the registry alone: config, graph, every table remote.
    let mut reg = RegistryModel::connect(&url, "graph_mmoe").unwrap();
    let version = reg.target().unwrap();
    let fetched = tmp.join("fetched");
    reg.fetch(version, &fetched).unwrap();
    assert_eq!(
        std::fs::read(fetched.join("dense.onnx")).unwrap(),
        std::fs::read(model.join("dense.onnx")).unwrap(),
        "the graph as pushed"
    );
    std::fs::copy(model.join("samples.jsonl"), fetched.join("samples.jsonl")).unwrap();
    let from_registry = predict(&fetched, &tmp.join("fetched.jsonl"), &[]);
    assert_eq!(
        from_registry, dram,
        "scores of the version from the registry"
    );

    // A replica serving from the cluster, then an update of every row of table `ad`.
    let server = super::serve::remote_server(&url, &["--model", m]);
    let body = format!(
        "[{}]",
        std::fs::read_to_string(model.join("samples.jsonl"))
            .unwrap()
            .trim()
            .replace('\n', ",")
    );
    let served = |s: &crate::server::Server| -> Vec<(f64, f64)> {
        let (code, text) = s
            .request("POST", "/v1/score", "application/json", body.as_bytes())
            .unwrap();
        assert_eq!(code, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        heads(v["scores"].as_array().unwrap())
    };
    let close = |a: &[(f64, f64)], b: &[(f64, f64)]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x.0 - y.0).abs() <= 1e-6 && (x.1 - y.1).abs() <= 1e-6)
    };
    assert!(
        close(&served(&server), &predicted(&dram)),
        "served before the update"
    );
    let file = tmp.join("ad.safetensors");
    let ids: Vec<i64> = (0..60).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let rows: Vec<f32> = (0..60 * 9).map(|_| rng.random_range(-2.0..2.0)).collect();
    super::updates::update_file(&file, &ids, &rows, 9);
    let out = crate::ok(&[
        "registry",
        "update",
        "--redis",
        &url,
        "--model",
        "graph_mmoe",
        "--table",
        "ad",
        "--rows",
        file.to_str().unwrap(),
    ]);
    assert!(out.contains("updated 60 rows"), "{out}");
    let after = predict(
        &model,
        &tmp.join("after.jsonl"),
        &["--placement", "remote", "--redis", &url],
    );
    let want = predicted(&after);
    assert!(
        !close(&want, &predicted(&dram)),
        "the update changed no score"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = served(&server);
        if close(&now, &want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not take the update in 30 s: {now:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(server);

    // Row files on the SSD tier (`ember convert`), then with a 1 MiB cache of the other policy.
    crate::ok(&["convert", "--model", m, "--placement", "ssd"]);
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    assert!(
        config.contains("\"ssd\"") && config.contains("\"graph\""),
        "{config}"
    );
    let ssd = predict(&model, &tmp.join("ssd.jsonl"), &[]);
    assert_eq!(ssd, dram, "scores with the tables on the SSD tier");
    let flags = ["--cache-mb", "1", "--cache-policy", "lfu", "--io", "mmap"];
    let small = predict(&model, &tmp.join("ssd_small.jsonl"), &flags);
    assert_eq!(small, dram, "scores with the SSD tier's flags");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Per sample, both heads, from `ember predict`'s lines, compared within `tol` (relative): rows
/// pooled on the cluster's nodes are summed in another order than in memory.
fn assert_heads_close(got: &str, want: &str, tol: f64, what: &str) {
    let (g, w) = (predicted(got), predicted(want));
    assert_eq!(g.len(), w.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        for (x, y) in [(a.0, b.0), (a.1, b.1)] {
            assert!(
                (x - y).abs() <= tol * y.abs().max(1e-3),
                "{what}: sample {i}: {x} vs {y}"
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn graph_model_bags_pooled_on_the_nodes_score_as_in_memory() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let url = c.url();
    let tmp = std::env::temp_dir().join(format!("ember-graph-pool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let model = fixture_copy(&tmp, "graph_mmoe");
    let m = model.to_str().unwrap();
    let dram = predict(&model, &tmp.join("dram.jsonl"), &[]);
    push(&url, m);
    // No row cache: every bag's rows are pooled on the node that holds them (refused to start
    // if a primary lacked the module).
    let flags = [
        "--placement",
        "remote",
        "--redis",
        &url,
        "--pool-remote",
        "on",
        "--cache-mb",
        "0",
    ];
    let pooled = predict(&model, &tmp.join("pooled.jsonl"), &flags);
    assert_heads_close(&pooled, &dram, 1e-5, "pooled on the nodes");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `ember predict`'s scores of a one-output model: a number a line.
fn scores(text: &str) -> Vec<f64> {
    text.lines()
        .map(|l| l.trim().parse().unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// A model with sequence features (the `graph_din` fixture: TorchRec `EmbeddingCollection`s
/// under target attention), its tables in memory, on the Redis Cluster tier (rows fetched, then
/// pooled on the nodes: each position of a sequence a bag of one row) and on the SSD tier:
/// `ember predict` gives PyTorch's scores within 1e-5 in memory, and the same scores from each
/// tier (within 1e-5 where the nodes sum a bag's rows in another order).
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_sequence_model_on_the_redis_and_ssd_tiers_scores_as_pytorch() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let url = c.url();
    let tmp = std::env::temp_dir().join(format!("ember-graph-seq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let model = fixture_copy(&tmp, "graph_din");
    let m = model.to_str().unwrap();
    let exp = expected("graph_din");
    let want: Vec<f64> = serde_json::from_value(exp["outputs"]["score"].clone()).unwrap();
    let dram = predict(&model, &tmp.join("dram.jsonl"), &[]);
    let got = scores(&dram);
    assert_eq!(got.len(), want.len(), "{dram}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "sample {i}: {g} vs PyTorch's {w}"
        );
    }
    push(&url, m);
    let remote = ["--placement", "remote", "--redis", &url];
    let fetched = predict(&model, &tmp.join("remote.jsonl"), &remote);
    assert_eq!(fetched, dram, "scores with the tables on the Redis tier");
    let pooled = [&remote[..], &["--pool-remote", "on", "--cache-mb", "0"]].concat();
    let on_nodes = scores(&predict(&model, &tmp.join("pooled.jsonl"), &pooled));
    for (i, (g, w)) in on_nodes.iter().zip(&got).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs(),
            "pooled on the nodes, sample {i}: {g} vs {w}"
        );
    }
    crate::ok(&["convert", "--model", m, "--placement", "ssd"]);
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    assert!(
        config.contains("\"ssd\"") && config.contains("\"max_len\": 6"),
        "{config}"
    );
    let ssd = predict(&model, &tmp.join("ssd.jsonl"), &[]);
    assert_eq!(ssd, dram, "scores with the tables on the SSD tier");
    std::fs::remove_dir_all(&tmp).unwrap();
}
