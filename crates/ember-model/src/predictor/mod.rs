//! [`Predictor`]: the CPU engine. It runs a model's forward pass with a fixed number of
//! threads and reuses its buffers across calls: the embedding stage on a [`Pooler`] (or a
//! sharded stage, one worker pool per device of a plan), the bottom MLP beside it on one thread
//! when there are several, then the interaction and the top MLP; a graph model's graph after
//! the embedding stage in their place.

use std::sync::Arc;
use std::time::Instant;

use ember_embed::{
    CheckedView, Dedup, EmbedError, EmbeddingCollection, PoolOptions, Pooler, Shard,
    ShardedEmbeddings, StagedBatch,
};
use faer::Par;

use crate::dense::driver::Kernels;
use crate::dense::{DenseDType, DenseIsa};
use crate::engine::{Engine, LayerTime, StageTimes};
use crate::error::{ModelError, Result};
use crate::inputs::Prepared;
use crate::interaction::{Interaction, InteractionScratch, concat};
use crate::lowp::{self as net, LowpScratch};
use crate::mlp::{Linear, MlpScratch, sigmoid};
use crate::model::Model;
use crate::outputs::Outputs;

mod graph;

#[derive(Debug, Default)]
struct Scratch {
    bottom: BottomScratch,
    pooled: Vec<f32>,
    head: HeadScratch,
}

/// The bottom MLP's buffers.
#[derive(Debug, Default)]
struct BottomScratch {
    /// f32 layers.
    f32: MlpScratch,
    /// bf16 / int8 layers: their scratch and the MLP's output.
    low: LowpScratch,
    out: Vec<f32>,
}

/// The buffers of what runs after the embeddings and the bottom MLP: the interaction (or the
/// cross net) and the top MLP.
#[derive(Debug, Default)]
struct HeadScratch {
    inter_out: Vec<f32>,
    inter: InteractionScratch,
    top: MlpScratch,
    /// bf16 / int8 layers: the top MLP's and cross net's scratch, the cross net's running `x_l`.
    low: LowpScratch,
    xl: Vec<f32>,
}

/// Dense layers with their names, in the order they run.
type Named<'a> = Vec<(String, &'a Linear)>;

/// The precision the dense layers run in, with its kernels (`None` for f32).
use crate::graph::Dense;

/// Runs a model's forward pass with a fixed number of threads; reuses its buffers across calls.
/// One `Predictor` per concurrent caller; they can share the `Arc<Model>`.
#[derive(Debug)]
pub struct Predictor {
    model: Arc<Model>,
    pooler: Pooler,
    /// The embedding stage spread over devices by a sharding plan, when one is given.
    sharded: Option<ShardedEmbeddings>,
    threads: usize,
    dense: Dense,
    scratch: Scratch,
}

impl Predictor {
    /// A predictor running on `threads` threads (1 runs on the calling thread).
    pub fn new(model: Arc<Model>, threads: usize) -> Result<Predictor> {
        if threads == 0 {
            return Err(ModelError::BadOption {
                option: "threads",
                reason: "must be at least 1".into(),
            });
        }
        let pooler = Pooler::new(PoolOptions {
            pooling: model.config().pooling.into(),
            dedup: Dedup::Auto,
            threads,
            ..PoolOptions::default()
        })?;
        let dense = dense_for(&model, model.dense_dtype())?;
        Ok(Predictor {
            model,
            pooler,
            sharded: None,
            threads,
            dense,
            scratch: Scratch::default(),
        })
    }

    /// Runs the dense layers in `dtype` from now on (the model's weights for it are packed
    /// here, before the next batch, when the model was loaded for another).
    pub fn set_dense_dtype(&mut self, dtype: DenseDType) -> Result<()> {
        self.dense = dense_for(&self.model, dtype)?;
        Ok(())
    }

    /// Calibrates `model`'s int8 layers on inputs like the ones it will serve: scores `batches`
    /// batches of `inputs` with the dense layers in bf16, records each layer's largest |input|
    /// per column, and sets each int8 layer's smoothing from them
    /// ([`crate::dense::pack::LowpWeights::set_smooth`]) before its int8 weights are packed.
    /// Once only, and before anything packs the model's int8 weights (a model loaded or built
    /// with `dense_dtype` int8 has them packed without a smoothing): then it does nothing.
    /// Inputs unlike the served ones make it worse, not better (the shipped model calibrated on
    /// uniform random inputs scored worse than without it): it is only run where the inputs are
    /// known, as `bench model` does.
    pub fn calibrate_int8(
        model: &Arc<Model>,
        threads: usize,
        batches: usize,
        mut inputs: impl FnMut(usize) -> (Vec<f32>, ember_embed::KeyedJagged),
    ) -> Result<()> {
        Self::calibrate_int8_with(model, threads, |p| {
            for i in 0..batches {
                let (dense, sparse) = inputs(i);
                let mut scores = vec![0f32; sparse.batch_size()];
                p.score(&dense, &sparse, &mut scores)?;
            }
            Ok(())
        })
    }

    /// [`Predictor::calibrate_int8`] on checked samples (a calibration file's, as `serve
    /// --calibrate` reads it), in batches of at most `batch`.
    pub fn calibrate_int8_samples(
        model: &Arc<Model>,
        threads: usize,
        samples: &[crate::Samples],
        batch: usize,
    ) -> Result<()> {
        Self::calibrate_int8_with(model, threads, |p| {
            let mut scores = Vec::new();
            for s in samples {
                for piece in s.pieces(batch.max(1)) {
                    let prepared = model.prepare(model.merge(&[&piece])?)?;
                    scores.resize(piece.len(), 0.0);
                    p.run(&prepared, &mut scores)?;
                }
            }
            Ok(())
        })
    }

    /// Runs `feed` on a bf16 predictor that records each int8 layer's input ranges, then sets
    /// the smoothing and packs the int8 weights ([`Predictor::calibrate_int8`]).
    fn calibrate_int8_with(
        model: &Arc<Model>,
        threads: usize,
        feed: impl FnOnce(&mut Predictor) -> Result<()>,
    ) -> Result<()> {
        if model.graph().is_some() {
            return Err(ModelError::BadOption {
                option: "calibrate",
                reason: "a graph model's int8 layers quantize each batch's activations as they \
                         run: there is no calibration to set (docs/graph-models.md)"
                    .into(),
            });
        }
        if model.int8_packed() {
            return Ok(());
        }
        let mut p = Predictor::new(model.clone(), threads)?;
        p.set_dense_dtype(DenseDType::Bf16)?;
        p.scratch.head.low.calibrate();
        p.scratch.bottom.low.calibrate();
        feed(&mut p)?;
        let (bottom, rest) = p.dense_layers();
        let runs = [
            (p.scratch.bottom.low.calibration(), bottom),
            (p.scratch.head.low.calibration(), rest),
        ];
        let lasts = [
            model.bottom_mlp().layers().last(),
            model.top_mlp().layers().last(),
        ];
        for (maxes, layers) in runs {
            for ((_, l), act) in layers.iter().zip(maxes.unwrap_or_default()) {
                // Each MLP's last layer runs in bf16.
                if !lasts.iter().any(|x| x.is_some_and(|x| std::ptr::eq(x, *l))) {
                    l.set_int8_smooth(act);
                }
            }
        }
        model.prepare_dense(DenseDType::Int8);
        Ok(())
    }

    /// The dense layers in the order the bf16 / int8 path runs them, named: the bottom MLP's,
    /// then the cross net's (`V`, `W` per layer) and the top MLP's.
    fn dense_layers(&self) -> (Named<'_>, Named<'_>) {
        let m = &*self.model;
        let cross: Vec<(String, &Linear)> = match m.interaction() {
            Interaction::Dcn { layers } => layers
                .iter()
                .enumerate()
                .flat_map(|(i, c)| [(format!("cross{i}.V"), &c.v), (format!("cross{i}.W"), &c.w)])
                .collect(),
            _ => Vec::new(),
        };
        fn named<'a>(prefix: &str, layers: &'a [Linear]) -> Vec<(String, &'a Linear)> {
            layers
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("{prefix}{i}"), l))
                .collect()
        }
        let bottom = named("bottom", m.bottom_mlp().layers());
        let rest = cross
            .into_iter()
            .chain(named("top", m.top_mlp().layers()))
            .collect();
        (bottom, rest)
    }

    /// Times every bf16 / int8 layer from now on ([`Predictor::layer_times`]).
    pub fn time_layers(&mut self) {
        self.scratch.head.low.time_layers();
        self.scratch.bottom.low.time_layers();
    }

    /// Each bf16 / int8 layer's time summed over the batches since [`Predictor::time_layers`],
    /// in the order they run (bottom MLP, cross net, top MLP); empty for f32.
    pub fn layer_times(&self) -> Vec<LayerTime> {
        let (bottom, rest) = self.dense_layers();
        let clocks = [
            (self.scratch.bottom.low.clock(), bottom),
            (self.scratch.head.low.clock(), rest),
        ];
        let mut out = Vec::new();
        for (clock, layers) in clocks {
            let Some(c) = clock else { continue };
            for ((name, l), t) in layers.into_iter().zip(c) {
                out.push(LayerTime {
                    name,
                    in_dim: l.in_dim(),
                    out_dim: l.out_dim(),
                    time: *t,
                });
            }
        }
        out
    }

    /// The precision the dense layers run in, and the kernel family (`None` for f32).
    pub fn dense(&self) -> (DenseDType, Option<DenseIsa>) {
        (self.dense.dtype, self.dense.kernels.map(|k| k.isa()))
    }

    /// A predictor whose embedding stage follows a sharding plan: each device's shards run on
    /// a pool of `threads_per_device` threads of its own, all devices at once (see
    /// [`ember_embed::shard`]); the dense layers run on `threads` threads. Row ranges share the
    /// model's table memory; column ranges are copied. Tables on the SSD tier cannot be sharded.
    pub fn with_shards(
        model: Arc<Model>,
        threads: usize,
        shards: &[Shard],
        threads_per_device: usize,
    ) -> Result<Predictor> {
        if model.stager().is_active() {
            return Err(ModelError::BadOption {
                option: "plan",
                reason: "a sharding plan needs every table in memory (no --placement ssd)".into(),
            });
        }
        let sharded = ShardedEmbeddings::new(
            model.embeddings(),
            shards,
            PoolOptions {
                pooling: model.config().pooling.into(),
                dedup: Dedup::Auto,
                threads: threads_per_device.max(1),
                ..PoolOptions::default()
            },
        )?;
        let mut p = Predictor::new(model, threads)?;
        p.sharded = Some(sharded);
        Ok(p)
    }

    /// The sharded embedding stage, when a plan was given.
    pub fn sharded(&self) -> Option<&ShardedEmbeddings> {
        self.sharded.as_ref()
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Writes each sample's logit (the top MLP output, before the sigmoid) into `logits`; a
    /// graph model has none (its outputs are what its graph gives: [`Engine::run_outputs`]).
    pub fn logits(&mut self, batch: &Prepared<'_>, logits: &mut [f32]) -> Result<StageTimes> {
        let b = batch.batch();
        if b.valid().collection() != self.model.embeddings().id() {
            return Err(EmbedError::WrongCollection.into());
        }
        if self.model.graph().is_some() {
            return Err(ModelError::Input(
                "a graph model gives its graph's outputs, not a logit (run_outputs)".into(),
            ));
        }
        check_out(logits, b.len())?;
        self.forward(b.dense(), b.len(), b.valid(), batch.staged(), logits)
    }

    /// The forward pass of a checked batch of `batch` samples.
    fn forward(
        &mut self,
        dense: &[f32],
        batch: usize,
        valid: CheckedView<'_>,
        staged: Option<&StagedBatch>,
        logits: &mut [f32],
    ) -> Result<StageTimes> {
        let m = &*self.model;
        let Scratch {
            bottom,
            pooled,
            head,
        } = &mut self.scratch;
        head.low.rewind();
        bottom.low.rewind();
        let pass = Pass {
            m,
            dense_p: self.dense,
            threads: self.threads,
        };
        let embed = Embed {
            pooler: &self.pooler,
            sharded: self.sharded.as_ref(),
            coll: m.embeddings(),
            valid,
            staged,
        };
        pooled.resize(batch * m.embeddings().total_dim(), 0.0);
        let mut t = StageTimes::default();
        let start = Instant::now();
        self.pooler.install(|| -> Result<()> {
            let x = pass.pool_and_bottom(embed, dense, batch, pooled, bottom, &mut t)?;
            pass.head(x, pooled, batch, head, logits, &mut t);
            Ok(())
        })?;
        t.wall = start.elapsed();
        Ok(t)
    }
}

/// What every stage of one forward pass reads: the model, the dense precision, the threads.
#[derive(Clone, Copy)]
struct Pass<'m> {
    m: &'m Model,
    dense_p: Dense,
    threads: usize,
}

impl Pass<'_> {
    /// Pools the batch's rows into `pooled` and runs the bottom MLP on `dense`, side by side
    /// when there are several threads; returns the bottom MLP's output and times both in `t`.
    fn pool_and_bottom<'s>(
        self,
        embed: Embed<'_>,
        dense: &'s [f32],
        batch: usize,
        pooled: &mut [f32],
        bottom: &'s mut BottomScratch,
        t: &mut StageTimes,
    ) -> Result<&'s [f32]> {
        let t0 = Instant::now();
        if self.threads > 1 {
            // The bottom MLP does not depend on the embeddings: one thread runs it (compute
            // bound) while the others pool (memory bound), then joins the pooling. On the
            // development machine the two "cores" share one core's FMA units, so splitting the
            // GEMM over both gains little, and overlapping it with the gathers gains more.
            let (pooled_res, (x, tb)) = rayon::join(
                || embed.pool(pooled),
                || {
                    let t1 = Instant::now();
                    let x = run_bottom(self.m, self.dense_p, dense, batch, bottom, 1);
                    (x, t1.elapsed())
                },
            );
            pooled_res?;
            t.embedding = t0.elapsed();
            t.bottom_mlp = tb;
            t.bottom_overlapped = true;
            Ok(x)
        } else {
            embed.pool(pooled)?;
            t.embedding = t0.elapsed();
            let t1 = Instant::now();
            let x = run_bottom(self.m, self.dense_p, dense, batch, bottom, self.threads);
            t.bottom_mlp = t1.elapsed();
            Ok(x)
        }
    }

    /// The interaction (or the cross net) of the bottom MLP's output `x` and the `pooled` rows,
    /// then the top MLP, writing one logit per sample; times both in `t`.
    fn head(
        self,
        x: &[f32],
        pooled: &[f32],
        batch: usize,
        s: &mut HeadScratch,
        logits: &mut [f32],
        t: &mut StageTimes,
    ) {
        let (m, threads) = (self.m, self.threads);
        let par = if threads > 1 {
            Par::rayon(threads)
        } else {
            Par::Seq
        };
        let t2 = Instant::now();
        let top_in = m.config().top_in();
        s.inter_out.resize(batch * top_in, 0.0);
        let Some(k) = self.dense_p.kernels else {
            m.interaction()
                .forward(x, pooled, batch, &mut s.inter_out, &mut s.inter, par);
            t.interaction = t2.elapsed();
            let t3 = Instant::now();
            let y = m.top_mlp().forward(&s.inter_out, batch, &mut s.top, par);
            logits.copy_from_slice(y);
            t.top_mlp = t3.elapsed();
            return;
        };
        let dtype = self.dense_p.dtype;
        let x_run = net::Exec {
            kernels: k,
            dtype,
            threads,
        };
        let input = match m.interaction() {
            Interaction::Dcn { layers } if batch > 0 => {
                concat(x, pooled, batch, &mut s.inter_out);
                s.xl.resize(s.inter_out.len(), 0.0);
                net::cross(x_run, layers, &s.inter_out, &mut s.xl, batch, &mut s.low);
                match dtype {
                    DenseDType::Bf16 if !layers.is_empty() => net::Input::Bf16Ready,
                    _ => net::Input::F32(&s.xl, top_in),
                }
            }
            other => {
                other.forward(x, pooled, batch, &mut s.inter_out, &mut s.inter, par);
                net::Input::F32(&s.inter_out, top_in)
            }
        };
        t.interaction = t2.elapsed();
        let t3 = Instant::now();
        let top = m.top_mlp().layers();
        net::mlp(x_run, top, input, batch, logits, &mut s.low);
        t.top_mlp = t3.elapsed();
    }
}

/// The bottom MLP on `th` threads, in the dense precision; its output lives in `s.f32`'s
/// buffers (f32) or `s.out` (bf16 / int8).
fn run_bottom<'s>(
    m: &Model,
    dense_p: Dense,
    dense: &'s [f32],
    batch: usize,
    s: &'s mut BottomScratch,
    th: usize,
) -> &'s [f32] {
    let Some(k) = dense_p.kernels else {
        let par = if th > 1 { Par::rayon(th) } else { Par::Seq };
        return m.bottom_mlp().forward(dense, batch, &mut s.f32, par);
    };
    let layers = m.bottom_mlp().layers();
    let Some(last) = layers.last() else {
        return dense;
    };
    s.out.resize(batch * last.out_dim(), 0.0);
    let input = net::Input::F32(dense, m.config().dense_in);
    let x_run = net::Exec {
        kernels: k,
        dtype: dense_p.dtype,
        threads: th,
    };
    net::mlp(x_run, layers, input, batch, &mut s.out, &mut s.low);
    &s.out
}

/// The dense precision `dtype` for `model`: its kernels chosen, its weights packed (int8's
/// without a smoothing unless [`Predictor::calibrate_int8`] ran first).
fn dense_for(model: &Arc<Model>, dtype: DenseDType) -> Result<Dense> {
    if dtype == DenseDType::F32 {
        return Ok(Dense {
            dtype,
            kernels: None,
        });
    }
    let kernels = Kernels::selected(dtype)?;
    model.prepare_dense(dtype);
    Ok(Dense {
        dtype,
        kernels: Some(kernels),
    })
}

impl Engine for Predictor {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn run(&mut self, batch: &Prepared<'_>, scores: &mut [f32]) -> Result<StageTimes> {
        if self.model.graph().is_some() {
            return self.run_graph_one(batch, scores);
        }
        let t = self.logits(batch, scores)?;
        scores.iter_mut().for_each(|v| *v = sigmoid(*v));
        Ok(t)
    }

    fn run_outputs(&mut self, batch: &Prepared<'_>, out: &mut Outputs) -> Result<StageTimes> {
        if self.model.graph().is_some() {
            return self.forward_graph(batch, out);
        }
        out.reset(1);
        out.values[0].resize(batch.len(), 0.0);
        self.run(batch, &mut out.values[0])
    }

    fn device(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }

    fn time_layers(&mut self) {
        Predictor::time_layers(self);
    }

    fn layer_times(&self) -> Vec<LayerTime> {
        Predictor::layer_times(self)
    }
}

/// Checks that `logits` has room for one score per sample.
fn check_out(logits: &[f32], batch: usize) -> Result<()> {
    if logits.len() != batch {
        return Err(ModelError::Input(format!(
            "output has room for {} scores, the batch has {batch} samples",
            logits.len()
        )));
    }
    Ok(())
}

/// One batch's embedding stage: the pooler (or the sharded stage, or the staged rows) that
/// pools its checked ids.
#[derive(Clone, Copy)]
struct Embed<'a> {
    pooler: &'a Pooler,
    sharded: Option<&'a ShardedEmbeddings>,
    coll: &'a EmbeddingCollection,
    valid: CheckedView<'a>,
    staged: Option<&'a StagedBatch>,
}

impl Embed<'_> {
    /// Pools the batch's rows into `out`: on the sharded stage when a plan was given, else
    /// from the staged rows when the batch was staged, else from the tables in memory.
    fn pool(self, out: &mut [f32]) -> ember_embed::Result<ember_embed::PoolStats> {
        match (self.sharded, self.staged) {
            (Some(s), _) => s.run(self.valid, out),
            (None, Some(s)) => self.pooler.run_staged(self.coll, self.valid, s, out),
            (None, None) => self.pooler.run(self.coll, self.valid, out),
        }
    }
}
