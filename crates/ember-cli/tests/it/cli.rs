//! The `ember` binary end to end: `bench embed` on small shapes, its JSON, its .npy output, and
//! its errors for bad flags.

use crate::common;
use common::{ember, json_of};

const SMALL: [&str; 12] = [
    "bench",
    "embed",
    "--tables",
    "3",
    "--rows",
    "5000",
    "--dim",
    "24",
    "--batches",
    "4",
    "--runs",
    "2",
];

#[test]
fn bench_embed_reports_json_for_every_dtype() {
    for dtype in ["f32", "f16", "bf16", "int8", "int4"] {
        let mut args = SMALL.to_vec();
        args.extend([
            "--dtype",
            dtype,
            "--json",
            "--pooling",
            "7",
            "--batch",
            "5",
            "--threads",
            "2",
        ]);
        let (ok, out, err) = ember(&args);
        assert!(ok, "{dtype}: {err}");
        assert!(out.contains("check: matches the reference"), "{out}");
        let j = json_of(&out);
        for k in [
            "lookups_per_s",
            "gb_per_s",
            "ns_per_lookup",
            "ceiling_lookups_per_s",
            "unique_ratio",
        ] {
            assert!(j[k].as_f64().unwrap() > 0.0, "{dtype}: {k} in {j}");
        }
        assert_eq!(j["threads"], 2);
        assert_eq!(j["dtype"], dtype);
        assert_eq!(j["dedup"], "auto");
        assert_eq!(j["tables"], 3);
        assert_eq!(j["pooling"], 7);
        let lps = j["lookups_per_s"].as_f64().unwrap();
        let gbps = j["gb_per_s"].as_f64().unwrap();
        let row = j["row_bytes"].as_f64().unwrap();
        assert!(
            (gbps - lps * row / 1e9).abs() <= 1e-6 * gbps,
            "gb_per_s is logical bytes"
        );
        if dtype == "f32" {
            assert!(j["quant_rel_error"].is_null());
        } else {
            let e = j["quant_rel_error"].as_f64().unwrap();
            assert!(e > 0.0 && e < 0.2, "{dtype}: {e}");
        }
    }
}

#[test]
fn presets_are_overridden_by_flags_and_modes_work() {
    let (ok, out, err) = ember(&[
        "bench",
        "embed",
        "--preset",
        "rm2",
        "--tables",
        "2",
        "--rows",
        "1000",
        "--batches",
        "2",
        "--runs",
        "1",
        "--mode",
        "weighted_sum",
        "--ids",
        "zipf:1.1",
        "--dedup",
        "on",
        "--json",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    assert_eq!(
        (
            j["dim"].as_u64(),
            j["pooling"].as_u64(),
            j["tables"].as_u64()
        ),
        (Some(128), Some(120), Some(2))
    );
    assert_eq!(j["mode"], "weighted_sum");
    assert!(j["unique_ratio"].as_f64().unwrap() < 0.9, "zipf ids repeat");
    assert_eq!(j["deduped_fraction"].as_f64(), Some(1.0));
}

#[test]
fn trace_replay_and_npy_ids() {
    let dir = std::env::temp_dir().join(format!("ember-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.txt");
    std::fs::write(
        &trace,
        (0..100)
            .map(|i| format!("{}\n", (i * 37) % 6000))
            .collect::<String>(),
    )
    .unwrap();
    let npy = dir.join("ids.npy");
    let mut args = SMALL.to_vec();
    let (t, n) = (trace.to_str().unwrap(), npy.to_str().unwrap());
    args.extend([
        "--ids",
        t,
        "--save-ids",
        n,
        "--pooling",
        "3",
        "--batch",
        "2",
        "--json",
    ]);
    let (ok, out, err) = ember(&args);
    assert!(ok, "{err}");
    assert!(json_of(&out)["ids"].as_str().unwrap().contains("trace"));
    let bytes = std::fs::read(&npy).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(
        header.contains("'shape': (4, 3, 6)") && header.contains("<u4"),
        "{header}"
    );
    assert_eq!((10 + hlen) % 64, 0);
    let ids: Vec<u32> = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ids.len(), 4 * 3 * 6);
    // Ids >= 5000 rows are dropped from the replay; table 0 starts at the beginning of the trace.
    let expected: Vec<u32> = (0..100)
        .map(|i| (i * 37) % 6000)
        .filter(|&x| x < 5000)
        .take(6)
        .collect();
    assert_eq!(&ids[..6], &expected[..]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_flags_are_clear_errors() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["bench", "embed", "--dtype", "int3"],
            "unknown dtype 'int3'",
        ),
        (
            &["bench", "embed", "--ids", "/no/such/trace"],
            "/no/such/trace",
        ),
        (&["bench", "embed", "--ids", "zipf:abc"], "not a number"),
        (
            &[
                "bench",
                "embed",
                "--rows",
                "1000000000000",
                "--tables",
                "1000",
            ],
            "memory is available",
        ),
        (
            &["bench", "embed", "--dim", "0"],
            "--dim must be at least 1",
        ),
    ];
    for (args, needle) in cases {
        let (ok, _, err) = ember(args);
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn replays_the_production_trace_when_present() {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/traces/reuse_medium_table_500K.txt");
    if !trace.exists() {
        eprintln!(
            "skipping: {} is absent (it ships beside the repository, not in it)",
            trace.display()
        );
        return;
    }
    let t = trace.to_str().unwrap();
    let (ok, out, err) = ember(&[
        "bench",
        "embed",
        "--tables",
        "4",
        "--rows",
        "500000",
        "--dim",
        "16",
        "--batches",
        "8",
        "--runs",
        "1",
        "--ids",
        t,
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("check: matches the reference"), "{out}");
    let j = json_of(&out);
    // 64 x 80 consecutive trace ids hold ~44% distinct rows (measured on the file: 0.438).
    let u = j["unique_ratio"].as_f64().unwrap();
    assert!((0.38..0.50).contains(&u), "unique ratio {u}");
}

/// `--device cuda` where it cannot run (a build without the `cuda` feature, or no driver or
/// device) fails with a message that says what is missing, for every command that takes it;
/// where a GPU is present it runs, and `bench embed` reports every variant.
#[test]
fn device_cuda_runs_or_says_what_is_missing() {
    let cases: Vec<Vec<&str>> = vec![
        [
            SMALL.as_slice(),
            &["--device", "cuda", "--json", "--profile-batches", "2"],
        ]
        .concat(),
        vec![
            "bench", "model", "--preset", "small", "--iters", "3", "--warmup", "1", "--device",
            "cuda",
        ],
        vec!["predict", "--device", "cuda"],
    ];
    for args in cases {
        let (ok, out, err) = ember(&args);
        if ok {
            if args[1] == "embed" {
                let j = json_of(&out);
                assert_eq!(j["variants"].as_array().map(Vec::len), Some(6), "{out}");
            }
            continue;
        }
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains("--features cuda")
                || err.contains("no CUDA device")
                || err.contains("NVRTC"),
            "{args:?}: {err}"
        );
    }
    // A bad variant name is refused by name (before any device is touched where CUDA is built).
    let (ok, _, err) =
        ember(&[&SMALL[..], &["--device", "cuda", "--variants", "fastest"]].concat());
    assert!(!ok);
    assert!(
        err.contains("fastest") || err.contains("--features cuda"),
        "{err}"
    );
}

/// The registry's old names, kept for one release, parse as the new ones: `ember store ...` as
/// `ember registry ...`, and `--from-store`, `--store-cache`, `--store-model`,
/// `--store-version` as `--from-registry`, `--registry-cache`, `--registry-model`,
/// `--registry-version` (the same arguments: giving both spellings is refused).
#[test]
fn the_registry_s_old_names_still_parse() {
    let parse = |line: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(line.split_whitespace())
            .env("EMBER_PARSE_ONLY", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), err)
    };
    const R: &str = "--redis redis://127.0.0.1:7000";
    let lines = [
        (format!("registry ls {R}"), format!("store ls {R}")),
        (
            format!("registry promote {R} --model m --version 2"),
            format!("store promote {R} --model m --version 2"),
        ),
        (
            format!("serve {R} --from-registry m --registry-cache /tmp/c --poll-secs 1"),
            format!("serve {R} --from-store m --store-cache /tmp/c --poll-secs 1"),
        ),
        (
            format!("serve --placement remote {R} --registry-model m --registry-version 3"),
            format!("serve --placement remote {R} --store-model m --store-version 3"),
        ),
        // The planner's cost model (`--profile` before).
        (
            "plan eval --tasks 1 --cost-model m.json".to_string(),
            "plan eval --tasks 1 --profile m.json".to_string(),
        ),
    ];
    for (new, old) in &lines {
        let (ok, err) = parse(new);
        assert!(ok, "{new}: {err}");
        let (ok, err) = parse(old);
        assert!(ok, "{old}: {err}");
    }
    let (ok, err) = parse(&format!("serve {R} --from-store m --from-registry m"));
    assert!(!ok && err.contains("--from-registry"), "{err}");
    // The help names the new word and the old one as its alias.
    let (ok, out, err) = ember(&["--help"]);
    assert!(
        ok && out.contains("registry") && out.contains("store"),
        "{out}{err}"
    );
    let (ok, out, err) = ember(&["store", "--help"]);
    assert!(ok && out.contains("promote"), "{out}{err}");
}

/// An error is said once, with its cause: `EMBER_DENSE_ISA` naming no family names the option
/// once (its reason was wrapped in the same option's words twice, through a cached string).
#[test]
fn a_bad_dense_isa_is_said_once() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("predict")
        .env("EMBER_DENSE_ISA", "tiles")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run ember");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("bad option EMBER_DENSE_ISA: 'tiles' is not one of emulated, avx512, amx"),
        "{err}"
    );
    assert_eq!(err.matches("EMBER_DENSE_ISA").count(), 1, "{err}");
}
