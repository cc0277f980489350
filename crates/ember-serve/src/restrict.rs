//! API groups restricted to requests carrying a header (`ember serve --restricted-api
//! GROUPS:KEY=VALUE`), as Triton's `--http-restricted-api` / `--grpc-restricted-protocol`, on
//! HTTP and gRPC alike (gRPC metadata is HTTP/2 headers): a request of a restricted group
//! without the header, or with another value, is refused before any work with 403 /
//! `PERMISSION_DENIED`, naming the group and the header (never its value).
//!
//! The groups are Triton's: `health`, `metadata`, `model-config`, `inference`,
//! `model-repository`, `statistics`, plus `metrics` (`GET /metrics`) and Triton's `trace`,
//! `logging` and `shared-memory` (gRPC methods Ember does not implement; restricting them
//! decides who is told so). Each route and method belongs to one group ([`group_of`]).

use std::collections::HashMap;

/// An API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    Health,
    Metadata,
    ModelConfig,
    Inference,
    ModelRepository,
    Statistics,
    Metrics,
    Trace,
    Logging,
    SharedMemory,
}

impl Group {
    /// Every group, in the order the docs list them.
    pub const ALL: [Group; 10] = [
        Group::Health,
        Group::Metadata,
        Group::ModelConfig,
        Group::Inference,
        Group::ModelRepository,
        Group::Statistics,
        Group::Metrics,
        Group::Trace,
        Group::Logging,
        Group::SharedMemory,
    ];

    /// Its name on the command line (Triton's).
    pub fn name(self) -> &'static str {
        match self {
            Group::Health => "health",
            Group::Metadata => "metadata",
            Group::ModelConfig => "model-config",
            Group::Inference => "inference",
            Group::ModelRepository => "model-repository",
            Group::Statistics => "statistics",
            Group::Metrics => "metrics",
            Group::Trace => "trace",
            Group::Logging => "logging",
            Group::SharedMemory => "shared-memory",
        }
    }
}

/// The group of a request: its HTTP path, or (gRPC) `/inference.GRPCInferenceService/Method`;
/// `None` for a path no route serves (it gets its 404 / UNIMPLEMENTED unrestricted).
pub fn group_of(path: &str) -> Option<Group> {
    if let Some(method) = path.strip_prefix("/inference.GRPCInferenceService/") {
        return Some(match method {
            "ServerLive" | "ServerReady" | "ModelReady" => Group::Health,
            "ServerMetadata" | "ModelMetadata" => Group::Metadata,
            "ModelConfig" => Group::ModelConfig,
            "ModelInfer" | "ModelStreamInfer" => Group::Inference,
            "ModelStatistics" => Group::Statistics,
            "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => {
                Group::ModelRepository
            }
            "TraceSetting" => Group::Trace,
            "LogSettings" => Group::Logging,
            m if m.contains("SharedMemory") => Group::SharedMemory,
            _ => return None,
        });
    }
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    Some(match parts.as_slice() {
        ["metrics"] => Group::Metrics,
        ["v1", "score"] => Group::Inference,
        ["v2"] => Group::Metadata,
        ["v2", "health", "live" | "ready"] => Group::Health,
        ["v2", "repository", ..] => Group::ModelRepository,
        ["v2", "models", "stats"] => Group::Statistics,
        ["v2", "models", _, rest @ ..] => {
            let rest = match rest {
                ["versions", _, r @ ..] => r,
                r => r,
            };
            match rest {
                [] => Group::Metadata,
                ["ready"] => Group::Health,
                ["infer"] => Group::Inference,
                ["config"] => Group::ModelConfig,
                ["stats"] => Group::Statistics,
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// The header a restricted group's requests must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// The header's name, lower case.
    pub name: String,
    pub value: String,
}

/// The restricted groups and their keys (empty: nothing restricted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restrictions {
    keys: HashMap<Group, Key>,
}

impl Restrictions {
    /// Adds one `GROUP[,GROUP...]:KEY=VALUE` (`--restricted-api`). Errors name what is wrong: an
    /// unknown group (listing the known ones), a group restricted twice, a header name HTTP does
    /// not allow, an empty value.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let (groups, header) = spec
            .split_once(':')
            .ok_or_else(|| format!("'{spec}' is not GROUP[,GROUP...]:KEY=VALUE"))?;
        let (name, value) = header
            .split_once('=')
            .ok_or_else(|| format!("'{header}' in '{spec}' is not KEY=VALUE"))?;
        let name = name.trim().to_ascii_lowercase();
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() || name.is_empty() {
            return Err(format!("'{name}' (in '{spec}') is not a valid header name"));
        }
        if value.is_empty() || axum::http::HeaderValue::from_str(value).is_err() {
            return Err(format!(
                "the value of header '{name}' (in '{spec}') must be non-empty visible ASCII"
            ));
        }
        for g in groups.split(',').map(str::trim) {
            let group = Group::ALL
                .into_iter()
                .find(|k| k.name() == g)
                .ok_or_else(|| {
                    let known: Vec<&str> = Group::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "unknown API group '{g}' in '{spec}' (known: {})",
                        known.join(", ")
                    )
                })?;
            let key = Key {
                name: name.clone(),
                value: value.to_string(),
            };
            if self.keys.insert(group, key).is_some() {
                return Err(format!("API group '{g}' is restricted twice"));
            }
        }
        Ok(())
    }

    /// Whether nothing is restricted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The restricted group `path` belongs to and its key, when `headers` do not carry the key;
    /// `None`: the request may go on.
    pub fn refused<'a>(
        &'a self,
        path: &str,
        headers: &axum::http::HeaderMap,
    ) -> Option<(Group, &'a Key)> {
        if self.keys.is_empty() {
            return None;
        }
        let group = group_of(path)?;
        let key = self.keys.get(&group)?;
        let carried = headers
            .get_all(key.name.as_str())
            .iter()
            .any(|v| same(v.as_bytes(), key.value.as_bytes()));
        (!carried).then_some((group, key))
    }
}

/// `a == b` in time that depends on their lengths only (a key's value is a secret: a compare
/// that stops at the first difference would tell a client how much of it matched).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    /// Every route of the HTTP router and every gRPC method belongs to the group Triton puts it
    /// in.
    #[test]
    fn every_route_and_method_has_its_group() {
        use Group::*;
        let cases = [
            ("/v2/health/live", Health),
            ("/v2/health/ready", Health),
            ("/v2/models/m/ready", Health),
            ("/v2/models/m/versions/3/ready", Health),
            ("/v2", Metadata),
            ("/v2/models/m", Metadata),
            ("/v2/models/m/versions/3", Metadata),
            ("/v2/models/m/config", ModelConfig),
            ("/v2/models/m/versions/3/config", ModelConfig),
            ("/v2/models/m/infer", Inference),
            ("/v2/models/m/versions/3/infer", Inference),
            ("/v1/score", Inference),
            ("/v2/models/stats", Statistics),
            ("/v2/models/m/stats", Statistics),
            ("/v2/models/m/versions/3/stats", Statistics),
            ("/v2/repository/index", ModelRepository),
            ("/v2/repository/models/m/load", ModelRepository),
            ("/v2/repository/models/m/unload", ModelRepository),
            ("/metrics", Metrics),
        ];
        for (path, g) in cases {
            assert_eq!(group_of(path), Some(g), "{path}");
        }
        for (m, g) in [
            ("ServerLive", Health),
            ("ModelReady", Health),
            ("ServerMetadata", Metadata),
            ("ModelMetadata", Metadata),
            ("ModelConfig", ModelConfig),
            ("ModelInfer", Inference),
            ("ModelStreamInfer", Inference),
            ("ModelStatistics", Statistics),
            ("RepositoryIndex", ModelRepository),
            ("RepositoryModelLoad", ModelRepository),
            ("RepositoryModelUnload", ModelRepository),
            ("TraceSetting", Trace),
            ("LogSettings", Logging),
            ("CudaSharedMemoryRegister", SharedMemory),
        ] {
            let path = format!("/inference.GRPCInferenceService/{m}");
            assert_eq!(group_of(&path), Some(g), "{m}");
        }
        // The gRPC methods this server implements are all in a group.
        for m in crate::grpc::IMPLEMENTED {
            assert!(group_of(&format!("/inference.GRPCInferenceService/{m}")).is_some());
        }
        for none in [
            "/",
            "/v3",
            "/v2/models/m/nope",
            "/inference.GRPCInferenceService/X",
        ] {
            assert_eq!(group_of(none), None, "{none}");
        }
    }

    #[test]
    fn a_restricted_group_needs_its_header_and_value() {
        let mut r = Restrictions::default();
        assert!(
            r.refused("/v2/repository/index", &HeaderMap::new())
                .is_none()
        );
        r.add("model-repository,statistics:Admin-Key=s3cret")
            .unwrap();
        r.add("inference:user-key=u").unwrap();
        let with = |k: &str, v: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
            h
        };
        let none = HeaderMap::new();
        let (g, key) = r.refused("/v2/repository/models/m/unload", &none).unwrap();
        assert_eq!(
            (g, key.name.as_str()),
            (Group::ModelRepository, "admin-key")
        );
        assert!(
            r.refused(
                "/v2/repository/models/m/unload",
                &with("admin-key", "s3cret")
            )
            .is_none()
        );
        assert!(
            r.refused("/v2/repository/index", &with("ADMIN-KEY", "s3cret"))
                .is_none()
        );
        for wrong in ["s3cre", "s3cret!", "S3CRET", "x"] {
            assert!(
                r.refused("/v2/models/stats", &with("admin-key", wrong))
                    .is_some()
            );
        }
        assert!(
            r.refused("/v2/models/m/infer", &with("admin-key", "s3cret"))
                .is_some()
        );
        assert!(
            r.refused(
                "/inference.GRPCInferenceService/ModelInfer",
                &with("user-key", "u")
            )
            .is_none()
        );
        // Groups not restricted, and paths of no group, go on.
        assert!(r.refused("/v2/health/ready", &none).is_none());
        assert!(r.refused("/nope", &none).is_none());
    }

    #[test]
    fn bad_specs_are_refused_naming_what_is_wrong() {
        for (spec, says) in [
            ("inference", "is not GROUP"),
            ("inference:key", "is not KEY=VALUE"),
            ("inferance:k=v", "unknown API group 'inferance'"),
            ("inference:bad key=v", "not a valid header name"),
            ("inference:=v", "not a valid header name"),
            ("inference:k=", "must be non-empty"),
            ("inference,inference:k=v", "restricted twice"),
        ] {
            let e = Restrictions::default().add(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
        let mut r = Restrictions::default();
        r.add("health:a=b").unwrap();
        assert!(
            r.add("health:c=d")
                .unwrap_err()
                .contains("restricted twice")
        );
    }

    #[test]
    fn the_compare_is_equality() {
        for (a, b) in [
            ("", ""),
            ("a", "a"),
            ("ab", "ab"),
            ("ab", "ac"),
            ("a", "ab"),
            ("", "a"),
        ] {
            assert_eq!(same(a.as_bytes(), b.as_bytes()), a == b, "{a} {b}");
        }
    }
}
