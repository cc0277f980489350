//! The check `bench embed` makes before timing: the kernel against the scalar reference on one
//! batch, and for quantized dtypes the pooled error against pooling the f32 rows (regenerated
//! from the seed).

use anyhow::{Result, ensure};
use ember_embed::pool::reference;
use ember_embed::{CheckedView, DType, EmbeddingCollection, Pooler, Pooling};
use ember_model::random::seeded_row;

/// Checks the kernel against the reference on one batch; for quantized dtypes also returns the
/// relative error (L2) of the pooled output against pooling the f32 source rows.
pub(super) fn check(
    coll: &EmbeddingCollection,
    pooler: &Pooler,
    vb: CheckedView<'_>,
    mode: Pooling,
    seed: u64,
    out: &mut [f32],
) -> Result<Option<f64>> {
    pooler.run(coll, vb, out)?;
    let mut want = vec![0f32; out.len()];
    reference::pooled_lookup(coll, vb, mode, &mut want)?;
    let kj = vb.get();
    let dim = coll.total_dim() / coll.features().len().max(1);
    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
        let (b, col) = (i / coll.total_dim(), i % coll.total_dim());
        let bag_len = kj.length(col / dim.max(1), b) as f32;
        let tol = 1e-5 * (1.0 + bag_len) * (1.0 + w.abs());
        ensure!(
            (g - w).abs() <= tol,
            "kernel result differs from the reference at sample {b}, column {col}: {g} vs {w}"
        );
    }
    let dtype = coll.tables()[0].dtype();
    if dtype == DType::F32 {
        return Ok(None);
    }
    // Pool the f32 source rows (regenerated from the seed) and compare.
    let (mut num, mut den) = (0f64, 0f64);
    let mut row = vec![0f32; dim];
    for f in 0..coll.features().len() {
        for b in 0..kj.batch_size() {
            let bag = kj.bag(f, b);
            let mut acc = vec![0f64; dim];
            for j in bag.clone() {
                seeded_row(seed, f, kj.ids().get(j) as usize, &mut row);
                let w = kj.weights().map_or(1.0, |w| f64::from(w[j]));
                acc.iter_mut()
                    .zip(&row)
                    .for_each(|(a, &x)| *a += w * f64::from(x));
            }
            let scale = if mode == Pooling::Mean && !bag.is_empty() {
                1.0 / bag.len() as f64
            } else {
                1.0
            };
            for (d, a) in acc.iter().enumerate() {
                let exact = a * scale;
                let got = f64::from(out[b * coll.total_dim() + f * dim + d]);
                num += (got - exact).powi(2);
                den += exact.powi(2);
            }
        }
    }
    Ok(Some((num / den.max(f64::MIN_POSITIVE)).sqrt()))
}
