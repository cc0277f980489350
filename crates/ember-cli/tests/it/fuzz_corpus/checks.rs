//! The fuzz targets' properties, one function per target (`fuzz/fuzz_targets/<target>.rs`,
//! `cargo +nightly fuzz run <target>`). The fuzz crate compiles this same file (`fuzz/src/lib.rs`,
//! through `#[path]`) and `cargo test` replays the kept corpora through it (`fuzz_corpus.rs`),
//! so that an input is checked alike wherever it runs.
//!
//! Each function takes the fuzzer's bytes, panics where its property fails, and answers whether
//! the reader took the input (read it to a value, where the agreements are checked) rather than
//! refusing it: the replay holds the kept seeds to their names (`seed-near-*` refused, the
//! other seeds taken), so that a corpus that no longer reaches the readers' values fails. Every
//! decoder and
//! reader must answer a value or an error, never a panic; where there is a reference (serde_json
//! for the KServe fast path, a `serde_json::Value` tree for `/v1/score`'s JSON samples, the other
//! protocol's decoder for the same tensors, `parse_line` for the Criteo reader, the client's
//! `sum_rows` for `EMBER.POOL`'s sums, a reply decoded again for RESP), the answer must agree
//! with it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ember_model::criteo::{self, CriteoBatch, CriteoReader};
use ember_model::serving::Request;
use ember_model::{LoadOptions, Samples};
use ember_pool_command::{self as pool, PoolCall, RefusalCode};
use ember_redis::{Conn, WireError};
use ember_serve::grpc::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use ember_serve::grpc::pb::{self, InferTensorContents};
use ember_serve::kserve::fastjson;
use ember_serve::kserve::json::{self as kjson, InferRequest};
use ember_serve::{ModelSpec, ServeError, grpc, v1};
use prost::Message;
use serde_json::{Value, json};

/// `ember predict`'s reader of `.npz` and safetensors files, a module of the `ember` binary
/// compiled here as well (the binary has no library to link): what the checks do not call of it
/// is dead code here.
#[allow(dead_code)]
#[path = "../../../src/predict/tensors.rs"]
mod tensors;

/// A target's check: whether the input was taken (the property itself is asserted inside).
pub type Check = fn(&[u8]) -> bool;

/// Every target: its name (the fuzz target's, and its corpus folders' under `fuzz/`) and its
/// check.
pub const TARGETS: &[(&str, Check)] = &[
    ("kserve_json", kserve_json),
    ("binary_tensor", binary_tensor),
    ("protobuf_infer", protobuf_infer),
    ("criteo_tsv", criteo_tsv),
    ("json_lines", json_lines),
    ("npz", npz),
    ("safetensors", safetensors),
    ("resp", resp),
    ("pool_args", pool_args),
];

/// The repository's root (where `models/` is), found above the crate that compiles this file.
pub fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .find(|p| p.join("models/default/config.json").is_file())
            .expect("the repository's models/default above this crate")
            .to_path_buf()
    })
}

fn load(dir: &str, name: &str) -> ModelSpec {
    let dir = root().join(dir);
    let m = ember_model::serving::load(&dir, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    ModelSpec::of(m, name)
}

/// The shipped DLRM (`models/default`: 13 dense features, 26 tables of 2,048 rows).
pub fn dlrm() -> &'static ModelSpec {
    static S: OnceLock<ModelSpec> = OnceLock::new();
    S.get_or_init(|| load("models/default", "default"))
}

/// The small HSTU model the tests serve (`hstu_small`): users, not samples.
pub fn hstu() -> &'static ModelSpec {
    static S: OnceLock<ModelSpec> = OnceLock::new();
    S.get_or_init(|| load("crates/ember-model/tests/fixtures/hstu_small", "hstu"))
}

/// A checked request holds what it says: its pieces add up to it and, for samples, one dense
/// row and one length per feature per sample, and as many ids as the lengths count.
fn consistent(spec: &ModelSpec, r: &Request) {
    let pieces: usize = r.pieces(2).map(|p| p.len()).sum();
    assert_eq!(pieces, r.len(), "a request's pieces do not add up to it");
    if let Some(s) = r.as_any().downcast_ref::<Samples>() {
        let n = s.len();
        assert_eq!(s.dense().len(), n * spec.dense_in());
        let lengths = s.lengths();
        assert_eq!(lengths.len(), n * spec.features().len());
        let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        assert_eq!(s.ids().len() as u64, total);
    }
}

/// Two decodings of the same request agree (checked requests of either family print their
/// columns: equal text, equal requests).
fn same(a: &Request, b: &Request, what: &str) {
    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{what}");
}

/// `kserve_json`: a KServe v2 JSON body. Where the fast path (`fastjson::parse_infer`) answers,
/// serde_json reads the body too, to the same request; what serde_json reads decodes against
/// both models (`kserve::json::decode`) to a consistent request or an error.
pub fn kserve_json(data: &[u8]) -> bool {
    let reference = serde_json::from_slice::<InferRequest>(data);
    if let Some(fast) = fastjson::parse_infer(data) {
        let Ok(reference) = &reference else {
            panic!("the fast path read a body serde_json refuses: {reference:?}");
        };
        assert_eq!(
            format!("{fast:?}"),
            format!("{reference:?}"),
            "the fast path and serde_json read the body differently"
        );
    }
    let Ok(req) = &reference else {
        return false;
    };
    let _ = kjson::timeout_us(req);
    let _ = kjson::binary_output(req);
    let mut taken = false;
    for spec in [dlrm(), hstu()] {
        if let Ok(r) = kjson::decode(spec, req) {
            consistent(spec, &r);
            taken = true;
        }
    }
    taken
}

/// The first two bytes of `data` (little-endian; what is there) and the rest.
fn split_u16(data: &[u8]) -> (usize, &[u8]) {
    match data {
        [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
        _ => (0, &[]),
    }
}

/// `binary_tensor`: a body of Triton's binary tensor data extension, framed as the JSON's length
/// (2 bytes, little-endian; `Inference-Header-Content-Length`, cut to the body) and the body. It
/// is read as the server reads it (the fast path, else serde_json; then
/// `kserve::json::decode_with_binary` against both models). Where every input's values are
/// binary data, the same tensors sent over gRPC as `raw_input_contents` decode alike: both
/// refused, or the same request.
pub fn binary_tensor(data: &[u8]) -> bool {
    let (json_len, body) = split_u16(data);
    let (json, binary) = body.split_at(json_len.min(body.len()));
    let req = match fastjson::parse_infer(json) {
        Some(r) => r,
        None => match serde_json::from_slice::<InferRequest>(json) {
            Ok(r) => r,
            Err(_) => return false,
        },
    };
    let _ = kjson::timeout_us(&req);
    let _ = kjson::binary_output(&req);
    let as_grpc = raw_grpc_request(&req, binary);
    let mut taken = false;
    for spec in [dlrm(), hstu()] {
        let got = kjson::decode_with_binary(spec, &req, binary);
        if let Ok(r) = &got {
            consistent(spec, r);
            taken = true;
        }
        let Some(g) = &as_grpc else { continue };
        match (&got, grpc::decode(spec, g)) {
            (Ok(a), Ok(b)) => same(a, &b, "JSON with binary data and gRPC raw contents"),
            (Err(_), Err(_)) => {}
            (a, b) => panic!(
                "JSON with binary data and gRPC raw contents disagree: {:?} vs {:?}",
                a.as_ref().map(|r| r.len()),
                b.map(|r| r.len())
            ),
        }
    }
    taken
}

/// The gRPC request of the same tensors, when every input of `req` is binary data and their
/// sizes add up to `binary`.
fn raw_grpc_request(req: &InferRequest, binary: &[u8]) -> Option<pb::ModelInferRequest> {
    let mut at = 0usize;
    let mut inputs = Vec::new();
    let mut raw = Vec::new();
    for i in &req.inputs {
        if i.data.is_some() {
            return None;
        }
        let size = i.parameters.as_ref()?.binary_data_size.as_ref()?.as_u64()?;
        let end = at
            .checked_add(usize::try_from(size).ok()?)
            .filter(|&e| e <= binary.len())?;
        inputs.push(InferInputTensor {
            name: i.name.to_string(),
            datatype: i.datatype.to_string(),
            shape: i.shape.to_vec(),
            ..Default::default()
        });
        raw.push(bytes::Bytes::copy_from_slice(&binary[at..end]));
        at = end;
    }
    (at == binary.len()).then(|| pb::ModelInferRequest {
        model_name: "m".into(),
        inputs,
        raw_input_contents: raw,
        outputs: req
            .outputs
            .iter()
            .flatten()
            .map(|o| InferRequestedOutputTensor {
                name: o.name.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

/// `protobuf_infer`: a `ModelInferRequest` on the wire. What prost reads decodes against both
/// models (`grpc::decode`) to a consistent request or an error; a request it takes, sent as
/// KServe JSON (contents as `data`, raw contents as binary data), decodes to the same request.
pub fn protobuf_infer(data: &[u8]) -> bool {
    let Ok(req) = pb::ModelInferRequest::decode(data) else {
        return false;
    };
    let mut taken = false;
    for spec in [dlrm(), hstu()] {
        let Ok(r) = grpc::decode(spec, &req) else {
            continue;
        };
        consistent(spec, &r);
        taken = true;
        let Some((body, binary)) = json_request(&req) else {
            continue;
        };
        let json: InferRequest = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("the JSON written from a gRPC request is refused: {e}"));
        match kjson::decode_with_binary(spec, &json, &binary) {
            Ok(j) => same(&r, &j, "gRPC and the same tensors as KServe JSON"),
            Err(e) => panic!("gRPC took a request that JSON refuses: {e}"),
        }
    }
    taken
}

/// `req` as a KServe JSON body and its binary data: raw contents as binary data, typed contents
/// as `data` (the field its datatype reads; `None` for other datatypes).
fn json_request(req: &pb::ModelInferRequest) -> Option<(Vec<u8>, Vec<u8>)> {
    let raw = !req.raw_input_contents.is_empty();
    let mut binary = Vec::new();
    let mut inputs = Vec::new();
    for (k, t) in req.inputs.iter().enumerate() {
        let mut input = json!({"name": t.name, "datatype": t.datatype, "shape": t.shape});
        if raw {
            let b = req.raw_input_contents.get(k)?;
            input["parameters"] = json!({"binary_data_size": b.len()});
            binary.extend_from_slice(b);
        } else {
            let empty = InferTensorContents::default();
            let c = t.contents.as_ref().unwrap_or(&empty);
            input["data"] = match t.datatype.as_str() {
                "FP32" => json!(c.fp32_contents),
                "INT32" => json!(c.int_contents),
                "INT64" => json!(c.int64_contents),
                _ => return None,
            };
        }
        inputs.push(input);
    }
    let outputs: Vec<Value> = req
        .outputs
        .iter()
        .map(|o| json!({"name": o.name}))
        .collect();
    let body = json!({"inputs": inputs, "outputs": outputs});
    Some((serde_json::to_vec(&body).expect("JSON"), binary))
}

/// `criteo_tsv`: a Criteo TSV file. `CriteoReader` (what `ember predict` streams) reads it to
/// the rows `parse_line` makes of its lines one by one, or to the error of the first line
/// `parse_line` refuses; a refused line leaves the batch as it was and its error names the file
/// and the line; `/v1/score`'s TSV decoder answers a consistent request or an error.
pub fn criteo_tsv(data: &[u8]) -> bool {
    let mut reader = CriteoReader::new(data, "f.tsv");
    let mut read = CriteoBatch::default();
    let streamed = reader.next_batch(usize::MAX, &mut read);
    if let Ok(text) = std::str::from_utf8(data) {
        let mut rows = CriteoBatch::default();
        let mut by_lines = Ok(());
        for (k, line) in text.split_terminator('\n').enumerate() {
            let before = rows.clone();
            if let Err(e) = criteo::parse_line(line, "f.tsv", k as u64 + 1, &mut rows) {
                assert_eq!(rows, before, "a refused line changed the batch");
                let msg = e.to_string();
                assert!(
                    msg.contains("f.tsv") && msg.contains(&format!("line {}", k + 1)),
                    "{msg}"
                );
                by_lines = Err(msg);
                break;
            }
        }
        match (&streamed, by_lines) {
            (Ok(n), Ok(())) => {
                assert_eq!(*n, rows.len());
                assert_eq!(read, rows, "the reader and parse_line read different rows");
                assert_eq!(reader.bytes_read(), data.len() as u64);
            }
            (Err(e), Err(msg)) => assert_eq!(e.to_string(), msg),
            (s, l) => panic!("the reader ({s:?}) and parse_line ({l:?}) disagree"),
        }
    }
    if let Ok(n) = &streamed {
        let n = *n;
        assert_eq!((read.dense.len(), read.cats.len()), (n * 13, n * 26));
        let names: Vec<String> = (1..=26).map(|i| format!("C{i}")).collect();
        let rows: Vec<usize> = (1..=26).collect();
        let kj = read.sparse(&names, &rows).expect("26 features");
        assert_eq!(kj.batch_size(), n);
    }
    for labels in [true, false] {
        if let Ok(r) = v1::decode_tsv(dlrm(), data, labels) {
            consistent(dlrm(), &r);
        }
    }
    streamed.is_ok()
}

/// `json_lines`: a JSON-lines file of `ember predict` (and `/v1/score`'s JSON). Each line is
/// decoded as `ember predict` decodes it, by `v1::decode_json_any`, against both models: a
/// consistent request or an error. For the DLRM, a line the streaming decoder takes is read to
/// the same samples from a `serde_json::Value` tree as the format describes them. (`predict`
/// first takes a `"label"` out of a line: that step is private to the binary's `jsonl.rs`, not
/// driven here.)
pub fn json_lines(data: &[u8]) -> bool {
    let (mut lines, mut taken) = (0, 0);
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Ok(text) = std::str::from_utf8(line) else {
            return false; // `BufRead::lines` stops at a line that is not UTF-8
        };
        if text.trim().is_empty() {
            continue;
        }
        lines += 1;
        if let Ok(r) = v1::decode_json_any(hstu(), line) {
            consistent(hstu(), &r);
            taken += 1;
        }
        let Ok(r) = v1::decode_json_any(dlrm(), line) else {
            continue;
        };
        consistent(dlrm(), &r);
        taken += 1; // no line is both a user and samples
        match samples_by_tree(dlrm(), line) {
            Some(Ok(t)) => same(&r, &t, "the streaming decoder and the Value tree"),
            Some(Err(e)) => panic!("the streaming decoder took samples the tree refuses: {e}"),
            None => panic!("the streaming decoder took a line that is not samples"),
        }
    }
    lines > 0 && taken == lines
}

/// `/v1/score`'s JSON samples (`{"dense": [...], "sparse": {"<feature>": [ids]}}`, one or an
/// array) read from a `serde_json::Value` tree and checked: `None` where the body is not that
/// shape.
fn samples_by_tree(spec: &ModelSpec, body: &[u8]) -> Option<Result<Request, ServeError>> {
    let items = match serde_json::from_slice(body).ok()? {
        Value::Array(a) => a,
        o @ Value::Object(_) => vec![o],
        _ => return None,
    };
    let nf = spec.features().len();
    let mut dense = Vec::new();
    // Per feature, per sample: the bag.
    let mut bags: Vec<Vec<Vec<i64>>> = vec![Vec::new(); nf];
    for item in &items {
        let o = item.as_object()?;
        let row = o.get("dense")?.as_array()?;
        let sparse = o.get("sparse")?.as_object()?;
        if o.len() != 2 || row.len() != spec.dense_in() || sparse.len() != nf {
            return None;
        }
        for x in row {
            dense.push(x.as_f64()? as f32);
        }
        for (f, name) in spec.features().iter().enumerate() {
            let ids = sparse.get(name)?.as_array()?.iter().map(Value::as_i64);
            bags[f].push(ids.collect::<Option<Vec<_>>>()?);
        }
    }
    let lengths: Vec<u32> = bags.iter().flatten().map(|b| b.len() as u32).collect();
    let mut ids = spec.new_ids(0);
    bags.iter().flatten().flatten().for_each(|&id| ids.push(id));
    Some(spec.check(items.len(), dense, lengths, ids))
}

/// Reads framed pieces: `[length: u16 LE][bytes]` each, the last cut to what is left.
struct Frames<'a>(&'a [u8]);

impl<'a> Frames<'a> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    /// The next piece: `None` for the length 0xFFFF (an absent value).
    fn piece(&mut self) -> Option<&'a [u8]> {
        let (n, rest) = split_u16(self.0);
        if n == 0xFFFF {
            self.0 = rest;
            return None;
        }
        let (piece, rest) = rest.split_at(n.min(rest.len()));
        self.0 = rest;
        Some(piece)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The `.npz` bytes of an `npz` input: the input itself where it starts as a zip file does
/// (`PK`); else a zip written here of the members it frames (a first byte whose lowest bit asks
/// for deflate, then per member its name and its `.npy` bytes as [`Frames`]), so that changes
/// to a member's bytes reach the reader past the zip's checksums. `None` where the zip cannot
/// be written (two members of one name).
fn npz_bytes(data: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    if data.starts_with(b"PK") {
        return Some(data.to_vec());
    }
    let mut f = Frames(data);
    let method = match f.byte() & 1 {
        1 => zip::CompressionMethod::Deflated,
        _ => zip::CompressionMethod::Stored,
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    while !f.is_empty() {
        let name = String::from_utf8_lossy(f.piece().unwrap_or_default()).into_owned();
        let bytes = f.piece().unwrap_or_default();
        z.start_file(name, opts).ok()?;
        z.write_all(bytes).ok()?;
    }
    Some(z.finish().ok()?.into_inner())
}

/// `npz`: a NumPy `.npz` of a model's inputs (see [`npz_bytes`] for the framing).
/// [`tensor_file`] says what is checked.
pub fn npz(data: &[u8]) -> bool {
    npz_bytes(data).is_some_and(|bytes| tensor_file(bytes, true))
}

/// `safetensors`: a safetensors file of a model's inputs. [`tensor_file`] says what is checked.
pub fn safetensors(data: &[u8]) -> bool {
    tensor_file(data.to_vec(), false)
}

/// A tensor file read as `ember predict` reads it (`TensorFile::from_bytes`, `check` against
/// the DLRM, `labels`, then `batch` after `batch`): errors or values, never a panic; the labels
/// one per sample; the samples of batches of 1 and of 3 equal to those of the whole file read
/// at once, cut the same way, and refused where it is.
fn tensor_file(bytes: Vec<u8>, npz: bool) -> bool {
    let spec = dlrm();
    let Ok(file) = tensors::TensorFile::from_bytes(bytes, npz) else {
        return false;
    };
    let Ok(n) = file.check(spec) else {
        return false;
    };
    if let Ok(Some(labels)) = file.labels() {
        assert_eq!(labels.len(), n, "labels");
    }
    let nf = spec.features().len();
    if n == 0 {
        return true; // `predict` reads no batch
    }
    let whole = file.batch(spec, &mut vec![0; nf], 0..n);
    if let Ok(w) = &whole {
        assert_eq!(w.len(), n);
    }
    for step in [1, 3] {
        let mut cursors = vec![0; nf];
        let batches: Result<Vec<Samples>, _> = (0..n)
            .step_by(step)
            .map(|s0| file.batch(spec, &mut cursors, s0..(s0 + step).min(n)))
            .collect();
        match (&whole, batches) {
            (Ok(w), Ok(b)) => {
                let want: Vec<Samples> = w.pieces(step).collect();
                assert!(b == want, "batches of {step} differ from the whole file's");
            }
            (Err(_), Err(_)) => {}
            (w, b) => panic!(
                "the whole file ({}) and batches of {step} ({}) disagree",
                w.is_ok(),
                b.is_ok()
            ),
        }
    }
    whole.is_ok()
}

fn is_protocol_error(e: &WireError) {
    assert!(e.1.starts_with("protocol error"), "{e:?}");
}

/// `resp`: bytes a Redis node sent, read reply after reply as a connection reads its buffer
/// (`Conn::parse_buffered`). Each reply is whole (its length) or not yet, or a protocol error;
/// a whole one is decoded to that same length, or refused as a protocol error, and handed out as
/// decoded; every shorter prefix of it is not whole yet; its value written again as RESP reads
/// back to itself.
pub fn resp(data: &[u8]) -> bool {
    let mut rest = data;
    for _ in 0..64 {
        let (n, handed, decoded) = match Conn::parse_buffered(rest) {
            Err(e) => {
                is_protocol_error(&e);
                return false;
            }
            Ok(None) => return rest.is_empty(),
            Ok(Some(p)) => p,
        };
        assert!(0 < n && n <= rest.len());
        let (v, len) = match decoded {
            Ok(d) => d,
            Err(e) => {
                is_protocol_error(&e);
                assert!(handed.is_err(), "handed out a reply decode refuses");
                return false;
            }
        };
        assert_eq!(len, n, "complete and decode measure the reply differently");
        assert_eq!(handed.as_ref().ok(), Some(&v), "the reply handed out");
        if n <= 1024 {
            for cut in 0..n {
                let p = Conn::parse_buffered(&rest[..cut]);
                assert!(matches!(p, Ok(None)), "a prefix of {cut} bytes: {p:?}");
            }
        }
        let mut again = Vec::new();
        v.write_resp(&mut again);
        match Conn::parse_buffered(&again) {
            Ok(Some((m, Ok(h), Ok((w, k))))) => {
                assert_eq!((m, k), (again.len(), again.len()));
                assert_eq!((&h, &w), (&v, &v), "written again, read back");
            }
            other => panic!("{v:?} written again reads as {other:?}"),
        }
        rest = &rest[n..];
    }
    rest.is_empty()
}

/// `pool_args`: an `EMBER.POOL` call as the Redis module runs it. The input frames (see
/// [`Frames`]) a count of arguments (the first byte, mod 10), the arguments, then the value of
/// each block the call names (a 0xFFFF length: not on the node). `PoolCall::parse` takes the
/// call or refuses it as `BADCALL`; `sum_bags` answers the reply's bytes or refuses (`BADCALL`,
/// `MISSING`, `SHORT`), and its sums are, bit for bit, the client's own (`sum_rows`, its
/// fallback for a node without the module) over the same rows.
pub fn pool_args(data: &[u8]) -> bool {
    let mut f = Frames(data);
    let k = f.byte() % 10;
    let args: Vec<&[u8]> = (0..k).map(|_| f.piece().unwrap_or_default()).collect();
    let call = match PoolCall::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e.code, RefusalCode::BadCall, "{e}");
            assert!(e.to_string().starts_with("BADCALL EMBER.POOL: "), "{e}");
            return false;
        }
    };
    assert!((1..=pool::MAX_DIM).contains(&call.dim));
    assert!(call.reply_bytes() <= pool::MAX_REPLY);
    let mut key = Vec::new();
    for i in 0..call.n_blocks() {
        call.block_key(i, &mut key);
        assert!(key.starts_with(call.prefix));
    }
    let blocks: Vec<Option<&[u8]>> = (0..call.n_blocks()).map(|_| f.piece()).collect();
    let (mut out, mut scratch) = (Vec::new(), Vec::new());
    if let Err(e) = pool::sum_bags(&call, &blocks, &mut out, &mut scratch) {
        let codes = [
            RefusalCode::BadCall,
            RefusalCode::Missing,
            RefusalCode::Short,
        ];
        assert!(codes.contains(&e.code), "{e}");
        return false;
    }
    assert_eq!(out.len(), call.reply_bytes());
    let reference: Vec<u8> = sums_by_rows(&args, &call, &blocks)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert!(
        out == reference,
        "the module's sums and the client's differ"
    );
    true
}

/// A call's sums as the client computes them from the rows it read (`sum_rows`), the rows found
/// from the call's own arguments.
fn sums_by_rows(args: &[&[u8]], call: &PoolCall<'_>, blocks: &[Option<&[u8]>]) -> Vec<f32> {
    let words = |b: &[u8]| -> Vec<u32> {
        b.chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    };
    let bags = words(args[5]);
    let rows = words(args[6]);
    let weights: Option<Vec<f32>> = args.get(7).map(|w| {
        w.chunks_exact(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    });
    let rb = call.dtype.row_bytes(call.dim);
    let row = |k: usize| {
        let (b, r) = (rows[2 * k] as usize, rows[2 * k + 1] as usize);
        let block = blocks[b].expect("summed by the module: on the node");
        &block[r * rb..(r + 1) * rb]
    };
    let (mut out, mut scratch) = (Vec::new(), Vec::new());
    pool::sum_rows(
        call.dtype,
        call.dim,
        &bags,
        weights.as_deref(),
        &mut out,
        &mut scratch,
        row,
    );
    out
}
