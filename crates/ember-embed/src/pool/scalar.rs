//! Portable scalar kernel: the fallback on CPUs without AVX2. Same algorithm as the SIMD kernels
//! (quantized rows accumulate `w * scale * code` and add `sum(w * bias)` once per bag).

use super::Segment;
use crate::dtype::DType;
use crate::jagged::RowIndex;
use crate::quant::{int4_scale_bias, int8_scale_bias};
use half::{bf16, f16};

/// Pools every bag of `s`.
pub(crate) fn pool_segment<I: RowIndex>(s: &Segment<'_, I>) {
    let dim = s.dim;
    for bag in 0..s.nbags() {
        let (lo, hi) = s.bag(bag);
        // SAFETY: `bag` is one of this unit's bags and no other reference to its row exists.
        let out = unsafe { s.out.row_mut(bag) };
        out.fill(0.0);
        let mut bias = 0f32;
        for j in lo..hi {
            // SAFETY: the id is a row of the segment (its contract), which nothing writes meanwhile.
            let row = unsafe { s.rows.bytes(s.ids[j].idx() * s.stride, s.stride) };
            let w = s.weights.map_or(1.0, |w| w[j]);
            match s.dtype {
                DType::F32 => {
                    for (o, c) in out.iter_mut().zip(row.chunks_exact(4)) {
                        *o += w * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
                DType::F16 => {
                    for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                        *o += w * f16::from_le_bytes([c[0], c[1]]).to_f32();
                    }
                }
                DType::BF16 => {
                    for (o, c) in out.iter_mut().zip(row.chunks_exact(2)) {
                        *o += w * bf16::from_le_bytes([c[0], c[1]]).to_f32();
                    }
                }
                DType::Int8 => {
                    let (sc, b) = int8_scale_bias(row, dim);
                    let ws = w * sc;
                    for (o, &q) in out.iter_mut().zip(&row[..dim]) {
                        *o += ws * f32::from(q);
                    }
                    bias += w * b;
                }
                DType::Int4 => {
                    let (sc, b) = int4_scale_bias(row, dim);
                    let ws = w * sc;
                    for (i, o) in out.iter_mut().enumerate() {
                        *o += ws * f32::from((row[i / 2] >> (4 * (i % 2))) & 0xF);
                    }
                    bias += w * b;
                }
            }
        }
        let scale = s.scale(hi - lo);
        for o in out.iter_mut() {
            *o = (*o + bias) * scale;
        }
    }
}
