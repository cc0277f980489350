//! Meta's HSTU ranking model (`DlrmHSTU` of meta-recsys/generative-recommenders, MLPerf
//! DLRMv3) as an Ember model family: a user's history and candidates in, one score per
//! candidate and task out.
//!
//! - [`config`]: `config.json` (`"family": "hstu"`), every hyperparameter of the reference's
//!   `DlrmHSTUConfig`;
//! - [`request`]: users checked once and laid out as tokens (`[contextual | history |
//!   candidates]`), their embedding lookups one jagged batch through Ember's embedding stage and
//!   tiers;
//! - [`attention`]: the jagged, blocked attention kernel with the causal and target-aware masks;
//! - [`layers`]: layer norms and the reference's `Linear -> SwishLayerNorm -> Linear` blocks;
//! - `weights.rs`: the dense part, read by the reference's names;
//! - [`forward`]: the forward pass on the CPU ([`HstuPredictor`]), its last step (postprocessor,
//!   item MLP, head) in `head.rs`.
//!
//! Weights are read by the names of the reference's `state_dict` (`tools/export_torch.py --from
//! generative-recommenders` writes them; `docs/model-format.md` lists them).

pub mod attention;
pub mod cache;
pub mod config;
mod entry;
pub mod forward;
mod head;
pub mod layers;
pub mod plan;
pub mod presets;
pub mod request;
mod reuse;
mod share;
mod spill;
mod stu;
mod times;
mod weights;
mod ymm;
mod zmm;

use crate::error::Invalid;
use std::path::Path;

use ember_embed::{EmbeddingCollection, EmbeddingTable, Feature, PagePolicy};
use ember_tier::{Stager, TierOptions};

pub use cache::{
    CacheStats, Eviction, HistoryCache, HistoryCacheConfig, Reuse, ShareConfig, SpillConfig,
};
pub use config::{AttentionNorm, HstuModelConfig, TaskType, TimeBucketClamp};
pub use forward::{HstuPredictor, HstuScores, HstuTimes};
pub use plan::{AsOf, Columns, ContextualSlot, TokenPlan};
pub use request::{HstuBatch, User, UserSpan};
pub use reuse::CacheUse;
pub use share::{ShareError, model_id};
pub use weights::{ActionEncoder, HstuWeights, Postprocessor, StuLayer, random_dense_tensors};

use crate::dense::{DenseDType, DenseIsa};
use crate::error::{ModelError, Result};
use crate::model::LoadOptions;
use crate::random::seeded_row;
use crate::weights::{Reader, map_weights};
use request::Roles;
use weights::{PRE, random_source, read_dense};

/// The reference's fixed widths: the action embedding per action type, and the hidden width of
/// the item MLP and the prediction head.
pub const ACTION_DIM: usize = 8;
pub const HEAD_HIDDEN: usize = 512;

/// The reference's `TimestampLayerNormPostprocessor` features: (seconds per unit, units per
/// period): hour of day, day of week.
pub const TIME_FEATURES: [(f32, f32); 2] = [(3600.0, 24.0), (86400.0, 7.0)];

/// An HSTU model: its config, tables (through Ember's embedding stage and tiers) and weights.
#[derive(Debug)]
pub struct HstuModel {
    config: HstuModelConfig,
    pub(crate) roles: Roles,
    embeddings: EmbeddingCollection,
    stager: Stager,
    weights: HstuWeights,
    /// The cache of users' histories, this loaded version's own.
    history: Option<std::sync::Arc<HistoryCache>>,
}

impl HstuModel {
    /// Whether `dir` holds an HSTU model (its config.json says `"family": "hstu"`).
    pub fn is_hstu_dir(dir: &Path) -> bool {
        let Ok(text) = ember_embed::files::read_text(
            &dir.join("config.json"),
            "model config",
            ember_embed::files::TEXT_LIMIT,
        ) else {
            return false;
        };
        crate::config::is_hstu_family(&text)
    }

    /// Loads `dir/config.json` and `dir/model.safetensors`.
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<HstuModel> {
        let mut config = HstuModelConfig::read(&dir.join("config.json"))?;
        opts.override_config(
            &mut config.tables,
            &mut config.remote,
            &mut config.dense_dtype,
        );
        config
            .check()
            .map_err(|Invalid(reason)| ModelError::Config {
                path: dir.join("config.json"),
                reason,
            })?;
        let path = dir.join("model.safetensors");
        let map = map_weights(&path)?;
        let mut r = Reader::new(&path, &map)?;
        let weights = read_dense(&config, &mut |name, shape| r.f32s(name, shape))?;
        if config.additional_features().is_empty() {
            r.allow_unused_prefix(&format!("{PRE}._additional_embedding_mlp."));
        }
        let tables = r.tables(
            &map,
            &config.tables,
            config.remote.as_ref(),
            opts.table_dtype,
            opts.pace,
        )?;
        r.check_all_used()?;
        drop(map);
        if let Some(d) = opts.table_dtype {
            config.tables.iter_mut().for_each(|t| t.dtype = d);
        }
        let tier = crate::model::tier_options(dir, config.tier.as_ref(), config.remote.as_ref())?;
        let mut model = Self::assemble(config, weights, tables, tier)?;
        model.set_history_cache(opts.history_cache)?;
        Ok(model)
    }

    /// A model of `config`'s shape with random weights (for benchmarks and `ember data model`):
    /// linear weights N(0, 1/in), norms near 1, table rows from [`seeded_row`].
    pub fn random(config: HstuModelConfig, seed: u64, threads: usize) -> Result<HstuModel> {
        config
            .check()
            .map_err(|Invalid(reason)| ModelError::Config {
                path: "config".into(),
                reason,
            })?;
        let weights = read_dense(&config, &mut random_source(seed))?;
        let mut tables = Vec::with_capacity(config.tables.len());
        for (i, t) in config.tables.iter().enumerate() {
            let mut table =
                EmbeddingTable::zeroed(&t.name, t.rows, t.dim, t.dtype, PagePolicy::Huge)?;
            table.fill_rows(threads, |r, row| seeded_row(seed, i, r, row));
            tables.push(table);
        }
        Self::assemble(config, weights, tables, TierOptions::default())
    }

    fn assemble(
        config: HstuModelConfig,
        weights: HstuWeights,
        tables: Vec<EmbeddingTable>,
        tier: TierOptions,
    ) -> Result<HstuModel> {
        let roles = Roles::of(&config).map_err(|Invalid(reason)| ModelError::Config {
            path: "config".into(),
            reason,
        })?;
        let index = |name: &str| {
            config
                .tables
                .iter()
                .position(|t| t.name == name)
                .expect("checked: the table exists")
        };
        let features = roles
            .features
            .iter()
            .map(|f| Feature {
                name: f.name.clone(),
                table: index(&f.table),
            })
            .collect();
        let mut embeddings = EmbeddingCollection::new(tables, features)?;
        ember_tier::prepare_updates(&mut embeddings, &tier)?;
        let stager = Stager::new(&embeddings, tier)?;
        DenseIsa::selected(config.dense_dtype)?;
        let model = HstuModel {
            config,
            roles,
            embeddings,
            stager,
            weights,
            history: None,
        };
        model.prepare_dense(model.config.dense_dtype);
        Ok(model)
    }

    /// Packs every dense layer's weights for `dtype` (at load; a predictor told to run another
    /// precision calls it first).
    pub fn prepare_dense(&self, dtype: DenseDType) {
        if dtype == DenseDType::F32 {
            return;
        }
        let w = &self.weights;
        let mlps = [
            Some(&w.content),
            w.additional.as_ref(),
            w.action.as_ref().map(|a| &a.mlp),
        ];
        for m in mlps.into_iter().flatten().chain([&w.item, &w.head]) {
            m.prepare(dtype);
        }
        for l in &w.layers {
            l.uvqk.prepare(dtype);
            l.output.prepare(dtype);
        }
        if let Postprocessor::Timestamp { combiner, .. } = &w.post {
            combiner.prepare(dtype);
        }
    }

    /// Replaces the SSD tier's settings (the row cache, its policy, how row files are read)
    /// with `tier`, as [`crate::Model::set_tier`] does; `dir` is the model directory.
    pub fn set_tier(&mut self, dir: &Path, tier: crate::config::TierConfig) -> Result<()> {
        let opts = crate::model::tier_options(dir, Some(&tier), self.config.remote.as_ref())?;
        ember_tier::prepare_updates(&mut self.embeddings, &opts)?;
        self.stager = Stager::new(&self.embeddings, opts)?;
        self.config.tier = Some(tier);
        Ok(())
    }

    /// Makes its in-memory tables live: their rows may then be rewritten while it serves
    /// (`embeddings().tables()[t].write_rows`, as the remote tier's streaming updates do), and
    /// a history cache retires the entries that read a rewritten row.
    pub fn make_tables_live(&mut self) -> Result<()> {
        if self.history.as_ref().is_some_and(|h| h.is_shared()) {
            return Err(ModelError::BadOption {
                option: "history_share",
                reason: "a model whose history cache is shared cannot take row updates".into(),
            });
        }
        Ok(self.embeddings.make_dram_tables_live()?)
    }

    /// Gives the model a new, empty cache of users' histories (`None`: none), which its
    /// runners use from then on ([`HstuPredictor::run_cached`]). Refused for a model whose
    /// attention divides by the batch's longest length (`attention_norm: batch_max`): a user's
    /// states would change with its batch-mates.
    pub fn set_history_cache(&mut self, config: Option<HistoryCacheConfig>) -> Result<()> {
        if config.is_some() && self.config.attention_norm != AttentionNorm::Alone {
            return Err(ModelError::BadOption {
                option: "history_cache",
                reason: "needs attention_norm alone (this model's config says batch_max)".into(),
            });
        }
        self.history = match config {
            Some(c) => Some(std::sync::Arc::new(self.new_history_cache(c)?)),
            None => None,
        };
        Ok(())
    }

    /// A new cache of `config` for this model (its spill directory made, its shared tier
    /// connected), not given to the model: a tool that runs several (replicas) holds them.
    pub fn new_history_cache(&self, config: HistoryCacheConfig) -> Result<HistoryCache> {
        let dir = config.spill.as_ref().map(|s| s.dir.clone());
        let share = config.share.clone();
        let mut cache = HistoryCache::new(config).map_err(|e| ModelError::BadOption {
            option: "history_cache",
            reason: format!(
                "making its spill directory under {}: {e}",
                dir.unwrap_or_default().display()
            ),
        })?;
        if let Some(s) = share {
            cache.attach_share(self.share_for(&s)?);
        }
        Ok(cache)
    }

    /// The shared tier of `cfg` for this model; refused where its tables take row updates
    /// (the remote placement follows the cluster's update streams; live tables are written):
    /// a replica cannot tell which of another's entries read a row written since.
    fn share_for(&self, cfg: &ShareConfig) -> Result<share::Share> {
        let refuse = |reason: String| ModelError::BadOption {
            option: "history_share",
            reason,
        };
        let tables = self.embeddings.tables();
        if let Some(t) = tables.iter().find(|t| t.is_live()) {
            return Err(refuse(format!(
                "table '{}' takes row updates; shared entries cannot be retired when a row \
                 they read changes",
                t.name()
            )));
        }
        if let Some(t) = (self.config.tables.iter()).find(|t| t.placement.name() == "remote") {
            return Err(refuse(format!(
                "table '{}' is on the remote tier, which follows row updates; shared entries \
                 cannot be retired when a row they read changes",
                t.name
            )));
        }
        share::Share::connect(cfg, model_id(self))
            .map_err(|e| refuse(format!("connecting to {}: {e}", cfg.url)))
    }

    /// Its cache of users' histories, if it has one.
    pub fn history_cache(&self) -> Option<&std::sync::Arc<HistoryCache>> {
        self.history.as_ref()
    }

    /// Frees the model with `pause` after each table, as [`crate::Model::release`] does.
    pub fn release(self, pause: std::time::Duration) {
        let HstuModel {
            embeddings, stager, ..
        } = self;
        crate::model::release_tables(stager, embeddings, pause);
    }

    /// Lookup feature `f`'s columns in a row of a batch's lookups.
    pub(crate) fn cols(&self, f: usize) -> std::ops::Range<usize> {
        let c = self.embeddings.col_offset(f);
        c..c + self.config.hstu.hstu_embedding_table_dim
    }

    pub fn config(&self) -> &HstuModelConfig {
        &self.config
    }

    pub fn weights(&self) -> &HstuWeights {
        &self.weights
    }

    /// The embedding stage: tables and the lookup features over the token axis.
    pub fn embeddings(&self) -> &EmbeddingCollection {
        &self.embeddings
    }

    /// The tier's stager (inactive when every table is in memory).
    pub fn stager(&self) -> &Stager {
        &self.stager
    }

    /// The task names, in output order.
    pub fn tasks(&self) -> Vec<String> {
        self.config
            .hstu
            .multitask_configs
            .iter()
            .map(|t| t.task_name.clone())
            .collect()
    }

    /// FLOPs (a multiply-add is two) of one user's STU projections and attention.
    pub fn layer_flops(&self, u: &User) -> (f64, f64) {
        let h = &self.config.hstu;
        let n = u.uih.get(&h.uih_post_id_feature_name).map_or(0, Vec::len);
        let c = u
            .candidates
            .get(&h.candidates_querytime_feature_name)
            .map_or(0, Vec::len);
        let t = (self.config.contextual_slots() + n + c) as f64;
        let (_, attn_macs) = self.macs(n, c);
        (2.0 * t * self.projection_params() as f64, 2.0 * attn_macs)
    }

    /// Weights of every STU layer's projections (UVQK and output): multiply-adds per token.
    fn projection_params(&self) -> usize {
        self.weights
            .layers
            .iter()
            .map(|l| l.uvqk.weight().len() + l.output.weight().len())
            .sum()
    }

    /// Multiply-adds of the dense layers for one user: per token (the input MLPs, the
    /// projections), per candidate (the item MLP, the head) and the attention's pairs.
    pub fn macs(&self, history: usize, candidates: usize) -> (f64, f64) {
        let w = &self.weights;
        let t = (self.config.contextual_slots() + history + candidates) as f64;
        let c = candidates as f64;
        let mut token = w.content.macs() as f64;
        token += w.additional.as_ref().map_or(0, |m| m.macs()) as f64;
        token += w.action.as_ref().map_or(0, |a| a.mlp.macs()) as f64;
        let proj = self.projection_params();
        let dense = t * (token + proj as f64) + c * (w.item.macs() + w.head.macs()) as f64;
        let h = &self.config.hstu;
        let m = (self.config.contextual_slots() + history) as f64;
        let pairs = m * (m + 1.0) / 2.0 + c * (m + 1.0);
        let per_pair = (h.hstu_num_heads * (h.hstu_attn_qk_dim + h.hstu_attn_linear_dim)) as f64;
        (dense, pairs * per_pair * h.hstu_attn_num_layers as f64)
    }
}
