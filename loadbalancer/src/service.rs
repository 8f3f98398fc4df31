//! The load balancer: the gRPC service, leader election, and the tasks that feed the registry
//! (dispatchers from their Leases, expiry of replicas that went away).

use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use kube_dispatch_proto::v1::{
    Assignment, LeaveRequest, LeaveResponse, RegisterRequest,
    load_balancer_server::{LoadBalancer, LoadBalancerServer},
};
use kube_dispatch_runtime::{
    admin::Readiness,
    auth::{AuthConfig, AuthLayer, Authentication, Authenticator, Caller, GroupOwners},
    bounds::{Connections, ServerLimits},
    leases::LeaseWatch,
    metrics::Metrics,
    tls::Transport,
};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::{net::TcpListener, sync::watch};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tracing::{debug, info, warn};

use crate::{
    metrics::RegistryCollector,
    registry::{MAX_POLLED, RegisterError, Registry},
};

/// Longest group name or replica id accepted.
const MAX_ID_LEN: usize = 253;

/// Longest dispatcher address (`host:port`) of a registration that is read: a DNS name and a
/// port.
const MAX_ADDRESS_LEN: usize = 259;

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
    Tls(#[from] kube_dispatch_runtime::tls::TlsError),
}

struct Service {
    registry: Arc<Registry>,
    leading: watch::Receiver<bool>,
    leases: Api<Lease>,
    lease_name: String,
    identity: String,
    /// The leader as last read, and when: a standby reads the leader Lease at most once per
    /// [`LEADER_TTL`], however many replicas register with it (one read at a time).
    leader: tokio::sync::Mutex<Option<(String, Instant)>>,
}

/// How long a standby trusts the leader it read from the Lease.
const LEADER_TTL: Duration = Duration::from_secs(1);

type AssignmentStream = Pin<Box<dyn Stream<Item = Result<Assignment, Status>> + Send>>;

#[tonic::async_trait]
impl LoadBalancer for Service {
    type RegisterStream = AssignmentStream;

    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<Self::RegisterStream>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        check_ids(&req.group, &req.replica_id)?;
        if !*self.leading.borrow() {
            match self.leader().await? {
                Holder::Other(leader) => {
                    let redirect = Assignment {
                        leader,
                        ..Assignment::default()
                    };
                    return Ok(Response::new(
                        futures::stream::once(async { Ok(redirect) }).boxed(),
                    ));
                }
                // The Lease names this replica already and its election is about to say so:
                // turned away, the replica would back off for longer than that takes.
                Holder::Me => {
                    let mut leading = self.leading.clone();
                    let now_leading = tokio::time::timeout(LEADER_TTL, leading.wait_for(|l| *l));
                    if !matches!(now_leading.await, Ok(Ok(_))) {
                        return Err(no_leader());
                    }
                }
            }
        }
        let (assignment, guard) = self
            .registry
            .register(
                &req.group,
                &req.replica_id,
                caller.identity().map(|i| i.username.as_str()),
                &polled(req.dispatchers),
            )
            .map_err(|e| match e {
                RegisterError::Full(_) | RegisterError::FullForIdentity { .. } => {
                    Status::resource_exhausted(e.to_string())
                }
                RegisterError::NotOwner(_) | RegisterError::ReplicaOfAnother { .. } => {
                    Status::permission_denied(e.to_string())
                }
            })?;
        let mut leading = self.leading.clone();
        // The stream ends when this replica stops leading, or when the registration is dropped.
        // Nothing is sent before the replica is placed (generation 0, while the registry
        // settles): it keeps polling what it was assigned last.
        let stream = tokio_stream::wrappers::WatchStream::new(assignment)
            .filter(|a| futures::future::ready(a.generation > 0))
            .take_until(async move {
                let _ = leading.wait_for(|l| !*l).await;
            })
            .map(move |a| {
                let _registered = &guard;
                Ok(a)
            });
        Ok(Response::new(stream.boxed()))
    }

    async fn leave(
        &self,
        request: Request<LeaveRequest>,
    ) -> Result<Response<LeaveResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        check_ids(&req.group, &req.replica_id)?;
        if !*self.leading.borrow() {
            return Err(Status::failed_precondition(
                "this load balancer does not lead; the leader forgets the replica after its grace",
            ));
        }
        let removed = self
            .registry
            .leave(
                &req.group,
                &req.replica_id,
                caller.identity().map(|i| i.username.as_str()),
            )
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        Ok(Response::new(LeaveResponse { removed }))
    }
}

/// INVALID_ARGUMENT unless the group and the replica id are 1 to [`MAX_ID_LEN`] characters.
fn check_ids(group: &str, replica_id: &str) -> Result<(), Status> {
    for (field, value) in [("group", group), ("replica_id", replica_id)] {
        if value.is_empty() || value.len() > MAX_ID_LEN {
            return Err(Status::invalid_argument(format!(
                "{field} must be 1 to {MAX_ID_LEN} characters long"
            )));
        }
    }
    Ok(())
}

/// The dispatchers a registration says its replica polls, as far as they are read: the first
/// [`MAX_POLLED`] of at most [`MAX_ADDRESS_LEN`] bytes. A hint, so never a reason to refuse.
fn polled(dispatchers: Vec<String>) -> Vec<String> {
    dispatchers
        .into_iter()
        .filter(|d| d.len() <= MAX_ADDRESS_LEN)
        .take(MAX_POLLED)
        .collect()
}

impl Service {
    /// Who holds the leader Lease, read from it at most once per [`LEADER_TTL`] when another
    /// replica does.
    async fn leader(&self) -> Result<Holder, Status> {
        let mut cached = self.leader.lock().await;
        if let Some((leader, at)) = &*cached
            && at.elapsed() < LEADER_TTL
        {
            return Ok(Holder::Other(leader.clone()));
        }
        let holder = self.read_leader().await?;
        if let Holder::Other(leader) = &holder {
            *cached = Some((leader.clone(), Instant::now()));
        }
        Ok(holder)
    }

    /// Who holds the leader Lease, as it says now.
    async fn read_leader(&self) -> Result<Holder, Status> {
        let lease = self
            .leases
            .get_opt(&self.lease_name)
            .await
            .map_err(|e| Status::unavailable(format!("cannot read the leader Lease: {e}")))?;
        match lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
        {
            Some(holder) if holder == self.identity => Ok(Holder::Me),
            Some(holder) => Ok(Holder::Other(holder)),
            None => Err(no_leader()),
        }
    }
}

/// The holder of the leader Lease, as a replica that does not lead sees it.
enum Holder {
    /// Another replica, at this address.
    Other(String),
    /// This replica: its election has taken the Lease and is about to say so.
    Me,
}

fn no_leader() -> Status {
    Status::unavailable(
        "no load balancer leads right now; keep polling the dispatchers you have and retry",
    )
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
    kube_dispatch_runtime::tls::warn_if_plaintext(&config.transport, "load balancer");
    // TCP_NODELAY is set on every connection: small frames must not wait for a delayed ACK.
    let refusals = config.metrics.refusals();
    let incoming = kube_dispatch_runtime::tls::incoming(
        listener,
        &config.transport,
        Connections::new(config.server, refusals.clone()),
    )?;
    let authentication = match &config.authentication {
        Some(auth) => {
            Authentication::Required(Arc::new(Authenticator::new(client.clone(), auth.clone())))
        }
        None => Authentication::Anonymous,
    };
    authentication.warn_if_anonymous("load balancer");
    let registry = Registry::new(
        config.max_registrations,
        config.max_registrations_per_identity,
        config.group_owners.clone(),
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let election = Election {
        client: client.clone(),
        lease: config.lease_name.clone(),
        namespace: config.namespace.clone(),
        identity: config.advertise_address.clone(),
        duration: config.lease_duration.as_secs().max(1),
        grace: config.lease_grace.as_secs().max(1),
    };
    // The first reading of the Lease (creating it if missing) fails the start, as a bad
    // namespace or missing permission should.
    let manager = election.build().await?;
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
        .layer(AuthLayer::new(authentication, &config.server, refusals))
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
    // The election task releases the Lease on `stop`: a standby, which watches it, takes over
    // at once instead of when it would have expired.
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
    result?;
    Ok(())
}

/// The leader election on one Lease.
///
/// `kube-lease-manager` alone lets a standby sleep until the expiry it last read, however early
/// the leader gives the Lease up: a rolling update would leave controllers without a leading
/// load balancer for up to a whole `--lease-duration`. So every replica also watches the
/// Lease:
///
/// - a standby that sees it free (released by a stopping leader, or deleted) reads it again
///   with a fresh manager, which takes it at once;
/// - a leader that sees it free, held by another or deleted reads it (an event may predate its
///   own lock), and if it is not its own any more steps down and reads it again the same way
///   (it may take a free Lease back at once);
/// - a leader that cannot renew steps down once its last renewal seen is older than the Lease
///   duration less the grace, rather than lead on beside the standby that takes the Lease.
struct Election {
    client: Client,
    lease: String,
    namespace: String,
    identity: String,
    /// Lease duration and renewal grace, in whole seconds.
    duration: u64,
    grace: u64,
}

impl Election {
    async fn build(&self) -> Result<LeaseManager, ServeError> {
        LeaseManagerBuilder::new(self.client.clone(), &self.lease)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.duration)
            .with_grace(self.grace)
            .build()
            .await
            .map_err(|source| ServeError::Election {
                lease: self.lease.clone(),
                source,
            })
    }

    /// How long a renewal seen keeps this replica safely the leader: the Lease duration less
    /// the grace (the clock skew tolerated).
    fn held_for(&self) -> Duration {
        Duration::from_secs(self.duration.saturating_sub(self.grace).max(1))
    }

    /// Whether the Lease, read now, names this replica as its holder; also when it cannot be
    /// read (renewals decide then).
    async fn still_held(&self, leases: &Api<Lease>) -> bool {
        match leases.get_opt(&self.lease).await {
            Ok(lease) => {
                lease.and_then(|l| l.spec?.holder_identity).as_deref() == Some(&self.identity)
            }
            Err(_) => true,
        }
    }

    /// Elects until `stop`, mirroring whether this replica leads into `elected`, then releases
    /// the Lease if it holds it.
    async fn run(
        self,
        manager: LeaseManager,
        leases: Api<Lease>,
        elected: watch::Sender<bool>,
        stop: CancellationToken,
    ) -> Result<(), LeaseManagerError> {
        let mut seen = std::pin::pin!(lease_seen(leases.clone(), &self.lease));
        let mut manager = Some(manager);
        // Until when this replica, if it leads, holds the Lease for sure: the last renewal seen
        // (its own election's or the watch's) plus `held_for`.
        let mut held_until = Instant::now();
        // Failures in a row, for the pause before the next attempt.
        let mut failures = 0u32;
        loop {
            let current = match &manager {
                Some(current) => current,
                None => {
                    let built = tokio::select! {
                        () = stop.cancelled() => break,
                        built = self.build() => built,
                    };
                    match built {
                        Ok(fresh) => manager.insert(fresh),
                        Err(e) => {
                            warn!(error = %e, "cannot read the leader Lease; trying again");
                            failures += 1;
                            if pause(failures, false, &stop).await {
                                break;
                            }
                            continue;
                        }
                    }
                }
            };
            let leading = *elected.borrow();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                changed = current.changed() => match changed {
                    Ok(leads) => {
                        failures = 0;
                        if leads {
                            held_until = Instant::now() + self.held_for();
                        }
                        elected.send_replace(leads);
                    }
                    Err(e) => {
                        warn!(error = %e, lease = %self.lease, leading, "leader election failed; trying again");
                        failures += 1;
                        if leading && Instant::now() >= held_until {
                            warn!(lease = %self.lease, "no renewal of the leader Lease for longer than it is safe to lead: stepping down");
                            elected.send_replace(false);
                            manager = None;
                        } else if matches!(e, LeaseManagerError::NonexistentLease(_)) {
                            // Only a fresh manager creates it again.
                            manager = None;
                        }
                        // A leader retries well within its grace; a standby backs off.
                        if pause(failures, leading, &stop).await {
                            break;
                        }
                    }
                },
                Some(seen) = seen.next() => {
                    if leading {
                        if matches!(&seen, Seen::HeldBy(holder) if *holder == self.identity) {
                            held_until = Instant::now() + self.held_for();
                        } else if !self.still_held(&leases).await {
                            // Free, deleted, or taken: not this replica's any more (an event
                            // older than this replica's own lock is not trusted alone).
                            warn!(lease = %self.lease, ?seen, "the leader Lease is no longer this replica's: stepping down");
                            elected.send_replace(false);
                            manager = None;
                        }
                    } else if matches!(seen, Seen::Free | Seen::Deleted) {
                        // A fresh manager reads it (creating it again if it is gone) and takes
                        // a free Lease at once.
                        debug!(lease = %self.lease, ?seen, "the leader Lease is free: trying to take it now");
                        manager = None;
                    }
                }
            }
        }
        match manager {
            Some(manager) => manager.release().await,
            None => Ok(()),
        }
    }
}

/// Waits before election attempt number `failures` + 1: 1 s doubling to 30 s for a standby,
/// 1 s for a leader (well within its renewal grace); returns whether `stop` came first.
async fn pause(failures: u32, leading: bool, stop: &CancellationToken) -> bool {
    let wait = if leading {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(1 << (failures.clamp(1, 6) - 1)).min(Duration::from_secs(30))
    };
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

/// What the watch of the leader Lease shows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// Held by the identity it names (taken or renewed).
    HeldBy(String),
    /// No holder: the leader released it (or it was never taken).
    Free,
    /// Deleted: nobody can renew it, and a fresh manager creates it again.
    Deleted,
}

/// What the Lease `name` shows at each change; watch failures are logged and retried.
fn lease_seen(leases: Api<Lease>, name: &str) -> impl Stream<Item = Seen> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher::watcher(leases, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => Some(
                    lease
                        .spec
                        .and_then(|spec| spec.holder_identity)
                        .filter(|holder| !holder.is_empty())
                        .map_or(Seen::Free, Seen::HeldBy),
                ),
                Ok(watcher::Event::Delete(_)) => Some(Seen::Deleted),
                Ok(_) => None,
                Err(e) => {
                    warn!(error = %e, "cannot watch the leader Lease; a standby takes it over only when it expires");
                    None
                }
            }
        })
}

/// Mirrors the election result; on gaining leadership, settles for `settle` before placing
/// anyone ([`Registry::settle`]); on losing it, drops every registration.
async fn follow_leadership(
    mut elected: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
    (registry, settle): (Arc<Registry>, Duration),
    stop: CancellationToken,
) {
    let mut settled_at = None;
    loop {
        let now = *elected.borrow_and_update();
        if now != *leading.borrow() {
            if now {
                info!(
                    ?settle,
                    "leading: placing the replicas once they have registered again with the dispatchers they poll"
                );
                registry.settle();
                settled_at = Some(tokio::time::Instant::now() + settle);
            } else {
                warn!(
                    "not leading any more: dropping registrations, replicas re-register with the leader"
                );
                registry.clear();
                settled_at = None;
            }
            leading.send_replace(now);
        }
        tokio::select! {
            () = stop.cancelled() => break,
            changed = elected.changed() => if changed.is_err() { break },
            () = tokio::time::sleep_until(settled_at.unwrap_or_else(tokio::time::Instant::now)), if settled_at.is_some() => {
                settled_at = None;
                registry.settled();
            }
        }
    }
    registry.clear();
    leading.send_replace(false);
}

/// Keeps the registry's dispatchers equal to those with a live Lease and an address.
async fn track_dispatchers(
    leases: Api<Lease>,
    registry: Arc<Registry>,
    grace: Duration,
    stop: CancellationToken,
) {
    // Retried within a dispatcher's default renew period, so placement follows soon after a cut.
    let mut watch = LeaseWatch::new(leases, Duration::from_secs(3));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // The registry learns the dispatchers once the watch has listed: before, it knows none.
    let mut seen = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            more = watch.next() => if more { seen = true } else { return },
            _ = tick.tick() => {}
        }
        if !seen || watch.listing() {
            continue;
        }
        let live: BTreeMap<String, String> = watch
            .observations
            .live(Instant::now(), grace)
            .into_iter()
            .filter_map(|(name, peer)| peer.address.map(|a| (name, a)))
            .collect();
        registry.set_dispatchers(live);
    }
}

async fn expire_replicas(registry: Arc<Registry>, grace: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => registry.expire(Instant::now(), grace),
        }
    }
}
