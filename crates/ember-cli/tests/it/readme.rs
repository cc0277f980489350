//! Keeps the README and `docs/` true: every `ember ...` command in their `sh` blocks parses (run with
//! `EMBER_PARSE_ONLY`, which stops after parsing), every repository file a README command
//! names exists, and the quick commands run for real from the repository root (the planner's
//! MLPerf and shipped-model examples, `ember predict`, the repository block's copy steps are
//! covered by `serve_cli`). Commands with placeholders the reader supplies (`models/mine`,
//! `ids.txt`, a Redis address) are parsed only.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The guides whose commands are checked: the README and every page of `docs/`.
fn guides() -> Vec<std::path::PathBuf> {
    let mut pages: Vec<_> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 5, "docs/ holds {} pages", pages.len());
    let mut all = vec![root().join("README.md")];
    all.extend(pages);
    all
}

/// The commands of the guides' `sh` blocks: continuation lines joined, comments and a trailing
/// `&` dropped.
fn commands() -> Vec<String> {
    guides()
        .iter()
        .flat_map(|p| sh_commands(&std::fs::read_to_string(p).unwrap()))
        .collect()
}

/// The commands of one page's `sh` blocks.
fn sh_commands(text: &str) -> Vec<String> {
    let (mut out, mut in_sh, mut cur) = (Vec::new(), false, String::new());
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = match line.find(" #") {
            Some(i) => &line[..i],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        let (part, more) = match line.trim_end().strip_suffix('\\') {
            Some(p) => (p, true),
            None => (line, false),
        };
        cur.push_str(part.trim());
        cur.push(' ');
        if !more {
            let c = cur.trim().trim_end_matches('&').trim().to_string();
            if !c.is_empty() {
                out.push(c);
            }
            cur.clear();
        }
    }
    out
}

/// The arguments of an `ember` command (optional `[...]` groups dropped).
fn ember_args(cmd: &str) -> Option<Vec<String>> {
    let rest = cmd
        .strip_prefix("ember ")
        .or_else(|| cmd.strip_prefix("cargo run --release -p ember-cli -- "))?;
    let mut words = Vec::new();
    let mut depth = 0;
    for w in rest.split_whitespace() {
        depth += w.matches('[').count();
        if depth == 0 {
            words.push(w.to_string());
        }
        depth -= w.matches(']').count();
    }
    Some(words)
}

fn ember(args: &[String], parse_only: bool, dir: &Path) -> (bool, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.args(args).current_dir(dir);
    if parse_only {
        c.env("EMBER_PARSE_ONLY", "1");
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn every_ember_command_in_the_readme_parses_and_names_files_that_exist() {
    let cmds = commands();
    let embers: Vec<(String, Vec<String>)> = cmds
        .iter()
        .filter_map(|c| ember_args(c).map(|a| (c.clone(), a)))
        .collect();
    assert!(
        embers.len() >= 20,
        "only {} ember commands found",
        embers.len()
    );
    for (cmd, args) in &embers {
        let (ok, text) = ember(args, true, root());
        assert!(
            ok,
            "command in README.md or docs/ does not parse: {cmd}\n{text}"
        );
        // Shipped files (data/, models/default) named by a command exist; data/traces is
        // fetched by tools/fetch_data.sh, which must name the file.
        for a in args
            .iter()
            .filter(|a| a.starts_with("data/") || a.starts_with("models/default"))
        {
            if let Some(name) = a.strip_prefix("data/traces/") {
                let script = std::fs::read_to_string(root().join("tools/fetch_data.sh")).unwrap();
                assert!(
                    script.contains(name),
                    "{cmd}: tools/fetch_data.sh does not fetch {a}"
                );
            } else {
                assert!(root().join(a).exists(), "{cmd}: {a} does not exist");
            }
        }
    }
    // Scripts and tools the README runs exist.
    for c in &cmds {
        for w in c.split_whitespace() {
            // `tools/FILE.py:FACTORY` (export_torch.py's --from torch-module) names the file.
            let w = w.split(':').next().unwrap_or(w);
            if (w.starts_with("tools/") || w.starts_with("bench/")) && !w.ends_with('/') {
                assert!(root().join(w).exists(), "{c}: {w} does not exist");
            }
        }
    }
}

#[test]
fn the_quick_readme_commands_run() {
    let dir = std::env::temp_dir().join(format!("ember-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Run from a copy of what the commands read, so that their outputs land outside the tree.
    for d in ["data/tables", "models/default"] {
        let (src, dst) = (root().join(d), dir.join(d));
        std::fs::create_dir_all(&dst).unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap();
            if f.file_type().unwrap().is_file() {
                std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
            }
        }
    }
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::copy(root().join("data/sample.tsv"), dir.join("data/sample.tsv")).unwrap();
    let quick = |c: &str| {
        // (a plan made with a calibrated --cost-model needs `plan calibrate`'s ~2 minutes first)
        (c.starts_with("ember plan make") && !c.contains("--cost-model"))
            || c.starts_with("cargo run --release -p ember-cli -- predict")
    };
    let cmds: Vec<String> = commands().into_iter().filter(|c| quick(c)).collect();
    assert!(cmds.len() >= 3, "{cmds:?}");
    for c in &cmds {
        let args = ember_args(c).unwrap();
        let (ok, text) = ember(&args, false, &dir);
        assert!(ok, "README command failed: {c}\n{text}");
    }
    assert!(dir.join("plan.json").exists() && dir.join("torchrec.json").exists());
    assert!(dir.join("p.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_readme_is_a_guide_that_opens_with_its_two_commands() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: it is a guide; dated figures and investigations go to docs/"
    );
    assert_eq!(
        text.lines().next(),
        Some("# Ember"),
        "README.md must open with its title"
    );
    let first = sh_commands(&text);
    assert_eq!(
        first.get(..2),
        Some(
            &[
                "cargo run --release -p ember-cli -- serve".to_string(),
                "cargo test --workspace".to_string()
            ][..]
        ),
        "README.md's first commands must be the main job and the tests"
    );
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "cargo test --workspace"),
        ".ci/run must run exactly the README's test command"
    );
    // Every page of docs/ is reachable from the README or from a page it links.
    let mut linked = std::collections::BTreeSet::new();
    let mut todo = vec![root().join("README.md")];
    while let Some(p) = todo.pop() {
        let body = std::fs::read_to_string(&p).unwrap();
        for part in body.split("](").skip(1) {
            let target = part.split([')', '#']).next().unwrap_or("");
            let Some(name) = target.rsplit('/').next() else {
                continue;
            };
            let page = root().join("docs").join(name);
            if name.ends_with(".md") && page.exists() && linked.insert(name.to_string()) {
                todo.push(page);
            }
        }
    }
    for p in guides().iter().skip(1) {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            linked.contains(&name),
            "docs/{name} is not linked from the README or its pages"
        );
    }
}
