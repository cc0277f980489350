//! A Redis Cluster client built for serving: every call has a deadline, retries are bounded and
//! fit inside it, and a batch's commands go to their nodes as one pipeline per node, all sent
//! before any reply is read (so the nodes work in parallel on one thread).
//!
//! [`Conn`] speaks the protocol; this file owns routing: the slot map from `CLUSTER SLOTS`,
//! `MOVED` / `ASK` redirections, failover, and which copy of a slot a read goes to. The `redis`
//! crate's own cluster client waits at least 1.28 s per retry and does not pipeline across nodes
//! on one call, which serving cannot afford.
//!
//! One call ([`Cluster::run`]):
//! 1. route each command to a node by its key's slot (primary; with `read_from_replicas`, the
//!    primary and its replicas in turn; a node that failed recently is skipped while another copy
//!    of its slots exists);
//! 2. send every node its commands, then read every node's replies, the nodes served in turn
//!    both ways (`cluster/exchange.rs`), each socket given the attempt's share of the time left
//!    (`time left / attempts left`);
//! 3. commands answered `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, or lost with their
//!    connection (refused, reset, timed out) are retried, at most `retries` times, after a refresh
//!    of the slot map where it is stale, on another copy of the slot where the node failed;
//! 4. past the deadline or the retries, the call fails with the first error, naming the node.
//!
//! Rows of a `ready` version never change, so a replica's copy is as good as its primary's: a
//! read that fails on a primary is retried on a replica at once, without waiting for failover.

use crate::error::{FailKind, Failure, Result};
use crate::ops::Ops;
use crate::options::ClusterOptions;
use crate::resp::{Conn, Replies, Reply};
use crate::slot::{SLOTS, key_slot};
use crate::value::{ServerError, Value, cmd};
use crate::wire::{Node, NodeStats, slot_ranges};
use std::time::{Duration, Instant};

mod exchange;

use exchange::Attempt;

/// A slot range and the nodes holding it, primary first.
#[derive(Debug, Clone)]
struct Range {
    copies: Vec<usize>,
}

/// A connection to a Redis Cluster (see the module documentation). Not shared: one per store.
#[derive(Debug)]
pub struct Cluster {
    opts: ClusterOptions,
    nodes: Vec<Node>,
    ranges: Vec<Range>,
    /// Index into `ranges` for each slot (`u16::MAX`: no node serves it).
    slot_range: Vec<u16>,
    stale: bool,
    refreshed: Option<Instant>,
    /// Turn of the next replica read.
    turn: usize,
    store: String,
}

/// What happened to one command in an attempt.
enum Outcome {
    Retry(Failure),
    Fail(Failure),
}

impl Cluster {
    /// Connects: learns the slot map from the first seed that answers within `connect_timeout`.
    pub fn connect(opts: ClusterOptions) -> Result<Cluster> {
        let store = opts.describe();
        let mut c = Cluster {
            opts,
            nodes: Vec::new(),
            ranges: Vec::new(),
            slot_range: vec![u16::MAX; SLOTS],
            stale: true,
            refreshed: None,
            turn: 0,
            store,
        };
        let deadline = Instant::now() + c.opts.timeout.max(c.opts.connect_timeout * 2);
        c.refresh(deadline).map_err(|f| f.into_error(&c.store))?;
        Ok(c)
    }

    /// What the store is called in errors.
    pub fn name(&self) -> &str {
        &self.store
    }

    pub fn options(&self) -> &ClusterOptions {
        &self.opts
    }

    /// Sets the deadline of later calls (after set-up calls made with [`ClusterOptions::for_setup`]).
    pub fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.opts.timeout = timeout;
    }

    /// Primaries serving at least one slot, `host:port`.
    pub fn primaries(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .ranges
            .iter()
            .map(|r| self.nodes[r.copies[0]].addr.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// One of `keys` per primary that serves any of them (to route a per-connection command
    /// such as `WAIT` to every node a round wrote to).
    pub fn one_key_per_primary<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Vec<&'a [u8]> {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for k in keys {
            let r = self.slot_range[key_slot(k) as usize];
            if r == u16::MAX {
                continue;
            }
            let p = self.ranges[r as usize].copies[0];
            if !seen.contains(&p) {
                seen.push(p);
                out.push(k);
            }
        }
        out
    }

    /// Replicas of the slot of `key` (0 where no node serves it).
    pub fn replicas_of(&self, key: &[u8]) -> usize {
        match self.slot_range[key_slot(key) as usize] {
            u16::MAX => 0,
            r => self.ranges[r as usize].copies.len() - 1,
        }
    }

    /// Round trips (pipelines) so far, over all nodes: cheaper than [`Cluster::node_stats`] on
    /// the read path.
    pub fn round_trips(&self) -> u64 {
        self.nodes.iter().map(|n| n.stats.round_trips).sum()
    }

    /// Counters per node.
    pub fn node_stats(&self) -> Vec<NodeStats> {
        self.nodes.iter().map(|n| n.stats.clone()).collect()
    }

    fn node_index(&mut self, addr: &str) -> usize {
        match self.nodes.iter().position(|n| n.addr == addr) {
            Some(i) => i,
            None => {
                self.nodes.push(Node {
                    addr: addr.into(),
                    conn: None,
                    readonly: false,
                    down_until: None,
                    stats: NodeStats {
                        node: addr.into(),
                        ..NodeStats::default()
                    },
                });
                self.nodes.len() - 1
            }
        }
    }

    /// Re-reads the slot map (`CLUSTER SLOTS`) from a known node or a seed.
    fn refresh(&mut self, deadline: Instant) -> std::result::Result<(), Failure> {
        let mut candidates: Vec<String> = self.nodes.iter().map(|n| n.addr.clone()).collect();
        for s in &self.opts.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        // Nodes that failed lately last.
        let now = Instant::now();
        candidates.sort_by_key(|a| {
            self.nodes
                .iter()
                .find(|n| &n.addr == a)
                .is_some_and(|n| n.down_until.is_some_and(|t| t > now))
        });
        let mut first: Option<Failure> = None;
        for addr in candidates {
            if Instant::now() >= deadline {
                break;
            }
            let i = self.node_index(&addr);
            let cmd = cmd("CLUSTER").arg("SLOTS").packed();
            match self.request(i, &cmd, deadline) {
                Ok(Value::Array(slots)) if !slots.is_empty() => {
                    self.install(&addr, &slots);
                    self.stale = false;
                    self.refreshed = Some(Instant::now());
                    return Ok(());
                }
                Ok(Value::ServerError(e)) => {
                    first.get_or_insert(Failure::new(FailKind::Server, &addr, e.to_string()));
                }
                Ok(other) => {
                    first.get_or_insert(Failure::new(
                        FailKind::Server,
                        &addr,
                        format!("CLUSTER SLOTS answered {other:?}: is this a cluster node?"),
                    ));
                }
                Err(f) => {
                    first.get_or_insert(f);
                }
            }
        }
        Err(first.unwrap_or_else(|| {
            Failure::new(
                FailKind::Timeout,
                "",
                "no node answered CLUSTER SLOTS in time",
            )
        }))
    }

    /// Installs a `CLUSTER SLOTS` answer from `from`.
    fn install(&mut self, from: &str, slots: &[Value]) {
        self.ranges.clear();
        self.slot_range.iter_mut().for_each(|s| *s = u16::MAX);
        for (lo, hi, addrs) in slot_ranges(from, slots) {
            let copies: Vec<usize> = addrs.iter().map(|a| self.node_index(a)).collect();
            let r = self.ranges.len() as u16;
            self.ranges.push(Range { copies });
            self.slot_range[lo as usize..=hi as usize].fill(r);
        }
        // Replicas answer reads only after READONLY; the role of a node may have changed.
        self.nodes.iter_mut().for_each(|n| n.readonly = false);
    }

    /// The node a command on `slot` goes to, avoiding `avoid` and nodes down where another copy
    /// exists. `read`: whether it may go to a replica.
    fn route(&mut self, slot: u16, read: bool, avoid: Option<usize>) -> Option<(usize, bool)> {
        let r = self.slot_range[slot as usize];
        if r == u16::MAX {
            return None;
        }
        let copies = &self.ranges[r as usize].copies;
        let now = Instant::now();
        let usable =
            |i: usize| Some(i) != avoid && self.nodes[i].down_until.is_none_or(|t| t <= now);
        let primary = copies[0];
        if !read {
            return Some((primary, false));
        }
        if self.opts.read_from_replicas && copies.len() > 1 {
            let k = copies.len();
            self.turn = self.turn.wrapping_add(1);
            for j in 0..k {
                let c = copies[(self.turn + j) % k];
                if usable(c) {
                    return Some((c, c != primary));
                }
            }
        } else if usable(primary) {
            return Some((primary, false));
        } else if let Some(&c) = copies[1..].iter().find(|&&c| usable(c)) {
            return Some((c, true));
        }
        Some((primary, false))
    }

    /// Connects node `i` if needed (and sends `READONLY` if `replica`), within `deadline`.
    fn ensure(
        &mut self,
        i: usize,
        replica: bool,
        deadline: Instant,
    ) -> std::result::Result<(), Failure> {
        let addr = self.nodes[i].addr.clone();
        if self.nodes[i].conn.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let t = left.min(self.opts.connect_timeout);
            if t.is_zero() {
                return Err(Failure::new(
                    FailKind::Timeout,
                    &addr,
                    "no time left to connect",
                ));
            }
            let auth = self
                .opts
                .password
                .as_deref()
                .map(|p| (self.opts.username.as_deref(), p));
            let conn = Conn::connect_with(&addr, t, auth, self.opts.tls.as_ref(), deadline)
                .map_err(|(kind, detail)| Failure::new(kind, &addr, detail))?;
            self.nodes[i].conn = Some(conn);
            self.nodes[i].readonly = false;
        }
        if replica && !self.nodes[i].readonly {
            let cmd = cmd("READONLY").packed();
            match self.request(i, &cmd, deadline)? {
                Value::Okay | Value::SimpleString(_) => self.nodes[i].readonly = true,
                other => {
                    return Err(Failure::new(
                        FailKind::Server,
                        &addr,
                        format!("READONLY answered {other:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// One command to node `i`, its reply (server errors as values).
    fn request(
        &mut self,
        i: usize,
        cmd: &[u8],
        deadline: Instant,
    ) -> std::result::Result<Value, Failure> {
        self.ensure(i, false, deadline)?;
        let n = &mut self.nodes[i];
        let conn = n.conn.as_mut().expect("connected above");
        let r = conn
            .send(&[cmd], deadline)
            .and_then(|()| conn.recv(deadline));
        match r {
            Ok(v) => Ok(v),
            Err((kind, detail)) => {
                n.conn = None;
                Err(Failure::new(kind, &n.addr, detail))
            }
        }
    }

    /// Runs `ops` and returns their replies in order, or the first failure (see the module
    /// documentation). `read`: the commands only read (they may go to replicas). A reply that is
    /// an error the cluster will not fix by retrying fails the call.
    pub fn run(&mut self, ops: &Ops, read: bool, deadline: Instant) -> Result<Vec<Value>> {
        let mut replies = Replies::default();
        self.run_into(ops, read, deadline, &mut replies)?;
        Ok(replies.to_values())
    }

    /// [`Cluster::run`] into `replies` (bulk strings in its arena: no allocation per reply).
    pub fn run_into(
        &mut self,
        ops: &Ops,
        read: bool,
        deadline: Instant,
        replies: &mut Replies,
    ) -> Result<()> {
        replies.reset(ops.len());
        self.run_each(ops, read, deadline, |i, r| replies.set(i, r))?;
        debug_assert!((0..ops.len()).all(|c| replies.answered(c)));
        Ok(())
    }

    /// [`Cluster::run`], each reply handed to `f` with its command's index as it is read (a
    /// bulk string as a slice of the connection's buffer: no copy). On success every command's
    /// reply was handed over exactly once (a retried command's by the attempt that answered it).
    pub fn run_each(
        &mut self,
        ops: &Ops,
        read: bool,
        deadline: Instant,
        mut f: impl FnMut(usize, Reply<'_>),
    ) -> Result<()> {
        self.run_inner(ops, read, deadline, &mut f)
            .map_err(|f| f.into_error(&self.store))
    }

    fn run_inner(
        &mut self,
        ops: &Ops,
        read: bool,
        deadline: Instant,
        sink: &mut dyn FnMut(usize, Reply<'_>),
    ) -> std::result::Result<(), Failure> {
        let n = ops.len();
        let mut pending: Vec<usize> = (0..n).collect();
        // Per command: a node to avoid (it failed), an ASK target.
        let mut avoid: Vec<Option<usize>> = vec![None; n];
        let mut ask: Vec<Option<usize>> = vec![None; n];
        let mut last: Option<Failure> = None;
        let attempts = self.opts.retries + 1;
        for attempt in 0..attempts {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if self.stale
                && self
                    .refreshed
                    .is_none_or(|t| now.duration_since(t) >= Duration::from_millis(10))
            {
                // A failed refresh keeps the old map: the commands then fail or get redirected.
                let share = deadline.saturating_duration_since(now) / 2;
                let _ = self.refresh(now + share);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt_deadline = Instant::now() + left / (attempts - attempt);
            // Group by node.
            let mut groups: Vec<(usize, bool, Vec<usize>)> = Vec::new();
            let mut failed: Vec<(usize, Outcome)> = Vec::new();
            for &c in &pending {
                let slot = ops.slot(c);
                let target = match ask[c] {
                    Some(node) => Some((node, false)),
                    None => self.route(slot, read, avoid[c]),
                };
                match target {
                    None => failed.push((
                        c,
                        Outcome::Retry(Failure::new(
                            FailKind::Uncovered,
                            "",
                            format!("no node serves slot {slot}"),
                        )),
                    )),
                    Some((node, replica)) => match groups.iter_mut().find(|g| g.0 == node) {
                        Some(g) => g.2.push(c),
                        None => groups.push((node, replica, vec![c])),
                    },
                }
            }
            if failed.iter().any(|f| matches!(f.1, Outcome::Retry(_))) {
                self.stale = true;
            }
            let at = Attempt {
                groups: &groups,
                ask: &mut ask,
                avoid: &mut avoid,
                failed: &mut failed,
                deadline: attempt_deadline,
                pass_errors: ops.passes_errors(),
            };
            self.exchange(ops, at, sink);
            pending.clear();
            for (c, outcome) in failed {
                match outcome {
                    Outcome::Fail(f) => return Err(f),
                    Outcome::Retry(f) => {
                        last.get_or_insert(f);
                        pending.push(c);
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            pending.sort_unstable();
            if attempt + 1 < attempts {
                // A short pause before retrying (a failover or a resharding step takes time).
                let pause = Duration::from_millis(1 << attempt.min(4));
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(pause.min(left / 4));
            }
        }
        let mut f = last.unwrap_or_else(|| {
            Failure::new(
                FailKind::Timeout,
                "",
                "the deadline passed before the call could start",
            )
        });
        if Instant::now() >= deadline && f.kind != FailKind::Timeout {
            f.detail = format!("{} (deadline of {:?} reached)", f.detail, self.opts.timeout);
        }
        Err(f)
    }

    /// Counts a failure of node `i`, drops its connection and avoids it for a while.
    fn node_failed(&mut self, i: usize, kind: FailKind) {
        let n = &mut self.nodes[i];
        n.conn = None;
        n.readonly = false;
        n.down_until = Some(Instant::now() + self.opts.down_for);
        *n.stats.errors.entry(kind.name()).or_default() += 1;
        self.stale = true;
    }

    /// Whether a server error is one the call retries (a redirect, a node down or loading).
    pub(super) fn retried(e: &ServerError) -> bool {
        e.is_transient()
    }

    /// The node serving `slot` as its primary, by the map known now (an index into
    /// [`Cluster::node_stats`]; `None`: no node serves it): to group commands by node.
    pub fn primary_of(&self, slot: u16) -> Option<usize> {
        let r = self.slot_range[slot as usize];
        (r != u16::MAX).then(|| self.ranges[r as usize].copies[0])
    }

    /// Node `i`'s address.
    pub fn node_addr(&self, i: usize) -> &str {
        &self.nodes[i].addr
    }

    /// Re-reads the slot map before the next call (a node answered that it does not hold keys
    /// the map says it does).
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    fn on_server_error(
        &mut self,
        c: usize,
        e: &ServerError,
        text: &str,
        node: usize,
        ask: &mut [Option<usize>],
    ) -> Outcome {
        let addr = self.nodes[node].addr.clone();
        let redirect = |kind| Failure::new(kind, &addr, text.to_string());
        match e.code() {
            "MOVED" => {
                self.stale = true;
                ask[c] = None;
                *self.nodes[node].stats.errors.entry("moved").or_default() += 1;
                Outcome::Retry(redirect(FailKind::Redirect))
            }
            "ASK" => {
                // "ASK <slot> <host:port>"
                let target = e
                    .details()
                    .and_then(|d| d.split_whitespace().nth(1))
                    .map(str::to_string);
                match target {
                    Some(t) => {
                        let i = self.node_index(&t);
                        ask[c] = Some(i);
                    }
                    None => self.stale = true,
                }
                Outcome::Retry(redirect(FailKind::Redirect))
            }
            _ if e.is_transient() => {
                self.stale = true;
                ask[c] = None;
                Outcome::Retry(redirect(FailKind::Redirect))
            }
            _ => Outcome::Fail(redirect(FailKind::Server)),
        }
    }
}
