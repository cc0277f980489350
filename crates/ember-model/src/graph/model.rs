//! A graph model: a DLRM-family [`crate::Model`] whose dense part is an ONNX graph
//! (`"interaction": {"kind": "graph", ...}`, written by `tools/export_torch.py --from
//! torch-module`). The embedding stage pools each sample's features into one row (every
//! feature's pooled embedding side by side, the graph's `sparse` input); the graph runs on that
//! row and the dense features (`dense`) and gives one value per sample of each named output.
//! Everything else is the DLRM path's own: placements and tiers, row updates, checks, batching
//! and serving.

use super::tensor::Data;
use super::{Dense, Graph, Tensor};

/// The graph's input of the dense features.
pub const DENSE_INPUT: &str = "dense";
/// The graph's input of the pooled embeddings.
pub const SPARSE_INPUT: &str = "sparse";

/// A batch's shape as the graph sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Widths {
    /// Samples.
    pub n: usize,
    /// Dense features per sample.
    pub dense: usize,
    /// Pooled values per sample.
    pub sparse: usize,
}

/// A buffer for a batch's pooled rows, from the thread's pool (`pool.rs`: no page faults),
/// zeroed; [`run`] takes it.
pub(crate) fn pooled_buffer(len: usize) -> Vec<f32> {
    super::pool::zeros(len)
}

/// The graph takes what the tables and the dense width give, and gives `outputs`: its inputs
/// are `dense` and / or `sparse`, its outputs `outputs` in order, and batches of 1 and 2 zeros
/// run to one value per sample of each.
pub(crate) fn check(
    graph: &Graph,
    dense_in: usize,
    sparse: usize,
    outputs: &[String],
) -> Result<(), String> {
    let inputs = graph.inputs();
    if let Some(other) = inputs
        .iter()
        .find(|n| ![DENSE_INPUT, SPARSE_INPUT].contains(n))
    {
        return Err(format!(
            "the graph takes an input {other:?}; a graph model's inputs are \"dense\" (the \
             dense features) and \"sparse\" (the pooled embeddings)"
        ));
    }
    if graph.outputs() != outputs {
        return Err(format!(
            "the graph gives {:?}; config.json names {outputs:?}",
            graph.outputs()
        ));
    }
    for n in [1, 2] {
        let w = Widths {
            n,
            dense: dense_in,
            sparse,
        };
        let mut outs = vec![Vec::new(); outputs.len()];
        run(
            graph,
            graph.dense,
            &vec![0.0; n * dense_in],
            pooled_buffer(n * sparse),
            w,
            1,
            &mut outs,
        )
        .map_err(|e| {
            format!(
                "the graph does not run on dense [{n}, {dense_in}] and the tables' pooled rows \
                 [{n}, {sparse}]: {e}"
            )
        })?;
    }
    Ok(())
}

/// The graph on a batch's dense features and pooled rows: each output's values into `out`
/// (one per sample each). An output of another length or type is an error naming it.
pub(crate) fn run(
    graph: &Graph,
    dense_p: Dense,
    dense: &[f32],
    pooled: Vec<f32>,
    w: Widths,
    threads: usize,
    out: &mut [Vec<f32>],
) -> Result<(), String> {
    let mut dv = super::pool::take(dense.len());
    dv.extend_from_slice(dense);
    let d = Tensor::f32(vec![w.n, w.dense], dv)?;
    let s = Tensor::f32(vec![w.n, w.sparse], pooled)?;
    let inputs: Vec<(&str, &Tensor)> = [(DENSE_INPUT, &d), (SPARSE_INPUT, &s)]
        .into_iter()
        .filter(|(name, _)| graph.inputs().contains(name))
        .collect();
    let outs = graph.run_in(dense_p, &inputs, threads);
    for t in [d, s] {
        if let Data::F32(v) = t.data {
            super::pool::give(v);
        }
    }
    let outs = outs.map_err(|e| e.to_string())?;
    for ((t, o), name) in outs.iter().zip(out.iter_mut()).zip(graph.outputs()) {
        let Some(v) = t.as_f32() else {
            return Err(format!("output {name:?} is {}, not float", t.kind()));
        };
        if v.len() != w.n {
            return Err(format!(
                "output {name:?} gives {} values (shape {:?}) for {} samples; each output must \
                 be one value per sample",
                v.len(),
                t.shape,
                w.n
            ));
        }
        o.clear();
        o.extend_from_slice(v);
    }
    Ok(())
}
