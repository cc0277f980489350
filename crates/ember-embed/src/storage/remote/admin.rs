//! Managing models in the store: [`push`] (pipelined, parallel across nodes, resumable,
//! verified), [`verify`], [`list`] and [`remove`] (in bounded steps, with `UNLINK`, never `KEYS`
//! or a big `DEL`). The key layout is in [`super::layout`].
//!
//! A push goes: the version is recorded `pushing` with its manifest (shapes, no CRCs yet); blocks
//! are written in rounds of about `window_bytes` (one pipeline per node per round), each round
//! followed by `WAIT` for a replica on every primary written, then read back from the primaries
//! and checked against the CRC-32 of the source, and recorded in the version's `done` hash; at
//! the end the manifest gets every block's CRC and the version turns `ready`. Servers only serve
//! `ready` versions, so a half-pushed version is never served; pushing again resumes it (the
//! blocks in `done` are skipped) if its tables are the same, and is refused otherwise.

use super::cluster::{Cluster, Ops};
use super::layout::{self, VersionState, block_prefix, check_name};
use super::manifest::{FORMAT, FORMAT_VERSION, Manifest, ManifestTable};
use super::store::{call, hash_entries, read_manifest, versions};
use crate::error::{EmbedError, Result};
use crate::table::EmbeddingTable;
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
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            version: None,
            window_bytes: 32 << 20,
            round_timeout: Duration::from_secs(30),
            replicas: 1,
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
    /// Rounds where fewer replicas than asked acknowledged the writes in time.
    pub unreplicated_rounds: usize,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn store_err(model: &str, version: u64, reason: impl Into<String>) -> EmbedError {
    EmbedError::RemoteStore {
        model: model.into(),
        version,
        reason: reason.into(),
    }
}

/// The manifest of `tables` (no CRCs).
fn manifest_of(model: &str, version: u64, tables: &[&EmbeddingTable]) -> Manifest {
    Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        model: model.into(),
        version,
        created_unix: now_unix(),
        tables: tables
            .iter()
            .map(|t| ManifestTable {
                name: t.name().into(),
                rows: t.rows(),
                dim: t.dim(),
                dtype: t.dtype(),
                row_bytes: t.stride(),
                rows_per_block: layout::rows_per_block(t.rows(), t.stride()),
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

/// The bytes of `rows` of `t` (from memory, or read row by row from its row file).
fn block_bytes<'a>(
    t: &'a EmbeddingTable,
    rows: std::ops::Range<usize>,
    buf: &'a mut Vec<u8>,
) -> Result<&'a [u8]> {
    let s = t.stride();
    if let Some(all) = t.resident() {
        return Ok(&all[rows.start * s..rows.end * s]);
    }
    buf.clear();
    buf.resize(rows.len() * s, 0);
    for (i, r) in rows.enumerate() {
        t.read_row(r, &mut buf[i * s..(i + 1) * s])?;
    }
    Ok(buf)
}

/// Pushes `tables` as a version of `model` (see the module documentation). `progress` is told
/// the bytes landed so far and the total after every round.
pub fn push(
    cluster: &mut Cluster,
    model: &str,
    tables: &[&EmbeddingTable],
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
        let key = layout::manifest_key(model, version);
        call(
            cluster,
            &key,
            redis::cmd("SET").arg(&key).arg(manifest.to_json()),
            false,
        )?;
        let vk = layout::versions_key(model);
        call(
            cluster,
            &vk,
            redis::cmd("HSET")
                .arg(&vk)
                .arg(version)
                .arg(VersionState::Pushing.name()),
            false,
        )?;
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
            let bytes = block_bytes(tables[ti], mt.block_rows(b), &mut scratch)?;
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
    for (mt, c) in manifest.tables.iter_mut().zip(crcs) {
        mt.block_crcs = c;
    }
    let key = layout::manifest_key(model, version);
    call(
        cluster,
        &key,
        redis::cmd("SET").arg(&key).arg(manifest.to_json()),
        false,
    )?;
    let vk = layout::versions_key(model);
    call(
        cluster,
        &vk,
        redis::cmd("HSET")
            .arg(&vk)
            .arg(version)
            .arg(VersionState::Ready.name()),
        false,
    )?;
    call(
        cluster,
        &done_key,
        redis::cmd("UNLINK").arg(&done_key),
        false,
    )?;
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Writes one round's blocks, waits for replicas, reads them back, checks and records them.
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
    // WAIT on each primary written, on the connection the writes went through.
    if opts.replicas > 0 {
        let wait_ms = opts.round_timeout.as_millis() as u64 / 2;
        for key in cluster.one_key_per_primary(keys.iter().map(|k| k.as_bytes())) {
            ops.push(key, redis::cmd("WAIT").arg(opts.replicas).arg(wait_ms));
        }
    }
    let replies = cluster.run(ops, false, deadline)?;
    for (i, v) in replies.iter().enumerate() {
        match v {
            Value::Okay | Value::SimpleString(_) if i < round.len() => {}
            Value::Int(n) if i >= round.len() => {
                if (*n as u64) < u64::from(opts.replicas) {
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
    // Read back from the primaries and check.
    ops.clear();
    for k in &keys {
        ops.push(k.as_bytes(), redis::cmd("GET").arg(k));
    }
    let replies = cluster.run(ops, false, deadline)?;
    let mut hset = redis::cmd("HSET");
    let done_key = layout::done_key(model, version);
    hset.arg(&done_key);
    for ((&(t, b, crc), v), key) in round.iter().zip(&replies).zip(&keys) {
        let mt = &manifest.tables[t];
        let want = mt.block_rows(b).len() * mt.row_bytes;
        let ok =
            matches!(v, Value::BulkString(got) if got.len() == want && crc32fast::hash(got) == crc);
        if !ok {
            return Err(store_err(
                model,
                version,
                format!("{key} does not read back as written (length or CRC-32 differs)"),
            ));
        }
        hset.arg(format!("{}:{b}", mt.name))
            .arg(format!("{crc:08x}"));
    }
    call(cluster, &done_key, &hset, false)?;
    ops.clear();
    round.clear();
    Ok(())
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    pub blocks: usize,
    pub bytes: usize,
    /// Blocks missing, of the wrong length or failing their CRC: `(table, block, what)`.
    pub bad: Vec<(String, usize, String)>,
}

/// Reads every block of a version back and checks it against the manifest's CRCs.
pub fn verify(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    timeout: Duration,
) -> Result<VerifyReport> {
    let manifest = read_manifest(cluster, model, version)?;
    let mut report = VerifyReport {
        blocks: 0,
        bytes: 0,
        bad: Vec::new(),
    };
    let mut ops = Ops::default();
    let mut pending: Vec<(usize, usize)> = Vec::new();
    let flush = |cluster: &mut Cluster,
                 ops: &mut Ops,
                 pending: &mut Vec<(usize, usize)>,
                 report: &mut VerifyReport|
     -> Result<()> {
        let replies = cluster.run(ops, true, Instant::now() + timeout)?;
        for (&(t, b), v) in pending.iter().zip(&replies) {
            let mt = &manifest.tables[t];
            let want = mt.block_rows(b).len() * mt.row_bytes;
            let what = match v {
                Value::BulkString(got) if got.len() != want => {
                    Some(format!("{} bytes, expected {want}", got.len()))
                }
                Value::BulkString(got) => match mt.block_crcs.get(b) {
                    Some(&c) if crc32fast::hash(got) != c => Some("CRC-32 differs".into()),
                    None => Some("no CRC in the manifest (push not finished)".into()),
                    _ => None,
                },
                _ => Some("missing".into()),
            };
            report.blocks += 1;
            report.bytes += want;
            if let Some(w) = what {
                report.bad.push((mt.name.clone(), b, w));
            }
        }
        ops.clear();
        pending.clear();
        Ok(())
    };
    let mut window = 0usize;
    for (t, mt) in manifest.tables.iter().enumerate() {
        for b in 0..mt.blocks() {
            let key = format!("{}{b}", block_prefix(model, version, &mt.name));
            ops.push(key.as_bytes(), redis::cmd("GET").arg(&key));
            pending.push((t, b));
            window += mt.block_rows(b).len() * mt.row_bytes;
            if window >= 32 << 20 {
                flush(cluster, &mut ops, &mut pending, &mut report)?;
                window = 0;
            }
        }
    }
    if !pending.is_empty() {
        flush(cluster, &mut ops, &mut pending, &mut report)?;
    }
    Ok(report)
}

/// One version in [`list`].
#[derive(Debug, Clone, PartialEq)]
pub struct VersionListing {
    pub version: u64,
    pub state: VersionState,
    pub created_unix: u64,
    pub tables: usize,
    pub rows: usize,
    pub bytes: usize,
}

/// Models and their versions, by name.
pub fn list(cluster: &mut Cluster) -> Result<Vec<(String, Vec<VersionListing>)>> {
    let mk = layout::models_key();
    let mut models = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let v = call(
            cluster,
            &mk,
            redis::cmd("SSCAN")
                .arg(&mk)
                .arg(&cursor)
                .arg("COUNT")
                .arg(1000),
            true,
        )?;
        let Value::Array(parts) = v else { break };
        if let (Some(Value::BulkString(next)), Some(Value::Array(items))) =
            (parts.first(), parts.get(1))
        {
            for i in items {
                if let Value::BulkString(b) = i {
                    models.push(String::from_utf8_lossy(b).into_owned());
                }
            }
            cursor = String::from_utf8_lossy(next).into_owned();
        }
        if cursor == "0" {
            break;
        }
    }
    models.sort();
    let mut out = Vec::new();
    for m in models {
        let mut vs = Vec::new();
        for (v, state) in versions(cluster, &m)? {
            let (created, tables, rows, bytes) = match read_manifest(cluster, &m, v) {
                Ok(man) => (
                    man.created_unix,
                    man.tables.len(),
                    man.tables.iter().map(|t| t.rows).sum(),
                    man.bytes(),
                ),
                Err(_) => (0, 0, 0, 0),
            };
            vs.push(VersionListing {
                version: v,
                state,
                created_unix: created,
                tables,
                rows,
                bytes,
            });
        }
        out.push((m, vs));
    }
    Ok(out)
}

/// Removes a version: marked `deleting` first (never served again), then its blocks are
/// unlinked `batch` keys at a time (`UNLINK` frees values off the main thread), then its
/// manifest and its entry. Safe to run again after an interruption. Returns the keys unlinked.
pub fn remove(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    timeout: Duration,
) -> Result<usize> {
    check_name("model", model)?;
    let known = versions(cluster, model)?;
    if !known.iter().any(|e| e.0 == version) {
        return Err(store_err(model, version, "no such version"));
    }
    let vk = layout::versions_key(model);
    call(
        cluster,
        &vk,
        redis::cmd("HSET")
            .arg(&vk)
            .arg(version)
            .arg(VersionState::Deleting.name()),
        false,
    )?;
    let mut unlinked = 0usize;
    if let Ok(manifest) = read_manifest(cluster, model, version) {
        let mut ops = Ops::default();
        for mt in &manifest.tables {
            let prefix = block_prefix(model, version, &mt.name);
            for b in 0..mt.blocks() {
                let key = format!("{prefix}{b}");
                ops.push(key.as_bytes(), redis::cmd("UNLINK").arg(&key));
                if ops.len() >= 512 {
                    unlinked +=
                        count_unlinked(&cluster.run(&ops, false, Instant::now() + timeout)?);
                    ops.clear();
                }
            }
        }
        if !ops.is_empty() {
            unlinked += count_unlinked(&cluster.run(&ops, false, Instant::now() + timeout)?);
        }
    }
    for key in [
        layout::done_key(model, version),
        layout::manifest_key(model, version),
    ] {
        call(cluster, &key, redis::cmd("UNLINK").arg(&key), false)?;
    }
    call(
        cluster,
        &vk,
        redis::cmd("HDEL").arg(&vk).arg(version),
        false,
    )?;
    if versions(cluster, model)?.is_empty() {
        let mk = layout::models_key();
        call(cluster, &mk, redis::cmd("SREM").arg(&mk).arg(model), false)?;
        call(cluster, &vk, redis::cmd("UNLINK").arg(&vk), false)?;
    }
    Ok(unlinked)
}

fn count_unlinked(replies: &[Value]) -> usize {
    replies
        .iter()
        .map(|v| match v {
            Value::Int(n) => *n as usize,
            _ => 0,
        })
        .sum()
}
