//! The batcher against the predictor alone: merged batches score like single requests, a full
//! queue refuses at once, late requests are answered without scores, shutdown finishes what is
//! queued, empty requests need no batch.

use super::*;
use crate::spec::ModelSpec;
use ember_model::serving::EngineRunner;
use ember_model::{
    Engine, KeyedJagged, LoadOptions, Model, Predictor, Prepared, Samples, StageTimes,
};

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
    let dense = (0..n * spec.dense_in())
        .map(|_| (next() % 1000) as f32 / 250.0)
        .collect();
    let mut lengths = Vec::new();
    let mut ids = Vec::new();
    for &rows in &spec.bags.as_ref().unwrap().rows {
        for _ in 0..n {
            let l = (next() % 4) as u32;
            lengths.push(l);
            ids.extend((0..l).map(|_| (next() % rows as u64) as i64));
        }
    }
    ember_model::serving::into_samples(spec.check(n, dense, lengths, ids).unwrap()).unwrap()
}

/// Scores `s` alone, without the batcher.
fn direct(model: &Arc<Model>, spec: &ModelSpec, s: &Samples) -> Vec<f32> {
    let mut p = Predictor::new(model.clone(), 1).unwrap();
    let lengths: Vec<usize> = s.lengths().iter().map(|&l| l as usize).collect();
    let kj = KeyedJagged::from_lengths(
        spec.features().to_vec(),
        s.len(),
        &lengths,
        s.ids().clone(),
        None,
    )
    .unwrap();
    let mut out = vec![0.0; s.len()];
    p.score(s.dense(), &kj, &mut out).unwrap();
    out
}

/// Submits each of `reqs` as a request of its own, each on a task (answers in `reqs`' order).
fn submit_each(b: &Arc<Batcher>, reqs: &[Samples]) -> Vec<tokio::task::JoinHandle<Result<Reply>>> {
    reqs.iter()
        .cloned()
        .map(|s| {
            let b = b.clone();
            tokio::spawn(async move { b.submit(Box::new(s), None).await })
        })
        .collect()
}

/// Submits `n` requests of `samples` samples each (seeds 0..n) and waits until all are queued.
async fn queue_requests(
    b: &Arc<Batcher>,
    spec: &ModelSpec,
    n: usize,
    samples: usize,
) -> Vec<tokio::task::JoinHandle<Result<Reply>>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (b, s) = (b.clone(), random_samples(spec, samples, i as u64));
            tokio::spawn(async move { b.submit(Box::new(s), None).await })
        })
        .collect();
    until("the requests queued", || b.queued() >= n).await;
    tasks
}

fn start(cfg: BatchConfig) -> (Arc<Model>, Arc<ModelSpec>, Arc<Batcher>) {
    let model = default_model();
    let spec = Arc::new(ModelSpec::of(model.clone(), "default"));
    let p = Predictor::new(model.clone(), 1).unwrap();
    let b = Arc::new(Batcher::start(
        Box::new(EngineRunner::new(Box::new(p))),
        cfg,
        "test",
    ));
    (model, spec, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_batches_score_like_single_requests() {
    let cfg = BatchConfig {
        max_batch: 16,
        max_delay: Duration::from_millis(20),
        queue: 1000,
        max_queue_delay: None,
        instances: 1,
    };
    let (model, spec, b) = start(cfg);
    let reqs: Vec<Samples> = (0..40)
        .map(|i| random_samples(&spec, 1 + i % 3, i as u64))
        .collect();
    let tasks = submit_each(&b, &reqs);
    let mut largest = 0;
    for (t, s) in tasks.into_iter().zip(&reqs) {
        let got = t.await.unwrap().unwrap();
        assert!(got.batch <= 16, "batch of {} over max_batch", got.batch);
        largest = largest.max(got.batch);
        let want = direct(&model, &spec, s);
        assert_eq!(got.scores().len(), s.len());
        for (g, w) in got.scores().iter().zip(&want) {
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
        max_queue_delay: None,
        instances: 1,
    };
    let (_, spec, b) = start(cfg);
    let waiting = queue_requests(&b, &spec, 2, 1).await;
    let t = Instant::now();
    let third = b.submit(Box::new(random_samples(&spec, 1, 9)), None).await;
    assert_eq!(
        third.unwrap_err(),
        ServeError::Overloaded("2 requests are queued".into())
    );
    assert!(t.elapsed() < Duration::from_millis(100), "refusal waited");
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().scores().len(), 1);
    }
    // Room again.
    assert!(
        b.submit(Box::new(random_samples(&spec, 2, 3)), None)
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_requests_are_answered_without_scores() {
    let cfg = BatchConfig {
        max_batch: 1000,
        max_delay: Duration::from_millis(100),
        queue: 10,
        max_queue_delay: None,
        instances: 1,
    };
    let (_, spec, b) = start(cfg);
    let late = b
        .submit(Box::new(random_samples(&spec, 1, 1)), Some(1_000))
        .await;
    assert_eq!(late.unwrap_err(), ServeError::DeadlineExceeded(1_000));
    let fine = b
        .submit(Box::new(random_samples(&spec, 1, 2)), Some(5_000_000))
        .await;
    assert!(fine.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_what_is_queued_then_refuses() {
    // One long-forming batch holds all ten, so that they are all waiting when the stop comes.
    let cfg = BatchConfig {
        max_batch: 1000,
        max_delay: Duration::from_secs(5),
        queue: 100,
        max_queue_delay: None,
        instances: 1,
    };
    let (_, spec, b) = start(cfg);
    let t0 = Instant::now();
    let tasks = queue_requests(&b, &spec, 10, 2).await;
    let b2 = b.clone();
    tokio::task::spawn_blocking(move || b2.shutdown())
        .await
        .unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().scores().len(), 2);
    }
    // The stop closed the forming batch at once rather than after max_delay.
    assert!(t0.elapsed() < Duration::from_secs(4));
    let after = b.submit(Box::new(random_samples(&spec, 1, 0)), None).await;
    assert_eq!(after.unwrap_err(), ServeError::ShuttingDown);
}

#[test]
fn empty_requests_need_no_batch() {
    let (_, spec, b) = start(BatchConfig::default());
    let s = spec.check(0, vec![], vec![], Vec::<i64>::new()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(rt.block_on(b.submit(s, None)).unwrap().scores().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_expected_to_wait_too_long_is_refused_at_once() {
    let cfg = BatchConfig {
        max_batch: 1000,
        // Long enough that the batch still forms while the test looks at it on a loaded
        // machine (at 300 ms a CI run once saw the batch leave before the check).
        max_delay: Duration::from_secs(2),
        queue: 100,
        max_queue_delay: Some(Duration::from_nanos(1)),
        instances: 1,
    };
    let (_, spec, b) = start(cfg);
    // Nothing ahead: no wait, whatever the bound.
    assert!(b.expected_wait().is_zero());
    assert_eq!(
        b.submit(Box::new(random_samples(&spec, 3, 1)), None)
            .await
            .unwrap()
            .scores()
            .len(),
        3
    );
    // One request waits in a forming batch: the next is expected to wait behind it.
    let ahead = {
        let (b, s) = (b.clone(), random_samples(&spec, 5, 2));
        tokio::spawn(async move { b.submit(Box::new(s), None).await })
    };
    until("the request ahead pending", || b.pending_samples() >= 5).await;
    assert!(b.expected_wait() > Duration::ZERO);
    let t = Instant::now();
    let refused = b.submit(Box::new(random_samples(&spec, 1, 3)), None).await;
    // At once: well under the 2 s it would have waited in the batch.
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "the refusal waited {:?}",
        t.elapsed()
    );
    let Err(ServeError::Overloaded(why)) = refused else {
        panic!("{refused:?}")
    };
    assert!(why.contains("--max-queue-delay-ms"), "{why}");
    assert_eq!(ahead.await.unwrap().unwrap().scores().len(), 5);
    assert_eq!(b.pending_samples(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_would_miss_its_deadline_is_refused_at_once() {
    let cfg = BatchConfig {
        max_batch: 1000,
        max_delay: Duration::from_millis(300),
        queue: 100,
        max_queue_delay: None,
        instances: 1,
    };
    let (_, spec, b) = start(cfg);
    b.submit(Box::new(random_samples(&spec, 2, 1)), None)
        .await
        .unwrap();
    let ahead = {
        let (b, s) = (b.clone(), random_samples(&spec, 5, 2));
        tokio::spawn(async move { b.submit(Box::new(s), None).await })
    };
    until("the request ahead pending", || b.pending_samples() >= 5).await;
    // No queue bound: a request without a deadline still queues, one whose deadline is shorter
    // than the expected wait does not.
    let refused = b
        .submit(Box::new(random_samples(&spec, 1, 3)), Some(0))
        .await;
    let Err(ServeError::Overloaded(why)) = refused else {
        panic!("{refused:?}")
    };
    assert!(why.contains("deadline"), "{why}");
    let queued = b.submit(Box::new(random_samples(&spec, 1, 4)), None).await;
    assert_eq!(queued.unwrap().scores().len(), 1);
    assert_eq!(ahead.await.unwrap().unwrap().scores().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_run_in_pieces_and_let_small_ones_through() {
    let cfg = BatchConfig {
        max_batch: 8,
        max_delay: Duration::ZERO,
        queue: 100,
        max_queue_delay: None,
        instances: 1,
    };
    let (model, spec, b) = start(cfg);
    let big = random_samples(&spec, 101, 5);
    let want = direct(&model, &spec, &big);
    let got = b.submit(Box::new(big), None).await.unwrap();
    assert_eq!(got.batch, 8);
    assert_eq!(got.scores().len(), 101);
    for (i, (g, w)) in got.scores().iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "sample {i}: {g} vs {w}"
        );
    }
    // A small request sent while a large one runs is answered before it.
    let huge = random_samples(&spec, 8 * 400, 6);
    let large = {
        let b = b.clone();
        tokio::spawn(async move { b.submit(Box::new(huge), None).await })
    };
    until("the large request pending", || b.pending_samples() > 0).await;
    let small = b
        .submit(Box::new(random_samples(&spec, 2, 7)), None)
        .await
        .unwrap();
    assert_eq!(small.scores().len(), 2);
    assert!(
        !large.is_finished(),
        "the small request waited for all of the large one"
    );
    assert_eq!(large.await.unwrap().unwrap().scores().len(), 3200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_a_deadline_answers_what_it_cannot_run() {
    let cfg = BatchConfig {
        max_batch: 1000,
        max_delay: Duration::from_secs(5),
        queue: 100,
        max_queue_delay: None,
        instances: 1,
    };
    let (_, spec, b) = start(cfg);
    let tasks = queue_requests(&b, &spec, 10, 2).await;
    let t0 = Instant::now();
    let b2 = b.clone();
    tokio::task::spawn_blocking(move || b2.shutdown_by(Instant::now()))
        .await
        .unwrap();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap_err(), ServeError::ShuttingDown);
    }
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(b.pending_samples(), 0);
}

/// An engine that counts the batches it ran.
struct Counting(Predictor, Arc<AtomicUsize>);

impl Engine for Counting {
    fn model(&self) -> &Arc<Model> {
        self.0.model()
    }
    fn run(&mut self, batch: &Prepared<'_>, scores: &mut [f32]) -> ember_model::Result<StageTimes> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.run(batch, scores)
    }
    fn device(&self) -> String {
        self.0.device()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_the_batches_and_score_like_single_requests() {
    let model = default_model();
    let spec = Arc::new(ModelSpec::of(model.clone(), "default"));
    let runs: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let engines: Vec<Box<dyn Engine>> = runs
        .iter()
        .map(|r| {
            let p = Predictor::new(model.clone(), 1).unwrap();
            Box::new(Counting(p, r.clone())) as Box<dyn Engine>
        })
        .collect();
    let cfg = BatchConfig {
        max_batch: 8,
        max_delay: Duration::from_millis(5),
        queue: 1000,
        max_queue_delay: None,
        instances: 1, // the engines' count wins
    };
    let b = Arc::new(Batcher::start_pool(
        engines
            .into_iter()
            .map(|e| Box::new(EngineRunner::new(e)) as Box<dyn ember_model::serving::Runner>)
            .collect(),
        cfg,
        "test",
    ));
    assert_eq!(b.config().instances, 3);
    let reqs: Vec<Samples> = (0..60)
        .map(|i| random_samples(&spec, 1 + i % 5, 100 + i as u64))
        .collect();
    let tasks = submit_each(&b, &reqs);
    for (t, s) in tasks.into_iter().zip(&reqs) {
        let got = t.await.unwrap().unwrap();
        assert!(got.batch <= 8, "batch of {} over max_batch", got.batch);
        let want = direct(&model, &spec, s);
        assert_eq!(got.scores().len(), s.len());
        for (g, w) in got.scores().iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5, "{g} vs {w}");
        }
    }
    // 180 samples in batches of at most 8: every instance ran some (a batch goes to whichever
    // instance is free; all three start free).
    let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::Relaxed)).collect();
    assert!(
        counts.iter().all(|&c| c > 0),
        "runs per instance {counts:?}"
    );
    assert!(counts.iter().sum::<usize>() >= 180 / 8, "{counts:?}");
    // Shutdown ends every instance's thread, and later requests are refused.
    let b2 = b.clone();
    tokio::task::spawn_blocking(move || b2.shutdown())
        .await
        .unwrap();
    let late = b.submit(Box::new(random_samples(&spec, 2, 1)), None).await;
    assert!(matches!(late, Err(ServeError::ShuttingDown)), "{late:?}");
}

/// Polls `ready` until it holds; fails naming `what` after 30 s (a loaded machine is slow, not
/// wrong), so that no test loop waits forever.
async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}
