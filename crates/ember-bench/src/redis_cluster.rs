//! A real Redis Cluster on loopback for tests and benchmarks: `redis-server` processes (Debian's
//! `redis-server` package) on free ports in a temporary directory, joined with
//! `redis-cli --cluster create`, torn down when dropped. Every wait is bounded.
//!
//! Nodes run with `cluster-require-full-coverage no` and `cluster-allow-reads-when-down yes`
//! (what `docs/remote-tier.md` recommends): a failed primary then costs only its own slots.

mod query;
mod tls;
use query::info_field;
pub use query::{command_stats, info_u64, query, query_text};
pub use tls::NodeTls;

use anyhow::{Context, Result, bail, ensure};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `redis-server` and `redis-cli` can be run; `Err` says what is missing.
pub fn available() -> Result<()> {
    for bin in ["redis-server", "redis-cli"] {
        let ok = Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ensure!(
            ok,
            "`{bin}` is not installed (apt-get install -y redis-server)"
        );
    }
    Ok(())
}

/// One node.
#[derive(Debug)]
pub struct LocalNode {
    pub port: u16,
    /// Its TLS port, in a cluster started with [`LocalCluster::start_tls`].
    pub tls_port: Option<u16>,
    child: Option<Child>,
    stopped: bool,
}

impl LocalNode {
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// A running cluster (see the module documentation).
#[derive(Debug)]
pub struct LocalCluster {
    dir: PathBuf,
    pub nodes: Vec<LocalNode>,
    pub node_timeout_ms: u64,
    /// A module every node loads (`--loadmodule`) but those in `without_module` (node indices).
    module: Option<PathBuf>,
    without_module: Vec<usize>,
    /// TLS on every node (a port of its own), with the cluster bus over TLS.
    tls: Option<NodeTls>,
}

/// Free loopback ports `p` with `p + 10000` (the cluster bus) free too.
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut out = Vec::new();
    let mut tries = 0;
    while out.len() < n {
        tries += 1;
        ensure!(tries < 10_000, "no free loopback ports found");
        let l = TcpListener::bind("127.0.0.1:0")?;
        let p = l.local_addr()?.port();
        if !(1024..=55_000).contains(&p) || out.contains(&p) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", p + 10_000)).is_err() {
            continue;
        }
        out.push(p);
    }
    Ok(out)
}

impl LocalCluster {
    /// Starts `primaries` primaries with `replicas` replicas each and waits until the cluster
    /// is `ok` everywhere and every replica is in sync (within `timeout`).
    pub fn start(primaries: usize, replicas: usize, node_timeout_ms: u64) -> Result<Self> {
        Self::start_with_module(primaries, replicas, node_timeout_ms, None, &[])
    }

    /// [`LocalCluster::start`] with `module` loaded into every node but those in
    /// `without_module` (indices in start order: the first `primaries` become primaries), as in
    /// the middle of a rolling upgrade.
    pub fn start_with_module(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u64,
        module: Option<&std::path::Path>,
        without_module: &[usize],
    ) -> Result<Self> {
        Self::start_full(
            primaries,
            replicas,
            node_timeout_ms,
            module,
            without_module,
            None,
        )
    }

    fn start_full(
        primaries: usize,
        replicas: usize,
        node_timeout_ms: u64,
        module: Option<&std::path::Path>,
        without_module: &[usize],
        tls: Option<NodeTls>,
    ) -> Result<Self> {
        available().map_err(anyhow::Error::msg)?;
        let dir = std::env::temp_dir().join(format!(
            "ember-redis-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ rand::random::<u64>() as u128
        ));
        std::fs::create_dir_all(&dir)?;
        let n = primaries * (1 + replicas);
        let mut c = LocalCluster {
            dir,
            nodes: Vec::new(),
            node_timeout_ms,
            module: module.map(std::path::Path::to_path_buf),
            without_module: without_module.to_vec(),
            tls,
        };
        for _ in 0..n {
            let taken: Vec<u16> = c.nodes.iter().map(|n| n.port).collect();
            let node = c.start_node(&taken)?;
            c.nodes.push(node);
        }
        c.create(primaries)?;
        c.wait_healthy(Duration::from_secs(30))?;
        c.wait_replicated(Duration::from_secs(30))?;
        Ok(c)
    }

    /// Forms the cluster of the started nodes as `redis-cli --cluster create` does, without its
    /// fixed one-second waits (a second of every test's cluster): the slots split evenly over
    /// the first `primaries` nodes, distinct config epochs, every node introduced to the first,
    /// and once each knows all the others, node `primaries + j` made a replica of primary
    /// `j % primaries`. Waits for the state it needs at each step, 30 s at most.
    fn create(&self, primaries: usize) -> Result<()> {
        ensure!(
            (1..=self.nodes.len()).contains(&primaries),
            "{primaries} primaries of {} nodes",
            self.nodes.len()
        );
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        // Redis Cluster's slot count (`ember_redis::slot::SLOTS`; this crate does not depend on
        // the client).
        const SLOTS: usize = 16384;
        for (i, &port) in ports.iter().enumerate().take(primaries) {
            let (first, last) = (SLOTS * i / primaries, SLOTS * (i + 1) / primaries - 1);
            query(
                port,
                ember_redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last),
            )?;
        }
        // Over TLS the cluster bus is the TLS port's (+10000).
        let meet = self.nodes[0].tls_port.unwrap_or(ports[0]);
        for (i, &port) in ports.iter().enumerate() {
            query(
                port,
                ember_redis::cmd("CLUSTER")
                    .arg("SET-CONFIG-EPOCH")
                    .arg(i + 1),
            )?;
            if i > 0 {
                query(
                    port,
                    ember_redis::cmd("CLUSTER")
                        .arg("MEET")
                        .arg("127.0.0.1")
                        .arg(meet),
                )?;
            }
        }
        let known = |port: u16| -> Result<usize> {
            let v: String = query_text(port, ember_redis::cmd("CLUSTER").arg("NODES"))?;
            Ok(v.lines()
                .filter(|l| !l.contains("handshake") && !l.contains("noaddr"))
                .count())
        };
        wait_for(Duration::from_secs(30), || {
            Ok(ports
                .iter()
                .all(|&p| known(p).is_ok_and(|k| k == ports.len())))
        })
        .context("the nodes did not all meet")?;
        for (j, &port) in ports.iter().enumerate().skip(primaries) {
            let id: String = query_text(
                ports[(j - primaries) % primaries],
                ember_redis::cmd("CLUSTER").arg("MYID"),
            )?;
            query(port, ember_redis::cmd("CLUSTER").arg("REPLICATE").arg(&id))?;
        }
        self.wait_healthy(Duration::from_secs(30))?;
        self.wait_replicated(Duration::from_secs(30))
    }

    /// Starts one node on a free port (not in `taken`) and waits for its PING. A node that exits
    /// at once lost its port between the check and its bind (the range is shared with every
    /// outgoing connection on the machine): it is tried again on other ports, five times at most.
    fn start_node(&self, taken: &[u16]) -> Result<LocalNode> {
        let mut lost = Vec::new();
        while lost.len() < 5 {
            let mut free = free_ports(2 + 2 * taken.len())?
                .into_iter()
                .filter(|p| !taken.contains(p));
            let port = free.next().context("no free loopback port")?;
            let tls_port = match self.tls {
                Some(_) => Some(free.next().context("no free loopback port")?),
                None => None,
            };
            let mut child = self.spawn(port, tls_port, self.nodes.len())?;
            let t0 = Instant::now();
            loop {
                if matches!(
                    query(port, &ember_redis::cmd("PING")),
                    Ok(ember_redis::Value::SimpleString(_))
                ) {
                    return Ok(LocalNode {
                        port,
                        tls_port,
                        child: Some(child),
                        stopped: false,
                    });
                }
                if child.try_wait()?.is_some() {
                    lost.push(port);
                    break;
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("redis-server on port {port} did not answer within 10 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        bail!("redis-server exited at start on ports {lost:?} (taken before it could bind?)")
    }

    /// Starts node `i`'s `redis-server` on `port` (and on `tls_port` over TLS).
    fn spawn(&self, port: u16, tls_port: Option<u16>, i: usize) -> Result<Child> {
        let log = self.dir.join(format!("{port}.log"));
        let mut cmd = Command::new("redis-server");
        if let Some(m) = self
            .module
            .as_ref()
            .filter(|_| !self.without_module.contains(&i))
        {
            cmd.arg("--loadmodule").arg(m);
        }
        if let (Some(t), Some(p)) = (&self.tls, tls_port) {
            cmd.args(t.args(p));
        }
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args([
                "--cluster-config-file",
                &self
                    .dir
                    .join(format!("nodes-{port}.conf"))
                    .to_string_lossy(),
            ])
            .args(["--cluster-node-timeout", &self.node_timeout_ms.to_string()])
            .args(["--cluster-require-full-coverage", "no"])
            .args(["--cluster-allow-reads-when-down", "yes"])
            .args(["--save", "", "--appendonly", "no"])
            // A replica's first sync starts at once, not after the default 5 s wait for more
            // replicas to share one transfer.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--dir", &self.dir.to_string_lossy()])
            .args(["--logfile", &log.to_string_lossy()])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")
    }

    /// Whether node `i` loaded the module.
    pub fn has_module(&self, i: usize) -> bool {
        self.module.is_some() && !self.without_module.contains(&i)
    }

    /// `redis://127.0.0.1:p1,...` naming every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(LocalNode::addr).collect();
        format!("redis://{}", nodes.join(","))
    }

    /// Ports of the nodes that are primaries now (by `CLUSTER NODES` of a live node).
    pub fn primaries(&self) -> Result<Vec<u16>> {
        let live = self
            .nodes
            .iter()
            .find(|n| n.is_running() && !n.stopped)
            .context("no live node")?;
        let v: String = query_text(live.port, ember_redis::cmd("CLUSTER").arg("NODES"))?;
        let mut ports = Vec::new();
        for line in v.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 2 && f[2].contains("master") && !f[2].contains("fail") {
                let addr = f[1].split('@').next().unwrap_or("");
                if let Some(p) = addr.rsplit(':').next().and_then(|p| p.parse().ok()) {
                    ports.push(p);
                }
            }
        }
        ports.sort_unstable();
        Ok(ports)
    }

    /// Index of the node on `port`.
    pub fn index(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port == port)
    }

    /// Waits until every running node says `cluster_state:ok`, every slot is served by a
    /// running primary and every running replica's link to its primary is up.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        wait_for(timeout, || {
            for n in self.nodes.iter().filter(|n| n.is_running() && !n.stopped) {
                if info_field(n.port, "cluster", "cluster_state")
                    .ok()
                    .as_deref()
                    != Some("ok")
                {
                    return Ok(false);
                }
                if info_field(n.port, "replication", "role").ok().as_deref() == Some("slave")
                    && info_field(n.port, "replication", "master_link_status")
                        .ok()
                        .as_deref()
                        != Some("up")
                {
                    return Ok(false);
                }
            }
            let primaries = self.primaries()?;
            Ok(primaries
                .iter()
                .all(|p| self.index(*p).is_some_and(|i| self.nodes[i].is_running())))
        })
        .context("the cluster did not become healthy")
    }

    /// Waits until every running primary has put all its running replicas online and each has
    /// acknowledged every write the primary took so far (replication is asynchronous: a
    /// primary killed before that loses those writes, as Redis documents; a test that kills one
    /// right after writing waits here first).
    pub fn wait_replicated(&self, timeout: Duration) -> Result<()> {
        wait_for(timeout, || {
            // `INFO replication` of every running node, once per look.
            let mut infos = Vec::new();
            for n in self.nodes.iter().filter(|n| n.is_running() && !n.stopped) {
                let info: String = query_text(n.port, ember_redis::cmd("INFO").arg("replication"))?;
                infos.push((n.port, info));
            }
            let field = |info: &str, name: &str| -> Option<String> {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                    .map(|v| v.trim().to_string())
            };
            for (port, info) in &infos {
                if field(info, "role").as_deref() != Some("master") {
                    continue;
                }
                let offset: u64 = field(info, "master_repl_offset")
                    .unwrap_or_default()
                    .parse()
                    .unwrap_or(0);
                let listed: Vec<&str> = info
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state="))
                    .collect();
                let behind = listed.iter().any(|r| {
                    let acked = r
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("offset="))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                    !r.contains("state=online") || acked < offset
                });
                // Running replicas of this primary that it does not list yet are behind too.
                let running = infos
                    .iter()
                    .filter(|(_, i)| field(i, "master_port") == Some(port.to_string()))
                    .count();
                if behind || listed.len() < running {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .context("the replicas did not catch up with their primaries")
    }

    /// Kills node `i` (SIGKILL), as a crash would.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut c) = self.nodes[i].child.take() {
            if self.nodes[i].stopped {
                signal(c.id(), libc::SIGCONT);
            }
            c.kill()?;
            c.wait()?;
        }
        self.nodes[i].stopped = false;
        Ok(())
    }

    /// Restarts killed node `i` (it rejoins from its nodes.conf, as a replica after failover).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        ensure!(self.nodes[i].child.is_none(), "node {i} is running");
        let (port, tls_port) = (self.nodes[i].port, self.nodes[i].tls_port);
        self.nodes[i].child = Some(self.spawn(port, tls_port, i)?);
        wait_for(Duration::from_secs(10), || {
            Ok(query(port, &ember_redis::cmd("PING")).is_ok())
        })
    }

    /// Pauses node `i` (SIGSTOP): its sockets stay open and nothing answers.
    pub fn pause(&mut self, i: usize) {
        if let Some(pid) = self.nodes[i].pid() {
            signal(pid, libc::SIGSTOP);
            self.nodes[i].stopped = true;
        }
    }

    /// Resumes paused node `i` (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        if let Some(pid) = self.nodes[i].pid() {
            signal(pid, libc::SIGCONT);
            self.nodes[i].stopped = false;
        }
    }

    /// `used_memory` of node `port`.
    pub fn used_memory(port: u16) -> Result<u64> {
        Ok(info_field(port, "memory", "used_memory")?.parse()?)
    }

    /// The temporary directory (logs, nodes.conf).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process we spawned and have not reaped; no memory is involved.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The Ember Redis module (`crates/ember-redis-module`), built by the workspace as
/// `libember_redis_module.so` beside the running program's profile directory (a test's
/// `target/debug/deps/..`, a binary's `target/release`), else built once now with `cargo build
/// --release -p ember-redis-module` into its own target directory (`target/module`), so that a
/// run of one test binary, whose `cargo` holds the main target directory, has it too.
pub fn pool_module() -> Result<PathBuf> {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.as_ref() {
        return Ok(p.clone());
    }
    const NAME: &str = "libember_redis_module.so";
    let exe = std::env::current_exe()?;
    let near = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join(NAME))
        .find(|p| p.is_file());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = match near {
        Some(p) => p,
        None => {
            let dir = root.join("target/module");
            let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .current_dir(&root)
                .args([
                    "build",
                    "--release",
                    "-p",
                    "ember-redis-module",
                    "--target-dir",
                ])
                .arg(&dir)
                .output()
                .context("running cargo build -p ember-redis-module")?;
            ensure!(
                out.status.success(),
                "building the Redis module failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir.join("release").join(NAME)
        }
    };
    ensure!(path.is_file(), "no Redis module at {}", path.display());
    *built = Some(path.clone());
    Ok(path)
}

/// Polls `f` every 50 ms until it says yes or `timeout` passes.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let t0 = Instant::now();
    loop {
        if let Ok(true) = f() {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!("gave up after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                if n.stopped {
                    signal(c.id(), libc::SIGCONT);
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // A failing test keeps the nodes' logs to read.
        if std::thread::panicking() {
            eprintln!("Redis Cluster logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
