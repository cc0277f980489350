//! The fuzz targets' seed inputs, generated (no Criteo data: rows are made up here): a few
//! valid inputs of each target for the shipped DLRM and the `hstu_small` fixture, and a few
//! nearly valid ones. `write_fuzz_seeds` (`fuzz_corpus.rs`, ignored) writes them into
//! `fuzz/corpus/<target>/` as `seed-*` files.

use std::io::Write;

use ember_embed::DType;
use ember_pool_command::CallBuilder;
use ember_serve::grpc::pb::model_infer_request::InferInputTensor;
use ember_serve::grpc::pb::{self, InferTensorContents};
use prost::Message;
use serde_json::{Value, json};

use super::checks::{dlrm, hstu, root};
use crate::common::npy;

/// One seed: its target, its file name and its bytes.
pub type Seed = (&'static str, String, Vec<u8>);

/// Every seed.
pub fn all() -> Vec<Seed> {
    let mut out = Vec::new();
    kserve(&mut out);
    binary(&mut out);
    protobuf(&mut out);
    criteo(&mut out);
    json_lines(&mut out);
    npz(&mut out);
    safetensors(&mut out);
    resp(&mut out);
    pool(&mut out);
    out
}

/// Named integer or float tensors of a request, in the signature's order: (name, INT / FP32
/// values as f64 or i64).
#[derive(Clone)]
enum Data {
    F(Vec<f32>),
    I(Vec<i64>),
}

type Tensors = Vec<(String, Vec<i64>, Data)>;

/// `n` made-up samples of the DLRM: dense `[n, 13]`, per feature 0 to 2 ids of its 2,048 rows.
fn dlrm_tensors(n: usize) -> Tensors {
    let spec = dlrm();
    let d = spec.dense_in();
    let dense: Vec<f32> = (0..n * d)
        .map(|k| ((k as f32) * 0.37).sin() * 3.0)
        .collect();
    let mut out = vec![(
        "dense".to_string(),
        vec![n as i64, d as i64],
        Data::F(dense),
    )];
    for (f, name) in spec.features().iter().enumerate() {
        let lengths: Vec<i64> = (0..n).map(|s| ((s + f) % 3) as i64).collect();
        let total: i64 = lengths.iter().sum();
        let ids: Vec<i64> = (0..total)
            .map(|k| (k * 7919 + f as i64 * 104_729) % 2048)
            .collect();
        out.push((format!("{name}_lengths"), vec![n as i64], Data::I(lengths)));
        out.push((format!("{name}_ids"), vec![total], Data::I(ids)));
    }
    out
}

/// The two shortest users of the fixture's `users.jsonl`.
fn users() -> Vec<Value> {
    let path = root().join("crates/ember-model/tests/fixtures/hstu_small/users.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_by_key(|l| l.len());
    lines[..2]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The HSTU model's input tensors for `users` (as the serving tests build them).
fn hstu_tensors(users: &[Value]) -> Tensors {
    let mut out = Vec::new();
    for i in &hstu().signature.inputs {
        let (base, what) = i.name.rsplit_once('_').unwrap();
        let get = |u: &Value| -> Vec<i64> {
            let v = u["uih"].get(base).or(u["candidates"].get(base));
            v.and_then(Value::as_array)
                .map(|a| a.iter().map(|x| x.as_i64().unwrap()).collect())
                .unwrap_or_default()
        };
        let v: Vec<i64> = match what {
            "lengths" => users.iter().map(|u| get(u).len() as i64).collect(),
            _ => users.iter().flat_map(get).collect(),
        };
        out.push((i.name.clone(), vec![v.len() as i64], Data::I(v)));
    }
    out
}

fn datatype(d: &Data, int32: bool) -> &'static str {
    match (d, int32) {
        (Data::F(_), _) => "FP32",
        (Data::I(_), true) => "INT32",
        (Data::I(_), false) => "INT64",
    }
}

fn le(d: &Data, int32: bool) -> Vec<u8> {
    match d {
        Data::F(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Data::I(v) if int32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        Data::I(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn json_data(d: &Data) -> Value {
    match d {
        Data::F(v) => json!(v),
        Data::I(v) => json!(v),
    }
}

/// A KServe JSON body; `binary(k)`: whether input `k` goes as binary data (appended to `bin`).
fn kserve_body(
    t: &Tensors,
    int32: bool,
    binary: impl Fn(usize) -> bool,
    bin: &mut Vec<u8>,
) -> Value {
    let inputs: Vec<Value> = t
        .iter()
        .enumerate()
        .map(|(k, (name, shape, d))| {
            let mut i = json!({"name": name, "shape": shape, "datatype": datatype(d, int32)});
            if binary(k) {
                let b = le(d, int32);
                i["parameters"] = json!({"binary_data_size": b.len()});
                bin.extend_from_slice(&b);
            } else {
                i["data"] = json_data(d);
            }
            i
        })
        .collect();
    json!({ "inputs": inputs })
}

fn kserve(out: &mut Vec<Seed>) {
    let mut put = |name: &str, body: String| out.push(("kserve_json", name.into(), body.into()));
    let none = &mut Vec::new();
    put(
        "seed-dlrm-1-sample.json",
        kserve_body(&dlrm_tensors(1), false, |_| false, none).to_string(),
    );
    let mut two = kserve_body(&dlrm_tensors(2), true, |_| false, none);
    two["id"] = json!("req-7");
    two["parameters"] = json!({"timeout": 5000, "binary_data_output": false});
    two["outputs"] = json!([{"name": "scores", "parameters": {"binary_data": true}}]);
    put("seed-dlrm-2-samples-int32-params.json", two.to_string());
    // A name with an escape: serde_json's path, not the fast path.
    let escaped = kserve_body(&dlrm_tensors(1), false, |_| false, none)
        .to_string()
        .replacen("\"dense\"", "\"d\\u0065nse\"", 1);
    put("seed-dlrm-escaped-name.json", escaped);
    put(
        "seed-hstu-2-users.json",
        kserve_body(&hstu_tensors(&users()), false, |_| false, none).to_string(),
    );
    let wrong = kserve_body(&dlrm_tensors(1), false, |_| false, none)
        .to_string()
        .replacen("[1,13]", "[1,12]", 1);
    put("seed-near-dense-shape.json", wrong);
    put("seed-near-no-inputs.json", r#"{"inputs": []}"#.into());
}

/// A body of the binary extension, framed as the `binary_tensor` target reads it.
fn framed_binary(json: &Value, bin: &[u8]) -> Vec<u8> {
    let j = json.to_string();
    let mut out = (j.len() as u16).to_le_bytes().to_vec();
    out.extend_from_slice(j.as_bytes());
    out.extend_from_slice(bin);
    out
}

fn binary(out: &mut Vec<Seed>) {
    let mut put = |name: &str, b: Vec<u8>| out.push(("binary_tensor", name.into(), b));
    let mut bin = Vec::new();
    let j = kserve_body(&dlrm_tensors(2), false, |_| true, &mut bin);
    put("seed-dlrm-2-samples-all-binary", framed_binary(&j, &bin));
    let mut bin = Vec::new();
    let j = kserve_body(&dlrm_tensors(1), true, |k| k % 2 == 0, &mut bin);
    put("seed-dlrm-1-sample-int32-mixed", framed_binary(&j, &bin));
    let mut bin = Vec::new();
    let j = kserve_body(&hstu_tensors(&users()[..1]), false, |_| true, &mut bin);
    put("seed-hstu-1-user-all-binary", framed_binary(&j, &bin));
    let mut bin = Vec::new();
    let j = kserve_body(&dlrm_tensors(1), false, |_| true, &mut bin);
    bin.truncate(bin.len() - 3);
    put("seed-near-binary-cut-short", framed_binary(&j, &bin));
}

/// A `ModelInferRequest` of `t`: typed contents, or raw contents.
fn grpc_request(t: &Tensors, int32: bool, raw: bool) -> Vec<u8> {
    let mut req = pb::ModelInferRequest {
        model_name: "default".into(),
        ..Default::default()
    };
    for (name, shape, d) in t {
        let contents = match d {
            Data::F(v) => InferTensorContents {
                fp32_contents: v.clone(),
                ..Default::default()
            },
            Data::I(v) if int32 => InferTensorContents {
                int_contents: v.iter().map(|&x| x as i32).collect(),
                ..Default::default()
            },
            Data::I(v) => InferTensorContents {
                int64_contents: v.clone(),
                ..Default::default()
            },
        };
        req.inputs.push(InferInputTensor {
            name: name.clone(),
            datatype: datatype(d, int32).into(),
            shape: shape.clone(),
            contents: (!raw).then_some(contents),
            ..Default::default()
        });
        if raw {
            req.raw_input_contents.push(le(d, int32).into());
        }
    }
    req.encode_to_vec()
}

fn protobuf(out: &mut Vec<Seed>) {
    let mut put = |name: &str, b: Vec<u8>| out.push(("protobuf_infer", name.into(), b));
    put(
        "seed-dlrm-2-samples-contents",
        grpc_request(&dlrm_tensors(2), false, false),
    );
    put(
        "seed-dlrm-1-sample-raw-int32",
        grpc_request(&dlrm_tensors(1), true, true),
    );
    let users = users();
    put(
        "seed-hstu-1-user-raw",
        grpc_request(&hstu_tensors(&users[..1]), false, true),
    );
    put(
        "seed-hstu-2-users-contents",
        grpc_request(&hstu_tensors(&users), false, false),
    );
    let mut short = dlrm_tensors(1);
    short.pop();
    put(
        "seed-near-missing-input",
        grpc_request(&short, false, false),
    );
}

/// A made-up Criteo row: label, 13 integers (some empty or negative), 26 hex categoricals
/// (some empty).
fn criteo_row(s: usize) -> String {
    let mut f = vec![(s % 2).to_string()];
    f.extend((0..13).map(|k| match (s + k) % 5 {
        0 => String::new(),
        1 => "-1".into(),
        v => (v * 37 * (k + 1)).to_string(),
    }));
    f.extend((0..26).map(|k| match (s * 26 + k) % 7 {
        0 => String::new(),
        _ => format!(
            "{:08x}",
            (s as u64 + 1) * 0x9e37_79b9 * (k as u64 + 1) % (1 << 32)
        ),
    }));
    f.join("\t")
}

fn criteo(out: &mut Vec<Seed>) {
    let mut put = |name: &str, text: String| out.push(("criteo_tsv", name.into(), text.into()));
    let rows: Vec<String> = (0..3).map(criteo_row).collect();
    put("seed-3-rows.tsv", rows.join("\n") + "\n");
    put(
        "seed-short-rows-crlf.tsv",
        "0\t\t5\t\t\t\t\t\t\t\t\t\t\t\t\tff\r\n1\r\n0\t1\t2\n".into(),
    );
    put(
        "seed-near-bad-label-line-2.tsv",
        format!("{}\n2\t1\n{}\n", rows[0], rows[1]),
    );
    put("seed-near-41-fields.tsv", format!("{}\textra\n", rows[2]));
    let unlabelled: Vec<&str> = rows.iter().map(|r| r.split_once('\t').unwrap().1).collect();
    put("seed-near-unlabelled.tsv", unlabelled.join("\n"));
}

/// The DLRM's samples as `/v1/score` JSON objects.
fn dlrm_json(n: usize) -> Vec<Value> {
    let spec = dlrm();
    let t = dlrm_tensors(n);
    let Data::F(dense) = &t[0].2 else {
        unreachable!()
    };
    let d = spec.dense_in();
    (0..n)
        .map(|s| {
            let mut sparse = serde_json::Map::new();
            for (f, name) in spec.features().iter().enumerate() {
                let (Data::I(lengths), Data::I(ids)) = (&t[1 + 2 * f].2, &t[2 + 2 * f].2) else {
                    unreachable!()
                };
                let start: i64 = lengths[..s].iter().sum();
                let bag = &ids[start as usize..(start + lengths[s]) as usize];
                sparse.insert(name.clone(), json!(bag));
            }
            json!({"dense": &dense[s * d..(s + 1) * d], "sparse": sparse})
        })
        .collect()
}

fn json_lines(out: &mut Vec<Seed>) {
    let mut put = |name: &str, text: String| out.push(("json_lines", name.into(), text.into()));
    let samples = dlrm_json(3);
    let lines: Vec<String> = samples.iter().map(Value::to_string).collect();
    put("seed-dlrm-3-samples.jsonl", lines.join("\n") + "\n");
    put(
        "seed-dlrm-array-crlf-blank.jsonl",
        format!("{}\r\n\n  \n{}", json!(samples[..2]), lines[2]),
    );
    let users: Vec<String> = users().iter().map(Value::to_string).collect();
    put("seed-hstu-2-users.jsonl", users.join("\n") + "\n");
    let mut missing = samples[0].clone();
    missing["sparse"].as_object_mut().unwrap().remove("C7");
    put("seed-near-missing-feature.jsonl", missing.to_string());
}

/// The `.npy` members of `n` samples: dense float64 (or float32), lengths int32, ids int64,
/// labels when asked.
fn npy_members(n: usize, f64_dense: bool, labels: bool) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, shape, d) in dlrm_tensors(n) {
        let shape: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
        let member = match &d {
            Data::F(v) if f64_dense => {
                let b: Vec<u8> = v.iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect();
                npy("<f8", &shape, &b)
            }
            Data::F(_) => npy("<f4", &shape, &le(&d, false)),
            Data::I(_) if name.ends_with("_lengths") => npy("<i4", &shape, &le(&d, true)),
            Data::I(_) => npy("<i8", &shape, &le(&d, false)),
        };
        out.push((format!("{name}.npy"), member));
    }
    if labels {
        let l: Vec<u8> = (0..n)
            .flat_map(|s| ((s % 2) as f32).to_le_bytes())
            .collect();
        out.push(("label.npy".into(), npy("<f4", &[n], &l)));
    }
    out
}

fn zip_of(members: &[(String, Vec<u8>)], deflate: bool) -> Vec<u8> {
    let method = match deflate {
        true => zip::CompressionMethod::Deflated,
        false => zip::CompressionMethod::Stored,
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in members {
        z.start_file(name.as_str(), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// Members framed as the `npz` target reads them (`checks::npz_bytes`).
fn framed_members(members: &[(String, Vec<u8>)], deflate: bool) -> Vec<u8> {
    let mut out = vec![u8::from(deflate)];
    for (name, bytes) in members {
        for piece in [name.as_bytes(), bytes] {
            out.extend((piece.len() as u16).to_le_bytes());
            out.extend_from_slice(piece);
        }
    }
    out
}

fn npz(out: &mut Vec<Seed>) {
    let mut put = |name: &str, b: Vec<u8>| out.push(("npz", name.into(), b));
    put(
        "seed-zip-stored-2-samples.npz",
        zip_of(&npy_members(2, true, true), false),
    );
    put(
        "seed-zip-deflated-3-samples.npz",
        zip_of(&npy_members(3, false, false), true),
    );
    put(
        "seed-framed-stored-2-samples",
        framed_members(&npy_members(2, false, true), false),
    );
    put(
        "seed-framed-deflated-1-sample",
        framed_members(&npy_members(1, true, false), true),
    );
    let mut skew = npy_members(2, false, false);
    skew[1].1 = npy("<i4", &[2], &[3, 0, 0, 0, 0, 0, 0, 0]); // C1's lengths count 3 ids of 1
    put(
        "seed-near-framed-lengths-skewed",
        framed_members(&skew, false),
    );
}

/// A safetensors file of `n` samples: dense float32 (or float64), lengths int64, ids int32,
/// labels float32.
fn safetensors_file(n: usize, f64_dense: bool) -> Vec<u8> {
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape, d) in dlrm_tensors(n) {
        let shape: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
        let (dt, b) = match &d {
            Data::F(v) if f64_dense => (
                Dtype::F64,
                v.iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect(),
            ),
            Data::F(_) => (Dtype::F32, le(&d, false)),
            Data::I(_) if name.ends_with("_ids") => (Dtype::I32, le(&d, true)),
            Data::I(_) => (Dtype::I64, le(&d, false)),
        };
        owned.push((name, dt, shape, b));
    }
    let labels: Vec<u8> = (0..n)
        .flat_map(|s| ((s % 2) as f32).to_le_bytes())
        .collect();
    owned.push(("label".into(), Dtype::F32, vec![n], labels));
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, shape, b)| (n.clone(), TensorView::new(*d, shape.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

fn safetensors(out: &mut Vec<Seed>) {
    let mut put = |name: &str, b: Vec<u8>| out.push(("safetensors", name.into(), b));
    put("seed-2-samples.safetensors", safetensors_file(2, false));
    put("seed-1-sample-f64.safetensors", safetensors_file(1, true));
    let mut cut = safetensors_file(1, false);
    cut.truncate(cut.len() - 5);
    put("seed-near-cut-short.safetensors", cut);
}

fn resp(out: &mut Vec<Seed>) {
    let mut put = |name: &str, b: &[u8]| out.push(("resp", name.into(), b.to_vec()));
    put("seed-ok", b"+OK\r\n");
    put("seed-moved", b"-MOVED 3999 127.0.0.1:6381\r\n");
    put("seed-int-bulk-nil", b":-42\r\n$5\r\nhello\r\n$-1\r\n");
    put(
        "seed-nested-array",
        b"*3\r\n$3\r\nabc\r\n*2\r\n:1\r\n*-1\r\n+PONG\r\n",
    );
    put("seed-bulk-of-crlf", b"$4\r\n\r\n\r\n\r\n");
    put("seed-near-partial-array", b"*2\r\n:1\r\n");
    let mut many = Vec::new();
    for k in 0..8 {
        let row: Vec<u8> = (0..16).map(|b| (b * 17 + k) as u8).collect();
        many.extend(format!("${}\r\n", row.len()).as_bytes());
        many.extend(&row);
        many.extend(b"\r\n");
    }
    put("seed-getrange-pipeline", &many);
    put(
        "seed-err-unknown-command",
        b"-ERR unknown command 'EMBER.POOL'\r\n",
    );
    put("seed-near-resp3-map", b"%1\r\n+a\r\n:1\r\n");
}

/// An `EMBER.POOL` input framed as the `pool_args` target reads it: the arguments, then each
/// block's value (`None`: not on the node).
fn pool_input(args: &[&[u8]], blocks: &[Option<Vec<u8>>]) -> Vec<u8> {
    let mut out = vec![args.len() as u8];
    for a in args {
        out.extend((a.len() as u16).to_le_bytes());
        out.extend_from_slice(a);
    }
    for b in blocks {
        match b {
            Some(b) => {
                out.extend((b.len() as u16).to_le_bytes());
                out.extend_from_slice(b);
            }
            None => out.extend(0xFFFFu16.to_le_bytes()),
        }
    }
    out
}

/// A call of `dtype` rows of `dim` over blocks of `rpb` rows (block `b` holds made-up rows),
/// bags of rows given as (block, row in block, weight); `present(b)`: whether block `b` is on
/// the node; `short`: the last block cut to 3 bytes.
fn pool_call(
    dtype: DType,
    dim: usize,
    rpb: usize,
    bags: &[&[(u32, u32, f32)]],
    weighted: bool,
    present: impl Fn(u32) -> bool,
    short: bool,
) -> Vec<u8> {
    let mut call = CallBuilder::default();
    let mut blocks: Vec<u32> = Vec::new();
    for bag in bags {
        for &(b, r, w) in *bag {
            call.row(b, r, weighted.then_some(w));
            if !blocks.contains(&b) {
                blocks.push(b);
            }
        }
        call.end_bag();
    }
    let (d, r) = (dim.to_string(), rpb.to_string());
    let args = call.args(b"ember:default:v1:t0:", dtype.name(), &d, &r, weighted);
    let rb = dtype.row_bytes(dim);
    let mut values: Vec<Option<Vec<u8>>> = blocks
        .iter()
        .map(|&b| {
            present(b).then(|| {
                let mut v = vec![0u8; rpb * rb];
                for row in 0..rpb {
                    let x: Vec<f32> = (0..dim)
                        .map(|k| ((b as usize * 31 + row * 7 + k) as f32 * 0.21).cos())
                        .collect();
                    dtype.encode_row(&x, &mut v[row * rb..(row + 1) * rb]);
                }
                v
            })
        })
        .collect();
    if let (true, Some(Some(last))) = (short, values.last_mut()) {
        last.truncate(3);
    }
    pool_input(&args, &values)
}

fn pool(out: &mut Vec<Seed>) {
    let mut put = |name: &str, b: Vec<u8>| out.push(("pool_args", name.into(), b));
    let bags: &[&[(u32, u32, f32)]] = &[&[(7, 3, 0.5), (2, 0, -1.0)], &[], &[(7, 9, 2.0)]];
    let all = |_| true;
    put(
        "seed-f32-weighted",
        pool_call(DType::F32, 4, 10, bags, true, all, false),
    );
    put(
        "seed-int8-unweighted",
        pool_call(DType::Int8, 8, 10, bags, false, all, false),
    );
    put(
        "seed-int4",
        pool_call(DType::Int4, 5, 10, bags, true, all, false),
    );
    put(
        "seed-f16",
        pool_call(DType::F16, 3, 10, bags, false, all, false),
    );
    put(
        "seed-bf16",
        pool_call(DType::BF16, 2, 10, bags, true, all, false),
    );
    put(
        "seed-near-missing-block",
        pool_call(DType::F32, 4, 10, bags, false, |b| b != 2, false),
    );
    put(
        "seed-near-short-block",
        pool_call(DType::F32, 4, 10, bags, false, all, true),
    );
    let mut six = pool_call(DType::F32, 4, 10, bags, false, all, false);
    six[0] = 6;
    put("seed-near-six-arguments", six);
}
