//! Following the updates of a model served from a store: its tier tables (their caches) and the
//! tables it holds in memory (made live: [`ember_embed::EmbeddingTable::make_live`]). A live table's
//! rows were read from the model's own files; when updates were published since the version was
//! pushed, they are read again whole from the store before serving starts, after the source's
//! positions are taken (an update published meanwhile is both in the rows read and applied again
//! after them, in order: the last write still wins). The source itself was opened by the store's
//! factory ([`crate::storage::updates::OpenedSource`]); nothing here knows what carries it.

use super::follow::{Follower, Reload, Target};
use crate::storage::updates::{LiveTable, OpenedSource};
use ember_embed::EmbeddingCollection;
use ember_embed::{EmbedError, Result};
use std::time::Instant;

/// The live tables of `coll` a source may follow: their indices in `coll`, and their shapes.
pub(super) fn live_tables(coll: &EmbeddingCollection) -> (Vec<usize>, Vec<LiveTable>) {
    (0..coll.tables().len())
        .filter(|&t| coll.tables()[t].is_live())
        .map(|t| {
            let table = &coll.tables()[t];
            let shape = LiveTable {
                name: table.name().into(),
                rows: table.rows(),
                dim: table.dim(),
                dtype: table.dtype(),
                row_bytes: table.stride(),
            };
            (t, shape)
        })
        .unzip()
}

/// Starts following `opened`: its first tables are the tier tables `tier` (their caches), the
/// rest the live tables of `coll` it holds (`live`: their indices in `coll`, as
/// [`live_tables`] gave them), each read again whole now if updates were published to it.
pub(super) fn follow(
    coll: &EmbeddingCollection,
    opened: OpenedSource,
    tier: &[usize],
    live: &[usize],
) -> Result<Follower> {
    let OpenedSource {
        source,
        live: held,
        reload,
    } = opened;
    let mut targets: Vec<Target> = tier.iter().map(|&d| Target::Cache(d)).collect();
    let mut of = vec![None; targets.len()];
    for (k, &j) in held.iter().enumerate() {
        let table = &coll.tables()[live[j]];
        of.push(Some((k, table.rows(), table.stride())));
        targets.push(Target::Dram(live[j]));
    }
    let mut reload = reload.map(|store| Reload::new(store, of));
    if let Some(r) = reload.as_mut() {
        for (i, target) in targets.iter().enumerate() {
            let Target::Dram(t) = *target else { continue };
            if !source.published(i) {
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
    let names = source.tables();
    Follower::start(source, names, targets, reload).map_err(|e| EmbedError::Io {
        path: "ember-updates".into(),
        op: "start the update thread",
        cause: e.into(),
    })
}
