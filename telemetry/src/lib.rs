//! How kube-dispatch's binaries and its Rust controller SDK show what they do.
//!
//! | module | holds |
//! | --- | --- |
//! | [`logging`] | logs to stdout as text or JSON lines, filtered by `RUST_LOG`; OpenTelemetry traces over OTLP, and the `traceparent` that carries a trace from the dispatcher to the controller |
//! | [`metrics`] | the process's Prometheus registry, with the process metrics and the count of refusals in it |
//! | [`admin`] | the admin endpoint: `/metrics`, `/healthz` and `/readyz` over plaintext HTTP for scrapes and probes |
//!
//! The servers (the dispatcher and the load balancer) and kdctl also print [`version`]. The
//! rest of what the servers share is `kube-dispatch-server`; the SDK links only this crate.
//!
//! A binary's `main` starts with [`logging::init`]; the admin endpoint's set-up is in [`admin`].
//!
//! ```no_run
//! use kube_dispatch_telemetry::{logging, version};
//!
//! logging::init(false);
//! tracing::info!(version = version(), "starting");
//! ```

#![forbid(unsafe_code)]

pub mod admin;
pub mod logging;
pub mod metrics;

/// This build's version, as `--version` prints it: the release (the workspace's version) and,
/// when the build was told (`KD_GIT_COMMIT` at build time, which `deploy/image.sh` sets), the
/// commit it was built from.
pub fn version() -> &'static str {
    static VERSION: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| match option_env!("KD_GIT_COMMIT") {
            Some(commit) if !commit.is_empty() => {
                format!("{} (commit {commit})", env!("CARGO_PKG_VERSION"))
            }
            _ => env!("CARGO_PKG_VERSION").to_owned(),
        });
    &VERSION
}
