//! Keeps the README true: every `ember ...` command in its `sh` blocks parses (run with
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

/// The commands of the README's `sh` blocks: continuation lines joined, comments and a trailing
/// `&` dropped.
fn commands() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
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
        assert!(ok, "README command does not parse: {cmd}\n{text}");
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
        c.starts_with("ember plan make")
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
