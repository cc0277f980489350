//! Redis ACL users with the least rights Ember needs, per role: the `ACL SETUSER` rules of each
//! ([`ROLES`]), to copy or to apply with [`Role::setuser`].
//!
//! | role | who | commands | keys |
//! |---|---|---|---|
//! | `reader` | `ember serve` / `ember predict` with remote tables: rows, pooling on the nodes (`EMBER.POOL`), following row updates and promotions, `--from-registry`, `--remote-fallback` | [`READER`] | read only, `%R~ember:<model>:*` |
//! | `publisher` | `ember registry push`, `update`, `promote`, `verify`, `rm`, `ls` | [`PUBLISHER`] | `~ember:models ~ember:<model>:*` |
//! | `admin` | setting the cluster up: `CLUSTER ADDSLOTS / MEET / REPLICATE`, `MODULE LOAD`, `ACL SETUSER`, `CONFIG`, `FLUSHALL`, `ember bench`'s own clusters | [`ADMIN`] (every command, key and channel: Redis's `default` user out of the box) | all |
//!
//! Each list is what the code sends, found by reading every command it builds (`cmd("...")`,
//! the hand-packed `GETRANGE`, `SET` and `ASKING`, the `EVAL` script's `redis.call`s); the tests
//! scan the sources again and fail on a command no role grants, or a role's command that no code
//! sends. Where each comes from:
//!
//! - both clients: `CLUSTER SLOTS` (the slot map, `cluster.rs`), `READONLY` (reads from replicas
//!   and a failed primary's replica), `ASKING` (a slot being moved, `cluster/exchange.rs`).
//!   `AUTH` needs no rule (Redis lets every connection run it); Ember sends no `HELLO`, `PING`
//!   or `SELECT`;
//! - reader: `GETRANGE` (rows, the readiness probe), `EMBER.POOL` and `COMMAND INFO` (which
//!   primaries have the module), `GET` (manifest, served version, `config`, `dense`, whole blocks
//!   of the tables `--from-registry` keeps in memory), `HSCAN` (the versions hash), `SMEMBERS`
//!   (blocks rewritten by updates), `EXISTS`, `XINFO STREAM`, `XREAD` (the update streams);
//! - publisher: `SET`, `HSET`, `HDEL`, `SADD`, `SREM`, `UNLINK`, `WAIT` (push, promote, rm), `GET`,
//!   `HSCAN`, `SSCAN`, `SMEMBERS` (read-back, verify, ls), `STRLEN`, `EVAL` with the `STRLEN` and
//!   `SETRANGE` its script calls (Redis checks a script's calls against the user), `XADD`
//!   (row updates).
//!
//! Keys: a model's keys all start `ember:<model>:` (`ember-registry`'s `layout.rs`); model names
//! are 1 to 128 of `A-Z a-z 0-9 _ - .`, so the pattern matches that model's keys and no other
//! model's. The publisher also writes `ember:models`, the set of models. `ember registry ls`
//! reads every model's versions: a publisher of one model cannot list the others (give it
//! [`ALL_MODELS`]). The reader's patterns are read-only (`%R~`): a server never writes the
//! model's keys. `EMBER.POOL` checks the reader's key patterns itself (the module, `acl.rs`),
//! since it names its keys in its arguments rather than as keys Redis knows.
//!
//! Add-on: a server of an HSTU model given `--history-share` writes users' states to
//! `ember:hist:*` ([`HISTORY_SHARE`], appended to the reader's rules).
//!
//! Users are per node: run `ACL SETUSER` on every node (replicas too), or keep them in each
//! node's ACL file. Load the module before a rule names `ember.pool` (Redis refuses a rule for an
//! unknown command); on a cluster without the module, drop `+ember.pool` (and serve with
//! `--pool-remote off`). The password goes in the URL: `redis://ember-reader:PASSWORD@host:port`.

use crate::value::{Cmd, cmd};

/// Where a role's rules name the model: replaced by [`Role::rules_for`].
pub const MODEL: &str = "{model}";

/// The model name [`Role::rules_for`] takes for every model: `ember:*:*`.
pub const ALL_MODELS: &str = "*";

/// The reader's rules (`ember serve` and `ember predict` on remote tables).
pub const READER: &str = "resetchannels -@all +cluster|slots +readonly +asking +command|info \
+ember.pool +getrange +get +hscan +smembers +exists +xinfo|stream +xread %R~ember:{model}:*";

/// The publisher's rules (`ember registry`: push, update, promote, verify, rm, ls).
pub const PUBLISHER: &str = "resetchannels -@all +cluster|slots +readonly +asking +get +set \
+hset +hdel +hscan +sadd +srem +sscan +smembers +unlink +wait +strlen +eval +setrange +xadd \
~ember:models ~ember:{model}:*";

/// The administrator's rules: everything, as Redis's `default` user has out of the box (set it
/// a password, `requirepass` or `ACL SETUSER default >PASSWORD`, and give it to no server).
pub const ADMIN: &str = "+@all ~* &*";

/// What a server of an HSTU model with `--history-share` adds to the reader's rules: users'
/// states read, written and kept alive (`ember-model`'s `hstu/share.rs`).
pub const HISTORY_SHARE: &str = "+get +set +expire ~ember:hist:*";

/// One role: its name, who uses it, and its `ACL SETUSER` rules (after the password).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    pub name: &'static str,
    pub who: &'static str,
    /// Rules, `{model}` standing for the model's name ([`Role::rules_for`]).
    pub rules: &'static str,
}

/// The three roles, least rights first.
pub const ROLES: [Role; 3] = [
    Role {
        name: "reader",
        who: "ember serve / ember predict with remote tables",
        rules: READER,
    },
    Role {
        name: "publisher",
        who: "ember registry push / update / promote / verify / rm / ls",
        rules: PUBLISHER,
    },
    Role {
        name: "admin",
        who: "the cluster's setup: slots, module, ACL users, config, flushes",
        rules: ADMIN,
    },
];

/// The role named `name`.
pub fn role(name: &str) -> Option<&'static Role> {
    ROLES.iter().find(|r| r.name == name)
}

/// Whether `model` can stand in a key pattern: a model's name (1 to 128 of
/// `A-Z a-z 0-9 _ - .`, none of them special in a pattern), or [`ALL_MODELS`].
fn model_ok(model: &str) -> bool {
    model == ALL_MODELS
        || (!model.is_empty()
            && model.len() <= 128
            && model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
}

impl Role {
    /// The rules for `model` (a name, or [`ALL_MODELS`]); `None` for a name that cannot name a
    /// model.
    pub fn rules_for(&self, model: &str) -> Option<String> {
        model_ok(model).then(|| self.rules.replace(MODEL, model))
    }

    /// `ACL SETUSER <user> reset on ><password> <rules for model>`: the user made anew with this
    /// role's rights and nothing else. `None` for a model name that cannot name a model.
    pub fn setuser(&self, user: &str, password: &str, model: &str) -> Option<Cmd> {
        Some(setuser(user, password, &self.rules_for(model)?))
    }
}

/// `ACL SETUSER <user> reset on ><password> <rules>`: the user made anew with exactly `rules`.
pub fn setuser(user: &str, password: &str, rules: &str) -> Cmd {
    let mut c = cmd("ACL");
    c.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(format!(">{password}"));
    for r in rules.split_whitespace() {
        c.arg(r);
    }
    c
}

/// A key pattern of a rule: `~P` (read and write), `%R~P`, `%W~P`, `%RW~P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    pub read: bool,
    pub write: bool,
    pub pattern: String,
}

/// What a rule string grants, read as Redis reads it (for rule strings of the forms used here):
/// commands allowed (`+name`, `+name|sub`, lowercase), categories allowed (`+@cat`), key
/// patterns, and whether it starts from no command (`-@all`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    pub commands: Vec<String>,
    pub categories: Vec<String>,
    pub keys: Vec<KeyPattern>,
    pub all_keys: bool,
    pub all_channels: bool,
    pub none_first: bool,
}

impl Grants {
    /// Reads `rules`; an error names a rule this reader does not know.
    pub fn parse(rules: &str) -> Result<Grants, String> {
        let mut g = Grants::default();
        for r in rules.split_whitespace() {
            if let Some(cat) = r.strip_prefix("+@") {
                g.categories.push(cat.to_ascii_lowercase());
            } else if let Some(name) = r.strip_prefix('+') {
                g.commands.push(name.to_ascii_lowercase());
            } else if r == "-@all" {
                g.none_first = true;
                g.commands.clear();
                g.categories.clear();
            } else if r == "~*" || r == "allkeys" {
                g.all_keys = true;
            } else if r == "&*" || r == "allchannels" {
                g.all_channels = true;
            } else if r == "resetchannels" {
                g.all_channels = false;
            } else if let Some((perm, pattern)) = r.split_once('~') {
                let (read, write) = match perm {
                    "" | "%RW" | "%WR" => (true, true),
                    "%R" => (true, false),
                    "%W" => (false, true),
                    _ => return Err(format!("rule '{r}': unknown key permission")),
                };
                g.keys.push(KeyPattern {
                    read,
                    write,
                    pattern: pattern.to_string(),
                });
            } else {
                return Err(format!("rule '{r}' is not one this reader knows"));
            }
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(v: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    fn commands(rules: &str) -> Vec<String> {
        let mut c = Grants::parse(rules).unwrap().commands;
        c.sort();
        c
    }

    #[test]
    fn each_roles_rules_parse_into_its_commands_and_keys() {
        let reader = Grants::parse(&role("reader").unwrap().rules_for("dlrm").unwrap()).unwrap();
        assert!(reader.none_first && !reader.all_keys && !reader.all_channels);
        assert!(reader.categories.is_empty());
        assert_eq!(
            commands(READER),
            sorted(&[
                "cluster|slots",
                "readonly",
                "asking",
                "command|info",
                "ember.pool",
                "getrange",
                "get",
                "hscan",
                "smembers",
                "exists",
                "xinfo|stream",
                "xread",
            ])
        );
        assert_eq!(
            reader.keys,
            vec![KeyPattern {
                read: true,
                write: false,
                pattern: "ember:dlrm:*".into()
            }]
        );
        let publisher =
            Grants::parse(&role("publisher").unwrap().rules_for("dlrm").unwrap()).unwrap();
        assert!(publisher.none_first && !publisher.all_keys && !publisher.all_channels);
        assert_eq!(
            commands(PUBLISHER),
            sorted(&[
                "cluster|slots",
                "readonly",
                "asking",
                "get",
                "set",
                "hset",
                "hdel",
                "hscan",
                "sadd",
                "srem",
                "sscan",
                "smembers",
                "unlink",
                "wait",
                "strlen",
                "eval",
                "setrange",
                "xadd",
            ])
        );
        let rw = |p: &str| KeyPattern {
            read: true,
            write: true,
            pattern: p.into(),
        };
        assert_eq!(publisher.keys, vec![rw("ember:models"), rw("ember:dlrm:*")]);
        // No writing command for the reader, nothing administrative for either.
        for c in [
            "set", "setrange", "hset", "unlink", "eval", "xadd", "flushall", "config",
        ] {
            assert!(!reader.commands.iter().any(|r| r == c), "{c}");
        }
        for c in [
            "flushall", "flushdb", "config", "module", "acl", "keys", "del", "debug",
        ] {
            assert!(!publisher.commands.iter().any(|r| r == c), "{c}");
        }
        let admin = Grants::parse(ADMIN).unwrap();
        assert!(admin.all_keys && admin.all_channels && admin.categories == ["all"]);
        let share = Grants::parse(HISTORY_SHARE).unwrap();
        assert_eq!(share.commands, ["get", "set", "expire"]);
        assert_eq!(share.keys, vec![rw("ember:hist:*")]);
    }

    #[test]
    fn rules_name_only_a_model_and_setuser_starts_from_nothing() {
        let r = role("reader").unwrap();
        assert!(r.rules_for("dlrm_v2-small.1").is_some());
        assert_eq!(
            Grants::parse(&r.rules_for(ALL_MODELS).unwrap())
                .unwrap()
                .keys[0]
                .pattern,
            "ember:*:*"
        );
        // A name with a pattern's special characters (or a key separator) would widen the
        // pattern: refused.
        for bad in [
            "",
            "a*",
            "a?",
            "a[b]",
            "a:b",
            "a b",
            "a\\b",
            &"x".repeat(129),
        ] {
            assert!(r.rules_for(bad).is_none(), "{bad}");
            assert!(r.setuser("u", "p", bad).is_none(), "{bad}");
        }
        let c = r.setuser("ember-reader", "pw", "m").unwrap();
        let words: Vec<&str> = c.args().map(|a| std::str::from_utf8(a).unwrap()).collect();
        assert_eq!(
            &words[..6],
            ["ACL", "SETUSER", "ember-reader", "reset", "on", ">pw"]
        );
        assert_eq!(words[6..].join(" "), r.rules_for("m").unwrap());
        assert!(role("root").is_none());
        assert!(Grants::parse("+get nonsense").is_err());
        assert!(Grants::parse("%X~k").is_err());
    }

    /// Every command the workspace's code sends, as `(command, file)`: `cmd("NAME")` (with its
    /// subcommand where NAME has them), the hand-packed heads (`b"*4\r\n$8\r\nGETRANGE..."`),
    /// arrays of arguments (`[b"COMMAND", b"INFO", ...]`) and Lua's `redis.call('NAME'`. Test
    /// code (`#[cfg(test)] mod`), tests and benchmarks (`ember-bench`, `ember-cli`'s `bench/`:
    /// admin's) are left out.
    fn sent_commands() -> Vec<(String, String)> {
        const CONTAINERS: [&str; 6] = ["CLUSTER", "XINFO", "COMMAND", "CONFIG", "ACL", "CLIENT"];
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        let mut dirs = vec![crates.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let rel = p
                    .strip_prefix(&crates)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                // This file names commands in its documentation and its tests.
                let skip = rel == "ember-redis/src/acl.rs"
                    || rel.starts_with("ember-bench")
                    || rel.starts_with("ember-cli/src/bench")
                    || rel.ends_with("/tests")
                    || rel.ends_with("/benches")
                    || rel.ends_with("_tests.rs");
                if skip {
                    continue;
                }
                if p.is_dir() {
                    dirs.push(p);
                } else if rel.ends_with(".rs") && rel.contains("/src/") {
                    files.push((rel, p));
                }
            }
        }
        let word = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                .collect::<String>()
                .to_ascii_uppercase()
        };
        let mut out = Vec::new();
        for (rel, p) in files {
            let text = std::fs::read_to_string(&p).unwrap();
            let code = match text.find("#[cfg(test)]\nmod ") {
                Some(i) => &text[..i],
                None => &text[..],
            };
            let mut add = |name: String, sub: Option<String>| {
                let full = match sub {
                    Some(s) if CONTAINERS.contains(&name.as_str()) && !s.is_empty() => {
                        format!("{name}|{s}")
                    }
                    _ => name,
                };
                if !full.is_empty() {
                    out.push((full, rel.clone()));
                }
            };
            for (i, _) in code.match_indices("cmd(\"") {
                let rest = &code[i + 5..];
                let name = word(rest);
                let after = rest[name.len()..].trim_start_matches(['"', ')']);
                let sub = after.trim_start().strip_prefix(".arg(\"").map(&word);
                add(name, sub);
            }
            for (i, _) in code.match_indices("redis.call('") {
                add(word(&code[i + 12..]), None);
            }
            for (i, _) in code.match_indices("b\"*") {
                // `b"*N\r\n$L\r\nNAME\r\n`: the first bulk string is the command.
                let rest = &code[i + 3..];
                let Some(head) = rest.split('"').next() else {
                    continue;
                };
                let parts: Vec<&str> = head.split("\\r\\n").collect();
                if parts.len() >= 3 && parts[1].starts_with('$') {
                    add(word(parts[2]), None);
                }
            }
            for (i, _) in code.match_indices("[b\"") {
                // `[b"NAME", b"SUB", ...]`: a command's arguments.
                let rest = &code[i + 3..];
                let name = word(rest);
                let upper = rest[..name.len()]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '.');
                if name.len() < 3 || !upper || !rest[name.len()..].starts_with('"') {
                    continue;
                }
                let sub = rest[name.len()..].strip_prefix("\", b\"").map(&word);
                add(name, sub);
            }
        }
        out
    }

    /// The roles are the code's commands: each command sent is granted by a role (the serving
    /// tier's by the reader), and each role's command is sent by some code (`EMBER.POOL` by
    /// name, through `ember-pool-command`'s constant).
    #[test]
    fn the_roles_grant_exactly_the_commands_the_code_sends() {
        let sent = sent_commands();
        let names = |s: &str| -> Vec<String> {
            Grants::parse(s)
                .unwrap()
                .commands
                .iter()
                .map(|c| c.to_ascii_uppercase())
                .collect()
        };
        let (reader, publisher, share) = (names(READER), names(PUBLISHER), names(HISTORY_SHARE));
        // Found at all: the scan works.
        for c in [
            "GETRANGE",
            "CLUSTER|SLOTS",
            "XREAD",
            "EVAL",
            "SETRANGE",
            "COMMAND|INFO",
        ] {
            assert!(sent.iter().any(|(s, _)| s == c), "{c} not found: {sent:?}");
        }
        for (c, file) in &sent {
            // Redis lets every connection authenticate.
            if c == "AUTH" {
                continue;
            }
            let granted = reader.contains(c) || publisher.contains(c) || share.contains(c);
            assert!(granted, "{file} sends {c}, which no role grants");
            let serving = file.starts_with("ember-tier/src/")
                || file.starts_with("ember-redis/src/cluster")
                || file == "ember-registry/src/read.rs";
            assert!(
                !serving || reader.contains(c),
                "{file} (serving) sends {c}, which the reader is not granted"
            );
        }
        for c in reader.iter().chain(&publisher).chain(&share) {
            assert!(
                c == "EMBER.POOL" || sent.iter().any(|(s, _)| s == c),
                "a role grants {c}, which no code sends"
            );
        }
    }
}
