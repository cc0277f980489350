//! `Dedup::Auto`: deduplicate a feature only where it is measured to pay.
//!
//! Deduplication saves fetches of repeated rows but costs a hash pass and a copy. Whether that pays
//! depends on where rows live: for tables in DRAM the direct kernel's repeats are already cache
//! hits (measured on RM1 with the production trace: dedup 2x slower at batch 64, 4x at 4096), while
//! rows from slow tiers make every avoided fetch count. So `auto` measures instead of guessing:
//! units whose ids show no reuse in a sample run directly; for the others, each feature times both
//! paths (ns per lookup) on its first units, keeps the faster, and re-times the other path every
//! `RECHECK` units so that it follows changes in the workload.

use std::sync::Mutex;

/// Timed units per path before choosing (the first is a warm-up and is replaced).
const EXPLORE: u32 = 3;
/// After exploring, one unit in this many runs the path not chosen, to keep its time fresh.
const RECHECK: u64 = 256;
/// A feature's ids are sampled for reuse on its first unit and then once every this many units.
const RESAMPLE: u64 = 64;

#[derive(Debug, Clone, Copy, Default)]
struct Feature {
    units: u64,
    /// Whether the last sample of the feature's ids showed reuse.
    reuse: bool,
    /// Exponentially weighted ns per lookup, [direct, dedup].
    ns: [f64; 2],
    timed: [u32; 2],
}

/// Per-feature measurements of the two paths.
#[derive(Debug, Default)]
pub(crate) struct AutoDedup {
    features: Mutex<Vec<Feature>>,
}

impl AutoDedup {
    /// For the next unit of feature `f`: `(dedup, timed)`. `shows_reuse` samples the unit's ids;
    /// it is called on the feature's first unit and every `RESAMPLE` units after. Units without
    /// reuse run directly and untimed; the others follow the measurements and are timed.
    pub(crate) fn choose(&self, f: usize, shows_reuse: impl FnOnce() -> bool) -> (bool, bool) {
        let mut g = self.features.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() <= f {
            g.resize(f + 1, Feature::default());
        }
        let st = &mut g[f];
        if st.units.is_multiple_of(RESAMPLE) {
            st.reuse = shows_reuse();
        }
        st.units += 1;
        if !st.reuse {
            return (false, false);
        }
        if st.timed[0] < EXPLORE {
            return (false, true);
        }
        if st.timed[1] < EXPLORE {
            return (true, true);
        }
        let best = st.ns[1] < st.ns[0];
        (
            if st.units.is_multiple_of(RECHECK) {
                !best
            } else {
                best
            },
            true,
        )
    }

    /// Records that a unit of feature `f` took `ns_per_lookup` on the given path.
    pub(crate) fn record(&self, f: usize, dedup: bool, ns_per_lookup: f64) {
        let mut g = self.features.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = g.get_mut(f) {
            let m = usize::from(dedup);
            st.ns[m] = if st.timed[m] <= 1 {
                ns_per_lookup
            } else {
                0.7 * st.ns[m] + 0.3 * ns_per_lookup
            };
            st.timed[m] += 1;
        }
    }

    /// The path feature `f` currently prefers (`None` until both were timed).
    #[cfg(test)]
    pub(crate) fn preferred(&self, f: usize) -> Option<bool> {
        let g = self.features.lock().unwrap_or_else(|p| p.into_inner());
        g.get(f)
            .filter(|s| s.timed.iter().all(|&t| t >= EXPLORE))
            .map(|s| s.ns[1] < s.ns[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explores_both_paths_then_keeps_the_faster_and_rechecks() {
        for dedup_faster in [false, true] {
            let a = AutoDedup::default();
            let mut picks = Vec::new();
            for _ in 0..2 * RECHECK {
                let (d, timed) = a.choose(0, || true);
                assert!(timed);
                picks.push(d);
                let ns = if d == dedup_faster { 10.0 } else { 30.0 };
                a.record(0, d, ns);
            }
            assert_eq!(a.preferred(0), Some(dedup_faster));
            assert!(
                picks[..EXPLORE as usize].iter().all(|&d| !d),
                "direct first"
            );
            assert!(
                picks[EXPLORE as usize..2 * EXPLORE as usize]
                    .iter()
                    .all(|&d| d),
                "then dedup"
            );
            let later = &picks[2 * EXPLORE as usize..];
            let others = later.iter().filter(|&&d| d != dedup_faster).count();
            assert!(
                (1..=3).contains(&others),
                "rare rechecks of the slower path: {others}"
            );
        }
    }

    #[test]
    fn features_are_independent() {
        let a = AutoDedup::default();
        for _ in 0..20 {
            let (d0, _) = a.choose(0, || true);
            a.record(0, d0, if d0 { 1.0 } else { 5.0 });
            let (d3, _) = a.choose(3, || true);
            a.record(3, d3, if d3 { 5.0 } else { 1.0 });
        }
        assert_eq!(a.preferred(0), Some(true));
        assert_eq!(a.preferred(3), Some(false));
        assert_eq!(a.preferred(1), None);
    }

    #[test]
    fn no_reuse_means_direct_and_reuse_is_resampled() {
        let a = AutoDedup::default();
        let mut samples = 0;
        for _ in 0..3 * RESAMPLE {
            let (d, timed) = a.choose(0, || {
                samples += 1;
                false
            });
            assert!(!d && !timed);
        }
        assert_eq!(
            samples, 3,
            "sampled on the first unit and every RESAMPLE units"
        );
    }
}
