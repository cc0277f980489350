//! The remote tier over TLS (`rediss://`) on a real Redis Cluster whose nodes serve TLS with
//! client certificates required (`tls-auth-clients yes`), the cluster bus and replication over
//! TLS too, with a test CA made here: `ember registry push` and `ember serve --placement
//! remote` over TLS score exactly as DRAM; a client without a certificate, one trusting another
//! CA, one expecting another name, and a plain client on the TLS port are refused with the
//! reason.

use std::path::PathBuf;
use std::time::Duration;

use ember_bench::redis_cluster::{LocalCluster, NodeTls};
use ember_tier::storage::remote::{Cluster, ClusterOptions};
#[path = "../shared/pki.rs"]
mod pki;
use pki::make_pki;

use crate::serve::remote_server;
use crate::server::tsv_rows;

fn connect(url: &str) -> Result<Cluster, String> {
    let mut o = ClusterOptions::parse(url).map_err(|e| e.to_string())?;
    o.timeout = Duration::from_secs(5);
    o.connect_timeout = Duration::from_secs(2);
    Cluster::connect(o).map_err(|e| e.to_string())
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn the_remote_tier_over_tls_scores_as_dram_and_refuses_the_wrong_clients() {
    let dir: PathBuf = std::env::temp_dir().join(format!("ember-redis-tls-{}", std::process::id()));
    make_pki(&dir);
    let f = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let tls = NodeTls {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        auth_clients: true,
    };
    let Some(c) = super::hold(|| LocalCluster::start_tls(3, 1, None, tls.clone())) else {
        return;
    };
    let base = c.tls_url().unwrap();
    let url = format!(
        "{base}?tls_ca={}&tls_cert={}&tls_key={}",
        f("ca.pem"),
        f("client.pem"),
        f("client.key")
    );

    // Refused, each saying why; nothing hangs (bounded by the connect timeout).
    let e = connect(&format!("{base}?tls_ca={}", f("ca.pem"))).unwrap_err();
    assert!(
        e.contains("requires a client certificate"),
        "no client certificate: {e}"
    );
    let e = connect(&format!(
        "{base}?tls_ca={}&tls_cert={}&tls_key={}",
        f("other-ca.pem"),
        f("client.pem"),
        f("client.key")
    ))
    .unwrap_err();
    assert!(e.contains("invalid peer certificate"), "another CA: {e}");
    let e = connect(&format!("{url}&tls_server_name=redis.example")).unwrap_err();
    assert!(e.contains("invalid peer certificate"), "another name: {e}");
    let plain_on_tls = base.replacen("rediss://", "redis://", 1);
    assert!(
        connect(&plain_on_tls).is_err(),
        "a plain client on the TLS ports"
    );
    let first_plain = c.nodes[0].addr();
    let e = connect(&format!(
        "rediss://{first_plain}?tls_ca={}&tls_cert={}&tls_key={}",
        f("ca.pem"),
        f("client.pem"),
        f("client.key")
    ))
    .unwrap_err();
    assert!(e.contains("TLS handshake"), "TLS to a plain port: {e}");

    // Pushed and served over TLS: the same scores as DRAM.
    let model = crate::default_model();
    crate::ok(&[
        "registry",
        "push",
        "--redis",
        &url,
        "--model",
        &model.to_string_lossy(),
    ]);
    let dram = crate::server::Server::start(&["--grpc", "off"]);
    let remote = remote_server(&url, &["--cache-mb", "1"]);
    let bodies: Vec<Vec<u8>> = (0..6).map(|seed| tsv_rows(16, 300 + seed)).collect();
    assert_eq!(
        crate::scores(&remote, &bodies),
        crate::scores(&dram, &bodies)
    );
    let metrics = remote
        .request("GET", "/metrics", "text/plain", b"")
        .unwrap()
        .1;
    let fetches = crate::server::metric_in(
        &metrics,
        "ember_remote_fetch_seconds_count{model=\"default\"}",
    );
    assert!(fetches > 0.0, "the rows came from the cluster: {metrics}");
    // Every connection was TLS: the seeds are the TLS ports, and the nodes' addresses came
    // from CLUSTER SLOTS asked over TLS (a plain port there would fail the handshake).
    drop(remote);
    let _ = std::fs::remove_dir_all(&dir);
}
