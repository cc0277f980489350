//! A model: its configuration, layers and embedding tables (with the SSD tier's stager when
//! tables live there), loaded from a model directory or built with random weights. Engines
//! ([`crate::Predictor`] on CPU, the CUDA backend's on a GPU) run it; [`crate::inputs`] checks
//! and prepares its batches.

use crate::error::Invalid;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ember_embed::trace::{self, AccessRecorder, load_trace};
use ember_embed::{DType, EmbeddingCollection, EmbeddingTable, Feature, PagePolicy, Placement};
use ember_tier::{Stager, TierOptions};

pub use crate::config::RemoteOverride;
use crate::config::{InteractionConfig, ModelConfig, RemoteConfig, TierConfig};
use crate::dense::{DenseDType, DenseIsa};
use crate::error::{ModelError, Result};
use crate::interaction::{CrossLayer, Interaction, dot_pairs};
use crate::mlp::{Linear, Mlp};
use crate::random::{normal_vec, seeded_row};
pub use crate::weights::Pace;
use crate::weights::{Weights, read_weights};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Re-encode every table in this dtype at load (e.g. quantize f32 tables to int8).
    pub table_dtype: Option<DType>,
    /// Place every table so (overriding config.json's `placement`).
    pub placement: Option<Placement>,
    /// Overrides of config.json's `remote` object (the cluster of `remote` tables).
    pub remote: RemoteOverride,
    /// How DRAM tables are copied when the load runs beside a serving version (the default:
    /// as fast as it goes).
    pub pace: Pace,
    /// Run the dense layers in this precision (overriding config.json's `dense_dtype`).
    pub dense_dtype: Option<DenseDType>,
    /// The model's name where its directory's name is not (a version directory `<name>/<n>/` of
    /// a repository): the default name of its `remote` tables' model in the store (config.json's
    /// `remote.model` and `RemoteOverride::model` win over it).
    pub name: Option<String>,
    /// An HSTU model's cache of users' histories (`None`: none; other families ignore it).
    pub history_cache: Option<crate::history::HistoryCacheConfig>,
}

impl LoadOptions {
    /// Applies the options that override config.json (placement, the remote store, the dense
    /// dtype) to a config's parts, for either family.
    pub(crate) fn override_config(
        &self,
        tables: &mut [crate::config::TableConfig],
        remote: &mut Option<RemoteConfig>,
        dense_dtype: &mut DenseDType,
    ) {
        if let Some(p) = self.placement {
            tables.iter_mut().for_each(|t| t.placement = p);
        }
        *remote = self.remote.apply(remote.take());
        if let (Some(r), Some(name)) = (remote.as_mut(), &self.name) {
            r.model.get_or_insert_with(|| name.clone());
        }
        if let Some(d) = self.dense_dtype {
            *dense_dtype = d;
        }
    }
}

/// What [`Model::record_accesses`] records of the batches [`Model::prepare`] sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOptions {
    /// Ids kept per table (the most recent).
    pub ids_per_table: usize,
    /// One batch in this many is recorded (1: every batch).
    pub every: u64,
}

impl Default for RecordOptions {
    /// The embedding stage's recorder's defaults.
    fn default() -> Self {
        let d = trace::RecordOptions::default();
        RecordOptions {
            ids_per_table: d.ids_per_table,
            every: d.every,
        }
    }
}

/// A DLRM-family model: bottom MLP, embedding tables, interaction, top MLP, sigmoid.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    bottom: Mlp,
    top: Mlp,
    interaction: Interaction,
    /// A graph model's dense part (`Interaction::Graph`).
    graph: Option<crate::graph::Graph>,
    embeddings: EmbeddingCollection,
    /// A graph model's sequence features, spread over the embedding stage's (`sequence.rs`).
    sequences: Option<crate::sequence::Sequences>,
    /// Stages lookups of the tables on the SSD tier (inactive when there are none).
    stager: Stager,
    /// Records the lookups of prepared batches, once [`Model::record_accesses`] started it.
    recorder: OnceLock<AccessRecorder>,
    /// Buffers of batches served, for the next merges (`serving/dlrm.rs`).
    spare: Spare,
}

/// The buffers of a merged batch, to merge the next one into ([`Model::merge_reusing`]).
#[derive(Debug)]
pub struct BatchBuffers {
    pub(crate) dense: Vec<f32>,
    pub(crate) sparse: ember_embed::MergeBuffers,
}

impl BatchBuffers {
    /// Bytes they hold.
    pub fn capacity_bytes(&self) -> usize {
        self.dense.capacity() * 4 + self.sparse.capacity_bytes()
    }
}

/// The buffers of a few batches served, merged into again: a DLRM batch's ids and dense values
/// are megabytes (1.2 MB at RM1's batch 64), and a fresh allocation per batch cost 287 page
/// faults a batch and a tenth of `bench model`'s rate (mimalloc returns freed memory to the OS
/// at once, `crates/ember-cli/src/main.rs`; `serving/dlrm.rs` keeps a prepared batch's). At most [`SPARE_BATCHES`] are kept, none over
/// [`SPARE_MAX_BYTES`]: a model holds at most 4 x 64 MB for this.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spare(Arc<std::sync::Mutex<Vec<BatchBuffers>>>);

/// Batches' buffers a model keeps (a batch running, one or two prepared ahead, one merging).
const SPARE_BATCHES: usize = 4;
/// The largest buffers kept: a rare huge batch's are freed.
const SPARE_MAX_BYTES: usize = 64 << 20;

impl Spare {
    pub(crate) fn take(&self) -> Option<BatchBuffers> {
        self.0.lock().ok()?.pop()
    }

    pub(crate) fn keep(&self, b: BatchBuffers) {
        if b.capacity_bytes() > SPARE_MAX_BYTES {
            return;
        }
        if let Ok(mut s) = self.0.lock()
            && s.len() < SPARE_BATCHES
        {
            s.push(b);
        }
    }
}

/// Frees a model's tier, then its tables one at a time with `pause` after each (either family's
/// [`Model::release`]).
pub(crate) fn release_tables(
    stager: Stager,
    embeddings: EmbeddingCollection,
    pause: std::time::Duration,
) {
    drop(stager);
    for table in embeddings.into_tables() {
        drop(table);
        std::thread::sleep(pause);
    }
}

impl Model {
    /// Buffers of batches served, for the next merges.
    pub(crate) fn spare(&self) -> &Spare {
        &self.spare
    }

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
        opts.override_config(
            &mut config.tables,
            &mut config.remote,
            &mut config.dense_dtype,
        );
        let mut w = read_weights(
            &dir.join("model.safetensors"),
            &config,
            opts.table_dtype,
            opts.pace,
        )?;
        if let Some((file, _)) = config.graph() {
            let graph =
                crate::graph::Graph::load(&dir.join(file)).map_err(|e| ModelError::Config {
                    path: dir.join("config.json"),
                    reason: format!("interaction.file {file:?}: {e}"),
                })?;
            w.graph = Some(graph);
        }
        if let Some(d) = opts.table_dtype {
            config.tables.iter_mut().for_each(|t| t.dtype = d);
        }
        let tier = tier_options(dir, config.tier.as_ref(), config.remote.as_ref())?;
        Self::from_weights(config, w, tier)
    }

    /// Replaces the SSD tier's settings (cache budget, policy, I/O) with `tier`; the cache starts
    /// empty. `dir` resolves a relative `pin_trace`.
    pub fn set_tier(&mut self, dir: &Path, tier: TierConfig) -> Result<()> {
        let opts = tier_options(dir, Some(&tier), self.config.remote.as_ref())?;
        ember_tier::prepare_updates(&mut self.embeddings, &opts)?;
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
        let features = crate::sequence::Sequences::stage_features(&config)
            .into_iter()
            .map(|(name, f)| Feature {
                name,
                table: feature_tables[f],
            })
            .collect();
        let table_rows: Vec<usize> = feature_tables.iter().map(|&t| w.tables[t].rows()).collect();
        let sequences = crate::sequence::Sequences::new(&config, &table_rows);
        let mut embeddings = EmbeddingCollection::new(w.tables, features)?;
        ember_tier::prepare_updates(&mut embeddings, &tier)?;
        let mut graph = None;
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
            InteractionConfig::Graph { ref outputs, .. } => {
                let g = w.graph.ok_or_else(|| {
                    config_error("a graph model is loaded from its directory (dense.onnx)".into())
                })?;
                let sparse = embeddings.total_dim();
                let dense = config.dense_in + sequences.as_ref().map_or(0, |s| s.count());
                crate::graph::model_check(&g, dense, sparse, outputs)
                    .map_err(|e| config_error(e.into()))?;
                graph = Some(g);
                Interaction::Graph
            }
        };
        let stager = Stager::new(&embeddings, tier)?;
        // Fails here, at load, when EMBER_DENSE_ISA names a family this CPU lacks.
        DenseIsa::selected(config.dense_dtype)?;
        let model = Model {
            config,
            bottom: w.bottom,
            top: w.top,
            interaction,
            graph,
            embeddings,
            sequences,
            stager,
            recorder: OnceLock::new(),
            spare: Default::default(),
        };
        model.prepare_dense(model.config.dense_dtype);
        Ok(model)
    }

    /// Converts and packs every dense layer's weights for `dtype` (at load for the model's own
    /// dense dtype; a predictor told to run another calls it before its first batch).
    pub fn prepare_dense(&self, dtype: DenseDType) {
        let cross = match &self.interaction {
            Interaction::Dcn { layers } => layers.as_slice(),
            _ => &[],
        };
        let layers = self.bottom.layers().iter().chain(self.top.layers());
        for l in layers.chain(cross.iter().flat_map(|c| [&c.v, &c.w])) {
            l.prepare(dtype);
        }
        if let Some(g) = self.graph() {
            g.prepare(dtype);
        }
        // int8 runs each MLP's last layer in bf16 (`lowp::mlp`).
        if dtype == DenseDType::Int8 {
            for mlp in [&self.bottom, &self.top] {
                if let Some(l) = mlp.layers().last() {
                    l.prepare(DenseDType::Bf16);
                }
            }
        }
    }

    /// Whether int8's weights are packed (their smoothing, if any, fixed:
    /// [`crate::Predictor::calibrate_int8`]).
    pub fn int8_packed(&self) -> bool {
        self.top.layers().first().is_some_and(|l| l.int8_packed())
    }

    /// The precision the model's dense layers run in by default.
    pub fn dense_dtype(&self) -> DenseDType {
        self.config.dense_dtype
    }

    /// Makes `dtype` the precision its predictors run by default, packing its weights (a
    /// model loaded in f32 and calibrated for int8 with [`crate::Predictor::calibrate_int8`]
    /// keeps the calibrated packing).
    pub fn set_dense_dtype(&mut self, dtype: DenseDType) -> Result<()> {
        DenseIsa::selected(dtype)?;
        self.config.dense_dtype = dtype;
        self.prepare_dense(dtype);
        Ok(())
    }

    /// A model of `config`'s shape with random weights (MLP weights N(0, 1/in), table rows from
    /// [`seeded_row`]), for benchmarks. Tables are filled on `threads` threads.
    pub fn random(config: ModelConfig, seed: u64, threads: usize) -> Result<Model> {
        config.check().map_err(config_error)?;
        if config.is_graph() {
            return Err(config_error(
                "a graph model's dense part is its dense.onnx: it has no random weights".into(),
            ));
        }
        let (bottom, top, cross) = random_dense(&config, seed);
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
                graph: None,
            },
            TierOptions::default(),
        )
    }

    /// Frees the model with `pause` after each table: a version retired beside a serving one
    /// (freeing 4 GB of tables at once held a core for ~50 ms at a time in `bench/swap.sh`).
    pub fn release(self, pause: std::time::Duration) {
        let Model {
            embeddings, stager, ..
        } = self;
        release_tables(stager, embeddings, pause);
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The embedding stage: tables and features (tools and benchmarks; a server sees what it
    /// needs through [`Model::inputs`] and [`Model::tier`]).
    pub fn embeddings(&self) -> &EmbeddingCollection {
        &self.embeddings
    }

    pub fn bottom_mlp(&self) -> &Mlp {
        &self.bottom
    }

    /// A graph model's dense part (`None` for DLRM and DCNv2).
    pub fn graph(&self) -> Option<&crate::graph::Graph> {
        self.graph.as_ref()
    }

    /// The feature interaction between the bottom MLP and the top MLP.
    pub fn interaction(&self) -> &Interaction {
        &self.interaction
    }

    pub fn top_mlp(&self) -> &Mlp {
        &self.top
    }

    /// Sparse feature names in input order, as requests name them (a sequence feature once).
    pub fn feature_names(&self) -> Vec<String> {
        match &self.sequences {
            Some(s) => s.names().to_vec(),
            None => self.embeddings.feature_names(),
        }
    }

    /// A graph model's sequence features (`None` when it has none): how requests' features
    /// reach the embedding stage, whose features are then not the requests'.
    pub fn sequences(&self) -> Option<&crate::sequence::Sequences> {
        self.sequences.as_ref()
    }

    /// The width of the dense rows of a checked batch: `dense_in`, plus one column per
    /// sequence feature (its length).
    pub fn dense_width(&self) -> usize {
        self.config.dense_in + self.sequences.as_ref().map_or(0, |s| s.count())
    }

    /// Sets how many batches the SSD tier's rows are read ahead where batches are known ahead
    /// (`predict`, `serve`); the cache is kept.
    pub fn set_prefetch_depth(&mut self, depth: usize) {
        self.config
            .tier
            .get_or_insert_with(TierConfig::default)
            .prefetch_depth = depth;
    }

    /// The SSD tier's stager: its counters, and staging ahead for pipelines (tools and
    /// benchmarks; a server sees the tier through [`Model::tier`]).
    pub fn stager(&self) -> &Stager {
        &self.stager
    }

    /// Batches whose tier rows are staged ahead of the one being computed where batches are
    /// known ahead ([`crate::run_ahead`] in `predict` and `serve`): the configured depth when a
    /// table is on the SSD tier, else 0 (nothing to stage, nothing to overlap).
    pub fn prefetch_depth(&self) -> usize {
        match self.stager.is_active() {
            true => self
                .config
                .tier
                .as_ref()
                .map_or(TierConfig::default().prefetch_depth, |t| t.prefetch_depth),
            false => 0,
        }
    }

    /// Counts `d` as time a forward pass waited for its batch's tier rows.
    pub fn record_stall(&self, d: Duration) {
        self.stager.add_stall(d);
    }

    /// Starts recording the lookups of every batch [`Model::prepare`] sees from now on (one in
    /// `opts.every`, the `opts.ids_per_table` most recent ids of each table), for
    /// [`Model::write_profile`]. A model records with the options of its first call; later
    /// calls change nothing.
    pub fn record_accesses(&self, opts: RecordOptions) -> Result<()> {
        if self.recorder.get().is_none() {
            let opts = trace::RecordOptions {
                ids_per_table: opts.ids_per_table,
                every: opts.every,
            };
            let r = AccessRecorder::new(&self.embeddings, opts)?;
            let _ = self.recorder.set(r);
        }
        Ok(())
    }

    /// The lookup recorder, once [`Model::record_accesses`] started it.
    pub fn recorder(&self) -> Option<&AccessRecorder> {
        self.recorder.get()
    }

    /// Writes the recorded lookups as `dir/<table>.ids`, one id per line, for `ember convert
    /// --layout-profile dir` (see [`AccessRecorder::write_dir`]); nothing when not recording.
    pub fn write_profile(&self, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
        match self.recorder.get() {
            Some(r) => Ok(r.write_dir(dir)?),
            None => Ok(Vec::new()),
        }
    }

    /// Bytes of all tables.
    pub fn table_bytes(&self) -> usize {
        self.embeddings.tables().iter().map(|t| t.bytes()).sum()
    }
}

/// The stager options of `tier` (defaults when absent), reading the pin trace relative to `dir`.
pub(crate) fn tier_options(
    dir: &Path,
    tier: Option<&TierConfig>,
    remote: Option<&RemoteConfig>,
) -> Result<TierOptions> {
    let default = TierConfig::default();
    let t = tier.unwrap_or(&default);
    let mut opts = t.options().map_err(config_error)?;
    if let Some(p) = &t.pin_trace {
        opts.pin_trace = Some(Arc::new(load_trace(&dir.join(p))?));
    }
    if let Some(r) = remote {
        opts.remote = Some(r.source(&dir_name(dir)).map_err(config_error)?);
        opts.pool_remote = r
            .pool_remote
            .parse()
            .map_err(|e| config_error(format!("remote.pool_remote: {e}").into()))?;
    }
    Ok(opts)
}

/// The name of model directory `dir` (its last component, `model` when it has none): what a
/// model is called in a remote store unless named.
pub fn dir_name(dir: &Path) -> String {
    std::path::absolute(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into())
}

/// A config refused after it was read (built in code, not from a file).
fn config_error(Invalid(reason): Invalid) -> ModelError {
    ModelError::Config {
        path: "config".into(),
        reason,
    }
}

/// The dense layers [`Model::random`] gives `config` for `seed`: MLP weights N(0, 1/in), biases
/// N(0, 0.01); cross net `V` N(0, 1/N), `W` N(0, 1/rank), biases zero.
fn random_dense(config: &ModelConfig, seed: u64) -> (Mlp, Mlp, Vec<CrossLayer>) {
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
    (bottom, top, cross)
}

/// A named f32 tensor: name, shape, values.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// The dense tensors of [`Model::random`]`(config, seed)` as `model.safetensors` names them
/// (`model-format.md`): name, shape, f32 values, in file order (bottom MLP, top MLP, cross
/// net). `ember data model` writes them beside tables of [`crate::random::seeded_row`]'s rows,
/// so the directory it writes loads as the same model.
pub fn random_dense_tensors(config: &ModelConfig, seed: u64) -> Result<Vec<NamedTensor>> {
    config.check().map_err(config_error)?;
    let (bottom, top, cross) = random_dense(config, seed);
    let mut out = Vec::new();
    for (prefix, mlp) in [("bottom_mlp", &bottom), ("top_mlp", &top)] {
        for (k, l) in mlp.layers().iter().enumerate() {
            let (o, i) = (l.bias().len(), l.weight().len() / l.bias().len().max(1));
            out.push((
                format!("{prefix}.{k}.weight"),
                vec![o, i],
                l.weight().to_vec(),
            ));
            out.push((format!("{prefix}.{k}.bias"), vec![o], l.bias().to_vec()));
        }
    }
    for (k, c) in cross.iter().enumerate() {
        let (r, n) = (c.v.bias().len(), c.w.bias().len());
        out.push((format!("crossnet.{k}.V"), vec![r, n], c.v.weight().to_vec()));
        out.push((format!("crossnet.{k}.W"), vec![n, r], c.w.weight().to_vec()));
        out.push((format!("crossnet.{k}.bias"), vec![n], c.w.bias().to_vec()));
    }
    Ok(out)
}
