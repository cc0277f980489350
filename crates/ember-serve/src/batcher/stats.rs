//! Per-version statistics in the shape of Triton's statistics extension
//! (`GET /v2/models[/{m}[/versions/{v}]]/stats`, gRPC `ModelStatistics`): counts and cumulative
//! nanoseconds since the version started serving.
//!
//! - `success` / `fail`: whole requests, from the batcher taking them to their answer (a
//!   request refused at admission is a failure of about zero time);
//! - `queue`: each queued piece of a request (a request longer than `--max-batch` is queued in
//!   pieces), from queued to its batch starting;
//! - `compute_input` (merging and staging a batch), `compute_infer` (the forward pass) and
//!   `compute_output` (slicing and sending the answers): per request in the batch, each with
//!   its batch's time, as Triton counts them; and per batch size in `batch_stats`.
//!
//! `inference_count` counts samples answered with scores, `execution_count` batches run.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count and a cumulative duration.
#[derive(Debug, Default)]
struct Dur {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Dur {
    fn add(&self, count: u64, each: Duration) {
        self.count.fetch_add(count, Relaxed);
        self.ns
            .fetch_add(count.saturating_mul(each.as_nanos() as u64), Relaxed);
    }

    fn get(&self) -> DurationStat {
        DurationStat {
            count: self.count.load(Relaxed),
            ns: self.ns.load(Relaxed),
        }
    }
}

/// What one version's batcher counted.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    last_inference_ms: AtomicU64,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    success: Dur,
    fail: Dur,
    queue: Dur,
    compute_input: Dur,
    compute_infer: Dur,
    compute_output: Dur,
    /// Per batch size (samples): executions and their stage times.
    batches: Mutex<BTreeMap<u64, BatchStats>>,
}

/// The stage times of one batch.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BatchTimes {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

impl Stats {
    /// A whole request of `samples` answered (`ok`) or failed after `took`.
    pub(crate) fn request(&self, ok: bool, samples: usize, took: Duration) {
        if ok {
            self.success.add(1, took);
            self.inference_count.fetch_add(samples as u64, Relaxed);
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            self.last_inference_ms.fetch_max(now, Relaxed);
        } else {
            self.fail.add(1, took);
        }
    }

    /// A queued piece waited `wait` for its batch.
    pub(crate) fn queued(&self, wait: Duration) {
        self.queue.add(1, wait);
    }

    /// A batch of `samples` samples from `requests` pieces ran with times `t`.
    pub(crate) fn batch(&self, requests: usize, samples: usize, t: BatchTimes) {
        let r = requests as u64;
        self.execution_count.fetch_add(1, Relaxed);
        self.compute_input.add(r, t.input);
        self.compute_infer.add(r, t.infer);
        self.compute_output.add(r, t.output);
        let mut b = self.batches.lock().unwrap_or_else(|e| e.into_inner());
        let e = b.entry(samples as u64).or_insert_with(|| BatchStats {
            batch_size: samples as u64,
            ..BatchStats::default()
        });
        for (d, t) in [
            (&mut e.compute_input, t.input),
            (&mut e.compute_infer, t.infer),
            (&mut e.compute_output, t.output),
        ] {
            d.count += 1;
            d.ns += t.as_nanos() as u64;
        }
    }

    /// The statistics of `name` version `version`, as Triton reports them.
    pub(crate) fn snapshot(&self, name: &str, version: u64) -> ModelStats {
        ModelStats {
            name: name.to_string(),
            version: version.to_string(),
            last_inference: self.last_inference_ms.load(Relaxed),
            inference_count: self.inference_count.load(Relaxed),
            execution_count: self.execution_count.load(Relaxed),
            inference_stats: InferenceStats {
                success: self.success.get(),
                fail: self.fail.get(),
                queue: self.queue.get(),
                compute_input: self.compute_input.get(),
                compute_infer: self.compute_infer.get(),
                compute_output: self.compute_output.get(),
                cache_hit: DurationStat::default(),
            },
            batch_stats: self
                .batches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .copied()
                .collect(),
        }
    }
}

/// A count and a total time in nanoseconds (Triton's `$duration_stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DurationStat {
    pub count: u64,
    pub ns: u64,
}

/// Triton's `$inference_stats` (`cache_hit` is always zero: Ember has no response cache).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct InferenceStats {
    pub success: DurationStat,
    pub fail: DurationStat,
    pub queue: DurationStat,
    pub compute_input: DurationStat,
    pub compute_infer: DurationStat,
    pub compute_output: DurationStat,
    pub cache_hit: DurationStat,
}

/// Triton's `$batch_stats`: executions of one batch size (samples).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BatchStats {
    pub batch_size: u64,
    pub compute_input: DurationStat,
    pub compute_infer: DurationStat,
    pub compute_output: DurationStat,
}

/// Triton's `$model_stat`: one version of one model.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelStats {
    pub name: String,
    pub version: String,
    /// Milliseconds since the epoch of the last request answered with scores (0: none yet).
    pub last_inference: u64,
    pub inference_count: u64,
    pub execution_count: u64,
    pub inference_stats: InferenceStats,
    pub batch_stats: Vec<BatchStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_as_triton_counts_them() {
        let s = Stats::default();
        let ms = Duration::from_millis;
        s.request(true, 3, ms(5));
        s.request(true, 1, ms(2));
        s.request(false, 9, ms(1));
        s.queued(ms(1));
        s.queued(ms(3));
        let t = BatchTimes {
            input: ms(1),
            infer: ms(4),
            output: Duration::ZERO,
        };
        s.batch(2, 4, t);
        s.batch(1, 4, t);
        s.batch(1, 1, t);
        let got = s.snapshot("m", 7);
        assert_eq!((got.name.as_str(), got.version.as_str()), ("m", "7"));
        assert_eq!((got.inference_count, got.execution_count), (4, 3));
        assert!(got.last_inference > 0);
        let i = &got.inference_stats;
        assert_eq!(
            i.success,
            DurationStat {
                count: 2,
                ns: 7_000_000
            }
        );
        assert_eq!(
            i.fail,
            DurationStat {
                count: 1,
                ns: 1_000_000
            }
        );
        assert_eq!(
            i.queue,
            DurationStat {
                count: 2,
                ns: 4_000_000
            }
        );
        // Per request: the batch of 2 requests counts its time twice.
        assert_eq!(
            i.compute_infer,
            DurationStat {
                count: 4,
                ns: 16_000_000
            }
        );
        assert_eq!(
            i.compute_input,
            DurationStat {
                count: 4,
                ns: 4_000_000
            }
        );
        let sizes: Vec<(u64, u64)> = got
            .batch_stats
            .iter()
            .map(|b| (b.batch_size, b.compute_infer.count))
            .collect();
        assert_eq!(sizes, vec![(1, 1), (4, 2)]);
        assert_eq!(got.batch_stats[1].compute_infer.ns, 8_000_000);
    }
}
