//! `ember serve --tls-cert --tls-key --tls-client-ca` measured by `ember loadgen` over TLS
//! (`https://` and `grpcs://`, both gRPC clients), with a test CA made here; and the refusals
//! of each side: an https URL without the CA, a client without its certificate, a client CA
//! without the server's own certificate.

use std::path::PathBuf;
use std::process::Command;

#[path = "../shared/pki.rs"]
mod pki;
use pki::make_pki;

use crate::serve_cli::{Started, start_server};

fn loadgen(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("loadgen")
        .args([
            "--qps",
            "150",
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--json",
        ])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn loadgen_measures_a_server_over_mutual_tls() {
    let dir: PathBuf = std::env::temp_dir().join(format!("ember-tls-cli-{}", std::process::id()));
    make_pki(&dir);
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let Started {
        mut child,
        addr,
        grpc,
        line,
        ..
    } = start_server(&[
        "--tls-cert",
        &f("server.pem"),
        "--tls-key",
        &f("server.key"),
        "--tls-client-ca",
        &f("ca.pem"),
    ]);
    assert!(line.contains("https://") && line.contains(&addr), "{line}");
    let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
    let https = format!("https://localhost:{}", port(&addr));
    let grpcs = format!("grpcs://localhost:{}", port(&grpc));
    let (ca, cert, key) = (f("ca.pem"), f("client.pem"), f("client.key"));
    let id = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    for (protocol, url, client) in [
        ("http", &https, "lean"),
        ("grpc", &grpcs, "lean"),
        ("grpc", &grpcs, "tonic"),
    ] {
        let mut args = vec![
            "--protocol",
            protocol,
            "--url",
            url,
            "--grpc-client",
            client,
        ];
        args.extend(id);
        let (ok, stdout, stderr) = loadgen(&args);
        assert!(ok, "{protocol} {client}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(v["errors"], 0, "{protocol} {client}: {v}");
        let answered = v["ok"].as_u64().unwrap();
        assert!(
            (80..=230).contains(&answered),
            "{protocol} {client}: {answered} answered"
        );
    }
    // An https URL without the CA; a plain URL to the TLS port; no client certificate.
    let (ok, _, err) = loadgen(&["--url", &https]);
    assert!(!ok && err.contains("needs --tls-ca"), "{err}");
    let (ok, _, err) = loadgen(&["--url", &format!("http://{addr}")]);
    assert!(!ok && err.contains("400"), "{err}");
    let (ok, _, err) = loadgen(&["--url", &https, "--tls-ca", &ca]);
    assert!(!ok && err.contains("asking"), "{err}");
    child.kill().unwrap();
    child.wait().unwrap();
    // A client CA without the server's own certificate.
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--http", "127.0.0.1:0", "--tls-client-ca", &ca])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--tls-client-ca needs --tls-cert"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
