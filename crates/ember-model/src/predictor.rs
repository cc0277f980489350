//! [`Predictor`]: the CPU engine. It runs a model's forward pass with a fixed number of
//! threads and reuses its buffers across calls: the embedding stage on a [`Pooler`] (or a
//! sharded stage, one worker pool per device of a plan), the bottom MLP beside it on one thread
//! when there are several, then the interaction and the top MLP.

use std::sync::Arc;
use std::time::Instant;

use ember_embed::{
    Dedup, EmbedError, EmbeddingCollection, PoolOptions, Pooler, Shard, ShardedEmbeddings,
    StagedBatch, ValidatedBatch,
};
use faer::Par;

use crate::engine::{Engine, StageTimes};
use crate::error::{ModelError, Result};
use crate::inputs::Prepared;
use crate::interaction::InteractionScratch;
use crate::mlp::{MlpScratch, sigmoid};
use crate::model::Model;

#[derive(Debug, Default)]
struct Scratch {
    bottom: MlpScratch,
    pooled: Vec<f32>,
    inter_out: Vec<f32>,
    inter: InteractionScratch,
    top: MlpScratch,
}

/// Runs a model's forward pass with a fixed number of threads; reuses its buffers across calls.
/// One `Predictor` per concurrent caller; they can share the `Arc<Model>`.
#[derive(Debug)]
pub struct Predictor {
    model: Arc<Model>,
    pooler: Pooler,
    /// The embedding stage spread over devices by a sharding plan, when one is given.
    sharded: Option<ShardedEmbeddings>,
    threads: usize,
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
        Ok(Predictor {
            model,
            pooler,
            sharded: None,
            threads,
            scratch: Scratch::default(),
        })
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

    /// Writes each sample's logit (the top MLP output, before the sigmoid) into `logits`.
    pub fn logits(&mut self, batch: &Prepared<'_>, logits: &mut [f32]) -> Result<StageTimes> {
        let b = batch.batch();
        if b.valid().collection() != self.model.embeddings().id() {
            return Err(EmbedError::WrongCollection.into());
        }
        check_out(logits, b.len())?;
        self.forward(b.dense(), b.len(), b.valid(), batch.staged(), logits)
    }

    /// The forward pass of a checked batch of `batch` samples.
    fn forward(
        &mut self,
        dense: &[f32],
        batch: usize,
        valid: ValidatedBatch<'_>,
        staged: Option<&StagedBatch>,
        logits: &mut [f32],
    ) -> Result<StageTimes> {
        let m = &*self.model;
        let Scratch {
            bottom,
            pooled,
            inter_out,
            inter,
            top,
        } = &mut self.scratch;
        let threads = self.threads;
        let pooler = &self.pooler;
        let sharded = self.sharded.as_ref();
        pooled.resize(batch * m.embeddings().total_dim(), 0.0);
        let mut t = StageTimes::default();
        let start = Instant::now();
        pooler.install(|| -> Result<()> {
            let par = if threads > 1 {
                Par::rayon(threads)
            } else {
                Par::Seq
            };
            let t0 = Instant::now();
            let x = if threads > 1 {
                // The bottom MLP does not depend on the embeddings: one thread runs it (compute
                // bound) while the others pool (memory bound), then joins the pooling. On the
                // development machine the two "cores" share one core's FMA units, so splitting the
                // GEMM over both gains little, and overlapping it with the gathers gains more.
                let (pooled_res, (x, tb)) = rayon::join(
                    || pool_batch(pooler, sharded, m.embeddings(), valid, staged, pooled),
                    || {
                        let t1 = Instant::now();
                        let x = m.bottom_mlp().forward(dense, batch, bottom, Par::Seq);
                        (x, t1.elapsed())
                    },
                );
                pooled_res?;
                t.embedding = t0.elapsed();
                t.bottom_mlp = tb;
                t.bottom_overlapped = true;
                x
            } else {
                pool_batch(pooler, sharded, m.embeddings(), valid, staged, pooled)?;
                t.embedding = t0.elapsed();
                let t1 = Instant::now();
                let x = m.bottom_mlp().forward(dense, batch, bottom, par);
                t.bottom_mlp = t1.elapsed();
                x
            };

            let t2 = Instant::now();
            inter_out.resize(batch * m.config().top_in(), 0.0);
            m.interaction()
                .forward(x, pooled, batch, inter_out, inter, par);
            t.interaction = t2.elapsed();

            let t3 = Instant::now();
            let y = m.top_mlp().forward(inter_out, batch, top, par);
            logits.copy_from_slice(y);
            t.top_mlp = t3.elapsed();
            Ok(())
        })?;
        t.wall = start.elapsed();
        Ok(t)
    }
}

impl Engine for Predictor {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn run(&mut self, batch: &Prepared<'_>, scores: &mut [f32]) -> Result<StageTimes> {
        let t = self.logits(batch, scores)?;
        scores.iter_mut().for_each(|v| *v = sigmoid(*v));
        Ok(t)
    }

    fn device(&self) -> String {
        format!("cpu ({} threads)", self.threads)
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

fn pool_batch(
    pooler: &Pooler,
    sharded: Option<&ShardedEmbeddings>,
    coll: &EmbeddingCollection,
    batch: ValidatedBatch<'_>,
    staged: Option<&StagedBatch>,
    out: &mut [f32],
) -> ember_embed::Result<ember_embed::PoolStats> {
    match (sharded, staged) {
        (Some(s), _) => s.run(batch, out),
        (None, Some(s)) => pooler.run_staged(coll, batch, s, out),
        (None, None) => pooler.run(coll, batch, out),
    }
}
