//! The graph runtime against PyTorch (the fixtures of `tools/graph_fixtures.py`: real TorchRec
//! models exported by `export_torch.py --from torch-module`) and each op against a plain
//! reference on random inputs.

use prost::Message;
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::onnx::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use super::*;

fn fixture(name: &str) -> (Graph, serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let g = Graph::load(&dir.join("dense.onnx")).unwrap();
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    (g, serde_json::from_str(&text).unwrap())
}

fn matrix(v: &serde_json::Value) -> (Vec<usize>, Vec<f32>) {
    let rows: Vec<Vec<f32>> = serde_json::from_value(v.clone()).unwrap();
    let w = rows.first().map_or(0, Vec::len);
    (vec![rows.len(), w], rows.concat())
}

/// The graph's `dense` input: the dense features, then (a model with sequence features) each
/// sequence's length.
fn graph_dense(exp: &serde_json::Value) -> &serde_json::Value {
    exp.get("graph_dense").unwrap_or(&exp["dense"])
}

fn close(got: &[f32], want: &[f32], rtol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1e-3);
        assert!(
            err <= rtol,
            "{what}[{i}]: {g} against {w} (relative {err:.2e})"
        );
    }
}

/// Every fixture's outputs within 1e-5 (relative) of PyTorch's: the whole batch, each sample
/// alone (batch 1), and an empty batch; on 1 and 2 threads.
#[test]
fn the_fixtures_score_as_pytorch() {
    for name in [
        "graph_deepfm",
        "graph_mmoe",
        "graph_two_tower",
        "graph_dlrm_dcn",
        "graph_din",
    ] {
        let (g, exp) = fixture(name);
        assert_eq!(g.inputs(), ["dense", "sparse"], "{name}");
        let (lin, _) = g.steps();
        assert!(
            lin >= 2,
            "{name}: the linear layers run on Ember's kernels ({lin})"
        );
        let (ds, dv) = matrix(graph_dense(&exp));
        let (ss, sv) = matrix(&exp["sparse"]);
        let b = ds[0];
        for threads in [1, 2] {
            let out = g
                .run(
                    &[
                        ("dense", &Tensor::f32(ds.clone(), dv.clone()).unwrap()),
                        ("sparse", &Tensor::f32(ss.clone(), sv.clone()).unwrap()),
                    ],
                    threads,
                )
                .unwrap();
            for (o, name_o) in out.iter().zip(g.outputs()) {
                let want: Vec<f32> =
                    serde_json::from_value(exp["outputs"][name_o].clone()).unwrap();
                close(
                    o.as_f32().unwrap(),
                    &want,
                    1e-5,
                    &format!("{name} {name_o}"),
                );
            }
        }
        for (i, rows) in [(0..1), (3..4), (b - 1..b), (0..0)].into_iter().enumerate() {
            let n = rows.len();
            let pick = |v: &[f32], w: usize| v[rows.start * w..rows.end * w].to_vec();
            let out = g
                .run(
                    &[
                        (
                            "dense",
                            &Tensor::f32(vec![n, ds[1]], pick(&dv, ds[1])).unwrap(),
                        ),
                        (
                            "sparse",
                            &Tensor::f32(vec![n, ss[1]], pick(&sv, ss[1])).unwrap(),
                        ),
                    ],
                    1,
                )
                .unwrap();
            for (o, name_o) in out.iter().zip(g.outputs()) {
                let want: Vec<f32> =
                    serde_json::from_value(exp["outputs"][name_o].clone()).unwrap();
                close(
                    o.as_f32().unwrap(),
                    &want[rows.clone()],
                    1e-5,
                    &format!("{name} {name_o} part {i}"),
                );
            }
        }
    }
}

// ---- hand-built graphs --------------------------------------------------------------------

fn tensor_proto(name: &str, shape: &[usize], v: &[f32]) -> TensorProto {
    TensorProto {
        dims: shape.iter().map(|&d| d as i64).collect(),
        data_type: 1,
        float_data: v.to_vec(),
        name: name.into(),
        ..Default::default()
    }
}

fn ints_proto(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        dims: vec![v.len() as i64],
        data_type: 7,
        int64_data: v.to_vec(),
        name: name.into(),
        ..Default::default()
    }
}

fn attr_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 2,
        i,
        ..Default::default()
    }
}

fn attr_float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 1,
        f,
        ..Default::default()
    }
}

fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 7,
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn node(op: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: format!("{op}_0"),
        op_type: op.into(),
        attribute: attrs,
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, inits: Vec<TensorProto>, ins: &[&str], outs: &[&str]) -> Vec<u8> {
    let vi = |n: &&str| ValueInfoProto {
        name: n.to_string(),
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![super::onnx::OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        producer_name: "test".into(),
        graph: Some(GraphProto {
            node: nodes,
            initializer: inits,
            input: ins.iter().map(vi).collect(),
            output: outs.iter().map(vi).collect(),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

/// A reduction's definition over the values it reduces.
type Reduction = fn(&[f32]) -> f32;

/// Each reduction op with its definition.
fn reductions() -> [(&'static str, Reduction); 4] {
    [
        ("ReduceSum", |s| s.iter().sum::<f32>()),
        ("ReduceMean", |s| s.iter().sum::<f32>() / s.len() as f32),
        ("ReduceMax", |s| {
            s.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        }),
        ("ReduceL2", |s| s.iter().map(|x| x * x).sum::<f32>().sqrt()),
    ]
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

fn run1(bytes: &[u8], x: Tensor) -> Tensor {
    let g = Graph::from_bytes(bytes).unwrap();
    g.run(&[("x", &x)], 1).unwrap().remove(0)
}

/// MatMul + Add + Relu on constants becomes one of Ember's linear layers, and scores as the
/// plain formula; so does Gemm with transB, alpha and a [1, out] bias; batches 0, 1, 2 and 37.
#[test]
fn linear_layers_are_fused_and_exact() {
    let mut rng = StdRng::seed_from_u64(7);
    let (k, n) = (19, 11);
    let w = random(&mut rng, k * n); // [k, n] for MatMul
    let b = random(&mut rng, n);
    let mm = model(
        vec![
            node("MatMul", &["x", "w"], &["h"], vec![]),
            node("Add", &["b", "h"], &["hb"], vec![]),
            node("Relu", &["hb"], &["y"], vec![]),
        ],
        vec![tensor_proto("w", &[k, n], &w), tensor_proto("b", &[n], &b)],
        &["x"],
        &["y"],
    );
    let g = Graph::from_bytes(&mm).unwrap();
    assert_eq!(g.steps(), (1, 0), "MatMul + Add + Relu is one linear layer");
    let wt: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect(); // [n, k]
    let gemm = model(
        vec![node(
            "Gemm",
            &["x", "wt", "c"],
            &["y"],
            vec![attr_int("transB", 1), attr_float("alpha", 0.5)],
        )],
        vec![
            tensor_proto("wt", &[n, k], &wt),
            tensor_proto("c", &[1, n], &b),
        ],
        &["x"],
        &["y"],
    );
    for rows in [0, 1, 2, 37] {
        let x = random(&mut rng, rows * k);
        let y = run1(&mm, Tensor::f32(vec![rows, k], x.clone()).unwrap());
        let z = run1(&gemm, Tensor::f32(vec![rows, k], x.clone()).unwrap());
        assert_eq!(y.shape, vec![rows, n]);
        for r in 0..rows {
            for j in 0..n {
                let dot: f32 = (0..k).map(|p| x[r * k + p] * w[p * n + j]).sum();
                let want = (dot + b[j]).max(0.0);
                let got = y.as_f32().unwrap()[r * n + j];
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{got} {want}"
                );
                let want = 0.5 * dot + b[j];
                let got = z.as_f32().unwrap()[r * n + j];
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{got} {want}"
                );
            }
        }
    }
}

/// An op this build lacks, a custom domain, an unknown attribute and a node reading a value
/// not yet computed are errors at load naming the node.
#[test]
fn what_cannot_run_is_refused_at_load_naming_the_node() {
    let bad = model(
        vec![node("LSTM", &["x"], &["y"], vec![])],
        vec![],
        &["x"],
        &["y"],
    );
    let e = Graph::from_bytes(&bad).unwrap_err().to_string();
    assert!(
        e.contains("LSTM_0") && e.contains("\"LSTM\"") && e.contains("Gemm"),
        "{e}"
    );
    let mut custom = node("Relu", &["x"], &["y"], vec![]);
    custom.domain = "com.microsoft".into();
    let e = Graph::from_bytes(&model(vec![custom], vec![], &["x"], &["y"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("com.microsoft") && e.contains("Relu_0"), "{e}");
    let attr = node(
        "Softmax",
        &["x"],
        &["y"],
        vec![attr_int("axis", 1), attr_int("fast", 1)],
    );
    let e = Graph::from_bytes(&model(vec![attr], vec![], &["x"], &["y"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"fast\"") && e.contains("Softmax_0"), "{e}");
    let order = model(
        vec![
            node("Relu", &["h"], &["y"], vec![]),
            node("Relu", &["x"], &["h"], vec![]),
        ],
        vec![],
        &["x"],
        &["y"],
    );
    let e = Graph::from_bytes(&order).unwrap_err().to_string();
    assert!(e.contains("topological"), "{e}");
    assert!(Graph::from_bytes(b"\xff\xff\xff").is_err());
    // A shape that does not fit is an error of the run, naming the node; nothing panics.
    let g = Graph::from_bytes(&model(
        vec![node("MatMul", &["x", "x"], &["y"], vec![])],
        vec![],
        &["x"],
        &["y"],
    ))
    .unwrap();
    let e = g
        .run(&[("x", &Tensor::f32(vec![2, 3], vec![0.0; 6]).unwrap())], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("MatMul_0") && e.contains("inner dims"), "{e}");
}

/// Shape ops against their definitions on a random [2, 3, 4] tensor.
#[test]
fn shape_ops_follow_the_spec() {
    let mut rng = StdRng::seed_from_u64(3);
    let v = random(&mut rng, 24);
    let x = || Tensor::f32(vec![2, 3, 4], v.clone()).unwrap();
    let at = |i: usize, j: usize, k: usize| v[(i * 3 + j) * 4 + k];
    // Transpose [2, 0, 1] -> [4, 2, 3].
    let t = run1(
        &model(
            vec![node(
                "Transpose",
                &["x"],
                &["y"],
                vec![attr_ints("perm", &[2, 0, 1])],
            )],
            vec![],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(t.shape, vec![4, 2, 3]);
    for (k, i, j) in (0..4).flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (k, i, j)))) {
        assert_eq!(t.as_f32().unwrap()[(k * 2 + i) * 3 + j], at(i, j, k));
    }
    // Slice axis -1 from -3 to 4 step 2 -> k in {1, 3}.
    let s = run1(
        &model(
            vec![node("Slice", &["x", "s", "e", "a", "st"], &["y"], vec![])],
            vec![
                ints_proto("s", &[-3]),
                ints_proto("e", &[100]),
                ints_proto("a", &[-1]),
                ints_proto("st", &[2]),
            ],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(s.shape, vec![2, 3, 2]);
    for (i, j, q) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..2).map(move |q| (i, j, q)))) {
        assert_eq!(
            s.as_f32().unwrap()[(i * 3 + j) * 2 + q],
            at(i, j, 1 + 2 * q)
        );
    }
    // Gather axis 1 with [[2, 0]] -> [2, 1, 2, 4]; negative index -1 is 2.
    let g = run1(
        &model(
            vec![node(
                "Gather",
                &["x", "i"],
                &["y"],
                vec![attr_int("axis", 1)],
            )],
            vec![TensorProto {
                dims: vec![1, 2],
                ..ints_proto("i", &[-1, 0])
            }],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(g.shape, vec![2, 1, 2, 4]);
    for (i, q, k) in (0..2).flat_map(|i| (0..2).flat_map(move |q| (0..4).map(move |k| (i, q, k)))) {
        assert_eq!(
            g.as_f32().unwrap()[(i * 2 + q) * 4 + k],
            at(i, [2, 0][q], k)
        );
    }
    // Split axis 2 into [1, 3], then Concat them back in the other order.
    let c = run1(
        &model(
            vec![
                node(
                    "Split",
                    &["x", "sp"],
                    &["p", "q"],
                    vec![attr_int("axis", 2)],
                ),
                node("Concat", &["q", "p"], &["y"], vec![attr_int("axis", -1)]),
            ],
            vec![ints_proto("sp", &[1, 3])],
            &["x"],
            &["y"],
        ),
        x(),
    );
    for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
        assert_eq!(
            c.as_f32().unwrap()[(i * 3 + j) * 4 + k],
            at(i, j, (k + 1) % 4)
        );
    }
    // Unsqueeze then Squeeze, Flatten, Reshape with 0 and -1, Shape.
    let r = run1(
        &model(
            vec![
                node("Unsqueeze", &["x", "ax"], &["u"], vec![]),
                node("Squeeze", &["u", "ax"], &["s"], vec![]),
                node("Flatten", &["s"], &["f"], vec![attr_int("axis", 2)]),
                node("Reshape", &["f", "sh"], &["r"], vec![]),
                node("Reshape", &["r", "sh2"], &["y"], vec![]),
            ],
            vec![
                ints_proto("ax", &[1]),
                ints_proto("sh", &[2, -1]),
                ints_proto("sh2", &[0, 3, -1]),
            ],
            &["x"],
            &["y"],
        ),
        x(),
    );
    // Flatten at 2: [6, 4]; [2, -1]: [2, 12]; [0, 3, -1] (0 copies dim 0): [2, 3, 4].
    assert_eq!(
        (r.shape.clone(), r.as_f32().unwrap()),
        (vec![2, 3, 4], &v[..])
    );
    // Expand [2, 3, 4] to [2, 2, 3, 4]: the tensor repeated along the new leading dim.
    let e = run1(
        &model(
            vec![node("Expand", &["x", "to"], &["y"], vec![])],
            vec![ints_proto("to", &[2, 1, 3, 4])],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(e.shape, vec![2, 2, 3, 4]);
    assert_eq!(e.as_f32().unwrap(), [v.clone(), v.clone()].concat());
    let sh = run1(
        &model(
            vec![node("Shape", &["x"], &["y"], vec![attr_int("start", -2)])],
            vec![],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(sh.as_i64().unwrap(), [3, 4]);
}

/// Reductions over the last axis (a row at a time, in vector lanes) against the plain sum, max
/// and norm of each row, on odd widths (below, at and past a vector) and batches (0, 1, past the
/// threaded size); the same values on 1 and 2 threads; a `Mul` of two `[n, d]` tensors summed
/// over rows (DeepFM's sum of squares) one step, bit for bit the two ops apart.
#[test]
fn last_axis_reductions_and_row_dots_match_the_plain_loops() {
    let mut rng = StdRng::seed_from_u64(21);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (n, d) in [(0, 7), (1, 1), (3, 15), (5, 16), (7, 33), (40, 1728)] {
        let v = random(&mut rng, n * d);
        let w = random(&mut rng, n * d);
        let x = || Tensor::f32(vec![n, d], v.clone()).unwrap();
        for (op, f) in reductions() {
            let bytes = model(
                vec![node(op, &["x", "a"], &["y"], vec![attr_int("keepdims", 0)])],
                vec![ints_proto("a", &[-1])],
                &["x"],
                &["y"],
            );
            let g = Graph::from_bytes(&bytes).unwrap();
            let one = g.run(&[("x", &x())], 1).unwrap().remove(0);
            let two = pool.install(|| g.run(&[("x", &x())], 2).unwrap().remove(0));
            assert_eq!(one.shape, vec![n], "{op}");
            assert_eq!(one.as_f32(), two.as_f32(), "{op} on 1 and 2 threads");
            for (i, &got) in one.as_f32().unwrap().iter().enumerate() {
                let want = f(&v[i * d..(i + 1) * d]);
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{op} [{n}, {d}] row {i}: {got} vs {want}"
                );
            }
        }
        let fused = model(
            vec![
                node("Mul", &["x", "w"], &["m"], vec![]),
                node(
                    "ReduceSum",
                    &["m", "a"],
                    &["y"],
                    vec![attr_int("keepdims", 1)],
                ),
            ],
            vec![ints_proto("a", &[1])],
            &["x", "w"],
            &["y"],
        );
        let apart = model(
            vec![
                node("Mul", &["x", "w"], &["m"], vec![]),
                node(
                    "ReduceSum",
                    &["m", "a"],
                    &["y"],
                    vec![attr_int("keepdims", 1)],
                ),
            ],
            vec![ints_proto("a", &[1])],
            &["x", "w"],
            &["y", "m"],
        );
        let wt = Tensor::f32(vec![n, d], w.clone()).unwrap();
        let (gf, ga) = (
            Graph::from_bytes(&fused).unwrap(),
            Graph::from_bytes(&apart).unwrap(),
        );
        assert!(
            gf.plan
                .steps
                .iter()
                .any(|s| matches!(s.kind, super::plan::Kind::GatedSum { .. }))
        );
        let a = gf.run(&[("x", &x()), ("w", &wt)], 1).unwrap().remove(0);
        let b = pool.install(|| gf.run(&[("x", &x()), ("w", &wt)], 2).unwrap().remove(0));
        let c = ga.run(&[("x", &x()), ("w", &wt)], 1).unwrap().remove(0);
        assert_eq!(a.shape, vec![n, 1]);
        assert_eq!(a.as_f32(), b.as_f32(), "row dots on 1 and 2 threads");
        assert_eq!(a.as_f32(), c.as_f32(), "row dots and the two ops apart");
    }
}

/// A join of values and of products / differences only it reads (DIN's `[q, k, q * k, q - k]`)
/// is one step computing each into its slot: bit for bit the ops apart (a graph that also
/// outputs the product and difference keeps them apart), on 1 and 2 threads, batches 0, 1 and past the threaded
/// size, on the last axis and on another; operands that broadcast take the ops-apart path.
#[test]
fn a_join_of_elementwise_ops_is_one_step_and_exact() {
    let mut rng = StdRng::seed_from_u64(31);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    // `m` is `q * k`, or `q * g` with `g` of shape [1, 1, d] (a broadcast).
    let build = |axis: i64, keep: bool, by: &str| {
        let mut outs = vec!["y"];
        if keep {
            outs.extend(["m", "d"]);
        }
        let nodes = vec![
            node("Mul", &["q", by], &["m"], vec![]),
            node("Sub", &["q", "k"], &["d"], vec![]),
            node(
                "Concat",
                &["q", "k", "m", "d"],
                &["y"],
                vec![attr_int("axis", axis)],
            ),
        ];
        Graph::from_bytes(&model(nodes, vec![], &["q", "k", "g"], &outs)).unwrap()
    };
    let joined = |g: &Graph| {
        g.plan
            .steps
            .iter()
            .filter(|s| matches!(s.kind, super::plan::Kind::Joined { .. }))
            .count()
    };
    for (axis, by) in [(2, "k"), (1, "k"), (2, "g")] {
        let (fused, apart) = (build(axis, false, by), build(axis, true, by));
        assert_eq!((joined(&fused), joined(&apart)), (1, 0), "axis {axis}");
        assert_eq!(fused.plan.steps.len(), 1, "the Mul and Sub are gone");
        for b in [0, 1, 300] {
            let (l, d) = (5, 24);
            let q = Tensor::f32(vec![b, l, d], random(&mut rng, b * l * d)).unwrap();
            let k = Tensor::f32(vec![b, l, d], random(&mut rng, b * l * d)).unwrap();
            let g = Tensor::f32(vec![1, 1, d], random(&mut rng, d)).unwrap();
            let ins = [("q", &q), ("k", &k), ("g", &g)];
            let want = apart.run(&ins, 1).unwrap().remove(0);
            let one = fused.run(&ins, 1).unwrap().remove(0);
            let two = pool.install(|| fused.run(&ins, 2).unwrap().remove(0));
            let mut shape = vec![b, l, d];
            shape[axis as usize] *= 4;
            assert_eq!(want.shape, shape, "axis {axis} batch {b}");
            assert_eq!(one.shape, want.shape, "axis {axis} batch {b}");
            assert_eq!(
                one.as_f32(),
                want.as_f32(),
                "axis {axis} batch {b}: 1 thread"
            );
            assert_eq!(
                two.as_f32(),
                want.as_f32(),
                "axis {axis} batch {b}: 2 threads"
            );
        }
    }
}

/// Expand's block copy and Slice's runs against the plain per-value definitions, on random
/// shapes (dims of 1 broadcast anywhere, ranks 0-4, empty dims; slices on every axis, steps 1-3).
#[test]
fn expand_and_slice_match_the_per_value_definitions() {
    let mut rng = StdRng::seed_from_u64(12);
    for case in 0..300 {
        let r = rng.random_range(0..5);
        let out: Vec<usize> = (0..r).map(|_| rng.random_range(0..5)).collect();
        let keep = rng.random_range(0..=r);
        let shape: Vec<usize> = out[r - keep..]
            .iter()
            .map(|&d| if rng.random_bool(0.4) { 1 } else { d })
            .collect();
        let v: Vec<f32> = random(&mut rng, shape.iter().product());
        let n = out.iter().product();
        let (want_s, want) =
            super::tensor::zip_with((&shape, &v), (&out, &vec![0.0; n]), |a, _| a, Vec::new())
                .unwrap();
        let mut got = Vec::new();
        super::layout::broadcast_into(&shape, &v, &want_s, &mut got);
        assert_eq!(got, want, "case {case}: {shape:?} -> {out:?}");
        if r == 0 {
            continue;
        }
        let t = Tensor::f32(out.clone(), random(&mut rng, n)).unwrap();
        let a = rng.random_range(0..r);
        let d = out[a] as i64;
        let (lo, hi, step) = (
            rng.random_range(-d - 1..=d),
            rng.random_range(-d - 1..=d + 1),
            rng.random_range(1..4),
        );
        let i = |x: i64| Tensor::i64(vec![1], vec![x]).unwrap();
        let got =
            super::layout::slice(&t, &i(lo), &i(hi), Some(&i(a as i64)), Some(&i(step))).unwrap();
        let clamp = |x: i64| (if x < 0 { x + d } else { x }).clamp(0, d) as usize;
        let picked: Vec<usize> = (clamp(lo)..clamp(hi)).step_by(step as usize).collect();
        let mut want_shape = out.clone();
        want_shape[a] = picked.len();
        let inner: usize = out[a + 1..].iter().product();
        let outer: usize = out[..a].iter().product();
        let tv = t.as_f32().unwrap();
        let mut want = Vec::new();
        for o in 0..outer {
            for &p in &picked {
                for k in 0..inner {
                    want.push(tv[(o * out[a] + p) * inner + k]);
                }
            }
        }
        assert_eq!(got.shape, want_shape, "case {case}");
        assert_eq!(
            got.as_f32().unwrap(),
            &want[..],
            "case {case}: slice {lo}..{hi} step {step} axis {a}"
        );
    }
}

/// The ops of a sequence's mask (`arange(L) < lengths`, `Not`, `Where`, a bool cast to float,
/// `lengths.clamp(min=1)` on int64) and the other comparisons and logic against plain loops,
/// broadcasting a `[1, L]` row against a `[B, 1]` column; booleans are int64 0 / 1.
#[test]
fn comparisons_and_masks_follow_the_spec() {
    let mut rng = StdRng::seed_from_u64(9);
    let (b, l) = (5, 4);
    let lengths: Vec<i64> = (0..b).map(|_| rng.random_range(0..7)).collect();
    let scores = random(&mut rng, b * l);
    type Test = fn(i64, i64) -> bool;
    let cmp: [(&str, Test); 5] = [
        ("Less", |a, c| a < c),
        ("LessOrEqual", |a, c| a <= c),
        ("Greater", |a, c| a > c),
        ("GreaterOrEqual", |a, c| a >= c),
        ("Equal", |a, c| a == c),
    ];
    let pos = || TensorProto {
        dims: vec![1, l as i64],
        ..ints_proto("pos", &(0..l as i64).collect::<Vec<_>>())
    };
    let run = |nodes: Vec<NodeProto>, inits: Vec<TensorProto>, x: Tensor| {
        let g = Graph::from_bytes(&model(nodes, inits, &["x", "s"], &["y"])).unwrap();
        let s = Tensor::f32(vec![b, l], scores.clone()).unwrap();
        g.run(&[("x", &x), ("s", &s)], 1).unwrap().remove(0)
    };
    let col = || Tensor::i64(vec![b, 1], lengths.clone()).unwrap();
    for (op, f) in cmp {
        let y = run(
            vec![node(op, &["pos", "x"], &["y"], vec![])],
            vec![pos()],
            col(),
        );
        assert_eq!(y.shape, vec![b, l], "{op}");
        for (i, j) in (0..b).flat_map(|i| (0..l).map(move |j| (i, j))) {
            let want = i64::from(f(j as i64, lengths[i]));
            assert_eq!(y.as_i64().unwrap()[i * l + j], want, "{op} [{i}, {j}]");
        }
    }
    // The masked softmax's input: Where(Not(pos < n), -1e9, s); the mask as float times s.
    let masked = run(
        vec![
            node("Less", &["pos", "x"], &["m"], vec![]),
            node("Not", &["m"], &["nm"], vec![]),
            node("Where", &["nm", "big", "s"], &["w"], vec![]),
            node("Cast", &["m"], &["mf"], vec![attr_int("to", 1)]),
            node("Mul", &["w", "mf"], &["y"], vec![]),
        ],
        vec![pos(), tensor_proto("big", &[], &[-1e9])],
        col(),
    );
    for (i, j) in (0..b).flat_map(|i| (0..l).map(move |j| (i, j))) {
        let inside = (j as i64) < lengths[i];
        let want = if inside { scores[i * l + j] } else { -0.0 };
        assert_eq!(masked.as_f32().unwrap()[i * l + j], want, "[{i}, {j}]");
    }
    // And / Or / Xor of two masks; Cast to bool of floats.
    for (op, f) in [
        ("And", (|a, c| a && c) as fn(bool, bool) -> bool),
        ("Or", |a, c| a || c),
        ("Xor", |a, c| a != c),
    ] {
        let y = run(
            vec![
                node("Less", &["pos", "x"], &["m"], vec![]),
                node("Cast", &["s"], &["sb"], vec![attr_int("to", 9)]),
                node("Greater", &["s", "zero"], &["p"], vec![]),
                node(op, &["m", "p"], &["y"], vec![]),
            ],
            vec![pos(), tensor_proto("zero", &[], &[0.0])],
            col(),
        );
        for (i, j) in (0..b).flat_map(|i| (0..l).map(move |j| (i, j))) {
            let want = f((j as i64) < lengths[i], scores[i * l + j] > 0.0);
            assert_eq!(y.as_i64().unwrap()[i * l + j], i64::from(want), "{op}");
        }
    }
    // An int64 clip keeps int64 (a mean over a sequence: sum / lengths.clamp(min=1)).
    let y = run(
        vec![node("Clip", &["x", "one"], &["y"], vec![])],
        vec![TensorProto {
            dims: vec![],
            ..ints_proto("one", &[1])
        }],
        col(),
    );
    let want: Vec<i64> = lengths.iter().map(|&n| n.max(1)).collect();
    assert_eq!(y.as_i64().unwrap(), &want[..]);
    // Where of a float and an int branch is refused, naming both.
    let g = Graph::from_bytes(&model(
        vec![
            node("Less", &["pos", "x"], &["m"], vec![]),
            node("Where", &["m", "x", "s"], &["y"], vec![]),
        ],
        vec![pos()],
        &["x", "s"],
        &["y"],
    ))
    .unwrap();
    let s = Tensor::f32(vec![b, l], scores.clone()).unwrap();
    let e = g
        .run(&[("x", &col()), ("s", &s)], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Where of a int64 and a float"), "{e}");
}

/// Reductions, softmax, broadcasting arithmetic, clip, batched MatMul against plain loops.
#[test]
fn math_ops_follow_the_spec() {
    let mut rng = StdRng::seed_from_u64(5);
    let v = random(&mut rng, 24);
    let x = || Tensor::f32(vec![2, 3, 4], v.clone()).unwrap();
    let at = |i: usize, j: usize, k: usize| v[(i * 3 + j) * 4 + k];
    for (op, f) in reductions() {
        let y = run1(
            &model(
                vec![node(op, &["x", "a"], &["y"], vec![attr_int("keepdims", 0)])],
                vec![ints_proto("a", &[1])],
                &["x"],
                &["y"],
            ),
            x(),
        );
        assert_eq!(y.shape, vec![2, 4], "{op}");
        for (i, k) in (0..2).flat_map(|i| (0..4).map(move |k| (i, k))) {
            let want = f(&[at(i, 0, k), at(i, 1, k), at(i, 2, k)]);
            assert!((y.as_f32().unwrap()[i * 4 + k] - want).abs() < 1e-5, "{op}");
        }
    }
    // Two axes at once (the general loop) and a gate per row times rows ([2, 3, 1] * x).
    let y = run1(
        &model(
            vec![
                node("ReduceSum", &["x", "a"], &["s"], vec![]),
                node("Mul", &["s", "x"], &["y"], vec![]),
            ],
            vec![ints_proto("a", &[0, 2])],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(y.shape, vec![2, 3, 4]);
    for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
        let s: f32 = (0..2)
            .flat_map(|p| (0..4).map(move |q| (p, q)))
            .map(|(p, q)| at(p, j, q))
            .sum();
        assert!((y.as_f32().unwrap()[(i * 3 + j) * 4 + k] - s * at(i, j, k)).abs() < 1e-5);
    }
    let g = random(&mut rng, 6);
    let y = run1(
        &model(
            vec![node("Mul", &["g", "x"], &["y"], vec![])],
            vec![tensor_proto("g", &[2, 3, 1], &g)],
            &["x"],
            &["y"],
        ),
        x(),
    );
    for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
        assert_eq!(
            y.as_f32().unwrap()[(i * 3 + j) * 4 + k],
            g[i * 3 + j] * at(i, j, k)
        );
    }
    let sm = run1(
        &model(
            vec![node("Softmax", &["x"], &["y"], vec![attr_int("axis", 1)])],
            vec![],
            &["x"],
            &["y"],
        ),
        x(),
    );
    for (i, k) in (0..2).flat_map(|i| (0..4).map(move |k| (i, k))) {
        let e: Vec<f32> = (0..3).map(|j| at(i, j, k).exp()).collect();
        for j in 0..3 {
            let want = e[j] / e.iter().sum::<f32>();
            assert!((sm.as_f32().unwrap()[(i * 3 + j) * 4 + k] - want).abs() < 1e-6);
        }
    }
    // x [2, 3, 4] * w [3, 1] - 1, clipped to [-1, 0.5], then divided by 2 (an int constant).
    let w = random(&mut rng, 3);
    let y = run1(
        &model(
            vec![
                node("Mul", &["x", "w"], &["m"], vec![]),
                node("Sub", &["m", "one"], &["s"], vec![]),
                node("Clip", &["s", "lo", "hi"], &["c"], vec![]),
                node("Div", &["c", "two"], &["y"], vec![]),
            ],
            vec![
                tensor_proto("w", &[3, 1], &w),
                tensor_proto("one", &[], &[1.0]),
                tensor_proto("lo", &[], &[-1.0]),
                tensor_proto("hi", &[], &[0.5]),
                TensorProto {
                    dims: vec![],
                    ..ints_proto("two", &[2])
                },
            ],
            &["x"],
            &["y"],
        ),
        x(),
    );
    for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
        let want = (at(i, j, k) * w[j] - 1.0).clamp(-1.0, 0.5) / 2.0;
        assert_eq!(y.as_f32().unwrap()[(i * 3 + j) * 4 + k], want);
    }
    // Batched MatMul [2, 3, 4] x [4, 5] (the constant broadcast over the batch; 3-D input to
    // a fused linear layer) and [2, 3, 4] x [2, 4, 2] (both batched: the general op).
    let b = random(&mut rng, 20);
    let y = run1(
        &model(
            vec![node("MatMul", &["x", "b"], &["y"], vec![])],
            vec![tensor_proto("b", &[4, 5], &b)],
            &["x"],
            &["y"],
        ),
        x(),
    );
    assert_eq!(y.shape, vec![2, 3, 5]);
    for (i, j, q) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..5).map(move |q| (i, j, q)))) {
        let want: f32 = (0..4).map(|k| at(i, j, k) * b[k * 5 + q]).sum();
        assert!((y.as_f32().unwrap()[(i * 3 + j) * 5 + q] - want).abs() < 1e-5);
    }
    let c = random(&mut rng, 16);
    let y = run1(
        &model(
            vec![
                node("Tanh", &["c"], &["t"], vec![]),
                node("MatMul", &["x", "t"], &["y"], vec![]),
            ],
            vec![tensor_proto("c", &[2, 4, 2], &c)],
            &["x"],
            &["y"],
        ),
        x(),
    );
    for (i, j, q) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..2).map(move |q| (i, j, q)))) {
        let want: f32 = (0..4)
            .map(|k| at(i, j, k) * c[(i * 4 + k) * 2 + q].tanh())
            .sum();
        assert!((y.as_f32().unwrap()[(i * 3 + j) * 2 + q] - want).abs() < 1e-5);
    }
}

/// Elementwise ops large enough to be split over the caller's threads give, bit for bit, the
/// plain loop's values: same shapes, a row repeated (its length not dividing the chunk) and a
/// unary op, in a pool of 2 threads and of 1.
#[test]
fn large_elementwise_ops_split_over_threads_match_the_plain_loop() {
    let mut rng = StdRng::seed_from_u64(9);
    let (rows, w) = (301, 217);
    let x = random(&mut rng, rows * w);
    let r = random(&mut rng, w);
    let bytes = model(
        vec![
            node("Mul", &["x", "x"], &["m"], vec![]),
            node("Add", &["m", "r"], &["a"], vec![]),
            node("Sigmoid", &["a"], &["y"], vec![]),
        ],
        vec![tensor_proto("r", &[1, w], &r)],
        &["x"],
        &["y"],
    );
    let g = Graph::from_bytes(&bytes).unwrap();
    let t = Tensor::f32(vec![rows, w], x.clone()).unwrap();
    for threads in [2, 1] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let y = pool.install(|| g.run(&[("x", &t)], threads).unwrap().remove(0));
        for i in 0..rows {
            for j in 0..w {
                let v = x[i * w + j] * x[i * w + j] + r[j];
                let want = 1.0 / (1.0 + (-v).exp());
                assert_eq!(
                    y.as_f32().unwrap()[i * w + j],
                    want,
                    "({i}, {j}), {threads} threads"
                );
            }
        }
    }
}

/// A gate per row times rows (`[B, E, 1] * [B, E, D]`, MMoE's), a row per sample broadcast
/// over the middle axis, their sum over one axis and their join: split over 2 threads, each
/// value bit for bit the one-thread run's and the index formula's; batch 1 and an empty batch.
#[test]
fn broadcasts_sums_and_joins_split_over_threads_match_one_thread() {
    let mut rng = StdRng::seed_from_u64(17);
    let (e, d) = (5, 97);
    let bytes = model(
        vec![
            node("Mul", &["g", "x"], &["m"], vec![]),
            node("Mul", &["x", "h"], &["k"], vec![]),
            node(
                "ReduceSum",
                &["m", "ax"],
                &["s"],
                vec![attr_int("keepdims", 0)],
            ),
            node("Concat", &["m", "k"], &["c"], vec![attr_int("axis", 1)]),
        ],
        vec![ints_proto("ax", &[1])],
        &["g", "x", "h"],
        &["s", "c"],
    );
    let graph = Graph::from_bytes(&bytes).unwrap();
    for b in [301, 1, 0] {
        let (gv, xv, hv) = (
            random(&mut rng, b * e),
            random(&mut rng, b * e * d),
            random(&mut rng, b * d),
        );
        let g = Tensor::f32(vec![b, e, 1], gv.clone()).unwrap();
        let x = Tensor::f32(vec![b, e, d], xv.clone()).unwrap();
        let h = Tensor::f32(vec![b, 1, d], hv.clone()).unwrap();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| graph.run(&[("g", &g), ("x", &x), ("h", &h)], threads))
                .unwrap()
        };
        let (two, one) = (run(2), run(1));
        for (a, c) in two.iter().zip(&one) {
            assert_eq!(a.shape, c.shape, "batch {b}");
            assert_eq!(a.as_f32().unwrap(), c.as_f32().unwrap(), "batch {b}");
        }
        let (sum, cat) = (two[0].as_f32().unwrap(), two[1].as_f32().unwrap());
        assert_eq!(two[1].shape, vec![b, 2 * e, d]);
        for i in 0..b {
            for k in 0..d {
                let mut want = 0.0f32;
                for j in 0..e {
                    let m = gv[i * e + j] * xv[(i * e + j) * d + k];
                    want += m;
                    assert_eq!(cat[(i * 2 * e + j) * d + k], m);
                    let kk = xv[(i * e + j) * d + k] * hv[i * d + k];
                    assert_eq!(cat[(i * 2 * e + e + j) * d + k], kk);
                }
                assert_eq!(sum[i * d + k], want, "sum ({i}, {k})");
            }
        }
    }
}

/// A Concat that joins every part of a Split back in order, on the same axis, reads the
/// split's input (the split is gone from the plan when nothing else reads its parts); a join
/// in another order, or a part read elsewhere, keeps the split; each as the plain formula.
#[test]
fn a_split_joined_back_whole_is_not_copied() {
    let x = Tensor::f32(vec![3, 8], (0..24).map(|v| v as f32).collect()).unwrap();
    let plan = |nodes: Vec<NodeProto>, outs: &[&str]| {
        let bytes = model(nodes, vec![ints_proto("sp", &[3, 5])], &["x", "d"], outs);
        Graph::from_bytes(&bytes).unwrap()
    };
    let split = || {
        node(
            "Split",
            &["x", "sp"],
            &["p", "q"],
            vec![attr_int("axis", 1)],
        )
    };
    let d = Tensor::f32(vec![3, 2], vec![-1.0; 6]).unwrap();
    let ops = |g: &Graph| {
        g.plan
            .steps
            .iter()
            .map(|s| s.what.clone())
            .collect::<Vec<_>>()
    };
    // [d, p, q] -> [d, x]: the split is dropped.
    let g = plan(
        vec![
            split(),
            node(
                "Concat",
                &["d", "p", "q"],
                &["y"],
                vec![attr_int("axis", 1)],
            ),
        ],
        &["y"],
    );
    assert!(
        !ops(&g).iter().any(|w| w.contains("Split")),
        "{:?}",
        ops(&g)
    );
    let y = g.run(&[("x", &x), ("d", &d)], 1).unwrap().remove(0);
    assert_eq!(y.shape, vec![3, 10]);
    for i in 0..3 {
        let want: Vec<f32> = [-1.0, -1.0]
            .into_iter()
            .chain((0..8).map(|k| (i * 8 + k) as f32))
            .collect();
        assert_eq!(&y.as_f32().unwrap()[i * 10..(i + 1) * 10], want.as_slice());
    }
    // [q, p]: another order, the split stays; and a part also read by a Neg keeps it too.
    for (nodes, outs) in [
        (
            vec![
                split(),
                node("Concat", &["q", "p"], &["y"], vec![attr_int("axis", 1)]),
            ],
            vec!["y"],
        ),
        (
            vec![
                split(),
                node("Concat", &["p", "q"], &["y"], vec![attr_int("axis", 1)]),
                node("Neg", &["p"], &["n"], vec![]),
            ],
            vec!["y", "n"],
        ),
    ] {
        let g = plan(nodes, &outs);
        assert!(ops(&g).iter().any(|w| w.contains("Split")), "{:?}", ops(&g));
        let got = g.run(&[("x", &x), ("d", &d)], 1).unwrap();
        let y = got[0].as_f32().unwrap();
        let reordered = outs.len() == 1;
        for i in 0..3 {
            for k in 0..8 {
                let src = match reordered {
                    true => (k + 3) % 8,
                    false => k,
                };
                assert_eq!(y[i * 8 + k], (i * 8 + src) as f32);
            }
        }
        if let Some(n) = got.get(1) {
            assert_eq!(n.shape, vec![3, 3]);
            assert_eq!(n.as_f32().unwrap()[4], -9.0);
        }
    }
}

/// The cross net's step, `x0 * (x W + b) + xl`, is one step: in f32 bit for bit the plain
/// formula (each product and sum rounded as the separate ops round them), in bf16 and int8
/// near it; an `x0` that broadcasts runs the three ops; a product read elsewhere is not fused.
#[test]
fn a_cross_step_is_one_pass_and_exact_in_f32() {
    let mut rng = StdRng::seed_from_u64(23);
    let (n, r) = (40, 24);
    let w = random(&mut rng, r * n);
    let b = random(&mut rng, n);
    let nodes = |x0: &str, extra: bool| {
        let mut v = vec![
            node("MatMul", &["x", "w"], &["y0"], vec![]),
            node("Add", &["y0", "b"], &["y"], vec![]),
            node("Mul", &[x0, "y"], &["m"], vec![]),
            node("Add", &["xl", "m"], &["z"], vec![]),
        ];
        if extra {
            v.push(node("Neg", &["m"], &["e"], vec![]));
        }
        v
    };
    let inits = || vec![tensor_proto("w", &[r, n], &w), tensor_proto("b", &[n], &b)];
    let plan = |x0: &str, extra: bool| {
        let outs: &[&str] = if extra { &["z", "e"] } else { &["z"] };
        Graph::from_bytes(&model(nodes(x0, extra), inits(), &["x", x0, "xl"], outs)).unwrap()
    };
    let crosses = |g: &Graph| {
        g.plan
            .steps
            .iter()
            .filter(|s| matches!(s.kind, super::plan::Kind::Cross(_)))
            .count()
    };
    for rows in [37, 1, 0] {
        let (xv, x0v, xlv) = (
            random(&mut rng, rows * r),
            random(&mut rng, rows * n),
            random(&mut rng, rows * n),
        );
        let x = Tensor::f32(vec![rows, r], xv.clone()).unwrap();
        let x0 = Tensor::f32(vec![rows, n], x0v.clone()).unwrap();
        let xl = Tensor::f32(vec![rows, n], xlv.clone()).unwrap();
        let lin: Vec<f32> = (0..rows * n)
            .map(|i| {
                let (row, o) = (i / n, i % n);
                let acc: f32 = (0..r).map(|k| xv[row * r + k] * w[k * n + o]).sum();
                acc + b[o]
            })
            .collect();
        let want: Vec<f32> = (0..rows * n).map(|i| x0v[i] * lin[i] + xlv[i]).collect();
        let mut g = plan("x0", false);
        assert_eq!(crosses(&g), 1);
        assert_eq!(g.steps(), (1, 0));
        let inputs = [("x", &x), ("x0", &x0), ("xl", &xl)];
        for threads in [1, 2] {
            let z = g.run(&inputs, threads).unwrap().remove(0);
            assert_eq!(z.shape, vec![rows, n]);
            // The layer's sums in their own order: within rounding of the formula's.
            for (i, (&got, &w)) in z.as_f32().unwrap().iter().zip(&want).enumerate() {
                assert!(
                    (got - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{i}: {got} vs {w}"
                );
            }
        }
        // The same values as the three ops, unfused (the product also read elsewhere).
        let unfused = plan("x0", true);
        assert_eq!(crosses(&unfused), 0);
        let u = unfused.run(&inputs, 1).unwrap().remove(0);
        let f = g.run(&inputs, 1).unwrap().remove(0);
        assert_eq!(f.as_f32().unwrap(), u.as_f32().unwrap(), "rows {rows}");
        for dtype in [crate::DenseDType::Bf16, crate::DenseDType::Int8] {
            g.set_dense_dtype(dtype).unwrap();
            let z = g.run(&inputs, 2).unwrap().remove(0);
            for (&got, &w) in z.as_f32().unwrap().iter().zip(&want) {
                assert!(
                    (got - w).abs() <= 0.1 * (1.0 + w.abs()),
                    "{dtype:?}: {got} vs {w}"
                );
            }
        }
        // An x0 of one row, broadcast: the three ops, the formula with that row.
        let g1 = plan("x0", false);
        let row0 = Tensor::f32(vec![1, n], x0v[..n.min(x0v.len())].to_vec());
        if let (Ok(row0), true) = (row0, rows > 0) {
            let z = g1
                .run(&[("x", &x), ("x0", &row0), ("xl", &xl)], 1)
                .unwrap()
                .remove(0);
            let f = z.as_f32().unwrap();
            for i in 0..rows * n {
                let expect = x0v[i % n] * lin[i] + xlv[i];
                assert!((f[i] - expect).abs() <= 1e-4 * (1.0 + expect.abs()), "{i}");
            }
        }
    }
}

/// A gate times its experts summed over the experts (MMoE's `Mul` then `ReduceSum`) is one
/// step, bit for bit the two ops' values (the product also read elsewhere keeps them apart):
/// either operand order, keepdims or not, 1 and 2 threads; operands of other shapes (both
/// `[B, E, D]`) and a sum over another axis give the two ops' values too.
#[test]
fn a_gated_sum_is_one_step_and_exact() {
    let mut rng = StdRng::seed_from_u64(29);
    let (e, d) = (3, 67);
    let build = |ins: [&str; 2], keep: i64, ax: i64, extra: bool| {
        let mut nodes = vec![
            node("Mul", &ins, &["m"], vec![]),
            node(
                "ReduceSum",
                &["m", "ax"],
                &["s"],
                vec![attr_int("keepdims", keep)],
            ),
        ];
        let mut outs = vec!["s"];
        if extra {
            nodes.push(node("Neg", &["m"], &["n"], vec![]));
            outs.push("n");
        }
        Graph::from_bytes(&model(
            nodes,
            vec![ints_proto("ax", &[ax])],
            &["g", "x"],
            &outs,
        ))
        .unwrap()
    };
    let gated = |g: &Graph| {
        g.plan
            .steps
            .iter()
            .filter(|s| matches!(s.kind, super::plan::Kind::GatedSum { .. }))
            .count()
    };
    for b in [211, 1, 0] {
        let gv = random(&mut rng, b * e);
        let xv = random(&mut rng, b * e * d);
        for (gshape, ax) in [
            (vec![b, e, 1], 1),
            (vec![b, e, 1], -2),
            (vec![b, e, d], 1),
            (vec![b, e, 1], 2),
        ] {
            let gvals = match gshape[2] {
                1 => gv.clone(),
                _ => random(&mut rng, b * e * d),
            };
            let g = Tensor::f32(gshape.clone(), gvals).unwrap();
            let x = Tensor::f32(vec![b, e, d], xv.clone()).unwrap();
            for (ins, keep) in [(["g", "x"], 0), (["x", "g"], 1)] {
                let fused = build(ins, keep, ax, false);
                let apart = build(ins, keep, ax, true);
                assert_eq!(gated(&fused), 1);
                assert_eq!(gated(&apart), 0);
                let want = apart.run(&[("g", &g), ("x", &x)], 1).unwrap().remove(0);
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let got = pool
                        .install(|| fused.run(&[("g", &g), ("x", &x)], threads))
                        .unwrap()
                        .remove(0);
                    assert_eq!(got.shape, want.shape, "{gshape:?} {ax} {ins:?}");
                    assert_eq!(
                        got.as_f32().unwrap(),
                        want.as_f32().unwrap(),
                        "{gshape:?} {ax}"
                    );
                }
            }
        }
    }
}

/// `--profile`'s step times: every step that ran, counted on the thread that ran it, and
/// nothing once stopped.
#[test]
fn the_profile_times_every_step_that_ran() {
    let bytes = model(
        vec![
            node("Mul", &["x", "x"], &["m"], vec![]),
            node("Sigmoid", &["m"], &["y"], vec![]),
        ],
        vec![],
        &["x"],
        &["y"],
    );
    let g = Graph::from_bytes(&bytes).unwrap();
    let x = Tensor::f32(vec![4, 3], vec![0.5; 12]).unwrap();
    Graph::profile_start();
    for _ in 0..3 {
        g.run(&[("x", &x)], 1).unwrap();
    }
    let p = g.profile_take();
    let names: Vec<&str> = p.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(p.len(), 2, "{names:?}");
    assert!(
        names.iter().any(|n| n.contains("(Mul)")) && names.iter().any(|n| n.contains("(Sigmoid)"))
    );
    let shares: f64 = p.iter().map(|s| s.2).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    g.run(&[("x", &x)], 1).unwrap();
    assert!(g.profile_take().is_empty(), "timed after it stopped");
}

/// A graph model's config is a DLRM-family config whose interaction is the graph: every loader
/// reads it (so the registry, `convert` and the server take it), and what cannot describe a
/// graph model is refused saying what.
#[test]
fn a_graph_config_reads_as_a_dlrm_family_config_and_bad_ones_are_refused() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/graph_mmoe/config.json");
    match crate::AnyConfig::read(&cfg).unwrap() {
        crate::AnyConfig::Dlrm(c) => {
            assert!(c.is_graph());
            assert_eq!(c.output_names(), ["ctr", "cvr"]);
            assert_eq!(c.pooled_width(), 6 + 9 + 4 + 5);
        }
        other => panic!("{other:?}"),
    }
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    let refused = |edit: &dyn Fn(&mut serde_json::Value), want: &str| {
        let mut c = good.clone();
        edit(&mut c);
        let bytes = serde_json::to_vec(&c).unwrap();
        let e = crate::AnyConfig::from_slice(&bytes, &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
    };
    refused(
        &|c| c["top_mlp"] = serde_json::json!([4, 1]),
        "must be empty",
    );
    refused(
        &|c| c["bottom_mlp"] = serde_json::json!([4]),
        "must be empty",
    );
    refused(
        &|c| c["interaction"]["outputs"] = serde_json::json!(["ctr", "ctr"]),
        "appears twice",
    );
    refused(
        &|c| c["interaction"]["outputs"] = serde_json::json!([]),
        "at least one output",
    );
    refused(
        &|c| c["interaction"]["file"] = serde_json::json!("../dense.onnx"),
        "not a file name",
    );
    refused(
        &|c| c["interaction"]["extra"] = serde_json::json!(1),
        "unknown field",
    );
    // A DLRM config still needs its top MLP (the default of a missing one is empty).
    refused(
        &|c| {
            c["interaction"] = serde_json::json!({"kind": "cat"});
        },
        "top_mlp must end",
    );
}

/// bf16 and int8 linear layers (the kernels this CPU has, else the emulated ones) stay within
/// 1e-2 of f32's scores on every fixture, and differ from them (the lower precision really
/// runs); batch 1 and an empty batch too.
#[test]
fn bf16_and_int8_layers_score_near_f32() {
    for name in [
        "graph_deepfm",
        "graph_mmoe",
        "graph_two_tower",
        "graph_dlrm_dcn",
        "graph_din",
    ] {
        let (mut g, exp) = fixture(name);
        let (ds, dv) = matrix(graph_dense(&exp));
        let (ss, sv) = matrix(&exp["sparse"]);
        let d = Tensor::f32(ds.clone(), dv).unwrap();
        let s = Tensor::f32(ss.clone(), sv).unwrap();
        let f32s = g.run(&[("dense", &d), ("sparse", &s)], 2).unwrap();
        for dtype in [crate::DenseDType::Bf16, crate::DenseDType::Int8] {
            g.set_dense_dtype(dtype).unwrap();
            let low = g.run(&[("dense", &d), ("sparse", &s)], 2).unwrap();
            let mut largest = 0.0f32;
            for (a, b) in f32s.iter().zip(&low) {
                for (x, y) in a.as_f32().unwrap().iter().zip(b.as_f32().unwrap()) {
                    largest = largest.max((x - y).abs());
                }
            }
            assert!(largest <= 1e-2, "{name} {dtype:?}: {largest}");
            assert!(largest > 0.0, "{name} {dtype:?}: the same scores as f32");
            for n in [1, 0] {
                let d1 =
                    Tensor::f32(vec![n, ds[1]], d.as_f32().unwrap()[..n * ds[1]].to_vec()).unwrap();
                let s1 =
                    Tensor::f32(vec![n, ss[1]], s.as_f32().unwrap()[..n * ss[1]].to_vec()).unwrap();
                let one = g.run(&[("dense", &d1), ("sparse", &s1)], 1).unwrap();
                for (a, b) in one.iter().zip(&low) {
                    assert_eq!(a.len(), n);
                    for (x, y) in a.as_f32().unwrap().iter().zip(b.as_f32().unwrap()) {
                        assert!((x - y).abs() <= 1e-2, "{name} {dtype:?} batch {n}");
                    }
                }
            }
            g.set_dense_dtype(crate::DenseDType::F32).unwrap();
        }
    }
}

fn fixture_batch(exp: &serde_json::Value) -> (Vec<f32>, ember_embed::KeyedJagged) {
    let (ds, dense) = matrix(&exp["dense"]);
    let keys: Vec<String> = serde_json::from_value(exp["keys"].clone()).unwrap();
    let lengths: Vec<usize> = serde_json::from_value(exp["lengths"].clone()).unwrap();
    let values: Vec<i64> = serde_json::from_value(exp["values"].clone()).unwrap();
    let kj =
        ember_embed::KeyedJagged::from_lengths(keys, ds[0], &lengths, values.into(), None).unwrap();
    (dense, kj)
}

/// A graph model loaded as a [`crate::Model`] (tables in DRAM, its graph's layers in f32).
fn load_model(dir: &Path) -> crate::Result<std::sync::Arc<crate::Model>> {
    crate::Model::load(dir, crate::LoadOptions::default()).map(std::sync::Arc::new)
}

/// Every output of `m` on `dense` and `kj`, on a predictor of `threads` threads.
fn score(
    m: &std::sync::Arc<crate::Model>,
    dense: &[f32],
    kj: &ember_embed::KeyedJagged,
    threads: usize,
) -> crate::Result<Vec<Vec<f32>>> {
    use crate::Engine;
    let mut p = crate::Predictor::new(m.clone(), threads)?;
    let mut out = crate::serving::Outputs::default();
    p.score_outputs(dense, kj, &mut out)?;
    Ok(out.values)
}

/// The whole model from ids: each fixture's tables pooled by Ember's embedding stage, then
/// its graph, within 1e-5 (relative) of PyTorch's outputs on the batch (empty bags, a sample
/// with no ids), on 1 and 2 threads; a one-output model's `Engine::run` gives that output.
#[test]
fn graph_models_score_ids_as_pytorch() {
    for name in [
        "graph_deepfm",
        "graph_mmoe",
        "graph_two_tower",
        "graph_dlrm_dcn",
        "graph_din",
    ] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let exp: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let (dense, kj) = fixture_batch(&exp);
        let m = load_model(&dir).unwrap();
        let names = m.config().output_names();
        for threads in [1, 2] {
            let out = score(&m, &dense, &kj, threads).unwrap();
            assert_eq!(out.len(), names.len());
            for (o, name_o) in out.iter().zip(&names) {
                let want: Vec<f32> =
                    serde_json::from_value(exp["outputs"][name_o].clone()).unwrap();
                close(o, &want, 1e-5, &format!("{name} {name_o} from ids"));
            }
            use crate::Engine;
            let mut p = crate::Predictor::new(m.clone(), threads).unwrap();
            let mut one = vec![0.0; kj.batch_size()];
            match p.score(&dense, &kj, &mut one) {
                Ok(_) => {
                    assert_eq!(names.len(), 1, "{name}");
                    assert_eq!(one, out[0], "{name}");
                }
                Err(e) => {
                    assert!(names.len() > 1, "{name}: {e}");
                    assert!(e.to_string().contains("outputs"), "{e}");
                }
            }
        }
    }
}

/// A graph model's int8 layers quantize each batch as they run: asking to calibrate them is
/// refused saying so, and the model scores on after.
#[test]
fn calibrating_a_graph_model_is_refused_saying_why() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/graph_two_tower");
    let m = load_model(&dir).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let (dense, kj) = fixture_batch(&exp);
    let e = crate::Predictor::calibrate_int8(&m, 1, 1, |_| (dense.clone(), kj.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("graph model") && e.contains("calibration"),
        "{e}"
    );
    assert_eq!(score(&m, &dense, &kj, 1).unwrap()[0].len(), kj.batch_size());
}

/// The check at load of a graph model's bf16 / int8 layers (what `ember serve` logs) scores
/// every output and reports the one that keeps least of f32's AUC; a one-output model names
/// none.
#[test]
fn the_load_check_of_a_graph_models_low_precision_covers_every_output() {
    for (name, outputs) in [("graph_mmoe", 2), ("graph_two_tower", 1)] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        for dtype in [crate::DenseDType::Bf16, crate::DenseDType::Int8] {
            let opts = crate::LoadOptions {
                dense_dtype: Some(dtype),
                ..crate::LoadOptions::default()
            };
            let m = std::sync::Arc::new(crate::Model::load(&dir, opts).unwrap());
            let a = crate::accuracy::check_at_load(&m, 1).unwrap().unwrap();
            assert_eq!(a.samples, crate::accuracy::LOAD_CHECK_SAMPLES, "{name}");
            assert!(
                a.ratio() > 0.98 && a.ratio() < 1.02,
                "{name} {dtype:?}: {}",
                a.ratio()
            );
            assert!(a.max_abs > 0.0, "{name} {dtype:?}: the same scores as f32");
            match outputs {
                1 => assert_eq!(a.output, None),
                _ => assert!(
                    ["ctr", "cvr"].contains(&a.output.as_deref().unwrap_or("")),
                    "{:?}",
                    a.output
                ),
            }
        }
    }
}

/// Load refuses a graph that does not fit the tables (a table's dim changed), an output the
/// config does not name, and a batch with an id past its table or the wrong dense width, each
/// saying what; the model keeps scoring after a refused batch.
#[test]
fn graph_models_refuse_what_does_not_fit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/graph_mmoe");
    let dir = std::env::temp_dir().join(format!("ember-graph-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["dense.onnx", "model.safetensors", "expected.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let write = |c: &serde_json::Value| {
        std::fs::write(dir.join("config.json"), serde_json::to_string(c).unwrap()).unwrap()
    };
    // An output the graph does not give.
    let mut c = cfg.clone();
    c["interaction"]["outputs"] = serde_json::json!(["ctr", "dwell"]);
    write(&c);
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(
        e.contains("\"dwell\"") && e.contains("config.json names"),
        "{e}"
    );
    // A feature dropped (its table too): the pooled row is 19 wide (6 + 9 + 4), not the
    // graph's 24.
    let mut c = cfg.clone();
    c["features"].as_array_mut().unwrap().pop();
    write(&c);
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(
        e.contains("does not run on dense") && e.contains("pooled rows [1, 19]"),
        "{e}"
    );
    let mut c = cfg.clone();
    c["tables"][3]["dim"] = serde_json::json!(2);
    write(&c);
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(e.contains("tables.cat"), "{e}");
    // The graph file missing.
    let mut c = cfg.clone();
    c["interaction"]["file"] = serde_json::json!("other.onnx");
    write(&c);
    let e = load_model(&dir).unwrap_err().to_string();
    assert!(e.contains("other.onnx"), "{e}");
    // The shipped config: bad batches are refused, good ones score.
    write(&cfg);
    let m = load_model(&dir).unwrap();
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let (dense, kj) = fixture_batch(&exp);
    let e = score(&m, &dense[1..], &kj, 1).unwrap_err().to_string();
    assert!(e.contains("dense"), "{e}");
    let keys: Vec<String> = serde_json::from_value(exp["keys"].clone()).unwrap();
    let mut lengths = vec![0usize; keys.len() * 7];
    lengths[0] = 1;
    let far =
        ember_embed::KeyedJagged::from_lengths(keys, 7, &lengths, vec![1_000_000i64].into(), None)
            .unwrap();
    let e = score(&m, &dense, &far, 1).unwrap_err().to_string();
    assert!(e.contains("1000000"), "{e}");
    assert!(score(&m, &dense, &kj, 1).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A linear layer over a join only it reads is factored (`factor.rs`): DIN's `[e, k, e * k, e -
/// k]`, `e` an `Expand` of one row a sample, runs as a layer over `[k, e * k]` plus `u W_e`
/// once a sample; within rounding of the join and the layer apart (the join also an output),
/// with and without the ReLU, batches 0, 1, 37 and past the threaded size, 1 and 2 threads, and
/// in bf16 / int8 near f32. Inputs that do not fit (a `u` whose last axis broadcasts too) run
/// the join and the layer as they are: bit for bit the graph apart. A join of values no two
/// parts share is not factored.
#[test]
fn a_layer_over_a_join_is_factored_and_within_rounding() {
    let mut rng = StdRng::seed_from_u64(41);
    let (l, d, out) = (7, 24, 40);
    let w = random(&mut rng, 4 * d * out);
    let b = random(&mut rng, out);
    let build = |relu: bool, keep: bool, expand: bool| {
        let q = if expand { "e" } else { "q" };
        let mut nodes = vec![
            node("Expand", &["u", "shape"], &["e"], vec![]),
            node("Mul", &[q, "k"], &["m"], vec![]),
            node("Sub", &[q, "k"], &["s"], vec![]),
            node(
                "Concat",
                &[q, "k", "m", "s"],
                &["c"],
                vec![attr_int("axis", -1)],
            ),
            node("MatMul", &["c", "w"], &["y0"], vec![]),
            node("Add", &["y0", "b"], &["y1"], vec![]),
        ];
        if relu {
            nodes.push(node("Relu", &["y1"], &["y"], vec![]));
        } else {
            nodes.push(node("Identity", &["y1"], &["y"], vec![]));
        }
        let inits = vec![
            tensor_proto("w", &[4 * d, out], &w),
            tensor_proto("b", &[out], &b),
            ints_proto("shape", &[1, l as i64, d as i64]),
        ];
        let outs: &[&str] = if keep { &["y", "c"] } else { &["y"] };
        Graph::from_bytes(&model(nodes, inits, &["u", "q", "k"], outs)).unwrap()
    };
    let factored = |g: &Graph| {
        g.plan
            .steps
            .iter()
            .filter(|s| matches!(s.kind, super::plan::Kind::Factored(_)))
            .count()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (relu, expand) in [(true, true), (false, true), (true, false)] {
        let mut g = build(relu, false, expand);
        let apart = build(relu, true, expand);
        let what = format!("relu {relu} expand {expand}");
        assert_eq!((factored(&g), factored(&apart)), (1, 0), "{what}");
        // The main layer reads `[k, q * k]` (no Expand: and `q`), each value once.
        let f = g
            .plan
            .steps
            .iter()
            .find_map(|s| match &s.kind {
                super::plan::Kind::Factored(f) => Some(f),
                _ => None,
            })
            .expect("counted above");
        assert_eq!(
            f.main.in_dim(),
            if expand { 2 * d } else { 3 * d },
            "{what}"
        );
        for n in [0, 1, 37, 300] {
            let u = Tensor::f32(vec![n, 1, d], random(&mut rng, n * d)).unwrap();
            let q = Tensor::f32(vec![n, l, d], random(&mut rng, n * l * d)).unwrap();
            let k = Tensor::f32(vec![n, l, d], random(&mut rng, n * l * d)).unwrap();
            let ins = [("u", &u), ("q", &q), ("k", &k)];
            let want = apart.run(&ins, 1).unwrap().remove(0);
            assert_eq!(want.shape, vec![n, l, out]);
            let wv = want.as_f32().unwrap();
            // Sums in another order (and the weights of a value summed first): rounding of
            // the order of the largest output, where an output near 0 is a cancellation.
            let top = wv.iter().fold(1.0f32, |a, &v| a.max(v.abs()));
            for threads in [1, 2] {
                let got = pool.install(|| g.run(&ins, threads).unwrap().remove(0));
                assert_eq!(got.shape, want.shape, "batch {n}");
                for (i, (&x, &y)) in got.as_f32().unwrap().iter().zip(wv).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5 * top,
                        "relu {relu} expand {expand} batch {n} threads {threads} [{i}]: {x} vs {y}"
                    );
                    assert!(
                        !relu || x >= 0.0,
                        "the ReLU applies after the broadcast part"
                    );
                }
            }
            for dtype in [crate::DenseDType::Bf16, crate::DenseDType::Int8] {
                g.set_dense_dtype(dtype).unwrap();
                let got = pool.install(|| g.run(&ins, 2).unwrap().remove(0));
                // Each row's codes are relative to its largest input: the error to the largest
                // output.
                for (&x, &y) in got.as_f32().unwrap().iter().zip(wv) {
                    assert!(
                        (x - y).abs() <= 0.05 * top,
                        "{dtype:?} batch {n}: {x} vs {y}"
                    );
                }
                g.set_dense_dtype(crate::DenseDType::F32).unwrap();
            }
        }
        if !expand {
            continue;
        }
        // A `u` of one value a row, broadcast along the last axis too: the join and the layer
        // as the graph has them.
        let n = 5;
        let u = Tensor::f32(vec![n, 1, 1], random(&mut rng, n)).unwrap();
        let q = Tensor::f32(vec![n, l, d], random(&mut rng, n * l * d)).unwrap();
        let k = Tensor::f32(vec![n, l, d], random(&mut rng, n * l * d)).unwrap();
        let ins = [("u", &u), ("q", &q), ("k", &k)];
        let want = apart.run(&ins, 1).unwrap().remove(0);
        let got = g.run(&ins, 1).unwrap().remove(0);
        assert_eq!(
            got.as_f32(),
            want.as_f32(),
            "relu {relu}: the unfitting inputs"
        );
    }
    // Parts that share no value: nothing to factor.
    let nodes = vec![
        node("Concat", &["a", "k"], &["c"], vec![attr_int("axis", 1)]),
        node("MatMul", &["c", "w"], &["y"], vec![]),
    ];
    let w2 = random(&mut rng, 2 * d * out);
    let g = Graph::from_bytes(&model(
        nodes,
        vec![tensor_proto("w", &[2 * d, out], &w2)],
        &["a", "k"],
        &["y"],
    ))
    .unwrap();
    assert_eq!(factored(&g), 0);
}

/// `Where` by its definition, each operand whole, one value, or broadcast along either axis
/// (the one-pass path takes the first two, the broadcast copies the rest).
#[test]
fn where_matches_its_definition_for_every_operand_shape() {
    let mut rng = StdRng::seed_from_u64(43);
    let (b, l) = (6, 5);
    let shapes = [vec![b, l], vec![1], vec![1, l], vec![b, 1]];
    for cs in &shapes {
        for xs in &shapes {
            for ys in &shapes {
                let n = |s: &Vec<usize>| s.iter().product::<usize>();
                let cv: Vec<i64> = (0..n(cs)).map(|_| rng.random_range(0..2)).collect();
                let (x, y) = (random(&mut rng, n(xs)), random(&mut rng, n(ys)));
                let ct = Tensor::i64(cs.clone(), cv.clone()).unwrap();
                let (xt, yt) = (
                    Tensor::f32(xs.clone(), x.clone()).unwrap(),
                    Tensor::f32(ys.clone(), y.clone()).unwrap(),
                );
                let got = super::logic::select(&ct, &xt, &yt).unwrap();
                // The three broadcast: rank 2 unless all are one value; each axis the largest.
                let two: Vec<&Vec<usize>> =
                    [cs, xs, ys].into_iter().filter(|s| s.len() == 2).collect();
                let (r, c) = two
                    .iter()
                    .fold((1, 1), |(r, c), s| (r.max(s[0]), c.max(s[1])));
                let want_shape = if two.is_empty() { vec![1] } else { vec![r, c] };
                assert_eq!(got.shape, want_shape);
                let at = |s: &Vec<usize>, i: usize, j: usize| match s[..] {
                    [1] => 0,
                    [sr, k] => (if sr == 1 { 0 } else { i }) * k + if k == 1 { 0 } else { j },
                    _ => unreachable!(),
                };
                for (i, j) in (0..r).flat_map(|i| (0..c).map(move |j| (i, j))) {
                    let want = if cv[at(cs, i, j)] != 0 {
                        x[at(xs, i, j)]
                    } else {
                        y[at(ys, i, j)]
                    };
                    let what = format!("{cs:?} {xs:?} {ys:?} [{i}, {j}]");
                    assert_eq!(got.as_f32().unwrap()[i * c + j], want, "{what}");
                }
            }
        }
    }
}

/// A large block of columns (past the threaded size) sliced on 2 threads: the per-value
/// definition, as on 1 thread; and int64 values too.
#[test]
fn a_large_slice_on_two_threads_matches_the_definition() {
    let mut rng = StdRng::seed_from_u64(44);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (rows, cols, start, len) = (301, 400, 37, 300);
    let v = random(&mut rng, rows * cols);
    let t = Tensor::f32(vec![rows, cols], v.clone()).unwrap();
    let want: Vec<f32> = (0..rows * len)
        .map(|i| v[(i / len) * cols + start + i % len])
        .collect();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let got = pool
            .install(|| super::layout::narrow(&t, 1, start, len, 1))
            .unwrap();
        assert_eq!(got.shape, vec![rows, len]);
        assert_eq!(got.as_f32().unwrap(), &want[..], "{threads} threads");
    }
    let ints: Vec<i64> = (0..(rows * cols) as i64).collect();
    let ti = Tensor::i64(vec![rows, cols], ints).unwrap();
    let got = pool
        .install(|| super::layout::narrow(&ti, 1, start, len, 1))
        .unwrap();
    let want: Vec<i64> = (0..rows * len)
        .map(|i| ((i / len) * cols + start + i % len) as i64)
        .collect();
    assert_eq!(got.as_i64().unwrap(), &want[..]);
}
