//! A version's records that the registry writes: its manifest and its state in the model's
//! `versions` hash (the keys are in [`crate::layout`]). The error about a
//! version is [`ember_embed::EmbedError::remote_store`].

use crate::Manifest;
use crate::layout::{self, VersionState};
use crate::store_error;
use ember_embed::Result;
use ember_redis::{Cluster, call};

/// Writes `manifest` to its key.
pub(crate) fn write_manifest(cluster: &mut Cluster, manifest: &Manifest) -> Result<()> {
    let key = layout::manifest_key(&manifest.model, manifest.version);
    call(
        cluster,
        &key,
        ember_redis::cmd("SET").arg(&key).arg(manifest.to_json()),
        false,
    )
    .map_err(store_error)?;
    Ok(())
}

/// Records `version` of `model` as `state` in the model's `versions` hash.
pub(crate) fn set_state(
    cluster: &mut Cluster,
    model: &str,
    version: u64,
    state: VersionState,
) -> Result<()> {
    let key = layout::versions_key(model);
    call(
        cluster,
        &key,
        ember_redis::cmd("HSET")
            .arg(&key)
            .arg(version)
            .arg(state.name()),
        false,
    )
    .map_err(store_error)?;
    Ok(())
}
