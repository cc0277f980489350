//! The remote tier on a real Redis Cluster (3 primaries + 3 replicas of Debian's `redis-server`,
//! started by each test on free loopback ports and torn down after): push, verify, list and
//! remove; rows read back bit for bit for every dtype; the server's scores against DRAM; several
//! replicas; and the faults (a killed primary, a paused node, the whole cluster down).
//!
//! Every test skips with a message where `redis-server` is not installed (`.ci/run` installs it).

mod store;

use ember_bench::redis_cluster::{self, LocalCluster};

/// A started cluster, or `None` (with the reason printed) where Redis is not installed.
pub fn cluster(replicas: usize) -> Option<LocalCluster> {
    if let Err(why) = redis_cluster::available() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(LocalCluster::start(3, replicas, 1000).expect("starting a local Redis Cluster"))
}
