//! Loading a model's version from the repository directory, warming it, swapping it in and
//! retiring the version it replaces.
//!
//! The directory is Triton's layout: `ROOT/<name>/<version>/`, a version a positive integer and
//! its directory an Ember model directory (`config.json`, `model.safetensors`, and `rows/` for
//! tables on the SSD tier). Names start with a letter or digit and hold `A-Z a-z 0-9 _ - .`;
//! anything else under `ROOT` or `ROOT/<name>` (a `.tmp` directory being copied, a
//! `config.pbtxt`) is ignored, so a version can be written elsewhere and renamed in whole.
//!
//! A version is read on a thread of the idle scheduling class so that serving keeps the cores;
//! its engine is built and warmed (a few batches of random samples, which also fault in what the
//! load did not touch) at normal priority, since the engine's threads go on to serve.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_model::serving::{Outputs, Runner, Servable};
use ember_model::{LoadOptions, Pace};

use super::{Entry, Repository, Served, State, Status};
use crate::batcher::Batcher;
use crate::error::{Result, ServeError};
use crate::metrics as m;
use crate::server_error::LoadError;
use crate::spec::ModelSpec;

/// Reads a model version and builds what runs it. The server calls it off the request path.
pub trait Loader: Send + Sync + std::fmt::Debug {
    /// Reads model `name` from `dir` (the slow part, run at lower priority), copying its tables
    /// as `pace` says (paced and breathing while other versions serve). `name` is the model's
    /// name in the repository (`dir` is one of its versions), the default name of its remote
    /// tables' model in the store. Errors name the file.
    fn load(
        &self,
        name: &str,
        dir: &Path,
        pace: Pace,
    ) -> std::result::Result<Arc<dyn Servable>, LoadError>;
    /// The runner of `model` (its threads serve, so this runs at normal priority).
    fn engine(&self, model: Arc<dyn Servable>) -> std::result::Result<Box<dyn Runner>, LoadError>;
}

/// Loads model directories of any family with `options` and runs them on the CPU with
/// `threads` threads.
#[derive(Debug, Clone, Default)]
pub struct DiskLoader {
    pub options: LoadOptions,
    pub threads: usize,
}

impl Loader for DiskLoader {
    fn load(
        &self,
        name: &str,
        dir: &Path,
        pace: Pace,
    ) -> std::result::Result<Arc<dyn Servable>, LoadError> {
        let opts = LoadOptions {
            pace,
            name: Some(name.into()),
            ..self.options.clone()
        };
        Ok(ember_model::serving::load(dir, opts)?)
    }

    fn engine(&self, model: Arc<dyn Servable>) -> std::result::Result<Box<dyn Runner>, LoadError> {
        model
            .cpu_runner(self.threads.max(1))
            .map_err(LoadError::Predictor)
    }
}

/// Where a repository's models come from.
#[derive(Debug, Clone)]
pub struct RepositoryConfig {
    /// The repository directory: `ROOT/<name>/<version>/`.
    pub root: PathBuf,
    pub loader: Arc<dyn Loader>,
    /// How often the directory is scanned for new, changed and removed versions (`None`: never;
    /// the repository API still loads and unloads).
    pub poll: Option<Duration>,
    /// Batches of random samples run on a new version before it takes requests.
    pub warm_batches: usize,
    /// Bytes per second a version's tables are copied at while another version serves (`None`:
    /// unpaced). The first loads, before the server takes requests, are never paced.
    pub pace_bytes_per_s: Option<u64>,
    /// Serve one model from the registry alone, following the version it says to serve;
    /// `root` then holds the versions fetched (`None`: serve the models under `root`).
    pub registry: Option<super::RegistryFollow>,
}

/// Whether `name` may name a model or version directory.
fn usable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn read_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| {
        ServeError::NotFound(format!("cannot read the directory {}: {e}", dir.display()))
    })?;
    let mut out = Vec::new();
    for e in rd.flatten() {
        let path = e.path();
        if let Some(name) = e.file_name().to_str()
            && usable(name)
            && path.is_dir()
        {
            out.push((name.to_string(), path));
        }
    }
    Ok(out)
}

/// The model directories under `root`, by name.
pub fn model_dirs(root: &Path) -> Result<Vec<String>> {
    let mut v: Vec<String> = read_dir(root)?.into_iter().map(|e| e.0).collect();
    v.sort();
    Ok(v)
}

/// The newest version directory of the model in `dir` (positive integers; others ignored).
pub fn newest_version(dir: &Path) -> Result<(u64, PathBuf)> {
    read_dir(dir)?
        .into_iter()
        .filter_map(|(n, p)| Some((n.parse::<u64>().ok().filter(|&v| v > 0)?, p)))
        .max_by_key(|e| e.0)
        .ok_or_else(|| {
            ServeError::NotFound(format!(
                "{} has no version directory: a model's versions are {}/<number>/, each holding \
                 config.json and model.safetensors",
                dir.display(),
                dir.display()
            ))
        })
}

/// What a version's files look like on disk (sizes and modification times), to retry a failed
/// version only once it changed.
pub(super) fn stamp(dir: &Path) -> Vec<(u64, Option<std::time::SystemTime>)> {
    ["config.json", "model.safetensors"]
        .iter()
        .map(|f| match std::fs::metadata(dir.join(f)) {
            Ok(md) => (md.len(), md.modified().ok()),
            Err(_) => (0, None),
        })
        .collect()
}

impl Repository {
    pub(super) fn source(&self) -> Result<&RepositoryConfig> {
        self.source.as_ref().ok_or_else(|| {
            ServeError::bad(
                "this server serves one model given at start (--model); start it with \
                 --model-repository DIR to load and unload models",
            )
        })
    }

    /// Loads the newest version of every model under the repository directory; errors name
    /// every model that failed.
    pub fn load_all(&self) -> Result<()> {
        if self.registry_follow().is_some() {
            return self.sync_registry().map(|_| ());
        }
        let root = self.source()?.root.clone();
        let mut failed = Vec::new();
        for name in model_dirs(&root)? {
            if let Err(e) = self.load(&name) {
                failed.push(e.to_string());
            }
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(ServeError::bad(failed.join("; "))),
        }
    }

    /// Loads (or reloads) model `name`'s newest version from the repository directory, and swaps
    /// it in for the version served. On failure the served version, if any, stays.
    pub fn load(&self, name: &str) -> Result<u64> {
        let src = self.source()?;
        if let Some(f) = &src.registry {
            if name != f.name {
                return Err(ServeError::NotFound(format!(
                    "no model '{name}': this server serves '{}' from the registry",
                    f.name
                )));
            }
            self.set_held(name, false);
            return self.sync_registry();
        }
        if !usable(name) {
            return Err(ServeError::NotFound(format!(
                "'{name}' cannot name a model: use A-Z a-z 0-9 _ - . (not starting with . _ -)"
            )));
        }
        let _one = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let dir = src.root.join(name);
        if !dir.is_dir() {
            return Err(ServeError::NotFound(format!(
                "no model '{name}' in the repository: {} is not a directory",
                dir.display()
            )));
        }
        let (version, vdir) = newest_version(&dir)?;
        self.set_held(name, false);
        self.swap_in(src, name, version, &vdir)?;
        Ok(version)
    }

    /// Stops serving model `name` and frees it once the requests running on it are answered.
    pub fn unload(&self, name: &str) -> Result<()> {
        self.source()?;
        let _one = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let old = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let Some(e) = models.get_mut(name) else {
                return Err(ServeError::NotFound(format!("unknown model '{name}'")));
            };
            let old = e.current.take();
            e.held = true;
            if let Some(o) = &old {
                e.versions.insert(o.version, Status::new(State::Unloading));
            }
            old
        };
        if let Some(old) = old {
            let v = old.version;
            self.retire(old);
            self.set_status(name, v, State::Unavailable, "unloaded".into());
            tracing::info!("model '{name}' version {v} unloaded");
        }
        Ok(())
    }

    /// Loads `version` of `name` from `dir`, warms it and swaps it in.
    pub(super) fn swap_in(
        &self,
        src: &RepositoryConfig,
        name: &str,
        version: u64,
        dir: &Path,
    ) -> Result<()> {
        let start = Instant::now();
        self.set_status(name, version, State::Loading, String::new());
        tracing::info!(
            "loading model '{name}' version {version} from {}",
            dir.display()
        );
        let built = self.build(src, name, version, dir);
        let took = start.elapsed().as_secs_f64();
        let served = match built {
            Ok(s) => s,
            Err(e) => {
                let reason = e.to_string();
                self.set_status(name, version, State::Unavailable, reason.clone());
                m::model_load(name, false, took);
                tracing::warn!("model '{name}' version {version} failed to load: {reason}");
                return Err(e.answer(format!(
                    "model '{name}' version {version} failed to load: {reason}"
                )));
            }
        };
        let old = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let e: &mut Entry = models.entry(name.to_string()).or_default();
            e.versions.insert(version, Status::new(State::Ready));
            let old = e.current.replace(Arc::new(served));
            if let Some(o) = old.as_ref().filter(|o| o.version != version) {
                e.versions.insert(o.version, Status::new(State::Unloading));
            }
            old
        };
        m::model_load(name, true, took);
        m::model_ready(name, version, true);
        tracing::info!(
            "model '{name}' version {version} serving (loaded and warmed in {took:.2} s)"
        );
        if let Some(old) = old {
            let v = old.version;
            self.retire(old);
            if v != version {
                self.set_status(
                    name,
                    v,
                    State::Unavailable,
                    format!("replaced by version {version}"),
                );
            }
        }
        Ok(())
    }

    /// Reads, builds and warms a version; the reason it failed otherwise.
    fn build(
        &self,
        src: &RepositoryConfig,
        name: &str,
        version: u64,
        dir: &Path,
    ) -> std::result::Result<Served, LoadError> {
        let loader = src.loader.clone();
        let dir2 = dir.to_path_buf();
        let pace = if self.served().is_empty() {
            Pace::default()
        } else {
            Pace::background(src.pace_bytes_per_s)
        };
        let model = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("ember-load".into())
                .spawn_scoped(s, move || {
                    super::lower_priority();
                    loader.load(name, &dir2, pace)
                })
                .map_err(LoadError::Thread)?
                .join()
                .map_err(|_| LoadError::Panicked)?
        })?;
        if self.is_stopped() {
            return Err(LoadError::Stopping);
        }
        let mut engines = Vec::with_capacity(self.batch.instances.max(1));
        for _ in 0..self.batch.instances.max(1) {
            engines.push(src.loader.engine(model.clone())?);
        }
        let took =
            warm_all(&mut engines, &self.batch, src.warm_batches).map_err(LoadError::Warm)?;
        let spec = ModelSpec::of(model, name);
        let batcher = Batcher::start_pool(engines, self.batch, name);
        batcher.prime(&took);
        Ok(Served::new(spec, version, batcher))
    }

    /// Waits (up to `RETIRE_GRACE`) until no request holds `old`, stops its batcher and frees it,
    /// on the calling thread (never a request's).
    fn retire(&self, old: Arc<Served>) {
        let end = Instant::now() + super::RETIRE_GRACE;
        while Arc::strong_count(&old) > 1 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(2));
        }
        old.batcher
            .shutdown_by(Instant::now() + Duration::from_secs(1));
        m::model_ready(old.name(), old.version, false);
        let model = old.spec.servable().clone();
        drop(old);
        free_quietly(model, FREE_WAIT);
    }
}

/// How long a retired version's model waits for its batcher's thread to let go of it.
const FREE_WAIT: Duration = Duration::from_secs(5);

/// The pause after each table a retired version frees.
const FREE_PAUSE: Duration = Duration::from_millis(1);

/// Frees a retired version's model on a thread of the idle class, one table at a time, once
/// every other holder (its batcher's thread) has let go of it, waiting up to `wait` (after
/// that, the last holder frees it). Returns when it is freed or left.
fn free_quietly(model: Arc<dyn Servable>, wait: Duration) {
    let end = Instant::now() + wait;
    let free = move || {
        super::lower_priority();
        let mut model = model;
        loop {
            match model.release(FREE_PAUSE) {
                None => return,
                Some(still_held) if Instant::now() < end => {
                    model = still_held;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Some(_) => return,
            }
        }
    };
    // A thread that does not start drops the closure, and the model with it, here.
    if let Ok(h) = std::thread::Builder::new()
        .name("ember-free".into())
        .spawn(free)
    {
        let _ = h.join();
    }
}

/// Batches of random samples a model runs before it serves (`ember serve` and each version a
/// repository loads).
pub const WARM_BATCHES: usize = 4;

/// [`warm`] for each of a model's runners, with requests of up to 128 items (within
/// `batch.max_batch`; the model may take fewer); every timing, for [`Batcher::prime`].
pub(crate) fn warm_all(
    engines: &mut [Box<dyn Runner>],
    batch: &crate::batcher::BatchConfig,
    batches: usize,
) -> ember_model::Result<Vec<(u64, Duration)>> {
    let n = batch.max_batch.min(128);
    let mut took = Vec::new();
    for e in engines {
        took.extend(warm(e.as_mut(), n, batches)?);
    }
    Ok(took)
}

/// Runs `batches` requests of up to `n` random items ([`Servable::warm_request`]: the model
/// bounds their size) through `engine`; returns how long each batch after the first (the
/// first faults in what the model touches) took, for the admission model to start from
/// ([`Batcher::prime`]). A batch whose rows a store could not give in time (a busy host, a
/// slow node) does not fail the load: the version serves as any version does when its store
/// is slow (503s naming it, readiness off), and stderr says so; any other failure does.
fn warm(
    engine: &mut dyn Runner,
    n: usize,
    batches: usize,
) -> ember_model::Result<Vec<(u64, Duration)>> {
    let model = engine.servable().clone();
    let mut out = Outputs::default();
    let mut slow = None;
    let mut took = Vec::with_capacity(batches);
    for b in 0..batches {
        let request = model.warm_request(n, 0x5eed + b as u64);
        let start = Instant::now();
        match engine.run_request(request.as_ref(), &mut out) {
            Err(e) if e.kind() == ember_model::ErrorKind::Unavailable => slow = Some(e),
            r => {
                r?;
                if b > 0 {
                    took.push((model.cost(request.as_ref()), start.elapsed()));
                }
            }
        }
    }
    if let Some(e) = slow {
        tracing::warn!("warming a version, a store did not answer in time ({e}); loading on");
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_versions_follow_the_layout() {
        assert!(usable("dlrm") && usable("rm1-v2.b") && usable("7"));
        assert!(!usable(".tmp") && !usable("_x") && !usable("a b") && !usable(""));
        let root = std::env::temp_dir().join(format!("ember-layout-{}", std::process::id()));
        let m = root.join("m");
        for d in ["1", "3", "12", "0", ".13", "x", "20.tmp"] {
            std::fs::create_dir_all(m.join(d)).unwrap();
        }
        std::fs::write(m.join("99"), b"a file, not a version").unwrap();
        std::fs::create_dir_all(root.join(".hidden")).unwrap();
        assert_eq!(model_dirs(&root).unwrap(), vec!["m".to_string()]);
        assert_eq!(newest_version(&m).unwrap().0, 12);
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let e = newest_version(&empty).unwrap_err().to_string();
        assert!(
            e.contains("no version directory") && e.contains("empty"),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn small_model() -> Arc<ember_model::Model> {
        let p = ember_model::presets::preset("small", ember_model::DType::F32).unwrap();
        Arc::new(ember_model::Model::random(p.config, 7, 1).unwrap())
    }

    #[test]
    fn a_retired_model_is_freed_once_its_last_other_holder_lets_go() {
        let model = small_model();
        let weak = Arc::downgrade(&model);
        let batcher = model.clone(); // a batcher's thread still running its last batch
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(batcher);
        });
        let start = Instant::now();
        free_quietly(model as Arc<dyn Servable>, Duration::from_secs(10));
        assert!(
            weak.upgrade().is_none(),
            "not freed when free_quietly returned"
        );
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "freed before the holder let go"
        );
        t.join().unwrap();
    }

    #[test]
    fn a_model_still_held_elsewhere_is_left_to_its_holder() {
        let model = small_model();
        let kept = model.clone();
        let start = Instant::now();
        free_quietly(model as Arc<dyn Servable>, Duration::from_millis(300));
        assert!(
            start.elapsed() >= Duration::from_millis(300),
            "gave up before its bound"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "waited without bound"
        );
        assert_eq!(Arc::strong_count(&kept), 1, "the holder's copy is whole");
        assert_eq!(kept.config().tables.len(), 8);
    }
}
