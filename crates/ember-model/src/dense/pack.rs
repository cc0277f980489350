//! Weights converted and packed once, at load, in the layout of AMX's B tiles.
//!
//! A layer `W` (`[n, k]`, PyTorch's `[out, in]`) is cut into tiles of 16 outputs by one tile
//! step of inputs (32 bf16 or 64 int8). Within a tile, row `r` holds for each of the 16 outputs
//! `c` the `g` consecutive inputs `r g .. r g + g` (`g` = 2 for bf16, 4 for int8): the "VNNI"
//! order that `tdpbf16ps` / `tdpbssd` read, 64 bytes a row, 1 KiB a tile. Tiles of one output
//! block follow each other along the inputs, so a block's weights are one sequential stream.
//! The same 64-byte row is one zmm register for `vdpbf16ps` / `vpdpbusd`. Outputs past `n` and
//! inputs past `k` are zero.

use std::sync::OnceLock;

use super::{DenseDType, TILE, k_step, to_bf16};

/// A layer's weights as bf16 tiles.
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    data: Vec<u16>,
    n: usize,
    k: usize,
    kp: usize,
}

impl PackedBf16 {
    /// Packs `w` (`[n, k]`, row-major f32), rounding each weight to bf16.
    pub fn new(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "weight is [n, k]");
        let kp = k
            .next_multiple_of(k_step(DenseDType::Bf16))
            .max(k_step(DenseDType::Bf16));
        let blocks = n.div_ceil(TILE);
        let mut data = vec![0u16; blocks * TILE * kp];
        for o in 0..n {
            let (nb, c) = (o / TILE, o % TILE);
            for (i, &v) in w[o * k..(o + 1) * k].iter().enumerate() {
                data[(nb * kp / 2 + i / 2) * 32 + c * 2 + i % 2] = to_bf16(v);
            }
        }
        PackedBf16 { data, n, k, kp }
    }

    /// Outputs.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inputs.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Inputs padded to a whole tile step (32).
    pub fn kp(&self) -> usize {
        self.kp
    }

    /// Output tiles (blocks of 16 outputs).
    pub fn blocks(&self) -> usize {
        self.n.div_ceil(TILE)
    }

    /// Output block `nb`'s tiles along all inputs: `kp / 2` rows of 32 values (16 outputs x 2
    /// inputs).
    pub fn block(&self, nb: usize) -> &[u16] {
        &self.data[nb * TILE * self.kp..(nb + 1) * TILE * self.kp]
    }

    /// The weight of output `o`, input `i`, as stored (bf16 bits).
    pub fn get(&self, o: usize, i: usize) -> u16 {
        self.data[(o / TILE * self.kp / 2 + i / 2) * 32 + o % TILE * 2 + i % 2]
    }
}

/// A layer's weights as int8 tiles, with their per-output scales.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    data: Vec<i8>,
    /// `max |W[o, :]| / 127` per output (1 for an all-zero row), padded to whole blocks with 0.
    scale: Vec<f32>,
    /// `128 * sum_i q[o, i]` per output, padded: what the VNNI kernel's `u8 = q + 128` inputs
    /// add to each sum, subtracted in the epilogue.
    comp: Vec<i32>,
    n: usize,
    k: usize,
    kp: usize,
}

impl PackedI8 {
    /// Quantizes `w` (`[n, k]`, row-major f32) per output channel and packs it.
    pub fn new(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "weight is [n, k]");
        let kp = k
            .next_multiple_of(k_step(DenseDType::Int8))
            .max(k_step(DenseDType::Int8));
        let blocks = n.div_ceil(TILE);
        let mut data = vec![0i8; blocks * TILE * kp];
        let mut scale = vec![0f32; blocks * TILE];
        let mut comp = vec![0i32; blocks * TILE];
        for o in 0..n {
            let row = &w[o * k..(o + 1) * k];
            let s = quant_scale(row);
            let (nb, c) = (o / TILE, o % TILE);
            let mut sum = 0i32;
            for (i, &v) in row.iter().enumerate() {
                let q = quantize(v, s);
                sum += q as i32;
                data[(nb * kp / 4 + i / 4) * 64 + c * 4 + i % 4] = q;
            }
            scale[o] = s;
            comp[o] = 128 * sum;
        }
        PackedI8 {
            data,
            scale,
            comp,
            n,
            k,
            kp,
        }
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Inputs padded to a whole tile step (64).
    pub fn kp(&self) -> usize {
        self.kp
    }

    pub fn blocks(&self) -> usize {
        self.n.div_ceil(TILE)
    }

    /// Output block `nb`'s tiles along all inputs: `kp / 4` rows of 64 values (16 outputs x 4
    /// inputs).
    pub fn block(&self, nb: usize) -> &[i8] {
        &self.data[nb * TILE * self.kp..(nb + 1) * TILE * self.kp]
    }

    /// Per-output scales (padded to whole blocks).
    pub fn scale(&self) -> &[f32] {
        &self.scale
    }

    /// Per-output `128 * sum of q` (padded to whole blocks).
    pub fn comp(&self) -> &[i32] {
        &self.comp
    }

    /// The quantized weight of output `o`, input `i`.
    pub fn get(&self, o: usize, i: usize) -> i8 {
        self.data[(o / TILE * self.kp / 4 + i / 4) * 64 + o % TILE * 4 + i % 4]
    }
}

/// The symmetric int8 scale of `v`: `max |v| / 127`, or 1 when every value is zero (so that
/// dividing by it is defined and zeros stay zeros).
#[inline]
pub fn quant_scale(v: &[f32]) -> f32 {
    let m = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if m > 0.0 && m.is_finite() {
        m / 127.0
    } else {
        1.0
    }
}

/// `round(v / s)` to nearest (ties to even, as `vcvtps2dq`), clamped to `-127 ..= 127`.
#[inline]
pub fn quantize(v: f32, s: f32) -> i8 {
    (v / s).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// A layer's weights for the reduced-precision kernels, converted and packed once (at load for
/// the model's dense dtype; on first use for another).
#[derive(Debug, Clone, Default)]
pub struct LowpWeights {
    bf16: OnceLock<PackedBf16>,
    int8: OnceLock<PackedI8>,
    /// int8's per-input smoothing `s` (`x W^T = (x / s) (W s)^T`), set by a calibration before
    /// the int8 weights are packed, and `1 / s` for the activations' quantizer.
    smooth: OnceLock<(Vec<f32>, Vec<f32>)>,
}

impl LowpWeights {
    /// `w` (`[n, k]`) as bf16 tiles.
    pub fn bf16(&self, w: &[f32], n: usize, k: usize) -> &PackedBf16 {
        self.bf16.get_or_init(|| PackedBf16::new(w, n, k))
    }

    /// `w` (`[n, k]`) as int8 tiles: each input column `i` multiplied by the smoothing `s[i]`
    /// first, when one was set.
    pub fn int8(&self, w: &[f32], n: usize, k: usize) -> &PackedI8 {
        self.int8.get_or_init(|| match self.smooth.get() {
            Some((s, _)) => {
                let ws: Vec<f32> = w.iter().enumerate().map(|(j, v)| v * s[j % k]).collect();
                PackedI8::new(&ws, n, k)
            }
            None => PackedI8::new(w, n, k),
        })
    }

    /// Sets the smoothing from the largest |activation| seen per input (`act`, from a
    /// calibration) and the weights `w` (`[n, k]`): `s[i] = sqrt(act[i] / max_o |w[o, i]|)`
    /// (SmoothQuant's balance, alpha 0.5), 1 where either is zero. It moves the spread of the
    /// inputs' scales (pooled embeddings of 1 id and of 100 ids side by side in the cross net's
    /// input) into the weights, whose scales are per output channel. `false` when the weights
    /// were packed already (or a smoothing was set): then nothing changes.
    pub fn set_smooth(&self, w: &[f32], k: usize, act: &[f32]) -> bool {
        if self.int8.get().is_some() || act.len() != k {
            return false;
        }
        let mut wmax = vec![0f32; k];
        for row in w.chunks_exact(k) {
            for (m, v) in wmax.iter_mut().zip(row) {
                *m = m.max(v.abs());
            }
        }
        let s: Vec<f32> = act
            .iter()
            .zip(&wmax)
            .map(|(&a, &b)| {
                let v = (a / b).sqrt();
                if a > 0.0 && b > 0.0 && v.is_finite() {
                    v.clamp(1e-4, 1e4)
                } else {
                    1.0
                }
            })
            .collect();
        let inv = s.iter().map(|v| 1.0 / v).collect();
        self.smooth.set((s, inv)).is_ok()
    }

    /// Whether the int8 tiles are packed.
    pub fn int8_packed(&self) -> bool {
        self.int8.get().is_some()
    }

    /// `1 / s` per input when a smoothing is set.
    pub fn inv_smooth(&self) -> Option<&[f32]> {
        self.smooth.get().map(|(_, inv)| inv.as_slice())
    }

    /// Packs `w` for `dtype`.
    pub fn prepare(&self, w: &[f32], n: usize, k: usize, dtype: DenseDType) {
        match dtype {
            DenseDType::F32 => {}
            DenseDType::Bf16 => {
                self.bf16(w, n, k);
            }
            DenseDType::Int8 => {
                self.int8(w, n, k);
            }
        }
    }
}
