//! Managing versions in the registry: [`verify`], [`list`] and [`remove`] (in bounded steps, with
//! `UNLINK`, never `KEYS` or a big `DEL`), and [`check_blocks`], the read-back both a push and
//! `verify` end with. [`crate::push`] writes the versions. The key layout is in
//! [`crate::layout`].

use crate::store_error;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::layout::{self, VersionState, block_prefix, check_name};
use crate::{Manifest, ManifestTable, read_manifest, served_version, updated_set, versions};
use crate::{layout::updated_key, layout::updates_key};
use ember_embed::{EmbedError, Result};
use ember_redis::Value;
use ember_redis::{Cluster, Ops, Reply, call};

use crate::files::read_files;
use crate::version::set_state;

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// Blocks read back.
    pub blocks: usize,
    /// Bytes of rows in them.
    pub bytes: usize,
    /// Blocks missing, of the wrong length or failing their CRC: `(table, block, what)`.
    pub bad: Vec<(String, usize, String)>,
    /// Blocks that row updates rewrote since the push (`(table, block)`): their length is
    /// checked, their CRC is not (the push's no longer applies).
    pub updated: Vec<(String, usize)>,
}

/// Reads every block of a version back and checks it against the manifest's CRCs.
pub fn verify(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    timeout: Duration,
) -> Result<VerifyReport> {
    let manifest = read_manifest(cluster, model, version)?;
    let updated = updated_blocks(cluster, &manifest)?;
    let mut report = check_blocks(cluster, &manifest, true, timeout, &updated, None, None)?;
    if manifest.files.is_some()
        && let Err(e) = read_files(cluster, &manifest)
    {
        report
            .bad
            .push(("(config and dense weights)".into(), 0, e.to_string()));
    }
    Ok(report)
}

/// The blocks of each table of `manifest` that row updates rewrote since the push.
pub(crate) fn updated_blocks(
    cluster: &mut Cluster,
    manifest: &Manifest,
) -> Result<Vec<BTreeSet<usize>>> {
    manifest
        .tables
        .iter()
        .map(|mt| updated_set(cluster, &manifest.model, manifest.version, &mt.name))
        .collect()
}

/// Where [`check_blocks`] hands each good block: `(table, block, bytes)`.
pub(crate) type BlockSink<'a> = dyn FnMut(usize, usize, &[u8]) + 'a;

/// Bytes of blocks read back per call in [`check_blocks`]: with 16 MB calls reading back a
/// pushed version ran at 2.4-2.8 GB/s on a 3-primary loopback cluster, with 256 MB calls at
/// 1.7 GB/s.
const CHECK_WINDOW: usize = 16 << 20;

/// Reads every block of `manifest`'s version back (`read`: from any copy; else from the
/// primaries), of the tables `only` names (indices; `None`: all), and checks its length and its
/// CRC against the manifest's, each reply as it is read (no copy); a block in `updated` (per
/// table) is held to its length only. Each block that passes goes to `sink` as `(table, block,
/// bytes)`.
pub(crate) fn check_blocks(
    cluster: &mut Cluster,
    manifest: &Manifest,
    read: bool,
    timeout: Duration,
    updated: &[BTreeSet<usize>],
    only: Option<&[usize]>,
    mut sink: Option<&mut BlockSink<'_>>,
) -> Result<VerifyReport> {
    let mut report = VerifyReport {
        blocks: 0,
        bytes: 0,
        bad: Vec::new(),
        updated: Vec::new(),
    };
    let mut ops = Ops::default();
    let mut pending: Vec<(usize, usize)> = Vec::new();
    let mut flush =
        |cluster: &mut Cluster, ops: &mut Ops, pending: &mut Vec<(usize, usize)>| -> Result<()> {
            let mut what: Vec<Option<String>> = vec![Some("missing".into()); pending.len()];
            cluster
                .run_each(ops, read, Instant::now() + timeout, |i, v| {
                    let (t, b) = pending[i];
                    let rewritten = updated.get(t).is_some_and(|u| u.contains(&b));
                    what[i] = fault(&manifest.tables[t], b, v, rewritten);
                    if let (None, Reply::Bulk(got), Some(sink)) = (&what[i], v, sink.as_mut()) {
                        sink(t, b, got);
                    }
                })
                .map_err(store_error)?;
            for (&(t, b), w) in pending.iter().zip(what) {
                let mt = &manifest.tables[t];
                report.blocks += 1;
                report.bytes += mt.block_rows(b).len() * mt.row_bytes;
                if let Some(w) = w {
                    report.bad.push((mt.name.clone(), b, w));
                } else if updated.get(t).is_some_and(|u| u.contains(&b)) {
                    report.updated.push((mt.name.clone(), b));
                }
            }
            ops.clear();
            pending.clear();
            Ok(())
        };
    let mut window = 0usize;
    for (t, mt) in manifest.tables.iter().enumerate() {
        if only.is_some_and(|o| !o.contains(&t)) {
            continue;
        }
        for b in 0..mt.blocks() {
            let key = format!(
                "{}{b}",
                block_prefix(&manifest.model, manifest.version, &mt.name)
            );
            ops.push(key.as_bytes(), ember_redis::cmd("GET").arg(&key));
            pending.push((t, b));
            window += mt.block_rows(b).len() * mt.row_bytes;
            if window >= CHECK_WINDOW {
                flush(cluster, &mut ops, &mut pending)?;
                window = 0;
            }
        }
    }
    if !pending.is_empty() {
        flush(cluster, &mut ops, &mut pending)?;
    }
    Ok(report)
}

/// What is wrong with block `b` of `mt` as read back (`reply`), if anything: its length, and
/// its CRC-32 against the manifest's unless row updates `rewrote` it.
fn fault(mt: &ManifestTable, b: usize, reply: Reply<'_>, rewrote: bool) -> Option<String> {
    let want = mt.block_rows(b).len() * mt.row_bytes;
    match reply {
        Reply::Bulk(got) if got.len() != want => {
            Some(format!("{} bytes, expected {want}", got.len()))
        }
        Reply::Bulk(_) if rewrote => None,
        Reply::Bulk(got) => match mt.block_crcs.get(b) {
            Some(&c) if crc32fast::hash(got) != c => Some("CRC-32 differs".into()),
            None => Some("no CRC in the manifest (push not finished)".into()),
            _ => None,
        },
        Reply::Other(_) => Some("missing".into()),
    }
}

/// One version in [`list`].
#[derive(Debug, Clone, PartialEq)]
pub struct VersionListing {
    /// The version's number.
    pub version: u64,
    /// Its state in the model's `versions` hash.
    pub state: VersionState,
    /// Seconds since the Unix epoch when its push started (0: its manifest cannot be read).
    pub created_unix: u64,
    /// Tables in its manifest.
    pub tables: usize,
    /// Rows over all its tables.
    pub rows: usize,
    /// Bytes of rows over all its tables.
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
            ember_redis::cmd("SSCAN")
                .arg(&mk)
                .arg(&cursor)
                .arg("COUNT")
                .arg(1000),
            true,
        )
        .map_err(store_error)?;
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
        return Err(EmbedError::remote_store(model, version, "no such version"));
    }
    if served_version(cluster, model)? == Some(version) {
        return Err(EmbedError::remote_store(
            model,
            version,
            "it is the served version (promoted): promote another one first with `ember registry \
             promote`",
        ));
    }
    set_state(cluster, model, version, VersionState::Deleting)?;
    let vk = layout::versions_key(model);
    let unlinked = match read_manifest(cluster, model, version) {
        Ok(manifest) => unlink_tables(cluster, &manifest, timeout)?,
        Err(_) => 0,
    };
    for key in [
        layout::done_key(model, version),
        layout::file_key(model, version, "config"),
        layout::file_key(model, version, "dense"),
        layout::file_key(model, version, "graph"),
        layout::manifest_key(model, version),
    ] {
        call(cluster, &key, ember_redis::cmd("UNLINK").arg(&key), false).map_err(store_error)?;
    }
    call(
        cluster,
        &vk,
        ember_redis::cmd("HDEL").arg(&vk).arg(version),
        false,
    )
    .map_err(store_error)?;
    if versions(cluster, model)?.is_empty() {
        let mk = layout::models_key();
        call(
            cluster,
            &mk,
            ember_redis::cmd("SREM").arg(&mk).arg(model),
            false,
        )
        .map_err(store_error)?;
        call(cluster, &vk, ember_redis::cmd("UNLINK").arg(&vk), false).map_err(store_error)?;
    }
    Ok(unlinked)
}

/// Unlinks every block of `manifest`'s version, 512 keys per call, then each table's update
/// stream and its set of updated blocks. Returns the blocks unlinked.
fn unlink_tables(cluster: &mut Cluster, manifest: &Manifest, timeout: Duration) -> Result<usize> {
    let (model, version) = (manifest.model.as_str(), manifest.version);
    let mut unlinked = 0usize;
    let mut ops = Ops::default();
    for mt in &manifest.tables {
        let prefix = block_prefix(model, version, &mt.name);
        for b in 0..mt.blocks() {
            let key = format!("{prefix}{b}");
            ops.push(key.as_bytes(), ember_redis::cmd("UNLINK").arg(&key));
            if ops.len() >= 512 {
                unlinked += count_unlinked(
                    &cluster
                        .run(&ops, false, Instant::now() + timeout)
                        .map_err(store_error)?,
                );
                ops.clear();
            }
        }
    }
    if !ops.is_empty() {
        unlinked += count_unlinked(
            &cluster
                .run(&ops, false, Instant::now() + timeout)
                .map_err(store_error)?,
        );
    }
    // Each table's update stream and its set of updated blocks (not counted: not blocks).
    let mut ops = Ops::default();
    for mt in &manifest.tables {
        for key in [
            updates_key(model, version, &mt.name),
            updated_key(model, version, &mt.name),
        ] {
            ops.push(key.as_bytes(), ember_redis::cmd("UNLINK").arg(&key));
        }
    }
    if !ops.is_empty() {
        cluster
            .run(&ops, false, Instant::now() + timeout)
            .map_err(store_error)?;
    }
    Ok(unlinked)
}

/// The keys `UNLINK` replies say were removed.
fn count_unlinked(replies: &[Value]) -> usize {
    replies
        .iter()
        .map(|v| match v {
            Value::Int(n) => *n as usize,
            _ => 0,
        })
        .sum()
}
