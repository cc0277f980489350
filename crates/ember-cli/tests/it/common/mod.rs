//! Helpers shared by the end-to-end tests of the `ember` binary (each test file uses some).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::Command;

/// Runs `ember args` in the current directory: (success, stdout, stderr).
pub fn ember(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .output()
        .expect("run ember");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The JSON object a `--json` run prints as its last line.
pub fn json_of(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().expect("output")).expect("last line is JSON")
}

/// POSTs `body` to `path` on `addr` over a fresh HTTP/1.1 connection: (status, body).
pub fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    post_with(addr, path, "", body)
}

/// As [`post`], with `headers` (each ending in CRLF).
pub fn post_with(addr: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
