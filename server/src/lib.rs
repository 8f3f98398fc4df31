//! What kube-dispatch's servers, the dispatcher and the load balancer, share: the adapters
//! between the pure rules of [`kube_dispatch_core`] and the outside world. How they log, count
//! and answer probes is `kube-dispatch-telemetry`, which the controller SDK links too.
//!
//! | module | holds |
//! | --- | --- |
//! | [`client`] | the Kubernetes client, from `--kubeconfig` or the environment (kdctl's too) |
//! | [`signal`] | SIGTERM and SIGINT cancel a token that starts the drain |
//! | [`leases`] | the watch of dispatcher Leases, folded into [`kube_dispatch_core::leases::Observations`] |
//! | [`tls`] | TLS for the servers: certificate files read again when they change |
//! | [`auth`] | who is calling: bearer tokens verified by TokenReview, through a bounded cache |
//! | [`authz`] | what the caller may read: SubjectAccessReviews for `list` and `watch`, cached |
//! | [`bounds`] | the transport bounds of every gRPC server (connections, streams, calls without a credential, deadlines), and the count and log of their refusals |
//! | [`limits`] | the request rate of each identity, so one cannot starve the others |
//! | [`flags`] | the security flags every server takes, and what they turn into |
//!
//! A server's `main` starts with these:
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use kube_dispatch_server::{client, signal};
//! use tokio_util::sync::CancellationToken;
//!
//! kube_dispatch_telemetry::logging::init(false);
//! let client = client::from_kubeconfig(None).await?;
//! let shutdown = CancellationToken::new();
//! tokio::spawn(signal::cancel_on_signal(shutdown.clone()));
//! # drop(client);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod auth;
pub mod authz;
pub mod bounds;
pub mod client;
pub mod flags;
pub mod leases;
pub mod limits;
pub mod signal;
pub mod tls;
