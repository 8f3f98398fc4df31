//! Runs a dispatcher: the watches, the core and the gRPC server (with grpc.health.v1 and server
//! reflection on the same port), until shutdown, then drains.

use std::{sync::Arc, time::Duration};

use kube::Client;
use kube_dispatch_proto::{
    Ring,
    v1::{FILE_DESCRIPTOR_SET, dispatcher_server::DispatcherServer},
};
use tokio::{net::TcpListener, sync::watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tracing::info;

use crate::{
    discovery::Resolver,
    server::{Core, DispatcherService, Settings},
    watch::Watches,
};

/// Everything a dispatcher needs besides its API-server client and its listener.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Core settings (identity, limits, queue, resync).
    pub settings: Settings,
    /// The ring members, this dispatcher among them.
    pub members: Vec<String>,
    /// A watch with no subscriber is stopped after this long.
    pub watch_grace: Duration,
    /// Largest request message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Longest the drain may take after shutdown begins.
    pub drain_timeout: Duration,
}

/// Why a dispatcher could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The identity is not on the ring.
    #[error("dispatcher id {id:?} is not among the ring members {members:?}")]
    NotAMember {
        /// This dispatcher's identity.
        id: String,
        /// The members given.
        members: Vec<String>,
    },
    /// The reflection service could not be built from the descriptors.
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A running dispatcher's handles, for callers that drive it in-process (tests, benches).
#[derive(Debug, Clone)]
pub struct Handles {
    /// The core.
    pub core: Arc<Core>,
    /// Changes the ring at run time.
    pub ring: Arc<watch::Sender<Arc<Ring>>>,
}

/// Serves on `listener` until `shutdown` is cancelled, then drains: health turns NOT_SERVING,
/// every session is closed (releasing its in-flight keys), long-polls return, and in-flight
/// calls get up to `drain_timeout` to finish. `started` receives the handles once serving.
pub async fn serve(
    config: ServeConfig,
    client: Client,
    listener: TcpListener,
    shutdown: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Handles>>,
) -> Result<(), ServeError> {
    let identity = config.settings.identity.clone();
    if !config.members.contains(&identity) {
        return Err(ServeError::NotAMember {
            id: identity,
            members: config.members,
        });
    }
    let (ring_tx, ring_rx) = watch::channel(Arc::new(Ring::new(config.members.clone())));
    let ring_tx = Arc::new(ring_tx);
    let watches = Watches::new(
        client.clone(),
        identity.clone(),
        ring_rx,
        config.watch_grace,
        shutdown.child_token(),
    );
    let core = Core::spawn(
        config.settings.clone(),
        Resolver::new(client),
        watches,
        shutdown.child_token(),
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<DispatcherServer<DispatcherService>>()
        .await;
    health.set_service_status("", ServingStatus::Serving).await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let dispatcher = DispatcherServer::new(DispatcherService::new(core.clone()))
        .max_decoding_message_size(config.max_message_bytes);

    let local = listener.local_addr().ok();
    info!(id = %identity, members = ?config.members, address = ?local, "dispatcher serving");
    if let Some(started) = started {
        let _ = started.send(Handles {
            core: core.clone(),
            ring: ring_tx,
        });
    }

    let drain = {
        let (core, health, shutdown) = (core.clone(), health.clone(), shutdown.clone());
        async move {
            shutdown.cancelled().await;
            info!("draining: health NOT_SERVING, closing sessions");
            health
                .set_not_serving::<DispatcherServer<DispatcherService>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            core.close_all();
        }
    };
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            too_large_is_resource_exhausted::<tonic::body::Body>,
        ))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(dispatcher)
        .serve_with_incoming_shutdown(incoming, drain);
    let timeout = config.drain_timeout;
    tokio::select! {
        result = server => result?,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(timeout).await;
        } => {
            info!(?timeout, "drain timed out; stopping with calls still open");
        }
    }
    info!("dispatcher stopped");
    Ok(())
}

/// tonic answers a request larger than the decoding limit with OUT_OF_RANGE; the gRPC status
/// codes document RESOURCE_EXHAUSTED for it (as grpc-go and grpc-java answer), and our clients
/// retry on neither. Rewrites that one answer so callers see the documented code.
fn too_large_is_resource_exhausted<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    let out_of_range = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"11");
    let too_large = headers.get("grpc-message").is_some_and(|v| {
        let m = v.as_bytes();
        m.windows(b"too%20large".len()).any(|w| w == b"too%20large")
            || m.windows(b"too large".len()).any(|w| w == b"too large")
    });
    if out_of_range && too_large {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("8"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use tonic::codegen::http::{HeaderValue, Response};

    use super::*;

    #[test]
    fn only_the_too_large_answer_is_rewritten() {
        let answer = |status: &'static str, message: &'static str| {
            let mut r = Response::new(());
            r.headers_mut()
                .insert("grpc-status", HeaderValue::from_static(status));
            r.headers_mut()
                .insert("grpc-message", HeaderValue::from_static(message));
            too_large_is_resource_exhausted(r).headers()["grpc-status"].clone()
        };
        assert_eq!(
            answer("11", "Error,%20decoded%20message%20length%20too%20large"),
            "8"
        );
        assert_eq!(answer("11", "duration out of range"), "11");
        assert_eq!(answer("3", "too large"), "3");
    }
}
