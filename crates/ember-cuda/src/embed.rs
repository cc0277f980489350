//! The embedding stage on the GPU: tables uploaded once, batches pooled by the NVRTC kernel in
//! one of six [`Variant`]s.
//!
//! Features are grouped by (dtype, load shape); one launch pools every bag of a group, so a
//! model with twelve f32 tables of dim 128 runs one kernel per batch, as FBGEMM's table-batched
//! embedding does.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use ember_embed::{
    CollectionId, DType, EmbeddingCollection, Ids, KeyedJagged, Pooling, ValidatedBatch,
};

use crate::device::{Gpu, TIMED, dptr};
use crate::error::{CudaError, DriverCtx, Result};
use crate::hot::HotPlan;
use crate::kernels::{DEDUP_SRC, Launch, PoolConfig, Shape};
use crate::tune::{self, TuneCache, TuneChoice};

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

    /// Whether the variant reads tables laid out with a hot region (see [`HotPlan`]).
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

/// The `FeatDesc` struct of the kernels as 7 little-endian words.
#[allow(clippy::too_many_arguments)]
fn desc_words(
    hot: u64,
    cold: u64,
    remap: u64,
    rows: usize,
    hot_rows: usize,
    stride: usize,
    dim: usize,
    out_col: usize,
    kj_feature: usize,
) -> [u64; 7] {
    let pair = |lo: usize, hi: usize| (lo as u32 as u64) | ((hi as u32 as u64) << 32);
    [
        hot,
        cold,
        remap,
        rows as u64,
        hot_rows as u64,
        pair(stride, dim),
        pair(out_col, kj_feature),
    ]
}

impl GpuEmbeddings {
    /// Uploads `coll`'s tables. With a [`HotPlan`], each table's hot rows are renumbered into
    /// one shared hot region (for [`Variant::L2Pin`] and [`Variant::Combined`]).
    pub fn upload(
        gpu: &Arc<Gpu>,
        coll: &EmbeddingCollection,
        plan: Option<&HotPlan>,
    ) -> Result<GpuEmbeddings> {
        let stream = gpu.compute();
        let tables = coll.tables();
        let rows: Vec<usize> = tables.iter().map(|t| t.rows()).collect();
        let strides: Vec<usize> = tables.iter().map(|t| t.stride()).collect();
        let empty = HotPlan::empty(tables.len());
        let plan = plan.unwrap_or(&empty);
        plan.check(&rows)?;
        for (i, t) in tables.iter().enumerate() {
            if plan.hot_rows(i) > 0 && t.rows() > i32::MAX as usize {
                return Err(CudaError::Input(format!(
                    "table {} has {} rows; renumbering for L2 pinning keeps 32-bit row maps",
                    t.name(),
                    t.rows()
                )));
            }
            if t.stride() > i32::MAX as usize || t.rows() >= 1 << 40 {
                return Err(CudaError::Input(format!(
                    "table {} is too large for the GPU kernels ({} rows of {} bytes)",
                    t.name(),
                    t.rows(),
                    t.stride()
                )));
            }
        }
        let hot_bytes = plan.hot_bytes(&strides, ALIGN);
        let mut hot_host = vec![0u8; hot_bytes];
        let mut dev = Vec::with_capacity(tables.len());
        let mut device_bytes = hot_bytes;
        let mut hot_offset = 0;
        for (t, table) in tables.iter().enumerate() {
            let data = table.resident().ok_or_else(|| {
                CudaError::Input(format!(
                    "table {} is on the SSD tier; --device cuda needs every table in memory \
                     (placement dram or mmap)",
                    table.name()
                ))
            })?;
            let stride = table.stride();
            let hot_rows = plan.hot_rows(t);
            let (cold, remap) = if hot_rows == 0 {
                (upload_bytes(gpu, data)?, None)
            } else {
                let (hot, cold) = plan.split(t, data, stride);
                hot_host[hot_offset..hot_offset + hot.len()].copy_from_slice(&hot);
                let remap = stream
                    .clone_htod(&plan.remap(t, table.rows()))
                    .ctx("uploading a row map")?;
                device_bytes += table.rows() * 4;
                (upload_bytes(gpu, &cold)?, Some(remap))
            };
            device_bytes += data.len() - hot_rows * stride;
            dev.push(DevTable {
                cold,
                remap,
                hot_offset,
                hot_rows,
                rows: table.rows(),
                stride,
            });
            hot_offset += (hot_rows * stride).next_multiple_of(ALIGN);
        }
        let hot = if hot_bytes > 0 {
            Some(upload_bytes(gpu, &hot_host)?)
        } else {
            None
        };
        let nf = coll.features().len();
        let index: HashMap<&str, usize> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name(), i))
            .collect();
        let feat_table: Vec<usize> = (0..nf).map(|f| index[coll.table_of(f).name()]).collect();
        let feat_col: Vec<usize> = (0..nf).map(|f| coll.col_offset(f)).collect();
        let feat_dim: Vec<usize> = (0..nf).map(|f| coll.table_of(f).dim()).collect();
        let mut emb = GpuEmbeddings {
            gpu: gpu.clone(),
            source: coll.id(),
            tables: dev,
            hot,
            hot_bytes,
            feat_table,
            feat_col,
            feat_dim,
            names: coll.feature_names(),
            total_dim: coll.total_dim(),
            groups: Vec::new(),
            all_descs: stream.alloc_zeros::<u64>(1).ctx("allocating")?,
            device_bytes,
        };
        // Groups: features of one dtype and load shape, in order of first appearance.
        let mut keys: Vec<(DType, Shape)> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        for f in 0..nf {
            let table = coll.table_of(f);
            let k = (table.dtype(), Shape::for_table(table.dtype(), table.dim()));
            match keys.iter().position(|x| *x == k) {
                Some(i) => members[i].push(f),
                None => {
                    keys.push(k);
                    members.push(vec![f]);
                }
            }
        }
        let all: Vec<u64> = (0..nf).flat_map(|f| emb.desc(f)).collect();
        emb.all_descs = stream
            .clone_htod(&nonempty(all))
            .ctx("uploading descriptors")?;
        for ((dtype, shape), features) in keys.into_iter().zip(members) {
            let words: Vec<u64> = features.iter().flat_map(|&f| emb.desc(f)).collect();
            let descs = stream.clone_htod(&words).ctx("uploading descriptors")?;
            emb.groups.push(Group {
                dtype,
                shape,
                features,
                descs,
            });
        }
        stream.synchronize().ctx("uploading tables")?;
        Ok(emb)
    }

    /// Feature `f`'s descriptor over the uploaded tables.
    fn desc(&self, f: usize) -> [u64; 7] {
        let stream = self.gpu.compute();
        let t = &self.tables[self.feat_table[f]];
        let hot = match &self.hot {
            Some(h) if t.hot_rows > 0 => dptr(h, stream) + t.hot_offset as u64,
            _ => 0,
        };
        let remap = t.remap.as_ref().map_or(0, |r| dptr(r, stream));
        desc_words(
            hot,
            dptr(&t.cold, stream),
            remap,
            t.rows,
            t.hot_rows,
            t.stride,
            self.feat_dim[f],
            self.feat_col[f],
            f,
        )
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Width of a pooled output row (sum of the features' dims).
    pub fn total_dim(&self) -> usize {
        self.total_dim
    }

    /// Bytes of the hot region (0 without a plan).
    pub fn hot_bytes(&self) -> usize {
        self.hot_bytes
    }

    /// Device memory the tables take.
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    /// Number of launches per batch (one per dtype and load shape).
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// A runner for `variant` with `pooling`.
    pub fn runner(&self, variant: Variant, pooling: Pooling) -> Result<EmbedRun> {
        if variant.pins_l2() && self.hot.is_none() {
            return Err(CudaError::Input(format!(
                "variant {variant} needs tables uploaded with a hot-row plan (a profile)"
            )));
        }
        let pin = if variant.pins_l2() {
            Some(self.pin_l2()?)
        } else {
            None
        };
        Ok(EmbedRun {
            gpu: self.gpu.clone(),
            variant,
            pooling,
            launches: self
                .groups
                .iter()
                .map(|_| match variant {
                    Variant::Prefetch => Launch::PREFETCH,
                    _ => Launch::BASELINE,
                })
                .collect(),
            tuned: !matches!(variant, Variant::Tuned | Variant::Combined),
            functions: HashMap::new(),
            bufs: Bufs::default(),
            batch: 0,
            n_ids: 0,
            id64: true,
            uploaded: false,
            pin,
            dedup: None,
            choices: Vec::new(),
            on_copy: false,
        })
    }

    /// Sets a persisting access-policy window over the hot region on the compute stream.
    fn pin_l2(&self) -> Result<PinInfo> {
        let gpu = &self.gpu;
        let info = gpu.info();
        let hot = self.hot.as_ref().expect("checked by the caller");
        let persisting = info.max_persisting_l2_bytes.min(self.hot_bytes);
        if persisting == 0 || info.max_window_bytes == 0 {
            return Err(CudaError::Unavailable(format!(
                "{} does not support persisting L2 accesses",
                info.name
            )));
        }
        gpu.context()
            .set_limit(
                sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
                info.max_persisting_l2_bytes,
            )
            .ctx("setting the persisting L2 size")?;
        let window = self.hot_bytes.min(info.max_window_bytes);
        let hit_ratio = (info.max_persisting_l2_bytes as f64 / window as f64).min(1.0) as f32;
        set_window(gpu, dptr(hot, gpu.compute()), window, hit_ratio)?;
        Ok(PinInfo {
            window_bytes: window,
            hit_ratio,
            persisting_bytes: info.max_persisting_l2_bytes,
        })
    }
}

/// Sets (or with `bytes == 0` clears) the compute stream's access-policy window.
fn set_window(gpu: &Gpu, base: u64, bytes: usize, hit_ratio: f32) -> Result<()> {
    // SAFETY: a zeroed launch-attribute value is a valid (empty) union; we then set the
    // access-policy member, the one the attribute id below reads.
    let mut v: sys::CUstreamAttrValue = unsafe { std::mem::zeroed() };
    v.accessPolicyWindow = sys::CUaccessPolicyWindow {
        base_ptr: base as *mut std::ffi::c_void,
        num_bytes: bytes,
        hitRatio: hit_ratio,
        hitProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_PERSISTING,
        missProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_STREAMING,
    };
    gpu.context().bind_to_thread().ctx("binding the context")?;
    // SAFETY: a live stream of the bound context and a fully initialised value.
    unsafe {
        sys::cuStreamSetAttribute(
            gpu.compute().cu_stream(),
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
            &v,
        )
    }
    .result()
    .ctx("setting the L2 access-policy window")
}

/// What [`Variant::L2Pin`] set up.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PinInfo {
    pub window_bytes: usize,
    pub hit_ratio: f32,
    pub persisting_bytes: usize,
}

fn nonempty<T: Default>(mut v: Vec<T>) -> Vec<T> {
    if v.is_empty() {
        v.push(T::default());
    }
    v
}

fn upload_bytes(gpu: &Gpu, data: &[u8]) -> Result<CudaSlice<u8>> {
    // Pad to the alignment so that every part starts aligned and no allocation is empty.
    let len = data.len().next_multiple_of(ALIGN).max(ALIGN);
    let stream = gpu.compute();
    let mut buf = stream.alloc_zeros::<u8>(len).ctx("allocating a table")?;
    if !data.is_empty() {
        stream
            .memcpy_htod(data, &mut buf.slice_mut(..data.len()))
            .ctx("uploading a table")?;
    }
    Ok(buf)
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
    fn ensure(&mut self, gpu: &Gpu, len: usize) -> Result<&mut CudaSlice<T>> {
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

    fn ptr(&self, gpu: &Gpu) -> u64 {
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
}

impl Drop for EmbedRun {
    fn drop(&mut self) {
        if self.pin.is_some() {
            // Clear the window so that later work on the stream is not steered, and release
            // the persisting lines.
            let _ = set_window(&self.gpu, 0, 0, 0.0);
            // SAFETY: a plain driver call on the bound context.
            let _ = unsafe { sys::cuCtxResetPersistingL2Cache() };
            let _ = self
                .gpu
                .context()
                .set_limit(sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0);
        }
    }
}

impl EmbedRun {
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Uploads go through the copy stream; the caller makes the compute stream wait for them.
    pub(crate) fn upload_on_copy_stream(&mut self) {
        self.on_copy = true;
    }

    /// Uses `launch` for every group instead of the variant's choice (tests run every launch
    /// the tuner can pick).
    pub fn force_launch(&mut self, launch: Launch) {
        self.launches.iter_mut().for_each(|l| *l = launch);
        self.functions.clear();
        self.tuned = true;
    }

    /// Samples in the uploaded batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    fn upload_stream(&self) -> Arc<cudarc::driver::CudaStream> {
        if self.on_copy {
            self.gpu.copy().clone()
        } else {
            self.gpu.compute().clone()
        }
    }

    /// The L2 window, for the pinning variants.
    pub fn pin_info(&self) -> Option<PinInfo> {
        self.pin
    }

    /// Validates `kj` against the collection `coll` that `emb` was uploaded from, and copies
    /// its offsets, ids and weights to the device.
    pub fn upload(
        &mut self,
        emb: &GpuEmbeddings,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
    ) -> Result<()> {
        self.uploaded = false;
        let valid = coll.validate(kj)?;
        self.upload_valid(emb, valid)
    }

    /// Copies the offsets, ids and weights of a batch validated against the collection `emb`
    /// was uploaded from (checked once upstream, not again) to the device.
    pub fn upload_valid(&mut self, emb: &GpuEmbeddings, batch: ValidatedBatch<'_>) -> Result<()> {
        // Until this upload completes, nothing may be launched over half-replaced buffers.
        self.uploaded = false;
        let kj = batch.get();
        if batch.collection() != emb.source || kj.keys() != emb.names.as_slice() {
            return Err(CudaError::Input(
                "the collection is not the one these tables were uploaded from".into(),
            ));
        }
        if self.pooling == Pooling::WeightedSum && kj.weights().is_none() {
            return Err(CudaError::Input(
                "weighted_sum pooling needs per-id weights in the batch".into(),
            ));
        }
        let gpu = self.gpu.clone();
        let stream = &self.upload_stream();
        // Dedup's hash table has next_pow2(2n) slots numbered in 32 bits: n < 2^31.
        if kj.batch_size() > i32::MAX as usize / 2 || kj.num_ids() >= 1 << 31 {
            return Err(CudaError::Input(format!(
                "a batch of {} samples and {} ids is too large for one launch (at most 2^31 ids)",
                kj.batch_size(),
                kj.num_ids()
            )));
        }
        self.batch = kj.batch_size();
        self.n_ids = kj.num_ids();
        let offsets: Vec<i64> = kj.offsets().iter().map(|&o| o as i64).collect();
        let o = self.bufs.offsets.ensure(&gpu, offsets.len())?;
        stream
            .memcpy_htod(&offsets, &mut o.slice_mut(..offsets.len()))
            .ctx("uploading offsets")?;
        match kj.ids() {
            Ids::I64(v) => {
                self.id64 = true;
                let b = self.bufs.ids64.ensure(&gpu, v.len())?;
                if !v.is_empty() {
                    stream
                        .memcpy_htod(v, &mut b.slice_mut(..v.len()))
                        .ctx("uploading ids")?;
                }
            }
            Ids::U32(v) => {
                self.id64 = false;
                let b = self.bufs.ids32.ensure(&gpu, v.len())?;
                if !v.is_empty() {
                    stream
                        .memcpy_htod(v, &mut b.slice_mut(..v.len()))
                        .ctx("uploading ids")?;
                }
            }
        }
        if let (Pooling::WeightedSum, Some(w)) = (self.pooling, kj.weights())
            && !w.is_empty()
        {
            let b = self.bufs.weights.ensure(&gpu, w.len())?;
            stream
                .memcpy_htod(w, &mut b.slice_mut(..w.len()))
                .ctx("uploading weights")?;
        }
        self.bufs
            .out
            .ensure(&gpu, self.batch * emb.total_dim.max(1))?;
        if self.variant == Variant::Dedup {
            self.prepare_dedup(emb, &offsets)?;
        }
        self.uploaded = true;
        Ok(())
    }

    /// Per batch: where each feature's distinct rows go in the compact buffer, and the
    /// descriptors that pool from there.
    fn prepare_dedup(&mut self, emb: &GpuEmbeddings, offsets: &[i64]) -> Result<()> {
        let gpu = self.gpu.clone();
        let stream = &self.upload_stream();
        let nf = emb.feat_table.len();
        let b = self.batch;
        let d = self.dedup.get_or_insert_with(DedupBufs::default);
        let feat_start: Vec<i64> = (0..=nf).map(|f| offsets[f * b]).collect();
        let mut cap_start = vec![0i64; nf + 1];
        let mut compact_off = vec![0usize; nf];
        let mut bytes = 0usize;
        for f in 0..nf {
            let t = &emb.tables[emb.feat_table[f]];
            let n_f = (feat_start[f + 1] - feat_start[f]) as usize;
            let cap = n_f.min(t.rows);
            cap_start[f + 1] = cap_start[f] + cap as i64;
            compact_off[f] = bytes;
            bytes += (cap * t.stride).next_multiple_of(ALIGN);
        }
        let n = self.n_ids;
        d.cap = (2 * n).max(64).next_power_of_two();
        d.cap_total = cap_start[nf] as usize;
        d.keys.ensure(&gpu, d.cap)?;
        d.number.ensure(&gpu, d.cap)?;
        d.slot_of.ensure(&gpu, n)?;
        d.uniq.ensure(&gpu, n)?;
        d.inverse.ensure(&gpu, n)?;
        d.counts.ensure(&gpu, nf)?;
        let compact_base = dptr(d.compact.ensure(&gpu, bytes)?, gpu.compute());
        let ptrs: Vec<u64> = compact_off
            .iter()
            .map(|&o| compact_base + o as u64)
            .collect();
        let upload_i64 = |g: &mut Grow<i64>, v: &[i64]| -> Result<()> {
            let buf = g.ensure(&gpu, v.len())?;
            stream
                .memcpy_htod(v, &mut buf.slice_mut(..v.len()))
                .ctx("uploading dedup bounds")
        };
        upload_i64(&mut d.feat_start, &feat_start)?;
        upload_i64(&mut d.cap_start, &cap_start)?;
        let p = d.compact_ptrs.ensure(&gpu, ptrs.len())?;
        if !ptrs.is_empty() {
            stream
                .memcpy_htod(&ptrs, &mut p.slice_mut(..ptrs.len()))
                .ctx("uploading dedup bounds")?;
        }
        d.group_descs.resize_with(emb.groups.len(), Grow::default);
        for (g, group) in emb.groups.iter().enumerate() {
            let words: Vec<u64> = group
                .features
                .iter()
                .flat_map(|&f| {
                    let t = &emb.tables[emb.feat_table[f]];
                    desc_words(
                        0,
                        ptrs[f],
                        0,
                        (cap_start[f + 1] - cap_start[f]) as usize,
                        0,
                        t.stride,
                        emb.feat_dim[f],
                        emb.feat_col[f],
                        f,
                    )
                })
                .collect();
            let buf = d.group_descs[g].ensure(&gpu, words.len())?;
            stream
                .memcpy_htod(&words, &mut buf.slice_mut(..words.len()))
                .ctx("uploading dedup descriptors")?;
        }
        Ok(())
    }

    fn config(&self, emb: &GpuEmbeddings, g: usize, launch: Launch, id64: bool) -> PoolConfig {
        let group = &emb.groups[g];
        PoolConfig {
            dtype: group.dtype,
            shape: group.shape,
            launch,
            id64,
            pooling: self.pooling,
            // Dedup pools from compact rows, which are never renumbered.
            pin: emb.hot.is_some() && self.variant != Variant::Dedup,
        }
    }

    fn function(
        &mut self,
        emb: &GpuEmbeddings,
        g: usize,
        launch: Launch,
        id64: bool,
    ) -> Result<CudaFunction> {
        let cfg = self.config(emb, g, launch, id64);
        self.gpu
            .function(&cfg.name(), || cfg.source(), &cfg.options(), "ember_pool")
    }

    /// The ids the pool kernel reads: the batch's, or the dedup inverse.
    fn pool_ids(&self) -> (u64, bool) {
        let gpu = &self.gpu;
        if self.variant == Variant::Dedup {
            let d = self.dedup.as_ref().expect("prepared at upload");
            (d.inverse.ptr(gpu), false)
        } else if self.id64 {
            (self.bufs.ids64.ptr(gpu), true)
        } else {
            (self.bufs.ids32.ptr(gpu), false)
        }
    }

    /// Enqueues group `g`'s pooling with `func` and `launch`.
    fn launch_group(
        &self,
        emb: &GpuEmbeddings,
        g: usize,
        func: &CudaFunction,
        launch: Launch,
    ) -> Result<()> {
        let gpu = &self.gpu;
        let stream = gpu.compute();
        let group = &emb.groups[g];
        let bags = group.features.len() * self.batch;
        if bags == 0 {
            return Ok(());
        }
        let bags_per_block = (launch.block / group.shape.lanes) as usize;
        let blocks = bags.div_ceil(bags_per_block);
        let descs = match (&self.dedup, self.variant) {
            (Some(d), Variant::Dedup) => d.group_descs[g].ptr(gpu),
            _ => dptr(&group.descs, stream),
        };
        let n_feat = group.features.len() as i32;
        let batch = self.batch as i32;
        let offsets = self.bufs.offsets.ptr(gpu);
        let (ids, _) = self.pool_ids();
        let weights = self.bufs.weights.ptr(gpu);
        let out = self.bufs.out.ptr(gpu);
        let stride = emb.total_dim as i32;
        let mut b = stream.launch_builder(func);
        b.arg(&descs)
            .arg(&n_feat)
            .arg(&batch)
            .arg(&offsets)
            .arg(&ids)
            .arg(&weights)
            .arg(&out)
            .arg(&stride);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (launch.block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `ember_pool`'s signature (pointers as u64, ints as i32);
        // descriptors point into live tables; offsets, ids and weights hold the uploaded
        // (validated) batch, and `out` has batch x total_dim floats.
        unsafe { b.launch(cfg) }.ctx("launching the pooled lookup")?;
        Ok(())
    }

    /// Enqueues the dedup passes (hash, number, inverse, gather) for the uploaded batch.
    fn launch_dedup(&self, emb: &GpuEmbeddings) -> Result<()> {
        let gpu = &self.gpu;
        let stream = gpu.compute();
        let d = self.dedup.as_ref().expect("prepared at upload");
        let n = self.n_ids as i64;
        if n == 0 {
            return Ok(());
        }
        let nf = emb.feat_table.len() as i32;
        // SAFETY: the buffers hold at least `cap` keys and `nf` counts.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                d.keys.ptr(gpu),
                0xff,
                d.cap * 8,
                stream.cu_stream(),
            )
            .ctx("clearing the dedup table")?;
            cudarc::driver::result::memset_d8_async(
                d.counts.ptr(gpu),
                0,
                emb.feat_table.len() * 4,
                stream.cu_stream(),
            )
            .ctx("clearing the dedup counts")?;
        }
        let f = |name: &str| gpu.function("dedup.cu", || DEDUP_SRC.to_string(), &[], name);
        let grid = |threads: i64| LaunchConfig {
            grid_dim: ((threads as u64).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (feat_start, keys, slot_of) =
            (d.feat_start.ptr(gpu), d.keys.ptr(gpu), d.slot_of.ptr(gpu));
        let mask = (d.cap - 1) as u64;
        let cap = d.cap as u64;
        let (number, counts, uniq, inverse) = (
            d.number.ptr(gpu),
            d.counts.ptr(gpu),
            d.uniq.ptr(gpu),
            d.inverse.ptr(gpu),
        );
        let insert = if self.id64 {
            f("ember_dedup_insert64")?
        } else {
            f("ember_dedup_insert32")?
        };
        let ids = if self.id64 {
            self.bufs.ids64.ptr(gpu)
        } else {
            self.bufs.ids32.ptr(gpu)
        };
        // The four launches: arguments match the kernels in dedup.cu; the table has `cap` (a
        // power of two, at least 2n) slots, so probing ends; buffers are sized at upload for
        // this batch.
        let mut b = stream.launch_builder(&insert);
        b.arg(&feat_start)
            .arg(&nf)
            .arg(&ids)
            .arg(&n)
            .arg(&keys)
            .arg(&mask)
            .arg(&slot_of);
        // SAFETY: arguments match dedup.cu's kernel; buffers are sized for this batch.
        unsafe { b.launch(grid(n)) }.ctx("launching dedup insert")?;
        let number_k = f("ember_dedup_number")?;
        let mut b = stream.launch_builder(&number_k);
        b.arg(&keys)
            .arg(&cap)
            .arg(&feat_start)
            .arg(&counts)
            .arg(&number)
            .arg(&uniq);
        // SAFETY: arguments match dedup.cu's kernel; buffers are sized for this batch.
        unsafe { b.launch(grid(cap as i64)) }.ctx("launching dedup number")?;
        let inverse_k = f("ember_dedup_inverse")?;
        let mut b = stream.launch_builder(&inverse_k);
        b.arg(&slot_of).arg(&number).arg(&n).arg(&inverse);
        // SAFETY: arguments match dedup.cu's kernel; buffers are sized for this batch.
        unsafe { b.launch(grid(n)) }.ctx("launching dedup inverse")?;
        if d.cap_total > 0 {
            let gather = f("ember_dedup_gather")?;
            let (descs, cap_start, ptrs) = (
                dptr(&emb.all_descs, stream),
                d.cap_start.ptr(gpu),
                d.compact_ptrs.ptr(gpu),
            );
            let mut b = stream.launch_builder(&gather);
            b.arg(&descs)
                .arg(&nf)
                .arg(&cap_start)
                .arg(&feat_start)
                .arg(&counts)
                .arg(&uniq)
                .arg(&ptrs);
            // SAFETY: arguments match dedup.cu's kernel; buffers are sized for this batch.
            unsafe { b.launch(grid(d.cap_total as i64 * 32)) }.ctx("launching dedup gather")?;
        }
        Ok(())
    }

    /// Chooses each group's launch for the tuned variants: from `cache` when it knows this
    /// device, group and workload class, else by timing the candidates on the uploaded batch
    /// (and recording the winner in `cache`).
    pub fn tune(&mut self, emb: &GpuEmbeddings, cache: &mut TuneCache) -> Result<()> {
        if self.tuned {
            return Ok(());
        }
        if !self.uploaded {
            return Err(CudaError::Input(
                "upload a representative batch before tuning".into(),
            ));
        }
        let combined = self.variant == Variant::Combined;
        let device = format!(
            "{} sm_{}{}",
            self.gpu.info().name,
            self.gpu.info().compute_capability.0,
            self.gpu.info().compute_capability.1
        );
        let mean_bag = self.n_ids as f64 / (self.batch * emb.feat_table.len()).max(1) as f64;
        self.choices = vec![None; emb.groups.len()];
        for g in 0..emb.groups.len() {
            let (_, id64) = self.pool_ids();
            let dims: Vec<usize> = emb.groups[g]
                .features
                .iter()
                .map(|&f| emb.feat_dim[f])
                .collect();
            let key = tune::key(
                &device,
                &self.config(emb, g, Launch::BASELINE, id64),
                &dims,
                self.batch,
                mean_bag,
                combined,
            );
            let choice = match cache.get(&key) {
                Some(c) => *c,
                None => {
                    let baseline = self.time_group(emb, g, Launch::BASELINE, id64)?;
                    let mut best = (Launch::BASELINE, baseline);
                    // Candidates that compile to the same registers and block as one already
                    // timed are the same kernel: skipped.
                    let mut seen = std::collections::HashSet::new();
                    for l in tune::occupancy_grid(1) {
                        if let Some(t) = self.try_time(emb, g, l, id64, &mut seen)?
                            && t < best.1
                        {
                            best = (l, t);
                        }
                    }
                    if combined {
                        for l in tune::prefetch_grid(best.0) {
                            if let Some(t) = self.try_time(emb, g, l, id64, &mut seen)?
                                && t < best.1
                            {
                                best = (l, t);
                            }
                        }
                    }
                    let c = TuneChoice {
                        launch: best.0,
                        micros: best.1,
                        baseline_micros: baseline,
                    };
                    cache.insert(key, c);
                    c
                }
            };
            self.launches[g] = choice.launch;
            self.choices[g] = Some(choice);
        }
        self.tuned = true;
        Ok(())
    }

    /// Times a candidate; `None` when it is a kernel already timed (same block, registers and
    /// prefetch depth) or cannot launch (too many registers for the block).
    fn try_time(
        &mut self,
        emb: &GpuEmbeddings,
        g: usize,
        l: Launch,
        id64: bool,
        seen: &mut std::collections::HashSet<(u32, i32, u32)>,
    ) -> Result<Option<f64>> {
        let regs = self
            .function(emb, g, l, id64)?
            .num_regs()
            .ctx("reading the register count")?;
        if !seen.insert((l.block, regs, l.prefetch)) {
            return Ok(None);
        }
        match self.time_group(emb, g, l, id64) {
            Ok(t) => Ok(Some(t)),
            Err(CudaError::Driver { source, .. })
                if source.0 == sys::cudaError_enum::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Median microseconds of one launch of group `g` with `launch` (after a warm-up).
    fn time_group(
        &mut self,
        emb: &GpuEmbeddings,
        g: usize,
        launch: Launch,
        id64: bool,
    ) -> Result<f64> {
        let func = self.function(emb, g, launch, id64)?;
        let stream = self.gpu.compute().clone();
        let ctx = self.gpu.context().clone();
        if self.variant == Variant::Dedup {
            self.launch_dedup(emb)?;
        }
        self.launch_group(emb, g, &func, launch)?;
        let mut times = Vec::new();
        for _ in 0..5 {
            let start = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            let end = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            start.record(&stream).ctx("recording an event")?;
            for _ in 0..4 {
                self.launch_group(emb, g, &func, launch)?;
            }
            end.record(&stream).ctx("recording an event")?;
            end.synchronize().ctx("timing a launch")?;
            times.push(f64::from(start.elapsed_ms(&end).ctx("timing a launch")?) * 1000.0 / 4.0);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Enqueues the pooling of the uploaded batch on the compute stream (tuning first where
    /// the variant asks for it and nothing is cached: in memory only).
    pub fn launch(&mut self, emb: &GpuEmbeddings) -> Result<()> {
        if !self.uploaded {
            return Err(CudaError::Input("no batch uploaded".into()));
        }
        // Raw driver calls (the dedup memsets) use the thread's current context.
        self.gpu
            .context()
            .bind_to_thread()
            .ctx("binding the context")?;
        if !self.tuned {
            self.tune(emb, &mut TuneCache::in_memory())?;
        }
        if self.variant == Variant::Dedup {
            self.launch_dedup(emb)?;
        }
        let (_, id64) = self.pool_ids();
        for g in 0..emb.groups.len() {
            let launch = self.launches[g];
            let func = match self.functions.get(&(g, id64)) {
                Some(f) => f.clone(),
                None => {
                    let f = self.function(emb, g, launch, id64)?;
                    self.functions.insert((g, id64), f.clone());
                    f
                }
            };
            self.launch_group(emb, g, &func, launch)?;
        }
        Ok(())
    }

    /// The pooled output of the last launch on the device (`batch x total_dim`, row-major).
    pub(crate) fn output_ptr(&self) -> u64 {
        self.bufs.out.ptr(&self.gpu)
    }

    /// Waits for the launch and copies the pooled output into `out` (`batch x total_dim`).
    pub fn download(&self, emb: &GpuEmbeddings, out: &mut [f32]) -> Result<()> {
        let need = self.batch * emb.total_dim;
        if out.len() != need {
            return Err(CudaError::Input(format!(
                "output has {} floats, the batch needs {need}",
                out.len()
            )));
        }
        if need == 0 {
            return Ok(());
        }
        let stream = self.gpu.compute();
        let buf = self.bufs.out.0.as_ref().expect("allocated at upload");
        stream
            .memcpy_dtoh(&buf.slice(..need), out)
            .ctx("downloading the pooled output")?;
        stream.synchronize().ctx("pooling")
    }

    /// Upload, launch and download in one call.
    pub fn pool(
        &mut self,
        emb: &GpuEmbeddings,
        coll: &EmbeddingCollection,
        kj: &KeyedJagged,
        out: &mut [f32],
    ) -> Result<()> {
        self.upload(emb, coll, kj)?;
        self.launch(emb)?;
        self.download(emb, out)
    }

    /// Median microseconds of one whole launch (every group, and the dedup passes) of the
    /// uploaded batch, over `reps` timings of `iters` launches each.
    pub fn time(&mut self, emb: &GpuEmbeddings, iters: usize, reps: usize) -> Result<f64> {
        self.launch(emb)?;
        let stream = self.gpu.compute().clone();
        let ctx = self.gpu.context().clone();
        let mut times = Vec::new();
        for _ in 0..reps.max(1) {
            let start = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            let end = ctx.new_event(Some(TIMED)).ctx("creating an event")?;
            start.record(&stream).ctx("recording an event")?;
            for _ in 0..iters.max(1) {
                self.launch(emb)?;
            }
            end.record(&stream).ctx("recording an event")?;
            end.synchronize().ctx("timing")?;
            times.push(
                f64::from(start.elapsed_ms(&end).ctx("timing")?) * 1000.0 / iters.max(1) as f64,
            );
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Each launch group's kernel: shape, launch, registers, occupancy, tuning times.
    pub fn kernel_stats(&mut self, emb: &GpuEmbeddings) -> Result<Vec<KernelStats>> {
        let (_, id64) = self.pool_ids();
        let mut v = Vec::new();
        for (g, group) in emb.groups.iter().enumerate() {
            let launch = self.launches[g];
            let func = self.function(emb, g, launch, id64)?;
            let regs = func.num_regs().ctx("reading the register count")?;
            let local = func.local_size_bytes().ctx("reading the local memory")?;
            let blocks = func
                .occupancy_max_active_blocks_per_multiprocessor(launch.block, 0, None)
                .ctx("reading the occupancy")?;
            let choice = self.choices.get(g).copied().flatten();
            v.push(KernelStats {
                dtype: group.dtype.to_string(),
                features: group.features.len(),
                vec: group.shape.vec,
                lanes: group.shape.lanes,
                chunks: group.shape.chunks,
                block: launch.block,
                max_regs: launch.max_regs,
                prefetch: launch.prefetch,
                registers: regs,
                local_bytes: local,
                blocks_per_sm: blocks,
                occupancy: f64::from(blocks * launch.block)
                    / self.gpu.info().max_threads_per_sm.max(1) as f64,
                tuned_micros: choice.map(|c| c.micros),
                baseline_micros: choice.map(|c| c.baseline_micros),
            });
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
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
        let w = desc_words(1, 2, 3, 500_000, 17, 512, 128, 256, 5);
        assert_eq!(&w[..5], &[1, 2, 3, 500_000, 17]);
        // stride, dim / out_col, kj_feature as little-endian int pairs.
        assert_eq!(w[5] & 0xffff_ffff, 512);
        assert_eq!(w[5] >> 32, 128);
        assert_eq!(w[6] & 0xffff_ffff, 256);
        assert_eq!(w[6] >> 32, 5);
        assert_eq!(std::mem::size_of_val(&w), 56);
    }
}
