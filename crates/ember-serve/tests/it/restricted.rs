//! API groups restricted to a header key (`ServeConfig::restricted`) on HTTP and gRPC, and
//! `/metrics` on an address of its own (`ServeConfig::metrics`): 403 / PERMISSION_DENIED
//! without the key or with another value, naming the group and the header but never the value;
//! answered with it; groups not restricted answered as before; every refusal counted.

use std::time::Duration;

use ember_serve::Restrictions;
use ember_serve::grpc::pb::{self, grpc_inference_service_client::GrpcInferenceServiceClient};
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::common::{
    assert_close, config, direct, get_text, kserve_body, random_req, scores_of, start,
};
use crate::grpc::{infer_req, scores};

const SECRET: &str = "s3cret-admin";

/// `msg` with metadata `key: value`.
fn with<T>(msg: T, key: &'static str, value: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert(key, MetadataValue::try_from(value).unwrap());
    r
}

#[tokio::test]
async fn restricted_groups_need_their_header_on_both_protocols() {
    let mut cfg = config();
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    cfg.metrics = Some("127.0.0.1:0".parse().unwrap());
    let mut r = Restrictions::default();
    r.add(&format!("model-repository,statistics:Admin-Key={SECRET}"))
        .unwrap();
    r.add("inference:user-key=u1").unwrap();
    cfg.restricted = r;
    let (s, url, m) = start(cfg).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();

    // HTTP: the repository index without the key, with another value, with the key.
    let index = |key: Option<&str>| {
        let mut b = http
            .post(format!("{url}/v2/repository/index"))
            .json(&serde_json::json!({}));
        if let Some(k) = key {
            b = b.header("admin-key", k);
        }
        b.send()
    };
    for key in [None, Some("s3cret"), Some("S3CRET-ADMIN"), Some("u1")] {
        let resp = index(key).await.unwrap();
        assert_eq!(resp.status(), 403, "{key:?}");
        let said = resp.text().await.unwrap();
        assert!(
            said.contains("model-repository API is restricted") && said.contains("'admin-key'"),
            "{said}"
        );
        assert!(
            !said.contains(SECRET),
            "the refusal told the secret: {said}"
        );
    }
    assert_eq!(index(Some(SECRET)).await.unwrap().status(), 200);
    let stats = http
        .get(format!("{url}/v2/models/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(stats.status(), 403);

    // Inference needs its own key; its scores are the model's.
    let req = random_req(&m, 3, 5);
    let infer = |key: Option<&str>| {
        let mut b = http
            .post(format!("{url}/v2/models/default/infer"))
            .json(&kserve_body(&m, &req));
        if let Some(k) = key {
            b = b.header("user-key", k);
        }
        b.send()
    };
    assert_eq!(infer(None).await.unwrap().status(), 403);
    let ok = infer(Some("u1")).await.unwrap();
    assert_eq!(ok.status(), 200);
    let v: serde_json::Value = ok.json().await.unwrap();
    assert_close(&scores_of(&v), &direct(&m, &req));

    // Groups not restricted: health, metadata.
    for path in ["/v2/health/ready", "/v2/models/default", "/v2"] {
        let resp = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }

    // gRPC: the same groups, the key as metadata.
    let g = s.grpc_addr().unwrap();
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{g}"))
        .await
        .unwrap();
    let index_req = pb::RepositoryIndexRequest {
        repository_name: String::new(),
        ready: false,
    };
    let e = c.repository_index(index_req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(
        e.message().contains("'admin-key'") && !e.message().contains(SECRET),
        "{e:?}"
    );
    let e = c
        .repository_index(with(index_req.clone(), "admin-key", "nope"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    c.repository_index(with(index_req, "admin-key", SECRET))
        .await
        .unwrap();
    let greq = infer_req(&m, &req, true, false);
    let e = c.model_infer(greq.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let resp = c
        .model_infer(with(greq, "user-key", "u1"))
        .await
        .unwrap()
        .into_inner();
    assert_close(&scores(&resp), &direct(&m, &req));
    assert!(
        c.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );

    // /metrics: on its own address, not on the HTTP listener; the refusals counted there.
    let moved = http.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(moved.status(), 404);
    assert!(moved.text().await.unwrap().contains("--metrics-addr"));
    let page = get_text(
        &http,
        format!("http://{}/metrics", s.metrics_addr().unwrap()),
    )
    .await;
    let refused: f64 = page
        .lines()
        .filter(|l| l.starts_with("ember_requests_refused_total") && l.contains("restricted_api"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // 4 index + 1 stats + 1 infer over HTTP, 2 index + 1 infer over gRPC (at least: the
    // recorder is the process's, shared with other tests).
    assert!(refused >= 9.0, "{refused} refusals counted:\n{page}");
    let other = http
        .get(format!(
            "http://{}/v2/health/ready",
            s.metrics_addr().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    s.shutdown().await.unwrap();
}
