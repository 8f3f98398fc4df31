//! The load balancer's server: its configuration, and [`serve`], which wires the gRPC service
//! (`grpc`), leader election (`election`) and the tasks that feed the registry (`trackers`).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_dispatch_proto::v1::load_balancer_server::LoadBalancerServer;
use kube_dispatch_server::{
    auth::{AuthConfig, AuthLayer, Authentication, Authenticator, GroupOwners},
    bounds::{Connections, ServerLimits},
    tls::Transport,
};
use kube_dispatch_telemetry::{admin::Readiness, metrics::Metrics};
use kube_lease_manager::LeaseManagerError;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::{
    election::{Election, follow_leadership},
    grpc::Service,
    metrics::RegistryCollector,
    registry::Registry,
    trackers::{expire_replicas, track_dispatchers},
};

/// Everything a load balancer needs besides its client and listener.
#[derive(Clone, Debug)]
pub struct Config {
    /// This replica's address (`host:port`) as controllers reach it; also its identity in the
    /// leader election, so standbys can redirect to the leader.
    pub advertise_address: String,
    /// Namespace of the leader Lease and of the dispatcher Leases.
    pub namespace: String,
    /// Name of the leader Lease.
    pub lease_name: String,
    /// Leader Lease duration: a standby takes over this long after the leader stops renewing
    /// (at once when a leader that stops releases it).
    pub lease_duration: Duration,
    /// How long before its Lease expires the leader renews it.
    pub lease_grace: Duration,
    /// Extra time before a silent dispatcher is dropped (as the dispatchers use).
    pub dispatcher_grace: Duration,
    /// A replica whose registration stream ended is removed after this long.
    pub replica_grace: Duration,
    /// How long a load balancer that has just become the leader waits for the replicas to
    /// register again before it places any ([`Registry::settle`]).
    pub leader_settle: Duration,
    /// Most replicas registered at once.
    pub max_registrations: usize,
    /// Most replicas one identity may have registered at once.
    pub max_registrations_per_identity: usize,
    /// TLS, or plaintext (`--insecure`).
    pub transport: Transport,
    /// Connections, streams, calls without a credential and deadlines, held at the transport.
    pub server: ServerLimits,
    /// How callers are authenticated; `None` takes anonymous registrations
    /// (`--allow-anonymous`).
    pub authentication: Option<AuthConfig>,
    /// What the admin endpoint's `/readyz` answers: ready once serving (a standby serves too:
    /// it redirects to the leader), not ready from shutdown on.
    pub readiness: Readiness,
    /// Which groups are shared by several users (`--group-owner`); every other group is its
    /// user's own.
    pub group_owners: GroupOwners,
    /// The registry the load balancer's metrics join (`crate::metrics`), served on `/metrics`.
    pub metrics: Metrics,
}

/// A running load balancer's handles, for in-process callers (tests).
#[derive(Debug, Clone)]
pub struct Handles {
    /// The registry (meaningful while leading).
    pub registry: Arc<Registry>,
    /// Whether this replica leads.
    pub leading: watch::Receiver<bool>,
}

/// Why the load balancer could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Leader election could not start.
    #[error("cannot set up leader election on Lease {lease}: {source}")]
    Election {
        /// The Lease.
        lease: String,
        /// The cause.
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The serving certificate could not be loaded.
    #[error(transparent)]
    Tls(#[from] kube_dispatch_server::tls::TlsError),
}

/// Serves on `listener` until `shutdown`: takes part in leader election, tracks the dispatchers
/// and, while leading, places registered replicas. `started` receives the handles.
pub async fn serve(
    config: Config,
    client: Client,
    listener: TcpListener,
    shutdown: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Handles>>,
) -> Result<(), ServeError> {
    kube_dispatch_server::tls::warn_if_plaintext(&config.transport, "load balancer");
    // TCP_NODELAY is set on every connection: small frames must not wait for a delayed ACK.
    let refusals = config.metrics.refusals();
    let connections = Connections::new(config.server, refusals.clone());
    let incoming =
        kube_dispatch_server::tls::incoming(listener, &config.transport, connections.clone())?;
    let authentication = match &config.authentication {
        Some(auth) => Authentication::Required(Arc::new(Authenticator::new(
            // Reviews take their turns: a reconnect storm opens no connection per review.
            kube_dispatch_server::client::for_reviews(client.clone()),
            auth.clone(),
        ))),
        None => Authentication::Anonymous,
    };
    authentication.warn_if_anonymous("load balancer");
    let registry = Registry::new(
        config.max_registrations,
        config.max_registrations_per_identity,
        config.group_owners.clone(),
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let election = election(&config, &client);
    // The first reading of the Lease (creating it if missing) fails the start, as a bad
    // namespace or missing permission should.
    let manager = election
        .build()
        .await
        .map_err(|source| ServeError::Election {
            lease: config.lease_name.clone(),
            source,
        })?;
    let (elected_tx, elected) = watch::channel(false);
    let stop = CancellationToken::new();
    let election = tokio::spawn(election.run(manager, leases.clone(), elected_tx, stop.clone()));
    let (leading_tx, leading) = watch::channel(false);
    tokio::spawn(follow_leadership(
        elected,
        leading_tx,
        (registry.clone(), config.leader_settle),
        stop.clone(),
    ));
    tokio::spawn(track_dispatchers(
        leases.clone(),
        registry.clone(),
        config.dispatcher_grace,
        stop.clone(),
    ));
    tokio::spawn(expire_replicas(
        registry.clone(),
        config.replica_grace,
        stop.clone(),
    ));

    config
        .metrics
        .register_collector(RegistryCollector::new(registry.clone(), leading.clone()));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<LoadBalancerServer<Service>>().await;
    health.set_service_status("", ServingStatus::Serving).await;
    let service = Service {
        registry: registry.clone(),
        leading: leading.clone(),
        leases,
        lease_name: config.lease_name.clone(),
        identity: config.advertise_address.clone(),
        leader: tokio::sync::Mutex::new(None),
    };
    info!(address = %config.advertise_address, lease = %config.lease_name, namespace = %config.namespace, "load balancer serving");
    if let Some(started) = started {
        let _ = started.send(Handles { registry, leading });
    }
    config.readiness.ready();
    let result = config
        .server
        .server()
        .layer(AuthLayer::new(authentication, &config.server, refusals).vouching(connections))
        .add_service(health_service)
        .add_service(LoadBalancerServer::new(service))
        .serve_with_incoming_shutdown(incoming, async {
            shutdown.cancelled().await;
            info!("shutting down: releasing leadership");
            config.readiness.not_ready("shutting down");
            stop.cancel();
        })
        .await;
    stop.cancel();
    release_leadership(election).await;
    result?;
    Ok(())
}

/// The leader election `config` asks for, identified by the address this replica advertises.
fn election(config: &Config, client: &Client) -> Election {
    Election {
        client: client.clone(),
        lease: config.lease_name.clone(),
        namespace: config.namespace.clone(),
        identity: config.advertise_address.clone(),
        duration: config.lease_duration.as_secs().max(1),
        grace: config.lease_grace.as_secs().max(1),
    }
}

/// Waits (at most 5 s) for the election task, which releases the Lease once stopped: a
/// standby, which watches it, takes over then instead of when it would have expired.
async fn release_leadership(election: JoinHandle<Result<(), LeaseManagerError>>) {
    match tokio::time::timeout(Duration::from_secs(5), election).await {
        Ok(Ok(Ok(()))) => {
            info!("leader election ended (the Lease released if this replica held it)")
        }
        Ok(Ok(Err(e))) => {
            warn!(error = %e, "could not release the leader Lease; it expires by itself")
        }
        Ok(Err(e)) => warn!(error = %e, "leader election task failed"),
        Err(_) => warn!("releasing the leader Lease timed out; it expires by itself"),
    }
}
