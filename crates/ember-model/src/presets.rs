//! Benchmark model shapes and random inputs for them.

use ember_embed::{DType, Ids, KeyedJagged};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::{
    FORMAT, FORMAT_VERSION, InteractionConfig, ModelConfig, PairOrder, PoolingName, TableConfig,
};
use crate::error::{ModelError, Result};

/// A benchmark preset: a model shape and the ids per bag of its inputs.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub config: ModelConfig,
    /// Ids per bag of each feature, in the config's feature order: every sample of feature `f`
    /// has exactly `pooling[f]` ids ([`random_batch_pooled`]).
    pub pooling: Vec<usize>,
    /// The cap on rows per table that built it (`None`: no cap).
    pub max_rows: Option<usize>,
}

/// Names of the presets.
pub const PRESETS: &[&str] = &["rm1", "small", "dlrm-v2"];

/// The rows cap dlrm-v2 gets unless asked otherwise: its five 40M-row tables at full size are
/// 102 GB of f32, so they are capped at 200K rows (the figures), ~0.9 GB in all.
pub const DLRM_V2_MAX_ROWS: usize = 200_000;

/// MLPerf DLRM-v2 (Criteo 1TB multi-hot): rows and multi-hot size (ids per sample) of each of
/// its 26 tables of dim 128, as `data/tables/mlperf_dlrm_dcnv2_tables.csv` lists them (a test
/// checks the two agree).
const DLRM_V2_TABLES: [(usize, usize); 26] = [
    (40_000_000, 3),
    (39_060, 2),
    (17_295, 1),
    (7_424, 2),
    (20_265, 6),
    (3, 1),
    (7_122, 1),
    (1_543, 1),
    (63, 1),
    (40_000_000, 7),
    (3_067_956, 3),
    (405_282, 8),
    (10, 1),
    (2_209, 6),
    (11_938, 9),
    (155, 5),
    (4, 1),
    (976, 1),
    (14, 1),
    (40_000_000, 12),
    (40_000_000, 100),
    (40_000_000, 27),
    (590_152, 10),
    (12_973, 3),
    (108, 1),
    (36, 1),
];

/// Batch sizes of MLPerf DLRM-v2 queries: the 5% quantiles of its query-size distribution
/// (100 to 700 samples, 270 on average). Benchmarks cycle through them in this order.
pub const MLPERF_QUERY_SIZES: [usize; 20] = [
    100, 100, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 300, 300, 400, 500, 600,
    700,
];

/// How a preset's table sizes are scaled: `--rows-scale` then `--max-rows`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowsOptions {
    /// Every table's rows are multiplied by this (rounded up, at least 1 row).
    pub scale: f64,
    /// The cap on each table's rows after scaling: `None` is the preset's own (dlrm-v2:
    /// [`DLRM_V2_MAX_ROWS`]; rm1, small: none), `Some(0)` no cap.
    pub max_rows: Option<usize>,
}

impl Default for RowsOptions {
    fn default() -> Self {
        RowsOptions {
            scale: 1.0,
            max_rows: None,
        }
    }
}

/// [`preset_with`] at the preset's own table sizes.
pub fn preset(name: &str, dtype: DType) -> Result<Preset> {
    preset_with(name, dtype, RowsOptions::default())
}

/// A preset by name, its tables sized by `rows`.
///
/// - `rm1`: dense 2048 -> bottom 256-64, 32 tables x 500K x 64, pooling 80, dot interaction,
///   top 768-384-1. `small`: the same shape with 8 tables x 10K rows (for tests and smoke runs).
/// - `dlrm-v2`: MLPerf DLRM-v2, TorchRec's `DLRM_DCN`: dense 13 -> bottom 512-256-128, 26
///   tables of dim 128 with MLPerf's rows and multi-hot sizes ([`DLRM_V2_TABLES`], rows capped
///   at [`DLRM_V2_MAX_ROWS`] by default), a 3-layer low-rank (512) cross net over the 3456
///   concatenated inputs, top 1024-1024-512-256-1.
pub fn preset_with(name: &str, dtype: DType, rows: RowsOptions) -> Result<Preset> {
    if !(rows.scale.is_finite() && rows.scale > 0.0) {
        return Err(ModelError::BadOption {
            option: "rows-scale",
            reason: format!("{} is not a positive number", rows.scale),
        });
    }
    let (name, shape): (&'static str, Shape) = match name {
        "rm1" => ("rm1", Shape::rm1(32, 500_000)),
        "small" => ("small", Shape::rm1(8, 10_000)),
        "dlrm-v2" => ("dlrm-v2", Shape::dlrm_v2()),
        _ => {
            return Err(ModelError::BadOption {
                option: "preset",
                reason: format!("unknown preset '{name}' (known: {})", PRESETS.join(", ")),
            });
        }
    };
    let max_rows = match rows.max_rows.or(shape.max_rows) {
        Some(0) | None => None,
        cap => cap,
    };
    let sized = |r: usize| {
        let r = ((r as f64 * rows.scale).ceil() as usize).max(1);
        max_rows.map_or(r, |cap| r.min(cap))
    };
    let config = ModelConfig {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        family: Some(shape.family.into()),
        dense_in: shape.dense_in,
        bottom_mlp: shape.bottom_mlp,
        interaction: shape.interaction,
        top_mlp: shape.top_mlp,
        tables: shape
            .tables
            .iter()
            .enumerate()
            .map(|(i, &(r, _))| TableConfig {
                name: format!("t{i}"),
                rows: sized(r),
                dim: shape.dim,
                dtype,
                placement: Default::default(),
            })
            .collect(),
        features: None,
        pooling: PoolingName::Sum,
        dense_dtype: Default::default(),
        tier: None,
        remote: None,
    };
    Ok(Preset {
        name,
        config,
        pooling: shape.tables.iter().map(|&(_, p)| p).collect(),
        max_rows,
    })
}

/// A preset's shape before its tables are sized.
struct Shape {
    family: &'static str,
    dense_in: usize,
    bottom_mlp: Vec<usize>,
    interaction: InteractionConfig,
    top_mlp: Vec<usize>,
    dim: usize,
    /// Rows and ids per bag of each table (one feature per table).
    tables: Vec<(usize, usize)>,
    /// The preset's own rows cap.
    max_rows: Option<usize>,
}

impl Shape {
    /// RM1's shape with `tables` tables of `rows` rows, 80 ids per bag.
    fn rm1(tables: usize, rows: usize) -> Shape {
        Shape {
            family: "dlrm",
            dense_in: 2048,
            bottom_mlp: vec![256, 64],
            interaction: InteractionConfig::Dot {
                self_interaction: false,
                pair_order: PairOrder::Lower,
            },
            top_mlp: vec![768, 384, 1],
            dim: 64,
            tables: vec![(rows, 80); tables],
            max_rows: None,
        }
    }

    /// MLPerf DLRM-v2 (TorchRec `DLRM_DCN`, as the MLPerf reference builds it).
    fn dlrm_v2() -> Shape {
        Shape {
            family: "torchrec_dlrm_dcn",
            dense_in: 13,
            bottom_mlp: vec![512, 256, 128],
            interaction: InteractionConfig::Dcn {
                layers: 3,
                low_rank: 512,
            },
            top_mlp: vec![1024, 1024, 512, 256, 1],
            dim: 128,
            tables: DLRM_V2_TABLES.to_vec(),
            max_rows: Some(DLRM_V2_MAX_ROWS),
        }
    }
}

/// Multiply-adds per sample of the dense layers: the bottom and top MLPs' matrix products and
/// the interaction's (dot: one `dim`-long dot product per pair; dcn: the two low-rank products
/// of each layer; cat: none). Elementwise work (biases, activations, the cross net's
/// Hadamard product) is not counted. 0 for a config that [`ModelConfig::check`] refuses.
pub fn dense_macs(cfg: &ModelConfig) -> usize {
    stage_macs(cfg).iter().sum()
}

/// [`dense_macs`] per stage: the bottom MLP, the interaction and the top MLP.
pub fn stage_macs(cfg: &ModelConfig) -> [usize; 3] {
    let mlp = |input: usize, sizes: &[usize]| {
        let mut k = input;
        sizes
            .iter()
            .map(|&n| std::mem::replace(&mut k, n) * n)
            .sum::<usize>()
    };
    let n = cfg.features().len() + 1;
    let interaction = match cfg.interaction {
        InteractionConfig::Dot {
            self_interaction, ..
        } => {
            let pairs = if self_interaction {
                n * (n + 1) / 2
            } else {
                n * (n - 1) / 2
            };
            pairs * cfg.bottom_out()
        }
        // A graph's work is not in its config: not counted.
        InteractionConfig::Cat { .. } | InteractionConfig::Graph { .. } => 0,
        InteractionConfig::Dcn { layers, low_rank } => layers * 2 * cfg.top_in() * low_rank,
    };
    [
        mlp(cfg.dense_in, &cfg.bottom_mlp),
        interaction,
        mlp(cfg.top_in(), &cfg.top_mlp),
    ]
}

/// A random batch for `cfg` with `pooling` ids in every bag ([`random_batch_pooled`]).
pub fn random_batch(
    cfg: &ModelConfig,
    batch: usize,
    pooling: usize,
    seed: u64,
) -> (Vec<f32>, KeyedJagged) {
    random_batch_pooled(cfg, batch, &vec![pooling; cfg.features().len()], seed)
}

/// A random batch for `cfg`: dense values uniform in [-1, 1), and every bag of feature `f`
/// exactly `pooling[f]` uniform ids of its table (fixed multi-hot sizes, as MLPerf's).
///
/// Panics when `pooling` does not give one size per feature of `cfg`.
pub fn random_batch_pooled(
    cfg: &ModelConfig,
    batch: usize,
    pooling: &[usize],
    seed: u64,
) -> (Vec<f32>, KeyedJagged) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dense: Vec<f32> = (0..batch * cfg.dense_in)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0)
        .collect();
    let feats = cfg.features();
    assert_eq!(
        pooling.len(),
        feats.len(),
        "random_batch_pooled: {} pooling sizes for {} features",
        pooling.len(),
        feats.len()
    );
    let rows: Vec<usize> = cfg
        .feature_tables()
        .expect("checked config")
        .iter()
        .map(|&t| cfg.tables[t].rows)
        .collect();
    let mut ids = Vec::with_capacity(batch * pooling.iter().sum::<usize>());
    let mut lengths = Vec::with_capacity(feats.len() * batch);
    for (&r, &p) in rows.iter().zip(pooling) {
        for _ in 0..batch * p {
            ids.push(rng.random_range(0..r as u32));
        }
        lengths.extend(std::iter::repeat_n(p, batch));
    }
    let kj = KeyedJagged::from_lengths(
        feats.into_iter().map(|f| f.name).collect(),
        batch,
        &lengths,
        Ids::U32(ids),
        None,
    )
    .expect("consistent by construction");
    (dense, kj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlrm_v2_tables_match_the_shipped_csv() {
        let csv = include_str!("../../../data/tables/mlperf_dlrm_dcnv2_tables.csv");
        let rows: Vec<(usize, usize)> = csv
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("table,"))
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                assert_eq!(f[2], "128", "{l}");
                (f[1].parse().unwrap(), f[3].parse().unwrap())
            })
            .collect();
        assert_eq!(rows, DLRM_V2_TABLES.to_vec());
    }

    #[test]
    fn dlrm_v2_is_mlperfs_shape_with_rows_capped() {
        let p = preset("dlrm-v2", DType::F32).unwrap();
        p.config.check().unwrap();
        assert_eq!(p.config.top_in(), 128 + 26 * 128);
        assert_eq!(p.max_rows, Some(DLRM_V2_MAX_ROWS));
        assert_eq!(p.config.tables[0].rows, DLRM_V2_MAX_ROWS);
        assert_eq!(p.config.tables[1].rows, 39_060);
        assert_eq!(p.pooling.iter().sum::<usize>(), 214);
        // 13*512 + 512*256 + 256*128, 3 * 2 * 3456 * 512, 3456*1024 + 1024*1024 + ...
        assert_eq!(dense_macs(&p.config), 170_496 + 10_616_832 + 5_243_136);
        let half = RowsOptions {
            scale: 0.5,
            max_rows: Some(0),
        };
        let p = preset_with("dlrm-v2", DType::F32, half).unwrap();
        assert_eq!(p.max_rows, None);
        assert_eq!(p.config.tables[0].rows, 20_000_000);
        assert_eq!(p.config.tables[5].rows, 2, "3 rows halved rounds up");
        let tiny = RowsOptions {
            scale: 1e-9,
            max_rows: Some(10),
        };
        let p = preset_with("dlrm-v2", DType::F32, tiny).unwrap();
        assert!(p.config.tables.iter().all(|t| t.rows == 1));
        let bad = RowsOptions {
            scale: f64::NAN,
            max_rows: None,
        };
        let e = preset_with("dlrm-v2", DType::F32, bad).unwrap_err();
        assert!(e.to_string().contains("rows-scale"), "{e}");
    }

    #[test]
    fn rm1_is_unchanged() {
        let p = preset("rm1", DType::F32).unwrap();
        assert_eq!(p.max_rows, None);
        assert_eq!(p.pooling, vec![80; 32]);
        assert!(p.config.tables.iter().all(|t| t.rows == 500_000));
        let capped = RowsOptions {
            scale: 1.0,
            max_rows: Some(1000),
        };
        let p = preset_with("small", DType::F32, capped).unwrap();
        assert!(p.config.tables.iter().all(|t| t.rows == 1000));
        assert!(preset("rm9", DType::F32).is_err());
    }

    #[test]
    fn every_bag_of_a_feature_has_its_pooling_size() {
        let p = preset_with(
            "dlrm-v2",
            DType::F32,
            RowsOptions {
                scale: 1.0,
                max_rows: Some(50),
            },
        )
        .unwrap();
        let (dense, kj) = random_batch_pooled(&p.config, 5, &p.pooling, 3);
        assert_eq!(dense.len(), 5 * 13);
        assert_eq!(kj.num_ids(), 5 * 214);
        for (f, &pool) in p.pooling.iter().enumerate() {
            for s in 0..5 {
                assert_eq!(kj.length(f, s), pool, "feature {f} sample {s}");
            }
        }
        // One size for all is the uniform batch of before.
        let cfg = preset("small", DType::F32).unwrap().config;
        assert_eq!(
            random_batch(&cfg, 4, 7, 9),
            random_batch_pooled(&cfg, 4, &[7; 8], 9)
        );
    }
}
