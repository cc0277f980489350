//! One node's state (its connection, whether it is avoided) and counters, and the ranges of a
//! `CLUSTER SLOTS` answer.

use crate::resp::Conn;
use crate::slot::SLOTS;
use crate::value::Value;
use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

/// Per-node counters of what calls moved (read by the metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    pub node: String,
    /// Commands answered, and bytes of their replies' values.
    pub commands: u64,
    pub bytes: u64,
    /// Round trips (one pipeline each).
    pub round_trips: u64,
    /// Failures by kind (see [`crate::FailKind::name`]).
    pub errors: HashMap<&'static str, u64>,
}

pub(super) struct Node {
    pub(super) addr: String,
    pub(super) conn: Option<Conn>,
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

/// The ranges of a `CLUSTER SLOTS` answer from node `from`: first and last slot, and the
/// `host:port` of each copy, primary first (a node announced without a host is on `from`'s).
/// Entries that are not ranges, or name no node, are skipped.
pub(super) fn slot_ranges(from: &str, slots: &[Value]) -> Vec<(u16, u16, Vec<String>)> {
    let from_host = from.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
    let mut out = Vec::new();
    for entry in slots {
        let Value::Array(parts) = entry else { continue };
        let (Some(Value::Int(lo)), Some(Value::Int(hi))) = (parts.first(), parts.get(1)) else {
            continue;
        };
        let mut copies = Vec::new();
        for node in &parts[2..] {
            let Value::Array(n) = node else { continue };
            let host = match n.first() {
                Some(Value::BulkString(b)) if !b.is_empty() && b != b"?" => {
                    String::from_utf8_lossy(b).into_owned()
                }
                _ => from_host.to_string(),
            };
            if let Some(Value::Int(port)) = n.get(1) {
                copies.push(format!("{host}:{port}"));
            }
        }
        let clamp = |v: i64| v.clamp(0, SLOTS as i64 - 1) as u16;
        if !copies.is_empty() && lo <= hi {
            out.push((clamp(*lo), clamp(*hi), copies));
        }
    }
    out
}
