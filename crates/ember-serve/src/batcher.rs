//! Dynamic batching: requests wait in a bounded queue; one worker thread owns the model's
//! [`Predictor`] and runs batches of up to `max_batch` samples, closing a batch when it is full
//! or when its first request has waited `max_delay`, whichever comes first.
//!
//! With tables on the SSD tier, a second thread runs the forward passes, so that the next batch's
//! missing rows are read while the current batch computes (`tier.prefetch_depth` batches ahead).
//!
//! A full queue refuses at once ([`ServeError::Overloaded`]) rather than growing memory. A
//! request whose deadline has passed when its batch starts is answered
//! [`ServeError::DeadlineExceeded`] without being computed. Shutting down stops new requests and
//! finishes every queued one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ember_embed::{Ids, KeyedJagged, StagedBatch};
use ember_model::{Predictor, Scorer, StageTimes};
use tokio::sync::oneshot;

use crate::error::{Result, ServeError};
use crate::metrics as m;
use crate::samples::{ModelSpec, Samples};

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

/// A request's scores and where its time went.
#[derive(Debug, Clone)]
pub struct Scored {
    pub scores: Vec<f32>,
    /// Samples in the batch it ran in.
    pub batch: usize,
}

struct Job {
    samples: Samples,
    deadline: Option<(Instant, u64)>,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Scored>>,
}

/// The queue and its worker.
#[derive(Debug)]
pub struct Batcher {
    tx: RwLock<Option<SyncSender<Job>>>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("n", &self.samples.n).finish()
    }
}

impl Batcher {
    /// Starts the worker thread, which owns `predictor`.
    pub fn start(predictor: Predictor, spec: Arc<ModelSpec>, cfg: BatchConfig) -> Self {
        Self::start_engine(Engine::Cpu(Box::new(predictor)), spec, cfg)
    }

    /// Starts the worker thread with any [`Engine`] (a GPU predictor, say).
    pub fn start_engine(engine: Engine, spec: Arc<ModelSpec>, cfg: BatchConfig) -> Self {
        let (tx, rx) = sync_channel(cfg.queue.max(1));
        let queued = Arc::new(AtomicUsize::new(0));
        let q = queued.clone();
        let worker = std::thread::Builder::new()
            .name("ember-batcher".into())
            .spawn(move || match engine {
                Engine::Cpu(predictor) => Worker::new(*predictor, spec, cfg, q).run(rx),
                Engine::Device(scorer) => run_device(scorer, spec, cfg, q, rx),
            })
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
    pub async fn submit(&self, samples: Samples, timeout_us: Option<u64>) -> Result<Scored> {
        if samples.n == 0 {
            return Ok(Scored {
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

/// What scores the batches: the CPU predictor (with the SSD tier's pipeline), or a predictor
/// on another device.
pub enum Engine {
    Cpu(Box<Predictor>),
    Device(Box<dyn Scorer>),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Engine::Cpu(p) => write!(f, "Engine::Cpu({})", p.device()),
            Engine::Device(s) => write!(f, "Engine::Device({})", s.device()),
        }
    }
}

/// The worker of a device engine: forms batches and scores them one at a time.
fn run_device(
    mut scorer: Box<dyn Scorer>,
    spec: Arc<ModelSpec>,
    cfg: BatchConfig,
    queued: Arc<AtomicUsize>,
    rx: Receiver<Job>,
) {
    let narrow_ids = spec.rows.iter().all(|&r| r <= u32::MAX as usize + 1);
    let mut carry = None;
    let mut scores = Vec::new();
    while let Some(jobs) = form_batch(&rx, &mut carry, &cfg, &queued) {
        if let Some(p) = prepare(&spec, narrow_ids, jobs) {
            scores.resize(p.n, 0.0);
            let r = scorer.score(&p.dense, &p.kj, &mut scores);
            answer(p, &scores, r);
        }
    }
}

struct Worker {
    predictor: Predictor,
    spec: Arc<ModelSpec>,
    cfg: BatchConfig,
    queued: Arc<AtomicUsize>,
    /// Whether every table's ids fit in u32 (the embedding stage's compact id type).
    narrow_ids: bool,
    scores: Vec<f32>,
}

/// A batch formed and merged, ready for the forward pass.
struct Prepared {
    live: Vec<Job>,
    n: usize,
    dense: Vec<f32>,
    kj: KeyedJagged,
}

impl Worker {
    fn new(
        predictor: Predictor,
        spec: Arc<ModelSpec>,
        cfg: BatchConfig,
        queued: Arc<AtomicUsize>,
    ) -> Self {
        let narrow_ids = spec.rows.iter().all(|&r| r <= u32::MAX as usize + 1);
        Worker {
            predictor,
            spec,
            cfg,
            queued,
            narrow_ids,
            scores: Vec::new(),
        }
    }

    /// Forms batches and runs them. With tables on the SSD tier and a prefetch depth of at least
    /// one, a second thread runs the forward passes while this one forms the next batch and reads
    /// its missing rows (up to `prefetch_depth` batches ahead); otherwise both happen here, and
    /// the forward pass stages its own rows.
    fn run(self, rx: Receiver<Job>) {
        let model = self.predictor.model().clone();
        let depth = model.config().tier.as_ref().map_or(1, |t| t.prefetch_depth);
        let Worker {
            mut predictor,
            spec,
            cfg,
            queued,
            narrow_ids,
            mut scores,
        } = self;
        let mut carry: Option<Job> = None;
        if !model.stager().is_active() || depth == 0 {
            while let Some(jobs) = form_batch(&rx, &mut carry, &cfg, &queued) {
                if let Some(p) = prepare(&spec, narrow_ids, jobs) {
                    compute(&mut predictor, &mut scores, p, None);
                }
            }
            return;
        }
        let (tx, ready) = sync_channel::<(Prepared, ember_embed::Result<StagedBatch>)>(depth - 1);
        std::thread::scope(|s| {
            let computer = std::thread::Builder::new()
                .name("ember-forward".into())
                .spawn_scoped(s, move || {
                    for (p, staged) in ready {
                        compute(&mut predictor, &mut scores, p, Some(staged));
                    }
                });
            if let Err(e) = computer {
                // No second thread: nothing can be computed; answer what comes.
                while let Some(jobs) = form_batch(&rx, &mut carry, &cfg, &queued) {
                    for j in jobs {
                        let _ = j
                            .reply
                            .send(Err(ServeError::Internal(format!("no forward thread: {e}"))));
                    }
                }
                return;
            }
            while let Some(jobs) = form_batch(&rx, &mut carry, &cfg, &queued) {
                let Some(p) = prepare(&spec, narrow_ids, jobs) else {
                    continue;
                };
                let staged = model
                    .embeddings()
                    .validate(&p.kj)
                    .and_then(|b| model.stager().stage(model.embeddings(), b));
                if tx.send((p, staged)).is_err() {
                    return;
                }
            }
            drop(tx);
        });
    }
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
    let mut n = first.samples.n;
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
            Ok(j) if n + j.samples.n > cfg.max_batch => {
                *carry = Some(j);
                break;
            }
            Ok(j) => {
                n += j.samples.n;
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

/// Answers the requests whose deadline has passed, and merges the others into one batch
/// (`None` when none is left, or when merging failed and they were answered).
fn prepare(spec: &ModelSpec, narrow_ids: bool, jobs: Vec<Job>) -> Option<Prepared> {
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
    let n: usize = live.iter().map(|j| j.samples.n).sum();
    metrics::histogram!(m::BATCH_SIZE).record(n as f64);
    match merge(spec, narrow_ids, &live, n) {
        Ok((dense, kj)) => Some(Prepared { live, n, dense, kj }),
        Err(e) => {
            for j in live {
                let _ = j.reply.send(Err(e.clone()));
            }
            None
        }
    }
}

/// Merges the jobs' samples into one batch: dense rows in job order, and feature-major ids.
fn merge(
    spec: &ModelSpec,
    narrow_ids: bool,
    jobs: &[Job],
    n: usize,
) -> Result<(Vec<f32>, KeyedJagged)> {
    let nf = spec.features.len();
    let mut dense = Vec::with_capacity(n * spec.dense_in);
    for j in jobs {
        dense.extend_from_slice(&j.samples.dense);
    }
    // Feature-major: feature f's lengths (and ids) of every job, in job order.
    let mut lengths = Vec::with_capacity(nf * n);
    let total: usize = jobs.iter().map(|j| j.samples.ids.len()).sum();
    let mut ids64 = Vec::with_capacity(total);
    let mut starts: Vec<usize> = vec![0; jobs.len()];
    for f in 0..nf {
        for (j, start) in jobs.iter().zip(starts.iter_mut()) {
            let s = &j.samples;
            let ls = &s.lengths[f * s.n..(f + 1) * s.n];
            let count: usize = ls.iter().map(|&l| l as usize).sum();
            lengths.extend(ls.iter().map(|&l| l as usize));
            ids64.extend_from_slice(&s.ids[*start..*start + count]);
            *start += count;
        }
    }
    let ids = if narrow_ids {
        Ids::U32(ids64.iter().map(|&i| i as u32).collect())
    } else {
        Ids::I64(ids64)
    };
    let kj = KeyedJagged::from_lengths(spec.features.clone(), n, &lengths, ids, None)
        .map_err(|e| ServeError::Internal(format!("merging a batch: {e}")))?;
    Ok((dense, kj))
}

/// Runs the forward pass of a prepared batch (its SSD-tier rows staged already when `staged` is
/// given) and answers its requests.
fn compute(
    predictor: &mut Predictor,
    scores: &mut Vec<f32>,
    p: Prepared,
    staged: Option<ember_embed::Result<StagedBatch>>,
) {
    scores.resize(p.n, 0.0);
    let result = match staged {
        None => predictor.predict(&p.dense, &p.kj, scores),
        Some(Ok(st)) => predictor.predict_staged(&p.dense, &p.kj, Some(&st), scores),
        Some(Err(e)) => Err(e.into()),
    };
    if result.is_ok() {
        m::record_tier(predictor.model().stager());
    }
    answer(p, scores, result.map_err(|e| e.to_string()));
}

/// Records a scored batch's stage times and answers its requests.
fn answer(p: Prepared, scores: &[f32], result: std::result::Result<StageTimes, String>) {
    let Prepared { live, n, .. } = p;
    match result {
        Ok(t) => {
            metrics::histogram!(m::EMBEDDING_STAGE).record(t.embedding.as_secs_f64());
            let dense_t = if t.bottom_overlapped {
                t.interaction + t.top_mlp
            } else {
                t.bottom_mlp + t.interaction + t.top_mlp
            };
            metrics::histogram!(m::DENSE_STAGE).record(dense_t.as_secs_f64());
            let mut at = 0;
            for j in live {
                let k = j.samples.n;
                let _ = j.reply.send(Ok(Scored {
                    scores: scores[at..at + k].to_vec(),
                    batch: n,
                }));
                at += k;
            }
        }
        Err(e) => {
            let e = ServeError::Internal(format!("scoring a batch: {e}"));
            for j in live {
                let _ = j.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ember_model::{LoadOptions, Model};

    /// The shipped default model.
    pub(crate) fn default_model() -> Arc<Model> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
        Arc::new(Model::load(&dir, LoadOptions::default()).expect("the shipped model loads"))
    }

    /// `n` samples with random dense values and 0-3 random ids per bag.
    pub(crate) fn random_samples(spec: &ModelSpec, n: usize, seed: u64) -> Samples {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let dense = (0..n * spec.dense_in)
            .map(|_| (next() % 1000) as f32 / 250.0)
            .collect();
        let mut lengths = Vec::new();
        let mut ids = Vec::new();
        for &rows in &spec.rows {
            for _ in 0..n {
                let l = (next() % 4) as u32;
                lengths.push(l);
                ids.extend((0..l).map(|_| (next() % rows as u64) as i64));
            }
        }
        Samples::new(spec, n, dense, lengths, ids).unwrap()
    }

    /// Scores `s` alone, without the batcher.
    fn direct(model: &Arc<Model>, spec: &ModelSpec, s: &Samples) -> Vec<f32> {
        let mut p = Predictor::new(model.clone(), 1).unwrap();
        let lengths: Vec<usize> = s.lengths.iter().map(|&l| l as usize).collect();
        let kj = KeyedJagged::from_lengths(
            spec.features.clone(),
            s.n,
            &lengths,
            Ids::I64(s.ids.clone()),
            None,
        )
        .unwrap();
        let mut out = vec![0.0; s.n];
        p.predict(&s.dense, &kj, &mut out).unwrap();
        out
    }

    fn start(cfg: BatchConfig) -> (Arc<Model>, Arc<ModelSpec>, Arc<Batcher>) {
        let model = default_model();
        let spec = Arc::new(ModelSpec::of(&model, "default"));
        let p = Predictor::new(model.clone(), 1).unwrap();
        let b = Arc::new(Batcher::start(p, spec.clone(), cfg));
        (model, spec, b)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merged_batches_score_like_single_requests() {
        let cfg = BatchConfig {
            max_batch: 16,
            max_delay: Duration::from_millis(20),
            queue: 1000,
        };
        let (model, spec, b) = start(cfg);
        let reqs: Vec<Samples> = (0..40)
            .map(|i| random_samples(&spec, 1 + i % 3, i as u64))
            .collect();
        let tasks: Vec<_> = reqs
            .iter()
            .cloned()
            .map(|s| {
                let b = b.clone();
                tokio::spawn(async move { b.submit(s, None).await })
            })
            .collect();
        let mut largest = 0;
        for (t, s) in tasks.into_iter().zip(&reqs) {
            let got = t.await.unwrap().unwrap();
            assert!(got.batch <= 16, "batch of {} over max_batch", got.batch);
            largest = largest.max(got.batch);
            let want = direct(&model, &spec, s);
            assert_eq!(got.scores.len(), s.n);
            for (g, w) in got.scores.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5, "{g} vs {w}");
            }
        }
        assert!(
            largest > 3,
            "no request was batched with another (largest batch {largest})"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_refuses_at_once() {
        let cfg = BatchConfig {
            max_batch: 1000,
            max_delay: Duration::from_millis(300),
            queue: 2,
        };
        let (_, spec, b) = start(cfg);
        let waiting: Vec<_> = (0..2)
            .map(|i| {
                let (b, s) = (b.clone(), random_samples(&spec, 1, i));
                tokio::spawn(async move { b.submit(s, None).await })
            })
            .collect();
        // Let both reach the queue.
        while b.queued() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let t = Instant::now();
        let third = b.submit(random_samples(&spec, 1, 9), None).await;
        assert_eq!(third.unwrap_err(), ServeError::Overloaded(2));
        assert!(t.elapsed() < Duration::from_millis(100), "refusal waited");
        for w in waiting {
            assert_eq!(w.await.unwrap().unwrap().scores.len(), 1);
        }
        // Room again.
        assert!(b.submit(random_samples(&spec, 2, 3), None).await.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn late_requests_are_answered_without_scores() {
        let cfg = BatchConfig {
            max_batch: 1000,
            max_delay: Duration::from_millis(100),
            queue: 10,
        };
        let (_, spec, b) = start(cfg);
        let late = b.submit(random_samples(&spec, 1, 1), Some(1_000)).await;
        assert_eq!(late.unwrap_err(), ServeError::DeadlineExceeded(1_000));
        let fine = b.submit(random_samples(&spec, 1, 2), Some(5_000_000)).await;
        assert!(fine.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_finishes_what_is_queued_then_refuses() {
        // One long-forming batch holds all ten, so that they are all waiting when the stop comes.
        let cfg = BatchConfig {
            max_batch: 1000,
            max_delay: Duration::from_secs(5),
            queue: 100,
        };
        let (_, spec, b) = start(cfg);
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let (b, s) = (b.clone(), random_samples(&spec, 2, i));
                tokio::spawn(async move { b.submit(s, None).await })
            })
            .collect();
        while b.queued() < 10 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let b2 = b.clone();
        tokio::task::spawn_blocking(move || b2.shutdown())
            .await
            .unwrap();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().scores.len(), 2);
        }
        // The stop closed the forming batch at once rather than after max_delay.
        assert!(t0.elapsed() < Duration::from_secs(4));
        let after = b.submit(random_samples(&spec, 1, 0), None).await;
        assert_eq!(after.unwrap_err(), ServeError::ShuttingDown);
    }

    #[test]
    fn empty_requests_need_no_batch() {
        let (_, spec, b) = start(BatchConfig::default());
        let s = Samples::new(&spec, 0, vec![], vec![], vec![]).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(rt.block_on(b.submit(s, None)).unwrap().scores.is_empty());
    }
}
