//! Synthetic Criteo-format data whose labels come from a hidden "teacher", so that a model trained
//! on it learns something real and its AUC means something.
//!
//! Rows: the 26 categorical columns draw values from Zipf(1.1) distributions over the Criteo Kaggle
//! cardinalities (values written as 8-digit hex hashes of (column, rank)); the 13 integer columns are
//! rounded log-normal counts, some missing, I2 sometimes negative as in the real data. The label is
//! Bernoulli(sigmoid(logit)) where the teacher's logit sums a weight per log-dense feature, an
//! effect per categorical value (larger for some columns, zero for a few) and a low-rank
//! interaction between some column pairs. Teacher parameters are pure functions of
//! [`TEACHER_SEED`] and the value, so every `--seed` draws rows from the same teacher: train on one
//! seed, evaluate on another.

use std::io::Write;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal, Zipf};

use crate::criteo::{DENSE, SPARSE};

/// The teacher's seed, shared by every synthetic file.
pub const TEACHER_SEED: u64 = 0x7EAC_4E55_EED5_2026;

/// Distinct values per categorical column (the Criteo Kaggle cardinalities).
pub const CARDINALITIES: [u64; SPARSE] = [
    1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593, 3_194, 27,
    14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572,
];

const RANK: usize = 4;
/// Column pairs the teacher makes interact.
const PAIRS: [(usize, usize); 6] = [(0, 1), (2, 5), (3, 10), (6, 13), (8, 16), (14, 24)];

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A standard normal that is a pure function of `key`.
fn hashed_normal(key: u64) -> f32 {
    let a = splitmix(key);
    let b = splitmix(a);
    let u1 = ((a >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (b >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

fn key(parts: &[u64]) -> u64 {
    parts.iter().fold(TEACHER_SEED, |h, &p| {
        splitmix(h ^ p.wrapping_mul(0x2545_F491_4F6C_DD1D))
    })
}

/// The hex value written for rank `rank` of column `col`.
pub fn value_of(col: usize, rank: u64) -> u32 {
    (key(&[1, col as u64, rank]) >> 32) as u32
}

/// The hidden model.
#[derive(Debug, Clone)]
pub struct Teacher {
    dense_w: [f32; DENSE],
    dense_mu: [f32; DENSE],
    col_scale: [f32; SPARSE],
    bias: f32,
}

impl Default for Teacher {
    fn default() -> Self {
        let mut dense_w = [0f32; DENSE];
        let mut dense_mu = [0f32; DENSE];
        for k in 0..DENSE {
            dense_w[k] = 0.35 * hashed_normal(key(&[2, k as u64]));
            dense_mu[k] = 1.0 + 1.5 * (k % 4) as f32;
        }
        let mut col_scale = [0f32; SPARSE];
        for (c, s) in col_scale.iter_mut().enumerate() {
            // A few columns carry no signal, a few a lot.
            *s = match c % 6 {
                0 => 0.0,
                1 | 2 => 0.9,
                _ => 0.4,
            };
        }
        Teacher {
            dense_w,
            dense_mu,
            col_scale,
            bias: 1.6,
        }
    }
}

impl Teacher {
    /// The teacher's logit for one row (`dense_log` = `ln(x+1)`, `ranks[c] = None` when missing).
    pub fn logit(&self, dense_log: &[f32; DENSE], ranks: &[Option<u64>; SPARSE]) -> f32 {
        let mut z = self.bias;
        for ((w, mu), x) in self.dense_w.iter().zip(&self.dense_mu).zip(dense_log) {
            z += w * (x - mu);
        }
        for (c, r) in ranks.iter().enumerate() {
            if let Some(r) = *r {
                z += self.col_scale[c] * hashed_normal(key(&[3, c as u64, r]));
            }
        }
        for &(a, b) in &PAIRS {
            if let (Some(ra), Some(rb)) = (ranks[a], ranks[b]) {
                let dot: f32 = (0..RANK as u64)
                    .map(|k| {
                        hashed_normal(key(&[4, a as u64, ra, k]))
                            * hashed_normal(key(&[4, b as u64, rb, k]))
                    })
                    .sum();
                z += 0.35 * dot;
            }
        }
        z
    }
}

/// Writes `rows` rows of synthetic Criteo TSV drawn with `seed`; returns the share of positives.
pub fn write_synth(out: &mut impl Write, rows: u64, seed: u64) -> std::io::Result<f64> {
    let teacher = Teacher::default();
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf: Vec<Zipf<f64>> = CARDINALITIES
        .iter()
        .map(|&n| Zipf::new(n as f64, 1.1).expect("n >= 1, s > 0"))
        .collect();
    let dense_dist: Vec<LogNormal<f64>> = (0..DENSE)
        .map(|k| LogNormal::new(0.5 + 0.4 * (k % 5) as f64, 1.2).expect("sigma > 0"))
        .collect();
    let mut positives = 0u64;
    let mut line = String::with_capacity(512);
    for _ in 0..rows {
        let mut dense_raw = [None::<i64>; DENSE];
        let mut dense_log = [0f32; DENSE];
        for k in 0..DENSE {
            // Columns 0, 4, 9 are often missing, the rest rarely.
            let p_missing = if k % 5 == 0 || k == 9 { 0.3 } else { 0.03 };
            if rng.random::<f64>() < p_missing {
                continue;
            }
            let mut v = dense_dist[k].sample(&mut rng).floor() as i64;
            if k == 1 && rng.random::<f64>() < 0.05 {
                v = -rng.random_range(1..4);
            }
            dense_raw[k] = Some(v);
            dense_log[k] = (v.max(0) as f32 + 1.0).ln();
        }
        let mut ranks = [None::<u64>; SPARSE];
        for (c, r) in ranks.iter_mut().enumerate() {
            let p_missing = if c % 7 == 3 { 0.25 } else { 0.02 };
            if rng.random::<f64>() >= p_missing {
                *r = Some(zipf[c].sample(&mut rng) as u64 - 1);
            }
        }
        let z = teacher.logit(&dense_log, &ranks);
        let label = rng.random::<f32>() < crate::mlp::sigmoid(z);
        positives += u64::from(label);
        line.clear();
        line.push(if label { '1' } else { '0' });
        use std::fmt::Write as _;
        for v in dense_raw {
            line.push('\t');
            if let Some(v) = v {
                let _ = write!(line, "{v}");
            }
        }
        for (c, r) in ranks.iter().enumerate() {
            line.push('\t');
            if let Some(r) = r {
                let _ = write!(line, "{:08x}", value_of(c, *r));
            }
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    Ok(if rows == 0 {
        0.0
    } else {
        positives as f64 / rows as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criteo::{CriteoBatch, CriteoReader};
    use crate::eval::auc;

    #[test]
    fn synth_rows_parse_and_the_teacher_is_learnable() {
        let mut buf = Vec::new();
        let ctr = write_synth(&mut buf, 4000, 11).unwrap();
        assert!((0.1..0.5).contains(&ctr), "ctr {ctr}");
        let mut r = CriteoReader::new(&buf[..], "synth");
        let mut b = CriteoBatch::default();
        assert_eq!(r.next_batch(10_000, &mut b).unwrap(), 4000);
        // Some fields are missing, some integers negative in the text, all parse.
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.contains("\t\t") && text.contains("\t-"));
        // The teacher's own logits rank the labels well above chance; a single column alone
        // carries some signal too.
        let t = Teacher::default();
        let mut logits = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            let mut dl = [0f32; DENSE];
            for k in 0..DENSE {
                let v: i64 = f[1 + k].parse().unwrap_or(0);
                dl[k] = (v.max(0) as f32 + 1.0).ln();
            }
            // Ranks are not recoverable from the hex value, so rebuild the logit from dense only.
            logits.push(
                (0..DENSE)
                    .map(|k| t.dense_w[k] * (dl[k] - t.dense_mu[k]))
                    .sum::<f32>(),
            );
        }
        let a = auc(&b.labels, &logits).unwrap();
        assert!(a > 0.55, "dense-only teacher AUC {a}");
        // Same seed, same bytes; another seed, other bytes.
        let mut again = Vec::new();
        write_synth(&mut again, 4000, 11).unwrap();
        assert_eq!(buf, again);
        let mut other = Vec::new();
        write_synth(&mut other, 4000, 12).unwrap();
        assert_ne!(buf, other);
    }
}
