//! One attempt's traffic ([`Cluster::exchange`]): every node's commands sent, then every reply
//! read, the nodes served in turn on both ways, so that each node has work while another's
//! socket is full. (Sent and read one node after the other, a batch of large values had one
//! node working at a time: reading back a pushed round ran at a third of what the three
//! primaries serve.)

use super::{Cluster, Outcome};
use crate::error::Failure;
use crate::ops::Ops;
use crate::resp::Reply;
use redis::Value;
use std::time::Instant;

/// Bytes of commands written to one node before the next node's turn.
const SEND_TURN: usize = 1 << 20;

/// A node's group of commands in an attempt: its node, whether it is read as a replica, and its
/// commands (indices into the call's [`Ops`]).
pub(super) type Group = (usize, bool, Vec<usize>);

/// One node's reading state.
struct Reading {
    group: usize,
    /// The next of its commands to read.
    next: usize,
    broke: Option<Failure>,
    bytes: u64,
    answered: u64,
}

impl Cluster {
    /// Sends every group its commands and reads their replies (see the module documentation):
    /// each reply goes to `sink`, each command not answered goes to `failed` (with `avoid` set
    /// where its node failed), and `ask` is cleared for commands answered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn exchange(
        &mut self,
        ops: &Ops,
        groups: &[Group],
        ask: &mut [Option<usize>],
        avoid: &mut [Option<usize>],
        failed: &mut Vec<(usize, Outcome)>,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, Reply<'_>),
    ) {
        // Connect, and lay out each group's commands: written straight from the packed buffer
        // (vectored), no copy.
        let mut wires: Vec<(usize, Vec<&[u8]>, usize)> = Vec::with_capacity(groups.len());
        for (g, (node, replica, cmds)) in groups.iter().enumerate() {
            if let Err(f) = self.ensure(*node, *replica, deadline) {
                self.node_failed(*node, f.kind);
                fail_all(cmds, &f, *node, avoid, failed);
                continue;
            }
            let mut parts = Vec::with_capacity(cmds.len());
            for &c in cmds {
                if ask[c].is_some() {
                    parts.push(&b"*1\r\n$6\r\nASKING\r\n"[..]);
                }
                parts.push(ops.bytes(c));
            }
            wires.push((g, parts, 0));
        }
        // Send, SEND_TURN bytes per node per turn.
        let mut reading: Vec<Reading> = Vec::with_capacity(wires.len());
        while !wires.is_empty() {
            let mut i = 0;
            while i < wires.len() {
                let (g, parts, at) = &mut wires[i];
                let node = groups[*g].0;
                let mut end = *at;
                let mut bytes = 0;
                while end < parts.len() && (end == *at || bytes + parts[end].len() <= SEND_TURN) {
                    bytes += parts[end].len();
                    end += 1;
                }
                let nd = &mut self.nodes[node];
                let conn = nd.conn.as_mut().expect("ensured");
                match conn.send(&parts[*at..end], deadline) {
                    Ok(()) if end == parts.len() => {
                        reading.push(Reading {
                            group: *g,
                            next: 0,
                            broke: None,
                            bytes: 0,
                            answered: 0,
                        });
                        wires.swap_remove(i);
                    }
                    Ok(()) => {
                        *at = end;
                        i += 1;
                    }
                    Err((kind, detail)) => {
                        let f = Failure::new(kind, &nd.addr, detail);
                        let g = *g;
                        self.node_failed(node, kind);
                        fail_all(&groups[g].2, &f, node, avoid, failed);
                        wires.swap_remove(i);
                    }
                }
            }
        }
        // Read, one reply per node per turn.
        while !reading.is_empty() {
            let mut i = 0;
            while i < reading.len() {
                let r = &mut reading[i];
                let (node, _, cmds) = &groups[r.group];
                let node = *node;
                if r.next == cmds.len() {
                    let (bytes, answered, broke) = (r.bytes, r.answered, r.broke.take());
                    reading.swap_remove(i);
                    let nd = &mut self.nodes[node];
                    nd.stats.commands += answered;
                    nd.stats.bytes += bytes;
                    nd.stats.round_trips += 1;
                    if let Some(f) = broke {
                        // Replies may still be on their way: the connection's state is unknown.
                        self.node_failed(node, f.kind);
                    }
                    continue;
                }
                let c = cmds[r.next];
                r.next += 1;
                i += 1;
                if let Some(f) = &r.broke {
                    failed.push((c, Outcome::Retry(f.clone())));
                    avoid[c] = Some(node);
                    continue;
                }
                let nd = &mut self.nodes[node];
                let conn = nd.conn.as_mut().expect("sent on it");
                if ask[c].is_some() {
                    // ASKING's own +OK.
                    if let Err((kind, detail)) = conn.recv(deadline) {
                        let f = Failure::new(kind, &nd.addr, detail);
                        failed.push((c, Outcome::Retry(f.clone())));
                        r.broke = Some(f);
                        continue;
                    }
                }
                let bytes = &mut r.bytes;
                let got = conn.recv_with(deadline, |reply| match reply {
                    Reply::Other(Value::ServerError(e)) => Err(e.clone()),
                    reply => {
                        if let Reply::Bulk(b) = reply {
                            *bytes += b.len() as u64;
                        }
                        sink(c, reply);
                        Ok(())
                    }
                });
                match got {
                    Ok(Err(e)) => {
                        let text = e.to_string();
                        let outcome = self.on_server_error(c, &e, &text, node, ask);
                        failed.push((c, outcome));
                    }
                    Ok(Ok(())) => {
                        r.answered += 1;
                        ask[c] = None;
                    }
                    Err((kind, detail)) => {
                        let f = Failure::new(kind, &nd.addr, detail);
                        r.broke = Some(f.clone());
                        failed.push((c, Outcome::Retry(f)));
                        avoid[c] = Some(node);
                    }
                }
            }
        }
    }
}

/// Every command of a group fails with `f` (to be retried, avoiding `node`).
fn fail_all(
    cmds: &[usize],
    f: &Failure,
    node: usize,
    avoid: &mut [Option<usize>],
    failed: &mut Vec<(usize, Outcome)>,
) {
    for &c in cmds {
        failed.push((c, Outcome::Retry(f.clone())));
        avoid[c] = Some(node);
    }
}
