//! An HSTU model's tables on the Redis Cluster tier and on the SSD tier, as a user puts them
//! there: `ember registry push` (and the registry's fetch, as `serve --from-registry` does it),
//! `ember convert --placement ssd`; `ember predict` must score every user exactly as with the
//! tables in memory.

use std::path::{Path, PathBuf};

use ember_bench::stats::median;
use ember_model::registry::RegistryModel;

/// A copy of `ember-model`'s `hstu_small` fixture (a DlrmHSTU of the reference, exported), in a
/// directory of its own named `hstu_small` (the name the registry gives it).
fn fixture_copy(dir: &Path) -> PathBuf {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ember-model/tests/fixtures/hstu_small");
    let dst = dir.join("hstu_small");
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["config.json", "model.safetensors", "users.jsonl"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    dst
}

/// `ember predict` of the model's users with `extra` flags: the scores file's text.
fn predict(model: &Path, out: &Path, extra: &[&str]) -> String {
    crate::predict_file(model, "users.jsonl", out, extra)
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn hstu_tables_on_the_redis_and_ssd_tiers_score_as_in_memory() {
    let Some(c) = super::cluster(0) else { return };
    let url = c.url();
    let tmp = std::env::temp_dir().join(format!("ember-hstu-tiers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let model = fixture_copy(&tmp);
    let m = model.to_str().unwrap();
    let dram = predict(&model, &tmp.join("dram.jsonl"), &[]);
    assert_eq!(dram.lines().count(), 8, "{dram}");

    let out = crate::ok(&[
        "registry",
        "push",
        "--redis",
        &url,
        "--model",
        m,
        "--replicas",
        "0",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(j["model"].as_str(), Some("hstu_small"), "{out}");
    assert_eq!(j["tables"].as_u64(), Some(3), "{out}");
    let out = crate::ok(&[
        "registry",
        "verify",
        "--redis",
        &url,
        "--model",
        "hstu_small",
        "--version",
        "1",
    ]);
    assert!(out.contains("verified"), "{out}");

    // Every table read from the cluster.
    let remote = predict(
        &model,
        &tmp.join("remote.jsonl"),
        &["--placement", "remote", "--redis", &url],
    );
    assert_eq!(
        remote, dram,
        "scores with the tables on the Redis Cluster tier"
    );

    // The version fetched from the registry alone (config and dense weights as pushed, every
    // table placed remote), as `serve --from-registry` builds it.
    let mut reg = RegistryModel::connect(&url, "hstu_small").unwrap();
    let version = reg.target().unwrap();
    let fetched = tmp.join("fetched");
    reg.fetch(version, &fetched).unwrap();
    std::fs::copy(model.join("users.jsonl"), fetched.join("users.jsonl")).unwrap();
    let config = std::fs::read_to_string(fetched.join("config.json")).unwrap();
    assert!(
        config.contains("\"family\": \"hstu\"") && config.contains("\"remote\""),
        "{config}"
    );
    let from_registry = predict(&fetched, &tmp.join("fetched.jsonl"), &[]);
    assert_eq!(
        from_registry, dram,
        "scores of the version fetched from the registry"
    );

    // Row files on the SSD tier (`ember convert`), cold and then from the tier's cache.
    crate::ok(&["convert", "--model", m, "--placement", "ssd"]);
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    assert!(config.contains("\"ssd\""), "{config}");
    let ssd = predict(&model, &tmp.join("ssd.jsonl"), &[]);
    assert_eq!(ssd, dram, "scores with the tables on the SSD tier");
    // With the tier's flags: a 1 MiB cache of the other policy, rows read through the mapping.
    let flags = ["--cache-mb", "1", "--cache-policy", "lfu", "--io", "mmap"];
    let small = predict(&model, &tmp.join("ssd_small.jsonl"), &flags);
    assert_eq!(small, dram, "scores with the SSD tier's flags");
    // The flags reach the tier: a pin trace that does not exist is refused, naming it.
    let users = model.join("users.jsonl");
    let (ok, text) = super::ember(&[
        "predict",
        "--model",
        m,
        "--data",
        users.to_str().unwrap(),
        "--cache-policy",
        "pinned",
        "--pin-trace",
        "/nonexistent/ids.trace",
    ]);
    assert!(!ok && text.contains("/nonexistent/ids.trace"), "{text}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// The embedding lookups of a 4,096-item history (and 512 candidates) of MLPerf DLRMv3's model
/// (tables scaled by 1e-4: 100,000 x 512 item rows in f16), per user, from DRAM, from the SSD
/// tier (row files read with direct I/O, an 8 MiB row cache: cold at each run's start) and
/// from a local 3-node Redis Cluster: `ember predict --batch 1 --threads 2 --json`'s lookup
/// time over 4 users, median of 3 runs each. Prints the table of `docs/hstu.md`.
#[test]
#[ignore = "a figure: bench/hstu_tiers.sh"]
fn figure_hstu_lookups_by_tier() {
    let Some(c) = super::cluster(0) else { return };
    let url = c.url();
    let tmp = std::env::temp_dir().join(format!("ember-hstu-tier-fig-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let dir = tmp.join("dlrmv3");
    let d = dir.to_str().unwrap();
    crate::ok(&[
        "data",
        "model",
        "--preset",
        "dlrm-v3",
        "--rows-scale",
        "1e-4",
        "--dtype",
        "f16",
        "--out",
        d,
    ]);
    let users = tmp.join("users.jsonl");
    let u = users.to_str().unwrap();
    crate::ok(&[
        "data",
        "users",
        "--model",
        d,
        "--users",
        "4",
        "--history",
        "4096",
        "--candidates",
        "512",
        "--out",
        u,
    ]);
    crate::ok(&[
        "registry",
        "push",
        "--redis",
        &url,
        "--model",
        d,
        "--replicas",
        "0",
    ]);
    crate::ok(&["convert", "--model", d, "--placement", "ssd"]);
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["tier"] = serde_json::json!({"cache_mb": 8});
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let mut rows = Vec::new();
    for (name, extra) in [
        ("DRAM", vec!["--placement", "dram"]),
        ("SSD tier", vec![]),
        (
            "Redis Cluster tier",
            vec!["--placement", "remote", "--redis", &url],
        ),
    ] {
        let runs: Vec<(f64, f64)> = (0..3)
            .map(|_| {
                let mut args = vec![
                    "predict",
                    "--model",
                    d,
                    "--data",
                    u,
                    "--batch",
                    "1",
                    "--threads",
                    "2",
                    "--json",
                ];
                args.extend_from_slice(&extra);
                let out = crate::ok(&args);
                let line = out
                    .lines()
                    .find(|l| l.starts_with('{'))
                    .expect("a JSON line");
                let j: serde_json::Value = serde_json::from_str(line).unwrap();
                let n = j["users"].as_f64().unwrap();
                let s = &j["stage_s"];
                (
                    s["lookups"].as_f64().unwrap() / n * 1e3,
                    s["wall"].as_f64().unwrap() / n * 1e3,
                )
            })
            .collect();
        let (lookups, wall): (Vec<f64>, Vec<f64>) = runs.iter().copied().unzip();
        let (lookups, wall) = (median(&lookups), median(&wall));
        rows.push((name, lookups, wall));
    }
    let dram = rows[0].1;
    println!("| tables | lookups ms / user | x DRAM | whole pass ms / user |");
    println!("|---|---|---|---|");
    for (name, lookups, wall) in &rows {
        println!(
            "| {name} | {lookups:.2} | {:.1}x | {wall:.1} |",
            lookups / dram.max(1e-9)
        );
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}
