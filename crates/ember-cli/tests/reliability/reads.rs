//! Every file a user names is a regular file read within a stated limit: devices, FIFOs and
//! directories are refused at once with an error naming what they are; oversize configs are
//! refused from their size; an endless line stops at the line limit; a config of 10^6 features
//! loads in time linear in its size.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ember(args: &[&str]) -> (bool, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), text, t.elapsed())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory of one test, removed when dropped, whether the test passed or not (each held a
/// copy of the model: runs left hundreds of MB in the temporary directory).
struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tmp(name: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("ember-reads-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

/// A copy of the shipped model whose `config.json` is replaced by `make(path)`.
fn model_with_config(name: &str, make: impl FnOnce(&Path)) -> TmpDir {
    let d = tmp(name);
    std::fs::copy(
        root().join("models/default/model.safetensors"),
        d.join("model.safetensors"),
    )
    .unwrap();
    make(&d.join("config.json"));
    d
}

#[test]
fn devices_fifos_and_directories_are_refused_at_once() {
    let model = root().join("models/default");
    let model = model.to_str().unwrap();
    // predict --data /dev/zero used to read until memory ran out.
    let (ok, err, took) = ember(&["predict", "--model", model, "--data", "/dev/zero"]);
    assert!(
        !ok && err.contains("the data file is a character device"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10));
    let d = tmp("fifo");
    let fifo = d.join("data.tsv");
    mkfifo(&fifo);
    let (ok, err, _) = ember(&[
        "predict",
        "--model",
        model,
        "--data",
        fifo.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("FIFO"), "{err}");
    let (ok, err, _) = ember(&["predict", "--model", model, "--data", d.to_str().unwrap()]);
    assert!(!ok && err.contains("directory"), "{err}");
    // A config that is a FIFO (no writer: opening it would block) or a directory.
    let m = model_with_config("cfg-fifo", mkfifo);
    let (ok, err, took) = ember(&["predict", "--model", m.to_str().unwrap(), "--data", "-"]);
    assert!(!ok && err.contains("the model config is a FIFO"), "{err}");
    assert!(took < Duration::from_secs(10));
    let m = model_with_config("cfg-dir", |p| std::fs::create_dir(p).unwrap());
    let (ok, err, _) = ember(&["predict", "--model", m.to_str().unwrap(), "--data", "-"]);
    assert!(
        !ok && err.contains("the model config is a directory"),
        "{err}"
    );
    // Weights and pinned-row traces too.
    let m = model_with_config("weights-fifo", |p| {
        std::fs::copy(root().join("models/default/config.json"), p).unwrap();
    });
    std::fs::remove_file(m.join("model.safetensors")).unwrap();
    mkfifo(&m.join("model.safetensors"));
    let (ok, err, _) = ember(&["predict", "--model", m.to_str().unwrap(), "--data", "-"]);
    assert!(!ok && err.contains("the weights file is a FIFO"), "{err}");
}

#[test]
fn an_oversize_config_and_an_endless_line_are_refused() {
    // 300 MiB of holes: refused from its size, not read.
    let m = model_with_config("cfg-big", |p| {
        std::fs::File::create(p)
            .unwrap()
            .set_len(300 << 20)
            .unwrap();
    });
    let (ok, err, took) = ember(&["predict", "--model", m.to_str().unwrap(), "--data", "-"]);
    assert!(!ok && err.contains("over the limit of 256.0 MiB"), "{err}");
    assert!(took < Duration::from_secs(10));
    // stdin of zeros: one endless line, stopped at 1 MiB.
    let model = root().join("models/default");
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["predict", "--model", model.to_str().unwrap(), "--data", "-"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("longer than 1048576 bytes"),
        "{err}"
    );
}

/// A model of `f` features over one table (cat interaction), written as Ember's format.
fn many_features(f: usize) -> TmpDir {
    let d = tmp(&format!("features-{f}"));
    let features: Vec<_> = (0..f)
        .map(|i| serde_json::json!({"name": format!("f{i}"), "table": "t0"}))
        .collect();
    let cfg = serde_json::json!({
        "format": "ember-dlrm", "format_version": 1, "family": "dlrm", "dense_in": 1,
        "bottom_mlp": [], "interaction": {"kind": "cat"}, "top_mlp": [1],
        "tables": [{"name": "t0", "rows": 4, "dim": 1, "dtype": "f32"}],
        "features": features,
    });
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    let w = vec![0u8; 4 * (1 + f)];
    let b = [0u8; 4];
    let t = [0u8; 16];
    let views = [
        ("top_mlp.0.weight", vec![1, 1 + f], &w[..]),
        ("top_mlp.0.bias", vec![1], &b[..]),
        ("tables.t0", vec![4, 1], &t[..]),
    ];
    let tensors: Vec<(&str, safetensors::tensor::TensorView)> = views
        .iter()
        .map(|(n, shape, data)| {
            let v =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (*n, v)
        })
        .collect();
    safetensors::serialize_to_file(tensors, None, &d.join("model.safetensors")).unwrap();
    d
}

/// Seconds until `ember serve --model dir` answers.
fn load_seconds(dir: &Path) -> f64 {
    let t = Instant::now();
    let s = crate::server::Server::start(&["--model", dir.to_str().unwrap(), "--grpc", "off"]);
    let took = t.elapsed().as_secs_f64();
    assert_eq!(
        s.request("GET", "/v2/health/ready", "", b"").unwrap().0,
        200
    );
    took
}

#[test]
fn a_config_of_a_million_features_loads_in_linear_time() {
    let small = load_seconds(&many_features(100_000));
    let large = load_seconds(&many_features(1_000_000));
    eprintln!("10^5 features: {small:.2} s, 10^6: {large:.2} s");
    // Quadratic checks took 36 s at 10^5 (about an hour at 10^6); linear ones ~10x per 10x.
    assert!(large < 60.0, "10^6 features took {large:.1} s");
    assert!(
        large < 40.0 * small.max(0.05),
        "{large:.2} s vs {small:.2} s for 10x fewer"
    );
}
