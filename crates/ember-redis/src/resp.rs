//! [`Conn`]: one node's connection, speaking RESP2 over a `TcpStream` (or TLS over it,
//! `tls.rs`) with one reusable read
//! buffer; [`Replies`]: a call's replies, bulk strings kept in one arena.
//!
//! Why not the `redis` crate's connection: on the fetch path (10,000 `GETRANGE` replies of a
//! few hundred bytes per batch) its combinator parser and one `Vec` per reply were a third of the
//! staging thread's time (`perf`), and reading back pushed blocks allocated (and, with the
//! allocator's purge, page-faulted) 32 MB per round. Here a reply is parsed in place: a bulk
//! string is handed out as a slice of the read buffer, nothing is allocated per reply, and
//! commands are written straight from their packed buffer (vectored writes).
//!
//! Every read and write is bounded by a deadline (the socket's timeout set to the time left).
//! Replies are Ember's own [`Value`] (`+OK` is [`Value::Okay`], an error reply a
//! [`Value::ServerError`] with its code), the same values the `redis` crate's parser gives (its
//! parser is the property tests' reference).

use crate::error::FailKind;
use crate::tls::{RedisTls, Stream};
use crate::value::{ServerError, Value, cmd};
use std::io::{IoSlice, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A socket failure: its kind and words.
pub type WireError = (FailKind, String);

/// Bytes asked of the socket per read (more when a reply is larger).
const READ_CHUNK: usize = 256 << 10;
/// The largest bulk string accepted (Redis's own `proto-max-bulk-len` default).
const MAX_BULK: usize = 512 << 20;
/// The longest header line accepted (`+`, `-`, `:`, `$`, `*` lines).
const MAX_LINE: usize = 64 << 10;
/// The deepest nesting of arrays accepted. Ember's replies nest at most 4 deep (`CLUSTER
/// SLOTS`, a stream read); a deeper one is refused before the recursive walk of `complete`
/// could run out of stack (a reply of 200,000 nested arrays did, found by fuzzing).
const MAX_DEPTH: usize = 64;
/// Past this size a reply grows the read buffer to its own size only.
const BIG_REPLY: usize = 4 << 20;
/// How far the socket's read timeout may drift from the time left: it is re-set only when it
/// differs by more (one `setsockopt` per millisecond or so, not one per reply).
const SLACK: Duration = Duration::from_millis(1);

fn left(deadline: Instant) -> Result<Duration, WireError> {
    let d = deadline.saturating_duration_since(Instant::now());
    match d.is_zero() {
        true => Err((FailKind::Timeout, "no time left".into())),
        false => Ok(d),
    }
}

fn io_err(what: &str, e: &std::io::Error) -> WireError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock | K::TimedOut => (FailKind::Timeout, format!("{what}: timed out")),
        _ => (FailKind::Connect, format!("{what}: {e}")),
    }
}

fn protocol(detail: impl Into<String>) -> WireError {
    (
        FailKind::Connect,
        format!("protocol error: {}", detail.into()),
    )
}

/// One reply, borrowed: a bulk string's bytes, or any other value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reply<'a> {
    Bulk(&'a [u8]),
    Other(&'a Value),
}

impl Reply<'_> {
    /// The reply as an owned [`Value`].
    pub fn to_value(self) -> Value {
        match self {
            Reply::Bulk(b) => Value::BulkString(b.to_vec()),
            Reply::Other(v) => v.clone(),
        }
    }
}

/// A node's connection (see the module documentation).
pub struct Conn {
    stream: Stream,
    /// `buf[pos..end]` is read and not yet parsed; `buf.len()` is its capacity (initialized).
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// The read timeout set now (`None`: unknown).
    read_timeout: Option<Duration>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.stream.tcp().peer_addr().ok())
            .field("buffered", &(self.end - self.pos))
            .finish()
    }
}

impl Conn {
    /// Connects to `addr` (`host:port`) within `timeout` and, with `auth` (`(user, password)`),
    /// authenticates before `deadline`.
    pub fn connect(
        addr: &str,
        timeout: Duration,
        auth: Option<(Option<&str>, &str)>,
        deadline: Instant,
    ) -> Result<Conn, WireError> {
        Self::connect_with(addr, timeout, auth, None, deadline)
    }

    /// [`Conn::connect`], over TLS where `tls` is given (its handshake within `deadline`).
    pub fn connect_with(
        addr: &str,
        timeout: Duration,
        auth: Option<(Option<&str>, &str)>,
        tls: Option<&RedisTls>,
        deadline: Instant,
    ) -> Result<Conn, WireError> {
        let addrs = addr
            .to_socket_addrs()
            .map_err(|e| (FailKind::Connect, format!("resolving {addr}: {e}")))?;
        let mut last = (FailKind::Connect, format!("{addr} resolves to no address"));
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    let stream = match tls {
                        None => Stream::Plain(tcp),
                        Some(t) => t.handshake(tcp, addr, deadline)?,
                    };
                    let mut c = Conn {
                        stream,
                        buf: vec![0; READ_CHUNK],
                        pos: 0,
                        end: 0,
                        read_timeout: None,
                    };
                    if let Some((user, password)) = auth {
                        let mut cmd = cmd("AUTH");
                        if let Some(u) = user {
                            cmd.arg(u);
                        }
                        cmd.arg(password);
                        c.send(&[&cmd.packed()], deadline)?;
                        match c.recv(deadline)? {
                            Value::Okay | Value::SimpleString(_) => {}
                            other => {
                                return Err((FailKind::Server, format!("AUTH answered {other:?}")));
                            }
                        }
                    }
                    return Ok(c);
                }
                Err(e) => last = io_err("connecting", &e),
            }
        }
        Err(last)
    }

    /// Writes `parts` back to back (vectored), within `deadline`.
    pub fn send(&mut self, parts: &[&[u8]], deadline: Instant) -> Result<(), WireError> {
        self.stream
            .tcp()
            .set_write_timeout(Some(left(deadline)?))
            .map_err(|e| io_err("sending", &e))?;
        // At most this many slices per call (the kernel's IOV_MAX is 1024).
        const IOV: usize = 512;
        for group in parts.chunks(IOV) {
            let mut slices: Vec<IoSlice<'_>> = group.iter().map(|p| IoSlice::new(p)).collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                match self.stream.write_vectored(rest) {
                    Ok(0) => {
                        return Err((FailKind::Connect, "sending: connection closed".into()));
                    }
                    Ok(n) => IoSlice::advance_slices(&mut rest, n),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_err("sending", &e)),
                }
            }
        }
        // TLS: what rustls still holds goes out now (plain TCP: nothing to do).
        self.stream.flush().map_err(|e| io_err("sending", &e))
    }

    /// Reads one reply as a [`Value`].
    pub fn recv(&mut self, deadline: Instant) -> Result<Value, WireError> {
        self.recv_with(deadline, |r| r.to_value())
    }

    /// Reads one reply and hands it to `f`: a bulk string as a slice of the read buffer (no
    /// allocation), anything else as a [`Value`].
    pub fn recv_with<R>(
        &mut self,
        deadline: Instant,
        f: impl FnOnce(Reply<'_>) -> R,
    ) -> Result<R, WireError> {
        let len = loop {
            match complete(&self.buf[self.pos..self.end])? {
                Need::Done(n) => break n,
                Need::More(want) => self.fill(want, deadline)?,
            }
        };
        let at = self.pos;
        self.pos += len;
        hand_out(&self.buf[at..at + len], f)
    }

    /// The reply at the start of `b`, read as [`Conn::recv_with`] reads it from its buffer:
    /// `Ok(None)` while it is not all there; else its length (`complete`), the reply handed out
    /// (as an owned value), and what `decode` reads of those bytes (the value and its length).
    /// The entry of the fuzz targets and their replay test (`fuzz/`), not an API.
    #[doc(hidden)]
    pub fn parse_buffered(b: &[u8]) -> Result<Option<Buffered>, WireError> {
        let n = match complete(b)? {
            Need::More(_) => return Ok(None),
            Need::Done(n) => n,
        };
        let whole = &b[..n];
        Ok(Some((n, hand_out(whole, |r| r.to_value()), decode(whole))))
    }

    /// Reads until at least `want` bytes (or, where unknown, more than now) are buffered.
    fn fill(&mut self, want: Option<usize>, deadline: Instant) -> Result<(), WireError> {
        let have = self.end - self.pos;
        let need = want.unwrap_or(have + 1).max(have + 1);
        if need > MAX_BULK + MAX_LINE {
            return Err(protocol(format!("a reply of {need} bytes")));
        }
        // Make room: where the reply cannot end inside the buffer, move what is buffered to
        // the front (a partial reply: little to copy), and grow to fit a few replies that
        // size (so that large replies are not moved one by one).
        if self.pos + need > self.buf.len() {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.buf.len() < need {
            // Room for a few replies that size; a very large one (a history cache's entry, tens
            // of MiB) gets its size and a read's worth more: zeroing 4x of it cost more than
            // reading it.
            let room = match need > BIG_REPLY {
                true => need + READ_CHUNK,
                false => (4 * need).max(READ_CHUNK),
            };
            self.buf.resize(room, 0);
        }
        let need = self.pos + need;
        while self.end < need {
            let l = left(deadline).map_err(|_| (FailKind::Timeout, "no reply in time".into()))?;
            if self.read_timeout.is_none_or(|t| t.abs_diff(l) > SLACK) {
                self.stream
                    .tcp()
                    .set_read_timeout(Some(l))
                    .map_err(|e| io_err("reading", &e))?;
                self.read_timeout = Some(l);
            }
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    return Err((
                        FailKind::Connect,
                        "reading: connection closed by the node".into(),
                    ));
                }
                Ok(n) => {
                    self.end += n;
                    if want.is_none() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let (kind, what) = io_err("reading", &e);
                    if kind == FailKind::Timeout && Instant::now() < deadline {
                        // The timeout set was up to SLACK short of the deadline.
                        self.read_timeout = None;
                        continue;
                    }
                    let what = match kind {
                        FailKind::Timeout => "no reply in time".to_string(),
                        _ => what,
                    };
                    return Err((kind, what));
                }
            }
        }
        Ok(())
    }
}

/// What [`Conn::parse_buffered`] finds of a whole reply: its length, the reply handed out, and
/// `decode`'s reading of it.
type Buffered = (
    usize,
    Result<Value, WireError>,
    Result<(Value, usize), WireError>,
);

/// Hands the whole reply `bytes` (as [`complete`] measured it) to `f`: a bulk string as a
/// slice of them (no allocation), anything else decoded.
fn hand_out<R>(bytes: &[u8], f: impl FnOnce(Reply<'_>) -> R) -> Result<R, WireError> {
    if bytes[0] == b'$' && bytes[1] != b'-' {
        let head = find_crlf(bytes, 1).expect("complete") + 2;
        return Ok(f(Reply::Bulk(&bytes[head..bytes.len() - 2])));
    }
    let v = decode(bytes)?.0;
    Ok(f(Reply::Other(&v)))
}

/// Whether a whole reply is buffered: its length, or how many bytes it needs (`None`: unknown
/// until more arrives).
#[derive(Debug, PartialEq)]
enum Need {
    Done(usize),
    More(Option<usize>),
}

fn find_crlf(b: &[u8], from: usize) -> Option<usize> {
    let i = memchr_cr(&b[from.min(b.len())..])?;
    let at = from + i;
    (at + 1 < b.len())
        .then_some(at)
        .filter(|&a| b[a + 1] == b'\n')
}

fn memchr_cr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\r')
}

fn parse_int(line: &[u8]) -> Result<i64, WireError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            protocol(format!(
                "{:?} is not a number",
                String::from_utf8_lossy(line)
            ))
        })
}

/// A reply's header line: its type byte, its text, and the index after its CRLF.
type Header<'a> = (u8, &'a [u8], usize);

/// The header line of the reply at `b[0]` (`None`: not all here).
fn header(b: &[u8]) -> Result<Option<Header<'_>>, WireError> {
    if b.is_empty() {
        return Ok(None);
    }
    match find_crlf(b, 1) {
        Some(e) => Ok(Some((b[0], &b[1..e], e + 2))),
        None if b.len() > MAX_LINE => Err(protocol("a header line without CRLF")),
        None => Ok(None),
    }
}

/// See [`Need`]. Arrays are walked element by element, at most [`MAX_DEPTH`] deep (so that
/// [`decode`], which reads only what this measured, never goes deeper either).
fn complete(b: &[u8]) -> Result<Need, WireError> {
    complete_in(b, 0)
}

/// [`complete`] for a reply inside `depth` arrays.
fn complete_in(b: &[u8], depth: usize) -> Result<Need, WireError> {
    let Some((t, line, mut at)) = header(b)? else {
        return Ok(Need::More(None));
    };
    match t {
        b'+' | b'-' | b':' => Ok(Need::Done(at)),
        b'$' => {
            let n = parse_int(line)?;
            if n < 0 {
                return Ok(Need::Done(at));
            }
            let n = n as usize;
            if n > MAX_BULK {
                return Err(protocol(format!("a bulk string of {n} bytes")));
            }
            match at + n + 2 <= b.len() {
                true if &b[at + n..at + n + 2] == b"\r\n" => Ok(Need::Done(at + n + 2)),
                true => Err(protocol("a bulk string not ended by CRLF")),
                false => Ok(Need::More(Some(at + n + 2))),
            }
        }
        b'*' => {
            let n = parse_int(line)?;
            if n > 0 && depth >= MAX_DEPTH {
                return Err(protocol(format!("arrays nested over {MAX_DEPTH} deep")));
            }
            for _ in 0..n.max(0) {
                match complete_in(&b[at..], depth + 1)? {
                    Need::Done(k) => at += k,
                    Need::More(Some(k)) => return Ok(Need::More(Some(at + k))),
                    Need::More(None) => return Ok(Need::More(None)),
                }
            }
            Ok(Need::Done(at))
        }
        other => Err(protocol(format!(
            "reply type {:?} (only RESP2 is spoken)",
            other as char
        ))),
    }
}

/// Decodes one complete reply at `b[0]`: the value and its length.
fn decode(b: &[u8]) -> Result<(Value, usize), WireError> {
    let (t, line, at) = header(b)?.ok_or_else(|| protocol("a reply cut short"))?;
    let v = match t {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
        b'-' => Value::ServerError(ServerError::parse(line)),
        b':' => Value::Int(parse_int(line)?),
        b'$' => match parse_int(line)? {
            n if n < 0 => Value::Nil,
            n => {
                let n = n as usize;
                return Ok((Value::BulkString(b[at..at + n].to_vec()), at + n + 2));
            }
        },
        b'*' => match parse_int(line)? {
            n if n < 0 => Value::Nil,
            n => {
                let mut items = Vec::with_capacity((n as usize).min(1024));
                let mut at = at;
                for _ in 0..n {
                    let (v, k) = decode(&b[at..])?;
                    items.push(v);
                    at += k;
                }
                return Ok((Value::Array(items), at));
            }
        },
        other => return Err(protocol(format!("reply type {:?}", other as char))),
    };
    Ok((v, at))
}

/// A call's replies in command order: bulk strings in one arena (reused from call to call),
/// anything else as a [`Value`].
#[derive(Debug, Default)]
pub struct Replies {
    arena: Vec<u8>,
    items: Vec<Item>,
}

#[derive(Debug)]
enum Item {
    Pending,
    Bulk(usize, usize),
    Other(Value),
}

impl Replies {
    /// Clears, for `n` replies to come.
    pub(super) fn reset(&mut self, n: usize) {
        self.arena.clear();
        self.items.clear();
        self.items.resize_with(n, || Item::Pending);
    }

    /// Keeps reply `i`.
    pub(super) fn set(&mut self, i: usize, r: Reply<'_>) {
        self.items[i] = match r {
            Reply::Bulk(b) => {
                let s = self.arena.len();
                self.arena.extend_from_slice(b);
                Item::Bulk(s, b.len())
            }
            Reply::Other(v) => Item::Other(v.clone()),
        };
    }

    pub(super) fn answered(&self, i: usize) -> bool {
        !matches!(self.items[i], Item::Pending)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Reply `i` (after a successful call, every reply is there).
    pub fn get(&self, i: usize) -> Reply<'_> {
        match &self.items[i] {
            Item::Bulk(s, n) => Reply::Bulk(&self.arena[*s..*s + *n]),
            Item::Other(v) => Reply::Other(v),
            Item::Pending => Reply::Other(&Value::Nil),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Reply<'_>> {
        (0..self.items.len()).map(|i| self.get(i))
    }

    /// The replies as [`Value`]s.
    pub fn to_values(&self) -> Vec<Value> {
        self.iter().map(Reply::to_value).collect()
    }
}

#[cfg(test)]
#[path = "resp_tests.rs"]
mod tests;
