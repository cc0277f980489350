//! The bytes of request bodies the server holds at once, across every connection: a request's
//! body counts from when it starts arriving until its answer is produced (its decoded samples
//! live that long, and cost a bounded multiple of it), so that memory is bounded in total and
//! not only per request. A request that does not fit is refused with 503: from its
//! `Content-Length` before its body is read, or, for a body of unknown length (chunked, HTTP/2,
//! gRPC), as soon as the bytes that arrived pass what is left.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The server-wide budget.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Budget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `n` bytes if they fit.
    fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Relaxed, Relaxed, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Relaxed);
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Relaxed)
    }
}

/// One request's part of the budget, given back when the last holder (the request's service
/// future, its body) drops it.
#[derive(Debug)]
pub(crate) struct Share {
    budget: Arc<Budget>,
    held: AtomicUsize,
}

impl Share {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Share {
            budget,
            held: AtomicUsize::new(0),
        }
    }

    /// Makes the share at least `total` bytes; false (and unchanged) when the budget cannot.
    pub(crate) fn cover(&self, total: usize) -> bool {
        let held = self.held.load(Relaxed);
        if total <= held {
            return true;
        }
        if !self.budget.try_take(total - held) {
            return false;
        }
        self.held.store(total, Relaxed);
        true
    }

    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.budget.give(self.held.load(Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_take_what_fits_and_give_it_back() {
        let b = Arc::new(Budget::new(100));
        let a = Share::new(b.clone());
        assert!(a.cover(60));
        assert!(a.cover(50), "already held");
        let c = Share::new(b.clone());
        assert!(!c.cover(41), "60 + 41 > 100");
        assert!(c.cover(40));
        assert!(!a.cover(61));
        assert_eq!(b.used(), 100);
        drop(a);
        assert_eq!(b.used(), 40);
        assert!(c.cover(100));
        drop(c);
        assert_eq!(b.used(), 0);
    }
}
