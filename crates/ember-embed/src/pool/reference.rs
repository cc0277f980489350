//! The specification of the pooled lookup as plain code: the test oracle.
//!
//! ```text
//! for f in features, b in samples:
//!     out[b, col(f) .. col(f) + dim(f)] = sum over j in bag(f, b) of w_j * row(table(f), ids[j])
//!     (w_j = weights[j] for weighted_sum, else 1; mean divides by the bag's length;
//!      an empty bag gives zeros)
//! ```
//! Rows are decoded to f32 with [`crate::DType::decode_row`] and accumulated in f64.

use super::Pooling;
use crate::collection::{CheckedView, EmbeddingCollection};
use crate::error::Result;

/// Computes the pooled lookup of `batch` into `out` (`batch_size x total_dim` floats).
pub fn pooled_lookup(
    coll: &EmbeddingCollection,
    batch: CheckedView<'_>,
    pooling: Pooling,
    out: &mut [f32],
) -> Result<()> {
    let kj = batch.get();
    super::check_call(coll, kj, pooling, out)?;
    let (bsz, width) = (kj.batch_size(), coll.total_dim());
    let weights = if pooling == Pooling::WeightedSum {
        kj.weights()
    } else {
        None
    };
    for f in 0..coll.features().len() {
        let table = coll.table_of(f);
        let dim = table.dim();
        let mut row = vec![0f32; dim];
        let mut acc = vec![0f64; dim];
        for b in 0..bsz {
            acc.iter_mut().for_each(|a| *a = 0.0);
            let bag = kj.bag(f, b);
            for j in bag.clone() {
                // Validated: 0 <= id < rows.
                let id = kj.ids().get(j) as usize;
                table.dequantize_row(id, &mut row)?;
                let w = weights.map_or(1.0, |w| f64::from(w[j]));
                for (a, &x) in acc.iter_mut().zip(&row) {
                    *a += w * f64::from(x);
                }
            }
            let scale = if pooling == Pooling::Mean && !bag.is_empty() {
                1.0 / bag.len() as f64
            } else {
                1.0
            };
            let dst = &mut out[b * width + coll.col_offset(f)..][..dim];
            for (d, a) in dst.iter_mut().zip(&acc) {
                *d = (a * scale) as f32;
            }
        }
    }
    Ok(())
}
