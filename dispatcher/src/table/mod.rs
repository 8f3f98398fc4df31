//! The group table of a dispatcher: the controller groups known here, the index of their
//! sessions by the ids the wire gives them, and what a session asks for (open, poll, ack,
//! close), in domain terms. The gRPC services (`crate::grpc`) turn the wire into these calls,
//! and [`SessionError`] into a `tonic::Status`; the housekeeping task (`crate::housekeeping`)
//! expires sessions, drops idle groups, shares the body pool out and releases the ring.
//!
//! - this file: the table itself, and the ring it releases;
//! - `sessions`: a session's calls, from open to close, and its expiry;
//! - `lifecycle`: a group made for its first session, its watches, and dropped when idle,
//!   with the limits a tenant is held to (`kube_dispatch_core::quota`);
//! - `bodies`: the body pool shared out once it runs short;
//! - `error`: why a call is refused, in words the caller can act on.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, atomic::AtomicU64},
};

use kube_dispatch_core::{
    handover::Slice, queue::SessionId, recent_deletions::RecentDeletionsConfig,
};
use kube_dispatch_server::auth::{Caller, GroupId};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::{
    config::Settings, group::Group, membership::sessions::LeaseSessions, watch::registry::Watches,
};

mod bodies;
mod error;
mod lifecycle;
mod sessions;

pub use error::SessionError;
pub use sessions::{Client, Opened, Polled};

/// Where a session id of the wire leads: its group, its id there, and who may use it. The
/// group holds the session itself ([`Group::session`]); the opener is kept here too, so a
/// caller that did not open a session is refused before anything about it is told or changed,
/// even once its replica's newer session has replaced it.
pub(crate) struct SessionRef {
    pub(crate) group: Arc<Group>,
    pub(crate) id: SessionId,
    /// The user that opened it; `None` when authentication is off.
    opener: Option<String>,
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
pub struct GroupTable {
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
    /// The sessions this dispatcher's Lease lists, and the reports of ended sessions.
    lease_sessions: Arc<LeaseSessions>,
}

impl std::fmt::Debug for GroupTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupTable")
            .field("identity", &self.settings.identity)
            .finish_non_exhaustive()
    }
}

impl GroupTable {
    /// The table. It serves the keys of `slice`, publishes on `released` the ring it has
    /// released, hands a session keys only once `lease_sessions` says the Lease lists it, and
    /// stops with `shutdown`; `crate::housekeeping` must run beside it (session expiry,
    /// handover, resync, idle groups).
    pub fn new(
        settings: Settings,
        watches: Arc<Watches>,
        slice: watch::Receiver<Arc<Slice>>,
        recent_deletions: RecentDeletionsConfig,
        released: watch::Sender<Option<String>>,
        lease_sessions: Arc<LeaseSessions>,
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
            lease_sessions,
        })
    }

    fn groups(&self) -> MutexGuard<'_, HashMap<GroupId, GroupEntry>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, SessionRef>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sessions this dispatcher's Lease lists, and the reports of ended sessions.
    pub fn lease_sessions(&self) -> &LeaseSessions {
        &self.lease_sessions
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
    pub fn watch_figures(&self) -> Vec<crate::watch::registry::WatchFigures> {
        self.watches.figures()
    }

    /// The lists made here for the peers and with them, if any.
    pub fn sharing(&self) -> Option<&Arc<crate::watch::sharing::ListSharing>> {
        self.watches.sharing()
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

    /// The groups served to at least one session here, for a warming peer (`Peer.Groups`).
    pub fn served_groups(&self) -> Vec<GroupId> {
        self.groups()
            .iter()
            .filter(|(_, e)| e.group.session_count() > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether group `id` is here and has listed what it owns ([`Group::is_listed`]).
    pub fn is_listed(&self, id: &GroupId) -> bool {
        self.groups().get(id).is_some_and(|e| e.group.is_listed())
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

    /// Trims every group to the current slice and, once no key that moved away is queued or in
    /// flight, publishes the ring as released.
    pub(crate) fn release_ring(&self, groups: &[Arc<Group>]) {
        let slice = self.slice();
        let released = slice.released(groups.iter().map(|g| g.trim_to_slice()));
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

#[cfg(test)]
mod tests;
