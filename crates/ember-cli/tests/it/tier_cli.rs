//! The SSD tier end to end: `ember convert` on a copy of the shipped model (in id order and laid
//! out by a profile), `ember predict` with every table on the tier (scores identical to DRAM, tier
//! counters in the JSON), and `ember bench tiered` on a small shape (JSON fields, the check against
//! DRAM, every policy, the laid-out files).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ember(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run ember");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ember-tier-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn json_of(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().expect("output")).expect("last line is JSON")
}

#[test]
fn convert_then_predict_on_the_tier_scores_like_dram() {
    let dir = tmp("model");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(repo().join("models/default").join(f), dir.join(f)).unwrap();
    }
    let d = dir.to_str().unwrap();
    let dram_scores = dir.join("dram.txt");
    let tier_scores = dir.join("tier.txt");
    let (ok, _, err) = ember(&[
        "predict",
        "--model",
        d,
        "--out",
        dram_scores.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    // Placing tables on ssd before converting names the fix.
    let (ok, _, err) = ember(&["predict", "--model", d, "--placement", "ssd"]);
    assert!(!ok && err.contains("ember convert"), "{err}");
    let (ok, _, err) = ember(&["convert", "--model", d, "--placement", "ssd", "--verify"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("verified") && err.contains("placed on ssd"),
        "{err}"
    );
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert_eq!(cfg.matches("\"placement\": \"ssd\"").count(), 26, "{cfg}");
    for (policy, depth) in [("lru", "0"), ("lfu", "1"), ("pinned", "2")] {
        let (ok, out, err) = ember(&[
            "predict",
            "--model",
            d,
            "--out",
            tier_scores.to_str().unwrap(),
            "--batch",
            "37",
            "--cache-mb",
            "1",
            "--cache-policy",
            policy,
            "--prefetch-depth",
            depth,
            "--json",
        ]);
        assert!(ok, "{policy}: {err}");
        assert_eq!(
            std::fs::read_to_string(&dram_scores).unwrap(),
            std::fs::read_to_string(&tier_scores).unwrap(),
            "{policy}: scores from the tier differ from DRAM"
        );
        let j = json_of(&out);
        let t = &j["tier"];
        assert!(t["hit_rate"].as_f64().unwrap() > 0.0, "{policy}: {t}");
        assert!(
            t["ssd_bytes_read"].as_u64().unwrap() >= 4096,
            "{policy}: {t}"
        );
        assert_eq!(t["prefetch_depth"].as_u64().unwrap().to_string(), depth);
        assert!(out.contains("SSD tier      hit rate"), "{out}");
    }
    // mmap placement also scores the same.
    let (ok, _, err) = ember(&[
        "predict",
        "--model",
        d,
        "--placement",
        "mmap",
        "--out",
        tier_scores.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read_to_string(&dram_scores).unwrap(),
        std::fs::read_to_string(&tier_scores).unwrap()
    );
    // Laid out by a profile (ids of the sample's first rows, some past small tables): the same
    // scores under every policy; the mmap placement is refused, naming the fix.
    let profile = dir.join("profile.txt");
    let ids: Vec<String> = (0..5000u64)
        .map(|i| ((i * 7919) % 40_000 / (1 + i % 3)).to_string())
        .collect();
    std::fs::write(&profile, ids.join("\n") + "\n").unwrap();
    let (ok, _, err) = ember(&[
        "convert",
        "--model",
        d,
        "--placement",
        "mmap",
        "--layout-profile",
        profile.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("needs the ssd placement"), "{err}");
    let (ok, _, err) = ember(&[
        "convert",
        "--model",
        d,
        "--placement",
        "ssd",
        "--layout-profile",
        profile.to_str().unwrap(),
        "--layout-hot-rows",
        "50",
        "--verify",
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("laid out by") && err.contains("50 hot rows by heat"),
        "{err}"
    );
    let f = ember_embed::rowfile::RowFile::open(&dir.join("rows/t3.rows")).unwrap();
    assert!(f.layout().is_some_and(|l| !l.is_identity()));
    for policy in ["lru", "pinned"] {
        let (ok, _, err) = ember(&[
            "predict",
            "--model",
            d,
            "--out",
            tier_scores.to_str().unwrap(),
            "--batch",
            "29",
            "--cache-mb",
            "1",
            "--cache-policy",
            policy,
        ]);
        assert!(ok, "{policy}: {err}");
        assert_eq!(
            std::fs::read_to_string(&dram_scores).unwrap(),
            std::fs::read_to_string(&tier_scores).unwrap(),
            "{policy}: scores from laid-out files differ from DRAM"
        );
    }
    let (ok, _, err) = ember(&["predict", "--model", d, "--placement", "mmap"]);
    assert!(!ok && err.contains("laid out by a profile"), "{err}");
    // A damaged row file stops predict with the file and block named.
    let rows = dir.join("rows/t3.rows");
    let mut bytes = std::fs::read(&rows).unwrap();
    let n = bytes.len();
    bytes[n - 4096 + 7] ^= 0xFF;
    std::fs::write(&rows, bytes).unwrap();
    let (ok, _, err) = ember(&["predict", "--model", d, "--cache-mb", "0"]);
    assert!(
        !ok && err.contains("t3.rows") && err.contains("fails its checksum"),
        "{err}"
    );
    // Bad flags.
    let (ok, _, err) = ember(&["predict", "--model", d, "--cache-policy", "mru"]);
    assert!(
        !ok && err.contains("'mru' is not lru, lfu or pinned"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn convert_from_safetensors_writes_every_float_table() {
    let dir = tmp("st");
    let (ok, _, err) = ember(&[
        "convert",
        "--safetensors",
        "models/default/model.safetensors",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    // Every table's rows equal the bytes the model loader puts in memory (subnormals flushed).
    let model =
        ember_model::Model::load(&repo().join("models/default"), Default::default()).unwrap();
    for t in model.embeddings().tables() {
        let f =
            ember_embed::rowfile::RowFile::open(&dir.join(format!("{}.rows", t.name()))).unwrap();
        assert_eq!(f.header().name, t.name());
        let mut bytes = vec![0u8; t.rows() * t.stride()];
        f.read_all(&mut bytes).unwrap();
        assert!(
            bytes == t.resident().unwrap(),
            "{}: rows differ from the loaded table",
            t.name()
        );
    }
    let (ok, _, err) = ember(&[
        "convert",
        "--safetensors",
        "Cargo.toml",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("not a safetensors file"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_tiered_reports_every_policy_against_dram_and_cold_mmap() {
    let dir = tmp("bench");
    let (ok, out, err) = ember(&[
        "bench",
        "tiered",
        "--tables",
        "3",
        "--rows",
        "20000",
        "--dim",
        "24",
        "--batch",
        "16",
        "--pooling",
        "20",
        "--batches",
        "4",
        "--runs",
        "2",
        "--ids",
        "zipf:1.05",
        "--cache-mb",
        "1",
        "--disk-secs",
        "0.2",
        "--mmap-runs",
        "1",
        "--dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    let policies = j["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 3);
    for p in policies {
        let h = p["hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&h), "{p}");
        assert!(p["lookups_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["ssd_bytes_read"].as_u64().unwrap() > 0, "{p}");
        assert!((0.0..=1.0).contains(&p["overlap"].as_f64().unwrap()), "{p}");
        assert!(p["cache_bytes_used"].as_u64().unwrap() <= 1 << 20, "{p}");
        // Each timed run paired with a DRAM run of the same batches: one ratio per run.
        let pairs = p["run_vs_dram"].as_array().unwrap();
        assert_eq!(pairs.len(), 2, "{p}");
        assert!(pairs.iter().all(|r| r.as_f64().unwrap() > 0.0), "{p}");
        assert!(p["vs_dram_paired"].as_f64().unwrap() > 0.0, "{p}");
        // The counters cover the timed runs only (2 runs x 4 batches), not the untimed runs
        // of the batches before each.
        assert_eq!(p["batches_staged"], 8, "{p}");
    }
    assert!(j["ratio_to_dram_paired"].as_f64().unwrap() > 0.0, "{j}");
    for k in [
        "hit_rate",
        "ssd_bytes_read",
        "overlap",
        "lookups_per_s",
        "dram_lookups_per_s",
        "mmap_cold_lookups_per_s",
        "disk_reads_per_s",
    ] {
        assert!(!j[k].is_null(), "{k} missing: {j}");
    }
    assert_eq!(j["checked_against_dram"], true);
    assert!(out.contains("equals the DRAM tables' bit for bit"), "{out}");
    // The budgeted mmap ran in a memory cgroup where this user may create one (root), or was
    // skipped with a note.
    assert!(
        !j["mmap_budget_lookups_per_s"].is_null()
            || err.contains("mmap with the cache budget: skipped"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// With a trace, `bench tiered` also runs the laid-out files: their policy is checked against
/// DRAM like the others, and the ratio to the row-ordered files and the bytes used per byte read
/// are reported.
#[test]
fn bench_tiered_runs_files_laid_out_by_the_trace() {
    let dir = tmp("bench-layout");
    let trace = dir.join("trace.txt");
    // Some ids repeat (hot), the rest are met once in a row, as a skewed trace is.
    let ids: Vec<String> = (0..20_000u64)
        .map(|i| {
            if i % 3 == 0 {
                i % 97
            } else {
                (i * 31) % 15_000
            }
            .to_string()
        })
        .collect();
    std::fs::write(&trace, ids.join("\n") + "\n").unwrap();
    let (ok, out, err) = ember(&[
        "bench",
        "tiered",
        "--tables",
        "2",
        "--rows",
        "15000",
        "--dim",
        "24",
        "--batch",
        "16",
        "--pooling",
        "20",
        "--batches",
        "4",
        "--runs",
        "2",
        "--ids",
        trace.to_str().unwrap(),
        "--cache-mb",
        "1",
        "--policies",
        "lru,pinned",
        "--layout-policies",
        "pinned,lfu",
        "--disk-secs",
        "0.2",
        "--no-mmap",
        "--dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    let policies = j["policies"].as_array().unwrap();
    let labels: Vec<&str> = policies
        .iter()
        .map(|p| p["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["lru", "pinned", "pinned, laid out", "lfu, laid out"],
        "{j}"
    );
    for p in policies {
        let used = p["useful_bytes_per_byte_read"].as_f64().unwrap();
        assert!(used > 0.0 && used <= 1.0, "{p}");
        assert_eq!(
            p["layout"].is_null(),
            !p["label"].as_str().unwrap().contains("laid out")
        );
    }
    let hot = &policies[2]["layout"];
    assert_eq!(hot["hot_rows"], (1 << 20) / 2 / 96, "{hot}");
    assert!(j["ratio_layout_to_id_order"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["checked_against_dram"], true);
    assert!(err.contains("layout: "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
