//! What one connection is doing, as its reader, its requests and its watchdog see it, and the
//! deadline that follows from it:
//!
//! - idle (no request in flight, no byte of a next request): closed after `idle_timeout`;
//! - a request head arriving (HTTP/1: bytes after idle, no request yet): closed `header_timeout`
//!   after its first byte;
//! - requests in flight: no deadline here (bodies have their minimum rate, `body.rs`).
//!
//! Times are nanoseconds since the connection was accepted, in atomics: the reader marks them
//! on every read without a lock.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::ConnConfig;

/// Why a connection's watchdog ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Close {
    /// Idle for `idle_timeout`: closed gracefully.
    Idle,
    /// A request head took longer than `header_timeout`: closed at once.
    Header,
    /// Closed to make room for a new connection (the oldest idle one).
    Evicted,
    /// The server is stopping.
    Shutdown,
}

impl Close {
    /// The `reason` label of `ember_connections_closed_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Close::Idle => "idle_timeout",
            Close::Header => "header_timeout",
            Close::Evicted => "evicted",
            Close::Shutdown => "shutdown",
        }
    }
}

/// A connection's state (see the module documentation).
#[derive(Debug)]
pub(crate) struct ConnState {
    accepted: Instant,
    /// Requests whose response is not yet produced.
    in_flight: AtomicU32,
    /// Requests begun so far.
    begun: AtomicU64,
    /// Request bodies not yet read to their end.
    receiving: AtomicU32,
    /// When the connection last became idle (ns since accepted).
    idle_since: AtomicU64,
    /// First byte of a request head read while idle (ns since accepted, plus 1; 0: none).
    head_since: AtomicU64,
    /// An HTTP/2 connection (its bytes are not request heads: pings, window updates).
    http2: AtomicBool,
    evict: AtomicBool,
    stop: AtomicBool,
    /// The body of the request in flight was read to its end (HTTP/1 runs one request at a
    /// time; HTTP/2 does not use it).
    body_ended: AtomicBool,
    /// The connection closes after the answer being sent (its request's body was not read):
    /// what it reads from now on is that body, never a request head.
    closing: AtomicBool,
    /// Wakes the watchdog when its deadline may have changed.
    pub(crate) changed: Notify,
}

impl ConnState {
    pub(crate) fn new() -> Self {
        ConnState {
            accepted: Instant::now(),
            in_flight: AtomicU32::new(0),
            begun: AtomicU64::new(0),
            receiving: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            evict: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            body_ended: AtomicBool::new(true),
            closing: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn now_ns(&self) -> u64 {
        self.accepted.elapsed().as_nanos() as u64
    }

    fn at(&self, ns: u64) -> Instant {
        self.accepted + Duration::from_nanos(ns)
    }

    /// The reader got bytes: the start of a request head when the connection was idle.
    pub(crate) fn on_read(&self) {
        if self.in_flight.load(Relaxed) == 0
            && self.head_since.load(Relaxed) == 0
            && !self.http2.load(Relaxed)
        {
            self.head_since.store(self.now_ns() + 1, Relaxed);
            self.changed.notify_one();
        }
    }

    /// The connection speaks HTTP/2 (its preface was read).
    pub(crate) fn set_http2(&self) {
        self.http2.store(true, Relaxed);
        self.head_since.store(0, Relaxed);
    }

    /// A request's head was read: it is in flight until the guard drops.
    pub(crate) fn begin(self: &std::sync::Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Relaxed);
        self.begun.fetch_add(1, Relaxed);
        self.head_since.store(0, Relaxed);
        self.changed.notify_one();
        RequestGuard(self.clone())
    }

    /// A request body that has not reached its end yet.
    pub(crate) fn body_started(&self) {
        self.receiving.fetch_add(1, Relaxed);
    }

    /// A request body reached its end (or was dropped).
    pub(crate) fn body_done(&self) {
        self.receiving.fetch_sub(1, Relaxed);
    }

    /// Whether a request is in flight.
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.load(Relaxed) > 0
    }

    /// Requests begun so far.
    pub(crate) fn begun(&self) -> u64 {
        self.begun.load(Relaxed)
    }

    /// Whether the connection speaks HTTP/2.
    pub(crate) fn is_http2(&self) -> bool {
        self.http2.load(Relaxed)
    }

    /// Whether a request body is still arriving.
    pub(crate) fn receiving(&self) -> bool {
        self.receiving.load(Relaxed) > 0
    }

    /// Whether a request head has started to arrive (and not yet ended).
    pub(crate) fn head_in_progress(&self) -> bool {
        self.in_flight.load(Relaxed) == 0 && self.head_since.load(Relaxed) != 0
    }

    /// Whether the connection is idle (what eviction picks from), and since when.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let idle = self.in_flight.load(Relaxed) == 0 && self.head_since.load(Relaxed) == 0;
        idle.then(|| self.at(self.idle_since.load(Relaxed)))
    }

    /// Asks the watchdog to close the connection to make room for another.
    pub(crate) fn evict(&self) {
        self.evict.store(true, Relaxed);
        self.changed.notify_one();
    }

    /// Whether it was asked to close to make room.
    pub(crate) fn evicted(&self) -> bool {
        self.evict.load(Relaxed)
    }

    /// The request body being read reached its end (`true`), or one starts (`false`).
    pub(crate) fn set_body_ended(&self, ended: bool) {
        self.body_ended.store(ended, Relaxed);
    }

    /// Whether the body of the request in flight was read to its end.
    pub(crate) fn body_ended(&self) -> bool {
        self.body_ended.load(Relaxed)
    }

    /// The answer being sent closes the connection (see the field).
    pub(crate) fn closing(&self) {
        self.closing.store(true, Relaxed);
    }

    /// Whether the connection closes after the answer being sent.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Relaxed)
    }

    /// Asks the watchdog to stop the connection (the server is stopping).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Relaxed);
        self.changed.notify_one();
    }

    /// What ends the connection now, or when the next deadline falls.
    pub(crate) fn check(&self, cfg: &ConnConfig) -> Result<Option<Instant>, Close> {
        if self.stop.load(Relaxed) {
            return Err(Close::Shutdown);
        }
        if self.evict.load(Relaxed) {
            return Err(Close::Evicted);
        }
        self.deadline(cfg)
    }

    /// The deadline the connection's own state gives (idle or slow head), the server's stop and
    /// evictions aside.
    pub(crate) fn deadline(&self, cfg: &ConnConfig) -> Result<Option<Instant>, Close> {
        if self.in_flight.load(Relaxed) > 0 {
            return Ok(None);
        }
        let now = Instant::now();
        let head = self.head_since.load(Relaxed);
        let (deadline, why) = match head {
            0 => (
                self.at(self.idle_since.load(Relaxed)) + cfg.idle_timeout,
                Close::Idle,
            ),
            h => (self.at(h - 1) + cfg.header_timeout, Close::Header),
        };
        if now >= deadline {
            Err(why)
        } else {
            Ok(Some(deadline))
        }
    }
}

/// A request in flight; when it drops, the connection may be idle again.
#[derive(Debug)]
pub(crate) struct RequestGuard(std::sync::Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let s = &self.0;
        if s.in_flight.fetch_sub(1, Relaxed) == 1 {
            s.idle_since.store(s.now_ns(), Relaxed);
            s.changed.notify_one();
        }
    }
}
