//! The request decoders on arbitrary and on nearly-valid input: every outcome is a value or a
//! `ServeError`, never a panic.

use std::sync::Arc;

use ember_model::{LoadOptions, Model};
use ember_serve::kserve::{self, InferRequest};
use ember_serve::{ModelSpec, score};
use proptest::prelude::*;
use serde_json::{Value, json};

fn spec() -> &'static ModelSpec {
    static S: std::sync::OnceLock<ModelSpec> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
        let m = Arc::new(Model::load(&dir, LoadOptions::default()).unwrap());
        ModelSpec::of(&m, "default")
    })
}

fn decode_infer(bytes: &[u8]) {
    if let Ok(req) = serde_json::from_slice::<InferRequest>(bytes) {
        let _ = kserve::timeout_us(&req);
        let _ = kserve::decode(spec(), &req);
    }
}

/// JSON values of any shape, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        "[a-z_0-9]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{0,5}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An inference request that is valid in form, with shapes, dtypes, names and data drawn
/// around the valid ones.
fn near_request() -> impl Strategy<Value = Value> {
    let names: Vec<String> = std::iter::once("dense".to_string())
        .chain(
            spec()
                .features
                .iter()
                .flat_map(|f| [format!("{f}_lengths"), format!("{f}_ids")]),
        )
        .chain(["bogus".to_string()])
        .collect();
    let input = (
        prop::sample::select(names),
        prop::collection::vec(-2i64..40, 0..3),
        prop::sample::select(vec!["FP32", "INT64", "INT32", "BYTES", "FP16"]),
        prop_oneof![
            prop::collection::vec(-5i64..600_000, 0..40).prop_map(Value::from),
            prop::collection::vec(-1e3f64..1e3, 0..40).prop_map(Value::from),
            any_json(),
        ],
    )
        .prop_map(|(name, shape, dt, data)| {
            json!({"name": name, "shape": shape, "datatype": dt, "data": data})
        });
    (prop::collection::vec(input, 0..60), any_json())
        .prop_map(|(inputs, params)| json!({"inputs": inputs, "parameters": {"timeout": params}}))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn infer_decoder_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        decode_infer(&bytes);
    }

    #[test]
    fn infer_decoder_never_panics_on_json(v in any_json()) {
        decode_infer(v.to_string().as_bytes());
    }

    #[test]
    fn infer_decoder_never_panics_on_near_requests(v in near_request()) {
        decode_infer(v.to_string().as_bytes());
    }

    #[test]
    fn score_decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400), v in any_json(), labels: bool) {
        let _ = score::decode_tsv(spec(), &bytes, labels);
        let _ = score::decode_json(spec(), &bytes);
        let _ = score::decode_json(spec(), v.to_string().as_bytes());
        let _ = score::decode_json(spec(), json!({"dense": vec![1.0; 13], "sparse": v}).to_string().as_bytes());
    }

    #[test]
    fn tsv_decoder_never_panics_on_near_rows(
        rows in prop::collection::vec(prop::collection::vec("[0-9a-f-]{0,9}", 0..45), 0..6),
        labels: bool,
    ) {
        let text: Vec<String> = rows.iter().map(|r| r.join("\t")).collect();
        let _ = score::decode_tsv(spec(), text.join("\n").as_bytes(), labels);
    }
}
