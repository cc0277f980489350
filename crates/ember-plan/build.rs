//! Tells the tests whether the shared data beside the repository (`../shared/data`: the MLPerf
//! table specs, Meta's locality statistics) is here: a test that reads it is built as ignored,
//! with the reason in the test summary, where it is not.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ember_shared)");
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    println!("cargo::rerun-if-changed={}", shared.display());
    if shared.is_dir() {
        println!("cargo::rustc-cfg=ember_shared");
    }
}
