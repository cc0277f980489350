//! The real server on a free loopback port, driven over HTTP: KServe v2, /v1/score, /metrics,
//! bad inputs, deadlines and the graceful stop.

use crate::common;

use std::time::Duration;

use common::*;
use ember_model::criteo::{self, CriteoBatch};
use ember_model::{Engine, Model, Predictor};
use serde_json::{Value, json};

fn body(m: &Model, r: &Req, nested: bool) -> Value {
    let dense: Value = if nested {
        r.dense
            .chunks(13)
            .map(|c| c.to_vec())
            .collect::<Vec<_>>()
            .into()
    } else {
        r.dense.clone().into()
    };
    let mut inputs =
        vec![json!({"name": "dense", "shape": [r.n, 13], "datatype": "FP32", "data": dense})];
    for (f, (l, ids)) in m.feature_names().iter().zip(&r.sparse) {
        inputs.push(
            json!({"name": format!("{f}_lengths"), "shape": [r.n], "datatype": "INT64", "data": l}),
        );
        inputs.push(json!({"name": format!("{f}_ids"), "shape": [ids.len()], "datatype": "INT64", "data": ids}));
    }
    json!({ "id": "req-7", "inputs": inputs })
}

/// GET `url`: the status and the JSON body.
async fn get_json(c: &reqwest::Client, url: String) -> (u16, Value) {
    let r = c.get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// POST `body` as JSON to `url`: the status and the JSON body.
async fn post_json(c: &reqwest::Client, url: String, body: &Value) -> (u16, Value) {
    let r = c.post(url).json(body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metadata() {
    let (s, url, m) = start(config()).await;
    let c = reqwest::Client::new();
    let (_, live) = get_json(&c, format!("{url}/v2/health/live")).await;
    assert_eq!(live["live"], true);
    let ready = c
        .get(format!("{url}/v2/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let (_, meta) = get_json(&c, format!("{url}/v2/models/default")).await;
    assert_eq!(meta["name"], "default");
    let inputs = meta["inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), 1 + 2 * m.feature_names().len());
    assert_eq!(inputs[0]["shape"], json!([-1, 13]));
    assert_eq!(meta["outputs"][0]["name"], "scores");
    let (status, e) = get_json(&c, format!("{url}/v2/models/other")).await;
    assert_eq!(status, 404);
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("unknown model 'other'")
    );
    assert_eq!(
        c.get(format!("{url}/nope")).send().await.unwrap().status(),
        404
    );
    s.shutdown().await.unwrap();
}

/// Triton's statistics and configuration extensions: counts that add up to the requests sent,
/// the versioned and unversioned routes, 404 for a version not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_and_configuration_as_triton_reports_them() {
    let cfg = config();
    let max_batch = cfg.batch.max_batch;
    let (s, url, m) = start(cfg).await;
    let c = reqwest::Client::new();
    let (_, meta) = get_json(&c, format!("{url}/v2")).await;
    let ext = meta["extensions"].as_array().unwrap();
    assert!(ext.contains(&json!("statistics")) && ext.contains(&json!("model_configuration")));
    let (_, before) = get_json(&c, format!("{url}/v2/models/stats")).await;
    assert_eq!(before["model_stats"][0]["inference_count"], 0);
    let sizes = [1usize, 5, 3];
    for (i, &n) in sizes.iter().enumerate() {
        let r = random_req(&m, n, 40 + i as u64);
        let (status, _) = post_json(
            &c,
            format!("{url}/v2/models/default/infer"),
            &body(&m, &r, false),
        )
        .await;
        assert_eq!(status, 200);
    }
    for route in [
        "models/stats",
        "models/default/stats",
        "models/default/versions/1/stats",
    ] {
        let (status, v) = get_json(&c, format!("{url}/v2/{route}")).await;
        assert_eq!(status, 200, "{route}: {v}");
        let st = &v["model_stats"][0];
        assert_eq!(
            (st["name"].as_str(), st["version"].as_str()),
            (Some("default"), Some("1"))
        );
        assert_eq!(st["inference_count"], 9, "{route}: {st}");
        let i = &st["inference_stats"];
        assert_eq!(i["success"]["count"], 3, "{st}");
        assert!(i["success"]["ns"].as_u64().unwrap() > 0);
        assert_eq!(i["fail"]["count"], 0);
        assert_eq!(i["queue"]["count"], 3);
        let runs = st["execution_count"].as_u64().unwrap();
        assert!((1..=3).contains(&runs), "{st}");
        let per_size: u64 = st["batch_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["compute_infer"]["count"].as_u64().unwrap())
            .sum();
        assert_eq!(per_size, runs, "{st}");
        assert!(st["last_inference"].as_u64().unwrap() > 1_700_000_000_000);
    }
    let (status, e) = get_json(&c, format!("{url}/v2/models/default/versions/9/stats")).await;
    assert_eq!(status, 404, "{e}");
    let (status, cfgj) = get_json(&c, format!("{url}/v2/models/default/config")).await;
    assert_eq!(status, 200, "{cfgj}");
    assert_eq!(cfgj["name"], "default");
    assert_eq!(cfgj["max_batch_size"], max_batch);
    let inputs = cfgj["input"].as_array().unwrap();
    assert_eq!(inputs.len(), 1 + 2 * m.feature_names().len());
    assert_eq!(
        inputs[0],
        json!({"name": "dense", "data_type": "TYPE_FP32", "dims": [13]})
    );
    assert_eq!(inputs[1]["dims"], json!([1]));
    assert_eq!(inputs[2]["dims"], json!([-1]));
    let (_, v1) = get_json(&c, format!("{url}/v2/models/default/versions/1/config")).await;
    assert_eq!(v1, cfgj);
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_matches_the_predictor() {
    let (s, url, m) = start(config()).await;
    let c = reqwest::Client::new();
    for (seed, n) in [(1u64, 1usize), (2, 5), (3, 17)] {
        let r = random_req(&m, n, seed);
        let want = direct(&m, &r);
        for (nested, route) in [(false, "infer"), (true, "versions/1/infer")] {
            let url = format!("{url}/v2/models/default/{route}");
            let (status, v) = post_json(&c, url, &body(&m, &r, nested)).await;
            assert_eq!(status, 200);
            assert_eq!(v["id"], "req-7");
            assert_eq!(v["model_name"], "default");
            assert_eq!(v["outputs"][0]["shape"], json!([n]));
            assert_close(&scores_of(&v), &want);
        }
    }
    // Many at once: batched together, each still gets its own scores.
    let reqs: Vec<Req> = (0..24)
        .map(|i| random_req(&m, 1 + i % 4, 100 + i as u64))
        .collect();
    let futs = reqs.iter().map(|r| {
        c.post(format!("{url}/v2/models/default/infer"))
            .json(&body(&m, r, false))
            .send()
    });
    let resps = futures_join(futs).await;
    for (resp, r) in resps.into_iter().zip(&reqs) {
        let v: Value = resp.unwrap().json().await.unwrap();
        assert_close(&scores_of(&v), &direct(&m, r));
    }
    s.shutdown().await.unwrap();
}

/// Runs the futures concurrently, answers in order.
async fn futures_join<F: std::future::Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400_naming_the_problem_and_serving_goes_on() {
    let mut cfg = config();
    cfg.max_body_bytes = 64 << 10;
    let (s, url, m) = start(cfg).await;
    let c = reqwest::Client::new();
    let good = body(&m, &random_req(&m, 2, 5), false);
    let f0 = m.feature_names()[0].clone();
    let f3 = m.feature_names()[3].clone();
    let rows = m.embeddings().table_of(3).rows();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut b = good.clone();
        f(&mut b);
        b.to_string()
    };
    let cases: Vec<(String, String)> = vec![
        (
            "{\"inputs\": [".into(),
            "malformed inference request JSON".into(),
        ),
        ("[1, 2]".into(), "malformed inference request JSON".into()),
        (
            edit(&|b| {
                b["inputs"].as_array_mut().unwrap().remove(0);
            }),
            "missing input 'dense'".into(),
        ),
        (
            edit(&|b| b["inputs"][0]["datatype"] = json!("FP64")),
            "input 'dense' has datatype FP64; it must be FP32".into(),
        ),
        (
            edit(&|b| b["inputs"][0]["shape"] = json!([2, 12])),
            "input 'dense' has shape [2, 12]; the model takes [N, 13]".into(),
        ),
        (
            edit(&|b| b["inputs"][0]["shape"] = json!([3, 13])),
            "input 'dense' has 26 values in 'data' but its shape [3, 13] holds 39".into(),
        ),
        (
            edit(&|b| b["inputs"][0]["data"][4] = json!("x")),
            "input 'dense': value 4 is not a number".into(),
        ),
        (
            edit(&|b| b["inputs"][2]["data"][0] = json!(1.5)),
            format!("input '{f0}_ids': value 0 is not an INT64 (1.5)"),
        ),
        (
            edit(&|b| b["inputs"][1]["data"] = json!([-1, 1])),
            format!("input '{f0}_lengths': length -1 of sample 0 is not a count of ids"),
        ),
        (
            edit(&|b| b["inputs"][1]["shape"] = json!([3])),
            format!("input '{f0}_lengths' has shape [3]; it needs one length per sample: [2]"),
        ),
        (
            edit(&|b| {
                b["inputs"][8]["data"][0] = json!(rows);
                b["inputs"][7]["data"] = json!([1, 0]);
                b["inputs"][8]["shape"] = json!([1]);
                b["inputs"][8]["data"] = json!([rows]);
            }),
            format!("{f3}: id {rows} of sample 0 is out of range (the table has {rows} rows)"),
        ),
        (
            edit(&|b| {
                b["inputs"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "extra", "shape": [1], "datatype": "INT64", "data": [1]}))
            }),
            "unknown input 'extra'".into(),
        ),
        (
            edit(&|b| b["parameters"] = json!({"timeout": "soon"})),
            "parameters.timeout must be a positive integer of microseconds".into(),
        ),
        (
            edit(&|b| b["outputs"] = json!([{"name": "logits"}])),
            "unknown output 'logits'".into(),
        ),
        (
            edit(&|b| b["inputs"][0]["shape"] = json!([-2, 13])),
            "dimensions must be >= 0".into(),
        ),
        (
            format!("{{\"inputs\": [], \"pad\": \"{}\"}}", "x".repeat(70 << 10)),
            "over the server's limit of 65536 bytes".into(),
        ),
    ];
    for (b, want) in &cases {
        let r = c
            .post(format!("{url}/v2/models/default/infer"))
            .header("content-type", "application/json")
            .body(b.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "for {want}");
        let e: Value = r.json().await.unwrap();
        let msg = e["error"].as_str().unwrap();
        assert!(
            msg.contains(want.as_str()),
            "error '{msg}' does not say '{want}'"
        );
        // And the next request is served normally.
        let (status, _) = post_json(&c, format!("{url}/v2/models/default/infer"), &good).await;
        assert_eq!(status, 200);
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_route_reads_tsv_and_json() {
    let (s, url, m) = start(config()).await;
    let c = reqwest::Client::new();
    let text = std::fs::read_to_string(root().join("data/sample.tsv")).unwrap();
    let lines: Vec<&str> = text.lines().take(40).collect();
    // Expected: the same rows through the Criteo reader and the predictor.
    let mut batch = CriteoBatch::default();
    for (i, l) in lines.iter().enumerate() {
        criteo::parse_line(l, "t", i as u64, &mut batch).unwrap();
    }
    let rows: Vec<usize> = (0..26).map(|f| m.embeddings().table_of(f).rows()).collect();
    let kj = batch.sparse(&m.feature_names(), &rows).unwrap();
    let mut want = vec![0.0; batch.len()];
    Predictor::new(m.clone(), 1)
        .unwrap()
        .score(&batch.dense, &kj, &mut want)
        .unwrap();

    let r = c
        .post(format!("{url}/v1/score"))
        .body(lines.join("\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got: Vec<f32> = r
        .text()
        .await
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_close(&got, &want);

    // Without the label column.
    let unlabeled: Vec<&str> = lines
        .iter()
        .map(|l| l.split_once('\t').unwrap().1)
        .collect();
    let r = c
        .post(format!("{url}/v1/score?labels=false"))
        .body(unlabeled.join("\n"))
        .send()
        .await
        .unwrap();
    let got: Vec<f32> = r
        .text()
        .await
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_close(&got, &want);

    // A malformed line: named by line and column.
    let mut bad = lines[..3].to_vec();
    let broken = lines[1].replacen('\t', "\tthree", 2);
    bad[1] = &broken;
    let r = c
        .post(format!("{url}/v1/score"))
        .body(bad.join("\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"].as_str().unwrap().contains("line 2"), "{e}");

    // Without labels, columns are counted as the client sent them.
    let r = c
        .post(format!("{url}/v1/score?labels=false"))
        .body(format!(
            "{}\nx\t{}",
            unlabeled[0],
            unlabeled[1].split_once('\t').unwrap().1
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    let msg = e["error"].as_str().unwrap();
    assert!(
        msg.contains("line 2, column 1: integer feature I1 is 'x'"),
        "{msg}"
    );

    // JSON: the model's inputs as they are.
    let req = random_req(&m, 3, 9);
    let samples: Vec<Value> = (0..3)
        .map(|i| {
            let mut sparse = serde_json::Map::new();
            for (f, (l, ids)) in m.feature_names().iter().zip(&req.sparse) {
                let start: i64 = l[..i].iter().sum();
                let bag = &ids[start as usize..(start + l[i]) as usize];
                sparse.insert(f.clone(), json!(bag));
            }
            json!({"dense": &req.dense[i * 13..(i + 1) * 13], "sparse": sparse})
        })
        .collect();
    let (_, v) = post_json(&c, format!("{url}/v1/score"), &json!(samples)).await;
    let got: Vec<f32> = v["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_close(&got, &direct(&m, &req));
    let (_, one) = post_json(&c, format!("{url}/v1/score"), &samples[1]).await;
    assert_eq!(one["scores"].as_array().unwrap().len(), 1);
    // The same JSON without its Content-Type: refused naming the header, not misread as TSV.
    for ctype in [None, Some("text/plain")] {
        let mut r = c
            .post(format!("{url}/v1/score"))
            .body(samples[1].to_string());
        if let Some(t) = ctype {
            r = r.header("content-type", t);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 400);
        let e: Value = r.json().await.unwrap();
        let msg = e["error"].as_str().unwrap();
        assert!(
            msg.contains("looks like JSON") && msg.contains("Content-Type: application/json"),
            "{msg}"
        );
        assert!(msg.contains(ctype.unwrap_or("no Content-Type")), "{msg}");
    }
    let mut missing = samples[0].clone();
    missing["sparse"]
        .as_object_mut()
        .unwrap()
        .remove(&m.feature_names()[2]);
    let (status, e) = post_json(&c, format!("{url}/v1/score"), &missing).await;
    assert_eq!(status, 400);
    assert!(
        e["error"].as_str().unwrap().contains(&format!(
            "sparse feature '{}' is missing",
            m.feature_names()[2]
        )),
        "{e}"
    );
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_metrics_and_a_graceful_stop() {
    let mut cfg = config();
    cfg.batch.max_delay = Duration::from_millis(150);
    cfg.batch.queue = 2;
    let (s, url, m) = start(cfg).await;
    let c = reqwest::Client::new();
    // Two requests wait in a forming batch; a third finds the queue full: 503 at once.
    let waiting: Vec<Req> = (0..2).map(|i| random_req(&m, 1, 20 + i)).collect();
    let futs = spawn_infers(&c, &url, &m, &waiting);
    wait_queued(&s, 2).await;
    let (status, v) = post_json(
        &c,
        format!("{url}/v2/models/default/infer"),
        &body(&m, &random_req(&m, 1, 22), false),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("at capacity"), "{v}");
    expect_scores(futs, &m, &waiting).await;
    // A deadline shorter than the batching delay: 504, not computed.
    let mut b = body(&m, &random_req(&m, 1, 3), false);
    b["parameters"] = json!({"timeout": 1000});
    let (status, _) = post_json(&c, format!("{url}/v2/models/default/infer"), &b).await;
    assert_eq!(status, 504);
    let page = get_text(&c, format!("{url}/metrics")).await;
    for name in [
        "ember_requests_total{protocol=\"http\",status=\"deadline_exceeded\"}",
        "ember_requests_total{protocol=\"http\",status=\"resource_exhausted\"}",
        "ember_request_duration_seconds_bucket",
        "ember_queue_wait_seconds_bucket",
        "ember_request_decode_seconds_bucket{protocol=\"http\"",
        "ember_requests_in_flight",
    ] {
        assert!(page.contains(name), "/metrics lacks {name}");
    }
    // Requests in flight when the stop comes are answered; then the port is closed.
    let reqs: Vec<Req> = (0..2).map(|i| random_req(&m, 3, 40 + i)).collect();
    let futs = spawn_infers(&c, &url, &m, &reqs);
    wait_queued(&s, 2).await;
    s.shutdown().await.unwrap();
    expect_scores(futs, &m, &reqs).await;
    assert!(c.get(format!("{url}/v2/health/live")).send().await.is_err());
}

type Pending = tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>;

/// Sends each request as KServe JSON at once, without waiting for the answers.
fn spawn_infers(c: &reqwest::Client, url: &str, m: &Model, reqs: &[Req]) -> Vec<Pending> {
    reqs.iter()
        .map(|r| {
            let send = c
                .post(format!("{url}/v2/models/default/infer"))
                .json(&body(m, r, false))
                .send();
            tokio::spawn(send)
        })
        .collect()
}

/// Each answer is 200 with the model's scores for its request.
async fn expect_scores(futs: Vec<Pending>, m: &std::sync::Arc<Model>, reqs: &[Req]) {
    for (f, r) in futs.into_iter().zip(reqs) {
        let resp = f.await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        assert_close(&scores_of(&v), &direct(m, r));
    }
}

/// A request in Triton's binary tensor data extension: the first `in_json` inputs keep their
/// values in JSON, the others send them as little-endian bytes after the JSON. Returns the body
/// and the JSON's length.
fn binary_body(m: &Model, r: &Req, int32: bool, in_json: usize, out: Value) -> (Vec<u8>, usize) {
    let mut j = body(m, r, false);
    j["parameters"] = json!({ "binary_data_output": out });
    let mut bin = Vec::new();
    for (k, input) in j["inputs"].as_array_mut().unwrap().iter_mut().enumerate() {
        if input["datatype"] == "INT64" && int32 {
            input["datatype"] = json!("INT32");
        }
        if k < in_json {
            continue;
        }
        let data = input.as_object_mut().unwrap().remove("data").unwrap();
        let start = bin.len();
        for v in data.as_array().unwrap() {
            match input["datatype"].as_str().unwrap() {
                "FP32" => bin.extend((v.as_f64().unwrap() as f32).to_le_bytes()),
                "INT32" => bin.extend((v.as_i64().unwrap() as i32).to_le_bytes()),
                _ => bin.extend(v.as_i64().unwrap().to_le_bytes()),
            }
        }
        input["parameters"] = json!({ "binary_data_size": bin.len() - start });
    }
    let mut b = j.to_string().into_bytes();
    let len = b.len();
    b.extend(bin);
    (b, len)
}

async fn post_binary(
    c: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    json_len: &str,
) -> reqwest::Response {
    c.post(format!("{url}/v2/models/default/infer"))
        .header("Inference-Header-Content-Length", json_len)
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_tensor_data_extension() {
    let (s, url, m) = start(config()).await;
    let c = reqwest::Client::new();
    // All inputs binary, some, or none; INT64 or INT32; scores back as binary or as JSON.
    for (k, (in_json, int32, out)) in [
        (0, false, true),
        (0, true, false),
        (1, false, true),
        (20, true, true),
        (53, false, true),
    ]
    .into_iter()
    .enumerate()
    {
        let r = random_req(&m, 1 + k % 3, 300 + k as u64);
        let (b, len) = binary_body(&m, &r, int32, in_json, json!(out));
        let resp = post_binary(&c, &url, b, &len.to_string()).await;
        assert_eq!(resp.status(), 200);
        let hl = resp
            .headers()
            .get("inference-header-content-length")
            .map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
        let bytes = resp.bytes().await.unwrap();
        let scores: Vec<f32> = if out {
            let hl = hl.expect("a binary answer names its JSON length");
            let head: Value = serde_json::from_slice(&bytes[..hl]).unwrap();
            assert_eq!(head["outputs"][0]["name"], "scores");
            assert_eq!(
                head["outputs"][0]["parameters"]["binary_data_size"],
                4 * r.n
            );
            assert!(head["outputs"][0].get("data").is_none());
            let (v, rest) = bytes[hl..].as_chunks::<4>();
            assert!(rest.is_empty());
            v.iter().map(|b| f32::from_le_bytes(*b)).collect()
        } else {
            assert!(hl.is_none());
            scores_of(&serde_json::from_slice(&bytes).unwrap())
        };
        assert_close(&scores, &direct(&m, &r));
    }
    // Asking for binary scores through the requested output works too.
    let r = random_req(&m, 2, 320);
    let mut j = body(&m, &r, false);
    j["outputs"] = json!([{"name": "scores", "parameters": {"binary_data": true}}]);
    let resp = post_json_raw(&c, &url, j.to_string()).await;
    assert!(
        resp.headers()
            .contains_key("inference-header-content-length")
    );

    // Bad binary requests: 400 naming the problem, and the next request is served.
    let r = random_req(&m, 2, 321);
    let (good, len) = binary_body(&m, &r, false, 0, json!(true));
    let head: Value = serde_json::from_slice(&good[..len]).unwrap();
    // The body with its JSON edited by `f` (and the header's length to match).
    let edit = |f: &dyn Fn(&mut Value)| -> (Vec<u8>, String, usize) {
        let mut h = head.clone();
        f(&mut h);
        let mut b = h.to_string().into_bytes();
        let l = b.len();
        b.extend_from_slice(&good[len..]);
        (b, l.to_string(), l)
    };
    // Dense sent as 48 bytes (and said so) where its shape needs 104.
    let (mut shrunk, shrunk_len, l) =
        edit(&|h| h["inputs"][0]["parameters"]["binary_data_size"] = json!(48));
    shrunk.drain(l + 48..l + 104);
    let (neg, neg_len, _) = edit(&|h| h["inputs"][0]["parameters"]["binary_data_size"] = json!(-1));
    let (both, both_len, _) = edit(&|h| h["inputs"][0]["data"] = json!([1.0]));
    let (neither, neither_len, _) = edit(&|h| {
        h["inputs"][0].as_object_mut().unwrap().remove("parameters");
    });
    let cases: Vec<(Vec<u8>, String, &str)> = vec![
        (
            good.clone(),
            (len + 1).to_string(),
            "malformed inference request JSON",
        ),
        (
            good.clone(),
            (good.len() + 1).to_string(),
            "Inference-Header-Content-Length",
        ),
        (
            good.clone(),
            "twelve".into(),
            "Inference-Header-Content-Length",
        ),
        (
            good[..good.len() - 8].to_vec(),
            len.to_string(),
            "runs past",
        ),
        (
            [&good[..], &[0u8; 4][..]].concat(),
            len.to_string(),
            "add up to",
        ),
        (
            shrunk,
            shrunk_len,
            "input 'dense': its binary data has 48 bytes but its shape [2, 13] of FP32 holds 26 \
             values (104 bytes)",
        ),
        (neg, neg_len, "must be a count of bytes"),
        (
            both,
            both_len,
            "both 'data' and parameters.binary_data_size",
        ),
        (neither, neither_len, "input 'dense' has no 'data'"),
    ];
    for (k, (b, hl, needle)) in cases.into_iter().enumerate() {
        let resp = post_binary(&c, &url, b, &hl).await;
        assert_eq!(resp.status(), 400, "case {k}");
        let v: Value = resp.json().await.unwrap();
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(needle), "case {k}: {e:?} lacks {needle:?}");
        let resp = post_binary(&c, &url, good.clone(), &len.to_string()).await;
        assert_eq!(resp.status(), 200, "after case {k}");
    }
    s.shutdown().await.unwrap();
}

async fn post_json_raw(c: &reqwest::Client, url: &str, body: String) -> reqwest::Response {
    let resp = c
        .post(format!("{url}/v2/models/default/infer"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

/// `/v1/score` requests are counted per model in `ember_model_requests_total`, as KServe's
/// are: answered ones under `status="ok"`, refused ones under their error's label. The model
/// has a name of its own, so that no other test's requests share its counters. (Run alone,
/// this test is its process's first server: it also holds the counters to being registered
/// after the metrics recorder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_requests_are_counted_per_model() {
    let cfg = ember_serve::ServeConfig {
        model_name: "v1-counted".into(),
        ..config()
    };
    let (s, url, m) = start(cfg).await;
    let c = reqwest::Client::new();
    // One KServe request too: the first server of a process counts those as well (its
    // counters are registered after the metrics recorder is installed).
    let (code, v) = post_json(
        &c,
        format!("{url}/v2/models/v1-counted/infer"),
        &body(&m, &random_req(&m, 2, 1), false),
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let text = std::fs::read_to_string(root().join("data/sample.tsv")).unwrap();
    let lines: Vec<&str> = text.lines().take(5).collect();
    for _ in 0..3 {
        let r = c
            .post(format!("{url}/v1/score"))
            .body(lines.join("\n"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = c
        .post(format!("{url}/v1/score"))
        .body("not\ta\trow")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let metrics = get_text(&c, format!("{url}/metrics")).await;
    // The model's requests, summed over the lines whose status `ok` matches.
    let count = |ok: bool| -> f64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("ember_model_requests_total{")
                    && l.contains("model=\"v1-counted\"")
                    && l.contains("status=\"ok\"") == ok
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(count(true), 4.0, "{metrics}");
    assert_eq!(count(false), 1.0, "{metrics}");
    s.shutdown().await.unwrap();
}
