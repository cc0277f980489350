//! Clients that misbehave, on plain sockets: idle connections, heads and bodies sent a byte at a
//! time, raw HTTP/2 connections that never answer a ping or never read a response.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Opens `n` connections that send nothing.
pub fn idle(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect"))
        .collect()
}

/// What the server did with a connection so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Still open, nothing received.
    Open,
    /// Closed by the server (after sending `bytes`, possibly none).
    Closed(Vec<u8>),
    /// Bytes received, still open.
    Data(Vec<u8>),
}

/// Reads whatever the server sent on `s` without blocking, and whether it closed.
pub fn seen(s: &TcpStream) -> Seen {
    s.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        let mut r: &TcpStream = s;
        match r.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    match (closed, got.is_empty()) {
        (true, _) => Seen::Closed(got),
        (false, true) => Seen::Open,
        (false, false) => Seen::Data(got),
    }
}

/// Whether `s` has been closed by the server.
pub fn closed(s: &TcpStream) -> bool {
    matches!(seen(s), Seen::Closed(_))
}

/// Connections that trickle a request: `prefix` at once, then `trickle` a byte each `every`.
pub struct Trickle {
    pub conns: Vec<TcpStream>,
    trickle: Vec<u8>,
    at: usize,
    /// What each connection received so far, and whether the server closed it (kept, as
    /// reading a socket consumes what it received: [`Trickle::closed`] may be polled).
    received: Vec<(Vec<u8>, bool)>,
}

impl Trickle {
    pub fn start(addr: SocketAddr, n: usize, prefix: &[u8], trickle: &[u8]) -> Trickle {
        let mut conns = idle(addr, n);
        for c in &mut conns {
            let _ = c.write_all(prefix);
        }
        Trickle {
            received: vec![(Vec::new(), false); conns.len()],
            conns,
            trickle: trickle.to_vec(),
            at: 0,
        }
    }

    /// Sends the next byte on every connection still open.
    pub fn step(&mut self) {
        let b = self.trickle[self.at % self.trickle.len()];
        self.at += 1;
        for c in &mut self.conns {
            let _ = c.write(&[b]);
        }
    }

    /// How many the server closed so far, and what each of those sent before closing.
    pub fn closed(&mut self) -> (usize, Vec<Vec<u8>>) {
        for (c, (got, ended)) in self.conns.iter().zip(&mut self.received) {
            if *ended {
                continue;
            }
            match seen(c) {
                Seen::Open => {}
                Seen::Data(b) => got.extend_from_slice(&b),
                Seen::Closed(b) => {
                    got.extend_from_slice(&b);
                    *ended = true;
                }
            }
        }
        let sent: Vec<Vec<u8>> = (self.received.iter())
            .filter(|(_, ended)| *ended)
            .map(|(got, _)| got.clone())
            .collect();
        (sent.len(), sent)
    }
}

/// A head that never ends (slowloris): a request line, then header bytes one at a time.
pub fn slow_head(addr: SocketAddr, n: usize) -> Trickle {
    Trickle::start(
        addr,
        n,
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        b"abcdefghij",
    )
}

/// A body that never ends: a full head declaring 100 KB, then one byte at a time.
pub fn slow_body(addr: SocketAddr, n: usize) -> Trickle {
    Trickle::start(
        addr,
        n,
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n0\t1",
        b"\t",
    )
}

/// An HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK literal header field without indexing, new name.
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut h = vec![0x00, name.len() as u8];
    h.extend_from_slice(name.as_bytes());
    h.push(value.len() as u8);
    h.extend_from_slice(value.as_bytes());
    h
}

/// An HTTP/2 connection (prior knowledge, as gRPC clients speak it) that sends its preface and
/// settings (`initial_window`: how much response it lets the server send), acknowledges the
/// server's settings, and then answers nothing: not its pings, not its data.
pub fn h2_silent(addr: SocketAddr, initial_window: u32) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE (0x4).
    let mut settings = vec![0x00, 0x04];
    settings.extend_from_slice(&initial_window.to_be_bytes());
    out.extend(frame(0x4, 0, 0, &settings));
    out.extend(frame(0x4, 0x1, 0, &[])); // ack of the server's settings, sent ahead
    s.write_all(&out).unwrap();
    s
}

/// On an [`h2_silent`] connection, a complete `/v1/score` request (stream 1) for `body`.
pub fn h2_request(s: &mut TcpStream, authority: &str, body: &[u8]) {
    let mut block = Vec::new();
    for (k, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1/score"),
        (":authority", authority),
        ("content-type", "text/plain"),
    ] {
        block.extend(literal(k, v));
    }
    let mut out = frame(0x1, 0x4, 1, &block); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, body)); // DATA, END_STREAM
    s.write_all(&out).unwrap();
}
