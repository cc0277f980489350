//! The memory ceiling: the simplest loop that gathers the same rows as a pooled lookup, over the
//! same tables and ids, and sums their bytes, with the same software prefetch and threads but no
//! bags, no decoding and no output. Benchmarks report Ember as a fraction of it, so users see how
//! close the kernels come to what the machine's memory system allows.

use ember_embed::{EmbedError, EmbeddingCollection, Ids, Isa, Result, ValidatedBatch};
use rayon::prelude::*;

// The ceiling shares no code with the kernels it measures (its own id trait and prefetch, the
// same few lines as `ember-embed`'s): a bug or a slowdown there must not lower the bar too.

/// A row id as the loop reads it (u32 or i64, validated).
trait RowIndex: Copy + Send + Sync {
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

/// Asks the CPU to bring the cache lines of `[p, p + len)` into L1, as the kernels do. Never
/// faults, whatever `p`.
#[inline(always)]
fn prefetch_span(p: *const u8, len: usize) {
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

/// Runs the ceiling loop on a fixed number of threads.
#[derive(Debug)]
pub struct Ceiling {
    pool: Option<rayon::ThreadPool>,
    prefetch: usize,
    isa: Isa,
}

impl Ceiling {
    /// A ceiling loop with `threads` threads and a prefetch distance of `prefetch` ids.
    pub fn new(threads: usize, prefetch: usize, isa: Isa) -> Result<Self> {
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .map_err(|e| EmbedError::ThreadPool {
                        threads,
                        reason: e.to_string(),
                    })?,
            )
        } else {
            None
        };
        Ok(Ceiling {
            pool,
            prefetch,
            isa: isa.require()?,
        })
    }

    /// Gathers every id of `batch` (each feature over its table) and returns a checksum of the
    /// bytes, so the work cannot be optimised away. Tables on the SSD tier (no resident rows)
    /// are skipped.
    pub fn run(&self, coll: &EmbeddingCollection, batch: ValidatedBatch<'_>) -> u64 {
        assert_eq!(
            batch.collection(),
            coll.id(),
            "the ceiling gathers a batch validated against its own collection"
        );
        let kj = batch.get();
        let one = |f: usize| -> u64 {
            let t = coll.table_of(f);
            let Some(rows) = t.resident() else {
                return 0;
            };
            let r = kj.feature_range(f);
            match kj.ids() {
                Ids::U32(v) => self.gather(rows, t.stride(), &v[r]),
                Ids::I64(v) => self.gather(rows, t.stride(), &v[r]),
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

    fn gather<I: RowIndex>(&self, rows: &[u8], stride: usize, ids: &[I]) -> u64 {
        let rows_in = rows.len() / stride.max(1);
        assert!(
            ids.iter().all(|i| i.idx() < rows_in),
            "ceiling ids must be rows of the table"
        );
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512 {
            // SAFETY: AVX-512 was checked by `Isa::require`; every id is a row (asserted above).
            return unsafe { gather_avx512(rows, stride, ids, self.prefetch) };
        }
        gather_portable(rows, stride, ids, self.prefetch)
    }
}

fn gather_portable<I: RowIndex>(rows: &[u8], stride: usize, ids: &[I], pf: usize) -> u64 {
    let mut sum = 0u64;
    for (j, id) in ids.iter().enumerate() {
        if pf > 0 && j + pf < ids.len() {
            prefetch_span(
                rows.as_ptr().wrapping_add(ids[j + pf].idx() * stride),
                stride,
            );
        }
        let row = &rows[id.idx() * stride..][..stride];
        let mut words = row.chunks_exact(8);
        for w in &mut words {
            sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        for &b in words.remainder() {
            sum = sum.wrapping_add(u64::from(b));
        }
    }
    sum
}

/// # Safety
/// AVX-512 F/BW must be available and every id must be a row of `rows`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gather_avx512<I: RowIndex>(rows: &[u8], stride: usize, ids: &[I], pf: usize) -> u64 {
    use std::arch::x86_64::*;
    let base = rows.as_ptr();
    let mut acc = _mm512_setzero_si512();
    let tail = stride % 64;
    let tail_mask: u64 = if tail == 0 { 0 } else { (1u64 << tail) - 1 };
    for j in 0..ids.len() {
        if pf > 0 && j + pf < ids.len() {
            // SAFETY: j + pf < len.
            prefetch_span(
                base.wrapping_add(unsafe { ids.get_unchecked(j + pf) }.idx() * stride),
                stride,
            );
        }
        // SAFETY: j < len and the id is a row (caller's contract).
        let row = unsafe { base.add(ids.get_unchecked(j).idx() * stride) };
        let mut off = 0;
        while off + 64 <= stride {
            // SAFETY: 64 bytes inside the row.
            acc = _mm512_add_epi32(acc, unsafe { _mm512_loadu_si512(row.add(off).cast()) });
            off += 64;
        }
        if tail != 0 {
            // SAFETY: the masked load reads only the row's last `tail` bytes.
            acc = _mm512_add_epi32(acc, unsafe {
                _mm512_maskz_loadu_epi8(tail_mask, row.add(off).cast())
            });
        }
    }
    _mm512_reduce_add_epi32(acc) as u32 as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_embed::{DType, EmbeddingTable, KeyedJagged};

    #[test]
    fn every_isa_sums_the_same_bytes() {
        let vals: Vec<f32> = (0..300 * 5).map(|i| (i as f32).sin()).collect();
        for dt in DType::ALL {
            let t = EmbeddingTable::from_f32("t", 300, 5, dt, &vals).unwrap();
            let coll = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
            let ids: Vec<u32> = (0..1000).map(|i| (i * 7919) % 300).collect();
            let kj = KeyedJagged::from_lengths(
                vec!["t".into()],
                1,
                &[1000],
                Ids::U32(ids.clone()),
                None,
            )
            .unwrap();
            let stride = dt.row_bytes(5);
            // The byte sum, computed plainly, in 32-bit lanes as the SIMD loop folds it.
            let mut lanes = [0u32; 16];
            for &id in &ids {
                let all = coll.tables()[0].resident().unwrap();
                let row = &all[id as usize * stride..(id as usize + 1) * stride];
                for chunk in row.chunks(64) {
                    let mut buf = [0u8; 64];
                    buf[..chunk.len()].copy_from_slice(chunk);
                    for (l, w) in buf.chunks_exact(4).enumerate() {
                        lanes[l] = lanes[l].wrapping_add(u32::from_le_bytes(w.try_into().unwrap()));
                    }
                }
            }
            let want = lanes.iter().fold(0u32, |a, &b| a.wrapping_add(b)) as u64;
            let portable: u64 =
                gather_portable(coll.tables()[0].resident().unwrap(), stride, &ids, 4);
            for isa in Isa::available_all() {
                for threads in [1, 2] {
                    let got = Ceiling::new(threads, 8, isa)
                        .unwrap()
                        .run(&coll, coll.validate(&kj).unwrap());
                    if isa == Isa::Avx512 {
                        assert_eq!(got, want, "{dt} {isa}");
                    } else {
                        assert_eq!(got, portable, "{dt} {isa}");
                    }
                }
            }
        }
    }
}
