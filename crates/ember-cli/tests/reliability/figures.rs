//! The figures of the reliability issue, measured on this machine (`#[ignore]`d: minutes to an
//! hour; `bench/reliability.sh` runs them on a release build). Each prints what it measured and
//! asserts the figure.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::clients;
use crate::sampler::{Sampler, mib, minutes, rss_slope};
use crate::server::{Server, metric_in, raise_fd_limit, request, tsv_rows};

/// The CPUs (`taskset -c` lists) of the server and of the load generator in the load figures:
/// `EMBER_SERVER_CPUS` and `EMBER_CLIENT_CPUS`, by default the first half of the CPUs this
/// process may use for the server and the rest for the client (one each on two cores), so that
/// the client's work cannot starve the server and what is measured is Ember.
fn cpu_split() -> (String, String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("0")
        .trim()
        .to_string();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
        cpus.extend(a..=b);
    }
    let join = |c: &[usize]| {
        c.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let half = (cpus.len() / 2).max(1);
    let (server, client) = cpus.split_at(half.min(cpus.len()));
    let client = if client.is_empty() { server } else { client };
    let pick = |var: &str, default: String| std::env::var(var).unwrap_or(default);
    (
        pick("EMBER_SERVER_CPUS", join(server)),
        pick("EMBER_CLIENT_CPUS", join(client)),
    )
}

/// `ember loadgen` against `s` with `args`, on the client's CPUs ([`cpu_split`]); its JSON
/// summary.
fn loadgen(s: &Server, args: &[&str]) -> Value {
    let url = format!("http://{}", s.addr);
    let out = Command::new("taskset")
        .args(["-c", &cpu_split().1, env!("CARGO_BIN_EXE_ember")])
        .args(["loadgen", "--url", &url, "--json"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "loadgen {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for l in text.lines().filter(|l| !l.starts_with('{')) {
        eprintln!("    {l}");
    }
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

/// The requests of the overload and soak figures: binary KServe, 256 samples each.
const LOAD: [&str; 6] = [
    "--format",
    "binary",
    "--samples-per-request",
    "256",
    "--warmup",
    "2",
];

/// The highest rate of `common` requests with p99 <= 10 ms (`--find-max`), on a warmed server:
/// a fresh server's first batches are slow (page faults, caches, the admission model's first
/// fit), and the search's first step must not fail on them.
fn highest_rate(s: &Server, common: &[&str]) -> f64 {
    loadgen(s, &[common, &["--qps", "500", "--duration", "5"]].concat());
    let find = loadgen(
        s,
        &[
            common,
            &[
                "--find-max",
                "--qps",
                "200",
                "--duration",
                "5",
                "--slo-p99-ms",
                "10",
            ],
        ]
        .concat(),
    );
    find["max_qps"].as_f64().expect("a sustainable rate")
}

#[test]
#[ignore = "a figure: minutes; run by bench/reliability.sh"]
fn figure_idle_flood_and_slowloris() {
    raise_fd_limit();
    let s = Server::start(&["--grpc", "off"]);
    let t0 = Instant::now();
    let idle = clients::idle(s.addr, 10_000);
    let mut slow = clients::slow_head(s.addr, 500);
    eprintln!(
        "10,000 idle + 500 slowloris connections open after {:?}",
        t0.elapsed()
    );
    let mut lat = Vec::new();
    let start = Instant::now();
    let mut last_step = Instant::now();
    let mut closed_at = None;
    while start.elapsed() < Duration::from_secs(14) {
        if last_step.elapsed() >= Duration::from_secs(1) {
            slow.step();
            last_step = Instant::now();
        }
        let t = Instant::now();
        let r = request(
            s.addr,
            "POST",
            "/v1/score",
            "text/plain",
            &tsv_rows(1, lat.len() as u64),
            Duration::from_secs(5),
        );
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.map(|r| r.0), Some(200));
        if closed_at.is_none() && start.elapsed() > Duration::from_secs(9) && slow.closed().0 == 500
        {
            closed_at = Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let open = s.metric("ember_connections_open");
    let (n_closed, _) = slow.closed();
    let still_idle = idle
        .iter()
        .take(200)
        .filter(|c| !clients::closed(c))
        .count();
    lat.sort_by(f64::total_cmp);
    let p = |q: f64| ember_bench::stats::quantile(&lat, q);
    eprintln!(
        "FIGURE idle flood: {} normal requests among 10,000 idle + 500 slowloris: p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms; slowloris closed by the 10 s header timeout: {n_closed}/500 \
         (all by {:?}); idle ones still open at 14 s (idle timeout 60 s): {still_idle}/200 \
         sampled; connections open {open}",
        lat.len(),
        p(0.5),
        p(0.99),
        lat[lat.len() - 1],
        closed_at,
    );
    assert!(p(0.99) < 50.0, "p99 {:.1} ms", p(0.99));
    assert_eq!(n_closed, 500);
    assert!(s.metric("ember_connections_closed_total{reason=\"header_timeout\"}") >= 500.0);
}

#[test]
#[ignore = "a figure: a few minutes; run by bench/reliability.sh"]
fn figure_overload_5x() {
    // Objective: p99 10 ms; the queue-delay bound is half of it. The server and the load
    // generator on CPUs of their own.
    let (server_cpus, client_cpus) = cpu_split();
    eprintln!("server on CPUs {server_cpus}, load generator on {client_cpus}");
    let s = Server::start_on(
        &server_cpus,
        &["--grpc", "off", "--max-queue-delay-ms", "5"],
    );
    let common = LOAD;
    let max = highest_rate(&s, &common);
    let rate = format!("{max:.0}");
    // Steady: the sustainable rate for 20 s.
    let rss = Sampler::start(s.pid(), Duration::from_millis(250));
    let steady = loadgen(
        &s,
        &[&common[..], &["--qps", &rate, "--duration", "20"]].concat(),
    );
    let rss_samples: Vec<f64> = rss.finish().iter().map(|x| x.rss as f64).collect();
    let steady_rss = ember_bench::stats::median(&rss_samples);
    // 5x for 60 s, then the sustainable rate for 10 s.
    let phases = format!("{:.0}:60,{max:.0}:10", 5.0 * max);
    let rss = Sampler::start(s.pid(), Duration::from_millis(250));
    let over = loadgen(
        &s,
        &[&common[..], &["--phases", &phases, "--timeline", "1"]].concat(),
    );
    let log = rss.finish();
    let peak_rss = log.iter().map(|x| x.rss).max().unwrap() as f64;
    let (_, page) = s.request("GET", "/metrics", "", b"").unwrap();
    let refusals = metric_in(&page, "ember_refusal_seconds_count");
    let under_1ms = metric_in(&page, "ember_refusal_seconds_bucket{le=\"0.001\"}");
    let ph = over["phases"].as_array().unwrap();
    let (o, a) = (&ph[0], &ph[1]);
    let after_first = &over["timeline"][60];
    eprintln!(
        "FIGURE overload: sustainable {max:.0} requests/s of 256 samples (p99 <= 10 ms, bound 5 \
         ms); steady p99 {:.2} ms, RSS {:.1} MiB.\n  at 5x ({:.0}/s, 60 s): accepted {} (p50 {:.2}, \
         p99 {:.2} ms), refused {} with 503 (client-side p50 {:.2}, p99 {:.2} ms; server-side {:.2}% \
         within 1 ms), errors {}; RSS peak {:.1} MiB ({:.2}x steady).\n  after: first second ok \
         {}/{} (p99 {:.2} ms); 10 s: ok {}/{}, p99 {:.2} ms",
        steady["p99_ms"].as_f64().unwrap(),
        mib(steady_rss),
        o["offered_qps"].as_f64().unwrap(),
        o["ok"],
        o["p50_ms"].as_f64().unwrap(),
        o["p99_ms"].as_f64().unwrap(),
        o["refused"],
        o["refused_p50_ms"].as_f64().unwrap_or(f64::NAN),
        o["refused_p99_ms"].as_f64().unwrap_or(f64::NAN),
        100.0 * under_1ms / refusals.max(1.0),
        o["errors"],
        mib(peak_rss),
        peak_rss / steady_rss,
        after_first["ok"],
        after_first["sent"],
        after_first["p99_ms"].as_f64().unwrap_or(f64::NAN),
        a["ok"],
        a["sent"],
        a["p99_ms"].as_f64().unwrap(),
    );
    assert!(
        o["p99_ms"].as_f64().unwrap() <= 20.0,
        "accepted p99 over 2x the objective"
    );
    assert!(
        under_1ms >= 0.99 * refusals,
        "refusals over 1 ms server-side"
    );
    assert!(
        peak_rss <= 1.5 * steady_rss,
        "RSS {:.1} MiB vs steady {:.1}",
        mib(peak_rss),
        mib(steady_rss)
    );
    assert_eq!(o["errors"].as_u64(), Some(0));
    let first_ok = after_first["ok"].as_f64().unwrap() / after_first["sent"].as_f64().unwrap();
    assert!(
        first_ok >= 0.95,
        "the first second after the overload answered {first_ok:.2}"
    );
}

#[test]
#[ignore = "a figure: runs EMBER_SOAK_SECS (default 3600 s); bench/reliability.sh soak"]
fn soak_at_80_percent_of_the_highest_rate() {
    let secs: u64 = std::env::var("EMBER_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3600);
    let (server_cpus, client_cpus) = cpu_split();
    eprintln!("server on CPUs {server_cpus}, load generator on {client_cpus}");
    let s = Server::start_on(
        &server_cpus,
        &["--grpc", "off", "--max-queue-delay-ms", "5"],
    );
    let common = LOAD;
    let rate = 0.8 * highest_rate(&s, &common);
    let rss = Sampler::start(s.pid(), Duration::from_secs(5));
    let run = loadgen(
        &s,
        &[
            &common[..],
            &[
                "--qps",
                &format!("{rate:.0}"),
                "--duration",
                &secs.to_string(),
                "--timeline",
                "60",
            ],
        ]
        .concat(),
    );
    let log = rss.finish();
    // RSS slope after a warm-up of a twelfth of the run (5 min of an hour), least squares.
    let per_10min = rss_slope(&log, secs as f64 / 12.0);
    let p99s: Vec<f64> = run["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["p99_ms"].as_f64().unwrap_or(f64::NAN))
        .collect();
    // Each minute's p99 beside the server's RSS and the machine's steal time (the load starts
    // with the sampler, after loadgen's 1 s warm-up).
    eprintln!("  minute   p99 ms   RSS MiB   steal %");
    for (m, (rss, steal)) in minutes(&log, p99s.len(), 1.0).into_iter().enumerate() {
        eprintln!("  {m:>6} {:>8.2} {rss:>9.1} {steal:>9.1}", p99s[m]);
    }
    let minutes = p99s;
    let first = minutes[0];
    let worst = minutes.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "FIGURE soak: {secs} s at {rate:.0} requests/s of 256 samples (80% of {:.0}): ok {}, \
         refused {}, errors {}; p99 per minute: first {first:.2} ms, worst {worst:.2} ms \
         ({:.2}x), all {minutes:.2?}; RSS {:.1} -> {:.1} MiB, slope after warm-up {per_10min:+.2} \
         MiB per 10 min",
        rate / 0.8,
        run["ok"],
        run["refused"],
        run["errors"],
        worst / first,
        mib(log[0].rss as f64),
        mib(log[log.len() - 1].rss as f64),
    );
    assert_eq!(run["errors"].as_u64(), Some(0));
    assert!(
        per_10min.abs() < 1.0,
        "RSS slope {per_10min:.2} MiB per 10 min"
    );
    assert!(
        worst <= 1.2 * first,
        "p99 per minute up to {worst:.2} ms vs {first:.2} ms"
    );
}

#[test]
#[ignore = "a figure: 16 MiB requests; run by bench/reliability.sh"]
fn figure_peak_rss_per_request_at_16_mib() {
    for p in crate::memory::peaks(16 << 20, 5) {
        let (shape, body) = (p.shape, p.body as u64);
        let worst = p.added.iter().max().unwrap();
        assert!(
            *worst <= 8 * body,
            "{shape}: +{worst} bytes for a {body}-byte body"
        );
        assert!(
            p.kept() <= crate::memory::CACHES,
            "{shape}: levels {:?}",
            p.levels
        );
    }
}
