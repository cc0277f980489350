//! The hot set: live per-id access counts of `get`, in a bounded table, from which the pinned
//! policy takes the hottest ids of the last interval ([`super::RowCache::take_hot`]).

use super::hash::{IdBuildHasher, IdMap};

/// Smallest bound on the number of ids with a live access count.
const MIN_HOT_LIMIT: usize = 1024;

/// Live access counts of at most `limit` ids; when full, the less frequent half is dropped, so
/// that counts are exact for ids that stay frequent and lower bounds otherwise.
#[derive(Debug)]
pub(super) struct HotCounts {
    counts: IdMap<u32>,
    /// Most ids `counts` may hold.
    limit: usize,
    /// Reused buffer for pruning.
    scratch: Vec<u32>,
    /// Whether `count` counts.
    on: bool,
}

impl HotCounts {
    /// Counts for a cache of `capacity` rows: at most `max(4 * capacity, 1024)` ids.
    pub(super) fn new(capacity: usize) -> Self {
        HotCounts {
            counts: IdMap::with_hasher(IdBuildHasher),
            limit: capacity.saturating_mul(4).max(MIN_HOT_LIMIT),
            scratch: Vec::new(),
            on: false,
        }
    }

    /// Turns counting on or off (room for the bound is reserved the first time it goes on).
    pub(super) fn set_tracking(&mut self, on: bool) {
        if on && !self.on {
            self.counts.reserve(self.limit);
            self.scratch.reserve(self.limit);
        }
        self.on = on;
    }

    /// Whether `count` counts.
    pub(super) fn is_on(&self) -> bool {
        self.on
    }

    /// Ids with a count now.
    pub(super) fn len(&self) -> usize {
        self.counts.len()
    }

    /// The bound on [`HotCounts::len`].
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Counts one `get` of `id`.
    #[inline]
    pub(super) fn count(&mut self, id: u64) {
        if !self.on {
            return;
        }
        if let Some(c) = self.counts.get_mut(&id) {
            *c = c.saturating_add(1);
            return;
        }
        if self.counts.len() >= self.limit {
            self.prune();
        }
        self.counts.insert(id, 1);
    }

    /// The `k` ids with the highest counts (most frequent first, ties by smaller id); the counts
    /// then restart.
    pub(super) fn take(&mut self, k: usize) -> Vec<u64> {
        let mut all: Vec<(u32, u64)> = self.counts.drain().map(|(id, c)| (c, id)).collect();
        let order = |a: &(u32, u64), b: &(u32, u64)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        if k < all.len() {
            all.select_nth_unstable_by(k, order);
            all.truncate(k);
        }
        all.sort_unstable_by(order);
        all.into_iter().map(|(_, id)| id).collect()
    }

    /// Keeps the `limit / 2` most frequent ids.
    #[cold]
    fn prune(&mut self) {
        let keep = self.limit / 2;
        let counts = &mut self.scratch;
        counts.clear();
        counts.extend(self.counts.values().copied());
        if counts.len() <= keep {
            return;
        }
        // Ascending: the `keep` largest counts sit at `idx..`.
        let idx = counts.len() - keep;
        let (_, &mut threshold, above) = counts.select_nth_unstable(idx);
        let mut ties = keep - above.iter().filter(|&&c| c > threshold).count();
        self.counts.retain(|_, c| {
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
