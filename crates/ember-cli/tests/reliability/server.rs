//! `ember serve` as a child process on free loopback ports: start, talk plain HTTP/1.1 to it,
//! read its metrics and its memory, signal it, and always stop it; and waits for a state of it
//! (a metric, what it has read of a connection), never for a time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running server; killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub grpc: Option<SocketAddr>,
    /// Its stderr after the start lines, as it comes.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// `ember serve` with `args` (HTTP and gRPC on free ports unless `args` set them).
    pub fn start(args: &[&str]) -> Server {
        Self::start_with(Command::new(env!("CARGO_BIN_EXE_ember")), args)
    }

    /// [`Server::start`] pinned to `cpus` (a `taskset -c` list), so that a load generator on
    /// other CPUs cannot take the server's.
    pub fn start_on(cpus: &str, args: &[&str]) -> Server {
        let mut c = Command::new("taskset");
        c.args(["-c", cpus, env!("CARGO_BIN_EXE_ember")]);
        Self::start_with(c, args)
    }

    /// [`Server::start`] under `sh -c 'ulimit -n N; exec ember serve ...'`: a process with
    /// only `n` file descriptors.
    pub fn start_with_fd_limit(n: u64, args: &[&str]) -> Server {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "ulimit -S -n {n} && ulimit -H -n {n} && exec \"$0\" \"$@\""
            ))
            .arg(env!("CARGO_BIN_EXE_ember"));
        Self::start_with(c, args)
    }

    fn start_with(mut cmd: Command, args: &[&str]) -> Server {
        let mut full = vec!["serve"];
        if !args.contains(&"--http") {
            full.extend(["--http", "127.0.0.1:0"]);
        }
        if !args.contains(&"--grpc") {
            full.extend(["--grpc", "127.0.0.1:0"]);
        }
        full.extend(args);
        let mut child = cmd
            .args(&full)
            .current_dir(std::env::temp_dir())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start ember serve");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let (mut addr, mut grpc) = (None, None);
        let mut line = String::new();
        let mut said = String::new();
        let wants_grpc = !args.windows(2).any(|w| w == ["--grpc", "off"]);
        while addr.is_none() || (wants_grpc && grpc.is_none()) {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.kill();
                panic!("ember serve {full:?} exited before it served: {said}");
            }
            said.push_str(&line);
            if let Some(rest) = line.split("http://").nth(1) {
                addr = rest.split_whitespace().next().and_then(|a| a.parse().ok());
            } else if line.starts_with("gRPC") {
                grpc = line.trim().rsplit(' ').next().and_then(|a| a.parse().ok());
            }
        }
        let log = Arc::new(Mutex::new(String::new()));
        let l = log.clone();
        std::thread::spawn(move || {
            let mut buf = String::new();
            while err.read_line(&mut buf).unwrap_or(0) > 0 {
                l.lock().unwrap().push_str(&buf);
                buf.clear();
            }
        });
        Server {
            child,
            addr: addr.unwrap(),
            grpc,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. "TERM") to the server.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal}");
    }

    /// Waits up to `limit` for the server to exit (`None`: still running then).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits up to [`PATIENCE`] for `text` in its log (stderr after the start lines).
    pub fn wait_log(&self, text: &str) {
        wait_until(&format!("{text:?} in the log"), PATIENCE, || {
            self.log.lock().unwrap().contains(text)
        });
    }

    /// A request: `(status, body)`; `None` when the connection failed.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        ctype: &str,
        body: &[u8],
    ) -> Option<(u16, String)> {
        request(
            self.addr,
            method,
            path,
            ctype,
            body,
            Duration::from_secs(30),
        )
    }

    /// The value of a metric line (`name{labels}` as printed), 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        self.try_metric(series).expect("GET /metrics")
    }

    /// [`Server::metric`], `None` when `/metrics` could not be read (its connection refused at
    /// the cap, say).
    pub fn try_metric(&self, series: &str) -> Option<f64> {
        let (status, text) = self.request("GET", "/metrics", "text/plain", b"")?;
        (status == 200).then(|| metric_in(&text, series))
    }

    /// Waits up to [`PATIENCE`] for `series` to satisfy `ok` (`what` says how, for the panic);
    /// returns its value then. Each look is a scrape: a connection of its own, counted in
    /// `ember_connections_open` while it is read.
    pub fn wait_metric(&self, series: &str, what: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let mut last = None;
        let end = Instant::now() + PATIENCE;
        loop {
            last = self.try_metric(series).or(last);
            match last {
                Some(v) if ok(v) => return v,
                _ => {}
            }
            assert!(
                Instant::now() < end,
                "{series} is {last:?} after {PATIENCE:?}, not {what}"
            );
            std::thread::sleep(POLL);
        }
    }

    /// Whether the server has accepted `conn` (a connection to [`Server::addr`]) and read every
    /// byte sent on it so far.
    pub fn has_read(&self, conn: &TcpStream) -> bool {
        server_side(self.addr, conn) == Some(0)
    }

    /// (resident, peak resident) memory in bytes, from /proc.
    pub fn rss(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb = |k: &str| {
            s.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        (kb("VmRSS:"), kb("VmHWM:"))
    }

    /// Resets the peak resident memory to the current one.
    pub fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5").unwrap();
    }

    /// Descriptors the server has open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Long enough for a loaded machine; a state never reached in it is a failure.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Between two looks at a state being waited for.
const POLL: Duration = Duration::from_millis(10);

/// Polls `ready` until it holds; panics naming `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < end, "no {what} within {limit:?}");
        std::thread::sleep(POLL);
    }
}

/// The server's side of `conn`, a loopback IPv4 connection to its listener at `addr`, from
/// `/proc/net/tcp`: `None` while it waits in the listener's accept queue (no descriptor yet,
/// inode 0) or once it is gone; then the bytes the client sent that the server has not read.
pub fn server_side(addr: SocketAddr, conn: &TcpStream) -> Option<u64> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(a) => format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(a.ip().octets()),
            a.port()
        ),
        SocketAddr::V6(_) => panic!("{a}: only IPv4 connections are looked up"),
    };
    let (local, remote) = (hex(addr), hex(conn.local_addr().ok()?));
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 10 || f[1] != local || f[2] != remote || f[9] == "0" {
            return None;
        }
        u64::from_str_radix(f[4].split_once(':')?.1, 16).ok()
    })
}

/// The value of `series` in a Prometheus text page (0 when absent).
pub fn metric_in(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .filter(|rest| rest.starts_with(' '))
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// One HTTP/1.1 request on a new connection (closed after): `(status, body)`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    ctype: &str,
    body: &[u8],
    timeout: Duration,
) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    parse_response(&resp)
}

/// `(status, body)` of a raw response.
pub fn parse_response(resp: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(resp);
    let status = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// Raises this process's descriptor limit to its hard limit (for tests that open thousands of
/// connections); returns the limit in effect.
pub fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the local struct they are given.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
    }
    l.rlim_cur
}

/// TSV rows of the shipped model's shape (Criteo: label, 13 integers, 26 hex categories).
pub fn tsv_rows(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = Vec::with_capacity(n * 200);
    for _ in 0..n {
        let mut line = String::from("0");
        for _ in 0..13 {
            line.push_str(&format!("\t{}", next() % 100));
        }
        for _ in 0..26 {
            line.push_str(&format!("\t{:08x}", next() as u32));
        }
        line.push('\n');
        out.extend_from_slice(line.as_bytes());
    }
    out
}
