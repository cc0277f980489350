//! What `ember registry promote` changes and what a server built from the registry alone reads:
//!
//! - the served version, `ember:<model>:served` ([`promote`]; read by
//!   [`crate::resolve_version`]);
//! - a version's tables read back whole, block by block and checked ([`read_tables`]), for the
//!   tables a server holds in memory.

use crate::store_error;
use std::time::Duration;

use crate::{Manifest, layout, read_manifest, resolve_version, served_version};
use ember_embed::{EmbedError, Result};
use ember_redis::{Cluster, call};

use crate::admin::{check_blocks, updated_blocks};
use crate::files::read_files;

/// Makes `version` the one `model`'s servers serve: it must be ready and hold its config and
/// dense weights (checked here). Servers built from the registry (`ember serve
/// --from-registry`) load it and swap it in; servers started later serve it. Returns the version
/// served before, if one was promoted.
pub fn promote(cluster: &mut Cluster, model: &str, version: u64) -> Result<Option<u64>> {
    layout::check_name("model", model)?;
    // Ready, or the reason it cannot be served.
    resolve_version(cluster, model, Some(version))?;
    let manifest = read_manifest(cluster, model, version)?;
    read_files(cluster, &manifest)?;
    let before = served_version(cluster, model)?;
    let key = layout::served_key(model);
    call(
        cluster,
        &key,
        ember_redis::cmd("SET").arg(&key).arg(version),
        false,
    )
    .map_err(store_error)?;
    Ok(before)
}

/// Reads every block of the tables `tables` (indices into the manifest's) and hands each to
/// `sink` as `(table, block, bytes)`, in no particular order. Every block is checked for its
/// length, and against its CRC-32 unless a row update rewrote it; any block that fails fails
/// the read, naming it.
pub fn read_tables(
    cluster: &mut Cluster,
    manifest: &Manifest,
    tables: &[usize],
    timeout: Duration,
    sink: &mut dyn FnMut(usize, usize, &[u8]),
) -> Result<()> {
    let updated = updated_blocks(cluster, manifest)?;
    let report = check_blocks(
        cluster,
        manifest,
        true,
        timeout,
        &updated,
        Some(tables),
        Some(sink),
    )?;
    match report.bad.first() {
        None => Ok(()),
        Some((t, b, what)) => Err(EmbedError::remote_store(
            &manifest.model,
            manifest.version,
            format!(
                "{} blocks cannot be read as pushed, the first table {t} block {b}: {what} (run \
                 `ember registry verify`)",
                report.bad.len()
            ),
        )),
    }
}
