//! A graph model with sequence features (the `graph_din` fixture: TorchRec
//! `EmbeddingCollection`s of an item history and a category history under target attention,
//! exported by `tools/graph_fixtures.py`) served by the real server on free loopback ports:
//! requests name each sequence once (its lengths and ids, as any feature); the fixture's batch
//! (sequences cut past `max_len`, empty ones, a sample with no ids) scores as PyTorch; random
//! requests of odd sizes with sequences up to twice `max_len` score over KServe JSON, gRPC and
//! `/v1/score`, alone or sharing batches, as the predictor on them alone; an id out of its
//! table anywhere in a sequence (past `max_len` too, where it is not looked up) is refused
//! naming the feature, and the server serves on.

use crate::common;
use crate::graph::{
    alone, check, concurrently, get_json, grpc_outputs, grpc_request, outputs_of, post, v1_body,
};

use std::sync::Arc;

use common::{Req, config, kserve_body, random_req};
use ember_model::{LoadOptions, Model};
use ember_serve::Server;
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::Value;

const NAME: &str = "din";

fn fixture() -> std::path::PathBuf {
    common::root().join("crates/ember-model/tests/fixtures/graph_din")
}

/// The fixture's own batch as one request.
fn fixture_req(m: &Model, exp: &Value) -> Req {
    let dense: Vec<Vec<f32>> = serde_json::from_value(exp["dense"].clone()).unwrap();
    let lengths: Vec<i64> = serde_json::from_value(exp["lengths"].clone()).unwrap();
    let values: Vec<i64> = serde_json::from_value(exp["values"].clone()).unwrap();
    let n = dense.len();
    let mut sparse = Vec::new();
    let mut at = 0usize;
    for f in 0..m.feature_names().len() {
        let l = lengths[f * n..(f + 1) * n].to_vec();
        let k = l.iter().sum::<i64>() as usize;
        sparse.push((l, values[at..at + k].to_vec()));
        at += k;
    }
    Req {
        n,
        dense: dense.concat(),
        sparse,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_model_is_served_as_pytorch_and_the_predictor_score_it() {
    let mut cfg = config();
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    cfg.model_name = NAME.into();
    let m = Arc::new(Model::load(&fixture(), LoadOptions::default()).unwrap());
    let server = Server::start(m.clone(), cfg).await.unwrap();
    let url = format!("http://{}", server.addr());
    let infer = format!("{url}/v2/models/{NAME}/infer");
    let c = reqwest::Client::new();

    // The metadata names each sequence's inputs once, as any feature's.
    let meta = get_json(&c, format!("{url}/v2/models/{NAME}")).await;
    let inputs: Vec<&str> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(inputs.len(), 1 + 2 * 5, "{meta}");
    assert_eq!(
        inputs[7..],
        [
            "hist_items_lengths",
            "hist_items_ids",
            "hist_cats_lengths",
            "hist_cats_ids"
        ]
    );

    // The fixture's batch: PyTorch's scores within 1e-5.
    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    let r = fixture_req(&m, &exp);
    let (code, text) = post(&c, infer.clone(), &kserve_body(&m, &r)).await;
    assert_eq!(code, 200, "{text}");
    let got = outputs_of(&serde_json::from_str(&text).unwrap());
    let want: Vec<f32> = serde_json::from_value(exp["outputs"]["score"].clone()).unwrap();
    for (i, (g, w)) in got["score"].iter().zip(&want).enumerate() {
        let rel = (g - w).abs() / w.abs().max(1e-3);
        assert!(rel <= 1e-5, "score[{i}]: {g} vs PyTorch's {w}");
    }

    // Random requests (batch 1 among them) over KServe JSON, concurrently: each as alone.
    let reqs: Vec<Req> = [1, 5, 17, 40]
        .iter()
        .enumerate()
        .map(|(k, &n)| random_req(&m, n, 70 + k as u64))
        .collect();
    assert!(
        reqs[3].sparse[3].0.iter().any(|&l| l > 6) && reqs[3].sparse[3].0.contains(&0),
        "sequences past max_len and empty ones among them"
    );
    for (v, r) in concurrently(&c, &infer, &m, &reqs).await.iter().zip(&reqs) {
        check(&outputs_of(v), &alone(&m, r), "kserve json");
    }

    // gRPC with raw contents, and `/v1/score`.
    let r = &reqs[2];
    let g = server.grpc_addr().unwrap();
    let mut gc = GrpcInferenceServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    let mut req = grpc_request(&m, r, &[]);
    req.model_name = NAME.into();
    let resp = gc.model_infer(req).await.unwrap().into_inner();
    check(&grpc_outputs(&resp), &alone(&m, r), "grpc");
    let (code, text) = post(&c, format!("{url}/v1/score"), &v1_body(&m, r)).await;
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let want = alone(&m, r);
    for i in 0..r.n {
        // One output: a number a sample, as a DLRM model's.
        let got = v["scores"][i].as_f64().unwrap_or_else(|| panic!("{v}")) as f32;
        assert!((got - want["score"][i]).abs() <= 1e-6, "v1 sample {i}: {v}");
    }

    // An id out of the item table, past max_len in a sample's history: refused naming the
    // feature; then the same request without it is served.
    let mut bad = Req {
        n: 1,
        dense: r.dense[..13].to_vec(),
        sparse: r.sparse.iter().map(|_| (vec![0], vec![])).collect(),
    };
    bad.sparse[3] = (vec![9], vec![1, 2, 3, 4, 5, 6, 7, 8, 70]);
    let (code, text) = post(&c, infer.clone(), &kserve_body(&m, &bad)).await;
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("hist_items") && text.contains("id 70") && text.contains("70 rows"),
        "{text}"
    );
    bad.sparse[3].1[8] = 69;
    let (code, text) = post(&c, infer.clone(), &kserve_body(&m, &bad)).await;
    assert_eq!(code, 200, "{text}");
    check(
        &outputs_of(&serde_json::from_str(&text).unwrap()),
        &alone(&m, &bad),
        "after the refusal",
    );
    server.shutdown().await.unwrap();
}
