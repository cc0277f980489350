//! Following the update streams of a collection's remote tables
//! (`crate::storage::remote::updates`): a thread (`ember-updates`) polls the streams every
//! [`POLL_EVERY`] while updates flow (backing off to [`POLL_IDLE`] when they do not) and queues
//! what it reads; the stager applies the queue between batches, under
//! its lock, before it looks the next batch's ids up ([`crate::RowCache::update`]: a row no
//! batch reads is rewritten in place, any other leaves the cache, so no batch sees a torn row).
//! The queue is bounded ([`MAX_QUEUED_ROWS`]): past it the thread stops reading until the
//! stager catches up, and if the stream is trimmed past its position meanwhile, the table's
//! cache is dropped ([`UpdateStats::resets`]).

use crate::storage::remote::updates::{EntryId, Polled, UpdateReader};
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
/// malformed entries, failed polls, and each table's position (its last entry's milliseconds).
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
    resets: AtomicU64,
    bad_entries: AtomicU64,
    poll_errors: AtomicU64,
    positions: Mutex<Vec<EntryId>>,
    /// Publish-to-applied lags, seconds.
    lags: Mutex<Vec<f32>>,
}

/// The polling thread and its queue (stopped and joined when dropped).
#[derive(Debug)]
pub(super) struct Follower {
    feed: Arc<Feed>,
    names: Vec<String>,
    /// The tier table of each table followed.
    pub(super) tier_of: Vec<usize>,
    thread: Option<JoinHandle<()>>,
}

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

/// The `ember-updates` thread: polls until told to stop (see the module documentation).
fn poll_loop(mut reader: UpdateReader, f: &Feed, names: &[String]) {
    let mut failing = false;
    let mut wait = POLL_EVERY;
    while !f.stop.load(Relaxed) {
        if f.queued_rows.load(Relaxed) >= MAX_QUEUED_ROWS {
            std::thread::sleep(POLL_EVERY);
            continue;
        }
        let polled = match reader.poll() {
            Ok(polled) => polled,
            Err(e) => {
                f.poll_errors.fetch_add(1, Relaxed);
                metrics::counter!(UPDATE_POLL_ERRORS).increment(1);
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
            metrics::gauge!(UPDATE_POSITION, "table" => name.clone()).set(p.0 as f64);
        }
        *lock(&f.positions) = at;
        if polled.is_empty() {
            std::thread::sleep(wait);
            wait = (wait * 2).min(POLL_IDLE);
            continue;
        }
        wait = POLL_EVERY;
        let full = polled.len() >= reader.count;
        f.queued_rows.fetch_add(rows_in(&polled), Relaxed);
        lock(&f.queue).extend(polled);
        if !full {
            std::thread::sleep(POLL_EVERY);
        }
    }
}

impl Follower {
    /// Starts following with `reader`, whose tables are tier tables `tier_of`.
    pub(super) fn start(
        reader: UpdateReader,
        names: Vec<String>,
        tier_of: Vec<usize>,
    ) -> std::io::Result<Self> {
        let feed = Arc::new(Feed::default());
        *lock(&feed.positions) = reader.positions();
        let (f, names_t) = (feed.clone(), names.clone());
        let thread = std::thread::Builder::new()
            .name("ember-updates".into())
            .spawn(move || poll_loop(reader, &f, &names_t))?;
        Ok(Follower {
            feed,
            names,
            tier_of,
            thread: Some(thread),
        })
    }

    /// Takes what was queued.
    pub(super) fn drain(&self) -> Vec<Polled> {
        let polled = std::mem::take(&mut *lock(&self.feed.queue));
        self.feed.queued_rows.fetch_sub(rows_in(&polled), Relaxed);
        polled
    }

    /// Counts what applying an update did, and its lag.
    pub(super) fn applied(&self, applied: u64, absent: u64, published_ms: u64) {
        self.feed.rows_applied.fetch_add(applied, Relaxed);
        self.feed.rows_absent.fetch_add(absent, Relaxed);
        metrics::counter!(UPDATE_ROWS, "outcome" => "applied").increment(applied);
        metrics::counter!(UPDATE_ROWS, "outcome" => "absent").increment(absent);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let lag = now.saturating_sub(published_ms) as f32 / 1000.0;
        metrics::histogram!(UPDATE_LAG).record(f64::from(lag));
        let mut lags = lock(&self.feed.lags);
        if lags.len() < MAX_LAGS {
            lags.push(lag);
        }
    }

    /// Counts a reset of followed table `i` (and says so).
    pub(super) fn reset(&self, i: usize, now_at: EntryId) {
        self.feed.resets.fetch_add(1, Relaxed);
        metrics::counter!(UPDATE_RESETS, "table" => self.names[i].clone()).increment(1);
        eprintln!(
            "ember: the update stream of table '{}' was trimmed past this server's position: \
             its cache was dropped (rows are read from the store again); going on from {now_at}",
            self.names[i]
        );
    }

    /// Counts a malformed entry (and says so).
    pub(super) fn bad(&self, i: usize, entry: EntryId, reason: &str) {
        self.feed.bad_entries.fetch_add(1, Relaxed);
        metrics::counter!(UPDATE_BAD).increment(1);
        eprintln!(
            "ember: skipped update {entry} of table '{}': {reason}",
            self.names[i]
        );
    }

    pub(super) fn stats(&self) -> UpdateStats {
        let f = &self.feed;
        UpdateStats {
            rows_applied: f.rows_applied.load(Relaxed),
            rows_absent: f.rows_absent.load(Relaxed),
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
