//! What a kernel pools: a [`Segment`] (consecutive bags of one feature over one row buffer), the
//! [`Rows`] it reads and the [`OutRows`] it writes.

use crate::dtype::DType;

/// The output pointer shared by the units of one call.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: units write disjoint (feature columns x bag rows) regions of the output, so sharing the
// base pointer between threads never lets two threads write the same float.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Output rows of one unit: row `i` is `dim` floats at `ptr + i * stride`.
#[derive(Clone, Copy)]
pub(crate) struct OutRows {
    pub(super) ptr: *mut f32,
    pub(super) stride: usize,
    pub(super) dim: usize,
}

impl OutRows {
    /// Pointer to the output of bag `i` of the unit.
    #[inline(always)]
    pub(crate) fn row_ptr(&self, i: usize) -> *mut f32 {
        self.ptr.wrapping_add(i * self.stride)
    }

    /// The output of bag `i`.
    ///
    /// # Safety
    /// `i` must be a bag of this unit, and no other reference to that row may be alive.
    #[inline(always)]
    pub(crate) unsafe fn row_mut<'a>(&self, i: usize) -> &'a mut [f32] {
        // SAFETY: `check_call` verified the output holds batch_size x total_dim floats, the unit's
        // rows and columns lie inside it, and the caller promises exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.row_ptr(i), self.dim) }
    }
}

/// The row bytes a segment reads: a table, a deduplicated unit's compact buffer, or a row
/// cache's slab, whose other slots the cache may write meanwhile. Hence a pointer and a length
/// rather than a slice, which would claim that no byte of it changes.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    ptr: *const u8,
    len: usize,
    _life: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Rows<'a> {
    /// Rows of a slice.
    pub(crate) fn of(rows: &'a [u8]) -> Self {
        Rows {
            ptr: rows.as_ptr(),
            len: rows.len(),
            _life: std::marker::PhantomData,
        }
    }

    /// Rows of a cache slab.
    ///
    /// # Safety
    /// While `'a` lasts, nothing writes the rows that the segment's ids name (the slots its batch
    /// holds); the slab outlives `'a`.
    pub(crate) unsafe fn of_slab(slab: &'a crate::staged::Slab) -> Self {
        Rows {
            ptr: slab.as_ptr(),
            len: slab.len(),
            _life: std::marker::PhantomData,
        }
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes `start .. start + n`.
    ///
    /// # Safety
    /// They must be a row the segment's ids name (which nothing writes during `'a`).
    #[inline(always)]
    pub(crate) unsafe fn bytes(&self, start: usize, n: usize) -> &'a [u8] {
        assert!(
            start <= self.len && n <= self.len - start,
            "row outside the rows"
        );
        // SAFETY: in bounds (asserted) of memory valid for `'a`; the caller names a row that
        // nothing writes meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), n) }
    }
}

/// A run of consecutive bags of one feature over one row buffer: what every kernel pools.
pub(crate) struct Segment<'a, I> {
    /// Row bytes (a table, the compact buffer of a deduplicated unit, or a cache's slab).
    pub rows: Rows<'a>,
    pub stride: usize,
    pub dim: usize,
    pub dtype: DType,
    /// The ids of these bags back to back; `ids[k]` is the id at batch position `base + k`.
    pub ids: &'a [I],
    pub weights: Option<&'a [f32]>,
    /// Bag boundaries as batch positions (`nbags + 1` entries).
    pub bags: &'a [usize],
    pub base: usize,
    pub out: OutRows,
    pub mean: bool,
    pub prefetch: usize,
}

impl<'a, I> Segment<'a, I> {
    /// The same bags over other rows and ids: a deduplicated unit's compact buffer and inverse
    /// index.
    pub(super) fn over<'b, J>(
        &self,
        rows: Rows<'b>,
        ids: &'b [J],
        prefetch: usize,
    ) -> Segment<'b, J>
    where
        'a: 'b,
    {
        Segment {
            rows,
            stride: self.stride,
            dim: self.dim,
            dtype: self.dtype,
            ids,
            weights: self.weights,
            bags: self.bags,
            base: self.base,
            out: self.out,
            mean: self.mean,
            prefetch,
        }
    }

    pub(crate) fn nbags(&self) -> usize {
        self.bags.len() - 1
    }
    /// Local id range of bag `i`.
    #[inline(always)]
    pub(crate) fn bag(&self, i: usize) -> (usize, usize) {
        (self.bags[i] - self.base, self.bags[i + 1] - self.base)
    }
    /// Multiplier applied to a finished bag of `len` ids.
    #[inline(always)]
    pub(crate) fn scale(&self, len: usize) -> f32 {
        if self.mean && len > 0 {
            1.0 / len as f32
        } else {
            1.0
        }
    }
}
