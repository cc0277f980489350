//! A decoded ONNX graph made ready to run: value names numbered, every op checked at load (an op,
//! attribute or element type the build lacks is an error naming the node), what depends on no
//! input computed once (constant folding), the linear layers given to Ember's dense kernels
//! (`Gemm` with constant weights, or `MatMul` by a constant then `Add` of a constant, with a
//! following `Relu` fused when nothing else reads the layer's output), and each value freed
//! after its last reader.

use std::collections::HashMap;

use super::factor::Factored;
use super::join::Part;
use super::onnx::{GraphProto, NodeProto};
use super::ops::{Binary, Op, Unary};
use super::tensor::Tensor;
use super::{GraphError, Result};
use crate::mlp::Linear;

/// One step of the plan: an op, or a linear layer on Ember's kernels.
#[derive(Debug)]
pub(super) enum Kind {
    Op(Op),
    Linear(Box<Linear>),
    /// A linear layer (no ReLU) whose output `y` only `x0 * y` reads, which only `+ xl` reads:
    /// the cross net's step in one pass (inputs `[x, x0, xl]`; [`Plan::crosses`]).
    Cross(Box<Linear>),
    /// A `Mul` whose product only a `ReduceSum` reads (inputs `[a, b, axes]`): a mixture of
    /// experts' gate times its experts, summed over the experts ([`Plan::gated_sums`]).
    GatedSum {
        axes: Option<Vec<i64>>,
        keepdims: bool,
    },
    /// A `Concat` on `axis` whose parts are its inputs or `Add` / `Sub` / `Mul` / `Div` of two
    /// of them that only the join reads: each computed into its slot of the output
    /// ([`Plan::joined_ops`]).
    Joined {
        axis: i64,
        parts: Vec<Part>,
    },
    /// A linear layer over a join that only it reads, split over the join's parts
    /// ([`Plan::factored`](super::fuse)): DIN's first attention layer.
    Factored(Box<Factored>),
}

#[derive(Debug)]
pub(super) struct Step {
    pub kind: Kind,
    /// Value ids read (`None`: an omitted optional input).
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<usize>,
    /// `node NAME (OP)`, for errors.
    pub what: String,
}

/// The planned graph.
#[derive(Debug)]
pub(super) struct Plan {
    pub steps: Vec<Step>,
    /// Values known at load (initializers and folded results), by id.
    pub consts: Vec<Option<Tensor>>,
    /// Graph inputs: (name, id).
    pub inputs: Vec<(String, usize)>,
    /// Graph outputs: (name, id).
    pub outputs: Vec<(String, usize)>,
    /// For each step, the values whose last reader it is (freed after it runs).
    pub frees: Vec<Vec<usize>>,
    pub values: usize,
}

fn what(n: &NodeProto, i: usize) -> String {
    let name = if n.name.is_empty() {
        format!("#{i}")
    } else {
        n.name.clone()
    };
    format!("node {name} ({})", n.op_type)
}

impl Plan {
    pub(super) fn new(g: &GraphProto) -> Result<Plan> {
        if !g.sparse_initializer.is_empty() {
            return Err(GraphError::Invalid(
                "the graph has sparse initializers; Ember reads dense ones only".into(),
            ));
        }
        let mut ids: HashMap<String, usize> = HashMap::new();
        let mut consts: Vec<Option<Tensor>> = Vec::new();
        let mut id = |name: &str, consts: &mut Vec<Option<Tensor>>| -> usize {
            *ids.entry(name.to_owned()).or_insert_with(|| {
                consts.push(None);
                consts.len() - 1
            })
        };
        for t in &g.initializer {
            let i = id(&t.name, &mut consts);
            consts[i] = Some(t.to_tensor(&format!("initializer {}", t.name))?);
        }
        let mut inputs = Vec::new();
        for v in &g.input {
            let i = id(&v.name, &mut consts);
            if consts[i].is_none() {
                inputs.push((v.name.clone(), i));
            }
        }
        let mut defined: Vec<bool> = consts.iter().map(Option::is_some).collect();
        defined.resize(consts.len(), false);
        for &(_, i) in &inputs {
            defined[i] = true;
        }
        let mut steps = Vec::new();
        for (n, node) in g.node.iter().enumerate() {
            let w = what(node, n);
            if !node.domain.is_empty() && node.domain != "ai.onnx" {
                return Err(GraphError::Unsupported(format!(
                    "{w}: domain {:?} (custom ops are not supported; export with standard ONNX ops)",
                    node.domain
                )));
            }
            let op = Op::parse(node, &w).map_err(GraphError::Unsupported)?;
            let (lo, hi) = op.arity();
            if node.input.len() < lo || node.input.len() > hi {
                return Err(GraphError::Invalid(format!(
                    "{w}: {} inputs, expected {lo} to {hi}",
                    node.input.len()
                )));
            }
            let mut ins = Vec::new();
            for name in &node.input {
                if name.is_empty() {
                    ins.push(None);
                    continue;
                }
                let i = id(name, &mut consts);
                defined.resize(consts.len(), false);
                if !defined[i] {
                    return Err(GraphError::Invalid(format!(
                        "{w}: input {name:?} is not computed before it (the graph's nodes must be \
                         in topological order)"
                    )));
                }
                ins.push(Some(i));
            }
            let outs: Vec<usize> = node
                .output
                .iter()
                .map(|name| id(name, &mut consts))
                .collect();
            defined.resize(consts.len(), false);
            outs.iter().for_each(|&o| defined[o] = true);
            steps.push(Step {
                kind: Kind::Op(op),
                inputs: ins,
                outputs: outs,
                what: w,
            });
        }
        let mut outputs = Vec::new();
        for v in &g.output {
            let i = *ids.get(&v.name).ok_or_else(|| {
                GraphError::Invalid(format!("output {:?} is not computed by any node", v.name))
            })?;
            outputs.push((v.name.clone(), i));
        }
        let values = consts.len();
        let mut plan = Plan {
            steps,
            consts,
            inputs,
            outputs,
            frees: Vec::new(),
            values,
        };
        plan.fold()?;
        plan.fuse();
        Ok(plan)
    }

    /// Runs once at load every step whose inputs are all known, and drops it.
    fn fold(&mut self) -> Result<()> {
        let steps = std::mem::take(&mut self.steps);
        for s in steps {
            let known = s
                .inputs
                .iter()
                .all(|i| i.is_none_or(|i| self.consts[i].is_some()));
            let Kind::Op(op) = &s.kind else {
                self.steps.push(s);
                continue;
            };
            if !known {
                self.steps.push(s);
                continue;
            }
            let args: Vec<Option<&Tensor>> = s
                .inputs
                .iter()
                .map(|i| i.and_then(|i| self.consts[i].as_ref()))
                .collect();
            let outs = op
                .eval(&args, s.outputs.len())
                .map_err(|e| GraphError::Invalid(format!("{}: {e}", s.what)))?;
            for (o, t) in s.outputs.iter().zip(outs) {
                self.consts[*o] = Some(t);
            }
        }
        Ok(())
    }

    /// How many steps read each value, and whether a graph output is it.
    pub(super) fn readers(&self) -> Vec<usize> {
        let mut n = vec![0usize; self.values];
        for s in &self.steps {
            s.inputs.iter().flatten().for_each(|&i| n[i] += 1);
        }
        for &(_, o) in &self.outputs {
            n[o] += 1;
        }
        n
    }

    pub(super) fn find_reader(&self, from: usize, value: usize) -> Option<usize> {
        (from..self.steps.len()).find(|&j| self.steps[j].inputs.contains(&Some(value)))
    }

    /// The 2-D weight `[out, in]` of a `Gemm` step or of a `MatMul` by a constant, and its
    /// scale; `None` when the step is not a linear layer on constant weights.
    fn weight_of(&self, s: &Step) -> Option<(Vec<f32>, usize, usize)> {
        let c = |i: Option<usize>| i.and_then(|i| self.consts[i].as_ref());
        let (alpha, ta, tb, w) = match &s.kind {
            Kind::Op(Op::Gemm {
                alpha,
                beta,
                ta,
                tb,
            }) if *beta == 1.0 => (*alpha, *ta, *tb, c(s.inputs[1])?),
            Kind::Op(Op::MatMul) => (1.0, false, false, c(s.inputs[1])?),
            _ => return None,
        };
        if ta || w.shape.len() != 2 || c(s.inputs[0]).is_some() {
            return None;
        }
        let v = w.as_f32()?;
        let (out, inp) = if tb {
            (w.shape[0], w.shape[1])
        } else {
            (w.shape[1], w.shape[0])
        };
        let mut wt = vec![0.0f32; out * inp];
        for o in 0..out {
            for i in 0..inp {
                wt[o * inp + i] = alpha * if tb { v[o * inp + i] } else { v[i * out + o] };
            }
        }
        Some((wt, out, inp))
    }

    /// The bias `[out]` a constant `t` gives (a scalar, `[out]` or `[1, out]`).
    fn bias_of(t: Option<&Tensor>, out: usize) -> Option<Vec<f32>> {
        let t = t?;
        let v = t.as_f32()?;
        match (t.shape.as_slice(), v.len()) {
            (_, 1) => Some(vec![v[0]; out]),
            ([n] | [1, n], _) if *n == out => Some(v.to_vec()),
            _ => None,
        }
    }

    /// The step after `i` that alone reads `y` (not a graph output), if it is `want`.
    pub(super) fn only_reader(
        &self,
        i: usize,
        y: usize,
        want: impl Fn(&Op) -> bool,
    ) -> Option<usize> {
        let readers = self.readers();
        let j = self.find_reader(i + 1, y)?;
        let ok = readers[y] == 1
            && !self.outputs.iter().any(|&(_, o)| o == y)
            && matches!(&self.steps[j].kind, Kind::Op(op) if want(op));
        ok.then_some(j)
    }

    /// Gemm / MatMul (+ Add) (+ Relu) on constant weights -> [`Linear`].
    pub(super) fn linears(&mut self) {
        let mut i = 0;
        while i < self.steps.len() {
            let Some((w, out, inp)) = self.weight_of(&self.steps[i]) else {
                i += 1;
                continue;
            };
            let mut y = self.steps[i].outputs[0];
            let mut gone = Vec::new();
            // Gemm's C (a C that is not a constant of the layer's width keeps the Gemm an op).
            let c = match &self.steps[i].kind {
                Kind::Op(Op::Gemm { .. }) => self.steps[i].inputs.get(2).copied().flatten(),
                _ => None,
            };
            let bias = match c {
                Some(c) => match Self::bias_of(self.consts[c].as_ref(), out) {
                    Some(b) => b,
                    None => {
                        i += 1;
                        continue;
                    }
                },
                // Else the constant of an Add that alone reads the layer (as PyTorch's exporter
                // writes a Linear whose bias it split off, or a MatMul's).
                None => {
                    let add = self.only_reader(i, y, |op| matches!(op, Op::Binary(Binary::Add)));
                    let found = add.and_then(|j| {
                        let s = &self.steps[j];
                        let other = s.inputs.iter().flatten().find(|&&v| v != y).copied();
                        let b = Self::bias_of(other.and_then(|o| self.consts[o].as_ref()), out)?;
                        Some((j, b, s.outputs[0]))
                    });
                    match found {
                        Some((j, b, to)) => {
                            gone.push(j);
                            y = to;
                            b
                        }
                        None => vec![0.0; out],
                    }
                }
            };
            let relu = self.only_reader(i, y, |op| matches!(op, Op::Unary(Unary::Relu)));
            if let Some(j) = relu {
                gone.push(j);
                y = self.steps[j].outputs[0];
            }
            let x = self.steps[i].inputs[0];
            let what = self.steps[i].what.clone();
            let layer = Linear::new(inp, out, w, bias, relu.is_some());
            self.steps[i] = Step {
                kind: Kind::Linear(Box::new(layer)),
                inputs: vec![x],
                outputs: vec![y],
                what,
            };
            gone.sort_unstable();
            for j in gone.into_iter().rev() {
                self.steps.remove(j);
            }
            i += 1;
        }
    }

    /// A `Concat` that reads every output of a `Split` on the same axis, in order, reads the
    /// split's input instead (the parts joined in order are that input); the split is dropped
    /// when nothing else reads its parts. TorchRec's `KeyedTensor` cuts the pooled embeddings
    /// into a part per feature that `DLRM_DCN` joins straight back: 26 copies and a join of
    /// 3.4 MB a batch of 256, 16% of its int8 graph's time on 2 threads.
    pub(super) fn split_concat(&mut self) {
        let producer: HashMap<usize, usize> = self
            .steps
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.outputs.iter().map(move |&o| (o, i)))
            .collect();
        let mut splits = Vec::new();
        for j in 0..self.steps.len() {
            let Kind::Op(Op::Concat { axis: ca }) = self.steps[j].kind else {
                continue;
            };
            let mut inputs = self.steps[j].inputs.clone();
            let mut p = 0;
            while p < inputs.len() {
                let found = inputs[p].and_then(|v| producer.get(&v)).and_then(|&i| {
                    let s = &self.steps[i];
                    let same_axis =
                        matches!(s.kind, Kind::Op(Op::Split { axis, .. }) if axis == ca);
                    let parts: Vec<Option<usize>> = s.outputs.iter().map(|&o| Some(o)).collect();
                    (same_axis && inputs[p..].starts_with(&parts))
                        .then(|| (i, parts.len(), s.inputs[0]))
                });
                if let Some((i, k, Some(x))) = found {
                    inputs.splice(p..p + k, [Some(x)]);
                    splits.push(i);
                }
                p += 1;
            }
            self.steps[j].inputs = inputs;
        }
        // Splits none of whose parts are read any more, from the last.
        let readers = self.readers();
        splits.sort_unstable();
        splits.dedup();
        for i in splits.into_iter().rev() {
            if self.steps[i].outputs.iter().all(|&o| readers[o] == 0) {
                self.steps.remove(i);
            }
        }
    }

    /// Which values each step reads for the last time.
    pub(super) fn lifetimes(&mut self) {
        let mut last = vec![usize::MAX; self.values];
        for (k, s) in self.steps.iter().enumerate() {
            s.inputs.iter().flatten().for_each(|&i| last[i] = k);
        }
        let keep: Vec<usize> = self.outputs.iter().map(|&(_, o)| o).collect();
        self.frees = vec![Vec::new(); self.steps.len()];
        for (v, &k) in last.iter().enumerate() {
            if k != usize::MAX && self.consts[v].is_none() && !keep.contains(&v) {
                self.frees[k].push(v);
            }
        }
    }
}
