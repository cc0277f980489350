//! Where each row lies in a row file's data: a [`RowLayout`], and how one is made from a profile
//! of accesses.
//!
//! A row file's data holds its rows in id order unless the file carries a layout (format
//! version 2): then position `p` of the data holds row `order[p]`, and the file stores, for every
//! row, its position (`u32` each, with a CRC in the header). Ids never change: a layout only
//! moves rows between blocks, so that rows read together share blocks, and each block read brings
//! more rows that are used.
//!
//! [`RowLayout::from_profile`] orders rows from a profile (an id trace, or counts):
//! 1. **hot**: the `hot_rows` most frequent rows, most frequent first (the rows a cache of that
//!    many rows keeps; they are rarely read from the file, and packing them together keeps them
//!    out of the blocks the rest is read in);
//! 2. **warm**: every other row the profile met, in the order of its first access: rows that are
//!    accessed close in time (in the same batch, the same requests) land in the same block
//!    (co-access);
//! 3. **cold**: rows the profile never met, in id order.

use crate::error::{EmbedError, LayoutError, Result};

/// Largest table a layout covers (positions are stored as `u32`).
pub const MAX_LAYOUT_ROWS: usize = u32::MAX as usize;

/// Why a vector is not a permutation (see [`invert`]).
enum NotPermutation {
    /// `v[i]` is past `v.len()`: `(i, v[i])`.
    Past(usize, u32),
    /// `v[i]` was met first at `first`: `(v[i], first, i)`.
    Twice(u32, u32, usize),
}

/// A permutation of a table's rows: where each row lies in the data, and which row each
/// position holds. Checked to be a permutation when built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayout {
    /// `slot[id]`: the position of row `id`.
    slot: Box<[u32]>,
    /// `order[p]`: the row at position `p`.
    order: Box<[u32]>,
}

/// How a profile placed a table's rows (for reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayoutSummary {
    /// Rows placed first by heat.
    pub hot: usize,
    /// Other rows the profile met, placed by first access.
    pub warm: usize,
    /// Rows the profile never met, left in id order at the end.
    pub cold: usize,
    /// Profile ids at or past the table's rows (ignored).
    pub out_of_range: usize,
}

impl RowLayout {
    /// The layout from `order` (`order[p]` is the row at position `p`), checked to hold every
    /// row of a `rows`-row table exactly once.
    pub fn from_order(order: Vec<u32>) -> std::result::Result<Self, LayoutError> {
        let rows = order.len();
        if rows > MAX_LAYOUT_ROWS {
            return Err(LayoutError::TooManyRows {
                rows,
                max: MAX_LAYOUT_ROWS,
            });
        }
        let slot = invert(&order).map_err(|e| match e {
            NotPermutation::Past(position, row) => LayoutError::RowPastEnd {
                position,
                row,
                rows,
            },
            NotPermutation::Twice(row, first, second) => {
                LayoutError::RowTwice { row, first, second }
            }
        })?;
        Ok(RowLayout {
            slot: slot.into(),
            order: order.into(),
        })
    }

    /// The layout from stored positions (`slot[id]`, as a layout section holds them), checked.
    pub fn from_slots(slot: &[u32]) -> std::result::Result<Self, LayoutError> {
        let rows = slot.len();
        let order = invert(slot).map_err(|e| match e {
            NotPermutation::Past(row, position) => LayoutError::PositionPastEnd {
                row,
                position,
                rows,
            },
            NotPermutation::Twice(position, first, second) => LayoutError::PositionTwice {
                position,
                first,
                second,
            },
        })?;
        Ok(RowLayout {
            slot: slot.into(),
            order: order.into(),
        })
    }

    /// Orders a `rows`-row table from a profile of accesses (`ids`, in access order): the
    /// `hot_rows` most frequent first, then the rest met by first access, then the unmet rows
    /// in id order (see the module documentation). Ids at or past `rows` are ignored and counted.
    pub fn from_profile(
        rows: usize,
        ids: &[u64],
        hot_rows: usize,
    ) -> Result<(Self, LayoutSummary)> {
        if rows > MAX_LAYOUT_ROWS {
            return Err(EmbedError::BadOption {
                option: "layout",
                reason: format!("{rows} rows: a layout covers at most {MAX_LAYOUT_ROWS}"),
            });
        }
        let mut count = vec![0u32; rows];
        // First access of each row met, as an index into `met`.
        let mut met: Vec<u32> = Vec::new();
        let mut out_of_range = 0;
        for &id in ids {
            if id >= rows as u64 {
                out_of_range += 1;
                continue;
            }
            let c = &mut count[id as usize];
            if *c == 0 {
                met.push(id as u32);
            }
            *c = c.saturating_add(1);
        }
        let hot_n = hot_rows.min(met.len());
        // Most frequent first; ties by first access (`met` is in that order, the sort is stable).
        let mut by_heat = met.clone();
        by_heat.sort_by_key(|&id| std::cmp::Reverse(count[id as usize]));
        by_heat.truncate(hot_n);
        let mut placed = vec![false; rows];
        let mut order = Vec::with_capacity(rows);
        for &id in &by_heat {
            placed[id as usize] = true;
            order.push(id);
        }
        for &id in &met {
            if !placed[id as usize] {
                placed[id as usize] = true;
                order.push(id);
            }
        }
        let warm = order.len() - hot_n;
        order.extend((0..rows as u32).filter(|&id| !placed[id as usize]));
        // Hot, then warm (each met row once), then cold (every row not placed): a permutation by
        // construction, and `rows` was checked above.
        let layout = Self::from_order(order).expect("a profile's order places every row once");
        Ok((
            layout,
            LayoutSummary {
                hot: hot_n,
                warm,
                cold: rows - hot_n - warm,
                out_of_range,
            },
        ))
    }

    /// Rows covered.
    pub fn rows(&self) -> usize {
        self.slot.len()
    }

    /// The position of row `id`.
    #[inline]
    pub fn position(&self, id: usize) -> usize {
        self.slot[id] as usize
    }

    /// The row at position `p`.
    #[inline]
    pub fn row_at(&self, p: usize) -> usize {
        self.order[p] as usize
    }

    /// Every row's position, in id order (what the file stores).
    pub fn slots(&self) -> &[u32] {
        &self.slot
    }

    /// Every position's row, in position order.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// Whether every row lies at its own id (a layout that changes nothing).
    pub fn is_identity(&self) -> bool {
        self.slot.iter().enumerate().all(|(i, &p)| p as usize == i)
    }
}

/// The inverse of the permutation `v` (`inv[v[i]] == i`), refusing a value past `v.len()` or
/// met twice.
fn invert(v: &[u32]) -> std::result::Result<Vec<u32>, NotPermutation> {
    let mut inv = vec![u32::MAX; v.len()];
    for (i, &x) in v.iter().enumerate() {
        let slot = inv.get_mut(x as usize).ok_or(NotPermutation::Past(i, x))?;
        if *slot != u32::MAX {
            return Err(NotPermutation::Twice(x, *slot, i));
        }
        *slot = i as u32;
    }
    // `len` values each filled a distinct slot below `len`: every slot is filled.
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_places_hot_then_first_access_then_unmet() {
        // Row 5 is met 3 times, 2 twice, 7 and 1 once (7 first), 9 past the table.
        let ids = [7, 5, 2, 5, 9, 1, 2, 5];
        let (l, s) = RowLayout::from_profile(8, &ids, 2).unwrap();
        assert_eq!(l.order(), &[5, 2, 7, 1, 0, 3, 4, 6]);
        assert_eq!(
            s,
            LayoutSummary {
                hot: 2,
                warm: 2,
                cold: 4,
                out_of_range: 1
            }
        );
        for p in 0..8 {
            assert_eq!(l.position(l.row_at(p)), p);
        }
        // No hot rows: first access order throughout.
        let (l, _) = RowLayout::from_profile(8, &ids, 0).unwrap();
        assert_eq!(&l.order()[..4], &[7, 5, 2, 1]);
        // More hot rows than met: every met row by heat.
        let (l, s) = RowLayout::from_profile(8, &ids, 100).unwrap();
        assert_eq!(&l.order()[..4], &[5, 2, 7, 1]);
        assert_eq!((s.hot, s.warm, s.cold), (4, 0, 4));
        // An empty profile changes nothing.
        let (l, _) = RowLayout::from_profile(5, &[], 3).unwrap();
        assert!(l.is_identity());
    }

    #[test]
    fn a_layout_must_be_a_permutation() {
        assert!(RowLayout::from_order(vec![2, 0, 1]).is_ok());
        let e = RowLayout::from_order(vec![0, 0, 1]).unwrap_err();
        assert_eq!(
            e,
            LayoutError::RowTwice {
                row: 0,
                first: 0,
                second: 1
            }
        );
        assert_eq!(e.to_string(), "row 0 is placed twice (positions 0 and 1)");
        let e = RowLayout::from_order(vec![0, 3, 1]).unwrap_err();
        assert_eq!(
            e,
            LayoutError::RowPastEnd {
                position: 1,
                row: 3,
                rows: 3
            }
        );
        let e = RowLayout::from_slots(&[1, 1, 0]).unwrap_err();
        assert_eq!(
            e,
            LayoutError::PositionTwice {
                position: 1,
                first: 0,
                second: 1
            }
        );
        assert_eq!(e.to_string(), "position 1 holds two rows (0 and 1)");
        let e = RowLayout::from_slots(&[0, 5, 1]).unwrap_err();
        assert_eq!(
            e,
            LayoutError::PositionPastEnd {
                row: 1,
                position: 5,
                rows: 3
            }
        );
        let l = RowLayout::from_slots(&[2, 0, 1]).unwrap();
        assert_eq!(l.order(), &[1, 2, 0]);
        assert_eq!(RowLayout::from_order(vec![1, 2, 0]).unwrap(), l);
    }
}
