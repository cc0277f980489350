//! Flags of the tiers shared by `predict` and `serve`: they override config.json's table
//! placement and `tier` object, and set an HSTU model's cache of users' histories (DRAM and
//! its disk spill).

use anyhow::{Context, Result};
use clap::Args;
use ember_embed::Placement;
use ember_model::config::TierConfig;
use ember_model::{LoadOptions, Model, RemoteOverride};
use ember_tier::{CachePolicy, IoMode};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Args)]
pub struct TierArgs {
    /// Place every table so: dram, mmap, ssd or remote (ssd and mmap read rows/NAME.rows,
    /// written by `ember convert`; remote reads the cluster of --redis, pushed there by `ember
    /// registry push`) [default: each table's placement in config.json, else dram].
    #[arg(long)]
    placement: Option<Placement>,
    /// DRAM budget of the SSD tier's row cache, in MiB [default: config.json's tier.cache_mb, else 1024].
    #[arg(long)]
    cache_mb: Option<usize>,
    /// Row cache policy of the SSD tier: lru, lfu (with TinyLFU admission) or pinned.
    #[arg(long)]
    cache_policy: Option<CachePolicy>,
    /// Batches whose missing rows are read ahead of the one being computed (0: each batch reads
    /// its own rows when it runs).
    #[arg(long)]
    prefetch_depth: Option<usize>,
    /// How the SSD tier reads row files: auto, uring or pread (direct I/O), or mmap (a plain
    /// mapping, through the page cache).
    #[arg(long)]
    io: Option<IoMode>,
    /// An id trace (one id per line) whose hottest ids the pinned policy pins at start.
    #[arg(long)]
    pin_trace: Option<PathBuf>,
    /// The Redis Cluster of the tables placed remote: redis://[user:password@]host:port[,...]
    /// [default: config.json's remote.redis].
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// The model's name in the registry [default: the model directory's name]. (--store-model:
    /// the old name, for one release.)
    #[arg(long, visible_alias = "store-model")]
    registry_model: Option<String>,
    /// The version in the registry to serve [default: the newest ready one at start].
    /// (--store-version: the old name, for one release.)
    #[arg(long, visible_alias = "store-version")]
    registry_version: Option<u64>,
    /// Deadline of one batch's remote fetch, retries included, in ms [default: 100].
    #[arg(long)]
    redis_timeout_ms: Option<u64>,
    /// Retries of a failed remote fetch within its deadline [default: 2].
    #[arg(long)]
    redis_retries: Option<u32>,
    /// Spread remote reads over the replicas as well as the primaries.
    #[arg(long)]
    read_from_replicas: bool,
    /// Read tables placed remote from their local row files (rows/NAME.rows, written by `ember
    /// convert`) while the cluster cannot answer: serving goes on through a failed node or a
    /// whole-cluster outage.
    #[arg(long)]
    remote_fallback: bool,
    /// Pool each batch's missing rows on the cluster's nodes (the EMBER.POOL module): auto
    /// (where the nodes have it), on (refuse to start when a primary lacks it) or off (rows read
    /// whole) [default: config.json's remote.pool_remote, else auto].
    #[arg(long, value_name = "MODE")]
    pool_remote: Option<ember_tier::storage::remote::PoolRemote>,
    /// HSTU models: a cache of users' history states of this many MiB (0: none), so that a
    /// returning user's request computes only its new actions and its candidates
    /// (docs/hstu.md, "A cache of users' histories").
    #[arg(long, default_value_t = 0, value_name = "MIB")]
    history_cache_mb: usize,
    /// Which entry the history cache evicts first: lru or lfu.
    #[arg(long, default_value = "lru")]
    history_cache_eviction: ember_model::hstu::Eviction,
    /// What a cached entry may stand for: stale (states computed at the user's earlier
    /// requests, within 256 appended actions and 7 days) or exact (a repeat only).
    #[arg(long, default_value = "stale")]
    history_reuse: ember_model::hstu::Reuse,
    /// Spill history entries evicted from DRAM to files under this directory (on an SSD),
    /// read back when their user returns (checksummed; a damaged file is recomputed).
    #[arg(long, value_name = "DIR")]
    history_spill_dir: Option<PathBuf>,
    /// The most MiB the spilled history entries hold.
    #[arg(long, default_value_t = 16384, value_name = "MIB")]
    history_spill_mb: u64,
    /// Share history entries with other replicas of the model through this Redis Cluster
    /// (redis://[user:password@]host:port[,host:port...]): a user's states are found whichever
    /// replica computed them. Refused for tables that take row updates.
    #[arg(long, value_name = "URL")]
    history_share: Option<String>,
    /// Seconds a shared entry stays in the cluster after its last write.
    #[arg(long, default_value_t = 86_400, value_name = "S")]
    history_share_ttl_s: u64,
    /// Deadline of one read or write of a shared entry; past it the user is recomputed.
    #[arg(long, default_value_t = 100, value_name = "MS")]
    history_share_timeout_ms: u64,
}

impl TierArgs {
    /// `--redis`, if given.
    pub fn redis(&self) -> Option<&str> {
        self.redis.as_deref()
    }

    /// Load options with the placement override.
    pub fn load_options(
        &self,
        table_dtype: Option<ember_embed::DType>,
        dense_dtype: Option<ember_model::DenseDType>,
    ) -> LoadOptions {
        LoadOptions {
            table_dtype,
            dense_dtype,
            placement: self.placement,
            remote: RemoteOverride {
                redis: self.redis.clone(),
                model: self.registry_model.clone(),
                version: self.registry_version,
                timeout_ms: self.redis_timeout_ms,
                retries: self.redis_retries,
                read_from_replicas: self.read_from_replicas.then_some(true),
                fallback_local: self.remote_fallback.then_some(true),
                pool_remote: self.pool_remote,
            },
            pace: Default::default(),
            name: None,
            history_cache: self.history_cache(),
        }
    }

    /// The history cache the flags ask for.
    fn history_cache(&self) -> Option<ember_model::hstu::HistoryCacheConfig> {
        (self.history_cache_mb > 0).then(|| ember_model::hstu::HistoryCacheConfig {
            bytes: self.history_cache_mb << 20,
            eviction: self.history_cache_eviction,
            reuse: self.history_reuse,
            spill: (self.history_spill_dir.clone()).map(|dir| ember_model::hstu::SpillConfig {
                dir,
                bytes: self.history_spill_mb << 20,
            }),
            share: (self.history_share.clone()).map(|url| ember_model::hstu::ShareConfig {
                url,
                ttl_s: self.history_share_ttl_s,
                timeout: std::time::Duration::from_millis(self.history_share_timeout_ms),
            }),
        })
    }

    /// Applies the tier flags to a loaded model (a fresh cache when any is given).
    pub fn apply(&self, model: &mut Model, dir: &Path) -> Result<()> {
        if let Some(d) = self.prefetch_depth {
            model.set_prefetch_depth(d);
        }
        if let Some(t) = self.tier_config(model.config().tier.as_ref())? {
            model.set_tier(dir, t).context("setting up the SSD tier")?;
        }
        Ok(())
    }

    /// Loads the model in `dir`, whichever family it is, with `opts` (from
    /// [`TierArgs::load_options`]) and these flags' tier: `predict`'s and the model
    /// repository's one load.
    pub fn load_any(
        &self,
        dir: &Path,
        opts: LoadOptions,
    ) -> Result<std::sync::Arc<dyn ember_model::serving::Servable>> {
        if ember_model::hstu::HstuModel::is_hstu_dir(dir) {
            return Ok(std::sync::Arc::new(self.load_hstu(dir, opts)?));
        }
        if opts.history_cache.is_some() {
            anyhow::bail!(
                "--history-cache-mb caches users' histories of an hstu model; {} is not one \
                 (leave it out)",
                dir.display()
            );
        }
        let mut model =
            Model::load(dir, opts).with_context(|| format!("loading model {}", dir.display()))?;
        self.apply(&mut model, dir)?;
        Ok(std::sync::Arc::new(model))
    }

    /// Loads the HSTU model in `dir` with `opts` (from [`TierArgs::load_options`]) and these
    /// flags' SSD tier.
    pub fn load_hstu(&self, dir: &Path, opts: LoadOptions) -> Result<ember_model::hstu::HstuModel> {
        self.refuse_prefetch_for_hstu()?;
        let mut model = ember_model::hstu::HstuModel::load(dir, opts)
            .with_context(|| format!("loading model {}", dir.display()))?;
        if let Some(t) = self.tier_config(model.config().tier.as_ref())? {
            model.set_tier(dir, t).context("setting up the SSD tier")?;
        }
        if let Some(c) = model.history_cache() {
            let c = c.config();
            tracing::info!(
                "history cache: {} MiB, {:?} eviction, reuse {}",
                c.bytes >> 20,
                c.eviction,
                c.reuse
            );
        }
        Ok(model)
    }

    /// `--prefetch-depth` sets how far a DLRM model's tier pipeline reads ahead; an HSTU model
    /// stages each batch's rows on the thread that runs it, so the flag is refused, not ignored.
    fn refuse_prefetch_for_hstu(&self) -> Result<()> {
        if self.prefetch_depth.is_some() {
            anyhow::bail!(
                "--prefetch-depth sets how far a DLRM model's SSD pipeline reads ahead; an hstu \
                 model stages each batch's rows on the thread that runs it (leave it out)"
            );
        }
        Ok(())
    }

    /// `base` (config.json's `tier` object) with the flags given applied; `None` when no cache
    /// flag is given (the tier stays as loaded).
    pub fn tier_config(&self, base: Option<&TierConfig>) -> Result<Option<TierConfig>> {
        if self.cache_mb.is_none()
            && self.cache_policy.is_none()
            && self.io.is_none()
            && self.pin_trace.is_none()
        {
            return Ok(None);
        }
        let mut t = base.cloned().unwrap_or_default();
        if let Some(v) = self.cache_mb {
            t.cache_mb = v;
        }
        if let Some(v) = self.cache_policy {
            t.policy = v.name().into();
        }
        if let Some(v) = self.prefetch_depth {
            t.prefetch_depth = v;
        }
        if let Some(v) = self.io {
            t.io = v.name().into();
        }
        if let Some(p) = &self.pin_trace {
            let abs =
                std::path::absolute(p).with_context(|| format!("--pin-trace {}", p.display()))?;
            t.pin_trace = Some(abs.display().to_string());
        }
        Ok(Some(t))
    }
}
