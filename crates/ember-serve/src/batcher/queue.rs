//! The batcher's queue: requests in arrival order, and the thread forming batches from them.
//!
//! A request wakes the forming thread only when that thread waits for it: for the first request
//! of a batch, or for the request that fills the batch. While a batch forms (its first request
//! waits at most `max_delay` for others), the thread sleeps until the batch must close and takes
//! every request that arrived meanwhile at once. A channel woke it for every request instead
//! (a futex wake on the I/O thread, a context switch on the batcher): on two cores that cost
//! more than the batch's model work.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a request could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `cap` requests are waiting.
    Full,
    /// The queue is closed: the batcher is stopping.
    Closed,
}

/// What the forming thread waits for, if it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Not asleep (or already woken).
    No,
    /// Any request.
    Any,
    /// Requests of at least this many samples in all (the rest of a batch).
    Samples(usize),
}

/// What the queue holds: items of some samples each (a batch holds at most `max` samples), and
/// of some weight (a batch weighs at most `max_weight`).
pub(crate) trait Weighed {
    /// Its samples.
    fn samples(&self) -> usize;
    /// Its weight (by default its samples).
    fn weight(&self) -> usize {
        self.samples()
    }
}

#[derive(Debug)]
struct Inner<T> {
    items: VecDeque<T>,
    /// Samples of the items queued.
    samples: usize,
    wait: Wait,
    closed: bool,
}

/// A bounded queue with one consumer that forms batches (see the module documentation).
#[derive(Debug)]
pub(crate) struct Queue<T> {
    inner: Mutex<Inner<T>>,
    wake: Condvar,
    cap: usize,
    /// Times a push woke the forming thread.
    wakes: AtomicUsize,
}

impl<T: Weighed> Queue<T> {
    pub(crate) fn new(cap: usize) -> Self {
        Queue {
            inner: Mutex::new(Inner {
                items: VecDeque::with_capacity(cap.clamp(1, 1024)),
                samples: 0,
                wait: Wait::No,
                closed: false,
            }),
            wake: Condvar::new(),
            cap: cap.max(1),
            wakes: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item`, waking the forming thread only if it waits for it.
    pub(crate) fn push(&self, item: T) -> Result<(), (Refused, T)> {
        let mut q = self.lock();
        if q.closed {
            return Err((Refused::Closed, item));
        }
        if q.items.len() >= self.cap {
            return Err((Refused::Full, item));
        }
        q.samples += item.samples();
        q.items.push_back(item);
        let wake = match q.wait {
            Wait::No => false,
            Wait::Any => true,
            Wait::Samples(n) => q.samples >= n,
        };
        if wake {
            q.wait = Wait::No;
        }
        drop(q);
        if wake {
            self.wakes.fetch_add(1, Relaxed);
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Refuses new items; the forming thread takes those queued, then gets `None`.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    /// [`Queue::next_batch_within`] with no bound on the weight.
    #[cfg(test)]
    pub(crate) fn next_batch(
        &self,
        max: usize,
        close_at: impl Fn(&T) -> Instant,
    ) -> Option<Vec<T>> {
        self.next_batch_within(max, usize::MAX, close_at)
    }

    /// The next batch: the first item (waiting for one as long as it takes), then the items
    /// behind it as long as the batch holds at most `max` samples and weighs at most
    /// `max_weight` (a larger or heavier first item makes a batch of its own), waiting for more
    /// until `close_at(first)` or until the batch is full. An item that does not fit stays
    /// first in the queue. `None` once the queue is closed and empty. (The forming thread is
    /// woken early only by samples: a batch full by weight closes when the next item arrives
    /// and does not fit, or at `close_at`.)
    pub(crate) fn next_batch_within(
        &self,
        max: usize,
        max_weight: usize,
        close_at: impl Fn(&T) -> Instant,
    ) -> Option<Vec<T>> {
        let mut q = self.lock();
        let first = loop {
            if let Some(first) = q.items.pop_front() {
                break first;
            }
            if q.closed {
                return None;
            }
            q.wait = Wait::Any;
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        };
        q.samples -= first.samples();
        let end = close_at(&first);
        let (mut n, mut w) = (first.samples(), first.weight());
        let mut batch = vec![first];
        loop {
            while let Some(next) = q.items.front() {
                let (k, wk) = (next.samples(), next.weight());
                if n + k > max || w.saturating_add(wk) > max_weight {
                    // The batch is full.
                    q.wait = Wait::No;
                    return Some(batch);
                }
                n += k;
                w += wk;
                q.samples -= k;
                batch.extend(q.items.pop_front());
            }
            let now = Instant::now();
            if n >= max || w >= max_weight || now >= end || q.closed {
                q.wait = Wait::No;
                return Some(batch);
            }
            q.wait = Wait::Samples(max - n);
            q = self.sleep(q, end - now);
        }
    }

    /// Times a push woke the forming thread.
    #[cfg(test)]
    pub(crate) fn wakes(&self) -> usize {
        self.wakes.load(Relaxed)
    }

    fn sleep<'a>(&self, q: MutexGuard<'a, Inner<T>>, d: Duration) -> MutexGuard<'a, Inner<T>> {
        match self.wake.wait_timeout(q, d) {
            Ok((q, _)) => q,
            Err(e) => e.into_inner().0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    impl Weighed for usize {
        fn samples(&self) -> usize {
            *self
        }
    }

    const LONG: Duration = Duration::from_secs(30);

    /// An item of `.0` samples weighing `.1`.
    #[derive(Debug, PartialEq)]
    struct Heavy(usize, usize);

    impl Weighed for Heavy {
        fn samples(&self) -> usize {
            self.0
        }
        fn weight(&self) -> usize {
            self.1
        }
    }

    #[test]
    fn batches_stop_at_their_weight_and_a_heavy_first_item_runs_alone() {
        let q = Queue::new(10);
        for h in [
            Heavy(1, 40),
            Heavy(1, 50),
            Heavy(1, 20),
            Heavy(2, 200),
            Heavy(1, 1),
        ] {
            q.push(h).unwrap();
        }
        let now = Instant::now();
        // 40 + 50 fit in 100, + 20 does not: it stays first, though 3 samples fit in 8.
        let b = q.next_batch_within(8, 100, |_| now + LONG).unwrap();
        assert_eq!(b, vec![Heavy(1, 40), Heavy(1, 50)]);
        let b = q.next_batch_within(8, 100, |_| now + LONG).unwrap();
        assert_eq!(b, vec![Heavy(1, 20)]);
        // Heavier than the bound alone: a batch of its own, closed at once (full).
        let b = q.next_batch_within(8, 100, |_| now + LONG).unwrap();
        assert_eq!(b, vec![Heavy(2, 200)]);
        // Samples still bound a light batch.
        for _ in 0..3 {
            q.push(Heavy(4, 1)).unwrap();
        }
        let b = q.next_batch_within(8, 100, |_| now + LONG).unwrap();
        assert_eq!(b, vec![Heavy(1, 1), Heavy(4, 1)]);
        let b = q.next_batch_within(8, 100, |_| now + LONG).unwrap();
        assert_eq!(b, vec![Heavy(4, 1), Heavy(4, 1)]);
    }

    #[test]
    fn batches_take_what_fits_and_leave_the_rest_first() {
        let q = Queue::new(10);
        for k in [2, 3, 4, 1] {
            q.push(k).unwrap();
        }
        let now = Instant::now();
        // 2 + 3 fit in 6; 4 does not, and stays first.
        assert_eq!(q.next_batch(6, |_| now + LONG), Some(vec![2, 3]));
        // 4 + 1 is not full: it closes at its time (already past here).
        assert_eq!(q.next_batch(6, |_| now), Some(vec![4, 1]));
        // A first item over the limit makes a batch of its own.
        q.push(9).unwrap();
        q.push(1).unwrap();
        assert_eq!(q.next_batch(6, |_| now + LONG), Some(vec![9]));
        // Closed: what is queued still comes out, without waiting for its close time.
        q.close();
        assert_eq!(q.next_batch(6, |_| now + LONG), Some(vec![1]));
        assert_eq!(q.next_batch(6, |_| now + LONG), None);
        assert_eq!(q.push(1), Err((Refused::Closed, 1)));
    }

    #[test]
    fn a_full_queue_refuses() {
        let q = Queue::new(2);
        q.push(1).unwrap();
        q.push(1).unwrap();
        assert_eq!(q.push(5), Err((Refused::Full, 5)));
    }

    #[test]
    fn a_forming_batch_closes_at_its_time_or_when_full() {
        let q = Arc::new(Queue::new(100));
        // Closes at its time: one item, nobody else comes.
        q.push(1).unwrap();
        let t = Instant::now();
        let b = q.next_batch(8, |_| t + Duration::from_millis(30));
        assert_eq!(b, Some(vec![1]));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // Closes when full, long before its time: the pusher that fills it wakes the former.
        q.push(1).unwrap();
        let pusher = {
            let q = q.clone();
            std::thread::spawn(move || {
                for _ in 0..7 {
                    std::thread::sleep(Duration::from_millis(2));
                    q.push(1).unwrap();
                }
            })
        };
        let t = Instant::now();
        let b = q.next_batch(8, |_| t + LONG).unwrap();
        assert_eq!(b.len(), 8);
        assert!(t.elapsed() < Duration::from_secs(5), "waited past full");
        pusher.join().unwrap();
    }

    #[test]
    fn requests_joining_a_forming_batch_do_not_wake_the_former() {
        let q = Arc::new(Queue::new(100));
        let former = {
            let q = q.clone();
            std::thread::spawn(move || {
                // A first batch that closes as soon as it has its first request.
                let first = q.next_batch(1000, |_| Instant::now()).unwrap();
                assert_eq!(first, vec![1]);
                // Then a batch that forms for 300 ms while 50 requests join it.
                let t = Instant::now();
                q.next_batch(1000, |_| t + Duration::from_millis(300))
            })
        };
        // The first request wakes the former, which waits for any.
        while q.lock().wait != Wait::Any {
            std::thread::sleep(Duration::from_millis(1));
        }
        q.push(1).unwrap();
        assert_eq!(q.wakes(), 1);
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..50 {
            q.push(1).unwrap();
        }
        let batch = former.join().unwrap().unwrap();
        assert_eq!(batch.len(), 50);
        // The first of the second batch woke the former (waiting for any) at most once more; the
        // 49 behind it joined without a wake.
        assert!(q.wakes() <= 2, "{} wakes for 51 requests", q.wakes());
    }

    #[test]
    fn every_item_comes_out_once_under_concurrent_pushes() {
        let q = Arc::new(Queue::new(1 << 20));
        let seen = Arc::new(AtomicUsize::new(0));
        let consumer = {
            let (q, seen) = (q.clone(), seen.clone());
            std::thread::spawn(move || {
                while let Some(b) =
                    q.next_batch(16, |_| Instant::now() + Duration::from_micros(200))
                {
                    assert!(b.iter().sum::<usize>() <= 16 || b.len() == 1);
                    seen.fetch_add(b.len(), Ordering::Relaxed);
                }
            })
        };
        let pushers: Vec<_> = (0..4)
            .map(|i| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for k in 0..5000 {
                        q.push(1 + (i + k) % 3).unwrap();
                        if k % 100 == 0 {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                })
            })
            .collect();
        pushers.into_iter().for_each(|p| p.join().unwrap());
        q.close();
        consumer.join().unwrap();
        assert_eq!(seen.load(Ordering::Relaxed), 20_000);
    }
}
