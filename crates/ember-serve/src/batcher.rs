//! Dynamic batching: requests wait in a bounded queue; one loop forms batches of up to
//! `max_batch` samples and the model's `Servable::max_batch_weight` (an HSTU batch's tokens:
//! its activations' memory), closed when full or when the first request has waited `max_delay`,
//! prepares them and runs them on the model's [`Runner`], then answers each request:
//!
//! ```text
//! admit -> queue -> form batch -> prepare (drop late requests, merge, stage tier rows) -> run -> answer
//! ```
//!
//! The loop is [`ember_model::run_ahead`], the same pipeline the SSD tier uses: when the model
//! has tables on the tier, forming and preparing the next batches (reading their rows) runs on a
//! thread of its own, `prefetch_depth` batches ahead of the batch being computed; otherwise all
//! of it runs on the batcher's thread. Requests arrive checked ([`crate::ModelSpec::check`]), so
//! nothing here checks their ids again.
//!
//! Load is shed, not queued: a request whose expected wait (`admit.rs`) is over its deadline or
//! `max_queue_delay`, or that finds the queue full, is refused at once
//! ([`ServeError::Overloaded`]). A request larger than `max_batch` runs as `max_batch` pieces,
//! each queued when the one before is answered, so that small requests interleave with it
//! instead of waiting behind all of it. A request whose deadline has passed when its batch
//! starts is answered [`ServeError::DeadlineExceeded`] without being computed, and one whose
//! client went away is dropped. Shutting down stops new requests and finishes the queued ones
//! until its deadline ([`Batcher::shutdown_by`]); those left then are answered
//! [`ServeError::ShuttingDown`].

mod admit;
mod instances;
mod queue;
mod run;
mod stats;

use stats::Stats;
pub use stats::{DurationStat, ModelStats};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ember_model::serving::{Outputs, Request, Runner, Servable};
use tokio::sync::oneshot;

use crate::error::{Result, ServeError};
use crate::metrics as m;
use admit::Load;
use queue::{Queue, Refused, Weighed};

/// Batching limits.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Most samples in one batch (a larger request runs as pieces of this size).
    pub max_batch: usize,
    /// Longest a request waits for others to join its batch.
    pub max_delay: Duration,
    /// Most requests waiting (in the queue or in a batch still forming); one more is refused.
    pub queue: usize,
    /// Longest a request may be expected to wait before its batch starts; one expected to wait
    /// longer is refused at once (`None`: only its own deadline bounds it).
    pub max_queue_delay: Option<Duration>,
    /// Model instances (Triton's `instance_group` count): batches run at once, each by an engine
    /// of its own. The batcher forms a batch when an instance is free, so requests that arrive
    /// while all are busy join the next one.
    pub instances: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            max_batch: 256,
            max_delay: Duration::from_micros(500),
            queue: 4096,
            max_queue_delay: Some(Duration::from_millis(50)),
            instances: 1,
        }
    }
}

/// A request's answer: its outputs, and the size of the batch it ran in.
#[derive(Debug, Clone)]
pub struct Reply {
    pub outputs: Outputs,
    /// Items in the batch it ran in.
    pub batch: usize,
}

impl Reply {
    /// The first output's values (a DLRM-family model's scores).
    pub fn scores(&self) -> &[f32] {
        self.outputs.scores()
    }
}

struct Job {
    samples: Request,
    /// `samples.weight()`, taken once (the queue reads it under its lock).
    weight: usize,
    /// Its expected cost (`Servable::cost`), counted in the admission model.
    cost: u64,
    deadline: Option<(Instant, u64)>,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Reply>>,
    /// Its samples count as pending until it is answered or dropped.
    _pending: Pending,
}

/// Samples and their expected cost, counted in [`Load`] until dropped.
struct Pending(Arc<Load>, usize, u64);

impl Pending {
    fn new(load: &Arc<Load>, n: usize, cost: u64) -> Self {
        load.add(n, cost);
        Pending(load.clone(), n, cost)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.done(self.1, self.2);
    }
}

impl Job {
    /// Answers the request. Its samples stop counting as pending first, so that whoever reads
    /// the answer sees them gone.
    fn answer(self, r: Result<Reply>) {
        let Job {
            reply, _pending, ..
        } = self;
        drop(_pending);
        let _ = reply.send(r);
    }
}

impl Weighed for Job {
    fn samples(&self) -> usize {
        self.samples.len()
    }
    /// What its items weigh against the model's `Servable::max_batch_weight` (an HSTU user:
    /// its tokens).
    fn weight(&self) -> usize {
        self.weight
    }
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
    queue: Arc<Queue<Job>>,
    queued: Arc<AtomicUsize>,
    cfg: BatchConfig,
    load: Arc<Load>,
    /// The model (its requests' costs).
    model: Arc<dyn Servable>,
    /// Its metrics' label.
    name: String,
    /// When set, queued requests not yet started then are answered `ShuttingDown`.
    abandon_at: Arc<Mutex<Option<Instant>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<Stats>,
}

impl Batcher {
    /// Starts the batching thread, which owns `engine` (the CPU predictor, a GPU predictor) of
    /// the model served as `name` (its metrics' label).
    pub fn start(engine: Box<dyn Runner>, cfg: BatchConfig, name: &str) -> Self {
        Self::start_pool(vec![engine], cfg, name)
    }

    /// [`Batcher::start`] with one engine per model instance (`engines` of one model; their
    /// count overrides `cfg.instances`): each runs its batches on a thread of its own.
    pub fn start_pool(engines: Vec<Box<dyn Runner>>, cfg: BatchConfig, name: &str) -> Self {
        assert!(!engines.is_empty(), "a batcher needs an engine");
        let cfg = BatchConfig {
            max_batch: cfg.max_batch.max(1),
            queue: cfg.queue.max(1),
            instances: engines.len(),
            ..cfg
        };
        let queue = Arc::new(Queue::new(cfg.queue));
        let rx = queue.clone();
        let queued = Arc::new(AtomicUsize::new(0));
        let load = Arc::new(Load::new(cfg.max_batch, cfg.instances));
        let abandon_at = Arc::new(Mutex::new(None));
        let stats = Arc::new(Stats::default());
        let model = engines[0].servable().clone();
        let shared = Shared {
            queued: queued.clone(),
            load: load.clone(),
            abandon_at: abandon_at.clone(),
            model_metrics: m::ModelMetrics::of(name, engines[0].servable().as_ref()).map(Arc::new),
            stats: stats.clone(),
        };
        let worker = std::thread::Builder::new()
            .name("ember-batcher".into())
            .spawn(move || {
                if engines.len() == 1 {
                    let engine = engines.into_iter().next().expect("one engine");
                    run::run(engine, cfg, shared, rx)
                } else {
                    instances::run(engines, cfg, shared, rx)
                }
            })
            .expect("spawn the batcher thread");
        Batcher {
            queue,
            queued,
            cfg,
            load,
            model,
            name: name.to_string(),
            abandon_at,
            worker: Mutex::new(Some(worker)),
            stats,
        }
    }

    /// Its limits.
    pub fn config(&self) -> &BatchConfig {
        &self.cfg
    }

    /// Its statistics, as Triton's statistics extension reports them, for `name` `version`.
    pub fn stats(&self, name: &str, version: u64) -> ModelStats {
        self.stats.snapshot(name, version)
    }

    /// Queues `samples` (as `max_batch` pieces when there are more); the answer comes when
    /// their batches have run. `timeout_us`, if given, is the request's deadline from now. A
    /// request expected to wait past its deadline or the queue-delay bound is refused at once.
    pub async fn submit(&self, samples: Request, timeout_us: Option<u64>) -> Result<Reply> {
        let (t0, n) = (Instant::now(), samples.len());
        let classes = samples.classes();
        let r = self.submit_counted(samples, timeout_us).await;
        let took = t0.elapsed();
        self.stats.request(r.is_ok(), n, took);
        if r.is_ok() {
            // Each item waited for the whole request: its latency is the request's.
            for class in classes {
                metrics::histogram!(m::ITEM_SECONDS, "model" => self.name.clone(), "history" => class)
                    .record(took.as_secs_f64());
            }
        }
        r
    }

    async fn submit_counted(&self, samples: Request, timeout_us: Option<u64>) -> Result<Reply> {
        if samples.is_empty() {
            return Ok(Reply {
                outputs: Outputs::default(),
                batch: 0,
            });
        }
        let now = Instant::now();
        let deadline = timeout_us.map(|us| (now + Duration::from_micros(us), us));
        // The first piece is admitted and counted in one atomic step, so that requests
        // arriving together cannot all pass on the same count; the later pieces of an admitted
        // request are counted when they are queued.
        if samples.len() <= self.cfg.max_batch {
            let cost = self.model.cost(samples.as_ref());
            let held = self.reserve(samples.len(), cost, timeout_us)?;
            return self.enqueue(samples, deadline, held).await;
        }
        // One piece in the queue at a time: requests that arrive meanwhile run between them.
        let mut outputs = Outputs::default();
        let mut batch = 0;
        for (i, piece) in samples.pieces(self.cfg.max_batch).enumerate() {
            let cost = self.model.cost(piece.as_ref());
            let counted = match i {
                0 => self.reserve(piece.len(), cost, timeout_us)?,
                _ => Pending::new(&self.load, piece.len(), cost),
            };
            let r = self.enqueue(piece, deadline, counted).await?;
            outputs.append(&r.outputs);
            batch = batch.max(r.batch);
        }
        Ok(Reply { outputs, batch })
    }

    /// The bound on a request's wait: the queue-delay bound or its deadline, the smaller.
    fn bound(&self, timeout_us: Option<u64>) -> Option<Duration> {
        match (self.cfg.max_queue_delay, timeout_us) {
            (Some(q), Some(us)) => Some(q.min(Duration::from_micros(us))),
            (q, us) => q.or(us.map(Duration::from_micros)),
        }
    }

    /// Admits `n` samples of expected `cost` and counts them as pending, or refuses them as
    /// [`Batcher::admit`].
    fn reserve(&self, n: usize, cost: u64, timeout_us: Option<u64>) -> Result<Pending> {
        let Some(bound) = self.bound(timeout_us) else {
            return Ok(Pending::new(&self.load, n, cost));
        };
        match self.load.try_add(n, cost, bound) {
            Ok(()) => Ok(Pending(self.load.clone(), n, cost)),
            Err(wait) => Err(self.refusal(wait, bound)),
        }
    }

    /// The 503 of a request expected to wait `wait`, over `bound`.
    fn refusal(&self, wait: Duration, bound: Duration) -> ServeError {
        metrics::counter!(m::REQUESTS_REFUSED, "reason" => "overloaded").increment(1);
        let why = match self.cfg.max_queue_delay {
            Some(q) if q <= bound => "the queue-delay bound (--max-queue-delay-ms)",
            _ => "the request's deadline",
        };
        ServeError::Overloaded(format!(
            "its expected wait of {:.1} ms is over {why} of {:.1} ms",
            wait.as_secs_f64() * 1e3,
            bound.as_secs_f64() * 1e3
        ))
    }

    /// Refuses a request expected to wait longer than its deadline (`timeout_us` from now) or
    /// the queue-delay bound. A front end calls it before reading and decoding a request, to
    /// refuse it without that work; [`Batcher::submit`] decides again, atomically with counting
    /// the request in.
    pub fn admit(&self, timeout_us: Option<u64>) -> Result<()> {
        let Some(bound) = self.bound(timeout_us) else {
            return Ok(());
        };
        let wait = self.load.expected_wait();
        if wait <= bound {
            return Ok(());
        }
        Err(self.refusal(wait, bound))
    }

    /// Queues samples of at most `max_batch` and waits for their answer.
    async fn enqueue(
        &self,
        samples: Request,
        deadline: Option<(Instant, u64)>,
        counted: Pending,
    ) -> Result<Reply> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            cost: counted.2,
            _pending: counted,
            weight: samples.weight(),
            samples,
            deadline,
            enqueued: Instant::now(),
            reply,
        };
        let full = || {
            metrics::counter!(m::REQUESTS_REFUSED, "reason" => "queue_full").increment(1);
            ServeError::Overloaded(format!("{} requests are queued", self.cfg.queue))
        };
        // Waiting includes sitting in a batch that is still forming.
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.cfg.queue {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(full());
        }
        if let Err((why, _job)) = self.queue.push(job) {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(match why {
                Refused::Full => full(),
                Refused::Closed => ServeError::ShuttingDown,
            });
        }
        metrics::gauge!(m::QUEUE_DEPTH).set(self.queued.load(Ordering::Relaxed) as f64);
        answer
            .await
            .unwrap_or_else(|_| Err(ServeError::Internal("the batcher stopped".into())))
    }

    /// Starts the admission model from batches the engine ran before serving (`(cost, time)`
    /// each, [`Servable::cost`] of the batch, from warming it): without them, the first batches of a fresh server, slow
    /// while caches and pages fill, would be all the model knows, and the first burst of
    /// requests would be refused for an expected wait that never comes.
    pub fn prime(&self, batches: &[(u64, Duration)]) {
        for &(n, t) in batches {
            self.load.observe(n, t);
        }
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Samples submitted and not yet answered.
    pub fn pending_samples(&self) -> usize {
        self.load.pending()
    }

    /// Expected cost ([`Servable::cost`]) submitted and not yet answered.
    pub fn pending_cost(&self) -> u64 {
        self.load.pending_cost()
    }

    /// The wait a request arriving now is expected to have before its batch starts.
    pub fn expected_wait(&self) -> Duration {
        self.load.expected_wait()
    }

    /// Refuses new requests, lets the worker finish every queued one, and waits for it.
    pub fn shutdown(&self) {
        self.queue.close();
        if let Some(w) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.join();
        }
    }

    /// [`Batcher::shutdown`], but requests whose batch has not started by `end` are answered
    /// [`ServeError::ShuttingDown`] instead of run (the batch running then finishes).
    pub fn shutdown_by(&self, end: Instant) {
        *self.abandon_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(end);
        self.shutdown();
    }
}

/// What the batching loop shares with the [`Batcher`].
struct Shared {
    queued: Arc<AtomicUsize>,
    load: Arc<Load>,
    abandon_at: Arc<Mutex<Option<Instant>>>,
    /// The model's tier and history cache metrics (none without either).
    model_metrics: Option<Arc<m::ModelMetrics>>,
    stats: Arc<Stats>,
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
pub(crate) mod tests;
