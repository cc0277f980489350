//! `ember registry` and `ember bench remote` as a user runs them.

fn ember(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .output()
        .expect("running ember");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn registry_push_ls_verify_rm() {
    let Some(c) = super::cluster(0) else { return };
    let url = c.url();
    let model = super::default_model();
    let model = model.to_str().unwrap();
    let (ok, out, err) = ember(&[
        "registry",
        "push",
        "--redis",
        &url,
        "--model",
        model,
        "--replicas",
        "0",
        "--json",
    ]);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(
        (
            j["model"].as_str(),
            j["version"].as_u64(),
            j["resumed"].as_bool()
        ),
        (Some("default"), Some(1), Some(false))
    );
    assert!(j["bytes"].as_u64().unwrap() > 1 << 20);
    let (ok, out, err) = ember(&[
        "registry",
        "push",
        "--redis",
        &url,
        "--model",
        model,
        "--replicas",
        "0",
        "--name",
        "other",
    ]);
    assert!(
        ok && out.contains("other version 1 is ready") && out.contains("verified"),
        "{out}{err}"
    );
    let (ok, out, _) = ember(&["registry", "ls", "--redis", &url]);
    assert!(ok);
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" ready ")).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(out.contains("default") && out.contains("other"), "{out}");
    let (ok, out, err) = ember(&[
        "registry",
        "verify",
        "--redis",
        &url,
        "--model",
        "default",
        "--version",
        "1",
    ]);
    assert!(ok && out.contains("verified"), "{out}{err}");
    let (ok, out, err) = ember(&[
        "registry",
        "rm",
        "--redis",
        &url,
        "--model",
        "other",
        "--version",
        "1",
    ]);
    assert!(ok && out.contains("removed"), "{out}{err}");
    let (ok, _, err) = ember(&[
        "registry",
        "rm",
        "--redis",
        &url,
        "--model",
        "other",
        "--version",
        "1",
    ]);
    assert!(!ok && err.contains("no such version"), "{err}");
    let (_, out, _) = ember(&["registry", "ls", "--redis", &url]);
    assert!(!out.contains("other"), "{out}");
    // The old name, kept for one release, runs the same command.
    let (ok, old, err) = ember(&["store", "ls", "--redis", &url]);
    assert!(ok && old == out, "{old}{err}");
    // Bad input is named.
    let (ok, _, err) = ember(&["registry", "ls", "--redis", "redis://127.0.0.1:notaport"]);
    assert!(!ok && err.contains("not host:port"), "{err}");
    let (ok, _, err) = ember(&[
        "registry", "push", "--redis", &url, "--model", model, "--name", "a:b",
    ]);
    assert!(!ok && err.contains("cannot name a key"), "{err}");
}

#[test]
fn nothing_listening_is_a_clear_error_not_a_hang() {
    let t = std::time::Instant::now();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (ok, _, err) = ember(&[
        "registry",
        "ls",
        "--redis",
        &format!("redis://127.0.0.1:{port}"),
        "--timeout-s",
        "1",
    ]);
    assert!(!ok && err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn bench_remote_runs_every_policy_checked_against_dram() {
    // Takes the turn of a cluster (the benchmark starts its own).
    let Some(_turn) = super::cluster(0) else {
        return;
    };
    let (ok, out, err) = ember(&[
        "bench",
        "remote",
        "--tables",
        "2",
        "--rows",
        "3000",
        "--dim",
        "13",
        "--batch",
        "8",
        "--pooling",
        "4",
        "--batches",
        "3",
        "--runs",
        "2",
        "--layout-rows",
        "2000",
        "--loop-secs",
        "0.2",
        "--policies",
        "lru,lfu",
        "--cache-fractions",
        "1.0,0.1",
        "--primaries",
        "3",
        "--replicas",
        "0",
        "--huge-pages",
        "off",
        "--json",
    ]);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let p = j["policies"].as_array().unwrap();
    assert_eq!(p.len(), 4);
    assert!(
        p.iter().all(
            |r| r["checked_against_dram"] == true && r["lookups_per_s"].as_f64().unwrap() > 0.0
        )
    );
    assert!(j["dram_lookups_per_s"].as_f64().unwrap() > 0.0);
    let mem = j["push"]["memory_vs_raw"].as_f64().unwrap();
    assert!(mem > 0.5 && mem < 2.0, "{mem}");
    assert_eq!(j["layouts"].as_array().unwrap().len(), 6);
    assert!(j["ceiling"]["rows_per_s"].as_f64().unwrap() > 0.0);
}
