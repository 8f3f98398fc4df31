//! The admin endpoint every kube-dispatch server has on a port of its own: plaintext HTTP for
//! the kubelet's probes (which speak neither TLS with our CA nor gRPC with a token).
//!
//! | path | answers |
//! | --- | --- |
//! | `/healthz` | 200 `ok` while the process runs, its drain included, so a pod handing its work back is not restarted (liveness) |
//! | `/readyz` | 200 `ok` while the process does its job now, else 503 with the reason, such as `handover pending` (readiness) |
//! | `/metrics` | the process's metrics, OpenMetrics text ([`crate::metrics`]) |
//!
//! It answers with nothing but these: no object, key or identity (metric labels name groups,
//! dispatchers, reasons and outcomes), so it needs no token. Keep the port off any Service
//! that controllers use.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (more wait in the listen backlog),
//! each closed after [`CONNECTION_LIFETIME`].
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use kube_dispatch_runtime::admin::{self, Readiness};
//! use tokio_util::sync::CancellationToken;
//!
//! let readiness = Readiness::new("starting");
//! let metrics = kube_dispatch_runtime::metrics::Metrics::default();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9070").await?;
//! tokio::spawn(admin::serve(listener, readiness.clone(), metrics, CancellationToken::new()));
//! // ... once the process does its job:
//! readiness.ready();
//! # Ok(())
//! # }
//! ```

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    routing::get,
};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::{self, Metrics};

/// Most admin connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest an admin connection stays open (probes and scrapes take milliseconds).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// Whether the process does its job now, and if not, why. Cheap to clone; every clone sets and
/// reads the same state.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<watch::Sender<Status>>);

/// What `/readyz` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Doing its job.
    Ready,
    /// Not now, for this reason.
    NotReady(String),
}

impl Readiness {
    /// Not ready, for `reason`, until [`Readiness::ready`].
    pub fn new(reason: impl Into<String>) -> Self {
        Self(Arc::new(watch::Sender::new(Status::NotReady(
            reason.into(),
        ))))
    }

    /// Ready from now on.
    pub fn ready(&self) {
        self.set(Status::Ready);
    }

    /// Not ready from now on, for `reason`.
    pub fn not_ready(&self, reason: impl Into<String>) {
        self.set(Status::NotReady(reason.into()));
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.0.borrow().clone()
    }

    /// A receiver that sees every change from now on.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.0.subscribe()
    }

    fn set(&self, status: Status) {
        self.0.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new("starting")
    }
}

/// The admin routes, for callers that serve them themselves.
pub fn router(readiness: Readiness, metrics: Metrics) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
                        metrics.encode(),
                    )
                }
            }),
        )
}

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    match readiness.status() {
        Status::Ready => (StatusCode::OK, "ok\n".to_owned()),
        Status::NotReady(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// Serves the admin routes on `listener` until `stop`; the connections open then are closed.
pub async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let service = TowerToHyperService::new(router(readiness, metrics));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => return,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off a little, as a full
                    // backlog would.
                    warn!(%error, "admin endpoint cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (service, stop) = (service.clone(), stop.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = stop.cancelled() => {}
                served = tokio::time::timeout(CONNECTION_LIFETIME, connection) => {
                    if let Ok(Err(error)) = served {
                        debug!(%peer, %error, "admin connection failed");
                    }
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (status, body)
    }

    #[tokio::test]
    async fn probes_answer_as_the_process_is() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let readiness = Readiness::new("handover pending");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            readiness.clone(),
            Metrics::default(),
            stop.clone(),
        ));

        assert_eq!(get(address, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(
            get(address, "/readyz").await,
            (503, "not ready: handover pending\n".into())
        );
        readiness.ready();
        assert_eq!(get(address, "/readyz").await, (200, "ok\n".into()));
        readiness.not_ready("draining");
        assert_eq!(
            get(address, "/readyz").await,
            (503, "not ready: draining\n".into())
        );
        assert_eq!(get(address, "/healthz").await.0, 200);
        assert_eq!(get(address, "/metrics/keys").await.0, 404);
        let (status, text) = get(address, "/metrics").await;
        assert_eq!(status, 200);
        assert!(text.contains("process_resident_memory_bytes"), "{text}");

        stop.cancel();
        server.await.unwrap();
    }
}
