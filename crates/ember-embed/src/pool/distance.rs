//! How far ahead the kernels prefetch rows: a fixed number of ids, or `auto`, which measures.
//!
//! The best distance is a property of the machine (memory latency against the rate rows are
//! consumed, the core's miss buffers) and of the rows (bytes each, how many hit in cache), so
//! no constant suits every host: on RM1 with the production trace, an AMD EPYC (Zen, AVX-512)
//! VM pooled 16 ids ahead at 0.6x and 96 ids ahead at 0.97x of the plain loop at its best
//! distance, while 16 was the sweet spot of the development machine. `auto` times units
//! at every candidate distance (one set of timings per row size, shared by the tables of that
//! size), keeps the fastest, then tries a neighbouring distance every [`RECHECK`] units and moves
//! when it is faster, so it follows the machine and the workload.

use crate::error::{EmbedError, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

/// Prefetch distance of a [`super::Pooler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    /// Prefetch this many ids ahead (0: off).
    Ids(usize),
    /// Measure, per row size (the default).
    Auto,
}

impl fmt::Display for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prefetch::Ids(n) => write!(f, "{n}"),
            Prefetch::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for Prefetch {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Prefetch::Auto),
            _ => s
                .parse()
                .map(Prefetch::Ids)
                .map_err(|_| EmbedError::BadOption {
                    option: "prefetch",
                    reason: format!("'{s}' is not a number of ids or auto"),
                }),
        }
    }
}

/// Distances `auto` chooses from, in ids.
pub const CANDIDATES: [usize; 10] = [0, 8, 16, 32, 48, 64, 96, 128, 192, 256];
/// Units timed per candidate while exploring; their median counts. Candidates are handed to
/// units in a scrambled order, so that each is timed on a mix of the tables of that row size
/// (tables differ in how many of their rows hit in cache: handed out in turn, with 32 tables and
/// 8 candidates, each candidate met the same 4 tables, and the choice followed the tables).
const EXPLORE: usize = 24;
/// After exploring, one unit in this many runs at a neighbouring distance.
const RECHECK: u64 = 16;
/// Units smaller than this run at the current distance, untimed (a clock read costs more than
/// the distance can save).
pub(super) const MIN_TIMED_IDS: usize = 256;
/// A neighbour replaces the current distance only when this much faster.
const MARGIN: f64 = 0.95;

/// A scrambled value of a unit counter (splitmix64's finaliser).
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// Row bytes of the tables this state times (one state per row size: the distance depends on
    /// the machine and on the bytes a row brings, not on which table it is).
    stride: usize,
    units: u64,
    /// Index into CANDIDATES of the distance in use.
    cur: usize,
    /// ns per lookup per candidate: the median of the exploring units, then a moving average.
    ns: [f64; CANDIDATES.len()],
    /// Exploring: the timings recorded (units that ran deduplicated record none).
    samples: [[f64; EXPLORE]; CANDIDATES.len()],
    timed: [usize; CANDIDATES.len()],
    /// Which neighbour the next recheck tries (alternates below / above).
    up: bool,
    /// Whether exploring is over (`cur` chosen from every candidate's timings).
    settled: bool,
}

impl State {
    fn new(stride: usize) -> Self {
        State {
            stride,
            units: 0,
            cur: 0,
            ns: [f64::INFINITY; CANDIDATES.len()],
            samples: [[0.0; EXPLORE]; CANDIDATES.len()],
            timed: [0; CANDIDATES.len()],
            up: false,
            settled: false,
        }
    }
}

/// Measurements of the candidate distances, per row size.
#[derive(Debug, Default)]
pub(crate) struct AutoPrefetch {
    states: Mutex<Vec<State>>,
}

impl AutoPrefetch {
    fn with<R>(&self, stride: usize, f: impl FnOnce(&mut State) -> R) -> R {
        let mut g = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let i = match g.iter().position(|s| s.stride == stride) {
            Some(i) => i,
            None => {
                g.push(State::new(stride));
                g.len() - 1
            }
        };
        f(&mut g[i])
    }

    /// The distance for the next unit over rows of `stride` bytes, as an index into
    /// [`CANDIDATES`] (to hand back to [`AutoPrefetch::record`]) and the distance.
    pub(crate) fn choose(&self, stride: usize) -> (usize, usize) {
        self.with(stride, |st| {
            st.units += 1;
            let h = mix(st.units);
            if !st.settled {
                // Units may finish out of order on several threads: `record` settles.
                let nc = CANDIDATES.len();
                let start = (h % nc as u64) as usize;
                let i = (0..nc)
                    .map(|k| (start + k) % nc)
                    .find(|&i| st.timed[i] < EXPLORE)
                    .unwrap_or(st.cur);
                return (i, CANDIDATES[i]);
            }
            if (h >> 8).is_multiple_of(RECHECK) {
                st.up = !st.up;
                let n = if st.up {
                    (st.cur + 1).min(CANDIDATES.len() - 1)
                } else {
                    st.cur.saturating_sub(1)
                };
                return (n, CANDIDATES[n]);
            }
            (st.cur, CANDIDATES[st.cur])
        })
    }

    /// Records that a unit over rows of `stride` bytes ran at candidate `i` in `ns_per_lookup`.
    pub(crate) fn record(&self, stride: usize, i: usize, ns_per_lookup: f64) {
        self.with(stride, |st| {
            if !st.settled {
                if st.timed[i] < EXPLORE {
                    st.samples[i][st.timed[i]] = ns_per_lookup;
                    st.timed[i] += 1;
                }
                if st.timed.iter().all(|&t| t >= EXPLORE) {
                    for (ns, v) in st.ns.iter_mut().zip(&mut st.samples) {
                        v.sort_by(f64::total_cmp);
                        *ns = v[EXPLORE / 2];
                    }
                    st.cur = (0..CANDIDATES.len())
                        .min_by(|&a, &b| st.ns[a].total_cmp(&st.ns[b]))
                        .unwrap_or(0);
                    st.settled = true;
                }
                return;
            }
            // The current distance runs most units: a slow average; a neighbour is timed once
            // per recheck, on whichever table: a faster one, still smoothing over tables.
            let alpha = if i == st.cur { 0.05 } else { 0.1 };
            st.ns[i] = (1.0 - alpha) * st.ns[i] + alpha * ns_per_lookup;
            if i != st.cur && st.ns[i] < MARGIN * st.ns[st.cur] {
                st.cur = i;
            }
        })
    }

    /// The distance for a unit too small to time: the current one, or 16 ids while exploring.
    pub(crate) fn untimed(&self, stride: usize) -> usize {
        self.current(stride).unwrap_or(16)
    }

    /// The distance rows of `stride` bytes use once explored (`None` before).
    pub(crate) fn current(&self, stride: usize) -> Option<usize> {
        let g = self.states.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .find(|s| s.stride == stride && s.settled)
            .map(|s| CANDIDATES[s.cur])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine whose cost per lookup is lowest at `best` (a V around it).
    fn cost(best: usize, d: usize) -> f64 {
        10.0 + (best as f64 - d as f64).abs() / 8.0
    }

    #[test]
    fn explores_every_candidate_then_keeps_the_fastest() {
        for best in [0, 16, 64, 96] {
            let a = AutoPrefetch::default();
            let mut tried = [0usize; CANDIDATES.len()];
            for _ in 0..CANDIDATES.len() * EXPLORE {
                let (i, d) = a.choose(256);
                assert_eq!(CANDIDATES[i], d);
                tried[i] += 1;
                a.record(256, i, cost(best, d));
            }
            assert!(tried.iter().all(|&t| t == EXPLORE), "{tried:?}");
            assert_eq!(a.current(256), Some(best));
            // Later units mostly run at the best, with rare neighbours.
            let mut others = 0;
            for _ in 0..4 * RECHECK {
                let (i, d) = a.choose(256);
                others += usize::from(d != best);
                a.record(256, i, cost(best, d));
            }
            assert!((1..=12).contains(&others), "{others} rechecks");
            assert_eq!(a.current(256), Some(best));
        }
    }

    #[test]
    fn follows_a_machine_that_changes() {
        let a = AutoPrefetch::default();
        let mut best = 16;
        for n in 0..4000 {
            if n == 200 {
                best = 64;
            }
            let (i, d) = a.choose(256);
            a.record(256, i, cost(best, d));
        }
        assert_eq!(a.current(256), Some(64), "climbed from 16 to 64");
    }

    #[test]
    fn row_sizes_are_independent_and_the_option_parses() {
        let a = AutoPrefetch::default();
        for _ in 0..CANDIDATES.len() * EXPLORE + 8 {
            let (i, d) = a.choose(256);
            a.record(256, i, cost(0, d));
            let (i, d) = a.choose(72);
            a.record(72, i, cost(96, d));
        }
        assert_eq!(a.current(256), Some(0));
        assert_eq!(a.current(72), Some(96));
        assert_eq!(a.current(512), None);
        assert_eq!(a.untimed(512), 16);
        assert_eq!("auto".parse::<Prefetch>().unwrap(), Prefetch::Auto);
        assert_eq!("24".parse::<Prefetch>().unwrap(), Prefetch::Ids(24));
        let e = "far".parse::<Prefetch>().unwrap_err().to_string();
        assert!(e.contains("far") && e.contains("auto"), "{e}");
    }
}
