//! Batches of samples as named arrays, for `ember predict` on any model: a NumPy `.npz`
//! (`np.savez` or `np.savez_compressed`) or a safetensors file holding the KServe v2 inputs of
//! the model, whole-file:
//!
//! | name | dtype | shape |
//! |---|---|---|
//! | `dense` | float32 (or float64, read as float32) | `[N, dense_in]` |
//! | `<F>_lengths`, each sparse feature `F` | int32 or int64 | `[N]` |
//! | `<F>_ids` | int32 or int64 | `[sum of F's lengths]` |
//! | `label` (optional) | float32, float64, int32 or int64 | `[N]` |
//!
//! The file is checked as a whole once (names, dtypes, shapes, lengths against ids), then cut
//! into batches of `--batch` samples, each decoded by the server's own decoder
//! ([`kserve::decode_tensors`]: the same checks and messages as a request). A safetensors file
//! is mapped, not read; an `.npz` is read into memory (its members may be compressed).

use anyhow::{Context, Result, bail};
use ember_serve::kserve::{self, IntSink, Tensor};
use ember_serve::{ModelSpec, ServeError};
use std::collections::BTreeMap;
use std::io::Read;
use std::ops::Range;
use std::path::Path;

/// The element types read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elem {
    F32,
    F64,
    I32,
    I64,
}

impl Elem {
    fn width(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::F64 | Elem::I64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Elem::F32 => "float32",
            Elem::F64 => "float64",
            Elem::I32 => "int32",
            Elem::I64 => "int64",
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64)
    }
}

/// One array: its type, shape and little-endian bytes (a range of the file's buffer).
#[derive(Debug)]
struct Array {
    elem: Elem,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

/// A file's arrays over the bytes that hold them.
#[derive(Debug)]
pub struct TensorFile {
    buf: Buf,
    arrays: BTreeMap<String, Array>,
}

#[derive(Debug)]
enum Buf {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Buf {
    fn all(&self) -> &[u8] {
        match self {
            Buf::Map(m) => &m[..],
            Buf::Owned(v) => &v[..],
        }
    }
}

impl TensorFile {
    /// Reads `path`: `.npz` as NumPy, anything else as safetensors.
    pub fn open(path: &Path, npz: bool) -> Result<TensorFile> {
        let f = std::fs::File::open(path)
            .with_context(|| format!("cannot open data file {}", path.display()))?;
        let t = if npz {
            read_npz(f)
        } else {
            // SAFETY: the map is only read, and predict holds it for one run; a file changed
            // underneath gives wrong values, not unsoundness beyond what memmap2 documents.
            let map = unsafe { memmap2::Mmap::map(&f) }?;
            read_safetensors(Buf::Map(map))
        };
        t.with_context(|| format!("reading {}", path.display()))
    }

    /// Reads a file's bytes held in memory, as [`Self::open`] reads the file: the entry of the
    /// fuzz targets and of their replay test (`fuzz/`, which compile this file themselves: the
    /// `ember` binary has no library).
    #[allow(dead_code, reason = "called by the fuzz targets, not by the binary")]
    pub fn from_bytes(bytes: Vec<u8>, npz: bool) -> Result<TensorFile> {
        match npz {
            true => read_npz(std::io::Cursor::new(bytes)),
            false => read_safetensors(Buf::Owned(bytes)),
        }
    }

    fn bytes(&self, a: &Array) -> &[u8] {
        &self.buf.all()[a.bytes.clone()]
    }

    /// Checks the arrays against the model's inputs: every one present with a dtype and shape
    /// that fit, nothing else; answers the number of samples.
    pub fn check(&self, spec: &ModelSpec) -> Result<usize> {
        let want = |name: &str| -> Result<&Array> {
            self.arrays.get(name).with_context(|| {
                format!(
                    "no array '{name}': the file needs 'dense', '<F>_lengths' and '<F>_ids' for \
                     each sparse feature F ({}), and may have 'label'; it has {}",
                    spec.features().join(", "),
                    self.names()
                )
            })
        };
        let dense = want("dense")?;
        if !dense.elem.is_float() || dense.shape.len() != 2 || dense.shape[1] != spec.dense_in() {
            bail!(
                "'dense' is {} {:?}; the model takes float32 [N, {}]",
                dense.elem.name(),
                dense.shape,
                spec.dense_in()
            );
        }
        let n = dense.shape[0];
        for f in spec.features() {
            let l = want(&format!("{f}_lengths"))?;
            let i = want(&format!("{f}_ids"))?;
            for (name, a) in [(format!("{f}_lengths"), l), (format!("{f}_ids"), i)] {
                if a.elem.is_float() || a.shape.len() != 1 {
                    bail!(
                        "'{name}' is {} {:?}; it must be int32 or int64, 1-d",
                        a.elem.name(),
                        a.shape
                    );
                }
            }
            if l.shape[0] != n {
                bail!(
                    "'{f}_lengths' has {} values; 'dense' has {n} samples",
                    l.shape[0]
                );
            }
            let total = self.total(l, &format!("{f}_lengths"))?;
            if total != i.shape[0] {
                bail!(
                    "'{f}_lengths' add up to {total} ids but '{f}_ids' has {}",
                    i.shape[0]
                );
            }
        }
        if let Some(l) = self.arrays.get("label")
            && l.shape != [n]
        {
            bail!(
                "'label' has shape {:?}; 'dense' has {n} samples: [{n}]",
                l.shape
            );
        }
        let known = |k: &str| {
            k == "dense"
                || k == "label"
                || spec
                    .features()
                    .iter()
                    .any(|f| k == format!("{f}_lengths") || k == format!("{f}_ids"))
        };
        if let Some(k) = self.arrays.keys().find(|k| !known(k)) {
            bail!(
                "unknown array '{k}': the model takes 'dense', '<F>_lengths' and '<F>_ids' for \
                 its sparse features ({}) and an optional 'label'",
                spec.features().join(", ")
            );
        }
        Ok(n)
    }

    fn names(&self) -> String {
        let v: Vec<&str> = self.arrays.keys().map(String::as_str).collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    }

    /// The sum of a lengths array; a negative length, or a sum past `usize`, is an error (a
    /// sum that wrapped passed the check against the ids and cut batches past the file's end).
    fn total(&self, a: &Array, name: &str) -> Result<usize> {
        let mut vals = Vec::new();
        self.view(name, a, 0..a.shape[0])
            .read_ints(a.shape[0], &mut vals)?;
        let mut total = 0usize;
        for (s, v) in vals.into_iter().enumerate() {
            let v = usize::try_from(v)
                .with_context(|| format!("'{name}': length {v} of sample {s} is negative"))?;
            total = total.checked_add(v).with_context(|| {
                format!(
                    "'{name}': the lengths up to sample {s} add up past {}",
                    usize::MAX
                )
            })?;
        }
        Ok(total)
    }

    /// The labels, if the file has them (read as the other arrays are: floats as FP32).
    pub fn labels(&self) -> Result<Option<Vec<f32>>> {
        let Some(a) = self.arrays.get("label") else {
            return Ok(None);
        };
        let (n, view) = (a.shape[0], self.view("label", a, 0..a.shape[0]));
        let mut out = Vec::with_capacity(n);
        if a.elem.is_float() {
            view.read_floats(n, &mut out)?;
        } else {
            let mut ints: Vec<i64> = Vec::with_capacity(n);
            view.read_ints(n, &mut ints)?;
            out.extend(ints.into_iter().map(|l| l as f32));
        }
        Ok(Some(out))
    }

    /// Samples `range` (of a file [`Self::check`]ed against `spec`), decoded as a request is.
    /// `cursors` holds, for each feature in the model's order, where the range's ids start;
    /// batches are taken in order, each moving the cursors past its ids.
    pub fn batch(
        &self,
        spec: &ModelSpec,
        cursors: &mut [usize],
        range: Range<usize>,
    ) -> Result<ember_model::Samples, ServeError> {
        let dense = &self.arrays["dense"];
        let d = spec.dense_in();
        let mut views = vec![self.view("dense", dense, range.start * d..range.end * d)];
        views[0].shape = vec![range.len() as i64, d as i64];
        let mut lengths: Vec<i64> = Vec::new();
        for (f, at) in spec.features().iter().zip(cursors) {
            let ln = format!("{f}_lengths");
            let idn = format!("{f}_ids");
            let lv = self.view(&ln, &self.arrays[&ln], range.clone());
            lengths.clear();
            lv.read_ints(range.len(), &mut lengths)?;
            // Non-negative: checked with the whole file.
            let n: usize = lengths.iter().map(|&l| l as usize).sum();
            views.push(lv);
            views.push(self.view(&idn, &self.arrays[&idn], *at..*at + n));
            *at += n;
        }
        let r = kserve::decode_tensors(spec, &views)?;
        ember_model::serving::into_samples(r)
            .ok_or_else(|| ServeError::bad("the model does not take samples".to_string()))
    }

    /// Values `range` of array `a` as a 1-d request tensor.
    fn view<'a>(&'a self, name: &str, a: &Array, range: Range<usize>) -> View<'a> {
        let w = a.elem.width();
        View {
            name: name.to_string(),
            elem: a.elem,
            shape: vec![range.len() as i64],
            bytes: &self.bytes(a)[range.start * w..range.end * w],
        }
    }
}

/// A slice of an array as a request's input tensor.
struct View<'a> {
    name: String,
    elem: Elem,
    shape: Vec<i64>,
    bytes: &'a [u8],
}

impl Tensor for View<'_> {
    fn name(&self) -> &str {
        &self.name
    }

    /// The protocol's datatype; float64 reads as FP32 (converted), as `torch.float()` would.
    fn datatype(&self) -> &str {
        match self.elem {
            Elem::F32 | Elem::F64 => "FP32",
            Elem::I32 => "INT32",
            Elem::I64 => "INT64",
        }
    }

    fn shape(&self) -> &[i64] {
        &self.shape
    }

    fn read_floats(&self, want: usize, out: &mut Vec<f32>) -> Result<(), ServeError> {
        match self.elem {
            Elem::F64 => {
                let v = kserve::le_values::<8>(self, "the file", self.bytes, want)?;
                out.extend(v.iter().map(|b| f64::from_le_bytes(*b) as f32));
                Ok(())
            }
            _ => kserve::le_floats(self, "the file", self.bytes, want, out),
        }
    }

    fn read_ints<S: IntSink>(&self, want: usize, out: &mut S) -> Result<(), ServeError> {
        kserve::le_ints(self, "the file", self.bytes, want, out)
    }

    fn count(&self) -> usize {
        self.bytes.len() / self.elem.width()
    }
}

fn read_safetensors(buf: Buf) -> Result<TensorFile> {
    let arrays = safetensors_arrays(buf.all())?;
    Ok(TensorFile { buf, arrays })
}

/// The arrays of the safetensors file `all`, each over its range of `all`.
fn safetensors_arrays(all: &[u8]) -> Result<BTreeMap<String, Array>> {
    let st = safetensors::SafeTensors::deserialize(all).context("not a safetensors file")?;
    let base = all.as_ptr() as usize;
    let mut arrays = BTreeMap::new();
    for (name, t) in st.tensors() {
        let elem = match t.dtype() {
            safetensors::Dtype::F32 => Elem::F32,
            safetensors::Dtype::F64 => Elem::F64,
            safetensors::Dtype::I32 => Elem::I32,
            safetensors::Dtype::I64 => Elem::I64,
            other => bail!("'{name}' is {other:?}: float32, float64, int32 and int64 are read"),
        };
        let start = t.data().as_ptr() as usize - base;
        let bytes = start..start + t.data().len();
        arrays.insert(
            name,
            Array {
                elem,
                shape: t.shape().to_vec(),
                bytes,
            },
        );
    }
    Ok(arrays)
}

fn read_npz(f: impl Read + std::io::Seek) -> Result<TensorFile> {
    let mut zip = zip::ZipArchive::new(f).context("not a NumPy .npz (zip) file")?;
    let mut buf = Vec::new();
    let mut arrays = BTreeMap::new();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i)?;
        let full = member.name()?.to_string();
        let Some(name) = full.strip_suffix(".npy").map(str::to_string) else {
            bail!("member '{full}' is not a .npy array");
        };
        let start = buf.len();
        member
            .read_to_end(&mut buf)
            .with_context(|| format!("reading '{name}'"))?;
        let (elem, shape, data) =
            npy_header(&buf[start..]).with_context(|| format!("array '{name}'"))?;
        let data = start + data;
        let len = shape
            .iter()
            .try_fold(elem.width(), |n, &d| n.checked_mul(d))
            .with_context(|| format!("array '{name}': shape {shape:?} is too large"))?;
        if buf.len() - data != len {
            bail!(
                "array '{name}': {} data bytes for shape {shape:?} of {}",
                buf.len() - data,
                elem.name()
            );
        }
        arrays.insert(
            name,
            Array {
                elem,
                shape,
                bytes: data..data + len,
            },
        );
    }
    Ok(TensorFile {
        buf: Buf::Owned(buf),
        arrays,
    })
}

/// A `.npy` header: the element type, the shape and where the data starts.
fn npy_header(b: &[u8]) -> Result<(Elem, Vec<usize>, usize)> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        bail!("not a .npy array (no \\x93NUMPY magic)");
    }
    let (len, at) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => bail!(".npy format version {v} is not known"),
    };
    let header = b
        .get(at..at + len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .context("truncated or non-text .npy header")?;
    let field = |key: &str| -> Result<&str> {
        let k = format!("'{key}':");
        let i = header
            .find(&k)
            .with_context(|| format!("no '{key}' in the header {header:?}"))?;
        Ok(header[i + k.len()..].trim_start())
    };
    let descr = field("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split('\'').next())
        .unwrap_or(descr);
    let elem = match descr {
        "<f4" => Elem::F32,
        "<f8" => Elem::F64,
        "<i4" => Elem::I32,
        "<i8" => Elem::I64,
        d => bail!("dtype '{d}': float32, float64, int32 and int64 (little-endian) are read"),
    };
    if field("fortran_order")?.starts_with("True") {
        bail!("Fortran order: save it C-contiguous (np.ascontiguousarray)");
    }
    let shape = field("shape")?;
    let shape = shape
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .with_context(|| format!("shape in {header:?}"))?;
    let shape = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .with_context(|| format!("shape ({shape})"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((elem, shape, at + len))
}
