//! One attempt's traffic ([`Cluster::exchange`]): every node's commands sent, then every reply
//! read, the nodes served in turn on both ways, so that each node has work while another's
//! socket is full. (Sent and read one node after the other, a batch of large values had one
//! node working at a time: reading back a pushed round ran at a third of what the three
//! primaries serve.)

use super::{Cluster, Outcome};
use crate::error::Failure;
use crate::ops::Ops;
use crate::resp::Reply;
use crate::value::Value;
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

/// A group's commands being sent: the group's index, its commands' bytes (each after an
/// `ASKING` where it needs one), and how many of those are sent.
type Wire<'o> = (usize, Vec<&'o [u8]>, usize);

/// One attempt's groups, deadline and per-command records, borrowed from the call: a command's
/// `ASK` redirection, the node to avoid, and the commands not answered.
pub(super) struct Attempt<'a> {
    pub groups: &'a [Group],
    pub ask: &'a mut [Option<usize>],
    pub avoid: &'a mut [Option<usize>],
    pub failed: &'a mut Vec<(usize, Outcome)>,
    pub deadline: Instant,
    /// The call's own server errors are replies ([`Ops::errors_as_replies`]).
    pub pass_errors: bool,
}

impl Attempt<'_> {
    /// Every command of a group fails with `f` (to be retried, avoiding `node`).
    fn fail_all(&mut self, cmds: &[usize], f: &Failure, node: usize) {
        for &c in cmds {
            self.failed.push((c, Outcome::Retry(f.clone())));
            self.avoid[c] = Some(node);
        }
    }
}

impl Cluster {
    /// Sends every group of the attempt its commands and reads their replies (see the module
    /// documentation): each reply goes to `sink`, each command not answered goes to
    /// `at.failed` (with `at.avoid` set where its node failed), and `at.ask` is cleared for
    /// commands answered.
    pub(super) fn exchange(
        &mut self,
        ops: &Ops,
        mut at: Attempt<'_>,
        sink: &mut dyn FnMut(usize, Reply<'_>),
    ) {
        let wires = self.lay_out(ops, &mut at);
        let reading = self.send_all(wires, &mut at);
        self.read_all(reading, &mut at, sink);
    }

    /// Connects each group's node and lays out its commands: written straight from the packed
    /// buffer (vectored), no copy. A group whose node cannot be reached fails whole.
    fn lay_out<'o>(&mut self, ops: &'o Ops, at: &mut Attempt<'_>) -> Vec<Wire<'o>> {
        let groups = at.groups;
        let mut wires: Vec<Wire<'o>> = Vec::with_capacity(groups.len());
        for (g, (node, replica, cmds)) in groups.iter().enumerate() {
            if let Err(f) = self.ensure(*node, *replica, at.deadline) {
                self.node_failed(*node, f.kind);
                at.fail_all(cmds, &f, *node);
                continue;
            }
            let mut parts = Vec::with_capacity(cmds.len());
            for &c in cmds {
                if at.ask[c].is_some() {
                    parts.push(&b"*1\r\n$6\r\nASKING\r\n"[..]);
                }
                parts.push(ops.bytes(c));
            }
            wires.push((g, parts, 0));
        }
        wires
    }

    /// Sends the wires, SEND_TURN bytes per node per turn; returns the reading state of each
    /// group sent whole. A group whose node fails a send fails whole.
    fn send_all(&mut self, mut wires: Vec<Wire<'_>>, at: &mut Attempt<'_>) -> Vec<Reading> {
        let groups = at.groups;
        let mut reading: Vec<Reading> = Vec::with_capacity(wires.len());
        while !wires.is_empty() {
            let mut i = 0;
            while i < wires.len() {
                let (g, parts, sent) = &mut wires[i];
                let node = groups[*g].0;
                let mut end = *sent;
                let mut bytes = 0;
                while end < parts.len() && (end == *sent || bytes + parts[end].len() <= SEND_TURN) {
                    bytes += parts[end].len();
                    end += 1;
                }
                let nd = &mut self.nodes[node];
                let conn = nd.conn.as_mut().expect("ensured");
                match conn.send(&parts[*sent..end], at.deadline) {
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
                        *sent = end;
                        i += 1;
                    }
                    Err((kind, detail)) => {
                        let f = Failure::new(kind, &nd.addr, detail);
                        let g = *g;
                        self.node_failed(node, kind);
                        at.fail_all(&groups[g].2, &f, node);
                        wires.swap_remove(i);
                    }
                }
            }
        }
        reading
    }

    /// Reads every group's replies, one reply per node per turn, then counts each node's
    /// traffic as its group is done.
    fn read_all(
        &mut self,
        mut reading: Vec<Reading>,
        at: &mut Attempt<'_>,
        sink: &mut dyn FnMut(usize, Reply<'_>),
    ) {
        while !reading.is_empty() {
            let mut i = 0;
            while i < reading.len() {
                let r = &mut reading[i];
                if r.next == at.groups[r.group].2.len() {
                    let node = at.groups[r.group].0;
                    let done = reading.swap_remove(i);
                    self.finish_reading(done, node);
                    continue;
                }
                self.read_next(r, at, sink);
                i += 1;
            }
        }
    }

    /// Counts the traffic of `node`'s finished group `r`; a connection that broke is failed
    /// now, its replies all read or not.
    fn finish_reading(&mut self, r: Reading, node: usize) {
        let nd = &mut self.nodes[node];
        nd.stats.commands += r.answered;
        nd.stats.bytes += r.bytes;
        nd.stats.round_trips += 1;
        if let Some(f) = r.broke {
            // Replies may still be on their way: the connection's state is unknown.
            self.node_failed(node, f.kind);
        }
    }

    /// Reads the reply to the next command of `r`'s group into `sink` (its `ASKING`'s `+OK`
    /// first, where it was sent one); a command whose connection broke fails, to be retried.
    #[inline]
    fn read_next(
        &mut self,
        r: &mut Reading,
        at: &mut Attempt<'_>,
        sink: &mut dyn FnMut(usize, Reply<'_>),
    ) {
        let (node, _, cmds) = &at.groups[r.group];
        let node = *node;
        let c = cmds[r.next];
        r.next += 1;
        if let Some(f) = &r.broke {
            at.failed.push((c, Outcome::Retry(f.clone())));
            at.avoid[c] = Some(node);
            return;
        }
        let nd = &mut self.nodes[node];
        let conn = nd.conn.as_mut().expect("sent on it");
        if at.ask[c].is_some() {
            // ASKING's own +OK.
            if let Err((kind, detail)) = conn.recv(at.deadline) {
                let f = Failure::new(kind, &nd.addr, detail);
                at.failed.push((c, Outcome::Retry(f.clone())));
                r.broke = Some(f);
                return;
            }
        }
        let bytes = &mut r.bytes;
        let pass_errors = at.pass_errors;
        let got = conn.recv_with(at.deadline, |reply| match reply {
            Reply::Other(Value::ServerError(e)) if !pass_errors || Cluster::retried(e) => {
                Err(e.clone())
            }
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
                let outcome = self.on_server_error(c, &e, &text, node, at.ask);
                at.failed.push((c, outcome));
            }
            Ok(Ok(())) => {
                r.answered += 1;
                at.ask[c] = None;
            }
            Err((kind, detail)) => {
                let f = Failure::new(kind, &nd.addr, detail);
                r.broke = Some(f.clone());
                at.failed.push((c, Outcome::Retry(f)));
                at.avoid[c] = Some(node);
            }
        }
    }
}
