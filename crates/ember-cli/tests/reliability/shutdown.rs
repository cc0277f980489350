//! Stopping: with stuck clients (half a request, a body arriving, idle, an HTTP/2 client that
//! reads no response) SIGTERM answers what was received and exits 0 within the grace period; a
//! second signal exits at once; SIGHUP stops the same way.

use std::net::TcpStream;
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
