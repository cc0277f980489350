//! Row-wise quantization in FBGEMM's fused layouts (see `dtype.rs` for the byte layouts).
//!
//! int8: `scale = (max - min) / 255`, `bias = min`, `code = round((x - min) * 255 / (range + 1e-8))`
//! (FBGEMM `FloatToFused8BitRowwiseQuantizedSBFloat`). Error per element <= scale / 2.
//!
//! int4: `bias = f16(min)`, `scale = f16((max - min) / 15)` (1 when the range is zero or the half
//! scale underflows), `code = clamp(round((x - bias) / scale), 0, 15)` (FBGEMM
//! `FloatToFusedNBitRowwiseQuantizedSBHalf`). Error per element <= scale / 2 plus the half rounding
//! of bias and scale.

use half::f16;

const EPS: f32 = 1e-8;

fn min_max(src: &[f32]) -> (f32, f32) {
    src.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// Quantizes `src` into `dst` (`src.len() + 8` bytes).
pub fn quantize_int8_row(src: &[f32], dst: &mut [u8]) {
    let dim = src.len();
    let (lo, hi) = if dim == 0 { (0.0, 0.0) } else { min_max(src) };
    let range = hi - lo;
    let scale = range / 255.0;
    let inv = 255.0 / (range + EPS);
    for (d, &x) in dst[..dim].iter_mut().zip(src) {
        *d = ((x - lo) * inv).round_ties_even().clamp(0.0, 255.0) as u8;
    }
    dst[dim..dim + 4].copy_from_slice(&scale.to_le_bytes());
    dst[dim + 4..dim + 8].copy_from_slice(&lo.to_le_bytes());
}

/// The scale and bias stored at the end of an int8 row of `dim` codes.
#[inline]
pub fn int8_scale_bias(row: &[u8], dim: usize) -> (f32, f32) {
    let s = f32::from_le_bytes(row[dim..dim + 4].try_into().expect("4 bytes"));
    let b = f32::from_le_bytes(row[dim + 4..dim + 8].try_into().expect("4 bytes"));
    (s, b)
}

/// Decodes an int8 row into `dst`.
pub fn dequantize_int8_row(src: &[u8], dst: &mut [f32]) {
    let dim = dst.len();
    let (s, b) = int8_scale_bias(src, dim);
    for (d, &q) in dst.iter_mut().zip(&src[..dim]) {
        *d = f32::from(q) * s + b;
    }
}

/// Quantizes `src` into `dst` (`ceil(src.len() / 2) + 4` bytes).
pub fn quantize_int4_row(src: &[f32], dst: &mut [u8]) {
    let dim = src.len();
    let nbytes = dim.div_ceil(2);
    let (lo, hi) = if dim == 0 { (0.0, 0.0) } else { min_max(src) };
    let bias = f16::from_f32(lo);
    let bias_f = bias.to_f32();
    let range = hi - bias_f;
    let mut scale = if range == 0.0 {
        f16::ONE
    } else {
        f16::from_f32(range / 15.0)
    };
    let mut inv = 1.0 / scale.to_f32();
    if scale.to_f32() == 0.0 || !inv.is_finite() {
        scale = f16::ONE;
        inv = 1.0;
    }
    dst[..nbytes].fill(0);
    for (i, &x) in src.iter().enumerate() {
        let q = ((x - bias_f) * inv).round_ties_even().clamp(0.0, 15.0) as u8;
        dst[i / 2] |= q << (4 * (i % 2));
    }
    dst[nbytes..nbytes + 2].copy_from_slice(&scale.to_le_bytes());
    dst[nbytes + 2..nbytes + 4].copy_from_slice(&bias.to_le_bytes());
}

/// The scale and bias stored at the end of an int4 row of `dim` codes.
#[inline]
pub fn int4_scale_bias(row: &[u8], dim: usize) -> (f32, f32) {
    let n = dim.div_ceil(2);
    let s = f16::from_le_bytes([row[n], row[n + 1]]).to_f32();
    let b = f16::from_le_bytes([row[n + 2], row[n + 3]]).to_f32();
    (s, b)
}

/// Decodes an int4 row into `dst`.
pub fn dequantize_int4_row(src: &[u8], dst: &mut [f32]) {
    let dim = dst.len();
    let (s, b) = int4_scale_bias(src, dim);
    for (i, d) in dst.iter_mut().enumerate() {
        let q = (src[i / 2] >> (4 * (i % 2))) & 0xF;
        *d = f32::from(q) * s + b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use proptest::prelude::*;

    fn row_strategy() -> impl Strategy<Value = Vec<f32>> {
        (1usize..300, -100.0f32..100.0, 0.0f32..50.0).prop_flat_map(|(dim, center, spread)| {
            proptest::collection::vec(center - spread..=center + spread, dim)
        })
    }

    proptest! {
        #[test]
        fn int8_error_is_at_most_half_a_step(src in row_strategy()) {
            let mut buf = vec![0u8; DType::Int8.row_bytes(src.len())];
            quantize_int8_row(&src, &mut buf);
            let (scale, _) = int8_scale_bias(&buf, src.len());
            let mut back = vec![0f32; src.len()];
            dequantize_int8_row(&buf, &mut back);
            for (x, y) in src.iter().zip(&back) {
                let bound = 0.5 * scale + 1e-5 * x.abs().max(1.0);
                prop_assert!((x - y).abs() <= bound, "x={x} y={y} scale={scale}");
            }
        }

        #[test]
        fn int4_error_is_at_most_half_a_step_plus_half_rounding(src in row_strategy()) {
            let mut buf = vec![0u8; DType::Int4.row_bytes(src.len())];
            quantize_int4_row(&src, &mut buf);
            let (scale, bias) = int4_scale_bias(&buf, src.len());
            let lo = src.iter().cloned().fold(f32::INFINITY, f32::min);
            let hi = src.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut back = vec![0f32; src.len()];
            dequantize_int4_row(&buf, &mut back);
            for (x, y) in src.iter().zip(&back) {
                let bound = 0.5 * scale + (hi - lo) * 2e-3 + (lo - bias).abs() + 1e-5 * x.abs().max(1.0);
                prop_assert!((x - y).abs() <= bound, "x={x} y={y} scale={scale} bias={bias}");
            }
        }

        #[test]
        fn half_types_round_trip_within_their_precision(src in row_strategy()) {
            for (dt, rel) in [(DType::F16, 1.0 / 1024.0), (DType::BF16, 1.0 / 128.0), (DType::F32, 0.0)] {
                let mut buf = vec![0u8; dt.row_bytes(src.len())];
                dt.encode_row(&src, &mut buf);
                let mut back = vec![0f32; src.len()];
                dt.decode_row(&buf, &mut back);
                for (x, y) in src.iter().zip(&back) {
                    prop_assert!((x - y).abs() <= x.abs() * rel + 1e-7, "{dt}: x={x} y={y}");
                }
            }
        }
    }

    #[test]
    fn constant_rows_decode_exactly() {
        for v in [0.0f32, 1.5, -3.25] {
            let src = vec![v; 7];
            for dt in [DType::Int8, DType::Int4] {
                let mut buf = vec![0u8; dt.row_bytes(7)];
                dt.encode_row(&src, &mut buf);
                let mut back = vec![9f32; 7];
                dt.decode_row(&buf, &mut back);
                assert!(
                    back.iter().all(|&y| (y - v).abs() < 1e-6),
                    "{dt} {v}: {back:?}"
                );
            }
        }
    }

    #[test]
    fn int4_packs_low_nibble_first() {
        // Values 0..=15 over a range of 15 quantize to their own codes.
        let src: Vec<f32> = (0..5).map(|i| i as f32 * 3.0).collect(); // 0,3,6,9,12 -> codes 0,3,6,9,12 with scale 0.8?
        let mut buf = vec![0u8; DType::Int4.row_bytes(5)];
        quantize_int4_row(&src, &mut buf);
        let (scale, bias) = int4_scale_bias(&buf, 5);
        assert_eq!(bias, 0.0);
        assert!((scale - 12.0 / 15.0).abs() < 1e-3);
        assert_eq!(buf[0] & 0xF, 0);
        assert_eq!(buf[0] >> 4, (3.0f32 / scale).round() as u8);
        assert_eq!(
            buf[2] >> 4,
            0,
            "the unused high nibble of an odd row stays zero"
        );
    }
}
