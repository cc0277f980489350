//! DRAM row cache in front of the SSD tier of embedding-table rows.
//!
//! Keys are row ids (`u64`), values are fixed-size rows of `row_bytes` bytes, and the budget is a
//! capacity in rows. All row bytes live in one slab (`capacity * row_bytes` bytes, allocated once
//! in [`RowCache::new`]); a slot index (`u32`) names a row of the slab, and an id -> slot hash map
//! (with an inline multiply-fold hasher) finds it. Every structure is sized up front, so nothing
//! is allocated on the `get` / `insert` path. The cache is single-threaded: callers share it
//! behind a `Mutex`.
//!
//! # Policies
//!
//! * [`CachePolicy::Lru`]: classic least-recently-used. Unpinned slots sit on an intrusive doubly
//!   linked list (`prev` / `next` in 16-byte per-slot records that also hold the id), so a hit, an
//!   insert and an eviction are all O(1). Cheap and good when recency predicts reuse, but a long
//!   one-shot scan (ids read once, e.g. the cold tail of a Zipfian id stream) flushes the whole
//!   hot set.
//! * [`CachePolicy::Lfu`]: LFU eviction with TinyLFU admission (G. Einziger, R. Friedman,
//!   B. Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM ToS 2017). A count-min
//!   sketch (4 rows of `u8` counters saturating at 15, width the next power of two
//!   `>= max(4 * capacity, 64)`, an id's 4 counters in one 64-byte cache line) estimates every
//!   id's recent access frequency, including ids that are not resident, in 16 to 32 bytes per
//!   row of capacity. It is bumped on every `get` (hit or miss; the `insert` after a miss does
//!   not count the access again), and every
//!   counter is halved after each `10 * max(capacity, 1)` bumps so that the estimate follows the
//!   recent past. The eviction victim is the least frequent of 8 pseudo-randomly sampled unpinned
//!   residents; when the cache is full, a candidate gets in only if it is strictly more frequent
//!   than that victim. Plain LFU or LRU admit every miss, so a long scan of one-shot ids churns
//!   the cache (each of its ids evicts a resident); under TinyLFU a one-shot id is no more
//!   frequent than the reused residents and is refused at the door, which keeps the hot set.
//! * [`CachePolicy::Pinned`]: a pinned set chosen by the caller (typically the hottest ids of the
//!   last interval, from [`RowCache::take_hot`]) plus LRU over the remaining capacity.
//!
//! Pinning ([`RowCache::pin`]) works under every policy: pinned rows are resident and never
//! evicted; the unpinned remainder keeps the policy's behaviour.
//!
//! Under the pinned policy (or any, after [`RowCache::set_track_hot`]), `get` keeps live per-id
//! access counts in a bounded table (at most `max(4 * capacity, 1024)` ids; when full, the less
//! frequent half is dropped) so that [`RowCache::take_hot`] can report the hottest ids of the
//! live traffic.

mod hash;
mod hot;
mod invariants;
mod lru;
mod sample;
mod sketch;
mod slab;
#[cfg(test)]
mod tests;

use hash::{IdBuildHasher, IdMap};
use hot::HotCounts;
use lru::LruList;
use sample::{Order, RNG_SEED, SAMPLES, SampleSet};
use sketch::Sketch;
use slab::{NIL, Slot, SlotState};
use std::fmt;
use std::str::FromStr;

/// Which rows stay in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachePolicy {
    /// Least recently used unpinned row is evicted; every miss is admitted.
    Lru,
    /// Least frequently used (sampled) unpinned row is evicted; TinyLFU admission.
    Lfu,
    /// Pinned set plus LRU over the remaining capacity.
    Pinned,
}

impl CachePolicy {
    /// Every policy, in declaration order.
    pub const ALL: [CachePolicy; 3] = [CachePolicy::Lru, CachePolicy::Lfu, CachePolicy::Pinned];

    /// The policy's name: `"lru"`, `"lfu"` or `"pinned"`.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu => "lfu",
            CachePolicy::Pinned => "pinned",
        }
    }
}

impl FromStr for CachePolicy {
    type Err = String;

    /// Parses a policy name (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, String> {
        CachePolicy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("'{s}' is not lru, lfu or pinned"))
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A DRAM cache of fixed-size rows keyed by row id, with a capacity in rows.
///
/// See the `cache` module's documentation (`cache/mod.rs`) for the policies. All row bytes live in one slab, and
/// every index structure is sized in [`RowCache::new`]: `get` and `insert` never allocate.
pub struct RowCache {
    policy: CachePolicy,
    capacity: usize,
    row_bytes: usize,
    /// `capacity * row_bytes` bytes; slot `s` is `slab[s * row_bytes..(s + 1) * row_bytes]`.
    slab: Vec<u8>,
    /// Id and LRU links of each slot.
    slots: Vec<Slot>,
    state: Vec<SlotState>,
    /// Resident id -> slot.
    map: IdMap<u32>,
    /// Free slots (a stack).
    free: Vec<u32>,
    /// Pinned slots, in pin order.
    pinned: Vec<u32>,
    order: Order,
    /// Frequency sketch (Lfu only).
    sketch: Option<Sketch>,
    /// Live access counts of `get`, for `take_hot`.
    hot: HotCounts,
}

impl fmt::Debug for RowCache {
    /// A summary: the slab and the index structures are not printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowCache")
            .field("policy", &self.policy)
            .field("capacity", &self.capacity)
            .field("row_bytes", &self.row_bytes)
            .field("len", &self.len())
            .field("pinned", &self.pinned.len())
            .field("hot_ids", &self.hot.len())
            .finish_non_exhaustive()
    }
}

impl RowCache {
    /// A cache of `capacity` rows of `row_bytes` bytes each under `policy`. The slab (one
    /// `Vec<u8>` of `capacity * row_bytes` bytes, allocated once here) is the only row storage.
    ///
    /// # Panics
    /// If `capacity >= u32::MAX` or `capacity * row_bytes` overflows `usize`.
    pub fn new(policy: CachePolicy, capacity: usize, row_bytes: usize) -> Self {
        assert!(
            capacity < NIL as usize,
            "row cache capacity {capacity} must be below {NIL}"
        );
        let slab_bytes = capacity.checked_mul(row_bytes).unwrap_or_else(|| {
            panic!("row cache of {capacity} rows of {row_bytes} bytes overflows usize")
        });
        let (order, sketch) = match policy {
            CachePolicy::Lfu => (
                Order::Sampled(SampleSet {
                    members: Vec::with_capacity(capacity),
                    pos: vec![0; capacity],
                    rng: RNG_SEED,
                }),
                Some(Sketch::new(capacity)),
            ),
            CachePolicy::Lru | CachePolicy::Pinned => (
                Order::Recency(LruList {
                    head: NIL,
                    tail: NIL,
                }),
                None,
            ),
        };
        RowCache {
            policy,
            capacity,
            row_bytes,
            slab: vec![0; slab_bytes],
            slots: vec![
                Slot {
                    id: 0,
                    prev: NIL,
                    next: NIL
                };
                capacity
            ],
            state: vec![SlotState::Free; capacity],
            map: IdMap::with_capacity_and_hasher(capacity, IdBuildHasher),
            free: (0..capacity as u32).rev().collect(),
            pinned: Vec::with_capacity(capacity),
            order,
            sketch,
            hot: HotCounts::new(capacity),
        }
        .tracking(policy == CachePolicy::Pinned)
    }

    /// Whether `get` keeps the live access counts behind [`RowCache::take_hot`]: on by default
    /// only under [`CachePolicy::Pinned`], which refreshes its pinned set from them; the other
    /// policies skip the cost (a hash-map update per lookup) unless asked.
    pub fn set_track_hot(&mut self, on: bool) {
        self.hot.set_tracking(on);
    }

    fn tracking(mut self, on: bool) -> Self {
        self.set_track_hot(on);
        self
    }

    /// The policy this cache was built with.
    pub fn policy(&self) -> CachePolicy {
        self.policy
    }

    /// Capacity in rows.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Resident rows, pinned ones included.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no row is resident.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes of resident rows (`len() * row_bytes()`, never above `capacity() * row_bytes()`).
    pub fn resident_bytes(&self) -> usize {
        self.len() * self.row_bytes
    }

    /// Whether `id` is resident. Records nothing.
    pub fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    /// A lookup of `id`: records the access (live counts for [`take_hot`](Self::take_hot), the
    /// frequency sketch under Lfu, recency under Lru / Pinned) and returns the row if resident.
    #[inline]
    pub fn get(&mut self, id: u64) -> Option<&[u8]> {
        self.hot.count(id);
        if let Some(sketch) = &mut self.sketch {
            sketch.record(id);
        }
        let slot = *self.map.get(&id)?;
        if self.state[slot as usize] == SlotState::Cached {
            self.order.touch(&mut self.slots, slot);
        }
        Some(self.row(slot))
    }

    /// Offers `row`, read from disk after a miss of `id`; the policy decides whether to admit it
    /// and what to evict. Returns whether `id` is now resident.
    ///
    /// A row whose length is not `row_bytes()` is refused (returns `false`, changes nothing).
    /// Inserting an id already resident overwrites its bytes and returns `true`. When the cache
    /// is full: Lru / Pinned evict the least recently used unpinned row; Lfu admits `id` only if
    /// its estimated frequency is strictly greater than the sampled victim's (else returns
    /// `false` and changes nothing but the sketch). If every resident row is pinned, returns
    /// `false`.
    pub fn insert(&mut self, id: u64, row: &[u8]) -> bool {
        if row.len() != self.row_bytes {
            return false;
        }
        // No sketch bump: the `get` that missed already counted this access.
        if let Some(&slot) = self.map.get(&id) {
            self.row_mut(slot).copy_from_slice(row);
            if self.state[slot as usize] == SlotState::Cached {
                self.order.touch(&mut self.slots, slot);
            }
            return true;
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let Some(victim) = self.victim() else {
                    return false;
                };
                if let Some(sketch) = &self.sketch
                    && sketch.estimate(id) <= sketch.estimate(self.slots[victim as usize].id)
                {
                    return false;
                }
                self.evict(victim);
                victim
            }
        };
        self.occupy(slot, id, row, SlotState::Cached);
        true
    }

    /// Replaces the pinned set with `rows` (`(id, bytes)` pairs), keeping at most `capacity()`
    /// distinct ids (the rest are ignored, as are rows whose length is not `row_bytes()`; a
    /// repeated id keeps its last bytes).
    ///
    /// Pinned rows are resident and never evicted by [`insert`](Self::insert). Rows pinned
    /// before and absent from the new set become ordinary entries (most recently used under
    /// LRU), which making room for the new set may evict. Works under every policy.
    pub fn pin<'a>(&mut self, rows: impl IntoIterator<Item = (u64, &'a [u8])>) {
        let mut old = std::mem::take(&mut self.pinned);
        for &slot in &old {
            self.state[slot as usize] = SlotState::Cached;
            self.order.push(&mut self.slots, slot);
        }
        old.clear();
        self.pinned = old;
        for (id, row) in rows {
            if self.pinned.len() >= self.capacity {
                break;
            }
            if row.len() != self.row_bytes {
                continue;
            }
            if let Some(&slot) = self.map.get(&id) {
                if self.state[slot as usize] == SlotState::Cached {
                    self.order.remove(&mut self.slots, slot);
                    self.state[slot as usize] = SlotState::Pinned;
                    self.pinned.push(slot);
                }
                self.row_mut(slot).copy_from_slice(row);
                continue;
            }
            let slot = match self.free.pop() {
                Some(slot) => slot,
                None => {
                    // Fewer than `capacity` rows are pinned, so a full cache has a victim.
                    let Some(victim) = self.victim() else { break };
                    self.evict(victim);
                    victim
                }
            };
            self.occupy(slot, id, row, SlotState::Pinned);
        }
    }

    /// Whether `id` is resident and pinned.
    pub fn is_pinned(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&slot| self.state[slot as usize] == SlotState::Pinned)
    }

    /// Number of pinned rows.
    pub fn pinned_len(&self) -> usize {
        self.pinned.len()
    }

    /// The `k` ids with the highest live access counts seen by [`get`](Self::get) since the
    /// last call (most frequent first, ties by smaller id); the counts then restart.
    ///
    /// At most `max(4 * capacity(), 1024)` distinct ids are counted; when the table is full, the
    /// less frequent half is dropped, so the counts are exact for ids that stay frequent and
    /// approximate (lower bounds) otherwise.
    pub fn take_hot(&mut self, k: usize) -> Vec<u64> {
        self.hot.take(k)
    }

    #[inline]
    fn row(&self, slot: u32) -> &[u8] {
        let start = slot as usize * self.row_bytes;
        &self.slab[start..start + self.row_bytes]
    }

    #[inline]
    fn row_mut(&mut self, slot: u32) -> &mut [u8] {
        let start = slot as usize * self.row_bytes;
        &mut self.slab[start..start + self.row_bytes]
    }

    /// Fills the free `slot` with `id` and `row`.
    #[inline]
    fn occupy(&mut self, slot: u32, id: u64, row: &[u8], state: SlotState) {
        self.slots[slot as usize].id = id;
        self.state[slot as usize] = state;
        self.map.insert(id, slot);
        self.row_mut(slot).copy_from_slice(row);
        match state {
            SlotState::Pinned => self.pinned.push(slot),
            _ => self.order.push(&mut self.slots, slot),
        }
    }

    /// Drops the evictable resident of `slot`; the caller reuses the slot.
    #[inline]
    fn evict(&mut self, slot: u32) {
        self.map.remove(&self.slots[slot as usize].id);
        self.order.remove(&mut self.slots, slot);
        self.state[slot as usize] = SlotState::Free;
    }

    /// The evictable slot the policy would drop next, if any.
    #[inline]
    fn victim(&mut self) -> Option<u32> {
        match &mut self.order {
            Order::Recency(l) => (l.tail != NIL).then_some(l.tail),
            Order::Sampled(set) => {
                let sketch = self.sketch.as_ref()?;
                let n = set.members.len();
                let freq = |slot: u32| sketch.estimate(self.slots[slot as usize].id);
                if n <= SAMPLES {
                    return set.members.iter().copied().min_by_key(|&s| freq(s));
                }
                let mut best = set.sample();
                let mut best_freq = freq(best);
                for _ in 1..SAMPLES {
                    let slot = set.sample();
                    let f = freq(slot);
                    if f < best_freq {
                        (best, best_freq) = (slot, f);
                    }
                }
                Some(best)
            }
        }
    }
}
