//! The kernels read no byte outside a table's rows. A load past the last row (a whole-register
//! load where only part of the register is the row's) gives the same sums, since lanes past the
//! row are never stored, so the property tests against the reference cannot see it: here the
//! rows lie against `PROT_NONE` guard pages, once ending where the upper guard starts and once
//! starting where the lower guard ends, and such a load kills the test with SIGSEGV.
//! (Prefetches may name any address: they never fault.)

use super::{OutRows, PoolOptions, Pooler, Rows, Segment};
use crate::dtype::DType;
use crate::isa::Isa;
use crate::table::EmbeddingTable;

/// `len` bytes between two inaccessible pages, at the start (`at_end` false) or the end of the
/// accessible region.
struct Guarded {
    map: *mut u8,
    total: usize,
    start: usize,
    len: usize,
}

impl Guarded {
    fn new(bytes: &[u8], at_end: bool) -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let body = bytes.len().div_ceil(page).max(1) * page;
        let total = body + 2 * page;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap of {total} bytes");
        let map = map.cast::<u8>();
        // SAFETY: both pages lie inside the mapping just made.
        unsafe {
            assert_eq!(libc::mprotect(map.cast(), page, libc::PROT_NONE), 0);
            assert_eq!(
                libc::mprotect(map.add(page + body).cast(), page, libc::PROT_NONE),
                0
            );
        }
        let start = if at_end {
            page + body - bytes.len()
        } else {
            page
        };
        // SAFETY: `start .. start + len` lies in the accessible pages, which nothing else uses.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.add(start), bytes.len()) };
        Guarded {
            map,
            total,
            start,
            len: bytes.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: initialised by `new`, readable and unchanged while `self` lives.
        unsafe { std::slice::from_raw_parts(self.map.add(self.start), self.len) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once.
        unsafe { libc::munmap(self.map.cast(), self.total) };
    }
}

/// Pools `bags` of `ids` over `rows` with one kernel family into a fresh output.
fn pool(
    isa: Isa,
    t: &EmbeddingTable,
    rows: &[u8],
    ids: &[u32],
    bags: &[usize],
    weights: Option<&[f32]>,
) -> Vec<f32> {
    let pooler = Pooler::new(PoolOptions {
        isa: Some(isa),
        ..Default::default()
    })
    .unwrap();
    let nbags = bags.len() - 1;
    let mut out = vec![f32::NAN; nbags * t.dim()];
    let seg = Segment {
        rows: Rows::of(rows),
        stride: t.stride(),
        dim: t.dim(),
        dtype: t.dtype(),
        ids,
        weights,
        bags,
        base: 0,
        out: OutRows {
            ptr: out.as_mut_ptr(),
            stride: t.dim(),
            dim: t.dim(),
        },
        mean: false,
        prefetch: 4,
    };
    pooler.kernel(&seg);
    out
}

#[test]
fn kernels_read_nothing_past_the_first_or_last_row() {
    let dtypes = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Int8,
        DType::Int4,
    ];
    let dims = (1..=40).chain([47, 63, 64, 65, 127, 128, 129, 130, 200]);
    for dtype in dtypes {
        for dim in dims.clone() {
            let rows = 3;
            let vals: Vec<f32> = (0..rows * dim)
                .map(|i| (i % 13) as f32 * 0.25 - 1.5)
                .collect();
            let t = EmbeddingTable::from_f32("t", rows, dim, dtype, &vals).unwrap();
            let bytes = t.resident().unwrap();
            // Every row at least once, the first and last rows last in their bags (no row after
            // them to prefetch), and an empty bag.
            let ids = [0u32, 2, 1, 2, 2, 0, 1, 0];
            let bags = [0, 2, 2, 5, 8];
            let weights = [0.5f32, 2.0, -1.0, 1.0, 0.25, 3.0, 1.5, -0.5];
            for isa in Isa::available_all() {
                for w in [None, Some(&weights[..])] {
                    let want = pool(Isa::Scalar, &t, bytes, &ids, &bags, w);
                    for at_end in [false, true] {
                        let g = Guarded::new(bytes, at_end);
                        let got = pool(isa, &t, g.bytes(), &ids, &bags, w);
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            let tol = 1e-4 * (1.0 + b.abs());
                            assert!(
                                (a - b).abs() <= tol,
                                "{isa} {dtype} dim {dim} weighted {} at_end {at_end}: \
                                 element {i} is {a}, the scalar kernel's {b}",
                                w.is_some()
                            );
                        }
                    }
                }
            }
        }
    }
}
