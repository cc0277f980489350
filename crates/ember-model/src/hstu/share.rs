//! The history cache's shared tier: users' entries kept in a Redis Cluster, so that replicas
//! serving one model (stateless behind a load balancer) find a user's states whichever replica
//! computed them. A DRAM (and disk) miss asks the cluster before recomputing; every entry the
//! pass keeps is written back.
//!
//! Keys, per model and user, all in one slot (the hash tag): `ember:hist:{M-U}:m`, the entry's
//! head (history, fingerprint, and per segment its place, its request and the CRC-32 of its
//! values), and `ember:hist:{M-U}:s:START:TOKENS:QUERY`, one segment's values (f32,
//! little-endian). `M` is the model's identity ([`model_id`]: its dense weights, its tables'
//! shapes and sampled rows), so two versions never read each other's states. A segment, once
//! computed, never changes: a return writes its new segment and the head, and renews the older
//! segments' expiry (`ttl`), instead of writing the whole entry again.
//!
//! A head or segment that is missing, short, or fails its checksum is refused and its user
//! recomputed, never served; a cluster that does not answer within `timeout` costs the request
//! that much and a recompute (counted, never an error to the client). Row updates are not
//! tracked across replicas, so the tier is refused for a model whose tables take them
//! ([`crate::hstu::HstuModel::set_history_cache`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ember_redis::{Cluster, ClusterOptions, Ops, Value, cmd};

use super::entry::{Entry, Segment};
use super::plan::AsOf;
use crate::history::ShareConfig;

const MAGIC: &[u8; 8] = b"EMBSHAR1";

/// How a read or write of the tier failed.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("the history share {0}")]
    Redis(#[from] ember_redis::RedisError),
    #[error("shared history entry {key} is damaged: {reason}")]
    Damaged { key: String, reason: &'static str },
}

/// Where a cache shares its entries.
pub(crate) struct Share {
    cluster: Mutex<Cluster>,
    /// `{M-` of every key: the model's identity.
    model: u64,
    ttl_s: u64,
    timeout: Duration,
    /// Per user: how many leading segments of its entry are in the cluster, and the last of
    /// them (a later entry that still starts with it needs only its new segments written).
    written: Mutex<HashMap<u64, (usize, Weak<Segment>)>>,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Share")
            .field("model", &format_args!("{:016x}", self.model))
            .field("ttl_s", &self.ttl_s)
            .finish()
    }
}

/// The most users whose written segments are remembered (past it, the memory starts over and
/// the next write of each user sends its whole entry).
const REMEMBERED: usize = 1 << 16;

impl Share {
    /// Connects to the cluster of `cfg` for the model whose identity is `model`.
    pub fn connect(cfg: &ShareConfig, model: u64) -> Result<Share, ShareError> {
        let mut opts = ClusterOptions::parse(&cfg.url)?;
        opts.timeout = cfg.timeout;
        let cluster = Cluster::connect(opts)?;
        Ok(Share {
            cluster: Mutex::new(cluster),
            model,
            ttl_s: cfg.ttl_s.max(1),
            timeout: cfg.timeout,
            written: Mutex::default(),
        })
    }

    fn head_key(&self, user: u64) -> String {
        format!("ember:hist:{{{:016x}-{user:016x}}}:m", self.model)
    }

    /// The key of `user`'s segment of `tokens` from token `start`, computed at query time
    /// `query`.
    fn segment_key(&self, user: u64, start: usize, tokens: usize, query: i64) -> String {
        format!(
            "ember:hist:{{{:016x}-{user:016x}}}:s:{start}:{tokens}:{query}",
            self.model
        )
    }

    fn run(&self, ops: &Ops, read: bool) -> Result<Vec<Value>, ShareError> {
        let deadline = Instant::now() + self.timeout;
        let mut c = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
        Ok(c.run(ops, read, deadline)?)
    }

    /// `user`'s entry in the cluster (`None`: none there), its segments checked against the
    /// head's checksums; `epochs` become its tables' epochs (the tier is only used where they
    /// never change).
    pub fn get(&self, user: u64, epochs: Vec<u64>) -> Result<Option<Entry>, ShareError> {
        let key = self.head_key(user);
        let mut ops = Ops::default();
        ops.push(key.as_bytes(), cmd("GET").arg(key.as_str()));
        let head = match self.run(&ops, true)?.pop() {
            Some(Value::BulkString(b)) => b,
            _ => return Ok(None),
        };
        let damaged = |reason| ShareError::Damaged {
            key: key.clone(),
            reason,
        };
        let h = decode_head(user, &head).map_err(damaged)?;
        let mut ops = Ops::default();
        let mut start = 0;
        for s in &h.segments {
            let k = self.segment_key(user, start, s.tokens, s.as_of.query);
            ops.push(k.as_bytes(), cmd("GET").arg(k.as_str()));
            start += s.tokens;
        }
        let values = self.run(&ops, true)?;
        let mut segments = Vec::with_capacity(h.segments.len());
        for (s, v) in h.segments.iter().zip(values) {
            let Value::BulkString(bytes) = v else {
                return Err(damaged("a segment is missing"));
            };
            if bytes.len() != s.len * 4 || crc32fast::hash(&bytes) != s.crc {
                return Err(damaged("a segment fails its checksum"));
            }
            let kv = from_bytes(&bytes);
            segments.push(Arc::new(Segment {
                tokens: s.tokens,
                as_of: s.as_of,
                kv,
            }));
        }
        self.remember(user, &segments);
        Ok(Some(Entry {
            history: h.history,
            fingerprint: h.fingerprint,
            epochs,
            segments,
        }))
    }

    /// Writes `entry` for `user`: the segments the cluster lacks, the head, and a new expiry
    /// for the segments it has.
    pub fn put(&self, user: u64, entry: &Entry) -> Result<(), ShareError> {
        let known = {
            let w = self.written.lock().unwrap_or_else(|p| p.into_inner());
            match w.get(&user) {
                Some((n, last)) if *n <= entry.segments.len() && *n > 0 => last
                    .upgrade()
                    .filter(|l| Arc::ptr_eq(l, &entry.segments[n - 1]))
                    .map_or(0, |_| *n),
                _ => 0,
            }
        };
        // Not written from here: the cluster's head says which segments another replica wrote
        // (one small read saves sending the user's whole history again).
        let there = match known {
            0 if entry.segments.len() > 1 => self.segments_there(user)?,
            _ => Vec::new(),
        };
        let mut ops = Ops::default();
        let mut start = 0;
        let ttl = self.ttl_s.to_string();
        for (i, s) in entry.segments.iter().enumerate() {
            let k = self.segment_key(user, start, s.tokens, s.as_of.query);
            let listed = there.contains(&(start, s.tokens, s.as_of.query, s.kv.len()));
            if i >= known && !listed {
                write_values(&mut ops, k.as_bytes(), &s.kv);
            }
            ops.push(
                k.as_bytes(),
                cmd("EXPIRE").arg(k.as_str()).arg(ttl.as_str()),
            );
            start += s.tokens;
        }
        let key = self.head_key(user);
        ops.set(key.as_bytes(), &encode_head(user, entry));
        ops.push(
            key.as_bytes(),
            cmd("EXPIRE").arg(key.as_str()).arg(ttl.as_str()),
        );
        self.run(&ops, false)?;
        self.remember(user, &entry.segments);
        Ok(())
    }

    /// The segments the cluster's head for `user` lists: (start, tokens, query, values);
    /// empty where there is no head or it is damaged.
    fn segments_there(&self, user: u64) -> Result<Vec<(usize, usize, i64, usize)>, ShareError> {
        let key = self.head_key(user);
        let mut ops = Ops::default();
        ops.push(key.as_bytes(), cmd("GET").arg(key.as_str()));
        let Some(Value::BulkString(b)) = self.run(&ops, true)?.pop() else {
            return Ok(Vec::new());
        };
        let Ok(h) = decode_head(user, &b) else {
            return Ok(Vec::new());
        };
        let mut start = 0;
        let mut out = Vec::with_capacity(h.segments.len());
        for s in &h.segments {
            out.push((start, s.tokens, s.as_of.query, s.len));
            start += s.tokens;
        }
        Ok(out)
    }

    fn remember(&self, user: u64, segments: &[Arc<Segment>]) {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if w.len() >= REMEMBERED && !w.contains_key(&user) {
            w.clear();
        }
        if let Some(last) = segments.last() {
            w.insert(user, (segments.len(), Arc::downgrade(last)));
        }
    }
}

/// A segment as the head describes it.
struct SegmentHead {
    tokens: usize,
    as_of: AsOf,
    len: usize,
    crc: u32,
}

struct Head {
    history: usize,
    fingerprint: u64,
    segments: Vec<SegmentHead>,
}

/// The head's bytes: magic, user, history, fingerprint, segment count, per segment (tokens,
/// its request's history, candidates, query time, values, CRC-32 of its values), then a CRC-32
/// of all of it.
fn encode_head(user: u64, entry: &Entry) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let mut put = |v: u64| out.extend_from_slice(&v.to_le_bytes());
    put(user);
    put(entry.history as u64);
    put(entry.fingerprint);
    put(entry.segments.len() as u64);
    for s in &entry.segments {
        let a = s.as_of;
        put(s.tokens as u64);
        put(a.history as u64);
        put(a.candidates as u64);
        put(a.query as u64);
        put(s.kv.len() as u64);
        let crc = match cfg!(target_endian = "little") {
            true => crc32fast::hash(bytemuck::cast_slice(&s.kv)),
            false => crc32fast::hash(
                &s.kv
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<_>>(),
            ),
        };
        put(crc as u64);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Adds `SET key values` (f32, little-endian): on a little-endian machine the values' own
/// bytes, not a copy (a first visit's entry is tens of MiB).
fn write_values(ops: &mut Ops, key: &[u8], kv: &[f32]) {
    if cfg!(target_endian = "little") {
        ops.set(key, bytemuck::cast_slice(kv));
    } else {
        let bytes: Vec<u8> = kv.iter().flat_map(|v| v.to_le_bytes()).collect();
        ops.set(key, &bytes);
    }
}

/// Values of a segment's bytes (f32, little-endian; a multiple of 4 bytes).
fn from_bytes(bytes: &[u8]) -> Vec<f32> {
    if cfg!(target_endian = "little") {
        let n = bytes.len() / 4;
        let mut v = vec![0f32; n];
        bytemuck::cast_slice_mut::<f32, u8>(&mut v).copy_from_slice(&bytes[..n * 4]);
        v
    } else {
        (bytes.chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    }
}

fn decode_head(user: u64, buf: &[u8]) -> Result<Head, &'static str> {
    let (body, rest) = super::spill::checked(buf, MAGIC, "not a shared history entry")?;
    let mut words = rest
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
    let mut next = || words.next().ok_or("short");
    if next()? != user {
        return Err("another user's entry");
    }
    let (history, fingerprint, n) = (next()? as usize, next()?, next()?);
    if n > (body.len() / 48) as u64 {
        return Err("a count past the head's size");
    }
    let mut segments = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (tokens, h, c, query) = (next()?, next()?, next()?, next()?);
        let (len, crc) = (next()?, next()?);
        segments.push(SegmentHead {
            tokens: tokens as usize,
            as_of: AsOf {
                history: h as usize,
                candidates: c as usize,
                query: query as i64,
            },
            len: len as usize,
            crc: crc as u32,
        });
    }
    if rest.len() != 8 * (4 + 6 * n as usize) {
        return Err("trailing bytes");
    }
    Ok(Head {
        history,
        fingerprint,
        segments,
    })
}

/// The identity of `model` for shared keys: its dense weights, and each table's shape and
/// sampled rows (the first, middle and last 16), so that another version (new weights or
/// tables) never reads this one's states.
pub fn model_id(model: &super::HstuModel) -> u64 {
    let mut a = crc32fast::Hasher::new();
    let mut b = crc32fast::Hasher::new();
    for l in &model.weights().layers {
        for w in [l.uvqk.weight(), l.output.weight()] {
            for v in w {
                a.update(&v.to_le_bytes());
            }
        }
    }
    let w = model.weights();
    for v in w.positions.iter().chain(&w.times).chain(&w.contextual_w) {
        b.update(&v.to_le_bytes());
    }
    for t in model.embeddings().tables() {
        b.update(&(t.rows() as u64).to_le_bytes());
        b.update(&(t.dim() as u64).to_le_bytes());
        let mut row = vec![0u8; t.dtype().row_bytes(t.dim())];
        let mid = t.rows() / 2;
        let sample = (0..16).chain(mid.saturating_sub(8)..mid + 8);
        let sample = sample.chain(t.rows().saturating_sub(16)..t.rows());
        for r in sample.filter(|&r| r < t.rows()) {
            if t.read_row(r, &mut row).is_ok() {
                b.update(&row);
            }
        }
    }
    (a.finalize() as u64) << 32 | b.finalize() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        crate::hstu::entry::fixtures::entry(&[(5, 4, 0.5), (3, 7, -1.25)], 40, 100)
    }

    #[test]
    fn values_round_trip_through_their_bytes() {
        let kv: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) * 0.37).collect();
        let bytes: Vec<u8> = kv.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(from_bytes(&bytes), kv);
        // The head's checksum of a segment is that of its little-endian bytes.
        let mut e = crate::hstu::entry::fixtures::entry(&[(1, 0, 0.0)], 1, 0);
        Arc::get_mut(&mut e.segments[0]).expect("one owner").kv = kv.clone();
        let h = decode_head(3, &encode_head(3, &e)).unwrap();
        assert_eq!(h.segments[0].crc, crc32fast::hash(&bytes));
        assert!(from_bytes(&[]).is_empty());
    }

    #[test]
    fn a_head_reads_back_and_a_damaged_one_is_refused() {
        let e = entry();
        let bytes = encode_head(9, &e);
        let h = decode_head(9, &bytes).unwrap();
        assert_eq!((h.history, h.fingerprint), (7, 0xfeed));
        assert_eq!(h.segments.len(), 2);
        for (s, t) in h.segments.iter().zip(&e.segments) {
            assert_eq!((s.tokens, s.as_of, s.len), (t.tokens, t.as_of, t.kv.len()));
            let raw: Vec<u8> = t.kv.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(s.crc, crc32fast::hash(&raw));
        }
        assert_eq!(decode_head(8, &bytes).err(), Some("another user's entry"));
        for at in [0, 9, 30, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x04;
            assert_eq!(
                decode_head(9, &bad).err(),
                Some("checksum mismatch"),
                "{at}"
            );
        }
        for cut in [0, 3, 12, bytes.len() - 5] {
            assert!(decode_head(9, &bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
