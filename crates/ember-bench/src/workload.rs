//! Synthetic and replayed id streams for benchmarks.
//!
//! - `uniform`: ids uniform over the table's rows.
//! - `zipf:ALPHA`: Zipf-distributed ranks (rank 1 hottest), scattered over the rows by a fixed
//!   bijection so that hot rows are not adjacent in memory.
//! - a trace file: one id per line, replayed as the literature does (MICRO'24 artifact): ids
//!   `>= rows` are dropped, the stream wraps at the end, and feature `f` of `F` starts reading at
//!   position `f * len / F`.

use ember_embed::trace::load_trace;
use ember_embed::{EmbedError, Ids, KeyedJagged, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

/// Where ids come from.
#[derive(Debug, Clone)]
pub enum IdSource {
    Uniform,
    Zipf(f64),
    Trace { path: String, ids: Arc<Vec<u64>> },
}

impl IdSource {
    /// A short description for reports.
    pub fn describe(&self) -> String {
        match self {
            IdSource::Uniform => "uniform".into(),
            IdSource::Zipf(a) => format!("zipf:{a}"),
            IdSource::Trace { path, ids } => format!("trace {path} ({} ids)", ids.len()),
        }
    }
}

impl FromStr for IdSource {
    type Err = EmbedError;
    /// `uniform`, `zipf:ALPHA`, or the path of a trace file (read now).
    fn from_str(s: &str) -> Result<Self> {
        if s == "uniform" {
            return Ok(IdSource::Uniform);
        }
        if let Some(a) = s.strip_prefix("zipf:") {
            let alpha: f64 = a.parse().map_err(|_| EmbedError::BadOption {
                option: "ids",
                reason: format!("zipf exponent '{a}' is not a number"),
            })?;
            if !(alpha > 0.0 && alpha.is_finite()) {
                return Err(EmbedError::BadOption {
                    option: "ids",
                    reason: format!("zipf exponent must be > 0, got {alpha}"),
                });
            }
            return Ok(IdSource::Zipf(alpha));
        }
        Ok(IdSource::Trace {
            path: s.into(),
            ids: Arc::new(load_trace(Path::new(s))?),
        })
    }
}

/// Shape of a benchmark workload: `rows[f]` is the row count of feature `f`'s table.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub rows: Vec<usize>,
    pub batch_size: usize,
    /// Ids per bag (every bag has exactly this many).
    pub pooling: usize,
    pub seed: u64,
}

enum Stream {
    Uniform(SmallRng, usize),
    Zipf(SmallRng, Zipf<f64>, usize, u64),
    Trace(Arc<Vec<u64>>, usize, usize),
}

impl Stream {
    fn next(&mut self) -> u64 {
        match self {
            Stream::Uniform(rng, rows) => rng.random_range(0..*rows as u64),
            Stream::Zipf(rng, z, rows, mult) => {
                let rank = (z.sample(rng) as u64).saturating_sub(1);
                // x -> (mult * x) mod rows is a bijection because gcd(mult, rows) == 1.
                ((u128::from(rank) * u128::from(*mult)) % *rows as u128) as u64
            }
            Stream::Trace(ids, pos, rows) => loop {
                let id = ids[*pos];
                *pos = (*pos + 1) % ids.len();
                if id < *rows as u64 {
                    return id;
                }
            },
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Generates `batches` batches; feature `f` is named `t{f}`.
pub fn generate(
    spec: &WorkloadSpec,
    source: &IdSource,
    batches: usize,
) -> Result<Vec<KeyedJagged>> {
    let nf = spec.rows.len();
    let mut streams = Vec::with_capacity(nf);
    for (f, &rows) in spec.rows.iter().enumerate() {
        if rows == 0 {
            return Err(EmbedError::BadOption {
                option: "rows",
                reason: "tables need at least one row".into(),
            });
        }
        let rng =
            SmallRng::seed_from_u64(spec.seed ^ (f as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        streams.push(match source {
            IdSource::Uniform => Stream::Uniform(rng, rows),
            IdSource::Zipf(a) => {
                let z = Zipf::new(rows as f64, *a).map_err(|e| EmbedError::BadOption {
                    option: "ids",
                    reason: format!("zipf: {e}"),
                })?;
                let mut mult = 0x9E37_79B9_7F4A_7C15u64 % rows as u64 + f as u64;
                while rows > 1 && gcd(mult % rows as u64, rows as u64) != 1 {
                    mult += 1;
                }
                Stream::Zipf(rng, z, rows, mult.max(1))
            }
            IdSource::Trace { path, ids } => {
                if !ids.iter().any(|&i| i < rows as u64) {
                    return Err(EmbedError::Trace {
                        path: path.clone(),
                        reason: format!("no id is below the table's {rows} rows"),
                    });
                }
                Stream::Trace(ids.clone(), f * ids.len() / nf.max(1), rows)
            }
        });
    }
    let keys: Vec<String> = (0..nf).map(|f| format!("t{f}")).collect();
    let lengths = vec![spec.pooling; nf * spec.batch_size];
    let per_feature = spec.batch_size * spec.pooling;
    let wide = spec.rows.iter().any(|&r| r > u32::MAX as usize);
    let mut out = Vec::with_capacity(batches);
    for _ in 0..batches {
        let ids = if wide {
            let mut v = Vec::with_capacity(nf * per_feature);
            streams
                .iter_mut()
                .for_each(|s| (0..per_feature).for_each(|_| v.push(s.next() as i64)));
            Ids::I64(v)
        } else {
            let mut v = Vec::with_capacity(nf * per_feature);
            streams
                .iter_mut()
                .for_each(|s| (0..per_feature).for_each(|_| v.push(s.next() as u32)));
            Ids::U32(v)
        };
        out.push(KeyedJagged::from_lengths(
            keys.clone(),
            spec.batch_size,
            &lengths,
            ids,
            None,
        )?);
    }
    Ok(out)
}

/// Distinct ids / ids, per (batch, feature), averaged over everything in `batches`.
pub fn unique_ratio(batches: &[KeyedJagged]) -> f64 {
    let (mut distinct, mut total) = (0usize, 0usize);
    let mut set = HashSet::new();
    for kj in batches {
        for f in 0..kj.keys().len() {
            set.clear();
            let r = kj.feature_range(f);
            total += r.len();
            for j in r {
                set.insert(kj.ids().get(j));
            }
            distinct += set.len();
        }
    }
    if total == 0 {
        1.0
    } else {
        distinct as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rows: Vec<usize>) -> WorkloadSpec {
        WorkloadSpec {
            rows,
            batch_size: 4,
            pooling: 3,
            seed: 1,
        }
    }

    #[test]
    fn trace_replay_drops_large_ids_wraps_and_offsets_features() {
        let ids = Arc::new(vec![0, 1, 99, 2, 3, 4, 5, 6]);
        let src = IdSource::Trace {
            path: "mem".into(),
            ids,
        };
        let b = generate(
            &WorkloadSpec {
                rows: vec![10, 10],
                batch_size: 1,
                pooling: 5,
                seed: 0,
            },
            &src,
            2,
        )
        .unwrap();
        let got: Vec<i64> = (0..10).map(|j| b[0].ids().get(j)).collect();
        // feature 0 starts at 0 (99 dropped), feature 1 at position 8 * 1 / 2 = 4.
        assert_eq!(got, [0, 1, 2, 3, 4, 3, 4, 5, 6, 0]);
        let got: Vec<i64> = (0..5).map(|j| b[1].ids().get(j)).collect();
        assert_eq!(got, [5, 6, 0, 1, 2], "wraps at the end");
        let tiny = IdSource::Trace {
            path: "mem".into(),
            ids: Arc::new(vec![50, 60]),
        };
        let e = generate(&spec(vec![10]), &tiny, 1).unwrap_err();
        assert!(e.to_string().contains("no id is below"), "{e}");
    }

    #[test]
    fn generated_ids_are_in_range_and_shaped() {
        for src in [IdSource::Uniform, IdSource::Zipf(1.1)] {
            let b = generate(&spec(vec![7, 1000]), &src, 3).unwrap();
            assert_eq!(b.len(), 3);
            for kj in &b {
                assert_eq!(kj.num_ids(), 2 * 4 * 3);
                assert!(
                    kj.feature_range(0)
                        .all(|j| (0..7).contains(&kj.ids().get(j)))
                );
                assert!(
                    kj.feature_range(1)
                        .all(|j| (0..1000).contains(&kj.ids().get(j)))
                );
            }
        }
    }

    #[test]
    fn zipf_is_skewed_and_uniform_is_not() {
        let s = WorkloadSpec {
            rows: vec![100_000],
            batch_size: 64,
            pooling: 80,
            seed: 3,
        };
        let z = unique_ratio(&generate(&s, &IdSource::Zipf(1.2), 2).unwrap());
        let u = unique_ratio(&generate(&s, &IdSource::Uniform, 2).unwrap());
        assert!(z < 0.5 && u > 0.95, "zipf {z} uniform {u}");
    }

    #[test]
    fn parse_sources_and_trace_errors() {
        assert!(matches!(
            "uniform".parse::<IdSource>(),
            Ok(IdSource::Uniform)
        ));
        assert!(matches!("zipf:0.9".parse::<IdSource>(), Ok(IdSource::Zipf(a)) if a == 0.9));
        assert!(
            "zipf:x"
                .parse::<IdSource>()
                .unwrap_err()
                .to_string()
                .contains("not a number")
        );
        assert!("zipf:-1".parse::<IdSource>().is_err());
        assert!("/nonexistent/trace".parse::<IdSource>().is_err());
    }
}
