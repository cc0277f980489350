//! The background fill of a pooled table's cache: a batch pools its misses on the nodes
//! (`pooling.rs`) and does not wait for their rows; those the cache's policy would admit now
//! ([`crate::RowCache::would_admit`]) are queued here, read whole by a thread of their own
//! (`ember-fill`, on a connection of its own), and offered to the cache.
//!
//! Freshness: the thread notes the stager's update generation (bumped whenever row updates are
//! applied to the caches, under the stager's lock) before it reads, and inserts its rows under
//! the lock only if no update was applied meanwhile; else it drops them. An update published
//! after the read is applied later to the row now cached (updates rewrite resident rows); one
//! applied before the insert would have been missed, and is why the rows are dropped. So the
//! fill never leaves a row older than the updates the server has applied.
//!
//! Bounded: [`QUEUE`] ids wait at most (more are dropped, counted); [`CHUNK`] are read per call,
//! within the store's deadline; a failed read drops its chunk.

use super::inner::Inner;
use super::stats::Counters;
use crate::storage::{RowRequest, RowStore};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Ids waiting at most.
pub(super) const QUEUE: usize = 1 << 16;
/// Ids read per call.
pub(super) const CHUNK: usize = 4096;

#[derive(Debug, Default)]
struct Queue {
    /// (tier table, id).
    ids: VecDeque<(usize, u64)>,
    stop: bool,
}

/// The fill thread and its queue.
#[derive(Debug)]
pub(super) struct Filler {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Filler {
    /// Starts the thread: rows read through `store` (the tables of tier tables whose store is
    /// `store_index`) land in `inner`'s caches.
    pub(super) fn start(
        mut store: Box<dyn RowStore>,
        store_index: usize,
        inner: Arc<Mutex<Inner>>,
        counters: Arc<Counters>,
    ) -> std::io::Result<Self> {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("ember-fill".into())
            .spawn(move || {
                let mut chunk = Vec::with_capacity(CHUNK);
                let mut reqs = Vec::with_capacity(CHUNK);
                let mut rows: Vec<u8> = Vec::new();
                loop {
                    {
                        let mut g = lock(&q.0);
                        while g.ids.is_empty() && !g.stop {
                            g = q.1.wait(g).unwrap_or_else(|p| p.into_inner());
                        }
                        if g.stop {
                            return;
                        }
                        let n = g.ids.len().min(CHUNK);
                        chunk.clear();
                        chunk.extend(g.ids.drain(..n));
                    }
                    // Where each row goes, and the update generation, read together.
                    let (gen0, offsets) = {
                        let g = lock(&inner);
                        reqs.clear();
                        let mut offsets = Vec::with_capacity(chunk.len());
                        let mut at = 0;
                        for (k, &(d, id)) in chunk.iter().enumerate() {
                            let t = &g.tables[d];
                            if t.store != store_index {
                                continue;
                            }
                            reqs.push(RowRequest {
                                table: t.table,
                                row: id as usize,
                                tag: k,
                            });
                            offsets.push(at);
                            at += t.row_bytes;
                        }
                        rows.clear();
                        rows.resize(at, 0);
                        (g.update_gen, offsets)
                    };
                    // Tag k -> its offset: requests are in chunk order, so by position.
                    let mut pos = vec![usize::MAX; chunk.len()];
                    for (i, r) in reqs.iter().enumerate() {
                        pos[r.tag] = offsets[i];
                    }
                    let got = store.read(&mut reqs, &mut |r, row| {
                        let at = pos[r.tag];
                        rows[at..at + row.len()].copy_from_slice(row);
                    });
                    if got.is_err() {
                        counters.fill_dropped.fetch_add(chunk.len() as u64, Relaxed);
                        continue;
                    }
                    let mut g = lock(&inner);
                    if g.update_gen != gen0 {
                        counters.fill_dropped.fetch_add(chunk.len() as u64, Relaxed);
                        continue;
                    }
                    let mut landed = 0;
                    for r in reqs.iter() {
                        let (d, id) = chunk[r.tag];
                        let t = &mut g.tables[d];
                        let at = pos[r.tag];
                        if t.cache.insert(id, &rows[at..at + t.row_bytes]) {
                            landed += 1;
                        }
                    }
                    counters.fill_rows.fetch_add(landed, Relaxed);
                }
            })?;
        Ok(Filler {
            queue,
            thread: Some(thread),
        })
    }

    /// Queues `ids` (tier table, id) to be read and offered to the cache; past [`QUEUE`] waiting,
    /// the rest are dropped (counted in `counters`).
    pub(super) fn offer(&self, ids: &[(usize, u64)], counters: &Counters) {
        if ids.is_empty() {
            return;
        }
        let mut g = lock(&self.queue.0);
        let room = QUEUE.saturating_sub(g.ids.len());
        g.ids.extend(ids.iter().take(room).copied());
        drop(g);
        counters
            .fill_dropped
            .fetch_add(ids.len().saturating_sub(room) as u64, Relaxed);
        self.queue.1.notify_one();
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        lock(&self.queue.0).stop = true;
        self.queue.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
