//! The remote tables' [`UpdateSource`]: [`open_source`] opens an [`UpdateReader`] on the update
//! streams of a version's tables, and of the in-memory tables of the model that the version
//! holds (with a [`RedisStore`] that reads those whole again when their updates were lost).

use super::store::{RedisStore, RemoteSource, RemoteTableSpec};
use super::updates::UpdateReader;
use crate::storage::RowStore;
use crate::storage::updates::EntryId;
use crate::storage::updates::{FollowedTable, LiveTable, OpenedSource, Polled, UpdateSource};
use ember_embed::Result;
use ember_redis::Cluster;
use ember_registry::read_manifest;
use ember_registry::store_error;

/// Opens the source of `followed` (the tables of a store of `src`, reading `version`) and of
/// those of `live` that the version holds (the others are said to be served without updates).
/// Stream positions are taken now: nothing published from here on is missed.
pub fn open_source(
    src: &RemoteSource,
    version: u64,
    mut followed: Vec<FollowedTable>,
    live: &[LiveTable],
) -> Result<OpenedSource> {
    let mut held = Vec::new();
    let mut reload: Option<Box<dyn RowStore>> = None;
    if !live.is_empty() {
        let mut cluster = Cluster::connect(src.cluster.for_setup()).map_err(store_error)?;
        let manifest = read_manifest(&mut cluster, &src.model, version)?;
        let mut specs = Vec::new();
        for (j, table) in live.iter().enumerate() {
            if manifest.table(&table.name).is_none() {
                eprintln!(
                    "ember: table '{}' is not in the store ({} v{version}): it serves its rows \
                     as loaded, without updates",
                    table.name, src.model
                );
                continue;
            }
            held.push(j);
            specs.push(RemoteTableSpec {
                name: table.name.clone(),
                rows: table.rows,
                dim: table.dim,
                dtype: table.dtype,
            });
            followed.push(FollowedTable {
                name: table.name.clone(),
                rows: table.rows,
                row_bytes: table.row_bytes,
            });
        }
        if !specs.is_empty() {
            let src = RemoteSource {
                version: Some(version),
                ..src.clone()
            };
            reload = Some(Box::new(RedisStore::open(&src, &specs)?));
        }
    }
    let reader = UpdateReader::open(src.cluster.clone(), &src.model, version, followed)?;
    Ok(OpenedSource {
        source: Box::new(reader),
        live: held,
        reload,
    })
}

impl UpdateSource for UpdateReader {
    fn name(&self) -> &str {
        self.source().0
    }

    fn tables(&self) -> Vec<String> {
        UpdateReader::tables(self)
    }

    fn poll(&mut self) -> Result<Vec<Polled>> {
        UpdateReader::poll(self)
    }

    fn positions(&self) -> Vec<EntryId> {
        UpdateReader::positions(self)
    }

    fn published(&self, i: usize) -> bool {
        UpdateReader::published(self, i)
    }

    fn batch(&self) -> usize {
        self.count
    }
}
