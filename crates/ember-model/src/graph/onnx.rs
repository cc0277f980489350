//! The part of ONNX's protobuf format (`onnx.proto`, IR version 3 and later) that a dense graph
//! needs: the model, its graph, nodes, attributes and tensors, decoded by `prost` from messages
//! declared here with the format's field numbers (fields Ember does not read are skipped by the
//! decoder, as protobuf allows). Decoded messages are turned into [`Tensor`]s and checked
//! attribute values; nothing else of the crate sees a protobuf type.

use super::tensor::Tensor;
use super::{GraphError, Result};

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// Only its presence is read: a sparse initializer is refused.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct SparseTensorProto {
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(string, tag = "7")]
    pub domain: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    /// 1 float, 2 int, 3 string, 4 tensor, 6 floats, 7 ints (others are refused where read).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// 1: the data is in an external file (refused: the graph is one file).
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// `TensorProto.DataType` values read here.
const FLOAT: i32 = 1;
const INT32: i32 = 6;
const INT64: i32 = 7;
const BOOL: i32 = 9;
const DOUBLE: i32 = 11;

impl TensorProto {
    /// The tensor as f32 (float, double) or i64 (int64, int32, bool) values; `what` names it in
    /// errors.
    pub(super) fn to_tensor(&self, what: &str) -> Result<Tensor> {
        let bad = |why: String| GraphError::Invalid(format!("{what}: {why}"));
        if self.data_location == 1 {
            return Err(bad(
                "its data is in an external file; export the graph as one file \
                 (torch.onnx.export(..., external_data=False))"
                    .into(),
            ));
        }
        let shape = self
            .dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("negative dim {d}"))))
            .collect::<Result<Vec<_>>>()?;
        let n: usize = shape.iter().product();
        let raw = &self.raw_data;
        let from_raw = |width: usize| -> Result<Vec<[u8; 8]>> {
            if raw.len() != n * width {
                return Err(bad(format!(
                    "{} bytes of data for {n} values of {width} bytes",
                    raw.len()
                )));
            }
            Ok(raw
                .chunks_exact(width)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..width].copy_from_slice(c);
                    b
                })
                .collect())
        };
        let t = match self.data_type {
            FLOAT if !raw.is_empty() => {
                let v = from_raw(4)?;
                Tensor::f32(
                    shape,
                    v.iter()
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                )
            }
            FLOAT => Tensor::f32(shape, self.float_data.clone()),
            DOUBLE if !raw.is_empty() => Tensor::f32(
                shape,
                from_raw(8)?
                    .iter()
                    .map(|b| f64::from_le_bytes(*b) as f32)
                    .collect(),
            ),
            DOUBLE => Tensor::f32(shape, self.double_data.iter().map(|&x| x as f32).collect()),
            INT64 if !raw.is_empty() => Tensor::i64(
                shape,
                from_raw(8)?
                    .iter()
                    .map(|b| i64::from_le_bytes(*b))
                    .collect(),
            ),
            INT64 => Tensor::i64(shape, self.int64_data.clone()),
            INT32 if !raw.is_empty() => Tensor::i64(
                shape,
                from_raw(4)?
                    .iter()
                    .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
                    .collect(),
            ),
            INT32 | BOOL if raw.is_empty() => {
                Tensor::i64(shape, self.int32_data.iter().map(|&x| x as i64).collect())
            }
            BOOL => Tensor::i64(shape, from_raw(1)?.iter().map(|b| b[0] as i64).collect()),
            t => {
                return Err(bad(format!(
                    "element type {t} ({}); Ember's graphs compute in f32, with int64 shapes and \
                     indices",
                    type_name(t)
                )));
            }
        };
        t.map_err(bad)
    }
}

/// `TensorProto.DataType`'s name, for errors.
pub(super) fn type_name(t: i32) -> &'static str {
    match t {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        16 => "bfloat16",
        _ => "other",
    }
}

/// A node's attributes, read by name; each read checks the attribute's type.
pub(super) struct Attrs<'a> {
    pub node: &'a str,
    pub list: &'a [AttributeProto],
}

impl Attrs<'_> {
    fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.list.iter().find(|a| a.name == name)
    }

    fn wrong(&self, name: &str, want: &str) -> GraphError {
        GraphError::Invalid(format!(
            "node {}: attribute {name} is not {want}",
            self.node
        ))
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if a.r#type == 2 => Ok(Some(a.i)),
            Some(_) => Err(self.wrong(name, "an int")),
        }
    }

    pub fn float(&self, name: &str) -> Result<Option<f32>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if a.r#type == 1 => Ok(Some(a.f)),
            Some(_) => Err(self.wrong(name, "a float")),
        }
    }

    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if a.r#type == 7 => Ok(Some(a.ints.clone())),
            Some(_) => Err(self.wrong(name, "a list of ints")),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<Tensor>> {
        match self.get(name) {
            None => Ok(None),
            Some(a) if a.r#type == 4 => match &a.t {
                Some(t) => t
                    .to_tensor(&format!("node {}: attribute {name}", self.node))
                    .map(Some),
                None => Err(self.wrong(name, "a tensor")),
            },
            Some(_) => Err(self.wrong(name, "a tensor")),
        }
    }

    /// The attribute names not in `known` (refused: an attribute Ember does not read could
    /// change what the node computes).
    pub fn unknown(&self, known: &[&str]) -> Option<String> {
        self.list
            .iter()
            .map(|a| a.name.as_str())
            .find(|n| !known.contains(n))
            .map(str::to_owned)
    }
}
