//! The request decoders on arbitrary and on nearly-valid input: every outcome is a value or a
//! `ServeError`, never a panic.

use std::sync::Arc;

use ember_model::{LoadOptions, Model};
use ember_serve::grpc::pb::model_infer_request::InferInputTensor;
use ember_serve::grpc::pb::{self, InferTensorContents};
use ember_serve::grpc::{self, raw_bytes};
use ember_serve::kserve::fastjson;
use ember_serve::kserve::json::{self as kserve, InferRequest};
use ember_serve::{ModelSpec, v1 as score};
use proptest::prelude::*;
use prost::Message;
use serde_json::{Value, json};

/// A decoded request's samples.
fn samples(r: ember_model::serving::Request) -> ember_model::Samples {
    ember_model::serving::into_samples(r).expect("a DLRM model's request holds samples")
}

fn spec() -> &'static ModelSpec {
    static S: std::sync::OnceLock<ModelSpec> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
        let m = Arc::new(Model::load(&dir, LoadOptions::default()).unwrap());
        ModelSpec::of(m, "default")
    })
}

fn decode_infer(bytes: &[u8]) {
    let serde = serde_json::from_slice::<InferRequest>(bytes);
    // The fast path answers only where serde_json would, and the same.
    if let Some(fast) = fastjson::parse_infer(bytes) {
        let serde = serde
            .as_ref()
            .expect("the fast path accepted what serde_json refuses");
        assert_eq!(format!("{fast:?}"), format!("{serde:?}"));
    }
    if let Ok(req) = serde {
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
                .features()
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

fn input_names() -> Vec<String> {
    std::iter::once("dense".to_string())
        .chain(
            spec()
                .features()
                .iter()
                .flat_map(|f| [format!("{f}_lengths"), format!("{f}_ids")]),
        )
        .collect()
}

/// A `ModelInferRequest` valid in form, with names, shapes, dtypes, contents and raw bytes drawn
/// around the valid ones.
fn near_grpc_request() -> impl Strategy<Value = pb::ModelInferRequest> {
    let mut names = input_names();
    names.push("bogus".into());
    let input = (
        prop::sample::select(names),
        prop::collection::vec(-2i64..40, 0..3),
        prop::sample::select(vec!["FP32", "INT64", "INT32", "BYTES", "FP16"]),
        prop::collection::vec(-5i64..600_000, 0..40),
        prop::collection::vec(-1e3f32..1e3, 0..40),
        prop::collection::vec(any::<u8>(), 0..200),
        0u8..4,
    )
        .prop_map(|(name, shape, dt, ints, floats, raw, kind)| {
            let contents = match kind {
                0 => None,
                1 => Some(InferTensorContents {
                    int64_contents: ints,
                    ..Default::default()
                }),
                2 => Some(InferTensorContents {
                    int_contents: ints.iter().map(|&x| x as i32).collect(),
                    ..Default::default()
                }),
                _ => Some(InferTensorContents {
                    fp32_contents: floats,
                    ..Default::default()
                }),
            };
            (
                InferInputTensor {
                    name,
                    datatype: dt.into(),
                    shape,
                    contents,
                    ..Default::default()
                },
                raw,
            )
        });
    (
        prop::collection::vec(input, 0..60),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(inputs, use_raw, drop_one)| {
            let (inputs, mut raw): (Vec<_>, Vec<_>) = inputs
                .into_iter()
                .map(|(mut t, r)| {
                    if use_raw {
                        t.contents = None;
                    }
                    (t, bytes::Bytes::from(r))
                })
                .unzip();
            if !use_raw {
                raw.clear();
            } else if drop_one {
                raw.pop();
            }
            pb::ModelInferRequest {
                model_name: "default".into(),
                inputs,
                raw_input_contents: raw,
                ..Default::default()
            }
        })
}

/// A valid request: `n`, dense `[n, dense_in]`, and per feature the lengths (0 to 3 ids per
/// bag) and the ids.
type Valid = (usize, Vec<f32>, Vec<Vec<i64>>, Vec<Vec<i64>>);

fn valid_request() -> impl Strategy<Value = Valid> {
    (0usize..5).prop_flat_map(|n| {
        let nf = spec().features().len();
        (
            Just(n),
            prop::collection::vec(-1e3f32..1e3, n * spec().dense_in()),
            prop::collection::vec(prop::collection::vec(0i64..4, n), nf),
        )
            .prop_flat_map(|(n, dense, lengths)| {
                let ids: Vec<_> = lengths
                    .iter()
                    .zip(&spec().bags.as_ref().unwrap().rows)
                    .map(|(l, &rows)| {
                        prop::collection::vec(0..rows as i64, l.iter().sum::<i64>() as usize)
                    })
                    .collect();
                (Just(n), Just(dense), Just(lengths), ids)
            })
    })
}

/// Requests in the fast path's plain shape (and just outside it), with random whitespace and
/// number spellings.
fn plain_request() -> impl Strategy<Value = String> {
    let num = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:e}")),
        any::<f32>().prop_map(|v| v.to_string()),
        (-1e6f64..1e6).prop_map(|v| v.to_string()),
        "-?[0-9]{1,25}(\\.[0-9]{0,20})?([eE][-+]?[0-9]{0,4})?",
        Just("-0".to_string()),
        Just("1e400".to_string()),
        Just("01".to_string()),
    ];
    let ws = "[ \t\n]{0,2}";
    let input = (
        "[a-zA-Z_0-9]{0,8}",
        prop::collection::vec(-3i64..40, 0..3),
        prop::sample::select(vec!["FP32", "INT64", "INT32"]),
        prop::collection::vec(num, 0..8),
        prop::option::of((0u64..100, any::<bool>())),
        ws,
    )
        .prop_map(|(name, shape, dt, data, params, w)| {
            let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            let p = match params {
                Some((n, true)) => format!(",{w}\"parameters\":{{\"binary_data_size\":{n}}}"),
                Some((n, false)) => format!(",\"parameters\":{w}{{\"other\":\"x\",\"binary_data_size\":{n}{w}}}"),
                None => String::new(),
            };
            format!(
                "{{{w}\"name\":{w}\"{name}\",\"shape\":[{}],{w}\"datatype\":\"{dt}\",\"data\":[{w}{}]{p}}}",
                shape.join(","),
                data.join(&format!(",{w}"))
            )
        });
    (
        prop::collection::vec(input, 0..6),
        prop::option::of("[a-z0-9-]{0,6}"),
        prop::option::of((0u64..10_000, any::<bool>())),
        any::<bool>(),
        ws,
    )
        .prop_map(|(inputs, id, params, outputs, w)| {
            let mut s = format!("{w}{{\"inputs\":{w}[{}]", inputs.join(","));
            if let Some(id) = id {
                s += &format!(",\"id\":\"{id}\"");
            }
            if let Some((t, b)) = params {
                s += &format!(",\"parameters\":{{\"timeout\":{t},\"binary_data_output\":{b}}}");
            }
            if outputs {
                s += ",\"outputs\":[{\"name\":\"scores\",\"parameters\":{\"binary_data\":true}}]";
            }
            s + &format!("}}{w}")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Wherever the fast path answers, it answers as serde_json does.
    #[test]
    fn fast_json_path_agrees_with_serde(body in plain_request()) {
        decode_infer(body.as_bytes());
    }

    #[test]
    fn binary_extension_decoder_never_panics(
        v in near_request(),
        sizes in prop::collection::vec(prop::option::of(-3i64..120), 60),
        binary in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut v = v;
        for (input, size) in v["inputs"].as_array_mut().unwrap().iter_mut().zip(sizes) {
            if let Some(n) = size {
                input.as_object_mut().unwrap().remove("data");
                input["parameters"] = json!({"binary_data_size": n});
            }
        }
        if let Ok(req) = serde_json::from_slice::<InferRequest>(v.to_string().as_bytes()) {
            let _ = kserve::decode_with_binary(spec(), &req, &binary);
            let _ = kserve::binary_output(&req);
        }
    }

    #[test]
    fn grpc_decoder_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(req) = pb::ModelInferRequest::decode(&bytes[..]) {
            let _ = grpc::decode(spec(), &req);
        }
    }

    #[test]
    fn grpc_decoder_never_panics_on_near_requests(req in near_grpc_request()) {
        let _ = grpc::decode(spec(), &req);
        // And through the wire form, as the server receives it.
        let again = pb::ModelInferRequest::decode(&req.encode_to_vec()[..]).unwrap();
        let _ = grpc::decode(spec(), &again);
    }

    /// The four ways to send one request (JSON, JSON with binary tensor data, protobuf contents,
    /// protobuf raw bytes) decode to the same samples.
    #[test]
    fn json_and_both_grpc_forms_decode_alike((n, dense, lengths, ids) in valid_request(), int32: bool) {
        let itype = if int32 { "INT32" } else { "INT64" };
        let names = input_names();
        let mut json_inputs = vec![json!({"name": "dense", "shape": [n, spec().dense_in()], "datatype": "FP32", "data": dense})];
        let mut tensors = vec![(names[0].clone(), "FP32", vec![n as i64, spec().dense_in() as i64])];
        let mut contents = vec![InferTensorContents { fp32_contents: dense.clone(), ..Default::default() }];
        let mut raw = vec![raw_bytes(&dense, f32::to_le_bytes)];
        let ints = |v: &[i64]| -> (InferTensorContents, bytes::Bytes) {
            if int32 {
                let v32: Vec<i32> = v.iter().map(|&x| x as i32).collect();
                let b = raw_bytes(&v32, i32::to_le_bytes);
                (InferTensorContents { int_contents: v32, ..Default::default() }, b)
            } else {
                (InferTensorContents { int64_contents: v.to_vec(), ..Default::default() }, raw_bytes(v, i64::to_le_bytes))
            }
        };
        for (f, (l, i)) in lengths.iter().zip(&ids).enumerate() {
            for (name, v) in [(&names[1 + 2 * f], l), (&names[2 + 2 * f], i)] {
                json_inputs.push(json!({"name": name, "shape": [v.len()], "datatype": itype, "data": v}));
                tensors.push((name.clone(), itype, vec![v.len() as i64]));
                let (c, b) = ints(v);
                contents.push(c);
                raw.push(b);
            }
        }
        let body = json!({"inputs": json_inputs}).to_string();
        let from_json = samples(kserve::decode(spec(), &serde_json::from_str(&body).unwrap()).unwrap());
        let make = |with_contents: bool| pb::ModelInferRequest {
            model_name: "default".into(),
            inputs: tensors
                .iter()
                .zip(&contents)
                .map(|((name, dt, shape), c)| InferInputTensor {
                    name: name.clone(),
                    datatype: dt.to_string(),
                    shape: shape.clone(),
                    contents: with_contents.then(|| c.clone()),
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: if with_contents { vec![] } else { raw.clone() },
            ..Default::default()
        };
        for with_contents in [true, false] {
            let wire = make(with_contents).encode_to_vec();
            let req = pb::ModelInferRequest::decode(&wire[..]).unwrap();
            prop_assert_eq!(&samples(grpc::decode(spec(), &req).unwrap()), &from_json);
        }
        // Triton's binary tensor data extension: every value after the JSON.
        let mut head: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut bin = Vec::new();
        for (input, b) in head["inputs"].as_array_mut().unwrap().iter_mut().zip(&raw) {
            input.as_object_mut().unwrap().remove("data");
            input["parameters"] = json!({"binary_data_size": b.len()});
            bin.extend_from_slice(b);
        }
        let head = head.to_string();
        let req: InferRequest = serde_json::from_str(&head).unwrap();
        prop_assert_eq!(&samples(kserve::decode_with_binary(spec(), &req, &bin).unwrap()), &from_json);
        prop_assert_eq!(from_json.len(), n);
        prop_assert_eq!(from_json.dense(), &dense[..]);
    }

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
