//! No crate lists a dependency it does not use: every name under `[dependencies]`,
//! `[dev-dependencies]` and `[build-dependencies]` of each workspace crate's `Cargo.toml` must
//! appear as a path (`name::`, `use name`, `name!`) in the sources that may use it (`src/`,
//! `tests/`, `benches/`, `examples/`, `build.rs`). A dependency needed for another reason (a
//! feature switched on for another crate, a linked library) is listed in `NEEDED_WITHOUT_A_PATH`
//! with that reason. No external tool is needed (cargo-machete / cargo-udeps are not installed
//! on CI's machines).

use std::path::{Path, PathBuf};

/// (crate, dependency, why it has no path in the sources)
const NEEDED_WITHOUT_A_PATH: &[(&str, &str, &str)] = &[(
    "ember-serve",
    "tonic-prost",
    "the gRPC code build.rs generates into OUT_DIR names tonic_prost::ProstCodec",
)];

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The dependency names of one manifest's dependency tables (keys, as written).
fn dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = matches!(
                t,
                "[dependencies]" | "[dev-dependencies]" | "[build-dependencies]"
            ) || t.starts_with("[target.") && t.ends_with("dependencies]");
            continue;
        }
        if !in_deps || t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some((k, _)) = t.split_once('=') {
            // `name.workspace = true` and `name = {...}` alike
            let key = k.trim().split('.').next().unwrap_or("");
            out.push(key.trim_matches('"').to_string());
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_listed_dependency_is_used() {
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    crates.sort();
    assert!(crates.len() >= 5, "found {} crates", crates.len());
    let mut unused = Vec::new();
    for c in &crates {
        let name = c.file_name().unwrap().to_string_lossy().to_string();
        let manifest = std::fs::read_to_string(c.join("Cargo.toml")).unwrap();
        let mut files = Vec::new();
        for d in ["src", "tests", "benches", "examples"] {
            rust_files(&c.join(d), &mut files);
        }
        if c.join("build.rs").exists() {
            files.push(c.join("build.rs"));
        }
        let text: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        for dep in dependencies(&manifest) {
            let id = dep.replace('-', "_");
            let used = [
                format!("{id}::"),
                format!("use {id}"),
                format!("{id}!"),
                format!("extern crate {id}"),
            ]
            .iter()
            .any(|p| text.contains(p.as_str()));
            let excused = NEEDED_WITHOUT_A_PATH
                .iter()
                .any(|(k, d, _)| *k == name && *d == dep);
            if !used && !excused {
                unused.push(format!("{name}: {dep}"));
            }
        }
    }
    assert!(
        unused.is_empty(),
        "dependencies listed but never used (remove them, or list them in NEEDED_WITHOUT_A_PATH \
         with the reason): {unused:?}"
    );
}

#[test]
fn the_manifest_reader_finds_each_table() {
    let m = "[package]\nname = \"x\"\n[dependencies]\na.workspace = true\nb-c = { version = \"1\" }\n\
             [dev-dependencies]\nd = \"1\"\n[features]\ne = [\"dep:a\"]\n[build-dependencies]\nf = \"1\"\n";
    assert_eq!(dependencies(m), ["a", "b-c", "d", "f"]);
}
