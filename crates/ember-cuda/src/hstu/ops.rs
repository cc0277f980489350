//! The launches the HSTU pass is made of: gathers, norms, adds, the MLPs and linear layers
//! (cuBLAS SGEMM in f32, cuBLASLt in bf16), and the launch shapes.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use ember_model::hstu::attention::Seq;

use super::predictor::GpuHstuPredictor;
use super::{DevMlp, DevNorm, GpuHstu};
use crate::device::dptr;
use crate::error::{DriverCtx, Result};
use crate::model::lt::{LtCall, Out};
use crate::model::{DevLinear, sgemm_xwt};

/// Rows of f32 on the device: the first at `ptr`, the next `ld` values on.
#[derive(Debug, Clone, Copy)]
pub(super) struct DevRows {
    pub ptr: u64,
    pub ld: usize,
}

/// `len` entries on the device at `ptr` (a null `ptr` where a launch takes none: see each).
#[derive(Debug, Clone, Copy)]
pub(super) struct DevList {
    pub ptr: u64,
    pub len: usize,
}

impl GpuHstuPredictor {
    /// `out[r] = emb[rows[r] or r, pair columns summed]` for the `rows.len` rows (`rows[r]`
    /// where `rows.ptr` is not null) and the `pairs.len` column pairs, `td` values a column.
    pub(super) fn gather(
        &self,
        emb: DevRows,
        rows: DevList,
        pairs: DevList,
        td: usize,
        out: u64,
    ) -> Result<()> {
        let (
            DevRows {
                ptr: emb,
                ld: total,
            },
            DevList { ptr: rows, len: n },
        ) = (emb, rows);
        let DevList {
            ptr: pairs,
            len: segs,
        } = pairs;
        let count = (n * segs * td) as i64;
        if count == 0 {
            return Ok(());
        }
        let (total_i, n_i, segs_i, td_i) = (total as i32, n as i32, segs as i32, td as i32);
        let s = self.m.gpu.compute();
        let mut b = s.launch_builder(&self.k.gather);
        b.arg(&emb)
            .arg(&total_i)
            .arg(&rows)
            .arg(&n_i)
            .arg(&pairs)
            .arg(&segs_i)
            .arg(&td_i)
            .arg(&out);
        // SAFETY: emb [_, total] with every row named (rows < the batch's tokens, or r < n);
        // pairs 2 x segs columns (+ td <= total) or -1; out [n, segs x td].
        unsafe { b.launch(grid(count)) }.ctx("launching a gather")?;
        Ok(())
    }

    /// `out[r] = [x[rows[r]] | extra[r]]` for the `rows.len` rows: `x.ld` values of `x`, then
    /// `extra.ld` of `extra` (0 for none).
    pub(super) fn rows(&self, x: DevRows, rows: DevList, extra: DevRows, out: u64) -> Result<()> {
        let (DevRows { ptr: x, ld: d }, DevList { ptr: rows, len: n }) = (x, rows);
        let (extra, ne) = (extra.ptr, extra.ld as i32);
        let count = (n * (d + ne as usize)) as i64;
        let (d_i, n_i) = (d as i32, n as i32);
        let s = self.m.gpu.compute();
        let mut b = s.launch_builder(&self.k.rows);
        b.arg(&x)
            .arg(&d_i)
            .arg(&rows)
            .arg(&n_i)
            .arg(&extra)
            .arg(&ne)
            .arg(&out);
        // SAFETY: x [t, d] with rows < t; extra [n, ne]; out [n, d + ne].
        unsafe { b.launch(grid(count)) }.ctx("launching a row gather")?;
        Ok(())
    }

    /// `x += y` over `n` values.
    pub(super) fn add(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let n = n as i64;
        let s = self.m.gpu.compute();
        let mut b = s.launch_builder(&self.k.add);
        b.arg(&x).arg(&y).arg(&n);
        // SAFETY: x and y hold n floats.
        unsafe { b.launch(grid(n)) }.ctx("launching an add")?;
        Ok(())
    }

    /// A layer norm (or SwishLayerNorm) of `rows` rows of `n` values from `x` to `y` (which may
    /// be `x`).
    pub(super) fn norm_rows(
        &self,
        x: DevRows,
        y: DevRows,
        norm: &DevNorm,
        rows: usize,
        n: usize,
        swish: bool,
    ) -> Result<()> {
        let (DevRows { ptr: x, ld: ldx }, DevRows { ptr: y, ld: ldy }) = (x, y);
        if rows == 0 {
            return Ok(());
        }
        let s = self.m.gpu.compute();
        let (w, bb) = (dptr(&norm.w, s), dptr(&norm.b, s));
        let (ldx, ldy, rows_i, n_i, sw) = (
            ldx as i32,
            ldy as i32,
            rows as i32,
            n as i32,
            i32::from(swish),
        );
        let mut b = s.launch_builder(&self.k.norm);
        b.arg(&x)
            .arg(&ldx)
            .arg(&y)
            .arg(&ldy)
            .arg(&w)
            .arg(&bb)
            .arg(&norm.eps)
            .arg(&rows_i)
            .arg(&n_i)
            .arg(&sw);
        // SAFETY: x [rows, ldx] and y [rows, ldy] with n <= both; the norm has n weights.
        unsafe { b.launch(warp_rows(rows)) }.ctx("launching a norm")?;
        Ok(())
    }

    /// `Linear -> SwishLayerNorm -> Linear [-> LayerNorm]` of `rows` rows of `x` into `y`.
    pub(super) fn mlp(
        &mut self,
        mlp: &DevMlp,
        x: u64,
        rows: usize,
        hidden: u64,
        y: u64,
        x16: u64,
    ) -> Result<()> {
        let hid = mlp.first.n_out;
        self.linear(&mlp.first, x, rows, hidden, x16, true)?;
        let h = DevRows {
            ptr: hidden,
            ld: hid,
        };
        self.norm_rows(h, h, &mlp.swish, rows, hid, true)?;
        self.linear(&mlp.second, hidden, rows, y, x16, true)?;
        if let Some(n) = &mlp.norm {
            let out = mlp.second.n_out;
            let y = DevRows { ptr: y, ld: out };
            self.norm_rows(y, y, n, rows, out, false)?;
        }
        Ok(())
    }

    /// `y = x W^T (+ b when bias)` for `rows` rows: cuBLAS SGEMM (and a bias kernel) in f32;
    /// in bf16, `x` cast into `x16` and cuBLASLt with the bias in its epilogue.
    pub(super) fn linear(
        &mut self,
        l: &DevLinear,
        x: u64,
        rows: usize,
        y: u64,
        x16: u64,
        bias: bool,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let s = self.m.gpu.compute().clone();
        if let Some(lt) = self.lt.as_mut() {
            let n = (rows * l.n_in) as i64;
            let mut b = s.launch_builder(&self.k.to_bf16);
            b.arg(&x).arg(&x16).arg(&n);
            // SAFETY: x holds rows x n_in floats, x16 at least as many bf16 (sized by forward).
            unsafe { b.launch(grid(n)) }.ctx("launching a cast")?;
            let w16 = l.w16.as_ref().expect("bf16 weights uploaded");
            return lt.linear(
                &s,
                &LtCall {
                    n_out: l.n_out,
                    n_in: l.n_in,
                    batch: rows,
                    w: dptr(w16, &s),
                    bias: if bias { dptr(&l.b, &s) } else { 0 },
                    x: x16,
                    y,
                    out: Out::F32,
                    relu: false,
                },
            );
        }
        sgemm_xwt(&self.blas, &s, l, x, rows, y)?;
        if bias {
            let bp = dptr(&l.b, &s);
            let (n, total, relu) = (l.n_out as i32, (rows * l.n_out) as i64, 0i32);
            let mut b = s.launch_builder(&self.k.bias);
            b.arg(&y).arg(&bp).arg(&n).arg(&total).arg(&relu);
            // SAFETY: y holds rows x n_out floats, the bias n_out.
            unsafe { b.launch(grid(total)) }.ctx("launching a bias")?;
        }
        Ok(())
    }
}

/// Blocks of attention the device should have in flight: 132 SMs (an H200) x 8.
const ATTENTION_BLOCKS: usize = 1056;

/// Keys a block of attention takes at most (a multiple of 64), and how many such chunks the
/// longest sequence has: few tiles (one or two users) are split along their keys so that the
/// device has about [`ATTENTION_BLOCKS`] blocks, no chunk under 256 keys.
pub(super) fn key_chunks(seqs: &[Seq], heads: usize, tiles: usize) -> (usize, usize) {
    let longest = seqs.iter().map(|q| q.len).max().unwrap_or(0).max(1);
    let blocks = (tiles * heads).max(1);
    let split = ATTENTION_BLOCKS
        .div_ceil(blocks)
        .clamp(1, longest.div_ceil(256).max(1));
    let chunk = longest.div_ceil(split).next_multiple_of(64);
    (chunk, longest.div_ceil(chunk))
}

/// The widest hidden layer of the model's MLPs.
pub(super) fn max_hidden(m: &GpuHstu) -> usize {
    [&m.content, &m.item, &m.head]
        .into_iter()
        .chain(m.additional.as_ref())
        .chain(m.action.as_ref())
        .map(|x| x.first.n_out)
        .max()
        .unwrap_or(1)
}

pub(super) fn grid(total: i64) -> LaunchConfig {
    crate::model::grid(total)
}

/// One warp a row, 8 rows a block.
pub(super) fn warp_rows(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(len: usize) -> Seq {
        Seq {
            start: 0,
            len,
            candidates: 1,
            norm: len as f32,
        }
    }

    #[test]
    fn key_chunks_cover_the_longest_sequence_in_64_key_steps() {
        for (lens, heads) in [
            (vec![1usize], 1usize),
            (vec![6145], 4),
            (vec![1537], 4),
            (vec![300, 4100, 17], 2),
            (vec![64; 400], 4),
            (vec![100_000], 1),
        ] {
            let seqs: Vec<Seq> = lens.iter().map(|&l| seq(l)).collect();
            let tiles: usize = lens.iter().map(|l| l.div_ceil(64)).sum();
            let (chunk, chunks) = key_chunks(&seqs, heads, tiles);
            let longest = *lens.iter().max().unwrap();
            assert!(chunk.is_multiple_of(64) && chunk > 0, "{lens:?}: {chunk}");
            // Every key of the longest sequence is in a chunk, and no chunk is empty.
            assert!(
                chunk * chunks >= longest && chunk * (chunks - 1) < longest,
                "{lens:?}"
            );
            // No chunk under 256 keys unless the sequence is that short.
            assert!(
                chunk >= 256.min(longest.next_multiple_of(64)),
                "{lens:?}: {chunk}"
            );
            // Splitting stops once the device has its blocks.
            if chunks > 1 {
                assert!(tiles * heads * (chunks - 1) < ATTENTION_BLOCKS, "{lens:?}");
            }
        }
        // Many users: no split.
        let many: Vec<Seq> = (0..64).map(|_| seq(1536)).collect();
        assert_eq!(key_chunks(&many, 4, 64 * 24).1, 1);
    }
}
