//! Overload sheds: with more requests than the model can run, those expected to wait past the
//! queue-delay bound are refused at once with 503 naming why, the accepted ones wait about the
//! bound, and the in-flight byte budget refuses bodies past it. A fresh server takes a burst
//! at once (it is warmed, and its admission model starts from the warm batches).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::server::{Server, metric_in, request, tsv_rows};

#[test]
fn overload_is_refused_at_once_and_the_accepted_wait_about_the_bound() {
    let s = Server::start(&[
        "--grpc",
        "off",
        "--max-queue-delay-ms",
        "5",
        "--threads",
        "1",
    ]);
    let body = Arc::new(tsv_rows(256, 7));
    let stop = Arc::new(AtomicBool::new(false));
    // 32 clients in closed loops, each a 256-sample request at a time: far more than one
    // forward thread runs within 5 ms.
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let (addr, body, stop) = (s.addr, body.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut ok, mut refused) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let r = request(
                        addr,
                        "POST",
                        "/v1/score",
                        "text/plain",
                        &body,
                        Duration::from_secs(10),
                    );
                    let d = t.elapsed();
                    match r {
                        Some((200, _)) => ok.push(d),
                        Some((503, b)) => {
                            assert!(
                                b.contains("expected wait") && b.contains("--max-queue-delay-ms"),
                                "{b}"
                            );
                            refused.push(d);
                        }
                        other => panic!("unexpected answer under overload: {other:?}"),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let started = Instant::now();
    let head_only = refused_on_its_head(s.addr, Duration::from_secs(10));
    // The load's length, not a wait for a state.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(started.elapsed()));
    stop.store(true, Ordering::Relaxed);
    assert!(
        head_only,
        "no request whose body never came was refused on its head (503, Connection: close)"
    );
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for c in clients {
        let (o, r) = c.join().unwrap();
        ok.extend(o);
        refused.extend(r);
    }
    ok.sort();
    refused.sort();
    eprintln!(
        "overload: {} accepted (p50 {:?}), {} refused (p50 {:?})",
        ok.len(),
        ok.get(ok.len() / 2),
        refused.len(),
        refused.get(refused.len() / 2)
    );
    assert!(!ok.is_empty(), "nothing was accepted");
    assert!(!refused.is_empty(), "nothing was refused under overload");
    // A refusal skips the work: it is answered faster than an accepted request.
    assert!(refused[refused.len() / 2] < ok[ok.len() / 2]);
    // Server side, the accepted requests waited about the bound: 95% within 25 ms (5x it).
    let (_, page) = s.request("GET", "/metrics", "text/plain", b"").unwrap();
    let count = metric_in(&page, "ember_queue_wait_seconds_count");
    let within = metric_in(&page, "ember_queue_wait_seconds_bucket{le=\"0.025\"}");
    assert!(
        within >= 0.95 * count,
        "{within} of {count} queue waits within 25 ms"
    );
    assert!(metric_in(&page, "ember_requests_refused_total{reason=\"overloaded\"}") >= 1.0);
}

/// Sends request heads declaring a 1 MB body that never comes, one connection each, until one
/// is refused on its head: answered 503 with `Connection: close` without the server waiting for
/// its body (a head it admits waits for the body: given up after 300 ms). False if none is by
/// `limit`.
fn refused_on_its_head(addr: std::net::SocketAddr, limit: Duration) -> bool {
    use std::io::{Read, Write};
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let Ok(mut c) = std::net::TcpStream::connect(addr) else {
            continue;
        };
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let head = format!(
            "POST /v1/score HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/plain\r\n\
             Content-Length: 1000000\r\n\r\n"
        );
        if c.write_all(head.as_bytes()).is_err() {
            continue;
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match c.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        if text.starts_with("http/1.1 503") {
            assert!(
                text.contains("connection: close"),
                "a refusal before the body keeps the connection: {text}"
            );
            return true;
        }
    }
    false
}

#[test]
fn bodies_past_the_in_flight_budget_are_refused() {
    // A 1 MiB budget: a 2 MiB request is refused from its Content-Length.
    let s = Server::start(&["--grpc", "off", "--max-inflight-bytes", "1048576"]);
    // Its head alone: the answer comes without the body being sent (or read).
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = "POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n";
    std::io::Write::write_all(&mut c, head.as_bytes()).unwrap();
    let mut resp = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut resp);
    let (status, body) = crate::server::parse_response(&resp).unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("--max-inflight-bytes"), "{body}");
    // Within it, served; and the budget is given back.
    let (status, _) = s
        .request("POST", "/v1/score", "text/plain", &tsv_rows(1000, 2))
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(s.metric("ember_inflight_body_bytes"), 0.0);
    assert!(s.metric("ember_requests_refused_total{reason=\"inflight_bytes\"}") >= 1.0);
}

#[test]
fn a_fresh_server_takes_its_first_load_at_once() {
    // The default queue-delay bound (50 ms), and `ember loadgen` at 3,000 requests/s from the
    // moment the server says where it listens: before the server warmed its model and started
    // its admission model from the warm batches, a quarter of such runs had their first
    // requests refused (15 503s in 0.1 ms, the first batch alone making 40 ms a sample).
    let s = Server::start(&["--grpc", "off"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["loadgen", "--url", &format!("http://{}", s.addr)])
        .args(["--format", "tsv", "--qps", "3000", "--duration", "2"])
        .args(["--warmup", "0", "--json"])
        .output()
        .expect("run ember loadgen");
    let text = String::from_utf8_lossy(&out.stdout);
    let run: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("loadgen printed no JSON ({e}): {text}"));
    assert!(run["ok"].as_u64().unwrap() > 0, "{run}");
    assert_eq!(run["refused"].as_u64(), Some(0), "{run}");
    assert_eq!(run["errors"].as_u64(), Some(0), "{run}");
}
