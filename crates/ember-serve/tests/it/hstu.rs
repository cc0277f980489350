//! An HSTU model (the `hstu_small` fixture, exported from the reference) served by the real
//! server on free loopback ports, through the same seam as a DLRM model: model metadata and
//! Triton's config from its signature; users over KServe v2 JSON, the binary extension and
//! gRPC, and over `/v1/score` as JSON users; each task's scores and the candidates' offsets
//! equal to the predictor's on the user alone, also when concurrent requests share batches;
//! bad users refused naming the user and the feature, the server serving on.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use common::config;
use ember_model::LoadOptions;
use ember_model::hstu::{HstuModel, HstuPredictor, User};
use ember_model::serving::Servable;
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use ember_serve::grpc::pb::model_infer_request::InferInputTensor;
use ember_serve::grpc::pb::{self, InferTensorContents};
use ember_serve::grpc::raw_bytes;
use ember_serve::{ServeConfig, Server};
use serde_json::{Value, json};

fn fixture() -> std::path::PathBuf {
    common::root().join("crates/ember-model/tests/fixtures/hstu_small")
}

async fn start(mut cfg: ServeConfig) -> (Server, String, Arc<HstuModel>) {
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    cfg.model_name = "hstu".into();
    let s: Arc<dyn Servable> =
        ember_model::serving::load(&fixture(), LoadOptions::default()).expect("the fixture loads");
    let m: Arc<HstuModel> = s.clone().into_any_arc().downcast().unwrap();
    let server = Server::start_servable(s, cfg).await.unwrap();
    let url = format!("http://{}", server.addr());
    (server, url, m)
}

/// Each task's scores of `users`, each user run alone.
fn alone(m: &Arc<HstuModel>, users: &[User]) -> Vec<Vec<Vec<f32>>> {
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    users
        .iter()
        .map(|u| {
            let (s, _) = p
                .run(&m.check_users(std::slice::from_ref(u), 0).unwrap())
                .unwrap();
            s.scores
        })
        .collect()
}

/// The signature's inputs for `users`: per input name, its INT64 values.
fn tensors(m: &HstuModel, users: &[User]) -> Vec<(String, Vec<i64>)> {
    let sig = m.signature();
    let mut out = Vec::new();
    for i in &sig.inputs {
        let (base, what) = i.name.rsplit_once('_').unwrap();
        let get = |u: &User| u.uih.get(base).or(u.candidates.get(base)).cloned();
        let v: Vec<i64> = match what {
            "lengths" => users
                .iter()
                .map(|u| get(u).map_or(0, |v| v.len() as i64))
                .collect(),
            _ => users
                .iter()
                .flat_map(|u| get(u).unwrap_or_default())
                .collect(),
        };
        out.push((i.name.clone(), v));
    }
    out
}

fn kserve_json(m: &HstuModel, users: &[User]) -> Value {
    let inputs: Vec<Value> = tensors(m, users)
        .into_iter()
        .map(|(name, v)| json!({"name": name, "datatype": "INT64", "shape": [v.len()], "data": v}))
        .collect();
    json!({ "inputs": inputs })
}

async fn get_json(c: &reqwest::Client, url: String) -> Value {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

async fn post_json(c: &reqwest::Client, url: String, body: &Value) -> Value {
    c.post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Checks an answer's outputs (by name: task scores and `candidate_offsets`) against the users
/// run alone.
fn check_outputs(m: &HstuModel, by_name: &HashMap<String, Vec<f64>>, want: &[Vec<Vec<f32>>]) {
    let offsets = &by_name["candidate_offsets"];
    assert_eq!(offsets.len(), want.len() + 1);
    for (t, task) in m.tasks().iter().enumerate() {
        let got = &by_name[task];
        for (u, w) in want.iter().enumerate() {
            let (a, b) = (offsets[u] as usize, offsets[u + 1] as usize);
            assert_eq!(b - a, w[t].len(), "user {u}'s candidates");
            for (g, w) in got[a..b].iter().zip(&w[t]) {
                assert!(
                    (*g as f32 - w).abs() <= 1e-6,
                    "task {task} user {u}: {g} vs {w}"
                );
            }
        }
    }
}

fn outputs_of(v: &Value) -> HashMap<String, Vec<f64>> {
    v["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let data = o["data"].as_array().unwrap();
            let vals = data.iter().map(|x| x.as_f64().unwrap()).collect();
            (o["name"].as_str().unwrap().to_string(), vals)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hstu_users_are_scored_over_kserve_and_v1_as_alone() {
    let (server, url, m) = start(config()).await;
    let c = reqwest::Client::new();
    // Metadata from the signature: per feature lengths and ids / values, per task an output.
    let meta: Value = get_json(&c, format!("{url}/v2/models/hstu")).await;
    let names: Vec<&str> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    for n in [
        "item_id_lengths",
        "item_id_ids",
        "action_timestamp_values",
        "item_query_time_values",
    ] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    let outs: Vec<&str> = meta["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    let mut want_outs: Vec<String> = m.tasks();
    want_outs.push("candidate_offsets".into());
    assert_eq!(outs, want_outs);
    let config: Value = get_json(&c, format!("{url}/v2/models/hstu/config")).await;
    assert_eq!(
        config["parameters"]["attention_norm"]["string_value"],
        "alone"
    );

    // Users of different lengths in one request, KServe JSON.
    let users: Vec<User> = (0..3)
        .flat_map(|k| m.random_users(1, 20 + 30 * k, 1 + 6 * k, 40 + k as u64))
        .collect();
    let want = alone(&m, &users);
    let r: Value = post_json(
        &c,
        format!("{url}/v2/models/hstu/infer"),
        &kserve_json(&m, &users),
    )
    .await;
    check_outputs(&m, &outputs_of(&r), &want);

    // The same, answered in Triton's binary tensor data: every output's bytes in order after
    // the JSON, each sized by its binary_data_size.
    let mut body = kserve_json(&m, &users);
    body["parameters"] = json!({"binary_data_output": true});
    let r = c
        .post(format!("{url}/v2/models/hstu/infer"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let header_len: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = r.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&bytes[..header_len]).unwrap();
    let mut at = header_len;
    let mut by_name = HashMap::new();
    for o in head["outputs"].as_array().unwrap() {
        let size = o["parameters"]["binary_data_size"].as_u64().unwrap() as usize;
        let raw = &bytes[at..at + size];
        at += size;
        let vals: Vec<f64> = match o["datatype"].as_str().unwrap() {
            "FP32" => raw
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                .collect(),
            _ => raw
                .chunks(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
                .collect(),
        };
        assert_eq!(o["shape"], json!([vals.len()]));
        by_name.insert(o["name"].as_str().unwrap().to_string(), vals);
    }
    assert_eq!(at, bytes.len());
    check_outputs(&m, &by_name, &want);

    // The same users, concurrently one a request: batched together or not, each scores as
    // alone.
    let tasks: Vec<_> = users
        .iter()
        .map(|u| {
            let (c, url, body) = (
                c.clone(),
                url.clone(),
                kserve_json(&m, std::slice::from_ref(u)),
            );
            tokio::spawn(async move {
                let r = c.post(format!("{url}/v2/models/hstu/infer")).json(&body);
                r.send().await.unwrap().json::<Value>().await.unwrap()
            })
        })
        .collect();
    for (t, w) in tasks.into_iter().zip(&want) {
        check_outputs(&m, &outputs_of(&t.await.unwrap()), std::slice::from_ref(w));
    }

    // `/v1/score` with JSON users (one a line), each user's scores by task.
    let lines: Vec<String> = users
        .iter()
        .map(|u| serde_json::to_string(u).unwrap())
        .collect();
    let r = c
        .post(format!("{url}/v1/score"))
        .header("content-type", "application/json")
        .body(lines.join("\n"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    for (u, w) in want.iter().enumerate() {
        for (t, task) in m.tasks().iter().enumerate() {
            let got = floats(&v["scores"][u][task]);
            assert_eq!(got.len(), w[t].len(), "user {u} task {task}");
            for (g, w) in got.iter().zip(&w[t]) {
                assert!((g - w).abs() <= 1e-6, "user {u} task {task}: {g} vs {w}");
            }
        }
    }

    // Bad users: refused naming the user and the feature; the next request is served.
    let mut late = users.clone();
    let q = late[1].candidates.get_mut("item_query_time").unwrap();
    q[0] = 0;
    let mut out_of_range = users.clone();
    out_of_range[2].uih.get_mut("item_id").unwrap()[3] = 1 << 40;
    for (bad, words) in [
        (
            late,
            vec!["user 1", "item_query_time", "before the last action"],
        ),
        (out_of_range, vec!["user 2", "item_id", "not a row"]),
    ] {
        let r = c
            .post(format!("{url}/v2/models/hstu/infer"))
            .json(&kserve_json(&m, &bad))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let e = r.text().await.unwrap();
        for w in words {
            assert!(e.contains(w), "{w} not in {e}");
        }
    }
    // A missing required input, and lengths that do not match the values.
    let mut body = kserve_json(&m, &users[..1]);
    body["inputs"]
        .as_array_mut()
        .unwrap()
        .retain(|i| i["name"] != "item_id_ids");
    let e = c
        .post(format!("{url}/v2/models/hstu/infer"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(e.contains("missing input 'item_id_ids'"), "{e}");
    let e = c
        .post(format!("{url}/v1/score"))
        .header("content-type", "application/json")
        .body(r#"{"uih": {"item_id": [1]}, "candidates": {}}"#)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(e.contains("user 0") && e.contains("missing"), "{e}");
    let e = c
        .post(format!("{url}/v1/score"))
        .body("1\t2\t3")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(e.contains("takes users as JSON"), "{e}");
    let r: Value = post_json(
        &c,
        format!("{url}/v2/models/hstu/infer"),
        &kserve_json(&m, &users[..1]),
    )
    .await;
    check_outputs(&m, &outputs_of(&r), &want[..1]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hstu_users_are_scored_over_grpc() {
    let (server, _, m) = start(config()).await;
    let g = server.grpc_addr().unwrap();
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    let users: Vec<User> = (0..2)
        .flat_map(|k| m.random_users(1, 25 + 10 * k, 3 + k, 7 + k as u64))
        .collect();
    let want = alone(&m, &users);
    for raw in [false, true] {
        let request = infer_request(&tensors(&m, &users), raw);
        let r = c.model_infer(request).await.unwrap().into_inner();
        let mut by_name = HashMap::new();
        for (o, bytes) in r.outputs.iter().zip(&r.raw_output_contents) {
            let vals: Vec<f64> = match o.datatype.as_str() {
                "FP32" => bytes
                    .chunks(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
                _ => bytes
                    .chunks(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
            };
            assert_eq!(o.shape, vec![vals.len() as i64]);
            by_name.insert(o.name.clone(), vals);
        }
        check_outputs(&m, &by_name, &want);
    }
    // A user over the model's maximum of candidates: refused, naming it.
    let too_many = m.random_users(1, 10, m.config().hstu.max_num_candidates_inference + 1, 3);
    let e = c
        .model_infer(infer_request(&tensors(&m, &too_many), false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("user 0") && e.message().contains("max_num_candidates"),
        "{}",
        e.message()
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_serves_both_families_side_by_side() {
    let root = std::env::temp_dir().join(format!("ember-repo-families-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (name, from) in [
        ("hstu", fixture()),
        ("dlrm", common::root().join("models/default")),
    ] {
        let v = root.join(name).join("1");
        std::fs::create_dir_all(&v).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(from.join(f), v.join(f)).unwrap();
        }
    }
    let source = ember_serve::RepositoryConfig {
        root: root.clone(),
        loader: Arc::new(ember_serve::DiskLoader {
            options: LoadOptions::default(),
            threads: 1,
        }),
        poll: None,
        warm_batches: 2,
        pace_bytes_per_s: None,
        registry: None,
    };
    let server = Server::start_repository(source, config()).await.unwrap();
    let url = format!("http://{}", server.addr());
    let c = reqwest::Client::new();
    let index: Value = c
        .post(format!("{url}/v2/repository/index"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ready: Vec<&str> = index
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "READY")
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(ready, vec!["dlrm", "hstu"], "{index}");
    // The HSTU model's users, as alone.
    let m: Arc<HstuModel> = Arc::new(HstuModel::load(&fixture(), LoadOptions::default()).unwrap());
    let users = m.random_users(2, 30, 5, 11);
    let r: Value = post_json(
        &c,
        format!("{url}/v2/models/hstu/infer"),
        &kserve_json(&m, &users),
    )
    .await;
    check_outputs(&m, &outputs_of(&r), &alone(&m, &users));
    // The DLRM model beside it, as its predictor scores.
    let d = common::model();
    let req = common::random_req(&d, 3, 5);
    let mut inputs =
        vec![json!({"name": "dense", "datatype": "FP32", "shape": [3, 13], "data": req.dense})];
    for (f, (l, ids)) in d.feature_names().iter().zip(&req.sparse) {
        inputs.push(
            json!({"name": format!("{f}_lengths"), "datatype": "INT64", "shape": [3], "data": l}),
        );
        inputs.push(json!({"name": format!("{f}_ids"), "datatype": "INT64", "shape": [ids.len()], "data": ids}));
    }
    let r: Value = post_json(
        &c,
        format!("{url}/v2/models/dlrm/infer"),
        &json!({ "inputs": inputs }),
    )
    .await;
    common::assert_close(&common::scores_of(&r), &common::direct(&d, &req));
    // The metrics count both models' requests by name.
    let metrics = common::get_text(&c, format!("{url}/metrics")).await;
    for name in ["dlrm", "hstu"] {
        assert!(
            metrics.contains(&format!("model=\"{name}\"")),
            "no metric names model {name}"
        );
    }
    server.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

/// A gRPC request of the model `hstu` with these INT64 inputs, in the typed contents or, with
/// `raw`, in `raw_input_contents`.
fn infer_request(ts: &[(String, Vec<i64>)], raw: bool) -> pb::ModelInferRequest {
    let inputs = ts
        .iter()
        .map(|(name, v)| InferInputTensor {
            name: name.clone(),
            datatype: "INT64".into(),
            shape: vec![v.len() as i64],
            parameters: HashMap::new(),
            contents: (!raw).then(|| InferTensorContents {
                int64_contents: v.clone(),
                ..Default::default()
            }),
        })
        .collect();
    let raw_input_contents = match raw {
        true => ts
            .iter()
            .map(|(_, v)| raw_bytes(v, i64::to_le_bytes))
            .collect(),
        false => vec![],
    };
    pb::ModelInferRequest {
        model_name: "hstu".into(),
        inputs,
        raw_input_contents,
        ..Default::default()
    }
}
