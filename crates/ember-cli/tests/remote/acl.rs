//! Least-rights Redis users (`ember_redis::acl`'s roles) on a real cluster, the users made at run
//! time on every node with `ACL SETUSER`:
//!
//! - a model pushed, verified, promoted and updated as the `publisher`, and served (rows read
//!   whole, `--from-registry`, row updates followed) and pooled on the nodes (`EMBER.POOL`) as
//!   the `reader`, gives the same scores and sums as with the default user, and no node refused
//!   anything (`ACL LOG` empty);
//! - each role is refused (`NOPERM`) the commands and the keys it is not granted;
//! - `EMBER.POOL` refuses a call naming a key its caller may not read, naming the user and the
//!   key, whole (no partial sums), and logs it in `ACL LOG`.

use crate::pool;
use crate::scores;
use crate::server::{Server, tsv_rows};
use ember_bench::redis_cluster::{self, LocalCluster};
use ember_embed::Pooling;
use ember_pool_command::CallBuilder;
use ember_redis::acl::{self, Grants};
use ember_redis::{Cmd, Conn, Value, cmd};
use ember_tier::storage::remote::PoolRemote;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::time::{Duration, Instant};

const PASSWORD: &str = "ember-acl-test";
/// The longest a server may take to apply a published update.
const UPDATE_WAIT: Duration = Duration::from_secs(30);
/// One command's deadline.
const REPLY_WAIT: Duration = Duration::from_secs(5);

/// Runs `command` (as the default user) on every node: ACL users are per node.
fn on_every_node(c: &LocalCluster, command: &Cmd) {
    for n in &c.nodes {
        match redis_cluster::query(n.port, command) {
            Ok(Value::Okay) => {}
            other => panic!("{command:?} on node {}: {other:?}", n.port),
        }
    }
}

/// User `user` with the rights of `role` on `model`'s keys, on every node.
fn make_user(c: &LocalCluster, user: &str, role: &str, model: &str) {
    let setuser = acl::role(role)
        .unwrap()
        .setuser(user, PASSWORD, model)
        .unwrap();
    on_every_node(c, &setuser);
}

/// User `user` with exactly `rules`, on every node.
fn make_user_with(c: &LocalCluster, user: &str, rules: &str) {
    on_every_node(c, &acl::setuser(user, PASSWORD, rules));
}

/// The cluster's URL as `user`.
fn url_as(c: &LocalCluster, user: &str) -> String {
    c.url()
        .replacen("redis://", &format!("redis://{user}:{PASSWORD}@"), 1)
}

/// A connection to the node on `port`, logged in as `user`.
fn login(port: u16, user: &str) -> Conn {
    let deadline = Instant::now() + REPLY_WAIT;
    let addr = format!("127.0.0.1:{port}");
    Conn::connect(&addr, REPLY_WAIT, Some((Some(user), PASSWORD)), deadline)
        .unwrap_or_else(|e| panic!("logging in as {user} on {addr}: {e:?}"))
}

/// `command`'s reply on `conn` (an error reply as `Value::ServerError`).
fn ask(conn: &mut Conn, command: &Cmd) -> Value {
    let deadline = Instant::now() + REPLY_WAIT;
    conn.send(&[&command.packed()], deadline).unwrap();
    conn.recv(deadline).unwrap()
}

/// The error reply `v` as text (`CODE detail`); panics naming `what` on any other reply.
fn refusal(v: &Value, what: &str) -> String {
    match v {
        Value::ServerError(e) => e.to_string(),
        other => panic!("{what}: expected an error reply, got {other:?}"),
    }
}

/// Asserts that `v` is Redis's (or the module's) ACL refusal.
fn assert_noperm(v: &Value, what: &str) {
    let e = refusal(v, what);
    assert!(e.starts_with("NOPERM "), "{what}: {e}");
}

/// The port of the primary holding `key` (the one that does not redirect a `GET`).
fn owner(c: &LocalCluster, key: &str) -> u16 {
    c.nodes
        .iter()
        .map(|n| n.port)
        .find(|&p| redis_cluster::query(p, cmd("GET").arg(key)).is_ok())
        .unwrap_or_else(|| panic!("no node serves {key}"))
}

/// A field of an `ACL LOG` entry (field, value, field, value, ...), as text.
fn field(entry: &Value, name: &str) -> Option<String> {
    let Value::Array(kv) = entry else { return None };
    kv.chunks(2).find_map(|p| match p {
        [Value::BulkString(k), v] if k.as_slice() == name.as_bytes() => match v {
            Value::Int(i) => Some(i.to_string()),
            v => v.text(),
        },
        _ => None,
    })
}

/// Every refusal every node recorded (`ACL LOG`): `(port, username, reason, context, object)`.
fn acl_log(c: &LocalCluster) -> Vec<(u16, [String; 4])> {
    let mut out = Vec::new();
    for n in &c.nodes {
        let v = redis_cluster::query(n.port, cmd("ACL").arg("LOG")).unwrap();
        let Value::Array(entries) = v else {
            panic!("ACL LOG on {} answered {v:?}", n.port)
        };
        for e in &entries {
            let f = |k: &str| field(e, k).unwrap_or_default();
            out.push((
                n.port,
                [f("username"), f("reason"), f("context"), f("object")],
            ));
        }
    }
    out
}

/// Checks that Redis reads `user`'s rules as `role`'s say for `model`: `ACL GETUSER`'s
/// commands and keys, on every node.
fn assert_rules_as_redis_reads_them(c: &LocalCluster, user: &str, role: &str, model: &str) {
    let want = Grants::parse(&acl::role(role).unwrap().rules_for(model).unwrap()).unwrap();
    let mut want_cmds = want.commands.clone();
    want_cmds.sort();
    for n in &c.nodes {
        let v = redis_cluster::query(n.port, cmd("ACL").arg("GETUSER").arg(user)).unwrap();
        let rules = ["commands", "keys"]
            .iter()
            .map(|k| field(&v, k).unwrap_or_else(|| panic!("ACL GETUSER {user}: no {k}: {v:?}")))
            .collect::<Vec<_>>()
            .join(" ");
        let got = Grants::parse(&rules).unwrap_or_else(|e| panic!("{rules}: {e}"));
        let mut cmds = got.commands.clone();
        cmds.sort();
        assert_eq!(cmds, want_cmds, "{user} on {}: {rules}", n.port);
        assert_eq!(got.keys, want.keys, "{user} on {}: {rules}", n.port);
        assert!(got.none_first && !got.all_keys, "{user}: {rules}");
    }
}

/// The shipped model pushed, verified, promoted and updated with the publisher's rights only,
/// and served with the reader's only (rows read whole from primaries and replicas and the
/// update followed; `--from-registry`, its config, dense weights and tables read whole): every
/// score is the default user's, before and after the update, and no node refused a command or a
/// key.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn publisher_and_reader_push_update_and_serve_as_the_default_user_does() {
    let Some(c) = crate::cluster_with_module(1, &[]) else {
        return;
    };
    make_user(&c, "ember-publisher", "publisher", "default");
    make_user(&c, "ember-reader", "reader", "default");
    assert_rules_as_redis_reads_them(&c, "ember-publisher", "publisher", "default");
    assert_rules_as_redis_reads_them(&c, "ember-reader", "reader", "default");
    let urls = [
        url_as(&c, "ember-publisher"),
        url_as(&c, "ember-reader"),
        c.url(),
    ];
    let [publisher, reader, admin] = [&urls[0], &urls[1], &urls[2]].map(String::as_str);
    let model = crate::default_model();
    let model = model.to_str().unwrap();
    crate::ok(&["registry", "push", "--redis", publisher, "--model", model]);
    c.wait_replicated(Duration::from_secs(20))
        .expect("replicas catching up after the push");
    let v = ["--model", "default", "--version", "1"];
    crate::ok(&[&["registry", "verify", "--redis", publisher][..], &v].concat());
    crate::ok(&[&["registry", "promote", "--redis", publisher][..], &v].concat());
    let listed = crate::ok(&["registry", "ls", "--redis", publisher]);
    assert!(listed.contains("default"), "{listed}");

    let rows_whole = ["--cache-mb", "0", "--read-from-replicas"];
    let from_registry = |url: &str| {
        Server::start(&[
            "--grpc",
            "off",
            "--redis",
            url,
            "--from-registry",
            "default",
            "--poll-secs",
            "0.2",
        ])
    };
    let servers = [
        crate::serve::remote_server(admin, &rows_whole),
        crate::serve::remote_server(reader, &rows_whole),
        from_registry(admin),
        from_registry(reader),
    ];
    let bodies: Vec<Vec<u8>> = (0..6u64).map(|s| tsv_rows(16, 900 + s)).collect();
    let before = scores(&servers[0], &bodies);
    for s in &servers[1..] {
        assert_eq!(scores(s, &bodies), before);
    }

    // Every row of t3 rewritten by the publisher; the reader's servers follow.
    let dir = std::env::temp_dir().join(format!("ember-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t3.safetensors");
    let ids: Vec<i64> = (0..2048).collect();
    let mut rng = StdRng::seed_from_u64(61);
    let rows: Vec<f32> = (0..2048 * 16)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    crate::updates::update_file(&file, &ids, &rows, 16);
    let f = file.to_str().unwrap();
    let update = ["--model", "default", "--table", "t3", "--rows", f];
    crate::ok(&[&["registry", "update", "--redis", publisher][..], &update].concat());
    let fresh = crate::serve::remote_server(admin, &["--cache-mb", "0"]);
    let want = scores(&fresh, &bodies);
    assert!(
        want.iter().zip(&before).all(|(a, b)| a != b),
        "the update changed no score"
    );
    // The servers reading rows from the store follow it (those from the registry hold every
    // table of this model in memory, as pushed: they follow no stream).
    crate::wait_state(
        "update of the servers reading the store",
        UPDATE_WAIT,
        || {
            let now: Vec<Vec<String>> = servers[..2].iter().map(|s| scores(s, &bodies)).collect();
            match now.iter().all(|n| *n == want) {
                true => Ok(()),
                false => Err(format!("{now:?}, want {want:?}")),
            }
        },
    );
    // A second version pushed and removed by the publisher (`rm`: UNLINK, HDEL).
    let v2 = ["--model", "default", "--version", "2"];
    let push2 = [
        "registry",
        "push",
        "--redis",
        publisher,
        "--model",
        model,
        "--version",
        "2",
    ];
    crate::ok(&push2);
    let listed = crate::ok(&["registry", "ls", "--redis", publisher]);
    assert!(
        listed.lines().filter(|l| l.contains("default")).count() >= 2,
        "{listed}"
    );
    crate::ok(&[&["registry", "rm", "--redis", publisher][..], &v2].concat());
    let listed = crate::ok(&["registry", "ls", "--redis", publisher]);
    assert_eq!(
        listed.lines().filter(|l| l.contains("default")).count(),
        1,
        "{listed}"
    );
    for s in &servers {
        let log = s.log.lock().unwrap().clone();
        assert!(!log.contains("NOPERM"), "{log}");
    }
    assert_eq!(acl_log(&c), vec![], "a node refused something");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `EMBER.POOL` calls every node answered so far (`INFO commandstats`).
fn pool_calls(c: &LocalCluster) -> u64 {
    let ports: Vec<u16> = c.nodes.iter().map(|n| n.port).collect();
    redis_cluster::command_stats(&ports, "EMBER.POOL")
        .unwrap()
        .1
}

/// Tables pushed by the publisher through the library, pooled on the nodes by the reader: the
/// same sums, bit for bit, as the default user's, the same rows pooled on the nodes (a refused
/// call would have its rows read whole instead), and nothing refused.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn the_reader_pools_on_the_nodes_bit_for_bit_as_the_default_user() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    make_user(&c, "ember-publisher", "publisher", "pooled");
    make_user(&c, "ember-reader", "reader", "pooled");
    let mut rng = StdRng::seed_from_u64(3);
    pool::push(
        &url_as(&c, "ember-publisher"),
        "pooled",
        &pool::dram_tables(),
    );
    let stager = |url: &str| pool::remote(url, "pooled", 1, PoolRemote::On).unwrap();
    let (reader, admin) = (stager(&url_as(&c, "ember-reader")), stager(&c.url()));
    let p = pool::pooler(Pooling::Sum);
    let calls = pool_calls(&c);
    let (r0, a0) = (reader.1.stats(), admin.1.stats());
    for n in [1, 16, 48] {
        // Bags of 0 to 60 ids over every row (so over every node).
        let kj = pool::batch(&mut rng, n, 60, Pooling::Sum);
        let pooled = |t| pool::staged(&p, t, &kj).unwrap();
        let (got, want) = (pooled(&reader), pooled(&admin));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "batch of {n}");
    }
    let (r, a) = (reader.1.stats().since(&r0), admin.1.stats().since(&a0));
    assert!(r.pooled_rows > 0, "the reader pooled nothing: {r:?}");
    assert_eq!(
        (r.pooled_rows, r.pool_plain_rows),
        (a.pooled_rows, a.pool_plain_rows),
        "reader {r:?}, default user {a:?}"
    );
    assert!(pool_calls(&c) > calls, "no EMBER.POOL call reached a node");
    assert_eq!(acl_log(&c), vec![], "a node refused something");
}

/// Each role is refused what it is not granted, on any node (Redis checks before it redirects):
/// writes and administration for the reader, administration for the publisher, other models'
/// keys and other keys for both; a script cannot call `EMBER.POOL`. The store is intact after.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn each_role_is_refused_the_commands_and_keys_it_is_not_granted() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    crate::push_default(&c);
    make_user(&c, "ember-reader", "reader", "default");
    make_user(&c, "ember-publisher", "publisher", "default");
    let manifest = "ember:default:v1:manifest";
    let pushed = redis_cluster::query(owner(&c, manifest), cmd("GET").arg(manifest)).unwrap();
    for key in ["secret:token", "ember:other:v1:manifest"] {
        let set = cmd("SET").arg(key).arg("s3cret").clone();
        assert_eq!(
            redis_cluster::query(owner(&c, key), &set).unwrap(),
            Value::Okay
        );
    }
    // What each role may do works (the refusals below are the rules', not a failed login).
    let mut r = login(owner(&c, manifest), "ember-reader");
    assert_eq!(ask(&mut r, cmd("GET").arg(manifest)), pushed);
    assert!(matches!(
        ask(&mut r, cmd("GETRANGE").arg(manifest).arg(0).arg(0)),
        Value::BulkString(_)
    ));
    let mut p = login(owner(&c, "ember:default:served"), "ember-publisher");
    assert_eq!(
        ask(&mut p, cmd("SET").arg("ember:default:served").arg(1)),
        Value::Okay
    );
    let refused_to_reader: Vec<Cmd> = vec![
        cmd("SET").arg(manifest).arg("x").clone(),
        cmd("SETRANGE").arg(manifest).arg(0).arg("x").clone(),
        cmd("UNLINK").arg("ember:default:served").clone(),
        cmd("XADD")
            .arg("ember:default:v1:t3:updates")
            .arg("*")
            .arg("f")
            .arg("v")
            .clone(),
        cmd("EVAL").arg("return 1").arg(0).clone(),
        cmd("FLUSHALL").clone(),
        cmd("CONFIG").arg("GET").arg("maxmemory").clone(),
        cmd("KEYS").arg("*").clone(),
        cmd("GET").arg("secret:token").clone(),
        cmd("GETRANGE").arg("secret:token").arg(0).arg(-1).clone(),
        cmd("GET").arg("ember:other:v1:manifest").clone(),
    ];
    let refused_to_publisher: Vec<Cmd> = vec![
        cmd("FLUSHALL").clone(),
        cmd("FLUSHDB").clone(),
        cmd("CONFIG").arg("SET").arg("maxmemory").arg("1").clone(),
        cmd("ACL")
            .arg("SETUSER")
            .arg("ember-reader")
            .arg("+@all")
            .clone(),
        cmd("MODULE").arg("LIST").clone(),
        cmd("KEYS").arg("*").clone(),
        cmd("DEL").arg("ember:default:served").clone(),
        cmd("GET").arg("secret:token").clone(),
        cmd("SET").arg("ember:other:v1:manifest").arg("x").clone(),
        cmd("EVAL")
            .arg("return redis.call('GET', KEYS[1])")
            .arg(1)
            .arg("secret:token")
            .clone(),
    ];
    for n in &c.nodes {
        let mut r = login(n.port, "ember-reader");
        for command in &refused_to_reader {
            assert_noperm(&ask(&mut r, command), &format!("reader: {command:?}"));
        }
        let mut p = login(n.port, "ember-publisher");
        for command in &refused_to_publisher {
            assert_noperm(&ask(&mut p, command), &format!("publisher: {command:?}"));
        }
        // A script runs with its caller's rights: the publisher's scripts cannot flush.
        let flush = cmd("EVAL")
            .arg("return redis.call('FLUSHALL')")
            .arg(0)
            .clone();
        let e = refusal(&ask(&mut p, &flush), "a script flushing");
        assert!(e.contains("can't run this command"), "{e}");
    }
    // No script calls EMBER.POOL, whoever runs it (`deny-script`): the module's key checks cannot
    // be bypassed through one.
    let script = cmd("EVAL")
        .arg(
            "return redis.call('EMBER.POOL', 'ember:default:v1:t0:', 'f32', '16', '1', '', '', '')",
        )
        .arg(0)
        .clone();
    let e = redis_cluster::query(c.nodes[0].port, &script).expect_err("EMBER.POOL in a script");
    assert!(e.to_string().contains("script"), "{e}");
    // Nothing was changed by the refused commands.
    assert_eq!(
        redis_cluster::query(owner(&c, manifest), cmd("GET").arg(manifest)).unwrap(),
        pushed
    );
    assert_eq!(
        redis_cluster::query(owner(&c, "secret:token"), cmd("GET").arg("secret:token")).unwrap(),
        Value::BulkString(b"s3cret".to_vec())
    );
}

/// Row `r` of block `b` of the hand-made table (dim 4, 2 rows a block).
fn row_of(b: u32, r: u32) -> [f32; 4] {
    std::array::from_fn(|d| (b * 8 + r * 4 + d as u32) as f32 / 8.0)
}

/// `EMBER.POOL prefix f32 4 2 ...`: one bag of `rows` (block, row in block).
fn pool_call(prefix: &str, rows: &[(u32, u32)]) -> Cmd {
    let mut call = CallBuilder::default();
    for &(b, r) in rows {
        call.row(b, r, None);
    }
    call.end_bag();
    let mut c = cmd("EMBER.POOL");
    for a in call.args(prefix.as_bytes(), "f32", "4", "2", false) {
        c.arg(a);
    }
    c
}

/// The reply of a one-bag call over `rows`: their sum, f32 little-endian.
fn sum_of(rows: &[(u32, u32)]) -> Value {
    let mut acc = [0f32; 4];
    for &(b, r) in rows {
        acc.iter_mut().zip(row_of(b, r)).for_each(|(a, x)| *a += x);
    }
    Value::BulkString(acc.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// `EMBER.POOL` checks its caller's read permission on every key it names: a key outside the
/// user's patterns (another model's prefix, a block the user may not read, a key it may only
/// write) refuses the whole call with `NOPERM` naming the user and the key, whatever the key's
/// place in the call and whether it exists, and is logged in `ACL LOG`; the connection's next
/// reply is its own (nothing partial was sent). Keys the user may read pool as for the default
/// user; a user without `+ember.pool` is refused by Redis.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn ember_pool_refuses_a_key_its_caller_may_not_read_naming_it() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let port = c.nodes[0].port;
    // Blocks on this node: two of model m's table t, one of another model's.
    let land = |prefix: &str, want: usize| -> Vec<u32> {
        let mut got = Vec::new();
        for b in 0..10_000u32 {
            let bytes: Vec<u8> = (0..2)
                .flat_map(|r| row_of(b, r))
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let set = cmd("SET").arg(format!("{prefix}{b}")).arg(bytes).clone();
            if redis_cluster::query(port, &set).is_ok() {
                got.push(b);
                if got.len() == want {
                    return got;
                }
            }
        }
        panic!("fewer than {want} blocks of {prefix} on node {port}");
    };
    let (m, secret) = ("ember:m:v1:t:", "ember:secret:v1:t:");
    let ab = land(m, 2);
    let (a, b) = (ab[0], ab[1]);
    let s = land(secret, 1)[0];
    make_user(&c, "pooler", "reader", "m");
    make_user_with(&c, "only-a", &format!("-@all +ember.pool %R~{m}{a}"));
    make_user_with(&c, "writer", "-@all +ember.pool %W~ember:m:*");
    make_user_with(&c, "no-pool", "-@all +get %R~ember:m:*");

    let both = [(a, 1), (b, 0), (a, 0)];
    let admin = |command: &Cmd| redis_cluster::query(port, command).unwrap();
    // The default user (every key) and the reader of m: the sums.
    assert_eq!(admin(&pool_call(m, &both)), sum_of(&both));
    let mut pooler = login(port, "pooler");
    assert_eq!(ask(&mut pooler, &pool_call(m, &both)), sum_of(&both));
    // Another model's block, there or not: refused naming it (a refusal tells nothing of
    // whether the key exists); a block of m that is not there is the module's MISSING.
    let named = |user: &str, key: String| {
        Value::ServerError(ember_redis::ServerError::parse(
            format!("NOPERM EMBER.POOL: user '{user}' may not read key '{key}'").as_bytes(),
        ))
    };
    assert_eq!(
        ask(&mut pooler, &pool_call(secret, &[(s, 0)])),
        named("pooler", format!("{secret}{s}"))
    );
    assert_eq!(
        ask(&mut pooler, &pool_call(secret, &[(s + 1_000_000, 0)])),
        named("pooler", format!("{secret}{}", s + 1_000_000))
    );
    let e = refusal(
        &ask(&mut pooler, &pool_call(m, &[(b + 1_000_000, 0)])),
        "a missing block",
    );
    assert!(e.starts_with("MISSING "), "{e}");
    // A user that may read block a only: b refuses the call wherever it is, and the next reply
    // on the connection is the next call's own.
    let mut only_a = login(port, "only-a");
    assert_eq!(
        ask(&mut only_a, &pool_call(m, &[(a, 0)])),
        sum_of(&[(a, 0)])
    );
    for rows in [
        vec![(a, 0), (b, 1)],
        vec![(b, 1), (a, 0)],
        vec![(a, 1), (a, 0), (b, 0)],
    ] {
        assert_eq!(
            ask(&mut only_a, &pool_call(m, &rows)),
            named("only-a", format!("{m}{b}")),
            "{rows:?}"
        );
        assert_eq!(
            ask(&mut only_a, &pool_call(m, &[(a, 1)])),
            sum_of(&[(a, 1)])
        );
    }
    // Write access is not read access.
    let mut writer = login(port, "writer");
    assert_eq!(
        ask(&mut writer, &pool_call(m, &[(a, 0)])),
        named("writer", format!("{m}{a}"))
    );
    // Without +ember.pool, Redis refuses the command itself.
    let mut no_pool = login(port, "no-pool");
    let e = refusal(
        &ask(&mut no_pool, &pool_call(m, &[(a, 0)])),
        "no +ember.pool",
    );
    assert!(
        e.starts_with("NOPERM ") && e.contains("'EMBER.POOL' command"),
        "{e}"
    );
    // Each of the module's refusals is in the node's ACL LOG, as Redis's own are.
    let log = acl_log(&c);
    for (user, key) in [
        ("pooler", format!("{secret}{s}")),
        ("only-a", format!("{m}{b}")),
        ("writer", format!("{m}{a}")),
    ] {
        assert!(
            log.iter().any(|(p, [u, reason, context, object])| {
                *p == port && u == user && reason == "key" && context == "module" && *object == key
            }),
            "no ACL LOG entry for {user} and {key}: {log:?}"
        );
    }
}

/// A user whose read patterns name 15 other models before `ember:m:*`: the key check's worst
/// case among Ember's roles is one pattern; this one matches 16 patterns per key.
const MANY_PATTERNS: &str = "-@all +ember.pool %R~ember:x0:* %R~ember:x1:* %R~ember:x2:* \
%R~ember:x3:* %R~ember:x4:* %R~ember:x5:* %R~ember:x6:* %R~ember:x7:* %R~ember:x8:* \
%R~ember:x9:* %R~ember:x10:* %R~ember:x11:* %R~ember:x12:* %R~ember:x13:* %R~ember:x14:* \
%R~ember:m:*";

/// One bag of a call's shape: (block index among the blocks written, row in block) per row.
type Bag = Vec<(usize, u32)>;

/// `calls` copies of `call` on a connection to `port` as `user` (`None`: the default user),
/// pipelined 100 at a time: the client's microseconds per call, and the node's
/// (`INFO commandstats`' usec / calls of `ember.pool`, reset first).
fn time_calls(port: u16, user: Option<&str>, call: &Cmd, want: &Value, calls: usize) -> (f64, f64) {
    redis_cluster::query(port, cmd("CONFIG").arg("RESETSTAT")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let auth = user.map(|u| (Some(u), PASSWORD));
    let mut conn = Conn::connect(&format!("127.0.0.1:{port}"), REPLY_WAIT, auth, deadline).unwrap();
    let packed = call.packed();
    let t0 = Instant::now();
    let mut left = calls;
    while left > 0 {
        let n = left.min(100);
        let parts: Vec<&[u8]> = (0..n).map(|_| packed.as_slice()).collect();
        conn.send(&parts, deadline).unwrap();
        for _ in 0..n {
            let got = conn.recv(deadline).unwrap();
            assert!(got == *want, "{user:?}: {got:?}");
        }
        left -= n;
    }
    let client = t0.elapsed().as_secs_f64() * 1e6 / calls as f64;
    let (usec, calls) = redis_cluster::command_stats(&[port], "EMBER.POOL").unwrap();
    assert!(calls > 0, "no ember.pool in INFO commandstats");
    (client, usec as f64 / calls as f64)
}

/// The figure: what the key checks cost `EMBER.POOL` on the node, per call, for the default
/// user (every key: Redis answers from a flag), the reader role (one pattern) and a user of 16
/// patterns, on three shapes of call: one row; 256 blocks of one row each (a check per row, the
/// checks' worst case); and 64 bags of 27 rows over 256 blocks (a pooled batch's share of one
/// node, RM1's pooling 80 over three primaries). f32 rows of 64, 16 to a block. Medians of
/// `EMBER_ACL_RUNS` (5) runs of 2,000 calls, the builds and users taken in turn in each run.
/// `EMBER_POOL_MODULE_BEFORE=path/libember_redis_module.so` adds a cluster running that build
/// (the module before the checks) to compare with; `EMBER_POOL_MODULE` names the build with the
/// checks (default: the test's own, unoptimized in a debug build: compare release builds).
#[test]
#[ignore = "a figure (a minute or two): the key checks' cost"]
fn figure_the_key_checks_cost() {
    if let Err(why) = redis_cluster::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let now = match std::env::var("EMBER_POOL_MODULE") {
        Ok(p) => p.into(),
        Err(_) => redis_cluster::pool_module().unwrap(),
    };
    let mut builds = vec![("with checks", now)];
    if let Ok(p) = std::env::var("EMBER_POOL_MODULE_BEFORE") {
        builds.push(("before", p.into()));
    }
    let runs: usize = std::env::var("EMBER_ACL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let (dim, rpb, prefix) = (64usize, 16usize, "ember:m:v1:t:");
    let mut rng = StdRng::seed_from_u64(7);
    let clusters: Vec<(&str, LocalCluster, Vec<u32>)> = builds
        .iter()
        .map(|(name, path)| {
            let c = LocalCluster::start_with_module(3, 0, 1000, Some(path), &[]).unwrap();
            c.wait_healthy(Duration::from_secs(20)).unwrap();
            let port = c.nodes[0].port;
            let block: Vec<u8> = (0..rpb * dim)
                .flat_map(|i| (i as f32 / 1024.0).to_le_bytes())
                .collect();
            let mut blocks = Vec::new();
            for b in 0..100_000u32 {
                let set = cmd("SET").arg(format!("{prefix}{b}")).arg(&block).clone();
                if redis_cluster::query(port, &set).is_ok() {
                    blocks.push(b);
                    if blocks.len() == 256 {
                        break;
                    }
                }
            }
            assert_eq!(blocks.len(), 256);
            make_user(&c, "pooler", "reader", "m");
            make_user_with(&c, "many", MANY_PATTERNS);
            (*name, c, blocks)
        })
        .collect();
    // Shapes as (block index among the 256, row in block) per bag.
    let batch = (0..64)
        .map(|_| {
            (0..27)
                .map(|_| (rng.random_range(0..256), rng.random_range(0..rpb as u32)))
                .collect()
        })
        .collect();
    let shapes: [(&str, Vec<Bag>); 3] = [
        ("1 row", vec![vec![(0, 3)]]),
        (
            "256 blocks x 1 row",
            vec![(0..256).map(|i| (i, 5)).collect()],
        ),
        ("64 bags x 27 rows", batch),
    ];
    let users: [(&str, Option<&str>); 3] = [
        ("default (~*)", None),
        ("reader (1 pattern)", Some("pooler")),
        ("16 patterns", Some("many")),
    ];
    // (build, user, shape) -> per run (client, node) microseconds per call.
    let mut seen: std::collections::BTreeMap<(usize, usize, usize), Vec<(f64, f64)>> =
        Default::default();
    for _ in 0..runs {
        for (si, (_, bags)) in shapes.iter().enumerate() {
            for (bi, (_, c, blocks)) in clusters.iter().enumerate() {
                let mut call = CallBuilder::default();
                for bag in bags {
                    for &(i, r) in bag {
                        call.row(blocks[i], r, None);
                    }
                    call.end_bag();
                }
                let (d, r) = (dim.to_string(), rpb.to_string());
                let mut command = cmd("EMBER.POOL");
                for a in call.args(prefix.as_bytes(), "f32", &d, &r, false) {
                    command.arg(a);
                }
                let port = c.nodes[0].port;
                let want = redis_cluster::query(port, &command).unwrap();
                assert!(matches!(want, Value::BulkString(_)), "{want:?}");
                for (ui, (_, user)) in users.iter().enumerate() {
                    let t = time_calls(port, *user, &command, &want, 2000);
                    seen.entry((bi, ui, si)).or_default().push(t);
                }
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "EMBER.POOL per call, microseconds, median of {runs} runs of 2,000 calls: node (client)"
    );
    for (si, (shape, _)) in shapes.iter().enumerate() {
        for (bi, (build, _, _)) in clusters.iter().enumerate() {
            let cells: Vec<String> = users
                .iter()
                .enumerate()
                .map(|(ui, (user, _))| {
                    let v = &seen[&(bi, ui, si)];
                    let node = median(v.iter().map(|t| t.1).collect());
                    let client = median(v.iter().map(|t| t.0).collect());
                    format!("{user}: {node:.2} ({client:.2})")
                })
                .collect();
            eprintln!("{shape:>20} | {build:>11} | {}", cells.join(" | "));
        }
    }
}
