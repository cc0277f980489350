//! The real server on free loopback ports, driven over gRPC with the generated client: health,
//! metadata, inference in both tensor forms against the model run directly, bad inputs (one
//! status each, naming the problem, and the next request served), the queue limit, deadlines,
//! metrics and the graceful stop.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use common::*;
use ember_model::Model;
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use ember_serve::grpc::pb::infer_parameter::ParameterChoice;
use ember_serve::grpc::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use ember_serve::grpc::pb::{self, InferParameter, InferTensorContents};
use ember_serve::grpc::raw_bytes;
use ember_serve::{ServeConfig, Server};
use tonic::Code;
use tonic::transport::Channel;

type Client = GrpcInferenceServiceClient<Channel>;

async fn start_grpc(mut cfg: ServeConfig) -> (Server, Client, String, Arc<Model>) {
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    let (s, url, m) = start(cfg).await;
    let g = s.grpc_addr().unwrap();
    let c = GrpcInferenceServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap()
        .max_decoding_message_size(usize::MAX);
    (s, c, url, m)
}

/// A `ModelInferRequest` for `r`: values in `raw_input_contents` or in each input's `contents`,
/// integers as INT64 or INT32.
pub(crate) fn infer_req(m: &Model, r: &Req, raw: bool, int32: bool) -> pb::ModelInferRequest {
    let itype = if int32 { "INT32" } else { "INT64" };
    let mut inputs = Vec::new();
    let mut raws = Vec::new();
    let mut push = |name: String, datatype: &str, shape: Vec<i64>, c: InferTensorContents, b| {
        inputs.push(InferInputTensor {
            name,
            datatype: datatype.into(),
            shape,
            parameters: HashMap::new(),
            contents: (!raw).then_some(c),
        });
        raws.push(b);
    };
    let ints = |v: &[i64]| -> (InferTensorContents, Bytes) {
        if int32 {
            let v32: Vec<i32> = v.iter().map(|&x| x as i32).collect();
            (
                InferTensorContents {
                    int_contents: v32.clone(),
                    ..Default::default()
                },
                raw_bytes(&v32, i32::to_le_bytes),
            )
        } else {
            (
                InferTensorContents {
                    int64_contents: v.to_vec(),
                    ..Default::default()
                },
                raw_bytes(v, i64::to_le_bytes),
            )
        }
    };
    push(
        "dense".into(),
        "FP32",
        vec![r.n as i64, 13],
        InferTensorContents {
            fp32_contents: r.dense.clone(),
            ..Default::default()
        },
        raw_bytes(&r.dense, f32::to_le_bytes),
    );
    for (f, (lengths, ids)) in m.feature_names().iter().zip(&r.sparse) {
        let (c, b) = ints(lengths);
        push(format!("{f}_lengths"), itype, vec![r.n as i64], c, b);
        let (c, b) = ints(ids);
        push(format!("{f}_ids"), itype, vec![ids.len() as i64], c, b);
    }
    pb::ModelInferRequest {
        model_name: "default".into(),
        id: "req-9".into(),
        inputs,
        raw_input_contents: if raw { raws } else { vec![] },
        ..Default::default()
    }
}

pub(crate) fn scores(r: &pb::ModelInferResponse) -> Vec<f32> {
    let (chunks, rest) = r.raw_output_contents[0].as_chunks::<4>();
    assert!(rest.is_empty());
    chunks.iter().map(|b| f32::from_le_bytes(*b)).collect()
}

fn int64_param(v: i64) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_and_inference_match_the_predictor() {
    let (s, mut c, url, m) = start_grpc(config()).await;
    assert!(
        c.server_live(pb::ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let ready = |name: &str, version: &str| pb::ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    };
    assert!(
        c.model_ready(ready("default", ""))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert!(
        c.model_ready(ready("default", "1"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    // A model or version not served is not ready (Triton's answer, which its clients'
    // `is_model_ready` expects), not an error.
    for (name, version) in [("nope", ""), ("default", "2")] {
        let r = c.model_ready(ready(name, version)).await.unwrap();
        assert!(!r.into_inner().ready, "{name} {version}");
    }
    let sm = c
        .server_metadata(pb::ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sm.name, "ember");
    let md = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "default".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(md.name, "default");
    assert_eq!(md.versions, ["1"]);
    assert_eq!(md.inputs.len(), 1 + 2 * 26);
    assert_eq!(md.inputs[0].name, "dense");
    assert_eq!(md.inputs[0].shape, [-1, 13]);
    for (f, name) in m.feature_names().iter().enumerate() {
        let ids = md
            .inputs
            .iter()
            .find(|i| i.name == format!("{name}_ids"))
            .unwrap();
        let rows = m.embeddings().table_of(f).rows() as i64;
        assert_eq!(
            ids.parameters["rows"].parameter_choice,
            Some(ParameterChoice::Int64Param(rows))
        );
    }
    assert_eq!(md.outputs[0].name, "scores");
    assert_eq!(md.outputs[0].datatype, "FP32");

    // Scores equal the model run directly, in both tensor forms, for INT64 and INT32 integers,
    // one sample, several, and none.
    let mut seed = 0;
    for raw in [true, false] {
        for int32 in [false, true] {
            for n in [1, 5, 0] {
                seed += 1;
                let r = random_req(&m, n, seed);
                let mut req = infer_req(&m, &r, raw, int32);
                if seed % 2 == 0 {
                    req.outputs.push(InferRequestedOutputTensor {
                        name: "scores".into(),
                        parameters: HashMap::new(),
                    });
                }
                let resp = c.model_infer(req).await.unwrap().into_inner();
                assert_eq!(resp.model_name, "default");
                assert_eq!(resp.id, "req-9");
                assert_eq!(resp.outputs.len(), 1);
                assert_eq!(resp.outputs[0].name, "scores");
                assert_eq!(resp.outputs[0].datatype, "FP32");
                assert_eq!(resp.outputs[0].shape, [n as i64]);
                assert_close(&scores(&resp), &direct(&m, &r));
            }
        }
    }
    // Concurrent requests are batched together and each gets its own scores.
    let reqs: Vec<Req> = (0..12)
        .map(|i| random_req(&m, 1 + i % 3, 100 + i as u64))
        .collect();
    let futs: Vec<_> = reqs
        .iter()
        .map(|r| {
            let mut c = c.clone();
            let req = infer_req(&m, r, true, false);
            tokio::spawn(async move { c.model_infer(req).await })
        })
        .collect();
    for (f, r) in futs.into_iter().zip(&reqs) {
        let resp = f.await.unwrap().unwrap().into_inner();
        assert_close(&scores(&resp), &direct(&m, r));
    }
    // Triton's statistics extension: 24 + 24 samples scored above, none failed.
    let ext = c
        .server_metadata(pb::ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner()
        .extensions;
    assert!(ext.contains(&"statistics".to_string()), "{ext:?}");
    let stats = |name: &str, version: &str| {
        let mut c = c.clone();
        let req = pb::ModelStatisticsRequest {
            name: name.into(),
            version: version.into(),
        };
        async move { c.model_statistics(req).await }
    };
    for (name, version) in [("", ""), ("default", ""), ("default", "1")] {
        let st = stats(name, version).await.unwrap().into_inner().model_stats;
        assert_eq!(st.len(), 1);
        let st = &st[0];
        assert_eq!((st.name.as_str(), st.version.as_str()), ("default", "1"));
        assert_eq!(st.inference_count, 48, "{st:?}");
        let i = st.inference_stats.as_ref().unwrap();
        assert!(i.success.as_ref().unwrap().count >= 20, "{i:?}");
        assert_eq!(i.fail.as_ref().unwrap().count, 0);
        let runs: u64 = st
            .batch_stats
            .iter()
            .map(|b| b.compute_infer.as_ref().unwrap().count)
            .sum();
        assert_eq!(runs, st.execution_count);
    }
    let e = stats("other", "").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    // Triton's model configuration extension: the same content as HTTP's `/config`.
    assert!(ext.contains(&"model_configuration".to_string()), "{ext:?}");
    let http: serde_json::Value = reqwest::get(format!("{url}/v2/models/default/config"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for version in ["", "1"] {
        let req = pb::ModelConfigRequest {
            name: "default".into(),
            version: version.into(),
        };
        let cfg = c.clone().model_config(req).await.unwrap().into_inner();
        let cfg = cfg.config.unwrap();
        assert_eq!(cfg.name, http["name"]);
        assert_eq!(i64::from(cfg.max_batch_size), http["max_batch_size"]);
        // The dense layers' precision, as Triton's `parameters`: f32 for the shipped model.
        assert_eq!(http["parameters"]["dense_dtype"]["string_value"], "f32");
        for key in ["dense_dtype", "dense_kernels"] {
            let v = &cfg.parameters[key].string_value;
            assert!(!v.is_empty() && v != "?", "{key}: {v}");
            assert_eq!(http["parameters"][key]["string_value"], v.as_str(), "{key}");
        }
        let delay = cfg.dynamic_batching.unwrap().max_queue_delay_microseconds;
        assert_eq!(
            delay,
            http["dynamic_batching"]["max_queue_delay_microseconds"]
        );
        let tensors = |ts: Vec<(String, i32, Vec<i64>)>| -> Vec<serde_json::Value> {
            ts.into_iter()
                .map(|(name, dtype, dims)| {
                    let dtype = pb::DataType::try_from(dtype).unwrap().as_str_name();
                    serde_json::json!({"name": name, "data_type": dtype, "dims": dims})
                })
                .collect()
        };
        let inputs = tensors(
            cfg.input
                .into_iter()
                .map(|t| (t.name, t.data_type, t.dims))
                .collect(),
        );
        assert_eq!(serde_json::Value::from(inputs), http["input"]);
        let outputs = tensors(
            cfg.output
                .into_iter()
                .map(|t| (t.name, t.data_type, t.dims))
                .collect(),
        );
        assert_eq!(serde_json::Value::from(outputs), http["output"]);
        assert_eq!(
            cfg.version_policy.unwrap().policy_choice,
            Some(pb::model_version_policy::PolicyChoice::Specific(
                pb::model_version_policy::Specific { versions: vec![1] }
            ))
        );
    }
    for (name, version) in [("other", ""), ("default", "9")] {
        let req = pb::ModelConfigRequest {
            name: name.into(),
            version: version.into(),
        };
        let e = c.clone().model_config(req).await.unwrap_err();
        assert_eq!(
            e.code(),
            Code::NotFound,
            "{name} {version}: {}",
            e.message()
        );
    }
    s.shutdown().await.unwrap();
}

/// Sends `body` as the message of a `ModelInfer` call, byte for byte.
async fn infer_raw_message(
    ch: Channel,
    body: Vec<u8>,
) -> Result<pb::ModelInferResponse, tonic::Status> {
    raw_call(ch, "/inference.GRPCInferenceService/ModelInfer", body).await
}

/// Sends `body` as the message of a call of `path`, byte for byte.
async fn raw_call(
    ch: Channel,
    path: &'static str,
    body: Vec<u8>,
) -> Result<pb::ModelInferResponse, tonic::Status> {
    #[derive(Debug, Default)]
    struct RawCodec;
    struct RawEncoder;
    struct ResponseDecoder;
    impl tonic::codec::Encoder for RawEncoder {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(
            &mut self,
            item: Vec<u8>,
            buf: &mut tonic::codec::EncodeBuf<'_>,
        ) -> Result<(), tonic::Status> {
            buf.put_slice(&item);
            Ok(())
        }
    }
    impl tonic::codec::Decoder for ResponseDecoder {
        type Item = pb::ModelInferResponse;
        type Error = tonic::Status;
        fn decode(
            &mut self,
            buf: &mut tonic::codec::DecodeBuf<'_>,
        ) -> Result<Option<pb::ModelInferResponse>, tonic::Status> {
            prost::Message::decode(buf)
                .map(Some)
                .map_err(|e| tonic::Status::internal(e.to_string()))
        }
    }
    impl tonic::codec::Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = pb::ModelInferResponse;
        type Encoder = RawEncoder;
        type Decoder = ResponseDecoder;
        fn encoder(&mut self) -> RawEncoder {
            RawEncoder
        }
        fn decoder(&mut self) -> ResponseDecoder {
            ResponseDecoder
        }
    }
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    g.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_invalid_argument_naming_the_problem_and_serving_goes_on() {
    let mut cfg = config();
    cfg.max_body_bytes = 64 << 10;
    let (s, mut c, _, m) = start_grpc(cfg).await;
    let good = random_req(&m, 2, 7);
    let ok = infer_req(&m, &good, true, false);
    let contents = infer_req(&m, &good, false, false);
    let dense_bytes = ok.raw_input_contents[0].clone();

    type Edit = Box<dyn Fn(&mut pb::ModelInferRequest)>;
    let cases: Vec<(&str, pb::ModelInferRequest, Edit, Code, &str)> = vec![
        (
            "unknown model",
            ok.clone(),
            Box::new(|r| r.model_name = "nope".into()),
            Code::NotFound,
            "unknown model 'nope'",
        ),
        (
            "unknown version",
            ok.clone(),
            Box::new(|r| r.model_version = "3".into()),
            Code::NotFound,
            "no version '3'",
        ),
        (
            "missing input",
            ok.clone(),
            Box::new(|r| {
                let k = r.inputs.iter().position(|i| i.name == "C5_ids").unwrap();
                r.inputs.remove(k);
                r.raw_input_contents.remove(k);
            }),
            Code::InvalidArgument,
            "missing input 'C5_ids'",
        ),
        (
            "unknown input",
            ok.clone(),
            Box::new(|r| r.inputs[3].name = "C99_ids".into()),
            Code::InvalidArgument,
            "unknown input 'C99_ids'",
        ),
        (
            "input twice",
            ok.clone(),
            Box::new(|r| r.inputs[3].name = r.inputs[1].name.clone()),
            Code::InvalidArgument,
            "given twice",
        ),
        (
            "dense dtype",
            ok.clone(),
            Box::new(|r| r.inputs[0].datatype = "INT64".into()),
            Code::InvalidArgument,
            "datatype INT64; it must be FP32",
        ),
        (
            "dense width",
            ok.clone(),
            Box::new(|r| r.inputs[0].shape = vec![2, 12]),
            Code::InvalidArgument,
            "takes [N, 13]",
        ),
        (
            "negative dim",
            ok.clone(),
            Box::new(|r| r.inputs[1].shape = vec![-2]),
            Code::InvalidArgument,
            "must be >= 0",
        ),
        (
            "ids dtype",
            ok.clone(),
            Box::new(|r| r.inputs[2].datatype = "FP32".into()),
            Code::InvalidArgument,
            "it must be INT64 or INT32",
        ),
        (
            "short raw",
            ok.clone(),
            Box::new(move |r| r.raw_input_contents[0] = dense_bytes.slice(..dense_bytes.len() - 3)),
            Code::InvalidArgument,
            "raw_input_contents[0] has",
        ),
        (
            "raw per input",
            ok.clone(),
            Box::new(|r| {
                r.raw_input_contents.pop();
            }),
            Code::InvalidArgument,
            "raw_input_contents has 52 entries for 53 inputs",
        ),
        (
            "raw and contents",
            ok.clone(),
            Box::new(|r| r.inputs[4].contents = Some(InferTensorContents::default())),
            Code::InvalidArgument,
            "sets 'contents'",
        ),
        (
            "contents count",
            contents.clone(),
            Box::new(|r| {
                r.inputs[0].contents.as_mut().unwrap().fp32_contents.pop();
            }),
            Code::InvalidArgument,
            "25 values in 'contents.fp32_contents'",
        ),
        (
            "contents in the wrong list",
            contents.clone(),
            Box::new(|r| {
                let c = r.inputs[2].contents.as_mut().unwrap();
                c.int_contents = c.int64_contents.iter().map(|&x| x as i32).collect();
                c.int64_contents.clear();
            }),
            Code::InvalidArgument,
            "contents.int64_contents",
        ),
        (
            "id out of range",
            contents.clone(),
            Box::new(|r| {
                let c = r.inputs[1].contents.as_mut().unwrap();
                c.int64_contents = vec![1, 0];
                r.inputs[2].shape = vec![1];
                r.inputs[2].contents.as_mut().unwrap().int64_contents = vec![1 << 40];
            }),
            Code::InvalidArgument,
            "out of range",
        ),
        (
            "negative length",
            contents.clone(),
            Box::new(|r| r.inputs[1].contents.as_mut().unwrap().int64_contents[0] = -1),
            Code::InvalidArgument,
            "not a count of ids",
        ),
        (
            "nan",
            contents.clone(),
            Box::new(|r| r.inputs[0].contents.as_mut().unwrap().fp32_contents[3] = f32::NAN),
            Code::InvalidArgument,
            "must be finite",
        ),
        (
            "unknown output",
            ok.clone(),
            Box::new(|r| {
                r.outputs.push(InferRequestedOutputTensor {
                    name: "logits".into(),
                    parameters: HashMap::new(),
                })
            }),
            Code::InvalidArgument,
            "unknown output 'logits'",
        ),
        (
            "timeout type",
            ok.clone(),
            Box::new(|r| {
                r.parameters.insert(
                    "timeout".into(),
                    InferParameter {
                        parameter_choice: Some(ParameterChoice::StringParam("1s".into())),
                    },
                );
            }),
            Code::InvalidArgument,
            "parameters.timeout",
        ),
        (
            "timeout sign",
            ok.clone(),
            Box::new(|r| {
                r.parameters.insert("timeout".into(), int64_param(-5));
            }),
            Code::InvalidArgument,
            "parameters.timeout",
        ),
    ];
    for (what, mut req, edit, code, needle) in cases {
        edit(&mut req);
        let e = c.model_infer(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{what}: {}", e.message());
        assert!(
            e.message().contains(needle),
            "{what}: {:?} lacks {needle:?}",
            e.message()
        );
        // The next request is served normally.
        let resp = c.model_infer(ok.clone()).await.unwrap().into_inner();
        assert_close(&scores(&resp), &direct(&m, &good));
    }

    // Bytes that are not a ModelInferRequest, and a message over --max-body-bytes.
    let ch = Channel::from_shared(format!("http://{}", s.grpc_addr().unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    for (what, body, needle) in [
        ("garbage", vec![0xff; 40], "malformed protobuf"),
        (
            "truncated",
            prost::Message::encode_to_vec(&ok)[..500].to_vec(),
            "malformed protobuf",
        ),
        ("too large", vec![0u8; 100 << 10], "--max-body-bytes"),
    ] {
        let e = infer_raw_message(ch.clone(), body).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {}", e.message());
        assert!(e.message().contains(needle), "{what}: {:?}", e.message());
        let resp = c.model_infer(ok.clone()).await.unwrap().into_inner();
        assert_close(&scores(&resp), &direct(&m, &good));
    }
    // The right bytes through the same path are scored (the raw call itself is sound).
    let resp = infer_raw_message(ch.clone(), prost::Message::encode_to_vec(&ok))
        .await
        .unwrap();
    assert_close(&scores(&resp), &direct(&m, &good));
    // Methods and services it does not have: UNIMPLEMENTED with a message naming them.
    for path in [
        "/inference.GRPCInferenceService/TraceSetting",
        "/grpc.health.v1.Health/Check",
    ] {
        let e = raw_call(ch.clone(), path, Vec::new()).await.unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented, "{path}");
        assert!(
            e.message().contains(path)
                && e.message().contains("ModelInfer, RepositoryIndex")
                && e.message().contains("ModelStatistics"),
            "{path}: {:?}",
            e.message()
        );
    }
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_limit_deadlines_metrics_and_a_graceful_stop() {
    let mut cfg = config();
    cfg.batch.max_delay = Duration::from_millis(300);
    cfg.batch.queue = 2;
    let (s, c, url, m) = start_grpc(cfg).await;
    let call = |r: &Req, edit: fn(&mut tonic::Request<pb::ModelInferRequest>)| {
        let mut c = c.clone();
        let mut req = tonic::Request::new(infer_req(&m, r, true, false));
        edit(&mut req);
        tokio::spawn(async move { c.model_infer(req).await })
    };
    // Two requests wait in a forming batch; a third finds the queue full at once.
    let waiting: Vec<Req> = (0..2).map(|i| random_req(&m, 1, 50 + i)).collect();
    let futs: Vec<_> = waiting.iter().map(|r| call(r, |_| {})).collect();
    wait_queued(&s, 2).await;
    let t = std::time::Instant::now();
    let e = call(&random_req(&m, 1, 60), |_| {})
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(t.elapsed() < Duration::from_millis(200), "refused at once");
    for (f, r) in futs.into_iter().zip(&waiting) {
        let resp = f.await.unwrap().unwrap().into_inner();
        assert_close(&scores(&resp), &direct(&m, r));
    }
    // Deadlines shorter than the batching delay, from parameters.timeout or the call's own
    // deadline: DEADLINE_EXCEEDED, not computed.
    let r = random_req(&m, 1, 61);
    let e = call(&r, |q| {
        q.get_mut()
            .parameters
            .insert("timeout".into(), int64_param(1000));
    })
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{}", e.message());
    // tonic's client gives up at its own deadline (CANCELLED, "Timeout expired") before the
    // server's answer can arrive; the server sees the call dropped and counts it `cancelled`.
    let e = call(&r, |q| q.set_timeout(Duration::from_millis(20)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{e:?}"
    );
    // The server counts the dropped call once its batch forms (after the 300 ms delay).
    let cancelled = "ember_requests_total{protocol=\"grpc\",status=\"cancelled\"}";
    let start = std::time::Instant::now();
    let http = reqwest::Client::new();
    loop {
        let page = get_text(&http, format!("{url}/metrics")).await;
        if page.lines().any(|l| l.starts_with(cancelled)) {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the dropped call was never counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A deadline longer than the delay is met.
    let resp = call(&r, |q| q.set_timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap()
        .into_inner();
    assert_close(&scores(&resp), &direct(&m, &r));

    let page = get_text(&http, format!("{url}/metrics")).await;
    let count = |name: &str| -> u64 {
        let line = page
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("/metrics lacks {name}"));
        line[name.len()..].trim().parse().unwrap()
    };
    assert!(count("ember_requests_total{protocol=\"grpc\",status=\"ok\"}") >= 3);
    assert_eq!(
        count("ember_requests_total{protocol=\"grpc\",status=\"resource_exhausted\"}"),
        1
    );
    assert_eq!(
        count("ember_requests_total{protocol=\"grpc\",status=\"deadline_exceeded\"}"),
        1
    );
    assert_eq!(
        count("ember_requests_total{protocol=\"grpc\",status=\"cancelled\"}"),
        1
    );

    // Requests in flight when the stop comes are answered; then the port is closed.
    let reqs: Vec<Req> = (0..2).map(|i| random_req(&m, 3, 70 + i)).collect();
    let futs: Vec<_> = reqs.iter().map(|r| call(r, |_| {})).collect();
    wait_queued(&s, 2).await;
    let g = s.grpc_addr().unwrap();
    s.shutdown().await.unwrap();
    for (f, r) in futs.into_iter().zip(&reqs) {
        let resp = f.await.unwrap().unwrap().into_inner();
        assert_close(&scores(&resp), &direct(&m, r));
    }
    assert!(
        GrpcInferenceServiceClient::connect(format!("http://{g}"))
            .await
            .is_err()
    );
}
