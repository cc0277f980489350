//! Stopping: with stuck clients (half a request, a body arriving, idle, an HTTP/2 client that
//! reads no response) SIGTERM answers what was received and exits 0 within the grace period; a
//! second signal exits at once; SIGHUP stops the same way. Under a steady stream of requests on
//! keep-alive connections, every request sent before SIGTERM is answered with its scores.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::clients;
use crate::server::{PATIENCE, Server, metric_in, request, tsv_rows, wait_until};

/// Clients stuck in every way a stop can meet them.
struct Stuck {
    idle: Vec<TcpStream>,
    heads: clients::Trickle,
    bodies: clients::Trickle,
    /// An HTTP/2 request whose answer cannot be sent (its window is 0).
    h2: TcpStream,
}

impl Stuck {
    /// Waits until the server has accepted every stuck connection and read all it was sent.
    fn wait_read(&self, s: &Server) {
        let all = || {
            (self.idle.iter())
                .chain(&self.heads.conns)
                .chain(&self.bodies.conns)
                .chain([&self.h2])
                .all(|c| s.has_read(c))
        };
        wait_until("read of every stuck client", PATIENCE, all);
    }
}

fn stuck(s: &Server) -> Stuck {
    let mut heads = clients::slow_head(s.addr, 5);
    let mut bodies = clients::slow_body(s.addr, 5);
    heads.step();
    bodies.step();
    let mut h2 = clients::h2_silent(s.addr, 0);
    clients::h2_request(&mut h2, &s.addr.to_string(), &tsv_rows(1, 3));
    Stuck {
        idle: clients::idle(s.addr, 5),
        heads,
        bodies,
        h2,
    }
}

/// Requests that wait in a forming batch (--max-delay-us 300000) when the signal comes.
fn received(s: &Server, n: usize) -> Vec<std::thread::JoinHandle<Option<(u16, String)>>> {
    (0..n)
        .map(|i| {
            let addr = s.addr;
            std::thread::spawn(move || {
                let body = tsv_rows(1, i as u64);
                request(
                    addr,
                    "POST",
                    "/v1/score",
                    "text/plain",
                    &body,
                    Duration::from_secs(20),
                )
            })
        })
        .collect()
}

#[test]
fn sigterm_with_stuck_clients_answers_what_was_received_and_exits_0_within_the_grace() {
    let mut s = Server::start(&["--max-delay-us", "300000", "--shutdown-grace-s", "3"]);
    let stuck = stuck(&s);
    let inflight = received(&s, 3);
    stuck.wait_read(&s);
    // Received: the three and the stuck HTTP/2 request queued (or, on a machine slow enough to
    // miss the batch's 300 ms, answered already).
    wait_until("four requests received", PATIENCE, || {
        let (_, page) = s.request("GET", "/metrics", "", b"").expect("GET /metrics");
        metric_in(&page, "ember_queue_depth")
            + metric_in(
                &page,
                "ember_requests_total{protocol=\"http\",status=\"ok\"}",
            )
            >= 4.0
    });
    let t = Instant::now();
    s.signal("TERM");
    let status = s
        .wait_exit(Duration::from_secs(10))
        .expect("the server did not exit");
    let took = t.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_millis(3800),
        "exited after {took:?} (grace 3 s)"
    );
    for t in inflight {
        let (code, body) = t.join().unwrap().expect("a received request was dropped");
        assert_eq!(code, 200, "{body}");
    }
    let log = s.log.lock().unwrap().clone();
    assert!(
        log.contains("SIGTERM: stopping") && log.contains("stopped"),
        "{log}"
    );
    eprintln!("SIGTERM with stuck clients: exit 0 after {took:?}");
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut s = Server::start(&["--shutdown-grace-s", "30"]);
    let stuck = stuck(&s);
    stuck.wait_read(&s);
    s.signal("TERM");
    s.wait_log("SIGTERM: stopping");
    // Not a wait for a state: the stop is under way, and the server must stay up through this.
    assert!(
        s.wait_exit(Duration::from_millis(300)).is_none(),
        "stopped before its stuck client"
    );
    let t = Instant::now();
    s.signal("INT");
    let status = s
        .wait_exit(Duration::from_secs(5))
        .expect("no exit on the second signal");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(status.code(), Some(130), "{status}");
    assert!(s.log.lock().unwrap().contains("SIGINT: exiting now"));
}

#[test]
fn sighup_stops_like_sigterm() {
    let mut s = Server::start(&["--grpc", "off"]);
    s.signal("HUP");
    let status = s
        .wait_exit(Duration::from_secs(10))
        .expect("no exit on SIGHUP");
    assert!(status.success(), "{status}");
    assert!(s.log.lock().unwrap().contains("SIGHUP: stopping"));
}

/// How a request sent on a keep-alive stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// 200 with one score per row.
    Scores,
    /// Another status; `close`: the answer said `Connection: close`.
    Status { code: u16, close: bool },
    /// No answer: the connection was closed (or reset) before one came.
    Dropped,
}

/// One request of a stream: when its last byte was written, and how it ended.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    answer: Answer,
}

/// Reads one HTTP/1.1 response (with a `Content-Length`) off a keep-alive connection: how it
/// ended, and whether it said `Connection: close`.
fn read_answer(r: &mut BufReader<TcpStream>, rows: usize) -> (Answer, bool) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return (Answer::Dropped, true),
            Ok(_) if line == "\r\n" => break,
            Ok(_) => head.push_str(&line.to_ascii_lowercase()),
        }
    }
    let code: u16 = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    if r.read_exact(&mut body).is_err() {
        return (Answer::Dropped, true);
    }
    let close = head.lines().any(|l| l.trim() == "connection: close");
    let scores = String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.trim().parse::<f32>().is_ok())
        .count();
    let answer = match code {
        200 if scores == rows => Answer::Scores,
        code => Answer::Status { code, close },
    };
    (answer, close)
}

/// A client on one keep-alive connection: sends `/v1/score` requests one after another until
/// the server closes the connection or says it will (also after a 200); counts answers into
/// `answered`.
fn stream(addr: SocketAddr, seed: u64, answered: Arc<AtomicUsize>) -> Vec<Sent> {
    let conn = TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    conn.set_nodelay(true).unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    let mut sent = Vec::new();
    for k in 0.. {
        let rows = 1 + (k % 3);
        let body = tsv_rows(rows, seed * 1_000_003 + k as u64);
        let mut req = format!(
            "POST /v1/score HTTP/1.1\r\nHost: {addr}\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        // One write, so that a request is either in the server's socket or not.
        if w.write_all(&req).is_err() {
            break;
        }
        let at = Instant::now();
        let (answer, close) = read_answer(&mut r, rows);
        sent.push(Sent { at, answer });
        answered.fetch_add(1, Ordering::Relaxed);
        // As an HTTP/1.1 client does: nothing more on a connection said to close.
        if close {
            break;
        }
    }
    sent
}

#[test]
fn sigterm_under_a_steady_stream_answers_every_request_sent_before_it() {
    let mut s = Server::start(&["--grpc", "off", "--shutdown-grace-s", "10"]);
    let answered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let (addr, answered) = (s.addr, answered.clone());
            std::thread::spawn(move || stream(addr, i, answered))
        })
        .collect();
    wait_until("the streams' first 400 answers", PATIENCE, || {
        answered.load(Ordering::Relaxed) >= 400
    });
    let signalled = Instant::now();
    s.signal("TERM");
    let status = s
        .wait_exit(Duration::from_secs(30))
        .expect("the server did not exit");
    assert!(status.success(), "exit status {status}");
    let sent: Vec<Sent> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let (before, after): (Vec<&Sent>, Vec<&Sent>) = sent.iter().partition(|x| x.at < signalled);
    let lost: Vec<Answer> = (before.iter())
        .filter(|x| x.answer != Answer::Scores)
        .map(|x| x.answer)
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} requests sent before SIGTERM were not answered with their scores: {lost:?}",
        lost.len(),
        before.len()
    );
    // What came after the signal: scores, or a refusal that closes the connection.
    for x in &after {
        let ok = match x.answer {
            Answer::Scores | Answer::Dropped => true,
            Answer::Status { code, close } => code == 503 && close,
        };
        assert!(ok, "a request sent after SIGTERM got {:?}", x.answer);
    }
    eprintln!(
        "SIGTERM under 8 keep-alive streams: {} sent before it, all answered; {} after it: {} \
         answered, {} refused or closed",
        before.len(),
        after.len(),
        after.iter().filter(|x| x.answer == Answer::Scores).count(),
        after.iter().filter(|x| x.answer != Answer::Scores).count(),
    );
}
