//! A kube-dispatch tier in a controller's test process: one dispatcher, served on a loopback
//! port against the API server a `kube::Client` talks to (a cluster made for tests, the API
//! server envtest runs), in plaintext and with timings short enough for tests. A controller's
//! test starts one, points its [`Controller`](https://docs.rs/kube-dispatch-controller) at it,
//! and runs as it would in a cluster:
//!
//! ```no_run
//! # async fn test() -> Result<(), Box<dyn std::error::Error>> {
//! use kube_dispatch_testing::Tier;
//!
//! let client = kube::Client::try_default().await?;
//! let tier = Tier::start(client.clone()).await?;
//! // Controller::<ConfigMap>::new(client, "my-controller")
//! //     .dispatchers(tier.dispatchers())
//! //     .credentials(tier.credentials())
//! //     .run(reconcile, error_policy, ctx)
//! // ... the test; dropping the tier stops it.
//! # drop(tier);
//! # Ok(())
//! # }
//! ```
//!
//! The dispatcher runs on the test's own runtime. It watches what the controllers that
//! connect subscribe to, in every namespace they ask for, and hands each key to one replica at
//! a time, as the dispatchers of a cluster do; its ring is itself alone, so it needs no Lease.

#![forbid(unsafe_code)]

use std::{net::SocketAddr, time::Duration};

use kube_dispatch_core::{
    backoff::Backoff,
    queue::{QueueConfig, pool::BodyPool},
};
use kube_dispatch_dispatcher::{
    config::{Limits, Membership, SecurityConfig, ServeConfig, ServerLimits, Settings},
    serve::{Handles, ServeError, serve},
};
use kube_dispatch_proto::credentials::Credentials;
use tokio::{sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// What fails a tier's start.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// No loopback port could be bound.
    #[error("cannot listen on a loopback port: {0}")]
    Listen(#[from] std::io::Error),
    /// The dispatcher stopped before it served.
    #[error("the dispatcher stopped before it served: {0}")]
    Stopped(String),
}

/// A dispatcher running in this process.
#[derive(Debug)]
pub struct Tier {
    addr: SocketAddr,
    handles: Handles,
    shutdown: CancellationToken,
    served: JoinHandle<Result<(), ServeError>>,
}

impl Tier {
    /// Starts a dispatcher with [`config`] against the API server of `client`, on a free
    /// loopback port, and returns once it serves.
    pub async fn start(client: kube::Client) -> Result<Self, TierError> {
        Self::start_with(client, config("dispatcher-0", &["dispatcher-0"])).await
    }

    /// Starts a dispatcher with `config`.
    pub async fn start_with(client: kube::Client, config: ServeConfig) -> Result<Self, TierError> {
        let listener = kube_dispatch_server::bounds::listen(([127, 0, 0, 1], 0).into())?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let (started, handles) = oneshot::channel();
        let served = tokio::spawn(serve(
            config,
            client,
            listener,
            shutdown.clone(),
            Some(started),
        ));
        match handles.await {
            Ok(handles) => Ok(Self {
                addr,
                handles,
                shutdown,
                served,
            }),
            Err(_) => Err(TierError::Stopped(match served.await {
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(())) => "it returned".to_owned(),
                Err(e) => e.to_string(),
            })),
        }
    }

    /// The dispatchers a controller polls: `Controller::dispatchers(tier.dispatchers())`.
    pub fn dispatchers(&self) -> Vec<String> {
        vec![self.addr.to_string()]
    }

    /// How a controller reaches them: plaintext, no token.
    pub fn credentials(&self) -> Credentials {
        Credentials::plaintext()
    }

    /// Where the dispatcher serves gRPC.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The dispatcher's groups, sessions and watches, for a test that looks inside.
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// Stops the dispatcher gracefully and waits until it has: sessions are told, and the
    /// watches end. Dropping the tier stops it too, without waiting.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let _ = (&mut self.served).await;
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A dispatcher's settings for tests: plaintext and anonymous, its ring `members` with
/// `identity` among them, sessions of 3 s by default and polls of at most 2 s, retries from
/// 100 ms to 5 s, reconciles of at most 30 s, no resync.
pub fn config(identity: &str, members: &[&str]) -> ServeConfig {
    ServeConfig {
        settings: Settings {
            identity: identity.to_owned(),
            limits: Limits {
                default_ttl: Duration::from_secs(3),
                max_ttl: Duration::from_secs(120),
                max_poll_wait: Duration::from_secs(2),
                ..Limits::default()
            },
            queue: QueueConfig {
                backoff: Backoff {
                    base: Duration::from_millis(100),
                    cap: Duration::from_secs(5),
                },
                max_reconcile_time: Duration::from_secs(30),
                body_budget: 16 * 1024 * 1024,
                memo_budget: 16 * 1024 * 1024,
                keep_delivered_bodies: false,
            },
            bodies: BodyPool::new(256 * 1024 * 1024),
            memos: BodyPool::new(32 * 1024 * 1024),
            resync_interval: Duration::ZERO,
            idle_group_grace: Duration::from_secs(30),
            status_interval: Duration::ZERO,
            max_recent_deletions: 65_536,
            group_owners: Default::default(),
        },
        membership: Membership::Fixed(members.iter().map(|m| (*m).to_owned()).collect()),
        ring_key: Default::default(),
        watch_grace: Duration::from_secs(5),
        list_mode: Default::default(),
        share_lists: true,
        protobuf: true,
        max_message_bytes: 4 * 1024 * 1024,
        // A test's clients connect from loopback, some a connection per session.
        server: ServerLimits {
            max_connections_per_peer: 1024,
            ..ServerLimits::default()
        },
        drain_timeout: Duration::from_secs(5),
        security: SecurityConfig::insecure(),
        readiness: Default::default(),
        metrics: Default::default(),
    }
}
