//! A test CA and its certificates, made with rcgen, for the TLS tests of both test binaries
//! (`it/tls_cli.rs`, `remote/tls.rs`; each includes this file by `#[path]`: it is no test binary of its own).

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Writes into `dir`: ca.pem; server.pem / server.key (127.0.0.1, localhost), also the Redis
/// nodes' certificate; client.pem / client.key; other-ca.pem (a CA that signed nothing here).
pub fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let ca = |name: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = p.self_signed(&key).unwrap().pem();
        (pem, Issuer::new(p, key))
    };
    let (ca_pem, issuer) = ca("Ember test CA");
    let (other_pem, _) = ca("Another CA");
    std::fs::write(dir.join("ca.pem"), ca_pem).unwrap();
    std::fs::write(dir.join("other-ca.pem"), other_pem).unwrap();
    for (name, sans) in [
        ("server", vec!["127.0.0.1", "localhost"]),
        ("client", vec!["client"]),
    ] {
        let sans: Vec<String> = sans.into_iter().map(String::from).collect();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(sans)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}
