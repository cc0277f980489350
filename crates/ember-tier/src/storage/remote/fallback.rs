//! [`WithLocalCopy`]: the store of `remote` tables that also have a local row-file copy
//! (placement `remote` with `fallback_local`). Reads go to the cluster; a read the cluster
//! cannot answer within its deadline (a node down before failover, a paused node, the whole
//! cluster down, a row missing from a partial push) is read from the local copy instead, and
//! for the next `retry_after` every read goes to the copy without trying the cluster, so that an
//! outage costs one deadline per `retry_after`, not one per batch. Then the cluster is tried
//! again, and serving goes back to it by itself once it answers.
//!
//! The copy holds the pushed bytes (the store's `push` read them from the same model directory;
//! the row file's header names the table and shape, checked at open, and its blocks are
//! CRC-checked as they are read). Row updates change the store's rows after the push, so the
//! copy is kept honest ([`CopyState`]): rows updated while this server follows the update
//! stream are kept in memory and answered from there (up to [`MAX_KEPT_BYTES`]); rows of the
//! blocks updated before it started, a table whose updates it missed (its stream trimmed past
//! it), or one past that bound are not read from the copy: such a read fails as the cluster's
//! did (503), never with a row older than the store's.
//!
//! [`RedisStore::read`](super::RedisStore) lands no row before every reply is checked, so a
//! failed read landed nothing and all of it is read again from the copy.

use super::metrics::{FALLBACK, FallbackMetrics};
use super::pool_jobs::{NodePoolStats, PoolJob, pool_then_read};
use super::store::RemoteRows;
use crate::storage::{ReadStats, RowRequest, RowStore};
use ember_embed::{EmbedError, Result};
use ember_redis::NodeStats;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Bytes of updated rows a copy keeps in memory at most, all tables together; past it, the
/// table whose update crossed it is no longer read from the copy.
pub const MAX_KEPT_BYTES: usize = 256 << 20;

/// How far the copy of one table still holds the store's rows.
#[derive(Debug, Default)]
struct CopyState {
    /// Rows updated while this server followed the table's stream, as the store has them.
    kept: HashMap<usize, Box<[u8]>>,
    /// Rows per block, and the blocks updated before: their rows (but those in `kept`) may
    /// differ from the copy's.
    rows_per_block: usize,
    updated_blocks: BTreeSet<usize>,
    /// Why no row of the table is read from the copy.
    unusable: Option<String>,
}

impl CopyState {
    /// Why row `row` cannot be read from the copy, if it cannot.
    fn refusal(&self, row: usize) -> Option<String> {
        if let Some(why) = &self.unusable {
            return Some(why.clone());
        }
        let block = row / self.rows_per_block.max(1);
        (!self.kept.contains_key(&row) && self.updated_blocks.contains(&block)).then(|| {
            format!(
                "row {row} (block {block}) was updated in the store before this server followed \
                 its updates, and the copy holds its pushed value"
            )
        })
    }
}

/// A remote store with a local copy of every one of its tables (same table order).
#[derive(Debug)]
pub struct WithLocalCopy {
    remote: Box<dyn RemoteRows>,
    local: Box<dyn RowStore>,
    retry_after: Duration,
    /// Until then, reads go to the copy without trying the cluster (`None`: the cluster
    /// answered the last read it was given).
    local_until: Option<Instant>,
    /// When the cluster last failed a read, and why (for the messages of the reads refused
    /// until `local_until`, which do not try the cluster).
    last_failure: Option<(Instant, String)>,
    /// Per table (grown on demand), what of the copy the store's updates left usable.
    copies: Vec<CopyState>,
    /// Bytes of `CopyState::kept`, all tables together.
    kept_bytes: usize,
    /// Table names, for messages.
    names: Vec<String>,
    /// The store's model: the metrics' `model` label.
    model: String,
    /// Its metrics (once the model is named).
    metrics: Option<FallbackMetrics>,
}

impl WithLocalCopy {
    /// `remote` backed by `local` (the same tables, in the same order); after a failed read
    /// the cluster is left alone for `retry_after`.
    pub fn new(
        remote: Box<dyn RemoteRows>,
        local: Box<dyn RowStore>,
        retry_after: Duration,
    ) -> Self {
        WithLocalCopy {
            remote,
            local,
            retry_after,
            local_until: None,
            last_failure: None,
            copies: Vec::new(),
            kept_bytes: 0,
            names: Vec::new(),
            model: String::new(),
            metrics: None,
        }
    }

    /// Names the store's model (the metrics' label) and its tables (in messages), and marks,
    /// per table, the blocks updates rewrote before this server followed its stream
    /// (`RedisStore::updated_blocks`, read after the stream positions were taken):
    /// `(rows per block, blocks)`.
    pub fn with_updated_blocks(
        mut self,
        model: &str,
        names: Vec<String>,
        blocks: Vec<(usize, BTreeSet<usize>)>,
    ) -> Self {
        self.model = model.to_string();
        self.metrics = Some(FallbackMetrics::new(model));
        self.names = names;
        for (t, (rows_per_block, set)) in blocks.into_iter().enumerate() {
            let c = self.copy(t);
            c.rows_per_block = rows_per_block;
            c.updated_blocks = set;
        }
        self
    }

    fn copy(&mut self, table: usize) -> &mut CopyState {
        if self.copies.len() <= table {
            self.copies.resize_with(table + 1, CopyState::default);
        }
        &mut self.copies[table]
    }

    fn name(&self, table: usize) -> String {
        self.names
            .get(table)
            .map_or_else(|| format!("#{table}"), |n| format!("'{n}'"))
    }

    /// Table `table` is no longer read from the copy, because `why`.
    fn set_unusable(&mut self, table: usize, why: String) {
        let c = self.copy(table);
        let freed: usize = c.kept.values().map(|r| r.len()).sum();
        c.kept = HashMap::new();
        if c.unusable.is_none() {
            c.unusable = Some(why);
            if let Some(m) = &self.metrics {
                m.stale_tables.increment(1);
            }
        }
        self.kept_bytes -= freed;
    }

    /// Reads `reqs` from the copy: the rows kept from updates from memory, the others from the
    /// file; refused whole (nothing landed) if any row's copy is stale.
    fn read_copy(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
        cluster: &dyn Fn() -> String,
    ) -> Result<ReadStats> {
        let mut from_file = reqs.len();
        let mut i = 0;
        while i < from_file {
            let r = reqs[i];
            let Some(c) = self.copies.get(r.table) else {
                i += 1;
                continue;
            };
            if let Some(why) = c.refusal(r.row) {
                return Err(EmbedError::StoreUnavailable {
                    store: "the remote store".into(),
                    kind: "stale local copy",
                    node: String::new(),
                    detail: format!(
                        "{}; the local copy of table {} cannot stand in: {why}",
                        cluster(),
                        self.name(r.table)
                    ),
                });
            }
            if c.kept.contains_key(&r.row) {
                from_file -= 1;
                reqs.swap(i, from_file);
            } else {
                i += 1;
            }
        }
        let stats = self.local.read(&mut reqs[..from_file], land)?;
        for r in &reqs[from_file..] {
            land(r, &self.copies[r.table].kept[&r.row]);
        }
        Ok(stats)
    }

    /// The cluster failed a call (`e`): counted, remembered, and left alone for `retry_after`.
    fn cluster_failed(&mut self, e: &EmbedError) {
        let kind = match e {
            EmbedError::StoreUnavailable { .. } => "unavailable",
            EmbedError::RemoteRow { .. } => "row",
            _ => "other",
        };
        let model = self.model.clone();
        metrics::counter!(FALLBACK, "model" => model, "kind" => kind).increment(1);
        let now = Instant::now();
        self.last_failure = Some((now, e.to_string()));
        self.set_local_until(Some(now + self.retry_after));
    }

    /// Reads go to the copy until `until` (`None`: back to the cluster); the gauge follows.
    fn set_local_until(&mut self, until: Option<Instant>) {
        if self.local_until.is_some() != until.is_some() {
            let on = f64::from(u8::from(until.is_some()));
            if let Some(m) = &self.metrics {
                m.active.set(on);
            }
        }
        self.local_until = until;
    }
}

impl RowStore for WithLocalCopy {
    fn engine(&self) -> &'static str {
        self.remote.engine()
    }

    fn direct(&self) -> bool {
        self.remote.direct() && self.local.direct()
    }

    fn row_bytes(&self, table: usize) -> usize {
        self.remote.row_bytes(table)
    }

    fn read(
        &mut self,
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<ReadStats> {
        if reqs.is_empty() {
            return Ok(ReadStats::default());
        }
        let t0 = Instant::now();
        let tried = self.local_until.is_none_or(|t| t0 >= t);
        if tried {
            match self.remote.read(reqs, land) {
                Ok(stats) => {
                    self.set_local_until(None);
                    return Ok(stats);
                }
                Err(e) => self.cluster_failed(&e),
            }
        }
        if let Some(m) = &self.metrics {
            m.rows.increment(reqs.len() as u64);
        }
        // Why the cluster is not read, for a refusal's message (built only when refused).
        let (last, retry_after) = (self.last_failure.take(), self.retry_after);
        let cluster = || match &last {
            Some((_, e)) if tried => e.clone(),
            Some((at, e)) => format!(
                "the cluster failed a read {} ms ago, and is tried again within {} ms ({e})",
                at.elapsed().as_millis(),
                retry_after.as_millis()
            ),
            None => "the cluster failed a read".to_string(),
        };
        let read = self.read_copy(reqs, land, &cluster);
        self.last_failure = last;
        let mut stats = read?;
        // The batch waited for the failed remote read too.
        stats.wait = t0.elapsed();
        Ok(stats)
    }
}

impl RemoteRows for WithLocalCopy {
    /// Ready whatever the cluster's state: the copy (local row files) can always be read.
    fn probe(&mut self) -> Result<()> {
        Ok(())
    }

    fn node_stats(&self) -> Vec<NodeStats> {
        self.remote.node_stats()
    }

    fn updated(&mut self, table: usize, ids: &[u64], rows: &[u8]) {
        if self.copy(table).unusable.is_some() || ids.is_empty() {
            return;
        }
        let row_bytes = rows.len() / ids.len();
        let mut added = 0usize;
        let c = self.copy(table);
        for (&id, row) in ids.iter().zip(rows.chunks_exact(row_bytes)) {
            if c.kept.insert(id as usize, row.into()).is_none() {
                added += row_bytes;
            }
        }
        self.kept_bytes += added;
        if self.kept_bytes > MAX_KEPT_BYTES {
            let why = format!(
                "more rows were updated than the copy keeps in memory ({} MiB)",
                MAX_KEPT_BYTES >> 20
            );
            self.set_unusable(table, why);
        }
    }

    fn missed_updates(&mut self, table: usize, why: &str) {
        self.set_unusable(table, why.to_string());
    }

    fn pools(&self) -> bool {
        self.remote.pools()
    }

    fn pool_nodes(&self) -> usize {
        self.remote.pool_nodes()
    }

    /// Pooled on the cluster's nodes while it answers; else (a failed call, or within
    /// `retry_after` of one) summed here from rows read from the copy, as a read would be. The
    /// remote call lands no row unless it succeeds whole, so nothing lands twice.
    fn pool(
        &mut self,
        jobs: &[PoolJob],
        sums: &mut [Vec<f32>],
        reqs: &mut [RowRequest],
        land: &mut dyn FnMut(&RowRequest, &[u8]),
    ) -> Result<NodePoolStats> {
        let t0 = Instant::now();
        if self.local_until.is_none_or(|t| t0 >= t) {
            match self.remote.pool(jobs, sums, reqs, land) {
                Ok(stats) => {
                    self.set_local_until(None);
                    return Ok(stats);
                }
                Err(e) => self.cluster_failed(&e),
            }
        }
        // `read` now goes to the copy (the cluster is left alone until `local_until`).
        let mut stats = pool_then_read(self, jobs, sums, reqs, land)?;
        stats.io.wait = t0.elapsed();
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{IoMode, open_row_files};
    use ember_embed::rowfile::{RowFile, write_row_file};
    use ember_embed::{DType, EmbeddingTable};
    use std::sync::Arc;

    /// A cluster that never answers (the copy's logic alone is under test here; the real
    /// cluster down is in `ember-cli/tests/remote/fallback.rs`).
    #[derive(Debug)]
    struct Down;

    /// What every call of [`Down`] answers.
    fn down() -> EmbedError {
        EmbedError::StoreUnavailable {
            store: "test".into(),
            kind: "down",
            node: String::new(),
            detail: "paused".into(),
        }
    }

    impl RemoteRows for Down {
        fn probe(&mut self) -> Result<()> {
            Err(down())
        }
        fn node_stats(&self) -> Vec<NodeStats> {
            Vec::new()
        }
    }

    impl RowStore for Down {
        fn engine(&self) -> &'static str {
            "down"
        }
        fn direct(&self) -> bool {
            false
        }
        fn row_bytes(&self, _table: usize) -> usize {
            8
        }
        fn read(
            &mut self,
            _reqs: &mut [RowRequest],
            _land: &mut dyn FnMut(&RowRequest, &[u8]),
        ) -> Result<ReadStats> {
            Err(down())
        }
    }

    /// A copy of a 100 x 2 f32 table (row r holds r, -r), behind a cluster that is down.
    fn copy(dir: &std::path::Path) -> WithLocalCopy {
        let vals: Vec<f32> = (0..100).flat_map(|r| [r as f32, -(r as f32)]).collect();
        let t = EmbeddingTable::from_f32("t", 100, 2, DType::F32, &vals).unwrap();
        let path = dir.join("t.rows");
        write_row_file(&path, "t", 100, 2, DType::F32, t.resident().unwrap()).unwrap();
        let local = open_row_files(
            vec![Arc::new(RowFile::open(&path).unwrap())],
            IoMode::Pread,
            4,
        )
        .unwrap();
        WithLocalCopy::new(Box::new(Down), local, Duration::from_secs(60))
    }

    fn row(v: f32) -> Vec<u8> {
        [v, -v].iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Reads `rows` of table 0: each row's bytes, or the error's message.
    fn read(s: &mut WithLocalCopy, rows: &[usize]) -> std::result::Result<Vec<Vec<u8>>, String> {
        let mut reqs: Vec<RowRequest> = rows
            .iter()
            .enumerate()
            .map(|(tag, &row)| RowRequest { table: 0, row, tag })
            .collect();
        let mut got = vec![Vec::new(); rows.len()];
        let mut landed = 0;
        s.read(&mut reqs, &mut |r, b| {
            got[r.tag] = b.to_vec();
            landed += 1;
        })
        .map_err(|e| {
            assert_eq!(landed, 0, "an error after rows landed");
            e.to_string()
        })?;
        assert_eq!(landed, rows.len(), "each request lands once");
        Ok(got)
    }

    #[test]
    fn the_copy_answers_updated_rows_from_memory_and_refuses_what_it_cannot_know() {
        let dir = std::env::temp_dir().join(format!("ember-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Block 3 (rows 30..40 of 10-row blocks) was updated before this server followed.
        let mut s = copy(&dir).with_updated_blocks(
            "m",
            vec!["t".into()],
            vec![(10, [3usize].into_iter().collect())],
        );
        let order = [5, 31, 99, 0, 31, 64];
        assert!(
            read(&mut s, &order)
                .unwrap_err()
                .contains("row 31 (block 3) was updated")
        );
        // Rows 31 and 64 updated while following: both answer their new value, the others the
        // file's; row 35 (block 3, never seen updated) is still refused.
        s.updated(0, &[31, 64], &[row(1000.0), row(2000.0)].concat());
        let got = read(&mut s, &order).unwrap();
        let want: Vec<Vec<u8>> = [5.0, 1000.0, 99.0, 0.0, 1000.0, 2000.0]
            .into_iter()
            .map(row)
            .collect();
        assert_eq!(got, want);
        let e = read(&mut s, &[1, 35]).unwrap_err();
        assert!(
            e.contains("stale local copy") && e.contains("table 't'") && e.contains("row 35"),
            "{e}"
        );
        // Updates missed: nothing of the table is read from the copy, kept rows are freed.
        s.missed_updates(0, "its stream was trimmed");
        assert_eq!(s.kept_bytes, 0);
        assert!(
            read(&mut s, &[5])
                .unwrap_err()
                .contains("its stream was trimmed")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn updates_past_the_memory_bound_make_the_table_unusable_not_the_process_bigger() {
        let dir = std::env::temp_dir().join(format!("ember-copy-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = copy(&dir);
        s.kept_bytes = MAX_KEPT_BYTES - 8; // as if other tables kept nearly all of it
        s.updated(0, &[7], &row(7.5));
        assert_eq!(read(&mut s, &[7]).unwrap(), vec![row(7.5)]);
        s.updated(0, &[8], &row(8.5));
        assert_eq!(
            s.kept_bytes,
            MAX_KEPT_BYTES - 8,
            "the table's kept rows are freed"
        );
        assert!(
            read(&mut s, &[9])
                .unwrap_err()
                .contains("more rows were updated than")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pooling while the cluster is down: the copy's rows summed in bag order (weighted, empty
    /// bags, repeats), an updated row's new value kept, a row the copy cannot know refused.
    #[test]
    fn pooling_with_the_cluster_down_sums_the_copy() {
        let dir = std::env::temp_dir().join(format!("ember-copy-pool-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = copy(&dir).with_updated_blocks(
            "m",
            vec!["t".into()],
            vec![(10, [3usize].into_iter().collect())],
        );
        s.updated(0, &[64], &row(2000.0));
        let job = PoolJob {
            table: 0,
            dtype: DType::F32,
            dim: 2,
            weighted: true,
            bags: vec![3, 0, 2],
            ids: vec![5, 64, 5, 99, 0],
            weights: vec![1.0, 0.5, 2.0, -1.0, 3.0],
        };
        let mut sums = vec![Vec::new()];
        // Beside the sums, rows read whole in the same call: from the copy too.
        let mut reqs = vec![RowRequest {
            table: 0,
            row: 7,
            tag: 0,
        }];
        let mut landed = Vec::new();
        s.pool(
            std::slice::from_ref(&job),
            &mut sums,
            &mut reqs,
            &mut |_, b| landed.push(b.to_vec()),
        )
        .unwrap();
        assert_eq!(landed, vec![row(7.0)]);
        // Bag 0: 5 + 0.5 x 2000 + 2 x 5; bag 1 empty; bag 2: -99 + 3 x 0.
        assert_eq!(sums[0], vec![1015.0, -1015.0, 0.0, 0.0, -99.0, 99.0]);
        let bad = PoolJob {
            bags: vec![1],
            ids: vec![35],
            weights: vec![1.0],
            ..job
        };
        let e = s
            .pool(&[bad], &mut sums, &mut [], &mut |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 35 (block 3) was updated"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
