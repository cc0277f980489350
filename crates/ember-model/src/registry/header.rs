//! Safetensors headers, as far as the registry needs them: read from a file or from bytes in
//! memory (bounded, every entry within the data), packed and written back. The dense weights
//! stored with a version are a safetensors file of every tensor of `model.safetensors` but the
//! tables ([`TABLE_PREFIX`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::{ModelError, Result};

/// The prefix of table tensors in `model.safetensors`.
pub(crate) const TABLE_PREFIX: &str = "tables.";

/// A tensor of a safetensors file: name, dtype, shape and its bytes' range in the data section.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The tensor's name.
    pub name: String,
    /// Its dtype as safetensors names it (`F32`, `BF16`, `U8`, ...).
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its bytes in the data section.
    pub range: std::ops::Range<usize>,
}

/// The entries of a safetensors header `head` (`__metadata__` left out), in data order; each
/// must lie within `data_len` bytes of data.
pub(crate) fn parse_header(path: &Path, head: &[u8], data_len: usize) -> Result<Vec<Entry>> {
    let bad = |reason: String| ModelError::Safetensors {
        path: path.into(),
        reason,
    };
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(head).map_err(|source| ModelError::SafetensorsHeader {
            path: path.into(),
            source,
        })?;
    let sizes = |v: Option<&serde_json::Value>| -> Option<Vec<usize>> {
        v?.as_array()?
            .iter()
            .map(|x| usize::try_from(x.as_u64()?).ok())
            .collect()
    };
    let mut out = Vec::new();
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        let e = (|| {
            let [a, b] = sizes(v.get("data_offsets"))?[..] else {
                return None;
            };
            (a <= b && b <= data_len).then_some(())?;
            Some(Entry {
                name: name.clone(),
                dtype: v.get("dtype")?.as_str()?.to_string(),
                shape: sizes(v.get("shape"))?,
                range: a..b,
            })
        })();
        out.push(e.ok_or_else(|| bad(format!("tensor {name} is not a valid entry")))?);
    }
    out.sort_by_key(|e| e.range.start);
    Ok(out)
}

/// The length of a safetensors header from its first 8 bytes, bounded.
fn header_len(path: &Path, first: [u8; 8], total: u64) -> Result<usize> {
    let n = u64::from_le_bytes(first);
    match n.checked_add(8).is_some_and(|end| end <= total) && n <= 100 << 20 {
        true => Ok(n as usize),
        false => Err(ModelError::Safetensors {
            path: path.into(),
            reason: format!("a header of {n} bytes in {total} bytes"),
        }),
    }
}

/// The entries of a safetensors file, and where its data section starts.
pub(crate) fn read_header(path: &Path, file: &File) -> Result<(Vec<Entry>, u64)> {
    let io = |source| ModelError::Io {
        path: path.into(),
        source,
    };
    let total = file.metadata().map_err(io)?.len();
    let mut first = [0u8; 8];
    file.read_exact_at(&mut first, 0).map_err(io)?;
    let n = header_len(path, first, total)?;
    let mut head = vec![0u8; n];
    file.read_exact_at(&mut head, 8).map_err(io)?;
    let data_len = usize::try_from(total - 8 - n as u64).unwrap_or(usize::MAX);
    Ok((parse_header(path, &head, data_len)?, 8 + n as u64))
}

/// The entries of a safetensors file held in memory, and where its data section starts.
pub(crate) fn header_of_bytes(path: &Path, bytes: &[u8]) -> Result<(Vec<Entry>, usize)> {
    let first: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| ModelError::Safetensors {
            path: path.into(),
            reason: "shorter than its header".into(),
        })?;
    let n = header_len(path, first, bytes.len() as u64)?;
    let entries = parse_header(path, &bytes[8..8 + n], bytes.len() - 8 - n)?;
    Ok((entries, 8 + n))
}

/// A safetensors header for `entries` (their ranges packed in order), padded to 8 bytes.
pub(crate) fn write_header(entries: &[Entry]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    for e in entries {
        map.insert(
            e.name.clone(),
            serde_json::json!({
                "dtype": e.dtype,
                "shape": e.shape,
                "data_offsets": [e.range.start, e.range.end],
            }),
        );
    }
    let mut json = serde_json::to_vec(&map).expect("a header serializes");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out
}

/// Packs `entries`' ranges back to back in their order; returns the bytes they take.
pub(crate) fn pack(entries: &mut [Entry]) -> usize {
    let mut at = 0;
    for e in entries {
        let len = e.range.len();
        e.range = at..at + len;
        at += len;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked() {
        let p = Path::new("x");
        let entry =
            |off: &str| format!(r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":{off}}}}}"#);
        assert_eq!(
            parse_header(p, entry("[0,8]").as_bytes(), 8).unwrap()[0].range,
            0..8
        );
        for bad in ["[0,9]", "[8,0]", "[0]", "\"x\""] {
            assert!(parse_header(p, entry(bad).as_bytes(), 8).is_err(), "{bad}");
        }
        assert!(header_of_bytes(p, &[1, 2, 3]).is_err());
        assert!(header_of_bytes(p, &u64::MAX.to_le_bytes()).is_err());
        // A written header reads back (padded to 8 bytes).
        let mut e = vec![Entry {
            name: "w".into(),
            dtype: "F16".into(),
            shape: vec![3, 1],
            range: 5..11,
        }];
        assert_eq!(pack(&mut e), 6);
        let mut bytes = write_header(&e);
        assert_eq!(bytes.len() % 8, 0);
        bytes.extend_from_slice(&[0; 6]);
        let (back, at) = header_of_bytes(p, &bytes).unwrap();
        assert_eq!(
            (back[0].range.clone(), back[0].shape.clone(), at),
            (0..6, vec![3, 1], bytes.len() - 6)
        );
        assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
    }
}
