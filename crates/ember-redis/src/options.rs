//! How to reach a cluster and how long to wait ([`ClusterOptions`], parsed from a
//! `redis://` or `rediss://` URL).

use crate::error::{RedisError, Result};
use crate::tls::RedisTls;
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
    /// TLS to every node (`rediss://`); `None`: plain TCP.
    pub tls: Option<RedisTls>,
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
            .field("tls", &self.tls)
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

    /// Parses `redis://[user:password@]host:port[,host:port...]` (the scheme may be left out),
    /// or `rediss://...?tls_ca=CA.pem[&tls_cert=C.pem&tls_key=C.key][&tls_server_name=NAME]`:
    /// TLS to every node, trusting the CA file, showing a client certificate where the nodes
    /// ask for one (`tls-auth-clients yes`), and expecting every node's certificate to carry
    /// NAME (by default, the host each node is reached at).
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: String| RedisError::BadUrl { reason };
        let (url_base, query) = match url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (url, None),
        };
        let (tls_scheme, rest) = match url_base.strip_prefix("rediss://") {
            Some(r) => (true, r),
            None => (false, url_base.strip_prefix("redis://").unwrap_or(url_base)),
        };
        let tls = tls_options(url, tls_scheme, query).map_err(bad)?;
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
            tls,
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
            tls: None,
        }
    }
}

/// The TLS of a URL: its `tls_*` parameters, which only `rediss://` takes (and needs
/// `tls_ca`: no system roots are read).
fn tls_options(
    url: &str,
    tls: bool,
    query: Option<&str>,
) -> std::result::Result<Option<RedisTls>, String> {
    let (mut ca, mut cert, mut key, mut name) = (None, None, None, None);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("'{pair}' in '{url}' is not NAME=VALUE"))?;
        let slot = match k {
            "tls_ca" => &mut ca,
            "tls_cert" => &mut cert,
            "tls_key" => &mut key,
            "tls_server_name" => &mut name,
            _ => {
                return Err(format!(
                    "unknown parameter '{k}' in the Redis URL (known: tls_ca, tls_cert, tls_key, \
                     tls_server_name)"
                ));
            }
        };
        *slot = Some(v.to_string());
    }
    let any = ca.is_some() || cert.is_some() || key.is_some() || name.is_some();
    match (tls, any) {
        (false, false) => return Ok(None),
        (false, true) => {
            return Err("tls_* parameters need a rediss:// URL (TLS); this one is redis://".into());
        }
        (true, _) => {}
    }
    let ca =
        ca.ok_or("rediss:// needs tls_ca=FILE (the CA that signed the nodes' certificates)")?;
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((c.into(), k.into())),
        (None, None) => None,
        _ => return Err("tls_cert and tls_key go together".into()),
    };
    RedisTls::new(ca.into(), client, name).map(Some)
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
        for bad in ["redis://", "redis://host", "redis://h:notaport"] {
            assert!(ClusterOptions::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_urls_need_their_ca_and_say_what_is_wrong() {
        for (url, says) in [
            ("rediss://h:1", "needs tls_ca"),
            ("redis://h:1?tls_ca=x.pem", "need a rediss://"),
            (
                "rediss://h:1?tls_ca=/nonexistent/ca.pem",
                "tls_ca /nonexistent/ca.pem",
            ),
            ("rediss://h:1?tls_ca=a&tls_cert=b", "go together"),
            (
                "rediss://h:1?tls_ca=a&verify=no",
                "unknown parameter 'verify'",
            ),
            ("rediss://h:1?tls_ca", "is not NAME=VALUE"),
        ] {
            let e = ClusterOptions::parse(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        assert!(ClusterOptions::parse("redis://h:1").unwrap().tls.is_none());
    }
}
