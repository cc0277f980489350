//! Admission by expected queueing time: a request is refused at once (503 /
//! RESOURCE_EXHAUSTED) when the wait before its batch starts would pass its deadline or the
//! server's queue-delay bound (`--max-queue-delay-ms`), as Triton's queue policy bounds a
//! model's queue, but decided when the request arrives rather than after it waited. Under any
//! offered load the requests taken then wait at most about the bound, and the queue (and the
//! memory it holds) stays as long as the bound allows.
//!
//! The wait is predicted from the work ahead of the request (submitted, not yet answered) and
//! a batch cost model `t(c) = a + b c` fitted to the batches the engine ran (least squares with
//! exponential forgetting, so it follows the model's real speed, tier misses included), where
//! `c` is a batch's expected cost (`Servable::cost`: its samples for a DLRM model, its users'
//! MFLOP for an HSTU one, so that a user of 4,096 history items and 512 candidates weighs what
//! it costs, not one sample): `wait = (ceil(P / max_batch) a + C b) / instances` for `P`
//! samples and cost `C` ahead and `instances` batches running side by side.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// Weight of the past per batch observed (about the last 30 batches count).
const FORGET: f64 = 0.967;

/// Samples ahead of new requests and the fitted batch cost: what admission reads.
#[derive(Debug)]
pub(crate) struct Load {
    /// Samples submitted and not yet answered (queued, forming, or running).
    pending: AtomicUsize,
    /// Their expected cost (`Servable::cost`).
    pending_cost: AtomicU64,
    max_batch: usize,
    /// Batches that run at once (model instances).
    instances: usize,
    /// The fitted time per batch (`a`) and per unit of cost (`b`), in ns, as f64 bits; read
    /// without a lock on every request.
    a_ns: AtomicU64,
    b_ns: AtomicU64,
    fit: Mutex<Fit>,
}

impl Load {
    pub(crate) fn new(max_batch: usize, instances: usize) -> Self {
        Load {
            pending: AtomicUsize::new(0),
            pending_cost: AtomicU64::new(0),
            max_batch: max_batch.max(1),
            instances: instances.max(1),
            a_ns: AtomicU64::new(0f64.to_bits()),
            b_ns: AtomicU64::new(0f64.to_bits()),
            fit: Mutex::new(Fit::default()),
        }
    }

    /// Samples submitted and not yet answered.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Relaxed)
    }

    /// Expected cost submitted and not yet answered.
    pub(crate) fn pending_cost(&self) -> u64 {
        self.pending_cost.load(Relaxed)
    }

    /// `n` more samples of expected `cost` wait (undone by [`Load::done`]).
    pub(crate) fn add(&self, n: usize, cost: u64) {
        self.pending_cost.fetch_add(cost, Relaxed);
        self.pending.fetch_add(n, Relaxed);
    }

    /// `n` samples of expected `cost` were answered.
    pub(crate) fn done(&self, n: usize, cost: u64) {
        self.pending.fetch_sub(n, Relaxed);
        self.pending_cost.fetch_sub(cost, Relaxed);
    }

    /// The predicted wait of a request arriving now, before its batch starts.
    pub(crate) fn expected_wait(&self) -> Duration {
        self.wait_behind(self.pending(), self.pending_cost())
    }

    /// The predicted wait behind `pending` samples of expected `cost`.
    fn wait_behind(&self, pending: usize, cost: u64) -> Duration {
        let a = f64::from_bits(self.a_ns.load(Relaxed));
        let b = f64::from_bits(self.b_ns.load(Relaxed));
        let batches = (pending as f64 / self.max_batch as f64).ceil();
        // Instances run batches side by side: the work ahead drains that many times as fast.
        let ns = (batches * a + cost as f64 * b) / self.instances as f64;
        Duration::from_nanos(ns.max(0.0) as u64)
    }

    /// Counts `n` more pending samples of expected `cost` if the wait behind those pending now
    /// is within `bound`; otherwise that wait. One atomic step on the pending cost: of requests
    /// arriving together, each is judged on the cost that includes those admitted before it
    /// (the sample count, which only sets the per-batch term, follows just after).
    pub(crate) fn try_add(&self, n: usize, cost: u64, bound: Duration) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        self.pending_cost
            .fetch_update(Relaxed, Relaxed, |c| {
                wait = self.wait_behind(self.pending(), c);
                (wait <= bound).then_some(c + cost)
            })
            .map(|_| {
                self.pending.fetch_add(n, Relaxed);
            })
            .map_err(|_| wait)
    }

    /// A batch of expected `cost` took `t` to run.
    pub(crate) fn observe(&self, cost: u64, t: Duration) {
        let mut fit = self.fit.lock().unwrap_or_else(|p| p.into_inner());
        fit.add(cost as f64, t.as_nanos() as f64);
        let (a, b) = fit.solve();
        self.a_ns.store(a.to_bits(), Relaxed);
        self.b_ns.store(b.to_bits(), Relaxed);
    }
}

/// Least squares of `t = a + b n` over decayed sums.
#[derive(Debug, Default, Clone)]
pub(crate) struct Fit {
    s0: f64,
    sn: f64,
    st: f64,
    snn: f64,
    snt: f64,
}

impl Fit {
    pub(crate) fn add(&mut self, n: f64, t: f64) {
        for s in [
            &mut self.s0,
            &mut self.sn,
            &mut self.st,
            &mut self.snn,
            &mut self.snt,
        ] {
            *s *= FORGET;
        }
        self.s0 += 1.0;
        self.sn += n;
        self.st += t;
        self.snn += n * n;
        self.snt += n * t;
    }

    /// `(a, b)`, both at least 0. With one batch size seen so far, all of the cost is put on
    /// the samples (`a` = 0): it over-predicts the wait behind small batches, so that a burst
    /// right after a quiet spell is shed early rather than queued long.
    pub(crate) fn solve(&self) -> (f64, f64) {
        if self.s0 <= 0.0 || self.sn <= 0.0 {
            return (0.0, 0.0);
        }
        let var = self.s0 * self.snn - self.sn * self.sn;
        let per_sample = (0.0, self.st / self.sn);
        if var <= 1e-6 * self.s0 * self.snn {
            return per_sample;
        }
        let b = (self.s0 * self.snt - self.sn * self.st) / var;
        let a = (self.st - b * self.sn) / self.s0;
        match (a >= 0.0, b >= 0.0) {
            (true, true) => (a, b),
            // Noise can tilt the line: keep the average, on whichever term is sound.
            (false, _) => per_sample,
            (true, false) => (self.st / self.s0, 0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a fresh server met: its first batch (1 sample, 40 ms while pages and caches fill)
    /// alone makes 40 ms per sample, and two samples ahead already pass a 50 ms bound. Warm
    /// batches before it (128 samples in 2 ms) keep the model near the engine's real speed, so
    /// that the burst after the slow batch is admitted.
    #[test]
    fn warm_batches_keep_one_cold_batch_from_refusing_a_burst() {
        let bound = Duration::from_millis(50);
        let cold = Load::new(256, 1);
        cold.observe(1, Duration::from_millis(40));
        cold.add(2, 2);
        assert!(cold.expected_wait() > bound, "{:?}", cold.expected_wait());

        let primed = Load::new(256, 1);
        for _ in 0..3 {
            primed.observe(128, Duration::from_millis(2));
        }
        primed.observe(1, Duration::from_millis(40));
        for k in 0..64 {
            assert!(
                primed.try_add(1, 1, bound).is_ok(),
                "sample {k} of the burst refused: wait {:?}",
                primed.expected_wait()
            );
        }
    }

    #[test]
    fn the_fit_recovers_a_line_and_stays_sound() {
        let mut f = Fit::default();
        assert_eq!(f.solve(), (0.0, 0.0));
        for i in 0..200 {
            let n = (1 + (i * 37) % 256) as f64;
            f.add(n, 50_000.0 + 2_000.0 * n);
        }
        let (a, b) = f.solve();
        assert!(
            (a - 50_000.0).abs() < 1.0 && (b - 2_000.0).abs() < 1e-3,
            "{a} {b}"
        );

        // One size only: all of it per sample.
        let mut one = Fit::default();
        for _ in 0..10 {
            one.add(4.0, 40_000.0);
        }
        let (a, b) = one.solve();
        assert_eq!(a, 0.0);
        assert!((b - 10_000.0).abs() < 1e-6, "{b}");

        // A line sloping down (noise) never gives a negative cost.
        let mut down = Fit::default();
        down.add(1.0, 10_000.0);
        down.add(100.0, 5_000.0);
        let (a, b) = down.solve();
        assert!(a >= 0.0 && b >= 0.0);
        assert!((a + b * 50.0) > 0.0);
    }

    #[test]
    fn the_wait_counts_batches_and_samples_ahead() {
        for instances in [1, 2, 3] {
            let load = Load::new(100, instances);
            assert_eq!(load.expected_wait(), Duration::ZERO);
            for n in [1usize, 10, 50, 100, 100, 20, 70] {
                load.observe(
                    n as u64,
                    Duration::from_nanos(1_000_000 + 10_000 * n as u64),
                );
            }
            load.add(250, 250);
            // 3 batches ahead: 3 ms + 250 x 10 us = 5.5 ms, shared by the instances.
            let w = load.expected_wait().as_secs_f64();
            assert!(
                (w - 5.5e-3 / instances as f64).abs() < 1e-6,
                "{instances}: {w}"
            );
            load.done(250, 250);
            assert_eq!(load.pending(), 0);
            assert_eq!(load.expected_wait(), Duration::ZERO);
        }
    }

    #[test]
    fn admission_and_counting_are_one_step_under_contention() {
        // 1 ms per sample, one sample per batch cost-free: a 10 ms bound admits samples while
        // fewer than 10 are ahead, so 8 threads racing with 100 tries each of 1 sample admit
        // exactly 11 (the one that sees 10 ahead is the first refused).
        let load = std::sync::Arc::new(Load::new(1000, 1));
        for _ in 0..40 {
            load.observe(10, Duration::from_millis(10));
        }
        let bound = Duration::from_millis(10);
        let admitted: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    let load = load.clone();
                    s.spawn(move || {
                        (0..100)
                            .filter(|_| load.try_add(1, 1, bound).is_ok())
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 11);
        assert_eq!(load.pending(), 11);
        // A refusal reports the wait it saw.
        let w = load.try_add(1, 1, bound).unwrap_err();
        assert!((w.as_secs_f64() - 0.011).abs() < 1e-6, "{w:?}");
    }

    /// Admission weighs requests by their cost, not their count: with the engine's time
    /// fitted per unit of cost, one costly request ahead (an HSTU user of 4,096 items) delays
    /// a newcomer as much as the many cheap ones of the same cost, and a costly request is
    /// refused where as many cheap ones would be admitted.
    #[test]
    fn the_wait_follows_the_cost_ahead_not_the_requests() {
        let load = Load::new(64, 1);
        // Batches of 1 to 8 users whose cost is 100 units each: 50 us a unit, 1 ms a batch.
        for users in [1u64, 4, 2, 8, 3] {
            let cost = 100 * users;
            load.observe(cost, Duration::from_nanos(1_000_000 + 50_000 * cost));
        }
        let bound = Duration::from_millis(30);
        // One user of cost 1,000 ahead: 1 batch + 1,000 x 50 us = 51 ms.
        load.add(1, 1000);
        let w = load.expected_wait().as_secs_f64();
        assert!((w - 0.051).abs() < 1e-6, "{w}");
        assert!(load.try_add(1, 10, bound).is_err());
        load.done(1, 1000);
        // Ten users of cost 10 ahead: 1 batch + 100 x 50 us = 6 ms, and a newcomer is taken.
        load.add(10, 100);
        let w = load.expected_wait().as_secs_f64();
        assert!((w - 0.006).abs() < 1e-6, "{w}");
        assert!(load.try_add(1, 1000, bound).is_ok());
        assert_eq!((load.pending(), load.pending_cost()), (11, 1100));
        // Now the costly one is ahead, the next is refused, naming the wait it saw.
        let w = load.try_add(1, 1, bound).unwrap_err().as_secs_f64();
        assert!((w - 0.056).abs() < 1e-6, "{w}");
        assert_eq!((load.pending(), load.pending_cost()), (11, 1100));
    }
}
