//! What a cache of users' histories is asked to be (`--history-cache-mb`, its eviction and
//! its reuse mode): the settings a model is loaded with ([`crate::LoadOptions`]); the cache
//! itself is `hstu/cache.rs`.

use ember_tier::UnknownName;

/// Which entry goes first when the cache is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Eviction {
    /// The least recently used.
    #[default]
    Lru,
    /// The least often used (ties: the least recently).
    Lfu,
}

impl std::str::FromStr for Eviction {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "lru" => Ok(Eviction::Lru),
            "lfu" => Ok(Eviction::Lfu),
            _ => Err(UnknownName {
                value: s.into(),
                expected: "lru, lfu",
            }),
        }
    }
}

/// When a held entry may stand for a user's first tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Only as computed for this very request's history length, candidate count and query time
    /// (a repeat with new candidates): the scores are the full recompute's, to f32 rounding.
    Exact,
    /// Tokens computed at earlier requests with their positions, time buckets and divisor of
    /// then, while the user has appended at most `max_appended` actions since the entry's
    /// oldest segment and its query time is at most `max_age_s` seconds after that segment's;
    /// past either bound the user is recomputed whole.
    Stale { max_appended: usize, max_age_s: i64 },
}

impl Reuse {
    /// The default: stale within 256 appended actions and 7 days (`docs/hstu.md` has what it
    /// keeps of the AUC and NE).
    pub const DEFAULT: Reuse = Reuse::Stale {
        max_appended: 256,
        max_age_s: 7 * 86_400,
    };
}

impl std::str::FromStr for Reuse {
    type Err = UnknownName;
    /// `exact`, `stale` (the default bound), or `stale:APPENDED:DAYS`.
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        let bad = || UnknownName {
            value: s.into(),
            expected: "exact, stale, stale:APPENDED:DAYS",
        };
        match s.split(':').collect::<Vec<_>>()[..] {
            ["exact"] => Ok(Reuse::Exact),
            ["stale"] => Ok(Reuse::DEFAULT),
            ["stale", n, days] => {
                let days: f64 = days.parse().map_err(|_| bad())?;
                if days.is_nan() || days < 0.0 {
                    return Err(bad());
                }
                Ok(Reuse::Stale {
                    max_appended: n.parse().map_err(|_| bad())?,
                    max_age_s: (days * 86_400.0).min(i64::MAX as f64) as i64,
                })
            }
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Reuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reuse::Exact => write!(
                f,
                "exact (only a repeat of the same history and query time)"
            ),
            Reuse::Stale {
                max_appended,
                max_age_s,
            } => write!(
                f,
                "stale (states kept from earlier requests while at most {max_appended} actions \
                 were appended and {:.1} days passed since the oldest)",
                *max_age_s as f64 / 86_400.0
            ),
        }
    }
}

impl Default for Reuse {
    fn default() -> Self {
        Reuse::DEFAULT
    }
}

/// A cache's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryCacheConfig {
    /// The most bytes its entries hold in DRAM.
    pub bytes: usize,
    pub eviction: Eviction,
    pub reuse: Reuse,
    /// Where entries evicted from DRAM go (`None`: they are dropped).
    pub spill: Option<SpillConfig>,
    /// A Redis Cluster that replicas of the model share entries through (`None`: not shared).
    pub share: Option<ShareConfig>,
}

/// The cache's shared tier (`hstu/share.rs`): a Redis Cluster's URL, how long an entry stays
/// there after its last write, and the deadline of one read or write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareConfig {
    pub url: String,
    pub ttl_s: u64,
    pub timeout: std::time::Duration,
}

/// The cache's disk tier: a directory (the cache writes under a directory of its own in it)
/// and the most bytes its files hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillConfig {
    pub dir: std::path::PathBuf,
    pub bytes: u64,
}
