//! The store's operations through the library: push, read back, verify, list, remove.

use ember_embed::{DType, EmbeddingTable};
use ember_registry::PushOptions;
use ember_registry::VersionState;
use ember_tier::storage::remote::{
    self, Cluster, ClusterOptions, RedisStore, RemoteSource, RemoteTableSpec,
};
use ember_tier::{storage::RowRequest, storage::RowStore};
use rand::{Rng, SeedableRng};
use std::time::Duration;

fn table(name: &str, rows: usize, dim: usize, dtype: DType, seed: u64) -> EmbeddingTable {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let values: Vec<f32> = (0..rows * dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    EmbeddingTable::from_f32(name, rows, dim, dtype, &values).unwrap()
}

fn admin(url: &str) -> Cluster {
    let mut o = ClusterOptions::parse(url).unwrap();
    o.timeout = Duration::from_secs(10);
    Cluster::connect(o).unwrap()
}

fn spec(t: &EmbeddingTable) -> RemoteTableSpec {
    RemoteTableSpec {
        name: t.name().into(),
        rows: t.rows(),
        dim: t.dim(),
        dtype: t.dtype(),
    }
}

/// Reads `rows` of every table through a store and checks them against the tables' bytes.
fn read_back(store: &mut RedisStore, tables: &[EmbeddingTable], rows: &[usize]) {
    let mut reqs: Vec<RowRequest> = Vec::new();
    for (t, tab) in tables.iter().enumerate() {
        for &r in rows.iter().filter(|&&r| r < tab.rows()) {
            reqs.push(RowRequest {
                table: t,
                row: r,
                tag: reqs.len(),
            });
        }
    }
    let mut seen = vec![false; reqs.len()];
    let want = reqs.clone();
    store
        .read(&mut reqs, &mut |req, bytes| {
            let tab = &tables[req.table];
            let s = tab.stride();
            assert_eq!(
                bytes,
                &tab.resident().unwrap()[req.row * s..(req.row + 1) * s],
                "table {} row {}",
                tab.name(),
                req.row
            );
            assert!(!seen[req.tag], "row landed twice");
            seen[req.tag] = true;
        })
        .unwrap();
    assert!(
        seen.iter().all(|&s| s),
        "{} of {} rows landed",
        seen.iter().filter(|&&s| s).count(),
        want.len()
    );
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn push_then_rows_read_back_bit_for_bit_for_every_dtype() {
    let Some(c) = super::cluster(1) else { return };
    let tables: Vec<EmbeddingTable> = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Int8,
        DType::Int4,
    ]
    .iter()
    .enumerate()
    // Odd dims and row counts; one table small enough to be a single block.
    .map(|(i, &d)| {
        table(
            &format!("t{i}"),
            [5000, 777, 3, 4097, 1000][i],
            [13, 64, 7, 33, 9][i],
            d,
            i as u64,
        )
    })
    .collect();
    let refs: Vec<&EmbeddingTable> = tables.iter().collect();
    let mut cl = admin(&c.url());
    let mut calls = 0;
    let rep = ember_registry::push(
        &mut cl,
        "m1",
        &refs,
        &PushOptions {
            window_bytes: 64 << 10,
            ..PushOptions::default()
        },
        &mut |_, _| calls += 1,
    )
    .unwrap();
    assert_eq!(rep.version, 1);
    assert!(!rep.resumed);
    assert_eq!(rep.bytes, tables.iter().map(|t| t.bytes()).sum::<usize>());
    assert_eq!(rep.bytes_written, rep.bytes);
    assert_eq!(rep.unreplicated_rounds, 0, "every round reached a replica");
    assert!(calls > 1, "progress was reported");
    let v = ember_registry::verify(&mut cl, "m1", 1, Duration::from_secs(10)).unwrap();
    assert!(v.bad.is_empty(), "{:?}", v.bad);
    assert_eq!(v.bytes, rep.bytes);

    let src = RemoteSource {
        cluster: ClusterOptions::parse(&c.url()).unwrap(),
        model: "m1".into(),
        version: None,
    };
    let specs: Vec<RemoteTableSpec> = tables.iter().map(spec).collect();
    let mut store = RedisStore::open(&src, &specs).unwrap();
    assert_eq!(store.version(), 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut rows: Vec<usize> = (0..600).map(|_| rng.random_range(0..5000)).collect();
    rows.extend([0, 1, 2, 776, 4096, 4999, 999]);
    rows.sort_unstable();
    rows.dedup();
    read_back(&mut store, &tables, &rows);
    // An empty read is free.
    let st = store
        .read(&mut [], &mut |_, _| panic!("nothing to land"))
        .unwrap();
    assert_eq!(st.bytes, 0);
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn versions_list_resume_and_remove() {
    let Some(c) = super::cluster(1) else { return };
    let t = table("emb", 3000, 16, DType::F32, 1);
    let mut cl = admin(&c.url());
    let o = PushOptions {
        window_bytes: 32 << 10,
        ..PushOptions::default()
    };
    // An interrupted push: its progress callback panics after a few rounds.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut n = 0;
        ember_registry::push(&mut admin(&c.url()), "m", &[&t], &o, &mut |_, _| {
            n += 1;
            if n == 3 {
                panic!("interrupted");
            }
        })
    }));
    assert!(r.is_err());
    let vs = ember_registry::versions(&mut cl, "m").unwrap();
    assert_eq!(vs, [(1, VersionState::Pushing)]);
    // A half-pushed version is never served.
    let src = RemoteSource {
        cluster: ClusterOptions::parse(&c.url()).unwrap(),
        model: "m".into(),
        version: None,
    };
    let e = RedisStore::open(&src, &[spec(&t)]).unwrap_err().to_string();
    assert!(e.contains("no ready version"), "{e}");
    let e = RedisStore::open(
        &RemoteSource {
            version: Some(1),
            ..src.clone()
        },
        &[spec(&t)],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("pushing"), "{e}");
    // A block that landed is damaged: the resumed push reads every block back at the end, names
    // it, stays `pushing`, and forgets the block, so that pushing again rewrites it.
    let key = format!("{}0", ember_registry::layout::block_prefix("m", 1, "emb"));
    let mut ops = remote::Ops::default();
    ops.push(
        key.as_bytes(),
        ember_redis::cmd("SETRANGE").arg(&key).arg(5).arg("damage"),
    );
    cl.run(
        &ops,
        false,
        std::time::Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    let e = ember_registry::push(&mut cl, "m", &[&t], &o, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("1 of") && e.contains("table emb block 0: CRC-32 differs"),
        "{e}"
    );
    assert!(e.contains("push again"), "{e}");
    assert_eq!(
        ember_registry::versions(&mut cl, "m").unwrap(),
        [(1, VersionState::Pushing)]
    );
    // Pushing again resumes it, skipping what landed.
    let rep = ember_registry::push(&mut cl, "m", &[&t], &o, &mut |_, _| {}).unwrap();
    assert_eq!(rep.version, 1);
    assert!(rep.resumed);
    assert!(
        rep.blocks_skipped > 0 && rep.bytes_written < rep.bytes,
        "{rep:?}"
    );
    assert!(
        ember_registry::verify(&mut cl, "m", 1, Duration::from_secs(10))
            .unwrap()
            .bad
            .is_empty()
    );
    // A second version of other rows; the newest ready one is served.
    let t2 = table("emb", 3000, 16, DType::F32, 2);
    assert_eq!(
        ember_registry::push(&mut cl, "m", &[&t2], &o, &mut |_, _| {})
            .unwrap()
            .version,
        2
    );
    let mut store = RedisStore::open(&src, &[spec(&t2)]).unwrap();
    assert_eq!(store.version(), 2);
    read_back(&mut store, std::slice::from_ref(&t2), &[0, 1, 2999]);
    let mut store1 = RedisStore::open(
        &RemoteSource {
            version: Some(1),
            ..src.clone()
        },
        &[spec(&t)],
    )
    .unwrap();
    read_back(&mut store1, std::slice::from_ref(&t), &[0, 1, 2999]);
    // Pushing a ready version again is refused.
    let e = ember_registry::push(
        &mut cl,
        "m",
        &[&t],
        &PushOptions {
            version: Some(2),
            ..o.clone()
        },
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("already ready"), "{e}");
    // A config that disagrees with the store is refused, naming the table.
    let wrong = RemoteTableSpec {
        dim: 17,
        ..spec(&t)
    };
    let e = RedisStore::open(&src, &[wrong]).unwrap_err().to_string();
    assert!(e.contains("'emb'") && e.contains("3000 x 16 f32"), "{e}");

    let listed = ember_registry::list(&mut cl).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, "m");
    assert_eq!(
        listed[0]
            .1
            .iter()
            .map(|v| (v.version, v.state, v.bytes))
            .collect::<Vec<_>>(),
        [
            (1, VersionState::Ready, t.bytes()),
            (2, VersionState::Ready, t.bytes())
        ]
    );

    let blocks = ember_registry::read_manifest(&mut cl, "m", 1)
        .unwrap()
        .tables[0]
        .blocks();
    assert_eq!(
        ember_registry::remove(&mut cl, "m", 1, Duration::from_secs(10)).unwrap(),
        blocks
    );
    assert_eq!(
        ember_registry::versions(&mut cl, "m").unwrap(),
        [(2, VersionState::Ready)]
    );
    // Removing again names the missing version; the other version still reads.
    assert!(ember_registry::remove(&mut cl, "m", 1, Duration::from_secs(10)).is_err());
    read_back(&mut store, std::slice::from_ref(&t2), &[5, 6]);
    ember_registry::remove(&mut cl, "m", 2, Duration::from_secs(10)).unwrap();
    assert!(ember_registry::list(&mut cl).unwrap().is_empty());
    // Nothing of the model is left in any node.
    for n in &c.nodes {
        let v = ember_bench::redis_cluster::query(n.port, &redis_scan()).unwrap();
        assert!(
            format!("{v:?}").contains("[]"),
            "node {} still has keys: {v:?}",
            n.port
        );
    }
}

/// `SCAN 0 MATCH ember:* COUNT 100000` (tests only: a node of a tiny test cluster).
fn redis_scan() -> ember_redis::Cmd {
    let mut c = ember_redis::cmd("SCAN");
    c.arg(0)
        .arg("MATCH")
        .arg("ember:*")
        .arg("COUNT")
        .arg(100_000);
    c
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_missing_or_short_row_is_an_error_naming_it_never_zeros() {
    let Some(c) = super::cluster(0) else { return };
    let t = table("emb", 2000, 8, DType::F32, 3);
    let mut cl = admin(&c.url());
    ember_registry::push(
        &mut cl,
        "m",
        &[&t],
        &PushOptions {
            replicas: 0,
            ..PushOptions::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    let man = ember_registry::read_manifest(&mut cl, "m", 1).unwrap();
    let rpb = man.tables[0].rows_per_block;
    // Damage block 1: cut it short; drop block 2.
    let key1 = format!("{}1", ember_registry::layout::block_prefix("m", 1, "emb"));
    let key2 = format!("{}2", ember_registry::layout::block_prefix("m", 1, "emb"));
    let port_of = |key: &str| {
        let slot = remote::slot::key_slot(key.as_bytes());
        c.nodes.iter().map(|n| n.port).find(|&p| {
            matches!(ember_bench::redis_cluster::query(p, ember_redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot)), Ok(ember_redis::Value::Int(n)) if n > 0)
        }).unwrap()
    };
    let p1 = port_of(&key1);
    ember_bench::redis_cluster::query(
        p1,
        ember_redis::cmd("SET")
            .arg(&key1)
            .arg(vec![0u8; 8 * 4 * 3 + 10]),
    )
    .unwrap();
    let p2 = port_of(&key2);
    ember_bench::redis_cluster::query(p2, ember_redis::cmd("UNLINK").arg(&key2)).unwrap();
    let bad = ember_registry::verify(&mut cl, "m", 1, Duration::from_secs(10))
        .unwrap()
        .bad;
    assert_eq!(bad.len(), 2, "{bad:?}");

    let src = RemoteSource {
        cluster: ClusterOptions::parse(&c.url()).unwrap(),
        model: "m".into(),
        version: None,
    };
    let mut store = RedisStore::open(&src, &[spec(&t)]).unwrap();
    for (row, what) in [(rpb + 3, "10 bytes in the store"), (2 * rpb, "missing")] {
        let mut reqs = vec![
            RowRequest {
                table: 0,
                row: 0,
                tag: 0,
            },
            RowRequest {
                table: 0,
                row,
                tag: 1,
            },
        ];
        let mut landed = 0;
        let e = store
            .read(&mut reqs, &mut |_, _| landed += 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model 'm' version 1, table 'emb', row")
                && e.contains(&row.to_string())
                && e.contains(what),
            "{e}"
        );
        assert_eq!(landed, 0, "nothing lands from a failed read");
    }
    // Rows of good blocks still read.
    read_back(
        &mut store,
        std::slice::from_ref(&t),
        &[0, 1, rpb - 1, 3 * rpb],
    );
}
