//! The rewrites of a folded plan, each a pattern of steps made one step that writes less:
//! a cross net's step, a gated sum, a join of elementwise ops, a layer over a join factored;
//! then each value's last reader ([`Plan::lifetimes`]).

use super::compute::Binary;
use super::factor::Factored;
use super::join::Part;
use super::ops::Op;
use super::plan::{Kind, Plan, Step};

impl Plan {
    /// The rewrites after folding, then each value's last reader.
    pub(super) fn fuse(&mut self) {
        self.linears();
        self.split_concat();
        self.crosses();
        self.gated_sums();
        self.joined_ops();
        self.factored();
        self.lifetimes();
    }

    /// A linear layer without ReLU whose output `y` is read only by `Mul(x0, y)`, itself read
    /// only by `Add(_, xl)` (either operand order), becomes one [`Kind::Cross`] step: TorchRec's
    /// `LowRankCrossNet` (`x0 * (W V x + b) + x`), whose two elementwise passes took 22% of
    /// `dcn_mlperf`'s int8 graph at batch 256 on 2 threads.
    fn crosses(&mut self) {
        let mut i = 0;
        while i < self.steps.len() {
            let fused = match &self.steps[i].kind {
                Kind::Linear(l) if !l.relu() => self.cross_of(i),
                _ => None,
            };
            if let Some((mul, add, x0, xl)) = fused {
                let outputs = self.steps[add].outputs.clone();
                let s = &mut self.steps[i];
                if let Kind::Linear(l) = std::mem::replace(&mut s.kind, Kind::Op(Op::MatMul)) {
                    s.kind = Kind::Cross(l);
                }
                s.inputs = vec![s.inputs[0], Some(x0), Some(xl)];
                s.outputs = outputs;
                // Both readers come after the layer; the later first.
                for j in [mul.max(add), mul.min(add)] {
                    self.steps.remove(j);
                }
            }
            i += 1;
        }
    }

    /// For the linear step `i`: its `Mul` and `Add` readers and the values `x0` and `xl`, when
    /// they make a cross step.
    fn cross_of(&self, i: usize) -> Option<(usize, usize, usize, usize)> {
        let y = self.steps[i].outputs[0];
        let other = |s: &Step, v: usize| -> Option<usize> {
            match s.inputs[..] {
                [Some(a), Some(b)] if a == v && b != v => Some(b),
                [Some(a), Some(b)] if b == v && a != v => Some(a),
                _ => None,
            }
        };
        let mul = self.only_reader(i, y, |op| matches!(op, Op::Binary(Binary::Mul)))?;
        let x0 = other(&self.steps[mul], y)?;
        let m = self.steps[mul].outputs[0];
        let add = self.only_reader(mul, m, |op| matches!(op, Op::Binary(Binary::Add)))?;
        let xl = other(&self.steps[add], m)?;
        // The fused step runs where the layer did: `x0` and `xl` must be known by then.
        let later = |v: usize| self.steps[i..].iter().any(|s| s.outputs.contains(&v));
        (!later(x0) && !later(xl)).then_some((mul, add, x0, xl))
    }

    /// A `Mul` whose product is read only by a `ReduceSum` (its data, not its axes) becomes one
    /// [`Kind::GatedSum`] step, which sums the products without writing them where the shapes
    /// are a gate `[B, E, 1]` and experts `[B, E, D]` summed over `E` (MMoE's; the product was
    /// `B * E * D` values written and read back, three times in `mmoe_large`).
    fn gated_sums(&mut self) {
        let mut i = 0;
        while i < self.steps.len() {
            let is_mul = matches!(self.steps[i].kind, Kind::Op(Op::Binary(Binary::Mul)));
            let m = self.steps[i].outputs[0];
            let sum = |op: &Op| {
                matches!(
                    op,
                    Op::Reduce {
                        kind: super::ops::Reduce::Sum,
                        noop: false,
                        ..
                    }
                )
            };
            let found = is_mul
                .then(|| self.only_reader(i, m, sum))
                .flatten()
                .filter(|&j| self.steps[j].inputs.first() == Some(&Some(m)));
            if let Some(j) = found {
                let axes_in = self.steps[j].inputs.get(1).copied().flatten();
                let later = |v: usize| self.steps[i..].iter().any(|s| s.outputs.contains(&v));
                if let (Kind::Op(Op::Reduce { axes, keepdims, .. }), false) =
                    (&self.steps[j].kind, axes_in.is_some_and(later))
                {
                    let kind = Kind::GatedSum {
                        axes: axes.clone(),
                        keepdims: *keepdims,
                    };
                    let outputs = self.steps[j].outputs.clone();
                    let s = &mut self.steps[i];
                    s.kind = kind;
                    s.inputs.push(axes_in);
                    s.outputs = outputs;
                    self.steps.remove(j);
                }
            }
            i += 1;
        }
    }

    /// A `Concat` of values some of which are `Add` / `Sub` / `Mul` / `Div` results that only it
    /// reads -> one [`Kind::Joined`] step, the ops' steps dropped: each result is computed into
    /// its slot of the join, never written apart. (DIN's activation unit joins `[q, k, q * k,
    /// q - k]`, `[B, L, 4 D]`: the product and the difference were written and read again.)
    fn joined_ops(&mut self) {
        let mut c = 0;
        while c < self.steps.len() {
            let Kind::Op(Op::Concat { axis }) = self.steps[c].kind else {
                c += 1;
                continue;
            };
            let Some(vs) = self.steps[c]
                .inputs
                .iter()
                .copied()
                .collect::<Option<Vec<_>>>()
            else {
                c += 1;
                continue;
            };
            let readers = self.readers();
            let (mut inputs, mut parts, mut gone) = (Vec::new(), Vec::new(), Vec::new());
            let at = |v: usize, inputs: &mut Vec<Option<usize>>| {
                inputs.push(Some(v));
                inputs.len() - 1
            };
            for v in vs {
                let producer = (0..c).find(|&p| self.steps[p].outputs.contains(&v));
                let fused = producer.filter(|_| readers[v] == 1).and_then(|p| {
                    let s = &self.steps[p];
                    match (&s.kind, &s.inputs[..]) {
                        (Kind::Op(Op::Binary(b)), [Some(x), Some(y)]) if *b != Binary::Pow => {
                            Some((p, *b, *x, *y))
                        }
                        _ => None,
                    }
                });
                match fused {
                    Some((p, b, x, y)) => {
                        let (i, j) = (at(x, &mut inputs), at(y, &mut inputs));
                        parts.push(Part::Op(b, i, j));
                        gone.push(p);
                    }
                    None => parts.push(Part::Copy(at(v, &mut inputs))),
                }
            }
            if gone.is_empty() {
                c += 1;
                continue;
            }
            let s = &mut self.steps[c];
            s.kind = Kind::Joined { axis, parts };
            s.inputs = inputs;
            gone.sort_unstable();
            for &p in gone.iter().rev() {
                self.steps.remove(p);
            }
            c = c + 1 - gone.len(); // the join moved back by the steps dropped before it
        }
    }

    /// A linear layer whose input is a join (`Concat` or [`Kind::Joined`]) that only it reads
    /// becomes one [`Kind::Factored`] step where factoring shrinks the layer's input
    /// (`factor.rs`): the join's step is dropped, the values before each `Expand` among its
    /// parts added to the step's inputs.
    fn factored(&mut self) {
        let readers = self.readers();
        let mut l = 0;
        while l < self.steps.len() {
            let Kind::Linear(_) = self.steps[l].kind else {
                l += 1;
                continue;
            };
            let Some(x) = self.steps[l].inputs[0] else {
                l += 1;
                continue;
            };
            let join = (0..l).find(|&j| self.steps[j].outputs.contains(&x));
            let alone = readers[x] == 1 && !self.outputs.iter().any(|&(_, o)| o == x);
            let found = join.filter(|_| alone).and_then(|j| {
                let s = &self.steps[j];
                match &s.kind {
                    Kind::Joined { axis, parts } => Some((j, *axis, parts.clone())),
                    Kind::Op(Op::Concat { axis }) if s.inputs.iter().all(Option::is_some) => {
                        Some((j, *axis, (0..s.inputs.len()).map(Part::Copy).collect()))
                    }
                    _ => None,
                }
            });
            let Some((j, axis, parts)) = found else {
                l += 1;
                continue;
            };
            // The join's inputs, then the value before each `Expand` among them.
            let mut inputs = self.steps[j].inputs.clone();
            let mut sources = vec![None; inputs.len()];
            for (i, v) in self.steps[j].inputs.iter().enumerate() {
                let from = v.and_then(|v| (0..j).find(|&p| self.steps[p].outputs.contains(&v)));
                if let Some(p) = from
                    && let (Kind::Op(Op::Expand), Some(u)) =
                        (&self.steps[p].kind, self.steps[p].inputs[0])
                {
                    inputs.push(Some(u));
                    sources[i] = Some(inputs.len() - 1);
                }
            }
            let Kind::Linear(layer) =
                std::mem::replace(&mut self.steps[l].kind, Kind::Op(Op::MatMul))
            else {
                unreachable!("matched above")
            };
            let join_inputs = self.steps[j].inputs.clone();
            let value = |i: usize| {
                let v = join_inputs[i];
                join_inputs.iter().position(|&w| w == v).unwrap_or(i)
            };
            let expanded = |i: usize| sources.get(i).copied().flatten();
            match Factored::new(layer, axis, parts, value, expanded) {
                Ok(f) => {
                    let s = &mut self.steps[l];
                    s.kind = Kind::Factored(Box::new(f));
                    s.inputs = inputs;
                    self.steps.remove(j);
                }
                Err(layer) => {
                    self.steps[l].kind = Kind::Linear(layer);
                    l += 1;
                }
            }
        }
    }
}
