//! The tier's stores, made from the placements of the collection's tier tables
//! ([`open_stores`]): one [`RowStore`] over the row files of the `ssd` tables (io_uring, `pread`
//! or a mapping), and for the `remote` tables one [`RemoteRows`]: the Redis store, behind its
//! local-copy fallback when the tables have row-file copies, with the follower of its update
//! source started before any row is read.
//!
//! This is the one file of the tier that names the remote backend's types; the rest sees a
//! [`TierStore`] (a local or a remote store: the remote-only calls, probing, node counters and
//! row updates, are made on remote ones alone) and where each tier table's rows are ([`Home`]).

use super::follow::Follower;
use super::live::{follow, live_tables};
use super::options::TierOptions;
use crate::storage::remote::{
    self, RedisStore, RemoteRows, RemoteSource, RemoteTableSpec, WithLocalCopy,
};
use crate::storage::updates::FollowedTable;
use crate::storage::{RowStore, open_row_files};
use ember_embed::EmbeddingCollection;
use ember_embed::rowfile::RowFile;
use ember_embed::{EmbedError, Result};
use ember_embed::{EmbeddingTable, Placement};
use std::sync::Arc;

/// A store of the tier.
#[derive(Debug)]
pub(super) enum TierStore {
    /// Row files on this machine (the `ssd` tables).
    Local(Box<dyn RowStore>),
    /// A store read over the network (the `remote` tables).
    Remote(Box<dyn RemoteRows>),
}

impl TierStore {
    /// The store as every backend is.
    pub(super) fn rows(&self) -> &dyn RowStore {
        match self {
            TierStore::Local(s) => s.as_ref(),
            TierStore::Remote(s) => s.as_ref(),
        }
    }

    /// The store as every backend is, to read from.
    #[inline]
    pub(super) fn rows_mut(&mut self) -> &mut dyn RowStore {
        match self {
            TierStore::Local(s) => s.as_mut(),
            TierStore::Remote(s) => s.as_mut(),
        }
    }
}

/// Where a tier table's rows are: its store (an index in [`Stores::stores`]), its index among
/// that store's tables, its rows and bytes per row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Home {
    pub(super) store: usize,
    pub(super) table: usize,
    pub(super) rows: usize,
    pub(super) row_bytes: usize,
}

/// What [`open_stores`] made.
#[derive(Debug)]
pub(super) struct Stores {
    /// The local store, then the remote one; none (no ring, no thread pool, no connection) for a
    /// kind that no table has.
    pub(super) stores: Vec<TierStore>,
    /// Per tier table, in order: where its rows are.
    pub(super) homes: Vec<Home>,
    /// The remote tables' update source, followed (`None`: no remote table, or not following).
    pub(super) follower: Option<Follower>,
    /// For a remote store that pools on its nodes: a second connection to it, for the
    /// background fill of the caches (`fill.rs`), and the store's index.
    pub(super) fill: Option<(Box<dyn RowStore>, usize)>,
}

/// Opens the stores of `coll`'s tier tables `tier` (their indices in `coll`, in tier order; each
/// placed `ssd` with its row file, or `remote`) as `opts` asks (see the module documentation).
pub(super) fn open_stores(
    coll: &EmbeddingCollection,
    tier: &[usize],
    opts: &TierOptions,
) -> Result<Stores> {
    let tables = coll.tables();
    let remote_store = usize::from(
        tier.iter()
            .any(|&t| tables[t].placement() == Placement::Ssd),
    );
    let (mut files, mut remote) = (Vec::new(), Vec::new());
    let mut homes = Vec::with_capacity(tier.len());
    for (d, &t) in tier.iter().enumerate() {
        let table = &tables[t];
        homes.push(match (table.placement(), table.row_file()) {
            (Placement::Ssd, Some(file)) => {
                files.push(file.clone());
                Home {
                    store: 0,
                    table: files.len() - 1,
                    rows: file.rows(),
                    row_bytes: file.row_bytes(),
                }
            }
            // Placed `remote` (its row file, if any, is its local copy).
            _ => {
                remote.push(d);
                Home {
                    store: remote_store,
                    table: remote.len() - 1,
                    rows: table.rows(),
                    row_bytes: table.stride(),
                }
            }
        });
    }
    let mut out = Stores {
        stores: Vec::new(),
        homes,
        follower: None,
        fill: None,
    };
    if !files.is_empty() {
        let store = open_row_files(files, opts.io, opts.queue_depth)?;
        out.stores.push(TierStore::Local(store));
    }
    if !remote.is_empty() {
        let (store, follower, fill) = open_remote(coll, tier, &remote, &out.homes, opts)?;
        out.fill = fill.map(|f| (f, out.stores.len()));
        out.stores.push(TierStore::Remote(store));
        out.follower = follower;
    }
    Ok(out)
}

/// Opens the store of the tier tables `remote` (their indices among the tier tables `tier`, whose
/// shapes `homes` gives), those placed `remote`: the Redis store, and its update source followed
/// when `opts` asks, before any row is read (no update published from then on is missed); behind
/// the local copy of its tables when they have one (all of them or none).
fn open_remote(
    coll: &EmbeddingCollection,
    tier: &[usize],
    remote: &[usize],
    homes: &[Home],
    opts: &TierOptions,
) -> Result<RemoteOpened> {
    let tables: Vec<_> = remote.iter().map(|&d| &coll.tables()[tier[d]]).collect();
    let Some(src) = &opts.remote else {
        return Err(EmbedError::BadOption {
            option: "redis",
            reason: format!(
                "table '{}' is placed remote: give the cluster (--redis redis://host:port)",
                tables[0].name()
            ),
        });
    };
    let copies = local_copies(&tables)?;
    let specs: Vec<RemoteTableSpec> = tables
        .iter()
        .map(|t| RemoteTableSpec {
            name: t.name().into(),
            rows: t.rows(),
            dim: t.dim(),
            dtype: t.dtype(),
        })
        .collect();
    let mut store = RedisStore::open(src, &specs)?;
    store.set_pooling(opts.pool_remote)?;
    // The background fill's own connection (plain reads only).
    let fill: Option<Box<dyn RowStore>> = match store.pooling() {
        remote::PoolRemote::Off => None,
        _ => Some(Box::new(RedisStore::open(src, &specs)?)),
    };
    let follower = match opts.follow_updates {
        true => Some(follow_store(
            coll,
            src,
            store.version(),
            &specs,
            remote,
            homes,
        )?),
        false => None,
    };
    if copies.is_empty() {
        return Ok((Box::new(store), follower, fill));
    }
    let local = open_row_files(copies, opts.io, opts.queue_depth)?;
    // After the stream positions: an update is in these sets or followed.
    let updated = store.updated_blocks()?;
    let names = specs.iter().map(|t| t.name.clone()).collect();
    let copy = WithLocalCopy::new(Box::new(store), local, src.cluster.down_for);
    let copy = copy.with_updated_blocks(&src.model, names, updated);
    Ok((Box::new(copy), follower, fill))
}

/// What `open_remote` opened: the store, its update source followed, the fill's connection.
type RemoteOpened = (
    Box<dyn RemoteRows>,
    Option<Follower>,
    Option<Box<dyn RowStore>>,
);

/// The row files of the local copies of the remote tables `tables`: all of them, or none.
fn local_copies(tables: &[&EmbeddingTable]) -> Result<Vec<Arc<RowFile>>> {
    let copies: Vec<_> = tables
        .iter()
        .filter_map(|t| t.row_file().cloned())
        .collect();
    if !copies.is_empty() && copies.len() != tables.len() {
        return Err(EmbedError::BadOption {
            option: "fallback_local",
            reason: format!(
                "{} of the {} remote tables have a local copy: all or none must",
                copies.len(),
                tables.len()
            ),
        });
    }
    Ok(copies)
}

/// Starts following the update source of `version` of `src`: the remote tables `specs` (the
/// tier tables `remote`, their caches; `homes` gives their row bytes) and the live tables of
/// `coll` that the version holds. Positions are taken now.
fn follow_store(
    coll: &EmbeddingCollection,
    src: &RemoteSource,
    version: u64,
    specs: &[RemoteTableSpec],
    remote: &[usize],
    homes: &[Home],
) -> Result<Follower> {
    let followed = specs
        .iter()
        .zip(remote)
        .map(|(t, &d)| FollowedTable {
            name: t.name.clone(),
            rows: t.rows,
            row_bytes: homes[d].row_bytes,
        })
        .collect();
    let (in_coll, live) = live_tables(coll);
    let opened = remote::open_source(src, version, followed, &live)?;
    follow(coll, opened, remote, &in_coll)
}
