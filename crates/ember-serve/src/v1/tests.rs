//! `/v1/score` JSON, read in one pass, against a plain reference (a map of vectors per sample,
//! as serde derives it): the same samples on random requests (features in any order, empty
//! bags, one sample or many), and every malformed request refused naming the sample and what is
//! wrong.

use std::collections::HashMap;

use proptest::prelude::*;
use serde::Deserialize;
use serde_json::json;

use super::*;
use crate::batcher::tests::default_model;
use ember_model::Samples;

/// One sample, as the reference reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefSample {
    dense: Vec<f64>,
    sparse: HashMap<String, Vec<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RefBody {
    One(RefSample),
    Many(Vec<RefSample>),
}

/// The reference: parse into maps, then lay the columns out feature-major.
fn reference(spec: &ModelSpec, body: &[u8]) -> Option<Samples> {
    let samples = match serde_json::from_slice::<RefBody>(body).ok()? {
        RefBody::One(s) => vec![s],
        RefBody::Many(v) => v,
    };
    let n = samples.len();
    let mut dense = Vec::new();
    for s in &samples {
        if s.dense.len() != spec.dense_in() {
            return None;
        }
        dense.extend(s.dense.iter().map(|&v| v as f32));
    }
    let (mut lengths, mut ids) = (Vec::new(), Vec::new());
    for f in spec.features() {
        for s in &samples {
            let bag = s.sparse.get(f)?;
            lengths.push(bag.len() as u32);
            ids.extend_from_slice(bag);
        }
    }
    if samples
        .iter()
        .any(|s| s.sparse.keys().any(|k| !spec.features().contains(k)))
    {
        return None;
    }
    spec.check(n, dense, lengths, ids)
        .ok()
        .and_then(ember_model::serving::into_samples)
}

fn spec() -> ModelSpec {
    ModelSpec::of(default_model(), "default")
}

/// A random sample of the default model: its bags in a shuffled order, ids in range.
fn sample(spec: &ModelSpec, seed: u64) -> serde_json::Value {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let dense: Vec<f64> = (0..spec.dense_in())
        .map(|_| (next() % 2000) as f64 / 100.0 - 10.0)
        .collect();
    let mut order: Vec<usize> = (0..spec.features().len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, next() as usize % (i + 1));
    }
    let mut sparse = serde_json::Map::new();
    for f in order {
        let rows = spec.bags.as_ref().unwrap().rows[f] as u64;
        let bag: Vec<u64> = (0..next() % 4).map(|_| next() % rows).collect();
        sparse.insert(spec.features()[f].clone(), json!(bag));
    }
    json!({"dense": dense, "sparse": sparse})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn one_pass_reads_what_the_reference_reads(seed in any::<u64>(), n in 0usize..6, one in any::<bool>()) {
        let spec = spec();
        let body = match (one, n) {
            (true, _) => sample(&spec, seed),
            (false, n) => json!((0..n as u64).map(|i| sample(&spec, seed ^ i)).collect::<Vec<_>>()),
        };
        let bytes = body.to_string().into_bytes();
        let got = ember_model::serving::into_samples(decode_json(&spec, &bytes).unwrap()).unwrap();
        let want = reference(&spec, &bytes).unwrap();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn malformed_samples_are_refused_by_name() {
    let spec = spec();
    let good = sample(&spec, 1);
    let f2 = spec.features()[2].clone();
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            {
                let mut s = good.clone();
                s["sparse"].as_object_mut().unwrap().remove(&f2);
                json!([good.clone(), s])
            },
            "sample 1: sparse feature",
        ),
        (
            {
                let mut s = good.clone();
                s["sparse"]["nope"] = json!([1]);
                s
            },
            "sample 0: unknown sparse feature 'nope'",
        ),
        (
            {
                let mut s = good.clone();
                s["dense"] = json!([1.0, 2.0]);
                json!([good.clone(), good.clone(), s])
            },
            "sample 2: 'dense' has 2 values; the model takes 13",
        ),
        (
            {
                let mut s = good.clone();
                s["dense"] = json!(vec![0.5; 20]);
                s
            },
            "'dense' has 20 values",
        ),
        (
            {
                let mut s = good.clone();
                s["extra"] = json!(1);
                s
            },
            "sample 0: unknown field 'extra'",
        ),
        (
            json!({"dense": good["dense"]}),
            "sample 0: missing field 'sparse'",
        ),
        (
            json!({"sparse": good["sparse"]}),
            "sample 0: missing field 'dense'",
        ),
        (json!([1, 2]), "a sample object"),
        (json!("x"), "a sample object or an array of them"),
        (
            {
                let mut s = good.clone();
                s["sparse"][&f2] = json!([1.5]);
                s
            },
            "body is not a sample",
        ),
    ];
    for (body, want) in cases {
        let e = decode_json(&spec, body.to_string().as_bytes()).unwrap_err();
        assert!(e.to_string().contains(want), "{body}: {e}");
    }
    // A feature given twice in one sample (JSON objects may repeat keys).
    let text = good.to_string();
    let dup = text.replacen("\"sparse\":{", &format!("\"sparse\":{{\"{f2}\":[],"), 1);
    let e = decode_json(&spec, dup.as_bytes()).unwrap_err().to_string();
    assert!(
        e.contains(&format!("sparse feature '{f2}' is given twice")),
        "{e}"
    );
    // Ids out of range are the one check's to name.
    let mut s = good.clone();
    s["sparse"][&f2] = json!([1_000_000_000]);
    let e = decode_json(&spec, s.to_string().as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("1000000000"), "{e}");
    // Truncated and empty bodies.
    assert!(decode_json(&spec, &text.as_bytes()[..text.len() / 2]).is_err());
    assert!(decode_json(&spec, b"").is_err());
    assert_eq!(decode_json(&spec, b"[]").unwrap().len(), 0);
}
