//! [`GpuEmbeddings`]: a collection's tables uploaded once (the hot rows of a [`HotPlan`]
//! renumbered into one region for the pinning variants), its features grouped into launches, and
//! the runners that pool batches over them.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use ember_embed::{DType, EmbeddingCollection, EmbeddingTable, Pooling};

use super::{ALIGN, Bufs, DevTable, EmbedRun, GpuEmbeddings, Group, Variant};
use crate::device::{Gpu, dptr};
use crate::error::{CudaError, DriverCtx, Result};
use crate::hot::HotPlan;
use crate::kernels::{Launch, Shape};

/// A feature's descriptor: the kernels' `FeatDesc` (`kernels/dedup.cu`). `hot` and `remap`
/// are null where the table has no hot region or no renumbering.
#[derive(Debug, Clone, Copy)]
pub(super) struct FeatDesc {
    pub hot: u64,
    pub cold: u64,
    pub remap: u64,
    pub rows: usize,
    pub hot_rows: usize,
    pub stride: usize,
    pub dim: usize,
    pub out_col: usize,
    pub kj_feature: usize,
}

impl FeatDesc {
    /// The struct as the kernels read it: 7 little-endian words.
    pub(super) fn words(&self) -> [u64; 7] {
        let pair = |lo: usize, hi: usize| (lo as u32 as u64) | ((hi as u32 as u64) << 32);
        [
            self.hot,
            self.cold,
            self.remap,
            self.rows as u64,
            self.hot_rows as u64,
            pair(self.stride, self.dim),
            pair(self.out_col, self.kj_feature),
        ]
    }
}

impl GpuEmbeddings {
    /// The features' names, in the order a batch must list them.
    pub(crate) fn feature_names(&self) -> &[String] {
        &self.names
    }

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
        let planned = plan.is_some();
        let plan = plan.unwrap_or(&empty);
        plan.check(&rows)?;
        check_table_sizes(tables, plan)?;
        let hot_bytes = plan.hot_bytes(&strides, ALIGN);
        let mut hot_host = vec![0u8; hot_bytes];
        let mut dev = Vec::with_capacity(tables.len());
        let mut device_bytes = hot_bytes;
        let mut hot_offset = 0;
        for (t, table) in tables.iter().enumerate() {
            let (uploaded, bytes) = upload_table(gpu, plan, t, table, &mut hot_host, hot_offset)?;
            device_bytes += bytes;
            hot_offset += (uploaded.hot_rows * uploaded.stride).next_multiple_of(ALIGN);
            dev.push(uploaded);
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
            planned,
            feat_table,
            feat_col,
            feat_dim,
            names: coll.feature_names(),
            total_dim: coll.total_dim(),
            groups: Vec::new(),
            all_descs: stream.alloc_zeros::<u64>(1).ctx("allocating")?,
            device_bytes,
        };
        emb.upload_descriptors(coll)?;
        stream.synchronize().ctx("uploading tables")?;
        Ok(emb)
    }

    /// Uploads every feature's descriptor (`all_descs`), and groups the features for launches
    /// (`groups`, each with its descriptors): features of one dtype and load shape, in order of
    /// first appearance.
    fn upload_descriptors(&mut self, coll: &EmbeddingCollection) -> Result<()> {
        let nf = coll.features().len();
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
        let gpu = self.gpu.clone();
        let stream = gpu.compute();
        let all: Vec<u64> = (0..nf).flat_map(|f| self.desc(f)).collect();
        self.all_descs = stream
            .clone_htod(&nonempty(all))
            .ctx("uploading descriptors")?;
        for ((dtype, shape), features) in keys.into_iter().zip(members) {
            let words: Vec<u64> = features.iter().flat_map(|&f| self.desc(f)).collect();
            let descs = stream.clone_htod(&words).ctx("uploading descriptors")?;
            self.groups.push(Group {
                dtype,
                shape,
                features,
                descs,
            });
        }
        Ok(())
    }

    /// Feature `f`'s descriptor over the uploaded tables.
    pub(super) fn desc(&self, f: usize) -> [u64; 7] {
        let stream = self.gpu.compute();
        let t = &self.tables[self.feat_table[f]];
        let hot = match &self.hot {
            Some(h) if t.hot_rows > 0 => dptr(h, stream) + t.hot_offset as u64,
            _ => 0,
        };
        let remap = t.remap.as_ref().map_or(0, |r| dptr(r, stream));
        FeatDesc {
            hot,
            cold: dptr(&t.cold, stream),
            remap,
            rows: t.rows,
            hot_rows: t.hot_rows,
            stride: t.stride,
            dim: self.feat_dim[f],
            out_col: self.feat_col[f],
            kj_feature: f,
        }
        .words()
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
        if variant.pins_l2() && !self.planned {
            return Err(CudaError::Input(format!(
                "variant {variant} needs tables uploaded with a hot-row plan (a profile)"
            )));
        }
        // A plan that found nothing hot (an empty profile) pins nothing: no window is set.
        let pin = if variant.pins_l2() && self.hot.is_some() {
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
            narrow_ids: true,
        })
    }
}

/// Refuses tables the kernels cannot address: over 2^31 - 1 bytes a row or 2^40 rows, or
/// over 2^31 - 1 rows with hot rows in `plan` (its row maps are 32-bit).
fn check_table_sizes(tables: &[EmbeddingTable], plan: &HotPlan) -> Result<()> {
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
    Ok(())
}

/// Uploads table `t` of `plan`: all its rows, or with hot rows its cold rows and its row map,
/// its hot rows copied into the host's hot region (`hot_host` at `hot_offset`). Returns it and
/// the device bytes it takes beside the hot region.
fn upload_table(
    gpu: &Arc<Gpu>,
    plan: &HotPlan,
    t: usize,
    table: &EmbeddingTable,
    hot_host: &mut [u8],
    hot_offset: usize,
) -> Result<(DevTable, usize)> {
    // A live table (row updates) is copied as it is now; later updates reach only the host
    // copy.
    let rows = table.rows_ref().ok_or_else(|| {
        CudaError::Input(format!(
            "table {} is placed {}; --device cuda needs every table in memory \
             (placement dram or mmap)",
            table.name(),
            table.placement()
        ))
    })?;
    let data: &[u8] = &rows;
    let stride = table.stride();
    let hot_rows = plan.hot_rows(t);
    let mut device_bytes = 0;
    let (cold, remap) = if hot_rows == 0 {
        (upload_bytes(gpu, data)?, None)
    } else {
        let (hot, cold) = plan.split(t, data, stride);
        hot_host[hot_offset..hot_offset + hot.len()].copy_from_slice(&hot);
        let remap = gpu
            .compute()
            .clone_htod(&plan.remap(t, table.rows()))
            .ctx("uploading a row map")?;
        device_bytes += table.rows() * 4;
        (upload_bytes(gpu, &cold)?, Some(remap))
    };
    device_bytes += data.len() - hot_rows * stride;
    let uploaded = DevTable {
        cold,
        remap,
        hot_offset,
        hot_rows,
        rows: table.rows(),
        stride,
    };
    Ok((uploaded, device_bytes))
}

pub(super) fn nonempty<T: Default>(mut v: Vec<T>) -> Vec<T> {
    if v.is_empty() {
        v.push(T::default());
    }
    v
}

pub(super) fn upload_bytes(gpu: &Gpu, data: &[u8]) -> Result<CudaSlice<u8>> {
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
