//! A [`super::LocalCluster`] whose nodes also speak TLS (`--tls-port`), with the cluster bus and
//! replication over TLS too (`tls-cluster`, `tls-replication`): clients that connect over TLS
//! learn the nodes' TLS ports from `CLUSTER SLOTS`. The harness itself keeps using each node's
//! plain port.

use std::path::PathBuf;

use anyhow::Result;

use super::LocalCluster;

/// The certificate files every node serves with (PEM), and whether clients must show one.
#[derive(Debug, Clone)]
pub struct NodeTls {
    /// The CA that signed the nodes' certificate and the clients' certificates.
    pub ca: PathBuf,
    /// The nodes' certificate (it must name 127.0.0.1) and key; also their client certificate
    /// on the cluster bus and for replication.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `tls-auth-clients yes` (every client shows a certificate the CA signed) or `optional`.
    pub auth_clients: bool,
}

impl NodeTls {
    /// The `redis-server` flags of a node with TLS on `tls_port`.
    pub(super) fn args(&self, tls_port: u16) -> Vec<String> {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        let auth = if self.auth_clients { "yes" } else { "optional" };
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path(&self.cert),
            "--tls-key-file",
            &path(&self.key),
            "--tls-ca-cert-file",
            &path(&self.ca),
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
            "--tls-auth-clients",
            auth,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

impl LocalCluster {
    /// [`LocalCluster::start_with_module`] with every node also serving TLS on a port of its
    /// own (`NodeTls`), the cluster bus and replication over TLS.
    pub fn start_tls(
        primaries: usize,
        replicas: usize,
        module: Option<&std::path::Path>,
        tls: NodeTls,
    ) -> Result<Self> {
        Self::start_full(primaries, replicas, 5000, module, &[], Some(tls))
    }

    /// `rediss://127.0.0.1:t1,...` naming every node's TLS port (no parameters: the caller adds
    /// `?tls_ca=...`); `None` without TLS.
    pub fn tls_url(&self) -> Option<String> {
        let ports: Option<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| n.tls_port.map(|p| format!("127.0.0.1:{p}")))
            .collect();
        Some(format!("rediss://{}", ports?.join(",")))
    }
}
