//! What kube-dispatch's binaries share at run time: the adapters between the pure rules of
//! [`kube_dispatch_core`] and the outside world.
//!
//! | module | holds |
//! | --- | --- |
//! | [`client`] | the Kubernetes client, from `--kubeconfig` or the environment |
//! | [`logging`] | logs to stdout as text or JSON lines, filtered by `RUST_LOG` |
//! | [`signal`] | SIGTERM and SIGINT cancel a token that starts the drain |
//! | [`leases`] | the watch of dispatcher Leases, folded into [`kube_dispatch_core::leases::Observations`] |
//! | [`tls`] | TLS for the servers: certificate files read again when they change |
//! | [`auth`] | who is calling: bearer tokens verified by TokenReview, through a bounded cache |
//! | [`authz`] | what the caller may read: SubjectAccessReviews for `list` and `watch`, cached |
//! | [`bounds`] | the transport bounds of every gRPC server (connections, streams, calls without a credential, deadlines), and the count and log of their refusals |
//! | [`limits`] | the request rate of each identity, so one cannot starve the others |
//! | [`flags`] | the security flags every server takes, and what they turn into |
//! | [`admin`] | the admin endpoint: `/metrics`, `/healthz` and `/readyz` over plaintext HTTP for scrapes and probes |
//! | [`metrics`] | the process's Prometheus registry, with the process metrics in it |
//!
//! A binary's `main` starts with these:
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use kube_dispatch_runtime::{client, logging, signal};
//! use tokio_util::sync::CancellationToken;
//!
//! logging::init(false);
//! let client = client::from_kubeconfig(None).await?;
//! let shutdown = CancellationToken::new();
//! tokio::spawn(signal::cancel_on_signal(shutdown.clone()));
//! # drop(client);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod authz;
pub mod bounds;
pub mod client;
pub mod flags;
pub mod leases;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod signal;
pub mod tls;

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
