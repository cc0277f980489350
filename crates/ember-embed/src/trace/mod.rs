//! Id traces: files of one row id per line, as the literature publishes them (the production-
//! derived traces of the MICRO'24 artifact). The SSD tier profiles its pinned set from one;
//! benchmarks replay them; [`AccessRecorder`] writes them from a served model's lookups.

use crate::error::{EmbedError, Result};
use std::path::Path;

mod record;
pub use record::{AccessRecorder, RecordOptions, profile_path};

/// Reads a trace: one non-negative integer id per line (blank lines ignored).
pub fn load_trace(path: &Path) -> Result<Vec<u64>> {
    let err = |reason: String| EmbedError::Trace {
        path: path.display().to_string(),
        reason,
    };
    let text = crate::files::read_text(path, "trace", crate::files::TRACE_LIMIT).map_err(|e| {
        EmbedError::TraceIo {
            path: path.display().to_string(),
            cause: e.into(),
        }
    })?;
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        ids.push(t.parse::<u64>().map_err(|_| {
            err(format!(
                "line {}: '{t}' is not a non-negative integer id",
                n + 1
            ))
        })?);
    }
    if ids.is_empty() {
        return Err(err("no ids".into()));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_named() {
        let path = std::env::temp_dir().join(format!("ember-trace-{}", std::process::id()));
        std::fs::write(&path, "1\n2\n\nx3\n").unwrap();
        let e = load_trace(&path).unwrap_err().to_string();
        assert!(e.contains("line 4") && e.contains("x3"), "{e}");
        std::fs::write(&path, "1\n 2 \n\n7\n").unwrap();
        assert_eq!(load_trace(&path).unwrap(), [1, 2, 7]);
        std::fs::write(&path, "\n\n").unwrap();
        assert!(
            load_trace(&path)
                .unwrap_err()
                .to_string()
                .contains("no ids")
        );
        std::fs::remove_file(&path).ok();
        assert!(load_trace(Path::new("/nonexistent/trace")).is_err());
    }
}
