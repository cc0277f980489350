//! `bench model`'s `--batch-sizes`: the sizes of consecutive batches.

use ember_model::presets::MLPERF_QUERY_SIZES;

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
