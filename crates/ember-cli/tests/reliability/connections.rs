//! Connection hygiene: slow heads and bodies closed by their timeouts while normal requests are
//! answered; idle connections closed; the cap closing the oldest idle connection first and
//! refusing when none is idle; a process short of descriptors still serving; heads and bodies
//! refused before they are read; HTTP/2 connections that stop answering pings closed.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::clients::{self, Seen};
use crate::server::{PATIENCE, Server, parse_response, raise_fd_limit, tsv_rows, wait_until};

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

/// How long after the 2.5 s of trickling the slow clients' closes may take (see the test).
const PAST_TIMEOUTS: Duration = Duration::from_secs(10);

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
        // Not a wait: the trickle's pace (a byte every 100 ms) is what the timeouts are tested on.
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every slow client is past its timeout by now; how soon the server acts on it depends on
    // the machine's load, so its closes are waited for, not expected at 2.5 s, within a bound
    // tied to the timeouts: 5x the longest (2 s), so that a server acting far past its timeouts
    // still fails.
    wait_until(
        "close of the 40 slow heads (header timeout 1 s)",
        PAST_TIMEOUTS,
        || heads.closed().0 == 40,
    );
    wait_until(
        "close of the 20 slow bodies (body timeout 1 s, 1000 bytes/s)",
        PAST_TIMEOUTS,
        || bodies.closed().0 == 20,
    );
    let (_, sent) = bodies.closed();
    for r in sent {
        let (status, body) = parse_response(&r).expect("a slow body gets an answer");
        assert_eq!(status, 408, "{body}");
        assert!(
            body.contains("arrived too slowly") && body.contains("--min-body-rate"),
            "{body}"
        );
    }
    wait_until(
        "close of the 50 idle connections (idle timeout 2 s)",
        PAST_TIMEOUTS,
        || idle.iter().all(clients::closed),
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
    // The server accepts in the order of the connects (one accept queue), so it has registered
    // all twenty, oldest first, before it accepts the first of these.
    for _ in 0..3 {
        score(&s);
    }
    wait_until("close of the oldest idle connection", PATIENCE, || {
        clients::closed(&idle[0])
    });
    assert!(
        idle[3..].iter().all(|c| !clients::closed(c)),
        "newer idle connections were closed"
    );
    s.wait_metric(
        "ember_connections_closed_total{reason=\"evicted\"}",
        "at least 1",
        |v| v >= 1.0,
    );
    drop(idle);
    s.wait_metric("ember_connections_open", "only the scrape's own", |v| {
        v <= 1.0
    });

    // Twenty connections each sending a body (busy, not idle): a new one is refused.
    let mut busy = clients::slow_body(s.addr, 20);
    busy.step();
    // Busy once the server has read their heads (until then they would look idle).
    wait_until("read of every busy connection's head", PATIENCE, || {
        busy.conns.iter().all(|c| s.has_read(c))
    });
    let mut extra = TcpStream::connect(s.addr).unwrap();
    let _ = extra.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut got = Seen::Open;
    wait_until(
        "answer or close of the connection past the cap",
        PATIENCE,
        || {
            got = clients::seen(&extra);
            got != Seen::Open
        },
    );
    assert!(
        matches!(&got, Seen::Closed(b) if b.is_empty()),
        "a connection past the cap with none idle was served: {got:?}"
    );
    assert_eq!(
        busy.closed().0,
        0,
        "busy connections were closed to make room"
    );
    drop(busy);
    // A scrape needs a free slot: the dropped bodies' connections must have ended.
    wait_until("free slot for a scrape", PATIENCE, || {
        s.try_metric("ember_connections_open").is_some()
    });
    assert!(s.metric("ember_connections_refused_total{reason=\"max_connections\"}") >= 1.0);
}

#[test]
fn a_process_short_of_descriptors_keeps_serving() {
    raise_fd_limit();
    // 320 descriptors: the server keeps 256 for itself and serves at most 64 connections.
    let s = Server::start_with_fd_limit(320, &["--grpc", "off"]);
    let flood = clients::idle(s.addr, 300);
    // Past the first 64, each connection accepted makes room by closing the oldest idle one.
    wait_until(
        "close of all but 64 of the 300 idle connections",
        PATIENCE,
        || flood.iter().filter(|c| clients::closed(c)).count() >= 300 - 64,
    );
    for _ in 0..5 {
        score(&s);
    }
    // A connection asked to make room counts in the gauge until its task has ended (and a
    // scrape at the cap makes room for itself): wait for those to end, not for a time. A
    // server over the cap for good stays over it, and fails here.
    s.wait_metric("ember_connections_open", "at most the cap of 64", |open| {
        open <= 64.0
    });
    assert!(s.open_fds() <= 320, "{} descriptors", s.open_fds());
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
    // The 6 s bound is what is tested: a ping and its timeout take 2 s, the idle timeout 60 s.
    wait_until(
        "close of the HTTP/2 connections that never answer a ping (idle timeout 60 s)",
        Duration::from_secs(6),
        || silent.iter().all(clients::closed),
    );
}

#[test]
fn an_answer_given_before_its_body_closes_the_connection_and_the_body_is_never_a_head() {
    // A model that is not served is answered 404 before the body is read. The body (100 KB, no
    // blank line in it) must not be read as the next request's head: that once gave a second,
    // bogus 431 answer on the connection and counted a refusal that never was.
    let s = Server::start(&["--grpc", "off"]);
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    let body = vec![b'x'; 100_000];
    let head = format!(
        "POST /v2/models/nope/infer HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        s.addr,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    // The server may close before taking all of it: what matters is what it answers.
    let _ = c.write_all(&body);
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut got);
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 404"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    assert_eq!(text.matches("http/1.1 ").count(), 1, "{text}");
    assert_eq!(
        s.metric("ember_requests_refused_total{reason=\"header_too_large\"}"),
        0.0
    );
}
