//! Pooling a batch's misses where the rows are: for the tier tables whose store pools on its
//! nodes (a remote store with `pool_remote` not off, [`RemoteRows::pool`]), the rows missing from
//! the cache of each feature whose partial sums cost fewer bytes than its rows (about one sum per
//! bag and node against one row per distinct miss; bags of one row, or a batch that repeats its
//! misses, are fetched as before) are not fetched; each feature's bags are summed over them on the nodes (one call per
//! node and table), and the feature is staged as its cached rows with zeros where the missing
//! ones were, plus the remote sums per bag, which the pooler adds after its kernel. The store's
//! other misses are fetched in the same call (one round trip per node for both), landed as the
//! fetch lands them. A step of [`super::Stager::stage`], between the lookups and the fetch of
//! the misses of other stores.
//!
//! Missing rows of pooled tables are not admitted to the cache by the batch, which does not wait
//! for them: those the cache's policy would admit now are read whole in the background and
//! offered to it (`fill.rs`).

use super::fill::Filler;
use super::inner::{Inner, TierTable, miss_requests};
use super::land::{Overflow, land_row};
use super::stats::Counters;
use super::stores::TierStore;
use crate::storage::RowRequest;
use crate::storage::remote::PoolJob;
use ember_embed::EmbeddingCollection;
use ember_embed::KeyedJagged;
use ember_embed::Result;
use ember_embed::staged::{Recycler, RemoteSums, STABLE_ROW, StagedBatch, StagedRows};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Per tier table (`tables`, their stores `stores`): whether its store pools on its nodes.
pub(super) fn pooled_tables(tables: &[TierTable], stores: &[TierStore]) -> Vec<bool> {
    tables
        .iter()
        .map(|t| matches!(&stores[t.store], TierStore::Remote(s) if s.pools()))
        .collect()
}

/// What [`pool_misses`] takes of the stager: which tier tables pool on their stores, where
/// staged buffers come from, its counters, and its background fill.
pub(super) struct PoolingParts<'a> {
    pub pooled: &'a [bool],
    pub recycler: &'a Recycler,
    pub counters: &'a Counters,
    pub filler: Option<&'a Filler>,
}

/// Pools the misses of `inner.misses` that belong to pooled tables on their stores, stages
/// their features as described in the module documentation (a zeroed buffer for each in
/// `overflow`, the sums in the feature's `remote`), and takes them out of `inner.misses`.
/// Returns the time spent waiting for the stores.
pub(super) fn pool_misses(
    parts: &PoolingParts<'_>,
    inner: &mut Inner,
    coll: &EmbeddingCollection,
    kj: &KeyedJagged,
    staged: &mut StagedBatch,
    overflow: &mut Overflow,
) -> Result<Duration> {
    let PoolingParts {
        pooled,
        recycler,
        counters,
        filler,
    } = *parts;
    let mut waited = Duration::ZERO;
    if !inner.misses.iter().any(|m| pooled[m.tier]) {
        return Ok(waited);
    }
    let mut chosen = choose(inner, pooled, coll, kj, staged);
    if chosen.is_empty() {
        return Ok(waited);
    }
    let is_chosen = |f: usize| chosen.iter().any(|c| c.0 == f);
    // The rows the caches would admit now are read whole in the background (`fill.rs`).
    if let Some(filler) = filler {
        let mut admit = Vec::new();
        for m in inner.misses.iter().filter(|m| is_chosen(m.feature)) {
            if inner.tables[m.tier].cache.would_admit(m.id as u64) {
                admit.push((m.tier, m.id as u64));
            }
        }
        filler.offer(&admit, counters);
    }
    inner.misses.retain(|m| !is_chosen(m.feature));
    let weights = kj.weights();
    for s in 0..inner.stores.len() {
        let (here, rest): (Vec<_>, Vec<_>) = chosen
            .into_iter()
            .partition(|c| inner.tables[c.1].store == s);
        chosen = rest;
        let (mine, jobs): (Vec<(usize, usize)>, Vec<PoolJob>) =
            here.into_iter().map(|(f, d, j)| ((f, d), j)).unzip();
        if mine.is_empty() {
            continue;
        }
        let mut sums: Vec<Vec<f32>> = (0..jobs.len()).map(|_| Vec::new()).collect();
        // This store's other misses are fetched in the same call (one round trip per node),
        // each landed as the fetch lands it, and so taken out of the misses left to fetch.
        let Inner {
            tables,
            stores,
            misses,
            ..
        } = &mut *inner;
        let mut reqs: Vec<RowRequest> = miss_requests(tables, misses, s).collect();
        let TierStore::Remote(store) = &mut stores[s] else {
            unreachable!("only remote stores pool")
        };
        let st = store.pool(&jobs, &mut sums, &mut reqs, &mut |r, row| {
            let m = &misses[r.tag];
            land_row(m, row, &mut tables[m.tier], staged, overflow, recycler);
        })?;
        misses.retain(|m| tables[m.tier].store != s);
        counters.store_reads.fetch_add(st.io.reads, Relaxed);
        counters.store_bytes_read.fetch_add(st.io.bytes, Relaxed);
        counters.pooled_rows.fetch_add(st.pooled_rows, Relaxed);
        counters.pool_plain_rows.fetch_add(st.plain_rows, Relaxed);
        waited += st.io.wait;
        for (&(f, _), sums) in mine.iter().zip(sums) {
            // SAFETY: only the remote sums and the overflow are set; the slots the feature names
            // stay as the stager held them.
            let sf = unsafe { staged.features_mut() }[f]
                .as_mut()
                .expect("staged above");
            // Zeros where the missing rows are: `complete` copies the cached ones beside them.
            overflow.push((f, recycler.take_rows(sf.n_rows * sf.stride)));
            sf.remote = Some(RemoteSums {
                weighted: weights.is_some(),
                sums,
            });
        }
    }
    Ok(waited)
}

/// The features with misses in pooled tables (`pooled`) whose partial sums would cost fewer
/// bytes than their rows, in order, each with its tier table and its misses per bag.
fn choose(
    inner: &Inner,
    pooled: &[bool],
    coll: &EmbeddingCollection,
    kj: &KeyedJagged,
    staged: &StagedBatch,
) -> Vec<(usize, usize, PoolJob)> {
    // The features with pooled misses, in order (each listed once), with their distinct misses.
    let mut feats: Vec<(usize, usize, usize)> = Vec::new();
    for m in inner.misses.iter().filter(|m| pooled[m.tier]) {
        match feats.iter_mut().find(|(f, _, _)| *f == m.feature) {
            Some(e) => e.2 += 1,
            None => feats.push((m.feature, m.tier, 1)),
        }
    }
    // Those whose partial sums would cost fewer bytes than their rows (else they are fetched
    // as before: rows in place in the cache, admitted by its policy).
    let mut chosen: Vec<(usize, usize, PoolJob)> = Vec::new();
    for (f, d, distinct) in feats {
        let job = job_of(inner, coll, kj, staged, f, d);
        let nodes = match &inner.stores[inner.tables[d].store] {
            TierStore::Remote(s) => s.pool_nodes().max(1),
            TierStore::Local(_) => 1,
        };
        let sums: usize = job.bags.iter().map(|&n| (n as usize).min(nodes)).sum();
        if sums * job.dim * 4 < distinct * job.dtype.row_bytes(job.dim) {
            chosen.push((f, d, job));
        }
    }
    chosen
}

/// Feature `f`'s (of tier table `d`) rows missing from the cache, per bag of the batch `kj`, in
/// bag order: the ids whose staged row is a placeholder (not a slot held, not a stable row).
fn job_of(
    inner: &Inner,
    coll: &EmbeddingCollection,
    kj: &KeyedJagged,
    staged: &StagedBatch,
    f: usize,
    d: usize,
) -> PoolJob {
    let table = coll.table_of(f);
    let sf = staged.feature(f).expect("a feature with misses was staged");
    let StagedRows::Slab { held, .. } = &sf.rows else {
        unreachable!("features are staged in a slab before their misses land")
    };
    let (bsz, weights) = (kj.batch_size(), kj.weights());
    let mut job = PoolJob {
        table: inner.tables[d].table,
        dtype: table.dtype(),
        dim: table.dim(),
        weighted: weights.is_some(),
        bags: Vec::with_capacity(bsz),
        ids: Vec::new(),
        weights: Vec::new(),
    };
    let start = kj.feature_range(f).start;
    for b in 0..bsz {
        let mut n = 0u32;
        for p in kj.bag(f, b) {
            let x = sf.inverse[p - start];
            if x != STABLE_ROW && held[x as usize] == u32::MAX {
                // Tier tables have fewer than u32::MAX rows (`tier_tables`).
                job.ids.push(kj.ids().get(p) as u32);
                if let Some(w) = weights {
                    job.weights.push(w[p]);
                }
                n += 1;
            }
        }
        job.bags.push(n);
    }
    job
}
