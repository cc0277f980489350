//! One measurement ([`run_at`]): requests sent at Poisson arrival times by a clock thread of
//! their own, whatever the server's pace, and each answer tallied by its scheduled time
//! (overall, per `--phases` phase, per `--timeline` interval).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ember_bench::stats::quantile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc::UnboundedSender;

use super::target::{Outcome, Target};
use super::{Bucket, LoadgenArgs, Phase, Run};

/// What each request reports: its outcome, and its scheduled time into the measurement
/// with its latency (none for warm-up requests).
type Report = (Outcome, Option<(Duration, Duration)>);

/// Measures `phases` (requests per second, seconds), after `--warmup` seconds of load.
pub(super) async fn run_at(
    target: &Arc<Target>,
    phases: Vec<(f64, f64)>,
    a: &LoadgenArgs,
) -> anyhow::Result<Run> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Report>();
    let secs: f64 = phases.iter().map(|p| p.1).sum();
    let sent_total = phases.iter().map(|p| p.0 * p.1).sum::<f64>();
    let warm = Duration::from_secs_f64(a.warmup);
    let start_unix_ms = (std::time::SystemTime::now() + warm)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // The arrival clock: its own thread, sleeping to each arrival (or sending at once when late).
    let clock = Clock {
        target: target.clone(),
        tx,
        outstanding: Arc::new(AtomicUsize::new(0)),
        handle: tokio::runtime::Handle::current(),
        seed: a.seed,
        warm,
        max_out: a.max_outstanding,
        phases: phases.clone(),
    };
    let clock = std::thread::spawn(move || clock.run());
    let (sent, dropped) = tokio::task::spawn_blocking(move || clock.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the arrival clock thread panicked"))?;
    let width = a.timeline.filter(|w| *w > 0.0);
    let mut tally = Tally::new(&phases, width, secs, sent, dropped);
    while let Some((outcome, when)) = rx.recv().await {
        let Some((at, d)) = when else { continue };
        tally.add(outcome, at, d.as_secs_f64() * 1e3);
    }
    let timeline = tally.timeline();
    let by_phase = tally.phases(&phases);
    let Tally {
        mut lat,
        mut refused_lat,
        errors,
        wrong,
        ..
    } = tally;
    lat.sort_by(f64::total_cmp);
    refused_lat.sort_by(f64::total_cmp);
    let ok = lat.len();
    Ok(Run {
        offered_qps: sent_total / secs,
        achieved_qps: ok as f64 / secs,
        samples_per_s: (ok * a.samples_per_request) as f64 / secs,
        sent: sent + dropped,
        ok,
        refused: refused_lat.len(),
        errors,
        wrong,
        start_unix_ms,
        p50_ms: quantile(&lat, 0.5),
        p90_ms: quantile(&lat, 0.9),
        p99_ms: quantile(&lat, 0.99),
        p999_ms: quantile(&lat, 0.999),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
        refused_p99_ms: quantile(&refused_lat, 0.99),
        refused_max_ms: refused_lat.last().copied().unwrap_or(f64::NAN),
        latency_histogram_ms: crate::report::log_buckets(&lat),
        timeline,
        phases: by_phase,
    })
}

/// The arrival clock of one measurement: what it sends, where the answers go, and when.
struct Clock {
    target: Arc<Target>,
    tx: UnboundedSender<Report>,
    /// Requests sent and not answered yet.
    outstanding: Arc<AtomicUsize>,
    /// The runtime the requests run on.
    handle: tokio::runtime::Handle,
    seed: u64,
    /// The warm-up, before the measurement.
    warm: Duration,
    /// `--max-outstanding`.
    max_out: usize,
    /// (requests per second, seconds) of each phase.
    phases: Vec<(f64, f64)>,
}

impl Clock {
    /// Sends the requests at their arrival times until the last phase ends; returns the
    /// requests of the measurement (after the warm-up) sent, and refused for
    /// `--max-outstanding`.
    fn run(self) -> (usize, usize) {
        let first_rate = self.phases[0].0;
        let mut rng = StdRng::seed_from_u64(self.seed ^ first_rate.to_bits());
        let start = Instant::now();
        // Where each phase ends, from the start of the load.
        let mut ends = Vec::with_capacity(self.phases.len());
        let mut at = self.warm;
        for &(rate, d) in &self.phases {
            at += Duration::from_secs_f64(d);
            ends.push((at, rate));
        }
        let end = at;
        let (mut next, mut sent, mut refused, mut k) = (Duration::ZERO, 0usize, 0usize, 0usize);
        while next < end {
            let due = start + next;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let counted = next >= self.warm;
            if self.outstanding.load(Ordering::Relaxed) >= self.max_out {
                refused += usize::from(counted);
            } else {
                sent += usize::from(counted);
                self.launch(k, next, due, counted);
            }
            k += 1;
            next += self.gap(&ends, next, first_rate, &mut rng);
        }
        (sent, refused)
    }

    /// Sends request `k`, scheduled `next` into the load (due at `due`), on the runtime; its
    /// outcome is reported, with its scheduled time and latency when it is `counted`.
    fn launch(&self, k: usize, next: Duration, due: Instant, counted: bool) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        let (target, tx, out) = (
            self.target.clone(),
            self.tx.clone(),
            self.outstanding.clone(),
        );
        let at = next.saturating_sub(self.warm);
        self.handle.spawn(async move {
            // A request unanswered for 10 s counts as an error.
            let r = tokio::time::timeout(Duration::from_secs(10), target.send(k)).await;
            let outcome = r.unwrap_or(Outcome::Error);
            out.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.send((outcome, counted.then(|| (at, due.elapsed()))));
        });
    }

    /// The time from the arrival at `next` to the following one. Exponential inter-arrival
    /// times: a Poisson process of the phase's rate (`ends`: where each phase ends, and its
    /// rate), ramped up from a tenth of the first over the warm-up (uncounted) so that a cold
    /// server is not hit by the full rate while its connections are still being set up.
    fn gap(
        &self,
        ends: &[(Duration, f64)],
        next: Duration,
        first_rate: f64,
        rng: &mut StdRng,
    ) -> Duration {
        let rate = ends
            .iter()
            .find(|(e, _)| next < *e)
            .map_or(first_rate, |&(_, r)| r);
        let ramp = if next < self.warm {
            0.1 + 0.9 * next.as_secs_f64() / self.warm.as_secs_f64()
        } else {
            1.0
        };
        let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        Duration::from_secs_f64(-u.ln() / (rate * ramp))
    }
}

/// The answers of one measurement, by their scheduled times.
struct Tally {
    /// Latencies (ms) of the answered and of the refused; errors; wrong answers.
    lat: Vec<f64>,
    refused_lat: Vec<f64>,
    errors: usize,
    wrong: usize,
    /// Per phase: answered latencies, refused latencies, errors.
    by_phase: Vec<(Vec<f64>, Vec<f64>, usize)>,
    /// Where each phase ends, seconds into the measurement.
    phase_end: Vec<f64>,
    /// `--timeline`: the intervals' width (seconds), and each interval with the latencies of
    /// its answered requests.
    width: Option<f64>,
    buckets: Vec<(Bucket, Vec<f64>)>,
}

impl Tally {
    /// An empty tally of `phases`, `secs` seconds in all, in intervals of `width` seconds:
    /// `sent` requests were sent, and `dropped` ones refused by the client (errors).
    fn new(
        phases: &[(f64, f64)],
        width: Option<f64>,
        secs: f64,
        sent: usize,
        dropped: usize,
    ) -> Tally {
        let nb = width.map_or(0, |w| (secs / w).ceil() as usize);
        let buckets = (0..nb)
            .map(|i| {
                let b = Bucket {
                    t: i as f64 * width.unwrap_or(0.0),
                    sent: 0,
                    ok: 0,
                    refused: 0,
                    errors: 0,
                    wrong: 0,
                    p50_ms: f64::NAN,
                    p99_ms: f64::NAN,
                    max_ms: f64::NAN,
                };
                (b, Vec::new())
            })
            .collect();
        let phase_end = phases
            .iter()
            .scan(0.0, |t, p| {
                *t += p.1;
                Some(*t)
            })
            .collect();
        Tally {
            lat: Vec::with_capacity(sent),
            refused_lat: Vec::new(),
            errors: dropped,
            wrong: 0,
            by_phase: phases.iter().map(|_| Default::default()).collect(),
            phase_end,
            width,
            buckets,
        }
    }

    /// Counts one answer: its `outcome`, scheduled `at` into the measurement, its latency `ms`.
    fn add(&mut self, outcome: Outcome, at: Duration, ms: f64) {
        let k = self
            .phase_end
            .iter()
            .position(|&e| at.as_secs_f64() < e)
            .unwrap_or(self.phase_end.len() - 1);
        match outcome {
            Outcome::Ok => self.by_phase[k].0.push(ms),
            Outcome::Refused => self.by_phase[k].1.push(ms),
            Outcome::Error | Outcome::Wrong => self.by_phase[k].2 += 1,
        }
        let nb = self.buckets.len();
        let bucket = self
            .width
            .map(|w| ((at.as_secs_f64() / w) as usize).min(nb.saturating_sub(1)))
            .and_then(|i| self.buckets.get_mut(i));
        let (b, blat) = match bucket {
            Some((b, l)) => (Some(b), Some(l)),
            None => (None, None),
        };
        if let Some(b) = b {
            b.sent += 1;
            match outcome {
                Outcome::Ok => b.ok += 1,
                Outcome::Refused => b.refused += 1,
                Outcome::Error => b.errors += 1,
                Outcome::Wrong => b.wrong += 1,
            }
        }
        match outcome {
            Outcome::Ok => {
                self.lat.push(ms);
                if let Some(l) = blat {
                    l.push(ms);
                }
            }
            Outcome::Refused => self.refused_lat.push(ms),
            Outcome::Error => self.errors += 1,
            Outcome::Wrong => self.wrong += 1,
        }
    }

    /// The `--timeline` intervals with their latencies (`None` without `--timeline`).
    fn timeline(&mut self) -> Option<Vec<Bucket>> {
        let buckets = std::mem::take(&mut self.buckets);
        self.width.map(|_| {
            buckets
                .into_iter()
                .map(|(mut b, mut l)| {
                    l.sort_by(f64::total_cmp);
                    b.p50_ms = quantile(&l, 0.5);
                    b.p99_ms = quantile(&l, 0.99);
                    b.max_ms = l.last().copied().unwrap_or(f64::NAN);
                    b
                })
                .collect()
        })
    }

    /// Each of `phases` on its own (none when there is one phase).
    fn phases(&mut self, phases: &[(f64, f64)]) -> Vec<Phase> {
        let by_phase = std::mem::take(&mut self.by_phase);
        match phases.len() {
            1 => Vec::new(),
            _ => phases
                .iter()
                .zip(by_phase)
                .map(|(&(rate, secs), (mut l, mut r, errors))| {
                    l.sort_by(f64::total_cmp);
                    r.sort_by(f64::total_cmp);
                    Phase {
                        offered_qps: rate,
                        secs,
                        sent: l.len() + r.len() + errors,
                        ok: l.len(),
                        refused: r.len(),
                        errors,
                        p50_ms: quantile(&l, 0.5),
                        p99_ms: quantile(&l, 0.99),
                        max_ms: l.last().copied().unwrap_or(f64::NAN),
                        refused_p50_ms: quantile(&r, 0.5),
                        refused_p99_ms: quantile(&r, 0.99),
                    }
                })
                .collect(),
        }
    }
}
