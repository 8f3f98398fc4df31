//! The controller-facing API (`proto/kubedispatch/v1/dispatcher.proto`): requests are validated
//! and turned into calls on [`GroupTable`], and every error into a `tonic::Status` with a message
//! that tells the caller what to fix.

use std::sync::Arc;

use kube_dispatch_core::{
    ack::{Acked, ack_outcomes},
    references::MAX_GROUP_FIELD_PATHS,
    subscription::{
        self, GroupSpec, InvalidRequest, OwnerKind, ResourceId, SubscriptionSpec, WatchKey,
        positive_duration, validate_open,
    },
};
use kube_dispatch_proto::{
    MAX_TRIGGER_KEYS, RequestKey, RingKey,
    v1::{
        self, AckItem, AckRequest, AckResponse, CloseSessionRequest, CloseSessionResponse,
        EndedSession, OpenSessionRequest, OpenSessionResponse, PollRequest, PollResponse,
        TriggerRequest, TriggerResponse, ack_item, dispatcher_server,
    },
};
use kube_dispatch_server::auth::Caller;
use kube_dispatch_telemetry::metrics::Refusals;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::{
    group::Group,
    security::Guard,
    table::{Client, GroupTable, SessionError},
    watch::{
        discovery::{ResolveError, Resolver},
        registry::WatchError,
    },
};

mod close;
mod wire;
use close::CLOSE_UNLISTED_WITHIN;
use wire::to_wire;

/// The gRPC service controllers call.
#[derive(Debug)]
pub struct DispatcherService {
    groups: Arc<GroupTable>,
    resolver: Resolver,
    guard: Arc<Guard>,
    /// Places for OpenSessions being served (`--max-opening-sessions`); one past them is
    /// refused at once.
    opening: Arc<tokio::sync::Semaphore>,
    refusals: Refusals,
}

/// Longest an OpenSession holds its place among `--max-opening-sessions`: one that takes
/// longer (a new group whose watches' first lists are slow) carries on without it.
const OPEN_PLACE_HOLD: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `open` holding `place` while it is quick: one still running after [`OPEN_PLACE_HOLD`]
/// (waiting on its watches' first lists) gives the place up and carries on, so slow lists (a
/// throttled API server) cannot hold every place.
async fn holding<T>(
    place: tokio::sync::OwnedSemaphorePermit,
    open: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(open);
    tokio::select! {
        done = &mut open => done,
        () = tokio::time::sleep(OPEN_PLACE_HOLD) => {
            drop(place);
            open.await
        }
    }
}

/// How long a replica refused at `--max-opening-sessions` (OpenSessions served at once) is told to wait before asking again
/// (`grpc-retry-pushback-ms`, gRPC's pushback); the SDKs add up to as much again at random.
pub const OPEN_RETRY_HINT: std::time::Duration = std::time::Duration::from_millis(500);

impl DispatcherService {
    /// A service over `groups`, resolving the resources sessions subscribe to with `resolver`
    /// and checking callers with `guard`, counting the opens it refuses in `refusals`.
    pub fn new(
        groups: Arc<GroupTable>,
        resolver: Resolver,
        guard: Arc<Guard>,
        refusals: Refusals,
    ) -> Self {
        let opening = groups.settings().limits.max_opening_sessions;
        Self {
            groups,
            resolver,
            guard,
            opening: Arc::new(tokio::sync::Semaphore::new(opening)),
            refusals,
        }
    }

    /// The answer to an OpenSession that opened `session_id` with `ttl`.
    fn opened(&self, session_id: String, ttl: std::time::Duration) -> OpenSessionResponse {
        let groups = &self.groups;
        let (dead_dispatchers, previous_process_died) = groups
            .lease_sessions()
            .named_dead()
            .for_replicas(groups.identity());
        OpenSessionResponse {
            session_id,
            ttl: prost_types::Duration::try_from(ttl).ok(),
            dispatcher_id: groups.identity().to_owned(),
            max_reconcile_time: prost_types::Duration::try_from(
                groups.settings().queue.max_reconcile_time,
            )
            .ok(),
            dispatcher_version: env!("CARGO_PKG_VERSION").to_owned(),
            capabilities: kube_dispatch_proto::capabilities::ALL
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
            dead_dispatchers,
            previous_process_died,
        }
    }

    /// A place to serve an OpenSession of `caller`, or the refusal that tells it when to ask
    /// again: RESOURCE_EXHAUSTED and a hint to retry after [`OPEN_RETRY_HINT`], which the SDKs
    /// honour with jitter. In a reconnect storm a replica asks again later rather than wait in
    /// a queue of opens (each of a new group waits for its watches' first lists).
    fn place_to_open(&self, caller: &Caller) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        self.opening.clone().try_acquire_owned().map_err(|_| {
            let max = self.groups.settings().limits.max_opening_sessions;
            self.refusals.refused(
                "opening",
                caller.name(),
                &format!("{max} OpenSessions were being served (--max-opening-sessions)"),
            );
            let refused = Status::resource_exhausted(format!(
                "{max} sessions are being opened on this dispatcher (--max-opening-sessions): ask again in {} ms",
                OPEN_RETRY_HINT.as_millis()
            ));
            kube_dispatch_proto::with_pushback(refused, OPEN_RETRY_HINT)
        })
    }

    /// The group of `session`, while its caller may still read what the group subscribes to (a
    /// cached decision, reviewed again once older than the recheck period); else the session
    /// is closed, so its in-flight keys go to sessions that may.
    async fn still_may_read(&self, session: &str, caller: &Caller) -> Result<Arc<Group>, Status> {
        let group = self.groups.group_of(session, caller).map_err(status)?;
        if let Err(denied) = self.guard.may_read(caller, &group.accesses).await {
            if denied.code() == tonic::Code::PermissionDenied {
                info!(%session, group = %group.id, user = caller.name(), reason = denied.message(), "access revoked: session closed");
                let _ = self.groups.close(session, caller);
            }
            return Err(denied);
        }
        Ok(group)
    }

    /// The resource `r` names, by discovery.
    async fn resolve(&self, r: &v1::ResourceRef) -> Result<ResourceId, Status> {
        self.resolver.resolve(r).await.map_err(|e| match e {
            ResolveError::NotFound(_) => Status::not_found(e.to_string()),
            ResolveError::Discovery { .. } => Status::unavailable(e.to_string()),
        })
    }

    /// The owner kind `o` names, namespaced or not as discovery says (NOT_FOUND, as for a
    /// subscription's resource, if discovery does not serve it: the group's keys would depend
    /// on when its first session opened). On a ring keyed by namespace a cluster-scoped owner's
    /// key has no namespace, so one dispatcher serves it, and it sees the children of its own
    /// namespaces only: the session is taken, as before, with a warning.
    async fn owner_kind(&self, o: &v1::ResourceRef) -> Result<OwnerKind, Status> {
        let namespaced = self.resolve(o).await?.namespaced;
        if !namespaced && self.groups.slice().ring.key() == RingKey::Namespace {
            warn!(
                owner = %format!("{}/{}", o.group, o.kind),
                "a cluster-scoped owner kind on a ring keyed by namespace: its owners hear only of children in the namespaces their dispatcher owns; run this controller on a ring keyed by name"
            );
        }
        Ok(OwnerKind {
            group: o.group.clone(),
            version: o.version.clone(),
            kind: o.kind.clone(),
            namespaced,
        })
    }

    /// The group's subscriptions, resolved by discovery.
    async fn resolve_spec(&self, req: &OpenSessionRequest) -> Result<GroupSpec, Status> {
        let mut subs = Vec::with_capacity(req.subscriptions.len());
        for (index, sub) in req.subscriptions.iter().enumerate() {
            let Some(r) = &sub.resource else {
                return Err(Status::invalid_argument(
                    "every subscription needs a resource",
                ));
            };
            let resource = self.resolve(r).await?;
            let namespace = if resource.namespaced {
                sub.namespace.clone()
            } else {
                String::new()
            };
            let named_by = match &sub.referenced_by {
                Some(refs) => Some(subscription::named_by(index, sub, refs).map_err(invalid)?),
                None => None,
            };
            subs.push(SubscriptionSpec {
                watch: WatchKey {
                    resource,
                    namespace,
                    label_selector: sub.label_selector.clone(),
                    field_selector: sub.field_selector.clone(),
                },
                payload: v1::PayloadMode::try_from(sub.payload)
                    .unwrap_or(v1::PayloadMode::Full)
                    .into(),
                owner: match &sub.owner {
                    Some(o) => Some(self.owner_kind(o).await?),
                    None => None,
                },
                named_by,
                changes_of: subscription::changes_of(index, sub).map_err(invalid)?,
            });
        }
        let spec = GroupSpec::new(subs);
        // Deletions found by a re-list are matched to the subscription by kind: one primary
        // subscription per kind keeps that unambiguous.
        let Some(kinds) = kinds_of(&spec, SubscriptionSpec::is_primary) else {
            return Err(Status::invalid_argument(
                "two subscriptions reconcile the same kind: merge them into one (one selector per kind), or map one of them to an owner",
            ));
        };
        // One referenced_by subscription per named kind (each keeps one view of what exists),
        // and a bounded number of paths to read from every object.
        if kinds_of(&spec, |s| s.named_by.is_some()).is_none() {
            return Err(Status::invalid_argument(
                "two referenced_by subscriptions name the same kind: merge their field paths into one",
            ));
        }
        let paths: usize = spec
            .subscriptions
            .iter()
            .filter_map(|s| s.named_by.as_ref())
            .map(|n| n.paths.len())
            .sum();
        if paths > MAX_GROUP_FIELD_PATHS {
            return Err(Status::invalid_argument(format!(
                "{paths} referenced_by field paths in one session; at most {MAX_GROUP_FIELD_PATHS} are accepted"
            )));
        }
        // References are read from the objects the group reconciles: the naming kind must be
        // one of them.
        for s in &spec.subscriptions {
            if let Some(n) = &s.named_by
                && kinds
                    .binary_search(&(n.group.as_str(), n.kind.as_str()))
                    .is_err()
            {
                return Err(Status::invalid_argument(format!(
                    "referenced_by names {}/{}, which no subscription of this session reconciles: add a subscription to it (without owner or referenced_by)",
                    n.group, n.kind
                )));
            }
        }
        Ok(spec)
    }

    /// Sessions a replica reports ended on dispatchers that died, for the Lease to carry: the
    /// full id is the proof, checked by the membership loop against what the dead dispatcher
    /// listed. Called once the caller's own session was found valid.
    fn ended_sessions(&self, ended: &[EndedSession]) {
        for ended in ended.iter().take(MAX_ENDED_SESSIONS) {
            if ended.dispatcher_id.len() <= MAX_ID_BYTES && ended.session_id.len() <= MAX_ID_BYTES {
                self.groups
                    .lease_sessions()
                    .report(&ended.dispatcher_id, &ended.session_id);
            }
        }
    }

    fn parse_acks(&self, acks: &[AckItem]) -> Result<Vec<Acked>, Status> {
        for a in acks {
            if let Some(ack_item::Outcome::Failure(f)) = &a.outcome {
                debug!(delivery = a.delivery_id, message = %f.message, "reconcile failed");
            }
        }
        ack_outcomes(acks, self.groups.settings().limits.max_acks).map_err(|e| match e {
            InvalidRequest::TooManyAcks { .. } => Status::resource_exhausted(e.to_string()),
            e => invalid(e),
        })
    }
}

fn invalid(e: InvalidRequest) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The status a refused session call gets.
fn status(e: SessionError) -> Status {
    let message = e.to_string();
    match e {
        SessionError::Draining => Status::unavailable(message),
        SessionError::TooManySessions { .. }
        | SessionError::TooManyGroupSessions { .. }
        | SessionError::TooManyGroups { .. }
        | SessionError::TooManyOfIdentity { .. } => Status::resource_exhausted(message),
        SessionError::SubscriptionsDiffer { .. }
        | SessionError::HeldInFlight { .. }
        | SessionError::Replaced { .. } => Status::failed_precondition(message),
        SessionError::Unknown { .. }
        | SessionError::EndedWhilePolling { .. }
        | SessionError::NotOpen { .. } => Status::not_found(message),
        SessionError::NotOwner(_)
        | SessionError::NotYours { .. }
        | SessionError::ReplicaOfAnother { .. } => Status::permission_denied(message),
        SessionError::Watch(e) => match e {
            WatchError::Rejected {
                code: 400 | 422, ..
            } => Status::invalid_argument(message),
            WatchError::Rejected {
                code: 401 | 403, ..
            } => Status::permission_denied(message),
            WatchError::Rejected { code: 404, .. } => Status::not_found(message),
            WatchError::Rejected { .. } => Status::failed_precondition(message),
            WatchError::ShuttingDown => Status::unavailable(message),
        },
    }
}

/// Most reports of ended sessions one call is read for (`PollRequest.ended_sessions`).
const MAX_ENDED_SESSIONS: usize = 16;

/// Longest dispatcher or session id an ended session is read with; longer ones name nothing
/// this tier made.
const MAX_ID_BYTES: usize = 256;

#[tonic::async_trait]
impl dispatcher_server::Dispatcher for DispatcherService {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let groups = &self.groups;
        // A draining dispatcher says so first, whatever the request.
        if groups.shutdown().is_cancelled() {
            return Err(status(SessionError::Draining));
        }
        let caller = Caller::of(&request);
        let req = request.into_inner();
        validate_open(&req).map_err(invalid)?;
        // Held until the open ends, given up on or not.
        let place = self.place_to_open(&caller)?;
        // Groups are scoped by identity: a listed group is refused to others before anything
        // is resolved or reviewed.
        let id = groups.group_id(&req.group, &caller).map_err(status)?;
        groups.admits(&id, &req.replica_id).map_err(status)?;
        let limits = groups.settings().limits;
        let ttl = match &req.ttl {
            Some(ttl) => positive_duration("ttl", ttl)
                .map_err(invalid)?
                .clamp(limits.min_ttl, limits.max_ttl),
            None => limits.default_ttl,
        };
        let spec = self.resolve_spec(&req).await?;
        self.guard
            .may_read(&caller, &crate::security::accesses(&spec))
            .await?;
        // Opened apart from this request: the call that makes a group subscribes it (waiting
        // for its watches' first lists) and then has it ask the peers for the deletions they
        // remember, and only that call does. A caller that gives up meanwhile (killed, timed
        // out, cut off) must not leave a group that never asks, which would lose every deletion
        // only the peers know of. The session of a caller that gave up is closed.
        let wanted = tokio_util::sync::CancellationToken::new();
        let gave_up = wanted.clone().drop_guard();
        let opening = tokio::spawn({
            let groups = groups.clone();
            let credentials = self.guard.peer_credentials.clone();
            let replica = req.replica_id.clone();
            let children_bodies = req
                .capabilities
                .iter()
                .any(|c| c == kube_dispatch_proto::capabilities::CHILDREN_BODIES);
            let name = req.client.clone();
            let (id, caller) = (id.clone(), caller.clone());
            async move {
                let client = Client {
                    name: &name,
                    children_bodies,
                };
                let open = groups.open(&id, &replica, client, &spec, ttl, &caller);
                let opened = holding(place, open).await?;
                // Keys can move here only on a ring from Leases: ask the peers what was deleted
                // of them before this group was served here.
                if opened.created && groups.recent_deletions().capacity > 0 {
                    tokio::spawn(super::peer::fetch_recent_deletions(
                        groups.clone(),
                        opened.group.clone(),
                        credentials,
                    ));
                }
                if wanted.is_cancelled() {
                    debug!(group = %id, replica, "the caller gave up while its session was opened: closed");
                    // Nothing was handed out on it: closing holds nothing back.
                    let _ = groups.close(&opened.session_id, &caller);
                }
                Ok::<_, SessionError>(opened)
            }
        });
        let opened = opening
            .await
            .map_err(|e| Status::internal(format!("opening the session failed: {e}")))?
            .map_err(status)?;
        gave_up.disarm();
        Ok(Response::new(self.opened(opened.session_id, ttl)))
    }

    async fn poll(&self, request: Request<PollRequest>) -> Result<Response<PollResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        self.still_may_read(&req.session_id, &caller).await?;
        let limits = self.groups.settings().limits;
        let wait = match &req.wait {
            Some(w) => positive_duration("wait", w)
                .map_err(invalid)?
                .min(limits.max_poll_wait),
            None => limits.max_poll_wait,
        };
        let max = match req.max_items {
            0 => limits.max_poll_items,
            n => usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(limits.max_poll_items),
        };
        let max_bytes = kube_dispatch_proto::answer_budget(req.max_bytes, limits.max_poll_bytes);
        let acks = self.parse_acks(&req.acks)?;
        self.ended_sessions(&req.ended_sessions);
        let polled = self
            .groups
            .poll(&req.session_id, &caller, acks, wait, max, max_bytes)
            .await
            .map_err(status)?;
        let requests = polled
            .deliveries
            .into_iter()
            .map(|(d, children)| to_wire(&polled.group, d, children))
            .collect();
        // Named as the poll saw them last, which it recorded as told to the session.
        let (dead_dispatchers, previous_process_died) =
            polled.named.for_replicas(self.groups.identity());
        Ok(Response::new(PollResponse {
            requests,
            held: prost_types::Duration::try_from(polled.held).ok(),
            dead_dispatchers,
            previous_process_died,
        }))
    }

    async fn ack(&self, request: Request<AckRequest>) -> Result<Response<AckResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        // An ack renews the session as a poll does, so it passes the same recheck: a replica
        // that only acks cannot keep a session its identity may no longer read.
        self.still_may_read(&req.session_id, &caller).await?;
        let acks = self.parse_acks(&req.acks)?;
        self.ended_sessions(&req.ended_sessions);
        self.groups
            .ack(&req.session_id, &caller, acks, req.stopping)
            .map_err(status)?;
        Ok(Response::new(AckResponse {}))
    }

    /// Answered once the Lease lists the session no more (`HANDOVER.md`, "Ending the wait for a
    /// member that died, by reports"): a replica told the close went through need not report
    /// the session should this dispatcher die. A close asked again, for a session no longer
    /// open here, is answered the same way, and a new process whose previous process listed it
    /// takes it as that session's report.
    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let caller = Caller::of(&request);
        let close = request.into_inner();
        let lease = self.groups.lease_sessions();
        let unlisting = match self.groups.close(&close.session_id, &caller) {
            Ok(unlisting) => unlisting,
            Err(e @ SessionError::NotOpen { .. }) => self.closed_before(&close, e)?,
            Err(e) => return Err(status(e)),
        };
        let session_id = &close.session_id;
        if let Some(made) = unlisting
            && tokio::time::timeout(CLOSE_UNLISTED_WITHIN, lease.unlisted(made))
                .await
                .is_err()
        {
            return Err(Status::unavailable(format!(
                "session {session_id} is closed, but this dispatcher's Lease may still list it: no write of the Lease went through within {CLOSE_UNLISTED_WITHIN:?}; close it again"
            )));
        }
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn trigger(
        &self,
        request: Request<TriggerRequest>,
    ) -> Result<Response<TriggerResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        if req.keys.len() > MAX_TRIGGER_KEYS {
            return Err(Status::resource_exhausted(format!(
                "{} keys in one trigger; at most {MAX_TRIGGER_KEYS} are accepted",
                req.keys.len()
            )));
        }
        let group = self.still_may_read(&req.session_id, &caller).await?;
        // Only keys of the kinds the group reconciles: a trigger reconciles an object, never
        // adds a kind.
        for key in &req.keys {
            let parsed =
                RequestKey::parse(key).map_err(|e| Status::invalid_argument(e.to_string()))?;
            if group.spec.version_of(&parsed.group, &parsed.kind).is_none() {
                return Err(Status::invalid_argument(format!(
                    "{key}: the group reconciles no {}/{}",
                    parsed.group, parsed.kind
                )));
            }
        }
        group.trigger(&req.keys, req.all).await;
        Ok(Response::new(TriggerResponse {}))
    }
}

/// The (group, kind) of the subscriptions of `spec` that `which` picks, sorted; `None` if two
/// name the same kind.
fn kinds_of(
    spec: &GroupSpec,
    which: impl Fn(&SubscriptionSpec) -> bool,
) -> Option<Vec<(&str, &str)>> {
    let mut kinds: Vec<(&str, &str)> = spec
        .subscriptions
        .iter()
        .filter(|s| which(s))
        .map(|s| {
            (
                s.watch.resource.group.as_str(),
                s.watch.resource.kind.as_str(),
            )
        })
        .collect();
    let before = kinds.len();
    kinds.sort_unstable();
    kinds.dedup();
    (kinds.len() == before).then_some(kinds)
}
