//! The dense precision's accuracy, checked when a model whose dense layers run in bf16 or int8
//! is loaded ([`ember_model::accuracy::check_at_load`]): a line for the log, a warning naming
//! the model when its AUC falls under MLPerf's high-accuracy target (99.9% of f32's).

use std::sync::Arc;

use ember_model::Model;
use ember_model::accuracy::{HIGH_ACCURACY, LOAD_CHECK_SAMPLES, check_at_load};

/// What the check found: `(is_warning, line)`; `None` for f32 dense layers.
pub fn accuracy_line(model: &Arc<Model>, name: &str, threads: usize) -> Option<(bool, String)> {
    match check_at_load(model, threads) {
        Ok(None) => None,
        Ok(Some(a)) if a.meets(HIGH_ACCURACY) => Some((
            false,
            format!(
                "model '{name}': {} dense layers ({}) keep {:.3}% of f32's AUC on {} random \
                 samples{} (max |score error| {:.2e}, mean {:.2e})",
                a.dtype,
                a.isa.map_or("?", |i| i.describe(a.dtype)),
                100.0 * a.ratio(),
                a.samples,
                worst_output(&a),
                a.max_abs,
                a.mean_abs
            ),
        )),
        Ok(Some(a)) => Some((
            true,
            format!(
                "model '{name}': {} dense layers keep only {:.3}% of f32's AUC on {} random \
                 samples{}, under MLPerf's 99.9% target (max |score error| {:.2e}): run it with \
                 --dense-dtype f32{}",
                a.dtype,
                100.0 * a.ratio(),
                a.samples,
                worst_output(&a),
                a.max_abs,
                if a.dtype.name() == "int8" {
                    " or bf16"
                } else {
                    ""
                }
            ),
        )),
        Err(e) => Some((
            true,
            format!(
                "model '{name}': the {LOAD_CHECK_SAMPLES}-sample accuracy check of its {} dense \
                 layers failed: {e}",
                model.dense_dtype()
            ),
        )),
    }
}

/// ` (its worst output, 'cvr')` for a model of several outputs, else nothing.
fn worst_output(a: &ember_model::accuracy::DenseAccuracy) -> String {
    a.output
        .as_ref()
        .map_or(String::new(), |o| format!(" (its worst output, '{o}')"))
}

/// [`accuracy_line`] through `tracing` (info, or warn).
pub fn check_accuracy(model: &Arc<Model>, name: &str, threads: usize) {
    match accuracy_line(model, name, threads) {
        Some((true, line)) => tracing::warn!("{line}"),
        Some((false, line)) => tracing::info!("{line}"),
        None => {}
    }
}
