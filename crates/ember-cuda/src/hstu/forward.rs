//! The pass a [`GpuHstuPredictor`] enqueues after the lookups, step for step as the CPU's
//! (`ember_model::hstu::forward`): the input MLPs, the contextual slots and the encodings; the
//! STU layers; the head.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use ember_model::DenseDType;
use ember_model::hstu::plan::TIME_FEATURE_WIDTH;
use ember_model::hstu::{HstuBatch, TokenPlan};

use super::ops::{DevList, DevRows, grid, key_chunks, max_hidden, warp_rows};
use super::predictor::{AttentionKernel, GpuHstuPredictor, Stage};
use super::sel::Sel;
use super::{DevLayer, DevPost, PAD_ROWS, TILE};
use crate::device::dptr;
use crate::error::{DriverCtx, Result};
use crate::model::{grow, up};

/// What an upload of the batch's plan says when it fails.
const PLAN: &str = "uploading the token plan";

/// One batch's shapes and the device addresses of its buffers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pass {
    /// Tokens computed (rows of the compact buffers: `x`, the norms, the MLPs, `y`), model dim,
    /// table dim, values per token's lookups.
    t: usize,
    /// The batch's tokens (rows of `uvqk`, `uvqk16` and `attn`): `t` unless a cache holds some.
    full: usize,
    /// With a cache of histories: the computed tokens' rows in the batch (`t` of them), the
    /// compact projections, the assembled rows of every token, and the held and kept pieces.
    rows: u64,
    uvqk_c: u64,
    y_full: u64,
    held: (u64, u64, usize),
    kept: (u64, u64, usize),
    d: usize,
    td: usize,
    total: usize,
    heads: usize,
    /// Values per row of the projections (`[u | v | q | k]`), and of `u` / attention's output.
    w: usize,
    nh: usize,
    emb: u64,
    x: u64,
    tmp: u64,
    input: u64,
    hidden: u64,
    xn: u64,
    uvqk: u64,
    uvqk16: u64,
    attn: u64,
    y: u64,
    x16: u64,
    pos: u64,
    bucket: u64,
    ctx: u64,
    seq: u64,
    tiles: u64,
    n_tiles: usize,
    norms: u64,
    /// Keys a block of attention takes, and the chunks of the longest sequence.
    chunk: (usize, usize),
    cand: u64,
    tf: u64,
}

impl GpuHstuPredictor {
    /// Enqueues everything after the lookups; returns the batch's candidates (their logits
    /// are then in `logits`).
    ///
    /// With `sel` (a pass with a cache of histories), `plan` is the compact plan of the
    /// computed tokens ([`Sel::compact`]) and the lookups uploaded are theirs alone.
    pub(super) fn forward(
        &mut self,
        batch: &HstuBatch,
        plan: &TokenPlan,
        sel: Option<&Sel>,
    ) -> Result<usize> {
        let mut p = self.buffers(batch, plan, sel)?;
        self.upload_plan(&mut p, plan, sel)?;
        self.inputs(&p, plan)?;
        self.mark(Some(Stage::Preprocess))?;
        let m = self.m.clone();
        for (k, l) in m.layers.iter().enumerate() {
            self.stu_layer(k, l, &p)?;
        }
        self.head(&p, plan)
    }

    /// Grows the buffers for `batch` and zeroes the pad rows after its last token.
    fn buffers(&mut self, batch: &HstuBatch, plan: &TokenPlan, sel: Option<&Sel>) -> Result<Pass> {
        let m = self.m.clone();
        let gpu = m.gpu.clone();
        let cfg = m.model.config();
        let h = &cfg.hstu;
        let full = batch.tokens();
        let (d, t) = (cfg.dim(), sel.map_or(full, |s| s.tokens.len()));
        let cols = &m.cols;
        let heads = h.hstu_num_heads;
        let (hid, qk) = (h.hstu_attn_linear_dim, h.hstu_attn_qk_dim);
        let (w, nh) = (heads * 2 * (hid + qk), heads * hid);
        let hidden_max = max_hidden(&m);
        let input_w = (cols.td * (1 + cols.additional.len()))
            .max(plan.action_width)
            .max(cols.td * cols.items.len().max(1))
            .max(d + TIME_FEATURE_WIDTH);
        let x16_len = t.max(1) * [3 * nh, input_w, hidden_max].into_iter().max().unwrap_or(1);
        let b = &mut self.b;
        let x16 = match m.dense {
            DenseDType::Bf16 => grow(&gpu, &mut b.x16, x16_len)?.0,
            _ => 0,
        };
        let tc = m.dense == DenseDType::Bf16 && self.tensor_core_attention;
        let uvqk16 = match tc {
            true => grow(&gpu, &mut b.uvqk16, (full + PAD_ROWS) * w)?.0,
            false => 0,
        };
        if uvqk16 != 0 {
            // The pad rows after the last token: finite (zero), whatever an earlier batch left.
            // SAFETY: the buffer holds (full + PAD_ROWS) x w bf16 values (grown above); the
            // memset is ordered on the compute stream before attention reads the rows.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    uvqk16 + (full * w * 2) as u64,
                    0,
                    PAD_ROWS * w * 2,
                    gpu.compute().cu_stream(),
                )
            }
            .ctx("clearing the pad rows")?;
        }
        let uvqk = grow(&gpu, &mut b.uvqk, full * w)?.0;
        let (uvqk_c, y_full) = match sel {
            Some(_) => self.cache_buffers(uvqk, t, full, w, nh)?,
            None => (0, 0),
        };
        let b = &mut self.b;
        Ok(Pass {
            t,
            full,
            rows: 0,
            uvqk_c,
            y_full,
            held: (0, 0, 0),
            kept: (0, 0, 0),
            d,
            td: cols.td,
            total: cols.total,
            heads,
            w,
            nh,
            emb: self.run.output_ptr(),
            x: grow(&gpu, &mut b.x, t * d)?.0,
            tmp: grow(&gpu, &mut b.tmp, t * d.max(nh))?.0,
            input: grow(&gpu, &mut b.input, t * input_w)?.0,
            hidden: grow(&gpu, &mut b.hidden, t * hidden_max)?.0,
            xn: grow(&gpu, &mut b.xn, t * d)?.0,
            uvqk,
            uvqk16,
            attn: grow(&gpu, &mut b.attn, full * nh)?.0,
            y: grow(&gpu, &mut b.y, t * 3 * nh)?.0,
            x16,
            pos: 0,
            bucket: 0,
            ctx: 0,
            seq: 0,
            tiles: 0,
            n_tiles: 0,
            norms: 0,
            chunk: (0, 0),
            cand: 0,
            tf: 0,
        })
    }

    /// A cached pass's own buffers (its compact projections, the assembled rows of every
    /// token), with the projections of the batch's `full` tokens zeroed: the held tokens' `u`
    /// and `q` columns are never written, and are zero rather than what an earlier batch left
    /// (attention reads a row's `q` only for computed rows, but a tile's last rows may be a held
    /// neighbour's).
    fn cache_buffers(
        &mut self,
        uvqk: u64,
        t: usize,
        full: usize,
        w: usize,
        nh: usize,
    ) -> Result<(u64, u64)> {
        let gpu = self.m.gpu.clone();
        // SAFETY: uvqk holds full x w floats (grown by the caller), ordered on the stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                uvqk,
                0,
                full * w * 4,
                gpu.compute().cu_stream(),
            )
        }
        .ctx("clearing the projections")?;
        let b = &mut self.b;
        Ok((
            grow(&gpu, &mut b.uvqk_c, t * w)?.0,
            grow(&gpu, &mut b.y_full, full * 3 * nh)?.0,
        ))
    }

    /// Uploads the host's tables of the batch ([`TokenPlan`]) and notes where they went.
    fn upload_plan(&mut self, p: &mut Pass, plan: &TokenPlan, sel: Option<&Sel>) -> Result<()> {
        let gpu = self.m.gpu.clone();
        let ints = |v: &[u32]| v.iter().map(|&a| a as i32).collect::<Vec<i32>>();
        let ctx: Vec<i32> = plan
            .contextual
            .iter()
            .flat_map(|c| {
                [
                    c.token as i32,
                    c.slot as i32,
                    c.col.map_or(-1, |c| c as i32),
                ]
            })
            .collect();
        let seq: Vec<i32> = plan
            .seqs
            .iter()
            .flat_map(|q| [q.start as i32, q.len as i32, q.history() as i32, 0])
            .collect();
        // Query rows: each sequence's computed tokens (all of them without a cache).
        let tiles: Vec<i32> = plan
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(k, q)| {
                let first = sel.map_or(0, |s| s.firsts[k]);
                (first..q.len)
                    .step_by(TILE)
                    .flat_map(move |i0| [k as i32, i0 as i32])
            })
            .collect();
        let norms: Vec<f32> = plan.seqs.iter().map(|q| q.norm).collect();
        let cand: Vec<i32> = plan.candidate_rows.iter().map(|&r| r as i32).collect();
        let b = &mut self.b;
        let out = p;
        out.pos = up(&gpu, &mut b.pos, &ints(&plan.positions), PLAN)?;
        out.bucket = up(&gpu, &mut b.bucket, &ints(&plan.buckets), PLAN)?;
        out.ctx = up(&gpu, &mut b.ctx, &ctx, PLAN)?;
        out.seq = up(&gpu, &mut b.seq, &seq, PLAN)?;
        out.tiles = up(&gpu, &mut b.tiles, &tiles, PLAN)?;
        out.n_tiles = tiles.len() / 2;
        out.chunk = key_chunks(&plan.seqs, out.heads, out.n_tiles);
        out.norms = up(&gpu, &mut b.norms, &norms, PLAN)?;
        out.cand = up(&gpu, &mut b.cand, &cand, PLAN)?;
        out.tf = up(&gpu, &mut b.tf, &plan.time_features, PLAN)?;
        if let Some(sel) = sel {
            let rows: Vec<i32> = sel.tokens.iter().map(|&t| t as i32).collect();
            out.rows = up(&gpu, &mut b.sel_rows, &rows, PLAN)?;
            out.held = Sel::upload_pieces(&gpu, &sel.held, &mut b.held_segs, &mut b.held_meta)?;
            out.kept = Sel::upload_pieces(&gpu, &sel.kept, &mut b.kept_segs, &mut b.kept_meta)?;
        }
        Ok(())
    }

    /// Steps 2 and 3: `x` = the content MLP of the merged post id, plus the additional
    /// features' MLP, plus the action encoder's MLP; the contextual slots; the encodings.
    fn inputs(&mut self, p: &Pass, plan: &TokenPlan) -> Result<()> {
        let m = self.m.clone();
        let s = m.gpu.compute().clone();
        let (t, d) = (p.t, p.d);
        let emb = DevRows {
            ptr: p.emb,
            ld: p.total,
        };
        // Every token's own row (no row list).
        let tokens = DevList { ptr: 0, len: t };
        let pp = DevList {
            ptr: dptr(&m.post_pairs, &s),
            len: 1,
        };
        self.gather(emb, tokens, pp, p.td, p.input)?;
        self.mlp(&m.content, p.input, t, p.hidden, p.x, p.x16)?;
        if let Some(a) = &m.additional {
            let ap = DevList {
                ptr: dptr(&m.add_pairs, &s),
                len: m.cols.additional.len(),
            };
            self.gather(emb, tokens, ap, p.td, p.input)?;
            self.mlp(a, p.input, t, p.hidden, p.tmp, p.x16)?;
            self.add(p.x, p.tmp, t * d)?;
        }
        if let Some(a) = &m.action {
            let dst = self.b.input.as_mut().expect("grown in buffers");
            s.memcpy_htod(&plan.actions, &mut dst.slice_mut(..plan.actions.len()))
                .ctx("uploading action inputs")?;
            self.mlp(a, p.input, t, p.hidden, p.tmp, p.x16)?;
            self.add(p.x, p.tmp, t * d)?;
        }
        if !plan.contextual.is_empty() {
            let (ctx_w, ctx_b) = (dptr(&m.ctx_w, &s), dptr(&m.ctx_b, &s));
            let (d_i, total_i, td_i) = (d as i32, p.total as i32, p.td as i32);
            let mut b = s.launch_builder(&self.k.contextual);
            b.arg(&p.x)
                .arg(&d_i)
                .arg(&p.emb)
                .arg(&total_i)
                .arg(&p.ctx)
                .arg(&ctx_w)
                .arg(&ctx_b)
                .arg(&td_i);
            let cfg = LaunchConfig {
                grid_dim: (plan.contextual.len() as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x [t, d], emb [t, total], items 3 ints each naming a token < t, a slot
            // of ctx_w [slots, td, d] / ctx_b [slots, d], and a column + td <= total or -1.
            unsafe { b.launch(cfg) }.ctx("launching the contextual slots")?;
        }
        let (pw, tw) = (dptr(&m.positions, &s), dptr(&m.times, &s));
        let alpha = (d as f64).sqrt() as f32;
        let (d_i, n) = (d as i32, (t * d) as i64);
        let mut b = s.launch_builder(&self.k.encode);
        b.arg(&p.x)
            .arg(&d_i)
            .arg(&p.pos)
            .arg(&p.bucket)
            .arg(&pw)
            .arg(&tw)
            .arg(&alpha)
            .arg(&n);
        // SAFETY: x [t, d]; pos / bucket t rows of the position / time tables ([_, d]).
        unsafe { b.launch(grid(n)) }.ctx("launching the encodings")?;
        Ok(())
    }

    /// Step 4, one STU layer: `x += [u | a | u * norm(a)] W_out` with `u, v, q, k` the
    /// projections of `layer_norm(x)`, `u = silu(u)` and `a` attention.
    fn stu_layer(&mut self, layer: usize, l: &DevLayer, p: &Pass) -> Result<()> {
        let s = self.m.gpu.compute().clone();
        let (t, d, w, nh) = (p.t, p.d, p.w, p.nh);
        let (x, xn) = (DevRows { ptr: p.x, ld: d }, DevRows { ptr: p.xn, ld: d });
        self.norm_rows(x, xn, &l.input_norm, t, d, false)?;
        self.mark(Some(Stage::Pointwise))?;
        let cached = p.rows != 0;
        self.linear(
            &l.uvqk,
            p.xn,
            t,
            if cached { p.uvqk_c } else { p.uvqk },
            p.x16,
            true,
        )?;
        self.mark(Some(Stage::Projections))?;
        if cached {
            // The computed rows into the batch's layout, the held tokens' keys and values
            // beside them.
            self.scatter(p.uvqk_c, w, p.rows, t, p.uvqk)?;
            self.kv(p.held, layer, p.heads, p.uvqk, p.w, true)?;
            self.mark(Some(Stage::Pointwise))?;
        }
        let (w_i, n_i, total_n) = (w as i32, nh as i32, (p.full * w) as i64);
        let mut b = s.launch_builder(&self.k.silu_u);
        b.arg(&p.uvqk)
            .arg(&w_i)
            .arg(&n_i)
            .arg(&p.uvqk16)
            .arg(&total_n);
        // SAFETY: uvqk [full, w]; uvqk16 0 or [full + PAD_ROWS, w].
        unsafe { b.launch(grid(total_n)) }.ctx("launching silu")?;
        self.mark(Some(Stage::Pointwise))?;
        self.attention(p)?;
        self.mark(Some(Stage::Attention))?;
        if cached {
            // The computed history tokens' keys and values, for the cache.
            self.kv(p.kept, layer, p.heads, p.uvqk, p.w, false)?;
        }
        let on = &l.output_norm;
        let (nw, nb) = (dptr(&on.w, &s), dptr(&on.b, &s));
        let group = i32::from(self.m.model.config().hstu.hstu_group_norm);
        let (heads_i, rows) = (p.heads as i32, p.full as i32);
        let y = if cached { p.y_full } else { p.y };
        let mut b = s.launch_builder(&self.k.assemble);
        b.arg(&p.uvqk)
            .arg(&w_i)
            .arg(&p.attn)
            .arg(&y)
            .arg(&nw)
            .arg(&nb)
            .arg(&on.eps)
            .arg(&group)
            .arg(&heads_i)
            .arg(&rows);
        // SAFETY: uvqk [full, w], attn [full, nh], y (y_full with a cache) [full, 3 nh]; the
        // norm's weights nh values (heads with group norm).
        unsafe { b.launch(warp_rows(p.full)) }.ctx("launching the output assembly")?;
        if cached {
            let rows = DevList {
                ptr: p.rows,
                len: t,
            };
            let none = DevRows { ptr: 0, ld: 0 };
            self.rows(DevRows { ptr: y, ld: 3 * nh }, rows, none, p.y)?;
        }
        self.mark(Some(Stage::Pointwise))?;
        self.linear(&l.output, p.y, t, p.tmp, p.x16, false)?;
        self.mark(Some(Stage::Projections))?;
        let bias = dptr(&l.output.b, &s);
        let (d_i, n) = (d as i32, (t * d) as i64);
        let mut b = s.launch_builder(&self.k.residual);
        b.arg(&p.x).arg(&p.tmp).arg(&bias).arg(&d_i).arg(&n);
        // SAFETY: x and tmp [t, d], bias [d].
        unsafe { b.launch(grid(n)) }.ctx("launching the residual")?;
        self.mark(Some(Stage::Pointwise))
    }

    /// Attention into `attn` (zeroed first: blocks add their key chunks' sums into it), on
    /// tensor cores in bf16 or on CUDA cores in f32.
    fn attention(&mut self, p: &Pass) -> Result<()> {
        let s = self.m.gpu.compute().clone();
        let qk = self.m.model.config().hstu.hstu_attn_qk_dim;
        let alpha = (1.0 / (qk as f64).sqrt()) as f32;
        // SAFETY: attn holds full x nh floats (grown in `buffers`); ordered on the compute stream
        // before the kernels add into it.
        unsafe {
            cudarc::driver::result::memset_d8_async(p.attn, 0, p.full * p.nh * 4, s.cu_stream())
        }
        .ctx("clearing attention's output")?;
        let tc = self.tensor_core_attention();
        let f = match (tc, self.attention_kernel) {
            (true, AttentionKernel::V1) => self.k.attn_bf16.as_ref().expect("compiled"),
            (true, AttentionKernel::V2) => self.k.attn_bf16_v2.as_ref().expect("compiled"),
            (false, _) => &self.k.attn_f32,
        };
        let src = if tc { p.uvqk16 } else { p.uvqk };
        let (w_i, heads_i, chunk) = (p.w as i32, p.heads as i32, p.chunk.0 as i32);
        let mut b = s.launch_builder(f);
        b.arg(&src)
            .arg(&w_i)
            .arg(&p.seq)
            .arg(&p.norms)
            .arg(&p.tiles)
            .arg(&heads_i)
            .arg(&alpha)
            .arg(&chunk)
            .arg(&p.attn);
        let cfg = LaunchConfig {
            grid_dim: (p.n_tiles as u32, p.heads as u32, p.chunk.1 as u32),
            block_dim: (if tc { 128 } else { 256 }, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernels read uvqk [full, w] (f32), or uvqk16 [full + PAD_ROWS, w] whose
        // pad rows were zeroed in `buffers` (bf16: q rows at most 63 past a tile's sequence, k
        // and v rows at most 63 (v1) or 31 (v2): PAD_ROWS = 64 covers both); seq / norms /
        // tiles as the kernel reads them, every tile's sequence inside [0, full); they add into
        // attn [full, heads x hid], zeroed above.
        unsafe { b.launch(cfg) }.ctx("launching attention")?;
        Ok(())
    }

    /// Step 5: the candidates' rows through the postprocessor, times the item MLP of their
    /// item rows, into the head's logits. Returns the candidates.
    fn head(&mut self, p: &Pass, plan: &TokenPlan) -> Result<usize> {
        let m = self.m.clone();
        let gpu = m.gpu.clone();
        let s = gpu.compute().clone();
        let (n, d) = (plan.candidate_rows.len(), p.d);
        let tasks = m.model.config().hstu.multitask_configs.len();
        if n == 0 {
            return Ok(0);
        }
        let user = grow(&gpu, &mut self.b.user, n * d)?.0;
        let item = grow(&gpu, &mut self.b.item, n * d)?.0;
        let logits = grow(&gpu, &mut self.b.logits, n * tasks)?.0;
        let x = DevRows { ptr: p.x, ld: d };
        let cand = DevList {
            ptr: p.cand,
            len: n,
        };
        let none = DevRows { ptr: 0, ld: 0 };
        let user_rows = DevRows { ptr: user, ld: d };
        match &m.post {
            DevPost::Timestamp { combiner, norm } => {
                let tf = DevRows {
                    ptr: p.tf,
                    ld: TIME_FEATURE_WIDTH,
                };
                self.rows(x, cand, tf, p.input)?;
                self.linear(combiner, p.input, n, user, p.x16, true)?;
                self.norm_rows(user_rows, user_rows, norm, n, d, false)?;
            }
            DevPost::LayerNorm(norm) => {
                self.rows(x, cand, none, user)?;
                self.norm_rows(user_rows, user_rows, norm, n, d, false)?;
            }
            DevPost::L2 => {
                self.rows(x, cand, none, user)?;
                let (d_i, n_i) = (d as i32, n as i32);
                let mut b = s.launch_builder(&self.k.l2);
                b.arg(&user).arg(&d_i).arg(&n_i);
                // SAFETY: user [n, d].
                unsafe { b.launch(warp_rows(n)) }.ctx("launching the l2 norm")?;
            }
        }
        let emb = DevRows {
            ptr: p.emb,
            ld: p.total,
        };
        let ip = DevList {
            ptr: dptr(&m.item_pairs, &s),
            len: m.cols.items.len(),
        };
        self.gather(emb, cand, ip, p.td, p.input)?;
        self.mlp(&m.item, p.input, n, p.hidden, item, p.x16)?;
        let total_n = (n * d) as i64;
        let mut b = s.launch_builder(&self.k.mul);
        b.arg(&user).arg(&item).arg(&total_n);
        // SAFETY: user and item [n, d].
        unsafe { b.launch(grid(total_n)) }.ctx("launching a product")?;
        self.mlp(&m.head, user, n, p.hidden, logits, p.x16)?;
        self.mark(Some(Stage::Head))?;
        Ok(n)
    }
}
