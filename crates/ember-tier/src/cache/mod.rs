//! DRAM row cache in front of the SSD tier of embedding-table rows.
//!
//! Keys are row ids (`u64`), values are fixed-size rows of `row_bytes` bytes, and the budget is a
//! capacity in rows. All row bytes live in one slab (`(capacity + reserve) * row_bytes` bytes,
//! allocated once in [`RowCache::with_reserve`]); a slot index (`u32`) names a row of the slab, and an id -> slot hash map
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
//! # Holding slots
//!
//! A staged batch pools cached rows where they are, in the slab, instead of copying them out:
//! [`RowCache::get_held`] and [`RowCache::insert_held`] return the row's slot and *hold* it, and
//! [`RowCache::release`] gives it back once the batch is pooled. A held slot is off the eviction
//! structure (never evicted, never overwritten); on release it goes back as the most recently
//! used. Rows the policy does not admit can borrow one of `reserve` staging slots past the
//! capacity ([`RowCache::hold_staging`]) for the life of their batch. The slab is shared with the
//! batches through [`RowCache::slab`] (see `slab.rs` for why that is sound).
//!
//! Pinning ([`RowCache::pin`]) works under every policy: pinned rows are resident and never
//! evicted; the unpinned remainder keeps the policy's behaviour.
//!
//! Under the pinned policy (or any, after [`RowCache::set_track_hot`]), `get` keeps live per-id
//! access counts in a bounded table (at most `max(4 * capacity, 1024)` ids; when full, the less
//! frequent half is dropped) so that [`RowCache::take_hot`] can report the hottest ids of the
//! live traffic.

mod access;
mod hash;
mod hot;
mod invariants;
mod lru;
mod pins;
mod sample;
mod sketch;
mod slab;
mod slotmap;
#[cfg(test)]
mod tests;
mod update;

use hot::HotCounts;
use lru::LruList;
pub use pins::PinEpoch;
use sample::{Order, RNG_SEED, SAMPLES, SampleSet};
use sketch::Sketch;
pub use slab::Slab;
use slab::{NIL, Slot, SlotState};
use slotmap::SlotMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
pub use update::Updated;

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
    type Err = crate::UnknownName;

    /// Parses a policy name (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CachePolicy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| crate::UnknownName::new(s, "lru, lfu or pinned"))
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
    /// `(capacity + reserve) * row_bytes` bytes; slot `s` is at `s * row_bytes`.
    slab: Arc<Slab>,
    /// Staging slots past the capacity (`capacity..capacity + reserve`).
    reserve: usize,
    /// Id, LRU links, state and holds of every slot, staging slots included (one record, so
    /// that a hold or a release touches one cache line per slot).
    slots: Vec<Slot>,
    /// Free staging slots (a stack).
    staging_free: Vec<u32>,
    /// Resident id -> slot.
    map: SlotMap,
    /// Free slots (a stack).
    free: Vec<u32>,
    /// Pinned slots, in pin order, and each pinned slot's position in it.
    pinned: Vec<u32>,
    pin_pos: Vec<u32>,
    /// One bit per cache slot, set while its row is *stable*: pinned, or resident in a cache
    /// that covers its ids (see `pins.rs`).
    stable_bits: Vec<u64>,
    /// Whether the capacity covers every id below the index's bound ([`RowCache::with_id_bound`]):
    /// id `i` then lives in slot `i`, nothing is ever evicted, and every resident row is stable.
    covers: bool,
    /// The pinned set's epoch, shared with batches that read pinned slots without holding them,
    /// and the slots of earlier sets held until no batch shares their epoch (see `pins.rs`).
    pin_epoch: PinEpoch,
    retired: std::collections::VecDeque<(PinEpoch, Vec<u32>)>,
    /// Slots of updated rows held for the batches of the current epoch (`update.rs`).
    retiring: Vec<u32>,
    order: Order,
    /// Frequency sketch (Lfu only).
    sketch: Option<Sketch>,
    /// Live access counts of `get`, for `take_hot`.
    hot: HotCounts,
    /// The mark of the latest [`RowCache::find_marked`] pass (0: none yet).
    mark: u32,
}

/// What [`RowCache::find_marked`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// The id is not resident.
    Absent,
    /// The id's first time in the pass: its slot, now held.
    First(u32),
    /// Seen before in the pass: the position given to it then.
    Again(u32),
    /// Stable (pinned, or resident in a cache that covers every id) in this slot: read it
    /// without a hold while keeping [`RowCache::pin_epoch`]; nothing was recorded or marked (see
    /// `pins.rs`).
    Stable(u32),
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
            .field("reserve", &self.reserve)
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
        Self::with_reserve(policy, capacity, 0, row_bytes)
    }

    /// A cache of `capacity` rows, plus `reserve` staging slots that batches borrow for rows the
    /// policy does not keep ([`RowCache::hold_staging`]).
    ///
    /// # Panics
    /// If `capacity + reserve >= u32::MAX` or the slab's size overflows `usize`.
    pub fn with_reserve(
        policy: CachePolicy,
        capacity: usize,
        reserve: usize,
        row_bytes: usize,
    ) -> Self {
        let total = capacity.saturating_add(reserve);
        assert!(
            total < NIL as usize,
            "row cache capacity {capacity} + reserve {reserve} must be below {NIL}"
        );
        let slab_bytes = total.checked_mul(row_bytes).unwrap_or_else(|| {
            panic!("row cache of {total} rows of {row_bytes} bytes overflows usize")
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
            slab: Arc::new(Slab::zeroed(slab_bytes)),
            reserve,
            slots: vec![Slot::FREE; total],
            staging_free: (capacity as u32..total as u32).rev().collect(),
            map: SlotMap::with_capacity(capacity),
            free: (0..capacity as u32).rev().collect(),
            pinned: Vec::with_capacity(capacity),
            pin_pos: vec![0; capacity],
            stable_bits: vec![0; capacity.div_ceil(64)],
            covers: false,
            pin_epoch: PinEpoch::default(),
            retired: std::collections::VecDeque::new(),
            retiring: Vec::new(),
            order,
            sketch,
            hot: HotCounts::new(capacity),
            mark: 0,
        }
        .tracking(policy == CachePolicy::Pinned)
    }

    /// Declares that every id this cache will see is below `bound` (a table's row count): the id
    /// -> slot map becomes a plain array of `bound` slots where that takes no more memory than
    /// the hash map (see `slotmap.rs`). An id at or above the bound is then never resident, and
    /// inserting one panics. Where the capacity covers every id below the bound, id `i` lives in
    /// slot `i` and nothing is evicted ([`covers_ids`](Self::covers_ids)).
    ///
    /// # Panics
    /// If a row is resident already.
    pub fn with_id_bound(mut self, bound: usize) -> Self {
        assert!(self.map.is_empty(), "id bound set on a cache with rows");
        self.map = SlotMap::for_ids_below(self.capacity, bound);
        // Room for every id: each gets the slot of its own number, never evicted (`pins.rs`).
        self.covers = self.map.is_dense() && self.capacity >= bound;
        if self.covers {
            self.free.clear();
            // Nothing to admit or evict by frequency: no sketch to keep up.
            self.sketch = None;
        }
        self
    }

    /// Whether the capacity covers every id below the bound given to
    /// [`with_id_bound`](Self::with_id_bound): each id then lives in the slot of its own
    /// number, no row is ever evicted, and every resident row is read in place without a hold.
    pub fn covers_ids(&self) -> bool {
        self.covers
    }

    /// Whether the id -> slot map is a plain array (see [`RowCache::with_id_bound`]).
    pub fn has_dense_index(&self) -> bool {
        self.map.is_dense()
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

    /// The row bytes, shared with batches that pool held slots in place.
    pub fn slab(&self) -> &Arc<Slab> {
        &self.slab
    }

    /// Staging slots past the capacity.
    pub fn reserve(&self) -> usize {
        self.reserve
    }

    /// Slots held by batches now (cache and staging slots; a slot held twice counts once).
    pub fn held_slots(&self) -> usize {
        self.slots.iter().filter(|r| r.holds > 0).count()
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
        // A held slot is off the eviction structure; its release makes it the most recent.
        if self.slots[slot as usize].state == SlotState::Cached
            && self.slots[slot as usize].holds == 0
        {
            self.order.touch(&mut self.slots, slot);
        }
        Some(self.row(slot))
    }

    /// The row of `id` if resident, recording nothing (no access count, no recency).
    pub fn peek(&self, id: u64) -> Option<&[u8]> {
        let slot = *self.map.get(&id)?;
        Some(self.row(slot))
    }

    /// Replaces the pinned set with `rows` (`(id, bytes)` pairs), keeping at most `capacity()`
    /// distinct ids (the rest are ignored, as are rows whose length is not `row_bytes()`; a
    /// repeated id keeps its last bytes).
    ///
    /// Pinned rows are resident and never evicted by [`insert`](Self::insert). Rows pinned
    /// before and absent from the new set become ordinary entries (most recently used under
    /// LRU), which making room for the new set may evict. Works under every policy.
    pub fn pin<'a>(&mut self, rows: impl IntoIterator<Item = (u64, &'a [u8])>) {
        self.retire_pins();
        let mut old = std::mem::take(&mut self.pinned);
        for &slot in &old {
            // In a covering cache every resident row stays stable.
            self.set_stable_bit(slot, self.covers);
            self.slots[slot as usize].state = SlotState::Cached;
            if self.slots[slot as usize].holds == 0 {
                self.order.push(&mut self.slots, slot);
            }
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
                let held = self.slots[slot as usize].holds > 0;
                if self.slots[slot as usize].state == SlotState::Cached {
                    if !held {
                        self.order.remove(&mut self.slots, slot);
                    }
                    self.slots[slot as usize].state = SlotState::Pinned;
                    self.set_stable_bit(slot, true);
                    self.push_pinned(slot);
                }
                if !held && !self.read_unheld(slot) {
                    self.write_row(slot, row);
                }
                continue;
            }
            let slot = match self.free_slot(id) {
                Some(slot) => slot,
                None if self.covers => continue,
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
            .is_some_and(|&slot| self.slots[slot as usize].state == SlotState::Pinned)
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
        // SAFETY: only `write_row` writes the slab, and it takes `&mut self`, which this borrow
        // rules out while the slice lives; batches only read.
        unsafe {
            self.slab
                .bytes(slot as usize * self.row_bytes, self.row_bytes)
        }
    }

    /// Writes `row` into `slot`, which no batch may hold.
    #[inline]
    fn write_row(&mut self, slot: u32, row: &[u8]) {
        assert_eq!(
            self.slots[slot as usize].holds, 0,
            "write to held slot {slot}"
        );
        debug_assert_eq!(row.len(), self.row_bytes);
        // SAFETY: no batch holds the slot (asserted), so no batch reads it, and `&mut self` makes
        // this the slab's only writer and rules out `row` slices of the cache meanwhile.
        unsafe { self.slab.write(slot as usize * self.row_bytes, row) };
    }

    /// Fills the free `slot` with `id` and `row`.
    #[inline]
    fn occupy(&mut self, slot: u32, id: u64, row: &[u8], state: SlotState) {
        self.slots[slot as usize].id = id;
        self.slots[slot as usize].state = state;
        self.map.insert(id, slot);
        self.write_row(slot, row);
        match state {
            SlotState::Pinned => self.push_pinned(slot),
            _ => self.order.push(&mut self.slots, slot),
        }
        self.set_stable_bit(slot, state == SlotState::Pinned || self.covers);
    }

    /// A free cache slot for the absent `id`, if any: slot `id` in a covering cache.
    #[inline]
    fn free_slot(&mut self, id: u64) -> Option<u32> {
        if self.covers {
            // Ids of a covering cache are below its bound, which is at most its capacity. The
            // slot may still be an orphan that batches read (`update.rs`): then none.
            let slot = u32::try_from(id).expect("ids of a covering cache fit a slot");
            return (self.slots[slot as usize].state == SlotState::Free).then_some(slot);
        }
        self.free.pop()
    }

    /// Drops the evictable resident of `slot`; the caller reuses the slot.
    #[inline]
    fn evict(&mut self, slot: u32) {
        self.map.remove(&self.slots[slot as usize].id);
        self.order.remove(&mut self.slots, slot);
        self.slots[slot as usize].state = SlotState::Free;
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
