//! A fast path for the common shape of a KServe v2 inference request: flat `data` arrays,
//! strings without escapes, and only the fields and parameters Ember reads. Anything else
//! (escapes, nested `data`, unknown fields, malformed JSON, numbers serde_json would refuse)
//! returns `None`, and the caller decodes the body with serde_json instead, which also writes
//! the error message. So this module decides nothing about validity; it only answers faster
//! when the request is plain. A property test checks that whenever it answers, its answer equals
//! serde_json's.
//!
//! Why: serde_json took 17 us for the 3.7 KB one-sample request of the shipped model (53 input
//! objects), the largest cost of a KServe JSON request in the server.

use std::ops::Range;

use serde_json::Value;
use smallvec::SmallVec;

use super::json::{
    InferInput, InferRequest, InputParams, Num, OutputParams, RequestParams, RequestedOutput,
    Values,
};

/// The request in `body`, if it has the plain shape (see the module's note).
pub fn parse_infer(body: &[u8]) -> Option<InferRequest<'_>> {
    let mut p = Parser { b: body, i: 0 };
    let r = p.request()?;
    p.ws();
    (p.i == body.len()).then_some(r)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// After an element: `true` at `,` (more follow), `false` at `close`.
    fn next(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// `open`, then items read by `item` separated by commas, then `close` (none at all allowed).
    fn seq(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        if self.peek()? == close {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self)?;
            if !self.next(close)? {
                return Some(());
            }
        }
    }

    /// A string without escapes or control characters.
    fn str(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let len = self.b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if self.b[start + len] != b'"' {
            return None;
        }
        self.i = start + len + 1;
        std::str::from_utf8(&self.b[start..start + len]).ok()
    }

    /// A key and its colon.
    fn key(&mut self) -> Option<&'a str> {
        let k = self.str()?;
        self.eat(b':')?;
        Some(k)
    }

    /// A number, as serde_json reads it: non-negative integers as `U`, negative ones as `I`,
    /// `-0` and anything with a fraction or exponent as `F`.
    fn num(&mut self) -> Option<Num> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let neg = b.get(i) == Some(&b'-');
        i += usize::from(neg);
        let digits = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let n_digits = i - digits;
        // No digits, or a leading zero: not JSON (serde_json says why).
        if n_digits == 0 || (b[digits] == b'0' && n_digits > 1) {
            return None;
        }
        let mut float = false;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let f = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == f {
                return None;
            }
            float = true;
        }
        if let Some(b'e' | b'E') = b.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = b.get(i) {
                i += 1;
            }
            let e = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == e {
                return None;
            }
            float = true;
        }
        self.i = i;
        if float {
            // Correctly rounded, as serde_json with `float_roundtrip`; out of range is refused
            // there, so not answered here.
            let text = std::str::from_utf8(&b[start..i]).ok()?;
            let v: f64 = text.parse().ok()?;
            return v.is_finite().then_some(Num::F(v));
        }
        if n_digits > 18 {
            return None;
        }
        let v = b[digits..i]
            .iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
        Some(match (neg, v) {
            (false, v) => Num::U(v),
            (true, 0) => Num::F(-0.0),
            (true, v) => Num::I(-(v as i64)),
        })
    }

    /// A flat array of numbers appended to `values`; its range there.
    fn numbers(&mut self, values: &mut Values) -> Option<Range<usize>> {
        let start = values.len();
        self.seq(b'[', b']', |p| {
            values.push(p.num()?);
            Some(())
        })?;
        Some(start..values.len())
    }

    fn shape(&mut self) -> Option<SmallVec<[i64; 4]>> {
        let mut out = SmallVec::new();
        self.seq(b'[', b']', |p| {
            out.push(match p.num()? {
                Num::U(v) => i64::try_from(v).ok()?,
                Num::I(v) => v,
                _ => return None,
            });
            Some(())
        })?;
        Some(out)
    }

    /// A flat object of numbers, booleans and strings, as (key, value) pairs; `None` on a
    /// repeated key (serde_json refuses those for the fields Ember reads).
    fn params(&mut self) -> Option<Vec<(&'a str, Value)>> {
        let mut out: Vec<(&str, Value)> = Vec::new();
        self.seq(b'{', b'}', |p| {
            let k = p.key()?;
            if out.iter().any(|(o, _)| *o == k) {
                return None;
            }
            let v = match p.peek()? {
                b'"' => Value::from(p.str()?),
                b't' => p.word("true", Value::Bool(true))?,
                b'f' => p.word("false", Value::Bool(false))?,
                _ => match p.num()? {
                    Num::U(v) => Value::from(v),
                    Num::I(v) => Value::from(v),
                    Num::F(v) => Value::from(v),
                    Num::Other => return None,
                },
            };
            out.push((k, v));
            Some(())
        })?;
        Some(out)
    }

    /// The value of the parameter `key` in a parameters object (others are ignored).
    fn param(&mut self, key: &str) -> Option<Option<Value>> {
        Some(
            self.params()?
                .into_iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v),
        )
    }

    fn word(&mut self, w: &str, v: Value) -> Option<Value> {
        self.b[self.i..].starts_with(w.as_bytes()).then(|| {
            self.i += w.len();
            v
        })
    }

    fn input(&mut self, values: &mut Values) -> Option<InferInput<'a>> {
        let (mut name, mut shape, mut datatype, mut parameters, mut data) =
            (None, None, None, None, None);
        self.seq(b'{', b'}', |p| {
            match p.key()? {
                "name" if name.is_none() => name = Some(p.str()?),
                "shape" if shape.is_none() => shape = Some(p.shape()?),
                "datatype" if datatype.is_none() => datatype = Some(p.str()?),
                "data" if data.is_none() => data = Some(p.numbers(values)?),
                "parameters" if parameters.is_none() => {
                    parameters = Some(InputParams {
                        binary_data_size: p.param("binary_data_size")?,
                    });
                }
                _ => return None,
            }
            Some(())
        })?;
        Some(InferInput {
            name: name?.into(),
            shape: shape?,
            datatype: datatype?.into(),
            parameters,
            data,
        })
    }

    fn output(&mut self) -> Option<RequestedOutput> {
        let (mut name, mut parameters) = (None, None);
        self.seq(b'{', b'}', |p| {
            match p.key()? {
                "name" if name.is_none() => name = Some(p.str()?.to_string()),
                "parameters" if parameters.is_none() => {
                    parameters = Some(OutputParams {
                        binary_data: p.param("binary_data")?,
                    });
                }
                _ => return None,
            }
            Some(())
        })?;
        Some(RequestedOutput {
            name: name?,
            parameters,
        })
    }

    fn request(&mut self) -> Option<InferRequest<'a>> {
        // Every value takes 2 bytes or more (a digit and a separator): room for all of them
        // at once, so that the list never grows by copying (memory is touched as it fills).
        let mut values = Values::with_capacity(self.b.len() / 2 + 1);
        let (mut id, mut parameters, mut inputs, mut outputs) = (None, None, None, None);
        self.seq(b'{', b'}', |p| {
            match p.key()? {
                "id" if id.is_none() => id = Some(p.str()?.to_string()),
                "inputs" if inputs.is_none() => {
                    let mut v = Vec::with_capacity(64);
                    p.seq(b'[', b']', |p| {
                        v.push(p.input(&mut values)?);
                        Some(())
                    })?;
                    inputs = Some(v);
                }
                "parameters" if parameters.is_none() => {
                    let mut r = RequestParams::default();
                    for (k, v) in p.params()? {
                        match k {
                            "timeout" => r.timeout = Some(v),
                            "binary_data_output" => r.binary_data_output = Some(v),
                            _ => {}
                        }
                    }
                    parameters = Some(r);
                }
                "outputs" if outputs.is_none() => {
                    let mut v = Vec::new();
                    p.seq(b'[', b']', |p| {
                        v.push(p.output()?);
                        Some(())
                    })?;
                    outputs = Some(v);
                }
                _ => return None,
            }
            Some(())
        })?;
        Some(InferRequest {
            id,
            parameters,
            inputs: inputs?,
            outputs,
            values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(body: &str) -> (Option<String>, Result<String, String>) {
        (
            parse_infer(body.as_bytes()).map(|r| format!("{r:?}")),
            serde_json::from_str::<InferRequest>(body)
                .map(|r| format!("{r:?}"))
                .map_err(|e| e.to_string()),
        )
    }

    #[test]
    fn plain_requests_take_the_fast_path_and_decode_as_serde_does() {
        for body in [
            r#"{"inputs":[{"name":"dense","shape":[1,3],"datatype":"FP32","data":[0.5,-2,3e-3]},{"name":"C1_ids","shape":[2],"datatype":"INT64","data":[7,0]}]}"#,
            r#" { "id" : "r1", "inputs" : [ { "name" : "x", "shape" : [ 0 ], "datatype" : "INT32", "data" : [ ] } ] , "parameters" : { "timeout" : 500 , "binary_data_output" : true } } "#,
            r#"{"inputs":[{"name":"x","shape":[2],"datatype":"INT64","parameters":{"binary_data_size":16}}],"outputs":[{"name":"scores","parameters":{"binary_data":true}}]}"#,
            r#"{"inputs":[],"outputs":[]}"#,
            r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[-0,-0.0,1E2]}]}"#,
        ] {
            let (fast, serde) = both(body);
            assert_eq!(fast.as_ref(), Some(serde.as_ref().unwrap()), "{body}");
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        for body in [
            // Nested data, escapes, unknown fields, null id, malformed JSON, numbers serde
            // refuses or reads differently.
            r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[[1,2]]}]}"#,
            r#"{"inputs":[{"name":"x\u0041","shape":[1],"datatype":"FP32","data":[1]}]}"#,
            r#"{"inputs":[],"extra":1}"#,
            r#"{"id":null,"inputs":[]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1,]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[01]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e400]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[12345678901234567890]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1.]}]}"#,
            r#"{"inputs":[],"inputs":[]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]} x"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"a":{"b":1}}}]}"#,
        ] {
            assert!(parse_infer(body.as_bytes()).is_none(), "{body}");
        }
    }
}
