//! Following the update streams of a model served from the store: its remote tables (their
//! caches) and the tables it holds in memory (made live: [`crate::EmbeddingTable::make_live`]).
//! A live table's rows were read from the model's own files; when updates were published since
//! the version was pushed, they are read again whole from the store before serving starts, after
//! the streams' positions are taken (an update published meanwhile is both in the rows read and
//! applied again after them, in order: the last write still wins).

use super::follow::{Follower, Reload, Target};
use crate::collection::EmbeddingCollection;
use crate::error::{EmbedError, Result};
use crate::storage::remote::updates::{FollowedTable, UpdateReader};
use crate::storage::remote::{Cluster, RedisStore, RemoteSource, RemoteTableSpec, read_manifest};
use std::time::Instant;

/// Starts following the streams of `coll`'s tables in the store: `remote` (tier tables
/// `remote_tier`, with `row_bytes` each) and every live table of `coll` that the store holds
/// (read again whole now if updates were published to it). `version`: the version the remote
/// tables are read from.
pub(super) fn follow(
    coll: &EmbeddingCollection,
    src: &RemoteSource,
    version: u64,
    remote: &[RemoteTableSpec],
    remote_tier: &[usize],
    row_bytes: impl Fn(usize) -> usize,
) -> Result<Follower> {
    let mut followed: Vec<FollowedTable> = remote
        .iter()
        .zip(remote_tier)
        .map(|(t, &d)| FollowedTable {
            name: t.name.clone(),
            rows: t.rows,
            row_bytes: row_bytes(d),
        })
        .collect();
    let mut targets: Vec<Target> = remote_tier.iter().map(|&d| Target::Cache(d)).collect();
    let live: Vec<usize> = (0..coll.tables().len())
        .filter(|&t| coll.tables()[t].is_live())
        .collect();
    let mut reload = None;
    if !live.is_empty() {
        let mut cluster = Cluster::connect(src.cluster.for_setup())?;
        let manifest = read_manifest(&mut cluster, &src.model, version)?;
        let mut specs = Vec::new();
        let mut of = vec![None; followed.len()];
        for &t in &live {
            let table = &coll.tables()[t];
            if manifest.table(table.name()).is_none() {
                eprintln!(
                    "ember: table '{}' is not in the store ({} v{version}): it serves its rows \
                     as loaded, without updates",
                    table.name(),
                    src.model
                );
                continue;
            }
            of.push(Some((specs.len(), table.rows(), table.stride())));
            specs.push(RemoteTableSpec {
                name: table.name().into(),
                rows: table.rows(),
                dim: table.dim(),
                dtype: table.dtype(),
            });
            followed.push(FollowedTable {
                name: table.name().into(),
                rows: table.rows(),
                row_bytes: table.stride(),
            });
            targets.push(Target::Dram(t));
        }
        if !specs.is_empty() {
            let src = RemoteSource {
                version: Some(version),
                ..src.clone()
            };
            reload = Some(Reload::new(RedisStore::open(&src, &specs)?, of));
        }
    }
    let names: Vec<String> = followed.iter().map(|t| t.name.clone()).collect();
    // Positions first: no update published from here on is missed.
    let reader = UpdateReader::open(src.cluster.clone(), &src.model, version, followed)?;
    if let Some(r) = reload.as_mut() {
        for (i, target) in targets.iter().enumerate() {
            let Target::Dram(t) = *target else { continue };
            if !reader.published(i) {
                continue;
            }
            let table = &coll.tables()[t];
            let t0 = Instant::now();
            let mut wrong = None;
            r.table(i, |ids, rows| {
                wrong = table.write_rows(&ids, &rows).err();
                wrong.is_none()
            })?;
            if let Some(e) = wrong {
                return Err(e);
            }
            eprintln!(
                "ember: table '{}' was updated in the store since it was pushed: read its {} \
                 rows from there ({:.1} s)",
                table.name(),
                table.rows(),
                t0.elapsed().as_secs_f64()
            );
        }
    }
    Follower::start(reader, names, targets, reload).map_err(|e| EmbedError::Io {
        path: "ember-updates".into(),
        op: "start the update thread",
        reason: e.to_string(),
    })
}
