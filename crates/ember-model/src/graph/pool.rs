//! Buffers of f32 reused between a thread's graph runs.
//!
//! Why: the binary's allocator (mimalloc, purge delay 0, `crates/ember-cli/src/main.rs`) hands
//! freed memory back to the OS at once, so every large buffer allocated afresh is zeroed page by
//! page by the kernel on first touch: on `dcn_mlperf` at batch 256 that was 52% of the graph's
//! time (`perf`: `clear_page_erms`). A thread's runs instead take their values' buffers from, and
//! give them back to, this pool: after the first run of a batch size, a run faults no pages. The
//! pool holds at most [`KEEP`] buffers of each element type (a graph's largest working set, per
//! thread that runs it). int64 values are kept too: a sequence model's masks, allocated and
//! freed each run, faulted in pages that cost DIN's int8 graph more than its masks' ops did.

use std::cell::RefCell;

/// The most buffers a thread keeps.
const KEEP: usize = 48;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    /// The int64 values' (a sequence's mask and its comparisons, `[B, L]` each).
    static FREE_I64: RefCell<Vec<Vec<i64>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for `cap` values: the smallest kept one that fits, else a new one.
pub(super) fn take(cap: usize) -> Vec<f32> {
    let mut v = kept(cap);
    v.clear();
    v
}

/// [`take`] for int64 values.
pub(super) fn take_i64(cap: usize) -> Vec<i64> {
    let mut v = FREE_I64.with_borrow_mut(|free| best(free, cap));
    v.clear();
    v
}

/// A buffer of `n` values, whatever they are (an earlier run's where the buffer is kept), for a
/// writer that sets every one: nothing is zeroed but what the kept buffer never held. (A
/// concatenation of a sequence model's four `[B, L, D]` parts zeroed its 13 MB output first, on
/// one thread: 12% of DIN's int8 graph at batch 256, `perf`.)
pub(super) fn scratch(n: usize) -> Vec<f32> {
    let mut v = kept(n);
    if v.len() >= n {
        v.truncate(n);
    } else {
        v.resize(n, 0.0);
    }
    v
}

/// The smallest kept buffer of at least `cap` values' room, as it was given back; else a new one.
fn kept(cap: usize) -> Vec<f32> {
    FREE.with_borrow_mut(|free| best(free, cap))
}

fn best<T>(free: &mut Vec<Vec<T>>, cap: usize) -> Vec<T> {
    let best = free
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= cap)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i);
    match best {
        Some(i) => free.swap_remove(i),
        None => Vec::with_capacity(cap),
    }
}

/// A buffer of `n` zeros.
pub(super) fn zeros(n: usize) -> Vec<f32> {
    let mut v = take(n);
    v.resize(n, 0.0);
    v
}

/// Gives a buffer back (when the pool is full, the smallest of the pool and it is dropped).
pub(super) fn give(v: Vec<f32>) {
    FREE.with_borrow_mut(|free| keep(free, v));
}

/// [`give`] for int64 values.
pub(super) fn give_i64(v: Vec<i64>) {
    FREE_I64.with_borrow_mut(|free| keep(free, v));
}

/// A tensor's buffer back to its pool.
pub(super) fn give_data(d: super::tensor::Data) {
    match d {
        super::tensor::Data::F32(v) => give(v),
        super::tensor::Data::I64(v) => give_i64(v),
    }
}

fn keep<T>(free: &mut Vec<Vec<T>>, v: Vec<T>) {
    if v.capacity() * size_of::<T>() < 4096 {
        return;
    }
    free.push(v);
    if free.len() > KEEP {
        let i = (0..free.len())
            .min_by_key(|&i| free[i].capacity())
            .unwrap_or(0);
        free.swap_remove(i);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_buffer_given_back_is_taken_again() {
        let v = super::zeros(5000);
        let p = v.as_ptr();
        super::give(v);
        let w = super::take(4000);
        assert!(w.is_empty() && w.capacity() >= 5000);
        assert_eq!(w.as_ptr(), p, "the kept buffer is reused");
        assert_eq!(super::zeros(10), vec![0.0; 10]);
    }
}
