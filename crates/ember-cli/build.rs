//! Tells the tests which engines this machine has: a test that needs `redis-server` and
//! `redis-cli` (the remote tier's, on a real local Redis Cluster) is built as ignored, with the
//! reason in the test summary, where they are not on the PATH, rather than passing without
//! running (`.ci/run` installs them first); likewise a test that reads the shared data beside
//! the repository (`../shared/data`, `ember_shared`), or renders a report in `chromium`
//! (`ember_chromium`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ember_redis)");
    println!("cargo::rustc-check-cfg=cfg(ember_shared)");
    println!("cargo::rustc-check-cfg=cfg(ember_chromium)");
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    println!("cargo::rerun-if-changed={}", shared.display());
    if shared.is_dir() {
        println!("cargo::rustc-cfg=ember_shared");
    }
    println!("cargo::rerun-if-env-changed=PATH");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<_> = std::env::split_paths(&path).collect();
    // A directory's listing changes when a program is installed in it.
    for d in dirs.iter().filter(|d| d.is_dir()) {
        println!("cargo::rerun-if-changed={}", d.display());
    }
    let on_path = |bin: &str| dirs.iter().any(|d| d.join(bin).is_file());
    if on_path("redis-server") && on_path("redis-cli") {
        println!("cargo::rustc-cfg=ember_redis");
    }
    // The HTML reports are rendered by a real headless browser (Debian's `chromium`).
    if on_path("chromium") {
        println!("cargo::rustc-cfg=ember_chromium");
    }
}
