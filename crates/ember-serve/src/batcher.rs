//! Dynamic batching: requests wait in a bounded queue; one loop forms batches of up to
//! `max_batch` samples (closed when full or when the first request has waited `max_delay`),
//! prepares them and runs them on the model's [`Engine`], then answers each request:
//!
//! ```text
//! form batch -> prepare (drop late requests, merge, stage tier rows) -> run -> answer
//! ```
//!
//! The loop is [`ember_model::run_ahead`], the same pipeline the SSD tier uses: when the model
//! has tables on the tier, forming and preparing the next batches (reading their rows) runs on a
//! thread of its own, `prefetch_depth` batches ahead of the batch being computed; otherwise all
//! of it runs on the batcher's thread. Requests arrive checked ([`crate::ModelSpec::check`]), so
//! nothing here checks their ids again.
//!
//! A full queue refuses at once ([`ServeError::Overloaded`]) rather than growing memory. A
//! request whose deadline has passed when its batch starts is answered
//! [`ServeError::DeadlineExceeded`] without being computed. Shutting down stops new requests and
//! finishes every queued one.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ember_model::{Engine, Model, Prepared, Samples, StageTimes, run_ahead};
use tokio::sync::oneshot;

use crate::error::{Result, ServeError};
use crate::metrics as m;

/// Batching limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Most samples in one batch (a larger single request runs alone).
    pub max_batch: usize,
    /// Longest a request waits for others to join its batch.
    pub max_delay: Duration,
    /// Most requests waiting (in the queue or in a batch still forming); one more is refused.
    pub queue: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_batch: 256,
            max_delay: Duration::from_micros(500),
            queue: 4096,
        }
    }
}

/// A request's answer: its scores, and the size of the batch it ran in.
#[derive(Debug, Clone)]
pub struct Reply {
    pub scores: Vec<f32>,
    /// Samples in the batch it ran in.
    pub batch: usize,
}

struct Job {
    samples: Samples,
    deadline: Option<(Instant, u64)>,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Reply>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("n", &self.samples.len())
            .finish()
    }
}

/// The queue and the thread that runs its batches.
#[derive(Debug)]
pub struct Batcher {
    tx: RwLock<Option<SyncSender<Job>>>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Batcher {
    /// Starts the batching thread, which owns `engine` (the CPU predictor, a GPU predictor).
    pub fn start(engine: Box<dyn Engine>, cfg: BatchConfig) -> Self {
        let (tx, rx) = sync_channel(cfg.queue.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let q = queued.clone();
        let worker = std::thread::Builder::new()
            .name("ember-batcher".into())
            .spawn(move || run(engine, cfg, q, rx))
            .expect("spawn the batcher thread");
        Batcher {
            tx: RwLock::new(Some(tx)),
            queued,
            capacity: cfg.queue.max(1),
            worker: Mutex::new(Some(worker)),
        }
    }

    /// Queues `samples`; the answer comes when their batch has run. `timeout_us`, if given, is the
    /// request's deadline from now.
    pub async fn submit(&self, samples: Samples, timeout_us: Option<u64>) -> Result<Reply> {
        if samples.is_empty() {
            return Ok(Reply {
                scores: Vec::new(),
                batch: 0,
            });
        }
        let now = Instant::now();
        let (reply, answer) = oneshot::channel();
        let job = Job {
            samples,
            deadline: timeout_us.map(|us| (now + Duration::from_micros(us), us)),
            enqueued: now,
            reply,
        };
        {
            let tx = self.tx.read().unwrap_or_else(|e| e.into_inner());
            let Some(tx) = tx.as_ref() else {
                return Err(ServeError::ShuttingDown);
            };
            // Waiting includes sitting in a batch that is still forming.
            if self.queued.fetch_add(1, Ordering::Relaxed) >= self.capacity {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                return Err(ServeError::Overloaded(self.capacity));
            }
            match tx.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    return Err(ServeError::Overloaded(self.capacity));
                }
                Err(TrySendError::Disconnected(_)) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    return Err(ServeError::ShuttingDown);
                }
            }
        }
        metrics::gauge!(m::QUEUE_DEPTH).set(self.queued.load(Ordering::Relaxed) as f64);
        answer
            .await
            .unwrap_or_else(|_| Err(ServeError::Internal("the batcher stopped".into())))
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Refuses new requests, lets the worker finish every queued one, and waits for it.
    pub fn shutdown(&self) {
        self.tx.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.join();
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The requests of a batch that are still waiting for their answer, and the batch prepared from
/// them (or why it could not be).
type Ready = (Vec<Job>, ember_model::Result<Prepared<'static>>);

/// The batching loop: form -> prepare -> run -> answer, until every sender is gone and the queue
/// is drained.
fn run(mut engine: Box<dyn Engine>, cfg: BatchConfig, queued: Arc<AtomicUsize>, rx: Receiver<Job>) {
    let model = engine.model().clone();
    let depth = model.prefetch_depth();
    let mut carry: Option<Job> = None;
    let batches = std::iter::from_fn(move || form_batch(&rx, &mut carry, &cfg, &queued));
    let mut scores = Vec::new();
    let _ = run_ahead(
        depth,
        batches,
        |jobs| prepare(&model, jobs),
        |ready: Option<Ready>| {
            if let Some((live, prepared)) = ready {
                run_batch(&mut *engine, &model, depth, &mut scores, live, prepared);
            }
            Ok::<(), Infallible>(())
        },
        // With a thread forming batches ahead, waiting for rows and waiting for requests look
        // alike: neither is counted as a stall (see `ember_tier_stall_seconds`).
        |_| {},
    );
}

/// Waits for the next batch: up to `max_batch` samples, closed when full or when its first
/// request has waited `max_delay`. `None` when every sender is gone and the queue is drained.
fn form_batch(
    rx: &Receiver<Job>,
    carry: &mut Option<Job>,
    cfg: &BatchConfig,
    queued: &AtomicUsize,
) -> Option<Vec<Job>> {
    let first = match carry.take() {
        Some(j) => j,
        None => rx.recv().ok()?,
    };
    let close_at = first.enqueued + cfg.max_delay;
    let mut n = first.samples.len();
    let mut jobs = vec![first];
    while n < cfg.max_batch {
        let next = match rx.try_recv() {
            Ok(j) => Ok(j),
            Err(_) => {
                let now = Instant::now();
                if now >= close_at {
                    break;
                }
                rx.recv_timeout(close_at - now)
            }
        };
        match next {
            Ok(j) if n + j.samples.len() > cfg.max_batch => {
                *carry = Some(j);
                break;
            }
            Ok(j) => {
                n += j.samples.len();
                jobs.push(j);
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    // The batch's requests stop waiting now (a carried one still waits).
    let left = queued.fetch_sub(jobs.len(), Ordering::Relaxed) - jobs.len();
    metrics::gauge!(m::QUEUE_DEPTH).set(left as f64);
    Some(jobs)
}

/// Answers the requests whose deadline has passed, merges the others into one batch and stages
/// its tier rows (`None` when no request is left).
fn prepare(model: &Model, jobs: Vec<Job>) -> Option<Ready> {
    let start = Instant::now();
    let (live, late): (Vec<Job>, Vec<Job>) = jobs
        .into_iter()
        .partition(|j| j.deadline.is_none_or(|(d, _)| d > start));
    for j in late {
        let us = j.deadline.map_or(0, |(_, us)| us);
        let _ = j.reply.send(Err(ServeError::DeadlineExceeded(us)));
    }
    if live.is_empty() {
        return None;
    }
    for j in &live {
        metrics::histogram!(m::QUEUE_WAIT).record((start - j.enqueued).as_secs_f64());
    }
    let n: usize = live.iter().map(|j| j.samples.len()).sum();
    metrics::histogram!(m::BATCH_SIZE).record(n as f64);
    let parts: Vec<&Samples> = live.iter().map(|j| &j.samples).collect();
    let prepared = model.merge(&parts).and_then(|b| model.prepare(b));
    Some((live, prepared))
}

/// Runs a prepared batch and answers its requests. Staged on this thread (`depth` 0), its
/// staging counts in the embedding stage and as a stall.
fn run_batch(
    engine: &mut dyn Engine,
    model: &Model,
    depth: usize,
    scores: &mut Vec<f32>,
    live: Vec<Job>,
    prepared: ember_model::Result<Prepared<'static>>,
) {
    let n: usize = live.iter().map(|j| j.samples.len()).sum();
    scores.resize(n, 0.0);
    let result = prepared.and_then(|p| {
        let times = engine.run(&p, scores)?;
        Ok(match depth {
            0 => model.staged_inline(&p, times),
            _ => times,
        })
    });
    if result.is_ok() {
        m::record_tier(model);
    }
    answer(live, n, scores, result);
}

/// Records a scored batch's stage times and answers its requests.
fn answer(live: Vec<Job>, n: usize, scores: &[f32], result: ember_model::Result<StageTimes>) {
    match result {
        Ok(t) => {
            metrics::histogram!(m::EMBEDDING_STAGE).record(t.embedding.as_secs_f64());
            metrics::histogram!(m::DENSE_STAGE).record(t.dense().as_secs_f64());
            let mut at = 0;
            for j in live {
                let k = j.samples.len();
                let _ = j.reply.send(Ok(Reply {
                    scores: scores[at..at + k].to_vec(),
                    batch: n,
                }));
                at += k;
            }
        }
        Err(e) => {
            // Its requests were checked when they arrived: whatever fails now is the server's.
            let e = ServeError::Internal(format!("scoring a batch: {e}"));
            for j in live {
                let _ = j.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
