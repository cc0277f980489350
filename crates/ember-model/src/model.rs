//! A loaded model and the [`Predictor`] that runs its forward pass.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_embed::{
    DType, Dedup, EmbeddingCollection, EmbeddingTable, Feature, KeyedJagged, PagePolicy, Placement,
    PoolOptions, Pooler, Shard, ShardedEmbeddings, StagedBatch, Stager, TierOptions,
    ValidatedBatch,
    workload::{load_trace, seeded_row},
};
use faer::Par;

use crate::config::{InteractionConfig, ModelConfig, TierConfig};
use crate::error::{ModelError, Result};
use crate::interaction::{CrossLayer, Interaction, InteractionScratch, dot_pairs};
use crate::mlp::{Linear, Mlp, MlpScratch};
use crate::random::normal_vec;
use crate::weights::{Weights, read_weights};

/// How to load a model.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Re-encode every table in this dtype at load (e.g. quantize f32 tables to int8).
    pub table_dtype: Option<DType>,
    /// Place every table so (overriding config.json's `placement`).
    pub placement: Option<Placement>,
}

/// A DLRM-family model: bottom MLP, embedding tables, interaction, top MLP, sigmoid.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    bottom: Mlp,
    top: Mlp,
    interaction: Interaction,
    embeddings: EmbeddingCollection,
    /// Stages lookups of the tables on the SSD tier (inactive when there are none).
    stager: Stager,
}

impl Model {
    /// Loads `dir/config.json` and `dir/model.safetensors`.
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<Model> {
        if !dir.is_dir() {
            return Err(ModelError::Io {
                path: dir.into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a model directory (expected config.json and model.safetensors in it)",
                ),
            });
        }
        let mut config = ModelConfig::read(&dir.join("config.json"))?;
        if let Some(p) = opts.placement {
            config.tables.iter_mut().for_each(|t| t.placement = p);
        }
        let w = read_weights(&dir.join("model.safetensors"), &config, opts.table_dtype)?;
        if let Some(d) = opts.table_dtype {
            config.tables.iter_mut().for_each(|t| t.dtype = d);
        }
        let tier = tier_options(dir, config.tier.as_ref())?;
        Self::from_weights(config, w, tier)
    }

    /// Replaces the SSD tier's settings (cache budget, policy, I/O) with `tier`; the cache starts
    /// empty. `dir` resolves a relative `pin_trace`.
    pub fn set_tier(&mut self, dir: &Path, tier: TierConfig) -> Result<()> {
        let opts = tier_options(dir, Some(&tier))?;
        self.stager = Stager::new(&self.embeddings, opts)?;
        self.config.tier = Some(tier);
        Ok(())
    }

    /// Builds a model from a checked config and its weights.
    pub(crate) fn from_weights(
        config: ModelConfig,
        w: Weights,
        tier: TierOptions,
    ) -> Result<Model> {
        config.check().map_err(config_error)?;
        let feature_tables = config.feature_tables().map_err(config_error)?;
        let features = config
            .features()
            .into_iter()
            .zip(feature_tables)
            .map(|(f, table)| Feature {
                name: f.name,
                table,
            })
            .collect();
        let embeddings = EmbeddingCollection::new(w.tables, features)?;
        let interaction = match config.interaction {
            InteractionConfig::Dot {
                self_interaction,
                pair_order,
            } => Interaction::Dot {
                pairs: dot_pairs(config.features().len() + 1, self_interaction, pair_order),
                d: config.bottom_out(),
            },
            InteractionConfig::Cat {} => Interaction::Cat,
            InteractionConfig::Dcn { .. } => Interaction::Dcn { layers: w.cross },
        };
        let stager = Stager::new(&embeddings, tier)?;
        Ok(Model {
            config,
            bottom: w.bottom,
            top: w.top,
            interaction,
            embeddings,
            stager,
        })
    }

    /// A model of `config`'s shape with random weights (MLP weights N(0, 1/in), table rows from
    /// [`seeded_row`]), for benchmarks. Tables are filled on `threads` threads.
    pub fn random(config: ModelConfig, seed: u64, threads: usize) -> Result<Model> {
        config.check().map_err(config_error)?;
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            s
        };
        let mut mlp = |in_dim: usize, sizes: &[usize], relu_last: bool| {
            let mut k_in = in_dim;
            let layers = sizes
                .iter()
                .enumerate()
                .map(|(k, &out)| {
                    let std = (1.0 / k_in as f32).sqrt();
                    let w = normal_vec(out * k_in, std, next());
                    let b = normal_vec(out, 0.01, next());
                    let l = Linear::new(k_in, out, w, b, relu_last || k + 1 < sizes.len());
                    k_in = out;
                    l
                })
                .collect();
            Mlp::new(layers)
        };
        let bottom = mlp(config.dense_in, &config.bottom_mlp, true);
        let top = mlp(config.top_in(), &config.top_mlp, false);
        let mut cross = Vec::new();
        if let InteractionConfig::Dcn { layers, low_rank } = config.interaction {
            let n = config.top_in();
            for _ in 0..layers {
                let v = normal_vec(low_rank * n, (1.0 / n as f32).sqrt(), next());
                let w = normal_vec(n * low_rank, (1.0 / low_rank as f32).sqrt(), next());
                cross.push(CrossLayer {
                    v: Linear::new(n, low_rank, v, vec![0.0; low_rank], false),
                    w: Linear::new(low_rank, n, w, vec![0.0; n], false),
                });
            }
        }
        let mut tables = Vec::with_capacity(config.tables.len());
        for (i, t) in config.tables.iter().enumerate() {
            let mut table =
                EmbeddingTable::zeroed(&t.name, t.rows, t.dim, t.dtype, PagePolicy::Huge)?;
            table.fill_rows(threads, |r, row| seeded_row(seed, i, r, row));
            tables.push(table);
        }
        Self::from_weights(
            config,
            Weights {
                bottom,
                top,
                cross,
                tables,
            },
            TierOptions::default(),
        )
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn embeddings(&self) -> &EmbeddingCollection {
        &self.embeddings
    }

    pub fn bottom_mlp(&self) -> &Mlp {
        &self.bottom
    }

    /// The feature interaction between the bottom MLP and the top MLP.
    pub fn interaction(&self) -> &Interaction {
        &self.interaction
    }

    pub fn top_mlp(&self) -> &Mlp {
        &self.top
    }

    /// Sparse feature names in input order.
    pub fn feature_names(&self) -> Vec<String> {
        self.embeddings.feature_names()
    }

    /// Sets how many batches the SSD tier's rows are read ahead where batches are known ahead
    /// (`predict`, `serve`); the cache is kept.
    pub fn set_prefetch_depth(&mut self, depth: usize) {
        self.config
            .tier
            .get_or_insert_with(TierConfig::default)
            .prefetch_depth = depth;
    }

    /// The SSD tier's stager: its counters, and staging ahead for pipelines.
    pub fn stager(&self) -> &Stager {
        &self.stager
    }

    /// Bytes of all tables.
    pub fn table_bytes(&self) -> usize {
        self.embeddings.tables().iter().map(|t| t.bytes()).sum()
    }
}

/// The stager options of `tier` (defaults when absent), reading the pin trace relative to `dir`.
fn tier_options(dir: &Path, tier: Option<&TierConfig>) -> Result<TierOptions> {
    let default = TierConfig::default();
    let t = tier.unwrap_or(&default);
    let mut opts = t.options().map_err(config_error)?;
    if let Some(p) = &t.pin_trace {
        opts.pin_trace = Some(Arc::new(load_trace(&dir.join(p))?));
    }
    Ok(opts)
}

/// A config refused after it was read (built in code, not from a file).
fn config_error(reason: String) -> ModelError {
    ModelError::Config {
        path: "config".into(),
        reason,
    }
}

/// Where one forward pass spent its time. With more than one thread the bottom MLP runs on one
/// thread beside the embedding stage (`bottom_overlapped`): `embedding` is then the wall time of
/// both, `bottom_mlp` the part the MLP took on its thread, and the stages add up to more than
/// `wall`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    pub embedding: Duration,
    pub bottom_mlp: Duration,
    pub interaction: Duration,
    pub top_mlp: Duration,
    /// The whole forward pass.
    pub wall: Duration,
    pub bottom_overlapped: bool,
}

impl StageTimes {
    /// The wall time of the forward pass.
    pub fn total(&self) -> Duration {
        self.wall
    }

    /// Field-wise sum.
    pub fn plus(self, o: StageTimes) -> StageTimes {
        StageTimes {
            embedding: self.embedding + o.embedding,
            bottom_mlp: self.bottom_mlp + o.bottom_mlp,
            interaction: self.interaction + o.interaction,
            top_mlp: self.top_mlp + o.top_mlp,
            wall: self.wall + o.wall,
            bottom_overlapped: self.bottom_overlapped || o.bottom_overlapped,
        }
    }
}

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
            pooling: model.config.pooling.into(),
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
            &model.embeddings,
            shards,
            PoolOptions {
                pooling: model.config.pooling.into(),
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

    /// Checks that `dense` (`[B, dense_in]`, finite) and `sparse` (the model's features, batch
    /// `B`, ids in range) form a batch of this model; returns `B`.
    pub fn check_batch(&self, dense: &[f32], sparse: &KeyedJagged) -> Result<usize> {
        self.check(dense, sparse).map(|(b, _)| b)
    }

    fn check<'a>(
        &self,
        dense: &[f32],
        sparse: &'a KeyedJagged,
    ) -> Result<(usize, ValidatedBatch<'a>)> {
        let m = &self.model;
        let n = m.config.dense_in;
        if !dense.len().is_multiple_of(n) {
            return Err(ModelError::Input(format!(
                "dense has {} values, not a multiple of the model's {n} dense features",
                dense.len()
            )));
        }
        let batch = dense.len() / n;
        if sparse.batch_size() != batch {
            return Err(ModelError::Input(format!(
                "dense has {batch} samples but the sparse features have {}",
                sparse.batch_size()
            )));
        }
        // A branch-free scan first (it vectorizes; an early-exit search does not), the position
        // only when some value is not finite.
        let all_finite = dense
            .chunks(64)
            .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()));
        if !all_finite && let Some(i) = dense.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Input(format!(
                "dense feature {} of sample {} is {} (must be finite)",
                i % n,
                i / n,
                dense[i]
            )));
        }
        Ok((batch, m.embeddings.validate(sparse)?))
    }

    /// Writes each sample's logit (the top MLP output, before the sigmoid) into `logits`. Tables
    /// on the SSD tier are staged first, inside the embedding stage's time.
    pub fn logits(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        logits: &mut [f32],
    ) -> Result<StageTimes> {
        let (batch, valid) = self.check(dense, sparse)?;
        check_out(logits, batch)?;
        if !self.model.stager.is_active() {
            return self.forward(dense, batch, valid, None, logits);
        }
        let t = Instant::now();
        let staged = self.model.stager.stage(&self.model.embeddings, valid)?;
        // Staged inline: the whole staging time is a stall, and part of the embedding stage.
        let st = t.elapsed();
        self.model.stager.add_stall(st);
        let mut times = self.forward(dense, batch, valid, Some(&staged), logits)?;
        times.embedding += st;
        times.wall += st;
        Ok(times)
    }

    /// [`Predictor::logits`] with the SSD tier's rows already staged for this batch (by
    /// [`ember_embed::tier::pipeline`] over the model's [`Model::stager`]).
    pub fn logits_staged(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        staged: Option<&StagedBatch>,
        logits: &mut [f32],
    ) -> Result<StageTimes> {
        let (batch, valid) = self.check(dense, sparse)?;
        check_out(logits, batch)?;
        self.forward(dense, batch, valid, staged, logits)
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
        pooled.resize(batch * m.embeddings.total_dim(), 0.0);
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
                    || pool(pooler, sharded, &m.embeddings, valid, staged, pooled),
                    || {
                        let t1 = Instant::now();
                        let x = m.bottom.forward(dense, batch, bottom, Par::Seq);
                        (x, t1.elapsed())
                    },
                );
                pooled_res?;
                t.embedding = t0.elapsed();
                t.bottom_mlp = tb;
                t.bottom_overlapped = true;
                x
            } else {
                pool(pooler, sharded, &m.embeddings, valid, staged, pooled)?;
                t.embedding = t0.elapsed();
                let t1 = Instant::now();
                let x = m.bottom.forward(dense, batch, bottom, par);
                t.bottom_mlp = t1.elapsed();
                x
            };

            let t2 = Instant::now();
            inter_out.resize(batch * m.config.top_in(), 0.0);
            m.interaction
                .forward(x, pooled, batch, inter_out, inter, par);
            t.interaction = t2.elapsed();

            let t3 = Instant::now();
            let y = m.top.forward(inter_out, batch, top, par);
            logits.copy_from_slice(y);
            t.top_mlp = t3.elapsed();
            Ok(())
        })?;
        t.wall = start.elapsed();
        Ok(t)
    }

    /// [`Predictor::predict`] with the SSD tier's rows already staged for this batch.
    pub fn predict_staged(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        staged: Option<&StagedBatch>,
        scores: &mut [f32],
    ) -> Result<StageTimes> {
        let t = self.logits_staged(dense, sparse, staged, scores)?;
        scores.iter_mut().for_each(|v| *v = sigmoid(*v));
        Ok(t)
    }

    /// Writes each sample's predicted probability (sigmoid of the logit) into `scores`.
    pub fn predict(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        scores: &mut [f32],
    ) -> Result<StageTimes> {
        let t = self.logits(dense, sparse, scores)?;
        scores.iter_mut().for_each(|v| *v = sigmoid(*v));
        Ok(t)
    }
}

/// Something that scores batches of a model: the CPU [`Predictor`], or a predictor on another
/// device (the CUDA backend's). The server runs one on its batching thread.
pub trait Scorer: Send {
    /// Writes each sample's probability into `scores` (one per sample of `sparse`).
    fn score(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        scores: &mut [f32],
    ) -> std::result::Result<StageTimes, String>;

    /// The device it runs on, for logs (`cpu`, `cuda:0 NVIDIA H100 ...`).
    fn device(&self) -> String;
}

impl Scorer for Predictor {
    fn score(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        scores: &mut [f32],
    ) -> std::result::Result<StageTimes, String> {
        self.predict(dense, sparse, scores)
            .map_err(|e| e.to_string())
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

fn pool(
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

/// The logistic function.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
