//! The occupancy autotuner's search space and its cache.
//!
//! For each launch group (tables of one dtype and load shape) and workload class (batch size,
//! mean bag length, each rounded to a power of two) the tuner times the kernel over a grid of
//! block sizes and register caps (a cap trades spills for more resident warps, i.e. more loads
//! in flight), then, for the combined variant, over prefetch depths at the best of those. The
//! winner is kept in a JSON file (`EMBER_TUNE_CACHE`, default `~/.cache/ember/cuda-tune.json`)
//! so that later runs start tuned.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{CudaError, Result};
use crate::kernels::{Launch, PoolConfig};

/// Block sizes tried.
pub const BLOCKS: [u32; 4] = [64, 128, 256, 512];
/// Register caps tried (0: the compiler's choice).
pub const REG_CAPS: [u32; 5] = [0, 32, 40, 48, 64];
/// Prefetch depths tried by the combined variant.
pub const PREFETCH: [u32; 4] = [1, 2, 4, 8];

/// The first stage: every block size and register cap at prefetch depth `prefetch`. An
/// uncapped kernel carries `__launch_bounds__(block)`; a capped one is compiled with
/// `--maxrregcount` (which NVRTC ignores for kernels with launch bounds).
pub fn occupancy_grid(prefetch: u32) -> Vec<Launch> {
    let mut v = Vec::new();
    for &block in &BLOCKS {
        for &cap in &REG_CAPS {
            v.push(Launch {
                block,
                max_regs: cap,
                prefetch,
            });
        }
    }
    v
}

/// The second stage: prefetch depths at the best occupancy setting.
pub fn prefetch_grid(best: Launch) -> Vec<Launch> {
    PREFETCH
        .iter()
        .map(|&prefetch| Launch { prefetch, ..best })
        .collect()
}

/// A tuned choice and what it measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TuneChoice {
    pub launch: Launch,
    /// Median time of one launch, microseconds.
    pub micros: f64,
    /// Microseconds of the baseline launch on the same workload.
    pub baseline_micros: f64,
}

/// The cache key of a launch group on a device and workload class.
pub fn key(
    device: &str,
    cfg: &PoolConfig,
    dims: &[usize],
    batch: usize,
    mean_bag: f64,
    with_prefetch: bool,
) -> String {
    let bucket = |x: f64| (x.max(1.0)).log2().round() as i32;
    format!(
        "{device}|{}|dims={:?}|batch~2^{}|bag~2^{}|{}",
        cfg.name(),
        dims,
        bucket(batch as f64),
        bucket(mean_bag),
        if with_prefetch { "combined" } else { "tuned" }
    )
}

/// Tuned choices, loaded from and saved to a JSON file.
#[derive(Debug, Clone, Default)]
pub struct TuneCache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, TuneChoice>,
}

impl TuneCache {
    /// The default file: `$EMBER_TUNE_CACHE`, else `$HOME/.cache/ember/cuda-tune.json`.
    pub fn default_path() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("EMBER_TUNE_CACHE") {
            return Some(PathBuf::from(p));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ember/cuda-tune.json"))
    }

    /// A cache kept in memory only.
    pub fn in_memory() -> TuneCache {
        TuneCache::default()
    }

    /// Loads `path` (a missing file is an empty cache; a damaged one is an error).
    pub fn load(path: &Path) -> Result<TuneCache> {
        let path_text = || path.display().to_string();
        let entries = match ember_embed::files::read_limited(path, "tuning cache", 16 << 20) {
            Ok(b) => serde_json::from_slice(&b).map_err(|source| CudaError::TuneCacheJson {
                path: path_text(),
                source,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(CudaError::TuneCache {
                    path: path_text(),
                    source,
                });
            }
        };
        Ok(TuneCache {
            path: Some(path.to_path_buf()),
            entries,
        })
    }

    pub fn get(&self, key: &str) -> Option<&TuneChoice> {
        self.entries.get(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records a choice and writes the file (atomically: a temporary file, then a rename). A
    /// file that cannot be written costs only the next run's tuning: it is reported on stderr,
    /// not returned.
    pub fn insert(&mut self, key: String, choice: TuneChoice) {
        self.entries.insert(key, choice);
        if let Err(e) = self.save() {
            eprintln!("warning: {e}; tuned choices are kept for this run only");
        }
    }

    fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let io = |source| CudaError::TuneCache {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(&self.entries).map_err(|source| {
            CudaError::TuneCacheJson {
                path: path.display().to_string(),
                source,
            }
        })?;
        std::fs::write(&tmp, body).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Shape;
    use ember_embed::{DType, Pooling};

    #[test]
    fn grids_cover_the_space_and_promise_only_what_the_cap_allows() {
        let g = occupancy_grid(1);
        assert_eq!(g.len(), BLOCKS.len() * REG_CAPS.len());
        assert!(g.contains(&Launch::BASELINE));
        for l in &g {
            // A block fits one SM's 64K registers under any cap tried.
            assert!(l.block * l.max_regs <= 65536, "{l:?}");
        }
        let p = prefetch_grid(g[5]);
        assert_eq!(p.len(), PREFETCH.len());
        assert!(
            p.iter()
                .all(|l| l.block == g[5].block && l.max_regs == g[5].max_regs)
        );
    }

    #[test]
    fn the_cache_round_trips_through_its_file_and_refuses_damage() {
        let dir = std::env::temp_dir().join(format!("ember-tune-{}", std::process::id()));
        let path = dir.join("sub/tune.json");
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = TuneCache::load(&path).unwrap();
        assert!(c.is_empty());
        let cfg = PoolConfig {
            dtype: DType::F32,
            shape: Shape::for_table(DType::F32, 128),
            launch: Launch::BASELINE,
            id64: true,
            pooling: Pooling::Sum,
            pin: false,
        };
        let k = key("NVIDIA H100", &cfg, &[128; 12], 2048, 150.0, true);
        assert!(k.contains("batch~2^11") && k.contains("bag~2^7"), "{k}");
        let choice = TuneChoice {
            launch: Launch {
                block: 128,
                max_regs: 48,
                prefetch: 4,
            },
            micros: 812.5,
            baseline_micros: 1400.0,
        };
        c.insert(k.clone(), choice);
        let back = TuneCache::load(&path).unwrap();
        assert_eq!(back.get(&k), Some(&choice));
        assert_eq!(back.len(), 1);
        std::fs::write(&path, b"{ not json").unwrap();
        let e = TuneCache::load(&path).unwrap_err().to_string();
        assert!(e.contains("tune.json"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cache_errors_keep_their_cause_as_the_source() {
        use std::error::Error as _;
        let dir = std::env::temp_dir().join(format!("ember-tune-src-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Damaged: serde_json's error, printed as the text variant printed it.
        let path = dir.join("tune.json");
        std::fs::write(&path, b"{ not json").unwrap();
        let e = TuneCache::load(&path).unwrap_err();
        assert!(matches!(e, CudaError::TuneCacheJson { .. }), "{e:?}");
        let json = e
            .source()
            .and_then(|s| s.downcast_ref::<serde_json::Error>());
        assert!(json.is_some_and(|j| j.is_syntax()), "{e:?}");
        let parse = serde_json::from_slice::<BTreeMap<String, TuneChoice>>(b"{ not json");
        let old = format!("autotune cache {}: {}", path.display(), parse.unwrap_err());
        assert_eq!(e.to_string(), old);
        // Unreadable (a directory): the I/O error.
        let e = TuneCache::load(&dir).unwrap_err();
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(|io| io.kind()),
            Some(std::io::ErrorKind::InvalidInput),
            "{e:?}"
        );
        let read = ember_embed::files::read_limited(&dir, "tuning cache", 16 << 20);
        let old = format!("autotune cache {}: {}", dir.display(), read.unwrap_err());
        assert_eq!(e.to_string(), old);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
