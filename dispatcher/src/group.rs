//! A controller group on this dispatcher: its subscriptions, its work queue and its sessions.
//!
//! The [`GroupQueue`] and its [`Partition`] hold the logic; this module adds the slice, the
//! clock and the wake-ups. The queue, the partition and the live sessions are one state under
//! one lock: each session is a [`SessionSlot`] (the [`Notify`] its long poll waits on, its
//! expiry) beside the queue's half of it (its ready keys, its keys in flight), and both change
//! together. A driver task fires the queue's timers. The tests at the end drive a group on a
//! paused clock.

use kube_dispatch_runtime::{auth::GroupId, authz::ResourceAccess};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use kube_dispatch_proto::{Ring, v1::Reason};
use prometheus_client::metrics::histogram::Histogram;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use kube_dispatch_core::{
    children::{ChildIndex, MAX_CHILDREN_PER_REQUEST, OwnerChildren},
    handover::Slice,
    key::KeyRef,
    partition::{GroupEvent, Partition},
    queue::{
        AckResult, Change, Delivery, GroupQueue, KeyStatus, QueueConfig, QueueFigures, SessionId,
        pool::Pools,
    },
    recent_deletions::RecentDeletionsConfig,
    references::References,
    request::Acked,
    subscription::{GroupSpec, OwnerKind},
};

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
}

/// The queue and what the group knows besides it as the ring changes: every decision against
/// the slice reads and changes both at once.
#[derive(Debug)]
struct State {
    queue: GroupQueue,
    partition: Partition,
    /// The live sessions: how each is woken and when it expires. The queue keeps, under the
    /// same ids, what each is handed (its ready keys, its keys in flight); both change together
    /// under the state lock, so no session is in one and not the other.
    sessions: HashMap<SessionId, Arc<SessionSlot>>,
}

impl State {
    /// Removes session `id`, whose in-flight keys go to the other sessions at once; wakes it
    /// (its poll ends) and the sessions given keys. Returns its slot, if it was live.
    fn remove_session(&mut self, id: SessionId) -> Option<Arc<SessionSlot>> {
        let wake = self.queue.remove_session(id);
        let slot = self.sessions.remove(&id);
        if let Some(slot) = &slot {
            slot.notify.notify_one();
        }
        self.wake(wake);
        slot
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
        let partition = Partition::new(&id.to_string(), slice.borrow().clone(), recent_deletions);
        let group = Arc::new(Self {
            id,
            accesses: crate::security::accesses(&spec),
            spec,
            state: Mutex::new(State {
                queue: GroupQueue::with_pools(config, pools),
                partition,
                sessions: HashMap::new(),
            }),
            slice,
            owned: Mutex::default(),
            references: Mutex::default(),
            timers_changed: Notify::new(),
            dropped: cancel.clone(),
            work_duration: duration_histogram(),
            queue_duration: duration_histogram(),
        });
        tokio::spawn(drive_timers(group.clone(), cancel));
        group
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

    /// Adds a session of `replica` opened by `opener`; returns its slot and the slots of the
    /// sessions it replaced (an older session of the same replica). In a group shared by
    /// several users, a replica whose live session another user opened is not replaced:
    /// `Err` names that user. Checked and added under the group's lock, so two users racing
    /// for one replica id cannot both win.
    pub fn add_session(
        &self,
        id: SessionId,
        wire_id: String,
        replica: &str,
        ttl: Duration,
        opener: Option<&str>,
    ) -> Result<(Arc<SessionSlot>, Vec<Arc<SessionSlot>>), String> {
        let slot = Arc::new(SessionSlot {
            notify: Notify::new(),
            expires_at: Mutex::new(Instant::now() + ttl),
            replica: replica.to_owned(),
            ttl,
            wire_id,
            opener: opener.map(str::to_owned),
        });
        let replaced = {
            let mut state = self.state_now();
            let State {
                queue, sessions, ..
            } = &mut *state;
            if let Some(holder) = sessions.values().find_map(|s| {
                let theirs = s.opener.as_deref()?;
                (s.replica == replica && opener.is_some_and(|o| o != theirs))
                    .then(|| theirs.to_owned())
            }) {
                return Err(holder);
            }
            let before: Vec<SessionId> = sessions.keys().copied().collect();
            // The replica's older session: whoever holds it (the replica before a restart, a
            // second process with its id) may still run what it was handed, so those keys stay
            // in flight until it would have expired.
            let mut wake = Vec::new();
            for (old, slot) in sessions.iter().filter(|(_, s)| s.replica == replica) {
                let until = *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner());
                wake.extend(queue.remove_session_holding(*old, until.into_std()));
            }
            wake.extend(queue.add_session(id, replica));
            let mut replaced = Vec::new();
            for old in before {
                if !queue.has_session(old)
                    && let Some(old) = sessions.remove(&old)
                {
                    old.notify.notify_one();
                    replaced.push(old);
                }
            }
            sessions.insert(id, slot.clone());
            state.wake(wake);
            replaced
        };
        self.timers_changed.notify_one();
        Ok((slot, replaced))
    }

    /// Removes a session whose client may still run what it was handed (closed by its
    /// client, or replaced by a newer session of its replica): its in-flight keys stay in flight
    /// until it would have expired, by when its client has fenced itself; see
    /// [`GroupQueue::remove_session_holding`].
    pub fn close_session(&self, id: SessionId) {
        {
            let mut state = self.state_now();
            let Some(slot) = state.sessions.remove(&id) else {
                return;
            };
            let until = *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner());
            let wake = state.queue.remove_session_holding(id, until.into_std());
            slot.notify.notify_one();
            state.wake(wake);
        }
        self.timers_changed.notify_one();
    }

    /// Removes a session that expired (or every session, when draining): its in-flight keys
    /// are re-delivered at once.
    pub fn remove_session(&self, id: SessionId) {
        self.state_now().remove_session(id);
    }

    /// Removes the sessions not renewed by `now`, as [`Group::remove_session`] does; returns
    /// them.
    pub fn expire_sessions(&self, now: Instant) -> Vec<Arc<SessionSlot>> {
        let mut state = self.state_now();
        let expired: Vec<SessionId> = state
            .sessions
            .iter()
            .filter(|(_, s)| *s.expires_at.lock().unwrap_or_else(|e| e.into_inner()) <= now)
            .map(|(id, _)| *id)
            .collect();
        expired
            .into_iter()
            .filter_map(|id| state.remove_session(id))
            .collect()
    }

    /// The live session `id`, if it still is (a newer session of its replica replaces it).
    pub fn session(&self, id: SessionId) -> Option<Arc<SessionSlot>> {
        self.state().sessions.get(&id).cloned()
    }

    /// The slice this group serves, to wait for its changes: a poll that found nothing to hand
    /// out while the handover held the keys is answered as soon as the gate opens.
    pub fn slice_changes(&self) -> watch::Receiver<Arc<Slice>> {
        let mut slice = self.slice.clone();
        slice.mark_unchanged();
        slice
    }

    /// Whether the session is live in this group.
    pub fn has_session(&self, id: SessionId) -> bool {
        self.state().sessions.contains_key(&id)
    }

    /// Whether `replica` holds a live session of the group.
    pub fn has_replica(&self, replica: &str) -> bool {
        self.state().sessions.values().any(|s| s.replica == replica)
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.state().sessions.len()
    }

    /// The state, with the queue trimmed to the slice current now ([`Partition::apply`], which
    /// does nothing when that slice was applied already), and that slice; and the sessions the
    /// trim woke. Every decision against the slice is taken on a queue trimmed to it, under the
    /// state lock: a key the ring just moved away is already known to be on its way out.
    fn current(&self) -> (MutexGuard<'_, State>, Arc<Slice>, Vec<SessionId>) {
        let mut state = self.state_now();
        let slice = self.slice.borrow().clone();
        let State {
            queue, partition, ..
        } = &mut *state;
        let (wake, _) = partition.apply(&slice, queue, Self::now());
        (state, slice, wake)
    }

    /// Takes one event of a key, from a watch, a list beside it or a peer: the group's one
    /// entry for events. What it means for the group is decided in core
    /// ([`Partition::record`]), against the slice current now, on a queue trimmed to it, under
    /// the state lock.
    pub fn apply(&self, event: GroupEvent<'_>) {
        self.apply_all(std::iter::once(event), false);
    }

    /// [`Group::apply`] of an event of a watch's stream, not of a list: a change of a key a
    /// handover holds is remembered to go first when it completes
    /// ([`Partition::record_streamed`]).
    pub fn apply_streamed(&self, event: GroupEvent<'_>) {
        self.apply_all(std::iter::once(event), true);
    }

    /// [`Group::apply`] (or, `streamed`, [`Group::apply_streamed`]) of each of `events`, under
    /// one hold of the lock.
    fn apply_all<'k>(&self, events: impl IntoIterator<Item = GroupEvent<'k>>, streamed: bool) {
        let (mut state, slice, mut wake) = self.current();
        let State {
            queue, partition, ..
        } = &mut *state;
        for event in events {
            let now = Self::now();
            wake.extend(if streamed {
                partition.record_streamed(&slice, queue, event, now)
            } else {
                partition.record(&slice, queue, event, now)
            });
        }
        state.wake(wake);
    }

    /// The remembered deletions of keys `identity` owns on `ring`, for a peer that starts
    /// serving this group (`crate::grpc::peer`).
    pub fn recent_deletions_owned_by(&self, ring: &Ring, identity: &str) -> Vec<Arc<str>> {
        self.state()
            .partition
            .recent_deletions_owned_by(ring, identity, Self::now())
    }

    /// Deletions that peers remembered (`crate::grpc::peer`): each is taken as if this
    /// dispatcher's watch had seen it now: queued if the key is served, held if a handover
    /// holds it, else remembered in turn.
    pub fn deleted_in_transit(&self, keys: impl IntoIterator<Item = String>) {
        for key in keys {
            self.apply(GroupEvent::Deleted {
                key: KeyRef::new(&key),
                change: Change::deletion(),
            });
        }
    }

    /// Trims the queue to the current slice if it changed ([`Partition::apply`]). Returns
    /// whether a key this dispatcher no longer owns is still queued or in flight, which holds
    /// back the release of the ring.
    pub fn apply_slice(&self) -> bool {
        let mut state = self.state_now();
        let slice = self.slice.borrow().clone();
        let State {
            queue, partition, ..
        } = &mut *state;
        let (wake, pending) = partition.apply(&slice, queue, Self::now());
        state.wake(wake);
        drop(state);
        // What the keys the ring moved away name is their new dispatcher's to know.
        self.references()
            .retain(|key| !slice.owned_elsewhere(KeyRef::new(key)));
        pending
    }

    /// The time the queue and partition count in: tokio's, so paused tests drive it.
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
        let partition = state.partition.figures();
        let queue = state.queue.figures(Self::now());
        let sessions = state.sessions.len();
        drop(state);
        let references = self.references();
        GroupFigures {
            queue,
            held: partition.held,
            remembered: partition.remembered,
            held_changes: partition.held_changes,
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

    /// Queues the deletions a finished re-list revealed; see [`GroupQueue::sweep`].
    pub fn sweep(&self, epoch: u32, belongs: impl Fn(&str) -> bool) {
        let mut state = self.state_now();
        let wake = state.queue.sweep(epoch, &belongs);
        state.partition.sweep(epoch, &belongs);
        state.wake(wake);
        drop(state);
        // The referrers deleted while the watch was away name nothing any more.
        self.references().swept_referrers(epoch, belongs);
    }

    /// Reconciles `keys` and, with `all`, every key it serves, whose objects exist
    /// (`Dispatcher.Trigger`): taken as related changes of reason TRIGGERED, so a trigger adds
    /// no key and a key in flight runs again after. Every key is taken under one hold of the
    /// group's lock per 1024 keys (`KEYS_PER_HOLD`), yielding between holds, so a trigger of every
    /// key of a large group never holds the lock (and a runtime worker) for long.
    pub async fn trigger(&self, keys: &[String], all: bool) {
        for chunk in keys.chunks(KEYS_PER_HOLD) {
            self.apply_all(
                chunk.iter().map(|key| GroupEvent::Triggered {
                    key: KeyRef::new(key),
                }),
                false,
            );
            tokio::task::yield_now().await;
        }
        if !all {
            return;
        }
        let live = {
            let (state, slice, wake) = self.current();
            let live = state.queue.live_keys(|k| slice.serves_key(KeyRef::new(k)));
            state.wake(wake);
            live
        };
        for chunk in live.chunks(KEYS_PER_HOLD) {
            {
                let mut state = self.state_now();
                let wake = state.queue.touch(chunk, Reason::Triggered);
                state.wake(wake);
            }
            tokio::task::yield_now().await;
        }
    }

    /// The index of references, to change it.
    fn references(&self) -> MutexGuard<'_, References> {
        self.references.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object of `key`, shown by the list or stream of `epoch`, names `targets` (request
    /// keys; none if it was deleted or is served elsewhere now); `if_absent`: only if nothing
    /// is indexed for it (a list beside the stream, maybe older than it).
    pub fn names(&self, key: &str, targets: Vec<String>, epoch: u32, if_absent: bool) {
        let mut references = self.references();
        if if_absent {
            references.name_if_absent(key, targets, epoch);
        } else {
            references.name(key, targets, epoch);
        }
    }

    /// The object of the request key `target` was shown at `resource_version` by the list or
    /// stream (`streamed`) of `epoch`, or deleted: each object that names it is reconciled, if
    /// it changed.
    pub fn named_object_seen(
        &self,
        target: &str,
        resource_version: &str,
        epoch: u32,
        deleted: bool,
        streamed: bool,
    ) {
        let referrers = self
            .references()
            .target_seen(target, resource_version, epoch, deleted);
        self.named_changed(&referrers, streamed);
    }

    /// The watch of named objects ended its list of `epoch`: the objects that name one of
    /// `belongs` it did not show (deleted while the watch was away) are reconciled.
    pub fn named_objects_swept(&self, epoch: u32, belongs: impl Fn(&str) -> bool) {
        let referrers = self.references().swept_targets(epoch, belongs);
        self.named_changed(&referrers, false);
    }

    /// Reconciles `referrers`: an object they name changed, as the watch's stream showed
    /// (`streamed`: remembered to go first if a handover holds them, and in the live lane) or
    /// a list did.
    fn named_changed(&self, referrers: &[Arc<str>], streamed: bool) {
        for chunk in referrers.chunks(KEYS_PER_HOLD) {
            self.apply_all(
                chunk.iter().map(|key| GroupEvent::NamedChanged {
                    key: KeyRef::new(key),
                }),
                streamed,
            );
        }
    }

    /// Resyncs up to `n` keys; see [`GroupQueue::resync_batch`].
    pub fn resync_batch(&self, n: usize) {
        let mut state = self.state_now();
        let wake = state.queue.resync_batch(n);
        state.wake(wake);
    }

    /// What the queue knows of `key` now; see [`GroupQueue::key_status`].
    pub fn key_status(&self, key: &str) -> Option<KeyStatus> {
        self.state().queue.key_status(key, Self::now())
    }

    /// The replicas holding live sessions, sorted.
    pub fn replicas(&self) -> Vec<String> {
        let mut replicas: Vec<String> = self
            .state()
            .sessions
            .values()
            .map(|s| s.replica.clone())
            .collect();
        replicas.sort();
        replicas
    }

    /// Number of keys known.
    pub fn key_count(&self) -> usize {
        self.state().queue.len()
    }

    /// Settles deliveries; returns how many were not in flight on the session.
    /// Each ack's memo is kept for the key's next delivery ([`GroupQueue::leave_memo`]).
    pub fn ack(&self, session: SessionId, acks: Vec<Acked>) -> usize {
        let now = Self::now();
        let mut unknown = 0;
        {
            let mut state = self.state_now();
            let mut wake = Vec::new();
            for Acked {
                delivery,
                outcome,
                memo,
            } in acks
            {
                state.queue.leave_memo(session, delivery, &memo);
                let (result, w) = state.queue.ack(session, delivery, outcome, now);
                match result {
                    AckResult::Unknown => unknown += 1,
                    AckResult::Settled { worked } => {
                        self.work_duration.observe(worked.as_secs_f64());
                    }
                }
                wake.extend(w);
            }
            state.wake(wake);
        }
        self.timers_changed.notify_one();
        unknown
    }

    /// Takes up to `max` ready keys for the session, within `max_bytes`
    /// ([`kube_dispatch_core::queue::GroupQueue::take_within`]), without their children.
    #[cfg(test)]
    pub(crate) fn take(&self, session: SessionId, max: usize, max_bytes: usize) -> Vec<Delivery> {
        self.take_with_children(session, max, max_bytes)
            .into_iter()
            .map(|(delivery, _)| delivery)
            .collect()
    }

    /// Takes up to `max` ready keys for the session, within `max_bytes`
    /// ([`kube_dispatch_core::queue::GroupQueue::take_within_sized`]), with each owner's
    /// children as the watches of its owned subscriptions know them, read after the key was
    /// taken (so at least as new as the change that queued it), their bytes counted within
    /// `max_bytes`. `None` for a key of a kind no owned subscription maps to.
    pub fn take_with_children(
        &self,
        session: SessionId,
        max: usize,
        max_bytes: usize,
    ) -> Vec<(Delivery, Option<OwnerChildren>)> {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut children: HashMap<String, OwnerChildren> = HashMap::new();
        let out = {
            // On a queue trimmed to the slice current now: a poll woken by a change of the
            // slice may come before the membership loop has trimmed the groups to it.
            let (mut state, slice, wake) = self.current();
            state.wake(wake);
            let queue = &mut state.queue;
            // While nothing may be handed out, owned keys stay queued (`apply_slice`). The
            // Lease deadline is kept in real time, as the membership loop keeps it.
            if !slice.hands_out(std::time::Instant::now()) {
                return Vec::new();
            }
            // The state lock, then an index's: the fan-out never holds an index while it
            // calls into a group.
            queue.take_within_sized(session, max, max_bytes, Self::now(), |key| {
                let Some(mut of) = children_of(&owned, key, &slice) else {
                    return 0;
                };
                // Half the answer at most, so a key alone in it fits with its children.
                of.fit(max_bytes / 2);
                let bytes = of.wire_bound();
                children.insert(key.to_owned(), of);
                bytes
            })
        };
        for queued in out.iter().filter_map(|d| d.queued) {
            self.queue_duration.observe(queued.as_secs_f64());
        }
        if !out.is_empty() {
            self.timers_changed.notify_one();
        }
        out.into_iter()
            .map(|d| {
                let of = children.remove(&d.key);
                (d, of)
            })
            .collect()
    }

    /// Takes the children of owners of `kind` from `index` into this group's requests.
    pub fn owns_from(&self, kind: OwnerKind, index: Arc<ChildIndex>) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if !owned
            .iter()
            .any(|(k, i)| *k == kind && Arc::ptr_eq(i, &index))
        {
            owned.push((kind, index));
        }
    }
}

/// The children of the owner `key` in `owned` (merged over the watches of every owned
/// subscription its kind maps to, in key order), or `None` if none maps to it.
fn children_of(
    owned: &[(OwnerKind, Arc<ChildIndex>)],
    key: &str,
    slice: &Slice,
) -> Option<OwnerChildren> {
    if owned.is_empty() {
        return None;
    }
    let parsed = kube_dispatch_proto::RequestKey::parse(key).ok()?;
    let mut found: Option<OwnerChildren> = None;
    for (kind, index) in owned {
        if kind.group != parsed.group || kind.kind != parsed.kind {
            continue;
        }
        let of = index.of(kind, key, slice);
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
mod tests {
    use kube_dispatch_proto::RequestKey;

    use super::*;
    use kube_dispatch_core::{
        backoff::Backoff,
        handover::LeaseDeadline,
        queue::{Observed, Outcome},
        subscription::GroupSpec,
    };

    fn group(cancel: &CancellationToken) -> Arc<Group> {
        let config = QueueConfig {
            backoff: Backoff {
                base: Duration::from_secs(10),
                cap: Duration::from_secs(60),
            },
            max_reconcile_time: Duration::from_secs(30),
            body_budget: 0,
            memo_budget: 1 << 20,
        };
        let slice = Slice::fixed("d0", kube_dispatch_proto::Ring::new(["d0"]));
        Group::spawn(
            GroupId::shared("g"),
            GroupSpec::new(Vec::new()),
            config,
            Pools::unbounded(),
            RecentDeletionsConfig::NONE,
            watch::channel(Arc::new(slice)).1,
            cancel.clone(),
        )
    }

    fn modified() -> Change {
        Change {
            reason: Reason::Modified,
            resource_version: "1".into(),
            uid: String::new(),
            body: None,
            deleted: false,
            trace: None,
        }
    }

    /// A deletion of a key owned elsewhere is remembered; when the ring gives the key here it
    /// is held, and delivered once the handover completes. A key whose object came back is not.
    #[tokio::test(start_paused = true)]
    async fn deletions_of_keys_that_move_here_are_delivered_after_the_handover() {
        let cancel = CancellationToken::new();
        let two = Slice::fixed("d0", Ring::new(["d0", "d1"]));
        let (tx, rx) = watch::channel(Arc::new(two.clone()));
        let g = Group::spawn(
            GroupId::shared("g"),
            GroupSpec::new(Vec::new()),
            QueueConfig::default(),
            Pools::unbounded(),
            RecentDeletionsConfig {
                window: Duration::from_secs(60),
                capacity: 16,
            },
            rx,
            cancel.clone(),
        );
        g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
            .unwrap();
        // Two keys d1 owns on the ring of two.
        let of_d1: Vec<String> = (0..100)
            .map(|i| format!("/ConfigMap/ns/cm-{i}"))
            .filter(|k| !two.owns_str(k))
            .take(2)
            .collect();
        let [gone, back] = <[String; 2]>::try_from(of_d1).expect("d1 owns keys");
        let deleted = || Change {
            reason: Reason::Deleted,
            deleted: true,
            ..modified()
        };
        for key in [&gone, &back] {
            g.apply(GroupEvent::Deleted {
                key: KeyRef::from(key),
                change: deleted(),
            });
        }
        // The object of `back` is created again.
        let name = back.trim_start_matches("/ConfigMap/ns/");
        g.apply(GroupEvent::ExistsElsewhere {
            key: KeyRef::from(&RequestKey::new("", "ConfigMap", "ns", name).to_string()),
            object: Observed {
                resource_version: "9".into(),
                uid: "u9".into(),
                body: None,
                trace: None,
            },
            epoch: 0,
        });
        assert!(
            g.take(1, 10, usize::MAX).is_empty(),
            "nothing of d1's is delivered here"
        );

        // d1 dies: d0 owns its keys but holds them until the handover completes.
        let mut held = two.clone();
        held.ring = Arc::new(Ring::new(["d0"]));
        tx.send_replace(Arc::new(held.clone()));
        g.apply_slice();
        assert!(
            g.take(1, 10, usize::MAX).is_empty(),
            "held until the handover completes"
        );

        // d1 flaps back before the handover completes: the key moves away again, its deletion
        // is remembered as one owned elsewhere, and moves back with the key.
        tx.send_replace(Arc::new(two.clone()));
        g.apply_slice();
        assert!(
            g.take(1, 10, usize::MAX).is_empty(),
            "nothing of d1's is delivered here"
        );
        tx.send_replace(Arc::new(held.clone()));
        g.apply_slice();

        held.settled = Some(held.ring.clone());
        tx.send_replace(Arc::new(held));
        g.apply_slice();
        let got: Vec<(String, bool)> = g
            .take(1, 10, usize::MAX)
            .iter()
            .map(|d| (d.key.clone(), d.deleted))
            .collect();
        assert_eq!(got, vec![(gone, true)]);
        cancel.cancel();
    }

    /// The watch shows `key`'s object at `rv`.
    fn exists(g: &Group, key: &str, rv: &str) {
        g.apply(GroupEvent::Exists {
            key: KeyRef::from(key),
            object: observed(rv),
            epoch: 1,
        });
    }

    /// A list beside the watch shows `key`'s object at `rv`.
    fn listed(g: &Group, key: &str, rv: &str) {
        g.apply(GroupEvent::Listed {
            key: KeyRef::from(key),
            object: observed(rv),
            epoch: 1,
        });
    }

    fn observed(rv: &str) -> Observed {
        Observed {
            resource_version: rv.into(),
            uid: "u".into(),
            body: None,
            trace: None,
        }
    }

    /// Delivered (key, reason, resourceVersion), each acknowledged.
    fn take_all(g: &Group) -> Vec<(String, Reason, String)> {
        let got = g.take(1, 100, usize::MAX);
        let acks = got
            .iter()
            .map(|d| (d.id, Outcome::Success).into())
            .collect();
        g.ack(1, acks);
        got.iter()
            .map(|d| (d.key.clone(), d.reason, d.resource_version.clone()))
            .collect()
    }

    /// A list beside the watch's stream may be older than what the stream showed: it adds only
    /// keys served here of which the group knows no version, and never undoes what it knows.
    #[tokio::test(start_paused = true)]
    async fn a_list_beside_the_stream_adds_only_keys_not_known() {
        let cancel = CancellationToken::new();
        let two = Slice::fixed("d0", Ring::new(["d0", "d1"]));
        let g = Group::spawn(
            GroupId::shared("g"),
            GroupSpec::new(Vec::new()),
            QueueConfig::default(),
            Pools::unbounded(),
            RecentDeletionsConfig::NONE,
            watch::channel(Arc::new(two.clone())).1,
            cancel.clone(),
        );
        g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
            .unwrap();
        let mine: Vec<String> = (0..100)
            .map(|i| format!("/ConfigMap/ns/cm-{i}"))
            .filter(|k| two.owns_str(k))
            .take(4)
            .collect();
        let elsewhere = (0..100)
            .map(|i| format!("/ConfigMap/ns/cm-{i}"))
            .find(|k| !two.owns_str(k))
            .expect("d1 owns a key");
        let [seen, gone, owner, new] = <[String; 4]>::try_from(mine).expect("d0 owns keys");
        exists(&g, &seen, "5");
        g.apply(GroupEvent::Deleted {
            key: KeyRef::from(&gone),
            change: Change::deletion(),
        });
        g.apply(GroupEvent::OwnedChanged {
            key: KeyRef::from(&owner),
        });
        assert_eq!(take_all(&g).len(), 3);

        listed(&g, &seen, "3");
        listed(&g, &elsewhere, "3");
        listed(&g, &owner, "4");
        listed(&g, &new, "6");
        let mut got = take_all(&g);
        got.sort();
        assert_eq!(
            got,
            vec![
                (owner.clone(), Reason::Added, "4".into()),
                (new.clone(), Reason::Added, "6".into()),
            ],
            "only the key never seen and the owner known only by an owned object's change"
        );
        // What the list added is known now: an older list adds nothing again.
        listed(&g, &new, "6");
        assert!(take_all(&g).is_empty());
        cancel.cancel();
    }

    /// An object that others name changes: shown by the watch's stream, the objects naming it
    /// are reconciled ahead of the keys a list brought (the live lane); shown by a list, they
    /// wait behind them (the listed lane).
    #[tokio::test(start_paused = true)]
    async fn a_named_objects_change_on_the_stream_goes_ahead_of_listed_keys() {
        let cancel = CancellationToken::new();
        let g = group(&cancel);
        g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
            .unwrap();
        let (streamed, relisted) = ("/ConfigMap/ns/by-stream", "/ConfigMap/ns/by-list");
        let (secret, other) = ("/Secret/ns/streamed", "/Secret/ns/relisted");
        exists(&g, streamed, "1");
        exists(&g, relisted, "1");
        g.names(streamed, vec![secret.into()], 1, false);
        g.names(relisted, vec![other.into()], 1, false);
        for target in [secret, other] {
            g.named_object_seen(target, "1", 1, false, true);
        }
        assert_eq!(take_all(&g).len(), 2, "both referrers reconciled once");

        let brought: Vec<String> = (0..3)
            .map(|i| format!("/ConfigMap/ns/listed-{i}"))
            .collect();
        for key in &brought {
            listed(&g, key, "1");
        }
        g.named_object_seen(other, "2", 1, false, false);
        g.named_object_seen(secret, "2", 1, false, true);
        let got: Vec<(String, Reason)> = take_all(&g)
            .into_iter()
            .map(|(key, reason, _)| (key, reason))
            .collect();
        let mut want = vec![(streamed.to_owned(), Reason::Referenced)];
        want.extend(brought.into_iter().map(|k| (k, Reason::Added)));
        want.push((relisted.to_owned(), Reason::Referenced));
        assert_eq!(got, want);
        cancel.cancel();
    }

    /// A group of no subscription on the slices `rx` sends, with one session (replica `a`).
    fn one_session_group(
        rx: watch::Receiver<Arc<Slice>>,
        cancel: &CancellationToken,
    ) -> Arc<Group> {
        let g = Group::spawn(
            GroupId::shared("g"),
            GroupSpec::new(Vec::new()),
            QueueConfig::default(),
            Pools::unbounded(),
            RecentDeletionsConfig::NONE,
            rx,
            cancel.clone(),
        );
        g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
            .unwrap();
        g
    }

    /// A settled slice whose Lease deadline has passed hands out nothing: a process paused
    /// past its Lease answers no poll from its old slice before its membership loop has run.
    #[tokio::test(start_paused = true)]
    async fn nothing_is_handed_out_past_the_lease_deadline() {
        let cancel = CancellationToken::new();
        let now = std::time::Instant::now();
        let lease = Arc::new(LeaseDeadline::expired(now));
        let mut slice = Slice::fixed("d0", Ring::new(["d0"]));
        slice.lease = lease.clone();
        let (_tx, rx) = watch::channel(Arc::new(slice));
        let g = one_session_group(rx, &cancel);
        exists(&g, "k", "1");
        assert!(take_all(&g).is_empty(), "the Lease was never renewed");
        lease.extend_to(now + Duration::from_secs(3600));
        assert_eq!(take_all(&g).len(), 1, "a current Lease hands the key out");
        cancel.cancel();
    }

    /// While nothing may be handed out, a key kept in the index records the versions its
    /// events show, and the changes of objects it owns, and is handed out once the gate opens:
    /// no list shows it again then.
    #[tokio::test(start_paused = true)]
    async fn a_kept_key_records_new_versions_while_nothing_is_handed_out() {
        let cancel = CancellationToken::new();
        let settled = Slice::fixed("d0", Ring::new(["d0"]));
        let (tx, rx) = watch::channel(Arc::new(settled.clone()));
        let g = one_session_group(rx, &cancel);
        exists(&g, "k", "1");
        exists(&g, "owner", "1");
        assert_eq!(take_all(&g).len(), 2);

        let mut fenced = settled.clone();
        fenced.settled = None;
        tx.send_replace(Arc::new(fenced));
        g.apply_slice();
        exists(&g, "k", "2");
        exists(&g, "new", "2");
        g.apply(GroupEvent::OwnedChanged {
            key: KeyRef::from("owner"),
        });
        assert!(
            take_all(&g).is_empty(),
            "nothing is handed out while fenced"
        );

        tx.send_replace(Arc::new(settled));
        g.apply_slice();
        let mut got = take_all(&g);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("k".to_owned(), Reason::Modified, "2".to_owned()),
                ("new".to_owned(), Reason::Added, "2".to_owned()),
                ("owner".to_owned(), Reason::Owned, "1".to_owned()),
            ],
            "the kept keys' changes, and a key it owns seen meanwhile, once the gate is open again"
        );
        cancel.cancel();
    }

    /// The driver fires a retry exactly when its backoff ends, and wakes the session's poll.
    #[tokio::test(start_paused = true)]
    async fn timers_fire_on_time_and_wake_the_session() {
        let cancel = CancellationToken::new();
        let g = group(&cancel);
        let (slot, _) = g
            .add_session(1, "s1".into(), "a", Duration::from_secs(60), None)
            .unwrap();
        exists(&g, "k", "1");
        let d = g.take(1, 10, usize::MAX);
        assert_eq!(d.len(), 1);
        let failed_at = Instant::now();
        assert_eq!(g.ack(1, vec![(d[0].id, Outcome::Failure).into()]), 0);
        // Consume the permit the first enqueue left, then wait for the retry's wake-up.
        slot.notify.notified().await;
        assert!(
            g.take(1, 10, usize::MAX).is_empty(),
            "not before the backoff"
        );
        tokio::time::timeout(Duration::from_secs(60), slot.notify.notified())
            .await
            .expect("the retry wakes the session");
        assert_eq!(failed_at.elapsed(), Duration::from_secs(10));
        let retry = g.take(1, 10, usize::MAX);
        assert_eq!((retry[0].reason, retry[0].attempt), (Reason::Retry, 1));
        cancel.cancel();
    }

    /// An unacknowledged delivery is void after the maximum reconcile time.
    #[tokio::test(start_paused = true)]
    async fn an_unacknowledged_delivery_expires_on_time() {
        let cancel = CancellationToken::new();
        let g = group(&cancel);
        g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
            .unwrap();
        exists(&g, "k", "1");
        let d = g.take(1, 10, usize::MAX);
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(g.ack(1, vec![]), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            g.ack(1, vec![(d[0].id, Outcome::Success).into()]),
            1,
            "the delivery expired"
        );
        cancel.cancel();
    }
}
