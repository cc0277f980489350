//! `ember serve`'s log: `tracing` events to stderr, as text (with ANSI colours on a terminal)
//! or one JSON object a line (`--log-format json`), filtered by `--log-level`, else `RUST_LOG`
//! (its full syntax: `info,ember_serve=debug`), else `info`. The access log (target
//! `ember_access`) is off unless `--access-log` turns it on.

use clap::{Args, ValueEnum};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log level: error, warn, info, debug or trace (or a RUST_LOG-style filter); overrides
    /// RUST_LOG [default: RUST_LOG, else info].
    #[arg(long)]
    log_level: Option<String>,
    /// Log lines as text, or as one JSON object a line (for machines).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log one line per request: protocol, route, model, status, samples, latency.
    #[arg(long)]
    access_log: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The filter `a` asks for: the level or RUST_LOG, with the access log on or off.
fn filter(a: &LogArgs) -> anyhow::Result<EnvFilter> {
    let base = match (&a.log_level, std::env::var("RUST_LOG")) {
        (Some(l), _) => l.clone(),
        (None, Ok(env)) if !env.trim().is_empty() => env,
        _ => "info".into(),
    };
    let access = if a.access_log { "info" } else { "off" };
    let spec = format!("{base},{}={access}", ember_serve::access::TARGET);
    EnvFilter::try_new(&spec).map_err(|e| {
        anyhow::anyhow!("--log-level / RUST_LOG '{base}' is not a level or filter: {e}")
    })
}

/// Installs the subscriber (once per process).
pub fn init(a: &LogArgs) -> anyhow::Result<()> {
    let filter = filter(a)?;
    // A log line that cannot be written (stderr closed by whoever started the server) is lost,
    // not reported with `eprintln!`, which would panic on the same closed stderr and take
    // the server down.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let done = match a.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    done.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(level: Option<&str>, access_log: bool) -> LogArgs {
        LogArgs {
            log_level: level.map(String::from),
            log_format: LogFormat::Text,
            access_log,
        }
    }

    #[test]
    fn the_level_and_the_access_log_make_the_filter() {
        let f = filter(&args(Some("warn"), false)).unwrap().to_string();
        assert!(f.contains("warn") && f.contains("ember_access=off"), "{f}");
        let f = filter(&args(Some("debug"), true)).unwrap().to_string();
        assert!(
            f.contains("debug") && f.contains("ember_access=info"),
            "{f}"
        );
        let e = filter(&args(Some("loud=nope=x"), false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'loud=nope=x' is not a level"), "{e}");
    }
}
