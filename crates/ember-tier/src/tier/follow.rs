//! Following the updates of a collection's tier tables from an
//! [`UpdateSource`] (a Redis Stream per table: `crate::storage::remote::updates`): a thread
//! (`ember-updates`) polls the source every
//! [`POLL_EVERY`] while updates flow (backing off to [`POLL_IDLE`] when they do not) and queues
//! what it reads; the stager applies the queue between batches, under
//! its lock, before it looks the next batch's ids up ([`crate::RowCache::update`]: a row no
//! batch reads is rewritten in place, any other leaves the cache, so no batch sees a torn row).
//! The queue is bounded ([`MAX_QUEUED_ROWS`]): past it the thread stops reading until the
//! stager catches up, and if the stream is trimmed past its position meanwhile, the table's
//! cache is dropped ([`UpdateStats::resets`]).
//!
//! A model served from the store may hold some tables in memory (placement `dram`): those are
//! made live ([`ember_embed::EmbeddingTable::make_live`]) and followed too, each update written into
//! the table under its lock (`EmbeddingTable::write_rows`). Such a table cannot be dropped like a cache: when
//! updates were published since it was pushed (at start) or its stream was trimmed past this
//! server, it is read again whole from the store ([`Reload`]).

use crate::storage::updates::{EntryId, Polled, UpdateSource};
use crate::storage::{RowRequest, RowStore};
use ember_embed::Result;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the thread polls the streams while updates flow; when a poll finds nothing, the
/// wait doubles up to [`POLL_IDLE`] (each poll is two commands per table, per server).
pub const POLL_EVERY: Duration = Duration::from_millis(10);
pub const POLL_IDLE: Duration = Duration::from_millis(100);
/// Rows queued and not yet applied at most.
pub const MAX_QUEUED_ROWS: usize = 1 << 20;
/// Metrics (the server describes them): rows updated by outcome (`applied`: the row was cached;
/// `absent`: it was not), publish-to-applied lag, streams trimmed past this server by table,
/// malformed entries, failed polls, and each table's position (its last entry's milliseconds);
/// each labelled with the store's `model` followed.
pub const UPDATE_ROWS: &str = "ember_update_rows_total";
pub const UPDATE_LAG: &str = "ember_update_lag_seconds";
pub const UPDATE_RESETS: &str = "ember_update_resets_total";
pub const UPDATE_BAD: &str = "ember_update_bad_entries_total";
pub const UPDATE_POLL_ERRORS: &str = "ember_update_poll_errors_total";
pub const UPDATE_POSITION: &str = "ember_update_position_ms";

/// Update lags kept at most between two [`super::Stager::take_update_lags`].
const MAX_LAGS: usize = 1 << 20;

/// What following the update streams did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateStats {
    /// Rows of cached ids updated (rewritten in place, or dropped from the cache because a batch
    /// was reading them).
    pub rows_applied: u64,
    /// Rows updated that were not cached (nothing to do: the store has them).
    pub rows_absent: u64,
    /// Rows of in-memory tables read again whole from the store (see the module documentation).
    pub rows_reloaded: u64,
    /// Times a stream was trimmed past this server's position (the table's cache was dropped).
    pub resets: u64,
    /// Entries that were not well-formed updates (skipped).
    pub bad_entries: u64,
    /// Polls that failed (retried).
    pub poll_errors: u64,
    /// Per table followed: its name and position in its stream.
    pub positions: Vec<(String, EntryId)>,
}

#[derive(Debug, Default)]
struct Feed {
    queue: Mutex<Vec<Polled>>,
    queued_rows: AtomicUsize,
    stop: AtomicBool,
    rows_applied: AtomicU64,
    rows_absent: AtomicU64,
    rows_reloaded: AtomicU64,
    resets: AtomicU64,
    bad_entries: AtomicU64,
    poll_errors: AtomicU64,
    positions: Mutex<Vec<EntryId>>,
    /// Publish-to-applied lags, seconds.
    lags: Mutex<Vec<f32>>,
    /// The store's model followed: every metric's `model` label (a server may follow several).
    model: String,
}

/// Where the updates of a table followed go.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Target {
    /// The cache of this tier table.
    Cache(usize),
    /// This table of the collection, held in memory (live).
    Dram(usize),
}

/// The polling thread and its queue (stopped and joined when dropped).
#[derive(Debug)]
pub(super) struct Follower {
    feed: Arc<Feed>,
    names: Vec<String>,
    /// Where each table followed goes.
    pub(super) targets: Vec<Target>,
    thread: Option<JoinHandle<()>>,
}

/// `m` locked (a panic while it was held leaves it as it was).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Rows of the updates in `polled`.
fn rows_in(polled: &[Polled]) -> usize {
    polled
        .iter()
        .map(|p| match p {
            Polled::Rows { ids, .. } => ids.len(),
            _ => 0,
        })
        .sum()
}

impl Feed {
    /// Counts a failed read of the store (retried).
    fn failed(&self) {
        self.poll_errors.fetch_add(1, Relaxed);
        metrics::counter!(UPDATE_POLL_ERRORS, "model" => self.model.clone()).increment(1);
    }
}

/// Queues `polled`, waiting while the queue is full; false once told to stop.
fn queue(f: &Feed, polled: Vec<Polled>) -> bool {
    while f.queued_rows.load(Relaxed) >= MAX_QUEUED_ROWS {
        if f.stop.load(Relaxed) {
            return false;
        }
        std::thread::sleep(POLL_EVERY);
    }
    f.queued_rows.fetch_add(rows_in(&polled), Relaxed);
    lock(&f.queue).extend(polled);
    !f.stop.load(Relaxed)
}

/// Rows read from the store per round when a live table is read whole.
const RELOAD_CHUNK: usize = 4096;

/// Reads whole live tables from the store (the version followed).
#[derive(Debug)]
pub(super) struct Reload {
    store: Box<dyn RowStore>,
    /// Per table followed: for a live one, its index in `store`, its rows and row bytes.
    of: Vec<Option<(usize, usize, usize)>>,
}

impl Reload {
    /// Reads the live tables `of` names (per table followed) from `store`.
    pub(super) fn new(store: Box<dyn RowStore>, of: Vec<Option<(usize, usize, usize)>>) -> Self {
        Reload { store, of }
    }

    /// Whether table followed `i` is live.
    pub(super) fn holds(&self, i: usize) -> bool {
        self.of.get(i).is_some_and(Option::is_some)
    }

    /// Reads every row of live table followed `i` in rounds of [`RELOAD_CHUNK`], handing each
    /// round's ids and rows to `sink` (which answers false to stop).
    pub(super) fn table(
        &mut self,
        i: usize,
        mut sink: impl FnMut(Vec<u64>, Vec<u8>) -> bool,
    ) -> Result<()> {
        let Some((t, rows, row_bytes)) = self.of[i] else {
            return Ok(());
        };
        let mut reqs = Vec::with_capacity(RELOAD_CHUNK);
        for start in (0..rows).step_by(RELOAD_CHUNK) {
            let end = (start + RELOAD_CHUNK).min(rows);
            reqs.clear();
            reqs.extend((start..end).map(|row| RowRequest {
                table: t,
                row,
                tag: row - start,
            }));
            let mut out = vec![0u8; (end - start) * row_bytes];
            self.store.read(&mut reqs, &mut |r, bytes| {
                out[r.tag * row_bytes..(r.tag + 1) * row_bytes].copy_from_slice(bytes);
            })?;
            if !sink((start as u64..end as u64).collect(), out) {
                break;
            }
        }
        Ok(())
    }
}

/// The `ember-updates` thread: polls until told to stop (see the module documentation).
fn poll_loop(
    mut reader: Box<dyn UpdateSource>,
    f: &Feed,
    names: &[String],
    mut reload: Option<Reload>,
) {
    let mut failing = false;
    let mut wait = POLL_EVERY;
    // Live tables to read again whole (their stream was trimmed past this server).
    let mut stale: Vec<(usize, EntryId)> = Vec::new();
    while !f.stop.load(Relaxed) {
        if f.queued_rows.load(Relaxed) >= MAX_QUEUED_ROWS {
            std::thread::sleep(POLL_EVERY);
            continue;
        }
        if let (Some(r), Some(&(i, at))) = (reload.as_mut(), stale.first()) {
            let rows = |ids: Vec<u64>, rows: Vec<u8>| {
                let p = Polled::Rows {
                    table: i,
                    entry: at,
                    ids,
                    rows,
                    published_ms: 0,
                };
                queue(f, vec![p])
            };
            match r.table(i, rows) {
                Ok(()) => {
                    stale.remove(0);
                }
                Err(e) => {
                    f.failed();
                    eprintln!(
                        "ember: reading table '{}' again failed ({e}); retrying",
                        names[i]
                    );
                    std::thread::sleep(POLL_EVERY * 10);
                }
            }
            continue;
        }
        let polled = match reader.poll() {
            Ok(polled) => polled,
            Err(e) => {
                f.failed();
                if !failing {
                    eprintln!("ember: reading row updates failed ({e}); retrying");
                }
                failing = true;
                std::thread::sleep(POLL_EVERY * 10);
                continue;
            }
        };
        failing = false;
        let at = reader.positions();
        for (name, p) in names.iter().zip(&at) {
            metrics::gauge!(UPDATE_POSITION, "model" => f.model.clone(), "table" => name.clone())
                .set(p.0 as f64);
        }
        *lock(&f.positions) = at;
        if polled.is_empty() {
            std::thread::sleep(wait);
            wait = (wait * 2).min(POLL_IDLE);
            continue;
        }
        wait = POLL_EVERY;
        let full = polled.len() >= reader.batch();
        if let Some(r) = &reload {
            stale.extend(polled.iter().filter_map(|p| match *p {
                Polled::Reset { table, now_at } if r.holds(table) => Some((table, now_at)),
                _ => None,
            }));
        }
        queue(f, polled);
        if !full {
            std::thread::sleep(POLL_EVERY);
        }
    }
}

impl Follower {
    /// Starts following with `reader`, whose tables go to `targets`; `reload` reads the live
    /// ones again when their stream is trimmed past this server.
    pub(super) fn start(
        reader: Box<dyn UpdateSource>,
        names: Vec<String>,
        targets: Vec<Target>,
        reload: Option<Reload>,
    ) -> std::io::Result<Self> {
        let feed = Arc::new(Feed {
            model: reader.name().to_string(),
            ..Feed::default()
        });
        *lock(&feed.positions) = reader.positions();
        let (f, names_t) = (feed.clone(), names.clone());
        let thread = std::thread::Builder::new()
            .name("ember-updates".into())
            .spawn(move || poll_loop(reader, &f, &names_t, reload))?;
        Ok(Follower {
            feed,
            names,
            targets,
            thread: Some(thread),
        })
    }

    /// Takes what was queued.
    pub(super) fn drain(&self) -> Vec<Polled> {
        let polled = std::mem::take(&mut *lock(&self.feed.queue));
        self.feed.queued_rows.fetch_sub(rows_in(&polled), Relaxed);
        polled
    }

    /// Counts rows of a live table read again from the store.
    pub(super) fn reloaded(&self, rows: u64) {
        self.feed.rows_reloaded.fetch_add(rows, Relaxed);
        let model = self.feed.model.clone();
        metrics::counter!(UPDATE_ROWS, "model" => model, "outcome" => "reloaded").increment(rows);
    }

    /// Counts what applying an update did, and its lag.
    pub(super) fn applied(&self, applied: u64, absent: u64, published_ms: u64) {
        self.feed.rows_applied.fetch_add(applied, Relaxed);
        self.feed.rows_absent.fetch_add(absent, Relaxed);
        let model = &self.feed.model;
        metrics::counter!(UPDATE_ROWS, "model" => model.clone(), "outcome" => "applied")
            .increment(applied);
        metrics::counter!(UPDATE_ROWS, "model" => model.clone(), "outcome" => "absent")
            .increment(absent);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let lag = now.saturating_sub(published_ms) as f32 / 1000.0;
        metrics::histogram!(UPDATE_LAG, "model" => model.clone()).record(f64::from(lag));
        let mut lags = lock(&self.feed.lags);
        if lags.len() < MAX_LAGS {
            lags.push(lag);
        }
    }

    /// Counts a reset of followed table `i` (and says so).
    pub(super) fn reset(&self, i: usize, now_at: EntryId) {
        self.feed.resets.fetch_add(1, Relaxed);
        let (model, table) = (self.feed.model.clone(), self.names[i].clone());
        metrics::counter!(UPDATE_RESETS, "model" => model, "table" => table).increment(1);
        let what = match self.targets[i] {
            Target::Cache(_) => "its cache was dropped (rows are read from the store again)",
            Target::Dram(_) => "it is read again whole from the store",
        };
        eprintln!(
            "ember: the update stream of table '{}' was trimmed past this server's position: \
             {what}; going on from {now_at}",
            self.names[i]
        );
    }

    /// Counts a malformed entry (and says so).
    pub(super) fn bad(&self, i: usize, entry: EntryId, reason: &str) {
        self.feed.bad_entries.fetch_add(1, Relaxed);
        metrics::counter!(UPDATE_BAD, "model" => self.feed.model.clone()).increment(1);
        eprintln!(
            "ember: skipped update {entry} of table '{}': {reason}",
            self.names[i]
        );
    }

    /// What following did so far.
    pub(super) fn stats(&self) -> UpdateStats {
        let f = &self.feed;
        UpdateStats {
            rows_applied: f.rows_applied.load(Relaxed),
            rows_absent: f.rows_absent.load(Relaxed),
            rows_reloaded: f.rows_reloaded.load(Relaxed),
            resets: f.resets.load(Relaxed),
            bad_entries: f.bad_entries.load(Relaxed),
            poll_errors: f.poll_errors.load(Relaxed),
            positions: self
                .names
                .iter()
                .cloned()
                .zip(lock(&f.positions).iter().copied())
                .collect(),
        }
    }

    /// The publish-to-applied lags since the last call, seconds.
    pub(super) fn take_lags(&self) -> Vec<f32> {
        std::mem::take(&mut *lock(&self.feed.lags))
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.feed.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
