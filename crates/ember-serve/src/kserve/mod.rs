//! The KServe v2 (Triton) inference protocol, the part both wire forms share: model metadata,
//! the model/version check, the input tensors' rules and their decoding into checked samples,
//! little-endian tensor bytes, the `scores` output.
//!
//! A model's inputs: `dense`, FP32 `[N, dense_in]`; for every sparse feature `F`, `F_lengths`
//! (INT32 or INT64 `[N]`: ids per sample) and `F_ids` (INT64 or INT32 `[sum of lengths]`, sample
//! by sample). Its output: `scores`, FP32 `[N]`, the predicted probabilities. The wire forms:
//! [`json`] (HTTP, with Triton's binary tensor data extension, and [`fastjson`], a fast path for
//! plain requests) and [`crate::grpc`] (protobuf); each implements [`Tensor`] over its inputs
//! and calls [`decode_tensors`].

pub mod fastjson;
pub mod json;
pub mod values;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Result, ServeError};
use crate::spec::ModelSpec;
use ember_model::{Ids, Samples};

/// A tensor's description in model metadata.
#[derive(Debug, Serialize)]
pub struct TensorMeta {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
    /// For `<feature>_ids`: `{"rows": N}`, the size of the table (ids run from 0 to N - 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// `GET /v2/models/{name}` body.
#[derive(Debug, Serialize)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: &'static str,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
}

/// The protocol extensions the server supports, as Triton names them in its server metadata
/// (gRPC leaves out `binary_tensor_data`, an HTTP extension).
pub const EXTENSIONS: &[&str] = &[
    "model_repository",
    "statistics",
    "model_configuration",
    "binary_tensor_data",
];

/// The output's name.
pub const SCORES: &str = "scores";

/// The metadata of the model `spec` describes, served as `version`.
pub fn metadata(spec: &ModelSpec, version: &str) -> ModelMetadata {
    let mut inputs = vec![TensorMeta {
        name: "dense".into(),
        datatype: "FP32",
        shape: vec![-1, spec.dense_in() as i64],
        parameters: None,
    }];
    for (f, &rows) in spec.features().iter().zip(&spec.inputs.rows) {
        inputs.push(TensorMeta {
            name: format!("{f}_lengths"),
            datatype: "INT64",
            shape: vec![-1],
            parameters: None,
        });
        inputs.push(TensorMeta {
            name: format!("{f}_ids"),
            datatype: "INT64",
            shape: vec![-1],
            parameters: Some(serde_json::json!({ "rows": rows })),
        });
    }
    ModelMetadata {
        name: spec.name.clone(),
        versions: vec![version.into()],
        platform: "ember",
        inputs,
        outputs: vec![TensorMeta {
            name: SCORES.into(),
            datatype: "FP32",
            shape: vec![-1],
            parameters: None,
        }],
    }
}

/// An input tensor of either wire form (JSON or protobuf), as the decoder reads it.
pub trait Tensor {
    fn name(&self) -> &str;
    fn datatype(&self) -> &str;
    fn shape(&self) -> &[i64];
    /// Appends the tensor's `want` values (its datatype is FP32) to `out`.
    fn read_floats(&self, want: usize, out: &mut Vec<f32>) -> Result<()>;
    /// Appends the tensor's `want` values (its datatype is INT64 or INT32) to `out`.
    fn read_ints<S: IntSink>(&self, want: usize, out: &mut S) -> Result<()>;
    /// How many values its data holds as its datatype reads them (unchecked: for sizing).
    fn count(&self) -> usize;
}

/// Bytes per value of a datatype read from raw bytes (0 for others).
pub fn width(datatype: &str) -> usize {
    match datatype {
        "FP32" | "INT32" => 4,
        "INT64" => 8,
        _ => 0,
    }
}

/// Where integers are read to: a list of lengths, or the request's ids (32-bit when the
/// model's tables allow, [`ModelSpec::new_ids`]).
pub trait IntSink {
    fn reserve_ints(&mut self, n: usize);
    fn push_int(&mut self, v: i64);
}

impl IntSink for Vec<i64> {
    fn reserve_ints(&mut self, n: usize) {
        self.reserve(n);
    }
    fn push_int(&mut self, v: i64) {
        self.push(v);
    }
}

impl IntSink for Ids {
    fn reserve_ints(&mut self, n: usize) {
        match self {
            Ids::U32(v) => v.reserve(n),
            Ids::I64(v) => v.reserve(n),
        }
    }
    fn push_int(&mut self, v: i64) {
        self.push(v);
    }
}

/// `raw` as `want` little-endian values of `W` bytes each; `field` says where the bytes were
/// (for the error).
pub fn le_values<'r, const W: usize>(
    t: &impl Tensor,
    field: &str,
    raw: &'r [u8],
    want: usize,
) -> Result<&'r [[u8; W]]> {
    let (chunks, rest) = raw.as_chunks::<W>();
    if chunks.len() != want || !rest.is_empty() {
        return Err(ServeError::bad(format!(
            "input '{}': {field} has {} bytes but its shape {:?} of {} holds {want} values \
             ({} bytes)",
            t.name(),
            raw.len(),
            t.shape(),
            t.datatype(),
            want.saturating_mul(W)
        )));
    }
    Ok(chunks)
}

/// Little-endian FP32 values appended to `out`.
pub fn le_floats(
    t: &impl Tensor,
    field: &str,
    raw: &[u8],
    want: usize,
    out: &mut Vec<f32>,
) -> Result<()> {
    let v = le_values::<4>(t, field, raw, want)?;
    out.extend(v.iter().map(|b| f32::from_le_bytes(*b)));
    Ok(())
}

/// Little-endian INT32 or INT64 values (by the tensor's datatype) appended to `out`.
pub fn le_ints(
    t: &impl Tensor,
    field: &str,
    raw: &[u8],
    want: usize,
    out: &mut impl IntSink,
) -> Result<()> {
    if t.datatype() == "INT32" {
        let v = le_values::<4>(t, field, raw, want)?;
        out.reserve_ints(want);
        v.iter()
            .for_each(|b| out.push_int(i64::from(i32::from_le_bytes(*b))));
    } else {
        let v = le_values::<8>(t, field, raw, want)?;
        out.reserve_ints(want);
        v.iter().for_each(|b| out.push_int(i64::from_le_bytes(*b)));
    }
    Ok(())
}

/// Refuses requested outputs other than `scores`.
pub fn check_outputs<'a>(mut names: impl Iterator<Item = &'a str>) -> Result<()> {
    match names.find(|&n| n != SCORES) {
        Some(o) => Err(ServeError::bad(format!(
            "unknown output '{o}': the model's only output is '{SCORES}'"
        ))),
        None => Ok(()),
    }
}

/// Decodes the input tensors of a request (either protocol) into checked samples: each input
/// to its slot, then the dense values, every feature's lengths (their sums size the ids), and
/// the ids, each read once into its place.
pub fn decode_tensors<T: Tensor>(spec: &ModelSpec, inputs: &[T]) -> Result<Samples> {
    let slots = input_slots(spec, inputs)?;
    let (n, dense) = read_dense(spec, &slots)?;
    let (lengths, totals) = read_lengths(spec, &slots, n)?;
    let ids = read_ids(spec, &slots, &totals)?;
    spec.check(n, dense, lengths, ids)
}

/// Each input to its slot: 0 is dense, `1 + 2f` feature f's lengths, `2 + 2f` its ids. An
/// input the model does not take, or one given twice, is refused.
fn input_slots<'t, T: Tensor>(spec: &ModelSpec, inputs: &'t [T]) -> Result<Vec<Option<&'t T>>> {
    let mut slots: Vec<Option<&T>> = vec![None; 1 + 2 * spec.features().len()];
    for i in inputs {
        let Some(&k) = spec.input_slots.get(i.name()) else {
            return Err(ServeError::bad(format!(
                "unknown input '{}': the model takes 'dense' and '<feature>_lengths' / \
                 '<feature>_ids' for its {} sparse features (the model's metadata lists them)",
                i.name(),
                spec.features().len(),
            )));
        };
        if slots[k].replace(i).is_some() {
            return Err(ServeError::bad(format!(
                "input '{}' is given twice",
                i.name()
            )));
        }
    }
    Ok(slots)
}

/// The input in slot `k`; `name` says which it is when it is missing.
fn slot<'t, T>(slots: &[Option<&'t T>], k: usize, name: impl FnOnce() -> String) -> Result<&'t T> {
    slots[k].ok_or_else(|| ServeError::bad(format!("missing input '{}'", name())))
}

/// The samples' count and their dense values: `dense` is FP32 `[N, dense_in]`.
fn read_dense<T: Tensor>(spec: &ModelSpec, slots: &[Option<&T>]) -> Result<(usize, Vec<f32>)> {
    let dense_in = slot(slots, 0, || "dense".into())?;
    expect_type(dense_in, &["FP32"])?;
    let shape = dims(dense_in)?;
    if shape.len() != 2 || shape[1] != spec.dense_in() {
        return Err(ServeError::bad(format!(
            "input 'dense' has shape {:?}; the model takes [N, {}]",
            dense_in.shape(),
            spec.dense_in()
        )));
    }
    let n = shape[0];
    let want = n.checked_mul(spec.dense_in()).ok_or_else(|| {
        ServeError::bad(format!(
            "input 'dense' has shape {:?}: too large",
            dense_in.shape()
        ))
    })?;
    // Sized by the tensor once its values are counted (a shape alone proves nothing).
    let mut dense = Vec::new();
    dense_in.read_floats(want, &mut dense)?;
    Ok((n, dense))
}

/// Every feature's lengths (INT64 or INT32 `[n]`, each a count of ids), feature-major, and
/// their sum per feature. Every tensor's shape is checked before any is read.
fn read_lengths<T: Tensor>(
    spec: &ModelSpec,
    slots: &[Option<&T>],
    n: usize,
) -> Result<(Vec<u32>, Vec<u64>)> {
    let nf = spec.features().len();
    let mut length_tensors = Vec::with_capacity(nf);
    for (fi, f) in spec.features().iter().enumerate() {
        let li = slot(slots, 1 + 2 * fi, || format!("{f}_lengths"))?;
        expect_type(li, &["INT64", "INT32"])?;
        let ls = dims(li)?;
        if ls.len() != 1 || ls[0] != n {
            return Err(ServeError::bad(format!(
                "input '{}' has shape {:?}; it needs one length per sample: [{n}]",
                li.name(),
                li.shape()
            )));
        }
        length_tensors.push(li);
    }
    // Room for them all at once, bounded by the values the tensors really hold.
    let room = length_tensors.iter().map(|t| t.count().min(n)).sum();
    let mut lengths = Vec::with_capacity(room);
    let mut totals = Vec::with_capacity(nf);
    let mut ls_raw = Vec::new();
    for li in length_tensors {
        ls_raw.clear();
        li.read_ints(n, &mut ls_raw)?;
        let mut total = 0u64;
        for (s, &v) in ls_raw.iter().enumerate() {
            let l = u32::try_from(v).map_err(|_| {
                ServeError::bad(format!(
                    "input '{}': length {v} of sample {s} is not a count of ids",
                    li.name()
                ))
            })?;
            total += l as u64;
            lengths.push(l);
        }
        totals.push(total);
    }
    Ok((lengths, totals))
}

/// Every feature's ids (INT64 or INT32 `[total]`, `totals` from [`read_lengths`]) into one id
/// column, sized once, 32-bit where the model's tables allow ([`ModelSpec::new_ids`]).
fn read_ids<T: Tensor>(spec: &ModelSpec, slots: &[Option<&T>], totals: &[u64]) -> Result<Ids> {
    let mut id_tensors = Vec::with_capacity(totals.len());
    for (fi, f) in spec.features().iter().enumerate() {
        let total = totals[fi];
        let ii = slot(slots, 2 + 2 * fi, || format!("{f}_ids"))?;
        expect_type(ii, &["INT64", "INT32"])?;
        let is = dims(ii)?;
        if is.len() != 1 || is[0] as u64 != total {
            return Err(ServeError::bad(format!(
                "input '{}' has shape {:?}; its lengths add up to {total} ids: [{total}]",
                ii.name(),
                ii.shape()
            )));
        }
        id_tensors.push(ii);
    }
    // Room for every id at once (no growth by copying), bounded by the values the tensors
    // really hold.
    let room: usize = id_tensors
        .iter()
        .zip(totals)
        .map(|(t, &total)| t.count().min(total as usize))
        .sum();
    let mut ids = spec.new_ids(room);
    for (ii, &total) in id_tensors.iter().zip(totals) {
        ii.read_ints(total as usize, &mut ids)?;
    }
    Ok(ids)
}

/// Refuses an input whose datatype is none of `ok`.
fn expect_type<T: Tensor>(i: &T, ok: &[&str]) -> Result<()> {
    if ok.contains(&i.datatype()) {
        Ok(())
    } else {
        Err(ServeError::bad(format!(
            "input '{}' has datatype {}; it must be {}",
            i.name(),
            i.datatype(),
            ok.join(" or ")
        )))
    }
}

/// The shape as sizes (negative dimensions refused).
fn dims<T: Tensor>(i: &T) -> Result<Vec<usize>> {
    i.shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| {
            ServeError::bad(format!(
                "input '{}' has shape {:?}: dimensions must be >= 0",
                i.name(),
                i.shape()
            ))
        })
}

/// The error of a tensor whose value count does not match its shape; `field` names where the
/// values were read from.
pub fn count_error<T: Tensor>(i: &T, field: &str, got: usize, want: usize) -> ServeError {
    ServeError::bad(format!(
        "input '{}' has {got} values in '{field}' but its shape {:?} holds {want}",
        i.name(),
        i.shape()
    ))
}
