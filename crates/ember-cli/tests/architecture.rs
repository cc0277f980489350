//! The house rules of the workspace, checked on its sources (`docs/architecture.md` states
//! them):
//!
//! - crates depend one way: redis <- embed <- model <- serve / plan / cuda / bench <- cli, and the server
//!   sees the model only through `ember-model` (no `ember-embed` anywhere in `ember-serve`),
//!   in the manifests and in the graph Cargo resolves (`cargo metadata`);
//! - no import cycle between the modules of a crate, nor between the files of a module
//!   directory (an import that "runs back up" closes a cycle);
//! - no source file over 600 lines of non-test code without a stated reason (`#[cfg(test)]`
//!   items left out wherever they stand);
//! - every source path `docs/architecture.md` names exists;
//! - every dependency a crate's `Cargo.toml` lists is named in its sources (or excused with
//!   its reason in `NEEDED_WITHOUT_A_PATH`): no external tool (cargo-machete / cargo-udeps are
//!   not on CI's machines).
//!
//! Test code (`#[cfg(test)]` modules, `tests/`, `benches/`) is not held to the import rules:
//! tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const CRATES: [&str; 8] = [
    "ember-redis",
    "ember-embed",
    "ember-model",
    "ember-serve",
    "ember-cuda",
    "ember-plan",
    "ember-bench",
    "ember-cli",
];

/// (crate, dependency, why it has no path in the sources)
const NEEDED_WITHOUT_A_PATH: &[(&str, &str, &str)] = &[(
    "ember-serve",
    "tonic-prost",
    "the gRPC code build.rs generates into OUT_DIR names tonic_prost::ProstCodec",
)];

/// Files allowed over the size limit, with why.
const LARGE: [(&str, &str); 0] = [];

/// The non-test code of a file: every item under `#[cfg(test)]` (or `#[cfg(all(test, ...))]`)
/// removed wherever it stands, a `mod tests;` line or a whole `mod tests { ... }` block (braces
/// counted outside comments, strings and char literals).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if !(t.starts_with("#[cfg(test)]") || t.starts_with("#[cfg(all(test")) {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        // Further attributes, then the item: up to its `;` or its balanced braces.
        let mut depth = 0i64;
        let mut opened = false;
        for item in lines.by_ref() {
            let code = code_chars(item);
            if !opened && code.trim_start().starts_with("#[") && depth == 0 {
                continue;
            }
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// A line's code with comments, string contents and char literals blanked (for brace counts).
fn code_chars(line: &str) -> String {
    let line = strip_comment(line);
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // a char literal ('{', '\\'') or a lifetime ('a): skip a literal only
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    chars.next();
                    chars.next();
                    chars.next();
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The code of a line, without its comment (`//` at the start or after white space; `://` in
/// a string is kept).
fn strip_comment(line: &str) -> &str {
    let b = line.as_bytes();
    for i in 0..b.len().saturating_sub(1) {
        if b[i] == b'/' && b[i + 1] == b'/' && (i == 0 || b[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a source file (`src/tier/stager.rs` -> `["tier", "stager"]`,
/// `src/tier/mod.rs` -> `["tier"]`, `src/lib.rs` -> `[]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The paths (`crate::a::b`, `super::c`) a file's code names, resolved to module paths (as far
/// as they are modules of the crate), including those inside `use crate::{a::X, b::Y}` groups.
fn references(
    code: &str,
    me: &[String],
    modules: &BTreeSet<Vec<String>>,
    reexports: &BTreeMap<Vec<String>, Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let idents = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|p| {
                p.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|p| !p.is_empty())
            .collect()
    };
    // The longest prefix of `path` that is a module, or an item a module re-exports (`crate::X`
    // for `pub use tier::X` in lib.rs names `tier`).
    let resolve = |path: Vec<String>, out: &mut BTreeSet<Vec<String>>| {
        for n in (1..=path.len()).rev() {
            if modules.contains(&path[..n]) {
                out.insert(path[..n].to_vec());
                return;
            }
            if let Some(target) = reexports.get(&path[..n]) {
                out.insert(target.clone());
                return;
            }
        }
    };
    for line in code.lines() {
        let line = strip_comment(line);
        for (kw, base) in [
            ("crate::", Vec::<String>::new()),
            ("super::", parent_of(me)),
        ] {
            let mut rest = line;
            while let Some(i) = rest.find(kw) {
                let after = &rest[i + kw.len()..];
                let prefix_ok = i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric();
                rest = after;
                if !prefix_ok {
                    continue;
                }
                let mut path = base.clone();
                if let Some(group) = after.strip_prefix('{') {
                    let end = group.find('}').unwrap_or(group.len());
                    for item in group[..end].split(',') {
                        let mut p = path.clone();
                        p.extend(idents(item.trim()));
                        resolve(p, &mut out);
                    }
                    continue;
                }
                path.extend(idents(after));
                resolve(path, &mut out);
            }
        }
    }
    out
}

/// The items each module re-exports from another of the crate's modules: `pub use a::b::X;`
/// (or `pub use crate::a::{X, Y as Z};`, `self::`, `super::`) in module `m` maps `m::X` to the
/// module `a::b` it comes from.
fn reexports(
    src: &Path,
    files: &[PathBuf],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeMap<Vec<String>, Vec<String>> {
    let mut out = BTreeMap::new();
    for f in files {
        let me = module_of(src, f);
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        let joined: String = code
            .lines()
            .map(strip_comment)
            .collect::<Vec<_>>()
            .join(" ");
        for stmt in joined.split(';') {
            let Some(i) = stmt.find("pub use ") else {
                continue;
            };
            let path = stmt[i + "pub use ".len()..].trim();
            let (mut base, rest) = if let Some(r) = path.strip_prefix("crate::") {
                (Vec::new(), r)
            } else if let Some(r) = path.strip_prefix("self::") {
                (me.clone(), r)
            } else if let Some(r) = path.strip_prefix("super::") {
                (parent_of(&me), r)
            } else {
                (me.clone(), path)
            };
            let (prefix, items) = match rest.find('{') {
                Some(b) => (&rest[..b], rest[b + 1..].trim_end().trim_end_matches('}')),
                None => match rest.rfind("::") {
                    Some(k) => (&rest[..k + 2], &rest[k + 2..]),
                    None => continue,
                },
            };
            base.extend(
                prefix
                    .split("::")
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from),
            );
            for item in items.split(',') {
                let mut words = item.split_whitespace();
                let (Some(first), alias) = (words.next(), words.nth(1)) else {
                    continue;
                };
                let mut full = base.clone();
                full.extend(first.split("::").map(String::from));
                let name = alias.unwrap_or_else(|| first.rsplit("::").next().unwrap_or(first));
                if name == "*" || name == "self" {
                    continue;
                }
                // The module it comes from: the longest module prefix of its path.
                let from = (1..full.len())
                    .rev()
                    .map(|n| full[..n].to_vec())
                    .find(|p| modules.contains(p));
                if let Some(from) = from
                    && from != me
                {
                    let mut key = me.clone();
                    key.push(name.to_string());
                    out.insert(key, from);
                }
            }
        }
    }
    out
}

/// The module a `super::` in a file of module `me` names: its parent (for `mod.rs` and other
/// files alike, `super` of module `a::b` is `a`).
fn parent_of(me: &[String]) -> Vec<String> {
    me[..me.len().saturating_sub(1)].to_vec()
}

/// A cycle in `edges`, if there is one (as a path of nodes).
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn modules_import_without_cycles() {
    for krate in CRATES {
        let src = root().join("crates").join(krate).join("src");
        let files = rust_files(&src);
        let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
        let reexports = reexports(&src, &files, &modules);
        // Per directory module (and the crate root, `[]`): the graph of its child modules.
        let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for f in &files {
            let me = module_of(&src, f);
            if me.last().is_some_and(|m| m == "tests") {
                continue;
            }
            let text = std::fs::read_to_string(f).unwrap();
            for target in references(&code_of(&text), &me, &modules, &reexports) {
                // The edge is between the two children of the modules' deepest common ancestor.
                let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common >= me.len() || common >= target.len() {
                    continue; // a module's own items, or its ancestors' / descendants'
                }
                graphs
                    .entry(me[..common].to_vec())
                    .or_default()
                    .entry(me[common].clone())
                    .or_default()
                    .insert(target[common].clone());
            }
        }
        for (parent, edges) in &graphs {
            if let Some(cycle) = find_cycle(edges) {
                panic!(
                    "{krate}: modules of `{}` import each other in a cycle: {}",
                    if parent.is_empty() {
                        "crate".to_string()
                    } else {
                        parent.join("::")
                    },
                    cycle.join(" -> ")
                );
            }
        }
    }
}

/// Which workspace crates each crate may depend on (docs/architecture.md's picture).
fn allowed_dependencies() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        ("ember-redis", &[][..]),
        ("ember-embed", &["ember-redis"][..]),
        ("ember-model", &["ember-embed"][..]),
        ("ember-serve", &["ember-model"][..]),
        ("ember-plan", &["ember-embed"][..]),
        ("ember-cuda", &["ember-embed", "ember-model"][..]),
        (
            "ember-bench",
            &["ember-embed", "ember-model", "ember-cuda"][..],
        ),
        (
            "ember-cli",
            &[
                "ember-embed",
                "ember-model",
                "ember-serve",
                "ember-plan",
                "ember-cuda",
                "ember-bench",
            ][..],
        ),
    ])
}

#[test]
fn crates_depend_one_way_and_the_server_only_on_the_model() {
    let allowed = allowed_dependencies();
    for krate in CRATES {
        let toml =
            std::fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml")).unwrap();
        for line in toml.lines() {
            let Some(dep) = line.split(['=', '.', ' ']).next() else {
                continue;
            };
            if dep.starts_with("ember-") && dep != krate {
                assert!(
                    allowed[krate].contains(&dep),
                    "{krate} depends on {dep}: the crates depend one way (see docs/architecture.md)"
                );
            }
        }
    }
    let serve = root().join("crates/ember-serve");
    for dir in ["src", "tests", "benches"] {
        for f in rust_files(&serve.join(dir)) {
            let text = std::fs::read_to_string(&f).unwrap();
            let names_embed = text.match_indices("ember_embed").any(|(i, m)| {
                let next = text[i + m.len()..].chars().next();
                !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            assert!(
                !names_embed,
                "{} names ember_embed: the server sees the model only through ember-model",
                f.display()
            );
        }
    }
}

/// The crate graph as Cargo resolves it (`cargo metadata`: normal, dev and build
/// dependencies, renamed ones too), not as the manifests' lines read: every workspace member is
/// in CRATES, and every dependency on a workspace crate is one the picture allows.
#[test]
fn the_crate_graph_cargo_resolves_points_one_way() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let allowed = allowed_dependencies();
    let packages = meta["packages"].as_array().unwrap();
    let members: BTreeSet<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        members,
        CRATES.iter().copied().collect::<BTreeSet<_>>(),
        "the workspace's members and the architecture test's CRATES differ"
    );
    let mut edges = 0;
    for p in packages {
        let name = p["name"].as_str().unwrap();
        for d in p["dependencies"].as_array().unwrap() {
            let dep = d["name"].as_str().unwrap();
            if !members.contains(dep) || dep == name {
                continue;
            }
            edges += 1;
            let kind = d["kind"].as_str().unwrap_or("normal");
            assert!(
                allowed[name].contains(&dep),
                "{name} depends on {dep} ({kind}): the crates depend one way (see \
                 docs/architecture.md)"
            );
        }
    }
    // The graph was read: the CLI alone depends on six workspace crates.
    assert!(edges >= 6, "{edges} workspace dependencies found");
}

#[test]
fn source_files_hold_one_concern() {
    let allowed: BTreeMap<&str, &str> = LARGE.into_iter().collect();
    let mut over = Vec::new();
    for krate in CRATES {
        let src = root().join("crates").join(krate).join("src");
        for f in rust_files(&src) {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            if rel.ends_with("/tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let lines = code_of(&text).lines().count();
            if lines > 600 && !allowed.contains_key(rel.as_str()) {
                over.push(format!("{rel}: {lines} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "source files over 600 lines of non-test code (split them, or list them in LARGE with \
         a reason): {over:?}"
    );
}

#[test]
fn the_architecture_document_names_files_that_exist() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut named = 0;
    for piece in doc.split('`') {
        let p = piece.trim();
        if p.starts_with("crates/") && !p.contains(' ') && !p.contains('*') {
            // `crates/ember-embed/src/tier/stager.rs` or a directory `crates/ember-embed/src/tier/`.
            let path = p.split(['#', ':']).next().unwrap_or(p);
            assert!(
                root().join(path).exists(),
                "docs/architecture.md names {p}, which does not exist"
            );
            named += 1;
        }
    }
    assert!(
        named >= 20,
        "docs/architecture.md names only {named} source paths"
    );
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

#[test]
fn every_listed_dependency_is_used() {
    // Every crate of the workspace is one the house rules know.
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let p = e.unwrap().path();
        let dir = p.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            !p.join("Cargo.toml").exists() || CRATES.contains(&dir.as_str()),
            "crates/{dir} is not in the architecture test's CRATES"
        );
    }
    let mut unused = Vec::new();
    for name in CRATES {
        let c = root().join("crates").join(name);
        let manifest = std::fs::read_to_string(c.join("Cargo.toml")).unwrap();
        let mut files = Vec::new();
        for d in ["src", "tests", "benches", "examples"] {
            if c.join(d).is_dir() {
                files.extend(rust_files(&c.join(d)));
            }
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
