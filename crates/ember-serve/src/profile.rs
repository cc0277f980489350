//! `ember serve --profile-dir DIR`: every served model records its lookups, and a thread writes
//! them every `interval` (and once more when the server stops) as `DIR/<model>/<table>.ids`,
//! the per-table profiles `ember convert --layout-profile DIR/<model>` lays row files out by.
//! A version swapped in records from the next write on; its files replace the old version's.

use std::path::PathBuf;
use std::sync::Weak;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use ember_model::RecordOptions;

use crate::repo::Repository;

/// Where and how served models' lookups are recorded.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    /// Profiles go to `dir/<model>/<table>.ids`.
    pub dir: PathBuf,
    /// Ids kept per table, and the share of batches recorded.
    pub record: RecordOptions,
    /// How often the files are rewritten.
    pub interval: Duration,
}

/// The thread that writes profiles; dropping it (or [`ProfileWriter::stop`]) writes them once
/// more and ends it.
#[derive(Debug)]
pub(crate) struct ProfileWriter {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts recording on every model `repo` serves now (so no batch of theirs is missed), then
/// the writer thread.
pub(crate) fn start(
    repo: &std::sync::Arc<Repository>,
    cfg: ProfileConfig,
) -> std::io::Result<ProfileWriter> {
    for s in repo.served() {
        if !s.spec.servable().records_lookups() {
            tracing::warn!(
                model = s.name(),
                "--profile-dir: this model's family does not record its lookups; no profile is \
                 written for it"
            );
        }
    }
    enable(repo, &cfg);
    let (tx, rx) = mpsc::channel::<()>();
    let weak: Weak<Repository> = std::sync::Arc::downgrade(repo);
    let thread = std::thread::Builder::new()
        .name("ember-profile".into())
        .spawn(move || {
            loop {
                let last = !matches!(
                    rx.recv_timeout(cfg.interval),
                    Err(RecvTimeoutError::Timeout)
                );
                let Some(repo) = weak.upgrade() else { return };
                write_all(&repo, &cfg);
                if last {
                    return;
                }
                enable(&repo, &cfg);
            }
        })?;
    Ok(ProfileWriter {
        stop: Some(tx),
        thread: Some(thread),
    })
}

/// Has every served model record (a no-op for those already recording).
fn enable(repo: &Repository, cfg: &ProfileConfig) {
    for s in repo.served() {
        if !s.spec.servable().records_lookups() {
            continue;
        }
        if let Err(e) = s.spec.servable().record_accesses(cfg.record) {
            tracing::warn!(model = s.name(), "cannot record lookups: {e}");
        }
    }
}

/// Writes each served model's profile; a failure is logged and the next write tries again.
fn write_all(repo: &Repository, cfg: &ProfileConfig) {
    for s in repo.served() {
        let dir = cfg.dir.join(s.name());
        match s.spec.servable().write_profile(&dir) {
            Ok(files) if !files.is_empty() => tracing::debug!(
                model = s.name(),
                version = s.version,
                "wrote {} table profiles under {}",
                files.len(),
                dir.display()
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(model = s.name(), "writing its lookup profile: {e}"),
        }
    }
}

impl ProfileWriter {
    /// Writes the profiles once more and waits for the thread to end.
    pub(crate) fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProfileWriter {
    fn drop(&mut self) {
        self.finish();
    }
}
