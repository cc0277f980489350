//! Page-locked host buffers that a batch is staged in before its copy to the device.
//!
//! A copy from pageable memory goes through the driver's bounce buffer, and CUDA synchronizes
//! the stream before it starts, so the copy of one batch cannot run beside another's compute.
//! From page-locked memory the copy engine reads the bytes itself, at the link's rate, while
//! the host goes on. Each runner (and each predictor slot) owns its buffers; the caller waits
//! for the event recorded after its last copies before it writes them again.

use std::sync::Arc;

use cudarc::driver::{CudaContext, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use rayon::prelude::*;

use crate::error::{DriverCtx, Result};

/// A page-locked host buffer that grows as batches need (to a power of two). By default it is
/// write-combined: fast for the host to write and the copy engine to read, slow for the host to
/// read; [`Pinned::readable`] is cached, for what the device writes back.
#[derive(Debug)]
pub(crate) struct Pinned<T> {
    buf: Option<PinnedHostSlice<T>>,
    flags: u32,
}

impl<T> Default for Pinned<T> {
    fn default() -> Self {
        Pinned {
            buf: None,
            flags: cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED,
        }
    }
}

impl<T> Pinned<T> {
    /// A buffer the host reads (cached page-locked memory).
    pub(crate) fn readable() -> Self {
        Pinned {
            buf: None,
            flags: 0,
        }
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> Pinned<T> {
    /// Its first `len` elements. The caller has waited for the last copy out of the buffer.
    pub(crate) fn get(&mut self, ctx: &Arc<CudaContext>, len: usize) -> Result<&mut [T]> {
        if self.buf.as_ref().is_none_or(|b| b.len() < len.max(1)) {
            self.buf = None; // free first
            let cap = len.max(1).next_power_of_two();
            // SAFETY: `alloc_pinned_with_flags` returns `cap` uninitialised elements; they are
            // zeroed before any slice of them is made, and zero bytes are a valid `T`
            // (`ValidAsZeroBits`).
            let mut buf = unsafe { ctx.alloc_pinned_with_flags::<T>(cap, self.flags) }
                .ctx("allocating pinned memory")?;
            let p = buf.as_mut_ptr().ctx("allocating pinned memory")?;
            // SAFETY: `p` points to `cap` elements of this fresh allocation, which nothing else
            // refers to yet.
            unsafe { std::ptr::write_bytes(p, 0, cap) };
            self.buf = Some(buf);
        }
        let buf = self.buf.as_mut().expect("allocated above");
        Ok(&mut buf.as_mut_slice().ctx("staging a batch")?[..len])
    }

    /// Its first `len` elements, as the last [`Pinned::get`] of at least `len` left them. The
    /// caller has waited for the device's writes into it.
    pub(crate) fn peek(&self, len: usize) -> Result<&[T]> {
        match &self.buf {
            Some(b) if b.len() >= len => Ok(&b.as_slice().ctx("reading a batch")?[..len]),
            _ => Err(crate::error::CudaError::Input(format!(
                "reading {len} values from a page-locked buffer that was never filled"
            ))),
        }
    }
}

/// Elements below which one thread fills a buffer (a thread hand-off costs more).
const PARALLEL_FROM: usize = 1 << 17;

/// `dst[i] = f(src[i])`, split across rayon's threads for large inputs. `dst` is usually
/// write-combined page-locked memory: written once, in order per thread, never read.
pub(crate) fn fill<S, D>(dst: &mut [D], src: &[S], f: impl Fn(S) -> D + Sync)
where
    S: Copy + Sync,
    D: Send,
{
    assert_eq!(
        dst.len(),
        src.len(),
        "staging buffer and source differ in length"
    );
    let each = |(d, s): (&mut [D], &[S])| {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = f(s);
        }
    };
    if src.len() < PARALLEL_FROM {
        each((dst, src));
    } else {
        let chunk = PARALLEL_FROM / 2;
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(each);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_converts_every_element_at_every_size() {
        for n in [
            0usize,
            1,
            7,
            PARALLEL_FROM - 1,
            PARALLEL_FROM,
            3 * PARALLEL_FROM + 5,
        ] {
            let src: Vec<i64> = (0..n as i64).map(|i| i * 7 % 1_000_003).collect();
            let mut dst = vec![u32::MAX; n];
            fill(&mut dst, &src, |v| v as u32);
            assert!(
                dst.iter().zip(&src).all(|(&d, &s)| d as i64 == s),
                "n = {n}"
            );
        }
    }
}
