//! [`push`]: a model's tables into the store as a version, pipelined, parallel across the
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

use super::admin::check_blocks;
use super::files::{ModelFilesData, read_files, write_files};
use super::layout::{self, VersionState, block_prefix, check_name};
use super::manifest::{FORMAT, FORMAT_VERSION, Manifest, ManifestTable};
use super::store::{read_manifest, set_state, store_err, versions, write_manifest};
use crate::dtype::DType;
use crate::error::Result;
use ember_redis::{Cluster, Ops, call, hash_entries};
use redis::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// can build it from the store alone (`ember serve --from-store`, `ember store promote`).
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
    pub version: u64,
    /// Whether it resumed an interrupted push.
    pub resumed: bool,
    pub tables: usize,
    pub rows: usize,
    /// Bytes of rows in the version, and bytes written by this push.
    pub bytes: usize,
    pub bytes_written: usize,
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

/// A table to push: its name and shape, and its rows (Ember's row encoding, back to back).
/// [`crate::EmbeddingTable`] is one, wherever its rows live.
pub trait RowSource {
    fn name(&self) -> &str;
    fn rows(&self) -> usize;
    fn dim(&self) -> usize;
    fn dtype(&self) -> DType;
    /// Rows `rows`, back to back: borrowed where they are in memory, else read into `buf`.
    fn row_bytes<'a>(
        &'a self,
        rows: std::ops::Range<usize>,
        buf: &'a mut Vec<u8>,
    ) -> Result<&'a [u8]>;
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
    let known = versions(cluster, model)?;
    let fresh = manifest_of(model, 0, tables);
    // Which version, and whether it resumes one.
    let (version, resumed) = match opts.version {
        Some(v) => match known.iter().find(|e| e.0 == v).map(|e| e.1) {
            None => (v, false),
            Some(VersionState::Pushing) => (v, true),
            Some(s) => {
                return Err(store_err(
                    model,
                    v,
                    format!(
                        "it is already {} (remove it first with `ember store rm --model {model} --version {v}`)",
                        s.name()
                    ),
                ));
            }
        },
        None => {
            let newest = known.last().map_or(0, |e| e.0);
            match known.iter().rev().find(|e| e.1 == VersionState::Pushing) {
                Some(&(v, _)) if same_tables(&read_manifest(cluster, model, v)?, &fresh) => {
                    (v, true)
                }
                _ => (newest + 1, false),
            }
        }
    };
    let mut manifest = manifest_of(model, version, tables);
    let done_key = layout::done_key(model, version);
    let mut done: HashMap<String, u32> = HashMap::new();
    if resumed {
        let old = read_manifest(cluster, model, version)?;
        if !same_tables(&old, &manifest) {
            return Err(store_err(
                model,
                version,
                "an interrupted push of other tables or shapes is in the store; remove it first \
                 with `ember store rm`",
            ));
        }
        manifest.created_unix = old.created_unix;
        for (f, v) in hash_entries(cluster, &done_key)? {
            if let Ok(crc) = u32::from_str_radix(&v, 16) {
                done.insert(f, crc);
            }
        }
    } else {
        write_manifest(cluster, &manifest)?;
        set_state(cluster, model, version, VersionState::Pushing)?;
        let mk = layout::models_key();
        call(cluster, &mk, redis::cmd("SADD").arg(&mk).arg(model), false)?;
    }

    let total: usize = manifest.bytes();
    let mut report = PushReport {
        version,
        resumed,
        tables: tables.len(),
        rows: tables.iter().map(|t| t.rows()).sum(),
        bytes: total,
        bytes_written: 0,
        blocks: manifest.tables.iter().map(ManifestTable::blocks).sum(),
        blocks_skipped: 0,
        seconds: 0.0,
        verify_seconds: 0.0,
        unreplicated_rounds: 0,
    };
    let t0 = Instant::now();
    let mut landed = 0u64;
    let mut round: Vec<(usize, usize, u32)> = Vec::new(); // (table, block, crc)
    let mut round_bytes = 0usize;
    let mut ops = Ops::default();
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
            let key = format!("{}{b}", block_prefix(model, version, &mt.name));
            ops.set(key.as_bytes(), bytes);
            round.push((ti, b, crc));
            round_bytes += bytes.len();
            if round_bytes >= opts.window_bytes {
                landed += round_bytes as u64;
                report.bytes_written += round_bytes;
                flush_round(
                    cluster,
                    model,
                    version,
                    &manifest,
                    &mut ops,
                    &mut round,
                    opts,
                    &mut report,
                )?;
                round_bytes = 0;
                progress(landed, total as u64);
            }
        }
    }
    if !round.is_empty() {
        landed += round_bytes as u64;
        report.bytes_written += round_bytes;
        flush_round(
            cluster,
            model,
            version,
            &manifest,
            &mut ops,
            &mut round,
            opts,
            &mut report,
        )?;
    }
    progress(landed, total as u64);
    if opts.replicas > 0 && report.unreplicated_rounds > 0 {
        replication_barrier(cluster, model, version, &manifest, opts, &mut report)?;
    }
    for (mt, c) in manifest.tables.iter_mut().zip(crcs) {
        mt.block_crcs = c;
    }
    if let Some(f) = &opts.files {
        manifest.files = Some(write_files(cluster, model, version, f)?);
    }
    write_manifest(cluster, &manifest)?;
    // Every block read back from its primary and checked against the CRC of its source (the
    // ones an interrupted push landed too). A block that differs leaves `done`: pushing again
    // rewrites it.
    let tv = Instant::now();
    let check = check_blocks(
        cluster,
        &manifest,
        false,
        opts.round_timeout,
        &[],
        None,
        None,
    )?;
    if opts.files.is_some() {
        read_files(cluster, &manifest)?;
    }
    report.verify_seconds = tv.elapsed().as_secs_f64();
    if !check.bad.is_empty() {
        let mut hdel = redis::cmd("HDEL");
        hdel.arg(&done_key);
        for (t, b, _) in &check.bad {
            hdel.arg(format!("{t}:{b}"));
        }
        call(cluster, &done_key, &hdel, false)?;
        let first: Vec<String> = check
            .bad
            .iter()
            .take(3)
            .map(|(t, b, w)| format!("table {t} block {b}: {w}"))
            .collect();
        return Err(store_err(
            model,
            version,
            format!(
                "{} of {} blocks do not read back as written ({}{}); push again to rewrite them",
                check.bad.len(),
                check.blocks,
                first.join("; "),
                if check.bad.len() > 3 { "; ..." } else { "" }
            ),
        ));
    }
    set_state(cluster, model, version, VersionState::Ready)?;
    call(
        cluster,
        &done_key,
        redis::cmd("UNLINK").arg(&done_key),
        false,
    )?;
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// A round's `WAIT` gives up after a quarter of the round, and a replica still in its first
/// sync (or on a slow link) may miss it: one last `WAIT` on every primary written, for all the
/// writes so far, as long as a round may take, before the version is marked ready. Where every
/// primary's replicas then acknowledge, nothing is left unreplicated.
fn replication_barrier(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    manifest: &Manifest,
    opts: &PushOptions,
    report: &mut PushReport,
) -> Result<()> {
    let keys: Vec<String> = manifest
        .tables
        .iter()
        .flat_map(|mt| {
            let prefix = block_prefix(model, version, &mt.name);
            (0..mt.blocks()).map(move |b| format!("{prefix}{b}"))
        })
        .collect();
    let mut ops = Ops::default();
    let mut want = Vec::new();
    let wait_ms = opts.round_timeout.as_millis() as u64;
    for key in cluster.one_key_per_primary(keys.iter().map(|k| k.as_bytes())) {
        let n = (opts.replicas as usize).min(cluster.replicas_of(key));
        if n > 0 {
            ops.push(key, redis::cmd("WAIT").arg(n).arg(wait_ms));
            want.push(n as i64);
        }
    }
    let deadline = Instant::now() + opts.round_timeout + Duration::from_secs(1);
    let replies = cluster.run(&ops, false, deadline)?;
    if replies
        .iter()
        .zip(&want)
        .all(|(v, &n)| matches!(v, Value::Int(got) if *got >= n))
    {
        report.unreplicated_rounds = 0;
    }
    Ok(())
}

/// Writes one round's blocks, waits for replicas, and records them in the version's `done` hash.
#[allow(clippy::too_many_arguments)]
fn flush_round(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    manifest: &Manifest,
    ops: &mut Ops,
    round: &mut Vec<(usize, usize, u32)>,
    opts: &PushOptions,
    report: &mut PushReport,
) -> Result<()> {
    let deadline = Instant::now() + opts.round_timeout;
    let keys: Vec<String> = round
        .iter()
        .map(|&(t, b, _)| {
            format!(
                "{}{b}",
                block_prefix(model, version, &manifest.tables[t].name)
            )
        })
        .collect();
    // WAIT on each primary written that has replicas, on the connection the writes went
    // through, for at most a third of the round (an attempt's share of it).
    if opts.replicas > 0 {
        let wait_ms = (opts.round_timeout.as_millis() as u64 / 4).max(1);
        for key in cluster.one_key_per_primary(keys.iter().map(|k| k.as_bytes())) {
            let n = (opts.replicas as usize).min(cluster.replicas_of(key));
            if n > 0 {
                ops.push(key, redis::cmd("WAIT").arg(n).arg(wait_ms));
            }
        }
    }
    let acks = cluster.run(ops, false, deadline)?;
    for (i, v) in acks.iter().enumerate() {
        match v {
            Value::Okay | Value::SimpleString(_) if i < round.len() => {}
            Value::Int(n) if i >= round.len() => {
                if *n < 1 {
                    report.unreplicated_rounds += 1;
                }
            }
            other => {
                return Err(store_err(
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
    // Recorded as landed (written, and acknowledged by the replicas asked for); checked by the
    // read-back at the end of the push.
    let mut hset = redis::cmd("HSET");
    let done_key = layout::done_key(model, version);
    hset.arg(&done_key);
    for &(t, b, crc) in round.iter() {
        hset.arg(format!("{}:{b}", manifest.tables[t].name))
            .arg(format!("{crc:08x}"));
    }
    call(cluster, &done_key, &hset, false)?;
    ops.clear();
    round.clear();
    Ok(())
}
