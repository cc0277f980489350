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

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;

/// "No slot" in the intrusive LRU list.
const NIL: u32 = u32::MAX;
/// Residents sampled when looking for an LFU victim.
const SAMPLES: usize = 8;
/// Rows of the count-min sketch.
const SKETCH_ROWS: usize = 4;
/// Columns of each sketch row in one 64-byte block.
const BLOCK_COLS: usize = 16;
/// Saturation value of a sketch counter.
const COUNTER_MAX: u8 = 15;
/// Smallest bound on the number of ids with a live access count.
const MIN_HOT_LIMIT: usize = 1024;
/// Odd 64-bit multipliers and seeds (digits of pi / golden ratio) for hashing.
const MUL: u64 = 0x9E37_79B9_7F4A_7C15;
const MAP_SEED: u64 = 0x243F_6A88_85A3_08D3;
const SKETCH_SEED: u64 = 0x1319_8A2E_0370_7344;
const SKETCH_MUL: u64 = 0xA409_3822_299F_31D1;
/// Seed of the victim-sampling xorshift generator (any non-zero value).
const RNG_SEED: u64 = 0xBE54_66CF_34E9_0C6C;

/// Multiplies as 128 bits and folds the halves: a fast, well-mixing 64-bit hash step.
#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Hasher for `u64` ids (one folded multiply per word).
#[derive(Debug, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = fold_mul(self.0 ^ u64::from(b), MUL);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = fold_mul(self.0 ^ n, MUL);
    }
}

/// Builds [`IdHasher`]s (fixed seed: iteration order is deterministic).
#[derive(Debug, Clone, Copy, Default)]
struct IdBuildHasher;

impl BuildHasher for IdBuildHasher {
    type Hasher = IdHasher;

    #[inline]
    fn build_hasher(&self) -> IdHasher {
        IdHasher(MAP_SEED)
    }
}

type IdMap<V> = HashMap<u64, V, IdBuildHasher>;

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

/// What a slot of the slab holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Resident and evictable (on the policy's eviction structure).
    Cached,
    /// Resident and pinned (on no eviction structure).
    Pinned,
}

/// One 64-byte cache line of the sketch: 16 consecutive counters of each of the 4 rows.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Block([[u8; BLOCK_COLS]; SKETCH_ROWS]);

/// Count-min sketch of 4 rows of saturating `u8` counters with periodic halving.
///
/// Row `r` is the concatenation of `blocks[..].0[r]`, so the sketch is `4 x width` counters with
/// `width = 16 * blocks.len()`. An id's column in every row lies in the same block (chosen by the
/// top bits of its hash; the low 16 bits pick the column inside each 16-counter group): the
/// 4 counters of an id share one cache line, so a lookup costs one memory access, not four.
#[derive(Debug)]
struct Sketch {
    blocks: Vec<Block>,
    /// `64 - log2(blocks.len())`: the top bits of a hash pick the block.
    shift: u32,
    /// Increments since the last halving.
    additions: usize,
    /// Increments between halvings.
    period: usize,
}

impl Sketch {
    fn new(capacity: usize) -> Self {
        let width = capacity.saturating_mul(4).max(64).next_power_of_two();
        let blocks = width / BLOCK_COLS;
        Sketch {
            blocks: vec![Block([[0; BLOCK_COLS]; SKETCH_ROWS]); blocks],
            shift: 64 - blocks.trailing_zeros(),
            additions: 0,
            period: capacity.max(1).saturating_mul(10),
        }
    }

    /// The block of `id` and the hash whose low 16 bits give its column in each row group.
    #[inline]
    fn locate(&self, id: u64) -> (usize, u64) {
        let h = fold_mul(id ^ SKETCH_SEED, SKETCH_MUL);
        ((h >> self.shift) as usize, h)
    }

    /// Estimated recent frequency of `id` (never below the truth up to saturation and aging).
    #[inline]
    fn estimate(&self, id: u64) -> u8 {
        let (b, h) = self.locate(id);
        let rows = &self.blocks[b].0;
        let col = |r: usize| (h >> (4 * r)) as usize & (BLOCK_COLS - 1);
        rows[0][col(0)]
            .min(rows[1][col(1)])
            .min(rows[2][col(2)])
            .min(rows[3][col(3)])
    }

    /// Records one access of `id`; halves every counter once per `period` accesses.
    #[inline]
    fn record(&mut self, id: u64) {
        let (b, h) = self.locate(id);
        for (r, row) in self.blocks[b].0.iter_mut().enumerate() {
            let c = &mut row[(h >> (4 * r)) as usize & (BLOCK_COLS - 1)];
            if *c < COUNTER_MAX {
                *c += 1;
            }
        }
        self.additions += 1;
        if self.additions >= self.period {
            self.additions = 0;
            for c in self.counters_mut() {
                *c >>= 1;
            }
        }
    }

    fn counters(&self) -> impl Iterator<Item = &u8> {
        self.blocks.iter().flat_map(|b| b.0.as_flattened())
    }

    fn counters_mut(&mut self) -> impl Iterator<Item = &mut u8> {
        self.blocks.iter_mut().flat_map(|b| b.0.as_flattened_mut())
    }
}

/// Per-slot metadata: 16 bytes, so an LRU step touches one cache line per slot.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Id held (meaningful when the slot is not free).
    id: u64,
    /// Neighbours on the LRU list (Lru / Pinned policies; `NIL` otherwise).
    prev: u32,
    next: u32,
}

/// Intrusive doubly linked list over `Slot::prev` / `Slot::next`, most recently used at `head`.
#[derive(Debug)]
struct LruList {
    head: u32,
    tail: u32,
}

impl LruList {
    #[inline]
    fn push_front(&mut self, slots: &mut [Slot], slot: u32) {
        let s = &mut slots[slot as usize];
        s.prev = NIL;
        s.next = self.head;
        if self.head == NIL {
            self.tail = slot;
        } else {
            slots[self.head as usize].prev = slot;
        }
        self.head = slot;
    }

    #[inline]
    fn unlink(&mut self, slots: &mut [Slot], slot: u32) {
        let Slot { prev, next, .. } = slots[slot as usize];
        if prev == NIL {
            self.head = next;
        } else {
            slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            slots[next as usize].prev = prev;
        }
    }

    #[inline]
    fn touch(&mut self, slots: &mut [Slot], slot: u32) {
        if self.head != slot {
            self.unlink(slots, slot);
            self.push_front(slots, slot);
        }
    }
}

/// Dense set of evictable slots, for O(1) uniform sampling (LFU).
#[derive(Debug)]
struct SampleSet {
    members: Vec<u32>,
    /// Index in `members` of each member slot.
    pos: Vec<u32>,
    /// xorshift64 state.
    rng: u64,
}

impl SampleSet {
    #[inline]
    fn push(&mut self, slot: u32) {
        self.pos[slot as usize] = self.members.len() as u32;
        self.members.push(slot);
    }

    #[inline]
    fn remove(&mut self, slot: u32) {
        let i = self.pos[slot as usize] as usize;
        self.members.swap_remove(i);
        if let Some(&moved) = self.members.get(i) {
            self.pos[moved as usize] = i as u32;
        }
    }

    /// A pseudo-random member (xorshift64, multiply-shift range reduction); needs a member.
    #[inline]
    fn sample(&mut self) -> u32 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        let n = self.members.len() as u128;
        self.members[((u128::from(x) * n) >> 64) as usize]
    }
}

/// The structure that orders the evictable (resident, unpinned) slots.
#[derive(Debug)]
enum Order {
    /// Lru and Pinned policies.
    Recency(LruList),
    /// Lfu policy.
    Sampled(SampleSet),
}

impl Order {
    #[inline]
    fn push(&mut self, slots: &mut [Slot], slot: u32) {
        match self {
            Order::Recency(l) => l.push_front(slots, slot),
            Order::Sampled(s) => s.push(slot),
        }
    }

    #[inline]
    fn remove(&mut self, slots: &mut [Slot], slot: u32) {
        match self {
            Order::Recency(l) => l.unlink(slots, slot),
            Order::Sampled(s) => s.remove(slot),
        }
    }

    #[inline]
    fn touch(&mut self, slots: &mut [Slot], slot: u32) {
        if let Order::Recency(l) = self {
            l.touch(slots, slot);
        }
    }
}

/// A DRAM cache of fixed-size rows keyed by row id, with a capacity in rows.
///
/// See the [module documentation](self) for the policies. All row bytes live in one slab, and
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
    hot: IdMap<u32>,
    /// Most ids `hot` may hold.
    hot_limit: usize,
    /// Reused buffer for pruning `hot`.
    hot_scratch: Vec<u32>,
    /// Whether `get` counts into `hot`.
    track_hot: bool,
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
        let hot_limit = capacity.saturating_mul(4).max(MIN_HOT_LIMIT);
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
            hot: IdMap::default(),
            hot_limit,
            hot_scratch: Vec::new(),
            track_hot: false,
        }
        .tracking(policy == CachePolicy::Pinned)
    }

    /// Whether `get` keeps the live access counts behind [`RowCache::take_hot`]: on by default
    /// only under [`CachePolicy::Pinned`], which refreshes its pinned set from them; the other
    /// policies skip the cost (a hash-map update per lookup) unless asked.
    pub fn set_track_hot(&mut self, on: bool) {
        if on && !self.track_hot {
            self.hot.reserve(self.hot_limit);
            self.hot_scratch.reserve(self.hot_limit);
        }
        self.track_hot = on;
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
        self.count_hot(id);
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
        let mut all: Vec<(u32, u64)> = self.hot.drain().map(|(id, c)| (c, id)).collect();
        let order = |a: &(u32, u64), b: &(u32, u64)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        if k < all.len() {
            all.select_nth_unstable_by(k, order);
            all.truncate(k);
        }
        all.sort_unstable_by(order);
        all.into_iter().map(|(_, id)| id).collect()
    }

    /// Checks the internal invariants and panics with a message if one fails (for tests):
    /// map / slot consistency, `len() <= capacity()`, the eviction structure (LRU list or LFU
    /// sample set) holds exactly the unpinned residents, every pinned id is resident, the live
    /// count table respects its bound.
    pub fn check_invariants(&self) {
        let cap = self.capacity;
        assert_eq!(self.slab.len(), cap * self.row_bytes, "slab size");
        assert_eq!(self.slots.len(), cap, "slots length");
        assert_eq!(self.state.len(), cap, "state length");
        assert!(self.len() <= cap, "len {} > capacity {cap}", self.len());
        assert!(
            self.resident_bytes() <= cap * self.row_bytes,
            "resident bytes over budget"
        );
        assert_eq!(
            self.len() + self.free.len(),
            cap,
            "resident + free != capacity"
        );
        for (&id, &slot) in &self.map {
            let s = slot as usize;
            assert!(s < cap, "id {id} maps to slot {slot} >= capacity");
            assert_ne!(
                self.state[s],
                SlotState::Free,
                "id {id} maps to free slot {slot}"
            );
            assert_eq!(
                self.slots[s].id, id,
                "slot {slot} holds {} not {id}",
                self.slots[s].id
            );
        }
        for &slot in &self.free {
            assert_eq!(
                self.state[slot as usize],
                SlotState::Free,
                "free slot {slot} in use"
            );
        }
        let count = |st: SlotState| self.state.iter().filter(|&&x| x == st).count();
        let (cached, pinned) = (count(SlotState::Cached), count(SlotState::Pinned));
        assert_eq!(
            cached + pinned,
            self.len(),
            "slot states disagree with the map"
        );
        assert_eq!(pinned, self.pinned.len(), "pinned slot list length");
        assert!(pinned <= cap, "more pinned rows than capacity");
        for &slot in &self.pinned {
            let s = slot as usize;
            assert_eq!(
                self.state[s],
                SlotState::Pinned,
                "pinned list slot {slot} not pinned"
            );
            assert_eq!(
                self.map.get(&self.slots[s].id),
                Some(&slot),
                "pinned slot {slot} not resident"
            );
        }
        match &self.order {
            Order::Recency(l) => {
                let (mut seen, mut prev, mut cur) = (0usize, NIL, l.head);
                while cur != NIL {
                    assert!(seen < cached, "LRU list longer than the unpinned residents");
                    let c = cur as usize;
                    assert_eq!(
                        self.state[c],
                        SlotState::Cached,
                        "LRU list holds slot {cur}"
                    );
                    assert_eq!(self.slots[c].prev, prev, "LRU prev link of slot {cur}");
                    seen += 1;
                    prev = cur;
                    cur = self.slots[c].next;
                }
                assert_eq!(l.tail, prev, "LRU tail");
                assert_eq!(seen, cached, "LRU list misses unpinned residents");
                assert!(self.sketch.is_none(), "sketch outside Lfu");
            }
            Order::Sampled(s) => {
                assert_eq!(s.members.len(), cached, "sample set size");
                for (i, &slot) in s.members.iter().enumerate() {
                    assert_eq!(
                        self.state[slot as usize],
                        SlotState::Cached,
                        "sampled {slot}"
                    );
                    assert_eq!(
                        s.pos[slot as usize] as usize, i,
                        "sample position of {slot}"
                    );
                }
                let sketch = self.sketch.as_ref().expect("Lfu has a sketch");
                assert!(
                    sketch.counters().all(|&c| c <= COUNTER_MAX),
                    "sketch counter"
                );
            }
        }
        assert!(
            self.hot.len() <= self.hot_limit,
            "live counts over their bound"
        );
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

    /// Counts one `get` of `id` in the bounded live table.
    #[inline]
    fn count_hot(&mut self, id: u64) {
        if !self.track_hot {
            return;
        }
        if let Some(c) = self.hot.get_mut(&id) {
            *c = c.saturating_add(1);
            return;
        }
        if self.hot.len() >= self.hot_limit {
            self.prune_hot();
        }
        self.hot.insert(id, 1);
    }

    /// Keeps the `hot_limit / 2` most frequent ids of the live table.
    #[cold]
    fn prune_hot(&mut self) {
        let keep = self.hot_limit / 2;
        let counts = &mut self.hot_scratch;
        counts.clear();
        counts.extend(self.hot.values().copied());
        if counts.len() <= keep {
            return;
        }
        // Ascending: the `keep` largest counts sit at `idx..`.
        let idx = counts.len() - keep;
        let (_, &mut threshold, above) = counts.select_nth_unstable(idx);
        let mut ties = keep - above.iter().filter(|&&c| c > threshold).count();
        self.hot.retain(|_, c| {
            if *c > threshold {
                true
            } else if *c == threshold && ties > 0 {
                ties -= 1;
                true
            } else {
                false
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::VecDeque;

    /// A row derived from `id` and a write `version`; no byte is ever zero.
    fn pattern(id: u64, version: u64, row_bytes: usize) -> Vec<u8> {
        (0..row_bytes as u64)
            .map(|j| ((id.wrapping_mul(31) + version.wrapping_mul(7) + j) % 251 + 1) as u8)
            .collect()
    }

    /// Scalar reference of the LRU (and Pinned) policy, pinning included.
    struct LruModel {
        cap: usize,
        pinned: Vec<u64>,
        /// Unpinned residents, most recently used first.
        order: VecDeque<u64>,
        bytes: HashMap<u64, Vec<u8>>,
    }

    impl LruModel {
        fn new(cap: usize) -> Self {
            LruModel {
                cap,
                pinned: vec![],
                order: VecDeque::new(),
                bytes: HashMap::new(),
            }
        }

        fn resident(&self, id: u64) -> bool {
            self.pinned.contains(&id) || self.order.contains(&id)
        }

        fn len(&self) -> usize {
            self.pinned.len() + self.order.len()
        }

        fn get(&mut self, id: u64) -> Option<Vec<u8>> {
            if let Some(p) = self.order.iter().position(|&x| x == id) {
                self.order.remove(p);
                self.order.push_front(id);
            } else if !self.pinned.contains(&id) {
                return None;
            }
            Some(self.bytes[&id].clone())
        }

        /// Makes room for one row; false if everything is pinned.
        fn make_room(&mut self) -> bool {
            if self.len() < self.cap {
                return true;
            }
            match self.order.pop_back() {
                Some(v) => {
                    self.bytes.remove(&v);
                    true
                }
                None => false,
            }
        }

        fn insert(&mut self, id: u64, row: Vec<u8>) -> bool {
            if self.pinned.contains(&id) {
                self.bytes.insert(id, row);
                return true;
            }
            if let Some(p) = self.order.iter().position(|&x| x == id) {
                self.order.remove(p);
            } else if !self.make_room() {
                return false;
            }
            self.order.push_front(id);
            self.bytes.insert(id, row);
            true
        }

        fn pin(&mut self, rows: &[(u64, Vec<u8>)]) {
            for id in std::mem::take(&mut self.pinned) {
                self.order.push_front(id);
            }
            for (id, row) in rows {
                if self.pinned.len() >= self.cap {
                    break;
                }
                if !self.pinned.contains(id) {
                    if let Some(p) = self.order.iter().position(|x| x == id) {
                        self.order.remove(p);
                    } else {
                        assert!(self.make_room());
                    }
                    self.pinned.push(*id);
                }
                self.bytes.insert(*id, row.clone());
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get(u64),
        Insert(u64),
        Pin(Vec<u64>),
    }

    fn op_strategy(ids: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..ids).prop_map(Op::Get),
            6 => (0..ids).prop_map(Op::Insert),
            1 => proptest::collection::vec(0..ids, 0..8).prop_map(Op::Pin),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// RowCache(Lru / Pinned) matches the scalar LRU model op by op.
        #[test]
        fn lru_matches_model(
            cap in 0usize..10,
            row_bytes in 1usize..12,
            pinned_policy in any::<bool>(),
            ops in proptest::collection::vec(op_strategy(24), 1..250),
        ) {
            let policy = if pinned_policy { CachePolicy::Pinned } else { CachePolicy::Lru };
            let mut cache = RowCache::new(policy, cap, row_bytes);
            let mut model = LruModel::new(cap);
            for (version, op) in (1u64..).zip(ops) {
                match op {
                    Op::Get(id) => {
                        let want = model.get(id);
                        prop_assert_eq!(cache.get(id).map(<[u8]>::to_vec), want);
                    }
                    Op::Insert(id) => {
                        let row = pattern(id, version, row_bytes);
                        prop_assert_eq!(cache.insert(id, &row), model.insert(id, row.clone()));
                    }
                    Op::Pin(ids) => {
                        let rows: Vec<(u64, Vec<u8>)> =
                            ids.iter().map(|&id| (id, pattern(id, version, row_bytes))).collect();
                        cache.pin(rows.iter().map(|(id, r)| (*id, r.as_slice())));
                        model.pin(&rows);
                    }
                }
                cache.check_invariants();
                prop_assert_eq!(cache.len(), model.len());
                prop_assert_eq!(cache.pinned_len(), model.pinned.len());
                for id in 0..24 {
                    prop_assert_eq!(cache.contains(id), model.resident(id), "id {}", id);
                    prop_assert_eq!(cache.is_pinned(id), model.pinned.contains(&id));
                }
            }
        }
    }

    /// Budget and byte integrity under random gets / inserts / pins, for every policy.
    #[test]
    fn budget_and_bytes_hold_for_every_policy() {
        let mut rng = StdRng::seed_from_u64(7);
        for policy in CachePolicy::ALL {
            for (cap, row_bytes) in [(0, 4), (1, 1), (3, 8), (17, 13), (64, 16)] {
                let mut cache = RowCache::new(policy, cap, row_bytes);
                let mut last: HashMap<u64, Vec<u8>> = HashMap::new();
                let universe = 3 * cap as u64 + 5;
                for version in 0..3000u64 {
                    let id = rng.random_range(0..universe);
                    match rng.random_range(0..20) {
                        0..9 => {
                            if let Some(row) = cache.get(id) {
                                assert_eq!(row, last[&id].as_slice(), "{policy} id {id}");
                            }
                        }
                        9..19 => {
                            let row = pattern(id, version, row_bytes);
                            let before: Vec<bool> =
                                (0..universe).map(|i| cache.contains(i)).collect();
                            if cache.insert(id, &row) {
                                last.insert(id, row);
                                assert!(cache.contains(id));
                            } else {
                                let after: Vec<bool> =
                                    (0..universe).map(|i| cache.contains(i)).collect();
                                assert_eq!(before, after, "refused insert changed residency");
                            }
                        }
                        _ => {
                            let n = rng.random_range(0..cap + 3);
                            let rows: Vec<(u64, Vec<u8>)> = (0..n)
                                .map(|_| {
                                    let id = rng.random_range(0..universe);
                                    // Now and then a wrong-length row, which pin ignores.
                                    let len = if rng.random_range(0..10) == 0 { 2 } else { 0 };
                                    (id, pattern(id, version, row_bytes + len))
                                })
                                .collect();
                            cache.pin(rows.iter().map(|(id, r)| (*id, r.as_slice())));
                            for (id, r) in &rows {
                                if r.len() == row_bytes && cache.is_pinned(*id) {
                                    last.insert(*id, r.clone());
                                }
                            }
                            assert!(cache.pinned_len() <= cap);
                        }
                    }
                    cache.check_invariants();
                    assert!(cache.len() <= cap);
                    assert!(cache.resident_bytes() <= cap * row_bytes);
                    assert_eq!(cache.resident_bytes(), cache.len() * row_bytes);
                }
            }
        }
    }

    /// Pinned rows survive heavy traffic under every policy; re-pinning demotes the old set.
    #[test]
    fn pinned_rows_are_never_evicted() {
        let (cap, rb) = (32, 16);
        for policy in CachePolicy::ALL {
            let mut rng = StdRng::seed_from_u64(11);
            let mut cache = RowCache::new(policy, cap, rb);
            let first: Vec<(u64, Vec<u8>)> =
                (1000..1008).map(|id| (id, pattern(id, 1, rb))).collect();
            cache.pin(first.iter().map(|(id, r)| (*id, r.as_slice())));
            let traffic = |cache: &mut RowCache, rng: &mut StdRng| {
                for v in 0..20_000 {
                    let id = rng.random_range(0..500);
                    if cache.get(id).is_none() {
                        cache.insert(id, &pattern(id, v, rb));
                    }
                }
                cache.check_invariants();
            };
            traffic(&mut cache, &mut rng);
            assert_eq!(cache.pinned_len(), 8);
            for (id, row) in &first {
                assert!(cache.is_pinned(*id), "{policy}: {id} lost its pin");
                assert_eq!(cache.get(*id), Some(row.as_slice()), "{policy}: {id}");
            }
            let second: Vec<(u64, Vec<u8>)> =
                (2000..2008).map(|id| (id, pattern(id, 2, rb))).collect();
            cache.pin(second.iter().map(|(id, r)| (*id, r.as_slice())));
            cache.check_invariants();
            assert_eq!(cache.pinned_len(), 8);
            for (id, _) in &first {
                assert!(!cache.is_pinned(*id), "{policy}: {id} still pinned");
                if policy != CachePolicy::Lfu {
                    // Demoted rows become the most recently used ordinary entries.
                    assert!(cache.contains(*id), "{policy}: demoted {id} dropped");
                }
            }
            traffic(&mut cache, &mut rng);
            for (id, row) in &second {
                assert!(cache.is_pinned(*id));
                assert_eq!(cache.get(*id), Some(row.as_slice()));
            }
            if policy != CachePolicy::Lfu {
                // Never touched again, the demoted rows aged out of the LRU.
                assert!(first.iter().all(|(id, _)| !cache.contains(*id)), "{policy}");
            }
        }
    }

    /// Under a hot set plus a long one-shot scan, TinyLFU admission keeps the hot set while LRU
    /// loses it.
    #[test]
    fn lfu_admission_protects_hot_set_from_scan() {
        let (cap, rb, hot) = (64, 8, 16u64);
        let run = |policy: CachePolicy| {
            let mut cache = RowCache::new(policy, cap, rb);
            let mut hits = 0usize;
            let steps = 40_000u64;
            for i in 0..steps {
                // One hot access in 8: a hot id comes back every 128 accesses, > capacity.
                let id = if i % 8 == 0 {
                    (i / 8) % hot
                } else {
                    1_000_000 + i
                };
                if cache.get(id).is_some() {
                    hits += 1;
                } else {
                    cache.insert(id, &pattern(id, 0, rb));
                }
            }
            cache.check_invariants();
            let resident_hot = (0..hot).filter(|&id| cache.contains(id)).count();
            (hits as f64 / steps as f64, resident_hot)
        };
        let (lru_rate, lru_hot) = run(CachePolicy::Lru);
        let (lfu_rate, lfu_hot) = run(CachePolicy::Lfu);
        assert!(lfu_rate > lru_rate, "lfu {lfu_rate} <= lru {lru_rate}");
        assert!(lfu_rate > 0.1, "lfu hit rate {lfu_rate}: hot set not kept");
        assert_eq!(lfu_hot, hot as usize, "lfu lost hot rows");
        assert!(lru_hot < hot as usize);
    }

    /// A full Lfu cache refuses a candidate no more frequent than the victim, and admits it once
    /// it has become more frequent; Lru always admits.
    #[test]
    fn lfu_admission_by_frequency() {
        let mut lfu = RowCache::new(CachePolicy::Lfu, 4, 2);
        let mut lru = RowCache::new(CachePolicy::Lru, 4, 2);
        for cache in [&mut lfu, &mut lru] {
            for id in 1..=4u64 {
                for _ in 0..5 {
                    cache.get(id);
                }
                assert!(cache.insert(id, &[id as u8; 2]), "not full: admitted");
            }
        }
        assert!(!lfu.insert(99, &[9; 2]), "one-shot candidate admitted");
        assert!(!lfu.contains(99));
        assert!(
            (1..=4).all(|id| lfu.contains(id)),
            "refusal changed residency"
        );
        assert!(lru.insert(99, &[9; 2]));
        assert!(!lru.contains(1), "lru evicts its least recent entry");
        for _ in 0..10 {
            assert!(lfu.get(99).is_none());
        }
        assert!(lfu.insert(99, &[9; 2]), "frequent candidate refused");
        assert_eq!(lfu.get(99), Some(&[9u8; 2][..]));
        assert_eq!((1..=4).filter(|&id| lfu.contains(id)).count(), 3);
        lfu.check_invariants();
    }

    /// take_hot reports the most frequent ids in order, ties by smaller id, then restarts.
    #[test]
    fn take_hot_orders_and_restarts() {
        let mut cache = RowCache::new(CachePolicy::Lru, 4, 2);
        cache.set_track_hot(true);
        // id i (1..=10) gets 3 * i accesses, interleaved; ids 20 and 15 tie with id 10.
        for round in 0..30 {
            for id in 1..=10u64 {
                if round < 3 * id {
                    cache.get(id);
                }
            }
            cache.get(20);
            cache.get(15);
        }
        assert_eq!(cache.take_hot(4), vec![10, 15, 20, 9]);
        assert!(
            cache.take_hot(4).is_empty(),
            "counts restart after take_hot"
        );
        cache.get(5);
        cache.get(5);
        cache.get(3);
        assert_eq!(cache.take_hot(10), vec![5, 3]);
        assert!(cache.take_hot(0).is_empty());
    }

    /// The live count table stays bounded and keeps very frequent ids.
    #[test]
    fn take_hot_memory_bound() {
        for cap in [10usize, 1000] {
            let mut cache = RowCache::new(CachePolicy::Lfu, cap, 4);
            cache.set_track_hot(true);
            let limit = (4 * cap).max(1024);
            assert_eq!(cache.hot_limit, limit);
            for i in 0..50_000u64 {
                cache.get(if i % 10 == 0 {
                    7
                } else if i % 10 == 1 {
                    8
                } else {
                    100 + i
                });
                assert!(cache.hot.len() <= limit);
            }
            cache.check_invariants();
            assert_eq!(cache.take_hot(2), vec![7, 8]);
            assert!(cache.hot.is_empty());
        }
    }

    #[test]
    fn capacity_zero_and_wrong_row_length() {
        for policy in CachePolicy::ALL {
            let mut cache = RowCache::new(policy, 0, 8);
            assert!(!cache.insert(1, &[1; 8]));
            assert!(cache.get(1).is_none());
            cache.pin([(1u64, &[1u8; 8][..])]);
            assert_eq!(
                (cache.len(), cache.pinned_len(), cache.resident_bytes()),
                (0, 0, 0)
            );
            assert!(cache.is_empty() && !cache.contains(1) && !cache.is_pinned(1));
            cache.check_invariants();

            let mut cache = RowCache::new(policy, 4, 8);
            assert!(!cache.insert(1, &[1; 7]));
            assert!(!cache.insert(1, &[1; 9]));
            assert!(cache.is_empty());
            assert!(cache.insert(1, &[1; 8]));
            assert!(!cache.insert(1, &[2; 3]), "wrong length on a resident id");
            assert_eq!(cache.get(1), Some(&[1u8; 8][..]));
            assert!(cache.insert(1, &[3; 8]), "overwrite of a resident id");
            assert_eq!(cache.get(1), Some(&[3u8; 8][..]));
            cache.pin([(2u64, &[1u8; 5][..])]);
            assert_eq!(cache.pinned_len(), 0);
            cache.check_invariants();
        }
    }

    #[test]
    fn full_of_pins_refuses_inserts() {
        for policy in CachePolicy::ALL {
            let mut cache = RowCache::new(policy, 3, 1);
            let rows = [(1u64, [1u8]), (2, [2]), (3, [3]), (4, [4])];
            cache.pin(rows.iter().map(|(id, r)| (*id, &r[..])));
            assert_eq!(cache.pinned_len(), 3, "extra pinned rows are ignored");
            assert!(!cache.is_pinned(4) && !cache.contains(4));
            assert!(!cache.insert(9, &[9]));
            assert!(cache.insert(2, &[7]), "overwriting a pinned row");
            assert_eq!(cache.get(2), Some(&[7u8][..]));
            cache.check_invariants();
        }
    }

    #[test]
    fn policy_names_round_trip() {
        for p in CachePolicy::ALL {
            assert_eq!(p.name().parse::<CachePolicy>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        assert_eq!("LRU".parse::<CachePolicy>(), Ok(CachePolicy::Lru));
        assert_eq!(
            "x".parse::<CachePolicy>(),
            Err("'x' is not lru, lfu or pinned".to_string())
        );
    }
}
