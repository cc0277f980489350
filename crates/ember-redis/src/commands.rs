//! Single commands for administration (not the read path): [`call`] one command and get its
//! reply, a server error turned into an error; [`hash_entries`] a small hash read with `HSCAN`;
//! [`query_node`] one command to one node by its address (a cluster's setup, its tests and
//! benchmarks: `redis-cli` without the binary).

use crate::cluster::Cluster;
use crate::error::{FailKind, Failure, RedisError, Result};
use crate::ops::Ops;
use crate::resp::Conn;
use crate::value::{Cmd, Value, cmd};
use std::time::{Duration, Instant};

/// One command's reply (`read`: it may go to a replica); a server error fails it.
pub fn call(cluster: &mut Cluster, key: &str, command: &Cmd, read: bool) -> Result<Value> {
    let mut ops = Ops::default();
    ops.push(key.as_bytes(), command);
    let deadline = Instant::now() + cluster.options().timeout;
    let mut v = cluster.run(&ops, read, deadline)?;
    let v = v.pop().expect("one reply");
    if let Value::ServerError(e) = &v {
        return Err(server_error(cluster, format!("{key}: {e}")));
    }
    Ok(v)
}

/// Every field and value of a small hash, with `HSCAN` (bounded steps, never `HGETALL`).
pub fn hash_entries(cluster: &mut Cluster, key: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let v = call(
            cluster,
            key,
            cmd("HSCAN").arg(key).arg(&cursor).arg("COUNT").arg(1000),
            false,
        )?;
        let Value::Array(parts) = v else {
            return Err(bad_reply(cluster, key, "HSCAN"));
        };
        let (Some(Value::BulkString(next)), Some(Value::Array(items))) =
            (parts.first(), parts.get(1))
        else {
            return Err(bad_reply(cluster, key, "HSCAN"));
        };
        for pair in items.chunks(2) {
            if let [Value::BulkString(f), Value::BulkString(v)] = pair {
                out.push((
                    String::from_utf8_lossy(f).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                ));
            }
        }
        cursor = String::from_utf8_lossy(next).into_owned();
        if cursor == "0" {
            return Ok(out);
        }
    }
}

/// The error of command `cmd` on `key` answered with a reply of the wrong kind.
pub fn bad_reply(cluster: &Cluster, key: &str, cmd: &str) -> RedisError {
    server_error(cluster, format!("{cmd} {key}: unexpected reply"))
}

fn server_error(cluster: &Cluster, detail: String) -> RedisError {
    Failure::new(FailKind::Server, "", detail).into_error(cluster.name())
}

/// One command to the node at `addr` (`host:port`), on a connection of its own, within
/// `timeout`; its reply, a server error turned into an error naming the node.
pub fn query_node(addr: &str, command: &Cmd, timeout: Duration) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    let fail =
        |(kind, detail): (FailKind, String)| Failure::new(kind, addr, detail).into_error(addr);
    let mut conn = Conn::connect(addr, timeout, None, deadline).map_err(fail)?;
    conn.send(&[&command.packed()], deadline).map_err(fail)?;
    match conn.recv(deadline).map_err(fail)? {
        Value::ServerError(e) => Err(fail((FailKind::Server, e.to_string()))),
        v => Ok(v),
    }
}
