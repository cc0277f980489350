//! Reading `model.safetensors` against a [`ModelConfig`]: every expected tensor must be present
//! with the right dtype and shape, and nothing else may be there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ember_embed::{DType, EmbeddingTable, Placement};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::config::{InteractionConfig, ModelConfig, TableConfig};
use crate::error::{ModelError, Result};
use crate::interaction::CrossLayer;
use crate::mlp::{Linear, Mlp};

/// Everything the weights file holds, in Ember's types.
#[derive(Debug)]
pub struct Weights {
    pub bottom: Mlp,
    pub top: Mlp,
    pub cross: Vec<CrossLayer>,
    pub tables: Vec<EmbeddingTable>,
    /// A graph model's dense part (`dense.onnx`), read beside the weights.
    pub graph: Option<crate::graph::Graph>,
}

/// Reads a mapped `model.safetensors`, remembering which tensors were read so that
/// [`Reader::check_all_used`] can refuse what no part of the model read. Both families (DLRM's
/// [`read_weights`] and the HSTU reader) read through it.
pub(crate) struct Reader<'a> {
    path: PathBuf,
    st: SafeTensors<'a>,
    used: BTreeSet<String>,
}

impl<'a> Reader<'a> {
    /// A reader of `map`, the mapping of the file at `path`.
    pub(crate) fn new(path: &Path, map: &'a memmap2::Mmap) -> Result<Reader<'a>> {
        let st = SafeTensors::deserialize(map).map_err(|source| ModelError::SafetensorsFormat {
            path: path.into(),
            source,
        })?;
        Ok(Reader {
            path: path.into(),
            st,
            used: BTreeSet::new(),
        })
    }
}

impl Reader<'_> {
    pub(crate) fn err(&self, tensor: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Weights {
            path: self.path.clone(),
            tensor: tensor.into(),
            reason: reason.into(),
        }
    }

    fn raw(&mut self, name: &str, dtype: StDtype, shape: &[usize]) -> Result<&[u8]> {
        let t = self
            .st
            .tensor(name)
            .map_err(|_| self.err(name, "missing"))?;
        if t.dtype() != dtype {
            return Err(self.err(
                name,
                format!("dtype is {:?}, expected {dtype:?}", t.dtype()),
            ));
        }
        if t.shape() != shape {
            return Err(self.err(
                name,
                format!("shape is {:?}, expected {shape:?}", t.shape()),
            ));
        }
        self.used.insert(name.to_string());
        Ok(t.data())
    }

    /// The f32 tensor `name` of exactly `shape` (subnormals read as zero).
    pub(crate) fn f32s(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let data = self.raw(name, StDtype::F32, shape)?;
        Ok(data
            .chunks_exact(4)
            .map(|c| flush(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect())
    }

    fn mlp(
        &mut self,
        prefix: &str,
        in_dim: usize,
        sizes: &[usize],
        relu_last: bool,
    ) -> Result<Mlp> {
        let mut layers = Vec::with_capacity(sizes.len());
        let mut k_in = in_dim;
        for (k, &out) in sizes.iter().enumerate() {
            let w = self.f32s(&format!("{prefix}.{k}.weight"), &[out, k_in])?;
            let b = self.f32s(&format!("{prefix}.{k}.bias"), &[out])?;
            let relu = relu_last || k + 1 < sizes.len();
            layers.push(Linear::new(k_in, out, w, b, relu));
            k_in = out;
        }
        Ok(Mlp::new(layers))
    }
}

/// Reads and checks the weights of `cfg` from `path`. `table_dtype` re-encodes every table
/// (e.g. quantizes f32 tables to int8) as it is loaded.
pub fn read_weights(
    path: &Path,
    cfg: &ModelConfig,
    table_dtype: Option<DType>,
    pace: Pace,
) -> Result<Weights> {
    let map = map_weights(path)?;
    let mut r = Reader::new(path, &map)?;
    let bottom = r.mlp("bottom_mlp", cfg.dense_in, &cfg.bottom_mlp, true)?;
    let top = r.mlp("top_mlp", cfg.top_in(), &cfg.top_mlp, false)?;
    let cross = r.cross(cfg)?;
    let tables = r.tables(&map, &cfg.tables, cfg.remote.as_ref(), table_dtype, pace)?;
    r.check_all_used()?;
    Ok(Weights {
        bottom,
        top,
        cross,
        tables,
        graph: None,
    })
}

/// Opens `path` (a regular file) and maps it read-only.
pub(crate) fn map_weights(path: &Path) -> Result<memmap2::Mmap> {
    let file = ember_embed::files::open_regular(path, "weights file").map_err(|source| {
        ModelError::Io {
            path: path.into(),
            source,
        }
    })?;
    // SAFETY: the mapping is read-only and lives only while the weights are copied out of it
    // (every tensor is copied; `read_weights` drops the map before it returns), so a 4 GB table
    // is not read into a second buffer first. Another process truncating or rewriting the file
    // during those seconds would be undefined behaviour (SIGBUS or torn values); model files are
    // not modified in place while a server loads them (export a new directory instead).
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ModelError::Io {
        path: path.into(),
        source,
    })
}

impl Reader<'_> {
    /// The tables `tables` as their placements say: copied out of `map` (the mapping this
    /// reader reads) for DRAM, opened from their row files or the remote store otherwise.
    pub(crate) fn tables(
        &mut self,
        map: &memmap2::Mmap,
        tables: &[TableConfig],
        remote: Option<&crate::config::RemoteConfig>,
        table_dtype: Option<DType>,
        pace: Pace,
    ) -> Result<Vec<EmbeddingTable>> {
        let mut out = Vec::with_capacity(tables.len());
        for t in tables {
            let table = match t.placement {
                Placement::Remote => self.remote_table(remote, t, table_dtype)?,
                Placement::Dram => self.dram_table(map, t, table_dtype, pace)?,
                _ => self.file_table(t, table_dtype)?,
            };
            out.push(table);
        }
        Ok(out)
    }

    /// The DCN cross layers of `cfg` (none for other interactions).
    fn cross(&mut self, cfg: &ModelConfig) -> Result<Vec<CrossLayer>> {
        let mut cross = Vec::new();
        if let InteractionConfig::Dcn { layers, low_rank } = cfg.interaction {
            let n = cfg.top_in();
            for l in 0..layers {
                let v = self.f32s(&format!("crossnet.{l}.V"), &[low_rank, n])?;
                let w = self.f32s(&format!("crossnet.{l}.W"), &[n, low_rank])?;
                let b = self.f32s(&format!("crossnet.{l}.bias"), &[n])?;
                cross.push(CrossLayer {
                    v: Linear::new(n, low_rank, v, vec![0.0; low_rank], false),
                    w: Linear::new(low_rank, n, w, b, false),
                });
            }
        }
        Ok(cross)
    }

    /// Marks every tensor whose name starts with `prefix` used (parts the reference always
    /// writes that the model does not run, such as a layer with no inputs).
    pub(crate) fn allow_unused_prefix(&mut self, prefix: &str) {
        for n in self.st.names() {
            if n.starts_with(prefix) {
                self.used.insert(n.to_string());
            }
        }
    }

    /// Marks the file's copy of table `name` used, if it has one (allowed, and not read, for a
    /// table whose rows live elsewhere).
    fn allow_unused_copy(&mut self, name: String) {
        if self.st.names().iter().any(|n| **n == name) {
            self.used.insert(name);
        }
    }

    /// A table placed remote: its rows come from the cluster (or, with `fallback_local`, from
    /// its row file beside the weights while the cluster is away).
    fn remote_table(
        &mut self,
        remote: Option<&crate::config::RemoteConfig>,
        t: &TableConfig,
        table_dtype: Option<DType>,
    ) -> Result<EmbeddingTable> {
        self.allow_unused_copy(format!("tables.{}", t.name));
        if table_dtype.is_some_and(|d| d != t.dtype) {
            return Err(ModelError::BadOption {
                option: "table_dtype",
                reason: format!(
                    "table '{}' is placed remote and cannot be re-encoded at load: push it \
                     in the dtype to serve (ember registry push --table-dtype)",
                    t.name
                ),
            });
        }
        if remote.is_some_and(|r| r.fallback_local) {
            let copy = open_row_file(&self.path, t, table_dtype)?;
            Ok(EmbeddingTable::remote_with_copy(copy)?)
        } else {
            Ok(EmbeddingTable::remote(&t.name, t.rows, t.dim, t.dtype)?)
        }
    }

    /// A table on the SSD tier: its rows come from its row file beside the weights.
    fn file_table(
        &mut self,
        t: &TableConfig,
        table_dtype: Option<DType>,
    ) -> Result<EmbeddingTable> {
        self.allow_unused_copy(format!("tables.{}", t.name));
        open_row_file(&self.path, t, table_dtype)
    }

    /// A table in DRAM: copied out of `map` (the mapping `self.st` reads), its pages of the
    /// file then dropped, and re-encoded to `table_dtype` where that differs.
    fn dram_table(
        &mut self,
        map: &memmap2::Mmap,
        t: &TableConfig,
        table_dtype: Option<DType>,
        pace: Pace,
    ) -> Result<EmbeddingTable> {
        let (st_dtype, cols) = match t.dtype {
            DType::F32 => (StDtype::F32, t.dim),
            DType::F16 => (StDtype::F16, t.dim),
            DType::BF16 => (StDtype::BF16, t.dim),
            DType::Int8 | DType::Int4 => (StDtype::U8, t.dtype.row_bytes(t.dim)),
        };
        let bytes = self.raw(&format!("tables.{}", t.name), st_dtype, &[t.rows, cols])?;
        let span = (bytes.as_ptr() as usize - map.as_ptr() as usize, bytes.len());
        // The advice below is unchecked: the span must lie in `map` (it does when `map` is the
        // mapping `self.st` reads, as the caller passes; checked once per table).
        assert!(
            (bytes.as_ptr() as usize) >= (map.as_ptr() as usize) && span.0 + span.1 <= map.len(),
            "table '{}' is not in the mapping passed",
            t.name
        );
        let table = copy_table(t, bytes, pace)?;
        // The table is copied: its pages of the file leave this process's memory now, not when
        // the map is dropped, so that a load holds the copies and one table of the file (a new
        // version loading beside the served one costs its own size, not twice that).
        // SAFETY: the span lies in `map` (asserted above), a read-only private file mapping;
        // MADV_DONTNEED only drops its resident pages, and a later read of them (none is made) would fault them back in from
        // the file unchanged.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, span.0, span.1)
        };
        match table_dtype {
            Some(d) if d != t.dtype => recode(&table, d),
            _ => Ok(table),
        }
    }

    /// Fails on the first tensor of the file that no part of the model read.
    pub(crate) fn check_all_used(&self) -> Result<()> {
        let extra: Vec<String> = self
            .st
            .names()
            .into_iter()
            .filter(|n| !self.used.contains(*n))
            .map(|s| s.to_string())
            .collect();
        if let Some(first) = extra.first() {
            return Err(self.err(
                first,
                format!(
                    "not part of the model described by config.json ({} unexpected tensor(s); a \
                     mismatched export?)",
                    extra.len()
                ),
            ));
        }
        Ok(())
    }
}

/// How a load copies DRAM tables beside a serving version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pace {
    /// At most this many bytes per second (leaves serving memory bandwidth); `None`: as fast
    /// as it goes.
    pub bytes_per_s: Option<u64>,
    /// Sleep briefly after every [`BREATHE_EVERY`] bytes (see `copy_table` for why).
    pub breathe: bool,
}

impl Pace {
    /// How a version loads while another serves: breathing, and at most `bytes_per_s`.
    pub fn background(bytes_per_s: Option<u64>) -> Pace {
        Pace {
            bytes_per_s,
            breathe: true,
        }
    }
}

/// Bytes a background load copies between two sleeps: 1 MiB, ~0.1-0.3 ms of copying and page
/// faults on a 2 MiB-page table.
pub const BREATHE_EVERY: usize = 1 << 20;

/// The sleep: long enough for the core to go idle.
const BREATHE_SLEEP: std::time::Duration = std::time::Duration::from_micros(50);

/// A DRAM table of `t` from its bytes in the file, copied once into its own (2 MiB-page) memory
/// with f32 / bf16 subnormals flushed on the way, 256 KiB at a time; with `pace.bytes_per_s`, at
/// most that many bytes per second (a load beside a serving version leaves it memory bandwidth).
///
/// With `pace.breathe` the copy sleeps briefly after each [`BREATHE_EVERY`] bytes. The loading
/// thread runs in the idle scheduling class, but while it is runnable its core never goes idle,
/// and Linux moves a request thread waiting on the other core's queue onto a core only when
/// that core goes idle or at its next periodic balance, milliseconds later: `perf sched` of
/// `bench/swap.sh` on 2 cores found request threads runnable but waiting 3-13 ms while the
/// other core ran the loader, 54% of all such waiting during a swap. A core that sleeps every
/// ~0.2 ms balances every ~0.2 ms.
fn copy_table(t: &crate::config::TableConfig, bytes: &[u8], pace: Pace) -> Result<EmbeddingTable> {
    let mut table = EmbeddingTable::zeroed(
        &t.name,
        t.rows,
        t.dim,
        t.dtype,
        ember_embed::PagePolicy::Huge,
    )?;
    let dst = match table.fresh_bytes_mut() {
        Some(d) if d.len() == bytes.len() => d,
        // Rows padded in memory (none of today's dtypes): the plain path.
        _ => {
            let flushed = flush_bytes(bytes, t.dtype);
            return Ok(EmbeddingTable::from_bytes(
                &t.name, t.rows, t.dim, t.dtype, &flushed,
            )?);
        }
    };
    const CHUNK: usize = 256 << 10;
    let start = std::time::Instant::now();
    for (k, (d, s)) in dst.chunks_mut(CHUNK).zip(bytes.chunks(CHUNK)).enumerate() {
        d.copy_from_slice(s);
        flush_in_place(d, t.dtype);
        if pace.breathe && ((k + 1) * CHUNK).is_multiple_of(BREATHE_EVERY) {
            std::thread::sleep(BREATHE_SLEEP);
        }
        if let Some(rate) = pace.bytes_per_s.filter(|&r| r > 0) {
            let due = std::time::Duration::from_secs_f64(((k + 1) * CHUNK) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    Ok(table)
}

/// Flushes f32 / bf16 subnormals in `b` to zero (other dtypes are left alone).
fn flush_in_place(b: &mut [u8], dtype: DType) {
    match dtype {
        DType::F32 => b.chunks_exact_mut(4).for_each(|c| {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            c.copy_from_slice(&flush(v).to_le_bytes());
        }),
        DType::BF16 => b.chunks_exact_mut(2).for_each(|c| {
            // bf16 is the top half of an f32: exponent bits all zero with a mantissa is subnormal.
            let bits = u16::from_le_bytes([c[0], c[1]]);
            if bits & 0x7F80 == 0 && bits & 0x007F != 0 {
                c.copy_from_slice(&(bits & 0x8000).to_le_bytes());
            }
        }),
        _ => {}
    }
}

/// Where `ember convert` writes the row file of table `name` of the model directory `dir`.
pub fn row_file_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join("rows").join(format!("{name}.rows"))
}

/// Opens the row file of a table placed on `mmap` or `ssd`, and checks it is the table the config
/// describes.
fn open_row_file(
    weights: &Path,
    t: &crate::config::TableConfig,
    table_dtype: Option<DType>,
) -> Result<EmbeddingTable> {
    let dir = weights.parent().unwrap_or(Path::new("."));
    let path = row_file_path(dir, &t.name);
    let bad = |reason: String| ModelError::Config {
        path: path.clone(),
        reason,
    };
    if !path.exists() {
        return Err(bad(format!(
            "table '{}' is placed on {} but its row file does not exist; write it with \
             `ember convert --model {}`",
            t.name,
            t.placement,
            dir.display()
        )));
    }
    if let Some(d) = table_dtype
        && d != t.dtype
    {
        return Err(bad(format!(
            "table '{}' is on {} in {}: it cannot be re-encoded as {d} at load; convert it with \
             --dtype {d}",
            t.name, t.placement, t.dtype
        )));
    }
    let table = EmbeddingTable::from_row_file(&path, t.placement, ember_embed::PagePolicy::Huge)?;
    if table.name() != t.name {
        return Err(bad(format!(
            "holds table '{}', not '{}' (a file copied under the wrong name?)",
            table.name(),
            t.name
        )));
    }
    if (table.rows(), table.dim(), table.dtype()) != (t.rows, t.dim, t.dtype) {
        return Err(bad(format!(
            "holds {} rows x dim {} {}, but config.json says table '{}' is {} x {} {}",
            table.rows(),
            table.dim(),
            table.dtype(),
            t.name,
            t.rows,
            t.dim,
            t.dtype
        )));
    }
    Ok(table)
}

/// Subnormal floats read as zero. Their effect on any output is below f32 resolution, and x86
/// runs arithmetic on them through microcode, about 100x slower: the shipped model, trained with
/// weight decay, had 18% subnormal table entries and 3,376 subnormal weights in one layer, and
/// scored 8.7x slower with faer (5.6x with Ember's GEMM) before this.
#[inline]
pub fn flush(v: f32) -> f32 {
    if v.is_subnormal() { 0.0 } else { v }
}

/// [`flush`] over the little-endian bytes of an f32 or bf16 tensor (f16 subnormals decode to
/// normal f32 values and are left alone).
pub fn flush_bytes(bytes: &[u8], dtype: DType) -> Vec<u8> {
    let mut out = bytes.to_vec();
    flush_in_place(&mut out, dtype);
    out
}

/// Re-encodes a table in another dtype.
pub fn recode(t: &EmbeddingTable, dtype: DType) -> Result<EmbeddingTable> {
    let Some(src) = t.resident() else {
        return Err(ember_embed::EmbedError::BadTable {
            table: t.name().into(),
            reason:
                "a table on the SSD tier cannot be re-encoded at load; convert it in that dtype"
                    .into(),
        }
        .into());
    };
    let stride = t.stride();
    let mut out = EmbeddingTable::zeroed(
        t.name(),
        t.rows(),
        t.dim(),
        dtype,
        ember_embed::PagePolicy::Huge,
    )?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    out.fill_rows(threads, |r, row| {
        t.dtype()
            .decode_row(&src[r * stride..(r + 1) * stride], row)
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnormals_flush_to_zero_and_nothing_else_changes() {
        let vals = [1e-40f32, -3e-42, 1.5, -0.0, f32::MIN_POSITIVE, 1e-30, 0.0];
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = flush_bytes(&bytes, DType::F32);
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [0.0, -0.0, 1.5, -0.0, f32::MIN_POSITIVE, 1e-30, 0.0]);
        let bf: Vec<u8> = vals
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let out = flush_bytes(&bf, DType::BF16);
        let got: Vec<f32> = out
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect();
        assert_eq!(got[0], 0.0);
        assert_eq!(got[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(got[2], 1.5);
        assert!(got[4] > 0.0 && got[5] > 0.0);
    }

    #[test]
    fn copied_tables_equal_the_flushed_bytes_across_chunks_and_dtypes() {
        // Past BREATHE_EVERY (so that a breathing copy sleeps mid-table) and a part of a chunk,
        // with subnormals at chunk edges; paced and breathing or not.
        let rows = (BREATHE_EVERY + 2 * (256 << 10)) / 14 + 7;
        for (dtype, dim) in [
            (DType::F32, 7),
            (DType::BF16, 7),
            (DType::F16, 7),
            (DType::Int8, 7),
        ] {
            let t = crate::config::TableConfig {
                name: "t".into(),
                rows,
                dim,
                dtype,
                placement: Placement::Dram,
            };
            let n = rows * dtype.row_bytes(dim);
            let mut s = 0x1234_5678_u64;
            let mut bytes: Vec<u8> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            assert!(n > BREATHE_EVERY, "{dtype:?}: {n} bytes");
            for at in [0, (256 << 10) - 4, 256 << 10, BREATHE_EVERY, n - 4] {
                bytes[at..at + 4].copy_from_slice(&1e-40f32.to_le_bytes());
            }
            let want = flush_bytes(&bytes, dtype);
            let paced = Pace {
                bytes_per_s: Some(1 << 40),
                breathe: true,
            };
            for pace in [Pace::default(), paced] {
                let got = copy_table(&t, &bytes, pace).unwrap();
                assert!(
                    got.resident().unwrap() == &want[..],
                    "{dtype:?} pace {pace:?}"
                );
            }
        }
    }
}
