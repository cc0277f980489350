//! `bench model`'s load: the sizes of its batches (`--batch`, `--batch-sizes`) and each
//! feature's ids per bag (`--pooling`, or the preset's).

use ember_model::presets::{MLPERF_QUERY_SIZES, Preset};

/// `--batch-sizes`: the sizes of consecutive batches, cycled.
#[derive(Debug, Clone)]
pub struct BatchSizes(pub Vec<usize>);

impl std::str::FromStr for BatchSizes {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "mlperf" {
            return Ok(BatchSizes(MLPERF_QUERY_SIZES.to_vec()));
        }
        let sizes = s
            .split(',')
            .map(|x| match x.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "'{x}' in '{s}' is not a batch size (mlperf, or sizes >= 1 joined by commas)"
                )),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(BatchSizes(sizes))
    }
}

/// What the batches hold: their sizes (cycled) and each feature's ids per bag.
#[derive(Debug)]
pub struct Load {
    pub sizes: Vec<usize>,
    pub pooling: Vec<usize>,
}

impl Load {
    /// `--batch` or `--batch-sizes`, and `--pooling` or the preset's.
    pub fn new(
        batch: usize,
        sizes: Option<&BatchSizes>,
        pooling: Option<usize>,
        p: &Preset,
    ) -> Load {
        Load {
            sizes: sizes.map_or_else(|| vec![batch], |b| b.0.clone()),
            pooling: pooling.map_or_else(|| p.pooling.clone(), |n| vec![n; p.pooling.len()]),
        }
    }

    pub fn max_batch(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1)
    }

    /// "batch 64", or the cycled sizes.
    pub fn batch_text(&self) -> String {
        match self.sizes.as_slice() {
            [b] => format!("batch {b}"),
            s if s == MLPERF_QUERY_SIZES => {
                format!("MLPerf query sizes 100-700, mean {:.0}", self.mean_batch())
            }
            s => format!("batch sizes {}", join(s)),
        }
    }

    pub fn mean_batch(&self) -> f64 {
        self.sizes.iter().sum::<usize>() as f64 / self.sizes.len() as f64
    }

    /// "pooling 80", or each feature's.
    pub fn pooling_text(&self) -> String {
        match self.uniform_pooling() {
            Some(n) => format!("pooling {n}"),
            None => format!(
                "pooling {} ({} ids a sample)",
                join(&self.pooling),
                self.pooling.iter().sum::<usize>()
            ),
        }
    }

    pub fn uniform_pooling(&self) -> Option<usize> {
        let first = *self.pooling.first()?;
        self.pooling.iter().all(|&p| p == first).then_some(first)
    }
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}
