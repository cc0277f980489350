//! A graph model (the `graph_mmoe` fixture: TorchRec tables under a multi-gate mixture of
//! experts with two task heads, exported by `tools/graph_fixtures.py`) served by the real
//! server on free loopback ports, through the same seam as the DLRM models: metadata and
//! Triton's config name both outputs; samples over KServe v2 JSON, the binary extension, gRPC
//! and `/v1/score` get each head's score, equal to the predictor's on the samples alone (and
//! PyTorch's on the fixture's batch), also when concurrent requests share batches; a request
//! naming one output gets that one; bad samples are refused naming what is wrong, and the
//! server serves on.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{Req, config, kserve_body, random_req};
use ember_model::serving::Outputs;
use ember_model::{Engine, Ids, KeyedJagged, LoadOptions, Model, Predictor};
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use ember_serve::grpc::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use ember_serve::grpc::pb::{self, InferTensorContents};
use ember_serve::grpc::raw_bytes;
use ember_serve::{ServeConfig, Server};
use serde_json::{Value, json};

const NAME: &str = "mmoe";

fn fixture() -> std::path::PathBuf {
    common::root().join("crates/ember-model/tests/fixtures/graph_mmoe")
}

async fn start(mut cfg: ServeConfig) -> (Server, String, Arc<Model>) {
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    cfg.model_name = NAME.into();
    let m = Arc::new(Model::load(&fixture(), LoadOptions::default()).unwrap());
    let server = Server::start(m.clone(), cfg).await.unwrap();
    let url = format!("http://{}", server.addr());
    (server, url, m)
}

/// `r`'s ids as the model takes them.
pub(crate) fn keyed(m: &Model, r: &Req) -> KeyedJagged {
    let lengths: Vec<usize> = r
        .sparse
        .iter()
        .flat_map(|(l, _)| l.iter().map(|&x| x as usize))
        .collect();
    let ids: Vec<i64> = r.sparse.iter().flat_map(|(_, i)| i.clone()).collect();
    KeyedJagged::from_lengths(m.feature_names(), r.n, &lengths, Ids::I64(ids), None).unwrap()
}

/// Each output of `r`'s samples run alone on a predictor: output name -> values.
pub(crate) fn alone(m: &Arc<Model>, r: &Req) -> HashMap<String, Vec<f32>> {
    let mut p = Predictor::new(m.clone(), 1).unwrap();
    let mut out = Outputs::default();
    p.score_outputs(&r.dense, &keyed(m, r), &mut out).unwrap();
    m.config()
        .output_names()
        .into_iter()
        .zip(out.values)
        .collect()
}

/// `r`'s samples as `/v1/score` JSON.
pub(crate) fn v1_body(m: &Model, r: &Req) -> Value {
    let names = m.feature_names();
    let mut at = vec![0usize; names.len()];
    let samples: Vec<Value> = (0..r.n)
        .map(|i| {
            let sparse: serde_json::Map<String, Value> = names
                .iter()
                .enumerate()
                .map(|(f, name)| {
                    let (lengths, ids) = &r.sparse[f];
                    let k = lengths[i] as usize;
                    let bag = &ids[at[f]..at[f] + k];
                    at[f] += k;
                    (name.clone(), json!(bag))
                })
                .collect();
            json!({"dense": &r.dense[i * 13..(i + 1) * 13], "sparse": sparse})
        })
        .collect();
    json!(samples)
}

pub(crate) fn outputs_of(v: &Value) -> HashMap<String, Vec<f32>> {
    v["outputs"]
        .as_array()
        .unwrap_or_else(|| panic!("no outputs in {v}"))
        .iter()
        .map(|o| {
            let data = o["data"].as_array().unwrap();
            let vals = data.iter().map(|x| x.as_f64().unwrap() as f32).collect();
            (o["name"].as_str().unwrap().to_string(), vals)
        })
        .collect()
}

pub(crate) fn check(got: &HashMap<String, Vec<f32>>, want: &HashMap<String, Vec<f32>>, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: outputs {:?}", got.keys());
    for (name, w) in want {
        let g = &got[name];
        assert_eq!(g.len(), w.len(), "{what}: {name}");
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!((a - b).abs() <= 1e-6, "{what}: {name}[{i}] {a} vs {b}");
        }
    }
}

pub(crate) async fn get_json(c: &reqwest::Client, url: String) -> Value {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

/// `reqs` as KServe JSON requests to `infer`, all in flight at once: their answers, in order.
pub(crate) async fn concurrently(
    c: &reqwest::Client,
    infer: &str,
    m: &Model,
    reqs: &[Req],
) -> Vec<Value> {
    let tasks: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (c, infer, body) = (c.clone(), infer.to_string(), kserve_body(m, r));
            tokio::spawn(async move {
                let resp = c.post(infer).json(&body).send().await.unwrap();
                resp.json::<Value>().await.unwrap()
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// A gRPC answer's outputs, each from its raw FP32 contents: name -> values.
pub(crate) fn grpc_outputs(resp: &pb::ModelInferResponse) -> HashMap<String, Vec<f32>> {
    resp.outputs
        .iter()
        .zip(&resp.raw_output_contents)
        .map(|(o, raw)| {
            let v = raw
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (o.name.clone(), v)
        })
        .collect()
}

pub(crate) async fn post(c: &reqwest::Client, url: String, body: &Value) -> (u16, String) {
    let r = c.post(url).json(body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_head_is_served_over_kserve_grpc_and_v1_as_alone() {
    let (server, url, m) = start(config()).await;
    let c = reqwest::Client::new();
    let infer = format!("{url}/v2/models/{NAME}/infer");

    // Metadata and Triton's config: the bag inputs and both heads.
    let meta: Value = get_json(&c, format!("{url}/v2/models/{NAME}")).await;
    let outs: Vec<&str> = meta["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(outs, ["ctr", "cvr"]);
    let inputs: Vec<&str> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(inputs[..3], ["dense", "f_u_lengths", "f_u_ids"]);
    let tconfig: Value = get_json(&c, format!("{url}/v2/models/{NAME}/config")).await;
    let touts: Vec<&str> = tconfig["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(touts, ["ctr", "cvr"], "{tconfig}");
    assert!(
        tconfig["parameters"]["dense_graph"]["string_value"]
            .as_str()
            .unwrap()
            .contains("linear layers"),
        "{tconfig}"
    );

    // KServe JSON, several requests of odd sizes (batch 1 among them).
    let reqs: Vec<Req> = [1, 7, 33]
        .iter()
        .enumerate()
        .map(|(k, &n)| random_req(&m, n, 50 + k as u64))
        .collect();
    for r in &reqs {
        let (code, text) = post(&c, infer.clone(), &kserve_body(&m, r)).await;
        assert_eq!(code, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        check(&outputs_of(&v), &alone(&m, r), "kserve json");
    }

    // One output asked for: that one alone.
    let r = &reqs[1];
    let mut body = kserve_body(&m, r);
    body["outputs"] = json!([{"name": "cvr"}]);
    let (code, text) = post(&c, infer.clone(), &body).await;
    assert_eq!(code, 200, "{text}");
    let got = outputs_of(&serde_json::from_str(&text).unwrap());
    let mut want = alone(&m, r);
    want.remove("ctr");
    check(&got, &want, "cvr asked for");
    body["outputs"] = json!([{"name": "dwell"}]);
    let (code, text) = post(&c, infer.clone(), &body).await;
    assert_eq!(code, 400);
    assert!(
        text.contains("unknown output 'dwell'") && text.contains("'ctr', 'cvr'"),
        "{text}"
    );

    // The binary extension: each head's FP32 bytes in order after the JSON.
    let mut body = kserve_body(&m, r);
    body["parameters"] = json!({"binary_data_output": true});
    let resp = c.post(&infer).json(&body).send().await.unwrap();
    let header_len: usize = resp.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = resp.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&bytes[..header_len]).unwrap();
    let mut at = header_len;
    let mut by_name = HashMap::new();
    for o in head["outputs"].as_array().unwrap() {
        assert_eq!(o["datatype"], "FP32");
        let size = o["parameters"]["binary_data_size"].as_u64().unwrap() as usize;
        let vals: Vec<f32> = bytes[at..at + size]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        at += size;
        by_name.insert(o["name"].as_str().unwrap().to_string(), vals);
    }
    assert_eq!(at, bytes.len());
    check(&by_name, &alone(&m, r), "binary");

    // Concurrent requests, batched together or not: each as alone.
    let many: Vec<Req> = (0..6)
        .map(|k| random_req(&m, 1 + k * 3, 90 + k as u64))
        .collect();
    for (v, r) in concurrently(&c, &infer, &m, &many).await.iter().zip(&many) {
        check(&outputs_of(v), &alone(&m, r), "concurrent");
    }

    // gRPC, raw contents, one output asked for and then both.
    let g = server.grpc_addr().unwrap();
    let mut gc = GrpcInferenceServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    for asked in [vec!["ctr"], vec![]] {
        let resp = gc
            .model_infer(grpc_request(&m, r, &asked))
            .await
            .unwrap()
            .into_inner();
        let got = grpc_outputs(&resp);
        let mut want = alone(&m, r);
        if !asked.is_empty() {
            want.retain(|k, _| asked.contains(&k.as_str()));
        }
        check(&got, &want, &format!("grpc {asked:?}"));
    }

    // `/v1/score` JSON samples: each sample's heads by name.
    let (code, text) = c
        .post(format!("{url}/v1/score"))
        .json(&v1_body(&m, r))
        .send()
        .await
        .map(|resp| (resp.status().as_u16(), resp))
        .unwrap();
    assert_eq!(code, 200);
    let v: Value = text.json().await.unwrap();
    let want = alone(&m, r);
    for i in 0..r.n {
        for (name, w) in &want {
            let got = v["scores"][i][name].as_f64().unwrap() as f32;
            assert!((got - w[i]).abs() <= 1e-6, "v1 sample {i} {name}");
        }
    }

    // Bad samples: an id past its table, a dense row of the wrong width; then served again.
    let mut far = kserve_body(&m, r);
    let mut one = vec![0i64; r.n];
    one[r.n - 1] = 1;
    far["inputs"][1]["data"] = json!(one);
    far["inputs"][2]["data"] = json!([1i64 << 40]);
    far["inputs"][2]["shape"] = json!([1]);
    let (code, text) = post(&c, infer.clone(), &far).await;
    assert_eq!(code, 400);
    assert!(text.contains("f_u"), "{text}");
    let mut narrow = kserve_body(&m, r);
    narrow["inputs"][0]["shape"] = json!([r.n, 12]);
    let (code, text) = post(&c, infer.clone(), &narrow).await;
    assert_eq!(code, 400);
    assert!(text.contains("dense"), "{text}");
    let (code, text) = post(&c, infer.clone(), &kserve_body(&m, r)).await;
    assert_eq!(code, 200, "{text}");
    check(
        &outputs_of(&serde_json::from_str(&text).unwrap()),
        &alone(&m, r),
        "after the refusals",
    );
    server.shutdown().await.unwrap();
}

/// The fixture's own batch (empty bags among it) through the server: PyTorch's outputs, as
/// `tools/graph_fixtures.py` recorded them, within 1e-5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_fixture_scores_as_pytorch() {
    let (server, url, m) = start(config()).await;
    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    let dense: Vec<Vec<f32>> = serde_json::from_value(exp["dense"].clone()).unwrap();
    let lengths: Vec<i64> = serde_json::from_value(exp["lengths"].clone()).unwrap();
    let values: Vec<i64> = serde_json::from_value(exp["values"].clone()).unwrap();
    let n = dense.len();
    let mut sparse = Vec::new();
    let mut at = 0usize;
    for f in 0..m.feature_names().len() {
        let l = lengths[f * n..(f + 1) * n].to_vec();
        let k: i64 = l.iter().sum();
        sparse.push((l, values[at..at + k as usize].to_vec()));
        at += k as usize;
    }
    let r = Req {
        n,
        dense: dense.concat(),
        sparse,
    };
    let c = reqwest::Client::new();
    let (code, text) = post(
        &c,
        format!("{url}/v2/models/{NAME}/infer"),
        &kserve_body(&m, &r),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    let got = outputs_of(&serde_json::from_str(&text).unwrap());
    for name in ["ctr", "cvr"] {
        let want: Vec<f32> = serde_json::from_value(exp["outputs"][name].clone()).unwrap();
        for (i, (g, w)) in got[name].iter().zip(&want).enumerate() {
            let rel = (g - w).abs() / w.abs().max(1e-3);
            assert!(rel <= 1e-5, "{name}[{i}]: {g} vs PyTorch's {w}");
        }
    }
    server.shutdown().await.unwrap();
}

pub(crate) fn grpc_request(m: &Model, r: &Req, asked: &[&str]) -> pb::ModelInferRequest {
    let mut inputs = vec![InferInputTensor {
        name: "dense".into(),
        datatype: "FP32".into(),
        shape: vec![r.n as i64, 13],
        parameters: HashMap::new(),
        contents: None::<InferTensorContents>,
    }];
    let mut raw = vec![raw_bytes(&r.dense, f32::to_le_bytes)];
    for (f, (l, ids)) in m.feature_names().iter().zip(&r.sparse) {
        for (name, v) in [(format!("{f}_lengths"), l), (format!("{f}_ids"), ids)] {
            inputs.push(InferInputTensor {
                name,
                datatype: "INT64".into(),
                shape: vec![v.len() as i64],
                parameters: HashMap::new(),
                contents: None,
            });
            raw.push(raw_bytes(v, i64::to_le_bytes));
        }
    }
    pb::ModelInferRequest {
        model_name: NAME.into(),
        inputs,
        outputs: asked
            .iter()
            .map(|n| InferRequestedOutputTensor {
                name: n.to_string(),
                parameters: HashMap::new(),
            })
            .collect(),
        raw_input_contents: raw,
        ..Default::default()
    }
}

/// The fixture copied to `dir` with table `ad`'s values times `scale` (every score moves),
/// written beside it and renamed in, as a user should.
fn graph_version(dir: &std::path::Path, scale: f32) {
    let tmp = dir.with_extension("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["config.json", "dense.onnx"] {
        std::fs::copy(fixture().join(f), tmp.join(f)).unwrap();
    }
    let mut b = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let span = &header["tables.ad"]["data_offsets"];
    let (lo, hi) = (
        8 + n + span[0].as_u64().unwrap() as usize,
        8 + n + span[1].as_u64().unwrap() as usize,
    );
    for c in b[lo..hi].chunks_mut(4) {
        let v = f32::from_le_bytes(c.try_into().unwrap()) * scale;
        c.copy_from_slice(&v.to_le_bytes());
    }
    std::fs::write(tmp.join("model.safetensors"), b).unwrap();
    std::fs::rename(&tmp, dir).unwrap();
}

/// A graph model in the model repository: version 2 written beside version 1 is loaded by the
/// poller and swapped in while requests run; every answer is wholly one version's (both heads
/// from the same version), and after the swap every answer is version 2's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_versions_swap_and_each_answer_is_one_versions() {
    use ember_serve::{DiskLoader, RepositoryConfig};
    let root = std::env::temp_dir().join(format!("ember-graph-repo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join(NAME)).unwrap();
    graph_version(&root.join(NAME).join("1"), 1.0);
    let repo = RepositoryConfig {
        root: root.clone(),
        loader: Arc::new(DiskLoader {
            options: LoadOptions::default(),
            threads: 1,
        }),
        poll: Some(std::time::Duration::from_millis(50)),
        warm_batches: 2,
        pace_bytes_per_s: None,
        registry: None,
    };
    let server = Server::start_repository(repo, config()).await.unwrap();
    let url = format!("http://{}", server.addr());
    let v1 = Arc::new(Model::load(&root.join(NAME).join("1"), LoadOptions::default()).unwrap());
    let r = random_req(&v1, 9, 7);
    let want1 = alone(&v1, &r);
    let c = reqwest::Client::new();
    let infer = format!("{url}/v2/models/{NAME}/infer");
    let (code, text) = post(&c, infer.clone(), &kserve_body(&v1, &r)).await;
    assert_eq!(code, 200, "{text}");
    check(
        &outputs_of(&serde_json::from_str(&text).unwrap()),
        &want1,
        "v1",
    );

    graph_version(&root.join(NAME).join("2"), 2.0);
    let v2 = Arc::new(Model::load(&root.join(NAME).join("2"), LoadOptions::default()).unwrap());
    let want2 = alone(&v2, &r);
    assert_ne!(want1["ctr"], want2["ctr"], "the versions score alike");
    let close = |got: &HashMap<String, Vec<f32>>, want: &HashMap<String, Vec<f32>>| {
        want.iter().all(|(k, w)| {
            got[k].len() == w.len() && got[k].iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-6)
        })
    };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen2 = 0;
    while seen2 < 3 {
        assert!(
            std::time::Instant::now() < end,
            "version 2 not served in 30 s"
        );
        let (code, text) = post(&c, infer.clone(), &kserve_body(&v1, &r)).await;
        assert_eq!(code, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let got = outputs_of(&v);
        match v["model_version"].as_str() {
            Some("1") => assert!(close(&got, &want1), "an answer of version 1: {got:?}"),
            Some("2") => {
                assert!(close(&got, &want2), "an answer of version 2: {got:?}");
                seen2 += 1;
            }
            other => panic!("version {other:?}"),
        }
    }
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
