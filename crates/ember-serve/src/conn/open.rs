//! The set of open connections: the cap, evictions to make room, and stopping them all.
//!
//! A connection is admitted and registered in one critical section, and the evictions under
//! way are counted under the same lock as the connections. Admission reads "open, less those
//! asked to close" at one instant, so no interleaving of accepts (either listener) and ends
//! can admit past the cap. An earlier version kept the evictions in an atomic decremented
//! after the lock was released: an accept in that window saw the ended connection gone but
//! still counted as closing, admitted without making room, and the server stayed one over
//! its cap (caught by the reliability suite's descriptor test, about one run in five).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;

use super::state::ConnState;
use crate::metrics as m;

/// Every open connection of the server (both listeners), for the cap and for stopping.
#[derive(Debug)]
pub(crate) struct OpenConns {
    cap: usize,
    next: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    conns: HashMap<u64, (Arc<ConnState>, AbortHandle)>,
    /// Connections asked to make room that have not closed yet (they no longer count).
    evicting: usize,
}

/// What became of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Under the cap.
    Yes,
    /// At the cap: the oldest idle connection was asked to close to make room.
    Evicted,
    /// At the cap with none idle: refused.
    No,
}

impl Inner {
    /// Asks the connection idle the longest (and not already asked) to close; false when none
    /// is idle.
    fn evict_oldest_idle(&mut self) -> bool {
        let oldest = (self.conns.values())
            .filter(|(s, _)| !s.evicted())
            .filter_map(|(s, _)| s.idle_since().map(|t| (t, s)))
            .min_by_key(|(t, _)| *t);
        match oldest {
            Some((_, s)) => {
                s.evict();
                self.evicting += 1;
                true
            }
            None => false,
        }
    }
}

impl OpenConns {
    pub(crate) fn new(cap: usize) -> Self {
        OpenConns {
            cap,
            next: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections open now (those asked to make room included, until they close).
    pub(crate) fn open(&self) -> usize {
        self.lock().conns.len()
    }

    /// The cap on open connections.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Admits a new connection with `state`, making room at the cap, and registers the task
    /// `start` spawns for it (given its id), all under one lock: a connection that ends at
    /// once is never registered after it removed itself, and two accepts never both take the
    /// last place. `start` is not called when the connection is refused.
    pub(crate) fn enter(
        &self,
        state: Arc<ConnState>,
        start: impl FnOnce(u64) -> AbortHandle,
    ) -> Admit {
        let mut inner = self.lock();
        let admit = if inner.conns.len().saturating_sub(inner.evicting) < self.cap {
            Admit::Yes
        } else if inner.evict_oldest_idle() {
            Admit::Evicted
        } else {
            return Admit::No;
        };
        let id = self.next.fetch_add(1, Relaxed);
        let task = start(id);
        inner.conns.insert(id, (state, task));
        admit
    }

    /// Asks the connection idle the longest to close (the process is out of descriptors);
    /// false when none is idle.
    pub(crate) fn evict_oldest_idle(&self) -> bool {
        self.lock().evict_oldest_idle()
    }

    /// A connection ended: it leaves the open connections (and the evictions under way).
    pub(crate) fn remove(&self, id: u64, state: &ConnState) {
        let mut inner = self.lock();
        if inner.conns.remove(&id).is_some() && state.evicted() {
            inner.evicting -= 1;
        }
    }

    /// Asks every connection to stop (see the module documentation).
    pub(crate) fn stop_all(&self) {
        self.lock().conns.values().for_each(|(s, _)| s.stop());
    }

    /// Waits until every connection has ended or `grace` has passed; drops those left then.
    /// Returns how many were dropped.
    pub(crate) async fn drain(&self, grace: Duration) -> usize {
        let end = Instant::now() + grace;
        while self.open() > 0 && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let left: Vec<AbortHandle> = (self.lock().conns.values())
            .map(|(_, a)| a.clone())
            .collect();
        left.iter().for_each(AbortHandle::abort);
        if !left.is_empty() {
            metrics::counter!(m::CONNECTIONS_CLOSED, "reason" => "grace_expired")
                .increment(left.len() as u64);
        }
        left.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Connections that are not closing, counted under the lock.
    fn staying(o: &OpenConns) -> usize {
        let inner = o.lock();
        inner.conns.values().filter(|(s, _)| !s.evicted()).count()
    }

    /// Ids and states of the connections asked to close.
    fn closing(o: &OpenConns) -> Vec<(u64, Arc<ConnState>)> {
        let inner = o.lock();
        (inner.conns.iter())
            .filter(|(_, (s, _))| s.evicted())
            .map(|(id, (s, _))| (*id, s.clone()))
            .collect()
    }

    /// Accepts on two threads while a third ends every connection asked to close, as their
    /// tasks do: whatever the interleaving, no more than the cap stay open, each accept past
    /// the cap makes room, and the count of evictions under way returns to zero.
    #[test]
    fn accepts_racing_ends_never_pass_the_cap() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = || rt.spawn(std::future::pending::<()>()).abort_handle();
        let cap = 8;
        let open = OpenConns::new(cap);
        // Accepting threads that have ended (counted as they unwind too, so that the closing
        // thread stops and a failed assertion is reported rather than hanging the test).
        let finished = AtomicUsize::new(0);
        struct Finish<'a>(&'a AtomicUsize);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Relaxed);
            }
        }
        let per_thread = 20_000;
        let admitted = std::thread::scope(|sc| {
            sc.spawn(|| {
                while finished.load(Relaxed) < 2 {
                    for (id, s) in closing(&open) {
                        open.remove(id, &s);
                    }
                }
            });
            let accepting: Vec<_> = (0..2)
                .map(|_| {
                    sc.spawn(|| {
                        let _finish = Finish(&finished);
                        let mut seen = [0usize; 3];
                        for _ in 0..per_thread {
                            let a = open.enter(Arc::new(ConnState::new()), |_| handle());
                            seen[a as usize] += 1;
                            let n = staying(&open);
                            assert!(n <= cap, "{n} connections stay open, over the cap {cap}");
                        }
                        seen
                    })
                })
                .collect();
            (accepting.into_iter())
                .map(|t| t.join().expect("an accepting thread"))
                .collect::<Vec<[usize; 3]>>()
        });
        let total = |i: usize| admitted.iter().map(|s| s[i]).sum::<usize>();
        // Every connection here is idle: none is refused, and all but the first `cap` made room.
        assert_eq!(total(Admit::No as usize), 0);
        assert_eq!(
            total(Admit::Yes as usize) + total(Admit::Evicted as usize),
            2 * per_thread
        );
        assert!(total(Admit::Yes as usize) >= cap);
        for (id, s) in closing(&open) {
            open.remove(id, &s);
        }
        assert_eq!(staying(&open), cap);
        assert_eq!(open.open(), cap);
        assert_eq!(open.lock().evicting, 0);
    }

    /// At the cap with every connection busy, a new one is refused and its task never started.
    #[test]
    fn at_the_cap_with_none_idle_a_new_connection_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let open = OpenConns::new(2);
        let mut guards = Vec::new();
        for _ in 0..2 {
            let s = Arc::new(ConnState::new());
            guards.push(s.begin());
            let a = open.enter(s, |_| rt.spawn(std::future::pending::<()>()).abort_handle());
            assert_eq!(a, Admit::Yes);
        }
        let a = open.enter(Arc::new(ConnState::new()), |_| {
            panic!("a refused connection's task was started")
        });
        assert_eq!(a, Admit::No);
        assert_eq!(open.open(), 2);
        // One goes idle: the next connection makes room by closing it.
        guards.pop();
        let a = open.enter(Arc::new(ConnState::new()), |_| {
            rt.spawn(std::future::pending::<()>()).abort_handle()
        });
        assert_eq!(a, Admit::Evicted);
        assert_eq!((open.open(), staying(&open)), (3, 2));
    }
}
