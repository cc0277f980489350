//! The model repository on a real server: many models by name, versions swapped in under
//! concurrent requests (every answer from exactly one version, none failed), failing loads that
//! leave the served version alone and name the bad file, the poller, and the gRPC methods.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ember_model::{LoadOptions, Model};
use ember_serve::grpc::pb;
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use ember_serve::{DiskLoader, ModelControl, RepositoryConfig, Server};
use serde_json::{Value, json};

/// A fresh directory for one test's repository.
fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-repo-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The shipped model's weights with `delta` added to the last layer's bias (every score moves).
fn weights_with_bias(delta: f32) -> Vec<u8> {
    let mut b = std::fs::read(root().join("models/default/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let at = 8
        + n
        + header["top_mlp.2.bias"]["data_offsets"][0]
            .as_u64()
            .unwrap() as usize;
    let v = f32::from_le_bytes(b[at..at + 4].try_into().unwrap()) + delta;
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    b
}

/// Writes version `v` of model `name` (bias moved by `delta`) under `root`, whole: written
/// beside it and renamed in, as a user should.
fn write_version(root: &Path, name: &str, v: u64, delta: f32) -> PathBuf {
    let tmp = root.join(name).join(format!(".{v}.tmp"));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(root_model().join("config.json"), tmp.join("config.json")).unwrap();
    std::fs::write(tmp.join("model.safetensors"), weights_with_bias(delta)).unwrap();
    let dir = root.join(name).join(v.to_string());
    std::fs::rename(&tmp, &dir).unwrap();
    dir
}

fn root_model() -> PathBuf {
    root().join("models/default")
}

fn source(root: &Path, poll: Option<Duration>) -> RepositoryConfig {
    RepositoryConfig {
        root: root.to_path_buf(),
        loader: Arc::new(DiskLoader {
            options: LoadOptions::default(),
            threads: 1,
        }),
        poll,
        warm_batches: 2,
        pace_bytes_per_s: Some(200 << 20),
        registry: None,
    }
}

async fn start_repo(root: &Path, poll: Option<Duration>, grpc: bool) -> (Server, String) {
    start_repo_with(root, poll, grpc, ModelControl::Explicit).await
}

async fn start_repo_with(
    root: &Path,
    poll: Option<Duration>,
    grpc: bool,
    control: ModelControl,
) -> (Server, String) {
    let mut cfg = config();
    cfg.model_control = control;
    if grpc {
        cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    }
    let s = Server::start_repository(source(root, poll), cfg)
        .await
        .unwrap();
    let url = format!("http://{}", s.addr());
    (s, url)
}

fn load_model(dir: &Path) -> Arc<Model> {
    Arc::new(Model::load(dir, LoadOptions::default()).unwrap())
}

async fn post(c: &reqwest::Client, url: String, body: &Value) -> (u16, Value) {
    let r = c.post(url).json(body).send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

async fn index(c: &reqwest::Client, url: &str) -> Vec<(String, String, String, String)> {
    let (code, v) = post(c, format!("{url}/v2/repository/index"), &json!({})).await;
    assert_eq!(code, 200, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            (s("name"), s("version"), s("state"), s("reason"))
        })
        .collect()
}

fn state_of<'a>(
    idx: &'a [(String, String, String, String)],
    name: &str,
    v: &str,
) -> &'a (String, String, String, String) {
    idx.iter()
        .find(|e| e.0 == name && e.1 == v)
        .unwrap_or_else(|| panic!("{name} v{v} not in the index {idx:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_swap_under_concurrent_requests_each_answer_from_one_version() {
    let root = temp("swap");
    let a1 = write_version(&root, "a", 1, 0.0);
    let b1 = write_version(&root, "b", 1, 0.5);
    let (server, url) = start_repo(&root, None, false).await;
    let c = reqwest::Client::new();

    // Two models by name, each its own weights.
    let (ma, mb1) = (load_model(&a1), load_model(&b1));
    let reqs: Vec<Req> = (0..16)
        .map(|i| random_req(&ma, 1 + i % 5, 100 + i as u64))
        .collect();
    let (code, ra) = post(
        &c,
        format!("{url}/v2/models/a/infer"),
        &kserve_body(&ma, &reqs[0]),
    )
    .await;
    assert_eq!(code, 200, "{ra}");
    assert_close(&scores_of(&ra), &direct(&ma, &reqs[0]));
    let (_, rb) = post(
        &c,
        format!("{url}/v2/models/b/infer"),
        &kserve_body(&ma, &reqs[0]),
    )
    .await;
    assert_eq!(rb["model_version"], "1");
    assert_close(&scores_of(&rb), &direct(&mb1, &reqs[0]));
    assert_ne!(scores_of(&ra), scores_of(&rb));
    let (code, v) = post(
        &c,
        format!("{url}/v2/models/c/infer"),
        &kserve_body(&ma, &reqs[0]),
    )
    .await;
    assert_eq!(code, 404);
    assert!(v["error"].as_str().unwrap().contains("'a', 'b'"), "{v}");
    let idx = index(&c, &url).await;
    assert_eq!(state_of(&idx, "a", "1").2, "READY");
    assert_eq!(state_of(&idx, "b", "1").2, "READY");

    // Clients hammer b while version 2 loads and swaps in.
    let b2 = write_version(&root, "b", 2, -0.7);
    let mb2 = load_model(&b2);
    let want: Vec<[Vec<f32>; 2]> = reqs
        .iter()
        .map(|r| [direct(&mb1, r), direct(&mb2, r)])
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bodies: Arc<Vec<Value>> = Arc::new(reqs.iter().map(|r| kserve_body(&ma, r)).collect());
    let mut clients = Vec::new();
    for k in 0..3 {
        let (c, url, stop, bodies) = (c.clone(), url.clone(), stop.clone(), bodies.clone());
        let answered = answered.clone();
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut i = k;
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                let (code, v) = post(&c, format!("{url}/v2/models/b/infer"), &bodies[i % 16]).await;
                seen.push((at, i % 16, code, v));
                answered.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            seen
        }));
    }
    // Traffic on version 1 before the swap, and on version 2 after it: counted, not timed.
    let traffic = async |more: usize| {
        let until = answered.load(Ordering::Relaxed) + more;
        eventually("clients' answers", async || {
            answered.load(Ordering::Relaxed) >= until
        })
        .await;
    };
    traffic(30).await;
    let (code, v) = post(&c, format!("{url}/v2/repository/models/b/load"), &json!({})).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["version"], "2");
    let swapped = Instant::now();
    traffic(30).await;
    stop.store(true, Ordering::Relaxed);
    let (mut old, mut new) = (0, 0);
    for cl in clients {
        for (at, i, code, v) in cl.await.unwrap() {
            assert_eq!(code, 200, "a request failed during the swap: {v}");
            let version = v["model_version"].as_str().unwrap();
            let k = match version {
                "1" => 0,
                "2" => 1,
                other => panic!("answered by version {other}"),
            };
            assert_close(&scores_of(&v), &want[i][k]);
            if at > swapped {
                assert_eq!(
                    version, "2",
                    "a request sent after the swap ran on version 1"
                );
            }
            if k == 0 { old += 1 } else { new += 1 }
        }
    }
    assert!(old > 0 && new > 0, "{old} answers from v1, {new} from v2");

    // The index and versioned routes tell the story.
    let idx = index(&c, &url).await;
    assert_eq!(state_of(&idx, "b", "2").2, "READY");
    let b1_state = state_of(&idx, "b", "1");
    assert_eq!(b1_state.2, "UNAVAILABLE");
    assert!(b1_state.3.contains("replaced by version 2"), "{b1_state:?}");
    let (code, v) = post(
        &c,
        format!("{url}/v2/models/b/versions/1/infer"),
        &bodies[0],
    )
    .await;
    assert_eq!(code, 404, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("serves version '2'"),
        "{v}"
    );
    let (code, v) = post(
        &c,
        format!("{url}/v2/models/b/versions/2/infer"),
        &bodies[0],
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let meta: Value = c
        .get(format!("{url}/v2/models/b"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["versions"], json!(["2"]));
    let ready = c
        .get(format!("{url}/v2/models/b/versions/2/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    let metrics = get_text(&c, format!("{url}/metrics")).await;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("ember_model_requests_total")
                && l.contains("model=\"b\"")
                && l.contains("version=\"2\"")
                && l.contains("status=\"ok\"")
        })
        .unwrap_or_else(|| panic!("no per-version request count in\n{metrics}"));
    let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= new as f64, "{line}");
    assert!(
        metrics.contains("ember_model_ready{model=\"b\",version=\"1\"} 0"),
        "{metrics}"
    );
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// A file a bad version names, and how it was spoiled.
type Spoil = (&'static str, fn(&Path));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_loads_keep_the_served_version_and_name_the_file() {
    let root = temp("fail");
    let m1 = write_version(&root, "m", 1, 0.0);
    let (server, url) = start_repo(&root, None, false).await;
    let c = reqwest::Client::new();
    let m = load_model(&m1);
    let r = random_req(&m, 3, 7);
    let load = |c: reqwest::Client, url: String| async move {
        post(&c, format!("{url}/v2/repository/models/m/load"), &json!({})).await
    };

    // A truncated weights file, a config that is not JSON, a missing weights file.
    let bad: [Spoil; 3] = [
        ("model.safetensors", |d| {
            let f = d.join("model.safetensors");
            let b = std::fs::read(&f).unwrap();
            std::fs::write(&f, &b[..b.len() / 2]).unwrap();
        }),
        ("config.json", |d| {
            std::fs::write(d.join("config.json"), "{ not json").unwrap()
        }),
        ("model.safetensors", |d| {
            std::fs::remove_file(d.join("model.safetensors")).unwrap()
        }),
    ];
    for (k, (file, spoil)) in bad.iter().enumerate() {
        let v = 2 + k as u64;
        let dir = write_version(&root, "m", v, 1.0);
        spoil(&dir);
        let (code, e) = load(c.clone(), url.clone()).await;
        assert_eq!(code, 400, "{e}");
        let msg = e["error"].as_str().unwrap();
        assert!(
            msg.contains(file) && msg.contains(&format!("version {v}")),
            "{msg}"
        );
        // Still served: version 1, its scores.
        let (code, ok) = post(&c, format!("{url}/v2/models/m/infer"), &kserve_body(&m, &r)).await;
        assert_eq!(code, 200, "{ok}");
        assert_eq!(ok["model_version"], "1");
        assert_close(&scores_of(&ok), &direct(&m, &r));
        let idx = index(&c, &url).await;
        let st = state_of(&idx, "m", &v.to_string());
        assert_eq!(st.2, "UNAVAILABLE");
        assert!(st.3.contains(file), "{st:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // Unknown models; unload, then load again.
    let (code, e) = post(
        &c,
        format!("{url}/v2/repository/models/nope/load"),
        &json!({}),
    )
    .await;
    assert_eq!(code, 404, "{e}");
    let (code, e) = post(
        &c,
        format!("{url}/v2/repository/models/m/unload"),
        &json!({}),
    )
    .await;
    assert_eq!(code, 200, "{e}");
    let (code, e) = post(&c, format!("{url}/v2/models/m/infer"), &kserve_body(&m, &r)).await;
    assert_eq!(code, 404, "{e}");
    assert!(e["error"].as_str().unwrap().contains("unloaded"), "{e}");
    let ready = c
        .get(format!("{url}/v2/models/m/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 404);
    let (code, e) = load(c.clone(), url.clone()).await;
    assert_eq!((code, &e["version"]), (200, &json!("1")), "{e}");
    let (code, _) = post(&c, format!("{url}/v2/models/m/infer"), &kserve_body(&m, &r)).await;
    assert_eq!(code, 200);
    server.shutdown().await.unwrap();

    // A repository whose model does not load does not start, and says which file.
    let dir = write_version(&root, "m", 9, 0.0);
    std::fs::write(dir.join("config.json"), "[]").unwrap();
    let e = Server::start_repository(source(&root, None), config())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("config.json") && msg.contains("'m' version 9"),
        "{msg}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// Polls `f` every 20 ms until it is true, for at most 20 s.
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_loads_new_versions_and_models_and_unloads_removed_ones() {
    let root = temp("poll");
    write_version(&root, "pm", 1, 0.0);
    let (server, url) = start_repo(&root, Some(Duration::from_millis(50)), false).await;
    let c = reqwest::Client::new();
    let versions = async |name: &str| -> Value {
        let r = c
            .get(format!("{url}/v2/models/{name}"))
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap()["versions"].clone()
    };
    assert_eq!(versions("pm").await, json!(["1"]));
    write_version(&root, "pm", 2, 0.3);
    eventually("version 2", async || versions("pm").await == json!(["2"])).await;
    write_version(&root, "pn", 1, 0.1);
    eventually("model n", async || versions("pn").await == json!(["1"])).await;
    // A bad version is tried once, reported, and not again until it changes.
    let bad = write_version(&root, "pm", 3, 0.0);
    std::fs::write(bad.join("config.json"), "{").unwrap();
    eventually("version 3 refused", async || {
        let idx = index(&c, &url).await;
        idx.iter()
            .any(|e| e.0 == "pm" && e.1 == "3" && e.2 == "UNAVAILABLE")
    })
    .await;
    // Not a wait: six poll periods pass in which the poller must NOT try version 3 again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = get_text(&c, format!("{url}/metrics")).await;
    let failed = metrics
        .lines()
        .find(|l| {
            l.starts_with("ember_model_loads_total")
                && l.contains("model=\"pm\"")
                && l.contains("failed")
        })
        .unwrap_or_else(|| panic!("no failed load counted:\n{metrics}"));
    assert!(
        failed.ends_with(" 1"),
        "the bad version was retried: {failed}"
    );
    assert_eq!(versions("pm").await, json!(["2"]));
    // Removing the bad version rolls nothing back (2 is still the newest good one); removing the
    // model's directory unloads it.
    std::fs::remove_dir_all(&bad).unwrap();
    std::fs::remove_dir_all(root.join("pn")).unwrap();
    eventually("n unloaded", async || {
        let r = c.get(format!("{url}/v2/models/pn")).send().await.unwrap();
        r.status().as_u16() == 404
    })
    .await;
    assert_eq!(versions("pm").await, json!(["2"]));
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repository_methods_over_grpc() {
    let root = temp("grpc");
    write_version(&root, "m", 1, 0.0);
    let (server, _) = start_repo(&root, None, true).await;
    let mut g =
        GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr().unwrap()))
            .await
            .unwrap();
    write_version(&root, "m", 2, 0.2);
    g.repository_model_load(pb::RepositoryModelLoadRequest {
        model_name: "m".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let idx = g
        .repository_index(pb::RepositoryIndexRequest {
            ready: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .models;
    assert_eq!(idx.len(), 1, "{idx:?}");
    assert_eq!(
        (
            idx[0].name.as_str(),
            idx[0].version.as_str(),
            idx[0].state.as_str()
        ),
        ("m", "2", "READY")
    );
    let meta = g
        .model_metadata(pb::ModelMetadataRequest {
            name: "m".into(),
            version: "2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.versions, vec!["2".to_string()]);
    // Version 1 is no longer served: not ready (Triton's answer), not an error.
    let r = g
        .model_ready(pb::ModelReadyRequest {
            name: "m".into(),
            version: "1".into(),
        })
        .await
        .unwrap();
    assert!(!r.into_inner().ready);
    g.repository_model_unload(pb::RepositoryModelUnloadRequest {
        model_name: "m".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let e = g
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "zz".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    server.shutdown().await.unwrap();

    // A server of one model says how to get a repository.
    let mut cfg = config();
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    cfg.model_control = ModelControl::Explicit;
    let (one, _, _) = start(cfg).await;
    let mut g = GrpcInferenceServiceClient::connect(format!("http://{}", one.grpc_addr().unwrap()))
        .await
        .unwrap();
    let e = g
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "default".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("--model-repository"), "{e:?}");
    one.shutdown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Model control is off unless asked for: without `--model-control explicit`, load and unload
/// answer 403 / PERMISSION_DENIED over HTTP and gRPC, saying how to turn it on, and the model
/// serves on; with it, a load or unload naming parameters (Triton's `config` / `file:`
/// overrides) is refused naming them, over both protocols, and a plain one loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_control_is_off_unless_asked_for_and_overrides_are_refused() {
    let root = temp("control");
    write_version(&root, "m", 1, 0.0);
    let c = reqwest::Client::new();
    let (server, url) = start_repo_with(&root, None, true, ModelControl::None).await;
    let mut g =
        GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr().unwrap()))
            .await
            .unwrap();
    for route in ["load", "unload"] {
        let (code, e) = post(
            &c,
            format!("{url}/v2/repository/models/m/{route}"),
            &json!({}),
        )
        .await;
        assert_eq!(code, 403, "{route}: {e}");
        let msg = e["error"].as_str().unwrap();
        assert!(msg.contains("--model-control"), "{route}: {msg}");
        assert!(
            msg.contains(&format!("{route}ing model \"m\"")),
            "{route}: {msg}"
        );
    }
    let e = g
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "m".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("--model-control"), "{e:?}");
    let e = g
        .repository_model_unload(pb::RepositoryModelUnloadRequest {
            model_name: "m".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // Still served, and still listed as ready.
    let idx = index(&c, &url).await;
    assert_eq!(state_of(&idx, "m", "1").2, "READY", "{idx:?}");
    let r = c
        .get(format!("{url}/v2/models/m/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    server.shutdown().await.unwrap();

    let (server, url) = start_repo_with(&root, None, true, ModelControl::Explicit).await;
    let mut g =
        GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr().unwrap()))
            .await
            .unwrap();
    let overrides = json!({"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}});
    let (code, e) = post(&c, format!("{url}/v2/repository/models/m/load"), &overrides).await;
    assert_eq!(code, 400, "{e}");
    let msg = e["error"].as_str().unwrap();
    assert!(msg.contains("config, file:1/model.onnx"), "{msg}");
    let r = c
        .post(format!("{url}/v2/repository/models/m/load"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let mut params = std::collections::HashMap::new();
    params.insert(
        "config".to_string(),
        pb::ModelRepositoryParameter::default(),
    );
    let e = g
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "m".into(),
            parameters: params,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("config"), "{e:?}");
    // A plain load (an empty body, as Triton's client sends none) loads.
    write_version(&root, "m", 2, 0.1);
    let r = c
        .post(format!("{url}/v2/repository/models/m/load"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(state_of(&index(&c, &url).await, "m", "2").2, "READY");
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
