//! Metrics of binary predictions: ROC AUC and log loss.

/// Area under the ROC curve (ties share their average rank, as scikit-learn's `roc_auc_score`).
/// `None` when only one class is present.
pub fn auc(labels: &[f32], scores: &[f32]) -> Option<f64> {
    assert_eq!(labels.len(), scores.len());
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_unstable_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let pos = labels.iter().filter(|&&l| l > 0.5).count();
    let neg = labels.len() - pos;
    if pos == 0 || neg == 0 {
        return None;
    }
    // Sum of the (1-based, tie-averaged) ranks of the positives: Mann-Whitney U.
    let mut rank_sum = 0f64;
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += avg * idx[i..=j].iter().filter(|&&k| labels[k] > 0.5).count() as f64;
        i = j + 1;
    }
    let (p, n) = (pos as f64, neg as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// Mean binary cross-entropy, probabilities clipped to `[1e-7, 1 - 1e-7]`.
pub fn log_loss(labels: &[f32], scores: &[f32]) -> f64 {
    assert_eq!(labels.len(), scores.len());
    if labels.is_empty() {
        return f64::NAN;
    }
    let s: f64 = labels
        .iter()
        .zip(scores)
        .map(|(&y, &p)| {
            let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
            if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum();
    s / labels.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition: the share of (positive, negative) pairs ordered right, ties counting 1/2.
    fn auc_pairs(labels: &[f32], scores: &[f32]) -> f64 {
        let (mut good, mut total) = (0f64, 0f64);
        for (i, &li) in labels.iter().enumerate() {
            for (j, &lj) in labels.iter().enumerate() {
                if li > 0.5 && lj < 0.5 {
                    total += 1.0;
                    if scores[i] > scores[j] {
                        good += 1.0;
                    } else if scores[i] == scores[j] {
                        good += 0.5;
                    }
                }
            }
        }
        good / total
    }

    proptest! {
        #[test]
        fn auc_matches_pair_count(v in proptest::collection::vec((0u8..2, 0u8..8), 2..60)) {
            let labels: Vec<f32> = v.iter().map(|p| p.0 as f32).collect();
            // Few distinct scores so that ties happen.
            let scores: Vec<f32> = v.iter().map(|p| p.1 as f32 / 7.0).collect();
            match auc(&labels, &scores) {
                None => prop_assert!(labels.iter().all(|&l| l == labels[0])),
                Some(a) => prop_assert!((a - auc_pairs(&labels, &scores)).abs() < 1e-12),
            }
        }
    }

    #[test]
    fn log_loss_of_known_values() {
        let l = log_loss(&[1.0, 0.0], &[0.8, 0.4]);
        assert!((l - (-(0.8f64.ln()) - 0.6f64.ln()) / 2.0).abs() < 1e-6);
        assert!(log_loss(&[1.0], &[0.0]) < 16.2);
        assert_eq!(auc(&[1.0, 0.0, 1.0], &[0.9, 0.1, 0.5]), Some(1.0));
    }
}
