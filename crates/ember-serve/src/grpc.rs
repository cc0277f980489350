//! The gRPC front end: KServe v2 / Triton's `inference.GRPCInferenceService` (health, metadata
//! and `ModelInfer`), sharing the HTTP front end's batcher, checks and metrics.
//!
//! Inputs are those of the JSON form (see [`crate::kserve`]), with values either in each input's
//! `contents` (`fp32_contents`, `int64_contents`, `int_contents`) or, as Triton's clients send
//! them, in `raw_input_contents` (little-endian bytes, one entry per input). The `scores` output
//! comes back in `raw_output_contents`, as Triton answers.
//!
//! A deadline comes from the call's gRPC deadline (`grpc-timeout`) or `parameters.timeout`
//! (int64 microseconds, as Triton's), the shorter of the two. Errors map to status codes:
//! INVALID_ARGUMENT (malformed protobuf, wrong inputs, a message over `--max-body-bytes`),
//! NOT_FOUND, RESOURCE_EXHAUSTED (the queue is full), DEADLINE_EXCEEDED, UNAVAILABLE (stopping).

use std::collections::HashMap;
use std::time::Duration;

use axum::http::HeaderValue;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::error::ServeError;
use crate::kserve::{self, IntSink, Tensor, count_error};
use crate::metrics::Tracked;
use crate::repo::Served;
use crate::spec::ModelSpec;
use crate::state::App;
use crate::triton;

pub use crate::proto::{Codec, pb, raw_bytes};

use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use pb::model_infer_request::InferInputTensor;
use pb::model_infer_response::InferOutputTensor;
use pb::model_metadata_response::TensorMetadata;
use pb::{InferParameter, infer_parameter::ParameterChoice};

/// The gRPC service over the server's shared state.
#[derive(Debug, Clone)]
pub struct Grpc {
    app: App,
}

/// The gRPC routes, ready for a listener of their own (HTTP/2 without TLS).
pub fn router(app: App) -> axum::Router {
    let limit = app.max_body_bytes;
    let svc = GrpcInferenceServiceServer::new(Grpc { app })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    axum::Router::new()
        .fallback_service(svc)
        .layer(axum::middleware::map_response(
            move |r: axum::response::Response| async move { size_error(r, limit) },
        ))
        .layer(axum::middleware::from_fn(unimplemented_message))
        .layer(axum::middleware::from_fn(crate::access::grpc))
}

/// The methods of `inference.GRPCInferenceService` this server implements (`proto/`).
pub const IMPLEMENTED: &[&str] = &[
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "ModelStatistics",
    "ModelConfig",
];

/// tonic answers a method or service it does not have with UNIMPLEMENTED and no message; a
/// Triton client calling, say, `ModelStatistics` then shows an empty error. Add one that names
/// the method and what is implemented.
async fn unimplemented_message(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = req.uri().path().to_string();
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    if h.get("grpc-status").is_some_and(|v| v == "12") && h.get("grpc-message").is_none() {
        let msg = format!(
            "{path} is not implemented by this server (Ember); inference.GRPCInferenceService \
             has {}",
            IMPLEMENTED.join(", ")
        );
        // Printable ASCII without '%' needs no percent-encoding in grpc-message.
        if let Ok(v) = HeaderValue::from_str(&msg.replace('%', "%25")) {
            h.insert("grpc-message", v);
        }
    }
    r
}

/// tonic answers a message over the size limit with OUT_OF_RANGE; Ember's contract (as for HTTP
/// bodies) is INVALID_ARGUMENT naming the flag. Nothing else in this service says OUT_OF_RANGE.
fn size_error(mut r: axum::response::Response, limit: usize) -> axum::response::Response {
    let h = r.headers_mut();
    if h.get("grpc-status").is_some_and(|v| v == "11") {
        h.insert("grpc-status", HeaderValue::from_static("3"));
        let msg = format!(
            "the request message is over the server's limit of {limit} bytes (--max-body-bytes)"
        );
        if let Ok(v) = HeaderValue::from_str(&msg) {
            h.insert("grpc-message", v);
        }
    }
    r
}

/// The `grpc-timeout` header (the caller's deadline), in microseconds.
fn grpc_timeout_us(md: &MetadataMap) -> Result<Option<u64>, ServeError> {
    let Some(v) = md.get("grpc-timeout") else {
        return Ok(None);
    };
    let bad = || ServeError::bad(format!("malformed grpc-timeout header {v:?}"));
    let s = v.to_str().map_err(|_| bad())?;
    if s.len() < 2 || s.len() > 9 {
        return Err(bad());
    }
    let (digits, unit) = s.split_at(s.len() - 1);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some((d.as_micros() as u64).max(1)))
}

/// The request's `parameters.timeout`, in microseconds.
fn parameter_timeout_us(p: &HashMap<String, InferParameter>) -> Result<Option<u64>, ServeError> {
    match p.get("timeout").map(|v| &v.parameter_choice) {
        None => Ok(None),
        Some(Some(ParameterChoice::Int64Param(t))) if *t > 0 => Ok(Some(*t as u64)),
        Some(other) => Err(ServeError::bad(format!(
            "parameters.timeout must be a positive int64_param of microseconds, not {other:?}"
        ))),
    }
}

/// An input tensor and, when the request sends raw contents, its bytes.
struct GrpcTensor<'a> {
    t: &'a InferInputTensor,
    raw: Option<(usize, &'a [u8])>,
}

impl GrpcTensor<'_> {
    fn contents(&self) -> Option<&pb::InferTensorContents> {
        self.t.contents.as_ref()
    }

    /// Where the raw bytes are, for errors.
    fn raw_field(k: usize) -> String {
        format!("raw_input_contents[{k}]")
    }
}

impl Tensor for GrpcTensor<'_> {
    fn name(&self) -> &str {
        &self.t.name
    }
    fn datatype(&self) -> &str {
        &self.t.datatype
    }
    fn shape(&self) -> &[i64] {
        &self.t.shape
    }

    fn count(&self) -> usize {
        if let Some((_, raw)) = self.raw {
            return raw
                .len()
                .checked_div(kserve::width(&self.t.datatype))
                .unwrap_or(0);
        }
        self.contents()
            .map_or(0, |c| match self.t.datatype.as_str() {
                "FP32" => c.fp32_contents.len(),
                "INT32" => c.int_contents.len(),
                "INT64" => c.int64_contents.len(),
                _ => 0,
            })
    }

    fn read_floats(&self, want: usize, out: &mut Vec<f32>) -> Result<(), ServeError> {
        if let Some((k, raw)) = self.raw {
            return kserve::le_floats(self, &Self::raw_field(k), raw, want, out);
        }
        let v = self.contents().map_or(&[][..], |c| &c.fp32_contents[..]);
        if v.len() != want {
            return Err(count_error(self, "contents.fp32_contents", v.len(), want));
        }
        out.extend_from_slice(v);
        Ok(())
    }

    fn read_ints<S: IntSink>(&self, want: usize, out: &mut S) -> Result<(), ServeError> {
        if let Some((k, raw)) = self.raw {
            return kserve::le_ints(self, &Self::raw_field(k), raw, want, out);
        }
        if self.t.datatype == "INT32" {
            let v = self.contents().map_or(&[][..], |c| &c.int_contents[..]);
            if v.len() != want {
                return Err(count_error(self, "contents.int_contents", v.len(), want));
            }
            out.reserve_ints(want);
            v.iter().for_each(|&x| out.push_int(i64::from(x)));
        } else {
            let v = self.contents().map_or(&[][..], |c| &c.int64_contents[..]);
            if v.len() != want {
                return Err(count_error(self, "contents.int64_contents", v.len(), want));
            }
            out.reserve_ints(want);
            v.iter().for_each(|&x| out.push_int(x));
        }
        Ok(())
    }
}

/// Decodes a `ModelInferRequest` into checked samples.
pub fn decode(
    spec: &ModelSpec,
    req: &pb::ModelInferRequest,
) -> Result<ember_model::serving::Request, ServeError> {
    kserve::check_outputs(spec, req.outputs.iter().map(|o| o.name.as_str()))?;
    let raw = &req.raw_input_contents;
    if !raw.is_empty() {
        if raw.len() != req.inputs.len() {
            return Err(ServeError::bad(format!(
                "raw_input_contents has {} entries for {} inputs: it needs one per input, in \
                 the order of 'inputs'",
                raw.len(),
                req.inputs.len()
            )));
        }
        if let Some(t) = req.inputs.iter().find(|t| t.contents.is_some()) {
            return Err(ServeError::bad(format!(
                "input '{}' sets 'contents' but the request sends raw_input_contents: use one \
                 or the other",
                t.name
            )));
        }
    }
    let tensors: Vec<GrpcTensor> = req
        .inputs
        .iter()
        .enumerate()
        .map(|(k, t)| GrpcTensor {
            t,
            raw: raw.get(k).map(|b| (k, &b[..])),
        })
        .collect();
    kserve::decode_tensors(spec, &tensors)
}

fn tensor_meta(t: kserve::TensorMeta) -> TensorMetadata {
    let mut parameters = HashMap::new();
    if let Some(rows) = t
        .parameters
        .as_ref()
        .and_then(|p| p.get("rows"))
        .and_then(|r| r.as_i64())
    {
        parameters.insert(
            "rows".to_string(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::Int64Param(rows)),
            },
        );
    }
    TensorMetadata {
        name: t.name,
        datatype: t.datatype.into(),
        shape: t.shape,
        parameters,
    }
}

impl Grpc {
    async fn infer(
        &self,
        md: &MetadataMap,
        req: pb::ModelInferRequest,
    ) -> Result<pb::ModelInferResponse, ServeError> {
        let served = self.app.model(&req.model_name, &req.model_version)?;
        let r = self.infer_on(&served, md, req).await;
        served.count_request(r.as_ref().err());
        r
    }

    async fn infer_on(
        &self,
        served: &Served,
        md: &MetadataMap,
        req: pb::ModelInferRequest,
    ) -> Result<pb::ModelInferResponse, ServeError> {
        let timeout = match (grpc_timeout_us(md)?, parameter_timeout_us(&req.parameters)?) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Refused before decoding when the server is already past its queue bound.
        served.batcher.admit(timeout)?;
        let t0 = std::time::Instant::now();
        let samples = decode(&served.spec, &req)?;
        crate::metrics::decoded("grpc", t0);
        let scored = served.batcher.submit(samples, timeout).await?;
        let asked: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
        let outs = kserve::requested(kserve::outputs(&served.spec, &scored), &asked);
        let mut outputs = Vec::with_capacity(outs.len());
        let mut raw_output_contents = Vec::with_capacity(outs.len());
        for o in &outs {
            let mut raw = bytes::BytesMut::with_capacity(o.values.byte_len());
            o.values.write_le(&mut raw);
            raw_output_contents.push(raw.freeze());
            outputs.push(InferOutputTensor {
                name: o.name.into(),
                datatype: o.values.datatype().into(),
                shape: vec![o.values.len() as i64],
                parameters: HashMap::new(),
                contents: None,
            });
        }
        Ok(pb::ModelInferResponse {
            model_name: served.spec.name.clone(),
            model_version: served.version_str.clone(),
            id: req.id,
            parameters: HashMap::new(),
            outputs,
            raw_output_contents,
        })
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Grpc {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        let ready = self.app.is_ready();
        Ok(Response::new(pb::ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        req: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = req.get_ref();
        // Triton answers `ready: false` (not an error) for a model or version it does not
        // serve, and its clients' `is_model_ready` counts on it.
        let ready = match self.app.model_ready(&r.name, &r.version) {
            Ok(ready) => ready,
            Err(ServeError::NotFound(_)) => false,
            Err(e) => return Err(e.into()),
        };
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: "ember".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: crate::kserve::EXTENSIONS
                .iter()
                .filter(|&&e| e != "binary_tensor_data")
                .map(|e| e.to_string())
                .collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = req.get_ref();
        let served = self.app.model(&r.name, &r.version)?;
        let meta = kserve::metadata(&served.spec, &served.version_str);
        Ok(Response::new(pb::ModelMetadataResponse {
            name: meta.name,
            versions: meta.versions,
            platform: meta.platform.into(),
            inputs: meta.inputs.into_iter().map(tensor_meta).collect(),
            outputs: meta.outputs.into_iter().map(tensor_meta).collect(),
        }))
    }

    async fn model_infer(
        &self,
        req: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        let t = Tracked::new("grpc");
        let (md, _, body) = req.into_parts();
        let r = self.infer(&md, body).await;
        t.finish(r.as_ref().err());
        let r = r.map_err(Status::from)?;
        let access = crate::access::Access {
            model: r.model_name.clone(),
            samples: r
                .outputs
                .first()
                .and_then(|o| o.shape.first())
                .map_or(0, |&n| n as usize),
        };
        let mut resp = Response::new(r);
        resp.extensions_mut().insert(access);
        Ok(resp)
    }

    async fn repository_index(
        &self,
        req: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let models = self
            .app
            .repo
            .index(req.get_ref().ready)
            .into_iter()
            .map(|e| pb::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state.into(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let req = req.into_inner();
        let what = format!("loading model {:?}", req.model_name);
        let params: Vec<String> = req.parameters.keys().cloned().collect();
        self.app.may_control(&what, &params)?;
        let name = req.model_name;
        self.app.on_repository(move |r| r.load(&name)).await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let req = req.into_inner();
        let what = format!("unloading model {:?}", req.model_name);
        let params: Vec<String> = req.parameters.keys().cloned().collect();
        self.app.may_control(&what, &params)?;
        let name = req.model_name;
        self.app.on_repository(move |r| r.unload(&name)).await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn model_config(
        &self,
        req: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let r = req.get_ref();
        let served = self.app.model(&r.name, &r.version)?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(triton::config(&served).to_proto()),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let r = req.into_inner();
        // Every model, in name order (as `served` lists them), or the one asked.
        let served = if r.name.is_empty() {
            self.app.repo.served()
        } else {
            vec![self.app.model(&r.name, &r.version)?]
        };
        let model_stats = served
            .iter()
            .map(|s| triton::stats_message(s.batcher.stats(s.name(), s.version)))
            .collect();
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_implemented_list_is_the_protos_rpcs() {
        let proto = include_str!("../proto/grpc_service.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect();
        assert_eq!(rpcs, IMPLEMENTED);
    }

    fn timeout(v: &str) -> Result<Option<u64>, ServeError> {
        let mut md = MetadataMap::new();
        md.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout_us(&md)
    }

    #[test]
    fn grpc_timeout_header_in_every_unit() {
        assert_eq!(grpc_timeout_us(&MetadataMap::new()), Ok(None));
        assert_eq!(timeout("2H"), Ok(Some(7_200_000_000)));
        assert_eq!(timeout("3M"), Ok(Some(180_000_000)));
        assert_eq!(timeout("4S"), Ok(Some(4_000_000)));
        assert_eq!(timeout("25m"), Ok(Some(25_000)));
        assert_eq!(timeout("99999999u"), Ok(Some(99_999_999)));
        assert_eq!(timeout("1500n"), Ok(Some(1)));
        // Under a microsecond still expires: never an unlimited deadline.
        assert_eq!(timeout("0n"), Ok(Some(1)));
        for bad in ["", "m", "12", "12x", "-1S", "123456789S", "1.5S", " 1S"] {
            assert!(timeout(bad).is_err(), "{bad:?} accepted");
        }
    }
}
