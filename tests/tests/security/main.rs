//! Security and hostile callers: each identity gets what it may read and nothing more, and a
//! shared tier survives every tenant and attacker (`proto/kubedispatch/v1/security.md`).

mod flood;
mod hostile;
mod hostile_tenants;
mod security;

use std::sync::Arc;

use kube_dispatch_tests::{Cluster, TestResult};

/// The test cluster's CA, which signs the tier's serving certificates.
fn ca() -> std::path::PathBuf {
    Cluster::shared().dir().join("pki/ca.crt")
}

/// A TLS client of the tier that trusts the test CA, for tests that speak TLS themselves.
fn tls_connector() -> TestResult<tokio_rustls::TlsConnector> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca())? {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
