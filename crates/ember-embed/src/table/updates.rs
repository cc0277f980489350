//! Which rows of a table were rewritten since a point: a bounded log of its row updates, for
//! what holds values computed from its rows (the HSTU history cache) to tell whether a row it
//! read has changed since.
//!
//! Each write ([`crate::EmbeddingTable::write_rows`], or the tier's row cache taking an update)
//! is an epoch; the log keeps the last [`KEPT`] rows written with their epochs. A question about
//! epochs it has forgotten (or a reset: a stream of updates that was trimmed) answers "changed",
//! never "unchanged".

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Row writes the log remembers.
pub const KEPT: usize = 1 << 16;

/// A table's log of row updates.
#[derive(Debug, Default)]
pub struct UpdateLog {
    epoch: AtomicU64,
    log: Mutex<Log>,
}

#[derive(Debug, Default)]
struct Log {
    /// (epoch, row), oldest first.
    rows: VecDeque<(u64, u64)>,
    /// Writes of this epoch and earlier are (partly) forgotten.
    forgotten: u64,
}

impl UpdateLog {
    /// Writes so far (0: never written).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Records that rows `ids` were rewritten (one epoch).
    pub fn wrote(&self, ids: &[u64]) {
        let mut g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let e = self.epoch.load(Ordering::Acquire) + 1;
        g.rows.extend(ids.iter().map(|&id| (e, id)));
        while g.rows.len() > KEPT {
            let (old, _) = g.rows.pop_front().expect("over KEPT rows");
            g.forgotten = g.forgotten.max(old);
        }
        self.epoch.store(e, Ordering::Release);
    }

    /// Records that any row may have changed (updates were lost).
    pub fn reset(&self) {
        let mut g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let e = self.epoch.load(Ordering::Acquire) + 1;
        g.rows.clear();
        g.forgotten = e;
        self.epoch.store(e, Ordering::Release);
    }

    /// Whether any of `ids` may have been rewritten after epoch `since`: true where one was,
    /// or where the log no longer knows.
    pub fn any_since(&self, since: u64, ids: impl IntoIterator<Item = u64>) -> bool {
        if self.epoch() <= since {
            return false;
        }
        // The caller's ids (a user's history) are fewer than the log's rows: they are the set,
        // built before the lock, and the log's recent rows are scanned under it.
        let ids: HashSet<u64> = ids.into_iter().collect();
        let g = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if since < g.forgotten {
            return true;
        }
        (g.rows.iter().rev())
            .take_while(|(e, _)| *e > since)
            .any(|(_, id)| ids.contains(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_written_after_an_epoch_are_found_and_older_ones_not() {
        let log = UpdateLog::default();
        assert!(!log.any_since(0, [1, 2, 3]));
        log.wrote(&[5, 9]);
        log.wrote(&[7]);
        assert_eq!(log.epoch(), 2);
        assert!(log.any_since(0, [1, 9]));
        assert!(!log.any_since(1, [5, 9, 1]));
        assert!(log.any_since(1, [7]));
        assert!(!log.any_since(2, [5, 7, 9]));
        assert!(!log.any_since(0, std::iter::empty()));
    }

    #[test]
    fn a_forgotten_or_reset_epoch_answers_changed() {
        let log = UpdateLog::default();
        log.wrote(&[1]);
        let big: Vec<u64> = (100..100 + KEPT as u64).collect();
        log.wrote(&big);
        // Epoch 1's row was dropped: a question since 0 cannot be answered "unchanged".
        assert!(log.any_since(0, [42]));
        assert!(!log.any_since(1, [42]));
        assert!(log.any_since(1, [100]));
        log.reset();
        assert!(log.any_since(2, [42]));
        assert!(!log.any_since(3, [42]));
    }
}
