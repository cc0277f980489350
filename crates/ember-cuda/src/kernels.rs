//! Kernel sources and their configurations. The pooled-lookup kernel is one source
//! (`kernels/pool.cu`) specialised by `#define`s: one module per [`PoolConfig`].

use ember_embed::{DType, Pooling};
use serde::{Deserialize, Serialize};

/// The pooled-lookup kernel's source.
pub const POOL_SRC: &str = include_str!("kernels/pool.cu");
/// Batch deduplication kernels.
pub const DEDUP_SRC: &str = include_str!("kernels/dedup.cu");
/// Dense-part kernels (bias, activations, interactions).
pub const MODEL_SRC: &str = include_str!("kernels/model.cu");
/// The HSTU model's kernels (compiled after [`MODEL_SRC`], with `QK` and `HID` defined).
pub const HSTU_SRC: &str = include_str!("kernels/hstu.cu");
/// The second version of the HSTU model's bf16 attention (compiled after [`HSTU_SRC`]).
pub const HSTU_ATTN2_SRC: &str = include_str!("kernels/hstu_attn2.cu");
/// The HSTU pass's kernels for a cache of histories (compiled after [`HSTU_SRC`]).
pub const HSTU_CACHE_SRC: &str = include_str!("kernels/hstu_cache.cu");

/// The HSTU module's source for attention widths `qk` (q, k) and `hid` (u, v) per head, and
/// its name (the module cache's key).
pub fn hstu_source(qk: usize, hid: usize) -> (String, String) {
    (
        format!(
            "{MODEL_SRC}\n#define QK {qk}\n#define HID {hid}\n{HSTU_SRC}\n{HSTU_ATTN2_SRC}\n{HSTU_CACHE_SRC}"
        ),
        format!("hstu_q{qk}_h{hid}.cu"),
    )
}

/// How one feature's rows are loaded: elements per chunk, lanes per bag, chunks per lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// Elements per load (1: the scalar path).
    pub vec: u32,
    /// Lanes per bag: a power of two from 1 to 32.
    pub lanes: u32,
    /// Chunks each lane owns.
    pub chunks: u32,
}

/// Bits of one element of `dtype`.
fn elem_bits(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 32,
        DType::F16 | DType::BF16 => 16,
        DType::Int8 => 8,
        DType::Int4 => 4,
    }
}

impl Shape {
    /// The widest load (16, 8 or 4 bytes per lane) that the row layout allows, and enough lanes
    /// to cover the row with one chunk each, up to a warp; rows wider than a warp's loads give
    /// each lane several chunks. Rows whose layout allows no aligned vector load use the
    /// scalar path.
    pub fn for_table(dtype: DType, dim: usize) -> Shape {
        let bits = elem_bits(dtype);
        let stride = dtype.row_bytes(dim);
        let vec = [16usize, 8, 4]
            .into_iter()
            .map(|nb| nb * 8 / bits)
            .find(|&v| v > 1 && dim.is_multiple_of(v) && stride.is_multiple_of(v * bits / 8))
            .unwrap_or(1);
        let chunks_total = dim / vec;
        let lanes = chunks_total.next_power_of_two().clamp(1, 32);
        let chunks = chunks_total.div_ceil(lanes).max(1);
        Shape {
            vec: vec as u32,
            lanes: lanes as u32,
            chunks: chunks as u32,
        }
    }

    /// Bytes one chunk load reads.
    pub fn load_bytes(&self, dtype: DType) -> usize {
        (self.vec as usize * elem_bits(dtype)).div_ceil(8)
    }
}

/// How one launch of the pooled lookup is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Launch {
    /// Threads per block.
    pub block: u32,
    /// Register cap (`--maxrregcount`); 0: the compiler's choice within `__launch_bounds__`.
    pub max_regs: u32,
    /// Rows loaded ahead (register prefetch); 1: none.
    pub prefetch: u32,
}

impl Launch {
    /// The plain kernel: 256 threads, no register cap, no prefetch.
    pub const BASELINE: Launch = Launch {
        block: 256,
        max_regs: 0,
        prefetch: 1,
    };
    /// The baseline with four rows in flight per lane.
    pub const PREFETCH: Launch = Launch {
        prefetch: 4,
        ..Launch::BASELINE
    };
}

/// Everything that specialises one pooled-lookup module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolConfig {
    pub dtype: DType,
    pub shape: Shape,
    pub launch: Launch,
    pub id64: bool,
    pub pooling: Pooling,
    /// Tables in the L2-pinned layout (a row map and a hot region).
    pub pin: bool,
}

impl PoolConfig {
    /// The source with this configuration's `#define`s in front.
    pub fn source(&self) -> String {
        let mode = match self.pooling {
            Pooling::Sum => 0,
            Pooling::Mean => 1,
            Pooling::WeightedSum => 2,
        };
        format!(
            "#define DT {}\n#define VEC {}\n#define LANES {}\n#define CH {}\n#define P {}\n\
             #define ID64 {}\n#define MODE {}\n#define BLOCK {}\n#define REGCAP {}\n#define PIN {}\n{}",
            self.dtype.code(),
            self.shape.vec,
            self.shape.lanes,
            self.shape.chunks,
            self.launch.prefetch,
            u32::from(self.id64),
            mode,
            self.launch.block,
            self.launch.max_regs,
            u32::from(self.pin),
            POOL_SRC
        )
    }

    /// NVRTC options beyond the architecture.
    pub fn options(&self) -> Vec<String> {
        if self.launch.max_regs > 0 {
            vec![format!("--maxrregcount={}", self.launch.max_regs)]
        } else {
            Vec::new()
        }
    }

    /// A readable name, used as the program name and the module cache's key.
    pub fn name(&self) -> String {
        format!(
            "pool_{}_v{}_l{}_c{}_p{}_{}_{}_b{}_r{}{}.cu",
            self.dtype,
            self.shape.vec,
            self.shape.lanes,
            self.shape.chunks,
            self.launch.prefetch,
            if self.id64 { "i64" } else { "u32" },
            self.pooling.name(),
            self.launch.block,
            self.launch.max_regs,
            if self.pin { "_pin" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_use_16_byte_loads_where_rows_allow_and_cover_every_element() {
        let s = Shape::for_table(DType::F32, 128);
        assert_eq!((s.vec, s.lanes, s.chunks), (4, 32, 1));
        assert_eq!(s.load_bytes(DType::F32), 16);
        let s = Shape::for_table(DType::F32, 64);
        assert_eq!((s.vec, s.lanes, s.chunks), (4, 16, 1));
        let s = Shape::for_table(DType::F32, 512);
        assert_eq!((s.vec, s.lanes, s.chunks), (4, 32, 4));
        let s = Shape::for_table(DType::F16, 128);
        assert_eq!((s.vec, s.lanes, s.chunks), (8, 16, 1));
        // int8 rows of 128 codes are 136 bytes: 16-byte loads would be misaligned on odd rows.
        let s = Shape::for_table(DType::Int8, 128);
        assert_eq!((s.vec, s.load_bytes(DType::Int8)), (8, 8));
        // Odd dims fall back to the scalar path.
        for dt in DType::ALL {
            let s = Shape::for_table(dt, 13);
            assert_eq!(s.vec, 1, "{dt}");
        }
        // Every (dtype, dim) is covered exactly: vec * lanes * chunks >= dim, rows aligned.
        for dt in DType::ALL {
            for dim in 1..300 {
                let s = Shape::for_table(dt, dim);
                let (v, l, c) = (s.vec as usize, s.lanes as usize, s.chunks as usize);
                assert!(dim.is_multiple_of(v), "{dt} {dim}");
                assert!(v * l * c >= dim, "{dt} {dim}");
                assert!(l.is_power_of_two() && l <= 32, "{dt} {dim}");
                if v > 1 {
                    let nb = s.load_bytes(dt);
                    assert!([4, 8, 16].contains(&nb), "{dt} {dim}");
                    assert!(dt.row_bytes(dim).is_multiple_of(nb), "{dt} {dim}");
                }
                // No lane idles for a whole row when one chunk per lane would do.
                assert!(c == 1 || l == 32, "{dt} {dim}");
            }
        }
    }

    #[test]
    fn sources_carry_their_configuration() {
        let c = PoolConfig {
            dtype: DType::Int4,
            shape: Shape::for_table(DType::Int4, 64),
            launch: Launch::PREFETCH,
            id64: true,
            pooling: Pooling::WeightedSum,
            pin: false,
        };
        let s = c.source();
        assert!(s.starts_with("#define DT 4\n"));
        assert!(s.contains("#define P 4\n") && s.contains("#define MODE 2\n"));
        assert!(s.contains("#define ID64 1\n") && s.contains("#define PIN 0\n"));
        assert!(s.contains("extern \"C\" __global__"));
        assert!(c.options().is_empty());
        let capped = PoolConfig {
            launch: Launch {
                max_regs: 40,
                ..Launch::BASELINE
            },
            ..c
        };
        assert_eq!(capped.options(), vec!["--maxrregcount=40".to_string()]);
        assert_ne!(capped.name(), c.name());
    }
}
