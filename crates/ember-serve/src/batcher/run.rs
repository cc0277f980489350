//! The batching loop of one model instance ([`run`]): form -> prepare -> run -> answer, and
//! its pieces, which the loop of several instances (`instances.rs`) shares.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ember_model::run_ahead;
use ember_model::serving::{Batched, Items, Outputs, Runner, Servable, Times};

use super::admit::Load;
use super::queue::Queue;
use super::stats::{BatchTimes, Stats};
use super::{BatchConfig, Job, Reply, Shared};
use crate::error::ServeError;
use crate::metrics as m;

/// The requests of a batch that are still waiting for their answer, the batch prepared from
/// them (or why it could not be), and the time that took.
pub(super) struct Ready {
    pub live: Vec<Job>,
    pub prepared: ember_model::Result<Batched>,
    pub input: Duration,
}

/// Where a batch runs and is accounted: the instance's runner and outputs buffer, the model,
/// and the model's tier and history cache metrics, statistics and load model.
pub(super) struct RunOn<'a> {
    pub engine: &'a mut dyn Runner,
    pub model: &'a dyn Servable,
    pub outputs: &'a mut Outputs,
    pub model_metrics: Option<&'a m::ModelMetrics>,
    pub stats: &'a Stats,
    pub load: &'a Load,
}

/// What one instance runs its batches with, owned: the model, the model's accounting (shared by
/// its instances) and the outputs buffer the instance reuses.
pub(super) struct Instance {
    model: Arc<dyn Servable>,
    outputs: Outputs,
    model_metrics: Option<Arc<m::ModelMetrics>>,
    stats: Arc<Stats>,
    load: Arc<Load>,
}

impl Shared {
    /// An instance of `model` accounted with these handles.
    pub(super) fn instance(&self, model: Arc<dyn Servable>) -> Instance {
        Instance {
            model,
            outputs: Outputs::default(),
            model_metrics: self.model_metrics.clone(),
            stats: self.stats.clone(),
            load: self.load.clone(),
        }
    }
}

impl Instance {
    /// Runs `ready` on `engine` and answers its requests ([`run_batch`]).
    pub(super) fn run(&mut self, engine: &mut dyn Runner, ready: Ready) {
        let on = RunOn {
            engine,
            model: self.model.as_ref(),
            outputs: &mut self.outputs,
            model_metrics: self.model_metrics.as_deref(),
            stats: &self.stats,
            load: &self.load,
        };
        run_batch(on, ready);
    }
}

/// The batching loop: form -> prepare -> run -> answer, until every sender is gone and the queue
/// is drained.
pub(super) fn run(
    mut engine: Box<dyn Runner>,
    cfg: BatchConfig,
    shared: Shared,
    rx: Arc<Queue<Job>>,
) {
    let model = engine.servable().clone();
    let depth = model.prefetch_depth();
    let mut instance = shared.instance(model.clone());
    let Shared {
        queued,
        abandon_at,
        stats,
        ..
    } = shared;
    let max_weight = model.max_batch_weight();
    let batches = std::iter::from_fn(move || form_batch(&rx, &cfg, max_weight, &queued));
    let _ = run_ahead(
        depth,
        batches,
        |jobs| prepare(model.as_ref(), jobs, &abandon_at, &stats),
        |ready: Option<Ready>| {
            if let Some(ready) = ready {
                instance.run(&mut *engine, ready);
            }
            Ok::<(), Infallible>(())
        },
        // With a thread forming batches ahead, waiting for rows and waiting for requests look
        // alike: neither is counted as a stall (see `ember_tier_stall_seconds`).
        |_| {},
    );
}

/// Waits for the next batch: up to `max_batch` samples, closed when full or when its first
/// request has waited `max_delay` (`queue.rs`). `None` when the batcher is stopping and the
/// queue is drained.
pub(super) fn form_batch(
    rx: &Queue<Job>,
    cfg: &BatchConfig,
    max_weight: usize,
    queued: &AtomicUsize,
) -> Option<Vec<Job>> {
    let jobs = rx.next_batch_within(cfg.max_batch, max_weight, |first| {
        first.enqueued + cfg.max_delay
    })?;
    // The batch's requests stop waiting now (one that did not fit still waits).
    let left = queued.fetch_sub(jobs.len(), Ordering::Relaxed) - jobs.len();
    metrics::gauge!(m::QUEUE_DEPTH).set(left as f64);
    Some(jobs)
}

/// Answers the requests whose deadline has passed (all of them once the stop's deadline has
/// passed), drops those whose client went away, merges the others into one batch and stages
/// its tier rows (`None` when no request is left).
pub(super) fn prepare(
    model: &dyn Servable,
    jobs: Vec<Job>,
    abandon_at: &Mutex<Option<Instant>>,
    stats: &Stats,
) -> Option<Ready> {
    let start = Instant::now();
    let abandon = abandon_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|end| start >= end);
    let (live, late): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| {
        !abandon && !j.reply.is_closed() && j.deadline.is_none_or(|(d, _)| d > start)
    });
    for j in late {
        let e = match j.deadline {
            _ if abandon => ServeError::ShuttingDown,
            Some((_, us)) => ServeError::DeadlineExceeded(us),
            None => continue,
        };
        j.answer(Err(e));
    }
    if live.is_empty() {
        return None;
    }
    for j in &live {
        metrics::histogram!(m::QUEUE_WAIT).record((start - j.enqueued).as_secs_f64());
        stats.queued(start - j.enqueued);
    }
    let merging = Instant::now();
    let n: usize = live.iter().map(|j| j.samples.len()).sum();
    metrics::histogram!(m::BATCH_SIZE).record(n as f64);
    let parts: Vec<&dyn Items> = live.iter().map(|j| j.samples.as_ref()).collect();
    let prepared = model.prepare(&parts);
    Some(Ready {
        live,
        prepared,
        input: merging.elapsed(),
    })
}

/// Runs a prepared batch and answers its requests (staged on this thread, the runner counts
/// its staging in the embedding stage). The admission model learns the batch's time before its
/// requests are answered.
pub(super) fn run_batch(on: RunOn<'_>, ready: Ready) {
    let RunOn {
        engine,
        model,
        outputs,
        model_metrics,
        stats,
        load,
    } = on;
    let Ready {
        live,
        prepared,
        input,
    } = ready;
    let n: usize = live.iter().map(|j| j.samples.len()).sum();
    let cost: u64 = live.iter().map(|j| j.cost).sum();
    let start = Instant::now();
    let result = prepared.and_then(|p| engine.run(&p, outputs));
    let infer = start.elapsed();
    let ok = result.is_ok();
    if ok {
        // Before the answers: a client that reads /metrics after its answer sees its batch.
        if let Some(t) = model_metrics {
            t.record(model);
        }
    }
    load.observe(cost, start.elapsed());
    let requests = live.len();
    let answered = Instant::now();
    answer(live, n, outputs, result);
    if ok {
        let output = answered.elapsed();
        let t = BatchTimes {
            input,
            infer,
            output,
        };
        stats.batch(requests, n, t);
    }
}

/// Records a scored batch's stage times and answers its requests, each with its items'
/// outputs.
pub(super) fn answer(
    live: Vec<Job>,
    n: usize,
    outputs: &Outputs,
    result: ember_model::Result<Times>,
) {
    match result {
        Ok(t) => {
            metrics::histogram!(m::EMBEDDING_STAGE).record(t.embedding.as_secs_f64());
            metrics::histogram!(m::DENSE_STAGE).record(t.dense.as_secs_f64());
            let (mut at, mut value) = (0, 0);
            for j in live {
                let k = j.samples.len();
                let (part, next) = outputs.part(at..at + k, value);
                j.answer(Ok(Reply {
                    outputs: part,
                    batch: n,
                }));
                (at, value) = (at + k, next);
            }
        }
        Err(e) => {
            // Its requests were checked when they arrived: whatever fails now is the server's,
            // or a store's that did not answer in time (a 503 naming it).
            let e = match e.kind() {
                ember_model::ErrorKind::Unavailable => ServeError::Unavailable(e.to_string()),
                _ => ServeError::Internal(format!("scoring a batch: {e}")),
            };
            for j in live {
                j.answer(Err(e.clone()));
            }
        }
    }
}
