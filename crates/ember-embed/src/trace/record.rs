//! Recording a served model's lookups as id traces, for `ember convert --layout-profile DIR`:
//! one file per table, `DIR/<table>.ids`, one id per line in the order they were looked up
//! (the format [`super::load_trace`] reads), so that a row layout can follow the live heat and
//! co-access of the rows instead of an offline trace.
//!
//! Whole batches are recorded (co-access is what the layout keeps together), one batch in
//! `every`, into a ring of the `ids_per_table` most recent ids of each table: memory is bounded
//! (8 bytes per id) and the cost is a copy of the sampled batches' ids under a lock per table.

use crate::collection::{CheckedView, EmbeddingCollection};
use crate::error::{EmbedError, Result};
use crate::jagged::Ids;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOptions {
    /// Ids kept per table (the most recent).
    pub ids_per_table: usize,
    /// One batch in this many is recorded (1: every batch).
    pub every: u64,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            ids_per_table: 1 << 18,
            every: 1,
        }
    }
}

/// The most recent ids of one table, oldest first once read out.
#[derive(Debug, Default)]
struct Ring {
    ids: Vec<u64>,
    /// Where the next id goes once `ids` is full.
    next: usize,
    /// Ids recorded in all, also those overwritten since.
    seen: u64,
}

impl Ring {
    /// Keeps `id`, over the oldest once `cap` (at least 1, as `AccessRecorder::new` checks) are
    /// kept.
    fn push(&mut self, cap: usize, id: u64) {
        self.seen += 1;
        if self.ids.len() < cap {
            self.ids.push(id);
        } else {
            self.ids[self.next] = id;
            self.next = (self.next + 1) % cap;
        }
    }

    fn ordered(&self) -> Vec<u64> {
        let mut v = Vec::with_capacity(self.ids.len());
        v.extend_from_slice(&self.ids[self.next..]);
        v.extend_from_slice(&self.ids[..self.next]);
        v
    }
}

/// Records the lookups of the batches of one [`EmbeddingCollection`] (see the module docs).
#[derive(Debug)]
pub struct AccessRecorder {
    opts: RecordOptions,
    batches: AtomicU64,
    /// Per table of the collection.
    rings: Vec<Mutex<Ring>>,
    names: Vec<String>,
}

impl AccessRecorder {
    /// A recorder for the tables of `coll`. Fails on options that would record nothing.
    pub fn new(coll: &EmbeddingCollection, opts: RecordOptions) -> Result<Self> {
        if opts.ids_per_table == 0 || opts.every == 0 {
            return Err(EmbedError::BadOption {
                option: "record",
                reason: format!(
                    "ids per table ({}) and the batch period ({}) must be at least 1",
                    opts.ids_per_table, opts.every
                ),
            });
        }
        let names: Vec<String> = coll.tables().iter().map(|t| t.name().to_string()).collect();
        Ok(AccessRecorder {
            opts,
            batches: AtomicU64::new(0),
            rings: names.iter().map(|_| Mutex::default()).collect(),
            names,
        })
    }

    /// The options.
    pub fn options(&self) -> RecordOptions {
        self.opts
    }

    /// Records `batch` (one of `coll`, the collection this recorder was made for) when it is
    /// the sampled one in `every`.
    pub fn record(&self, coll: &EmbeddingCollection, batch: CheckedView<'_>) {
        let n = self.batches.fetch_add(1, Ordering::Relaxed);
        if !n.is_multiple_of(self.opts.every) || batch.collection() != coll.id() {
            return;
        }
        let kj = batch.get();
        for f in 0..coll.features().len() {
            let t = coll.features()[f].table;
            let Some(ring) = self.rings.get(t) else {
                continue;
            };
            let mut ring = ring.lock().unwrap_or_else(|p| p.into_inner());
            let r = kj.feature_range(f);
            match kj.ids() {
                Ids::U32(v) => v[r]
                    .iter()
                    .for_each(|&i| ring.push(self.opts.ids_per_table, i as u64)),
                Ids::I64(v) => v[r]
                    .iter()
                    .for_each(|&i| ring.push(self.opts.ids_per_table, i as u64)),
            }
        }
    }

    /// The recorded ids of table `t` (index into the collection's tables), oldest first, and
    /// how many were recorded in all.
    pub fn table(&self, t: usize) -> (Vec<u64>, u64) {
        let ring = self.rings[t].lock().unwrap_or_else(|p| p.into_inner());
        (ring.ordered(), ring.seen)
    }

    /// Writes `dir/<table>.ids` for every table with recorded ids (creating `dir`), each
    /// through a temporary file and a rename, so a reader never sees half a file. Returns the
    /// files written. Tables whose names cannot be file names are refused by name.
    pub fn write_dir(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let io = |path: &Path, e: std::io::Error| EmbedError::TraceIo {
            path: path.display().to_string(),
            cause: e.into(),
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut written = Vec::new();
        for (t, name) in self.names.iter().enumerate() {
            let (ids, _) = self.table(t);
            if ids.is_empty() {
                continue;
            }
            let path = profile_path(dir, name)?;
            let mut tmp = path.clone().into_os_string();
            tmp.push(".tmp");
            let tmp = PathBuf::from(tmp);
            let write = || -> std::io::Result<()> {
                let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
                for id in &ids {
                    writeln!(w, "{id}")?;
                }
                w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
                std::fs::rename(&tmp, &path)
            };
            if let Err(e) = write() {
                let _ = std::fs::remove_file(&tmp);
                return Err(io(&path, e));
            }
            written.push(path);
        }
        Ok(written)
    }
}

/// `dir/<table>.ids`: the profile of table `table` in a directory of profiles (what
/// [`AccessRecorder::write_dir`] writes and `ember convert --layout-profile DIR` reads).
pub fn profile_path(dir: &Path, table: &str) -> Result<PathBuf> {
    let bad =
        table.is_empty() || table == "." || table == ".." || table.contains(['/', '\\', '\0']);
    if bad {
        return Err(EmbedError::Trace {
            path: dir.display().to_string(),
            reason: format!("table name '{table}' cannot name a profile file"),
        });
    }
    Ok(dir.join(format!("{table}.ids")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, EmbeddingTable, KeyedJagged};

    fn coll() -> EmbeddingCollection {
        let t = |name: &str, rows: usize| {
            EmbeddingTable::from_f32(name, rows, 2, DType::F32, &vec![0.0; rows * 2]).unwrap()
        };
        EmbeddingCollection::one_feature_per_table(vec![t("a", 100), t("b", 10)]).unwrap()
    }

    fn batch(a: &[u32], b: &[u32]) -> KeyedJagged {
        let ids: Vec<u32> = a.iter().chain(b).copied().collect();
        // One sample per batch: feature a's ids, then feature b's.
        KeyedJagged::from_lengths(
            vec!["a".into(), "b".into()],
            1,
            &[a.len(), b.len()],
            Ids::U32(ids),
            None,
        )
        .unwrap()
    }

    #[test]
    fn keeps_the_most_recent_ids_per_table_in_order() {
        let c = coll();
        let opts = RecordOptions {
            ids_per_table: 5,
            every: 1,
        };
        let r = AccessRecorder::new(&c, opts).unwrap();
        for (a, b) in [
            (&[1u32, 2, 3][..], &[9u32][..]),
            (&[4, 5, 6, 7], &[]),
            (&[8], &[0, 1]),
        ] {
            let kj = batch(a, b);
            r.record(&c, c.check_view(&kj).unwrap());
        }
        assert_eq!(r.table(0), (vec![4, 5, 6, 7, 8], 8));
        assert_eq!(r.table(1), (vec![9, 0, 1], 3));
    }

    #[test]
    fn records_one_batch_in_every() {
        let c = coll();
        let opts = RecordOptions {
            ids_per_table: 100,
            every: 3,
        };
        let r = AccessRecorder::new(&c, opts).unwrap();
        for i in 0..7u32 {
            let kj = batch(&[i], &[]);
            r.record(&c, c.check_view(&kj).unwrap());
        }
        assert_eq!(r.table(0).0, vec![0, 3, 6]);
        let zero = RecordOptions { every: 0, ..opts };
        assert!(AccessRecorder::new(&c, zero).is_err());
    }

    #[test]
    fn writes_files_that_load_as_traces() {
        let c = coll();
        let r = AccessRecorder::new(&c, RecordOptions::default()).unwrap();
        let kj = batch(&[42, 7, 42], &[]);
        r.record(&c, c.check_view(&kj).unwrap());
        let dir = std::env::temp_dir().join(format!("ember-record-{}", std::process::id()));
        let written = r.write_dir(&dir).unwrap();
        // Table b saw no ids: no file.
        assert_eq!(written, vec![dir.join("a.ids")]);
        assert_eq!(
            super::super::load_trace(&written[0]).unwrap(),
            vec![42, 7, 42]
        );
        assert!(!dir.join("b.ids").exists());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(profile_path(&dir, "../x").is_err());
        assert!(profile_path(&dir, "").is_err());
    }
}
