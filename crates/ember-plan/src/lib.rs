//! `ember plan`: sharding embedding tables over devices.
//!
//! - [`spec`]: tables (CSV or JSON: name, rows, dim, dtype, pooling factor) and devices;
//! - [`access`]: reuse profiles (Meta's locality statistics, or a trace);
//! - [`plan`]: a plan (which shard of which table lives where), its checks (every row and
//!   column placed exactly once, memory caps), plan files, and TorchRec's `ParameterSharding`;
//! - [`baselines`]: the heuristics a planner must beat (random, size-, dim-, lookup- and
//!   size-lookup-greedy), table-wise;
//! - [`cost`]: the cost model (analytic and boosted), fitted on measurements;
//! - [`search`]: Ember's planner (placement grid, local search, beam search over column splits);
//! - [`task`], [`measure`], [`eval`]: NeuroShard-like tasks, measured with Ember's kernels, for
//!   `ember plan calibrate` and `ember plan eval`.
//!
//! Plans run with [`ember_embed::ShardedEmbeddings`] (`predict --plan`, `serve --plan`).

pub mod access;
pub mod baselines;
pub mod cost;
mod error;
pub mod eval;
pub mod measure;
pub mod plan;
pub mod search;
pub mod spec;
pub mod task;

pub use error::{PlanError, Result};
pub use plan::{Plan, PlanFile, Shard};
pub use spec::{DeviceSpec, TableSpec};
