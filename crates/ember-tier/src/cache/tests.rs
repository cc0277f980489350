//! The row cache against scalar reference models of its policies (proptest), its budget and
//! pinning guarantees, TinyLFU admission, and the live hot-set counts.

use super::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
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
        // Small caches, and caches with room for every id (which then never evict).
        cap in prop_oneof![0usize..10, 24usize..30],
        row_bytes in 1usize..12,
        pinned_policy in any::<bool>(),
        dense in any::<bool>(),
        ops in proptest::collection::vec(op_strategy(24), 1..250),
    ) {
        let policy = if pinned_policy { CachePolicy::Pinned } else { CachePolicy::Lru };
        let mut cache = RowCache::new(policy, cap, row_bytes);
        if dense {
            // Ids below 24: the index is a plain array wherever that is no larger.
            cache = cache.with_id_bound(24);
            prop_assert_eq!(cache.has_dense_index(), 24 * 4 <= (2 * cap).next_power_of_two().max(8) * 16);
            prop_assert_eq!(cache.covers_ids(), cap >= 24);
        }
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
                        let before: Vec<bool> = (0..universe).map(|i| cache.contains(i)).collect();
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
        let first: Vec<(u64, Vec<u8>)> = (1000..1008).map(|id| (id, pattern(id, 1, rb))).collect();
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
        let second: Vec<(u64, Vec<u8>)> = (2000..2008).map(|id| (id, pattern(id, 2, rb))).collect();
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
        assert_eq!(cache.hot.limit(), limit);
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
        assert_eq!(cache.hot.len(), 0);
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
    let e = "x".parse::<CachePolicy>().unwrap_err();
    assert_eq!(e.value, "x");
    assert_eq!(e.to_string(), "'x' is not lru, lfu or pinned");
}

/// A cache with room for every id keeps id `i` in slot `i`, answers marked lookups of resident
/// ids as stable (no map, no mark, no hold), evicts nothing, and never rewrites a stable row
/// while a batch shares its epoch.
#[test]
fn covering_cache_reads_every_resident_row_in_place() {
    for policy in CachePolicy::ALL {
        let mut cache = RowCache::new(policy, 40, 4).with_id_bound(32);
        assert!(cache.covers_ids());
        for id in (0..32u64).rev().step_by(3) {
            assert!(cache.insert(id, &pattern(id, 1, 4)));
        }
        let mark = cache.next_mark();
        for id in 0..32u64 {
            let want = if id % 3 == 31 % 3 {
                Marked::Stable(id as u32)
            } else {
                Marked::Absent
            };
            assert_eq!(cache.find_marked(id, mark, 0), want, "{policy} id {id}");
            assert_eq!(
                cache.find_marked(id, mark, 0),
                want,
                "a stable id is not marked"
            );
        }
        assert_eq!(cache.held_slots(), 0);
        // Filling every id evicts nothing.
        for id in 0..32u64 {
            assert!(cache.insert(id, &pattern(id, 2, 4)));
        }
        assert_eq!(cache.len(), 32);
        // While a batch keeps the epoch, a stable row keeps its bytes.
        let epoch = cache.pin_epoch();
        assert!(cache.insert(5, &pattern(5, 3, 4)));
        assert_eq!(cache.get(5), Some(&pattern(5, 2, 4)[..]));
        // A new pinned set starts a new epoch: rows read under the old one keep their bytes
        // until it is let go and reaped.
        cache.pin([(7u64, &pattern(7, 3, 4)[..])]);
        assert!(cache.is_pinned(7));
        assert_eq!(cache.get(7), Some(&pattern(7, 2, 4)[..]));
        assert!(cache.insert(5, &pattern(5, 3, 4)));
        assert_eq!(cache.get(5), Some(&pattern(5, 2, 4)[..]));
        cache.check_invariants();
        drop(epoch);
        cache.reap_pins();
        assert!(cache.insert(5, &pattern(5, 3, 4)));
        assert_eq!(cache.get(5), Some(&pattern(5, 3, 4)[..]));
        assert_eq!(cache.held_slots(), 0);
        cache.check_invariants();
    }
}

/// Updates: a row no batch reads is rewritten in place; a row a batch holds, or reads unheld
/// under an epoch, keeps its old bytes for that batch while the id leaves the cache, and its
/// slot comes back once the batch is done. Random holds, epochs and updates, for every policy
/// and for small and covering caches.
#[test]
fn updates_never_tear_a_row_a_batch_reads() {
    for seed in 21..25 {
        updates_never_tear_with(seed);
    }
}

/// A batch in flight in the test below: the slots it read (bytes seen, whether held) and its
/// epoch.
type ReadingBatch = (Vec<(u32, Vec<u8>, bool)>, PinEpoch);

fn updates_never_tear_with(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Updates absent, in place, dropped.
    let mut outcomes = [0usize; 3];
    for policy in CachePolicy::ALL {
        for cap in [4usize, 16, 40] {
            let bound = 32u64;
            let rb = 8;
            let mut cache = RowCache::new(policy, cap, rb).with_id_bound(bound as usize);
            assert_eq!(cache.covers_ids(), cap >= 32);
            let mut latest: HashMap<u64, Vec<u8>> = HashMap::new();
            // Batches in flight: the slots they read and the bytes they saw, and their epoch.
            let mut batches: Vec<ReadingBatch> = Vec::new();
            for step in 1..4000u64 {
                let id = rng.random_range(0..bound);
                match rng.random_range(0..10) {
                    0..3 => {
                        // A miss fetched: the store has the latest bytes.
                        let row = latest.entry(id).or_insert_with(|| pattern(id, step, rb));
                        cache.insert(id, row);
                    }
                    3..5 => {
                        // A batch reads a few rows: held, or unheld when stable.
                        let mut read = Vec::new();
                        let epoch = cache.pin_epoch();
                        let mark = cache.next_mark();
                        for k in 0..3 {
                            let id = rng.random_range(0..bound);
                            match cache.find_marked(id, mark, k) {
                                Marked::Stable(slot) => {
                                    read.push((slot, cache.slot_row(slot).to_vec(), false));
                                }
                                Marked::First(slot) => {
                                    cache.hold(slot);
                                    read.push((slot, cache.slot_row(slot).to_vec(), true));
                                }
                                Marked::Again(_) | Marked::Absent => {}
                            }
                        }
                        batches.push((read, epoch));
                    }
                    5..8 => {
                        let row = pattern(id, step, rb);
                        let was = cache.contains(id);
                        let got = cache.update(id, &row);
                        outcomes[got as usize] += 1;
                        assert_eq!(got == Updated::Absent, !was, "{policy} cap {cap}");
                        if got == Updated::InPlace {
                            assert_eq!(cache.get(id), Some(&row[..]));
                        } else {
                            assert!(!cache.contains(id), "an updated row in use leaves");
                        }
                        latest.insert(id, row);
                        if rng.random_bool(0.5) {
                            cache.end_updates();
                        }
                    }
                    8 => {
                        let ids: Vec<u64> = (0..3).map(|_| rng.random_range(0..bound)).collect();
                        let rows: Vec<(u64, Vec<u8>)> = ids
                            .iter()
                            .map(|&i| {
                                (
                                    i,
                                    latest
                                        .get(&i)
                                        .cloned()
                                        .unwrap_or_else(|| pattern(i, step, rb)),
                                )
                            })
                            .collect();
                        cache.end_updates();
                        cache.pin(rows.iter().map(|(i, r)| (*i, r.as_slice())));
                        for (i, r) in rows {
                            latest.insert(i, r);
                        }
                    }
                    _ => {
                        // The oldest batch is done: its rows were whole and unchanged.
                        if !batches.is_empty() {
                            let (read, epoch) = batches.remove(0);
                            for (slot, bytes, held) in read {
                                assert_eq!(
                                    cache.slot_row(slot),
                                    &bytes[..],
                                    "{policy} cap {cap}: a batch's row changed under it"
                                );
                                if held {
                                    cache.release(slot);
                                }
                            }
                            drop(epoch);
                            cache.reap_pins();
                        }
                    }
                }
                // Every resident row has its latest bytes.
                for i in 0..bound {
                    if cache.contains(i) {
                        assert_eq!(
                            cache.peek(i),
                            latest.get(&i).map(|r| &r[..]),
                            "{policy} cap {cap} id {i}"
                        );
                    }
                }
                cache.check_invariants();
            }
            for (read, epoch) in batches.drain(..) {
                for (slot, bytes, held) in read {
                    assert_eq!(cache.slot_row(slot), &bytes[..]);
                    if held {
                        cache.release(slot);
                    }
                }
                drop(epoch);
            }
            cache.end_updates();
            cache.reap_pins();
            assert_eq!(cache.held_slots(), 0, "{policy} cap {cap}: orphans freed");
            cache.drop_all();
            assert_eq!(cache.len(), 0);
            cache.check_invariants();
        }
    }
    assert!(
        outcomes.iter().all(|&n| n > 0),
        "seed {seed}: every outcome met: {outcomes:?}"
    )
}
