//! A cache of users' history states (issue 58): per user, every layer's keys and values of its
//! contextual slots and history items as an earlier request computed them, so that a returning
//! user's request computes only its new actions and its candidates (`reuse.rs` runs that pass).
//!
//! What it holds and when it answers (`docs/hstu.md`, "A cache of users' histories"):
//!
//! - **Key:** the user's contextual ids (the `user_id` of MLPerf's model). A user without one
//!   is never cached.
//! - **Entry:** segments of tokens, each with the request that computed it ([`AsOf`]); a
//!   request that reuses an entry appends its new history items as a segment (no copy of the
//!   older ones, which the new entry shares), and a fingerprint of every input of the tokens it
//!   holds (ids, timestamps, action bits, the contextual gate).
//! - **Reuse:** only when the request's first tokens are exactly those inputs and the entry is
//!   within the staleness bound of [`Reuse`]; otherwise the user is recomputed whole and its
//!   entry replaced. Nothing stale beyond the bound, damaged or of another model is ever served.
//! - **Bounded in bytes:** least recently (LRU) or least frequently (LFU) used entries are
//!   evicted; an entry larger than the whole cache is not kept.
//! - **Versions:** a cache belongs to one loaded model ([`super::HstuModel::set_history_cache`]);
//!   a version swap loads a new model with an empty cache, and the old one goes with its model.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use crate::history::{Eviction, HistoryCacheConfig, Reuse, ShareConfig, SpillConfig};

use super::HstuModel;
pub use super::entry::{Entry, Segment};
use super::plan::AsOf;
use super::request::HstuBatch;
use super::share::Share;
use super::spill::Spill;

/// What the cache did, counted since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Users served from an entry.
    pub hits: u64,
    /// Users with no entry.
    pub misses: u64,
    /// Users whose entry was not used: its inputs differ from the request's (a history that
    /// changed, not only grew), or it is past the staleness bound.
    pub refused: u64,
    /// Users never cached (no contextual id).
    pub uncached: u64,
    /// Of the refused: entries that held a row updated since they were computed.
    pub updated: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Entries too large for the whole cache, not kept.
    pub too_large: u64,
    /// Bytes and entries held now.
    pub bytes: u64,
    pub entries: u64,
    /// The disk tier: entries written there on eviction, read back, and bytes held there
    /// now; and entries found damaged (a file on disk, or an entry in DRAM: recomputed).
    pub spilled: u64,
    pub disk_hits: u64,
    pub damaged: u64,
    pub disk_bytes: u64,
    /// Nanoseconds spent reading entries back (and checking them).
    pub disk_read_ns: u64,
    /// The shared tier (a Redis Cluster): entries read from it, entries written to it, calls
    /// that failed (no answer within the deadline, an error; the user recomputed), and
    /// nanoseconds spent reading (and checking) the entries it gave, and writing.
    pub shared_hits: u64,
    pub shared_writes: u64,
    pub share_errors: u64,
    pub share_read_ns: u64,
    pub share_write_ns: u64,
}

impl std::ops::AddAssign for CacheStats {
    /// Adds another cache's counters (several replicas' caches as one).
    fn add_assign(&mut self, o: CacheStats) {
        let CacheStats {
            hits,
            misses,
            refused,
            uncached,
            updated,
            inserts,
            evictions,
            too_large,
            bytes,
            entries,
            spilled,
            disk_hits,
            damaged,
            disk_bytes,
            disk_read_ns,
            shared_hits,
            shared_writes,
            share_errors,
            share_read_ns,
            share_write_ns,
        } = o;
        for (a, b) in [
            (&mut self.hits, hits),
            (&mut self.misses, misses),
            (&mut self.refused, refused),
            (&mut self.uncached, uncached),
            (&mut self.updated, updated),
            (&mut self.inserts, inserts),
            (&mut self.evictions, evictions),
            (&mut self.too_large, too_large),
            (&mut self.bytes, bytes),
            (&mut self.entries, entries),
            (&mut self.spilled, spilled),
            (&mut self.disk_hits, disk_hits),
            (&mut self.damaged, damaged),
            (&mut self.disk_bytes, disk_bytes),
            (&mut self.disk_read_ns, disk_read_ns),
            (&mut self.shared_hits, shared_hits),
            (&mut self.shared_writes, shared_writes),
            (&mut self.share_errors, share_errors),
            (&mut self.share_read_ns, share_read_ns),
            (&mut self.share_write_ns, share_write_ns),
        ] {
            *a += b;
        }
    }
}

#[derive(Debug)]
struct Held {
    entry: Arc<Entry>,
    bytes: usize,
    rank: (u64, u64),
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<u64, Held>,
    /// Entries by eviction rank, lowest first.
    order: BTreeMap<(u64, u64), u64>,
    bytes: usize,
    clock: u64,
}

/// The cache: shared by a model's runners (one lock, held for a map operation, never for a
/// pass).
#[derive(Debug)]
pub struct HistoryCache {
    config: HistoryCacheConfig,
    inner: Mutex<Inner>,
    counts: Counts,
    spill: Option<Spill>,
    share: Option<Share>,
}

/// The counters of [`CacheStats`] as they are kept (each field's meaning is there).
#[derive(Debug, Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    refused: AtomicU64,
    uncached: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    too_large: AtomicU64,
    updated: AtomicU64,
    spilled: AtomicU64,
    disk_hits: AtomicU64,
    damaged: AtomicU64,
    disk_read_ns: AtomicU64,
    shared_hits: AtomicU64,
    shared_writes: AtomicU64,
    share_errors: AtomicU64,
    share_read_ns: AtomicU64,
    share_write_ns: AtomicU64,
}

/// A shared tier's failure, on stderr at most once a minute (each is counted).
fn warn_share_failure(e: &super::share::ShareError) {
    static LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
        *last = Some(std::time::Instant::now());
        eprintln!("warning: history cache: {e} (users recomputed; counted in share_errors)");
    }
}

/// Adds `n` to a counter.
fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// What a request does with a user's entry.
#[derive(Debug, Clone)]
pub enum Plan {
    /// No key: computed whole, not kept.
    Uncached,
    /// Computed whole; its slots and history kept as a new entry under `key`.
    Fresh { key: u64 },
    /// Its first `entry.history` items read from `entry`, the rest computed and appended.
    Reuse { key: u64, entry: Arc<Entry> },
}

impl HistoryCache {
    /// A cache of `config`; an error where its spill directory cannot be made.
    pub fn new(config: HistoryCacheConfig) -> std::io::Result<HistoryCache> {
        let spill = match &config.spill {
            Some(s) => Some(Spill::open(&s.dir, s.bytes)?),
            None => None,
        };
        Ok(HistoryCache {
            config,
            inner: Mutex::new(Inner::default()),
            counts: Default::default(),
            spill,
            share: None,
        })
    }

    /// Shares its entries through `share` (reads on a miss, writes what it keeps).
    pub(crate) fn attach_share(&mut self, share: Share) {
        self.share = Some(share);
    }

    /// Whether it shares its entries with other replicas.
    pub fn is_shared(&self) -> bool {
        self.share.is_some()
    }

    pub fn config(&self) -> &HistoryCacheConfig {
        &self.config
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (bytes, entries) = {
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            (g.bytes as u64, g.map.len() as u64)
        };
        CacheStats {
            hits: n(&c.hits),
            misses: n(&c.misses),
            refused: n(&c.refused),
            uncached: n(&c.uncached),
            inserts: n(&c.inserts),
            evictions: n(&c.evictions),
            too_large: n(&c.too_large),
            updated: n(&c.updated),
            spilled: n(&c.spilled),
            disk_hits: n(&c.disk_hits),
            damaged: n(&c.damaged),
            disk_bytes: self.spill.as_ref().map_or(0, |s| s.held()),
            disk_read_ns: n(&c.disk_read_ns),
            shared_hits: n(&c.shared_hits),
            shared_writes: n(&c.shared_writes),
            share_errors: n(&c.share_errors),
            share_read_ns: n(&c.share_read_ns),
            share_write_ns: n(&c.share_write_ns),
            bytes,
            entries,
        }
    }

    /// What to do for user `u` of `batch` (a batch of `model`): reuse its entry where the
    /// entry is whole, its inputs are the request's first tokens', [`Reuse`] allows it, and
    /// no row its tokens read was updated since.
    pub fn plan(&self, model: &HstuModel, batch: &HstuBatch, u: usize) -> Plan {
        let c = &self.counts;
        let Some(key) = user_key(batch, u) else {
            add(&c.uncached, 1);
            return Plan::Uncached;
        };
        let entry = {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.touch(key, self.config.eviction)
        };
        let entry = entry.or_else(|| self.read_back(key));
        let Some(entry) = entry.or_else(|| self.read_shared(key, model)) else {
            add(&c.misses, 1);
            return Plan::Fresh { key };
        };
        let per_token = model.kv_per_token();
        if !entry.is_whole(batch.slots(), per_token) {
            // A damaged entry is recomputed, never read.
            add(&c.refused, 1);
            add(&c.damaged, 1);
            return Plan::Fresh { key };
        }
        let span = batch.users()[u];
        let now = AsOf::of(batch, u);
        let first = entry.segments[0].as_of;
        let within = match self.config.reuse {
            Reuse::Exact => entry.segments.len() == 1 && first == now,
            Reuse::Stale {
                max_appended,
                max_age_s,
            } => {
                span.history - span.history.min(first.history) <= max_appended
                    && now.query.saturating_sub(first.query) <= max_age_s
            }
        };
        if entry.history > span.history
            || !within
            || fingerprint(batch, u, entry.history) != entry.fingerprint
        {
            add(&c.refused, 1);
            return Plan::Fresh { key };
        }
        if updated_since(model, batch, u, &entry) {
            add(&c.refused, 1);
            add(&c.updated, 1);
            return Plan::Fresh { key };
        }
        add(&c.hits, 1);
        Plan::Reuse { key, entry }
    }

    /// Keeps `entry` for `key` (replacing what was held), evicting others to make room, and
    /// writes it to the shared tier where there is one (on the caller's thread: a return
    /// writes only its new segment).
    pub fn insert(&self, key: u64, entry: Entry) {
        let Some(share) = &self.share else {
            self.keep(key, entry);
            return;
        };
        let c = &self.counts;
        let t = std::time::Instant::now();
        let written = share.put(key, &entry);
        add(&c.share_write_ns, t.elapsed().as_nanos() as u64);
        match written {
            Ok(()) => add(&c.shared_writes, 1),
            Err(e) => {
                add(&c.share_errors, 1);
                warn_share_failure(&e);
            }
        }
        self.keep(key, entry);
    }

    /// The entry `key` in the shared tier, checked and kept in DRAM; `None` where there is
    /// none, it is damaged (counted, recomputed) or the cluster did not answer in time.
    fn read_shared(&self, key: u64, model: &HstuModel) -> Option<Arc<Entry>> {
        let c = &self.counts;
        let share = self.share.as_ref()?;
        let t = std::time::Instant::now();
        let read = share.get(key, epochs(model));
        match read {
            Ok(Some(e)) => {
                add(&c.share_read_ns, t.elapsed().as_nanos() as u64);
                add(&c.shared_hits, 1);
                self.keep(key, e)
            }
            Ok(None) => None,
            Err(super::share::ShareError::Damaged { .. }) => {
                add(&c.damaged, 1);
                None
            }
            Err(e) => {
                add(&c.share_errors, 1);
                warn_share_failure(&e);
                None
            }
        }
    }

    /// [`HistoryCache::insert`], giving back the entry as held (`None`: too large to keep).
    fn keep(&self, key: u64, entry: Entry) -> Option<Arc<Entry>> {
        let c = &self.counts;
        let bytes = entry.bytes();
        if bytes > self.config.bytes {
            add(&c.too_large, 1);
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.remove(key);
            return None;
        }
        let entry = Arc::new(entry);
        let evicted = {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            // An entry replaced keeps its uses (LFU).
            let uses = g.map.get(&key).map_or(0, |h| h.rank.0);
            g.remove(key);
            let mut evicted = Vec::new();
            while g.bytes + bytes > self.config.bytes {
                let Some((_, victim)) = g.order.pop_first() else {
                    break;
                };
                if let Some(e) = g.remove(victim) {
                    evicted.push((victim, e));
                }
            }
            g.clock += 1;
            let rank = match self.config.eviction {
                Eviction::Lru => (g.clock, 0),
                Eviction::Lfu => (uses + 1, g.clock),
            };
            g.order.insert(rank, key);
            g.bytes += bytes;
            let held = entry.clone();
            g.map.insert(
                key,
                Held {
                    entry: held,
                    bytes,
                    rank,
                },
            );
            evicted
        };
        add(&c.evictions, evicted.len() as u64);
        add(&c.inserts, 1);
        // Written outside the lock: the other runners go on.
        if let Some(spill) = &self.spill {
            for (key, e) in evicted {
                if spill.put(key, &e).is_ok() {
                    add(&c.spilled, 1);
                }
            }
        }
        Some(entry)
    }

    /// The entry `key` spilled to disk, read back into DRAM; `None` where there is none or
    /// its file is damaged (deleted, counted, the user recomputed).
    fn read_back(&self, key: u64) -> Option<Arc<Entry>> {
        let c = &self.counts;
        let t = std::time::Instant::now();
        let read = self.spill.as_ref()?.take(key);
        add(&c.disk_read_ns, t.elapsed().as_nanos() as u64);
        match read {
            Ok(Some(e)) => {
                add(&c.disk_hits, 1);
                self.keep(key, e)
            }
            Ok(None) => None,
            Err(_) => {
                add(&c.damaged, 1);
                None
            }
        }
    }

    /// Drops every entry.
    pub fn clear(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *g = Inner {
            clock: g.clock,
            ..Inner::default()
        };
    }
}

impl Inner {
    /// The entry held for `key`, its rank raised (a use).
    fn touch(&mut self, key: u64, eviction: Eviction) -> Option<Arc<Entry>> {
        self.clock += 1;
        let clock = self.clock;
        let held = self.map.get_mut(&key)?;
        self.order.remove(&held.rank);
        held.rank = match eviction {
            Eviction::Lru => (clock, 0),
            Eviction::Lfu => (held.rank.0 + 1, clock),
        };
        self.order.insert(held.rank, key);
        Some(held.entry.clone())
    }

    fn remove(&mut self, key: u64) -> Option<Arc<Entry>> {
        let h = self.map.remove(&key)?;
        self.order.remove(&h.rank);
        self.bytes -= h.bytes;
        Some(h.entry)
    }
}

/// A 64-bit mix (splitmix64's finaliser) of `h` and `v`.
fn mix(h: u64, v: u64) -> u64 {
    let mut z = (h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Every input of token `t`: each feature's ids there, its time and its action bits.
fn token_hash(batch: &HstuBatch, t: usize) -> u64 {
    let kj = batch.lookups.get();
    let mut h = mix(batch.times[t] as u64, batch.actions[t] as u64);
    for f in 0..kj.keys().len() {
        let bag = kj.bag(f, t);
        h = mix(h, bag.len() as u64 | (f as u64) << 32);
        for i in bag {
            h = mix(h, kj.ids().get(i) as u64);
        }
    }
    h
}

/// User `u`'s cache key: its contextual slots' ids, or `None` where it has none.
pub fn user_key(batch: &HstuBatch, u: usize) -> Option<u64> {
    let kj = batch.lookups.get();
    let start = batch.users()[u].start;
    let mut key = 0x5bd1_e995_u64;
    let mut any = false;
    for t in start..start + batch.slots() {
        for f in 0..kj.keys().len() {
            for i in kj.bag(f, t) {
                any = true;
                key = mix(key, kj.ids().get(i) as u64 ^ (f as u64) << 56);
            }
        }
    }
    any.then_some(key)
}

/// The inputs of user `u`'s contextual slots (their ids and whether the model's length gate
/// lets each feature in) and first `history` history items, chained.
pub fn fingerprint(batch: &HstuBatch, u: usize, history: usize) -> u64 {
    let span = batch.users()[u];
    let nc = batch.contextual_on.len() / batch.len().max(1);
    let mut h = mix(history as u64, nc as u64);
    for &on in &batch.contextual_on[u * nc..(u + 1) * nc] {
        h = mix(h, on as u64);
    }
    for t in span.start..span.start + batch.slots() + history.min(span.history) {
        h = mix(h, token_hash(batch, t));
    }
    h
}

/// The update epoch of each of `model`'s tables now.
pub fn epochs(model: &HstuModel) -> Vec<u64> {
    (model.embeddings().tables().iter())
        .map(|t| t.updates().epoch())
        .collect()
}

/// Whether a row that user `u`'s held tokens read (its slots and first `entry.history` items)
/// may have been written since `entry` was computed.
fn updated_since(model: &HstuModel, batch: &HstuBatch, u: usize, entry: &Entry) -> bool {
    let coll = model.embeddings();
    let kj = batch.lookups.get();
    let start = batch.users()[u].start;
    let held = start..start + batch.slots() + entry.history;
    (coll.tables().iter().enumerate()).any(|(t, table)| {
        let since = entry.epochs.get(t).copied().unwrap_or(0);
        if table.updates().epoch() <= since {
            return false;
        }
        let ids = (coll.features().iter().enumerate())
            .filter(|(_, f)| f.table == t)
            .flat_map(|(f, _)| held.clone().flat_map(move |tok| kj.bag(f, tok)))
            .map(|i| kj.ids().get(i) as u64);
        table.updates().any_since(since, ids)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_modes_parse_and_bad_ones_are_named() {
        assert_eq!("exact".parse::<Reuse>().unwrap(), Reuse::Exact);
        assert_eq!("stale".parse::<Reuse>().unwrap(), Reuse::DEFAULT);
        assert_eq!(
            "stale:64:0.5".parse::<Reuse>().unwrap(),
            Reuse::Stale {
                max_appended: 64,
                max_age_s: 43_200
            }
        );
        // What the server says at start-up, in one line of single spaces.
        let said = Reuse::DEFAULT.to_string();
        assert!(
            said.contains("at most 256 actions were appended and 7.0 days"),
            "{said}"
        );
        for bad in [
            "",
            "fresh",
            "stale:64",
            "stale:x:1",
            "stale:1:-1",
            "stale:1:nan",
        ] {
            let e = bad.parse::<Reuse>().unwrap_err().to_string();
            assert!(e.contains("stale:APPENDED:DAYS"), "{bad}: {e}");
        }
    }

    fn entry(bytes: usize) -> Entry {
        super::super::entry::fixtures::entry(&[(1, 0, 0.0)], bytes / 4, 0)
    }

    /// A cache of room for three entries of `size` bytes.
    fn three(eviction: Eviction) -> (HistoryCache, usize) {
        let size = entry(4096).bytes();
        let c = HistoryCache::new(HistoryCacheConfig {
            bytes: 3 * size,
            eviction,
            reuse: Reuse::DEFAULT,
            spill: None,
            share: None,
        })
        .unwrap();
        (c, size)
    }

    fn held(c: &HistoryCache) -> Vec<u64> {
        let g = c.inner.lock().unwrap();
        let mut k: Vec<u64> = g.map.keys().copied().collect();
        k.sort();
        k
    }

    #[test]
    fn lru_evicts_the_least_recently_used_and_stays_in_bounds() {
        let (c, size) = three(Eviction::Lru);
        for k in 1..=3 {
            c.insert(k, entry(4096));
        }
        // 1 used: 2 is now the oldest.
        c.inner.lock().unwrap().touch(1, Eviction::Lru).unwrap();
        c.insert(4, entry(4096));
        assert_eq!(held(&c), vec![1, 3, 4]);
        let st = c.stats();
        assert_eq!(
            (st.evictions, st.entries, st.bytes),
            (1, 3, 3 * size as u64)
        );
        // Replacing an entry frees its bytes first: no eviction.
        c.insert(3, entry(4096));
        assert_eq!((c.stats().evictions, held(&c)), (1, vec![1, 3, 4]));
        // Larger than the whole cache: not kept, and the old entry of its key is dropped.
        c.insert(4, entry(4 * 4096));
        assert_eq!((c.stats().too_large, held(&c)), (1, vec![1, 3]));
        c.clear();
        assert_eq!((c.stats().bytes, c.stats().entries), (0, 0));
    }

    #[test]
    fn lfu_evicts_the_least_often_used_and_keeps_uses_across_replacement() {
        let (c, _) = three(Eviction::Lfu);
        for k in 1..=3 {
            c.insert(k, entry(4096));
        }
        for _ in 0..3 {
            c.inner.lock().unwrap().touch(1, Eviction::Lfu).unwrap();
        }
        c.inner.lock().unwrap().touch(2, Eviction::Lfu).unwrap();
        // 1 extended (replaced): it keeps its uses.
        c.insert(1, entry(4096));
        c.insert(4, entry(4096));
        assert_eq!(held(&c), vec![1, 2, 4]);
        c.insert(5, entry(4096));
        // 4 (one use, older than 5) goes before 2 (two uses).
        assert_eq!(held(&c), vec![1, 2, 5]);
    }
}
