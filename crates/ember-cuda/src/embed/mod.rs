//! The embedding stage on the GPU: tables uploaded once, batches pooled by the NVRTC kernel in
//! one of six [`Variant`]s.
//!
//! Features are grouped by (dtype, load shape); one launch pools every bag of a group, so a
//! model with twelve f32 tables of dim 128 runs one kernel per batch, as FBGEMM's table-batched
//! embedding does.
//!
//! The types are defined here; their code lives beside them, one concern a file:
//!
//! | file | what |
//! |---|---|
//! | `tables.rs` | [`GpuEmbeddings`]: tables uploaded (hot rows renumbered), launch groups, runners |
//! | `pin.rs` | L2 pinning: the persisting access-policy window over the hot rows |
//! | `run.rs` | [`EmbedRun`]: a batch uploaded, launched, read back, timed |
//! | `dedup.rs` | the dedup variant: distinct ids on the GPU, their rows gathered once |
//! | `tuning.rs` | the autotuner's timing of a group's candidate launches |

mod dedup;
mod pin;
mod run;
mod tables;
mod tuning;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice};
use ember_embed::{CollectionId, DType, Pooling};

use crate::device::{Gpu, dptr};
use crate::error::{CudaError, DriverCtx, Result};
use crate::kernels::{Launch, Shape};
use crate::staging::Pinned;
use crate::tune::TuneChoice;

/// Device allocations of a table part start at this alignment (16-byte loads need 16).
const ALIGN: usize = 256;

/// Which kernel pools a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// 256 threads per block, compiler-chosen registers, one row in flight per lane.
    Baseline,
    /// Block size and register cap chosen by the autotuner for the group and workload.
    Tuned,
    /// The baseline with four rows loaded ahead per lane (register prefetch).
    Prefetch,
    /// The baseline over tables whose hot rows are renumbered into one region that a
    /// persisting L2 access-policy window covers.
    L2Pin,
    /// Autotuned block, registers and prefetch depth, over L2-pinned tables.
    Combined,
    /// Each feature's distinct ids found on the GPU (hash table), their rows copied once into
    /// a compact buffer, then pooled from there.
    Dedup,
}

impl Variant {
    pub const ALL: [Variant; 6] = [
        Variant::Baseline,
        Variant::Tuned,
        Variant::Prefetch,
        Variant::L2Pin,
        Variant::Combined,
        Variant::Dedup,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "baseline",
            Variant::Tuned => "tuned",
            Variant::Prefetch => "prefetch",
            Variant::L2Pin => "l2pin",
            Variant::Combined => "combined",
            Variant::Dedup => "dedup",
        }
    }

    /// Whether the variant reads tables laid out with a hot region (see [`crate::HotPlan`]).
    pub fn pins_l2(self) -> bool {
        matches!(self, Variant::L2Pin | Variant::Combined)
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Variant {
    type Err = CudaError;
    fn from_str(s: &str) -> Result<Variant> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                CudaError::Input(format!(
                    "'{s}' is not a GPU variant (baseline, tuned, prefetch, l2pin, combined, dedup)"
                ))
            })
    }
}

/// One table on the device.
#[derive(Debug)]
struct DevTable {
    /// Rows not in the hot region, in their original order (all rows when nothing is hot).
    cold: CudaSlice<u8>,
    /// Old id -> new id, where rows were renumbered.
    remap: Option<CudaSlice<i32>>,
    hot_offset: usize,
    hot_rows: usize,
    rows: usize,
    stride: usize,
}

/// Features pooled by one launch.
#[derive(Debug)]
struct Group {
    dtype: DType,
    shape: Shape,
    features: Vec<usize>,
    /// Their descriptors (`FeatDesc`, 7 words each) over the tables.
    descs: CudaSlice<u64>,
}

/// A collection's tables on the device.
#[derive(Debug)]
pub struct GpuEmbeddings {
    gpu: Arc<Gpu>,
    /// The collection the tables came from: only its batches are pooled.
    source: CollectionId,
    tables: Vec<DevTable>,
    hot: Option<CudaSlice<u8>>,
    hot_bytes: usize,
    /// Whether a [`HotPlan`](crate::HotPlan) was given (its hot set may be empty).
    planned: bool,
    /// Per feature: its table, output column and dim.
    feat_table: Vec<usize>,
    feat_col: Vec<usize>,
    feat_dim: Vec<usize>,
    names: Vec<String>,
    total_dim: usize,
    groups: Vec<Group>,
    /// Descriptors of every feature in batch order (the dedup gather reads tables through them).
    all_descs: CudaSlice<u64>,
    device_bytes: usize,
}

/// A device buffer that grows as batches need.
#[derive(Debug)]
struct Grow<T>(Option<CudaSlice<T>>);

impl<T> Default for Grow<T> {
    fn default() -> Self {
        Grow(None)
    }
}

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> Grow<T> {
    pub(super) fn ensure(&mut self, gpu: &Gpu, len: usize) -> Result<&mut CudaSlice<T>> {
        let len = len.max(1);
        if self.0.as_ref().is_none_or(|b| b.len() < len) {
            self.0 = None; // free first
            let cap = len.next_power_of_two();
            self.0 = Some(gpu.compute().alloc_zeros::<T>(cap).ctx("allocating")?);
            // Allocation is ordered on the compute stream; copies into the buffer may run on
            // the copy stream. Growing is rare: wait for it.
            gpu.compute().synchronize().ctx("allocating")?;
        }
        Ok(self.0.as_mut().expect("just allocated"))
    }

    pub(super) fn ptr(&self, gpu: &Gpu) -> u64 {
        self.0.as_ref().map_or(0, |b| dptr(b, gpu.compute()))
    }
}

#[derive(Debug, Default)]
struct Bufs {
    offsets: Grow<i64>,
    ids64: Grow<i64>,
    ids32: Grow<u32>,
    weights: Grow<f32>,
    out: Grow<f32>,
    /// The page-locked copies of the batch that the uploads read ([`crate::staging`]).
    host: HostBufs,
    /// Recorded after the last uploads: the host buffers may be written again once it fired.
    staged: Option<CudaEvent>,
}

impl Drop for Bufs {
    fn drop(&mut self) {
        // The page-locked buffers are freed after this: no copy may still be reading them.
        if let Some(e) = &self.staged {
            let _ = e.synchronize();
        }
    }
}

#[derive(Debug, Default)]
struct HostBufs {
    offsets: Pinned<i64>,
    ids64: Pinned<i64>,
    ids32: Pinned<u32>,
    weights: Pinned<f32>,
}

/// Scratch of the dedup variant.
#[derive(Debug, Default)]
struct DedupBufs {
    keys: Grow<u64>,
    slot_of: Grow<u32>,
    number: Grow<u32>,
    counts: Grow<u32>,
    uniq: Grow<i64>,
    inverse: Grow<u32>,
    compact: Grow<u8>,
    compact_ptrs: Grow<u64>,
    cap_start: Grow<i64>,
    feat_start: Grow<i64>,
    group_descs: Vec<Grow<u64>>,
    cap: usize,
    cap_total: usize,
}

/// What [`Variant::L2Pin`] set up.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PinInfo {
    pub window_bytes: usize,
    pub hit_ratio: f32,
    pub persisting_bytes: usize,
}

/// What a launch group's kernel is (registers and occupancy as the driver reports them).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelStats {
    pub dtype: String,
    pub features: usize,
    pub vec: u32,
    pub lanes: u32,
    pub chunks: u32,
    pub block: u32,
    pub max_regs: u32,
    pub prefetch: u32,
    pub registers: i32,
    pub local_bytes: i32,
    pub blocks_per_sm: u32,
    /// Resident warps per SM over the SM's maximum.
    pub occupancy: f64,
    /// Autotuner: the chosen launch's and the baseline's time in microseconds, where tuned.
    pub tuned_micros: Option<f64>,
    pub baseline_micros: Option<f64>,
}

/// Pools batches over a [`GpuEmbeddings`] with one [`Variant`]: upload a batch, launch, read
/// the output back (or leave it on the device for the model).
#[derive(Debug)]
pub struct EmbedRun {
    gpu: Arc<Gpu>,
    variant: Variant,
    pooling: Pooling,
    /// Per group.
    launches: Vec<Launch>,
    tuned: bool,
    /// (group, id64) -> function.
    functions: HashMap<(usize, bool), CudaFunction>,
    bufs: Bufs,
    batch: usize,
    n_ids: usize,
    id64: bool,
    uploaded: bool,
    pin: Option<PinInfo>,
    dedup: Option<DedupBufs>,
    choices: Vec<Option<TuneChoice>>,
    /// Whether uploads go through the copy stream (the caller orders them with events).
    on_copy: bool,
    /// Whether 64-bit ids are sent as 32-bit ones when every table's rows allow (half the
    /// bytes over the link); tests turn it off to run the 64-bit kernels.
    narrow_ids: bool,
}

#[cfg(test)]
mod tests {
    use super::tables::FeatDesc;
    use super::*;

    #[test]
    fn variants_parse_by_name_and_refuse_others() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>().unwrap(), v);
        }
        let e = "fast".parse::<Variant>().unwrap_err().to_string();
        assert!(e.contains("'fast'") && e.contains("combined"), "{e}");
        assert!(Variant::L2Pin.pins_l2() && Variant::Combined.pins_l2());
        assert!(!Variant::Tuned.pins_l2());
    }

    #[test]
    fn descriptors_pack_like_the_kernels_struct() {
        let w = FeatDesc {
            hot: 1,
            cold: 2,
            remap: 3,
            rows: 500_000,
            hot_rows: 17,
            stride: 512,
            dim: 128,
            out_col: 256,
            kj_feature: 5,
        }
        .words();
        assert_eq!(&w[..5], &[1, 2, 3, 500_000, 17]);
        // stride, dim / out_col, kj_feature as little-endian int pairs.
        assert_eq!(w[5] & 0xffff_ffff, 512);
        assert_eq!(w[5] >> 32, 128);
        assert_eq!(w[6] & 0xffff_ffff, 256);
        assert_eq!(w[6] >> 32, 5);
        assert_eq!(std::mem::size_of_val(&w), 56);
    }
}
