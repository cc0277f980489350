//! Decoding one KServe v2 request for the shipped default model (one sample, 26 features of one
//! id each: what `ember loadgen` sends): JSON parse (serde_json, and the fast path of
//! `fastjson`), then the checks against the model.
//!
//! `cargo bench -p ember-serve --bench decode`

use std::sync::Arc;

use divan::{Bencher, black_box};
use ember_model::{LoadOptions, Model};
use ember_serve::ModelSpec;
use ember_serve::kserve::json::{self as kserve, InferRequest};
use serde_json::json;

fn main() {
    divan::main();
}

fn spec() -> ModelSpec {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let m = Arc::new(Model::load(&dir, LoadOptions::default()).unwrap());
    ModelSpec::of(m, "default")
}

fn body(spec: &ModelSpec, n: usize) -> Vec<u8> {
    let mut inputs = vec![
        json!({"name": "dense", "shape": [n, 13], "datatype": "FP32",
        "data": (0..n * 13).map(|i| (i % 7) as f32 * 0.37).collect::<Vec<_>>()}),
    ];
    for (f, &rows) in spec
        .features()
        .iter()
        .zip(&spec.bags.as_ref().unwrap().rows)
    {
        inputs.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64", "data": vec![1; n]}));
        inputs.push(
            json!({"name": format!("{f}_ids"), "shape": [n], "datatype": "INT64",
            "data": (0..n).map(|i| (i * 7919) % rows).collect::<Vec<_>>()}),
        );
    }
    json!({ "inputs": inputs }).to_string().into_bytes()
}

#[divan::bench(args = [1, 16])]
fn parse(bencher: Bencher, n: usize) {
    let b = body(&spec(), n);
    bencher.bench_local(|| {
        serde_json::from_slice::<InferRequest>(black_box(&b))
            .unwrap()
            .inputs
            .len()
    });
}

#[divan::bench(args = [1, 16])]
fn parse_fast(bencher: Bencher, n: usize) {
    let b = body(&spec(), n);
    bencher.bench_local(|| {
        ember_serve::kserve::fastjson::parse_infer(black_box(&b))
            .unwrap()
            .inputs
            .len()
    });
}

#[divan::bench(args = [1, 16])]
fn parse_fast_and_check(bencher: Bencher, n: usize) {
    let s = spec();
    let b = body(&s, n);
    bencher.bench_local(|| {
        let r = ember_serve::kserve::fastjson::parse_infer(black_box(&b)).unwrap();
        kserve::decode(&s, &r).unwrap().len()
    });
}

#[divan::bench(args = [1, 16])]
fn parse_and_check(bencher: Bencher, n: usize) {
    let s = spec();
    let b = body(&s, n);
    bencher.bench_local(|| {
        let r: InferRequest = serde_json::from_slice(black_box(&b)).unwrap();
        kserve::decode(&s, &r).unwrap().len()
    });
}

#[divan::bench(args = [1])]
fn parse_value(bencher: Bencher, n: usize) {
    let b = body(&spec(), n);
    bencher.bench_local(|| {
        serde_json::from_slice::<serde_json::Value>(black_box(&b))
            .unwrap()
            .is_object()
    });
}
