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
//! Probes answer under any load of idle or slow connections:
//!
//! - every connection is accepted at once, and one that has not sent its request head within
//!   [`HEAD_TIMEOUT`] is closed;
//! - at most [`MAX_CONNECTIONS`] are open at once; a new one past it closes the oldest (a probe
//!   sends its head within a millisecond of connecting, so only a flood of
//!   [`MAX_CONNECTIONS`] connections within that millisecond could push it out);
//! - each connection is closed after [`CONNECTION_LIFETIME`];
//! - scrapes encode the metrics one at a time off the async workers, so probes never wait
//!   behind them.
//!
//! Connections closed early count in `kube_dispatch_refused_total{bound="admin_connections"}`.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use kube_dispatch_telemetry::admin::{self, Readiness};
//! use tokio_util::sync::CancellationToken;
//!
//! let readiness = Readiness::new("starting");
//! let metrics = kube_dispatch_telemetry::metrics::Metrics::default();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9070").await?;
//! tokio::spawn(admin::serve(listener, readiness.clone(), metrics, CancellationToken::new()));
//! // ... once the process does its job:
//! readiness.ready();
//! # Ok(())
//! # }
//! ```

use std::{
    collections::VecDeque,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    routing::get,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::{self, Metrics};

/// Most admin connections open at once; a new one past it closes the oldest.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most admin connections open at once from one peer address; a new one past it closes that
/// peer's oldest, so one peer cannot push out the kubelet's probes or the scrapes.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;
/// Longest a connection may take to send its request head (each request's, kept-alive ones
/// included).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
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
    let scrapes = Arc::new(Semaphore::new(1));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
        .route(
            "/metrics",
            get(move || {
                let (metrics, scrapes) = (metrics.clone(), scrapes.clone());
                async move {
                    // One scrape encodes at a time, on a blocking thread: a slow or repeated
                    // scrape never holds up a probe.
                    let Ok(turn) = scrapes.acquire_owned().await else {
                        return Err(StatusCode::SERVICE_UNAVAILABLE);
                    };
                    // The turn ends with the encoding, even when the connection is closed
                    // under it.
                    let text = tokio::task::spawn_blocking(move || {
                        let _turn = turn;
                        metrics.encode()
                    })
                    .await
                    .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
                    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text))
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
    let refusals = metrics.refusals();
    let service = TowerToHyperService::new(router(readiness, metrics));
    // The open connections, oldest first, each with its peer and the token that closes it.
    let open: Arc<Mutex<VecDeque<(u64, IpAddr, CancellationToken)>>> = Arc::default();
    let mut next_id = 0u64;
    loop {
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
        let id = next_id;
        next_id += 1;
        let close = stop.child_token();
        {
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            let of_peer = open.iter().filter(|(_, p, _)| *p == peer.ip()).count();
            let evict = if of_peer >= MAX_CONNECTIONS_PER_PEER {
                open.iter().position(|(_, p, _)| *p == peer.ip())
            } else if open.len() >= MAX_CONNECTIONS {
                Some(0)
            } else {
                None
            };
            if let Some((_, _, oldest)) = evict.and_then(|at| open.remove(at)) {
                oldest.cancel();
                refusals.refused(
                    "admin_connections",
                    &peer.ip().to_string(),
                    "the admin endpoint is at its connection bound: the oldest was closed",
                );
            }
            open.push_back((id, peer.ip(), close.clone()));
        }
        let (service, open) = (service.clone(), open.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = close.cancelled() => {}
                served = tokio::time::timeout(CONNECTION_LIFETIME, connection) => {
                    if let Ok(Err(error)) = served {
                        debug!(%peer, %error, "admin connection failed");
                    }
                }
            }
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = open.iter().position(|(i, _, _)| *i == id) {
                open.remove(at);
            }
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

    /// Idle connections, slow ones that never finish their request head, and more of them than
    /// the endpoint holds: the probe still answers at once.
    #[tokio::test]
    async fn probes_answer_under_idle_and_slow_connections() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let metrics = Metrics::default();
        let server = tokio::spawn(serve(
            listener,
            Readiness::default(),
            metrics.clone(),
            stop.clone(),
        ));
        let mut held = Vec::new();
        for i in 0..MAX_CONNECTIONS + 100 {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            if i % 2 == 0 {
                // Slow: part of a head, never finished.
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost")
                    .await
                    .unwrap();
            }
            held.push(stream);
        }
        let asked = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(1), get(address, "/healthz")).await;
        assert_eq!(
            answer.expect("the probe answers within 1 s"),
            (200, "ok\n".into()),
            "after {:?}",
            asked.elapsed()
        );
        assert!(
            metrics.refusals().count("admin_connections") >= 100,
            "the oldest connections were closed past the bound"
        );
        // Idle connections are closed once their head is late: the newest one is idle.
        let mut first = held.pop().expect("connections were opened");
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(
            HEAD_TIMEOUT + Duration::from_secs(2),
            tokio::io::AsyncReadExt::read(&mut first, &mut byte),
        )
        .await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "an idle connection outlived the head timeout: {closed:?}"
        );
        stop.cancel();
        server.await.unwrap();
    }
}
