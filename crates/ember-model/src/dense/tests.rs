//! Every kernel family against the reference: random layers of odd shapes (inputs and outputs
//! not multiples of a tile, batches of 0, 1, odd and several chunks), every epilogue (bias,
//! ReLU, the cross net's residual, bf16 output), 1 and 2 threads. A family this machine cannot
//! run is an ignored test saying why (`build.rs` detects the CPU), never a passing one.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::acts;
use super::driver::{self, Epilogue, Kernels, MatBf16, MatF32};
use super::pack::{PackedBf16, PackedI8};
use super::reference::{linear_bf16, linear_int8};
use super::{ActsBf16, ActsI8, DenseDType, DenseIsa, from_bf16, to_bf16};
use crate::interaction::CrossLayer;
use crate::lowp::{self as net, LowpScratch};
use crate::mlp::Linear;
use crate::random::normal_vec;

/// Shapes `(batch, n, k)`: odd sizes, tile multiples, batch 0 and 1, several row chunks.
fn shapes(rng: &mut StdRng) -> Vec<(usize, usize, usize)> {
    let mut v = vec![
        (0, 5, 7),
        (1, 1, 1),
        (1, 16, 32),
        (3, 17, 33),
        (16, 32, 64),
        (33, 40, 100),
        (130, 47, 13),
        (300, 70, 200),
        // Several output chunks on AMX (a chunk is ~1 MiB of weights: 10 blocks at k 3000).
        (40, 200, 3000),
    ];
    for _ in 0..6 {
        v.push((
            rng.random_range(0..200),
            rng.random_range(1..90),
            rng.random_range(1..300),
        ));
    }
    v
}

/// `max |got - want| <= tol(i)` for every output.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol(i),
            "{what}: output {i}: {g} vs {w} (tolerance {})",
            tol(i)
        );
    }
}

/// `sum_i |x[b, i] w[o, i]|` per output: the scale of an f32 sum's rounding error.
fn abs_sums(x: &[f32], w: &[f32], (batch, n, k): (usize, usize, usize)) -> Vec<f32> {
    (0..batch * n)
        .map(|j| {
            let (b, o) = (j / n, j % n);
            (0..k).map(|i| (x[b * k + i] * w[o * k + i]).abs()).sum()
        })
        .collect()
}

/// One layer through `isa`'s kernels with the plain epilogue (bias, ReLU, f32 out; half the
/// time a group matrix added, row `r / per`, before the ReLU), every shape, 1 and 2 threads,
/// against the reference.
fn layer_matches(isa: DenseIsa, dtype: DenseDType) {
    let k = Kernels::for_isa(isa, dtype).expect("the test runs only where the family does");
    let mut rng = StdRng::seed_from_u64(41 + dtype as u64);
    for (batch, n, kd) in shapes(&mut rng) {
        for threads in [1, 2] {
            let seed = rng.random();
            let x = normal_vec(batch * kd, 1.0, seed);
            let w = normal_vec(n * kd, 0.3, seed ^ 1);
            let bias = normal_vec(n, 0.5, seed ^ 2);
            let relu = rng.random::<bool>();
            let per = rng.random_range(1..=5);
            let g = rng
                .random::<bool>()
                .then(|| normal_vec(batch.div_ceil(per) * n, 1.0, seed ^ 3));
            let mut y = vec![f32::NAN; batch * n];
            let ep = Epilogue {
                bias: &bias,
                group: g.as_ref().map(|g| {
                    let m = MatF32 {
                        ptr: g.as_ptr().cast_mut(),
                        ld: n,
                    };
                    (m, per)
                }),
                relu,
                cross: None,
                f32_out: Some(MatF32 {
                    ptr: y.as_mut_ptr(),
                    ld: n,
                }),
                bf16_out: None,
            };
            let dims = (batch, n, kd);
            let sums = abs_sums(&x, &w, dims);
            let what = format!(
                "{isa} {dtype} batch {batch} n {n} k {kd} threads {threads} group {}",
                g.is_some()
            );
            // The reference's layer without its ReLU, then the group's row, then the ReLU.
            let finish = |v: Vec<f32>| -> Vec<f32> {
                let Some(g) = &g else { return v };
                v.iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let s = v + g[(i / n) / per * n + i % n];
                        if relu { s.max(0.0) } else { s }
                    })
                    .collect()
            };
            let relu_in = relu && g.is_none();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            match dtype {
                DenseDType::Bf16 => {
                    let p = PackedBf16::new(&w, n, kd);
                    let mut a = Vec::new();
                    acts::to_bf16_rows(&x, batch, kd, kd, &mut a, p.kp());
                    let acts = ActsBf16 {
                        ptr: a.as_ptr(),
                        lda: p.kp(),
                    };
                    pool.install(|| driver::linear_bf16(&k, acts, batch, &p, &ep, threads));
                    let want = finish(linear_bf16(&x, &w, &bias, dims, relu_in));
                    assert_close(&what, &y, &want, |i| 1e-5 * sums[i] + 1e-6);
                }
                DenseDType::Int8 => {
                    let p = PackedI8::new(&w, n, kd);
                    let (mut a, mut sx) = (Vec::new(), Vec::new());
                    let u = k.unsigned_i8();
                    acts::quantize_rows(
                        dense(&x, batch, kd),
                        quant(u, None),
                        &mut a,
                        p.kp(),
                        &mut sx,
                    );
                    let acts = ActsI8 {
                        ptr: a.as_ptr(),
                        lda: p.kp(),
                    };
                    pool.install(|| driver::linear_i8(&k, acts, &sx, batch, &p, &ep, threads));
                    let raw = linear_int8(&x, &w, &bias, dims, relu_in);
                    let want = finish(raw.clone());
                    // Exact integer sums; only the f32 scaling (and the group's add) rounds.
                    let tol = |i: usize| 1e-5 * (raw[i].abs() + want[i].abs()) + 1e-6;
                    assert_close(&what, &y, &want, tol);
                }
                DenseDType::F32 => unreachable!(),
            }
        }
    }
}

/// The cross net's epilogue (`x0 * v + xl`, written in f32 and bf16) on one layer.
fn cross_epilogue_matches(isa: DenseIsa) {
    let k = Kernels::for_isa(isa, DenseDType::Bf16).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for (batch, n, kd) in shapes(&mut rng) {
        let seed = rng.random();
        let x = normal_vec(batch * kd, 1.0, seed);
        let w = normal_vec(n * kd, 0.3, seed ^ 1);
        let bias = normal_vec(n, 0.5, seed ^ 2);
        let x0 = normal_vec(batch * n, 1.0, seed ^ 3);
        let xl0 = normal_vec(batch * n, 1.0, seed ^ 4);
        let mut xl = xl0.clone();
        let ldb = n + 3;
        let mut xb = vec![0u16; batch * ldb];
        let ep = Epilogue {
            bias: &bias,
            group: None,
            relu: false,
            cross: Some((
                MatF32 {
                    ptr: x0.as_ptr().cast_mut(),
                    ld: n,
                },
                MatF32 {
                    ptr: xl.as_mut_ptr(),
                    ld: n,
                },
            )),
            f32_out: Some(MatF32 {
                ptr: xl.as_mut_ptr(),
                ld: n,
            }),
            bf16_out: Some(MatBf16 {
                ptr: xb.as_mut_ptr(),
                ld: ldb,
            }),
        };
        let p = PackedBf16::new(&w, n, kd);
        let mut a = Vec::new();
        acts::to_bf16_rows(&x, batch, kd, kd, &mut a, p.kp());
        let acts = ActsBf16 {
            ptr: a.as_ptr(),
            lda: p.kp(),
        };
        driver::linear_bf16(&k, acts, batch, &p, &ep, 1);
        let v = linear_bf16(&x, &w, &bias, (batch, n, kd), false);
        let sums = abs_sums(&x, &w, (batch, n, kd));
        let want: Vec<f32> = (0..batch * n).map(|i| x0[i] * v[i] + xl0[i]).collect();
        let what = format!("{isa} cross batch {batch} n {n} k {kd}");
        assert_close(&what, &xl, &want, |i| {
            (1e-5 * sums[i] + 1e-6) * x0[i].abs() + 1e-6 * want[i].abs()
        });
        for b in 0..batch {
            for o in 0..n {
                let got = xb[b * ldb + o];
                assert_eq!(
                    got,
                    to_bf16(xl[b * n + o]),
                    "{what}: bf16 output ({b}, {o})"
                );
            }
            // Columns past n untouched.
            assert!(xb[b * ldb + n..(b + 1) * ldb].iter().all(|&v| v == 0));
        }
    }
}

/// `‖got - want‖ / ‖want‖`.
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| ((g - w) as f64).powi(2))
        .sum();
    let s: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum();
    (d / s.max(1e-30)).sqrt()
}

/// A three-layer MLP and a two-layer cross net through `net`, against the reference layer by
/// layer (each layer's input rounded or quantized as the kernels' are). Roundings of
/// intermediate values may differ by one step where the sums' order moves a value across a
/// rounding boundary, so the whole is compared by relative norm.
fn net_matches(isa: DenseIsa, dtype: DenseDType) {
    let k = Kernels::for_isa(isa, dtype).unwrap();
    let reference = |x: &[f32], l: &Linear, batch: usize| {
        let dims = (batch, l.out_dim(), l.in_dim());
        match dtype {
            DenseDType::Bf16 => linear_bf16(x, l.weight(), l.bias(), dims, l.relu()),
            _ => linear_int8(x, l.weight(), l.bias(), dims, l.relu()),
        }
    };
    let tol = if dtype == DenseDType::Bf16 {
        2e-3
    } else {
        5e-3
    };
    for (batch, seed) in [(1usize, 1u64), (37, 2), (200, 3)] {
        let sizes = [29usize, 70, 33, 5];
        let layers: Vec<Linear> = sizes
            .windows(2)
            .enumerate()
            .map(|(i, d)| {
                let w = normal_vec(
                    d[0] * d[1],
                    (1.0 / d[0] as f32).sqrt(),
                    seed * 10 + i as u64,
                );
                let b = normal_vec(d[1], 0.1, seed * 20 + i as u64);
                Linear::new(d[0], d[1], w, b, i < 2)
            })
            .collect();
        let x = normal_vec(batch * sizes[0], 1.0, seed);
        let mut out = vec![0f32; batch * 5];
        let mut s = LowpScratch::default();
        let run = net::Exec {
            kernels: k,
            dtype,
            threads: 2,
        };
        net::mlp(
            run,
            &layers,
            net::Input::F32(&x, sizes[0]),
            batch,
            &mut out,
            &mut s,
        );
        let mut want = x.clone();
        for (i, l) in layers.iter().enumerate() {
            // int8 runs an MLP's last layer in bf16.
            want = if i + 1 == layers.len() {
                let dims = (batch, l.out_dim(), l.in_dim());
                linear_bf16(&want, l.weight(), l.bias(), dims, l.relu())
            } else {
                reference(&want, l, batch)
            };
        }
        let e = rel_err(&out, &want);
        assert!(
            e < tol,
            "{isa} {dtype} mlp batch {batch}: relative error {e}"
        );

        let (n, r) = (45, 20);
        let cross: Vec<CrossLayer> = (0..2)
            .map(|i| CrossLayer {
                v: Linear::new(
                    n,
                    r,
                    normal_vec(r * n, 0.15, seed + 40 + i),
                    vec![0.0; r],
                    false,
                ),
                w: Linear::new(
                    r,
                    n,
                    normal_vec(n * r, 0.2, seed + 50 + i),
                    normal_vec(n, 0.1, seed + 60 + i),
                    false,
                ),
            })
            .collect();
        let x0 = normal_vec(batch * n, 1.0, seed + 70);
        let mut xl = vec![f32::NAN; batch * n]; // not read: the first residual is x0
        let run = net::Exec {
            kernels: k,
            dtype,
            threads: 1,
        };
        net::cross(run, &cross, &x0, &mut xl, batch, &mut s);
        let mut want = x0.clone();
        for c in &cross {
            let low = reference(&want, &c.v, batch);
            let v = reference(&low, &c.w, batch);
            for i in 0..batch * n {
                want[i] += x0[i] * v[i];
            }
        }
        let e = rel_err(&xl, &want);
        assert!(
            e < tol,
            "{isa} {dtype} cross batch {batch}: relative error {e}"
        );
        if dtype == DenseDType::Bf16 && batch > 0 {
            // The top MLP's bf16 input is x_L, left in the scratch: one more layer from it.
            let top = Linear::new(n, 3, normal_vec(3 * n, 0.2, seed + 80), vec![0.1; 3], false);
            let mut y = vec![0f32; batch * 3];
            let tops = std::slice::from_ref(&top);
            net::mlp(run, tops, net::Input::Bf16Ready, batch, &mut y, &mut s);
            let want_y = reference(&xl, &top, batch);
            let e = rel_err(&y, &want_y);
            assert!(
                e < tol,
                "{isa} bf16 top from x_L batch {batch}: relative error {e}"
            );
        }
    }
}

macro_rules! family_tests {
    ($isa:expr, $cfg:meta, $why:literal, $($name:ident => $body:expr;)*) => {$(
        #[test]
        #[cfg_attr(not($cfg), ignore = $why)]
        fn $name() {
            let isa = $isa;
            $body(isa)
        }
    )*};
}

family_tests!(DenseIsa::Amx, ember_amx,
    "needs AMX tiles (AMX-BF16/INT8 with Linux's permission): none on the machine that built the tests",
    amx_bf16_layer => |i| layer_matches(i, DenseDType::Bf16);
    amx_int8_layer => |i| layer_matches(i, DenseDType::Int8);
    amx_cross_epilogue => cross_epilogue_matches;
    amx_bf16_net => |i| net_matches(i, DenseDType::Bf16);
    amx_int8_net => |i| net_matches(i, DenseDType::Int8);
);

family_tests!(DenseIsa::Avx512, ember_avx512,
    "needs AVX-512 F/BW/VL: none on the machine that built the tests",
    avx512_bf16_layer => |i| layer_matches(i, DenseDType::Bf16);
    avx512_cross_epilogue => cross_epilogue_matches;
    avx512_bf16_net => |i| net_matches(i, DenseDType::Bf16);
);

family_tests!(DenseIsa::Avx512, ember_avx512_vnni,
    "needs AVX512_VNNI: none on the machine that built the tests",
    avx512_int8_layer => |i| layer_matches(i, DenseDType::Int8);
    avx512_int8_net => |i| net_matches(i, DenseDType::Int8);
);

#[test]
fn emulated_matches_reference_everywhere() {
    layer_matches(DenseIsa::Emulated, DenseDType::Bf16);
    layer_matches(DenseIsa::Emulated, DenseDType::Int8);
    cross_epilogue_matches(DenseIsa::Emulated);
    net_matches(DenseIsa::Emulated, DenseDType::Bf16);
    net_matches(DenseIsa::Emulated, DenseDType::Int8);
}

#[test]
fn quantizers_give_the_reference_codes() {
    let mut rng = StdRng::seed_from_u64(3);
    for (m, k) in [(0, 5), (1, 1), (3, 17), (5, 100), (2, 64)] {
        let mut x = normal_vec(m * k, 2.0, rng.random());
        if m > 1 {
            x[k..2 * k].fill(0.0); // a zero row: scale 1, every code 0
        }
        if m > 2 && k > 2 {
            x[2 * k] = 127.0; // scale exactly 1: x.5 values tie
            x[2 * k + 1] = 2.5;
            x[2 * k + 2] = -3.5;
        }
        let ld = k.next_multiple_of(64);
        for unsigned in [false, true] {
            let bias = if unsigned { 128u8 } else { 0 };
            let (mut fast, mut sx) = (Vec::new(), Vec::new());
            let (rows, q) = (dense(&x, m, k), quant(unsigned, None));
            acts::quantize_rows(rows, q, &mut fast, ld, &mut sx);
            let mut plain = vec![0u8; m.next_multiple_of(16) * ld];
            let mut sp = vec![0f32; m];
            acts::quantize_plain(rows, q, &mut plain, ld, &mut sp);
            for r in 0..m {
                let mut q = vec![0i8; k];
                let s = super::reference::quantize_row(&x[r * k..(r + 1) * k], &mut q);
                for (name, codes, scale) in [("selected", &fast, sx[r]), ("plain", &plain, sp[r])] {
                    assert_eq!(scale, s, "{name} scale of row {r}");
                    for i in 0..ld {
                        let want = if i < k {
                            (q[i] as u8).wrapping_add(bias)
                        } else {
                            bias
                        };
                        assert_eq!(codes[r * ld + i], want, "{name} code ({r}, {i}), {m}x{k}");
                    }
                }
            }
        }
    }
}

/// `m` rows of `k` values back to back.
fn dense(x: &[f32], m: usize, k: usize) -> acts::RowsF32<'_> {
    acts::RowsF32 { x, m, k, ld: k }
}

fn quant(unsigned: bool, smooth: Option<&[f32]>) -> acts::Quant<'_> {
    acts::Quant { unsigned, smooth }
}

#[test]
fn quantizers_split_over_a_pool_give_the_same_codes() {
    let (m, k) = (301, 77);
    let x = normal_vec(m * k, 3.0, 11);
    let inv: Vec<f32> = (0..k).map(|i| 0.25 + i as f32 / 40.0).collect();
    let run = |threads: usize, smooth: Option<&[f32]>| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (mut q, mut sx, mut b) = (Vec::new(), Vec::new(), Vec::new());
        pool.install(|| {
            acts::quantize_rows(dense(&x, m, k), quant(true, smooth), &mut q, 128, &mut sx);
            acts::to_bf16_rows(&x, m, k, k, &mut b, 96);
        });
        (q, sx, b)
    };
    for smooth in [None, Some(inv.as_slice())] {
        assert_eq!(
            run(1, smooth),
            run(2, smooth),
            "smoothing {}",
            smooth.is_some()
        );
    }
    // With a smoothing, the codes are those of x / s.
    let scaled: Vec<f32> = x.iter().enumerate().map(|(j, v)| v * inv[j % k]).collect();
    let (mut q, mut sx) = (Vec::new(), Vec::new());
    acts::quantize_rows(
        dense(&scaled, m, k),
        quant(true, None),
        &mut q,
        128,
        &mut sx,
    );
    let (qs, ss, _) = run(1, Some(&inv));
    assert_eq!((q, sx), (qs, ss));
}

/// int8 with a calibrated smoothing against f32 on inputs whose columns differ in scale by 100x
/// (as the cross net's pooled bags of 1 and 100 ids): the smoothing must cut the error.
#[test]
fn int8_smoothing_cuts_the_error_of_columns_of_unlike_scales() {
    let (batch, n, kd) = (64, 40, 96);
    let mut x = normal_vec(batch * kd, 1.0, 21);
    for (j, v) in x.iter_mut().enumerate() {
        if j % kd < kd / 4 {
            *v *= 100.0;
        }
    }
    let w = normal_vec(n * kd, 0.1, 22);
    let bias = vec![0.0; n];
    let want = linear_bf16(&x, &w, &bias, (batch, n, kd), false);
    let k = Kernels::selected(DenseDType::Int8).unwrap();
    let err = |smooth: bool| {
        let l = Linear::new(kd, n, w.clone(), bias.clone(), false);
        if smooth {
            let act: Vec<f32> = (0..kd)
                .map(|c| (0..batch).map(|b| x[b * kd + c].abs()).fold(0.0, f32::max))
                .collect();
            assert!(l.set_int8_smooth(&act));
        }
        // Two layers, so the first runs int8 (an MLP's last layer runs bf16).
        let id = Linear::new(
            n,
            n,
            (0..n * n).map(|i| f32::from(i % (n + 1) == 0)).collect(),
            vec![0.0; n],
            false,
        );
        let mut out = vec![0f32; batch * n];
        let mut s = LowpScratch::default();
        let run = net::Exec {
            kernels: k,
            dtype: DenseDType::Int8,
            threads: 1,
        };
        net::mlp(
            run,
            &[l, id],
            net::Input::F32(&x, kd),
            batch,
            &mut out,
            &mut s,
        );
        rel_err(&out, &want)
    };
    // Measured: 0.0075 against 0.0115 without.
    let (plain, smoothed) = (err(false), err(true));
    assert!(
        smoothed < 0.8 * plain,
        "smoothing: {smoothed} against {plain} without"
    );
    assert!(smoothed < 0.01, "{smoothed}");
}

#[test]
fn packing_keeps_every_weight_and_pads_with_zeros() {
    let (n, k) = (19, 37);
    let w = normal_vec(n * k, 1.0, 5);
    let b = PackedBf16::new(&w, n, k);
    let q = PackedI8::new(&w, n, k);
    assert_eq!((b.kp(), q.kp(), b.blocks()), (64, 64, 2));
    for o in 0..32 {
        for i in 0..64 {
            let (gb, gq) = (b.get(o, i), q.get(o, i));
            if o < n && i < k {
                assert_eq!(gb, to_bf16(w[o * k + i]));
                let s = q.scale()[o];
                assert!((gq as f32 * s - w[o * k + i]).abs() <= s / 2.0 + 1e-6);
            } else {
                assert_eq!((from_bf16(gb), gq), (0.0, 0), "padding at ({o}, {i})");
            }
        }
    }
}

#[test]
fn an_unknown_or_absent_family_is_refused_by_name() {
    let e = "tiles".parse::<DenseIsa>().unwrap_err().to_string();
    assert!(e.contains("tiles") && e.contains("amx"), "{e}");
    assert!(DenseIsa::Emulated.require(DenseDType::Int8).is_ok());
    for isa in DenseIsa::ALL {
        if !isa.available(DenseDType::Bf16) {
            let e = isa.require(DenseDType::Bf16).unwrap_err().to_string();
            assert!(e.contains(isa.name()) && e.contains("bf16"), "{e}");
        }
    }
}

/// Rows quantized as a function writes them (`quantize_filled`, a factored layer's join): the
/// codes and scales of the same rows in memory, on 1 and 2 threads; no rows, one, a few past a
/// 16-row step and many; odd widths; unsigned or not; smoothed or not.
#[test]
fn filled_rows_quantize_as_the_rows_in_memory() {
    let mut rng = StdRng::seed_from_u64(45);
    for (m, k) in [(0, 5), (1, 7), (17, 33), (300, 80), (301, 128)] {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for unsigned in [false, true] {
                let x = normal_vec(m * k, 1.0, rng.random());
                let smooth: Option<Vec<f32>> = rng.random::<bool>().then(|| {
                    let s = normal_vec(k, 1.0, rng.random());
                    s.iter().map(|v| v.abs() + 0.5).collect()
                });
                let q = quant(unsigned, smooth.as_deref());
                let ld = k.next_multiple_of(64);
                let (mut a, mut sa, mut b, mut sb) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                let fill = |r: usize, row: &mut [f32]| row.copy_from_slice(&x[r * k..(r + 1) * k]);
                pool.install(|| {
                    acts::quantize_rows(dense(&x, m, k), q, &mut a, ld, &mut sa);
                    acts::quantize_filled((m, k), &fill, q, &mut b, ld, &mut sb);
                });
                let what = format!("m {m} k {k} threads {threads} unsigned {unsigned}");
                assert_eq!(sa, sb, "{what}: scales");
                assert_eq!(a, b, "{what}: codes");
                assert_eq!(sb.len(), m, "{what}");
            }
        }
    }
}
