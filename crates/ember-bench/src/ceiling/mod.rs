//! The memory ceiling: the plainest fast loop over the same rows and ids as a pooled lookup, the
//! bar that `bench embed` reports Ember against. For every bag of every feature it sums the bag's
//! rows in registers (one accumulator per cache line of a row, rows read whole, as bytes, so any
//! row format costs only its bytes), prefetches rows a fixed number of ids ahead with every line
//! unrolled, and keeps one value per bag, as a hand-written gather-and-sum in C does
//! (`../shared/tools/gather_ceiling_trace.c`). It decodes nothing and writes no output matrix.
//!
//! "The best loop anyone can write for the workload": [`Ceiling::tune`] times the loop at several
//! prefetch distances on the benchmark's own batches and keeps the fastest, so the bar does not
//! depend on Ember's `--prefetch` setting (a distance that is wrong for the machine lowers the
//! ceiling and flatters the kernels, which is what happened before this loop: Ember ran at 100%
//! of a ceiling that a 30-line C loop beat by 25%).

use ember_embed::{CheckedView, EmbedError, EmbeddingCollection, Ids, Isa, PrefetchLevel, Result};
use rayon::prelude::*;
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod x86;

// The ceiling shares no code with the kernels it measures (its own id trait and prefetch): a bug
// or a slowdown there must not lower the bar too.

/// A row id as the loop reads it (u32 or i64, validated).
pub(crate) trait RowIndex: Copy + Send + Sync {
    fn idx(self) -> usize;
}

impl RowIndex for u32 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}

impl RowIndex for i64 {
    #[inline(always)]
    fn idx(self) -> usize {
        self as usize
    }
}

/// Prefetch distances [`Ceiling::tune`] tries, in ids.
pub const TUNED_DISTANCES: [usize; 11] = [0, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];

/// What the loop reads for one feature: `rows` of `stride` bytes, and the bags `bags[i] ..
/// bags[i + 1]` (batch positions; `ids[0]` is at position `first`).
pub(crate) struct Job<'a, I> {
    pub(crate) rows: &'a [u8],
    pub(crate) stride: usize,
    pub(crate) ids: &'a [I],
    pub(crate) bags: &'a [usize],
    pub(crate) first: usize,
    pub(crate) prefetch: usize,
    /// Prefetch into L2 (`prefetcht1`) rather than L1.
    pub(crate) l2: bool,
}

impl<I> Job<'_, I> {
    /// Indices into `ids` of the bag that `b` (two consecutive bag offsets) bounds.
    #[inline(always)]
    pub(crate) fn span(&self, b: &[usize]) -> std::ops::Range<usize> {
        b[0] - self.first..b[1] - self.first
    }
}

/// Runs the ceiling loop on a fixed number of threads.
#[derive(Debug)]
pub struct Ceiling {
    pool: Option<rayon::ThreadPool>,
    prefetch: usize,
    level: PrefetchLevel,
    isa: Isa,
}

impl Ceiling {
    /// A ceiling loop with `threads` threads and a prefetch distance of `prefetch` ids, into the
    /// cache level Ember's kernels use ([`PrefetchLevel::selected`]) (until [`Ceiling::tune`]
    /// picks both).
    pub fn new(threads: usize, prefetch: usize, isa: Isa) -> Result<Self> {
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .map_err(|e| EmbedError::ThreadPool {
                        threads,
                        cause: ember_embed::Cause::new(e),
                    })?,
            )
        } else {
            None
        };
        Ok(Ceiling {
            pool,
            prefetch,
            level: PrefetchLevel::selected(),
            isa: isa.require()?,
        })
    }

    /// The prefetch distance in use, in ids.
    pub fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// The cache level prefetches fill.
    pub fn prefetch_level(&self) -> PrefetchLevel {
        self.level
    }

    /// Times the loop over `batches` at each of [`TUNED_DISTANCES`], prefetching into L1 and
    /// into L2 (best of `rounds` passes, after one untimed pass), and keeps the fastest distance
    /// and level; returns the distance ([`Ceiling::prefetch_level`] has the level).
    pub fn tune(
        &mut self,
        coll: &EmbeddingCollection,
        batches: &[CheckedView<'_>],
        rounds: usize,
    ) -> usize {
        let mut best = (f64::INFINITY, self.prefetch, self.level);
        let mut sink = 0u64;
        for &d in &TUNED_DISTANCES {
            // Both levels at each distance (only one without prefetch), in turn, so that drift
            // hits both alike.
            let levels: &[PrefetchLevel] = match d {
                0 => &[PrefetchLevel::L1],
                _ => &[PrefetchLevel::L1, PrefetchLevel::L2],
            };
            for &level in levels {
                self.prefetch = d;
                self.level = level;
                for b in batches {
                    sink = sink.wrapping_add(self.run(coll, *b));
                }
                for _ in 0..rounds.max(1) {
                    let t = Instant::now();
                    for b in batches {
                        sink = sink.wrapping_add(self.run(coll, *b));
                    }
                    let s = t.elapsed().as_secs_f64();
                    if s < best.0 {
                        best = (s, d, level);
                    }
                }
            }
        }
        std::hint::black_box(sink);
        (_, self.prefetch, self.level) = best;
        best.1
    }

    /// Sums every bag of `batch` (each feature over its table) and returns a checksum of the
    /// sums, so the work cannot be optimised away. Tables on the SSD tier (no resident rows)
    /// are skipped.
    pub fn run(&self, coll: &EmbeddingCollection, batch: CheckedView<'_>) -> u64 {
        assert_eq!(
            batch.collection(),
            coll.id(),
            "the ceiling gathers a batch validated against its own collection"
        );
        let kj = batch.get();
        let bsz = kj.batch_size();
        let one = |f: usize| -> u64 {
            let t = coll.table_of(f);
            let Some(rows) = t.resident() else {
                return 0;
            };
            if bsz == 0 {
                return 0;
            }
            let r = kj.feature_range(f);
            let bags = &kj.offsets()[f * bsz..=(f + 1) * bsz];
            match kj.ids() {
                Ids::U32(v) => self.gather(rows, t.stride(), &v[r.clone()], bags, r.start),
                Ids::I64(v) => self.gather(rows, t.stride(), &v[r.clone()], bags, r.start),
            }
        };
        let nf = coll.features().len();
        match &self.pool {
            None => (0..nf).map(one).fold(0, u64::wrapping_add),
            Some(p) => p.install(|| {
                (0..nf)
                    .into_par_iter()
                    .map(one)
                    .reduce(|| 0, u64::wrapping_add)
            }),
        }
    }

    fn gather<I: RowIndex>(
        &self,
        rows: &[u8],
        stride: usize,
        ids: &[I],
        bags: &[usize],
        first: usize,
    ) -> u64 {
        let rows_in = rows.len() / stride.max(1);
        assert!(
            ids.iter().all(|i| i.idx() < rows_in),
            "ceiling ids must be rows of the table"
        );
        assert!(
            bags.windows(2).all(|w| w[0] <= w[1])
                && bags.first() == Some(&first)
                && bags.last() == Some(&(first + ids.len())),
            "bags must cover the ids in order"
        );
        let job = Job {
            rows,
            stride,
            ids,
            bags,
            first,
            prefetch: self.prefetch,
            l2: self.level == PrefetchLevel::L2,
        };
        #[cfg(target_arch = "x86_64")]
        if let Some(sum) = x86::gather(self.isa, &job) {
            return sum;
        }
        gather_portable(&job)
    }
}

/// The loop in plain Rust (no SIMD ISA, or rows wider than the SIMD loops take). Every loop
/// returns the same value: per bag, the wrapping sum of its rows' little-endian 32-bit words (a
/// row's last 1-3 bytes zero-padded to a word), and the wrapping sum of those over bags.
pub(crate) fn gather_portable<I: RowIndex>(j: &Job<'_, I>) -> u64 {
    let mut sum = 0u64;
    for b in j.bags.windows(2) {
        let mut acc = 0u32;
        for k in j.span(b) {
            if j.prefetch > 0 && k + j.prefetch < j.ids.len() {
                prefetch_row(
                    j.rows
                        .as_ptr()
                        .wrapping_add(j.ids[k + j.prefetch].idx() * j.stride),
                    j.stride,
                );
            }
            acc = acc.wrapping_add(word_sum(&j.rows[j.ids[k].idx() * j.stride..][..j.stride]));
        }
        sum = sum.wrapping_add(u64::from(acc));
    }
    sum
}

/// The wrapping sum of `b`'s little-endian 32-bit words, the last 1-3 bytes zero-padded.
#[inline(always)]
pub(crate) fn word_sum(b: &[u8]) -> u32 {
    let mut words = b.chunks_exact(4);
    let mut acc = 0u32;
    for w in &mut words {
        acc = acc.wrapping_add(u32::from_le_bytes(w.try_into().expect("4 bytes")));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 4];
        w[..rest.len()].copy_from_slice(rest);
        acc = acc.wrapping_add(u32::from_le_bytes(w));
    }
    acc
}

/// Asks the CPU to bring the cache lines of `[p, p + len)` into L1. Never faults, whatever `p`.
#[inline(always)]
fn prefetch_row(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let mut a = p as usize & !63;
        let last = (p as usize).wrapping_add(len.max(1) - 1);
        while a <= last {
            // SAFETY: prefetch is a hint; it does not fault on any address (Intel SDM, PREFETCHh).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(a as *const i8) };
            a += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_embed::{DType, EmbeddingTable, KeyedJagged};

    /// Each bag's words summed plainly: the value every loop must return.
    fn bag_sums(rows: &[u8], stride: usize, ids: &[u32], bags: &[usize]) -> u64 {
        let mut total = 0u64;
        for b in bags.windows(2) {
            let mut acc = 0u32;
            for &id in &ids[b[0]..b[1]] {
                let row = &rows[id as usize * stride..][..stride];
                for c in row.chunks(4) {
                    let mut w = [0u8; 4];
                    w[..c.len()].copy_from_slice(c);
                    acc = acc.wrapping_add(u32::from_le_bytes(w));
                }
            }
            total = total.wrapping_add(u64::from(acc));
        }
        total
    }

    #[test]
    fn every_isa_sums_the_same_bytes() {
        // Strides from 4 bytes to past the unrolled loops' 512, aligned to lines and not; bags of
        // every length, empty ones included.
        for (dim, dt) in [
            (5, DType::F32),
            (16, DType::F32),
            (64, DType::F32),
            (130, DType::F32),
            (100, DType::F32),
            (200, DType::F32),
            (7, DType::F16),
            (64, DType::Int8),
            (33, DType::Int4),
            (1, DType::Int8),
        ] {
            let rows = 300;
            let vals: Vec<f32> = (0..rows * dim).map(|i| (i as f32).sin()).collect();
            let t = EmbeddingTable::from_f32("t", rows, dim, dt, &vals).unwrap();
            let coll = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
            let lengths: Vec<usize> = (0..40).map(|b| (b * 7) % 13).collect();
            let n: usize = lengths.iter().sum();
            let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % rows as u32).collect();
            let kj = KeyedJagged::from_lengths(
                vec!["t".into()],
                lengths.len(),
                &lengths,
                Ids::U32(ids.clone()),
                None,
            )
            .unwrap();
            let stride = dt.row_bytes(dim);
            let all = coll.tables()[0].resident().unwrap();
            let bags = kj.offsets().to_vec();
            let want = bag_sums(all, stride, &ids, &bags);
            for isa in Isa::available_all() {
                for threads in [1, 2] {
                    for pf in [0, 3, 16] {
                        let got = Ceiling::new(threads, pf, isa)
                            .unwrap()
                            .run(&coll, coll.check_view(&kj).unwrap());
                        assert_eq!(got, want, "{dt} dim {dim} {isa} threads {threads} pf {pf}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_batch_of_features_sums_as_each_feature_alone() {
        // Later features' bags start past position 0 of the batch.
        let table = |name: &str, dim: usize| {
            let vals: Vec<f32> = (0..50 * dim).map(|i| (i as f32).cos()).collect();
            EmbeddingTable::from_f32(name, 50, dim, DType::F32, &vals).unwrap()
        };
        let lengths_a = [3usize, 0, 5, 2];
        let lengths_b = [1usize, 4, 0, 6];
        let ids_a: Vec<u32> = (0..10).map(|i| (i * 7) % 50).collect();
        let ids_b: Vec<u32> = (0..11).map(|i| (i * 13) % 50).collect();
        let one = |name: &str, dim: usize, lengths: &[usize], ids: &[u32]| {
            let coll = EmbeddingCollection::one_feature_per_table(vec![table(name, dim)]).unwrap();
            let kj = KeyedJagged::from_lengths(
                vec![name.into()],
                4,
                lengths,
                Ids::U32(ids.to_vec()),
                None,
            )
            .unwrap();
            (coll, kj)
        };
        let both = EmbeddingCollection::one_feature_per_table(vec![table("a", 16), table("b", 37)])
            .unwrap();
        let lengths: Vec<usize> = lengths_a.iter().chain(&lengths_b).copied().collect();
        let ids: Vec<u32> = ids_a.iter().chain(&ids_b).copied().collect();
        let kj = KeyedJagged::from_lengths(
            vec!["a".into(), "b".into()],
            4,
            &lengths,
            Ids::U32(ids),
            None,
        )
        .unwrap();
        for isa in Isa::available_all() {
            let c = Ceiling::new(1, 2, isa).unwrap();
            let (ca, ka) = one("a", 16, &lengths_a, &ids_a);
            let (cb, kb) = one("b", 37, &lengths_b, &ids_b);
            let alone = c
                .run(&ca, ca.check_view(&ka).unwrap())
                .wrapping_add(c.run(&cb, cb.check_view(&kb).unwrap()));
            assert_eq!(c.run(&both, both.check_view(&kj).unwrap()), alone, "{isa}");
        }
    }

    #[test]
    fn tuning_keeps_one_of_the_distances_tried() {
        let vals: Vec<f32> = (0..1000 * 16).map(|i| i as f32).collect();
        let t = EmbeddingTable::from_f32("t", 1000, 16, DType::F32, &vals).unwrap();
        let coll = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
        let ids: Vec<u32> = (0..640).map(|i| (i * 31) % 1000).collect();
        let kj =
            KeyedJagged::from_lengths(vec!["t".into()], 8, &[80; 8], Ids::U32(ids), None).unwrap();
        let mut c = Ceiling::new(1, 16, Isa::best()).unwrap();
        let before = c.run(&coll, coll.check_view(&kj).unwrap());
        let d = c.tune(&coll, &[coll.check_view(&kj).unwrap()], 2);
        assert!(TUNED_DISTANCES.contains(&d));
        assert_eq!(c.prefetch(), d);
        // The distance changes the speed, never the sums.
        assert_eq!(c.run(&coll, coll.check_view(&kj).unwrap()), before);
    }
}
