//! Streaming row updates on a real cluster: published rows reach the store and every server's
//! cache, the last write to a row wins everywhere, batches in flight keep whole rows, a stream
//! trimmed past a reader is reported, and malformed entries are skipped with the reason.

use ember_embed::{
    DType, EmbedError, EmbeddingCollection, EmbeddingTable, Ids, KeyedJagged, PoolOptions, Pooler,
};
use ember_registry::PushOptions;
use ember_tier::CachePolicy;
use ember_tier::storage::remote::updates::{EntryId, FollowedTable, Polled, UpdateReader};
use ember_tier::storage::remote::{self, Cluster, ClusterOptions, RemoteSource};
use ember_tier::{Stager, TierOptions};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const ROWS: usize = 3000;
const DIM: usize = 16;
/// The bound on waiting for a state (updates applied, a reset seen): generous, as a loaded
/// machine stretches every step; a test reaching it has failed, one reaching its state earlier
/// goes on at once.
const STATE_WAIT: Duration = Duration::from_secs(30);

pub fn admin(url: &str) -> Cluster {
    let mut o = ClusterOptions::parse(url).unwrap();
    o.timeout = Duration::from_secs(10);
    Cluster::connect(o).unwrap()
}

pub fn values(seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..ROWS * DIM)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect()
}

/// Rows `ids` of `vals` encoded as `dtype` rows.
pub fn encode(vals: &[f32], ids: &[u64], dtype: DType) -> Vec<u8> {
    let picked: Vec<f32> = ids
        .iter()
        .flat_map(|&i| {
            vals[i as usize * DIM..(i as usize + 1) * DIM]
                .iter()
                .copied()
        })
        .collect();
    let t = EmbeddingTable::from_f32("x", ids.len(), DIM, dtype, &picked).unwrap();
    t.resident().unwrap().to_vec()
}

fn batch(rng: &mut rand::rngs::StdRng) -> KeyedJagged {
    // Ids 0..400 (a hot range the caches hold), 8 bags of 25; rows 100..110 (updated twice
    // below) in every batch.
    let ids: Vec<u32> = (0..200)
        .map(|k| {
            if k < 10 {
                100 + k
            } else {
                rng.random_range(0..400)
            }
        })
        .collect();
    KeyedJagged::from_lengths(vec!["t".into()], 8, &[25; 8], Ids::U32(ids), None).unwrap()
}

/// Table `t` of `vals` pushed as model `model`: the admin connection and the version.
fn pushed(url: &str, model: &str, vals: &[f32]) -> (Cluster, u64) {
    let table = EmbeddingTable::from_f32("t", ROWS, DIM, DType::F32, vals).unwrap();
    let mut cl = admin(url);
    let rep = ember_registry::push(
        &mut cl,
        model,
        &[&table],
        &PushOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    (cl, rep.version)
}

/// One feature on remote table `t`.
fn remote_coll() -> EmbeddingCollection {
    EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::remote("t", ROWS, DIM, DType::F32).unwrap(),
    ])
    .unwrap()
}

/// A server's stager of `coll` on model `model` with a cache of `cache_rows` rows, following
/// the updates.
fn follower(
    coll: &EmbeddingCollection,
    url: &str,
    model: &str,
    cache_rows: usize,
    policy: CachePolicy,
) -> Stager {
    Stager::new(
        coll,
        TierOptions {
            cache_bytes: cache_rows * DIM * 4,
            policy,
            remote: Some(RemoteSource {
                cluster: ClusterOptions::parse(url).unwrap(),
                model: model.into(),
                version: None,
            }),
            ..TierOptions::default()
        },
    )
    .unwrap()
}

/// `kj` pooled from `staged` (rows of `coll`).
fn pool_staged(
    pooler: &Pooler,
    coll: &EmbeddingCollection,
    kj: &KeyedJagged,
    staged: &ember_embed::StagedBatch,
) -> Vec<f32> {
    let mut out = vec![0f32; 8 * DIM];
    pooler
        .run_staged(coll, coll.check_view(kj).unwrap(), staged, &mut out)
        .unwrap();
    out
}

/// `kj` pooled from table `t` of `vals` in DRAM.
fn pool_dram(pooler: &Pooler, vals: &[f32], kj: &KeyedJagged) -> Vec<f32> {
    let mem = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::from_f32("t", ROWS, DIM, DType::F32, vals).unwrap(),
    ])
    .unwrap();
    let mut out = vec![0f32; 8 * DIM];
    pooler
        .run(&mem, mem.check_view(kj).unwrap(), &mut out)
        .unwrap();
    out
}

/// Two servers' stagers (one whose cache covers the table, one much smaller) follow the stream:
/// after updates, including two to the same row, both pool exactly what a DRAM table with the
/// updates applied pools, within a few seconds, while a batch staged before is still in flight
/// and keeps its old rows whole.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn updates_reach_every_server_and_the_last_write_wins() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let mut vals = values(1);
    let (mut cl, version) = pushed(&url, "upd", &vals);
    let coll = remote_coll();
    let servers = [
        follower(&coll, &url, "upd", ROWS, CachePolicy::Lru),
        follower(&coll, &url, "upd", 150, CachePolicy::Lfu),
    ];
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let pool = |kj: &KeyedJagged, staged: &ember_embed::StagedBatch| {
        pool_staged(&pooler, &coll, kj, staged)
    };
    let dram = |vals: &[f32], kj: &KeyedJagged| pool_dram(&pooler, vals, kj);
    // Warm both caches on the hot range, and keep one batch of each in flight.
    for _ in 0..20 {
        let kj = batch(&mut rng);
        for s in &servers {
            let staged = s.stage(&coll, coll.check_view(&kj).unwrap()).unwrap();
            assert_eq!(pool(&kj, &staged), dram(&vals, &kj));
        }
    }
    let before = batch(&mut rng);
    let in_flight: Vec<_> = servers
        .iter()
        .map(|s| s.stage(&coll, coll.check_view(&before).unwrap()).unwrap())
        .collect();
    let old = dram(&vals, &before);

    // Rows 0..300 updated, then rows 100..110 again: the second write wins.
    let first: Vec<u64> = (0..300).collect();
    let new1 = values(2);
    let rows1 = encode(&new1, &first, DType::F32);
    ember_registry::updates::publish(&mut cl, "upd", None, "t", &first, &rows1, 1000).unwrap();
    let second: Vec<u64> = (100..110).collect();
    let new2 = values(3);
    let rows2 = encode(&new2, &second, DType::F32);
    let r =
        ember_registry::updates::publish(&mut cl, "upd", Some(version), "t", &second, &rows2, 1000)
            .unwrap();
    assert_eq!((r.version, r.rows), (version, 10));
    for &i in &first {
        let i = i as usize;
        let src = if (100..110).contains(&i) {
            &new2
        } else {
            &new1
        };
        vals[i * DIM..(i + 1) * DIM].copy_from_slice(&src[i * DIM..(i + 1) * DIM]);
    }

    let deadline = Instant::now() + STATE_WAIT;
    let mut fresh = [false, false];
    while fresh.iter().any(|f| !f) {
        assert!(
            Instant::now() < deadline,
            "updates not visible within {STATE_WAIT:?}: {fresh:?}, {:?}",
            servers.iter().map(|s| s.update_stats()).collect::<Vec<_>>()
        );
        let kj = batch(&mut rng);
        for (k, s) in servers.iter().enumerate() {
            let staged = s.stage(&coll, coll.check_view(&kj).unwrap()).unwrap();
            let got = pool(&kj, &staged);
            fresh[k] = got == dram(&vals, &kj);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Once a server has applied both updates, every batch after reads them.
    for _ in 0..5 {
        let kj = batch(&mut rng);
        for s in &servers {
            let staged = s.stage(&coll, coll.check_view(&kj).unwrap()).unwrap();
            assert_eq!(pool(&kj, &staged), dram(&vals, &kj));
        }
    }
    // The table's log of updates names the rows written and no other (an HSTU model's
    // history cache retires the entries that read them).
    let log = coll.tables()[0].updates();
    assert!(log.any_since(0, [5, 105]) && !log.any_since(0, [300, ROWS as u64 - 1]));
    // The batches staged before the updates still read their old rows, whole.
    for staged in &in_flight {
        assert_eq!(pool(&before, staged), old);
    }
    drop(in_flight);
    for s in &servers {
        let u = s.update_stats().expect("following");
        assert!(u.rows_applied > 0, "{u:?}");
        assert_eq!((u.resets, u.bad_entries), (0, 0), "{u:?}");
        assert_eq!(u.positions.len(), 1);
        assert_eq!(u.positions[0].0, "t");
        assert!(u.positions[0].1 > EntryId::default());
        assert!(!s.take_update_lags().is_empty());
        s.check_invariants(usize::MAX);
    }
    // A fresh server (a restart) reads the updated rows from the store.
    let late = follower(&coll, &url, "upd", ROWS, CachePolicy::Pinned);
    let kj = batch(&mut rng);
    let staged = late.stage(&coll, coll.check_view(&kj).unwrap()).unwrap();
    assert_eq!(pool(&kj, &staged), dram(&vals, &kj));
}

/// A reader polls the entries published after it opened, in order; an entry trimmed away before
/// it read it is a reset; a malformed entry is skipped with the reason; bad publishes are
/// refused naming what is wrong.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_trimmed_stream_resets_the_reader_and_bad_entries_are_named() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let vals = values(4);
    let table = EmbeddingTable::from_f32("t", ROWS, DIM, DType::Int8, &vals).unwrap();
    let mut cl = admin(&url);
    let rep = ember_registry::push(
        &mut cl,
        "trim",
        &[&table],
        &PushOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let rb = DType::Int8.row_bytes(DIM);
    let followed = || {
        vec![FollowedTable {
            name: "t".into(),
            rows: ROWS,
            row_bytes: rb,
        }]
    };
    let mut reader = UpdateReader::open(
        ClusterOptions::parse(&url).unwrap(),
        "trim",
        rep.version,
        followed(),
    )
    .unwrap();
    assert!(reader.poll().unwrap().is_empty(), "no stream yet");
    let ids = [7u64, 2999];
    let rows = encode(&vals, &ids, DType::Int8);
    ember_registry::updates::publish(&mut cl, "trim", None, "t", &ids, &rows, 1000).unwrap();
    match &reader.poll().unwrap()[..] {
        [
            Polled::Rows {
                table: 0,
                ids: got,
                rows: bytes,
                published_ms,
                ..
            },
        ] => {
            assert_eq!(got, &ids);
            assert_eq!(bytes, &rows);
            assert!(*published_ms > 0);
        }
        other => panic!("{other:?}"),
    }
    // Refused publishes name what is wrong.
    let mut err = |ids: &[u64], rows: &[u8], table: &str| {
        ember_registry::updates::publish(&mut cl, "trim", None, table, ids, rows, 1000)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[3000], &rows[..rb], "t").contains("row 3000 is past its 3000 rows"));
    assert!(err(&[1, 2], &rows[..rb], "t").contains("bytes of rows for 2 ids"));
    assert!(err(&[1], &rows[..rb], "nope").contains("table 'nope': not in this version"));
    // A trainer's malformed entry: skipped with the reason.
    let key = ember_registry::layout::updates_key("trim", rep.version, "t");
    let mut ops = remote::Ops::default();
    xadd(&mut ops, &key, None, &[1u8, 2, 3], &rows[..rb]);
    cl.run(&ops, false, Instant::now() + Duration::from_secs(5))
        .unwrap();
    match &reader.poll().unwrap()[..] {
        [Polled::Bad { reason, .. }] => assert!(reason.contains("3 bytes of ids"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Published and trimmed away (exactly, to one entry) before the reader polls: a reset, then
    // the reader goes on from the newest entry.
    for k in 0..5u64 {
        let mut ops = remote::Ops::default();
        xadd(&mut ops, &key, Some(1), &k.to_le_bytes(), &rows[..rb]);
        cl.run(&ops, false, Instant::now() + Duration::from_secs(5))
            .unwrap();
    }
    let polled = reader.poll().unwrap();
    assert!(
        matches!(polled[..], [Polled::Reset { table: 0, .. }]),
        "{polled:?}"
    );
    assert!(reader.poll().unwrap().is_empty(), "nothing after the reset");
    ember_registry::updates::publish(&mut cl, "trim", None, "t", &ids, &rows, 1000).unwrap();
    assert!(matches!(reader.poll().unwrap()[..], [Polled::Rows { .. }]));
}

/// A safetensors update file: `ids` (i64) and `rows` (f32, ids x dim).
pub fn update_file(path: &std::path::Path, ids: &[i64], rows: &[f32], dim: usize) {
    use safetensors::tensor::{Dtype, TensorView};
    let id_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let row_bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = vec![
        (
            "ids",
            TensorView::new(Dtype::I64, vec![ids.len()], &id_bytes).unwrap(),
        ),
        (
            "rows",
            TensorView::new(Dtype::F32, vec![ids.len(), dim], &row_bytes).unwrap(),
        ),
    ];
    std::fs::write(path, safetensors::serialize(tensors, None).unwrap()).unwrap();
}

/// `ember registry update` of a whole table of the shipped model, served by two replicas (one with
/// a cache too small to hold it): both replicas' scores change to exactly those of a server
/// started after the update; bad update files are refused naming what is wrong.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn an_update_changes_the_scores_of_every_replica() {
    use crate::server::tsv_rows;
    let Some(c) = super::cluster(1) else { return };
    super::push_default(&c);
    let a = super::serve::remote_server(&c.url(), &["--cache-policy", "lru"]);
    let b = super::serve::remote_server(&c.url(), &["--cache-mb", "1", "--cache-policy", "lfu"]);
    let bodies: Vec<Vec<u8>> = (0..4u64).map(|s| tsv_rows(16, 300 + s)).collect();
    let score = |s: &crate::server::Server, body: &[u8]| {
        let (code, got) = s.request("POST", "/v1/score", "text/plain", body).unwrap();
        assert_eq!(code, 200, "{got}");
        got
    };
    let before: Vec<String> = bodies.iter().map(|b| score(&a, b)).collect();
    for (body, want) in bodies.iter().zip(&before) {
        assert_eq!(&score(&b, body), want);
    }
    let dir = std::env::temp_dir().join(format!("ember-update-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t3.safetensors");
    let ids: Vec<i64> = (0..2048).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let rows: Vec<f32> = (0..2048 * 16)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    update_file(&file, &ids, &rows, 16);
    let ember = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args([
                "registry",
                "update",
                "--redis",
                &c.url(),
                "--model",
                "default",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let f = file.to_str().unwrap();
    let out = ember(&["--table", "t3", "--rows", f, "--chunk-rows", "500"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("updated 2048 rows of default/v1/t3 in 5 entries"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A server started now reads every updated row from the store: the replicas must reach
    // exactly its scores (not merely scores that changed: the update is five entries, which a
    // replica may apply over several batches).
    let fresh = super::serve::remote_server(&c.url(), &[]);
    let want: Vec<String> = bodies.iter().map(|body| score(&fresh, body)).collect();
    assert!(
        want.iter().zip(&before).all(|(x, y)| x != y),
        "the update changed no score"
    );
    let deadline = Instant::now() + STATE_WAIT;
    loop {
        let now: Vec<Vec<String>> = [&a, &b]
            .iter()
            .map(|s| bodies.iter().map(|body| score(s, body)).collect())
            .collect();
        if now.iter().all(|n| *n == want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas not updated within {STATE_WAIT:?}: {now:?} want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = a.request("GET", "/metrics", "text/plain", b"").unwrap().1;
    assert!(
        metrics.contains("ember_update_rows_total{model=\"default\",outcome=\"applied\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("ember_update_lag_seconds_bucket"));
    assert!(metrics.contains("ember_update_position_ms{model=\"default\",table=\"t3\"}"));
    // Bad update files and arguments are refused with what is wrong.
    let bad = dir.join("bad.safetensors");
    update_file(&bad, &[1, 2], &rows[..2 * 8], 8);
    let err = |args: &[&str]| {
        let out = ember(args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let bad_f = bad.to_str().unwrap();
    assert!(
        err(&["--table", "t3", "--rows", bad_f]).contains("rows of dim 8, table 't3' has dim 16")
    );
    assert!(err(&["--table", "nope", "--rows", f]).contains("has no table 'nope'"));
    update_file(&bad, &[5000], &rows[..16], 16);
    assert!(err(&["--table", "t3", "--rows", bad_f]).contains("row 5000 is past its 2048 rows"));
    std::fs::write(&bad, b"not safetensors").unwrap();
    assert!(err(&["--table", "t3", "--rows", bad_f]).contains("not a safetensors file"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server whose stream was trimmed past its position (a producer that trims hard, or a server
/// that fell behind) drops its cache of the table, counts the reset, and reads the rows afresh
/// from the store: its scores are those of the updated table.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_server_behind_a_trimmed_stream_drops_its_cache_and_reads_the_store() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let mut vals = values(6);
    let (mut cl, version) = pushed(&url, "reset", &vals);
    let coll = remote_coll();
    let stager = follower(&coll, &url, "reset", ROWS, CachePolicy::Lru);
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let pooled = |kj: &KeyedJagged, vals: &[f32]| {
        let staged = stager.stage(&coll, coll.check_view(kj).unwrap()).unwrap();
        (
            pool_staged(&pooler, &coll, kj, &staged),
            pool_dram(&pooler, vals, kj),
        )
    };
    for _ in 0..5 {
        let (got, want) = pooled(&batch(&mut rng), &vals);
        assert_eq!(got, want);
    }
    // Rows 100..110 rewritten in the store, then 50 entries published in one pipeline with the
    // stream trimmed to exactly one entry: the follower cannot have read them all.
    let ids: Vec<u64> = (100..110).collect();
    let new = values(7);
    let rows = encode(&new, &ids, DType::F32);
    overrun(&mut cl, "reset", version, "t", &ids, &rows);
    for &i in &ids {
        let i = i as usize;
        vals[i * DIM..(i + 1) * DIM].copy_from_slice(&new[i * DIM..(i + 1) * DIM]);
    }
    let deadline = Instant::now() + STATE_WAIT;
    while stager.update_stats().unwrap().resets == 0 {
        assert!(Instant::now() < deadline, "no reset within {STATE_WAIT:?}");
        let _ = pooled(&batch(&mut rng), &vals);
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..5 {
        let (got, want) = pooled(&batch(&mut rng), &vals);
        assert_eq!(got, want, "after the reset, rows come from the store");
    }
    assert_eq!(stager.held_slots(), 0);
    stager.check_invariants(usize::MAX);
    // Updates were lost: the log answers "changed" for every row written before the reset.
    assert!(coll.tables()[0].updates().any_since(0, [ROWS as u64 - 1]));
}

/// Writes `rows` (f32 rows of `DIM`) of `ids` of `table` straight into their blocks, then
/// publishes them 50 times in one pipeline with the stream trimmed to exactly one entry: a
/// follower cannot have read them all (its position is trimmed away). Returns the table's rows
/// per block.
pub fn overrun(
    cl: &mut Cluster,
    model: &str,
    version: u64,
    table: &str,
    ids: &[u64],
    rows: &[u8],
) -> usize {
    let prefix = ember_registry::layout::block_prefix(model, version, table);
    let manifest = ember_registry::read_manifest(cl, model, version).unwrap();
    let rpb = manifest.table(table).unwrap().rows_per_block;
    let mut ops = remote::Ops::default();
    for (&id, row) in ids.iter().zip(rows.chunks_exact(DIM * 4)) {
        let key = format!("{prefix}{}", id as usize / rpb);
        let at = id as usize % rpb * DIM * 4;
        ops.push(
            key.as_bytes(),
            ember_redis::cmd("SETRANGE").arg(&key).arg(at).arg(row),
        );
    }
    cl.run(&ops, false, Instant::now() + Duration::from_secs(5))
        .unwrap();
    let key = ember_registry::layout::updates_key(model, version, table);
    let id_bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    let mut ops = remote::Ops::default();
    for _ in 0..50 {
        xadd(&mut ops, &key, Some(1), &id_bytes, rows);
    }
    cl.run(&ops, false, Instant::now() + Duration::from_secs(5))
        .unwrap();
    rpb
}

/// Queues a raw `XADD key [MAXLEN max_len] * ids IDS rows ROWS` (an entry as a publisher of any
/// language writes it, or a malformed one), with an exact trim when `max_len` is given.
pub fn xadd(ops: &mut remote::Ops, key: &str, max_len: Option<usize>, ids: &[u8], rows: &[u8]) {
    let mut cmd = ember_redis::cmd("XADD");
    cmd.arg(key);
    if let Some(n) = max_len {
        cmd.arg("MAXLEN").arg(n);
    }
    cmd.arg("*").arg("ids").arg(ids).arg("rows").arg(rows);
    ops.push(key.as_bytes(), &cmd);
}

/// `cmd` run once through `cl` on the node of `key`, with a 5 s deadline.
fn one(cl: &mut Cluster, key: &str, cmd: &ember_redis::Cmd) -> Result<ember_redis::Value, String> {
    let mut ops = remote::Ops::default();
    ops.push(key.as_bytes(), cmd);
    cl.run(&ops, false, Instant::now() + Duration::from_secs(5))
        .map(|mut v| v.pop().unwrap())
        .map_err(|e| e.to_string())
}

/// A block the store lost (a node restarted without its data: here its key deleted, as that
/// node would answer) is never recreated by an update as zeros around the updated row: the
/// update is refused naming the block, nothing of it is written (not the rows of the blocks
/// that are there either), and a read of the block's other rows still fails as missing. The
/// same holds for a block cut short, and for the write script run by itself.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn an_update_to_a_block_the_store_lost_is_refused_and_writes_nothing() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let vals = values(45);
    let (mut cl, version) = pushed(&url, "lost", &vals);
    let rb = DIM * 4;
    let rpb = ember_registry::layout::rows_per_block(ROWS, rb);
    let prefix = ember_registry::layout::block_prefix("lost", version, "t");
    let (gone, kept) = (3usize, 5usize);
    let gone_key = format!("{prefix}{gone}");
    let kept_key = format!("{prefix}{kept}");
    one(&mut cl, &gone_key, ember_redis::cmd("DEL").arg(&gone_key)).unwrap();
    // The last row of the lost block with a row of a block that is there.
    let ids = [(gone * rpb + rpb - 1) as u64, (kept * rpb) as u64];
    let new = values(46);
    let rows = encode(&new, &ids, DType::F32);
    let e = ember_registry::updates::publish(&mut cl, "lost", None, "t", &ids, &rows, 1000)
        .unwrap_err();
    let EmbedError::UpdateRefused { table, found, .. } = &e else {
        panic!("an update over a lost block is refused, writing nothing: {e}");
    };
    assert!(
        table == "t" && found == &format!("block {gone} is missing"),
        "{e}"
    );
    assert!(
        e.to_string().contains("nothing of this update was written"),
        "{e}"
    );
    let strlen =
        |cl: &mut Cluster, key: &str| match one(cl, key, ember_redis::cmd("STRLEN").arg(key)) {
            Ok(ember_redis::Value::Int(n)) => n as usize,
            other => panic!("STRLEN {key}: {other:?}"),
        };
    assert_eq!(
        strlen(&mut cl, &gone_key),
        0,
        "the lost block was recreated"
    );
    let kept_row = match one(
        &mut cl,
        &kept_key,
        ember_redis::cmd("GETRANGE")
            .arg(&kept_key)
            .arg(0)
            .arg(rb - 1),
    ) {
        Ok(ember_redis::Value::BulkString(b)) => b,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        kept_row,
        encode(&vals, &[ids[1]], DType::F32),
        "a row was written"
    );
    // A server's read of another row of the lost block: missing, never zeros.
    let coll = remote_coll();
    let st = follower(&coll, &url, "lost", 0, CachePolicy::Lru);
    let first = (gone * rpb) as u32;
    let kj =
        KeyedJagged::from_lengths(vec!["t".into()], 1, &[1], Ids::U32(vec![first]), None).unwrap();
    let e = match st.stage(&coll, coll.check_view(&kj).unwrap()) {
        Ok(_) => panic!("row {first} of a lost block was read"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(&format!("row {first}: missing in the store")),
        "{e}"
    );
    // A block cut short: refused the same way, left as it was.
    one(
        &mut cl,
        &kept_key,
        ember_redis::cmd("SET").arg(&kept_key).arg(&kept_row[..]),
    )
    .unwrap();
    let e =
        ember_registry::updates::publish(&mut cl, "lost", None, "t", &ids[1..], &rows[rb..], 1000)
            .unwrap_err()
            .to_string();
    assert!(
        e.contains(&format!("block {kept} holds {rb} bytes, not {}", rpb * rb)),
        "{e}"
    );
    assert_eq!(strlen(&mut cl, &kept_key), rb);
    // The write script by itself (what a producer in another language runs): refuses a missing
    // or short block with EMBERBLOCK, writes into a whole one.
    let script = |key: &str, len: usize| {
        ember_redis::cmd("EVAL")
            .arg(ember_registry::updates::WRITE_ROWS)
            .arg(1)
            .arg(key)
            .arg(len)
            .arg(rb)
            .arg(&rows[rb..])
            .clone()
    };
    let e = one(&mut cl, &gone_key, &script(&gone_key, rpb * rb)).unwrap_err();
    assert!(e.contains("EMBERBLOCK"), "{e}");
    assert_eq!(strlen(&mut cl, &gone_key), 0);
    let e = one(&mut cl, &kept_key, &script(&kept_key, rpb * rb)).unwrap_err();
    assert!(e.contains("EMBERBLOCK"), "{e}");
    let whole = format!("{prefix}{}", kept + 1);
    one(&mut cl, &whole, &script(&whole, rpb * rb)).unwrap();
    match one(
        &mut cl,
        &whole,
        ember_redis::cmd("GETRANGE")
            .arg(&whole)
            .arg(rb)
            .arg(2 * rb - 1),
    ) {
        Ok(ember_redis::Value::BulkString(b)) => assert_eq!(b, &rows[rb..]),
        other => panic!("{other:?}"),
    }
    assert_eq!(strlen(&mut cl, &whole), rpb * rb);
}

/// A stream that goes away (lost with a node that restarted without its data) or goes back
/// (recreated with fewer entries than the reader read: a failover to a replica that had not
/// copied the last ones) resets the reader, which then follows the new stream from its start:
/// the rows this server applied may be newer than the store's, so its cache must go.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_stream_that_vanishes_or_goes_back_resets_the_reader() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let vals = values(47);
    let (mut cl, version) = pushed(&url, "gone", &vals);
    let mut reader = UpdateReader::open(
        ClusterOptions::parse(&url).unwrap(),
        "gone",
        version,
        vec![FollowedTable {
            name: "t".into(),
            rows: ROWS,
            row_bytes: DIM * 4,
        }],
    )
    .unwrap();
    let key = ember_registry::layout::updates_key("gone", version, "t");
    let publish = |cl: &mut Cluster, id: u64| {
        let rows = encode(&vals, &[id], DType::F32);
        ember_registry::updates::publish(cl, "gone", None, "t", &[id], &rows, 1000).unwrap();
    };
    let rows_of = |polled: &[Polled]| -> Vec<u64> {
        polled
            .iter()
            .flat_map(|p| match p {
                Polled::Rows { ids, .. } => ids.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    for id in [1, 2, 3] {
        publish(&mut cl, id);
    }
    assert_eq!(rows_of(&reader.poll().unwrap()), [1, 2, 3]);
    // Gone.
    one(&mut cl, &key, ember_redis::cmd("DEL").arg(&key)).unwrap();
    let polled = reader.poll().unwrap();
    assert!(
        matches!(polled[..], [Polled::Reset { table: 0, .. }]),
        "{polled:?}"
    );
    assert!(
        reader.poll().unwrap().is_empty(),
        "nothing while it is gone"
    );
    // Created again: followed from its first entry.
    publish(&mut cl, 4);
    publish(&mut cl, 5);
    assert_eq!(rows_of(&reader.poll().unwrap()), [4, 5]);
    // Back to fewer entries than were read (deleted and recreated between two polls).
    one(&mut cl, &key, ember_redis::cmd("DEL").arg(&key)).unwrap();
    publish(&mut cl, 6);
    let polled = reader.poll().unwrap();
    assert!(
        matches!(polled[..], [Polled::Reset { table: 0, .. }]),
        "{polled:?}"
    );
    publish(&mut cl, 7);
    assert_eq!(rows_of(&reader.poll().unwrap()), [7]);
}
