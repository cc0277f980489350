//! A model's MLPs and cross net in bf16 or int8: activations stay in the kernels' input form
//! between layers (bf16 rows written by the previous layer's epilogue; int8 rows quantized from
//! the f32 outputs, since a row's scale needs its whole row), f32 where the model needs it (the
//! bottom MLP's output for the interaction, the cross net's running `x_l`, the logits).

use crate::dense::acts::{self, Quant, RowsF32};
use crate::dense::driver::{self, Epilogue, Kernels, MatBf16, MatF32};
use crate::dense::{ActsBf16, ActsI8, DenseDType, TILE};
use crate::interaction::CrossLayer;
use crate::mlp::Linear;

mod layer;
pub use layer::{Rows, linear_cross, linear_grouped, linear_int8};

/// Buffers reused across calls.
#[derive(Debug, Default)]
pub struct LowpScratch {
    /// bf16 activations: the current layer's input and the next one's.
    b0: Vec<u16>,
    b1: Vec<u16>,
    /// int8 activations and their rows' scales.
    q: Vec<u8>,
    sx: Vec<f32>,
    /// f32 outputs of int8 layers.
    f: Vec<f32>,
    /// The cross net's low-rank projection (bf16).
    low: Vec<u16>,
    /// Per-layer wall times summed over forward passes, when timing is on
    /// ([`LowpScratch::time_layers`]).
    clock: Option<PerLayer<std::time::Duration>>,
    /// The largest |input| per column of each layer, when calibrating (bf16 runs only;
    /// [`LowpScratch::calibrate`]).
    calib: Option<PerLayer<Vec<f32>>>,
}

/// One value per layer call of a forward pass, in the order the layers run.
#[derive(Debug, Default, Clone)]
pub struct PerLayer<T> {
    pub values: Vec<T>,
    next: usize,
}

impl<T: Default> PerLayer<T> {
    /// The next layer's value (made on first use).
    fn next_slot(&mut self) -> &mut T {
        if self.values.len() <= self.next {
            self.values.resize_with(self.next + 1, T::default);
        }
        self.next += 1;
        &mut self.values[self.next - 1]
    }
}

impl LowpScratch {
    /// Starts timing every layer call (a clock read before and after each).
    pub fn time_layers(&mut self) {
        self.clock.get_or_insert_with(Default::default);
    }

    /// The layer times so far (`None` when timing is off).
    pub fn clock(&self) -> Option<&[std::time::Duration]> {
        self.clock.as_ref().map(|c| c.values.as_slice())
    }

    /// Marks the start of a forward pass: the per-layer values restart at the first layer.
    pub fn rewind(&mut self) {
        if let Some(c) = &mut self.clock {
            c.next = 0;
        }
        if let Some(c) = &mut self.calib {
            c.next = 0;
        }
    }

    /// Starts recording each bf16 layer's largest |input| per column (int8's calibration).
    pub fn calibrate(&mut self) {
        self.calib.get_or_insert_with(Default::default);
    }

    /// The recorded maxima, one vector per layer in call order.
    pub fn calibration(&self) -> Option<&[Vec<f32>]> {
        self.calib.as_ref().map(|c| c.values.as_slice())
    }

    /// Records the largest |value| per column of `m` bf16 rows of `k` values at stride `ld`
    /// (in `b0` or `low`) as the next layer's input.
    fn capture(&mut self, which: Buf, m: usize, k: usize, ld: usize) {
        let Some(calib) = &mut self.calib else {
            return;
        };
        let mx = calib.next_slot();
        mx.resize(k, 0.0);
        let buf = match which {
            Buf::B0 => &self.b0,
            Buf::Low => &self.low,
        };
        for r in 0..m {
            for (o, &b) in mx.iter_mut().zip(&buf[r * ld..r * ld + k]) {
                *o = o.max(crate::dense::from_bf16(b).abs());
            }
        }
    }

    /// Runs `f` (one layer), adding its time to the next slot when timing.
    fn timed<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        if self.clock.is_none() {
            return f(self);
        }
        let t = std::time::Instant::now();
        let r = f(self);
        *self.clock.as_mut().expect("checked").next_slot() += t.elapsed();
        r
    }
}

/// A bf16 activation buffer of the scratch.
#[derive(Debug, Clone, Copy)]
enum Buf {
    B0,
    Low,
}

/// Where an MLP's input is.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// `m` rows of f32 at a stride.
    F32(&'a [f32], usize),
    /// Already in the scratch's bf16 buffer `b0`, at the first layer's padded width (left there
    /// by [`cross`]).
    Bf16Ready,
}

/// How reduced-precision layers run: on `kernels`, in `dtype` (bf16 or int8), on `threads`.
#[derive(Debug, Clone, Copy)]
pub struct Exec {
    pub kernels: Kernels,
    pub dtype: DenseDType,
    pub threads: usize,
}

/// Runs `layers` on `m` rows as `x` says and writes the last layer's f32 output (`[m, out]`,
/// dense) to `out`.
pub fn mlp(
    x: Exec,
    layers: &[Linear],
    input: Input<'_>,
    m: usize,
    out: &mut [f32],
    s: &mut LowpScratch,
) {
    if layers.is_empty() {
        return;
    }
    let (k, threads) = (&x.kernels, x.threads);
    match x.dtype {
        DenseDType::Bf16 => mlp_bf16(k, layers, input, m, out, s, threads),
        DenseDType::Int8 => mlp_int8(k, layers, input, m, out, s, threads),
        DenseDType::F32 => unreachable!("f32 layers run on the f32 path"),
    }
}

/// [`mlp`] in bf16: each layer's epilogue writes the next layer's bf16 input, the last one
/// f32 to `out`. `layers` is not empty.
fn mlp_bf16(
    k: &Kernels,
    layers: &[Linear],
    input: Input<'_>,
    m: usize,
    out: &mut [f32],
    s: &mut LowpScratch,
    threads: usize,
) {
    let first = &layers[0];
    let kp0 = first.packed_bf16().kp();
    if let Input::F32(x, ldx) = input {
        acts::to_bf16_rows(x, m, first.in_dim(), ldx, &mut s.b0, kp0);
    }
    for (i, l) in layers.iter().enumerate() {
        let w = l.packed_bf16();
        s.capture(Buf::B0, m, l.in_dim(), w.kp());
        let a = ActsBf16 {
            ptr: s.b0.as_ptr(),
            lda: w.kp(),
        };
        let mut ep = Epilogue {
            bias: l.bias(),
            group: None,
            relu: l.relu(),
            cross: None,
            f32_out: None,
            bf16_out: None,
        };
        let next = layers.get(i + 1);
        if let Some(nl) = next {
            let ld = nl.packed_bf16().kp();
            s.b1.resize(m.next_multiple_of(TILE) * ld, 0);
            ep.bf16_out = Some(MatBf16 {
                ptr: s.b1.as_mut_ptr(),
                ld,
            });
            s.timed(|_| driver::linear_bf16(k, a, m, w, &ep, threads));
            acts::zero_pad_bf16(&mut s.b1, m, l.out_dim(), ld);
            std::mem::swap(&mut s.b0, &mut s.b1);
        } else {
            ep.f32_out = Some(MatF32 {
                ptr: out.as_mut_ptr(),
                ld: l.out_dim(),
            });
            assert!(out.len() >= m * l.out_dim());
            s.timed(|_| driver::linear_bf16(k, a, m, w, &ep, threads));
        }
    }
}

/// [`mlp`] in int8: every layer but the last quantizes the previous f32 output; the last runs
/// in bf16 and writes f32 to `out`. `layers` is not empty.
fn mlp_int8(
    k: &Kernels,
    layers: &[Linear],
    input: Input<'_>,
    m: usize,
    out: &mut [f32],
    s: &mut LowpScratch,
    threads: usize,
) {
    let (x, ldx) = match input {
        Input::F32(x, ldx) => (x, ldx),
        Input::Bf16Ready => unreachable!("int8 layers start from f32"),
    };
    let last = layers.len() - 1;
    // Every layer but the last in int8; the last (the logit, or the bottom MLP's output that
    // the interaction multiplies) in bf16, from the f32 outputs before it: its error goes
    // straight to the score, and it is a small share of the work. Measured on DLRM-v2 (`bench
    // model --accuracy 50000`): with the top MLP's last layer in int8 too, int8 kept 99.83% of
    // f32's AUC; see docs/dense-precision.md.
    for (i, l) in layers.iter().enumerate() {
        let n = l.out_dim();
        // The input: `x`, or the previous layer's f32 output.
        let (src, lds): (&[f32], usize) = if i == 0 { (x, ldx) } else { (&s.f, l.in_dim()) };
        if i == last {
            let w = l.packed_bf16();
            acts::to_bf16_rows(src, m, l.in_dim(), lds, &mut s.b0, w.kp());
            let a = ActsBf16 {
                ptr: s.b0.as_ptr(),
                lda: w.kp(),
            };
            assert!(out.len() >= m * n);
            let ep = f32_epilogue(l, out.as_mut_ptr());
            s.timed(|_| driver::linear_bf16(k, a, m, w, &ep, threads));
            break;
        }
        let a = quantize_for(k, l, (src, lds, m), &mut s.q, &mut s.sx);
        s.f.resize(m * n, 0.0);
        let ep = f32_epilogue(l, s.f.as_mut_ptr());
        s.timed(|s| driver::linear_i8(k, a, &s.sx, m, l.packed_int8(), &ep, threads));
    }
}

/// `m` rows of f32 at a stride (`(x, ldx, m)`) quantized for int8 layer `l` into `q` (codes)
/// and `sx` (the rows' scales): the layer's input.
fn quantize_for(
    k: &Kernels,
    l: &Linear,
    (x, ldx, m): (&[f32], usize, usize),
    q: &mut Vec<u8>,
    sx: &mut Vec<f32>,
) -> ActsI8 {
    let w = l.packed_int8();
    let rows = RowsF32 {
        x,
        m,
        k: l.in_dim(),
        ld: ldx,
    };
    let quant = Quant {
        unsigned: k.unsigned_i8(),
        smooth: l.int8_inv_smooth(),
    };
    acts::quantize_rows(rows, quant, q, w.kp(), sx);
    ActsI8 {
        ptr: q.as_ptr(),
        lda: w.kp(),
    }
}

/// The epilogue of layer `l` writing its f32 outputs at `out` (`[m, l.out_dim()]`, dense).
fn f32_epilogue(l: &Linear, out: *mut f32) -> Epilogue<'_> {
    Epilogue {
        bias: l.bias(),
        group: None,
        relu: l.relu(),
        cross: None,
        f32_out: Some(MatF32 {
            ptr: out,
            ld: l.out_dim(),
        }),
        bf16_out: None,
    }
}

/// The DCNv2 cross net as `x` says: `x_L` of `x0` (`[m, n]`) written to `xl` (whose contents on
/// entry are not read: the first layer's residual is `x0` itself). In bf16, `x_L` is also left
/// in bf16 in the scratch ([`Input::Bf16Ready`] for the top MLP).
pub fn cross(
    x: Exec,
    layers: &[CrossLayer],
    x0: &[f32],
    xl: &mut [f32],
    m: usize,
    s: &mut LowpScratch,
) {
    let Some(first) = layers.first() else {
        return;
    };
    let n = first.v.in_dim();
    assert!(x0.len() >= m * n && xl.len() >= m * n);
    let (k, threads) = (&x.kernels, x.threads);
    match x.dtype {
        DenseDType::Bf16 => cross_bf16(k, layers, x0, xl, m, s, threads),
        DenseDType::Int8 => cross_int8(k, layers, x0, xl, m, s, threads),
        DenseDType::F32 => unreachable!("f32 layers run on the f32 path"),
    }
}

/// `x0` and `x_l`, `n` wide, as the matrices of the cross epilogue (`x0 * (W low + b) + x_l`).
fn cross_mats(x0: &[f32], xl: &mut [f32], n: usize) -> (MatF32, MatF32) {
    let x0m = MatF32 {
        ptr: x0.as_ptr().cast_mut(),
        ld: n,
    };
    let xlm = MatF32 {
        ptr: xl.as_mut_ptr(),
        ld: n,
    };
    (x0m, xlm)
}

/// [`cross`] in bf16: each layer's epilogue writes `x_{l+1}` in f32 to `xl` and in bf16 as the
/// next layer's input. `layers` is not empty; `x0` and `xl` hold `m` rows (checked by `cross`).
fn cross_bf16(
    k: &Kernels,
    layers: &[CrossLayer],
    x0: &[f32],
    xl: &mut [f32],
    m: usize,
    s: &mut LowpScratch,
    threads: usize,
) {
    let first = &layers[0];
    let n = first.v.in_dim();
    let (x0m, xlm) = cross_mats(x0, xl, n);
    let kpn = first.v.packed_bf16().kp();
    acts::to_bf16_rows(x0, m, n, n, &mut s.b0, kpn);
    for (i, l) in layers.iter().enumerate() {
        let (v, w) = (l.v.packed_bf16(), l.w.packed_bf16());
        let ld = w.kp();
        s.low.resize(m.next_multiple_of(TILE) * ld, 0);
        let ep = Epilogue {
            bias: l.v.bias(),
            group: None,
            relu: false,
            cross: None,
            f32_out: None,
            bf16_out: Some(MatBf16 {
                ptr: s.low.as_mut_ptr(),
                ld,
            }),
        };
        s.capture(Buf::B0, m, n, kpn);
        let a = ActsBf16 {
            ptr: s.b0.as_ptr(),
            lda: kpn,
        };
        s.timed(|_| driver::linear_bf16(k, a, m, v, &ep, threads));
        acts::zero_pad_bf16(&mut s.low, m, v.n(), ld);
        // x_{l+1} = x0 * (W low + b) + x_l, in f32 and as the next layer's bf16 input.
        let ep = Epilogue {
            bias: l.w.bias(),
            group: None,
            relu: false,
            cross: Some((x0m, if i == 0 { x0m } else { xlm })),
            f32_out: Some(xlm),
            bf16_out: Some(MatBf16 {
                ptr: s.b0.as_mut_ptr(),
                ld: kpn,
            }),
        };
        s.capture(Buf::Low, m, v.n(), ld);
        let a = ActsBf16 {
            ptr: s.low.as_ptr(),
            lda: ld,
        };
        s.timed(|_| driver::linear_bf16(k, a, m, w, &ep, threads));
    }
}

/// [`cross`] in int8: each layer quantizes its input (`x0`, then `x_l`) and the low-rank
/// projection, and the second GEMM's epilogue writes `x_{l+1}` to `xl`. `layers` is not
/// empty; `x0` and `xl` hold `m` rows (checked by `cross`).
fn cross_int8(
    k: &Kernels,
    layers: &[CrossLayer],
    x0: &[f32],
    xl: &mut [f32],
    m: usize,
    s: &mut LowpScratch,
    threads: usize,
) {
    let n = layers[0].v.in_dim();
    let (x0m, xlm) = cross_mats(x0, xl, n);
    let u = k.unsigned_i8();
    for (i, l) in layers.iter().enumerate() {
        let (v, w) = (l.v.packed_int8(), l.w.packed_int8());
        let input: &[f32] = if i == 0 { x0 } else { xl };
        let rows = RowsF32 {
            x: input,
            m,
            k: n,
            ld: n,
        };
        let q = Quant {
            unsigned: u,
            smooth: l.v.int8_inv_smooth(),
        };
        acts::quantize_rows(rows, q, &mut s.q, v.kp(), &mut s.sx);
        let r = v.n();
        s.f.resize(m * r, 0.0);
        let ep = Epilogue {
            bias: l.v.bias(),
            group: None,
            relu: false,
            cross: None,
            f32_out: Some(MatF32 {
                ptr: s.f.as_mut_ptr(),
                ld: r,
            }),
            bf16_out: None,
        };
        let a = ActsI8 {
            ptr: s.q.as_ptr(),
            lda: v.kp(),
        };
        s.timed(|s| driver::linear_i8(k, a, &s.sx, m, v, &ep, threads));
        let rows = RowsF32 {
            x: &s.f,
            m,
            k: r,
            ld: r,
        };
        let q = Quant {
            unsigned: u,
            smooth: l.w.int8_inv_smooth(),
        };
        acts::quantize_rows(rows, q, &mut s.q, w.kp(), &mut s.sx);
        let ep = Epilogue {
            bias: l.w.bias(),
            group: None,
            relu: false,
            cross: Some((x0m, if i == 0 { x0m } else { xlm })),
            f32_out: Some(xlm),
            bf16_out: None,
        };
        let a = ActsI8 {
            ptr: s.q.as_ptr(),
            lda: w.kp(),
        };
        s.timed(|s| driver::linear_i8(k, a, &s.sx, m, w, &ep, threads));
    }
}
