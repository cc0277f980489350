//! Device copies of a history cache's segments ([`DevHeld`], in HBM): a segment uploaded for
//! one request, or computed by one, stays on the device under a byte budget, least recently
//! used out first, keyed by the host segment it copies (segments never change; a dropped
//! one's copy is dropped at the next insert).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::CudaSlice;
use ember_model::hstu::cache::Segment;

/// Device copies of the cache's segments, by the host segment they copy.
#[derive(Debug, Default)]
pub(super) struct DevHeld {
    map: HashMap<usize, Copy1>,
    bytes: usize,
    clock: u64,
}

#[derive(Debug)]
struct Copy1 {
    seg: Weak<Segment>,
    buf: Arc<CudaSlice<f32>>,
    used: u64,
}

impl DevHeld {
    /// The copy of `seg`, if the device holds it. An entry's `Weak` keeps its segment's
    /// allocation, so no other segment can be at that address while the entry stands.
    pub(super) fn get(&mut self, seg: &Arc<Segment>) -> Option<Arc<CudaSlice<f32>>> {
        self.clock += 1;
        let c = self.map.get_mut(&(Arc::as_ptr(seg) as usize))?;
        c.used = self.clock;
        Some(c.buf.clone())
    }

    /// Keeps `buf` as `seg`'s copy, then drops the copies of dropped segments and, least
    /// recently used first, others until `budget` bytes are held (`buf` itself too if it
    /// alone is over).
    pub(super) fn put(&mut self, seg: &Arc<Segment>, buf: Arc<CudaSlice<f32>>, budget: usize) {
        self.clock += 1;
        self.bytes += buf.len() * 4;
        let c = Copy1 {
            seg: Arc::downgrade(seg),
            buf,
            used: self.clock,
        };
        if let Some(old) = self.map.insert(Arc::as_ptr(seg) as usize, c) {
            self.bytes -= old.buf.len() * 4;
        }
        let mut freed = 0;
        self.map.retain(|_, c| {
            let live = c.seg.strong_count() > 0;
            if !live {
                freed += c.buf.len() * 4;
            }
            live
        });
        self.bytes -= freed;
        while self.bytes > budget {
            let Some((&k, _)) = self.map.iter().min_by_key(|(_, c)| c.used) else {
                break;
            };
            let c = self.map.remove(&k).expect("found");
            self.bytes -= c.buf.len() * 4;
        }
    }

    /// Bytes of device memory held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `held` locked (a panic while it was held left nothing half-written that matters).
pub(super) fn lock(held: &Mutex<DevHeld>) -> MutexGuard<'_, DevHeld> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}
