//! Helpers shared by the end-to-end tests of the `ember` binary (each test file uses some).
#![allow(dead_code)]

use std::io::{BufRead, Read, Write};
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

/// GETs `path` on `addr` over a fresh HTTP/1.1 connection: the whole response, head and body.
pub fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    resp
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

/// Reads a starting `ember serve`'s stderr up to the line that names its HTTP address
/// ("... on http://127.0.0.1:PORT ...", or https://): (its `host:port`, that line, the lines
/// before it).
pub fn address_line(err: &mut impl BufRead) -> (String, String, Vec<String>) {
    let mut line = String::new();
    let mut before = Vec::new();
    for _ in 0..64 {
        if !line.is_empty() {
            before.push(std::mem::take(&mut line));
        }
        if err.read_line(&mut line).unwrap() == 0
            || line.contains("http://")
            || line.contains("https://")
        {
            break;
        }
    }
    let addr = line
        .split(" on http://")
        .nth(1)
        .or_else(|| line.split(" on https://").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (addr, line, before)
}

/// `ember serve ARGS --http 127.0.0.1:0 --grpc off`, killed when dropped (a failing test
/// leaves no server running).
pub struct Served {
    pub child: std::process::Child,
    /// Its HTTP `host:port`.
    pub addr: String,
}

pub fn serve(args: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "off"])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let (addr, _, _) = address_line(&mut err);
    Served { child, addr }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `.npy` array, as NumPy writes it (format 1.0, header padded to 64 bytes).
pub fn npy(descr: &str, shape: &[usize], bytes: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((h.len() as u16).to_le_bytes());
    out.extend(h.as_bytes());
    out.extend(bytes);
    out
}
