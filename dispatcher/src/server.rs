//! The gRPC edge: sessions, long-polls and acks, turned into calls on groups. Every error is
//! converted to a `tonic::Status` here, with a message that tells the caller what to fix.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kube_dispatch_proto::{
    RequestKey,
    lease::ring_id,
    v1::{
        self, AckItem, AckRequest, AckResponse, CloseSessionRequest, CloseSessionResponse,
        OpenSessionRequest, OpenSessionResponse, PollRequest, PollResponse, ReconcileRequest,
        ack_item, dispatcher_server,
    },
};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{debug, info};

use crate::{
    discovery::{ResolveError, Resolver},
    group::{Group, SessionSlot},
    watch::{Subscriber, WatchError, Watches},
};
use kube_dispatch_core::{
    handover::Slice,
    queue::{Delivery, DeliveryId, Outcome, QueueConfig, SessionId},
    recent_deletions::RecentDeletionsConfig,
    subscription::{
        GroupSpec, InvalidRequest, OwnerKind, SubscriptionSpec, WatchKey, positive_duration,
        validate_open,
    },
};

/// Limits that protect the dispatcher from misbehaving clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most live sessions on this dispatcher.
    pub max_sessions: usize,
    /// Most live sessions per group.
    pub max_sessions_per_group: usize,
    /// Session ttl when the client asks for none.
    pub default_ttl: Duration,
    /// Bounds of a session ttl.
    pub min_ttl: Duration,
    /// Bounds of a session ttl.
    pub max_ttl: Duration,
    /// Longest a poll waits for work.
    pub max_poll_wait: Duration,
    /// Most requests one poll returns.
    pub max_poll_items: usize,
    /// Most acks in one request.
    pub max_acks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 10_000,
            max_sessions_per_group: 1_000,
            default_ttl: Duration::from_secs(10),
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(300),
            max_poll_wait: Duration::from_secs(5),
            max_poll_items: 1_000,
            max_acks: 10_000,
        }
    }
}

/// Settings of the dispatcher core.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This dispatcher's identity on the ring.
    pub identity: String,
    /// Client limits.
    pub limits: Limits,
    /// Queue behaviour of every group.
    pub queue: QueueConfig,
    /// Every key is resynced once per interval; zero disables resync.
    pub resync_interval: Duration,
    /// A group with no session is dropped (and its watches released) after this long.
    pub idle_group_grace: Duration,
    /// Every this long, each controller group whose queue changed logs a `queue status` line
    /// (keys known, ready, in flight, sessions); zero disables it.
    pub status_interval: Duration,
    /// Most deletions of keys owned by other dispatchers each group remembers, so a key that
    /// moves here is not lost if it was deleted in transit (`kube_dispatch_core::recent_deletions`); about
    /// 100 bytes each.
    pub max_recent_deletions: usize,
}

struct SessionRef {
    group: Arc<Group>,
    id: SessionId,
    slot: Arc<SessionSlot>,
}

struct GroupEntry {
    group: Arc<Group>,
    cancel: CancellationToken,
    empty_since: Option<Instant>,
}

/// Counters reported in logs and, later, metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Acks of deliveries that were not in flight.
    pub unknown_acks: AtomicU64,
    /// Sessions that expired.
    pub expired_sessions: AtomicU64,
}

/// The dispatcher's shared state, behind the gRPC service.
pub struct Core {
    settings: Settings,
    resolver: Resolver,
    watches: Arc<Watches>,
    groups: Mutex<HashMap<String, GroupEntry>>,
    sessions: Mutex<HashMap<String, SessionRef>>,
    next_session: AtomicU64,
    /// Counters.
    pub counters: Counters,
    /// The keys this dispatcher serves, from the membership task (or fixed).
    slice: watch::Receiver<Arc<Slice>>,
    /// What each group remembers of deletions of keys owned elsewhere.
    recent_deletions: RecentDeletionsConfig,
    /// The ring id this dispatcher has released (nothing moved away is in flight), for the
    /// membership task to publish.
    released: watch::Sender<Option<String>>,
    /// Set when draining begins: nothing more is handed out, acks are still taken.
    draining: CancellationToken,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("identity", &self.settings.identity)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// The core, with its housekeeping task (session expiry, handover, resync, idle groups)
    /// running until `shutdown`. It serves the keys of `slice` and publishes on `released` the
    /// ring it has released.
    pub fn spawn(
        settings: Settings,
        resolver: Resolver,
        watches: Arc<Watches>,
        slice: watch::Receiver<Arc<Slice>>,
        recent_deletions: RecentDeletionsConfig,
        released: watch::Sender<Option<String>>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let core = Arc::new(Self {
            settings,
            resolver,
            watches,
            groups: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            counters: Counters::default(),
            slice,
            recent_deletions,
            released,
            draining: CancellationToken::new(),
            shutdown,
        });
        tokio::spawn(housekeeping(core.clone()));
        core
    }

    fn groups(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupEntry>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionRef>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions().len()
    }

    /// Number of controller groups known (with sessions, or idle within their grace).
    pub fn group_count(&self) -> usize {
        self.groups().len()
    }

    /// Number of running watches against the API server.
    pub fn watch_count(&self) -> usize {
        self.watches.len()
    }

    /// Stops handing out keys; acks are still taken, so in-flight reconciles can finish.
    pub fn begin_drain(&self) {
        self.draining.cancel();
    }

    /// Number of deliveries in flight over all groups.
    pub fn in_flight(&self) -> usize {
        let groups: Vec<Arc<Group>> = self.groups().values().map(|e| e.group.clone()).collect();
        groups.iter().map(|g| g.in_flight()).sum()
    }

    /// The keys this dispatcher serves now.
    pub fn slice(&self) -> Arc<Slice> {
        self.slice.borrow().clone()
    }

    /// The slice as it changes.
    pub fn slices(&self) -> watch::Receiver<Arc<Slice>> {
        self.slice.clone()
    }

    /// How long peers remember deletions of keys they do not own
    /// (`kube_dispatch_core::recent_deletions`).
    pub fn recent_deletions_window(&self) -> std::time::Duration {
        self.recent_deletions.window
    }

    /// This dispatcher's identity on the ring.
    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    /// The controller group `name`, if known here.
    pub fn group(&self, name: &str) -> Option<Arc<Group>> {
        self.groups().get(name).map(|e| e.group.clone())
    }

    /// Closes every session, releasing in-flight keys; used when draining.
    pub fn close_all(&self) {
        let sessions: Vec<SessionRef> = self.sessions().drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.group.remove_session(s.id);
        }
    }

    fn lookup(
        &self,
        session_id: &str,
    ) -> Result<(Arc<Group>, SessionId, Arc<SessionSlot>), Status> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session_id) else {
            return Err(Status::not_found(format!(
                "session {session_id:?} is unknown or expired on dispatcher {}: open a new session",
                self.settings.identity
            )));
        };
        if !s.group.has_session(s.id) {
            // Replaced by a newer session of the same replica.
            sessions.remove(session_id);
            return Err(Status::failed_precondition(format!(
                "session {session_id:?} was replaced by a newer session of its replica: use that one or open a new session"
            )));
        }
        Ok((s.group.clone(), s.id, s.slot.clone()))
    }

    async fn resolve_spec(&self, req: &OpenSessionRequest) -> Result<GroupSpec, Status> {
        let mut subs = Vec::with_capacity(req.subscriptions.len());
        for sub in &req.subscriptions {
            let Some(r) = &sub.resource else {
                return Err(Status::invalid_argument(
                    "every subscription needs a resource",
                ));
            };
            let resource = self.resolver.resolve(r).await.map_err(|e| match e {
                ResolveError::NotFound(_) => Status::not_found(e.to_string()),
                ResolveError::Discovery { .. } => Status::unavailable(e.to_string()),
            })?;
            let namespace = if resource.namespaced {
                sub.namespace.clone()
            } else {
                String::new()
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
                owner: sub.owner.as_ref().map(|o| OwnerKind {
                    group: o.group.clone(),
                    version: o.version.clone(),
                    kind: o.kind.clone(),
                }),
            });
        }
        let spec = GroupSpec::new(subs);
        // Deletions found by a re-list are matched to the subscription by kind: one primary
        // subscription per kind keeps that unambiguous.
        let mut kinds: Vec<(&str, &str)> = spec
            .subscriptions
            .iter()
            .filter(|s| s.owner.is_none())
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
        if kinds.len() != before {
            return Err(Status::invalid_argument(
                "two subscriptions reconcile the same kind: merge them into one (one selector per kind), or map one of them to an owner",
            ));
        }
        Ok(spec)
    }

    /// Finds or creates the group for a new session of `replica`; returns it and whether it
    /// was created.
    fn group_for(
        &self,
        name: &str,
        replica: &str,
        spec: &GroupSpec,
    ) -> Result<(Arc<Group>, bool), Status> {
        let mut groups = self.groups();
        if let Some(entry) = groups.get(name) {
            if entry.group.spec == *spec {
                // A replica reopening replaces its session: it takes no new slot.
                if !entry.group.has_replica(replica)
                    && entry.group.session_count() >= self.settings.limits.max_sessions_per_group
                {
                    return Err(Status::resource_exhausted(format!(
                        "group {name:?} already has {} sessions on this dispatcher, the most allowed",
                        self.settings.limits.max_sessions_per_group
                    )));
                }
                return Ok((entry.group.clone(), false));
            }
            if entry.group.session_count() > 0 {
                return Err(Status::failed_precondition(format!(
                    "group {name:?} has live sessions with different subscriptions: every replica of a group must send the same subscriptions (or use another group name)"
                )));
            }
            // No session left: the new subscriptions replace the old ones.
            if let Some(old) = groups.remove(name) {
                self.release(&old);
            }
        }
        // Groups without sessions linger for their grace; bound them with the sessions, so a
        // client opening sessions under ever new group names cannot grow this map.
        if groups.len() >= self.settings.limits.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "dispatcher {} already holds {} controller groups (idle ones are kept for {:?}), the most allowed",
                self.settings.identity,
                groups.len(),
                self.settings.idle_group_grace
            )));
        }
        let cancel = self.shutdown.child_token();
        let group = Group::spawn(
            name.to_owned(),
            spec.clone(),
            self.settings.queue,
            self.recent_deletions,
            self.slice.clone(),
            cancel.clone(),
        );
        groups.insert(
            name.to_owned(),
            GroupEntry {
                group: group.clone(),
                cancel,
                empty_since: None,
            },
        );
        Ok((group, true))
    }

    fn release(&self, entry: &GroupEntry) {
        for sub in &entry.group.spec.subscriptions {
            self.watches.unsubscribe(&sub.watch, &entry.group.name);
        }
        entry.cancel.cancel();
    }

    async fn subscribe_all(&self, group: &Arc<Group>) -> Result<(), Status> {
        for sub in &group.spec.subscriptions {
            let subscriber = Subscriber {
                group: group.clone(),
                payload: sub.payload,
                owner: sub.owner.clone(),
            };
            if let Err(e) = self.watches.subscribe(&sub.watch, subscriber).await {
                if let Some(entry) = self.groups().remove(&group.name) {
                    self.release(&entry);
                }
                return Err(match &e {
                    WatchError::Rejected {
                        code: 400 | 422, ..
                    } => Status::invalid_argument(e.to_string()),
                    WatchError::Rejected {
                        code: 401 | 403, ..
                    } => Status::permission_denied(e.to_string()),
                    WatchError::Rejected { code: 404, .. } => Status::not_found(e.to_string()),
                    WatchError::Rejected { .. } => Status::failed_precondition(e.to_string()),
                    WatchError::ShuttingDown => Status::unavailable(e.to_string()),
                });
            }
        }
        Ok(())
    }

    fn to_wire(group: &Group, d: Delivery) -> ReconcileRequest {
        let key =
            RequestKey::parse(&d.key).unwrap_or_else(|_| RequestKey::new("", "", "", &*d.key));
        let version = group
            .spec
            .version_of(&key.group, &key.kind)
            .unwrap_or_default()
            .to_owned();
        ReconcileRequest {
            delivery_id: d.id,
            key: d.key.to_string(),
            object: Some(v1::ObjectKey {
                group: key.group,
                version,
                kind: key.kind,
                namespace: key.namespace,
                name: key.name,
            }),
            reason: d.reason as i32,
            resource_version: d.resource_version,
            uid: d.uid,
            object_json: d.body.map(|b| b.to_vec()).unwrap_or_default(),
            deleted: d.deleted,
            attempt: d.attempt,
        }
    }

    fn parse_acks(&self, acks: Vec<AckItem>) -> Result<Vec<(DeliveryId, Outcome)>, Status> {
        if acks.len() > self.settings.limits.max_acks {
            return Err(Status::resource_exhausted(format!(
                "{} acks in one request; at most {} are accepted",
                acks.len(),
                self.settings.limits.max_acks
            )));
        }
        acks.into_iter()
            .map(|a| {
                let outcome = match a.outcome {
                    None => {
                        return Err(Status::invalid_argument(format!(
                            "ack of delivery {} has no outcome: set success, failure or requeue",
                            a.delivery_id
                        )));
                    }
                    Some(ack_item::Outcome::Success(_)) => Outcome::Success,
                    Some(ack_item::Outcome::Failure(f)) => {
                        debug!(delivery = a.delivery_id, message = %f.message, "reconcile failed");
                        Outcome::Failure
                    }
                    Some(ack_item::Outcome::Requeue(r)) => {
                        let after = r
                            .after
                            .as_ref()
                            .ok_or_else(|| Status::invalid_argument("requeue.after must be set"))?;
                        Outcome::Requeue(
                            positive_duration("requeue.after", after).map_err(invalid)?,
                        )
                    }
                };
                Ok((a.delivery_id, outcome))
            })
            .collect()
    }

    /// Extends a session by its ttl.
    fn renew(&self, slot: &SessionSlot) {
        *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now() + slot.ttl;
    }

    /// Settles acks of a session; those not in flight are ignored, counted and logged.
    fn settle(
        &self,
        group: &Group,
        id: SessionId,
        session: &str,
        acks: Vec<(DeliveryId, Outcome)>,
    ) {
        if acks.is_empty() {
            return;
        }
        let unknown = group.ack(id, acks);
        if unknown > 0 {
            self.counters
                .unknown_acks
                .fetch_add(unknown as u64, Ordering::Relaxed);
            debug!(
                session,
                unknown, "acks of deliveries not in flight were ignored"
            );
        }
    }
}

fn invalid(e: InvalidRequest) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Expires sessions, trims queues to the slice and releases the ring, resyncs keys and drops
/// idle groups, four times a second and whenever the slice changes.
async fn housekeeping(core: Arc<Core>) {
    const TICK: Duration = Duration::from_millis(250);
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut slice_changes = Some(core.slice.clone());
    let mut status = QueueStatus::default();
    loop {
        let changed = async {
            match slice_changes.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let fixed = tokio::select! {
            () = core.shutdown.cancelled() => return,
            _ = ticker.tick() => false,
            changed = changed => !changed,
        };
        if fixed {
            // The slice's sender is gone (a fixed ring): ticks alone remain.
            slice_changes = None;
        }
        let now = Instant::now();
        let expired: Vec<(String, SessionRef)> = {
            let mut sessions = core.sessions();
            let ids: Vec<String> = sessions
                .iter()
                .filter(|(_, s)| {
                    *s.slot.expires_at.lock().unwrap_or_else(|e| e.into_inner()) <= now
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| sessions.remove(&id).map(|s| (id, s)))
                .collect()
        };
        for (id, s) in expired {
            core.counters
                .expired_sessions
                .fetch_add(1, Ordering::Relaxed);
            info!(session = %id, group = %s.group.name, replica = %s.slot.replica, "session expired: its in-flight keys go to other sessions");
            s.group.remove_session(s.id);
        }
        let groups: Vec<Arc<Group>> = {
            let mut groups = core.groups();
            let grace = core.settings.idle_group_grace;
            let mut idle = Vec::new();
            for (name, entry) in groups.iter_mut() {
                if entry.group.session_count() > 0 {
                    entry.empty_since = None;
                } else if let Some(since) = entry.empty_since {
                    if now.duration_since(since) >= grace {
                        idle.push(name.clone());
                    }
                } else {
                    entry.empty_since = Some(now);
                }
            }
            for name in idle {
                if let Some(entry) = groups.remove(&name) {
                    info!(group = %name, "dropping group: no session for {grace:?}");
                    core.release(&entry);
                }
            }
            groups.values().map(|e| e.group.clone()).collect()
        };
        release(&core, &groups);
        status.log(&groups, core.settings.status_interval, now);
        let interval = core.settings.resync_interval;
        if !interval.is_zero() {
            for group in groups {
                let (keys, _) = group.sizes();
                // Spread evenly: keys * tick / interval per tick, rounded up.
                let n = (keys as u128 * TICK.as_nanos()).div_ceil(interval.as_nanos().max(1));
                group.resync_batch(usize::try_from(n).unwrap_or(usize::MAX));
            }
        }
    }
}

/// The periodic `queue status` log lines: one per group whose figures changed since its last.
#[derive(Default)]
struct QueueStatus {
    last: Option<Instant>,
    /// (keys, ready, in flight, sessions) as last logged, per group; groups are bounded.
    logged: HashMap<String, (usize, usize, usize, usize)>,
}

impl QueueStatus {
    fn log(&mut self, groups: &[Arc<Group>], interval: Duration, now: Instant) {
        if interval.is_zero()
            || self
                .last
                .is_some_and(|at| now.duration_since(at) < interval)
        {
            return;
        }
        self.last = Some(now);
        self.logged
            .retain(|name, _| groups.iter().any(|g| &g.name == name));
        for group in groups {
            let (keys, ready) = group.sizes();
            let figures = (keys, ready, group.in_flight(), group.session_count());
            if self.logged.insert(group.name.clone(), figures) != Some(figures) {
                let (keys, ready, in_flight, sessions) = figures;
                info!(group = %group.name, keys, ready, in_flight, sessions, "queue status");
            }
        }
    }
}

/// Trims every group to the current slice and, once no key that moved away is in flight,
/// publishes the ring as released.
fn release(core: &Core, groups: &[Arc<Group>]) {
    let slice = core.slice();
    // Every group must be trimmed: no short-circuit.
    let moving = groups
        .iter()
        .fold(false, |moving, g| g.apply_slice() | moving);
    let released =
        (!moving && slice.ring.contains(&core.settings.identity)).then(|| ring_id(&slice.ring));
    core.released.send_if_modified(|current| {
        if *current == released {
            return false;
        }
        if let Some(id) = &released {
            info!(ring = %id, "released the ring: nothing that moved away is queued or in flight");
        }
        *current = released;
        true
    });
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct DispatcherService {
    core: Arc<Core>,
}

impl DispatcherService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

#[tonic::async_trait]
impl dispatcher_server::Dispatcher for DispatcherService {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let core = &self.core;
        if core.shutdown.is_cancelled() {
            return Err(Status::unavailable(
                "the dispatcher is draining: open the session on another dispatcher or retry",
            ));
        }
        let req = request.into_inner();
        validate_open(&req).map_err(invalid)?;
        let limits = core.settings.limits;
        let replacing = core
            .groups()
            .get(&req.group)
            .is_some_and(|e| e.group.has_replica(&req.replica_id));
        if !replacing && core.session_count() >= limits.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "dispatcher {} already holds {} sessions, the most allowed",
                core.settings.identity, limits.max_sessions
            )));
        }
        let ttl = match &req.ttl {
            Some(ttl) => positive_duration("ttl", ttl)
                .map_err(invalid)?
                .clamp(limits.min_ttl, limits.max_ttl),
            None => limits.default_ttl,
        };
        let spec = core.resolve_spec(&req).await?;
        let (group, created) = core.group_for(&req.group, &req.replica_id, &spec)?;
        if created {
            core.subscribe_all(&group).await?;
            // Keys can move here only on a ring from Leases: ask the peers what was deleted
            // of them before this group was served here.
            if core.recent_deletions.capacity > 0 {
                tokio::spawn(crate::peer::fetch_recent_deletions(
                    core.clone(),
                    group.clone(),
                ));
            }
        }
        let id = core.next_session.fetch_add(1, Ordering::Relaxed);
        let session_id = format!(
            "{}-{id}-{:016x}",
            core.settings.identity,
            rand::random::<u64>()
        );
        let (slot, replaced) = group.add_session(id, session_id.clone(), &req.replica_id, ttl);
        let mut sessions = core.sessions();
        for old in replaced {
            info!(session = %old.wire_id, replica = %req.replica_id, "session replaced by a newer one of its replica");
            sessions.remove(&old.wire_id);
        }
        sessions.insert(
            session_id.clone(),
            SessionRef {
                group: group.clone(),
                id,
                slot,
            },
        );
        drop(sessions);
        info!(session = %session_id, group = %req.group, replica = %req.replica_id, ?ttl, "session opened");
        Ok(Response::new(OpenSessionResponse {
            session_id,
            ttl: prost_types::Duration::try_from(ttl).ok(),
            dispatcher_id: core.settings.identity.clone(),
            max_reconcile_time: prost_types::Duration::try_from(
                core.settings.queue.max_reconcile_time,
            )
            .ok(),
        }))
    }

    async fn poll(&self, request: Request<PollRequest>) -> Result<Response<PollResponse>, Status> {
        let core = &self.core;
        let req = request.into_inner();
        let limits = core.settings.limits;
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
        let acks = core.parse_acks(req.acks)?;
        let (group, id, slot) = core.lookup(&req.session_id)?;
        let ttl = slot.ttl;
        let received = Instant::now();
        core.renew(&slot);
        // A waiting poll does not renew its session: never wait past half the ttl.
        let wait = wait.min(ttl / 2);
        core.settle(&group, id, &req.session_id, acks);
        let deadline = received + wait;
        // While draining, nothing new is handed out; the poll waits as usual, so replicas do
        // not spin, and their acks still settle what is in flight. `looked` is when the last
        // look at the queue began: the requests' reconcile time and the renewal below both
        // start no earlier.
        let mut looked = received;
        let take = || {
            if core.draining.is_cancelled() {
                Vec::new()
            } else {
                group.take(id, max)
            }
        };
        let mut requests = take();
        while requests.is_empty() {
            tokio::select! {
                () = slot.notify.notified() => {}
                () = tokio::time::sleep_until(deadline) => break,
                () = core.shutdown.cancelled() => break,
            }
            if !group.has_session(id) {
                return Err(Status::not_found(format!(
                    "session {:?} ended while polling: open a new session",
                    req.session_id
                )));
            }
            looked = Instant::now();
            requests = take();
        }
        if requests.is_empty() {
            looked = Instant::now();
        }
        // The replica counts its fencing deadline and the requests' deadlines from `held` after
        // it sent the poll: never later than the dispatcher's own start of either.
        let held = looked.duration_since(received);
        core.renew(&slot);
        let requests = requests
            .into_iter()
            .map(|d| Core::to_wire(&group, d))
            .collect();
        Ok(Response::new(PollResponse {
            requests,
            held: prost_types::Duration::try_from(held).ok(),
        }))
    }

    async fn ack(&self, request: Request<AckRequest>) -> Result<Response<AckResponse>, Status> {
        let core = &self.core;
        let req = request.into_inner();
        let acks = core.parse_acks(req.acks)?;
        let (group, id, slot) = core.lookup(&req.session_id)?;
        core.renew(&slot);
        core.settle(&group, id, &req.session_id, acks);
        Ok(Response::new(AckResponse {}))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let core = &self.core;
        let id = request.into_inner().session_id;
        let Some(s) = core.sessions().remove(&id) else {
            return Err(Status::not_found(format!(
                "session {id:?} is unknown or already closed"
            )));
        };
        info!(session = %id, group = %s.group.name, "session closed: its in-flight keys are released");
        s.group.remove_session(s.id);
        Ok(Response::new(CloseSessionResponse {}))
    }
}
