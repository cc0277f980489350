//! Cluster faults under load while rows are updated (`bench/remote_faults.sh` runs the figure,
//! `#[ignore]`d in CI, about five minutes; a short version runs in CI): the shipped model served
//! by two replicas from a fresh 3 + 3 cluster (one with no row cache, every batch reads the
//! cluster; one with a 1 MiB cache, about 30% of the rows, reading the replicas too), `ember
//! loadgen` over both, and rows of table `t5` rewritten 10,000 times a second while a fault
//! strikes: rows 1..1024 about ten times a second each, rows 1024.. once each, one every 20 ms
//! (an update a fault loses is then not rewritten by a later one, and the final check sees it).
//!
//! **Wrong scores with rows changing.** Every update flips a row of `t5` between two values: `a`,
//! as pushed, and `b`, drawn once. Two DRAM servers are the references, one of the shipped model
//! and one of the same model with every row of `t5` at `b`; loadgen's requests each hold one
//! sample, so one row of `t5`, and `--verify-against` counts an answer wrong unless its score is
//! one of the two references'. A torn row, a row of another id, a block the store lost read as
//! zeros: each gives a score neither reference gives. After the run, with the updates stopped,
//! every row of `t5` is scored on each replica and must be what the publisher last wrote (the
//! reference of that row's last state): no update lost to a fault, whatever the replicas cached.
//! Where the fault lost rows and the replicas have no local copy, the check ends at the first
//! row answered 503 (a request reads rows of every table, so most of them answer 503).
//!
//! **Update lag.** A probe flips row 0 (which the publisher leaves alone) every 100 ms and times,
//! from its first try to publish, until each replica's score of a request reading that row is the
//! new one: publish-to-visible, during the fault and after it.
//!
//! The publisher retries an update until it is written and published (as a producer must: the
//! rows are written before the entry, so a retry rewrites the same bytes), for 30 s at most; an
//! update given up, or refused after a try that failed (and may have written some rows), leaves
//! its rows in either state for the final check, and is counted. An update refused at its first
//! try (a block the store lost) wrote nothing: its rows keep their state.

use crate::load::{self, Seen, now_ms};
use crate::server::{PATIENCE, Server, request, wait_until};
use crate::{Held, wait_state};
use ember_bench::redis_cluster;
use ember_embed::EmbedError;
use ember_registry::{layout::updates_key, updates::Publisher};
use ember_tier::storage::remote::{Cluster, ClusterOptions};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TABLE: &str = "t5";
/// The feature that reads `t5` (its column among the 26 categorical ones).
const FEATURE: usize = 5;
const ROWS: usize = 2048;
const DIM: usize = 16;
/// An update given up after this long (its rows are then in either state): longer than any
/// fault here but a lost block, so that every row's last state is known.
const GIVE_UP: Duration = Duration::from_secs(30);

/// The two values every row of `t5` flips between (f32 little-endian, `ROWS` x `DIM`): `a` as
/// pushed, `b` drawn at random within the range of `a`.
pub struct States {
    a: Vec<u8>,
    b: Vec<u8>,
}

impl States {
    pub fn load() -> States {
        let bytes = std::fs::read(super::default_model().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let a = st.tensor("tables.t5").unwrap().data().to_vec();
        assert_eq!(a.len(), ROWS * DIM * 4, "the shipped t5 is 2048 x 16 f32");
        let scale = a
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()).abs())
            .fold(0.0, f32::max);
        let mut rng = StdRng::seed_from_u64(44);
        let b = (0..ROWS * DIM)
            .flat_map(|_| rng.random_range(-scale..scale).to_le_bytes())
            .collect();
        States { a, b }
    }

    fn row(&self, id: usize, b: bool) -> &[u8] {
        let all = if b { &self.b } else { &self.a };
        &all[id * DIM * 4..(id + 1) * DIM * 4]
    }

    /// A copy of the shipped model whose `t5` holds `b` everywhere, in a new temporary directory.
    fn model_b(&self) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!(
                "ember-faults-{}-{}",
                std::process::id(),
                rand::random::<u32>()
            ))
            .join("default");
        std::fs::create_dir_all(&dir).unwrap();
        let from = super::default_model();
        std::fs::copy(from.join("config.json"), dir.join("config.json")).unwrap();
        let bytes = std::fs::read(from.join("model.safetensors")).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
            .tensors()
            .into_iter()
            .map(|(name, v)| match name.as_str() {
                "tables.t5" => {
                    let b = safetensors::tensor::TensorView::new(
                        v.dtype(),
                        v.shape().to_vec(),
                        &self.b,
                    );
                    (name, b.unwrap())
                }
                _ => (name, v),
            })
            .collect();
        safetensors::serialize_to_file(
            views,
            meta.metadata().clone(),
            &dir.join("model.safetensors"),
        )
        .unwrap();
        dir
    }
}

/// TSV lines, one per row of `rows`, whose `t5` feature reads that row (categorical values are
/// hex, taken modulo the table's 2048 rows) and whose other inputs are fixed.
pub fn rows_body(rows: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let mut out = String::new();
    for r in rows {
        out.push('0');
        for d in 0..13 {
            out.push_str(&format!("\t{}", d * 3));
        }
        for f in 0..26u32 {
            let v = if f as usize == FEATURE {
                r as u32
            } else {
                1 + f * 37
            };
            out.push_str(&format!("\t{v:08x}"));
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// A model as the tests ask for its scores: its name (in the store, on the servers) and the
/// `/v1/score` path that scores it on the servers under test.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub path: String,
}

impl Named {
    /// The model of a server of one model.
    pub fn only(name: &str) -> Named {
        Named {
            name: name.into(),
            path: "/v1/score".into(),
        }
    }

    /// Model `name` of a server of several.
    pub fn among_others(name: &str) -> Named {
        Named {
            name: name.into(),
            path: format!("/v1/score?model={name}"),
        }
    }
}

/// The scores `path` (`/v1/score`, with its query) of `addr` gives `body`, or what it answered
/// instead.
fn scores(addr: SocketAddr, path: &str, body: &[u8]) -> Result<Vec<f64>, String> {
    match request(
        addr,
        "POST",
        path,
        "text/plain",
        body,
        Duration::from_secs(5),
    ) {
        Some((200, text)) => Ok(text
            .split_whitespace()
            .filter_map(|t| t.parse().ok())
            .collect()),
        Some((code, text)) => Err(format!("{code}: {}", text.trim())),
        None => Err("no answer".into()),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()) + 1e-7
}

/// The DRAM references: the shipped model (every row of `t5` at `a`) and its copy at `b`, with
/// their scores of the probe's request and of every row of `t5`.
pub struct Refs {
    servers: [Server; 2],
    probe: [f64; 2],
    sweep: [Vec<f64>; 2],
    dir: PathBuf,
}

impl Refs {
    /// The two references, serving the model as `name`.
    pub fn start(states: &States, name: &str) -> Refs {
        let dir = states.model_b();
        let model_a = super::default_model().to_string_lossy().to_string();
        let model_b = dir.to_string_lossy().to_string();
        let servers = [&model_a, &model_b]
            .map(|m| Server::start(&["--grpc", "off", "--model", m, "--name", name]));
        let score = |k: usize, body: &[u8]| scores(servers[k].addr, "/v1/score", body).unwrap();
        let probe = [0, 1].map(|k| score(k, &rows_body([0]))[0]);
        let sweep = [0, 1].map(|k| score(k, &rows_body(0..ROWS)));
        assert_eq!(sweep[0].len(), ROWS);
        let differ = (0..ROWS)
            .filter(|&r| !close(sweep[0][r], sweep[1][r]))
            .count();
        // A row whose two states score alike would let a stale row pass: nearly none may.
        assert!(
            differ >= ROWS * 99 / 100,
            "only {differ} rows of {ROWS} score apart"
        );
        Refs {
            servers,
            probe,
            sweep,
            dir,
        }
    }

    /// `--verify-against` naming both references.
    pub fn verify_args(&self) -> Vec<String> {
        let urls: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("http://{}", s.addr))
            .collect();
        vec!["--verify-against".into(), urls.join(",")]
    }
}

impl Drop for Refs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.dir.parent().unwrap());
    }
}

/// A row's last published state: `a`, `b`, or either (an update given up, or one whose rows
/// were written but not published).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Last {
    A,
    B,
    Either,
}

/// What the publisher did.
#[derive(Debug)]
pub struct Published {
    pub last: Vec<Last>,
    /// Rows written once (see [`COLD`]).
    pub cold: u64,
    pub rows: u64,
    pub secs: f64,
    /// Tries that failed, updates refused (nothing written), updates given up, and the longest
    /// an update took.
    pub failed_tries: u64,
    pub refused: u64,
    pub given_up: u64,
    pub longest: Duration,
    pub last_error: Option<String>,
}

/// One probe: when it first tried to publish (Unix ms), and per replica how long until its
/// update was visible (`None`: not within 60 s).
#[derive(Debug, Clone)]
pub struct Probe {
    pub at_ms: u64,
    pub lag: Vec<Option<f64>>,
}

/// The publisher (10,000 rows/s over rows 1.. of `t5`) and the probe (row 0), running.
pub struct Updates {
    stop: Arc<AtomicBool>,
    probed: Arc<std::sync::atomic::AtomicUsize>,
    publisher: JoinHandle<Published>,
    prober: JoinHandle<(Vec<Probe>, Last)>,
}

fn connect(url: &str) -> Cluster {
    let mut o = ClusterOptions::parse(url).unwrap();
    o.timeout = Duration::from_secs(1);
    Cluster::connect(o).expect("connecting the publisher")
}

/// Rows `COLD..` are each written once, one every [`COLD_EVERY`] in a random order, so that an
/// update a fault loses is not rewritten by a later one and shows in the final check; rows
/// `1..COLD` are rewritten about ten times a second.
const COLD: u64 = 1024;
const COLD_EVERY: Duration = Duration::from_millis(20);

/// How an update ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Went {
    /// Written and published.
    Through,
    /// Refused with nothing written (a block the store lost): its rows keep their state.
    Refused,
    /// Given up after [`GIVE_UP`] of failures: its rows may be in either state.
    GivenUp,
}

/// Publishes `ids` at `to`, retrying failures for [`GIVE_UP`]; counts failed tries.
fn publish(
    p: &Publisher,
    cl: &mut Cluster,
    states: &States,
    ids: &[u64],
    to: &[bool],
    failed: &mut u64,
    last_error: &mut Option<String>,
) -> Went {
    let bytes: Vec<u8> = ids
        .iter()
        .zip(to)
        .flat_map(|(&id, &b)| states.row(id as usize, b).to_vec())
        .collect();
    let t = Instant::now();
    let mut first_try = true;
    loop {
        match p.publish(cl, ids, &bytes, 100_000) {
            Ok(_) => return Went::Through,
            Err(e) => {
                *failed += 1;
                let refused = matches!(e, EmbedError::UpdateRefused { .. });
                *last_error = Some(e.to_string());
                // Refused with nothing written, unless a try before failed after writing some.
                if refused {
                    return if first_try {
                        Went::Refused
                    } else {
                        Went::GivenUp
                    };
                }
                if t.elapsed() > GIVE_UP {
                    return Went::GivenUp;
                }
                // A retry's pause (a failover takes about the node timeout).
                std::thread::sleep(Duration::from_millis(20));
                first_try = false;
            }
        }
    }
}

impl Updates {
    /// Starts publishing `rows_per_s` rows a second of `model` in the cluster at `url`, and the
    /// probe of `replicas`; returns once a first probe was seen by every replica.
    pub fn start(
        url: &str,
        model: &Named,
        rows_per_s: u64,
        states: Arc<States>,
        refs: &Refs,
        replicas: &[&Server],
    ) -> Updates {
        let stop = Arc::new(AtomicBool::new(false));
        let probed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let publisher = {
            let (stop, states, url) = (stop.clone(), states.clone(), url.to_string());
            let name = model.name.clone();
            std::thread::spawn(move || flip_rows(&url, &name, rows_per_s, &states, &stop))
        };
        let prober = {
            let (stop, probed, url) = (stop.clone(), probed.clone(), url.to_string());
            let want = refs.probe;
            let addrs: Vec<SocketAddr> = replicas.iter().map(|s| s.addr).collect();
            let model = model.clone();
            std::thread::spawn(move || {
                probe_row0(&url, &model, &states, want, &addrs, &stop, &probed)
            })
        };
        let u = Updates {
            stop,
            probed,
            publisher,
            prober,
        };
        wait_until("a first probe seen by every replica", PATIENCE, || {
            u.probed.load(Ordering::Relaxed) >= 1
        });
        u
    }

    /// Stops both; what was published (row 0's last state from the probe) and the probes.
    pub fn stop(self) -> (Published, Vec<Probe>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut p = self.publisher.join().expect("the publisher");
        let (probes, row0) = self.prober.join().expect("the probe");
        p.last[0] = row0;
        (p, probes)
    }
}

/// The publisher's loop: 100 random rows of 1.. of `model` flipped at a time, `rows_per_s`
/// rows a second.
fn flip_rows(
    url: &str,
    model: &str,
    rows_per_s: u64,
    states: &States,
    stop: &AtomicBool,
) -> Published {
    let mut cl = connect(url);
    let p = Publisher::open(&mut cl, model, None, TABLE).unwrap();
    let mut rng = StdRng::seed_from_u64(rand::random());
    let mut cold: Vec<u64> = (COLD..ROWS as u64).collect();
    cold.shuffle(&mut rng);
    let mut out = Published {
        last: vec![Last::A; ROWS],
        cold: 0,
        rows: 0,
        secs: 0.0,
        failed_tries: 0,
        refused: 0,
        given_up: 0,
        longest: Duration::ZERO,
        last_error: None,
    };
    let t0 = Instant::now();
    let mut paced_from = (t0, 0u64);
    let mut tried = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut ids: Vec<u64> = (0..100).map(|_| rng.random_range(1..COLD)).collect();
        ids.sort_unstable();
        ids.dedup();
        if t0.elapsed() >= COLD_EVERY * out.cold as u32
            && let Some(id) = cold.pop()
        {
            ids.push(id);
            out.cold += 1;
        }
        let to: Vec<bool> = ids
            .iter()
            .map(|&id| out.last[id as usize] != Last::B)
            .collect();
        let t = Instant::now();
        let went = publish(
            &p,
            &mut cl,
            states,
            &ids,
            &to,
            &mut out.failed_tries,
            &mut out.last_error,
        );
        out.longest = out.longest.max(t.elapsed());
        for (&id, &b) in ids.iter().zip(&to) {
            let last = &mut out.last[id as usize];
            *last = match went {
                Went::Through if b => Last::B,
                Went::Through => Last::A,
                Went::Refused => *last,
                Went::GivenUp => Last::Either,
            };
        }
        out.given_up += u64::from(went == Went::GivenUp);
        out.refused += u64::from(went == Went::Refused);
        out.rows += ids.len() as u64 * u64::from(went == Went::Through);
        tried += ids.len() as u64;
        // The publisher's pace (`rows_per_s`), not a wait; after a stall it catches up on at
        // most one second of updates, as a producer with a bounded queue would.
        let (from, base) = paced_from;
        let due = from + Duration::from_micros((tried - base) * 1_000_000 / rows_per_s);
        let now = Instant::now();
        if now > due + Duration::from_secs(1) {
            paced_from = (now - Duration::from_secs(1), tried);
        } else if let Some(wait) = due.checked_duration_since(now) {
            std::thread::sleep(wait);
        }
    }
    out.secs = t0.elapsed().as_secs_f64();
    out
}

/// The probe's loop: row 0 flipped, then each replica asked until it scores the new state.
fn probe_row0(
    url: &str,
    model: &Named,
    states: &States,
    want: [f64; 2],
    addrs: &[SocketAddr],
    stop: &AtomicBool,
    probed: &std::sync::atomic::AtomicUsize,
) -> (Vec<Probe>, Last) {
    let mut cl = connect(url);
    let p = Publisher::open(&mut cl, &model.name, None, TABLE).unwrap();
    let body = rows_body([0]);
    let (mut failed, mut err) = (0, None);
    let mut probes = Vec::new();
    let mut last = Last::A;
    while !stop.load(Ordering::Relaxed) {
        let to = last != Last::B;
        let at_ms = now_ms();
        let t = Instant::now();
        match publish(&p, &mut cl, states, &[0], &[to], &mut failed, &mut err) {
            Went::Through => last = if to { Last::B } else { Last::A },
            went => {
                if went == Went::GivenUp {
                    last = Last::Either;
                }
                probes.push(Probe {
                    at_ms,
                    lag: vec![None; addrs.len()],
                });
                // The probe's pace.
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let lag = addrs
            .iter()
            .map(|&a| {
                loop {
                    if scores(a, &model.path, &body)
                        .is_ok_and(|s| s.len() == 1 && close(s[0], want[to as usize]))
                    {
                        return Some(t.elapsed().as_secs_f64());
                    }
                    // 60 s at most, and 2 s once the run has stopped: a row its replicas can
                    // no longer read (a shard restarted empty) is not waited out (it cost the
                    // CI run a minute).
                    let stopped = stop.load(Ordering::Relaxed);
                    if t.elapsed() > Duration::from_secs(if stopped { 2 } else { 60 }) {
                        return None;
                    }
                    // The probe's poll interval.
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
            .collect();
        probes.push(Probe { at_ms, lag });
        probed.fetch_add(1, Ordering::Relaxed);
        // Not a wait: a probe every 100 ms is the measurement's own pace.
        std::thread::sleep(Duration::from_millis(100));
    }
    (probes, last)
}

/// Waits (30 s at most) until every replica scores every row of `t5` as its last published
/// state; how long that took, or what still differed. With `lost` (the store lost rows and
/// the replicas have no copy) a replica's 503 naming a row missing in the store ends the wait.
pub fn settle(
    replicas: &[&Server],
    model: &Named,
    refs: &Refs,
    last: &[Last],
    lost: bool,
) -> Result<Duration, String> {
    let body = rows_body(0..ROWS);
    let t = Instant::now();
    loop {
        let mut seen = Vec::new();
        for (k, s) in replicas.iter().enumerate() {
            match scores(s.addr, &model.path, &body) {
                Ok(got) if got.len() == ROWS => {
                    let bad: Vec<usize> = (0..ROWS)
                        .filter(|&r| {
                            let ok_a = close(got[r], refs.sweep[0][r]);
                            let ok_b = close(got[r], refs.sweep[1][r]);
                            match last[r] {
                                Last::A => !ok_a,
                                Last::B => !ok_b,
                                Last::Either => !(ok_a || ok_b),
                            }
                        })
                        .collect();
                    if let Some(&r) = bad.first() {
                        seen.push(format!(
                            "replica {k}: {} rows of {ROWS} differ from their last published state, \
                             e.g. row {r} ({:?}): {} (a: {}, b: {})",
                            bad.len(),
                            last[r],
                            got[r],
                            refs.sweep[0][r],
                            refs.sweep[1][r]
                        ));
                    }
                }
                Ok(got) => seen.push(format!("replica {k}: {} scores", got.len())),
                Err(e) => seen.push(format!("replica {k}: {e}")),
            }
        }
        if seen.is_empty() {
            return Ok(t.elapsed());
        }
        let missing = |e: &String| e.contains("503") && e.contains("missing in the store");
        if t.elapsed() > Duration::from_secs(30) || (lost && seen.iter().any(missing)) {
            return Err(seen.join("; "));
        }
        // The poll's interval inside a bounded wait for a state.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two replicas of the shipped model on cluster `c`: one with no row cache, reading the
/// primaries; one with 1 MiB, reading the replicas too (`--read-from-replicas`); with
/// `fallback`, both also with the local copy (`--remote-fallback`) of the model in `fallback`.
pub fn replicas(c: &Held, fallback: Option<&Path>) -> [Server; 2] {
    let model = fallback.map(|d| d.to_string_lossy().to_string());
    [
        &["--cache-mb", "0"][..],
        &["--cache-mb", "1", "--read-from-replicas"][..],
    ]
    .map(|own| {
        let mut args: Vec<&str> = own.to_vec();
        if let Some(m) = &model {
            args.extend(["--model", m, "--remote-fallback"]);
        }
        super::serve::remote_server(&c.url(), &args)
    })
}

/// The node now holding `t5`'s update stream (a primary), by asking each primary.
pub fn stream_primary(c: &Held) -> usize {
    let key = updates_key("default", 1, TABLE);
    for p in c.primaries().unwrap() {
        let got = redis_cluster::query(p, ember_redis::cmd("EXISTS").arg(&key));
        if matches!(got, Ok(ember_redis::Value::Int(1))) {
            return c.index(p).unwrap();
        }
    }
    panic!("no primary holds {key}");
}

/// The replica of the node `primary`.
pub fn replica_of(c: &Held, primary: usize) -> usize {
    let port = c.nodes[primary].port.to_string();
    (0..c.nodes.len())
        .find(|&i| {
            i != primary
                && c.nodes[i].is_running()
                && redis_cluster::query_text(
                    c.nodes[i].port,
                    ember_redis::cmd("INFO").arg("replication"),
                )
                .ok()
                .is_some_and(|info| info.contains(&format!("master_port:{port}")))
        })
        .expect("a replica of the primary")
}

/// One fault's run and what it cost.
pub struct Run {
    pub name: String,
    pub seen: Seen,
    /// How long the fault lasted, seconds: from its start until the cluster was whole again
    /// (a failover done, a node back) or, for a lasting fault, until it was struck.
    pub window: f64,
    pub published: Published,
    /// Probes, their time taken from the fault's.
    pub probes: Vec<(f64, Vec<Option<f64>>)>,
    pub settled: Result<Duration, String>,
}

/// What a fault's run serves and checks: the replicas, the reference scores, the rows' states.
pub struct Fleet<'a> {
    pub replicas: &'a [&'a Server],
    pub refs: &'a Refs,
    pub states: &'a Arc<States>,
}

/// Runs loadgen over the fleet's replicas at `rate` for `secs` with updates flowing, `fault`
/// four seconds in (it returns once the fault is over); then stops the updates and checks every
/// row (`lost`: the fault lost rows the replicas cannot read elsewhere, see [`settle`]).
pub fn run_fault(
    name: &str,
    c: &mut Held,
    fleet: &Fleet<'_>,
    rate: f64,
    secs: f64,
    fault: impl FnOnce(&mut Held),
    lost: bool,
) -> Run {
    let Fleet {
        replicas,
        refs,
        states,
    } = *fleet;
    let model = Named::only("default");
    let updates = Updates::start(&c.url(), &model, 10_000, states.clone(), refs, replicas);
    let mut at = 0;
    let mut window = 0.0;
    let seen = load::under_load(replicas, rate, secs, &refs.verify_args(), || {
        at = now_ms();
        let t = Instant::now();
        fault(c);
        window = t.elapsed().as_secs_f64();
    });
    let (published, probes) = updates.stop();
    let settled = settle(replicas, &model, refs, &published.last, lost);
    let probes = probes
        .into_iter()
        .map(|p| ((p.at_ms as f64 - at as f64) / 1e3, p.lag))
        .collect();
    Run {
        name: name.into(),
        seen,
        window,
        published,
        probes,
        settled,
    }
}

/// The figures of one run (see [`Run::figures`]).
#[derive(Debug)]
pub struct Figures {
    pub failed: u64,
    pub wrong: u64,
    /// From the fault's end until every 0.5 s bucket is answered in full (`None`: not by the
    /// end of the run).
    pub back_s: Option<f64>,
    pub p99_during: f64,
    pub p99_after: f64,
    /// Update lag (publish-to-visible, the slower replica): the worst of the probes published
    /// during the fault (and until full rate), and the median and worst after.
    pub lag_during: Option<f64>,
    pub lag_after: (f64, f64),
}

impl Run {
    pub fn figures(&self) -> Figures {
        let b = &self.seen.buckets;
        let bad = |x: &load::Bucket| x.ok < x.sent || x.wrong > 0;
        let back_s = match b.iter().rposition(bad) {
            None => Some(0.0),
            Some(i) if i + 1 == b.len() => None,
            Some(i) => Some((b[i].t + 0.5 - self.window).max(0.0)),
        };
        let end = self.window + back_s.unwrap_or(f64::INFINITY);
        let worst = |from: f64, to: f64| {
            b.iter()
                .filter(|x| x.t > from && x.t < to && x.ok > 0)
                .map(|x| x.p99_ms)
                .fold(f64::NAN, f64::max)
        };
        let lag = |p: &(f64, Vec<Option<f64>>)| {
            p.1.iter()
                .map(|l| l.unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max)
        };
        let during: Vec<f64> = self
            .probes
            .iter()
            .filter(|p| p.0 >= -0.5 && p.0 < end)
            .map(lag)
            .collect();
        let mut after: Vec<f64> = self.probes.iter().filter(|p| p.0 >= end).map(lag).collect();
        after.sort_by(f64::total_cmp);
        Figures {
            failed: self.seen.refused + self.seen.errors,
            wrong: self.seen.wrong,
            back_s,
            p99_during: worst(-0.5, end),
            p99_after: worst(end, f64::INFINITY),
            lag_during: during.into_iter().reduce(f64::max),
            lag_after: match after.len() {
                0 => (f64::NAN, f64::NAN),
                n => (after[n / 2], after[n - 1]),
            },
        }
    }

    /// Prints the run and its FIGURE line.
    pub fn report(&self) {
        load::report(&self.name, &self.seen);
        let p = &self.published;
        eprintln!(
            "  updates: {:.0} rows/s ({} rows written once), {} failed tries, {} refused, {} given \
             up, slowest {:.0} ms{}",
            p.rows as f64 / p.secs,
            p.cold,
            p.failed_tries,
            p.refused,
            p.given_up,
            p.longest.as_secs_f64() * 1e3,
            p.last_error
                .as_deref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        );
        let f = self.figures();
        let secs = |v: Option<f64>| v.map_or("never".into(), |v| format!("{v:.1} s"));
        eprintln!(
            "FIGURE {}: failed {} (503 {}), wrong {}, p99 during {:.1} ms / after {:.1} ms, back to \
             full rate {} after the fault, update lag during {} / after p50 {:.0} ms max {:.0} ms, \
             every row as last published: {}",
            self.name,
            f.failed,
            self.seen.refused,
            f.wrong,
            f.p99_during,
            f.p99_after,
            secs(f.back_s),
            secs(f.lag_during),
            f.lag_after.0 * 1e3,
            f.lag_after.1 * 1e3,
            match &self.settled {
                Ok(d) => format!(
                    "yes, {:.0} ms after the updates stopped",
                    d.as_secs_f64() * 1e3
                ),
                Err(e) => format!("NO: {e}"),
            }
        );
    }
}

/// Every node of `c` paused for `secs`, then resumed.
fn pause_all(c: &mut Held, secs: f64) {
    for i in 0..c.nodes.len() {
        c.pause(i);
    }
    // The fault's length, not a wait.
    std::thread::sleep(Duration::from_secs_f64(secs));
    for i in 0..c.nodes.len() {
        c.resume(i);
    }
}

/// Kills node `i` and waits until the cluster has failed it over (a replica promoted).
fn kill_until_failed_over(c: &mut Held, i: usize) {
    let port = c.nodes[i].port;
    c.kill(i).unwrap();
    wait_state("the failover of the killed primary", PATIENCE, || {
        let p = c.primaries().map_err(|e| e.to_string())?;
        (!p.contains(&port) && p.len() == 3)
            .then_some(())
            .ok_or(format!("primaries {p:?}"))
    });
}

/// A primary that does not hold `t5`'s update stream.
fn other_primary(c: &Held) -> usize {
    let stream = stream_primary(c);
    let p = c.primaries().unwrap();
    p.iter()
        .map(|&p| c.index(p).unwrap())
        .find(|&i| i != stream)
        .expect("three primaries")
}

/// One fault.
pub struct Fault {
    pub name: &'static str,
    /// The replicas have the local copy (`--remote-fallback`).
    pub fallback: bool,
    /// Seconds the run goes on after the fault's start, at least.
    pub given: f64,
    /// The fault loses rows from the store: without the local copy, requests reading them fail
    /// (503, naming the row) until the version is pushed again.
    pub loses_rows: bool,
    pub act: Box<dyn FnOnce(&mut Held)>,
}

/// The faults, in order; `pause_s` and `cluster_s`: how long a primary and the whole cluster
/// are paused.
pub fn faults(pause_s: f64, cluster_s: f64) -> Vec<Fault> {
    let fault = |name, fallback, given, act: Box<dyn FnOnce(&mut Held)>| Fault {
        name,
        fallback,
        given,
        loses_rows: false,
        act,
    };
    let restart_empty = |c: &mut Held| {
        let v = other_primary(c);
        c.kill(v).unwrap();
        c.restart(v).unwrap();
        c.wait_healthy(PATIENCE)
            .expect("the restarted node serving");
    };
    vec![
        fault(
            "a primary killed",
            false,
            3.0,
            Box::new(|c| {
                let v = stream_primary(c);
                kill_until_failed_over(c, v);
            }),
        ),
        fault(
            "a primary paused",
            false,
            pause_s,
            Box::new(move |c| {
                let v = stream_primary(c);
                c.pause(v);
                // The fault's length, not a wait.
                std::thread::sleep(Duration::from_secs_f64(pause_s));
                c.resume(v);
            }),
        ),
        fault(
            "a replica killed",
            false,
            1.0,
            Box::new(|c| {
                let v = replica_of(c, stream_primary(c));
                c.kill(v).unwrap();
            }),
        ),
        fault(
            "the whole cluster paused",
            false,
            cluster_s,
            Box::new(move |c| pause_all(c, cluster_s)),
        ),
        fault(
            "the whole cluster paused, with --remote-fallback",
            true,
            cluster_s,
            Box::new(move |c| pause_all(c, cluster_s)),
        ),
        fault(
            "a primary killed and restarted empty after its failover",
            false,
            5.0,
            Box::new(|c| {
                let v = stream_primary(c);
                kill_until_failed_over(c, v);
                c.restart(v).unwrap();
                c.wait_healthy(PATIENCE)
                    .expect("the restarted node rejoining");
            }),
        ),
        Fault {
            loses_rows: true,
            ..fault(
                "a primary restarted empty before its failover (its shard's rows lost)",
                false,
                3.0,
                Box::new(restart_empty),
            )
        },
        Fault {
            loses_rows: true,
            ..fault(
                "a primary restarted empty before its failover, with --remote-fallback",
                true,
                3.0,
                Box::new(restart_empty),
            )
        },
    ]
}

/// The faults of [`faults`] that `pick` takes by name, each on its own fresh cluster, at `rate`
/// (`None`: half the highest found), each run going on `secs_after` seconds past the time the
/// fault is given; the runs, each with whether it lost rows the replicas cannot read elsewhere.
fn run_all(
    rate: Option<f64>,
    secs_after: f64,
    pause_s: f64,
    cluster_s: f64,
    pick: impl Fn(&str) -> bool,
) -> Vec<(Run, bool)> {
    let states = Arc::new(States::load());
    let refs = Refs::start(&states, "default");
    let copy = super::serve::model_with_row_files();
    let mut runs = Vec::new();
    let rate = match rate {
        Some(r) => r,
        None => match highest_rate(&states, &refs) {
            Some(max) => max / 2.0,
            None => return runs,
        },
    };
    for f in faults(pause_s, cluster_s) {
        if !pick(f.name) {
            continue;
        }
        let Some(mut c) = super::cluster(1) else {
            return runs;
        };
        super::push_default(&c);
        let [r0, r1] = replicas(&c, f.fallback.then_some(copy.as_path()));
        let secs = 4.0 + f.given + secs_after;
        let lost = f.loses_rows && !f.fallback;
        let fleet = Fleet {
            replicas: &[&r0, &r1],
            refs: &refs,
            states: &states,
        };
        let run = run_fault(f.name, &mut c, &fleet, rate, secs, f.act, lost);
        run.report();
        runs.push((run, lost));
    }
    let _ = std::fs::remove_dir_all(copy.parent().unwrap());
    runs
}

/// The highest rate over both replicas at p99 <= 10 ms with the updates flowing, found on a
/// cluster of its own: its updates leave rows in state `b` that a fault's run, which starts
/// from the store as pushed, must not inherit (the first run once shared it, and the rows its
/// own publisher had not reached yet read as `b` where it expected `a`). `None`: no cluster.
fn highest_rate(states: &Arc<States>, refs: &Refs) -> Option<f64> {
    let c = super::cluster(1)?;
    super::push_default(&c);
    let [r0, r1] = replicas(&c, None);
    let model = Named::only("default");
    let updates = Updates::start(&c.url(), &model, 10_000, states.clone(), refs, &[&r0, &r1]);
    let urls = format!("http://{},http://{}", r0.addr, r1.addr);
    let max = load::find_max(&urls, 200.0);
    drop(updates.stop());
    eprintln!(
        "highest rate over both replicas at p99 <= 10 ms with updates flowing: {max:.0}/s; \
         the runs offer half"
    );
    Some(max)
}

/// What every run must show: no wrong score; every row as last published once the updates
/// stop, and full rate again; where rows were lost with no local copy, a 503 naming a row
/// missing in the store instead.
fn check(runs: &[(Run, bool)]) {
    for (r, lost) in runs {
        let f = r.figures();
        let p = &r.published;
        assert_eq!(f.wrong, 0, "{}: wrong scores", r.name);
        assert_eq!(r.seen.errors, 0, "{}: errors other than 503", r.name);
        assert!(p.rows > 0 && p.cold > 0, "{}: nothing published", r.name);
        if r.name.contains("--remote-fallback") {
            assert_eq!(f.failed, 0, "{}: failed with the local copy", r.name);
        }
        if *lost {
            let e = r.settled.as_ref().unwrap_err();
            assert!(
                e.contains("503") && e.contains("missing in the store"),
                "{}: {e}",
                r.name
            );
            continue;
        }
        assert!(r.settled.is_ok(), "{}: {:?}", r.name, r.settled);
        assert!(f.back_s.is_some(), "{}: never back to full rate", r.name);
        if !r.name.contains("rows lost") && !r.name.contains("restarted empty before") {
            // Every update went through: none refused or given up, and the rate held but for
            // the fault's own stall.
            assert_eq!((p.refused, p.given_up), (0, 0), "{}: updates", r.name);
            let rate = p.rows as f64 / p.secs;
            assert!(rate >= 5_000.0, "{}: {rate:.0} rows/s published", r.name);
        }
    }
}

/// The figure (`bench/remote_faults.sh`): every fault, at half the highest rate found with the
/// updates flowing (`EMBER_FAULT_RATE` to set it), those whose name holds `EMBER_FAULTS`.
#[test]
#[ignore = "a figure: bench/remote_faults.sh"]
fn figure_faults_under_load_with_updates() {
    let rate = std::env::var("EMBER_FAULT_RATE")
        .ok()
        .map(|r| r.parse().unwrap());
    let only = std::env::var("EMBER_FAULTS").unwrap_or_default();
    let runs = run_all(rate, 8.0, 5.0, 10.0, |name| name.contains(only.as_str()));
    check(&runs);
}

/// The short version, in CI: three of the faults at a light load (300 requests/s over both
/// replicas) with the updates at full rate: a killed primary (the one holding the update stream),
/// the whole cluster paused for 2 s with the local copy, and a primary restarted empty (its rows
/// lost). No wrong score in any; every row as last published after the first two, a 503 naming
/// a missing row after the third.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn faults_under_load_with_updates_give_no_wrong_score() {
    let short = [
        "a primary killed",
        "the whole cluster paused, with --remote-fallback",
        "a primary restarted empty before its failover (its shard's rows lost)",
    ];
    let runs = run_all(Some(300.0), 3.0, 2.0, 2.0, |name| short.contains(&name));
    if runs.is_empty() && !cfg!(ember_redis) {
        return;
    }
    assert_eq!(runs.len(), short.len());
    check(&runs);
}
