//! Next-batch prefetch: [`run_ahead`] prepares items (stages a batch's rows from the tier, forms
//! and stages a server's next batch) on a thread of its own, up to `depth` items ahead of the
//! consumer that computes them, so that reads overlap compute. [`pipeline`] is the tier's use of
//! it: stage each batch with a [`Stager`].
//!
//! `predict`, the server's batcher and `bench tiered` all run through [`run_ahead`]: one
//! pipeline, one set of rules (order kept, first error stops it, the producer never runs more
//! than `depth` items ahead).

use super::stager::Stager;
use ember_embed::EmbeddingCollection;
use ember_embed::KeyedJagged;
use ember_embed::Result;
use ember_embed::staged::StagedBatch;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Runs `prepare` on each item `depth` items ahead of `consume`, on a thread of its own (depth
/// 0: inline on the calling thread, no overlap). `consume` gets every prepared item in order; the
/// first error it returns stops the pipeline (the producer stops before its next item). `waited`
/// is told how long `consume`'s thread waited for each item (with depth 0, all of `prepare`'s
/// time). Where no thread can be started, it runs inline, as with depth 0.
pub fn run_ahead<T, U, E, I>(
    depth: usize,
    items: I,
    prepare: impl Fn(T) -> U + Sync,
    mut consume: impl FnMut(U) -> std::result::Result<(), E>,
    waited: impl Fn(Duration),
) -> std::result::Result<(), E>
where
    U: Send,
    I: IntoIterator<Item = T> + Send,
    I::IntoIter: Send,
{
    let inline = |items: I::IntoIter, consume: &mut dyn FnMut(U) -> std::result::Result<(), E>| {
        for item in items {
            let t = Instant::now();
            let u = prepare(item);
            waited(t.elapsed());
            consume(u)?;
        }
        Ok(())
    };
    if depth == 0 {
        return inline(items.into_iter(), &mut consume);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(depth - 1);
    // Shared so that the items are not lost with the closure when the thread cannot start.
    let items = Mutex::new(Some(items.into_iter()));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let prepare = &prepare;
        let (stop, shared) = (&stop, &items);
        let producer = std::thread::Builder::new()
            .name("ember-prepare".into())
            .spawn_scoped(s, move || {
                let taken = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
                let Some(items) = taken else { return };
                for item in items {
                    let u = prepare(item);
                    // Checked before blocking on the next item too (the loop's `next`); an iterator
                    // that blocks forever (an idle stdin) still delays the end after an error.
                    if stop.load(Relaxed) {
                        break;
                    }
                    if tx.send(u).is_err() {
                        break;
                    }
                }
            });
        if producer.is_err() {
            let taken = items.lock().unwrap_or_else(|p| p.into_inner()).take();
            return match taken {
                Some(items) => inline(items, &mut consume),
                None => Ok(()),
            };
        }
        let result = loop {
            let t = Instant::now();
            let Ok(u) = rx.recv() else {
                break Ok(());
            };
            waited(t.elapsed());
            if let Err(e) = consume(u) {
                stop.store(true, Relaxed);
                break Err(e);
            }
        };
        // Unblocks the producer (its next send fails) before the scope joins it.
        drop(rx);
        result
    })
}

/// Stages each item's batch `depth` batches ahead of `consume` with `stager` ([`run_ahead`]).
/// `consume` gets every item in order with its staged rows or the error staging it raised; the
/// first error `consume` returns stops the pipeline. Time `consume` waits for a batch is counted
/// as the stager's stall.
pub fn pipeline<T, E, I>(
    stager: &Stager,
    coll: &EmbeddingCollection,
    depth: usize,
    items: I,
    batch_of: impl Fn(&T) -> &KeyedJagged + Sync,
    mut consume: impl FnMut(T, Result<StagedBatch>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E>
where
    T: Send,
    I: IntoIterator<Item = T> + Send,
    I::IntoIter: Send,
{
    let stage = |item: T| {
        let staged = coll
            .check_view(batch_of(&item))
            .and_then(|b| stager.stage(coll, b));
        (item, staged)
    };
    run_ahead(
        depth,
        items,
        stage,
        |(item, staged)| consume(item, staged),
        |d| stager.add_stall(d),
    )
}
