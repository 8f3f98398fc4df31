//! Components run on runtimes of their own, so a test can stop one gracefully or kill it the
//! way `kill -9` would: every task dropped at once, sockets closed, nothing cleaned up.

use std::{fmt::Display, future::Future, net::SocketAddr};

use kube::Client;
use tokio::{runtime::Runtime, sync::oneshot};
use tokio_util::sync::CancellationToken;

use crate::{Cluster, FixtureError};

/// Longest a graceful stop may take (a dispatcher's drain included) before the test fails.
pub const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Binds a listener at `address` (loopback) for a component to serve on, as the binaries do
/// (`kube_dispatch_server::bounds::bind`: its backlog included); returns it and its address.
pub fn bind(address: &str) -> Result<(std::net::TcpListener, SocketAddr), FixtureError> {
    let failed = |command: String, e: &dyn std::fmt::Display| FixtureError::Script {
        command,
        detail: e.to_string(),
    };
    let parsed: SocketAddr = address
        .parse()
        .map_err(|e| failed(format!("parse {address}"), &e))?;
    let listener = kube_dispatch_server::bounds::bind(parsed)
        .map_err(|e| failed(format!("bind {address}"), &e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| failed("local_addr".into(), &e))?;
    Ok((listener, addr))
}

/// How a component reaches the API server.
#[derive(Clone, Debug, Default)]
pub enum ApiAccess {
    /// Directly, as the admin.
    #[default]
    Admin,
    /// As the admin, through this proxy (a fault proxy in front of the API server).
    Via(SocketAddr),
    /// Directly, with this bearer token (an identity the API server's priority and fairness
    /// can hold back, which it never does to the admin).
    Token(String),
}

impl From<Option<SocketAddr>> for ApiAccess {
    fn from(proxy: Option<SocketAddr>) -> Self {
        proxy.map_or(Self::Admin, Self::Via)
    }
}

/// Runs a serving component named `name` on its own runtime: `serve` gets a client that
/// reaches the API server as `api` says, `listener`, the shutdown token and a sender for its
/// handles, which this returns once it serves.
pub async fn spawn_server<H, E, F, Fut>(
    name: &str,
    listener: std::net::TcpListener,
    api: impl Into<ApiAccess>,
    serve: F,
) -> Result<(Isolated, H), FixtureError>
where
    H: Send + 'static,
    E: Display,
    F: FnOnce(Client, tokio::net::TcpListener, CancellationToken, oneshot::Sender<H>) -> Fut
        + Send
        + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let label = name.to_owned();
    let api = api.into();
    let runner = Isolated::spawn(name, move |shutdown| async move {
        let client = match api {
            ApiAccess::Via(proxy) => Cluster::shared().client_via(proxy).await,
            ApiAccess::Admin => Cluster::shared().client().await,
            ApiAccess::Token(token) => Cluster::shared().client_with_token(&token, true).await,
        };
        let client = match client {
            Ok(c) => c,
            Err(e) => panic!("test {label} has no client: {e}"),
        };
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => panic!("test {label} cannot listen: {e}"),
        };
        if let Err(e) = serve(client, listener, shutdown, tx).await {
            panic!("test {label} failed: {e}");
        }
    })?;
    let handles = rx.await.map_err(|_| FixtureError::Script {
        command: format!("start {name}"),
        detail: "it stopped before serving".into(),
    })?;
    Ok((runner, handles))
}

/// A component running on its own runtime.
#[derive(Debug)]
pub struct Isolated {
    runtime: Option<Runtime>,
    shutdown: CancellationToken,
    done: Option<oneshot::Receiver<()>>,
}

impl Isolated {
    /// Runs `component(shutdown)` on a new one-thread runtime named `name`.
    pub fn spawn<F, Fut>(name: &str, component: F) -> Result<Self, FixtureError>
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(|e| FixtureError::Script {
                command: format!("runtime for {name}"),
                detail: e.to_string(),
            })?;
        let shutdown = CancellationToken::new();
        let (done_tx, done) = oneshot::channel();
        let token = shutdown.clone();
        runtime.spawn(async move {
            component(token).await;
            let _ = done_tx.send(());
        });
        Ok(Self {
            runtime: Some(runtime),
            shutdown,
            done: Some(done),
        })
    }

    /// The runtime, to run more on it.
    pub fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.runtime.as_ref().map(|r| r.handle().clone())
    }

    /// Signals a graceful stop and waits until the component has finished; fails the test if
    /// it has not within [`STOP_DEADLINE`].
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(done) = self.done.take() {
            tokio::time::timeout(STOP_DEADLINE, done)
                .await
                .unwrap_or_else(|_| {
                    panic!("a component did not stop within {STOP_DEADLINE:?} of being asked to")
                })
                .ok();
        }
    }

    /// Freezes it for `duration`, as `SIGSTOP` would: its only worker thread is blocked, so
    /// nothing of it runs, while its sockets stay open and peers see no error.
    pub fn freeze(&self, duration: std::time::Duration) {
        if let Some(runtime) = &self.runtime {
            runtime.spawn(async move { std::thread::sleep(duration) });
        }
    }

    /// Kills it: every task is dropped where it stands.
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
