//! Connection hygiene: slow heads and bodies closed by their timeouts while normal requests are
//! answered; idle connections closed; the cap closing the oldest idle connection first and
//! refusing when none is idle; a process short of descriptors still serving; heads and bodies
//! refused before they are read; HTTP/2 connections that stop answering pings closed.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::clients::{self, Seen};
use crate::server::{Server, parse_response, raise_fd_limit, tsv_rows};

/// A normal request; its latency.
fn score(s: &Server) -> Duration {
    let t = Instant::now();
    let (status, body) = s
        .request("POST", "/v1/score", "text/plain", &tsv_rows(2, 1))
        .expect("a normal request is answered");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.lines().count(), 2, "{body}");
    t.elapsed()
}

#[test]
fn slow_heads_and_bodies_are_closed_by_their_timeouts_while_others_are_served() {
    let s = Server::start(&[
        "--grpc",
        "off",
        "--header-timeout-s",
        "1",
        "--body-timeout-s",
        "1",
        "--min-body-rate",
        "1000",
        "--idle-timeout-s",
        "2",
    ]);
    let mut heads = clients::slow_head(s.addr, 40);
    let mut bodies = clients::slow_body(s.addr, 20);
    let idle = clients::idle(s.addr, 50);
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    // 2.5 s of trickling, a byte every 100 ms (a head never ends, a body runs at 10 bytes/s),
    // with a normal request every 100 ms.
    while start.elapsed() < Duration::from_millis(2500) {
        heads.step();
        bodies.step();
        worst = worst.max(score(&s));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (h, _) = heads.closed();
    assert_eq!(
        h, 40,
        "slow heads still open after 2.5 s (header timeout 1 s)"
    );
    let (b, sent) = bodies.closed();
    assert_eq!(
        b, 20,
        "slow bodies still open (body timeout 1 s, 1000 bytes/s)"
    );
    for r in sent {
        let (status, body) = parse_response(&r).expect("a slow body gets an answer");
        assert_eq!(status, 408, "{body}");
        assert!(
            body.contains("arrived too slowly") && body.contains("--min-body-rate"),
            "{body}"
        );
    }
    let still_open = idle.iter().filter(|c| !clients::closed(c)).count();
    assert_eq!(
        still_open, 0,
        "idle connections open after 2.5 s (idle timeout 2 s)"
    );
    eprintln!("normal requests among slow clients: worst {worst:?}");
    assert!(s.metric("ember_connections_closed_total{reason=\"header_timeout\"}") >= 40.0);
    assert!(s.metric("ember_connections_closed_total{reason=\"idle_timeout\"}") >= 50.0);
    assert!(s.metric("ember_requests_refused_total{reason=\"slow_body\"}") >= 20.0);
}

#[test]
fn at_the_cap_the_oldest_idle_connection_makes_room_and_busy_ones_are_kept() {
    let s = Server::start(&["--grpc", "off", "--max-connections", "20"]);
    let idle = clients::idle(s.addr, 20);
    // Let the server register them, oldest first.
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        score(&s);
    }
    assert!(
        clients::closed(&idle[0]),
        "the oldest idle connection was not closed"
    );
    assert!(
        idle[3..].iter().all(|c| !clients::closed(c)),
        "newer idle connections were closed"
    );
    assert!(s.metric("ember_connections_closed_total{reason=\"evicted\"}") >= 1.0);
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));

    // Twenty connections each sending a body (busy, not idle): a new one is refused.
    let mut busy = clients::slow_body(s.addr, 20);
    busy.step();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(s.addr).unwrap();
    let _ = extra.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        matches!(clients::seen(&extra), Seen::Closed(b) if b.is_empty()),
        "a connection past the cap with none idle was served"
    );
    assert_eq!(
        busy.closed().0,
        0,
        "busy connections were closed to make room"
    );
    drop(busy);
    std::thread::sleep(Duration::from_millis(200));
    assert!(s.metric("ember_connections_refused_total{reason=\"max_connections\"}") >= 1.0);
}

#[test]
fn a_process_short_of_descriptors_keeps_serving() {
    raise_fd_limit();
    // 320 descriptors: the server keeps 256 for itself and serves at most 64 connections.
    let s = Server::start_with_fd_limit(320, &["--grpc", "off"]);
    let flood = clients::idle(s.addr, 300);
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        score(&s);
    }
    let open = s.metric("ember_connections_open");
    assert!(open <= 64.0, "{open} connections open past the cap of 64");
    assert!(s.open_fds() <= 320, "{} descriptors", s.open_fds());
    let closed = flood.iter().filter(|c| clients::closed(c)).count();
    assert!(
        closed >= 300 - 64,
        "only {closed} of the 300 idle connections were closed"
    );
}

#[test]
fn oversize_requests_are_refused_before_their_body_is_read() {
    let s = Server::start(&["--grpc", "off", "--max-body-bytes", "1048576"]);
    // Content-Length of 10^12 and no body: answered at once.
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
        .unwrap();
    let mut resp = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut resp);
    let (status, body) = parse_response(&resp).unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("1000000000000 bytes") && body.contains("--max-body-bytes"),
        "{body}"
    );
    // Heads over the limit: 431 with a JSON body, whether hyper has buffered them or not.
    for size in [40_000, 200_000] {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let head = format!(
            "GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(size)
        );
        let _ = c.write_all(head.as_bytes());
        let mut resp = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c, &mut resp);
        let (status, body) = parse_response(&resp).expect("an answer");
        assert_eq!(status, 431, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["error"].as_str().unwrap().contains("--max-header-bytes"),
            "{body}"
        );
    }
    // 405 and an empty body to /v1/score: JSON errors too.
    let (status, body) = s.request("DELETE", "/v1/score", "text/plain", b"").unwrap();
    assert_eq!(status, 405, "{body}");
    assert!(body.contains("use POST"), "{body}");
    let (status, body) = s.request("POST", "/v1/score", "text/plain", b"").unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("the request body is empty"), "{body}");
    assert!(s.metric("ember_requests_refused_total{reason=\"body_too_large\"}") >= 1.0);
    assert!(s.metric("ember_requests_refused_total{reason=\"header_too_large\"}") >= 2.0);
    // And the server still serves.
    score(&s);
}

#[test]
fn http2_connections_that_stop_answering_pings_are_closed() {
    let s = Server::start(&[
        "--h2-ping-interval-s",
        "1",
        "--h2-ping-timeout-s",
        "1",
        "--idle-timeout-s",
        "60",
    ]);
    let grpc = s.grpc.unwrap();
    let silent: Vec<TcpStream> = (0..5).map(|_| clients::h2_silent(grpc, 65_535)).collect();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        if silent.iter().all(clients::closed) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let open = silent.iter().filter(|c| !clients::closed(c)).count();
    assert_eq!(
        open, 0,
        "HTTP/2 connections that never answer a ping still open"
    );
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "closed only by the idle timeout"
    );
}
