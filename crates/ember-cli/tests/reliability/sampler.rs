//! What `/proc` says of a server and the machine over a long run: the server's RSS and the
//! machine's steal time (the share of the CPUs a hypervisor gave to other guests: a shared VM's
//! stalls, told apart from the server's own), sampled at a fixed interval by a thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One sample: seconds since the start, the server's RSS in bytes, and the machine's steal and
/// total CPU time since boot, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub t: f64,
    pub rss: u64,
    pub steal: u64,
    pub total: u64,
}

/// Samples process `pid` and the machine every `every` until finished.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Sample>>>,
    thread: std::thread::JoinHandle<()>,
}

/// The steal and total ticks of `/proc/stat`'s first line.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    (v.get(7).copied().unwrap_or(0), v.iter().sum())
}

/// `VmRSS` of process `pid`, in bytes (0 when it cannot be read).
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl Sampler {
    pub fn start(pid: u32, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (st, lg) = (stop.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            while !st.load(Ordering::Relaxed) {
                let (steal, total) = cpu_ticks();
                let s = Sample {
                    t: t0.elapsed().as_secs_f64(),
                    rss: rss(pid),
                    steal,
                    total,
                };
                lg.lock().unwrap().push(s);
                // The sampling interval.
                std::thread::sleep(every);
            }
        });
        Sampler { stop, log, thread }
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.log.lock().unwrap().clone()
    }
}

pub fn mib(bytes: f64) -> f64 {
    bytes / (1 << 20) as f64
}

/// The least-squares slope of the RSS over the samples from `warm` seconds on, in MiB per 10
/// minutes.
pub fn rss_slope(log: &[Sample], warm: f64) -> f64 {
    let pts: Vec<(f64, f64)> = log
        .iter()
        .filter(|x| x.t >= warm)
        .map(|x| (x.t, x.rss as f64))
        .collect();
    let n = pts.len() as f64;
    let (mx, my) = (
        pts.iter().map(|p| p.0).sum::<f64>() / n,
        pts.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let slope = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>()
        / pts.iter().map(|p| (p.0 - mx).powi(2)).sum::<f64>();
    mib(slope * 600.0)
}

/// Per minute of a run that started `offset` seconds after the sampler: the RSS at its end (MiB)
/// and the steal time over it (% of all CPU time), from the samples nearest its bounds.
pub fn minutes(log: &[Sample], n: usize, offset: f64) -> Vec<(f64, f64)> {
    let at = |t: f64| {
        log.iter()
            .min_by(|x, y| (x.t - t).abs().total_cmp(&(y.t - t).abs()))
            .copied()
    };
    (0..n)
        .filter_map(|m| {
            let from = at(m as f64 * 60.0 + offset)?;
            let to = at((m + 1) as f64 * 60.0 + offset)?;
            let steal =
                100.0 * (to.steal - from.steal) as f64 / (to.total - from.total).max(1) as f64;
            Some((mib(to.rss as f64), steal))
        })
        .collect()
}
