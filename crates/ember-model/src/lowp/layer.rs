//! Single layers in bf16 / int8 for a model's graph, which calls its layers one at a time
//! (`crate::graph`): a plain layer, one whose epilogue is the cross net's step, and one whose
//! epilogue adds a value broadcast over rows (a factored layer, its rows possibly filled as
//! they are quantized).

use super::{Exec, LowpScratch, f32_epilogue, quantize_for};
use crate::dense::acts::{self, Quant};
use crate::dense::driver::{self, Epilogue, MatF32};
use crate::dense::{ActsBf16, ActsI8, DenseDType};
use crate::mlp::Linear;

/// One int8 layer on `m` rows of f32 at stride `ldx`, its f32 output written to `out` (`[m,
/// out]`, dense): the rows quantized with their own scales, as [`mlp`]'s int8 layers but the
/// last. (A model's graph calls its layers one at a time, `crate::graph`.)
pub fn linear_int8(
    x: Exec,
    l: &Linear,
    input: &[f32],
    ldx: usize,
    m: usize,
    out: &mut [f32],
    s: &mut LowpScratch,
) {
    assert!(out.len() >= m * l.out_dim());
    let ep = f32_epilogue(l, out.as_mut_ptr());
    let x = Exec {
        dtype: DenseDType::Int8,
        ..x
    };
    run(x, l, Rows::F32(input, ldx), m, &ep, s);
}

/// One layer on `m` rows of f32 at stride `ldx` whose epilogue is the cross net's step, `out =
/// x0 * (W input + b) + xl` (`x0`, `xl` and `out` dense `[m, out]`), in bf16 or int8 as `x`
/// says: a graph's DCN step (`graph/plan.rs`), one pass where the layer, a `Mul` and an `Add`
/// were three.
pub fn linear_cross(
    x: Exec,
    l: &Linear,
    (input, ldx): (&[f32], usize),
    m: usize,
    (x0, xl): (&[f32], &[f32]),
    out: &mut [f32],
    s: &mut LowpScratch,
) {
    let n = l.out_dim();
    assert!(x0.len() >= m * n && xl.len() >= m * n && out.len() >= m * n);
    // The driver only reads the cross matrices.
    let mat = |v: &[f32]| MatF32 {
        ptr: v.as_ptr().cast_mut(),
        ld: n,
    };
    let ep = Epilogue {
        bias: l.bias(),
        group: None,
        relu: false,
        cross: Some((mat(x0), mat(xl))),
        f32_out: Some(MatF32 {
            ptr: out.as_mut_ptr(),
            ld: n,
        }),
        bf16_out: None,
    };
    run(x, l, Rows::F32(input, ldx), m, &ep, s);
}

/// A layer's input rows: f32 in memory (at a stride), or written one at a time by a function
/// (`fill(row, values)`, a factored layer's join: `graph/factor.rs`).
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32], usize),
    Filled(&'a (dyn Fn(usize, &mut [f32]) + Sync)),
}

impl std::fmt::Debug for Rows<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rows::F32(v, ld) => write!(f, "Rows::F32({} values, stride {ld})", v.len()),
            Rows::Filled(_) => f.write_str("Rows::Filled"),
        }
    }
}

/// One layer on `m` input rows, in bf16 or int8 as `x` says; where `group = (g, per)`, its
/// epilogue adds row `r / per` of `g` (`[ceil(m / per), out]`, dense) to output row `r` before
/// the ReLU (`relu`, not the layer's own): a factored layer's rows plus its once-a-sample part
/// (`graph/factor.rs`), one pass where the broadcast `Add` was another. Filled rows are
/// quantized as they are written in int8 (never held in f32 whole), gathered first in bf16.
#[allow(clippy::too_many_arguments)]
pub fn linear_grouped(
    x: Exec,
    l: &Linear,
    input: Rows<'_>,
    m: usize,
    group: Option<(&[f32], usize)>,
    relu: bool,
    out: &mut [f32],
    s: &mut LowpScratch,
) {
    let n = l.out_dim();
    assert!(out.len() >= m * n);
    if let Some((g, per)) = group {
        assert!(per > 0 && g.len() >= m.div_ceil(per) * n);
    }
    let ep = Epilogue {
        bias: l.bias(),
        // The driver only reads the group matrix.
        group: group.map(|(g, per)| {
            let mat = MatF32 {
                ptr: g.as_ptr().cast_mut(),
                ld: n,
            };
            (mat, per)
        }),
        relu,
        cross: None,
        f32_out: Some(MatF32 {
            ptr: out.as_mut_ptr(),
            ld: n,
        }),
        bf16_out: None,
    };
    run(x, l, input, m, &ep, s);
}

/// Layer `l` on `m` input rows through `ep`, in bf16 or int8 as `x` says: int8 rows quantized
/// per row (filled rows as they are written), bf16 rows rounded (filled rows gathered first).
fn run(x: Exec, l: &Linear, input: Rows<'_>, m: usize, ep: &Epilogue<'_>, s: &mut LowpScratch) {
    let (k, kd) = (x.kernels, l.in_dim());
    match (x.dtype, input) {
        (DenseDType::Int8, Rows::F32(input, ldx)) => {
            let a = quantize_for(&k, l, (input, ldx, m), &mut s.q, &mut s.sx);
            s.timed(|s| driver::linear_i8(&k, a, &s.sx, m, l.packed_int8(), ep, x.threads));
        }
        (DenseDType::Int8, Rows::Filled(fill)) => {
            let w = l.packed_int8();
            let quant = Quant {
                unsigned: k.unsigned_i8(),
                smooth: l.int8_inv_smooth(),
            };
            acts::quantize_filled((m, kd), fill, quant, &mut s.q, w.kp(), &mut s.sx);
            let a = ActsI8 {
                ptr: s.q.as_ptr(),
                lda: w.kp(),
            };
            s.timed(|s| driver::linear_i8(&k, a, &s.sx, m, w, ep, x.threads));
        }
        (DenseDType::Bf16, input) => {
            let w = l.packed_bf16();
            let rows: Vec<f32>;
            let (input, ldx) = match input {
                Rows::F32(v, ldx) => (v, ldx),
                Rows::Filled(fill) => {
                    rows = {
                        let mut v = vec![0.0; m * kd];
                        for (r, row) in v.chunks_exact_mut(kd.max(1)).enumerate() {
                            fill(r, row);
                        }
                        v
                    };
                    (&rows[..], kd)
                }
            };
            acts::to_bf16_rows(input, m, kd, ldx, &mut s.b0, w.kp());
            let a = ActsBf16 {
                ptr: s.b0.as_ptr(),
                lda: w.kp(),
            };
            s.timed(|_| driver::linear_bf16(&k, a, m, w, ep, x.threads));
        }
        (DenseDType::F32, _) => unreachable!("f32 layers run on the f32 path"),
    }
}
