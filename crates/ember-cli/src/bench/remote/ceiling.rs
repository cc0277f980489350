//! The ceiling of `bench remote`: the cluster's own rate for the same fetches, a plain loop of
//! pipelined `GETRANGE`s over bare connections (the remote tier's own RESP connection, which
//! reads replies in place: no routing, no retries, no cache on the path).

use anyhow::{Context, Result, bail};
use ember_bench::stats::quantile;
use ember_redis::Value;
use ember_tier::storage::remote::{self, ClusterOptions, Reply, slot::key_slot};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// A plain loop: `rows` random rows per batch as `GETRANGE`s, one pipeline per primary (all
/// sent, then all read), over bare [`remote::Conn`]s. Rows/s and the p99 batch.
pub(super) fn ceiling_loop(
    url: &str,
    model: &str,
    version: u64,
    manifest: &ember_registry::Manifest,
    rows: usize,
    secs: f64,
    seed: u64,
) -> Result<(f64, f64)> {
    let opts = ClusterOptions::parse(url)?;
    let slots = slot_map(&opts.seeds[0])?;
    let auth = opts
        .password
        .as_deref()
        .map(|p| (opts.username.as_deref(), p));
    let mut conns: Vec<(String, remote::Conn)> = Vec::new();
    for (_, _, node) in &slots {
        if !conns.iter().any(|c| &c.0 == node) {
            let t = Duration::from_secs(5);
            let c = remote::Conn::connect(node, t, auth, Instant::now() + t)
                .map_err(|e| anyhow::anyhow!("connecting to {node}: {}", e.1))?;
            conns.push((node.clone(), c));
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xc0ffee);
    let mut bufs: Vec<(Vec<u8>, usize)> = vec![(Vec::new(), 0); conns.len()];
    let (mut done, mut times) = (0usize, Vec::new());
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        bufs.iter_mut().for_each(|b| {
            b.0.clear();
            b.1 = 0;
        });
        for _ in 0..rows {
            let t = &manifest.tables[rng.random_range(0..manifest.tables.len())];
            let row = rng.random_range(0..t.rows);
            let key = format!(
                "{}{}",
                ember_registry::layout::block_prefix(model, version, &t.name),
                row / t.rows_per_block
            );
            let off = (row % t.rows_per_block) * t.row_bytes;
            let slot = key_slot(key.as_bytes());
            let node = &slots
                .iter()
                .find(|r| r.0 <= slot && slot <= r.1)
                .context("slot not covered")?
                .2;
            let i = conns.iter().position(|c| &c.0 == node).expect("connected");
            let getrange = ember_redis::cmd("GETRANGE")
                .arg(&key)
                .arg(off)
                .arg(off + t.row_bytes - 1)
                .packed();
            bufs[i].0.extend_from_slice(&getrange);
            bufs[i].1 += 1;
        }
        let b0 = Instant::now();
        let deadline = b0 + Duration::from_secs(30);
        let wire = |e: (remote::FailKind, String)| anyhow::anyhow!("ceiling loop: {}", e.1);
        for (c, b) in conns.iter_mut().zip(&bufs) {
            if b.1 > 0 {
                c.1.send(&[&b.0], deadline).map_err(wire)?;
            }
        }
        for (c, b) in conns.iter_mut().zip(&bufs) {
            for _ in 0..b.1 {
                let row =
                    c.1.recv_with(deadline, |r| matches!(r, Reply::Bulk(v) if !v.is_empty()))
                        .map_err(wire)?;
                done += usize::from(row);
            }
        }
        times.push(b0.elapsed().as_secs_f64());
    }
    let busy: f64 = times.iter().sum();
    times.sort_by(f64::total_cmp);
    Ok((done as f64 / busy, quantile(&times, 0.99)))
}

/// `(first slot, last slot, primary host:port)` from `CLUSTER SLOTS`.
fn slot_map(seed: &str) -> Result<Vec<(u16, u16, String)>> {
    let slots = ember_redis::query_node(
        seed,
        ember_redis::cmd("CLUSTER").arg("SLOTS"),
        Duration::from_secs(5),
    )?;
    let Value::Array(ranges) = slots else {
        bail!("CLUSTER SLOTS: unexpected reply");
    };
    let mut out = Vec::new();
    for r in ranges {
        let Value::Array(p) = r else { continue };
        if let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(n))) =
            (p.first(), p.get(1), p.get(2))
            && let (Some(Value::BulkString(h)), Some(Value::Int(port))) = (n.first(), n.get(1))
        {
            out.push((
                *lo as u16,
                *hi as u16,
                format!("{}:{port}", String::from_utf8_lossy(h)),
            ));
        }
    }
    Ok(out)
}
