//! Running a [`Plan`] on one batch: the inputs checked against the graph's, each step on its
//! inputs' values, each value dropped after its last reader (its buffer given back to the
//! thread's pool, `pool.rs`), and a value that a reshape reads for the last time moved, not
//! copied.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use faer::Par;

use super::Dense;
use super::factor::Factored;
use super::plan::{Kind, Plan, Step};
use super::pool;
use super::tensor::{Data, Tensor};
use super::{GraphError, Result};
use crate::dense::DenseDType;
use crate::lowp::{self, LowpScratch};

/// In int8, layers of at most this many outputs (a head's logits) run in bf16.
const HEAD_OUTPUTS: usize = 16;

/// Layers of at most this many outputs (a dot product a row: an attention score, a logit) run
/// in f32 whatever the dense dtype: bf16's tiles pad one output to 16, and converting the input
/// cost more than the f32 dot products (DIN's `[B * 50, 40] x [40, 1]`, `docs/graph-models.md`).
const DOT_OUTPUTS: usize = 2;

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
        let t0 = std::time::Instant::now();
        let outs = step(plan, &given, s, &plan.frees[k], &mut vals, run).map_err(fail)?;
        if PROFILING.load(Ordering::Relaxed) {
            let mut all = STEPS.lock().unwrap_or_else(|e| e.into_inner());
            let key = plan as *const Plan as usize;
            let i = match all.iter().position(|(p, _)| *p == key) {
                Some(i) => i,
                None => {
                    all.push((key, vec![Default::default(); plan.steps.len()]));
                    all.len() - 1
                }
            };
            all[i].1[k].0 += t0.elapsed();
            all[i].1[k].1 += 1;
        }
        for (o, t) in s.outputs.iter().zip(outs) {
            vals[*o] = Some(t);
        }
        for &f in &plan.frees[k] {
            if let Some(t) = vals[f].take() {
                pool::give_data(t.data);
            }
        }
    }
    let outs = plan
        .outputs
        .iter()
        .map(|(name, id)| {
            vals[*id]
                .clone()
                .or_else(|| given[*id].cloned())
                .or_else(|| plan.consts[*id].clone())
                .ok_or_else(|| GraphError::Run(format!("output {name:?} was not computed")))
        })
        .collect();
    // What is left (the outputs, values no step reads) goes back to the pool, not to the
    // allocator, which would hand it to the OS and fault it in afresh on the next run.
    for v in vals.into_iter().flatten() {
        pool::give_data(v.data);
    }
    outs
}

/// How the linear layers run.
#[derive(Clone, Copy)]
struct Run {
    dense: Dense,
    threads: usize,
    par: Par,
}

/// Each step's time and runs since [`profile_start`].
pub(super) type StepTimes = Vec<(std::time::Duration, u64)>;

/// Whether steps are timed (`ember bench graph --profile`): on every thread, so that a graph
/// run by a predictor's pool is timed too.
static PROFILING: AtomicBool = AtomicBool::new(false);
/// Per plan (by address: plans alive at once differ), each step's time and runs.
static STEPS: Mutex<Vec<(usize, StepTimes)>> = Mutex::new(Vec::new());

/// Starts timing each step of every graph's runs, from zero.
pub(super) fn profile_start() {
    STEPS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    PROFILING.store(true, Ordering::Relaxed);
}

/// Stops timing steps; returns what `plan`'s runs took since [`profile_start`].
pub(super) fn profile_take(plan: &Plan) -> StepTimes {
    PROFILING.store(false, Ordering::Relaxed);
    let mut all = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    let key = plan as *const Plan as usize;
    match all.iter().position(|(p, _)| *p == key) {
        Some(i) => all.swap_remove(i).1,
        None => Vec::new(),
    }
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
        Kind::Linear(l) => Ok(vec![linear(
            l,
            args[0].ok_or("its input is missing")?,
            run,
        )?]),
        Kind::Joined { axis, parts } => Ok(vec![super::join::joined(&args, *axis, parts)?]),
        Kind::Factored(f) => Ok(vec![factored(f, &args, run)?]),
        Kind::GatedSum { axes, keepdims } => {
            let (Some(a), Some(b)) = (args[0], args[1]) else {
                return Err("an input of the gated sum is missing".into());
            };
            let axes = super::ops::axes_of(args.get(2).copied().flatten(), axes)?;
            if let Some(t) = super::compute::gated_sum(a, b, axes.as_deref(), *keepdims) {
                return Ok(vec![t?]);
            }
            let m = super::compute::binary(super::compute::Binary::Mul, a, b)?;
            let r =
                super::compute::reduce(super::compute::Reduce::Sum, &m, axes.as_deref(), *keepdims);
            if let Data::F32(v) = m.data {
                pool::give(v);
            }
            Ok(vec![r?])
        }
        Kind::Cross(l) => {
            let [Some(x), Some(x0), Some(xl)] = args[..] else {
                return Err("an input of the cross step is missing".into());
            };
            Ok(vec![cross(l, x, (x0, xl), run)?])
        }
    }
}

/// Layer `l` on `x` (`[.., in]`): `[.., out]`.
fn linear(l: &crate::mlp::Linear, x: &Tensor, run: Run) -> std::result::Result<Tensor, String> {
    let xv = layer_input(l, x)?;
    let rows = x.len() / l.in_dim().max(1);
    // Every output is written by the layer (its GEMM, GEMV or epilogue): not zeroed first.
    let mut y = pool::scratch(rows * l.out_dim());
    match run.dense.kernels.filter(|_| l.out_dim() > DOT_OUTPUTS) {
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
                lowp::mlp(exec, std::slice::from_ref(l), input, rows, &mut y, s);
            }
        }),
    }
    Tensor::f32(out_shape(l, x), y)
}

/// A factored layer ([`Kind::Factored`], `factor.rs`): the join of its rows' parts through
/// the factored layer, each broadcast value's product added to its rows (in the layer's
/// epilogue on Ember's bf16 / int8 kernels); in int8, each row of the join is quantized as it
/// is computed, never written whole in f32. Where the inputs do not fit, the join and the
/// layer as the graph has them.
fn factored(
    f: &Factored,
    args: &[Option<&Tensor>],
    run: Run,
) -> std::result::Result<Tensor, String> {
    let Some((lead, per)) = f.fits(args) else {
        let x = super::join::joined(args, f.axis, &f.parts)?;
        let y = linear(&f.layer, &x, run);
        give(x);
        return y;
    };
    let (m, n) = (lead.iter().product::<usize>(), f.main.out_dim());
    // The broadcast values' products, summed: a row for each `per` rows.
    let mut group: Option<Vec<f32>> = None;
    for s in f.side.iter().filter(|_| m > 0) {
        let u = args[s.source].ok_or("a broadcast input is missing")?;
        let p = linear(&s.layer, u, run)?;
        let Data::F32(p) = p.data else {
            return Err("a layer gave integers".into());
        };
        match &mut group {
            None => group = Some(p),
            Some(g) => {
                g.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
                pool::give(p);
            }
        }
    }
    let int8 = run
        .dense
        .kernels
        .filter(|_| run.dense.dtype == DenseDType::Int8 && n > HEAD_OUTPUTS && m > 0);
    let y = match int8 {
        Some(kernels) => {
            let fill = super::join::filler(args, &f.rows, f.width)?;
            let mut out = pool::scratch(m * n); // every output written by the epilogue
            LOWP.with_borrow_mut(|s| {
                let exec = lowp::Exec {
                    kernels,
                    dtype: run.dense.dtype,
                    threads: run.threads,
                };
                let g = group.as_deref().map(|g| (g, per));
                let rows = lowp::Rows::Filled(&fill);
                lowp::linear_grouped(exec, &f.main, rows, m, g, f.layer.relu(), &mut out, s);
            });
            Tensor::f32([&lead[..], &[n]].concat(), out)
        }
        None => {
            let x = super::join::joined(args, -1, &f.rows)?;
            let y = match &group {
                Some(g) => grouped(&f.main, &x, (g, per), f.layer.relu(), run),
                None => linear(&f.main, &x, run), // no broadcast part, or no rows
            };
            give(x);
            y
        }
    };
    if let Some(g) = group {
        pool::give(g);
    }
    y
}

/// Layer `l` (no ReLU of its own) on `x`, row `r` of its output plus row `r / per` of `group`,
/// then the ReLU if `relu`.
fn grouped(
    l: &crate::mlp::Linear,
    x: &Tensor,
    (group, per): (&[f32], usize),
    relu: bool,
    run: Run,
) -> std::result::Result<Tensor, String> {
    let xv = layer_input(l, x)?;
    let (rows, n) = (x.len() / l.in_dim().max(1), l.out_dim());
    if group.len() < rows.div_ceil(per) * n {
        return Err(format!(
            "{} broadcast values for {rows} rows of {n} outputs, a row each {per}",
            group.len()
        ));
    }
    let kernels = run
        .dense
        .kernels
        .filter(|_| l.out_dim() > HEAD_OUTPUTS || run.dense.dtype == DenseDType::Bf16);
    let Some(kernels) = kernels else {
        // f32 (and int8's head-sized layers): the layer, then one pass.
        let mut y = linear(l, x, run)?;
        let Data::F32(v) = &mut y.data else {
            return Err("a layer gave integers".into());
        };
        let add = |(r, row): (usize, &mut [f32])| {
            let g = &group[r / per * n..(r / per + 1) * n];
            row.iter_mut().zip(g).for_each(|(v, &g)| {
                *v += g;
                if relu {
                    *v = v.max(0.0);
                }
            });
        };
        if run.threads > 1 && v.len() >= 1 << 15 {
            use rayon::prelude::*;
            v.par_chunks_mut(n).enumerate().for_each(add);
        } else {
            v.chunks_mut(n).enumerate().for_each(add);
        }
        return Ok(y);
    };
    let mut out = pool::scratch(rows * n); // every output written by the layer's epilogue
    LOWP.with_borrow_mut(|s| {
        let exec = lowp::Exec {
            kernels,
            dtype: run.dense.dtype,
            threads: run.threads,
        };
        let input = lowp::Rows::F32(xv, l.in_dim());
        let g = Some((group, per));
        lowp::linear_grouped(exec, l, input, rows, g, relu, &mut out, s);
    });
    Tensor::f32(out_shape(l, x), out)
}

/// `x`'s values, checked as layer `l`'s input.
fn layer_input<'a>(
    l: &crate::mlp::Linear,
    x: &'a Tensor,
) -> std::result::Result<&'a [f32], String> {
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
    Ok(xv)
}

fn out_shape(l: &crate::mlp::Linear, x: &Tensor) -> Vec<usize> {
    let mut shape = x.shape.clone();
    if let Some(d) = shape.last_mut() {
        *d = l.out_dim();
    }
    shape
}

/// The cross step `x0 * (l x) + xl` ([`Kind::Cross`]): where `x0` and `xl` have the layer's
/// output shape, in the layer's epilogue (bf16, and int8 but for a head's few outputs), else
/// in one loop after the layer, each value rounded as the separate `Mul` and `Add` round it;
/// with broadcasting, as the three ops.
fn cross(
    l: &crate::mlp::Linear,
    x: &Tensor,
    (x0, xl): (&Tensor, &Tensor),
    run: Run,
) -> std::result::Result<Tensor, String> {
    let shape = out_shape(l, x);
    let (Some(a), Some(b)) = (x0.as_f32(), xl.as_f32()) else {
        return Err(format!(
            "x0 is {} and xl {}, not float",
            x0.kind(),
            xl.kind()
        ));
    };
    if x0.shape != shape || xl.shape != shape {
        use super::compute::{Binary, binary};
        let y = linear(l, x, run)?;
        let m = binary(Binary::Mul, x0, &y);
        give(y);
        let m = m?;
        let z = binary(Binary::Add, &m, xl);
        give(m);
        return z;
    }
    let xv = layer_input(l, x)?;
    let rows = x.len() / l.in_dim().max(1);
    let low = run
        .dense
        .kernels
        .filter(|_| l.out_dim() > HEAD_OUTPUTS || run.dense.dtype == DenseDType::Bf16);
    let Some(kernels) = low else {
        let y = linear(l, x, run)?;
        let mut v = match y.data {
            Data::F32(v) => v,
            Data::I64(_) => return Err("a layer gave integers".into()),
        };
        let step = |o: &mut [f32], p: &[f32], q: &[f32]| {
            o.iter_mut()
                .zip(p.iter().zip(q))
                .for_each(|(o, (&p, &q))| *o = p * *o + q)
        };
        if v.len() >= 1 << 15 && run.threads > 1 {
            use rayon::prelude::*;
            v.par_chunks_mut(1 << 13)
                .zip(a.par_chunks(1 << 13).zip(b.par_chunks(1 << 13)))
                .for_each(|(o, (p, q))| step(o, p, q));
        } else {
            step(&mut v, a, b);
        }
        return Tensor::f32(shape, v);
    };
    let mut out = pool::scratch(rows * l.out_dim()); // every output written by the epilogue
    LOWP.with_borrow_mut(|s| {
        let exec = lowp::Exec {
            kernels,
            dtype: run.dense.dtype,
            threads: run.threads,
        };
        lowp::linear_cross(exec, l, (xv, l.in_dim()), rows, (a, b), &mut out, s);
    });
    Tensor::f32(shape, out)
}

/// `t`'s buffer back to the thread's pool (a value no later step reads).
fn give(t: Tensor) {
    if let Data::F32(v) = t.data {
        pool::give(v);
    }
}
