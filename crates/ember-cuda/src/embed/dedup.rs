//! The dedup variant on the GPU: per batch, each feature's distinct ids are found with a hash
//! table, their rows gathered once into a compact buffer, and the bags pooled from there through
//! the inverse index.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::tables::FeatDesc;
use super::{ALIGN, DedupBufs, EmbedRun, GpuEmbeddings, Grow};
use crate::device::dptr;
use crate::error::{DriverCtx, Result};
use crate::kernels::DEDUP_SRC;

impl EmbedRun {
    /// Per batch: where each feature's distinct rows go in the compact buffer, and the
    /// descriptors that pool from there.
    pub(super) fn prepare_dedup(&mut self, emb: &GpuEmbeddings, offsets: &[usize]) -> Result<()> {
        let gpu = self.gpu.clone();
        let stream = &self.upload_stream();
        let nf = emb.feat_table.len();
        let b = self.batch;
        let d = self.dedup.get_or_insert_with(DedupBufs::default);
        let feat_start: Vec<i64> = (0..=nf).map(|f| offsets[f * b] as i64).collect();
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
                    FeatDesc {
                        hot: 0,
                        cold: ptrs[f],
                        remap: 0,
                        rows: (cap_start[f + 1] - cap_start[f]) as usize,
                        hot_rows: 0,
                        stride: t.stride,
                        dim: emb.feat_dim[f],
                        out_col: emb.feat_col[f],
                        kj_feature: f,
                    }
                    .words()
                })
                .collect();
            let buf = d.group_descs[g].ensure(&gpu, words.len())?;
            stream
                .memcpy_htod(&words, &mut buf.slice_mut(..words.len()))
                .ctx("uploading dedup descriptors")?;
        }
        Ok(())
    }

    /// Enqueues the dedup passes (hash, number, inverse, gather) for the uploaded batch.
    pub(super) fn launch_dedup(&self, emb: &GpuEmbeddings) -> Result<()> {
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
}
