//! `/v1/score`'s JSON samples, read in one pass straight into the columns the model takes: no
//! tree, no per-sample map or per-bag vector. A sample costs what its values cost (4 bytes a
//! dense value, a length and a 32-bit id), whatever its JSON looks like; a request of many empty
//! bags costs 4 bytes per bag (its `"name":[],` takes 8 or more), where a map of vectors per
//! sample took about 20x its body.
//!
//! Ids are appended sample by sample, as they come, with the span of each (sample, feature)
//! bag; the feature-major order the model takes is gathered once at the end.

use std::fmt;

use ember_model::Ids;
use ember_model::serving::Request;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::{Result, ServeError};
use crate::spec::ModelSpec;

/// The columns read so far.
struct Columns<'s> {
    spec: &'s ModelSpec,
    /// Samples read.
    n: usize,
    dense: Vec<f32>,
    /// Ids in arrival order (sample-major).
    ids: Ids,
    /// Per (sample, feature), sample-major: where its bag is in `ids`, and its length.
    spans: Vec<(u32, u32)>,
}

/// What a sample looks like, for the error of a body that is none.
const SAMPLE_SHAPE: &str = r#"{"dense": [...], "sparse": {"<feature>": [ids]}}"#;

/// Decodes a JSON body: one sample or an array of samples (see the module documentation of
/// `v1`).
pub fn decode(spec: &ModelSpec, body: &[u8]) -> Result<Request> {
    let nf = spec.features().len();
    // Bounds on what the body can hold, reserved once (memory is only touched as it fills):
    // every dense value and id takes at least 2 bytes, every sample at least its keys.
    let min_sample = 2 * spec.dense_in() + 6 * nf + 24;
    let most_samples = body.len() / min_sample + 1;
    let mut cols = Columns {
        spec,
        n: 0,
        dense: Vec::with_capacity(most_samples * spec.dense_in()),
        ids: spec.new_ids(body.len() / 2 + 1),
        spans: Vec::with_capacity(most_samples * nf),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = Body(&mut cols).deserialize(&mut de).and_then(|()| de.end());
    if let Err(e) = read {
        return Err(ServeError::bad(format!(
            "body is not a sample or an array of samples ({SAMPLE_SHAPE}): {e}"
        )));
    }
    cols.finish()
}

impl Columns<'_> {
    /// Gathers the bags feature-major and checks the samples.
    fn finish(self) -> Result<Request> {
        let Columns {
            spec,
            n,
            dense,
            ids,
            spans,
        } = self;
        let nf = spec.features().len();
        let mut lengths = Vec::with_capacity(n * nf);
        for f in 0..nf {
            lengths.extend((0..n).map(|s| spans[s * nf + f].1));
        }
        let ids = match ids {
            Ids::U32(v) => Ids::U32(gather(&v, &spans, n, nf)),
            Ids::I64(v) => Ids::I64(gather(&v, &spans, n, nf)),
        };
        drop(spans);
        spec.check(n, dense, lengths, ids)
    }
}

/// The bags of `ids` (sample-major spans) feature-major.
fn gather<T: Copy>(ids: &[T], spans: &[(u32, u32)], n: usize, nf: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(ids.len());
    for f in 0..nf {
        for s in 0..n {
            let (at, len) = spans[s * nf + f];
            out.extend_from_slice(&ids[at as usize..(at + len) as usize]);
        }
    }
    out
}

/// The body: one sample object, or an array of them.
struct Body<'c, 's>(&'c mut Columns<'s>);

impl<'de> DeserializeSeed<'de> for Body<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Body<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sample object or an array of them")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<(), A::Error> {
        Sample(self.0).visit_map(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while seq.next_element_seed(Sample(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

/// One sample: `{"dense": [...], "sparse": {...}}`, both required, nothing else.
struct Sample<'c, 's>(&'c mut Columns<'s>);

impl<'de> DeserializeSeed<'de> for Sample<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Sample<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sample object {\"dense\": [...], \"sparse\": {...}}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let c = self.0;
        let s = c.n;
        let nf = c.spec.features().len();
        // Unseen bags are marked with a length no bag can have.
        c.spans.extend(std::iter::repeat_n((0, u32::MAX), nf));
        let (mut dense, mut sparse) = (false, false);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "dense" if !dense => {
                    dense = true;
                    let mut got = 0;
                    map.next_value_seed(Dense(&mut *c, &mut got))?;
                    if got != c.spec.dense_in() {
                        return Err(de::Error::custom(format!(
                            "sample {s}: 'dense' has {got} values; the model takes {}",
                            c.spec.dense_in()
                        )));
                    }
                }
                "sparse" if !sparse => {
                    sparse = true;
                    map.next_value_seed(Sparse(&mut *c))?;
                }
                "dense" | "sparse" => {
                    return Err(de::Error::custom(format!(
                        "sample {s}: '{key}' is given twice"
                    )));
                }
                k => {
                    return Err(de::Error::custom(format!(
                        "sample {s}: unknown field '{k}' (a sample has 'dense' and 'sparse')"
                    )));
                }
            }
        }
        let missing = match (dense, sparse) {
            (false, _) => Some("dense"),
            (_, false) => Some("sparse"),
            _ => None,
        };
        if let Some(m) = missing {
            return Err(de::Error::custom(format!(
                "sample {s}: missing field '{m}'"
            )));
        }
        let first = s * nf;
        if let Some(f) = (0..nf).find(|&f| c.spans[first + f].1 == u32::MAX) {
            return Err(de::Error::custom(format!(
                "sample {s}: sparse feature '{}' is missing (send [] for an empty bag)",
                c.spec.features()[f]
            )));
        }
        c.n += 1;
        Ok(())
    }
}

/// A sample's dense values, appended as f32 (up to the model's width) and counted.
struct Dense<'c, 's>(&'c mut Columns<'s>, &'c mut usize);

impl<'de> DeserializeSeed<'de> for Dense<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Dense<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of numbers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let (c, got) = (self.0, self.1);
        while let Some(v) = seq.next_element::<f64>()? {
            // More than the model takes is refused once counted: not stored.
            if *got < c.spec.dense_in() {
                c.dense.push(v as f32);
            }
            *got += 1;
        }
        Ok(())
    }
}

/// A sample's bags: `{"<feature>": [ids...], ...}`.
struct Sparse<'c, 's>(&'c mut Columns<'s>);

impl<'de> DeserializeSeed<'de> for Sparse<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Sparse<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of feature names to arrays of ids")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let c = self.0;
        let s = c.n;
        let nf = c.spec.features().len();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let Some(&f) = c.spec.feature_index.get(&*key) else {
                return Err(de::Error::custom(format!(
                    "sample {s}: unknown sparse feature '{key}' (the model's are {})",
                    c.spec.features().join(", ")
                )));
            };
            if c.spans[s * nf + f].1 != u32::MAX {
                return Err(de::Error::custom(format!(
                    "sample {s}: sparse feature '{key}' is given twice"
                )));
            }
            let at = c.ids.len();
            map.next_value_seed(Bag(&mut *c))?;
            let len = c.ids.len() - at;
            let (Ok(at), Ok(len)) = (u32::try_from(at), u32::try_from(len)) else {
                return Err(de::Error::custom("too many ids in one request"));
            };
            c.spans[s * nf + f] = (at, len);
        }
        Ok(())
    }
}

/// One bag's ids.
struct Bag<'c, 's>(&'c mut Columns<'s>);

impl<'de> DeserializeSeed<'de> for Bag<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Bag<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of integer ids")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(id) = seq.next_element::<i64>()? {
            self.0.ids.push(id);
        }
        Ok(())
    }
}
