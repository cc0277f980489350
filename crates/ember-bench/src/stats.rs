//! Small statistics helpers for benchmark reports.

/// Median of `v` (mean of the two middle values for even lengths); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The `q` quantile of `sorted` (ascending), `q` a fraction (0.99 for p99), by nearest rank:
/// the smallest value that at least `q` of the values do not exceed (`sorted[ceil(q n) - 1]`,
/// the first value for `q` = 0). Every p50 / p99 Ember prints (benchmarks, `ember loadgen`)
/// is this one. NaN when empty; panics where `q` is outside 0..=1 (a percent passed by
/// mistake).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    assert!(
        (0.0..=1.0).contains(&q),
        "quantile {q} is not a fraction in 0..=1"
    );
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "not a fraction")]
    fn a_percent_is_refused_as_a_quantile() {
        quantile(&[1.0, 2.0], 99.0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.501), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
