//! A plan: the shards of every table and the device each lives on.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{PlanError, Result};
use crate::spec::{DeviceSpec, TableSpec};

/// Rows `rows.0 .. rows.1` and columns `cols.0 .. cols.1` of table `table`, on `device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub table: usize,
    pub rows: (u64, u64),
    pub cols: (u32, u32),
    pub device: usize,
}

impl Shard {
    /// A whole table on one device.
    pub fn whole(t: &TableSpec, table: usize, device: usize) -> Shard {
        Shard {
            table,
            rows: (0, t.rows),
            cols: (0, t.dim),
            device,
        }
    }

    pub fn bytes(&self, t: &TableSpec) -> u64 {
        t.shard_bytes(self.rows.1 - self.rows.0, self.cols.1 - self.cols.0)
    }
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
                b[s.device] += s.bytes(&tables[s.table]);
            }
        }
        b
    }

    /// Checks that every table is covered exactly once (shards inside the table, not
    /// overlapping, areas adding up) and that every device's shards fit its memory.
    pub fn check(&self, tables: &[TableSpec], dev: &DeviceSpec) -> Result<()> {
        let bad = |m: String| Err(PlanError::Invalid(m));
        let mut per_table: Vec<Vec<&Shard>> = vec![Vec::new(); tables.len()];
        for s in &self.shards {
            let Some(t) = tables.get(s.table) else {
                return bad(format!(
                    "a shard names table {}, there are {}",
                    s.table,
                    tables.len()
                ));
            };
            if s.device >= dev.count {
                return bad(format!(
                    "a shard of {} is on device {}, there are {}",
                    t.name, s.device, dev.count
                ));
            }
            if s.rows.0 >= s.rows.1 || s.rows.1 > t.rows || s.cols.0 >= s.cols.1 || s.cols.1 > t.dim
            {
                return bad(format!(
                    "shard rows {:?} cols {:?} is empty or outside table {} ({} x {})",
                    s.rows, s.cols, t.name, t.rows, t.dim
                ));
            }
            per_table[s.table].push(s);
        }
        for (t, shards) in tables.iter().zip(&per_table) {
            let area: u128 = shards
                .iter()
                .map(|s| u128::from(s.rows.1 - s.rows.0) * u128::from(s.cols.1 - s.cols.0))
                .sum();
            for (i, a) in shards.iter().enumerate() {
                for b in &shards[i + 1..] {
                    let rows = a.rows.0 < b.rows.1 && b.rows.0 < a.rows.1;
                    let cols = a.cols.0 < b.cols.1 && b.cols.0 < a.cols.1;
                    if rows && cols {
                        return bad(format!("two shards of {} overlap", t.name));
                    }
                }
            }
            if area != u128::from(t.rows) * u128::from(t.dim) {
                return bad(format!("the shards of {} do not cover it exactly", t.name));
            }
        }
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
                Shard::whole(&tables[1], 1, 1),
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
        let mut outside = good;
        outside.shards[2].rows = (0, 51);
        assert!(outside.check(&tables, &dev).is_err());
    }
}
