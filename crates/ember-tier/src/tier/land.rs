//! Landing a batch's fetched rows: each in a slot of its table's cache held for the batch
//! (admitted, or a staging slot lent), so that the feature pools straight from the slab; or, for
//! a feature whose rows the cache could not all hold, every row of the feature copied into one
//! compact buffer of its own (the same result, one copy more). Steps of
//! [`super::Stager::stage`].

use super::inner::{Miss, TierTable};
use crate::cache::RowCache;
use ember_embed::staged::{Recycler, STABLE_ROW, StagedBatch, StagedFeature, StagedRows};

/// Rows of a batch that found no slot in their table's cache, per feature: (feature, its
/// distinct rows, `stride` bytes each).
pub(super) type Overflow = Vec<(usize, Vec<u8>)>;

/// Lands fetched row `row` of miss `m` in a slot of `table`'s cache held for the batch (admitted,
/// or a staging slot lent), else in its feature's buffer in `overflow` (taken from `recycler` at
/// the feature's first such row).
#[inline]
pub(super) fn land_row(
    m: &Miss,
    row: &[u8],
    table: &mut TierTable,
    staged: &mut StagedBatch,
    overflow: &mut Overflow,
    recycler: &Recycler,
) {
    // SAFETY: the slot written below is one this batch holds from now on (`held`), written
    // before the batch is handed out; what the batch names keeps `StagedBatch::set_feature`'s
    // promise.
    let feats = unsafe { staged.features_mut() };
    let Some(StagedFeature {
        rows: StagedRows::Slab { held, .. },
        ..
    }) = feats[m.feature].as_mut()
    else {
        return;
    };
    let slot = table
        .cache
        .insert_held(m.id as u64, row)
        .or_else(|| table.cache.hold_staging(row));
    match slot {
        Some(slot) => held[m.slot] = slot,
        None => {
            let rb = row.len();
            let k = match overflow.iter().position(|(f, _)| *f == m.feature) {
                Some(k) => k,
                None => {
                    overflow.push((m.feature, recycler.take_rows(held.len() * rb)));
                    overflow.len() - 1
                }
            };
            overflow[k].1[m.slot * rb..(m.slot + 1) * rb].copy_from_slice(row);
        }
    }
}

/// Points each id of `sf` that missed at the slot its fetched row landed in, so that the whole
/// feature pools straight from the slab.
pub(super) fn fill_slots(sf: &mut StagedFeature) {
    let StagedRows::Slab { held, slots, .. } = &mut sf.rows else {
        return;
    };
    for (s, &x) in slots.iter_mut().zip(&sf.inverse) {
        if *s == u32::MAX {
            *s = held[x as usize];
        }
    }
}

/// Makes `sf` compact: its held rows copied beside those that found no slot (`rows`, one per
/// distinct row) and their slots let go of at once, its stable rows appended (`copy_stable`).
pub(super) fn compact(
    sf: &mut StagedFeature,
    mut rows: Vec<u8>,
    cache: &mut RowCache,
    recycler: &Recycler,
) {
    let StagedRows::Slab { held, slots, .. } = &mut sf.rows else {
        return;
    };
    let rb = sf.stride;
    for (i, &slot) in held.iter().enumerate() {
        if slot != u32::MAX {
            rows[i * rb..(i + 1) * rb].copy_from_slice(cache.slot_row(slot));
            cache.release(slot);
        }
    }
    recycler.put_held(std::mem::take(held));
    let slots = std::mem::take(slots);
    copy_stable(sf, &slots, &mut rows, cache);
    recycler.put(Vec::new(), slots);
    sf.rows = StagedRows::Compact(rows);
}

/// For a feature whose rows are being copied out of the cache (a compact buffer, `rows`, holding
/// its distinct evictable rows): appends its distinct stable rows (`slots` locates them) after
/// those, and points the inverse of their ids at them. A rare path (the cache could not hold a
/// batch's rows): the stable rows are deduplicated here with a hash map.
fn copy_stable(sf: &mut StagedFeature, slots: &[u32], rows: &mut Vec<u8>, cache: &RowCache) {
    if sf.stable == 0 {
        return;
    }
    let rb = sf.stride;
    let mut at: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for (x, &slot) in sf.inverse.iter_mut().zip(slots) {
        if *x != STABLE_ROW {
            continue;
        }
        *x = *at.entry(slot).or_insert_with(|| {
            let i = sf.n_rows;
            sf.n_rows += 1;
            rows.extend_from_slice(cache.slot_row(slot));
            i as u32
        });
    }
    debug_assert_eq!(rows.len(), sf.n_rows * rb);
    sf.stable = 0;
}
