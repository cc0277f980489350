//! `ember plan`: sharding embedding tables over devices.
//!
//! This crate holds (so far):
//! - [`spec`]: tables (CSV or JSON: name, rows, dim, dtype, pooling factor) and devices;
//! - [`plan`]: a plan (which shard of which table lives where), its checks (every row and
//!   column placed exactly once, memory caps), and its TorchRec `ParameterSharding` view;
//! - [`baselines`]: the heuristics a planner must beat (random, size-, dim-, lookup- and
//!   size-lookup-greedy), table-wise.
//!
//! The measured cost model, the search and `ember plan calibrate / eval` build on these.

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
