//! The JSON form of the protocol (HTTP): request and response bodies, read by hand-written
//! visitors, and Triton's binary tensor data extension (Triton's own HTTP client uses it by
//! default): with the header `Inference-Header-Content-Length: L`, the body is L bytes of JSON
//! followed by the values of each input whose `parameters.binary_data_size` is set, in the order
//! of `inputs`, as little-endian bytes. Scores come back the same way when the request sets
//! `parameters.binary_data_output` or asks for `scores` with `parameters.binary_data`. A request
//! may set `parameters.timeout` (microseconds, as Triton's) for a deadline.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use smallvec::SmallVec;

use super::values::Flatten;
pub use super::values::{Num, Values};
use super::{
    IntSink, Tensor, check_outputs, count_error, decode_tensors, le_floats, le_ints, width,
};
use crate::error::{Result, ServeError};
use crate::spec::ModelSpec;
use ember_model::serving::Request;

/// `POST /v2/models/{name}/infer` body (strings borrowed from the body where they can be).
///
/// Decoded by hand-written visitors rather than derived ones so that every input's `data` goes
/// into one list (`values`) and `inputs` is allocated once: derived decoding moved each
/// ~350-byte input three times (return, push, growth), 9% of the server's time at 13K
/// requests/s.
#[derive(Debug)]
pub struct InferRequest<'a> {
    pub id: Option<String>,
    pub parameters: Option<RequestParams>,
    pub inputs: Vec<InferInput<'a>>,
    pub outputs: Option<Vec<RequestedOutput>>,
    /// The `data` values of every input, input after input; each input holds its range.
    pub values: Values,
}

/// Request `parameters` Ember reads; others are accepted and ignored (Triton hands them to
/// backends).
#[derive(Debug, Default, Deserialize)]
pub struct RequestParams {
    /// The deadline, in microseconds.
    #[serde(default)]
    pub timeout: Option<Value>,
    /// Answer every output as binary data.
    #[serde(default)]
    pub binary_data_output: Option<Value>,
}

/// Input `parameters` Ember reads (others are ignored).
#[derive(Debug, Default, Deserialize)]
pub struct InputParams {
    /// The input's values follow the JSON, this many bytes.
    #[serde(default)]
    pub binary_data_size: Option<Value>,
}

/// Requested-output `parameters` Ember reads (others are ignored).
#[derive(Debug, Default, Deserialize)]
pub struct OutputParams {
    /// Answer this output as binary data.
    #[serde(default)]
    pub binary_data: Option<Value>,
}

/// One input tensor.
#[derive(Debug)]
pub struct InferInput<'a> {
    pub name: Cow<'a, str>,
    pub shape: SmallVec<[i64; 4]>,
    pub datatype: Cow<'a, str>,
    pub parameters: Option<InputParams>,
    /// Where its values are in [`InferRequest::values`]; `None` when they come as binary data
    /// after the JSON.
    pub data: Option<std::ops::Range<usize>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for InferRequest<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(RequestVisitor(std::marker::PhantomData))
    }
}

struct RequestVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for RequestVisitor<'a> {
    type Value = InferRequest<'a>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an inference request object")
    }
    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let (mut id, mut parameters, mut inputs, mut outputs) = (None, None, None, None);
        let mut values = Values::with_capacity(64);
        while let Some(Str(key)) = map.next_key::<Str<'de>>()? {
            match key.as_ref() {
                "id" => set(&mut id, "id", map.next_value::<Option<String>>()?)?,
                "parameters" => set(&mut parameters, "parameters", map.next_value()?)?,
                "outputs" => set(&mut outputs, "outputs", map.next_value()?)?,
                "inputs" => {
                    let v = map.next_value_seed(InputsSeed {
                        values: &mut values,
                        _a: std::marker::PhantomData,
                    })?;
                    set(&mut inputs, "inputs", v)?;
                }
                k => {
                    return Err(A::Error::unknown_field(
                        k,
                        &["id", "parameters", "inputs", "outputs"],
                    ));
                }
            }
        }
        Ok(InferRequest {
            id: id.flatten(),
            parameters: parameters.flatten(),
            inputs: inputs.ok_or_else(|| A::Error::missing_field("inputs"))?,
            outputs: outputs.flatten(),
            values,
        })
    }
}

/// A string borrowed from the body when it has no escapes (serde's own `Cow<str>` always
/// copies).
struct Str<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// Stores a field's value, refusing a second one.
fn set<T, E: serde::de::Error>(
    slot: &mut Option<T>,
    name: &'static str,
    v: T,
) -> std::result::Result<(), E> {
    if slot.replace(v).is_some() {
        return Err(E::duplicate_field(name));
    }
    Ok(())
}

/// `inputs`: a list allocated once, each input's data appended to `values`.
struct InputsSeed<'v, 'a> {
    values: &'v mut Values,
    _a: std::marker::PhantomData<&'a ()>,
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for InputsSeed<'_, 'a> {
    type Value = Vec<InferInput<'a>>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for InputsSeed<'_, 'a> {
    type Value = Vec<InferInput<'a>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of input tensors")
    }
    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).clamp(64, 1024));
        while let Some(i) = seq.next_element_seed(InputSeed {
            values: &mut *self.values,
            _a: std::marker::PhantomData,
        })? {
            out.push(i);
        }
        Ok(out)
    }
}

/// One input; its `data` leaves appended to `values`.
struct InputSeed<'v, 'a> {
    values: &'v mut Values,
    _a: std::marker::PhantomData<&'a ()>,
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for InputSeed<'_, 'a> {
    type Value = InferInput<'a>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for InputSeed<'_, 'a> {
    type Value = InferInput<'a>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an input tensor object")
    }
    fn visit_map<A: MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let (mut name, mut shape, mut datatype, mut parameters, mut data) =
            (None, None, None, None, None);
        while let Some(Str(key)) = map.next_key::<Str<'de>>()? {
            match key.as_ref() {
                "name" => set(&mut name, "name", map.next_value::<Str<'de>>()?.0)?,
                "shape" => set(&mut shape, "shape", map.next_value()?)?,
                "datatype" => set(&mut datatype, "datatype", map.next_value::<Str<'de>>()?.0)?,
                "parameters" => set(&mut parameters, "parameters", map.next_value()?)?,
                "data" => {
                    let start = self.values.len();
                    map.next_value_seed(Flatten(&mut *self.values))?;
                    set(&mut data, "data", start..self.values.len())?;
                }
                k => {
                    return Err(A::Error::unknown_field(
                        k,
                        &["name", "shape", "datatype", "parameters", "data"],
                    ));
                }
            }
        }
        Ok(InferInput {
            name: name.ok_or_else(|| A::Error::missing_field("name"))?,
            shape: shape.ok_or_else(|| A::Error::missing_field("shape"))?,
            datatype: datatype.ok_or_else(|| A::Error::missing_field("datatype"))?,
            parameters: parameters.flatten(),
            data,
        })
    }
}

/// An output the client asks for.
#[derive(Debug, Deserialize)]
pub struct RequestedOutput {
    pub name: String,
    #[serde(default)]
    pub parameters: Option<OutputParams>,
}

/// The inference response body.
#[derive(Debug, Serialize)]
pub struct InferResponse<'a> {
    pub model_name: String,
    pub model_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub outputs: Vec<OutputTensor<'a>>,
}

/// One output tensor.
#[derive(Debug, Serialize)]
pub struct OutputTensor<'a> {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<usize>,
    /// `{"binary_data_size": bytes}` when the values follow the JSON as binary data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Its values, written as a JSON array (borrowed from the answer, not copied).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<&'a super::OutputValues<'a>>,
}

/// The request's deadline, if it set `parameters.timeout` (microseconds).
pub fn timeout_us(req: &InferRequest<'_>) -> Result<Option<u64>> {
    match req.parameters.as_ref().and_then(|p| p.timeout.as_ref()) {
        None => Ok(None),
        Some(v) => v.as_u64().filter(|&t| t > 0).map(Some).ok_or_else(|| {
            ServeError::bad(format!(
                "parameters.timeout must be a positive integer of microseconds, not {v}"
            ))
        }),
    }
}

/// Decodes and checks a JSON inference request against the model (all values in JSON).
pub fn decode(spec: &ModelSpec, req: &InferRequest<'_>) -> Result<Request> {
    decode_with_binary(spec, req, &[])
}

/// Decodes and checks an inference request whose JSON is followed by `binary`, the binary
/// tensor data of the inputs that set `parameters.binary_data_size` (empty when none does).
pub fn decode_with_binary(
    spec: &ModelSpec,
    req: &InferRequest<'_>,
    binary: &[u8],
) -> Result<Request> {
    check_outputs(spec, req.outputs.iter().flatten().map(|o| o.name.as_str()))?;
    let mut at = 0usize;
    let mut tensors = Vec::with_capacity(req.inputs.len());
    for i in &req.inputs {
        let size = match i
            .parameters
            .as_ref()
            .and_then(|p| p.binary_data_size.as_ref())
        {
            None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                ServeError::bad(format!(
                    "input '{}': parameters.binary_data_size must be a count of bytes, not {v}",
                    i.name
                ))
            })?),
        };
        let bin = match (size, &i.data) {
            (Some(_), Some(_)) => {
                return Err(ServeError::bad(format!(
                    "input '{}' has both 'data' and parameters.binary_data_size: use one",
                    i.name
                )));
            }
            (None, None) => {
                return Err(ServeError::bad(format!(
                    "input '{}' has no 'data' (nor parameters.binary_data_size)",
                    i.name
                )));
            }
            (None, Some(_)) => None,
            (Some(n), None) => {
                let end = usize::try_from(n)
                    .ok()
                    .and_then(|n| at.checked_add(n))
                    .filter(|&e| e <= binary.len())
                    .ok_or_else(|| {
                        ServeError::bad(format!(
                            "input '{}': parameters.binary_data_size {n} runs past the {} bytes \
                             of binary data after the JSON (Inference-Header-Content-Length)",
                            i.name,
                            binary.len()
                        ))
                    })?;
                let b = &binary[at..end];
                at = end;
                Some(b)
            }
        };
        let data = i.data.clone().map(|r| (&req.values, r));
        tensors.push(JsonTensor { i, data, bin });
    }
    if at != binary.len() {
        return Err(ServeError::bad(format!(
            "{} bytes of binary data follow the JSON but the inputs' binary_data_size add up to \
             {at}",
            binary.len()
        )));
    }
    decode_tensors(spec, &tensors)
}

/// Whether the answer should carry the scores as binary data.
pub fn binary_output(req: &InferRequest<'_>) -> bool {
    let on = |v: &Option<Value>| v.as_ref().and_then(Value::as_bool).unwrap_or(false);
    req.parameters
        .as_ref()
        .is_some_and(|p| on(&p.binary_data_output))
        || req
            .outputs
            .iter()
            .flatten()
            .any(|o| o.parameters.as_ref().is_some_and(|p| on(&p.binary_data)))
}

/// A JSON input with its values: in JSON, or as binary data.
struct JsonTensor<'a, 'b> {
    i: &'a InferInput<'b>,
    data: Option<(&'a Values, std::ops::Range<usize>)>,
    bin: Option<&'a [u8]>,
}

impl Tensor for JsonTensor<'_, '_> {
    fn name(&self) -> &str {
        &self.i.name
    }
    fn datatype(&self) -> &str {
        &self.i.datatype
    }
    fn shape(&self) -> &[i64] {
        &self.i.shape
    }

    fn count(&self) -> usize {
        match (&self.data, self.bin) {
            (Some((_, r)), _) => r.len(),
            (None, b) => b.map_or(0, |b| {
                b.len().checked_div(width(&self.i.datatype)).unwrap_or(0)
            }),
        }
    }

    fn read_floats(&self, want: usize, out: &mut Vec<f32>) -> Result<()> {
        let Some((values, range)) = self.data.clone() else {
            return le_floats(
                self,
                "its binary data",
                self.bin.unwrap_or_default(),
                want,
                out,
            );
        };
        if range.len() != want {
            return Err(count_error(self, "data", range.len(), want));
        }
        out.reserve(want);
        for (k, v) in values.iter(range).enumerate() {
            out.push(match v {
                Num::I(x) => x as f32,
                Num::U(x) => x as f32,
                Num::F(x) => x as f32,
                Num::Other => {
                    return Err(ServeError::bad(format!(
                        "input '{}': value {k} is not a number",
                        self.i.name
                    )));
                }
            });
        }
        Ok(())
    }

    fn read_ints<S: IntSink>(&self, want: usize, out: &mut S) -> Result<()> {
        let Some((values, range)) = self.data.clone() else {
            return le_ints(
                self,
                "its binary data",
                self.bin.unwrap_or_default(),
                want,
                out,
            );
        };
        let int32 = self.i.datatype == "INT32";
        if range.len() != want {
            return Err(count_error(self, "data", range.len(), want));
        }
        out.reserve_ints(want);
        for (k, v) in values.iter(range).enumerate() {
            let x = match v {
                Num::I(x) => Some(x),
                Num::U(x) => i64::try_from(x).ok(),
                Num::F(_) | Num::Other => None,
            };
            let x = x
                .filter(|&x| !int32 || i32::try_from(x).is_ok())
                .ok_or_else(|| {
                    ServeError::bad(format!(
                        "input '{}': value {k} is not an {} ({})",
                        self.i.name,
                        self.i.datatype,
                        match v {
                            // Kept as f32: shown as one.
                            Num::F(f) => (f as f32).to_string(),
                            Num::Other => "not a number".into(),
                            Num::I(x) => x.to_string(),
                            Num::U(x) => x.to_string(),
                        }
                    ))
                })?;
            out.push_int(x);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> std::result::Result<InferRequest<'_>, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn request_fields_are_read_and_checked_like_derived_ones() {
        let r = parse(
            r#"{"id": "a", "parameters": {"timeout": 5, "other": [1]}, "outputs": [{"name": "scores"}],
                "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2.5], [-3, 4]]},
                           {"name": "y", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": 8}},
                           {"name": "z", "datatype": "INT32", "shape": [0], "data": []}]}"#,
        )
        .unwrap();
        assert_eq!(r.id.as_deref(), Some("a"));
        assert_eq!(r.parameters.unwrap().timeout, Some(Value::from(5)));
        assert_eq!(r.outputs.unwrap()[0].name, "scores");
        assert_eq!(r.inputs.len(), 3);
        assert_eq!(r.inputs[0].data, Some(0..4));
        let got: Vec<Num> = r.values.iter(0..r.values.len()).collect();
        assert_eq!(got, [Num::I(1), Num::F(2.5), Num::I(-3), Num::I(4)]);
        assert_eq!(r.inputs[1].data, None);
        assert_eq!(
            r.inputs[1].parameters.as_ref().unwrap().binary_data_size,
            Some(Value::from(8))
        );
        assert_eq!(r.inputs[2].data, Some(4..4));
        assert_eq!(r.inputs[2].shape.as_slice(), [0]);
        // A null id or parameters is absent.
        let r = parse(r#"{"id": null, "parameters": null, "inputs": []}"#).unwrap();
        assert!(r.id.is_none() && r.parameters.is_none() && r.inputs.is_empty());
        for (bad, needle) in [
            (r#"{"inputs": [], "extra": 1}"#, "unknown field `extra`"),
            (
                r#"{"inputs": [], "inputs": []}"#,
                "duplicate field `inputs`",
            ),
            (r#"{"id": "x"}"#, "missing field `inputs`"),
            (
                r#"{"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}"#,
                "missing field `name`",
            ),
            (
                r#"{"inputs": [{"name": "a", "datatype": "FP32", "data": [1]}]}"#,
                "missing field `shape`",
            ),
            (
                r#"{"inputs": [{"name": "a", "shape": [1], "data": [1]}]}"#,
                "missing field `datatype`",
            ),
            (
                r#"{"inputs": [{"name": "a", "name": "b", "shape": [1], "datatype": "FP32"}]}"#,
                "duplicate field `name`",
            ),
            (
                r#"{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1], "data": [2]}]}"#,
                "duplicate field `data`",
            ),
            (
                r#"{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "dat": [1]}]}"#,
                "unknown field `dat`",
            ),
            (r#"{"inputs": {}}"#, "invalid type"),
            (
                r#"{"inputs": [{"name": 3, "shape": [1], "datatype": "FP32", "data": [1]}]}"#,
                "invalid type",
            ),
            (r#"[]"#, "invalid type"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
