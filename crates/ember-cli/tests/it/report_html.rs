//! `--report FILE.html` on the benchmarks and loadgen: each page is rendered by a real headless
//! browser (Debian's `chromium`), and the DOM it built holds every plot as an SVG with its
//! drawing (bars, lines) and its axis text. Without `chromium` the test is ignored, saying so.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn ember(args: &[&str], dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The DOM chromium builds from `page` (after parsing and laying it out).
fn rendered(page: &Path) -> String {
    let out = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Checks the page as the browser built it: one `<figure class="plot">` per title, each with an
/// `<svg>` that draws `shape` (rect for bars and histograms, polyline for lines) and has text.
fn check(page: &Path, titles: &[(&str, &str)]) {
    let dom = rendered(page);
    let figures: Vec<&str> = dom.split("<figure class=\"plot\"").skip(1).collect();
    assert_eq!(figures.len(), titles.len(), "{}: {dom}", page.display());
    for (f, (title, shape)) in figures.iter().zip(titles) {
        let f = &f[..f.find("</figure>").unwrap()];
        assert!(f.contains(&format!("<h2>{title}</h2>")), "{title}: {f}");
        assert!(f.contains("<svg"), "{title}: no svg");
        assert!(
            f.matches(&format!("<{shape}")).count() >= 2,
            "{title}: no {shape} in {f}"
        );
        assert!(f.matches("<text").count() >= 4, "{title}: no axis text");
    }
    // Self-contained: nothing to fetch.
    assert!(!dom.contains(" src=") && !dom.contains("<script") && !dom.contains("<link"));
}

#[test]
#[cfg_attr(
    not(ember_chromium),
    ignore = "needs `chromium` on the PATH (apt-get install chromium)"
)]
fn reports_render_in_a_headless_browser_with_their_plots() {
    let dir: PathBuf = std::env::temp_dir().join(format!("ember-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let small = [
        "--tables",
        "2",
        "--rows",
        "4000",
        "--dim",
        "16",
        "--pooling",
        "4",
    ];
    let more = ["--batch", "32", "--batches", "4", "--runs", "3"];
    let mut args = vec!["bench", "embed"];
    args.extend(small.iter().chain(&more));
    args.extend(["--report", "embed.html"]);
    ember(&args, &dir);
    check(
        &dir.join("embed.html"),
        &[
            ("Lookups/s against the memory ceiling", "rect"),
            ("Run by run", "polyline"),
        ],
    );
    let mut args = vec!["bench", "tiered"];
    args.extend(small.iter().chain(&more));
    args.extend([
        "--cache-mb",
        "1",
        "--dir",
        "tier",
        "--report",
        "tiered.html",
    ]);
    ember(&args, &dir);
    check(
        &dir.join("tiered.html"),
        &[
            ("Hit rate per cache policy", "rect"),
            ("Hit rate per id", "rect"),
            ("Lookups/s", "rect"),
        ],
    );
    ember(
        &[
            "bench",
            "model",
            "--preset",
            "small",
            "--batch",
            "16",
            "--iters",
            "12",
            "--report",
            "model.html",
        ],
        &dir,
    );
    check(
        &dir.join("model.html"),
        &[("Where the time goes", "rect"), ("Batch latency", "rect")],
    );
    // loadgen against a live server: one measurement with a timeline, then a search.
    let mut server = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "off"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("http://") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "server ended");
    }
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let url = format!("http://{addr}");
    let run = ["loadgen", "--url", &url, "--qps", "200", "--warmup", "0.2"];
    let mut args = run.to_vec();
    args.extend([
        "--duration",
        "1.5",
        "--timeline",
        "0.5",
        "--report",
        "load.html",
    ]);
    ember(&args, &dir);
    check(
        &dir.join("load.html"),
        &[("Latency histogram", "rect"), ("Over time", "polyline")],
    );
    let mut args = run.to_vec();
    args.extend([
        "--duration",
        "0.4",
        "--find-max",
        "--slo-p99-ms",
        "0.001",
        "--tries",
        "2",
    ]);
    args.extend(["--report", "max.html"]);
    // An objective nothing meets: two runs of the first rate fail, and the page shows them.
    ember(&args, &dir);
    check(
        &dir.join("max.html"),
        &[
            ("Latency against throughput", "polyline"),
            ("Latency histogram", "rect"),
        ],
    );
    server.kill().unwrap();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
