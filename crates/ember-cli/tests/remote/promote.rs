//! Servers built from the registry alone (`ember serve --from-registry`) and `ember registry
//! promote`: two replicas with no model directory score exactly as the model directory pushed;
//! a pushed version is not served until promoted once one was promoted; a promotion is swapped
//! in on every replica under concurrent requests with none failed and every answer from exactly one
//! version; a rollback; the promoted version cannot be removed; a version that cannot be loaded
//! leaves the served one alone and is reported; and promote's refusals.

use crate::server::{PATIENCE, Server, tsv_rows, wait_until as wait_for};
use crate::{ember, ok, scores};
use ember_registry::layout;
use ember_tier::storage::remote;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The shipped model with `t3` held in memory and the rest in the store; every weight and row
/// scaled by `scale` (so that each version scores differently).
fn model_dir(root: &std::path::Path, scale: f32) -> std::path::PathBuf {
    let dir = root.join(format!("fresh-{scale}"));
    std::fs::create_dir_all(&dir).unwrap();
    let src = super::default_model();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    for t in config["tables"].as_array_mut().unwrap() {
        let placement = if t["name"] == "t3" { "dram" } else { "remote" };
        t["placement"] = placement.into();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let scaled: Vec<(String, Vec<u8>, Vec<usize>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            let data = t
                .data()
                .chunks_exact(4)
                .flat_map(|c| (f32::from_le_bytes(c.try_into().unwrap()) * scale).to_le_bytes())
                .collect();
            (name, data, t.shape().to_vec())
        })
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = scaled
        .iter()
        .map(|(n, d, s)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d);
            (n.as_str(), v.unwrap())
        })
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    dir
}

/// `ember registry CMD --redis URL --model MODEL --version V`: whether it succeeded, and what it
/// printed.
fn version_cmd(cmd: &str, url: &str, model: &str, version: u64) -> (bool, String) {
    let v = version.to_string();
    ember(&[
        "registry",
        cmd,
        "--redis",
        url,
        "--model",
        model,
        "--version",
        &v,
    ])
}

/// `ember registry promote` of version `v` of `fresh`, which must succeed; what it printed.
fn promote(url: &str, v: u64) -> String {
    let (done, said) = version_cmd("promote", url, "fresh", v);
    assert!(done, "{said}");
    said
}

/// The version `s` serves, from its index.
fn served_version(s: &Server) -> Vec<(String, String)> {
    let (code, idx) = s
        .request("POST", "/v2/repository/index", "application/json", b"{}")
        .unwrap();
    assert_eq!(code, 200, "{idx}");
    let v: serde_json::Value = serde_json::from_str(&idx).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["version"].as_str().unwrap().to_string(),
                format!("{} {}", e["state"], e["reason"]),
            )
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn replicas_from_the_registry_follow_promotions_without_a_failed_request() {
    let Some(c) = super::cluster(1) else { return };
    let tmp = std::env::temp_dir().join(format!("ember-promote-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let (d1, d2) = (model_dir(&tmp, 1.0), model_dir(&tmp, 0.75));
    let url = c.url();
    let push = |d: &std::path::Path| {
        ok(&[
            "registry",
            "push",
            "--redis",
            &url,
            "--model",
            d.to_str().unwrap(),
            "--name",
            "fresh",
        ])
    };
    push(&d1);
    // What each version must score: its directory served from memory, every table in DRAM.
    let bodies: Vec<Vec<u8>> = (0..6u64).map(|s| tsv_rows(16, 700 + s)).collect();
    let want: Vec<Vec<String>> = [&d1, &d2]
        .iter()
        .map(|d| {
            let s = Server::start(&[
                "--grpc",
                "off",
                "--model",
                d.to_str().unwrap(),
                "--placement",
                "dram",
            ]);
            scores(&s, &bodies)
        })
        .collect();
    assert!(want[0].iter().zip(&want[1]).all(|(a, b)| a != b));

    // promote refuses what cannot be served.
    let (done, said) = version_cmd("promote", &url, "fresh", 9);
    assert!(!done && said.contains("no such version"), "{said}");
    promote(&url, 1);
    // `from`: the flag, its new name or its old one (kept for one release).
    let replica = |cache: Option<&std::path::Path>, from: &str| {
        let mut args = vec![
            "--grpc",
            "off",
            "--redis",
            &url,
            from,
            "fresh",
            "--poll-secs",
            "0.2",
        ];
        let dir;
        if let Some(d) = cache {
            dir = d.to_str().unwrap().to_string();
            args.extend(["--registry-cache", &dir]);
        }
        Server::start(&args)
    };
    let cache = tmp.join("cache-a");
    let a = replica(Some(&cache), "--from-registry");
    let b = replica(None, "--from-store");
    for s in [&a, &b] {
        assert_eq!(scores(s, &bodies), want[0], "a replica from the registry");
    }
    // Only the served version is fetched, the tables in memory with it (t3: 2048 x 16 f32).
    let fetched: Vec<String> = std::fs::read_dir(cache.join("fresh"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(fetched, ["1"]);
    let weights = std::fs::metadata(cache.join("fresh/1/model.safetensors")).unwrap();
    assert!(weights.len() > 2048 * 16 * 4, "{}", weights.len());

    // A new version is pushed: the promoted one stays served.
    push(&d2);
    let listed = ok(&["registry", "ls", "--redis", &url]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains("fresh") && l.contains(" 1 ") && l.contains("promoted")),
        "{listed}"
    );
    // A period in which v2 must NOT be served (four polls at 0.2 s), not a wait for a state.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(scores(&a, &bodies), want[0], "v2 served without promote");

    // Promote v2 while clients score on both replicas: every answer is exactly one version's,
    // none fails, and both replicas end on v2.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new((0usize, 0usize)));
    let clients: Vec<_> = [a.addr, b.addr]
        .into_iter()
        .map(|addr| {
            let (stop, seen, bodies, want) =
                (stop.clone(), seen.clone(), bodies.clone(), want.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % bodies.len();
                    let (code, got) = crate::server::request(
                        addr,
                        "POST",
                        "/v1/score",
                        "text/plain",
                        &bodies[k],
                        Duration::from_secs(10),
                    )
                    .expect("a request during the swap");
                    assert_eq!(code, 200, "a request failed during the swap: {got}");
                    let mut s = seen.lock().unwrap();
                    if got == want[0][k] {
                        s.0 += 1;
                    } else {
                        assert_eq!(got, want[1][k], "scores from neither version");
                        s.1 += 1;
                    }
                    i += 1;
                }
            })
        })
        .collect();
    wait_for("20 answers from v1 before the promotion", PATIENCE, || {
        seen.lock().unwrap().0 >= 20
    });
    let said = promote(&url, 2);
    assert!(said.contains("was version 1"), "{said}");
    for s in [&a, &b] {
        wait_for("v2 served", Duration::from_secs(20), || {
            served_version(s)
                .iter()
                .any(|v| v.0 == "2" && v.1.contains("READY"))
        });
    }
    // Both replicas serve v2: clients go on until v2 has answered them 20 more times.
    let swapped = seen.lock().unwrap().1;
    wait_for("20 answers from v2 after the swap", PATIENCE, || {
        seen.lock().unwrap().1 >= swapped + 20
    });
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client saw a failure");
    }
    let (old, new) = *seen.lock().unwrap();
    assert!(old > 0 && new > 0, "{old} answers from v1, {new} from v2");
    for s in [&a, &b] {
        assert_eq!(scores(s, &bodies), want[1]);
    }
    let fetched = || -> Vec<String> {
        std::fs::read_dir(cache.join("fresh"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    // They are removed once the swap is done, after the answers above.
    wait_for("the replaced version's files removed", PATIENCE, || {
        fetched() != ["1", "2"] && fetched() != ["2", "1"]
    });
    assert_eq!(fetched(), ["2"], "the replaced version's files stay behind");

    // The promoted version cannot be removed; v1 can be promoted back (a rollback).
    let (done, said) = version_cmd("rm", &url, "fresh", 2);
    assert!(!done && said.contains("served version"), "{said}");
    promote(&url, 1);
    wait_for("the rollback to v1", Duration::from_secs(20), || {
        scores(&a, &bodies) == want[0]
    });

    // A version that cannot be loaded (its dense weights damaged after the push, and promoted
    // behind promote's back) leaves v1 serving and is reported with the reason.
    push(&d2);
    let mut cl = crate::updates::admin(&url);
    let mut ops = remote::Ops::default();
    let dense = layout::file_key("fresh", 3, "dense");
    ops.push(
        dense.as_bytes(),
        ember_redis::cmd("SETRANGE")
            .arg(&dense)
            .arg(40)
            .arg("garbage"),
    );
    let served = layout::served_key("fresh");
    ops.push(
        served.as_bytes(),
        ember_redis::cmd("SET").arg(&served).arg(3),
    );
    cl.run(&ops, false, Instant::now() + Duration::from_secs(5))
        .unwrap();
    wait_for("v3 reported unavailable", Duration::from_secs(20), || {
        served_version(&a)
            .iter()
            .any(|v| v.0 == "3" && v.1.contains("UNAVAILABLE") && v.1.contains("CRC-32"))
    });
    assert_eq!(scores(&a, &bodies), want[0], "v1 goes on serving");
    let (done, said) = version_cmd("verify", &url, "fresh", 3);
    assert!(!done && said.contains("dense"), "{said}");
    let (done, said) = version_cmd("promote", &url, "fresh", 3);
    assert!(!done && said.contains("CRC-32"), "{said}");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A version pushed without its config and dense weights (by an older ember, or the library's
/// `push` without them) cannot be promoted, and a replica from the registry says why it cannot
/// start.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_version_without_its_dense_weights_is_refused() {
    let Some(c) = super::cluster(0) else { return };
    let mut cl = crate::updates::admin(&c.url());
    let t = ember_embed::EmbeddingTable::from_f32("t", 64, 4, ember_embed::DType::F32, &[0.5; 256])
        .unwrap();
    ember_registry::push(
        &mut cl,
        "bare",
        &[&t],
        &ember_registry::PushOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let url = c.url();
    let (done, said) = version_cmd("promote", &url, "bare", 1);
    assert!(
        !done && said.contains("pushed without its config.json"),
        "{said}"
    );
    let (done, said) = ember(&[
        "serve",
        "--grpc",
        "off",
        "--http",
        "127.0.0.1:0",
        "--redis",
        &url,
        "--from-registry",
        "bare",
    ]);
    assert!(
        !done && said.contains("pushed without its config.json"),
        "{said}"
    );
}
