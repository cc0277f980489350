//! The layout study of `bench remote`: the same rows stored as Ember's blocks, as a hash per
//! partition (HPS, TFRA) and as a key per row (DeepRec), each measured for memory per row
//! (`INFO memory`) and fetch rate, then removed.

use anyhow::Result;
use ember_tier::storage::remote::{Cluster, Ops};
use rand::{Rng, SeedableRng};
use serde_json::{Value as Json, json};
use std::time::{Duration, Instant};

use super::used_memory;

/// Memory per row and fetch rate of three layouts of the same rows (256- and 72-byte rows):
/// Ember's blocks (`GETRANGE`), a hash per partition (HPS, TFRA: `HMGET`), a key per row
/// (DeepRec: `GET`).
pub(super) fn layout_study(
    cluster: &mut Cluster,
    primaries: &[String],
    rows: usize,
    secs: f64,
) -> Result<Json> {
    let mut out = Vec::new();
    for row_bytes in [256usize, 72] {
        for layout in ["blocks", "hash_per_partition", "key_per_row"] {
            let (mem, rate) = one_layout(cluster, primaries, layout, rows, row_bytes, secs)?;
            eprintln!(
                "layout {layout:<18} {row_bytes:>3}-byte rows: {:.1} bytes per row in INFO memory ({:.2}x raw), fetch {:.0} rows/s",
                mem,
                mem / row_bytes as f64,
                rate
            );
            out.push(
                json!({"layout": layout, "row_bytes": row_bytes, "memory_per_row": mem,
                "memory_vs_raw": mem / row_bytes as f64, "fetch_rows_per_s": rate}),
            );
        }
    }
    Ok(Json::Array(out))
}

/// Memory per row (`INFO memory` of the `primaries`) and fetch rate of `rows` rows of `rb`
/// bytes stored in `layout`; the rows are removed after.
fn one_layout(
    cluster: &mut Cluster,
    primaries: &[String],
    layout: &str,
    rows: usize,
    rb: usize,
    secs: f64,
) -> Result<(f64, f64)> {
    let l = Layout {
        name: layout,
        rows,
        rb,
        rpb: ember_registry::layout::rows_per_block(rows, rb),
        partitions: primaries.len() * 4,
    };
    let mem0 = used_memory(primaries)?;
    l.store(cluster)?;
    let mem = used_memory(primaries)?.saturating_sub(mem0) as f64 / rows as f64;
    let rate = l.fetch_rate(cluster, secs)?;
    l.remove(cluster)?;
    Ok((mem, rate))
}

/// A minute from now: the deadline of each pipeline of the study.
fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Runs the commands of `ops` on `cluster`, then empties it.
fn flush(cluster: &mut Cluster, ops: &mut Ops) -> Result<()> {
    cluster.run(ops, false, deadline())?;
    ops.clear();
    Ok(())
}

/// One layout of the study's rows: its name (`blocks`, `hash_per_partition` or
/// `key_per_row`), the rows and their bytes, the rows of a block, the hashes' partitions.
struct Layout<'a> {
    name: &'a str,
    rows: usize,
    rb: usize,
    rpb: usize,
    partitions: usize,
}

impl Layout<'_> {
    /// Row `r`'s key, and its field in its partition's hash (`hash_per_partition`).
    fn key(&self, r: usize) -> (String, Option<[u8; 8]>) {
        match self.name {
            "blocks" => (format!("ember-layout:b:{}", r / self.rpb), None),
            "hash_per_partition" => (
                format!("ember-layout:h:{{p{}}}", r % self.partitions),
                Some((r as u64).to_le_bytes()),
            ),
            _ => (format!("ember-layout:k:{r}"), None),
        }
    }

    /// Writes every row (bytes 0x5a), pipelined: a block per `SET`, or a row per `HSET` or
    /// `SET`.
    fn store(&self, cluster: &mut Cluster) -> Result<()> {
        let (rows, rb, rpb) = (self.rows, self.rb, self.rpb);
        let row = vec![0x5au8; rb];
        let mut ops = Ops::default();
        match self.name {
            "blocks" => {
                let block = row.repeat(rpb);
                for b in 0..rows.div_ceil(rpb) {
                    let n = (rows - b * rpb).min(rpb);
                    ops.set(self.key(b * rpb).0.as_bytes(), &block[..n * rb]);
                    if ops.len() >= 64 {
                        flush(cluster, &mut ops)?;
                    }
                }
            }
            _ => {
                for r in 0..rows {
                    let (k, field) = self.key(r);
                    match field {
                        Some(f) => ops.push(
                            k.as_bytes(),
                            ember_redis::cmd("HSET").arg(&k).arg(&f[..]).arg(&row),
                        ),
                        None => ops.set(k.as_bytes(), &row),
                    }
                    if ops.len() >= 4096 {
                        flush(cluster, &mut ops)?;
                    }
                }
            }
        }
        if !ops.is_empty() {
            flush(cluster, &mut ops)?;
        }
        Ok(())
    }

    /// Rows fetched per second of the cluster's time, over `secs` seconds of batches of 1000
    /// random rows.
    fn fetch_rate(&self, cluster: &mut Cluster, secs: f64) -> Result<f64> {
        let mut ops = Ops::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut fetched, mut busy) = (0usize, 0f64);
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < secs {
            ops.clear();
            let ids: Vec<usize> = (0..1000).map(|_| rng.random_range(0..self.rows)).collect();
            self.queue_fetch(&ids, &mut ops);
            let b0 = Instant::now();
            cluster.run(&ops, true, deadline())?;
            busy += b0.elapsed().as_secs_f64();
            fetched += ids.len();
        }
        Ok(fetched as f64 / busy)
    }

    /// Queues the fetch of rows `ids` in `ops`: a `GETRANGE` of its block or a `GET` per row,
    /// or an `HMGET` per partition.
    fn queue_fetch(&self, ids: &[usize], ops: &mut Ops) {
        let (rb, rpb, partitions) = (self.rb, self.rpb, self.partitions);
        match self.name {
            "blocks" => ids.iter().for_each(|&r| {
                let off = (r % rpb) * rb;
                ops.getrange(self.key(r).0.as_bytes(), off, off + rb - 1)
            }),
            "hash_per_partition" => {
                let mut by: Vec<Vec<[u8; 8]>> = vec![Vec::new(); partitions];
                ids.iter()
                    .for_each(|&r| by[r % partitions].push((r as u64).to_le_bytes()));
                for (p, fields) in by.iter().enumerate().filter(|(_, f)| !f.is_empty()) {
                    let k = format!("ember-layout:h:{{p{p}}}");
                    let mut c = ember_redis::cmd("HMGET");
                    c.arg(&k);
                    fields.iter().for_each(|f| {
                        c.arg(&f[..]);
                    });
                    ops.push(k.as_bytes(), &c);
                }
            }
            _ => ids.iter().for_each(|&r| {
                let k = self.key(r).0;
                ops.push(k.as_bytes(), ember_redis::cmd("GET").arg(&k))
            }),
        }
    }

    /// Removes every key of the layout (bounded `UNLINK`s).
    fn remove(&self, cluster: &mut Cluster) -> Result<()> {
        let mut ops = Ops::default();
        let keys: Vec<String> = match self.name {
            "blocks" => (0..self.rows.div_ceil(self.rpb))
                .map(|b| self.key(b * self.rpb).0)
                .collect(),
            "hash_per_partition" => (0..self.partitions)
                .map(|p| format!("ember-layout:h:{{p{p}}}"))
                .collect(),
            _ => (0..self.rows).map(|r| self.key(r).0).collect(),
        };
        for k in keys {
            ops.push(k.as_bytes(), ember_redis::cmd("UNLINK").arg(&k));
            if ops.len() >= 4096 {
                flush(cluster, &mut ops)?;
            }
        }
        if !ops.is_empty() {
            flush(cluster, &mut ops)?;
        }
        Ok(())
    }
}
