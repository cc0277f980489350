//! `ember serve --from-registry NAME`: one model served from the registry alone, following the
//! version the registry says to serve (`ember registry promote`, else the newest ready one).
//!
//! The registry holds each version whole (tables, `config.json`, dense weights). A version to
//! serve is fetched into the repository directory as `ROOT/<name>/<version>/` (the tables held
//! in memory read block by block and checked; the others stay in the registry's cluster, read
//! through the row cache), then loaded, warmed and swapped in as any repository version is;
//! the directory of the version it replaced is removed. A version that fails to fetch or load
//! leaves the served one untouched, shows as `UNAVAILABLE` with the reason, and is tried again
//! after [`RETRY`] (or at once when another version is promoted).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ember_model::registry::RegistryModel;

use super::{Repository, State};
use crate::error::{Result, ServeError};

/// How long a version that failed is left alone before it is tried again.
pub const RETRY: Duration = Duration::from_secs(30);

/// The model a server follows in the registry.
#[derive(Debug, Clone)]
pub struct RegistryFollow {
    /// `redis://host:port[,...]`.
    pub redis: String,
    /// Its name in the registry.
    pub model: String,
    /// The name clients address it by.
    pub name: String,
}

impl Repository {
    /// The followed model, when this server serves one from the registry.
    pub(super) fn registry_follow(&self) -> Option<&RegistryFollow> {
        self.source.as_ref().and_then(|s| s.registry.as_ref())
    }

    /// The version the registry says to serve (connecting first if needed).
    fn registry_target(&self, f: &RegistryFollow) -> Result<u64> {
        let mut conn = self.registry_conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_none() {
            *conn = Some(RegistryModel::connect(&f.redis, &f.model).map_err(unavailable)?);
        }
        let got = conn.as_mut().map(|c| c.target());
        match got {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => {
                // Connect again next time (the cluster may have moved).
                *conn = None;
                Err(unavailable(e))
            }
            None => Err(ServeError::Internal("no registry connection".into())),
        }
    }

    /// Serves the registry's version of the followed model if it is not served yet; returns it.
    pub(super) fn sync_registry(&self) -> Result<u64> {
        let src = self.source()?;
        let Some(f) = self.registry_follow() else {
            return Err(ServeError::Internal(
                "no model followed in a registry".into(),
            ));
        };
        let _one = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let target = self.registry_target(f)?;
        if self.served_version(&f.name) == Some(target) {
            return Ok(target);
        }
        let dir = src.root.join(&f.name).join(target.to_string());
        self.set_status(&f.name, target, State::Loading, String::new());
        tracing::info!(
            "fetching model '{}' version {target} from the registry {}",
            f.model,
            f.redis
        );
        let fetched = std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("ember-fetch".into())
                .spawn_scoped(s, || {
                    super::lower_priority();
                    let mut conn = self.registry_conn.lock().unwrap_or_else(|e| e.into_inner());
                    let c = conn.as_mut().ok_or("no registry connection")?;
                    c.fetch(target, &dir).map_err(|e| {
                        *conn = None;
                        format!("fetching it from the registry: {e}")
                    })
                })
                .map_err(|e| format!("starting the fetching thread: {e}"))?
                .join()
                .map_err(|_| "the fetching thread panicked".to_string())?
        });
        match fetched {
            Ok(done) => tracing::info!(
                "model '{}' version {target} fetched ({:.1} MB of tables held in memory) \
                 in {:.2} s",
                f.model,
                done.table_bytes as f64 / 1e6,
                done.seconds
            ),
            Err(reason) => {
                self.set_status(&f.name, target, State::Unavailable, reason.clone());
                tracing::warn!(
                    "model '{}' version {target} failed to load: {reason}",
                    f.name
                );
                return Err(ServeError::Unavailable(format!(
                    "model '{}' version {target} failed to load: {reason}",
                    f.name
                )));
            }
        }
        let swapped = self.swap_in(src, &f.name, target, &dir);
        // Only the served version's directory stays.
        let keep = self.served_version(&f.name);
        if let Ok(rd) = std::fs::read_dir(src.root.join(&f.name)) {
            for e in rd.flatten() {
                let name = e.file_name();
                if keep.is_none_or(|k| name.to_str() != Some(&k.to_string())) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        swapped.map(|()| target)
    }

    fn served_version(&self, name: &str) -> Option<u64> {
        self.served()
            .iter()
            .find(|s| s.name() == name)
            .map(|s| s.version)
    }
}

fn unavailable(e: impl std::fmt::Display) -> ServeError {
    ServeError::Unavailable(format!("the model registry: {e}"))
}

/// Starts the thread that follows the registry every `every`; it ends when the repository is
/// dropped or stopped.
pub(crate) fn spawn(repo: &Arc<Repository>, every: Duration) {
    // The version that failed last, and when: not fetched again before `RETRY`.
    let mut failed: Option<(u64, Instant)> = None;
    let mut said = String::new();
    super::spawn_watcher(
        repo,
        "ember-registry-poll",
        every,
        "promoted versions load only on request",
        move |repo| follow_once(repo, &mut failed, &mut said),
    );
}

/// One look at the registry: swaps in the version to serve if it changed.
fn follow_once(repo: &Repository, failed: &mut Option<(u64, Instant)>, said: &mut String) {
    let Some(f) = repo.registry_follow() else {
        return;
    };
    if repo.is_held(&f.name) {
        return;
    }
    let target = match repo.registry_target(f) {
        Ok(v) => v,
        Err(e) => {
            // Said once per distinct failure; the served version goes on serving.
            let now = e.to_string();
            if now != *said {
                tracing::warn!("cannot read the version to serve ({now}); serving on");
                *said = now;
            }
            return;
        }
    };
    said.clear();
    if repo.served_version(&f.name) == Some(target)
        || failed.is_some_and(|(v, at)| v == target && at.elapsed() < RETRY)
    {
        return;
    }
    *failed = match repo.sync_registry() {
        Ok(_) => None,
        Err(_) => Some((target, Instant::now())),
    };
}
