//! The house rule of error messages (`docs/architecture.md`, "Errors"), checked on the sources:
//! an error type of the workspace (a `thiserror` derive) says its cause in its own message. Every
//! field that is its `source()` (`#[source]`, `#[from]`, or a field named `source`) is named in
//! its `#[error(...)]` text, or the variant is `transparent`. A message is then whole: a server
//! answers `to_string()`, and the binary prints a chain down to the first Ember error only
//! (`main.rs`'s `report`), classifying causes by type, never by their text.

use std::path::Path;

use super::architecture::{CRATES, blank_literals, code_of, root, rust_files};

/// One variant (or struct) whose source is not in its message: `(type, variant, field)`.
type Miss = (String, String, String);

/// The index of the bracket that closes the one at `open` (`(`, `[`, `{`) in `blank`.
fn closing(blank: &[u8], open: usize) -> usize {
    let (o, c) = match blank[open] {
        b'(' => (b'(', b')'),
        b'[' => (b'[', b']'),
        _ => (b'{', b'}'),
    };
    let mut depth = 0;
    for (i, &b) in blank.iter().enumerate().skip(open) {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    panic!("unbalanced '{}' at byte {open}", o as char);
}

/// Whether `ident` appears in `text` as a whole identifier (or, for a tuple field's index, as
/// `{0`, `{0:` or `.0`).
fn names(text: &str, ident: &str) -> bool {
    if ident.bytes().all(|b| b.is_ascii_digit()) {
        return text.contains(&format!("{{{ident}}}"))
            || text.contains(&format!("{{{ident}:"))
            || text.contains(&format!(".{ident}"));
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    text.match_indices(ident).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| text.as_bytes()[i]);
        let after = text.as_bytes().get(at + ident.len()).copied();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// The attributes (`#[...]`, each its text from `src`) and what follows them from `at` in a
/// list: `(attributes, the index after them)`.
fn attributes(src: &str, blank: &[u8], mut at: usize) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    loop {
        while at < blank.len() && blank[at].is_ascii_whitespace() {
            at += 1;
        }
        if blank.get(at) == Some(&b'#') && blank.get(at + 1) == Some(&b'[') {
            let end = closing(blank, at + 1);
            out.push(src[at + 2..end].to_string());
            at = end + 1;
        } else {
            return (out, at);
        }
    }
}

/// The fields of a field list between `open` and its closing bracket: `(name or index, is a
/// source)`.
fn fields(src: &str, blank: &[u8], open: usize) -> Vec<(String, bool)> {
    let end = closing(blank, open);
    let mut out = Vec::new();
    let mut at = open + 1;
    let mut index = 0;
    while at < end {
        let (attrs, start) = attributes(src, blank, at);
        if start >= end {
            break;
        }
        // The field runs to the next comma outside brackets (types hold `<...>`, `(...)`).
        let mut depth = 0i32;
        let mut stop = start;
        while stop < end {
            match blank[stop] {
                b'(' | b'[' | b'{' | b'<' => depth += 1,
                b')' | b']' | b'}' | b'>' => depth -= 1,
                b',' if depth == 0 => break,
                _ => {}
            }
            stop += 1;
        }
        let name = match blank[open] {
            b'{' => src[start..stop]
                .split(':')
                .next()
                .unwrap_or("")
                .trim()
                .trim_start_matches("pub ")
                .trim()
                .to_string(),
            _ => index.to_string(),
        };
        let source = attrs
            .iter()
            .any(|a| a.trim() == "source" || a.trim() == "from")
            || name == "source";
        out.push((name, source));
        index += 1;
        at = stop + 1;
    }
    out
}

/// The `#[error(...)]` text among `attrs`.
fn message(attrs: &[String]) -> Option<&str> {
    attrs
        .iter()
        .find_map(|a| a.trim().strip_prefix("error").map(str::trim))
}

/// The source fields of `fs` that `msg` does not name.
fn unnamed<'a>(msg: Option<&str>, fs: &'a [(String, bool)]) -> Vec<&'a str> {
    let Some(msg) = msg else {
        return Vec::new();
    };
    if msg.trim_matches(|c| c == '(' || c == ')').trim() == "transparent" {
        return Vec::new();
    }
    fs.iter()
        .filter(|(name, source)| *source && !names(msg, name))
        .map(|(name, _)| name.as_str())
        .collect()
}

/// Every `thiserror` type of `code` (non-test Rust source) with a source its message does not
/// name, and the number of error types read.
fn misses(code: &str) -> (Vec<Miss>, usize) {
    let blank = blank_literals(code);
    let b = blank.as_bytes();
    assert_eq!(b.len(), code.len(), "blanking keeps byte positions");
    let mut out = Vec::new();
    let mut types = 0;
    let mut from = 0;
    while let Some(found) = blank[from..].find("#[derive(") {
        let open = from + found + 8;
        let close = closing(b, open);
        from = close;
        let derived = &blank[open + 1..close];
        if !derived
            .split(',')
            .any(|d| d.trim() == "Error" || d.trim() == "thiserror::Error")
        {
            continue;
        }
        let (attrs, at) = attributes(code, b, close + 2);
        let rest = &blank[at..];
        let kw = rest
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ");
        let (is_enum, after_kw) = match (kw.strip_prefix("enum "), kw.strip_prefix("struct ")) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => continue,
        };
        types += 1;
        let ty: String = after_kw
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let body = at + rest.len() - after_kw.len() + ty.len();
        let Some(open) = blank[body..].find(['{', '(', ';']).map(|i| body + i) else {
            continue;
        };
        if !is_enum {
            if b[open] != b';' {
                for f in unnamed(message(&attrs), &fields(code, b, open)) {
                    out.push((ty.clone(), String::new(), f.to_string()));
                }
            }
            continue;
        }
        let end = closing(b, open);
        let mut at = open + 1;
        while at < end {
            let (attrs, start) = attributes(code, b, at);
            if start >= end {
                break;
            }
            let variant: String = blank[start..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let mut next = start + variant.len();
            while b[next].is_ascii_whitespace() {
                next += 1;
            }
            let fs = match b[next] {
                b'{' | b'(' => {
                    let fs = fields(code, b, next);
                    next = closing(b, next) + 1;
                    fs
                }
                _ => Vec::new(),
            };
            for f in unnamed(message(&attrs), &fs) {
                out.push((ty.clone(), variant.clone(), f.to_string()));
            }
            at = blank[next..end].find(',').map_or(end, |i| next + i + 1);
        }
    }
    (out, types)
}

#[test]
fn the_message_reader_finds_an_unnamed_source() {
    let code = r#"
#[derive(Debug, thiserror::Error)]
pub enum E {
    #[error("{path}: {source}")]
    Named { path: String, source: std::io::Error },
    #[error("reading {path} failed")]
    Forgot {
        path: String,
        #[source]
        cause: Box<HashMap<String, u32>>,
    },
    #[error("bad: {0}")]
    Tuple(#[from] Inner),
    #[error("lost")]
    TupleLost(String, #[source] Inner),
    #[error(transparent)]
    Through(#[from] Other),
    #[error("{store} ({kind}): {detail}", kind = failure.kind, detail = failure.detail)]
    Args { store: String, #[source] failure: F },
    #[error("unit")]
    Unit,
}

#[derive(Debug, Error)]
#[error("wrapped")]
pub struct S(#[source] Inner);

#[derive(Debug, Clone)]
pub enum NotAnError {
    #[error("no")]
    A(#[source] X),
}
"#;
    let want = [
        ("E", "Forgot", "cause"),
        ("E", "TupleLost", "1"),
        ("S", "", "0"),
    ];
    let want: Vec<Miss> = want
        .iter()
        .map(|(t, v, f)| (t.to_string(), v.to_string(), f.to_string()))
        .collect();
    assert_eq!(misses(code), (want, 2));
}

#[test]
fn every_error_names_its_source_in_its_message() {
    let mut found = Vec::new();
    let mut types = 0;
    for krate in CRATES {
        let src = root().join("crates").join(krate).join("src");
        for file in rust_files(&src) {
            let text = std::fs::read_to_string(&file).unwrap();
            let rel = file
                .strip_prefix(root().join("crates"))
                .unwrap_or(Path::new(""));
            let (misses, read) = misses(&code_of(&text));
            types += read;
            for (ty, variant, field) in misses {
                found.push(format!(
                    "{}: {ty}{}{variant}: source `{field}` is not in its #[error] text",
                    rel.display(),
                    if variant.is_empty() { "" } else { "::" }
                ));
            }
        }
    }
    // The reader found the workspace's error types (EmbedError, ModelError, PlanError, ...).
    assert!(types >= 15, "only {types} error types read");
    assert!(
        found.is_empty(),
        "an error's message must say its cause (the binary prints a chain only down to the \
         first Ember error):\n{}",
        found.join("\n")
    );
}
