//! `--poll-secs`: the repository directory scanned every interval. A model whose newest version
//! on disk is not the one served is (re)loaded, and a new model directory loaded; a model whose
//! directory is gone is unloaded. A version that failed to load is tried again only once its
//! files change, so that a bad version is reported once, not every interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::Repository;
use super::load::{model_dirs, newest_version, stamp};

type Stamp = Vec<(u64, Option<std::time::SystemTime>)>;

/// Starts the poller over `repo`; it ends when the repository is dropped or stopped.
pub(crate) fn spawn(repo: &Arc<Repository>, every: Duration) {
    let mut failed: HashMap<String, (u64, Stamp)> = HashMap::new();
    super::spawn_watcher(
        repo,
        "ember-repo-poll",
        every,
        "new versions load only on request",
        move |r| poll_once(r, &mut failed),
    );
}

/// One scan: loads what changed, unloads what is gone.
fn poll_once(repo: &Repository, failed: &mut HashMap<String, (u64, Stamp)>) {
    let Some(root) = repo.root().cloned() else {
        return;
    };
    let Ok(on_disk) = model_dirs(&root) else {
        // A repository that cannot be read now (being replaced) changes nothing.
        return;
    };
    let served: HashMap<String, u64> = repo
        .served()
        .iter()
        .map(|s| (s.name().to_string(), s.version))
        .collect();
    for name in &on_disk {
        if repo.is_held(name) {
            continue;
        }
        let Ok((v, dir)) = newest_version(&root.join(name)) else {
            continue;
        };
        if served.get(name) == Some(&v) {
            failed.remove(name);
            continue;
        }
        let now = stamp(&dir);
        if failed.get(name).is_some_and(|f| f.0 == v && f.1 == now) {
            continue;
        }
        match repo.load(name) {
            Ok(_) => {
                failed.remove(name);
            }
            Err(_) => {
                failed.insert(name.clone(), (v, now));
            }
        }
    }
    for name in served.keys() {
        if !on_disk.contains(name) {
            tracing::warn!(
                "model '{name}' is gone from {}: unloading it",
                root.display()
            );
            let _ = repo.unload(name);
            // Gone from disk is not unloaded by request: it loads again if it comes back.
            repo.set_held(name, false);
        }
    }
}
