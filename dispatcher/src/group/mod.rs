//! A controller group on this dispatcher: its subscriptions, its work queue and its sessions.
//!
//! The [`GroupQueue`] and its [`Transit`] hold the logic; this module adds the slice, the
//! clock and the wake-ups. The queue, the transit and the live sessions are one state under
//! one lock: each session is a [`SessionSlot`] (the [`Notify`] its long poll waits on, its
//! expiry) beside the queue's half of it (its ready keys, its keys in flight), and both change
//! together. A driver task fires the queue's timers. The tests at the end drive a group on a
//! paused clock.

use kube_dispatch_server::{auth::GroupId, authz::ResourceAccess};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, atomic::AtomicBool},
    time::Duration,
};

use prometheus_client::metrics::histogram::Histogram;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use kube_dispatch_core::{
    children::{ChildIndex, MAX_CHILDREN_PER_REQUEST, OwnerChildren},
    handover::Slice,
    queue::{
        GroupQueue, KeyStatus, QueueConfig, QueueFigures, SessionId,
        pool::{BodyPool, Pools},
    },
    recent_deletions::RecentDeletionsConfig,
    references::References,
    subscription::{GroupSpec, OwnerKind},
    transit::Transit,
};

mod events;
mod references;
mod sessions;
pub use sessions::Taken;

/// Keys taken per hold of the group's lock when many arrive at once (a trigger of every key, a
/// named object many objects name), so no single hold is long.
const KEYS_PER_HOLD: usize = 1024;

/// A live session of the group.
#[derive(Debug)]
pub struct SessionSlot {
    /// Signalled when the session has ready keys, or is closed.
    pub notify: Notify,
    /// When the session expires unless renewed.
    pub expires_at: Mutex<Instant>,
    /// The replica that holds it.
    pub replica: String,
    /// How long the session lives without renewal.
    pub ttl: Duration,
    /// The session id on the wire.
    pub wire_id: String,
    /// The user that opened it; `None` when authentication is off.
    pub opener: Option<String>,
    /// Its replica said it is stopping (`AckRequest.stopping`): its polls are answered at once.
    pub stopping: std::sync::atomic::AtomicBool,
    /// The generation of the dispatchers named dead that its last answer carried (the open's,
    /// then each poll's): a poll that finds another answers at once.
    pub told_dead: std::sync::atomic::AtomicU64,
}

/// A session that ended, and whether it had nothing in flight then
/// ([`GroupQueue::has_nothing_in_flight`]).
#[derive(Debug)]
pub struct Ended {
    /// Its slot.
    pub slot: Arc<SessionSlot>,
    /// It had nothing in flight: each key it was handed acknowledged, or run out.
    pub idle: bool,
}

/// The queue and what the group knows besides it as the ring changes: every decision against
/// the slice reads and changes both at once.
#[derive(Debug)]
struct State {
    queue: GroupQueue,
    transit: Transit,
    /// The live sessions: how each is woken and when it expires. The queue keeps, under the
    /// same ids, what each is handed (its ready keys, its keys in flight); both change together
    /// under the state lock, so no session is in one and not the other.
    sessions: HashMap<SessionId, Arc<SessionSlot>>,
}

impl State {
    /// Removes session `id`, whose in-flight keys go to the other sessions at once; wakes it
    /// (its poll ends) and the sessions given keys. Returns its slot, if it was live, and
    /// whether it had nothing in flight ([`GroupQueue::has_nothing_in_flight`]).
    fn remove_session(&mut self, id: SessionId) -> Option<Ended> {
        let idle = self.queue.has_nothing_in_flight(id);
        let wake = self.queue.remove_session(id);
        let slot = self.sessions.remove(&id);
        if let Some(slot) = &slot {
            slot.notify.notify_one();
        }
        self.wake(wake);
        slot.map(|slot| Ended { slot, idle })
    }

    /// Wakes `sessions` (they have ready keys, or ended).
    fn wake(&self, sessions: Vec<SessionId>) {
        for id in sessions {
            if let Some(slot) = self.sessions.get(&id) {
                slot.notify.notify_one();
            }
        }
    }
}

/// One controller group.
#[derive(Debug)]
pub struct Group {
    /// The group's name and owner.
    pub id: GroupId,
    /// What every session of the group subscribes to.
    pub spec: GroupSpec,
    /// What a caller must be able to read to be given the group's keys (from `spec`, once).
    pub accesses: Vec<ResourceAccess>,
    state: Mutex<State>,
    /// The keys this dispatcher serves; read under the state lock on every change, so no key
    /// outside it enters the queue once [`Group::apply_slice`] has run.
    slice: watch::Receiver<Arc<Slice>>,
    /// The indexes of owned objects of the watches its owned subscriptions feed from, with the
    /// owner kind each maps to: an owner's requests carry its children from them.
    owned: Mutex<Vec<(OwnerKind, Arc<ChildIndex>)>>,
    /// The process's body pool, where the indexes in `owned` keep children's bodies for this
    /// group's requests.
    body_pool: BodyPool,
    /// Whether a session of the group takes its owners' children's bodies (its client lists
    /// the capability "children-bodies"): from then on the group's indexes keep them and its
    /// requests carry them. Never unset: a replica of an older SDK in the same group ignores
    /// them.
    children_bodies: AtomicBool,
    /// The indexes of every watch the group subscribes to, each with its count of quiet steps
    /// when the group subscribed, until the group has listed: once each of them has shown
    /// everything since (a warming dispatcher joins once its peers' groups are listed).
    watched: Mutex<Option<Vec<Watched>>>,
    /// Set once the group was seen listed: it knows every key it owns here.
    listed: AtomicBool,
    /// What the objects it serves here name at the field paths of its `referenced_by`
    /// subscriptions, both ways: a change to a named object reconciles the objects that name
    /// it. Bounded by the keys served here ([`kube_dispatch_core::references`]).
    references: Mutex<References>,
    /// Wakes the timer driver when a timer may have moved earlier.
    timers_changed: Notify,
    /// Cancelled when the group is dropped from the dispatcher; ends the tasks that serve it.
    dropped: CancellationToken,
    /// From each delivery to its acknowledgement (`workqueue_work_duration_seconds`).
    pub work_duration: Histogram,
    /// From a key becoming ready to its delivery (`workqueue_queue_duration_seconds`).
    pub queue_duration: Histogram,
}

/// A watch a group feeds from, with its count of quiet steps when the group subscribed
/// ([`ChildIndex::quiet_steps`]).
type Watched = (Arc<ChildIndex>, u64);

/// A group's figures at one instant, for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupFigures {
    /// The queue's.
    pub queue: QueueFigures,
    /// Deletions held for the end of a handover.
    pub held: usize,
    /// Deletions of keys owned elsewhere remembered.
    pub remembered: usize,
    /// Changes of keys a handover holds, to go first when it ends.
    pub held_changes: usize,
    /// Keys a handover holds whose objects it knows exist (the index of held keys).
    pub held_keys: usize,
    /// Live sessions.
    pub sessions: usize,
    /// Objects served here that name others at a field path.
    pub referrers: usize,
    /// About the bytes of that index.
    pub reference_bytes: usize,
}

impl Group {
    /// A group with an empty queue that takes only keys of `slice` and remembers deletions of
    /// other keys as `recent_deletions` says; its timer driver runs until `cancel`, which must be
    /// cancelled when the group is dropped from the dispatcher.
    pub fn spawn(
        id: GroupId,
        spec: GroupSpec,
        config: QueueConfig,
        pools: Pools,
        recent_deletions: RecentDeletionsConfig,
        slice: watch::Receiver<Arc<Slice>>,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let transit = Transit::new(&id.to_string(), slice.borrow().clone(), recent_deletions);
        // A key queued by a change to a child or a named object is delivered with its own
        // object as the watch last showed it, not read by its controller.
        let config = QueueConfig {
            keep_delivered_bodies: spec.has_related(),
            ..config
        };
        let body_pool = pools.bodies.clone();
        let group = Arc::new(Self {
            id,
            accesses: crate::security::accesses(&spec),
            spec,
            state: Mutex::new(State {
                queue: GroupQueue::with_pools(config, pools),
                transit,
                sessions: HashMap::new(),
            }),
            slice,
            owned: Mutex::default(),
            body_pool,
            children_bodies: AtomicBool::new(false),
            watched: Mutex::default(),
            listed: AtomicBool::new(false),
            references: Mutex::default(),
            timers_changed: Notify::new(),
            dropped: cancel.clone(),
            work_duration: duration_histogram(),
            queue_duration: duration_histogram(),
        });
        tokio::spawn(drive_timers(group.clone(), cancel));
        group
    }

    /// The group subscribed to every watch it needs, with their indexes (`watched`).
    pub fn subscribed(&self, watched: Vec<Arc<ChildIndex>>) {
        let watched = watched
            .into_iter()
            .map(|index| {
                let since = index.quiet_steps();
                (index, since)
            })
            .collect();
        *self.watched.lock().unwrap_or_else(|e| e.into_inner()) = Some(watched);
    }

    /// Whether the group has listed what it owns here: subscribed, and every watch it feeds
    /// from has shown everything since (its first list done, and the list beside it for this
    /// group when it joined a running watch). Once true, true for good.
    pub fn is_listed(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.listed.load(Ordering::Acquire) {
            return true;
        }
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let listed = watched.as_ref().is_some_and(|w| {
            w.iter()
                .all(|(index, since)| index.quiet_steps() > *since || index.shows_everything())
        });
        if listed {
            self.listed.store(true, Ordering::Release);
            // Listed for good: the indexes are the watches' to keep.
            *watched = None;
        }
        listed
    }

    /// Resolves when the group is dropped from the dispatcher (or the dispatcher stops).
    pub async fn dropped(&self) {
        self.dropped.cancelled().await;
    }

    /// The state, to read it.
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would leave the queue unusable: recover the data, the
        // queue's operations keep their invariants step by step.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, to change it now: keys the change makes ready became ready now
    /// (`workqueue_queue_duration_seconds`).
    fn state_now(&self) -> MutexGuard<'_, State> {
        let mut state = self.state();
        state.queue.at(Self::now());
        state
    }

    /// The slice this group serves, to wait for its changes: a poll that found nothing to hand
    /// out while the handover held the keys is answered as soon as the gate opens.
    pub fn slice_changes(&self) -> watch::Receiver<Arc<Slice>> {
        let mut slice = self.slice.clone();
        slice.mark_unchanged();
        slice
    }

    /// The time the queue and transit count in: tokio's, so paused tests drive it.
    fn now() -> std::time::Instant {
        Instant::now().into_std()
    }

    /// Number of deliveries in flight.
    pub fn in_flight(&self) -> usize {
        self.state().queue.in_flight_len()
    }

    /// The group's figures now.
    pub fn figures(&self) -> GroupFigures {
        let state = self.state();
        let transit = state.transit.figures();
        let queue = state.queue.figures(Self::now());
        let sessions = state.sessions.len();
        drop(state);
        let references = self.references();
        GroupFigures {
            queue,
            held: transit.held,
            remembered: transit.remembered,
            held_changes: transit.held_changes,
            held_keys: transit.held_keys,
            sessions,
            referrers: references.len(),
            reference_bytes: references.bytes(),
        }
    }

    /// Bytes of bodies held for ready keys.
    pub fn body_bytes(&self) -> usize {
        self.state().queue.body_bytes()
    }

    /// Holds the group to `share` bytes of bodies; see [`GroupQueue::hold_bodies_to`].
    pub fn hold_bodies_to(&self, share: Option<usize>) -> usize {
        self.state().queue.hold_bodies_to(share)
    }

    /// What the queue knows of `key` now; see [`GroupQueue::key_status`].
    pub fn key_status(&self, key: &str) -> Option<KeyStatus> {
        self.state().queue.key_status(key, Self::now())
    }

    /// Whether a key that moved away is still here, queued or in flight: the ring it left is
    /// not released yet.
    pub fn has_leaving_keys(&self) -> bool {
        self.state().queue.any_leaving(|_| true)
    }

    /// Number of keys known.
    pub fn key_count(&self) -> usize {
        self.state().queue.len()
    }
}

/// How long an owner's delivery waits, at most, for a list that will show its children (the
/// first list of a watch of them, one beside it for keys just moved here, a re-list, a group's
/// join) rather than be made with its children incomplete, which its reconcile would read
/// itself: a GET of each, or a LIST of the namespace. Counted from when that list began
/// ([`ChildIndex::listing_since`]) and from when the owner became ready, whichever bound comes
/// first; past it, the owner is delivered with its children incomplete.
pub const OWNER_WAITS_FOR_CHILDREN: Duration = Duration::from_secs(5);

/// How often a session with owners waiting for their children looks at them again.
pub const OWNERS_LOOKED_AT_AGAIN: Duration = Duration::from_millis(50);

/// Until when the owner `key`, ready since `ready`, may wait for its children rather than be
/// delivered now: when they are incomplete (in `owned`, the indexes of every owned subscription
/// its kind maps to), and every index missing some is listing them since less than
/// [`OWNER_WAITS_FOR_CHILDREN`] before `now`, and the owner has waited less than that. `None`
/// when it goes now. Reads the indexes' flags, not the children.
fn waits_for_children(
    owned: &[(OwnerKind, Arc<ChildIndex>)],
    key: &str,
    ready: std::time::Instant,
    now: std::time::Instant,
) -> Option<std::time::Instant> {
    if owned.is_empty() {
        return None;
    }
    let parsed = kube_dispatch_proto::RequestKey::parse(key).ok()?;
    let mut until = ready + OWNER_WAITS_FOR_CHILDREN;
    let mut incomplete = false;
    for (kind, index) in owned {
        if kind.group != parsed.group || kind.kind != parsed.kind || index.is_complete_for(key) {
            continue;
        }
        // Incomplete while no list runs (a reader ahead of the watch's slice): nothing to wait for.
        until = until.min(index.listing_since()? + OWNER_WAITS_FOR_CHILDREN);
        incomplete = true;
    }
    (incomplete && until > now).then_some(until)
}

/// The children of the owner `key` in `owned` (merged over the watches of every owned
/// subscription its kind maps to, in key order), or `None` if none maps to it.
fn children_of(owned: &[(OwnerKind, Arc<ChildIndex>)], key: &str) -> Option<OwnerChildren> {
    if owned.is_empty() {
        return None;
    }
    let parsed = kube_dispatch_proto::RequestKey::parse(key).ok()?;
    let mut found: Option<OwnerChildren> = None;
    for (kind, index) in owned {
        if kind.group != parsed.group || kind.kind != parsed.kind {
            continue;
        }
        let of = index.of(kind, key);
        found = Some(match found {
            None => of,
            Some(mut all) => {
                all.children.extend(of.children);
                all.complete &= of.complete;
                all.truncated |= of.truncated;
                all
            }
        });
    }
    let mut found = found?;
    found.children.sort_by(|a, b| a.key.cmp(&b.key));
    if found.children.len() > MAX_CHILDREN_PER_REQUEST {
        found.children.truncate(MAX_CHILDREN_PER_REQUEST);
        found.truncated = true;
    }
    Some(found)
}

/// The buckets of `workqueue_work_duration_seconds` and `workqueue_queue_duration_seconds`:
/// 1 ms to about 17 min by factors of 2 (reconciles are bounded by `--max-reconcile-time`).
fn duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 21,
    ))
}

/// Fires the group's timers (retries, requeues, reconcile deadlines) on time, until `cancel`.
async fn drive_timers(group: Arc<Group>, cancel: CancellationToken) {
    loop {
        let changed = group.timers_changed.notified();
        tokio::pin!(changed);
        // Register before reading the deadline, so a change made in between is not missed.
        changed.as_mut().enable();
        let next = group.state().queue.next_deadline();
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = &mut changed => continue,
            () = sleep => {}
        }
        let mut state = group.state_now();
        let wake = state.queue.advance(Group::now());
        state.wake(wake);
    }
}

#[cfg(test)]
mod tests;
