//! Queries of one node of a test cluster: a command's reply, a field of `INFO`, a command's
//! statistics.

use anyhow::{Context, Result};
use std::time::Duration;

/// How long one query of a node may take, connecting included.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// `redis-cli`-style query of one node: its reply, an error reply as an error.
pub fn query(port: u16, cmd: &ember_redis::Cmd) -> Result<ember_redis::Value> {
    Ok(ember_redis::query_node(
        &format!("127.0.0.1:{port}"),
        cmd,
        QUERY_TIMEOUT,
    )?)
}

/// [`query`], its reply as text.
pub fn query_text(port: u16, cmd: &ember_redis::Cmd) -> Result<String> {
    let v = query(port, cmd)?;
    v.text()
        .with_context(|| format!("node {port} answered {v:?}, not text"))
}

/// A field of `INFO <section>` (or of `CLUSTER INFO` for the section `cluster`).
pub(super) fn info_field(port: u16, section: &str, field: &str) -> Result<String> {
    let cmd = match section {
        "cluster" => ember_redis::cmd("CLUSTER").arg("INFO").clone(),
        _ => ember_redis::cmd("INFO").arg(section).clone(),
    };
    let v = query_text(port, &cmd)?;
    v.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|s| s.trim().to_string())
        .with_context(|| format!("INFO {section} has no {field}"))
}

/// A numeric field of `INFO <section>` of the node on `port`.
pub fn info_u64(port: u16, section: &str, field: &str) -> Result<u64> {
    Ok(info_field(port, section, field)?.parse()?)
}

/// `INFO commandstats` of `cmd` (as Redis names it: `getrange`, `EMBER.POOL`) summed over
/// `ports`: its CPU time in microseconds and its calls (0 and 0 where it was never called).
pub fn command_stats(ports: &[u16], cmd: &str) -> Result<(u64, u64)> {
    let (mut usec, mut calls) = (0, 0);
    let want = format!("cmdstat_{cmd}:");
    for &p in ports {
        let text = query_text(p, ember_redis::cmd("INFO").arg("commandstats"))?;
        if let Some(line) = text.lines().find_map(|l| l.strip_prefix(&want)) {
            for kv in line.split(',') {
                match kv.split_once('=') {
                    Some(("usec", v)) => usec += v.parse::<u64>().unwrap_or(0),
                    Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
    }
    Ok((usec, calls))
}
