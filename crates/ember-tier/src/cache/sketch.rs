//! The admission sketch of the LFU policy (TinyLFU): a count-min sketch of recent access
//! frequencies, including those of ids that are not resident.

use super::hash::fold_mul;

/// Rows of the count-min sketch.
const SKETCH_ROWS: usize = 4;
/// Columns of each sketch row in one 64-byte block.
const BLOCK_COLS: usize = 16;
/// Saturation value of a sketch counter.
pub(super) const COUNTER_MAX: u8 = 15;
const SKETCH_SEED: u64 = 0x1319_8A2E_0370_7344;
const SKETCH_MUL: u64 = 0xA409_3822_299F_31D1;

/// One 64-byte cache line of the sketch: 16 consecutive counters of each of the 4 rows.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Block([[u8; BLOCK_COLS]; SKETCH_ROWS]);

/// Count-min sketch of 4 rows of saturating `u8` counters with periodic halving.
///
/// Row `r` is the concatenation of `blocks[..].0[r]`, so the sketch is `4 x width` counters with
/// `width = 16 * blocks.len()`. An id's column in every row lies in the same block (chosen by the
/// top bits of its hash; the low 16 bits pick the column inside each 16-counter group): the
/// 4 counters of an id share one cache line, so a lookup costs one memory access, not four.
#[derive(Debug)]
pub(super) struct Sketch {
    blocks: Vec<Block>,
    /// `64 - log2(blocks.len())`: the top bits of a hash pick the block.
    shift: u32,
    /// Increments since the last halving.
    additions: usize,
    /// Increments between halvings.
    period: usize,
}

impl Sketch {
    pub(super) fn new(capacity: usize) -> Self {
        let width = capacity.saturating_mul(4).max(64).next_power_of_two();
        let blocks = width / BLOCK_COLS;
        Sketch {
            blocks: vec![Block([[0; BLOCK_COLS]; SKETCH_ROWS]); blocks],
            shift: 64 - blocks.trailing_zeros(),
            additions: 0,
            period: capacity.max(1).saturating_mul(10),
        }
    }

    /// The block of `id` and the hash whose low 16 bits give its column in each row group.
    #[inline]
    fn locate(&self, id: u64) -> (usize, u64) {
        let h = fold_mul(id ^ SKETCH_SEED, SKETCH_MUL);
        ((h >> self.shift) as usize, h)
    }

    /// Asks the CPU to bring `id`'s counters (one 64-byte block) into cache.
    #[inline(always)]
    pub(super) fn prefetch(&self, id: u64) {
        let (b, _) = self.locate(id);
        let p = self.blocks.as_ptr().wrapping_add(b);
        ember_embed::prefetch::prefetch_span(p.cast(), 1);
    }

    /// Estimated recent frequency of `id` (never below the truth up to saturation and aging).
    #[inline]
    pub(super) fn estimate(&self, id: u64) -> u8 {
        let (b, h) = self.locate(id);
        let rows = &self.blocks[b].0;
        let col = |r: usize| (h >> (4 * r)) as usize & (BLOCK_COLS - 1);
        rows[0][col(0)]
            .min(rows[1][col(1)])
            .min(rows[2][col(2)])
            .min(rows[3][col(3)])
    }

    /// Records one access of `id`; halves every counter once per `period` accesses.
    #[inline]
    pub(super) fn record(&mut self, id: u64) {
        let (b, h) = self.locate(id);
        for (r, row) in self.blocks[b].0.iter_mut().enumerate() {
            let c = &mut row[(h >> (4 * r)) as usize & (BLOCK_COLS - 1)];
            if *c < COUNTER_MAX {
                *c += 1;
            }
        }
        self.additions += 1;
        if self.additions >= self.period {
            self.additions = 0;
            for c in self.counters_mut() {
                *c >>= 1;
            }
        }
    }

    pub(super) fn counters(&self) -> impl Iterator<Item = &u8> {
        self.blocks.iter().flat_map(|b| b.0.as_flattened())
    }

    fn counters_mut(&mut self) -> impl Iterator<Item = &mut u8> {
        self.blocks.iter_mut().flat_map(|b| b.0.as_flattened_mut())
    }
}
