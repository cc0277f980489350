//! Several model instances (`--instances N`, Triton's `instance_group` count): the batcher's
//! thread forms and prepares a batch whenever an instance is free and hands it to that
//! instance's thread, which runs it on its own engine and answers its requests.

use std::sync::Arc;

use ember_model::serving::Runner;

use super::queue::Queue;
use super::run::{Ready, form_batch, prepare};
use super::{BatchConfig, Job, Shared};
use crate::error::ServeError;

/// The batching loop of several instances: this thread forms and prepares a batch whenever an
/// instance is free and hands it to that instance's thread, which runs and answers it. Forming
/// waits for a free instance, so requests arriving while all run join the next batch rather
/// than filling small ones. Tier rows are staged here, while the instances compute.
pub(super) fn run(
    engines: Vec<Box<dyn Runner>>,
    cfg: BatchConfig,
    shared: Shared,
    rx: Arc<Queue<Job>>,
) {
    let model = engines[0].servable().clone();
    let (free_tx, free_rx) = std::sync::mpsc::channel::<usize>();
    let mut to = Vec::with_capacity(engines.len());
    let mut threads = Vec::with_capacity(engines.len());
    for (i, mut engine) in engines.into_iter().enumerate() {
        let (tx, work) = std::sync::mpsc::sync_channel::<Ready>(1);
        to.push(tx);
        let (free, mut instance) = (free_tx.clone(), shared.instance(model.clone()));
        let thread = std::thread::Builder::new()
            .name(format!("ember-instance-{i}"))
            .spawn(move || {
                let _ = free.send(i);
                for ready in work {
                    instance.run(&mut *engine, ready);
                    if free.send(i).is_err() {
                        break;
                    }
                }
            })
            .expect("spawn a model instance's thread");
        threads.push(thread);
    }
    drop(free_tx);
    let Shared {
        queued,
        abandon_at,
        stats,
        ..
    } = shared;
    // Each instance says when it is free; a batch is formed only then.
    let mut still_free = None;
    loop {
        let i = match still_free.take() {
            Some(i) => i,
            None => match free_rx.recv() {
                Ok(i) => i,
                Err(_) => break,
            },
        };
        let Some(jobs) = form_batch(&rx, &cfg, model.max_batch_weight(), &queued) else {
            break;
        };
        match prepare(model.as_ref(), jobs, &abandon_at, &stats) {
            Some(ready) => {
                if let Err(std::sync::mpsc::SendError(ready)) = to[i].send(ready) {
                    // That instance's thread is gone (it panicked): answer its requests
                    // rather than drop them.
                    for j in ready.live {
                        j.answer(Err(ServeError::Internal("a model instance stopped".into())));
                    }
                }
            }
            // Nothing left to run in it: the instance is still free.
            None => still_free = Some(i),
        }
    }
    drop(to);
    for t in threads {
        let _ = t.join();
    }
}
