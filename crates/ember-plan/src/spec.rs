//! What is planned: tables and devices.
//!
//! Tables come from CSV (a header with at least `name` or `table`, `rows`, `dim`, and
//! optionally `dtype` (default f32) and `pooling` / `pooling_factor` (default 1); `#` lines are
//! comments), as in `../shared/data/tables/mlperf_dlrm_dcnv2_tables.csv`, or from JSON (an array
//! of objects with the same fields).

pub use crate::error::SpecError;
use std::path::Path;

use ember_embed::DType;
use serde::{Deserialize, Serialize};

use crate::error::{PlanError, Result};

/// One embedding table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    pub name: String,
    pub rows: u64,
    pub dim: u32,
    #[serde(default = "f32")]
    pub dtype: DType,
    /// Mean ids per sample (bag length).
    #[serde(default = "one")]
    pub pooling: f64,
}

fn f32() -> DType {
    DType::F32
}

fn one() -> f64 {
    1.0
}

impl TableSpec {
    /// Bytes of the whole table.
    pub fn bytes(&self) -> u64 {
        self.rows * self.dtype.row_bytes(self.dim as usize) as u64
    }

    /// Bytes of a shard of `rows` rows and `cols` columns (quantized rows keep their scale and
    /// bias per shard).
    pub fn shard_bytes(&self, rows: u64, cols: u32) -> u64 {
        rows * self.dtype.row_bytes(cols as usize) as u64
    }

    /// Bytes read per sample by the whole table: pooling x row bytes.
    pub fn bytes_per_sample(&self) -> f64 {
        self.pooling * self.dtype.row_bytes(self.dim as usize) as f64
    }

    fn check(&self) -> std::result::Result<(), SpecError> {
        if self.name.is_empty() {
            return Err(SpecError::Unnamed);
        }
        if self.rows == 0 || self.dim == 0 {
            return Err(SpecError::Empty {
                table: self.name.clone(),
            });
        }
        if !(self.pooling.is_finite() && self.pooling >= 0.0) {
            return Err(SpecError::Pooling {
                table: self.name.clone(),
                pooling: self.pooling,
            });
        }
        Ok(())
    }
}

/// The devices tables are spread over (identical ones).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceSpec {
    pub count: usize,
    /// Memory each device may give to tables.
    pub memory_bytes: u64,
    /// Memory bandwidth in GB/s, where known (the analytical model's unit of time).
    #[serde(default)]
    pub bandwidth_gbps: Option<f64>,
}

/// Reads tables from a CSV or JSON file (by extension; JSON when it starts with `[`).
pub fn read_tables(path: &Path) -> Result<Vec<TableSpec>> {
    let err = |cause: SpecError| PlanError::Tables {
        path: path.display().to_string(),
        cause,
    };
    let text = ember_embed::files::read_text(path, "table spec", ember_embed::files::TEXT_LIMIT)
        .map_err(|source| PlanError::SpecIo {
            path: path.display().to_string(),
            source,
        })?;
    let tables = if text.trim_start().starts_with('[') {
        serde_json::from_str::<Vec<TableSpec>>(&text).map_err(|source| PlanError::SpecJson {
            path: path.display().to_string(),
            source,
        })?
    } else {
        parse_csv(&text).map_err(err)?
    };
    check_tables(&tables).map_err(err)?;
    Ok(tables)
}

/// Checks every table and that names are distinct.
pub fn check_tables(tables: &[TableSpec]) -> std::result::Result<(), SpecError> {
    if tables.is_empty() {
        return Err(SpecError::NoTables);
    }
    let mut names = std::collections::HashSet::new();
    for t in tables {
        t.check()?;
        if !names.insert(t.name.as_str()) {
            return Err(SpecError::Twice {
                table: t.name.clone(),
            });
        }
    }
    Ok(())
}

/// Parses the CSV form.
pub fn parse_csv(text: &str) -> std::result::Result<Vec<TableSpec>, SpecError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let (hl, header) = lines.next().ok_or(SpecError::NoHeader)?;
    let cols: Vec<String> = header.split(',').map(|c| c.trim().to_lowercase()).collect();
    let find = |names: &[&str], column| {
        cols.iter()
            .position(|c| names.contains(&c.as_str()))
            .ok_or(SpecError::NoColumn {
                line: hl + 1,
                column,
            })
    };
    let name = find(&["name", "table"], "name")?;
    let rows = find(&["rows", "num_embeddings"], "rows")?;
    let dim = find(&["dim", "embedding_dim"], "dim")?;
    let dtype = find(&["dtype"], "dtype").ok();
    let pooling = find(&["pooling", "pooling_factor"], "pooling").ok();
    let mut out = Vec::new();
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let line = i + 1;
        if f.len() != cols.len() {
            return Err(SpecError::Fields {
                line,
                found: f.len(),
                want: cols.len(),
            });
        }
        let num = |k: usize, what| {
            f[k].parse::<f64>().map_err(|_| SpecError::NotNumber {
                line,
                what,
                value: f[k].to_string(),
            })
        };
        let int = |k: usize, what| {
            f[k].parse::<u64>().map_err(|_| SpecError::NotWhole {
                line,
                what,
                value: f[k].to_string(),
            })
        };
        let d = int(dim, "dim")?;
        out.push(TableSpec {
            name: f[name].to_string(),
            rows: int(rows, "rows")?,
            dim: u32::try_from(d).map_err(|_| SpecError::DimTooLarge { line, dim: d })?,
            dtype: match dtype {
                Some(k) => f[k].parse().map_err(|cause| SpecError::DType {
                    line,
                    cause: Box::new(cause),
                })?,
                None => DType::F32,
            },
            pooling: match pooling {
                Some(k) => num(k, "pooling")?,
                None => 1.0,
            },
        });
    }
    Ok(out)
}

/// f32 tables `t0, t1, ...` of `(rows, dim, pooling)`, for tests.
#[cfg(test)]
pub(crate) fn test_tables(spec: &[(u64, u32, f64)]) -> Vec<TableSpec> {
    spec.iter()
        .enumerate()
        .map(|(i, &(rows, dim, pooling))| TableSpec {
            name: format!("t{i}"),
            rows,
            dim,
            dtype: DType::F32,
            pooling,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_comments_and_either_column_name() {
        let t = parse_csv(
            "# a comment\ntable,rows,dim,pooling_factor\nt0,40000000,128,3\nt1,39060,64,2.5\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "t0");
        assert_eq!(t[0].rows, 40_000_000);
        assert_eq!(t[1].pooling, 2.5);
        assert_eq!(t[1].dtype, DType::F32);
        assert_eq!(t[0].bytes(), 40_000_000 * 512);
        let t = parse_csv("name,rows,dim,dtype\na,10,13,int8\n").unwrap();
        assert_eq!((t[0].dtype, t[0].pooling), (DType::Int8, 1.0));
        assert_eq!(t[0].shard_bytes(10, 13), 10 * 21);
    }

    #[test]
    fn bad_csv_names_the_line() {
        for (text, want) in [
            ("name,rows,dim\na,10\n", "line 2: 2 fields"),
            ("name,rows,dim\na,ten,4\n", "line 2: rows 'ten'"),
            ("name,rows,dim,dtype\na,1,4,f64\n", "line 2"),
            ("rows,dim\n1,2\n", "no name column"),
            ("", "no header"),
        ] {
            let e = parse_csv(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert_eq!(
            parse_csv("name,rows,dim\na,ten,4\n").unwrap_err(),
            SpecError::NotWhole {
                line: 2,
                what: "rows",
                value: "ten".into()
            }
        );
        let e = parse_csv("name,rows,dim,dtype\na,1,4,f64\n").unwrap_err();
        assert!(matches!(e, SpecError::DType { line: 2, .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        let dup = parse_csv("name,rows,dim\na,1,4\na,2,4\n").unwrap();
        assert_eq!(
            check_tables(&dup).unwrap_err(),
            SpecError::Twice { table: "a".into() }
        );
        let zero = parse_csv("name,rows,dim\na,0,4\n").unwrap();
        assert_eq!(
            check_tables(&zero).unwrap_err(),
            SpecError::Empty { table: "a".into() }
        );
    }

    #[test]
    #[cfg_attr(
        not(ember_shared),
        ignore = "needs ../shared/data beside the repository (not here when built)"
    )]
    fn the_mlperf_tables_parse_where_present() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/data/tables/mlperf_dlrm_dcnv2_tables.csv");
        assert!(
            p.exists(),
            "{} not found: this test reads ../shared/data beside the repository (it is built as ignored where that is absent; --include-ignored runs it anyway)",
            p.display()
        );
        let t = read_tables(&p).unwrap();
        assert_eq!(t.len(), 26);
        assert!(t.iter().all(|t| t.dim == 128));
        let total: u64 = t.iter().map(TableSpec::bytes).sum();
        assert!(total > 50 << 30, "{total}");
    }
}
