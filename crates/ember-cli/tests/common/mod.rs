//! Helpers shared by the end-to-end tests of the `ember` binary.

use std::process::Command;

/// Runs `ember args` in the current directory: (success, stdout, stderr).
pub fn ember(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .output()
        .expect("run ember");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The JSON object a `--json` run prints as its last line.
pub fn json_of(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().expect("output")).expect("last line is JSON")
}
