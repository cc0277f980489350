//! The models a server serves, by name, and their versions (KServe v2 / Triton's model
//! repository extension).
//!
//! A server started on one model (`ember serve --model DIR`) holds that model as version 1. A
//! server started on a repository (`ember serve --model-repository DIR`, Triton's layout:
//! `DIR/<name>/<version>/` holding `config.json` and `model.safetensors`) serves the newest
//! version of every model under it (Triton's default version policy, `latest 1`), and loads,
//! reloads and unloads them while it serves ([`load`]):
//!
//! ```text
//! load (at lower priority, off the request path) -> engine -> warm (a few batches)
//!     -> swap (one write under the lock) -> retire the old version (wait for its requests, free)
//! ```
//!
//! A request takes the version it runs on once, as an [`Arc<Served>`], and keeps it until it is
//! answered: a request in flight during a swap finishes on the version it started on, and every
//! answer comes from exactly one version (its `model_version` says which).

pub mod load;
mod poll;
mod registry;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;

use crate::batcher::{BatchConfig, Batcher};
use crate::error::{Result, ServeError};
use crate::spec::ModelSpec;
pub(crate) use load::warm_all;
pub use load::{DiskLoader, Loader, RepositoryConfig, WARM_BATCHES};
pub(crate) use poll::spawn as spawn_poller;
pub use registry::RegistryFollow;
pub(crate) use registry::spawn as spawn_registry_follower;

/// One version of a model, serving.
#[derive(Debug)]
pub struct Served {
    pub spec: Arc<ModelSpec>,
    /// Its version number.
    pub version: u64,
    /// The same, as the protocol writes it.
    pub version_str: String,
    pub batcher: Arc<Batcher>,
    /// Its count of requests answered, registered once (the request path only increments).
    requests_ok: metrics::Counter,
}

impl Served {
    fn new(spec: ModelSpec, version: u64, batcher: Batcher) -> Self {
        let requests_ok = crate::metrics::model_requests_ok(&spec.name, version);
        Served {
            spec: Arc::new(spec),
            version,
            version_str: version.to_string(),
            batcher: Arc::new(batcher),
            requests_ok,
        }
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Counts a request it answered (or refused with `err`).
    pub(crate) fn count_request(&self, err: Option<&ServeError>) {
        crate::metrics::model_request(&self.requests_ok, self.name(), &self.version_str, err);
    }

    /// Whether it takes requests: false while a store its model reads rows from does not answer.
    pub fn is_ready(&self) -> bool {
        self.spec.servable().tier().store_healthy()
    }
}

/// A version's state, as the repository index shows it (Triton's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Loading,
    Ready,
    Unloading,
    Unavailable,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Loading => "LOADING",
            State::Ready => "READY",
            State::Unloading => "UNLOADING",
            State::Unavailable => "UNAVAILABLE",
        }
    }
}

#[derive(Debug, Clone)]
struct Status {
    state: State,
    /// Why it is unavailable (empty otherwise).
    reason: String,
}

/// A model: the version requests go to, and every version the server has tried.
#[derive(Debug, Default)]
struct Entry {
    current: Option<Arc<Served>>,
    versions: BTreeMap<u64, Status>,
    /// Unloaded by request: the poller leaves it alone until a load request.
    held: bool,
}

/// A line of the repository index.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    pub version: String,
    pub state: &'static str,
    pub reason: String,
}

/// The served models.
#[derive(Debug)]
pub struct Repository {
    models: RwLock<BTreeMap<String, Entry>>,
    /// Where models are loaded from; `None` for a server of one model given at start.
    source: Option<RepositoryConfig>,
    batch: BatchConfig,
    /// One load, reload or unload at a time (two loads at once would hold three versions).
    control: Mutex<()>,
    /// Set when the server stops: nothing is swapped in after.
    stopped: AtomicBool,
    /// The registry a model is followed in (`--from-registry`), once connected.
    registry_conn: Mutex<Option<ember_model::registry::RegistryModel>>,
}

impl Repository {
    /// A repository of the one model `served` as version 1; it cannot load others.
    pub(crate) fn single(
        name: &str,
        engines: Vec<Box<dyn ember_model::serving::Runner>>,
        batch: BatchConfig,
    ) -> Self {
        let spec = ModelSpec::of(engines[0].servable().clone(), name);
        let served = Arc::new(Served::new(
            spec,
            1,
            Batcher::start_pool(engines, batch, name),
        ));
        let mut entry = Entry::default();
        entry.versions.insert(1, Status::new(State::Ready));
        entry.current = Some(served);
        crate::metrics::model_ready(name, 1, true);
        Repository {
            models: RwLock::new(BTreeMap::from([(name.to_string(), entry)])),
            source: None,
            batch,
            control: Mutex::new(()),
            stopped: AtomicBool::new(false),
            registry_conn: Mutex::new(None),
        }
    }

    /// An empty repository reading `source` (load its models with [`Repository::load_all`]).
    pub(crate) fn open(source: RepositoryConfig, batch: BatchConfig) -> Self {
        crate::metrics::handle();
        Repository {
            models: RwLock::new(BTreeMap::new()),
            source: Some(source),
            batch,
            control: Mutex::new(()),
            stopped: AtomicBool::new(false),
            registry_conn: Mutex::new(None),
        }
    }

    /// The directory models are loaded from, if any.
    pub fn root(&self) -> Option<&PathBuf> {
        self.source.as_ref().map(|s| &s.root)
    }

    /// The version a request for `name` runs on: `version` (`""` names none: the served one).
    pub fn get(&self, name: &str, version: &str) -> Result<Arc<Served>> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = models.get(name) else {
            return Err(ServeError::NotFound(format!(
                "unknown model '{name}': this server serves {}",
                Self::names(&models)
            )));
        };
        if let Some(cur) = &entry.current
            && (version.is_empty() || version == cur.version_str)
        {
            return Ok(cur.clone());
        }
        let serving = match &entry.current {
            Some(c) => format!("it serves version '{}'", c.version),
            None => "no version of it is served".into(),
        };
        if version.is_empty() {
            // No version served: say what happened to each one tried.
            if let Some((v, _)) = entry
                .versions
                .iter()
                .rev()
                .find(|e| e.1.state == State::Loading)
            {
                return Err(ServeError::Unavailable(format!(
                    "model '{name}' is loading version {v}; {serving}"
                )));
            }
            let tried: Vec<String> = entry
                .versions
                .iter()
                .rev()
                .map(|(v, s)| format!("version {v}: {}", s.describe()))
                .collect();
            return Err(ServeError::NotFound(format!(
                "model '{name}' is not served ({})",
                tried.join("; ")
            )));
        }
        let v: u64 = version.parse().map_err(|_| {
            ServeError::NotFound(format!(
                "model '{name}' has no version '{version}' (versions are numbers; {serving})"
            ))
        })?;
        match entry.versions.get(&v) {
            Some(s) if s.state == State::Loading => Err(ServeError::Unavailable(format!(
                "model '{name}' version {v} is loading; {serving}"
            ))),
            Some(s) => Err(ServeError::NotFound(format!(
                "model '{name}' version {v} is not served ({}); {serving}",
                s.describe()
            ))),
            None => Err(ServeError::NotFound(format!(
                "model '{name}' has no version '{version}'; {serving}"
            ))),
        }
    }

    /// The model a request that names none runs on (`/v1/score`): `name` if given, else the
    /// only one served.
    pub fn get_default(&self, name: Option<&str>) -> Result<Arc<Served>> {
        if let Some(n) = name {
            return self.get(n, "");
        }
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let mut served = models.values().filter_map(|e| e.current.as_ref());
        match (served.next(), served.next()) {
            (Some(only), None) => Ok(only.clone()),
            (None, _) => Err(ServeError::Unavailable("no model is served".into())),
            _ => Err(ServeError::bad(format!(
                "this server serves {}: name one with ?model=NAME",
                Self::names(&models)
            ))),
        }
    }

    fn names(models: &BTreeMap<String, Entry>) -> String {
        let names: Vec<String> = models
            .iter()
            .filter(|e| e.1.current.is_some())
            .map(|e| format!("'{}'", e.0))
            .collect();
        match names.is_empty() {
            true => "no model".into(),
            false => names.join(", "),
        }
    }

    /// Every version serving now, in model-name order.
    pub fn served(&self) -> Vec<Arc<Served>> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.values().filter_map(|e| e.current.clone()).collect()
    }

    /// The index: every model and version the server has tried, with its state; `ready_only`
    /// keeps the ready ones. Models on disk not yet loaded are listed with no version.
    pub fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let mut out = Vec::new();
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        for (name, e) in models.iter() {
            for (v, s) in &e.versions {
                out.push(IndexEntry {
                    name: name.clone(),
                    version: v.to_string(),
                    state: s.state.name(),
                    reason: s.reason.clone(),
                });
            }
        }
        drop(models);
        if let Some(root) = self.root()
            && !ready_only
        {
            for name in load::model_dirs(root).unwrap_or_default() {
                if !out.iter().any(|e| e.name == name) {
                    out.push(IndexEntry {
                        name,
                        version: String::new(),
                        state: State::Unavailable.name(),
                        reason: "not loaded".into(),
                    });
                }
            }
        }
        if ready_only {
            out.retain(|e| e.state == State::Ready.name());
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn set_status(&self, name: &str, version: u64, state: State, reason: String) {
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        let e = models.entry(name.to_string()).or_default();
        e.versions.insert(version, Status { state, reason });
        // Keep the index short: the served version, and the last few tried.
        while e.versions.len() > 8 {
            let Some(&oldest) = e.versions.keys().next() else {
                break;
            };
            if e.current.as_ref().is_some_and(|c| c.version == oldest) {
                break;
            }
            e.versions.remove(&oldest);
        }
    }

    /// Stops every model: no more swaps; each batcher answers what it holds by `end`.
    pub(crate) fn shutdown_by(&self, end: std::time::Instant) {
        self.stopped.store(true, Ordering::Relaxed);
        for s in self.served() {
            s.batcher.shutdown_by(end);
        }
    }

    /// Whether model `name` was unloaded by request (and not loaded since).
    fn is_held(&self, name: &str) -> bool {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.get(name).is_some_and(|e| e.held)
    }

    fn set_held(&self, name: &str, held: bool) {
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        models.entry(name.to_string()).or_default().held = held;
    }

    /// Whether the server stopped.
    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }
}

impl Status {
    fn new(state: State) -> Self {
        Status {
            state,
            reason: String::new(),
        }
    }

    /// `unavailable: <why>`, or the state alone.
    fn describe(&self) -> String {
        let state = self.state.name().to_lowercase();
        match self.reason.is_empty() {
            true => state,
            false => format!("{state}: {}", self.reason),
        }
    }
}

/// Runs `tick` every `every` on a thread named `name` until the repository is dropped or
/// stopped; if the thread cannot start, stderr says so and `lost` (what does not happen then).
fn spawn_watcher(
    repo: &Arc<Repository>,
    name: &str,
    every: Duration,
    lost: &str,
    mut tick: impl FnMut(&Repository) + Send + 'static,
) {
    let weak = Arc::downgrade(repo);
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(repo) = weak.upgrade() else { return };
                if repo.is_stopped() {
                    return;
                }
                tick(&repo);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("could not start the thread {name} ({e}); {lost}");
    }
}

/// How long a retired version waits for the requests that run on it before its batcher is
/// stopped anyway (those still queued then are answered `ShuttingDown`).
const RETIRE_GRACE: Duration = Duration::from_secs(30);

/// Puts the calling thread in the idle scheduling class (it runs when no serving thread wants
/// the core), or at nice 19 where that is refused. Of the four ways measured with
/// `bench/swap.sh` (nice 10; idle class; idle class paced at 250 MB/s; nice 5 paced at 250
/// MB/s), the idle class unpaced spiked least. The idle class alone is not enough: a core it
/// holds does not take waiting request threads until it sleeps, hence [`load::Pace::background`]'s
/// breathing copy (docs/serving.md: the figures).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: both calls take the calling thread's id and change only its scheduling; the
    // parameter struct outlives the call.
    unsafe {
        let tid = libc::gettid();
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        }
    }
}
