//! The requests `ember loadgen` sends: 64 distinct random requests valid for the model (from its
//! metadata), as KServe v2 JSON, Triton's binary tensor data extension, or Criteo TSV rows.

use anyhow::{Context, bail};
use ember_serve::grpc::raw_bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::LoadgenArgs;

/// What requests must match: the dense width and each sparse feature's name and table size.
#[derive(Debug)]
pub(super) struct Shape {
    pub(super) dense_in: usize,
    pub(super) features: Vec<(String, u64)>,
}

/// The shape of a model from its KServe v2 JSON metadata.
pub(super) fn json_shape(meta: &Value) -> anyhow::Result<Shape> {
    let inputs = meta["inputs"]
        .as_array()
        .context("model metadata has no 'inputs'")?;
    let dense_in = inputs
        .iter()
        .find(|i| i["name"] == "dense")
        .and_then(|i| i["shape"].get(1))
        .and_then(Value::as_u64)
        .context("model metadata has no 'dense' input of shape [-1, D]")?
        as usize;
    let features = inputs
        .iter()
        .filter_map(|i| {
            let name = i["name"].as_str()?.strip_suffix("_ids")?;
            Some((name.to_string(), i["parameters"]["rows"].as_u64()?))
        })
        .collect();
    Ok(Shape { dense_in, features })
}

/// One request's random samples: dense `[n, dense_in]`, and per feature its ids (`pooling` per
/// sample).
pub(super) struct Draw {
    pub(super) dense: Vec<f32>,
    pub(super) ids: Vec<Vec<i64>>,
}

/// 64 distinct random requests, valid for the model.
pub(super) fn draws(shape: &Shape, a: &LoadgenArgs) -> Vec<Draw> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let n = a.samples_per_request;
    (0..64)
        .map(|_| Draw {
            dense: (0..n * shape.dense_in)
                .map(|_| rng.random_range(0.0..4.0))
                .collect(),
            ids: shape
                .features
                .iter()
                .map(|(_, rows)| {
                    (0..n * a.pooling)
                        .map(|_| rng.random_range(0..*rows) as i64)
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// KServe v2 JSON bodies.
pub(super) fn bodies(shape: &Shape, a: &LoadgenArgs) -> Vec<Vec<u8>> {
    let n = a.samples_per_request;
    draws(shape, a)
        .into_iter()
        .map(|d| {
            let mut ins = vec![json!({
                "name": "dense", "shape": [n, shape.dense_in], "datatype": "FP32", "data": d.dense
            })];
            for ((f, _), ids) in shape.features.iter().zip(d.ids) {
                ins.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64", "data": vec![a.pooling; n]}));
                ins.push(json!({"name": format!("{f}_ids"), "shape": [ids.len()], "datatype": "INT64", "data": ids}));
            }
            json!({ "inputs": ins }).to_string().into_bytes()
        })
        .collect()
}

/// KServe v2 requests in Triton's binary tensor data extension, as Triton's HTTP client sends
/// them by default: a JSON head naming each input's `binary_data_size`, then the values as
/// little-endian bytes; scores asked back as binary. Returns each body and its JSON's length.
pub(super) fn binary_bodies(shape: &Shape, a: &LoadgenArgs) -> Vec<(Vec<u8>, usize)> {
    let n = a.samples_per_request;
    let lengths = raw_bytes(&vec![a.pooling as i64; n], i64::to_le_bytes);
    draws(shape, a)
        .into_iter()
        .map(|d| {
            let dense = raw_bytes(&d.dense, f32::to_le_bytes);
            let mut ins = vec![json!({
                "name": "dense", "shape": [n, shape.dense_in], "datatype": "FP32",
                "parameters": {"binary_data_size": dense.len()}
            })];
            let mut bin = dense.to_vec();
            for ((f, _), ids) in shape.features.iter().zip(d.ids) {
                let ids = raw_bytes(&ids, i64::to_le_bytes);
                ins.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64",
                    "parameters": {"binary_data_size": lengths.len()}}));
                ins.push(json!({"name": format!("{f}_ids"), "shape": [ids.len() / 8], "datatype": "INT64",
                    "parameters": {"binary_data_size": ids.len()}}));
                bin.extend_from_slice(&lengths);
                bin.extend_from_slice(&ids);
            }
            let mut body = json!({ "inputs": ins, "parameters": {"binary_data_output": true} })
                .to_string()
                .into_bytes();
            let head = body.len();
            body.extend(bin);
            (body, head)
        })
        .collect()
}

/// Criteo TSV rows (label, 13 integers, 26 hex categoricals), `samples_per_request` per body.
pub(super) fn tsv_bodies(shape: &Shape, a: &LoadgenArgs) -> anyhow::Result<Vec<Vec<u8>>> {
    if shape.dense_in != 13 || shape.features.len() != 26 {
        bail!("--format tsv needs a Criteo-shaped model (13 dense, 26 sparse features)");
    }
    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut out = Vec::new();
    for _ in 0..64 {
        let mut body = String::new();
        for _ in 0..a.samples_per_request {
            body.push('0');
            for _ in 0..13 {
                body.push_str(&format!("\t{}", rng.random_range(0..200u32)));
            }
            for _ in 0..26 {
                body.push_str(&format!("\t{:08x}", rng.random::<u32>()));
            }
            body.push('\n');
        }
        out.push(body.into_bytes());
    }
    Ok(out)
}

/// `--format users`: the lines of `--users` (an HSTU model's users as JSON, one a line, as
/// `ember data users` writes them), each a `/v1/score` body, sent in the file's order.
pub(super) fn user_bodies(a: &LoadgenArgs) -> anyhow::Result<Vec<Vec<u8>>> {
    let path = a
        .users
        .as_ref()
        .context("--format users needs --users FILE (JSON lines, from `ember data users`)")?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --users {}", path.display()))?;
    let lines: Vec<Vec<u8>> = (text.lines())
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.as_bytes().to_vec())
        .collect();
    if lines.is_empty() {
        bail!("--users {}: no users in it", path.display());
    }
    Ok(lines)
}
