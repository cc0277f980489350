//! Helpers shared by the property tests.

use ember_embed::{Ids, KeyedJagged};
use rand::Rng;
use rand::rngs::SmallRng;

/// What a random batch looks like.
#[derive(Debug, Clone, Copy)]
pub struct BatchShape {
    pub batch: usize,
    /// Bags have 0..=max_len ids (a fifth of them are empty).
    pub max_len: usize,
    /// Half the bags draw from the first `hot` rows only, so batches repeat rows.
    pub hot: usize,
    pub weighted: bool,
    /// i64 ids instead of u32.
    pub wide: bool,
}

/// A random batch over features whose tables have `rows[f]` rows, named `keys`.
pub fn random_batch(
    rng: &mut SmallRng,
    keys: &[String],
    rows: &[usize],
    b: BatchShape,
) -> KeyedJagged {
    let (mut lengths, mut ids) = (Vec::new(), Vec::new());
    for &r in rows {
        for _ in 0..b.batch {
            let len = if rng.random_bool(0.2) {
                0
            } else {
                rng.random_range(0..=b.max_len)
            };
            lengths.push(len);
            let span = if rng.random_bool(0.5) {
                r.min(b.hot)
            } else {
                r
            };
            (0..len).for_each(|_| ids.push(rng.random_range(0..span) as i64));
        }
    }
    let weights = b.weighted.then(|| {
        (0..ids.len())
            .map(|_| rng.random_range(-2.0f32..2.0))
            .collect()
    });
    let ids = if b.wide {
        Ids::I64(ids)
    } else {
        Ids::U32(ids.into_iter().map(|x| x as u32).collect())
    };
    KeyedJagged::from_lengths(keys.to_vec(), b.batch, &lengths, ids, weights).unwrap()
}
