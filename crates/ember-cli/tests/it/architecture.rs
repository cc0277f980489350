//! The house rules of the workspace, checked on its sources (`docs/architecture.md` states
//! them):
//!
//! - crates depend one way: embed <- pool-command <- redis-module; redis, embed <- registry;
//!   redis, embed, pool-command, registry <- tier <- model <- serve / plan / cuda / bench <- cli
//!   (the Redis module links neither the tier nor the server), and the server sees the model only
//!   through `ember-model` (no `ember-embed` or `ember-tier` anywhere in `ember-serve`), in the
//!   manifests and in the graph Cargo resolves (`cargo metadata`);
//! - the server's code names none of the embedding stage's types `ember-model` re-exports but
//!   the seam's input columns (`SERVER_MAY_NAME`, each with its reason), and calls none of the
//!   `Model` methods that hand the stage out (`EMBEDDING_STAGE_ACCESSORS`);
//! - no import cycle between the modules of a crate, nor between the files of a module
//!   directory (an import that "runs back up" closes a cycle);
//! - no source file over 600 lines of non-test code without a stated reason (`#[cfg(test)]`
//!   items left out wherever they stand);
//! - no function over 100 lines without a stated reason (a `// Long:` line above it);
//! - every source path `docs/architecture.md` names exists;
//! - every dependency a crate's `Cargo.toml` lists is named in its sources (or excused with
//!   its reason in `NEEDED_WITHOUT_A_PATH`): no external tool (cargo-machete / cargo-udeps are
//!   not on CI's machines).
//!
//! Test code (`#[cfg(test)]` modules, `tests/`, `benches/`) is not held to the import rules:
//! tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) const CRATES: [&str; 12] = [
    "ember-redis",
    "ember-pool-command",
    "ember-redis-module",
    "ember-embed",
    "ember-tier",
    "ember-model",
    "ember-registry",
    "ember-serve",
    "ember-cuda",
    "ember-plan",
    "ember-bench",
    "ember-cli",
];

/// (crate, dependency, why it has no path in the sources)
const NEEDED_WITHOUT_A_PATH: &[(&str, &str, &str)] = &[
    (
        "ember-serve",
        "tonic-prost",
        "the gRPC code build.rs generates into OUT_DIR names tonic_prost::ProstCodec",
    ),
    (
        "ember-cli",
        "ember-redis-module",
        "a dev-dependency so that `cargo test` builds the module's cdylib beside the test \
         binaries, where redis_cluster::pool_module finds it for the tests' redis-server",
    ),
];

/// Files allowed over the size limit, with why.
const LARGE: [(&str, &str); 0] = [];

/// The non-test code of a file: every item under `#[cfg(test)]` (or `#[cfg(all(test, ...))]`)
/// removed wherever it stands, a `mod tests;` line or a whole `mod tests { ... }` block (braces
/// counted outside comments, strings and char literals).
pub(crate) fn code_of(text: &str) -> String {
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
pub(crate) fn rust_files(dir: &Path) -> Vec<PathBuf> {
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
        // EMBER.POOL's definition: the module links it, and neither the tier nor the server.
        ("ember-pool-command", &["ember-embed"][..]),
        ("ember-redis-module", &["ember-pool-command"][..]),
        ("ember-embed", &[][..]),
        // The registry owns what is in the store: its layout, reads and writes. The tier reads
        // through it; the model fetches a version as a model directory through it.
        ("ember-registry", &["ember-redis", "ember-embed"][..]),
        (
            "ember-tier",
            &[
                "ember-redis",
                "ember-embed",
                "ember-pool-command",
                "ember-registry",
            ][..],
        ),
        (
            "ember-model",
            &["ember-embed", "ember-tier", "ember-registry", "ember-redis"][..],
        ),
        ("ember-serve", &["ember-model"][..]),
        ("ember-plan", &["ember-embed"][..]),
        ("ember-cuda", &["ember-embed", "ember-model"][..]),
        (
            "ember-bench",
            &[
                "ember-redis",
                "ember-embed",
                "ember-tier",
                "ember-model",
                "ember-cuda",
            ][..],
        ),
        (
            "ember-cli",
            &[
                "ember-redis",
                "ember-embed",
                "ember-tier",
                "ember-pool-command",
                "ember-model",
                "ember-registry",
                "ember-serve",
                "ember-plan",
                "ember-cuda",
                "ember-bench",
                "ember-redis-module",
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
            for stage in ["ember_embed", "ember_tier"] {
                let named = text.match_indices(stage).any(|(i, m)| {
                    let next = text[i + m.len()..].chars().next();
                    !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                assert!(
                    !named,
                    "{} names {stage}: the server sees the model only through ember-model",
                    f.display()
                );
            }
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

/// Lines a function may span (from its `fn` line to its closing brace) without a stated reason.
const LONG_FN: usize = 100;

/// `code` with comments, string and char literals blanked to spaces, its lines kept: the text
/// that braces and keywords are read from. Handles block comments, strings over several lines,
/// escapes, raw strings (`r#"..."#`, `br"..."`), char literals and lifetimes.
pub(crate) fn blank_literals(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let keep = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    keep(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if (c == b'r' || (c == b'b' && next == Some(b'r'))) && !ident_before && {
            let j = if c == b'b' { i + 2 } else { i + 1 };
            let hashes = b[j..].iter().take_while(|&&h| h == b'#').count();
            b.get(j + hashes) == Some(&b'"')
        } {
            let j = if c == b'b' { i + 2 } else { i + 1 };
            let hashes = b[j..].iter().take_while(|&&h| h == b'#').count();
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            out.extend(std::iter::repeat_n(b' ', j + hashes + 1 - i));
            i = j + hashes + 1;
            while i < b.len() && !b[i..].starts_with(&close) {
                keep(&mut out, b[i]);
                i += 1;
            }
            out.extend(std::iter::repeat_n(b' ', close.len().min(b.len() - i)));
            i += close.len();
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    keep(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A char literal ('{', '\n', '\u{7f}') or a lifetime ('a): blank a literal only.
            let end = if next == Some(b'\\') {
                (b.get(i + 3..).unwrap_or(&[]).iter())
                    .position(|&d| d == b'\'')
                    .map(|p| i + 3 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(b' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The functions of `code` (non-test code, literals blanked) longer than `limit` lines that
/// state no reason (a `// Long: <reason>` line among the comments and attributes right above
/// the `fn`): `(name, first line, lines)`.
fn long_functions(original: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let code = blank_literals(original);
    let text: Vec<&str> = original.lines().collect();
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        // `fn name`: a declaration (`fn(` is a function pointer's type).
        let Some(name) = line
            .split_whitespace()
            .skip_while(|w| *w != "fn")
            .nth(1)
            .and_then(|w| w.split(|c: char| !(c.is_alphanumeric() || c == '_')).next())
            .filter(|w| !w.is_empty())
        else {
            continue;
        };
        // The body: from the first `{` after the name to its match (none: a declaration).
        let mut depth = 0i64;
        let mut end = None;
        'scan: for (j, l) in lines.iter().enumerate().skip(at) {
            let from = if j == at {
                line.find(name).unwrap_or(0)
            } else {
                0
            };
            for c in l[from..].chars() {
                match c {
                    ';' if depth == 0 => break 'scan,
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(j);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        let Some(end) = end else { continue };
        let len = end - at + 1;
        if len <= limit {
            continue;
        }
        let stated = text[..at]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["))
            .any(|l| l.starts_with("// Long:"));
        if !stated {
            found.push((name.to_string(), at + 1, len));
        }
    }
    found
}

#[test]
fn the_function_reader_measures_bodies_and_reads_reasons() {
    let body = "    let x = 1;\n".repeat(3);
    let f = format!("fn short() {{\n{body}}}\n");
    assert!(long_functions(&f, 5).is_empty());
    let brace_text = "    let s = \"}}}}\"; let c = '}'; let r = r#\"{\"#; // }\n";
    let g = format!("/// doc\nfn long<'a>(x: &'a str) {{\n{brace_text}{body}}}\nfn after() {{}}\n");
    assert_eq!(long_functions(&g, 4), vec![("long".to_string(), 2, 6)]);
    let h = format!("// Long: one unrolled loop\n#[inline]\n{}", &g[8..]);
    assert!(
        long_functions(&h, 4).is_empty(),
        "a stated reason excuses it"
    );
    let multi = format!("fn m() {{\n    let s = \"a\n}}\n\";\n{body}}}\n");
    assert_eq!(long_functions(&multi, 4), vec![("m".to_string(), 1, 8)]);
    let quotes = format!("fn q() {{\n    let a = '\\''; let b = '{{';\n{body}}}\n");
    assert_eq!(long_functions(&quotes, 4), vec![("q".to_string(), 1, 6)]);
    assert!(long_functions("trait T { fn f(&self); }\n", 0).is_empty());
}

#[test]
fn functions_stay_short_or_say_why() {
    let mut over = Vec::new();
    for krate in CRATES {
        let src = root().join("crates").join(krate).join("src");
        for f in rust_files(&src) {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            if rel.ends_with("/tests.rs") || rel.ends_with("_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            for (name, line, len) in long_functions(&code_of(&text), LONG_FN) {
                over.push(format!("{rel}:{line} {name}: {len} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {LONG_FN} lines of non-test code (cut them into functions that each do \
         one thing, or state why not in a `// Long: <reason>` line above the fn): {over:#?}"
    );
}

#[test]
fn the_architecture_document_names_files_that_exist() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut named = 0;
    for piece in doc.split('`') {
        let p = piece.trim();
        if p.starts_with("crates/") && !p.contains(' ') && !p.contains('*') {
            // `crates/ember-tier/src/tier/stager.rs` or a directory `crates/ember-tier/src/tier/`.
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

/// The embedding stage's items (`ember-embed`, `ember-tier`) that `ember-model` re-exports and the
/// server's code may name, with why.
/// Every other re-export (`KeyedJagged`, `TierStats`, ...) is for tools and engines: the server
/// sees what it needs of them through the seam's own types (`Model::inputs`, `Model::tier`).
const SERVER_MAY_NAME: &[(&str, &str)] = &[
    (
        "Ids",
        "the seam's id column: what a decoder builds for `Model::check_samples`",
    ),
    (
        "Lengths",
        "the seam's lengths column: what a decoder builds for `Model::check_samples`",
    ),
    (
        "metric_names",
        "the names of the metrics the embedding stage records, which the server describes on \
         /metrics: strings, no type of the stage",
    ),
    (
        "run_ahead",
        "the seam's pipeline: a generic function that runs `Model::prepare` ahead of \
         `Engine::run`; no type of the embedding stage crosses it",
    ),
];

/// The `Model` methods that hand out the embedding stage itself (its stager, its collection of
/// tables, its lookup recorder): tools and benchmarks call them, the server's code does not.
const EMBEDDING_STAGE_ACCESSORS: [&str; 3] = ["stager", "embeddings", "recorder"];

/// The names `lib` (a crate root's code) re-exports from the embedding stage (`ember-embed` and
/// `ember-tier`): `pub use ember_embed::X;`, `pub use ember_tier::a::{X, Y as Z};` give `X`, `Y`
/// (or `Z`).
fn embed_reexports(lib: &str) -> Vec<String> {
    let joined: String = lib.lines().map(strip_comment).collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    for stmt in joined.split(';') {
        let Some(i) = ["pub use ember_embed::", "pub use ember_tier::"]
            .iter()
            .find_map(|p| stmt.find(p))
        else {
            continue;
        };
        let path = &stmt[i + "pub use ".len()..];
        let items = match path.find('{') {
            Some(b) => path[b + 1..].trim_end().trim_end_matches('}'),
            None => path.rsplit("::").next().unwrap_or(path),
        };
        for item in items.split(',') {
            let words: Vec<&str> = item.split_whitespace().collect();
            let name = match words[..] {
                [first] => first.rsplit("::").next().unwrap_or(first),
                [_, "as", alias] => alias,
                _ => continue,
            };
            out.push(name.to_string());
        }
    }
    out
}

/// Whether `code` names the identifier `name` (not as part of a longer one); with `call`, only
/// as a method or path call: `.name(` or `::name(`.
fn names_ident(code: &str, name: &str, call: bool) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(name).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + name.len()..].trim_start().chars().next();
        let whole = !before.is_some_and(ident) && !after.is_some_and(ident);
        whole && (!call || (matches!(before, Some('.' | ':')) && after == Some('(')))
    })
}

#[test]
fn the_server_names_no_type_of_the_embedding_stage() {
    let lib = std::fs::read_to_string(root().join("crates/ember-model/src/lib.rs")).unwrap();
    let reexported = embed_reexports(&code_of(&lib));
    assert!(
        reexported.iter().any(|n| n == "KeyedJagged") && reexported.len() >= 5,
        "read too few of ember-model's re-exports of ember-embed: {reexported:?}"
    );
    for (name, _why) in SERVER_MAY_NAME {
        assert!(
            reexported.iter().any(|n| n == name),
            "SERVER_MAY_NAME lists {name}, which ember-model no longer re-exports from ember-embed"
        );
    }
    let src = root().join("crates/ember-serve/src");
    let mut named = Vec::new();
    for f in rust_files(&src) {
        if module_of(&src, &f).last().is_some_and(|m| m == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let code: String = code_of(&text)
            .lines()
            .map(code_chars)
            .collect::<Vec<_>>()
            .join("\n");
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        for name in &reexported {
            let may = SERVER_MAY_NAME.iter().any(|(n, _)| n == name);
            if !may && names_ident(&code, name, false) {
                named.push(format!("{rel} names ember_model::{name}"));
            }
        }
        for m in EMBEDDING_STAGE_ACCESSORS {
            if names_ident(&code, m, true) {
                named.push(format!("{rel} calls Model::{m}"));
            }
        }
    }
    assert!(
        named.is_empty(),
        "the server sees the model through ember-model's seam (Model::inputs, Model::tier, ...), \
         not the embedding stage's types: {named:?} (or list a re-export in SERVER_MAY_NAME with \
         its reason)"
    );
}

#[test]
fn the_reexport_reader_finds_each_name() {
    let lib = "/// doc\n#[doc(hidden)]\npub use ember_embed::id_checks;\npub use ember_embed::{\n    \
               DType, Ids as Column,\n};\npub use ember_tier::run_ahead;\npub use x::Y;\n";
    assert_eq!(
        embed_reexports(lib),
        ["id_checks", "DType", "Column", "run_ahead"]
    );
    assert!(names_ident("let s = m.stager ();", "stager", true));
    assert!(!names_ident("let stager = 1; x.stagers()", "stager", true));
    assert!(names_ident(
        "use ember_model::{Ids, Shard};",
        "Shard",
        false
    ));
    assert!(!names_ident("struct ShardMap;", "Shard", false));
}
