//! Security and hostile callers: each identity gets what it may read and nothing more, and a
//! shared tier survives every tenant and attacker (`proto/kubedispatch/v1/security.md`).

mod flood;
mod hostile;
mod hostile_tenants;
mod security;

use kube_dispatch_tests::{Cluster, TestResult};

/// The test cluster's CA, which signs the tier's serving certificates.
fn ca() -> std::path::PathBuf {
    Cluster::shared().dir().join("pki/ca.crt")
}

/// A TLS client of the tier that trusts the test CA, for tests that speak TLS themselves.
fn tls_connector() -> TestResult<tokio_rustls::TlsConnector> {
    kube_dispatch_tests::flood::tls_connector(&ca())
}
