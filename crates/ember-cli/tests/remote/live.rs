//! Row updates to the tables a model served from the store holds in memory (placement `dram`
//! beside `remote` ones): applied in place with no torn row while batches pool, read again
//! whole from the store at start when updates were published since the push, and read again
//! when the stream was trimmed past the server.

use crate::server::PATIENCE;
use crate::updates::{admin, encode, overrun, values};
use ember_embed::{
    DType, EmbeddingCollection, EmbeddingTable, Ids, KeyedJagged, PoolOptions, Pooler,
};
use ember_registry::PushOptions;
use ember_tier::CachePolicy;
use ember_tier::storage::remote::{self, ClusterOptions, RemoteSource};
use ember_tier::{Stager, TierOptions};
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

const ROWS: usize = 3000;
const DIM: usize = 16;

/// Remote table `r` (rows `r`) and in-memory table `d` (rows `d`), one feature each, made live
/// and followed: what a server of model `model` holds.
fn server(url: &str, model: &str, d: &[f32]) -> (EmbeddingCollection, Stager) {
    let mut coll = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::remote("r", ROWS, DIM, DType::F32).unwrap(),
        EmbeddingTable::from_f32("d", ROWS, DIM, DType::F32, d).unwrap(),
    ])
    .unwrap();
    let opts = TierOptions {
        cache_bytes: ROWS * DIM * 4,
        policy: CachePolicy::Lru,
        remote: Some(RemoteSource {
            cluster: ClusterOptions::parse(url).unwrap(),
            model: model.into(),
            version: None,
        }),
        ..TierOptions::default()
    };
    assert!(
        ember_tier::prepare_updates(&mut coll, &opts).unwrap(),
        "d is made live"
    );
    assert!(coll.tables()[1].is_live() && coll.tables()[1].resident().is_none());
    let stager = Stager::new(&coll, opts).unwrap();
    (coll, stager)
}

/// Bags of one id each, `n` of them, over both features (ids at random).
fn singles(rng: &mut rand::rngs::StdRng, n: usize) -> KeyedJagged {
    let ids: Vec<u32> = (0..2 * n)
        .map(|_| rng.random_range(0..ROWS as u32))
        .collect();
    KeyedJagged::from_lengths(
        vec!["r".into(), "d".into()],
        n,
        &vec![1; 2 * n],
        Ids::U32(ids),
        None,
    )
    .unwrap()
}

/// `kj` pooled by the server, and by a plain DRAM collection of `r` and `d`.
fn both(
    pooler: &Pooler,
    (coll, stager): &(EmbeddingCollection, Stager),
    kj: &KeyedJagged,
    r: &[f32],
    d: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let n = kj.batch_size();
    let staged = stager.stage(coll, coll.check_view(kj).unwrap()).unwrap();
    let mut got = vec![0f32; n * 2 * DIM];
    pooler
        .run_staged(coll, coll.check_view(kj).unwrap(), &staged, &mut got)
        .unwrap();
    let mem = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::from_f32("r", ROWS, DIM, DType::F32, r).unwrap(),
        EmbeddingTable::from_f32("d", ROWS, DIM, DType::F32, d).unwrap(),
    ])
    .unwrap();
    let mut want = vec![0f32; n * 2 * DIM];
    pooler
        .run(&mem, mem.check_view(kj).unwrap(), &mut want)
        .unwrap();
    (got, want)
}

/// Pushes `r` and `d` as `model`.
fn push(url: &str, model: &str, r: &[f32], d: &[f32]) -> (remote::Cluster, u64) {
    let tr = EmbeddingTable::from_f32("r", ROWS, DIM, DType::F32, r).unwrap();
    let td = EmbeddingTable::from_f32("d", ROWS, DIM, DType::F32, d).unwrap();
    let mut cl = admin(url);
    let rep = ember_registry::push(
        &mut cl,
        model,
        &[&tr, &td],
        &PushOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    (cl, rep.version)
}

/// Updates to an in-memory table reach it while a thread pools it without pause: every pooled
/// row is a whole row of the table before or after (never a mix), the last write wins, the
/// remote table beside it is untouched, and a server started later from the pushed rows reads
/// the updated ones from the store before it serves.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn updates_rewrite_in_memory_tables_whole_rows_only() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let (r, d0) = (values(11), values(12));
    let (mut cl, _) = push(&url, "live", &r, &d0);
    let srv = server(&url, "live", &d0);
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (got, want) = both(&pooler, &srv, &singles(&mut rng, 64), &r, &d0);
    assert_eq!(got, want);

    // Every row of d rewritten twice (two versions of the table), in entries of 500 rows.
    let (d1, d2) = (values(13), values(14));
    let stop = AtomicBool::new(false);
    // Two threads pool every row of d in each batch: one applies the queued updates (in
    // its stage call) while the other pools.
    let read = |seed: u64| {
        let pooler = Pooler::new(PoolOptions::default()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut batches = 0u64;
        let (coll, stager) = &srv;
        while !stop.load(Relaxed) {
            // The in-memory feature only: bags of one id, every row once, pooled straight
            // from the table.
            let mut ids: Vec<u32> = (0..ROWS as u32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.random_range(0..=i));
            }
            let kj = KeyedJagged::from_lengths(
                vec!["r".into(), "d".into()],
                ROWS,
                &[vec![0; ROWS], vec![1; ROWS]].concat(),
                Ids::U32(ids.clone()),
                None,
            )
            .unwrap();
            let staged = stager.stage(coll, coll.check_view(&kj).unwrap()).unwrap();
            let mut out = vec![0f32; ROWS * 2 * DIM];
            pooler
                .run_staged(coll, coll.check_view(&kj).unwrap(), &staged, &mut out)
                .unwrap();
            for (b, &id) in ids.iter().enumerate() {
                let row = &out[b * 2 * DIM + DIM..(b + 1) * 2 * DIM];
                let of = |v: &[f32]| &v[id as usize * DIM..(id as usize + 1) * DIM] == row;
                assert!(
                    of(&d0) || of(&d1) || of(&d2),
                    "row {id} is torn: {row:?} after {batches} batches"
                );
            }
            batches += 1;
        }
        batches
    };
    std::thread::scope(|s| {
        let read = &read;
        let readers = [s.spawn(move || read(2)), s.spawn(move || read(3))];
        for v in [&d1, &d2] {
            for start in (0..ROWS).step_by(500) {
                let ids: Vec<u64> = (start as u64..(start + 500).min(ROWS) as u64).collect();
                let rows = encode(v, &ids, DType::F32);
                ember_registry::updates::publish(&mut cl, "live", None, "d", &ids, &rows, 1000)
                    .unwrap();
            }
        }
        crate::wait_state("the update in the table", PATIENCE, || {
            let (got, want) = both(&pooler, &srv, &singles(&mut rng, 64), &r, &d2);
            if got == want {
                Ok(())
            } else {
                Err(format!("{:?}", srv.1.update_stats()))
            }
        });
        stop.store(true, Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    });
    // `verify` holds the rewritten blocks to their length, not to the push's CRCs.
    let manifest = ember_registry::read_manifest(&mut cl, "live", 1).unwrap();
    let v = ember_registry::verify(&mut cl, "live", 1, Duration::from_secs(10)).unwrap();
    assert!(v.bad.is_empty(), "{:?}", v.bad);
    let d_blocks = manifest.table("d").unwrap().blocks();
    assert_eq!(v.updated.len(), d_blocks, "{:?}", v.updated);
    assert!(v.updated.iter().all(|(t, _)| t == "d"));
    let u = srv.1.update_stats().unwrap();
    assert_eq!(u.rows_applied, 2 * ROWS as u64, "{u:?}");
    assert_eq!(
        u.positions.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["r", "d"]
    );
    // A restart: the table loaded from the pushed rows is read again from the store first.
    let late = server(&url, "live", &d0);
    for _ in 0..3 {
        let (got, want) = both(&pooler, &late, &singles(&mut rng, 64), &r, &d2);
        assert_eq!(got, want, "a server started after the updates serves them");
    }
}

/// A server whose in-memory table's stream was trimmed past its position reads the whole table
/// again from the store, says so in its counters, and serves the store's rows.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_trimmed_stream_reads_an_in_memory_table_again() {
    let Some(c) = super::cluster(1) else { return };
    let url = c.url();
    let (r, mut d) = (values(21), values(22));
    let (mut cl, version) = push(&url, "livetrim", &r, &d);
    let srv = server(&url, "livetrim", &d);
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    // Rows 100..110 of d rewritten in the store, then 50 entries published with the stream
    // trimmed to one: the server cannot have read them all.
    let ids: Vec<u64> = (100..110).collect();
    let new = values(23);
    let rows = encode(&new, &ids, DType::F32);
    let rpb = overrun(&mut cl, "livetrim", version, "d", &ids, &rows);
    for &i in &ids {
        let i = i as usize;
        d[i * DIM..(i + 1) * DIM].copy_from_slice(&new[i * DIM..(i + 1) * DIM]);
    }
    crate::wait_state("d read again from the store", PATIENCE, || {
        let u = srv.1.update_stats().unwrap();
        let (got, want) = both(&pooler, &srv, &singles(&mut rng, 64), &r, &d);
        if u.resets > 0 && u.rows_reloaded >= ROWS as u64 && got == want {
            Ok(())
        } else {
            Err(format!("{u:?}"))
        }
    });
    // Rows written without publishing (no record of an update): verify calls them damaged.
    let v = ember_registry::verify(&mut cl, "livetrim", version, Duration::from_secs(10)).unwrap();
    let bad: Vec<usize> = (100..110).map(|i| i / rpb).collect();
    assert!(!v.bad.is_empty() && v.updated.is_empty(), "{v:?}");
    assert!(
        v.bad
            .iter()
            .all(|(t, b, what)| t == "d" && bad.contains(b) && what.contains("CRC"))
    );
    // Every id of d, after: the store's rows.
    let all: Vec<u32> = (0..ROWS as u32).collect();
    let kj = KeyedJagged::from_lengths(
        vec!["r".into(), "d".into()],
        ROWS,
        &[vec![0; ROWS], vec![1; ROWS]].concat(),
        Ids::U32(all),
        None,
    )
    .unwrap();
    let (got, want) = both(&pooler, &srv, &kj, &r, &d);
    assert_eq!(got, want);
    drop(srv);
    // Removing the version removes its update streams too.
    ember_registry::remove(&mut cl, "livetrim", version, Duration::from_secs(10)).unwrap();
    let key = ember_registry::layout::updates_key("livetrim", version, "d");
    let mut ops = remote::Ops::default();
    ops.push(key.as_bytes(), ember_redis::cmd("EXISTS").arg(&key));
    let left = cl
        .run(&ops, false, Instant::now() + Duration::from_secs(5))
        .unwrap();
    assert_eq!(
        left,
        [ember_redis::Value::Int(0)],
        "the stream outlived its version"
    );
}

/// `ember serve` of a model whose table `t3` is held in memory and the others read from the
/// store: `ember registry update` of `t3` changes the scores of a running replica to exactly those
/// of a replica started after the update (which reads `t3` from the store before it serves, not
/// from its files), and the counters say the rows were applied.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_served_model_applies_updates_to_its_in_memory_table() {
    use crate::server::{Server, tsv_rows};
    let Some(c) = super::cluster(1) else { return };
    let dir = std::env::temp_dir().join(format!("ember-live-{}", std::process::id()));
    let model = dir.join("mixed");
    std::fs::create_dir_all(&model).unwrap();
    let src = super::default_model();
    std::fs::copy(
        src.join("model.safetensors"),
        model.join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    for t in config["tables"].as_array_mut().unwrap() {
        let placement = if t["name"] == "t3" { "dram" } else { "remote" };
        t["placement"] = placement.into();
    }
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let ember = crate::ok;
    let (url, m) = (c.url(), model.to_str().unwrap());
    ember(&["registry", "push", "--redis", &url, "--model", m]);
    let serve = || Server::start(&["--grpc", "off", "--model", m, "--redis", &url]);
    let a = serve();
    let bodies: Vec<Vec<u8>> = (0..4u64).map(|s| tsv_rows(16, 500 + s)).collect();
    let scores = |s: &Server| crate::scores(s, &bodies);
    let before = scores(&a);
    let file = dir.join("t3.safetensors");
    let ids: Vec<i64> = (0..2048).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let rows: Vec<f32> = (0..2048 * 16)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    crate::updates::update_file(&file, &ids, &rows, 16);
    let f = file.to_str().unwrap();
    let said = ember(&[
        "registry", "update", "--redis", &url, "--model", "mixed", "--table", "t3", "--rows", f,
    ]);
    assert!(said.contains("updated 2048 rows of mixed/v1/t3"), "{said}");
    let fresh = serve();
    let want = scores(&fresh);
    assert!(
        want.iter().zip(&before).all(|(x, y)| x != y),
        "the update changed no score: the fresh replica served t3 from its files"
    );
    crate::server::wait_until("the running replica serving the update", PATIENCE, || {
        scores(&a) == want
    });
    let metrics = a.request("GET", "/metrics", "text/plain", b"").unwrap().1;
    let applied = metrics
        .lines()
        .find(|l| l.starts_with("ember_update_rows_total{model=\"mixed\",outcome=\"applied\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(applied, Some(2048.0), "{metrics}");
    assert!(metrics.contains("ember_update_position_ms{model=\"mixed\",table=\"t3\"}"));
    let _ = std::fs::remove_dir_all(&dir);
}
