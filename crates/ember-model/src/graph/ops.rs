//! The ONNX operators Ember's graphs run, each read from its node (attributes checked at load)
//! and evaluated on [`Tensor`]s by its definition in the ONNX operator spec (opset 13 and later;
//! the older attribute forms of axes, splits and clip bounds are read too). The linear layers
//! (`Gemm`, `MatMul` + `Add` with constant weights) are not run here but by Ember's dense kernels
//! (`plan.rs`); the `Gemm` and `MatMul` here are the general ones, for what is left.

use super::compute::*;
pub use super::compute::{Binary, Reduce, Unary};
use super::layout::*;
use super::logic;
pub use super::logic::{Cmp, Logic};
use super::onnx::{Attrs, NodeProto};
use super::tensor::ints;
use super::tensor::{Tensor, axis};

/// One op with its attributes.
#[derive(Debug, Clone)]
pub enum Op {
    Unary(Unary),
    Binary(Binary),
    Clip {
        min: Option<f32>,
        max: Option<f32>,
    },
    Gemm {
        alpha: f32,
        beta: f32,
        ta: bool,
        tb: bool,
    },
    MatMul,
    Concat {
        axis: i64,
    },
    Split {
        axis: i64,
        split: Option<Vec<i64>>,
    },
    Slice,
    Reshape {
        allowzero: bool,
    },
    Flatten {
        axis: i64,
    },
    Unsqueeze {
        axes: Option<Vec<i64>>,
    },
    Squeeze {
        axes: Option<Vec<i64>>,
    },
    Transpose {
        perm: Option<Vec<i64>>,
    },
    Gather {
        axis: i64,
    },
    Reduce {
        kind: Reduce,
        axes: Option<Vec<i64>>,
        keepdims: bool,
        noop: bool,
    },
    Softmax {
        axis: i64,
    },
    Shape {
        start: i64,
        end: Option<i64>,
    },
    Constant(Tensor),
    Cast {
        to: CastTo,
    },
    Expand,
    Compare(Cmp),
    Logic(Logic),
    Not,
    Where,
}

/// What a `Cast` gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CastTo {
    Float,
    Int64,
    /// int64 0 or 1 (`logic.rs`)
    Bool,
}

/// The op types this build runs, for the error that names one it does not.
pub const SUPPORTED: &str = "Abs, Add, And, Cast, Clip, Concat, Constant, Div, Equal, Exp, \
     Expand, Flatten, Gather, Gemm, Greater, GreaterOrEqual, Identity, Less, LessOrEqual, Log, \
     MatMul, Mul, Neg, Not, Or, Pow, ReduceL2, ReduceMax, ReduceMean, ReduceSum, Relu, Reshape, \
     Shape, Sigmoid, Slice, Softmax, Split, Sqrt, Squeeze, Sub, Tanh, Transpose, Unsqueeze, Where, \
     Xor";

impl Op {
    /// The node's op, its attributes checked; `Err` names what is not supported.
    pub fn parse(node: &NodeProto, what: &str) -> Result<Op, String> {
        let a = Attrs {
            node: what,
            list: &node.attribute,
        };
        let e = |e: super::GraphError| e.to_string();
        let known = known_attrs(&node.op_type);
        if let Some(n) = a.unknown(known) {
            return Err(format!(
                "{what} ({}): attribute {n:?} is not supported",
                node.op_type
            ));
        }
        let int = |n: &str, d: i64| a.int(n).map(|v| v.unwrap_or(d)).map_err(e);
        let reduce = |kind| {
            Ok(Op::Reduce {
                kind,
                axes: a.ints("axes").map_err(e)?,
                keepdims: int("keepdims", 1)? != 0,
                noop: int("noop_with_empty_axes", 0)? != 0,
            })
        };
        if let Some(op) = elementwise(&node.op_type) {
            return Ok(op);
        }
        match node.op_type.as_str() {
            "Clip" => Ok(Op::Clip {
                min: a.float("min").map_err(e)?,
                max: a.float("max").map_err(e)?,
            }),
            "Gemm" => Ok(Op::Gemm {
                alpha: a.float("alpha").map_err(e)?.unwrap_or(1.0),
                beta: a.float("beta").map_err(e)?.unwrap_or(1.0),
                ta: int("transA", 0)? != 0,
                tb: int("transB", 0)? != 0,
            }),
            "MatMul" => Ok(Op::MatMul),
            "Concat" => Ok(Op::Concat {
                axis: a
                    .int("axis")
                    .map_err(e)?
                    .ok_or_else(|| format!("{what} (Concat): no axis"))?,
            }),
            "Split" => Ok(Op::Split {
                axis: int("axis", 0)?,
                split: a.ints("split").map_err(e)?,
            }),
            "Slice" => Ok(Op::Slice),
            "Reshape" => Ok(Op::Reshape {
                allowzero: int("allowzero", 0)? != 0,
            }),
            "Flatten" => Ok(Op::Flatten {
                axis: int("axis", 1)?,
            }),
            "Unsqueeze" => Ok(Op::Unsqueeze {
                axes: a.ints("axes").map_err(e)?,
            }),
            "Squeeze" => Ok(Op::Squeeze {
                axes: a.ints("axes").map_err(e)?,
            }),
            "Transpose" => Ok(Op::Transpose {
                perm: a.ints("perm").map_err(e)?,
            }),
            "Gather" => Ok(Op::Gather {
                axis: int("axis", 0)?,
            }),
            "ReduceSum" => reduce(Reduce::Sum),
            "ReduceMean" => reduce(Reduce::Mean),
            "ReduceMax" => reduce(Reduce::Max),
            "ReduceL2" => reduce(Reduce::L2),
            "Softmax" => Ok(Op::Softmax {
                axis: int("axis", -1)?,
            }),
            "Shape" => Ok(Op::Shape {
                start: int("start", 0)?,
                end: a.int("end").map_err(e)?,
            }),
            "Constant" => constant(&a).map(Op::Constant),
            "Cast" => match int("to", 0)? {
                1 => Ok(Op::Cast { to: CastTo::Float }),
                7 => Ok(Op::Cast { to: CastTo::Int64 }),
                9 => Ok(Op::Cast { to: CastTo::Bool }),
                t => Err(format!(
                    "{what} (Cast): to {} is not supported (float, int64 and bool are)",
                    super::onnx::type_name(t as i32)
                )),
            },
            "Expand" => Ok(Op::Expand),
            other => Err(format!(
                "{what}: op {other:?} is not supported (this build runs: {SUPPORTED})"
            )),
        }
    }

    /// How many inputs the op takes at least and at most.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Unary(_) | Op::Flatten { .. } | Op::Softmax { .. } | Op::Shape { .. } => (1, 1),
            Op::Cast { .. } | Op::Transpose { .. } | Op::Not => (1, 1),
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } | Op::Expand => (2, 2),
            Op::Compare(_) | Op::Logic(_) => (2, 2),
            Op::Where => (3, 3),
            Op::Reshape { .. } => (2, 2),
            Op::Clip { .. } => (1, 3),
            Op::Gemm { .. } => (2, 3),
            Op::Concat { .. } => (1, usize::MAX),
            Op::Split { .. } | Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Reduce { .. } => {
                (1, 2)
            }
            Op::Slice => (3, 5),
            Op::Constant(_) => (0, 0),
        }
    }

    /// The output shape of an op that only reshapes its first input (Reshape, Flatten,
    /// Unsqueeze, Squeeze, Identity), so that the runner can move a value it no longer needs
    /// rather than copy it; `None` for other ops.
    pub fn view_shape(&self, x: &[Option<&Tensor>]) -> Option<Result<Vec<usize>, String>> {
        let t = x.first().copied().flatten()?;
        let r = t.shape.len();
        let shape = match self {
            Op::Unary(Unary::Identity) => Ok(t.shape.clone()),
            Op::Reshape { allowzero } => match x.get(1).copied().flatten() {
                Some(w) => ints(w).and_then(|w| reshape_shape(&t.shape, w, *allowzero)),
                None => Err("Reshape needs a shape".into()),
            },
            Op::Flatten { axis: ax } => {
                let a = if *ax == r as i64 { Ok(r) } else { axis(*ax, r) };
                a.map(|a| {
                    let lead: usize = t.shape[..a].iter().product();
                    vec![lead, t.shape[a..].iter().product()]
                })
            }
            Op::Unsqueeze { axes } => (|| {
                let axes =
                    axes_of(x.get(1).copied().flatten(), axes)?.ok_or("Unsqueeze needs axes")?;
                let rank = r + axes.len();
                let mut at: Vec<usize> = axes
                    .iter()
                    .map(|&a| axis(a, rank))
                    .collect::<Result<_, _>>()?;
                at.sort_unstable();
                let mut shape = t.shape.clone();
                for a in at {
                    shape.insert(a, 1);
                }
                Ok(shape)
            })(),
            Op::Squeeze { axes } => (|| {
                let drop: Vec<usize> = match axes_of(x.get(1).copied().flatten(), axes)? {
                    Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?,
                    None => (0..r).filter(|&i| t.shape[i] == 1).collect(),
                };
                if drop.iter().any(|&a| t.shape[a] != 1) {
                    return Err(format!(
                        "Squeeze of a dim that is not 1 (shape {:?})",
                        t.shape
                    ));
                }
                Ok((0..r)
                    .filter(|i| !drop.contains(i))
                    .map(|i| t.shape[i])
                    .collect())
            })(),
            _ => return None,
        };
        Some(shape)
    }

    /// The op on its inputs (`None` for an omitted optional one): its outputs (`outs` of them).
    pub fn eval(&self, x: &[Option<&Tensor>], outs: usize) -> Result<Vec<Tensor>, String> {
        let req = |i: usize| {
            x.get(i)
                .copied()
                .flatten()
                .ok_or(format!("input {i} is missing"))
        };
        let one = |t: Result<Tensor, String>| t.map(|t| vec![t]);
        match self {
            Op::Unary(u) => one(unary(*u, req(0)?)),
            Op::Binary(b) => one(binary(*b, req(0)?, req(1)?)),
            Op::Clip { min, max } => one(clip(x, *min, *max)),
            Op::Gemm {
                alpha,
                beta,
                ta,
                tb,
            } => one(gemm(
                req(0)?,
                req(1)?,
                x.get(2).copied().flatten(),
                *alpha,
                *beta,
                *ta,
                *tb,
            )),
            Op::MatMul => one(matmul(req(0)?, req(1)?)),
            Op::Concat { axis } => {
                let ts: Vec<&Tensor> = x
                    .iter()
                    .map(|t| t.ok_or("an input is missing"))
                    .collect::<Result<_, _>>()?;
                one(concat(&ts, *axis))
            }
            Op::Split { axis: ax, split } => {
                split_into(req(0)?, x.get(1).copied().flatten(), split, *ax, outs)
            }
            Op::Slice => one(slice(
                req(0)?,
                req(1)?,
                req(2)?,
                x.get(3).copied().flatten(),
                x.get(4).copied().flatten(),
            )),
            Op::Reshape { .. } | Op::Flatten { .. } | Op::Unsqueeze { .. } | Op::Squeeze { .. } => {
                let shape = self
                    .view_shape(x)
                    .unwrap_or_else(|| Err("not a view".into()))?;
                one(req(0)?.clone().reshaped(shape))
            }
            Op::Transpose { perm } => one(transpose(req(0)?, perm.as_deref())),
            Op::Gather { axis: ax } => one(gather(req(0)?, req(1)?, *ax)),
            Op::Reduce {
                kind,
                axes,
                keepdims,
                noop,
            } => {
                let t = req(0)?;
                let axes = axes_of(x.get(1).copied().flatten(), axes)?;
                if axes.as_ref().is_none_or(|a| a.is_empty()) && *noop {
                    return one(Ok(t.clone()));
                }
                one(reduce(*kind, t, axes.as_deref(), *keepdims))
            }
            Op::Softmax { axis: ax } => one(softmax(req(0)?, *ax)),
            Op::Shape { start, end } => one(shape_of(req(0)?, *start, *end)),
            Op::Constant(t) => Ok(vec![t.clone()]),
            Op::Cast { to: CastTo::Bool } => one(logic::to_bool(req(0)?)),
            Op::Cast { to } => one(cast(req(0)?, *to == CastTo::Float)),
            Op::Expand => one(expand(req(0)?, req(1)?)),
            Op::Compare(c) => one(logic::compare(*c, req(0)?, req(1)?)),
            Op::Logic(l) => one(logic::logic(*l, req(0)?, req(1)?)),
            Op::Not => one(logic::not(req(0)?)),
            Op::Where => one(logic::select(req(0)?, req(1)?, req(2)?)),
        }
    }
}

/// The elementwise ops without attributes.
fn elementwise(op_type: &str) -> Option<Op> {
    Some(match op_type {
        "Relu" => Op::Unary(Unary::Relu),
        "Sigmoid" => Op::Unary(Unary::Sigmoid),
        "Tanh" => Op::Unary(Unary::Tanh),
        "Exp" => Op::Unary(Unary::Exp),
        "Log" => Op::Unary(Unary::Log),
        "Neg" => Op::Unary(Unary::Neg),
        "Sqrt" => Op::Unary(Unary::Sqrt),
        "Abs" => Op::Unary(Unary::Abs),
        "Identity" => Op::Unary(Unary::Identity),
        "Add" => Op::Binary(Binary::Add),
        "Sub" => Op::Binary(Binary::Sub),
        "Mul" => Op::Binary(Binary::Mul),
        "Div" => Op::Binary(Binary::Div),
        "Pow" => Op::Binary(Binary::Pow),
        "Less" => Op::Compare(Cmp::Less),
        "LessOrEqual" => Op::Compare(Cmp::LessOrEqual),
        "Greater" => Op::Compare(Cmp::Greater),
        "GreaterOrEqual" => Op::Compare(Cmp::GreaterOrEqual),
        "Equal" => Op::Compare(Cmp::Equal),
        "And" => Op::Logic(Logic::And),
        "Or" => Op::Logic(Logic::Or),
        "Xor" => Op::Logic(Logic::Xor),
        "Not" => Op::Not,
        "Where" => Op::Where,
        _ => return None,
    })
}

/// The attributes each op's node may carry (any other is refused at load).
fn known_attrs(op_type: &str) -> &'static [&'static str] {
    match op_type {
        "Gemm" => &["alpha", "beta", "transA", "transB"],
        "Concat" | "Gather" | "Flatten" | "Softmax" => &["axis"],
        "Split" => &["axis", "split", "num_outputs"],
        "Reshape" => &["allowzero"],
        "Unsqueeze" | "Squeeze" => &["axes"],
        "Transpose" => &["perm"],
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceL2" => {
            &["axes", "keepdims", "noop_with_empty_axes"]
        }
        "Shape" => &["start", "end"],
        "Constant" => &[
            "value",
            "value_float",
            "value_floats",
            "value_int",
            "value_ints",
        ],
        "Cast" => &["to", "saturate"],
        "Clip" => &["min", "max"],
        _ => &[],
    }
}

fn constant(a: &Attrs<'_>) -> Result<Tensor, String> {
    let e = |e: super::GraphError| e.to_string();
    if let Some(t) = a.tensor("value").map_err(e)? {
        return Ok(t);
    }
    if let Some(f) = a.float("value_float").map_err(e)? {
        return Tensor::f32(vec![], vec![f]);
    }
    if let Some(i) = a.int("value_int").map_err(e)? {
        return Tensor::i64(vec![], vec![i]);
    }
    if let Some(v) = a.ints("value_ints").map_err(e)? {
        return Tensor::i64(vec![v.len()], v);
    }
    let floats = a.list.iter().find(|x| x.name == "value_floats");
    if let Some(f) = floats {
        return Tensor::f32(vec![f.floats.len()], f.floats.clone());
    }
    Err(format!("{} (Constant): no value", a.node))
}

/// Axes from the input (opset 13+) or the attribute (older opsets).
pub(super) fn axes_of(
    input: Option<&Tensor>,
    attr: &Option<Vec<i64>>,
) -> Result<Option<Vec<i64>>, String> {
    match input {
        Some(t) => Ok(Some(ints(t)?.to_vec())),
        None => Ok(attr.clone()),
    }
}
