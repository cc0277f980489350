//! How to reach a cluster and how long to wait ([`ClusterOptions`], parsed from a
//! `redis://` URL).

use crate::error::{RedisError, Result};
use std::fmt;
use std::time::Duration;

/// How to reach a cluster, and how long to wait for it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Nodes to learn the cluster from, `host:port`.
    pub seeds: Vec<String>,
    /// `AUTH` credentials, if the cluster asks for them.
    pub username: Option<String>,
    pub password: Option<String>,
    /// Longest wait for a TCP connection to a node.
    pub connect_timeout: Duration,
    /// Deadline of one call (a batch's fetch), retries included.
    pub timeout: Duration,
    /// Retries of the commands that failed, within the deadline.
    pub retries: u32,
    /// Spread reads over each slot's primary and replicas.
    pub read_from_replicas: bool,
    /// How long a node that failed is avoided while another copy of its slots exists.
    pub down_for: Duration,
}

impl fmt::Debug for ClusterOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterOptions")
            .field("seeds", &self.seeds)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("read_from_replicas", &self.read_from_replicas)
            .finish()
    }
}

/// Deadline of the calls a server makes once while it starts or loads a version (slot map,
/// manifest, stream positions): a load runs at low priority and may wait for a core, so the
/// per-batch deadline (100 ms by default) would fail it on a busy host.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

impl ClusterOptions {
    /// These options with a deadline of at least [`SETUP_TIMEOUT`], for calls made once at start.
    pub fn for_setup(&self) -> Self {
        ClusterOptions {
            timeout: self.timeout.max(SETUP_TIMEOUT),
            ..self.clone()
        }
    }

    /// Parses `redis://[user:password@]host:port[,host:port...]` (the scheme may be left out).
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: String| RedisError::BadUrl { reason };
        let rest = url.strip_prefix("redis://").unwrap_or(url);
        if rest.starts_with("rediss://") || url.starts_with("rediss://") {
            return Err(bad("TLS (rediss://) is not supported yet".into()));
        }
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (username, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => ((!u.is_empty()).then(|| u.to_string()), Some(p.to_string())),
                None => (None, Some(a.to_string())),
            },
        };
        let seeds: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        if seeds.is_empty() {
            return Err(bad(format!(
                "'{url}' names no node (expected redis://host:port)"
            )));
        }
        for s in &seeds {
            let ok = s
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(bad(format!("'{s}' in '{url}' is not host:port")));
            }
        }
        Ok(ClusterOptions {
            seeds,
            username,
            password,
            ..ClusterOptions::default()
        })
    }

    /// The seeds, for messages: `redis cluster at 127.0.0.1:7000,127.0.0.1:7001`.
    pub fn describe(&self) -> String {
        format!("redis cluster at {}", self.seeds.join(","))
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            seeds: Vec::new(),
            username: None,
            password: None,
            connect_timeout: Duration::from_millis(250),
            timeout: Duration::from_millis(100),
            retries: 2,
            read_from_replicas: false,
            down_for: Duration::from_millis(500),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_and_without_scheme_and_auth() {
        let o = ClusterOptions::parse("redis://127.0.0.1:7000,127.0.0.1:7001").unwrap();
        assert_eq!(o.seeds, ["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert_eq!(o.password, None);
        let o = ClusterOptions::parse("redis://u:p@h:1/").unwrap();
        assert_eq!(
            (o.username.as_deref(), o.password.as_deref()),
            (Some("u"), Some("p"))
        );
        assert_eq!(o.seeds, ["h:1"]);
        let o = ClusterOptions::parse(":secret@h:2").unwrap();
        assert_eq!(
            (o.username.as_deref(), o.password.as_deref()),
            (None, Some("secret"))
        );
        assert!(!format!("{o:?}").contains("secret"));
        for bad in [
            "redis://",
            "redis://host",
            "redis://h:notaport",
            "rediss://h:1",
        ] {
            assert!(ClusterOptions::parse(bad).is_err(), "{bad}");
        }
    }
}
