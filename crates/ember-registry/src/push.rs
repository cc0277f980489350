//! [`push`]: a model's tables into the registry as a version, pipelined, parallel across the
//! nodes, resumable and verified.
//!
//! A push goes: the version is recorded `pushing` with its manifest (shapes, no CRCs yet); blocks
//! are written in rounds of about `window_bytes` (one pipeline per node per round), each round
//! followed by `WAIT` for a replica on every primary written and recorded in the version's
//! `done` hash; at the end the manifest gets every block's CRC-32, every block is read back from
//! its primary and checked against it, and only then does the version turn `ready`. (Reading
//! each round back right after writing it ran at half the rate of one read-back at the end,
//! 1.2 against 2.4-2.8 GB/s on a loopback cluster.) Servers only serve
//! `ready` versions, so a half-pushed version is never served; pushing again resumes it (the
//! blocks in `done` are skipped) if its tables are the same, and is refused otherwise.

use crate::store_error;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::layout::{self, VersionState, block_prefix, check_name};
use crate::manifest::{FORMAT, FORMAT_VERSION};
use crate::{Manifest, ManifestTable, read_manifest, versions};
use ember_embed::{DType, EmbedError, EmbeddingTable, Result};
use ember_redis::Value;
use ember_redis::{Cluster, Ops, call, hash_entries};

use crate::admin::check_blocks;
use crate::files::{ModelFilesData, read_files, write_files};
use crate::version::{set_state, write_manifest};

/// How to push.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// The version to push (`None`: resume the newest interrupted push of the same tables, or
    /// one more than the newest version).
    pub version: Option<u64>,
    /// Bytes of blocks written per round (one pipeline per node).
    pub window_bytes: usize,
    /// Deadline of one round.
    pub round_timeout: Duration,
    /// Wait for this many replicas to acknowledge each round (0: do not wait).
    pub replicas: u32,
    /// The model's `config.json` and dense weights, stored with the version so that a server
    /// can build it from the registry alone (`ember serve --from-registry`, `ember registry
    /// promote`).
    pub files: Option<ModelFilesData>,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            version: None,
            window_bytes: 32 << 20,
            round_timeout: Duration::from_secs(30),
            replicas: 1,
            files: None,
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, PartialEq)]
pub struct PushReport {
    /// The version pushed.
    pub version: u64,
    /// Whether it resumed an interrupted push.
    pub resumed: bool,
    /// Tables pushed.
    pub tables: usize,
    /// Rows over all the tables.
    pub rows: usize,
    /// Bytes of rows in the version, and bytes written by this push.
    pub bytes: usize,
    /// Bytes of blocks this push wrote (those an interrupted push landed are not written again).
    pub bytes_written: usize,
    /// Blocks in the version.
    pub blocks: usize,
    /// Blocks already landed by an earlier, interrupted push.
    pub blocks_skipped: usize,
    /// Seconds writing (and verifying) blocks.
    pub seconds: f64,
    /// Of which reading every block back and checking its CRC.
    pub verify_seconds: f64,
    /// Rounds where fewer replicas than asked acknowledged the writes in time, and did not by
    /// the end of the push either (0 when a last `WAIT` for everything succeeded).
    pub unreplicated_rounds: usize,
}

impl PushReport {
    /// The report of a push of `manifest`'s version before any block is written.
    fn start(manifest: &Manifest, resumed: bool) -> Self {
        PushReport {
            version: manifest.version,
            resumed,
            tables: manifest.tables.len(),
            rows: manifest.tables.iter().map(|t| t.rows).sum(),
            bytes: manifest.bytes(),
            bytes_written: 0,
            blocks: manifest.tables.iter().map(ManifestTable::blocks).sum(),
            blocks_skipped: 0,
            seconds: 0.0,
            verify_seconds: 0.0,
            unreplicated_rounds: 0,
        }
    }
}

/// A table to push: its name and shape, and its rows (Ember's row encoding, back to back).
/// [`EmbeddingTable`] is one, wherever its rows live.
pub trait RowSource {
    /// The table's name (a part of its keys).
    fn name(&self) -> &str;
    /// Its rows.
    fn rows(&self) -> usize;
    /// Values per row.
    fn dim(&self) -> usize;
    /// Its rows' encoding.
    fn dtype(&self) -> DType;
    /// Rows `rows`, back to back: borrowed where they are in memory, else read into `buf`.
    fn row_bytes<'a>(
        &'a self,
        rows: std::ops::Range<usize>,
        buf: &'a mut Vec<u8>,
    ) -> Result<&'a [u8]>;
}

/// A table's rows for `ember registry push`.
impl RowSource for EmbeddingTable {
    fn name(&self) -> &str {
        EmbeddingTable::name(self)
    }
    fn rows(&self) -> usize {
        EmbeddingTable::rows(self)
    }
    fn dim(&self) -> usize {
        EmbeddingTable::dim(self)
    }
    fn dtype(&self) -> DType {
        EmbeddingTable::dtype(self)
    }
    fn row_bytes<'a>(
        &'a self,
        rows: std::ops::Range<usize>,
        buf: &'a mut Vec<u8>,
    ) -> Result<&'a [u8]> {
        let s = self.stride();
        if let Some(all) = self.resident() {
            return Ok(&all[rows.start * s..rows.end * s]);
        }
        buf.clear();
        buf.resize(rows.len() * s, 0);
        for (i, r) in rows.enumerate() {
            self.read_row(r, &mut buf[i * s..(i + 1) * s])?;
        }
        Ok(buf)
    }
}

/// Pushes `tables` as a version of `model` (see the module documentation). `progress` is told
/// the bytes landed so far and the total after every round.
pub fn push<T: RowSource>(
    cluster: &mut Cluster,
    model: &str,
    tables: &[&T],
    opts: &PushOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PushReport> {
    check_name("model", model)?;
    for t in tables {
        check_name("table", t.name())?;
    }
    let (version, resumed) = choose_version(cluster, model, tables, opts.version)?;
    let mut manifest = manifest_of(model, version, tables);
    let done = match resumed {
        true => resume(cluster, &mut manifest)?,
        false => begin(cluster, &manifest).map(|()| HashMap::new())?,
    };
    let mut report = PushReport::start(&manifest, resumed);
    let t0 = Instant::now();
    let crcs = write_blocks(
        cluster,
        &manifest,
        tables,
        &done,
        opts,
        &mut report,
        progress,
    )?;
    if opts.replicas > 0 && report.unreplicated_rounds > 0 {
        replication_barrier(cluster, &manifest, opts, &mut report)?;
    }
    for (mt, c) in manifest.tables.iter_mut().zip(crcs) {
        mt.block_crcs = c;
    }
    if let Some(f) = &opts.files {
        manifest.files = Some(write_files(cluster, model, version, f)?);
    }
    write_manifest(cluster, &manifest)?;
    read_back(cluster, &manifest, opts, &mut report)?;
    set_state(cluster, model, version, VersionState::Ready)?;
    let done_key = layout::done_key(model, version);
    call(
        cluster,
        &done_key,
        ember_redis::cmd("UNLINK").arg(&done_key),
        false,
    )
    .map_err(store_error)?;
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Seconds since the Unix epoch.
fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The manifest of `tables` (no CRCs).
fn manifest_of<T: RowSource>(model: &str, version: u64, tables: &[&T]) -> Manifest {
    Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        model: model.into(),
        version,
        created_unix: now_unix(),
        files: None,
        tables: tables
            .iter()
            .map(|t| ManifestTable {
                name: t.name().into(),
                rows: t.rows(),
                dim: t.dim(),
                dtype: t.dtype(),
                row_bytes: t.dtype().row_bytes(t.dim()),
                rows_per_block: layout::rows_per_block(t.rows(), t.dtype().row_bytes(t.dim())),
                block_crcs: Vec::new(),
            })
            .collect(),
    }
}

/// Whether two manifests describe the same tables (ignoring CRCs and dates).
fn same_tables(a: &Manifest, b: &Manifest) -> bool {
    a.tables.len() == b.tables.len()
        && a.tables.iter().zip(&b.tables).all(|(x, y)| {
            (
                &x.name,
                x.rows,
                x.dim,
                x.dtype,
                x.row_bytes,
                x.rows_per_block,
            ) == (
                &y.name,
                y.rows,
                y.dim,
                y.dtype,
                y.row_bytes,
                y.rows_per_block,
            )
        })
}

/// The version to push and whether the push resumes it: `asked`, resumed if an interrupted
/// push left it (refused if it is in any other state); else the newest interrupted push of the
/// same tables, or one more than the newest version.
fn choose_version<T: RowSource>(
    cluster: &mut Cluster,
    model: &str,
    tables: &[&T],
    asked: Option<u64>,
) -> Result<(u64, bool)> {
    let known = versions(cluster, model)?;
    if let Some(v) = asked {
        return match known.iter().find(|e| e.0 == v).map(|e| e.1) {
            None => Ok((v, false)),
            Some(VersionState::Pushing) => Ok((v, true)),
            Some(s) => Err(EmbedError::remote_store(
                model,
                v,
                format!(
                    "it is already {} (remove it first with `ember registry rm --model {model} --version {v}`)",
                    s.name()
                ),
            )),
        };
    }
    let newest = known.last().map_or(0, |e| e.0);
    let fresh = manifest_of(model, 0, tables);
    match known.iter().rev().find(|e| e.1 == VersionState::Pushing) {
        Some(&(v, _)) if same_tables(&read_manifest(cluster, model, v)?, &fresh) => Ok((v, true)),
        _ => Ok((newest + 1, false)),
    }
}

/// Resumes the interrupted push of `manifest`'s version: refused unless it was of the same
/// tables and shapes; keeps its date. Returns the blocks it landed (`<table>:<block>` ->
/// CRC-32).
fn resume(cluster: &mut Cluster, manifest: &mut Manifest) -> Result<HashMap<String, u32>> {
    let (model, version) = (manifest.model.clone(), manifest.version);
    let old = read_manifest(cluster, &model, version)?;
    if !same_tables(&old, manifest) {
        return Err(EmbedError::remote_store(
            &model,
            version,
            "an interrupted push of other tables or shapes is in the registry; remove it first \
             with `ember registry rm`",
        ));
    }
    manifest.created_unix = old.created_unix;
    let mut done = HashMap::new();
    for (f, v) in hash_entries(cluster, &layout::done_key(&model, version)).map_err(store_error)? {
        if let Ok(crc) = u32::from_str_radix(&v, 16) {
            done.insert(f, crc);
        }
    }
    Ok(done)
}

/// Starts a new version: its manifest (no CRCs yet), its state `pushing`, its model in the set
/// of models.
fn begin(cluster: &mut Cluster, manifest: &Manifest) -> Result<()> {
    write_manifest(cluster, manifest)?;
    set_state(
        cluster,
        &manifest.model,
        manifest.version,
        VersionState::Pushing,
    )?;
    let mk = layout::models_key();
    call(
        cluster,
        &mk,
        ember_redis::cmd("SADD").arg(&mk).arg(&manifest.model),
        false,
    )
    .map_err(store_error)?;
    Ok(())
}

/// Writes every block of `tables` not in `done` with the same CRC, in rounds of about
/// `opts.window_bytes`; returns every block's CRC-32, per table. `progress` is told the bytes
/// landed after every round.
fn write_blocks<T: RowSource>(
    cluster: &mut Cluster,
    manifest: &Manifest,
    tables: &[&T],
    done: &HashMap<String, u32>,
    opts: &PushOptions,
    report: &mut PushReport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<Vec<u32>>> {
    let total = manifest.bytes() as u64;
    let mut round = Round::new(manifest, opts);
    let mut landed = 0u64;
    let mut scratch = Vec::new();
    let mut crcs: Vec<Vec<u32>> = manifest
        .tables
        .iter()
        .map(|t| vec![0; t.blocks()])
        .collect();
    for (ti, mt) in manifest.tables.iter().enumerate() {
        for (b, slot) in crcs[ti].iter_mut().enumerate() {
            let bytes = tables[ti].row_bytes(mt.block_rows(b), &mut scratch)?;
            let crc = crc32fast::hash(bytes);
            *slot = crc;
            if done.get(&format!("{}:{b}", mt.name)) == Some(&crc) {
                report.blocks_skipped += 1;
                landed += bytes.len() as u64;
                continue;
            }
            round.add(ti, b, crc, bytes);
            if round.bytes >= opts.window_bytes {
                landed += round.bytes as u64;
                round.flush(cluster, report)?;
                progress(landed, total);
            }
        }
    }
    if !round.blocks.is_empty() {
        landed += round.bytes as u64;
        round.flush(cluster, report)?;
    }
    progress(landed, total);
    Ok(crcs)
}

/// The blocks written since the last round was flushed, and how to flush them.
struct Round<'a> {
    /// The version pushed.
    manifest: &'a Manifest,
    /// The window, the round's deadline and the replicas to wait for.
    opts: &'a PushOptions,
    /// The round's `SET`s (then its `WAIT`s).
    ops: Ops,
    /// `(table, block, CRC-32)` of each block in the round.
    blocks: Vec<(usize, usize, u32)>,
    /// Bytes of the round's blocks.
    bytes: usize,
}

impl<'a> Round<'a> {
    /// An empty round of `manifest`'s version.
    fn new(manifest: &'a Manifest, opts: &'a PushOptions) -> Self {
        Round {
            manifest,
            opts,
            ops: Ops::default(),
            blocks: Vec::new(),
            bytes: 0,
        }
    }

    /// The key of block `b` of table `t`.
    fn key(&self, t: usize, b: usize) -> String {
        let m = self.manifest;
        format!(
            "{}{b}",
            block_prefix(&m.model, m.version, &m.tables[t].name)
        )
    }

    /// Adds block `b` of table `t` (`bytes`, CRC-32 `crc`) to the round.
    fn add(&mut self, t: usize, b: usize, crc: u32, bytes: &[u8]) {
        let key = self.key(t, b);
        self.ops.set(key.as_bytes(), bytes);
        self.blocks.push((t, b, crc));
        self.bytes += bytes.len();
    }

    /// Writes the round's blocks, waits for replicas, and records them in the version's `done`
    /// hash; the round is then empty.
    fn flush(&mut self, cluster: &mut Cluster, report: &mut PushReport) -> Result<()> {
        report.bytes_written += self.bytes;
        let (model, version) = (self.manifest.model.as_str(), self.manifest.version);
        let deadline = Instant::now() + self.opts.round_timeout;
        let keys: Vec<String> = self
            .blocks
            .iter()
            .map(|&(t, b, _)| self.key(t, b))
            .collect();
        // WAIT on each primary written that has replicas, on the connection the writes went
        // through, for at most a third of the round (an attempt's share of it).
        if self.opts.replicas > 0 {
            let wait_ms = (self.opts.round_timeout.as_millis() as u64 / 4).max(1);
            for key in cluster.one_key_per_primary(keys.iter().map(|k| k.as_bytes())) {
                let n = (self.opts.replicas as usize).min(cluster.replicas_of(key));
                if n > 0 {
                    self.ops
                        .push(key, ember_redis::cmd("WAIT").arg(n).arg(wait_ms));
                }
            }
        }
        let acks = cluster
            .run(&self.ops, false, deadline)
            .map_err(store_error)?;
        for (i, v) in acks.iter().enumerate() {
            match v {
                Value::Okay | Value::SimpleString(_) if i < self.blocks.len() => {}
                Value::Int(n) if i >= self.blocks.len() => {
                    if *n < 1 {
                        report.unreplicated_rounds += 1;
                    }
                }
                other => {
                    return Err(EmbedError::remote_store(
                        model,
                        version,
                        format!(
                            "writing {} answered {other:?}",
                            keys.get(i).map_or("WAIT", |k| k)
                        ),
                    ));
                }
            }
        }
        self.record_done(cluster)
    }

    /// Records the round's blocks as landed (written, and acknowledged by the replicas asked
    /// for; checked by the read-back at the end of the push), then empties the round.
    fn record_done(&mut self, cluster: &mut Cluster) -> Result<()> {
        let mut hset = ember_redis::cmd("HSET");
        let done_key = layout::done_key(&self.manifest.model, self.manifest.version);
        hset.arg(&done_key);
        for &(t, b, crc) in &self.blocks {
            hset.arg(format!("{}:{b}", self.manifest.tables[t].name))
                .arg(format!("{crc:08x}"));
        }
        call(cluster, &done_key, &hset, false).map_err(store_error)?;
        self.ops.clear();
        self.blocks.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// A round's `WAIT` gives up after a quarter of the round, and a replica still in its first
/// sync (or on a slow link) may miss it: one last `WAIT` on every primary written, for all the
/// writes so far, as long as a round may take, before the version is marked ready. Where every
/// primary's replicas then acknowledge, nothing is left unreplicated.
fn replication_barrier(
    cluster: &mut Cluster,
    manifest: &Manifest,
    opts: &PushOptions,
    report: &mut PushReport,
) -> Result<()> {
    let keys: Vec<String> = manifest
        .tables
        .iter()
        .flat_map(|mt| {
            let prefix = block_prefix(&manifest.model, manifest.version, &mt.name);
            (0..mt.blocks()).map(move |b| format!("{prefix}{b}"))
        })
        .collect();
    let mut ops = Ops::default();
    let mut want = Vec::new();
    let wait_ms = opts.round_timeout.as_millis() as u64;
    for key in cluster.one_key_per_primary(keys.iter().map(|k| k.as_bytes())) {
        let n = (opts.replicas as usize).min(cluster.replicas_of(key));
        if n > 0 {
            ops.push(key, ember_redis::cmd("WAIT").arg(n).arg(wait_ms));
            want.push(n as i64);
        }
    }
    let deadline = Instant::now() + opts.round_timeout + Duration::from_secs(1);
    let replies = cluster.run(&ops, false, deadline).map_err(store_error)?;
    if replies
        .iter()
        .zip(&want)
        .all(|(v, &n)| matches!(v, Value::Int(got) if *got >= n))
    {
        report.unreplicated_rounds = 0;
    }
    Ok(())
}

/// Reads every block back from its primary and checks it against the CRC of its source (the
/// ones an interrupted push landed too), and the config and dense weights if pushed. A block
/// that differs leaves `done`, so that pushing again rewrites it, and fails the push.
fn read_back(
    cluster: &mut Cluster,
    manifest: &Manifest,
    opts: &PushOptions,
    report: &mut PushReport,
) -> Result<()> {
    let tv = Instant::now();
    let check = check_blocks(
        cluster,
        manifest,
        false,
        opts.round_timeout,
        &[],
        None,
        None,
    )?;
    if opts.files.is_some() {
        read_files(cluster, manifest)?;
    }
    report.verify_seconds = tv.elapsed().as_secs_f64();
    if check.bad.is_empty() {
        return Ok(());
    }
    let done_key = layout::done_key(&manifest.model, manifest.version);
    let mut hdel = ember_redis::cmd("HDEL");
    hdel.arg(&done_key);
    for (t, b, _) in &check.bad {
        hdel.arg(format!("{t}:{b}"));
    }
    call(cluster, &done_key, &hdel, false).map_err(store_error)?;
    let first: Vec<String> = check
        .bad
        .iter()
        .take(3)
        .map(|(t, b, w)| format!("table {t} block {b}: {w}"))
        .collect();
    Err(EmbedError::remote_store(
        &manifest.model,
        manifest.version,
        format!(
            "{} of {} blocks do not read back as written ({}{}); push again to rewrite them",
            check.bad.len(),
            check.blocks,
            first.join("; "),
            if check.bad.len() > 3 { "; ..." } else { "" }
        ),
    ))
}
