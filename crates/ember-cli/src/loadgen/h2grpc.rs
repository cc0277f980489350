//! A lean gRPC client for `ModelInfer` load: calls go over `h2` directly, many at once on each
//! HTTP/2 connection, with request messages encoded (and framed) once before the load starts.
//! Answers are not decoded: a call's outcome is its `grpc-status`.
//!
//! Why: tonic's client (a tower stack, a buffer task per channel, encoding each message per
//! call) cost more CPU per call than the server spent answering it, on the same two cores, so
//! the gRPC figure measured the client.

use std::net::SocketAddr;

use anyhow::Context;
use bytes::Bytes;
use h2::client::SendRequest;
use http::{HeaderValue, Method, Request, Uri, header};
use prost::Message;

use super::tls::{Tls, connect};

use ember_serve::grpc::pb;

/// The path of `ModelInfer`.
const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// HTTP/2 connections to one server, and the URI of `ModelInfer` on it.
#[derive(Debug)]
pub(super) struct Lean {
    conns: Vec<SendRequest<Bytes>>,
    uri: Uri,
}

/// A message as a gRPC body: uncompressed, its length (big-endian u32), its bytes.
pub(super) fn frame(req: &pb::ModelInferRequest) -> Bytes {
    let len = req.encoded_len();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    req.encode(&mut out).expect("a Vec grows as needed");
    out.into()
}

impl Lean {
    /// Opens `n` HTTP/2 connections to `addr` (`authority` names it in requests).
    pub(super) async fn connect(
        addr: SocketAddr,
        authority: &str,
        tls: Option<Tls>,
        n: usize,
    ) -> anyhow::Result<Self> {
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            let tcp = connect(addr, tls.as_ref())
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            let (send, conn) = h2::client::Builder::new()
                .initial_window_size(4 << 20)
                .initial_connection_window_size(16 << 20)
                .handshake::<_, Bytes>(tcp)
                .await
                .with_context(|| format!("HTTP/2 handshake with {addr}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            conns.push(send);
        }
        let uri = Uri::builder()
            .scheme(if tls.is_some() { "https" } else { "http" })
            .authority(authority)
            .path_and_query(MODEL_INFER)
            .build()
            .context("the server's address as a URI authority")?;
        Ok(Lean { conns, uri })
    }

    /// Sends `body` (a framed message, [`frame`]) as the `k`-th call; its `grpc-status` (None:
    /// the call failed, or its answer had none).
    pub(super) async fn call(&self, k: usize, body: &Bytes) -> Option<u32> {
        self.exchange(k, body).await.ok().flatten()
    }

    /// One call; its `grpc-status` (None: the answer had none).
    async fn exchange(&self, k: usize, body: &Bytes) -> Result<Option<u32>, h2::Error> {
        let send = self.conns[k % self.conns.len()].clone();
        let mut send = send.ready().await?;
        let mut req = Request::new(());
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri.clone();
        let h = req.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        let (answer, mut stream) = send.send_request(req, false)?;
        stream.send_data(body.clone(), true)?;
        let (parts, mut body) = answer.await?.into_parts();
        if parts.status != http::StatusCode::OK {
            return Ok(None);
        }
        // A trailers-only answer (an error) carries its status in the headers.
        if let Some(s) = status_of(&parts.headers) {
            return Ok(Some(s));
        }
        while let Some(chunk) = body.data().await {
            let n = chunk?.len();
            let _ = body.flow_control().release_capacity(n);
        }
        Ok(body.trailers().await?.as_ref().and_then(status_of))
    }
}

fn status_of(h: &http::HeaderMap) -> Option<u32> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_message_decodes_as_itself() {
        let req = pb::ModelInferRequest {
            model_name: "default".into(),
            raw_input_contents: vec![Bytes::from_static(&[1, 2, 3]), vec![0; 300].into()],
            ..Default::default()
        };
        let f = frame(&req);
        assert_eq!(f[0], 0, "uncompressed");
        let len = u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize;
        assert_eq!(len, f.len() - 5);
        assert_eq!(pb::ModelInferRequest::decode(&f[5..]).unwrap(), req);
    }

    #[test]
    fn the_status_comes_from_the_grpc_status_header() {
        let mut h = http::HeaderMap::new();
        assert_eq!(status_of(&h), None);
        h.insert("grpc-status", HeaderValue::from_static("8"));
        assert_eq!(status_of(&h), Some(8));
    }
}
