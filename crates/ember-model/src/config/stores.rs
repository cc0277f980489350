//! The `tier` and `remote` objects of a `config.json`: where tables placed off DRAM are read
//! from and how they are cached.

use ember_tier::{CachePolicy, IoMode, TierOptions};
use serde::{Deserialize, Serialize};

use crate::error::Invalid;

/// The `remote` object: the Redis Cluster holding the tables placed `remote` (pushed there by
/// `ember registry push`), and how long a fetch may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `redis://[user:password@]host:port[,host:port...]`: any nodes of the cluster.
    pub redis: String,
    /// The model's name in the store [default: the model directory's name].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The version to serve [default: the newest ready one at start].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// Deadline of one batch's fetch, retries included, in milliseconds.
    #[serde(default = "default_remote_timeout_ms")]
    pub timeout_ms: u64,
    /// Retries of a failed fetch within its deadline.
    #[serde(default = "default_remote_retries")]
    pub retries: u32,
    /// Spread reads over the replicas as well as the primaries.
    #[serde(default)]
    pub read_from_replicas: bool,
    /// Also open each remote table's local row file (`rows/NAME.rows`, written by `ember
    /// convert`) and read it while the cluster cannot answer: serving goes on through a node
    /// failure or a whole-cluster outage, and back to the cluster once it answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fallback_local: bool,
    /// Pool a batch's missing rows on the nodes that hold them (`EMBER.POOL`, the Redis module
    /// `crates/ember-redis-module`): `auto` where the nodes have the module, `on` (a server
    /// refuses to start when a primary lacks it), `off` (rows read whole).
    #[serde(default = "default_pool_remote")]
    pub pool_remote: String,
}

fn default_pool_remote() -> String {
    "auto".into()
}

fn default_remote_timeout_ms() -> u64 {
    100
}
fn default_remote_retries() -> u32 {
    2
}

impl RemoteConfig {
    /// A config for the cluster at `redis` with the defaults.
    pub fn new(redis: &str) -> Self {
        RemoteConfig {
            redis: redis.into(),
            model: None,
            version: None,
            timeout_ms: default_remote_timeout_ms(),
            retries: default_remote_retries(),
            read_from_replicas: false,
            fallback_local: false,
            pool_remote: default_pool_remote(),
        }
    }

    /// The stager's source: `dir_name` names the model when `model` does not.
    pub fn source(
        &self,
        dir_name: &str,
    ) -> std::result::Result<ember_tier::storage::remote::RemoteSource, Invalid> {
        let mut cluster = ember_tier::storage::remote::ClusterOptions::parse(&self.redis)
            .map_err(|e| format!("remote.redis: {e}"))?;
        if self.timeout_ms == 0 {
            return Err("remote.timeout_ms must be at least 1".into());
        }
        cluster.timeout = std::time::Duration::from_millis(self.timeout_ms);
        cluster.retries = self.retries;
        cluster.read_from_replicas = self.read_from_replicas;
        Ok(ember_tier::storage::remote::RemoteSource {
            cluster,
            model: self.model.clone().unwrap_or_else(|| dir_name.to_string()),
            version: self.version,
        })
    }
}

/// The `tier` object: settings of the SSD tier (used when a table has `"placement": "ssd"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// DRAM budget of the row cache in MiB, shared by the tier tables.
    #[serde(default = "default_cache_mb")]
    pub cache_mb: usize,
    /// `lru`, `lfu` (LFU with TinyLFU admission) or `pinned`.
    #[serde(default = "default_policy")]
    pub policy: String,
    /// Batches staged ahead of the one being computed where batches are known ahead (`predict`).
    #[serde(default = "default_depth")]
    pub prefetch_depth: usize,
    /// `auto`, `uring`, `pread` or `mmap`.
    #[serde(default = "default_io")]
    pub io: String,
    /// Reads in flight at most.
    #[serde(default = "default_queue_depth")]
    pub queue_depth: usize,
    /// An id trace (one id per line, relative to the model directory) profiled for the pinned set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_trace: Option<String>,
    /// Re-pin from live counts every this many batches (0: never).
    #[serde(default)]
    pub refresh_batches: usize,
}

fn default_cache_mb() -> usize {
    1024
}
fn default_policy() -> String {
    "lfu".into()
}
fn default_depth() -> usize {
    1
}
fn default_io() -> String {
    "auto".into()
}
fn default_queue_depth() -> usize {
    128
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            cache_mb: default_cache_mb(),
            policy: default_policy(),
            prefetch_depth: default_depth(),
            io: default_io(),
            queue_depth: default_queue_depth(),
            pin_trace: None,
            refresh_batches: 0,
        }
    }
}

impl TierConfig {
    /// The options of a [`ember_tier::Stager`] (the pin trace is read by the caller).
    pub fn options(&self) -> std::result::Result<TierOptions, Invalid> {
        let policy: CachePolicy = self
            .policy
            .parse()
            .map_err(|e| format!("tier.policy: {e}"))?;
        let io: IoMode = self.io.parse().map_err(|e| format!("tier.io: {e}"))?;
        if self.queue_depth == 0 {
            return Err("tier.queue_depth must be at least 1".into());
        }
        Ok(TierOptions {
            cache_bytes: self.cache_mb.saturating_mul(1 << 20),
            policy,
            io,
            queue_depth: self.queue_depth,
            refresh_batches: self.refresh_batches,
            ..TierOptions::default()
        })
    }
}

/// What a command line overrides in config.json's `remote` object; `redis` is needed where the
/// config has none.
#[derive(Debug, Clone, Default)]
pub struct RemoteOverride {
    pub redis: Option<String>,
    pub model: Option<String>,
    pub version: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub retries: Option<u32>,
    pub read_from_replicas: Option<bool>,
    pub fallback_local: Option<bool>,
    pub pool_remote: Option<ember_tier::storage::remote::PoolRemote>,
}

impl RemoteOverride {
    /// `config` with these overrides (`None` when neither gives a cluster).
    pub fn apply(&self, config: Option<RemoteConfig>) -> Option<RemoteConfig> {
        let mut c = match (config, &self.redis) {
            (Some(mut c), Some(url)) => {
                c.redis = url.clone();
                c
            }
            (Some(c), None) => c,
            (None, Some(url)) => RemoteConfig::new(url),
            (None, None) => return None,
        };
        if let Some(m) = &self.model {
            c.model = Some(m.clone());
        }
        if let Some(v) = self.version {
            c.version = Some(v);
        }
        if let Some(v) = self.timeout_ms {
            c.timeout_ms = v;
        }
        if let Some(v) = self.retries {
            c.retries = v;
        }
        if let Some(v) = self.read_from_replicas {
            c.read_from_replicas = v;
        }
        if let Some(v) = self.fallback_local {
            c.fallback_local = v;
        }
        if let Some(v) = self.pool_remote {
            c.pool_remote = v.name().into();
        }
        Some(c)
    }
}
