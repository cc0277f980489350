//! TLS on both listeners (`ServeConfig::tls`), against a test CA made here (rcgen): real
//! clients (reqwest and tonic over rustls, and `curl` where it is on the PATH) score over
//! HTTPS and gRPC with TLS; clients that do not trust the CA, plain clients, clients that never
//! finish a handshake and (with a client CA) clients without a certificate, or with one from
//! another CA, are refused, and the server keeps serving; bad certificate and key files stop
//! the start with an error naming them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ember_serve::grpc::pb::{self, grpc_inference_service_client::GrpcInferenceServiceClient};
use ember_serve::{ServeConfig, Server, ServerError, TlsConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::common::{assert_close, config, direct, kserve_body, model, random_req, scores_of};

/// A CA, and PEM files of certificates it signed, in a directory of the test's own.
struct Pki {
    dir: PathBuf,
}

struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    Ca {
        cert_pem: cert.pem(),
        issuer: Issuer::new(p, key),
    }
}

/// A certificate for `names` signed by `ca`: (certificate PEM, key PEM).
fn leaf(ca: &Ca, names: &[&str]) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let p = CertificateParams::new(names).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// The test CA, a server certificate for localhost / 127.0.0.1, a client certificate of
    /// the same CA, and a client certificate of another CA.
    fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("ember-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca1 = ca("Ember test CA");
        let other = ca("Another CA");
        let (scert, skey) = leaf(&ca1, &["localhost", "127.0.0.1"]);
        let (ccert, ckey) = leaf(&ca1, &["client"]);
        let (rcert, rkey) = leaf(&other, &["rogue"]);
        for (name, pem) in [
            ("ca.pem", &ca1.cert_pem),
            ("server.pem", &scert),
            ("server.key", &skey),
            ("client.pem", &ccert),
            ("client.key", &ckey),
            ("rogue.pem", &rcert),
            ("rogue.key", &rkey),
            ("other-ca.pem", &other.cert_pem),
        ] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }

    fn tls(&self, client_ca: bool) -> TlsConfig {
        TlsConfig {
            cert: self.path("server.pem"),
            key: self.path("server.key"),
            client_ca: client_ca.then(|| self.path("ca.pem")),
        }
    }

    /// An HTTPS client trusting the test CA, showing `identity` (a certificate's file stem).
    fn https(&self, identity: Option<&str>) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&self.read("ca.pem")).unwrap();
        let mut b = reqwest::Client::builder()
            .add_root_certificate(ca)
            .tls_built_in_root_certs(false)
            .timeout(Duration::from_secs(20));
        if let Some(id) = identity {
            let mut pem = self.read(&format!("{id}.pem"));
            pem.extend(self.read(&format!("{id}.key")));
            b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    }

    /// A gRPC channel over TLS trusting the test CA, showing `identity`.
    async fn grpc(
        &self,
        addr: std::net::SocketAddr,
        identity: Option<&str>,
    ) -> Result<Channel, tonic::transport::Error> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.read("ca.pem")))
            .domain_name("localhost");
        if let Some(id) = identity {
            tls = tls.identity(Identity::from_pem(
                self.read(&format!("{id}.pem")),
                self.read(&format!("{id}.key")),
            ));
        }
        Channel::from_shared(format!("https://localhost:{}", addr.port()))
            .unwrap()
            .tls_config(tls)?
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_tls(tls: TlsConfig) -> Server {
    let mut cfg: ServeConfig = config();
    cfg.grpc = Some("127.0.0.1:0".parse().unwrap());
    cfg.tls = Some(tls);
    cfg.conn.header_timeout = Duration::from_millis(500);
    Server::start(model(), cfg).await.unwrap()
}

/// Scores a request over HTTPS with `client`; the scores equal the model's own.
async fn scores_over_https(client: &reqwest::Client, base: &str) -> reqwest::Result<()> {
    let m = model();
    let r = random_req(&m, 5, 11);
    let resp = client
        .post(format!("{base}/v2/models/default/infer"))
        .json(&kserve_body(&m, &r))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await?;
    assert_close(&scores_of(&v), &direct(&m, &r));
    Ok(())
}

async fn grpc_ready(ch: Channel) -> Result<bool, tonic::Status> {
    let mut c = GrpcInferenceServiceClient::new(ch);
    Ok(c.server_ready(pb::ServerReadyRequest {})
        .await?
        .into_inner()
        .ready)
}

/// Reads a connection to its end (bounded): what the server sent before it closed.
async fn read_to_close(tcp: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got))
        .await
        .expect("the server closed the connection in time")
        .ok();
    got
}

#[tokio::test]
async fn tls_serves_trusted_clients_and_refuses_the_rest() {
    let pki = Pki::new("server");
    let s = start_tls(pki.tls(false)).await;
    let base = format!("https://localhost:{}", s.addr().port());

    // HTTPS, HTTP/1.1 and HTTP/2 (ALPN), with scores equal to the model's.
    let client = pki.https(None);
    scores_over_https(&client, &base).await.unwrap();
    let resp = client
        .get(format!("{base}/v2/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (resp.status().as_u16(), resp.version()),
        (200, reqwest::Version::HTTP_2)
    );

    // A client that does not trust the CA fails its handshake.
    let untrusting = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let e = untrusting
        .get(format!("{base}/v2/health/ready"))
        .send()
        .await;
    assert!(e.is_err(), "a client without the CA was answered: {e:?}");

    // A plain HTTP client gets a 400 saying the port speaks TLS.
    let plain = format!("http://127.0.0.1:{}", s.addr().port());
    let resp = reqwest::get(format!("{plain}/v2/health/ready"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let said = resp.text().await.unwrap();
    assert!(said.contains("this port speaks TLS"), "{said}");

    // A connection that opens and never starts its handshake is closed after the header
    // timeout (500 ms here), as is one that starts it and stops halfway.
    for first in [&b""[..], &[0x16, 0x03, 0x01][..]] {
        let mut tcp = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
        tcp.write_all(first).await.unwrap();
        let t = std::time::Instant::now();
        assert!(read_to_close(&mut tcp).await.is_empty());
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
    }

    // gRPC with TLS; a plain gRPC client is refused.
    let g = s.grpc_addr().unwrap();
    assert!(grpc_ready(pki.grpc(g, None).await.unwrap()).await.unwrap());
    let plain = Channel::from_shared(format!("http://{g}"))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        assert!(
            grpc_ready(ch).await.is_err(),
            "a plain gRPC call was answered"
        );
    }

    // Still serving, after every refusal.
    scores_over_https(&pki.https(None), &base).await.unwrap();
    curl_checks(&pki, &base, false).await;
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_asks_every_client_for_a_certificate_of_its_ca() {
    let pki = Pki::new("mutual");
    let s = start_tls(pki.tls(true)).await;
    let base = format!("https://localhost:{}", s.addr().port());
    scores_over_https(&pki.https(Some("client")), &base)
        .await
        .unwrap();
    for who in [None, Some("rogue")] {
        let e = pki
            .https(who)
            .get(format!("{base}/v2/health/ready"))
            .send()
            .await;
        assert!(e.is_err(), "client {who:?} was answered: {e:?}");
    }
    let g = s.grpc_addr().unwrap();
    assert!(
        grpc_ready(pki.grpc(g, Some("client")).await.unwrap())
            .await
            .unwrap()
    );
    for who in [None, Some("rogue")] {
        // TLS 1.3 sends the client's certificate after the handshake it thinks is done: the
        // refusal may come at connect or at the first call.
        if let Ok(ch) = pki.grpc(g, who).await {
            assert!(
                grpc_ready(ch).await.is_err(),
                "gRPC client {who:?} was answered"
            );
        }
    }
    scores_over_https(&pki.https(Some("client")), &base)
        .await
        .unwrap();
    curl_checks(&pki, &base, true).await;
    s.shutdown().await.unwrap();
}

/// `curl` (a real client of its own TLS stack) against the server: trusted, it is answered over
/// HTTP/1.1 and HTTP/2; without the CA it fails verification (exit 60).
#[cfg(ember_curl)]
async fn curl_checks(pki: &Pki, base: &str, mutual: bool) {
    let (ca, base) = (pki.path("ca.pem"), base.to_string());
    let (cert, key) = (pki.path("client.pem"), pki.path("client.key"));
    // Off the runtime's thread: the server answers on it.
    tokio::task::spawn_blocking(move || curl_blocking(&ca, &cert, &key, &base, mutual))
        .await
        .unwrap();
}

#[cfg(ember_curl)]
fn curl_blocking(ca: &Path, cert: &Path, key: &Path, base: &str, mutual: bool) {
    let curl = |extra: &[&str]| {
        let mut c = std::process::Command::new("curl");
        c.args([
            "-sS",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
        ]);
        c.args(extra);
        c.arg(format!("{base}/v2/health/ready"));
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let mut trusted = vec!["--cacert", ca.to_str().unwrap()];
    if mutual {
        trusted.extend([
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ]);
    }
    let mut h1 = trusted.clone();
    h1.push("--http1.1");
    assert_eq!(curl(&h1), (Some(0), "200 1.1".to_string()));
    let mut h2 = trusted.clone();
    h2.push("--http2");
    let (code, said) = curl(&h2);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.starts_with("200 "), "{said}");
    assert_eq!(
        curl(&[]).0,
        Some(60),
        "curl without the CA must fail verification"
    );
    if mutual {
        let (code, said) = curl(&["--cacert", ca.to_str().unwrap()]);
        assert_ne!(
            (code, said.as_str()),
            (Some(0), "200 1.1"),
            "curl without a certificate was answered"
        );
    }
}

#[cfg(not(ember_curl))]
async fn curl_checks(_: &Pki, _: &str, _: bool) {}

#[tokio::test]
async fn bad_certificate_and_key_files_stop_the_start_naming_them() {
    let pki = Pki::new("bad");
    let other_key = pki.path("client.key");
    let missing = pki.path("missing.pem");
    let key_only = pki.path("server.key");
    let cases: [(TlsConfig, &[&str]); 4] = [
        (
            TlsConfig {
                cert: missing.clone(),
                ..pki.tls(false)
            },
            &["--tls-cert", "missing.pem"],
        ),
        (
            TlsConfig {
                cert: key_only.clone(),
                ..pki.tls(false)
            },
            &["--tls-cert", "server.key", "no PEM CERTIFICATE"],
        ),
        (
            TlsConfig {
                key: pki.path("ca.pem"),
                ..pki.tls(false)
            },
            &["--tls-key", "ca.pem", "no private key"],
        ),
        (
            TlsConfig {
                key: other_key,
                ..pki.tls(false)
            },
            &["client.key", "does not fit", "server.pem"],
        ),
    ];
    for (tls, words) in cases {
        let mut cfg = config();
        cfg.tls = Some(tls);
        let e = Server::start(model(), cfg).await.unwrap_err();
        assert!(matches!(e, ServerError::Tls(_)), "{e:?}");
        let said = e.to_string();
        for w in words {
            assert!(said.contains(w), "{said:?} does not say {w:?}");
        }
    }
}
