//! Hot rows for L2 pinning: a profile of row frequencies, the rows worth pinning within a byte
//! budget, and the renumbering that makes them contiguous.
//!
//! Each table's rows are renumbered so that its hot rows come first, hottest first, followed by
//! the rest in their original order. On the device all tables' hot rows sit side by side in one
//! region, so one access-policy window covers the whole hot set; a lookup maps its id through
//! the table's `remap` (old id -> new id) and reads row `new < hot_rows` from the hot region,
//! else row `new - hot_rows` from the table's cold region.

use std::collections::HashMap;

use ember_embed::{EmbeddingCollection, KeyedJagged};

use crate::error::{CudaError, Result};

/// The rows chosen to be pinned, per table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HotPlan {
    /// Per table: its hot rows (old ids), hottest first.
    pub hot: Vec<Vec<u32>>,
}

impl HotPlan {
    /// No pinned rows.
    pub fn empty(tables: usize) -> HotPlan {
        HotPlan {
            hot: vec![Vec::new(); tables],
        }
    }

    /// Picks, over all tables, the rows with the most lookups per byte (`counts[t]`: row ->
    /// lookups of table `t`; `strides[t]`: its bytes per row) until `budget` bytes are taken.
    /// Ties go to the lower (table, row), so plans are reproducible.
    pub fn from_counts(counts: &[HashMap<u32, u64>], strides: &[usize], budget: usize) -> HotPlan {
        assert_eq!(counts.len(), strides.len());
        let mut all: Vec<(u32, u32, u64)> = counts
            .iter()
            .enumerate()
            .flat_map(|(t, c)| c.iter().map(move |(&r, &n)| (t as u32, r, n)))
            .filter(|&(_, _, n)| n > 0)
            .collect();
        // Most lookups per byte first: n_a / s_a > n_b / s_b  <=>  n_a * s_b > n_b * s_a.
        all.sort_by(|a, b| {
            let (sa, sb) = (strides[a.0 as usize] as u128, strides[b.0 as usize] as u128);
            (u128::from(b.2) * sa)
                .cmp(&(u128::from(a.2) * sb))
                .then((a.0, a.1).cmp(&(b.0, b.1)))
        });
        let mut plan = HotPlan::empty(counts.len());
        let mut used = 0usize;
        for (t, r, _) in all {
            let s = strides[t as usize];
            if used + s > budget {
                continue; // a smaller row of another table may still fit
            }
            used += s;
            plan.hot[t as usize].push(r);
        }
        plan
    }

    /// Counts each table's lookups over `batches` (a profile, e.g. warm-up traffic) and picks
    /// the hot rows within `budget` bytes.
    pub fn profile<'a>(
        coll: &EmbeddingCollection,
        batches: impl IntoIterator<Item = &'a KeyedJagged>,
        budget: usize,
    ) -> Result<HotPlan> {
        let tables = coll.tables();
        let mut counts: Vec<HashMap<u32, u64>> = vec![HashMap::new(); tables.len()];
        let table_index: HashMap<&str, usize> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name(), i))
            .collect();
        for kj in batches {
            let valid = coll.check_view(kj)?;
            let kj = valid.get();
            for f in 0..coll.features().len() {
                let t = table_index[coll.table_of(f).name()];
                for j in kj.feature_range(f) {
                    *counts[t].entry(kj.ids().get(j) as u32).or_insert(0) += 1;
                }
            }
        }
        let strides: Vec<usize> = tables.iter().map(|t| t.stride()).collect();
        Ok(HotPlan::from_counts(&counts, &strides, budget))
    }

    /// Hot rows of table `t`.
    pub fn hot_rows(&self, t: usize) -> usize {
        self.hot.get(t).map_or(0, Vec::len)
    }

    /// Bytes of the hot region (each table's part rounded up to `align`).
    pub fn hot_bytes(&self, strides: &[usize], align: usize) -> usize {
        (0..self.hot.len())
            .map(|t| (self.hot_rows(t) * strides[t]).next_multiple_of(align))
            .sum()
    }

    /// Checks the plan against tables of `rows[t]` rows: ids in range, no row twice.
    pub fn check(&self, rows: &[usize]) -> Result<()> {
        if self.hot.len() != rows.len() {
            return Err(CudaError::Input(format!(
                "hot-row plan has {} tables, the collection {}",
                self.hot.len(),
                rows.len()
            )));
        }
        for (t, hot) in self.hot.iter().enumerate() {
            let mut seen = vec![false; rows[t]];
            for &r in hot {
                let r = r as usize;
                if r >= rows[t] || std::mem::replace(&mut seen[r], true) {
                    return Err(CudaError::Input(format!(
                        "hot-row plan: row {r} of table {t} is out of range or listed twice"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Table `t`'s renumbering: `remap[old] = new` (hot rows first, then the rest in order).
    pub fn remap(&self, t: usize, rows: usize) -> Vec<i32> {
        let hot = &self.hot[t];
        let mut remap = vec![-1i32; rows];
        for (new, &old) in hot.iter().enumerate() {
            remap[old as usize] = new as i32;
        }
        for (next, r) in (hot.len() as i32..).zip(remap.iter_mut().filter(|r| **r < 0)) {
            *r = next;
        }
        remap
    }

    /// Table `t`'s bytes split into its hot rows (in new order) and its cold rows (the rest, in
    /// order). `data` is the table's packed rows of `stride` bytes.
    pub fn split(&self, t: usize, data: &[u8], stride: usize) -> (Vec<u8>, Vec<u8>) {
        let rows = data.len() / stride;
        let hot = &self.hot[t];
        let mut is_hot = vec![false; rows];
        let mut hot_bytes = Vec::with_capacity(hot.len() * stride);
        for &r in hot {
            is_hot[r as usize] = true;
            hot_bytes.extend_from_slice(&data[r as usize * stride..][..stride]);
        }
        let mut cold = Vec::with_capacity((rows - hot.len()) * stride);
        for (r, row) in data.chunks_exact(stride).enumerate() {
            if !is_hot[r] {
                cold.extend_from_slice(row);
            }
        }
        (hot_bytes, cold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn renumbered_rows_read_back_the_original_rows() {
        let mut rng = StdRng::seed_from_u64(7);
        for case in 0..50 {
            let ntab = rng.random_range(1..4);
            let rows: Vec<usize> = (0..ntab).map(|_| rng.random_range(1..200)).collect();
            let strides: Vec<usize> = (0..ntab).map(|_| rng.random_range(1..40)).collect();
            let data: Vec<Vec<u8>> = (0..ntab)
                .map(|t| (0..rows[t] * strides[t]).map(|_| rng.random()).collect())
                .collect();
            let counts: Vec<HashMap<u32, u64>> = (0..ntab)
                .map(|t| {
                    (0..rng.random_range(0..rows[t] * 2))
                        .map(|_| (rng.random_range(0..rows[t]) as u32, rng.random_range(1..50)))
                        .collect()
                })
                .collect();
            let budget = rng.random_range(0..2000);
            let plan = HotPlan::from_counts(&counts, &strides, budget);
            plan.check(&rows).unwrap();
            // Within budget.
            let used: usize = (0..ntab).map(|t| plan.hot_rows(t) * strides[t]).sum();
            assert!(used <= budget, "case {case}");
            // Every chosen row has at least the lookups per byte of every row left out that
            // would have fit.
            for t in 0..ntab {
                for (&r, &n) in &counts[t] {
                    if plan.hot[t].contains(&r) || used + strides[t] > budget {
                        continue;
                    }
                    for u in 0..ntab {
                        for &h in &plan.hot[u] {
                            let nh = counts[u][&h];
                            assert!(
                                u128::from(nh) * strides[t] as u128
                                    >= u128::from(n) * strides[u] as u128,
                                "case {case}: ({u},{h}) pinned over ({t},{r})"
                            );
                        }
                    }
                }
            }
            for t in 0..ntab {
                let remap = plan.remap(t, rows[t]);
                let mut sorted = remap.clone();
                sorted.sort();
                assert_eq!(
                    sorted,
                    (0..rows[t] as i32).collect::<Vec<_>>(),
                    "a permutation"
                );
                let (hot, cold) = plan.split(t, &data[t], strides[t]);
                let s = strides[t];
                let h = plan.hot_rows(t);
                assert_eq!(hot.len() + cold.len(), data[t].len());
                for (old, &new) in remap.iter().enumerate() {
                    let new = new as usize;
                    let got = if new < h {
                        &hot[new * s..][..s]
                    } else {
                        &cold[(new - h) * s..][..s]
                    };
                    assert_eq!(
                        got,
                        &data[t][old * s..][..s],
                        "case {case} table {t} row {old}"
                    );
                }
                // Hottest first within a table.
                let c: Vec<u64> = plan.hot[t].iter().map(|r| counts[t][r]).collect();
                assert!(c.windows(2).all(|w| w[0] >= w[1]), "case {case}");
            }
        }
    }

    #[test]
    fn bad_plans_are_refused() {
        let plan = HotPlan {
            hot: vec![vec![3, 3]],
        };
        assert!(plan.check(&[10]).is_err());
        let plan = HotPlan {
            hot: vec![vec![10]],
        };
        assert!(plan.check(&[10]).is_err());
        assert!(HotPlan::empty(2).check(&[10]).is_err());
        assert!(HotPlan::empty(1).check(&[10]).is_ok());
    }
}
