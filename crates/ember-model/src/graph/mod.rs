//! A model's dense part as an ONNX graph (`dense.onnx`, written by `tools/export_torch.py --from
//! torch-module`): read, checked and planned at load, run on a batch.
//!
//! Why a runtime of Ember's own rather than a library (measured, `docs/graph-models.md`): the
//! dense parts of recommendation models are linear layers joined by a few cheap ops, and the
//! linear layers are where the time goes; here they run on Ember's own GEMM kernels (the DLRM
//! path's `Linear`: AVX-512 / faer in f32, and the bf16 / int8 kernels), which the candidate
//! runtimes cannot call. `ort` needs ONNX Runtime's shared library at run time (its default
//! build downloads one, which cannot be fetched here); `tract` adds a large dependency tree to
//! the build. The ops this build runs are listed in [`ops::SUPPORTED`]; any other is an error
//! at load that names the op and the node.
//!
//! - `onnx.rs`: the protobuf messages (a subset of `onnx.proto`, decoded by `prost`);
//! - `tensor.rs`: values (f32 and i64 tensors) and broadcasting;
//! - `ops.rs`: each op, parsed from its node (attributes checked) and dispatched;
//! - `compute.rs`: the ops' arithmetic, `layout.rs` the ops that move values, by the ONNX
//!   spec;
//! - `plan.rs`: the graph checked, folded, its linear layers fused, its values' lifetimes;
//! - `eval.rs`: a plan run on a batch; `pool.rs`: the buffers its runs reuse;
//! - `model.rs`: the graph as a [`crate::Model`]'s dense part: checked against its tables, run
//!   on a batch's dense features and pooled rows.

mod compute;
mod eval;
mod factor;
mod fuse;
mod join;
mod layout;
mod logic;
mod model;
mod onnx;
mod ops;
mod plan;
mod pool;
mod rows;
mod tensor;
#[cfg(test)]
mod tests;

use std::path::Path;

use prost::Message;

use crate::dense::DenseDType;
use crate::dense::driver::Kernels;

pub use model::{DENSE_INPUT, SPARSE_INPUT};
pub(crate) use model::{Widths, check as model_check, pooled_buffer, run as model_run};
pub use ops::SUPPORTED as SUPPORTED_OPS;
pub use tensor::Tensor;

use plan::{Kind, Plan};

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("{0}")]
    Io(String),
    #[error("not an ONNX model: {0}")]
    Decode(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Run(String),
}

pub type Result<T> = std::result::Result<T, GraphError>;

/// A dense graph ready to run.
#[derive(Debug)]
pub struct Graph {
    plan: Plan,
    /// The linear layers' precision and, below f32, their kernels ([`Graph::set_dense_dtype`]).
    dense: Dense,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Dense {
    pub dtype: DenseDType,
    pub kernels: Option<Kernels>,
}

/// The largest `dense.onnx` read (a dense part's weights; the tables are not in it).
const MAX_BYTES: u64 = 2 << 30;

impl Graph {
    pub fn load(path: &Path) -> Result<Graph> {
        let meta = std::fs::metadata(path)
            .map_err(|e| GraphError::Io(format!("{}: {e}", path.display())))?;
        if meta.len() > MAX_BYTES {
            return Err(GraphError::Invalid(format!(
                "{}: {} bytes, more than the {} a dense graph may have",
                path.display(),
                meta.len(),
                MAX_BYTES
            )));
        }
        let bytes =
            std::fs::read(path).map_err(|e| GraphError::Io(format!("{}: {e}", path.display())))?;
        Graph::from_bytes(&bytes).map_err(|e| match e {
            GraphError::Decode(m) => GraphError::Decode(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Graph> {
        let m = onnx::ModelProto::decode(bytes).map_err(|e| GraphError::Decode(e.to_string()))?;
        for o in &m.opset_import {
            if (o.domain.is_empty() || o.domain == "ai.onnx") && o.version < 7 {
                return Err(GraphError::Unsupported(format!(
                    "opset {} (Ember reads opset 7 and later)",
                    o.version
                )));
            }
        }
        let g = m
            .graph
            .as_ref()
            .ok_or_else(|| GraphError::Decode("the model has no graph".into()))?;
        Ok(Graph {
            plan: Plan::new(g)?,
            dense: Dense {
                dtype: DenseDType::F32,
                kernels: None,
            },
        })
    }

    /// The graph's input names, in order.
    pub fn inputs(&self) -> Vec<&str> {
        self.plan.inputs.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The graph's output names, in order.
    pub fn outputs(&self) -> Vec<&str> {
        self.plan.outputs.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// How many steps run on Ember's linear kernels, and how many as ops.
    pub fn steps(&self) -> (usize, usize) {
        let lin = self
            .plan
            .steps
            .iter()
            .filter(|s| matches!(s.kind, Kind::Linear(_) | Kind::Cross(_) | Kind::Factored(_)))
            .count();
        (lin, self.plan.steps.len() - lin)
    }

    /// Runs the linear layers in `dtype` from now on: its kernels chosen for this CPU and the
    /// weights converted and packed (bf16; int8 without a calibration's smoothing).
    pub fn set_dense_dtype(&mut self, dtype: DenseDType) -> crate::Result<()> {
        let kernels = match dtype {
            DenseDType::F32 => None,
            d => Some(Kernels::selected(d)?),
        };
        self.prepare(dtype);
        self.dense = Dense { dtype, kernels };
        Ok(())
    }

    /// Converts and packs the linear layers' weights for `dtype` (a model's predictors then
    /// run it with [`Graph::run_in`]).
    pub fn prepare(&self, dtype: DenseDType) {
        for s in &self.plan.steps {
            match &s.kind {
                Kind::Linear(l) | Kind::Cross(l) => l.prepare(dtype),
                Kind::Factored(f) => f.layers().for_each(|l| l.prepare(dtype)),
                _ => {}
            }
        }
    }

    /// Starts timing each step of the graph runs, on every thread (`ember bench graph
    /// --profile`), from zero.
    pub fn profile_start() {
        eval::profile_start();
    }

    /// Stops timing steps: each step of this graph that ran, as `node NAME (OP)` (a linear
    /// layer on Ember's kernels keeps its node's name), its mean time per run, and its share of
    /// the steps' total, slowest first.
    pub fn profile_take(&self) -> Vec<(String, std::time::Duration, f64)> {
        let times = eval::profile_take(&self.plan);
        let total: f64 = times.iter().map(|t| t.0.as_secs_f64()).sum();
        let mut v: Vec<_> = self
            .plan
            .steps
            .iter()
            .zip(&times)
            .filter(|(_, t)| t.1 > 0)
            .map(|(s, t)| {
                let share = t.0.as_secs_f64() / total.max(f64::MIN_POSITIVE);
                (s.what.clone(), t.0 / t.1 as u32, share)
            })
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.1));
        v
    }

    pub fn dense_dtype(&self) -> DenseDType {
        self.dense.dtype
    }

    /// Runs the graph on `inputs` (by name, every graph input given): its outputs, in order.
    /// The linear layers run on `threads` threads of the caller's rayon pool.
    pub fn run(&self, inputs: &[(&str, &Tensor)], threads: usize) -> Result<Vec<Tensor>> {
        eval::run(&self.plan, self.dense, inputs, threads)
    }

    /// [`Graph::run`] with the linear layers in `dense`'s precision (a predictor's, its
    /// weights packed by [`Graph::prepare`]).
    pub(crate) fn run_in(
        &self,
        dense: Dense,
        inputs: &[(&str, &Tensor)],
        threads: usize,
    ) -> Result<Vec<Tensor>> {
        eval::run(&self.plan, dense, inputs, threads)
    }
}
