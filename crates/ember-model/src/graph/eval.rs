//! Running a [`Plan`] on one batch: the inputs checked against the graph's, each step on its
//! inputs' values, each value dropped after its last reader (its buffer given back to the
//! thread's pool, `pool.rs`), and a value that a reshape reads for the last time moved, not
//! copied.

use faer::Par;

use super::Dense;
use super::plan::{Kind, Plan, Step};
use super::pool;
use super::tensor::{Data, Tensor};
use super::{GraphError, Result};
use crate::dense::DenseDType;
use crate::lowp::{self, LowpScratch};

/// In int8, layers of at most this many outputs (a head's logits) run in bf16.
const HEAD_OUTPUTS: usize = 16;

pub(super) fn run(
    plan: &Plan,
    dense: Dense,
    inputs: &[(&str, &Tensor)],
    threads: usize,
) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Option<Tensor>> = vec![None; plan.values];
    let mut given: Vec<Option<&Tensor>> = vec![None; plan.values];
    for (name, t) in inputs {
        match plan.inputs.iter().find(|(n, _)| n == name) {
            Some((_, id)) => given[*id] = Some(*t),
            None => {
                return Err(GraphError::Run(format!(
                    "{name:?} is not an input of the graph"
                )));
            }
        }
    }
    if let Some((name, _)) = plan.inputs.iter().find(|(_, id)| given[*id].is_none()) {
        return Err(GraphError::Run(format!(
            "the graph's input {name:?} was not given"
        )));
    }
    let par = if threads > 1 {
        Par::rayon(threads)
    } else {
        Par::Seq
    };
    for (k, s) in plan.steps.iter().enumerate() {
        let fail = |e: String| GraphError::Run(format!("{}: {e}", s.what));
        let run = Run {
            dense,
            threads,
            par,
        };
        let outs = step(plan, &given, s, &plan.frees[k], &mut vals, run).map_err(fail)?;
        for (o, t) in s.outputs.iter().zip(outs) {
            vals[*o] = Some(t);
        }
        for &f in &plan.frees[k] {
            if let Some(Tensor {
                data: Data::F32(v), ..
            }) = vals[f].take()
            {
                pool::give(v);
            }
        }
    }
    plan.outputs
        .iter()
        .map(|(name, id)| {
            vals[*id]
                .clone()
                .or_else(|| given[*id].cloned())
                .or_else(|| plan.consts[*id].clone())
                .ok_or_else(|| GraphError::Run(format!("output {name:?} was not computed")))
        })
        .collect()
}

/// How the linear layers run.
#[derive(Clone, Copy)]
struct Run {
    dense: Dense,
    threads: usize,
    par: Par,
}

thread_local! {
    /// The bf16 / int8 layers' activations, reused by the thread's runs (as `pool.rs` keeps the
    /// values' buffers).
    static LOWP: std::cell::RefCell<LowpScratch> = std::cell::RefCell::new(LowpScratch::default());
}

/// One step's outputs.
fn step(
    plan: &Plan,
    given: &[Option<&Tensor>],
    s: &Step,
    frees: &[usize],
    vals: &mut [Option<Tensor>],
    run: Run,
) -> std::result::Result<Vec<Tensor>, String> {
    let get = |i: usize| vals[i].as_ref().or(given[i]).or(plan.consts[i].as_ref());
    let args: Vec<Option<&Tensor>> = s.inputs.iter().map(|i| i.and_then(get)).collect();
    match &s.kind {
        Kind::Op(op) => {
            let Some(shape) = op.view_shape(&args) else {
                return op.eval(&args, s.outputs.len());
            };
            let shape = shape?;
            // A reshape of a value read for the last time takes it as it is.
            let first = s.inputs[0].ok_or("input 0 is missing")?;
            let owned = frees.contains(&first)
                && vals[first].is_some()
                && s.inputs.iter().flatten().filter(|&&i| i == first).count() == 1;
            let t = match owned {
                true => vals[first].take().ok_or("input 0 is missing")?,
                false => args[0].ok_or("input 0 is missing")?.clone(),
            };
            Ok(vec![t.reshaped(shape)?])
        }
        Kind::Linear(l) => {
            let x = args[0].ok_or("its input is missing")?;
            let xv = x
                .as_f32()
                .ok_or_else(|| format!("input is {}, not float", x.kind()))?;
            if x.shape.last() != Some(&l.in_dim()) {
                return Err(format!(
                    "input of shape {:?} for a layer of {} inputs",
                    x.shape,
                    l.in_dim()
                ));
            }
            let rows = x.len() / l.in_dim().max(1);
            let mut y = pool::zeros(rows * l.out_dim());
            match run.dense.kernels {
                None => l.forward(xv, rows, &mut y, run.par),
                Some(kernels) => LOWP.with_borrow_mut(|s| {
                    let exec = lowp::Exec {
                        kernels,
                        dtype: run.dense.dtype,
                        threads: run.threads,
                    };
                    // int8 but for a head's few outputs, which run in bf16 as the DLRM
                    // path's last layer does (their error goes straight to the score).
                    if run.dense.dtype == DenseDType::Int8 && l.out_dim() > HEAD_OUTPUTS {
                        lowp::linear_int8(exec, l, xv, l.in_dim(), rows, &mut y, s);
                    } else {
                        let input = lowp::Input::F32(xv, l.in_dim());
                        lowp::mlp(exec, std::slice::from_ref(&**l), input, rows, &mut y, s);
                    }
                }),
            }
            let mut shape = x.shape.clone();
            *shape.last_mut().unwrap() = l.out_dim();
            Ok(vec![Tensor::f32(shape, y)?])
        }
    }
}
