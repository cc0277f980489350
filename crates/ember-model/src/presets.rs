//! Benchmark model shapes and random inputs for them.

use ember_embed::{DType, Ids, KeyedJagged};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::{
    FORMAT, FORMAT_VERSION, InteractionConfig, ModelConfig, PairOrder, PoolingName, TableConfig,
};
use crate::error::{ModelError, Result};

/// A benchmark preset: a model shape and the pooling factor of its inputs.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub config: ModelConfig,
    pub pooling_factor: usize,
}

/// Names of the presets.
pub const PRESETS: &[&str] = &["rm1", "small"];

/// RM1: dense 2048 -> bottom 256-64, 32 tables x 500K x 64, pooling 80, dot interaction,
/// top 768-384-1. `small`: the same shape with 8 tables x 10K rows (for tests and smoke runs).
pub fn preset(name: &str, dtype: DType) -> Result<Preset> {
    let (tables, rows) = match name {
        "rm1" => (32, 500_000),
        "small" => (8, 10_000),
        _ => {
            return Err(ModelError::BadOption {
                option: "preset",
                reason: format!("unknown preset '{name}' (known: {})", PRESETS.join(", ")),
            });
        }
    };
    let config = ModelConfig {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        family: Some("dlrm".into()),
        dense_in: 2048,
        bottom_mlp: vec![256, 64],
        interaction: InteractionConfig::Dot {
            self_interaction: false,
            pair_order: PairOrder::Lower,
        },
        top_mlp: vec![768, 384, 1],
        tables: (0..tables)
            .map(|i| TableConfig {
                name: format!("t{i}"),
                rows,
                dim: 64,
                dtype,
                placement: Default::default(),
            })
            .collect(),
        features: None,
        pooling: PoolingName::Sum,
        tier: None,
        remote: None,
    };
    Ok(Preset {
        name: if name == "rm1" { "rm1" } else { "small" },
        config,
        pooling_factor: 80,
    })
}

/// A random batch for `cfg`: dense N(0,1)-ish values, every bag `pooling` uniform ids.
pub fn random_batch(
    cfg: &ModelConfig,
    batch: usize,
    pooling: usize,
    seed: u64,
) -> (Vec<f32>, KeyedJagged) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dense: Vec<f32> = (0..batch * cfg.dense_in)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0)
        .collect();
    let feats = cfg.features();
    let rows: Vec<usize> = cfg
        .feature_tables()
        .expect("checked config")
        .iter()
        .map(|&t| cfg.tables[t].rows)
        .collect();
    let mut ids = Vec::with_capacity(feats.len() * batch * pooling);
    for &r in &rows {
        for _ in 0..batch * pooling {
            ids.push(rng.random_range(0..r as u32));
        }
    }
    let kj = KeyedJagged::from_lengths(
        feats.into_iter().map(|f| f.name).collect(),
        batch,
        &vec![pooling; rows.len() * batch],
        Ids::U32(ids),
        None,
    )
    .expect("consistent by construction");
    (dense, kj)
}
