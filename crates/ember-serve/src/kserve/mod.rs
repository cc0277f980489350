//! The KServe v2 (Triton) inference protocol, the part both wire forms share: model metadata,
//! the model/version check, the input tensors' rules and their decoding into checked samples,
//! little-endian tensor bytes, the `scores` output.
//!
//! A model's inputs and outputs are its [`ember_model::serving::Signature`]'s. A DLRM-family
//! model's: `dense`, FP32 `[N, dense_in]`; for every sparse feature `F`, `F_lengths` (INT32 or
//! INT64 `[N]`: ids per sample) and `F_ids` (INT64 or INT32 `[sum of lengths]`, sample by
//! sample); its output `scores`, FP32 `[N]`. An HSTU model's: per history and candidate
//! feature `F`, `F_lengths` (`[N]` users) and `F_ids` or `F_values`; per task an FP32 output of
//! one score per candidate, and `candidate_offsets` (INT64 `[N + 1]`). The wire forms:
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
use ember_model::Ids;
use ember_model::serving::{InputColumns, InputKind, Request};

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

/// The output of a model of one score per sample.
pub const SCORES: &str = "scores";

/// The metadata of the model `spec` describes, served as `version`: its signature's inputs
/// (a table's size as `{"rows": N}` on its ids), its outputs, and the offsets output where an
/// item has a run of values.
pub fn metadata(spec: &ModelSpec, version: &str) -> ModelMetadata {
    let sig = &spec.signature;
    let inputs = sig
        .inputs
        .iter()
        .map(|i| match &i.kind {
            InputKind::Floats { width } => TensorMeta {
                name: i.name.clone(),
                datatype: "FP32",
                shape: vec![-1, *width as i64],
                parameters: None,
            },
            InputKind::Lengths => TensorMeta {
                name: i.name.clone(),
                datatype: "INT64",
                shape: vec![-1],
                parameters: None,
            },
            InputKind::Values { rows, .. } => TensorMeta {
                name: i.name.clone(),
                datatype: "INT64",
                shape: vec![-1],
                parameters: rows.map(|rows| serde_json::json!({ "rows": rows })),
            },
        })
        .collect();
    let mut outputs: Vec<TensorMeta> = sig
        .outputs
        .iter()
        .map(|o| TensorMeta {
            name: o.clone(),
            datatype: "FP32",
            shape: vec![-1],
            parameters: None,
        })
        .collect();
    if let Some(o) = &sig.offsets {
        outputs.push(TensorMeta {
            name: o.clone(),
            datatype: "INT64",
            shape: vec![-1],
            parameters: None,
        });
    }
    ModelMetadata {
        name: spec.name.clone(),
        versions: vec![version.into()],
        platform: "ember",
        inputs,
        outputs,
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

/// One output tensor of an answer.
#[derive(Debug)]
pub struct Output<'a> {
    pub name: &'a str,
    pub values: OutputValues<'a>,
}

/// An output's values (serialized as a JSON array of them).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OutputValues<'a> {
    F32(&'a [f32]),
    I64(Vec<i64>),
}

impl OutputValues<'_> {
    pub fn len(&self) -> usize {
        match self {
            OutputValues::F32(v) => v.len(),
            OutputValues::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The protocol's datatype.
    pub fn datatype(&self) -> &'static str {
        match self {
            OutputValues::F32(_) => "FP32",
            OutputValues::I64(_) => "INT64",
        }
    }

    /// Bytes of its little-endian values.
    pub fn byte_len(&self) -> usize {
        match self {
            OutputValues::F32(v) => 4 * v.len(),
            OutputValues::I64(v) => 8 * v.len(),
        }
    }

    /// Appends its values, little-endian, to `out`.
    pub fn write_le(&self, out: &mut impl bytes::BufMut) {
        match self {
            OutputValues::F32(v) => v.iter().for_each(|x| out.put_f32_le(*x)),
            OutputValues::I64(v) => v.iter().for_each(|x| out.put_i64_le(*x)),
        }
    }
}

/// The outputs of an answer, in the signature's order: each declared output, then the
/// offsets of each item's run where the model has them.
pub fn outputs<'a>(spec: &'a ModelSpec, reply: &'a crate::Reply) -> Vec<Output<'a>> {
    let sig = &spec.signature;
    let o = &reply.outputs;
    let mut v: Vec<Output<'a>> = sig
        .outputs
        .iter()
        .enumerate()
        .map(|(k, name)| Output {
            name,
            values: OutputValues::F32(o.values.get(k).map_or(&[], |v| v)),
        })
        .collect();
    if let Some(name) = &sig.offsets {
        let offsets = o.offsets().into_iter().map(|x| x as i64).collect();
        v.push(Output {
            name,
            values: OutputValues::I64(offsets),
        });
    }
    v
}

/// The outputs a request asked for by name (`asked`, checked by [`check_outputs`]), in the
/// model's order; every output when it named none (the KServe v2 rule).
pub fn requested<'a>(mut outs: Vec<Output<'a>>, asked: &[String]) -> Vec<Output<'a>> {
    if !asked.is_empty() {
        outs.retain(|o| asked.iter().any(|a| a == o.name));
    }
    outs
}

/// Refuses requested outputs the model does not have.
pub fn check_outputs<'a>(spec: &ModelSpec, mut names: impl Iterator<Item = &'a str>) -> Result<()> {
    let sig = &spec.signature;
    let known = |n: &str| sig.outputs.iter().any(|o| o == n) || sig.offsets.as_deref() == Some(n);
    match names.find(|&n| !known(n)) {
        Some(o) => {
            let mut all = sig.outputs.clone();
            all.extend(sig.offsets.clone());
            Err(ServeError::bad(format!(
                "unknown output '{o}': the model's outputs are '{}'",
                all.join("', '")
            )))
        }
        None => Ok(()),
    }
}

/// Decodes the input tensors of a request (either protocol) by the model's signature and
/// checks them: each input to its slot, then every float input, every lengths input (their
/// sums size the values), and the values, each read once into its place.
pub fn decode_tensors<T: Tensor>(spec: &ModelSpec, inputs: &[T]) -> Result<Request> {
    let slots = input_slots(spec, inputs)?;
    let n = items(spec, &slots)?;
    let floats = read_floats(spec, &slots, n)?;
    let (lengths, totals) = read_lengths(spec, &slots, n)?;
    let values = read_values(spec, &slots, &totals)?;
    let present = slots.iter().map(Option::is_some).collect();
    spec.check_columns(InputColumns {
        n,
        floats,
        lengths: lengths.into(),
        values,
        present,
    })
}

/// Each input to its slot (its index in the signature). An input the model does not take, or
/// one given twice, is refused.
fn input_slots<'t, T: Tensor>(spec: &ModelSpec, inputs: &'t [T]) -> Result<Vec<Option<&'t T>>> {
    let sig = &spec.signature;
    let mut slots: Vec<Option<&T>> = vec![None; sig.inputs.len()];
    for i in inputs {
        let Some(&k) = spec.input_slots.get(i.name()) else {
            let names: Vec<&str> = sig.inputs.iter().map(|i| i.name.as_str()).collect();
            let listed = match names.len() {
                0..=8 => format!("'{}'", names.join("', '")),
                n => format!("'{}', ... ({n} inputs)", names[..8].join("', '")),
            };
            return Err(ServeError::bad(format!(
                "unknown input '{}': the model takes {listed} (the model's metadata lists them)",
                i.name(),
            )));
        };
        if slots[k].replace(i).is_some() {
            return Err(ServeError::bad(format!(
                "input '{}' is given twice",
                i.name()
            )));
        }
    }
    for (k, i) in sig.inputs.iter().enumerate() {
        if i.required && slots[k].is_none() {
            return Err(ServeError::bad(format!("missing input '{}'", i.name)));
        }
    }
    Ok(slots)
}

/// The request's items: the first float input's rows, else the first lengths input's size.
fn items<T: Tensor>(spec: &ModelSpec, slots: &[Option<&T>]) -> Result<usize> {
    let sig = &spec.signature;
    let first = sig
        .inputs
        .iter()
        .zip(slots)
        .find(|(i, t)| t.is_some() && matches!(i.kind, InputKind::Floats { .. }))
        .or_else(|| {
            sig.inputs
                .iter()
                .zip(slots)
                .find(|(i, t)| t.is_some() && i.kind == InputKind::Lengths)
        });
    match first {
        Some((_, Some(t))) => Ok(dims(*t)?.first().copied().unwrap_or(0)),
        _ => Ok(0),
    }
}

/// Every float input's values (FP32 `[n, width]`), in declared order.
fn read_floats<T: Tensor>(spec: &ModelSpec, slots: &[Option<&T>], n: usize) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for (i, t) in spec.signature.inputs.iter().zip(slots) {
        let (InputKind::Floats { width }, Some(t)) = (&i.kind, t) else {
            continue;
        };
        expect_type(*t, &["FP32"])?;
        let shape = dims(*t)?;
        if shape.len() != 2 || shape[0] != n || shape[1] != *width {
            return Err(ServeError::bad(format!(
                "input '{}' has shape {:?}; the model takes [N, {width}]{}",
                i.name,
                t.shape(),
                match shape.first() {
                    Some(&rows) if rows != n => format!(" with N = {n}, as the other inputs"),
                    _ => String::new(),
                }
            )));
        }
        let want = n.checked_mul(*width).ok_or_else(|| {
            ServeError::bad(format!(
                "input '{}' has shape {:?}: too large",
                i.name,
                t.shape()
            ))
        })?;
        // Sized by the tensor once its values are counted (a shape alone proves nothing).
        t.read_floats(want, &mut out)?;
    }
    Ok(out)
}

/// Every lengths input's counts (INT64 or INT32 `[n]`, zeros for an absent one), in
/// declared order, and each one's sum (by its slot). Every tensor's shape is checked before
/// any is read.
fn read_lengths<T: Tensor>(
    spec: &ModelSpec,
    slots: &[Option<&T>],
    n: usize,
) -> Result<(Vec<u32>, Vec<u64>)> {
    let sig = &spec.signature;
    let mut length_tensors = Vec::new();
    for (i, t) in sig.inputs.iter().zip(slots) {
        if i.kind != InputKind::Lengths {
            continue;
        }
        if let Some(t) = t {
            expect_type(*t, &["INT64", "INT32"])?;
            let ls = dims(*t)?;
            if ls.len() != 1 || ls[0] != n {
                return Err(ServeError::bad(format!(
                    "input '{}' has shape {:?}; it needs one length per {}: [{n}]",
                    t.name(),
                    t.shape(),
                    sig.item
                )));
            }
        }
        length_tensors.push(*t);
    }
    // Room for them all at once, bounded by the values the tensors really hold.
    let room = length_tensors
        .iter()
        .map(|t| t.map_or(n, |t| t.count().min(n)))
        .sum();
    let mut lengths = Vec::with_capacity(room);
    let mut totals = vec![0u64; sig.inputs.len()];
    let mut ls_raw = Vec::new();
    let slots_of = sig
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, i)| i.kind == InputKind::Lengths);
    for ((k, _), li) in slots_of.zip(length_tensors) {
        let Some(li) = li else {
            lengths.resize(lengths.len() + n, 0);
            continue;
        };
        ls_raw.clear();
        li.read_ints(n, &mut ls_raw)?;
        let mut total = 0u64;
        for (s, &v) in ls_raw.iter().enumerate() {
            let l = u32::try_from(v).map_err(|_| {
                ServeError::bad(format!(
                    "input '{}': length {v} of {} {s} is not a count of {}",
                    li.name(),
                    sig.item,
                    // Worked out only for the error: ids of a table, or plain values.
                    match counts_ids(sig, k) {
                        true => "ids",
                        false => "values",
                    }
                ))
            })?;
            total += l as u64;
            lengths.push(l);
        }
        totals[k] = total;
    }
    Ok((lengths, totals))
}

/// Whether the lengths input in slot `k` counts ids of a table (else plain values).
fn counts_ids(sig: &ember_model::serving::Signature, k: usize) -> bool {
    sig.inputs
        .iter()
        .any(|i| matches!(i.kind, InputKind::Values { lengths, rows: Some(_) } if lengths == k))
}

/// Every values input (INT64 or INT32 `[total]`, `totals` by their lengths input's slot, from
/// [`read_lengths`]) into one column, sized once, 32-bit where the model allows
/// ([`ModelSpec::new_ids`]).
fn read_values<T: Tensor>(spec: &ModelSpec, slots: &[Option<&T>], totals: &[u64]) -> Result<Ids> {
    let mut value_tensors = Vec::new();
    for (i, t) in spec.signature.inputs.iter().zip(slots) {
        let InputKind::Values { lengths, .. } = i.kind else {
            continue;
        };
        let total = totals[lengths];
        let Some(ii) = t else {
            if total > 0 {
                return Err(ServeError::bad(format!(
                    "missing input '{}': its lengths add up to {total} values",
                    i.name
                )));
            }
            continue;
        };
        expect_type(*ii, &["INT64", "INT32"])?;
        let is = dims(*ii)?;
        if is.len() != 1 || is[0] as u64 != total {
            return Err(ServeError::bad(format!(
                "input '{}' has shape {:?}; its lengths add up to {total} values: [{total}]",
                ii.name(),
                ii.shape()
            )));
        }
        if slots[lengths].is_none() {
            return Err(ServeError::bad(format!(
                "input '{}' is given without '{}'",
                i.name, spec.signature.inputs[lengths].name
            )));
        }
        value_tensors.push((*ii, total));
    }
    // Room for every value at once (no growth by copying), bounded by the values the tensors
    // really hold.
    let room: usize = value_tensors
        .iter()
        .map(|(t, total)| t.count().min(*total as usize))
        .sum();
    let mut ids = spec.new_ids(room);
    for (ii, total) in value_tensors {
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
