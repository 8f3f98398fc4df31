//! Runs a dispatcher: the watches, the group and session table and the gRPC server (with
//! grpc.health.v1 and server reflection on the same port), until shutdown, then drains. A
//! drain asked by an operator can be undone: the dispatcher then serves a new term, on the same
//! listener, as a process that starts.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use kube::Client;
use kube_dispatch_proto::{
    Ring,
    v1::{
        FILE_DESCRIPTOR_SET, dispatcher_server::DispatcherServer, operator_server::OperatorServer,
        peer_server::PeerServer,
    },
};
use kube_dispatch_server::{auth::AuthLayer, bounds::Connections};
use kube_dispatch_telemetry::admin::Readiness;
use tokio::{net::TcpListener, sync::watch};
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};
use tracing::info;

use crate::{
    config::{Membership, ServeConfig},
    grpc::{
        dispatcher::DispatcherService,
        operator::{DrainHandle, DrainState, OperatorService},
        peer::{PeerService, start_warm_up},
    },
    housekeeping,
    membership::{self, sessions::LeaseSessions},
    metrics::{GroupTableCollector, RingMetrics},
    security::Guard,
    table::GroupTable,
    watch::{
        discovery::Resolver,
        registry::{Listing, Watches},
        sharing::ListSharing,
    },
};
use kube_dispatch_core::{handover::Slice, recent_deletions::RecentDeletionsConfig};

mod drain;
mod incoming;

use drain::{Drain, drained};
use incoming::Incoming;

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
    /// The serving certificate could not be loaded.
    #[error(transparent)]
    Tls(#[from] kube_dispatch_server::tls::TlsError),
    /// This dispatcher's own identity could not be learned (SelfSubjectReview).
    #[error("cannot learn this dispatcher's own identity (SelfSubjectReview): {0}")]
    OwnIdentity(#[source] kube::Error),
}

/// A running dispatcher's handles, for callers that drive it in-process (tests, benches).
#[derive(Debug, Clone)]
pub struct Handles {
    /// The group and session table.
    pub groups: Arc<GroupTable>,
    /// What the dispatcher serves, as it changes.
    pub slice: watch::Receiver<Arc<Slice>>,
}

/// Serves on `listener` until `shutdown` is cancelled, then drains: health turns NOT_SERVING,
/// nothing more is handed out, in-flight reconciles get up to `drain_timeout` to be
/// acknowledged, the Lease is released (only if none is left in flight, so the others may take
/// over at once), every session is closed and long-polls return. The same drain runs earlier
/// when an operator asks for it (`kubedispatch.v1.Operator/Drain`); the server then keeps
/// serving health and the operator API, out of the ring, until `shutdown`, or until an operator
/// asks for the undrain (`Operator/Undrain`): the dispatcher then serves a new term, with a new
/// table, watches and membership, as a process that starts would, on the same listener.
/// `started` receives the first term's handles once serving.
pub async fn serve(
    config: ServeConfig,
    client: Client,
    listener: TcpListener,
    shutdown: CancellationToken,
    mut started: Option<tokio::sync::oneshot::Sender<Handles>>,
) -> Result<(), ServeError> {
    let guard = guard(&config, &client).await?;
    let local = listener.local_addr().ok();
    let connections = Connections::new(config.server, config.metrics.refusals());
    let incoming = Incoming::new(kube_dispatch_server::tls::incoming(
        listener,
        &config.security.transport,
        connections.clone(),
    )?);
    // Registered once for the process; every term reports through them.
    let process = Process {
        guard,
        connections,
        ring: RingMetrics::new(&config.metrics),
        lease_metrics: membership::LeaseMetrics::new(&config.metrics),
        tables: GroupTableCollector::default(),
        local,
    };
    config.metrics.register_collector(process.tables.clone());
    loop {
        let end = term(
            &config,
            &client,
            &process,
            &incoming,
            &shutdown,
            started.take(),
        )
        .await?;
        if end == TermEnd::Stopped {
            break;
        }
        info!("undrained: rejoining the ring as a process that starts");
    }
    info!("dispatcher stopped");
    Ok(())
}

/// What a dispatcher keeps from one term to the next: who may call it, its connection bounds,
/// the metrics registered once, and the address it listens on.
struct Process {
    guard: Arc<Guard>,
    connections: Arc<Connections>,
    ring: RingMetrics,
    lease_metrics: membership::LeaseMetrics,
    tables: GroupTableCollector,
    local: Option<std::net::SocketAddr>,
}

/// How a term ended.
#[derive(Debug, PartialEq, Eq)]
enum TermEnd {
    /// The process is shutting down.
    Stopped,
    /// Drained, then asked to rejoin: another term follows.
    Undrained,
}

/// One term of a dispatcher: its table, watches, membership and gRPC services, served on
/// `incoming` until shut down, or drained and then undrained.
async fn term(
    config: &ServeConfig,
    client: &Client,
    process: &Process,
    incoming: &Incoming,
    shutdown: &CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Handles>>,
) -> Result<TermEnd, ServeError> {
    let identity = config.settings.identity.clone();
    // Stops the groups and the watches, after the drain.
    let stop = CancellationToken::new();
    let members_stop = CancellationToken::new();
    let clean = Arc::new(AtomicBool::new(false));
    // However the term ends (an error included), the groups, the watches and the membership
    // task stop with it; the Lease is then left to expire unless the drain found nothing in
    // flight.
    let _stop_on_exit = (stop.clone().drop_guard(), members_stop.clone().drop_guard());
    let (groups, slice_rx, membership_task) =
        start_table(config, client, process, (&stop, &members_stop, &clean))?;
    let resolver = Resolver::new(client.clone());

    // The drain begins on shutdown, or earlier when asked through the operator API.
    let leave = shutdown.child_token();
    // Ends the term: cancelled by the shutdown, or by the undrain.
    let ending = shutdown.child_token();
    let (drain_state, drain_rx) = watch::channel(DrainState::Serving);
    let (health, health_service) =
        health(config, slice_rx.clone(), process.ring.clone(), &leave).await;
    let (reflection, dispatcher, peer, operator) = services(
        config,
        (&groups, resolver, &process.guard),
        DrainHandle {
            start: leave.clone(),
            state: drain_rx.clone(),
            leases: matches!(config.membership, Membership::Leases(_)),
            shutdown: shutdown.clone(),
            undrain: ending.clone(),
        },
    )?;

    info!(id = %identity, membership = ?config.membership, address = ?process.local, "dispatcher serving");
    if let Some(started) = started {
        let _ = started.send(Handles {
            groups: groups.clone(),
            slice: slice_rx,
        });
    }

    let timeout = config.drain_timeout;
    tokio::spawn(
        Drain {
            groups: groups.clone(),
            health: health.clone(),
            readiness: config.readiness.clone(),
            state: drain_state,
            timeout,
            clean,
            members_stop,
            membership_task,
        }
        .run(leave.clone(), stop.clone()),
    );
    let drained = drained(ending.clone(), drain_rx.clone());
    // Small gRPC frames (a poll's response, an ack) must not wait for the peer's delayed ACK:
    // `incoming` sets TCP_NODELAY (without it every long-poll response stalled about 40 ms on
    // loopback).
    let server = config
        .server
        .server()
        .layer(tower::util::MapResponseLayer::new(
            too_large_is_resource_exhausted::<tonic::body::Body>,
        ))
        .layer(
            AuthLayer::new(
                process.guard.authentication().clone(),
                &config.server,
                config.metrics.refusals(),
            )
            .vouching(process.connections.clone()),
        )
        .add_service(health_service)
        .add_service(reflection)
        .add_service(dispatcher)
        .add_service(peer)
        .add_service(operator)
        .serve_with_incoming_shutdown(incoming.stream(shutdown.clone()), drained);
    until_stopped(server, ending, timeout).await?;
    stop.cancel();
    Ok(if shutdown.is_cancelled() {
        TermEnd::Stopped
    } else {
        TermEnd::Undrained
    })
}

/// A term's group table, with what it serves as it changes, and its membership task: started,
/// the watches to stop with `stop`, the membership with `members_stop` (releasing the Lease
/// if `clean` says nothing was left in flight).
#[allow(clippy::type_complexity)]
fn start_table(
    config: &ServeConfig,
    client: &Client,
    process: &Process,
    (stop, members_stop, clean): (&CancellationToken, &CancellationToken, &Arc<AtomicBool>),
) -> Result<
    (
        Arc<GroupTable>,
        watch::Receiver<Arc<Slice>>,
        Option<tokio::task::JoinHandle<()>>,
    ),
    ServeError,
> {
    let initial = initial_slice(config, &config.settings.identity)?;
    let (slice_tx, slice_rx) = watch::channel(Arc::new(initial));
    let (released_tx, released_rx) = watch::channel(None);
    let (groups, lease_sessions) = group_table(config, client, slice_rx.clone(), released_tx, stop);
    process.tables.point_at(&groups);
    let membership_task = start_membership(
        config,
        (client.clone(), &groups),
        (slice_tx, released_rx),
        (lease_sessions, process.lease_metrics.clone()),
        members_stop.clone(),
        clean.clone(),
    );
    Ok((groups, slice_rx, membership_task))
}

/// grpc.health.v1: `kubedispatch.v1.Dispatcher` is SERVING until the drain (liveness); the
/// overall status "" is SERVING only while every key this dispatcher owns is served, so a
/// rolling update waits for each pod's handover before it moves on (readiness). Kept in step
/// with the handover, with the ring metrics, until `leave` (the drain then owns them).
async fn health(
    config: &ServeConfig,
    slice: watch::Receiver<Arc<Slice>>,
    ring: RingMetrics,
    leave: &CancellationToken,
) -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<DispatcherServer<DispatcherService>>()
        .await;
    tokio::spawn(report_handover(
        slice,
        health.clone(),
        config.readiness.clone(),
        ring,
        leave.clone(),
    ));
    (health, health_service)
}

/// Who may do what ([`Guard`]), with a warning where the settings say nobody is checked.
async fn guard(config: &ServeConfig, client: &Client) -> Result<Arc<Guard>, ServeError> {
    let guard = Guard::new(&config.security, client)
        .await
        .map_err(ServeError::OwnIdentity)?;
    kube_dispatch_server::tls::warn_if_plaintext(&config.security.transport, "dispatcher");
    guard.authentication().warn_if_anonymous("dispatcher");
    Ok(Arc::new(guard))
}

/// The dispatcher's gRPC services: reflection, and controllers' (`Dispatcher`), peers'
/// (`Peer`) and operators' (`Operator`, which can start the drain through `drain`).
#[allow(clippy::type_complexity)]
fn services(
    config: &ServeConfig,
    (groups, resolver, guard): (&Arc<GroupTable>, Resolver, &Arc<Guard>),
    drain: DrainHandle,
) -> Result<
    (
        ServerReflectionServer<impl ServerReflection>,
        DispatcherServer<DispatcherService>,
        PeerServer<PeerService>,
        OperatorServer<OperatorService>,
    ),
    ServeError,
> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let dispatcher = DispatcherServer::new(DispatcherService::new(
        groups.clone(),
        resolver,
        guard.clone(),
        config.metrics.refusals(),
    ))
    .max_decoding_message_size(config.max_message_bytes);
    let peer = PeerServer::new(PeerService::new(groups.clone(), guard.clone()))
        .max_decoding_message_size(config.max_message_bytes);
    let operator = OperatorServer::new(OperatorService::new(groups.clone(), guard.clone(), drain));
    Ok((reflection, dispatcher, peer, operator))
}

/// Runs `server` until it stops; once `ending` (shutdown, or the undrain), gives up on calls
/// still open when the drain's `timeout` and some slack (the Lease release is a request) have
/// passed.
async fn until_stopped(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    ending: CancellationToken,
    timeout: Duration,
) -> Result<(), ServeError> {
    let slack = Duration::from_secs(5);
    tokio::select! {
        result = server => result?,
        () = async {
            ending.cancelled().await;
            tokio::time::sleep(timeout + slack).await;
        } => {
            info!(?timeout, "calls still open past the drain's timeout: leaving them");
        }
    }
    Ok(())
}

/// The slice a dispatcher starts with: its place on a fixed ring (it must be a member), or,
/// with Leases, nothing served until the Leases have been read and the handover gate opens.
fn initial_slice(config: &ServeConfig, identity: &str) -> Result<Slice, ServeError> {
    Ok(match &config.membership {
        Membership::Fixed(members) => {
            if !members.iter().any(|m| m == identity) {
                return Err(ServeError::NotAMember {
                    id: identity.to_owned(),
                    members: members.clone(),
                });
            }
            Slice::fixed(identity, Ring::with_key(members.clone(), config.ring_key))
        }
        Membership::Leases(_) => Slice::fixed(
            identity,
            Ring::with_key([identity.to_owned()], config.ring_key),
        )
        .closed(),
    })
}

/// The group table and the sessions its Lease lists, with its metrics and housekeeping
/// started: its watches stop with `stop`.
fn group_table(
    config: &ServeConfig,
    client: &Client,
    slice: watch::Receiver<Arc<Slice>>,
    released: watch::Sender<Option<String>>,
    stop: &CancellationToken,
) -> (Arc<GroupTable>, Arc<LeaseSessions>) {
    let sharing = ListSharing::new(
        client.clone(),
        &config.settings.identity,
        config.security.peer_credentials.clone(),
        slice.clone(),
    );
    let listing = Listing {
        mode: config.list_mode,
        sharing: Some(sharing),
        share: config.share_lists,
        protobuf: config.protobuf,
    };
    let watches = Watches::new(
        client.clone(),
        slice.clone(),
        config.watch_grace,
        listing,
        stop.child_token(),
    );
    // Keys move only when the ring comes from Leases.
    let recent_deletions = match &config.membership {
        Membership::Fixed(_) => RecentDeletionsConfig::NONE,
        Membership::Leases(lease) => RecentDeletionsConfig {
            window: lease.transit_window(),
            capacity: config.settings.max_recent_deletions,
        },
    };
    // Sessions are listed on the Lease before they are handed keys; with a fixed ring there is
    // no Lease, and no member that dies.
    let lease_sessions = Arc::new(match &config.membership {
        Membership::Fixed(_) => LeaseSessions::unlimited(),
        Membership::Leases(lease) => LeaseSessions::new(lease.handover_bound),
    });
    let groups = GroupTable::new(
        config.settings.clone(),
        watches,
        slice,
        recent_deletions,
        released,
        lease_sessions.clone(),
        stop.child_token(),
    );
    tokio::spawn(housekeeping::run(groups.clone()));
    (groups, lease_sessions)
}

/// Starts the membership loop when the ring comes from Leases ([`membership::run`]); with a
/// fixed ring the slice never changes, and there is no task.
fn start_membership(
    config: &ServeConfig,
    (client, groups): (Client, &Arc<GroupTable>),
    (slice, released): (watch::Sender<Arc<Slice>>, watch::Receiver<Option<String>>),
    (lease_sessions, lease_metrics): (Arc<LeaseSessions>, membership::LeaseMetrics),
    stop: CancellationToken,
    clean: Arc<AtomicBool>,
) -> Option<tokio::task::JoinHandle<()>> {
    match config.membership.clone() {
        Membership::Fixed(_) => None,
        Membership::Leases(lease) => {
            let credentials = config.security.peer_credentials.clone();
            let warm = start_warm_up(groups.clone(), lease.warm_up, credentials, stop.clone());
            Some(tokio::spawn(membership::run(
                client,
                lease,
                config.ring_key,
                slice,
                released,
                lease_sessions,
                (stop, clean),
                lease_metrics,
                warm,
            )))
        }
    }
}

/// Keeps the overall health status, the admin endpoint's readiness and the ring metrics in
/// step with the handover until `shutdown` (the drain, which then owns them).
async fn report_handover(
    mut slice: watch::Receiver<Arc<Slice>>,
    health: tonic_health::server::HealthReporter,
    readiness: Readiness,
    mut ring: RingMetrics,
    shutdown: CancellationToken,
) {
    loop {
        let current = slice.borrow_and_update().clone();
        let settled = current.is_settled();
        // Once draining, the drain owns the status.
        if shutdown.is_cancelled() {
            ring.closed();
            return;
        }
        ring.observe(&current, std::time::Instant::now());
        if settled {
            readiness.ready();
            health.set_service_status("", ServingStatus::Serving).await;
        } else {
            readiness.not_ready("handover pending: keys that moved here are held");
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
        }
        tokio::select! {
            () = shutdown.cancelled() => {
                ring.closed();
                return;
            }
            changed = slice.changed() => if changed.is_err() {
                // A fixed slice: it stays as it is.
                shutdown.cancelled().await;
                ring.closed();
                return;
            },
        }
    }
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
