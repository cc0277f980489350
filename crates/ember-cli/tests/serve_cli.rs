//! `ember serve` as a user runs it: the binary on a free port, scored over HTTP, stopped with
//! SIGTERM while requests are in flight (they are answered; the exit code is 0).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn serve_scores_tsv_and_stops_cleanly_on_sigterm() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--http", "127.0.0.1:0", "--max-delay-us", "300000"])
        .current_dir(std::env::temp_dir())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    // "serving model 'default' on http://127.0.0.1:PORT  (..."
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    assert!(line.contains("model 'default'"), "{line}");
    let rows = std::fs::read_to_string(root.join("data/sample.tsv")).unwrap();
    let rows: Vec<String> = rows.lines().take(3).map(String::from).collect();
    // Three requests that wait in a forming batch (max delay 300 ms) when SIGTERM arrives.
    let inflight: Vec<_> = rows
        .iter()
        .map(|r| {
            let (a, r) = (addr.clone(), r.clone());
            std::thread::spawn(move || post(&a, "/v1/score", &r))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    for t in inflight {
        let (status, body) = t.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let score: f32 = body.trim().parse().unwrap();
        assert!((0.0..=1.0).contains(&score));
    }
    let code = child.wait().unwrap();
    assert!(code.success(), "exit status {code}");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
}
