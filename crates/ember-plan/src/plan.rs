//! A plan: the shards of every table and the device each lives on.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{PlanError, Result};
use crate::spec::{DeviceSpec, TableSpec};

pub use ember_embed::Shard;

/// A whole table on one device.
pub fn whole(t: &TableSpec, table: usize, device: usize) -> Shard {
    Shard {
        table,
        rows: (0, t.rows),
        cols: (0, t.dim),
        device,
    }
}

/// Row ranges of table `t`: the fewest equal parts of at most `split_bytes` bytes (the rule the
/// planner and every baseline share, so that a table larger than a device can be placed).
pub fn row_ranges(t: &TableSpec, split_bytes: u64) -> Vec<(u64, u64)> {
    let parts = t
        .bytes()
        .div_ceil(split_bytes.max(1))
        .clamp(1, t.rows.max(1));
    let per = t.rows.div_ceil(parts);
    (0..t.rows)
        .step_by(per.max(1) as usize)
        .map(|r| (r, (r + per).min(t.rows)))
        .collect()
}

/// Bytes of a shard of table `t`.
pub fn shard_bytes(s: &Shard, t: &TableSpec) -> u64 {
    t.shard_bytes(s.num_rows(), s.num_cols())
}

/// Shards of every table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub shards: Vec<Shard>,
}

impl Plan {
    /// Bytes each device holds.
    pub fn device_bytes(&self, tables: &[TableSpec], devices: usize) -> Vec<u64> {
        let mut b = vec![0u64; devices];
        for s in &self.shards {
            if s.device < devices {
                b[s.device] += shard_bytes(s, &tables[s.table]);
            }
        }
        b
    }

    /// Checks that every table is covered exactly once (shards inside the table, not
    /// overlapping, areas adding up) and that every device's shards fit its memory.
    pub fn check(&self, tables: &[TableSpec], dev: &DeviceSpec) -> Result<()> {
        let bad = |m: String| Err(PlanError::Invalid(m));
        if let Some(s) = self.shards.iter().find(|s| s.device >= dev.count) {
            let name = tables.get(s.table).map_or("?", |t| t.name.as_str());
            return bad(format!(
                "a shard of {name} is on device {}, there are {}",
                s.device, dev.count
            ));
        }
        let dims: Vec<(u64, u32)> = tables.iter().map(|t| (t.rows, t.dim)).collect();
        let names: Vec<String> = tables.iter().map(|t| t.name.clone()).collect();
        ember_embed::shard::check_cover(&self.shards, &dims, &names).map_err(PlanError::Cover)?;
        for (d, b) in self.device_bytes(tables, dev.count).iter().enumerate() {
            if *b > dev.memory_bytes {
                return bad(format!(
                    "device {d} holds {b} bytes, more than its {}",
                    dev.memory_bytes
                ));
            }
        }
        Ok(())
    }

    /// The plan as TorchRec's `ParameterSharding` fields, per table name: `sharding_type`
    /// (table_wise, column_wise, row_wise or grid_shard), `compute_kernel`, `ranks`, and
    /// `sharding_spec` (each shard's `shard_offsets` [row, col], `shard_sizes` and
    /// `placement` `rank:R/cuda:R`).
    pub fn to_torchrec(&self, tables: &[TableSpec]) -> Value {
        let mut out = serde_json::Map::new();
        for (i, t) in tables.iter().enumerate() {
            let shards: Vec<&Shard> = self.shards.iter().filter(|s| s.table == i).collect();
            let full_rows = shards.iter().all(|s| s.rows == (0, t.rows));
            let full_cols = shards.iter().all(|s| s.cols == (0, t.dim));
            let kind = match (shards.len(), full_rows, full_cols) {
                (1, _, _) => "table_wise",
                (_, true, _) => "column_wise",
                (_, _, true) => "row_wise",
                _ => "grid_shard",
            };
            let spec: Vec<Value> = shards
                .iter()
                .map(|s| {
                    json!({
                        "shard_offsets": [s.rows.0, s.cols.0],
                        "shard_sizes": [s.rows.1 - s.rows.0, s.cols.1 - s.cols.0],
                        "placement": format!("rank:{}/cuda:{}", s.device, s.device),
                    })
                })
                .collect();
            out.insert(
                t.name.clone(),
                json!({
                    "sharding_type": kind,
                    "compute_kernel": "fused",
                    "ranks": shards.iter().map(|s| s.device).collect::<Vec<_>>(),
                    "sharding_spec": spec,
                }),
            );
        }
        Value::Object(out)
    }
}

/// A plan file: the tables and devices planned for, the shards, and the model's predictions.
/// `predict --plan` and `serve --plan` read it and match its tables to a model's by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanFile {
    pub tables: Vec<TableSpec>,
    pub devices: DeviceSpec,
    pub batch: usize,
    pub shards: Vec<Shard>,
    /// Predicted microseconds per batch of each device.
    #[serde(default)]
    pub predicted_us: Vec<f64>,
    /// Which cost model predicted them.
    #[serde(default)]
    pub cost_model: String,
}

impl PlanFile {
    /// Reads and checks a plan file (coverage and memory).
    pub fn read(path: &std::path::Path) -> Result<PlanFile> {
        let text = ember_embed::files::read_text(path, "plan", ember_embed::files::TEXT_LIMIT)
            .map_err(|source| PlanError::SpecIo {
                path: path.display().to_string(),
                source,
            })?;
        let f: PlanFile = serde_json::from_str(&text).map_err(|source| PlanError::SpecJson {
            path: path.display().to_string(),
            source,
        })?;
        crate::spec::check_tables(&f.tables).map_err(|cause| PlanError::Tables {
            path: path.display().to_string(),
            cause,
        })?;
        Plan {
            shards: f.shards.clone(),
        }
        .check(&f.tables, &f.devices)
        .map_err(|cause| PlanError::PlanFile {
            path: path.display().to_string(),
            cause: Box::new(cause),
        })?;
        Ok(f)
    }

    /// Writes the plan file.
    pub fn write(&self, path: &std::path::Path) -> Result<()> {
        std::fs::write(
            path,
            serde_json::to_string_pretty(self).expect("a plan serializes"),
        )
        .map_err(|source| PlanError::SpecIo {
            path: path.display().to_string(),
            source,
        })
    }

    /// The shards renumbered onto a model's tables (`(name, rows, dim)` in the model's order):
    /// every model table must be in the plan with the same rows and dim.
    pub fn shards_for(&self, model: &[(String, u64, u32)]) -> Result<Vec<Shard>> {
        let mut map = vec![usize::MAX; self.tables.len()];
        for (i, (name, rows, dim)) in model.iter().enumerate() {
            let Some(k) = self.tables.iter().position(|t| &t.name == name) else {
                return Err(PlanError::Invalid(format!(
                    "the model's table {name} is not in the plan (it has {})",
                    self.tables
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            let t = &self.tables[k];
            if (t.rows, t.dim) != (*rows, *dim) {
                return Err(PlanError::Invalid(format!(
                    "table {name} is {rows} x {dim} in the model but {} x {} in the plan",
                    t.rows, t.dim
                )));
            }
            map[k] = i;
        }
        if let Some(k) = map.iter().position(|&m| m == usize::MAX) {
            return Err(PlanError::Invalid(format!(
                "the plan's table {} is not in the model",
                self.tables[k].name
            )));
        }
        Ok(self
            .shards
            .iter()
            .map(|s| Shard {
                table: map[s.table],
                ..s.clone()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_embed::DType;

    fn t(name: &str, rows: u64, dim: u32) -> TableSpec {
        TableSpec {
            name: name.into(),
            rows,
            dim,
            dtype: DType::F32,
            pooling: 2.0,
        }
    }

    #[test]
    fn plans_must_cover_each_table_once_and_fit() {
        let tables = vec![t("a", 100, 8), t("b", 50, 4)];
        let dev = DeviceSpec {
            count: 2,
            memory_bytes: 4000,
            bandwidth_gbps: None,
        };
        let good = Plan {
            shards: vec![
                Shard {
                    table: 0,
                    rows: (0, 100),
                    cols: (0, 4),
                    device: 0,
                },
                Shard {
                    table: 0,
                    rows: (0, 100),
                    cols: (4, 8),
                    device: 1,
                },
                whole(&tables[1], 1, 1),
            ],
        };
        good.check(&tables, &dev).unwrap();
        assert_eq!(good.device_bytes(&tables, 2), vec![1600, 1600 + 800]);
        let tr = good.to_torchrec(&tables);
        assert_eq!(tr["a"]["sharding_type"], "column_wise");
        assert_eq!(tr["a"]["sharding_spec"][1]["shard_offsets"], json!([0, 4]));
        assert_eq!(tr["b"]["sharding_type"], "table_wise");
        assert_eq!(tr["b"]["sharding_spec"][0]["placement"], "rank:1/cuda:1");

        let mut missing = good.clone();
        missing.shards.remove(1);
        assert!(
            missing
                .check(&tables, &dev)
                .unwrap_err()
                .to_string()
                .contains("cover")
        );
        let mut overlap = good.clone();
        overlap.shards[1].cols = (3, 8);
        overlap.shards.push(Shard {
            table: 0,
            rows: (0, 100),
            cols: (0, 1),
            device: 0,
        });
        assert!(
            overlap
                .check(&tables, &dev)
                .unwrap_err()
                .to_string()
                .contains("overlap")
        );
        let small = DeviceSpec {
            memory_bytes: 2000,
            ..dev
        };
        assert!(
            good.check(&tables, &small)
                .unwrap_err()
                .to_string()
                .contains("device 1")
        );
        let mut off = good.clone();
        off.shards[2].device = 2;
        assert!(off.check(&tables, &dev).is_err());
        let mut outside = good.clone();
        outside.shards[2].rows = (0, 51);
        assert!(outside.check(&tables, &dev).is_err());

        // A plan file matches a model's tables by name, in the model's order.
        let f = PlanFile {
            tables: tables.clone(),
            devices: dev,
            batch: 8,
            shards: good.shards.clone(),
            predicted_us: vec![],
            cost_model: String::new(),
        };
        let m = vec![("b".to_string(), 50, 4), ("a".to_string(), 100, 8)];
        let s = f.shards_for(&m).unwrap();
        assert_eq!(s.iter().map(|s| s.table).collect::<Vec<_>>(), vec![1, 1, 0]);
        let wrong = vec![("b".to_string(), 50, 4), ("a".to_string(), 100, 16)];
        assert!(
            f.shards_for(&wrong)
                .unwrap_err()
                .to_string()
                .contains("100 x 16")
        );
        let missing = vec![("b".to_string(), 50, 4)];
        assert!(
            f.shards_for(&missing)
                .unwrap_err()
                .to_string()
                .contains("not in the model")
        );
        let extra = vec![
            ("c".to_string(), 5, 4),
            ("b".to_string(), 50, 4),
            ("a".to_string(), 100, 8),
        ];
        assert!(
            f.shards_for(&extra)
                .unwrap_err()
                .to_string()
                .contains("c is not in the plan")
        );
        let dir = std::env::temp_dir().join(format!("ember-planfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        f.write(&dir.join("p.json")).unwrap();
        assert_eq!(PlanFile::read(&dir.join("p.json")).unwrap(), f);
        let mut broken = f.clone();
        broken.shards.pop();
        broken.write(&dir.join("b.json")).unwrap();
        let e = PlanFile::read(&dir.join("b.json")).unwrap_err().to_string();
        assert!(e.contains("cover"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
