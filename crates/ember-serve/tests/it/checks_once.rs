//! A served request's ids are checked exactly once, whatever its protocol (KServe JSON,
//! `/v1/score` JSON or TSV, gRPC) and however the batcher merges it, on the plain and on the
//! sharded embedding stage. The count is the process-wide number of id checks
//! (`ember_model::id_checks`), so this file holds one test: a test binary of its own.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::{model, random_req, root};
use ember_model::{Predictor, id_checks};
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use ember_serve::grpc::pb::{self, model_infer_request::InferInputTensor};
use ember_serve::grpc::raw_bytes;
use ember_serve::{BatchConfig, ServeConfig, Server};
use serde_json::{Value, json};

/// A KServe v2 JSON body and the same samples as a gRPC request with raw contents.
fn bodies(m: &ember_model::Model, seed: u64, n: usize) -> (Value, Value, pb::ModelInferRequest) {
    let r = random_req(m, n, seed);
    let names = m.feature_names();
    let mut inputs =
        vec![json!({"name": "dense", "shape": [n, 13], "datatype": "FP32", "data": r.dense})];
    let mut tensors = vec![InferInputTensor {
        name: "dense".into(),
        datatype: "FP32".into(),
        shape: vec![n as i64, 13],
        parameters: HashMap::new(),
        contents: None,
    }];
    let mut raw = vec![raw_bytes(&r.dense, f32::to_le_bytes)];
    let mut samples: Vec<Value> = (0..n)
        .map(|s| json!({"dense": r.dense[s * 13..(s + 1) * 13], "sparse": {}}))
        .collect();
    for (f, (lengths, ids)) in names.iter().zip(&r.sparse) {
        inputs.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64", "data": lengths}));
        inputs.push(json!({"name": format!("{f}_ids"), "shape": [ids.len()], "datatype": "INT64", "data": ids}));
        for (suffix, v) in [("lengths", lengths), ("ids", ids)] {
            tensors.push(InferInputTensor {
                name: format!("{f}_{suffix}"),
                datatype: "INT64".into(),
                shape: vec![v.len() as i64],
                parameters: HashMap::new(),
                contents: None,
            });
            raw.push(raw_bytes(v, i64::to_le_bytes));
        }
        let mut at = 0;
        for (s, &l) in lengths.iter().enumerate() {
            samples[s]["sparse"][f] = json!(ids[at..at + l as usize]);
            at += l as usize;
        }
    }
    let grpc = pb::ModelInferRequest {
        model_name: "default".into(),
        inputs: tensors,
        raw_input_contents: raw,
        ..Default::default()
    };
    (json!({ "inputs": inputs }), Value::Array(samples), grpc)
}

/// Sends 16 requests (four of each of four protocols, concurrently so that the batcher merges them) and
/// returns how many id checks they cost.
async fn checks_of_sixteen_requests(server: &Server, m: &ember_model::Model) -> u64 {
    let url = format!("http://{}", server.addr());
    let grpc_url = format!("http://{}", server.grpc_addr().unwrap());
    let c = reqwest::Client::new();
    let tsv = std::fs::read_to_string(root().join("data/sample.tsv")).unwrap();
    let lines: Vec<&str> = tsv.lines().collect();
    let before = id_checks();
    let mut tasks = Vec::new();
    for k in 0..4u64 {
        let (kserve, samples, grpc) = bodies(m, 100 + k, 1 + k as usize % 3);
        let (c1, u1) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let r = c1
                .post(format!("{u1}/v2/models/default/infer"))
                .json(&kserve)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }));
        let (c2, u2) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let r = c2
                .post(format!("{u2}/v1/score"))
                .json(&samples)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }));
        let (c3, u3) = (c.clone(), url.clone());
        let rows = lines[2 * k as usize..2 * k as usize + 2].join("\n");
        tasks.push(tokio::spawn(async move {
            let r = c3
                .post(format!("{u3}/v1/score"))
                .body(rows)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }));
        let g = grpc_url.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = GrpcInferenceServiceClient::connect(g).await.unwrap();
            match client.model_infer(grpc).await {
                Ok(_) => 200,
                Err(s) => panic!("gRPC request failed: {s:?}"),
            }
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    id_checks() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_checked_once_per_request() {
    let cfg = ServeConfig {
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: Some("127.0.0.1:0".parse().unwrap()),
        batch: BatchConfig {
            // Requests wait for each other: the batcher merges several into one batch.
            max_batch: 256,
            max_delay: Duration::from_millis(20),
            queue: 256,
            max_queue_delay: None,
            instances: 1,
        },
        ..ServeConfig::default()
    };
    let m = model();
    let server = Server::start(m.clone(), cfg.clone()).await.unwrap();
    assert_eq!(checks_of_sixteen_requests(&server, &m).await, 16);
    server.shutdown().await.unwrap();

    // The sharded stage routes each batch to its devices without checking again.
    let shards: Vec<ember_model::Shard> = (0..m.embeddings().tables().len())
        .flat_map(|t| {
            let table = &m.embeddings().tables()[t];
            let (rows, dim) = (table.rows() as u64, table.dim() as u32);
            let half = rows / 2;
            let parts = if half == 0 {
                vec![(0, rows, 0)]
            } else {
                vec![(0, half, 0), (half, rows, 1)]
            };
            parts
                .into_iter()
                .map(move |(r0, r1, device)| ember_model::Shard {
                    table: t,
                    rows: (r0, r1),
                    cols: (0, dim),
                    device,
                })
        })
        .collect();
    let sharded = Predictor::with_shards(m.clone(), 1, &shards, 1).unwrap();
    assert_eq!(sharded.sharded().unwrap().devices().len(), 2);
    let server = Server::start_engine(Box::new(sharded), cfg).await.unwrap();
    assert_eq!(checks_of_sixteen_requests(&server, &m).await, 16);
    server.shutdown().await.unwrap();
}
