//! The family-neutral seam between a server (or a tool) and a model of any family: a
//! [`Servable`] declares its inputs, outputs and stages in a [`Signature`], checks a request's
//! decoded columns into a [`Request`], merges checked requests into a batch and stages it;
//! a [`Runner`] runs the batch on a device. A server batches, admits, meters and answers
//! through these two traits and names no family:
//!
//! ```text
//! decode (by the signature) -> Servable::check -> queue -> Servable::prepare -> Runner::run -> Outputs
//! ```
//!
//! A request is made of *items* (a DLRM sample, an HSTU user): the unit of batching and
//! admission. Each declared output holds, per item, one value (a DLRM score) or a run of values
//! (an HSTU task's scores, one per candidate); [`Signature::offsets`] then names the output that
//! tells each item's run.
//!
//! The families: `dlrm.rs` (DLRM and DCNv2, [`crate::Model`] with any [`crate::Engine`]) and
//! `hstu.rs` ([`crate::hstu::HstuModel`] on the CPU). [`load`] reads a model directory of
//! either family.

mod dlrm;
mod hstu;

pub use crate::outputs::Outputs;
pub use dlrm::{EngineRunner, SCORES, into_samples};
pub use hstu::{HstuRunner, run_staged_users};

use std::any::Any;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ember_embed::{Ids, Lengths};

use crate::dense::DenseDType;
use crate::engine::LayerTime;
use crate::error::Result;
use crate::inputs::Inputs;
use crate::model::{LoadOptions, RecordOptions};
use crate::tier::Tier;

/// What an input tensor holds, per request of `n` items.
#[derive(Debug, Clone, PartialEq)]
pub enum InputKind {
    /// FP32 `[n, width]`, finite.
    Floats { width: usize },
    /// INT64 or INT32 `[n]`: a count of values per item, for the [`InputKind::Values`] input
    /// that names it.
    Lengths,
    /// INT64 or INT32 `[sum of the counts of input number `lengths`]`, item after item; ids of
    /// a table of `rows` rows, or plain integers (timestamps, weights) when `rows` is `None`.
    Values { lengths: usize, rows: Option<u64> },
}

/// One declared input.
#[derive(Debug, Clone, PartialEq)]
pub struct InputSpec {
    pub name: String,
    pub kind: InputKind,
    /// Whether a request must give it (an optional one left out is absent, not empty).
    pub required: bool,
}

/// A model's interface, as a server sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    pub inputs: Vec<InputSpec>,
    /// FP32 outputs, each one value per item or, with [`Signature::offsets`], a run per item.
    pub outputs: Vec<String>,
    /// The INT64 `[n + 1]` output of where each item's run starts (`None`: one value per item).
    pub offsets: Option<String>,
    /// What one item is, in messages ("sample", "user").
    pub item: &'static str,
    /// The forward pass's stages, in order ([`Times::stages`]).
    pub stages: Vec<&'static str>,
    /// Whether every [`InputKind::Values`] input fits 32 bits (the columns keep them so).
    pub narrow_values: bool,
}

impl Signature {
    /// Whether each item gets one value of one output (a DLRM score), not runs of them.
    pub fn one_value_per_item(&self) -> bool {
        self.offsets.is_none() && self.outputs.len() == 1
    }

    /// An empty value column with room for `capacity`, as [`Servable::check`] takes it.
    pub fn new_values(&self, capacity: usize) -> Ids {
        Ids::with_capacity(self.narrow_values, capacity)
    }
}

/// A request decoded by its signature, not yet checked: `n` items; every
/// [`InputKind::Floats`] input's values, inputs in declared order; every
/// [`InputKind::Lengths`] input's counts (`n` each, or all ones), in declared order; every
/// [`InputKind::Values`] input's values, in declared order. `present[i]` says whether input
/// `i` was given (an absent one contributes zero counts and no values).
#[derive(Debug, Clone, PartialEq)]
pub struct InputColumns {
    pub n: usize,
    pub floats: Vec<f32>,
    pub lengths: Lengths,
    pub values: Ids,
    pub present: Vec<bool>,
}

/// A request's items, checked against the model: what a server queues.
pub trait Items: Send + Sync + Debug + 'static {
    /// Items (samples, users).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What the items weigh against [`Servable::max_batch_weight`] (an HSTU user: its
    /// tokens); by default one each.
    fn weight(&self) -> usize {
        self.len()
    }
    /// A class per item for per-item latency metrics (an HSTU user: the bucket of its history's
    /// length, `"1024"` for 257 to 1,024 items); empty where the family has none.
    fn classes(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The items in pieces of at most `max`, in order, each still checked; each piece is made
    /// when it is asked for.
    fn pieces(&self, max: usize) -> Box<dyn Iterator<Item = Request> + Send + '_>;
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// A checked request.
pub type Request = Box<dyn Items>;

/// Checked requests merged into one batch and staged (tier rows read): what a [`Runner`] runs.
pub type Batched = Box<dyn Any + Send>;

/// A model as a server serves it.
pub trait Servable: Send + Sync + Debug + 'static {
    /// Its signature (built on each call: a server keeps it).
    fn signature(&self) -> Signature;

    /// Checks decoded columns; errors name the input, the item and the value.
    fn check(&self, columns: InputColumns) -> Result<Request>;

    /// When the inputs are dense features and one bag of ids per sparse feature (the Criteo
    /// form `/v1/score` takes as TSV lines and JSON samples): their description.
    fn bags(&self) -> Option<Inputs> {
        None
    }

    /// Checks a JSON body of the family's own form (one item or an array of them), where it has
    /// one (`None`: it has none; the bag form is read by the server).
    fn check_json(&self, _body: &[u8]) -> Option<Result<Request>> {
        None
    }

    /// Merges checked requests into one batch and stages its tier rows.
    fn prepare(&self, parts: &[&dyn Items]) -> Result<Batched>;

    /// Batches to prepare ahead of the one running (0: prepare on the running thread).
    fn prefetch_depth(&self) -> usize;

    /// The most [`Items::weight`] a tool merges into one batch, whatever its item count (an
    /// HSTU batch's tokens bound its activations' memory); by default no bound.
    fn max_batch_weight(&self) -> usize {
        usize::MAX
    }

    /// A request of random items (at most `most`) to warm the model with before it serves.
    fn warm_request(&self, most: usize, seed: u64) -> Request;

    /// A request of synthetic items shaped as `w` asks (`ember bench model`), drawn from
    /// `seed`; an error names a setting of `w` this family has no use for.
    fn synthetic(&self, w: &Workload, seed: u64) -> Result<Request>;

    /// The floating-point operations (a multiply-add is two) of `items`' forward pass in each
    /// declared stage that does dense work, for a tool's rates and ceiling shares; empty where
    /// the family does not count them.
    fn flops(&self, _items: &dyn Items) -> Vec<(&'static str, f64)> {
        Vec::new()
    }

    /// What running `items` is expected to cost, in the unit of a server's admission model
    /// (`ember-serve`'s `batcher/admit.rs` fits a batch's time as `a + b * cost`): one per item
    /// by default (a DLRM sample); an HSTU user its forward pass's MFLOP, which grows with its
    /// history times its candidates. At least 1 for items that are not empty.
    fn cost(&self, items: &dyn Items) -> u64 {
        items.len() as u64
    }

    /// Its SSD / remote tier.
    fn tier(&self) -> Tier<'_>;

    /// Model parameters a server reports (its model configuration): name, value.
    fn parameters(&self) -> Vec<(&'static str, String)>;

    /// Each table's placement's name (`dram`, `ssd`, `remote`, ...).
    fn placements(&self) -> Vec<&'static str>;

    /// The precision of its dense layers.
    fn dense_dtype(&self) -> DenseDType;

    /// Its cache of users' histories' counters, where it has one (an HSTU model with
    /// `history_cache` in its load options).
    fn history_cache(&self) -> Option<crate::hstu::CacheStats> {
        None
    }

    /// Whether it can record its lookups for a placement profile (`ember serve --profile-dir`).
    fn records_lookups(&self) -> bool {
        false
    }

    /// Starts recording its lookups for a placement profile; an error where the family does
    /// not record them ([`Servable::records_lookups`]).
    fn record_accesses(&self, _opts: RecordOptions) -> Result<()> {
        Err(crate::error::ModelError::BadOption {
            option: "profile",
            reason: "this model family does not record its lookups".into(),
        })
    }

    /// Writes the lookups recorded so far under `dir`: the files written.
    fn write_profile(&self, _dir: &Path) -> Result<Vec<std::path::PathBuf>> {
        Ok(Vec::new())
    }

    /// A runner on the CPU with `threads` threads.
    fn cpu_runner(self: Arc<Self>, threads: usize) -> Result<Box<dyn Runner>>;

    /// Frees its tables one at a time, `pause` after each, if the caller holds the last
    /// reference; else gives the reference back.
    fn release(self: Arc<Self>, pause: Duration) -> Option<Arc<dyn Servable>>;

    fn as_any(&self) -> &dyn Any;

    /// The model as its own type (`Arc::downcast`), for a caller that builds a family's runner
    /// itself (a GPU engine).
    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// Runs prepared batches of one model on one device.
pub trait Runner: Send {
    fn servable(&self) -> &Arc<dyn Servable>;

    /// Runs `batch` (from [`Servable::prepare`] of this model), writing `out`.
    fn run(&mut self, batch: &Batched, out: &mut Outputs) -> Result<Times>;

    /// The device it runs on, for logs.
    fn device(&self) -> String;

    /// Starts timing each reduced-precision dense layer ([`Runner::layer_times`]).
    fn time_layers(&mut self) {}

    /// Each timed layer's time since [`Runner::time_layers`]; empty where the engine does not
    /// time its layers.
    fn layer_times(&self) -> Vec<LayerTime> {
        Vec::new()
    }

    /// Checks nothing: prepares `request` and runs it on the calling thread (warming, tools).
    fn run_request(&mut self, request: &dyn Items, out: &mut Outputs) -> Result<Times> {
        let s = self.servable().clone();
        let batch = s.prepare(&[request])?;
        self.run(&batch, out)
    }
}

/// Where one batch's time went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Times {
    /// The whole forward pass.
    pub wall: Duration,
    /// The embedding lookups (with tier staging done on the running thread).
    pub embedding: Duration,
    /// The dense layers on the critical path.
    pub dense: Duration,
    /// On a device: the batch's copy in and its outputs' copy out (outside `wall`).
    pub copy_in: Duration,
    pub copy_out: Duration,
    /// Each declared stage's time ([`Signature::stages`]).
    pub stages: Vec<(&'static str, Duration)>,
    /// Stages that ran beside the others, their time inside another stage's (the stages then
    /// add up to more than `wall`).
    pub overlapped: Vec<&'static str>,
}

impl Times {
    /// Adds `t` (a later batch's times, its stages in the same order) to these.
    pub fn add(&mut self, t: &Times) {
        self.wall += t.wall;
        self.embedding += t.embedding;
        self.dense += t.dense;
        self.copy_in += t.copy_in;
        self.copy_out += t.copy_out;
        if self.stages.is_empty() {
            self.stages = t.stages.iter().map(|&(n, _)| (n, Duration::ZERO)).collect();
        }
        for ((_, a), (_, b)) in self.stages.iter_mut().zip(&t.stages) {
            *a += *b;
        }
        for o in &t.overlapped {
            if !self.overlapped.contains(o) {
                self.overlapped.push(o);
            }
        }
    }
}

/// Synthetic traffic a tool asks a family for ([`Servable::synthetic`]); `None` is the
/// family's default, and a family refuses a setting it has no use for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    /// Items a request [default: the family's].
    pub items: Option<usize>,
    /// Ids per bag of each bag feature, in the signature's order (one value: every feature's).
    pub pooling: Option<Vec<usize>>,
    /// History items of each user.
    pub history: Option<usize>,
    /// Candidates of each user.
    pub candidates: Option<usize>,
}

impl Workload {
    /// The error for a setting the family of `item`s has no use for.
    pub fn unused(option: &'static str, item: &str) -> crate::error::ModelError {
        crate::error::ModelError::BadOption {
            option,
            reason: format!("this model's {item}s have no use for it"),
        }
    }
}

/// Loads the model in `dir`, whichever family it is.
pub fn load(dir: &Path, opts: LoadOptions) -> Result<Arc<dyn Servable>> {
    Ok(servable(crate::family::AnyModel::load(dir, opts)?))
}

/// A model of either family, to serve.
pub fn servable(m: crate::family::AnyModel) -> Arc<dyn Servable> {
    match m {
        crate::family::AnyModel::Dlrm(m) => Arc::new(*m),
        crate::family::AnyModel::Hstu(m) => Arc::new(*m),
    }
}

#[cfg(test)]
mod tests;
