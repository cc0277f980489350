//! One node's connection: sends and receives bounded by a deadline (the socket's timeout is set
//! to the time left before each), and the node's state and counters.

use super::options::FailKind;
use redis::Value;
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Per-node counters of what calls moved (read by the metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    pub node: String,
    /// Commands answered, and bytes of their replies' values.
    pub commands: u64,
    pub bytes: u64,
    /// Round trips (one pipeline each).
    pub round_trips: u64,
    /// Failures by kind (see [`FailKind::name`]).
    pub errors: HashMap<&'static str, u64>,
}

pub(super) struct Node {
    pub(super) addr: String,
    pub(super) conn: Option<redis::Connection>,
    /// Whether this connection was sent `READONLY` (replica reads).
    pub(super) readonly: bool,
    /// Not to be used until then while another copy exists.
    pub(super) down_until: Option<Instant>,
    pub(super) stats: NodeStats,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("addr", &self.addr)
            .field("connected", &self.conn.is_some())
            .field("down_until", &self.down_until)
            .finish()
    }
}

fn left(deadline: Instant) -> std::result::Result<Duration, (FailKind, String)> {
    let d = deadline.saturating_duration_since(Instant::now());
    match d.is_zero() {
        true => Err((FailKind::Timeout, "no time left".into())),
        false => Ok(d),
    }
}

fn io_kind(e: &redis::RedisError) -> FailKind {
    match e.is_timeout() {
        true => FailKind::Timeout,
        false => FailKind::Connect,
    }
}

pub(super) fn send(
    conn: &mut redis::Connection,
    bytes: &[u8],
    deadline: Instant,
) -> std::result::Result<(), (FailKind, String)> {
    conn.set_write_timeout(Some(left(deadline)?))
        .map_err(|e| (io_kind(&e), e.to_string()))?;
    conn.send_packed_command(bytes)
        .map_err(|e| (io_kind(&e), format!("sending: {e}")))
}

/// How far past its deadline a read may block: the read timeout is re-set only when the one set
/// would let a read run longer than that past the deadline, so that a pipeline of thousands of
/// replies costs a `setsockopt` per millisecond or so, not one per reply.
const SLACK: Duration = Duration::from_millis(1);

/// Reads one reply. `set` is the read timeout this connection has now (`None`: unknown), kept by
/// the caller across the replies of one pipeline.
pub(super) fn recv(
    conn: &mut redis::Connection,
    deadline: Instant,
    set: &mut Option<Duration>,
) -> std::result::Result<Value, (FailKind, String)> {
    let left = left(deadline)?;
    if set.is_none_or(|t| t > left + SLACK) {
        conn.set_read_timeout(Some(left))
            .map_err(|e| (io_kind(&e), e.to_string()))?;
        *set = Some(left);
    }
    conn.recv_response().map_err(|e| {
        let kind = io_kind(&e);
        let what = match kind {
            FailKind::Timeout => "no reply in time".to_string(),
            _ => format!("reading: {e}"),
        };
        (kind, what)
    })
}
