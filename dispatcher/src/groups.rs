//! The group and session table of a dispatcher: the controller groups known here, their
//! sessions, and what a session asks for (open, poll, ack, close), in domain terms. The gRPC
//! services (`crate::grpc`) turn the wire into these calls, and [`SessionError`] into a
//! `tonic::Status`; the housekeeping task (`crate::housekeeping`) expires sessions, drops idle
//! groups and releases the ring.
//!
//! One file past 600 lines, because the table is one idea: every call reads and changes the same
//! two maps, and a third of the file documents the errors a caller can get.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kube_dispatch_core::{
    handover::Slice,
    queue::{Delivery, DeliveryId, Outcome, SessionId},
    recent_deletions::RecentDeletionsConfig,
    subscription::GroupSpec,
};
use kube_dispatch_runtime::auth::{Caller, GroupId, NotOwner};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    config::Settings,
    group::{Group, SessionSlot},
    k8s::watches::{Subscriber, WatchError, Watches},
};

/// Why a session call was refused. Each message tells the caller what to do.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The dispatcher is draining and opens no session.
    #[error("the dispatcher is draining: open the session on another dispatcher or retry")]
    Draining,
    /// The dispatcher holds the most sessions allowed (`--max-sessions`).
    #[error("dispatcher {identity} already holds {max} sessions, the most allowed")]
    TooManySessions {
        /// This dispatcher.
        identity: String,
        /// The limit.
        max: usize,
    },
    /// The group holds the most sessions allowed here (`--max-sessions-per-group`).
    #[error("group {group:?} already has {max} sessions on this dispatcher, the most allowed")]
    TooManyGroupSessions {
        /// The group.
        group: String,
        /// The limit.
        max: usize,
    },
    /// The dispatcher holds as many groups as sessions are allowed (idle ones included).
    #[error(
        "dispatcher {identity} already holds {count} controller groups (idle ones are kept for {grace:?}), the most allowed"
    )]
    TooManyGroups {
        /// This dispatcher.
        identity: String,
        /// Groups held.
        count: usize,
        /// How long an idle group is kept.
        grace: Duration,
    },
    /// One identity holds the most sessions or groups it may hold here
    /// (`--max-sessions-per-identity`, `--max-groups-per-identity`).
    #[error(
        "{user} already holds {max} {what} on dispatcher {identity}, the most one identity may hold"
    )]
    TooManyOfIdentity {
        /// The caller.
        user: String,
        /// `sessions` or `controller groups (idle ones included)`.
        what: &'static str,
        /// The limit.
        max: usize,
        /// This dispatcher.
        identity: String,
    },
    /// Another replica of the group subscribed to something else.
    #[error(
        "group {group:?} has live sessions with different subscriptions: every replica of a group must send the same subscriptions (or use another group name)"
    )]
    SubscriptionsDiffer {
        /// The group.
        group: String,
    },
    /// A watch the group needs could not be started.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The session is not (or no longer) known here.
    #[error(
        "session {session:?} is unknown or expired on dispatcher {identity}: open a new session"
    )]
    Unknown {
        /// The session id given.
        session: String,
        /// This dispatcher.
        identity: String,
    },
    /// The replica opened a newer session, which replaced this one.
    #[error(
        "session {session:?} was replaced by a newer session of its replica: use that one or open a new session"
    )]
    Replaced {
        /// The session id given.
        session: String,
    },
    /// New subscriptions for a group whose last session ended with deliveries in flight.
    #[error(
        "group {group:?} still has deliveries in flight from a session that ended without acknowledging them: its subscriptions can change once they settle (within that session's ttl); retry then"
    )]
    HeldInFlight {
        /// The group.
        group: String,
    },
    /// The session expired or was replaced while its poll waited.
    #[error("session {session:?} ended while polling: open a new session")]
    EndedWhilePolling {
        /// The session id given.
        session: String,
    },
    /// A close of a session that is not open.
    #[error("session {session:?} is unknown or already closed")]
    NotOpen {
        /// The session id given.
        session: String,
    },
    /// The group is listed with `--group-owner` for other users
    /// (`proto/kubedispatch/v1/security.md`).
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
    /// In a group shared by several users (`--group-owner`), a replica id whose live session
    /// another user opened.
    #[error(
        "replica {replica:?} of group {group:?} has a live session opened by {holder}, not {caller}: give each replica an id of its own"
    )]
    ReplicaOfAnother {
        /// The group.
        group: String,
        /// The replica id.
        replica: String,
        /// The user whose session holds it.
        holder: String,
        /// The caller.
        caller: String,
    },
    /// The session was opened by another identity.
    #[error("session {session:?} was not opened by {caller}")]
    NotYours {
        /// The session id given.
        session: String,
        /// The caller.
        caller: String,
    },
}

/// A session just opened.
#[derive(Debug)]
pub struct Opened {
    /// Its id on the wire.
    pub session_id: String,
    /// Its group.
    pub group: Arc<Group>,
    /// Whether the group was created for it (its watches were just started).
    pub created: bool,
}

/// What a poll returns.
#[derive(Debug)]
pub struct Polled {
    /// The session's group.
    pub group: Arc<Group>,
    /// The keys handed out.
    pub deliveries: Vec<Delivery>,
    /// How long the dispatcher held the poll before its last look at the queue: the replica
    /// counts its deadlines from that long after it sent the poll (`controller-sdk` fencing).
    pub held: Duration,
}

/// Where a session id of the wire leads: its group, and its id there. The group holds the
/// session itself ([`Group::session`]).
pub(crate) struct SessionRef {
    pub(crate) group: Arc<Group>,
    pub(crate) id: SessionId,
}

pub(crate) struct GroupEntry {
    pub(crate) group: Arc<Group>,
    cancel: CancellationToken,
    empty_since: Option<Instant>,
    /// The user that created the group, whose limits it counts against; `None` when
    /// authentication is off.
    creator: Option<String>,
}

/// Counters of the whole table, kept past the groups they happened in: `expired_sessions` is
/// exported as `kube_dispatch_expired_sessions_total`; unknown acks are exported per group, by
/// the queue (`kube_dispatch_group_acks_total{outcome="unknown"}`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Acks of deliveries that were not in flight.
    pub unknown_acks: AtomicU64,
    /// Sessions that expired.
    pub expired_sessions: AtomicU64,
    /// Bytes of bodies dropped to share the body pool out.
    pub shed_body_bytes: AtomicU64,
}

/// The dispatcher's groups and sessions, shared by the gRPC services and the housekeeping task.
pub struct Groups {
    settings: Settings,
    watches: Arc<Watches>,
    groups: Mutex<HashMap<GroupId, GroupEntry>>,
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
    /// While the body pool is held in shares: until when (extended each time it is short).
    bodies_held_until: Mutex<Option<Instant>>,
    /// Set when draining begins: nothing more is handed out, acks are still taken.
    draining: CancellationToken,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups")
            .field("identity", &self.settings.identity)
            .finish_non_exhaustive()
    }
}

impl Groups {
    /// The table. It serves the keys of `slice`, publishes on `released` the ring it has
    /// released, and stops with `shutdown`; `crate::housekeeping` must run beside it (session
    /// expiry, handover, resync, idle groups).
    pub fn new(
        settings: Settings,
        watches: Arc<Watches>,
        slice: watch::Receiver<Arc<Slice>>,
        recent_deletions: RecentDeletionsConfig,
        released: watch::Sender<Option<String>>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            settings,
            watches,
            groups: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            counters: Counters::default(),
            slice,
            recent_deletions,
            released,
            bodies_held_until: Mutex::new(None),
            draining: CancellationToken::new(),
            shutdown,
        })
    }

    fn groups(&self) -> MutexGuard<'_, HashMap<GroupId, GroupEntry>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, SessionRef>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
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
        self.all().iter().map(|g| g.in_flight()).sum()
    }

    /// Each running watch's counters.
    pub fn watch_figures(&self) -> Vec<crate::k8s::watches::WatchFigures> {
        self.watches.figures()
    }

    /// Every group held here, idle ones included.
    pub fn all(&self) -> Vec<Arc<Group>> {
        self.groups().values().map(|e| e.group.clone()).collect()
    }

    /// The keys this dispatcher serves now.
    pub fn slice(&self) -> Arc<Slice> {
        self.slice.borrow().clone()
    }

    /// The slice as it changes.
    pub fn slices(&self) -> watch::Receiver<Arc<Slice>> {
        self.slice.clone()
    }

    /// What groups remember of deletions of keys they do not own
    /// (`kube_dispatch_core::recent_deletions`).
    pub fn recent_deletions(&self) -> RecentDeletionsConfig {
        self.recent_deletions
    }

    /// This dispatcher's identity on the ring.
    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    /// Cancelled when the dispatcher stops.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The controller group `id`, if known here.
    pub fn group(&self, id: &GroupId) -> Option<Arc<Group>> {
        self.groups().get(id).map(|e| e.group.clone())
    }

    /// Every group named `name`, whoever it belongs to.
    pub fn named(&self, name: &str) -> Vec<Arc<Group>> {
        self.groups()
            .iter()
            .filter(|(id, _)| id.name == name)
            .map(|(_, e)| e.group.clone())
            .collect()
    }

    /// The group `caller` means by `name` (its own, or one listed with `--group-owner` for it);
    /// PERMISSION_DENIED for a listed group `caller` is not listed for.
    pub fn group_id(&self, name: &str, caller: &Caller) -> Result<GroupId, SessionError> {
        Ok(self
            .settings
            .group_owners
            .group_id(name, caller.identity().map(|i| i.username.as_str()))?)
    }

    /// Closes every session, releasing in-flight keys; used when draining.
    pub fn close_all(&self) {
        let sessions: Vec<SessionRef> = self.sessions().drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.group.remove_session(s.id);
        }
    }

    /// Whether a new session of `replica` in `group` may be opened: not while draining, and
    /// not past `--max-sessions` (a replica reopening replaces its session and takes no new
    /// slot). Cheap: checked before the request's resources are resolved.
    pub fn admits(&self, group: &GroupId, replica: &str) -> Result<(), SessionError> {
        if self.shutdown.is_cancelled() {
            return Err(SessionError::Draining);
        }
        let replacing = self
            .groups()
            .get(group)
            .is_some_and(|e| e.group.has_replica(replica));
        let max = self.settings.limits.max_sessions;
        if !replacing && self.session_count() >= max {
            return Err(SessionError::TooManySessions {
                identity: self.settings.identity.clone(),
                max,
            });
        }
        Ok(())
    }

    /// Opens a session of `replica` in `group`, which subscribes to `spec`, with `ttl`: joins
    /// the group, or creates it and starts its watches (waiting for their first list). A
    /// session the replica had in the group is replaced.
    pub async fn open(
        &self,
        group: &GroupId,
        replica: &str,
        spec: &GroupSpec,
        ttl: Duration,
        caller: &Caller,
    ) -> Result<Opened, SessionError> {
        self.admits(group, replica)?;
        let (group, created) = self.group_for(group, replica, spec, caller)?;
        if created {
            self.subscribe_all(&group).await?;
        }
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let session_id = format!(
            "{}-{id}-{:016x}",
            self.settings.identity,
            rand::random::<u64>()
        );
        let user = caller.identity().map(|i| i.username.as_str());
        let (_, replaced) = group
            .add_session(id, session_id.clone(), replica, ttl, user)
            .map_err(|holder| SessionError::ReplicaOfAnother {
                group: group.id.name.clone(),
                replica: replica.to_owned(),
                holder,
                caller: caller.name().to_owned(),
            })?;
        let mut sessions = self.sessions();
        for old in replaced {
            info!(session = %old.wire_id, %replica, "session replaced by a newer one of its replica");
            sessions.remove(&old.wire_id);
        }
        sessions.insert(
            session_id.clone(),
            SessionRef {
                group: group.clone(),
                id,
            },
        );
        drop(sessions);
        info!(session = %session_id, group = %group.id, %replica, ?ttl, "session opened");
        Ok(Opened {
            session_id,
            group,
            created,
        })
    }

    /// Settles `acks` of `session`, then hands it up to `max` ready keys, waiting up to `wait`
    /// (never past half its ttl, since a waiting poll does not renew it) for one. While
    /// draining, nothing new is handed out; the poll waits as usual, so replicas do not spin.
    pub async fn poll(
        &self,
        session: &str,
        caller: &Caller,
        acks: Vec<(DeliveryId, Outcome)>,
        wait: Duration,
        max: usize,
        max_bytes: usize,
    ) -> Result<Polled, SessionError> {
        let (group, id, slot) = self.lookup(session, caller)?;
        let received = Instant::now();
        renew(&slot);
        let wait = wait.min(slot.ttl / 2);
        self.settle(&group, id, session, acks);
        let deadline = received + wait;
        // `looked` is when the last look at the queue began: the requests' reconcile time and
        // the renewal below both start no earlier.
        let mut looked = received;
        let take = || {
            if self.draining.is_cancelled() {
                Vec::new()
            } else {
                group.take(id, max, max_bytes)
            }
        };
        let mut deliveries = take();
        while deliveries.is_empty() {
            tokio::select! {
                () = slot.notify.notified() => {}
                () = tokio::time::sleep_until(deadline) => break,
                () = self.shutdown.cancelled() => break,
            }
            if !group.has_session(id) {
                return Err(SessionError::EndedWhilePolling {
                    session: session.to_owned(),
                });
            }
            looked = Instant::now();
            deliveries = take();
        }
        if deliveries.is_empty() {
            looked = Instant::now();
        }
        renew(&slot);
        Ok(Polled {
            group,
            deliveries,
            held: looked.duration_since(received),
        })
    }

    /// Settles `acks` of `session`, which renews it.
    pub fn ack(
        &self,
        session: &str,
        caller: &Caller,
        acks: Vec<(DeliveryId, Outcome)>,
    ) -> Result<(), SessionError> {
        let (group, id, slot) = self.lookup(session, caller)?;
        renew(&slot);
        self.settle(&group, id, session, acks);
        Ok(())
    }

    /// Closes `session`: what it has in flight goes to the group's other sessions at once.
    pub fn close(&self, session: &str, caller: &Caller) -> Result<(), SessionError> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session) else {
            return Err(SessionError::NotOpen {
                session: session.to_owned(),
            });
        };
        if let Some(slot) = s.group.session(s.id) {
            check_opener(&slot, session, caller)?;
        }
        let Some(s) = sessions.remove(session) else {
            return Err(SessionError::NotOpen {
                session: session.to_owned(),
            });
        };
        drop(sessions);
        info!(%session, group = %s.group.id, "session closed: its queued keys go to the others now, what it has in flight once it would have expired");
        s.group.close_session(s.id);
        Ok(())
    }

    /// The group of `session` if `caller` opened it, to check access before a poll.
    pub fn group_of(&self, session: &str, caller: &Caller) -> Result<Arc<Group>, SessionError> {
        Ok(self.lookup(session, caller)?.0)
    }

    fn lookup(
        &self,
        session: &str,
        caller: &Caller,
    ) -> Result<(Arc<Group>, SessionId, Arc<SessionSlot>), SessionError> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session) else {
            return Err(SessionError::Unknown {
                session: session.to_owned(),
                identity: self.settings.identity.clone(),
            });
        };
        let Some(slot) = s.group.session(s.id) else {
            // Replaced by a newer session of the same replica.
            sessions.remove(session);
            return Err(SessionError::Replaced {
                session: session.to_owned(),
            });
        };
        check_opener(&slot, session, caller)?;
        Ok((s.group.clone(), s.id, slot))
    }

    /// Finds or creates the group for a new session of `replica`; returns it and whether it
    /// was created.
    fn group_for(
        &self,
        id: &GroupId,
        replica: &str,
        spec: &GroupSpec,
        caller: &Caller,
    ) -> Result<(Arc<Group>, bool), SessionError> {
        let mut groups = self.groups();
        let user = caller.identity().map(|i| i.username.clone());
        let existing = groups.get(id);
        // A replica reopening replaces its session: it takes no new slot.
        let replacing = existing.is_some_and(|e| e.group.has_replica(replica));
        if let Some(user) = &user {
            // A group re-created with new subscriptions replaces one of the same owner.
            self.check_identity_limits(&groups, user, existing.is_none(), replacing)?;
        }
        if let Some(entry) = existing {
            if entry.group.spec == *spec {
                let max = self.settings.limits.max_sessions_per_group;
                if !replacing && entry.group.session_count() >= max {
                    return Err(SessionError::TooManyGroupSessions {
                        group: id.name.clone(),
                        max,
                    });
                }
                return Ok((entry.group.clone(), false));
            }
            if entry.group.session_count() > 0 {
                return Err(SessionError::SubscriptionsDiffer {
                    group: id.name.clone(),
                });
            }
            // Deliveries of a session that was closed or replaced may still run: a group
            // made anew would hand their keys out again at once.
            if entry.group.in_flight() > 0 {
                return Err(SessionError::HeldInFlight {
                    group: id.name.clone(),
                });
            }
            // No session left: the new subscriptions replace the old ones.
            if let Some(old) = groups.remove(id) {
                self.release(&old);
            }
        }
        // Groups without sessions linger for their grace; bound them with the sessions, so a
        // client opening sessions under ever new group names cannot grow this map.
        if groups.len() >= self.settings.limits.max_sessions {
            return Err(SessionError::TooManyGroups {
                identity: self.settings.identity.clone(),
                count: groups.len(),
                grace: self.settings.idle_group_grace,
            });
        }
        let cancel = self.shutdown.child_token();
        let group = Group::spawn(
            id.clone(),
            spec.clone(),
            self.settings.queue,
            self.settings.bodies.clone(),
            self.recent_deletions,
            self.slice.clone(),
            cancel.clone(),
        );
        groups.insert(
            id.clone(),
            GroupEntry {
                group: group.clone(),
                cancel,
                empty_since: None,
                creator: user,
            },
        );
        Ok((group, true))
    }

    /// Whether `user` may take one more session (unless `replacing` its own), and one more
    /// group when `creating` one. Counted over the groups `user` owns: at most
    /// `--max-sessions` groups, so a scan costs microseconds, and no count can drift from the
    /// table.
    fn check_identity_limits(
        &self,
        groups: &HashMap<GroupId, GroupEntry>,
        user: &str,
        creating: bool,
        replacing: bool,
    ) -> Result<(), SessionError> {
        let limits = &self.settings.limits;
        let (mut owned, mut sessions) = (0, 0);
        for entry in groups.values() {
            if entry.creator.as_deref() == Some(user) {
                owned += 1;
                sessions += entry.group.session_count();
            }
        }
        let refuse = |what, max| SessionError::TooManyOfIdentity {
            user: user.to_owned(),
            what,
            max,
            identity: self.settings.identity.clone(),
        };
        if creating && owned >= limits.max_groups_per_identity {
            return Err(refuse(
                "controller groups (idle ones included)",
                limits.max_groups_per_identity,
            ));
        }
        if !replacing && sessions >= limits.max_sessions_per_identity {
            return Err(refuse("sessions", limits.max_sessions_per_identity));
        }
        Ok(())
    }

    /// Stops what `entry`'s group holds: its watch subscriptions and its timers.
    fn release(&self, entry: &GroupEntry) {
        for sub in &entry.group.spec.subscriptions {
            self.watches.unsubscribe(&sub.watch, &entry.group);
        }
        entry.cancel.cancel();
    }

    /// Whether `group` is still the one the table holds under its id: a group replaced while
    /// it was starting its watches (another session of its id, with other subscriptions, found
    /// it without sessions) is not.
    fn is_current(&self, group: &Arc<Group>) -> bool {
        self.groups()
            .get(&group.id)
            .is_some_and(|e| Arc::ptr_eq(&e.group, group))
    }

    async fn subscribe_all(&self, group: &Arc<Group>) -> Result<(), SessionError> {
        for sub in &group.spec.subscriptions {
            let subscriber = Subscriber {
                group: group.clone(),
                payload: sub.payload,
                owner: sub.owner.clone(),
            };
            let subscribed = self.watches.subscribe(&sub.watch, subscriber).await;
            // Replaced meanwhile: nothing may keep feeding (and holding bodies for) a group
            // the table no longer knows.
            let replaced = !self.is_current(group);
            if subscribed.is_err() || replaced {
                let entry = {
                    let mut groups = self.groups();
                    match groups.get(&group.id) {
                        Some(e) if Arc::ptr_eq(&e.group, group) => groups.remove(&group.id),
                        _ => None,
                    }
                };
                match entry {
                    Some(entry) => self.release(&entry),
                    // Released when it was replaced; what it subscribed to since goes too.
                    None => {
                        for sub in &group.spec.subscriptions {
                            self.watches.unsubscribe(&sub.watch, group);
                        }
                    }
                }
                subscribed?;
                return Err(SessionError::SubscriptionsDiffer {
                    group: group.id.name.clone(),
                });
            }
        }
        Ok(())
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

    /// Expires the sessions not renewed by `now`: their in-flight keys go to the group's other
    /// sessions.
    pub(crate) fn expire_sessions(&self, now: Instant) {
        let groups: Vec<Arc<Group>> = self.groups().values().map(|e| e.group.clone()).collect();
        for group in groups {
            for slot in group.expire_sessions(now) {
                self.sessions().remove(&slot.wire_id);
                self.counters
                    .expired_sessions
                    .fetch_add(1, Ordering::Relaxed);
                info!(session = %slot.wire_id, group = %group.id, replica = %slot.replica, "session expired: its in-flight keys go to other sessions");
            }
        }
    }

    /// Drops the groups that have had no session for `--idle-group-grace` by `now`; returns
    /// the groups left.
    pub(crate) fn drop_idle_groups(&self, now: Instant) -> Vec<Arc<Group>> {
        let mut groups = self.groups();
        let grace = self.settings.idle_group_grace;
        let mut idle = Vec::new();
        for (id, entry) in groups.iter_mut() {
            // Deliveries held after their session closed keep it too: dropped, the group
            // would forget them, and a new one hand their keys out again at once.
            if entry.group.session_count() > 0 || entry.group.in_flight() > 0 {
                entry.empty_since = None;
            } else if let Some(since) = entry.empty_since {
                if now.duration_since(since) >= grace {
                    idle.push(id.clone());
                }
            } else {
                entry.empty_since = Some(now);
            }
        }
        for id in idle {
            if let Some(entry) = groups.remove(&id) {
                info!(group = %id, "dropping group: no session for {grace:?}");
                self.release(&entry);
            }
        }
        groups.values().map(|e| e.group.clone()).collect()
    }

    /// Shares the process's body pool out once it runs short: evenly over the users that have
    /// groups here, and a user's share evenly over its groups. Each group holding more than
    /// its share drops bodies down to it, and takes no more than its share until the pool has
    /// not been short for [`BODY_HOLD`]: no group, and no identity however many groups it
    /// opens, can keep the others' bodies out. Keys whose bodies are dropped are delivered
    /// without them (their controllers read the objects).
    pub(crate) fn share_bodies(&self, groups: &[Arc<Group>], now: Instant) {
        let pool = &self.settings.bodies;
        let mut held_until = self
            .bodies_held_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let spell_began = if pool.is_short() {
            held_until.replace(now + BODY_HOLD).is_none()
        } else {
            match *held_until {
                Some(until) if now >= until => {
                    *held_until = None;
                    for group in groups {
                        group.hold_bodies_to(None);
                    }
                    info!(
                        "the body pool has had room for {BODY_HOLD:?}: groups take bodies up to their own budget again"
                    );
                    return;
                }
                Some(_) => false,
                None => return,
            }
        };
        drop(held_until);
        let mut per_user: HashMap<Option<&str>, usize> = HashMap::new();
        for g in groups {
            *per_user.entry(g.id.owner.as_deref()).or_default() += 1;
        }
        let user_share = pool.capacity() / per_user.len().max(1);
        let mut freed = 0;
        for group in groups {
            let share = user_share / per_user[&group.id.owner.as_deref()];
            let shed = group.hold_bodies_to(Some(share));
            if shed > 0 {
                debug!(group = %group.id, shed, share, "bodies dropped: the body pool is short and this group held more than its share");
                freed += shed;
            }
        }
        self.counters
            .shed_body_bytes
            .fetch_add(freed as u64, Ordering::Relaxed);
        if spell_began {
            warn!(
                used = pool.used(),
                capacity = pool.capacity(),
                users = per_user.len(),
                freed,
                "the body pool (--max-body-bytes) is nearly spent: each user gets an even share, groups over theirs drop bodies and their keys go without (controllers read the objects)"
            );
        }
    }

    /// Trims every group to the current slice and, once no key that moved away is queued or in
    /// flight, publishes the ring as released.
    pub(crate) fn release_ring(&self, groups: &[Arc<Group>]) {
        let slice = self.slice();
        let released = slice.released(groups.iter().map(|g| g.apply_slice()));
        self.released.send_if_modified(|current| {
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
}

/// How long groups stay held to their shares of the body pool after it was last short: long
/// enough that a group refilling what it dropped does not make the pool swing every tick.
const BODY_HOLD: Duration = Duration::from_secs(60);

/// Extends a session by its ttl.
fn renew(slot: &SessionSlot) {
    *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now() + slot.ttl;
}

/// Ok if `caller` opened `session` (or nobody is authenticated).
fn check_opener(slot: &SessionSlot, session: &str, caller: &Caller) -> Result<(), SessionError> {
    match (&slot.opener, caller.identity()) {
        (None, _) => Ok(()),
        (Some(opener), Some(c)) if *opener == c.username => Ok(()),
        (Some(_), _) => Err(SessionError::NotYours {
            session: session.to_owned(),
            caller: caller.name().to_owned(),
        }),
    }
}
