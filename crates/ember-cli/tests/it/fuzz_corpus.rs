//! The fuzz targets' kept inputs replayed on the stable toolchain (issue 61): every file of
//! `fuzz/corpus/<target>/` and of `fuzz/regressions/<target>/` (the inputs of crashes found
//! and fixed) goes through its target's check, the function `cargo +nightly fuzz run <target>`
//! calls (`fuzz_corpus/checks.rs`, which the fuzz crate compiles too). CI runs no fuzzer (it has
//! no nightly toolchain); this holds what the fuzzers kept to the same properties on every test
//! run. `fuzz/README.md` says how the fuzzers run.

mod checks;
mod seeds;

use std::path::{Path, PathBuf};

/// The files of `dir`, sorted (none where it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    v.retain(|p| p.is_file());
    v.sort();
    v
}

#[test]
fn every_kept_fuzz_input_holds_its_targets_property() {
    let fuzz = checks::root().join("fuzz");
    let (mut broken, mut misnamed) = (Vec::new(), Vec::new());
    for &(target, check) in checks::TARGETS {
        let corpus = files(&fuzz.join("corpus").join(target));
        assert!(
            corpus.len() >= 3,
            "fuzz/corpus/{target} holds {} inputs: the seeds are missing (write_fuzz_seeds)",
            corpus.len()
        );
        let regressions = files(&fuzz.join("regressions").join(target));
        for path in corpus.iter().chain(&regressions) {
            let bytes = std::fs::read(path).unwrap();
            let rel = path.strip_prefix(checks::root()).unwrap().to_owned();
            let name = path.file_name().unwrap().to_string_lossy();
            match std::panic::catch_unwind(|| check(&bytes)) {
                Err(_) => broken.push(rel),
                // A seed is taken by its reader, a `seed-near-*` refused: the corpus reaches
                // the readers' values, where the agreements are checked.
                Ok(taken) if name.starts_with("seed-") => {
                    if taken == name.starts_with("seed-near-") {
                        misnamed.push((rel, taken));
                    }
                }
                Ok(_) => {}
            }
        }
    }
    assert!(
        broken.is_empty(),
        "kept fuzz inputs that break their target's property (each one's panic is above): \
         {broken:#?}"
    );
    assert!(
        misnamed.is_empty(),
        "seeds taken (true) or refused (false) against their names: {misnamed:#?}"
    );
}

/// Writes the generated seeds (`fuzz_corpus/seeds.rs`) into `fuzz/corpus/<target>/`, after
/// checking each: `cargo test -p ember-cli --test it write_fuzz_seeds -- --ignored`.
#[test]
#[ignore = "writes into the repository's fuzz/corpus"]
fn write_fuzz_seeds() {
    let fuzz = checks::root().join("fuzz/corpus");
    for (target, name, bytes) in seeds::all() {
        let (_, check) = checks::TARGETS.iter().find(|(t, _)| *t == target).unwrap();
        assert_eq!(
            check(&bytes),
            !name.starts_with("seed-near-"),
            "{target}/{name}"
        );
        let dir = fuzz.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}
