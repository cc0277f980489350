//! The registry read: a model's versions and their states, the promoted one, the version a
//! server serves, a version's manifest, and the blocks row updates rewrote. The serving tier
//! (`ember-tier`'s remote store) reads a version through these, as the registry's own commands
//! do.

use crate::layout::{self, VersionState};
use crate::manifest::Manifest;
use crate::store_error;
use ember_embed::{EmbedError, Result};
use ember_redis::Value;
use ember_redis::{Cluster, call, hash_entries};
use std::collections::BTreeSet;

/// A model's versions and their states, oldest first.
pub fn versions(cluster: &mut Cluster, model: &str) -> Result<Vec<(u64, VersionState)>> {
    let mut v: Vec<(u64, VersionState)> = hash_entries(cluster, &layout::versions_key(model))
        .map_err(store_error)?
        .into_iter()
        .filter_map(|(f, s)| Some((f.parse().ok()?, VersionState::parse(&s)?)))
        .collect();
    v.sort_unstable_by_key(|e| e.0);
    Ok(v)
}

/// The version promoted to be served (`ember registry promote`), if any.
pub fn served_version(cluster: &mut Cluster, model: &str) -> Result<Option<u64>> {
    let key = layout::served_key(model);
    match call(cluster, &key, ember_redis::cmd("GET").arg(&key), false).map_err(store_error)? {
        Value::BulkString(b) => std::str::from_utf8(&b)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                EmbedError::remote_store(
                    model,
                    0,
                    format!(
                        "{key} holds '{}', not a version",
                        String::from_utf8_lossy(&b)
                    ),
                )
            }),
        _ => Ok(None),
    }
}

/// `version` if it is ready; else the promoted version (`ember registry promote`), or the newest
/// ready one when none was promoted.
pub fn resolve_version(cluster: &mut Cluster, model: &str, version: Option<u64>) -> Result<u64> {
    let all = versions(cluster, model)?;
    let err = |version: u64, reason: String| EmbedError::RemoteStore {
        model: model.into(),
        version,
        reason,
    };
    let promoted = match version {
        Some(_) => None,
        None => served_version(cluster, model)?,
    };
    match version.or(promoted) {
        Some(v) => match all.iter().find(|e| e.0 == v) {
            Some((_, VersionState::Ready)) => Ok(v),
            Some((_, s)) => Err(err(v, format!("it is {} and cannot be served", s.name()))),
            None if promoted.is_some() => Err(err(
                v,
                format!(
                    "it is promoted ({}) but not in {}: promote a ready version",
                    layout::served_key(model),
                    cluster.name()
                ),
            )),
            None => Err(err(v, format!("no such version in {}", cluster.name()))),
        },
        None => all
            .iter()
            .rev()
            .find(|e| e.1 == VersionState::Ready)
            .map(|e| e.0)
            .ok_or_else(|| {
                err(
                    0,
                    format!(
                        "no ready version in {} (push one with `ember registry push`)",
                        cluster.name()
                    ),
                )
            }),
    }
}

/// A version's manifest.
pub fn read_manifest(cluster: &mut Cluster, model: &str, version: u64) -> Result<Manifest> {
    let key = layout::manifest_key(model, version);
    match call(cluster, &key, ember_redis::cmd("GET").arg(&key), true).map_err(store_error)? {
        Value::BulkString(b) => Manifest::from_json(model, version, &b),
        _ => Err(EmbedError::RemoteStore {
            model: model.into(),
            version,
            reason: format!("no manifest at {key}"),
        }),
    }
}

/// The blocks of `table` that row updates rewrote since the push (`ember registry verify` holds
/// them to their length only, a local copy does not serve their rows).
pub fn updated_set(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    table: &str,
) -> Result<BTreeSet<usize>> {
    let key = layout::updated_key(model, version, table);
    Ok(
        match call(cluster, &key, ember_redis::cmd("SMEMBERS").arg(&key), true)
            .map_err(store_error)?
        {
            Value::Array(v) => v
                .iter()
                .filter_map(|b| match b {
                    Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
                    _ => None,
                })
                .collect(),
            _ => BTreeSet::new(),
        },
    )
}
