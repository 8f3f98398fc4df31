//! What a controller group on one dispatcher knows besides its queue as the ring changes: the
//! slice the queue was last trimmed to, the deletions held for keys a handover holds, and the
//! recent deletions of keys other dispatchers own (`dispatcher/HANDOVER.md`, "Deletions in
//! transit"). Pure: the caller passes the slice, the queue and the time, and holds one lock
//! around the queue and its partition.

use std::{collections::HashSet, sync::Arc, time::Instant};

use kube_dispatch_proto::{Ring, key::hash64, v1::Reason};
use tracing::{debug, warn};

use crate::{
    handover::Slice,
    key::KeyRef,
    queue::{Change, GroupQueue, Observed, SessionId},
    recent_deletions::{RecentDeletions, RecentDeletionsConfig},
};

/// What a watch, a list beside it or a peer tells a group of one key: the group's one entry for
/// events ([`Partition::record`]). Besides these, a group takes the end of a re-list
/// ([`GroupQueue::sweep`]) and a ring change ([`Partition::apply`]).
#[derive(Debug)]
pub enum GroupEvent<'a> {
    /// The watch shows the object of a key it placed on this dispatcher (its stream, or its
    /// own list with that list's `epoch`).
    Exists {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The object as the group keeps it.
        object: Observed,
        /// The list that showed it, or the list the stream follows.
        epoch: u32,
    },
    /// The watch shows the object of a key another dispatcher owned when it looked: no body.
    /// A deletion remembered for it is forgotten.
    ExistsElsewhere {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The object, without a body.
        object: Observed,
        /// As for [`GroupEvent::Exists`].
        epoch: u32,
    },
    /// The object of a key was deleted: seen by the watch, wherever the key is placed, or
    /// remembered by a peer (`change.deleted` is set).
    Deleted {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The deletion.
        change: Change,
    },
    /// An object the key's object owns changed or went away.
    OwnedChanged {
        /// The owner's request key.
        key: KeyRef<'a>,
    },
    /// An object the key's object names at a field path (`crate::references`) was created,
    /// changed or deleted.
    NamedChanged {
        /// The naming object's request key.
        key: KeyRef<'a>,
    },
    /// A replica asked for a reconcile of the key (`Dispatcher.Trigger`): taken only for a key
    /// served here whose object the queue knows exists, so a trigger adds no key and never
    /// hurries a deletion's retry.
    Triggered {
        /// The key.
        key: KeyRef<'a>,
    },
    /// A list run beside the watch's stream shows the object, for keys newly served here. The
    /// stream is the authority on every key it has shown (the list may be older), so this
    /// fills only a key the queue knows no version of.
    Listed {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The object as the group keeps it.
        object: Observed,
        /// The watch's list epoch.
        epoch: u32,
    },
    /// A list run beside the watch's stream shows an owned object, on the terms of
    /// [`GroupEvent::Listed`]: only for an owner key the queue does not hold.
    ListedOwned {
        /// The owner's request key.
        key: KeyRef<'a>,
    },
}

/// The partition bookkeeping of one group. Every method takes the slice current at the call:
/// the one the group's caller read under the same lock as the queue.
#[derive(Debug)]
pub struct Partition {
    /// The group, for logs.
    group: Arc<str>,
    /// The slice the queue was last trimmed to.
    applied: Option<Arc<Slice>>,
    /// Keys that moved here whose objects were deleted while the handover held them: queued as
    /// deleted once the handover completes (a re-list cannot show a deletion). At most one per
    /// key of the slice.
    held: HashSet<String>,
    /// Recent deletions of keys other dispatchers own: when the ring gives such a key to this
    /// dispatcher, its deletion joins `held`, since it may have happened after the old owner
    /// stopped delivering. Bounded by its config.
    recent: RecentDeletions,
}

impl Partition {
    /// The partition of `group`, whose queue is empty and trimmed to `slice`.
    pub fn new(group: &str, slice: Arc<Slice>, recent: RecentDeletionsConfig) -> Self {
        Self {
            group: group.into(),
            applied: Some(slice),
            held: HashSet::new(),
            recent: RecentDeletions::new(recent),
        }
    }

    /// What `event` means for the group under `slice`: recorded in `queue` if the key is
    /// served here, or kept while nothing may be handed out (`Partition::keeps`), or on its
    /// way out ([`GroupQueue::is_leaving`]; if the ring brings it back before it settles, the
    /// change is delivered, and a list that follows skips keys known here); otherwise left to
    /// the partition: a deletion held for a handover, or remembered for a key owned elsewhere.
    /// Call with `queue` trimmed to `slice` ([`Partition::apply`]). Returns the sessions to wake.
    pub fn record(
        &mut self,
        slice: &Slice,
        queue: &mut GroupQueue,
        event: GroupEvent<'_>,
        now: Instant,
    ) -> Vec<SessionId> {
        let unserved = |queue: &GroupQueue, key: KeyRef<'_>| {
            Self::keeps(slice, queue, key) || queue.is_leaving(key.text())
        };
        match event {
            GroupEvent::Exists { key, object, epoch } => {
                if self.admits(slice, key, Some(false), now) || unserved(queue, key) {
                    return queue.observe(key.text(), object, epoch);
                }
            }
            GroupEvent::ExistsElsewhere { key, object, epoch } => {
                self.exists_elsewhere(slice, key);
                if slice.serves_key(key) || unserved(queue, key) {
                    return queue.observe(key.text(), object, epoch);
                }
            }
            GroupEvent::Deleted { key, change } => {
                debug_assert!(change.deleted, "a deletion: {change:?}");
                // Recorded too if the key is still here on its way out, so that its earlier
                // object's deletion goes first if it is created again.
                if self.admits(slice, key, Some(true), now) || queue.is_leaving(key.text()) {
                    return queue.change(key.text(), change);
                }
            }
            GroupEvent::OwnedChanged { key } => {
                if slice.serves_key(key) || unserved(queue, key) {
                    return queue.change(key.text(), Change::related(Reason::Owned));
                }
            }
            GroupEvent::NamedChanged { key } => {
                if slice.serves_key(key) || unserved(queue, key) {
                    return queue.change(key.text(), Change::related(Reason::Referenced));
                }
            }
            GroupEvent::Triggered { key } => {
                if slice.serves_key(key) && queue.knows_live(key.text()) {
                    return queue.change(key.text(), Change::related(Reason::Triggered));
                }
            }
            GroupEvent::Listed { key, object, epoch } => {
                if slice.serves_key(key) && !queue.knows_object(key.text()) {
                    return queue.observe(key.text(), object, epoch);
                }
            }
            GroupEvent::ListedOwned { key } => {
                if slice.serves_key(key) && !queue.contains(key.text()) {
                    return queue.change(key.text(), Change::related(Reason::Owned));
                }
            }
        }
        Vec::new()
    }

    /// Whether `key` (with `hash`) is served under `slice`, so its event goes to the queue.
    /// Otherwise records whether its object was deleted (`Some(true)`) or exists
    /// (`Some(false)`): for a key held by a handover, in the held deletions; for a key owned
    /// elsewhere, in the recent deletions.
    fn admits(
        &mut self,
        slice: &Slice,
        key: KeyRef<'_>,
        deleted: Option<bool>,
        now: Instant,
    ) -> bool {
        let placement = slice.placement(key);
        let (hash, key) = (key.hash(), key.text());
        if slice.serves_hash(placement) {
            if deleted == Some(true) {
                debug!(group = %self.group, key, "deletion queued: the key is served here");
            }
            return true;
        }
        let Some(deleted) = deleted else {
            return false;
        };
        if slice.owns_hash(placement) {
            if deleted {
                debug!(group = %self.group, key, "deletion held: the key moved here and the handover holds it");
                self.held.insert(key.to_owned());
            } else {
                self.held.remove(key);
                self.recent.exists(hash);
            }
        } else if deleted {
            debug!(group = %self.group, key, "deletion remembered: the key is owned elsewhere");
            if !self.recent.deleted(hash, key, now) {
                let missed = self.recent.overflowed();
                if missed.is_power_of_two() {
                    warn!(
                        group = %self.group,
                        remembered = self.recent.len(),
                        missed,
                        "too many recent deletions of keys owned elsewhere to remember: if such a key moves here, its deletion may not be delivered (raise --max-recent-deletions)"
                    );
                }
            }
        } else {
            self.recent.exists(hash);
        }
        false
    }

    /// Deletions held for the end of a handover, and deletions of keys owned elsewhere
    /// remembered, for metrics.
    pub fn figures(&self) -> (usize, usize) {
        (self.held.len(), self.recent.len())
    }

    /// Whether `key`, not served, is kept in the index while nothing may be handed out: a key
    /// indexed already, or one this dispatcher owns on its ring (after a start, its keys are
    /// held until the gate opens; indexed, a re-list of a watch that could not resume meanwhile
    /// shows which of them were deleted).
    fn keeps(slice: &Slice, queue: &GroupQueue, key: KeyRef<'_>) -> bool {
        slice.settled.is_none() && (queue.contains(key.text()) || slice.owns_key(key))
    }

    /// Records that the object of `key`, which this dispatcher did not own when the watch
    /// looked, exists: a deletion remembered for it is forgotten (or, if the key has moved here
    /// since, a deletion held for it).
    fn exists_elsewhere(&mut self, slice: &Slice, key: KeyRef<'_>) {
        if slice.owns_key(key) {
            self.held.remove(key.text());
        }
        self.recent.exists(key.hash());
    }

    /// The remembered deletions of keys `identity` owns on `ring`, for a peer that starts
    /// serving this group.
    pub fn recent_deletions_owned_by(
        &mut self,
        ring: &Ring,
        identity: &str,
        now: Instant,
    ) -> Vec<Arc<str>> {
        self.recent.keys_where(now, |_, key| {
            ring.owner_of_hash(ring.place(key)) == Some(identity)
        })
    }

    /// Trims `queue` to `slice` if it changed since the last call: keys that moved away are
    /// forgotten once what was queued for them here has been delivered and settled (right away
    /// when nothing may be handed out); deletions held by a handover that completed are queued.
    /// Returns the sessions to wake, and whether a key this dispatcher no longer owns is still
    /// queued or in flight, which holds back the release of the ring.
    pub fn apply(
        &mut self,
        slice: &Arc<Slice>,
        queue: &mut GroupQueue,
        now: Instant,
    ) -> (Vec<SessionId>, bool) {
        let mut wake = Vec::new();
        if !self.applied.as_ref().is_some_and(|a| Arc::ptr_eq(a, slice)) {
            // While nothing may be handed out (fenced, draining, starting, or not on the ring it
            // sees, e.g. cut off from the API server), the keys still owned stay indexed: once
            // the gate opens again, a re-list shows which of them were deleted meanwhile,
            // perhaps while the watch was down too.
            if slice.settled.is_some() {
                // Keys that moved away are delivered here first only if this dispatcher was
                // serving them until now (not when it comes back from handing out nothing).
                let was_serving = self.applied.as_ref().is_some_and(|a| a.settled.is_some());
                queue.forget_where(|key| !slice.serves_str(key), was_serving);
            } else if slice.is_member() {
                queue.forget_where(|key| !slice.owns_str(key), false);
            }
            // Not on its own ring: it owns nothing it could hand out or release, so the index
            // stays as it was until it is back on a ring.
            self.applied = Some(slice.clone());
            // Held deletions of keys that moved away again are remembered as deletions of keys
            // owned elsewhere: the key may come back here (after a flap, or once this dispatcher
            // is back on its ring), and its new owner may not have seen it.
            let away: Vec<String> = self
                .held
                .iter()
                .filter(|key| !slice.owns_str(key))
                .cloned()
                .collect();
            for key in away {
                debug!(group = %self.group, key, "held deletion remembered: the key moved away again");
                self.held.remove(&key);
                self.recent.deleted(hash64(key.as_bytes()), &key, now);
            }
            // Keys that moved here may have been deleted while in transit.
            let moved_in = self.recent.take_where(now, |_, key| slice.owns_str(key));
            for key in &moved_in {
                debug!(group = %self.group, key = &**key, "remembered deletion held: the key moved here");
            }
            self.held.extend(moved_in.iter().map(|key| key.to_string()));
            let released: Vec<String> = self
                .held
                .iter()
                .filter(|key| slice.serves_str(key))
                .cloned()
                .collect();
            for key in released {
                debug!(group = %self.group, key, "held deletion queued: the handover completed");
                self.held.remove(&key);
                wake.extend(queue.change(&key, Change::deletion()));
            }
        }
        // Keys that moved away, ready for a group that has no session left to deliver them:
        // left to their new owner, their deletions remembered for it.
        for key in queue.abandon_leaving_ready() {
            debug!(group = %self.group, key, "a deletion that moved away had no session here to take it: remembered for its new owner");
            self.recent.deleted(hash64(key.as_bytes()), &key, now);
        }
        let pending = queue.any_leaving(|key| !slice.owns_str(key));
        (wake, pending)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{backoff::Backoff, queue::QueueConfig};

    const REMEMBER: RecentDeletionsConfig = RecentDeletionsConfig {
        window: Duration::from_secs(60),
        capacity: 100,
    };

    fn queue() -> GroupQueue {
        GroupQueue::new(QueueConfig {
            backoff: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(1),
            },
            max_reconcile_time: Duration::from_secs(30),
            body_budget: 1 << 20,
            memo_budget: 1 << 20,
        })
    }

    /// A key that `owner` owns on a ring of `members`.
    fn key_of(owner: &str, members: &[&str]) -> String {
        let ring = Ring::new(members.iter().copied());
        (0..1000)
            .map(|i| format!("/ConfigMap/ns/k-{i}"))
            .find(|k| ring.owner_of_hash(hash64(k.as_bytes())) == Some(owner))
            .expect("one of 1000 keys falls on the owner")
    }

    /// `identity` on a ring of `members`, in the middle of a handover from `settled`.
    fn moving(identity: &str, members: &[&str], settled: &[&str]) -> Arc<Slice> {
        let mut slice = Slice::fixed(identity, Ring::new(members.iter().copied()));
        slice.settled = Some(Arc::new(Ring::new(settled.iter().copied())));
        Arc::new(slice)
    }

    fn fixed(identity: &str, members: &[&str]) -> Arc<Slice> {
        Arc::new(Slice::fixed(identity, Ring::new(members.iter().copied())))
    }

    /// The keys `queue` hands out, with whether each is a deletion.
    fn taken(queue: &mut GroupQueue, now: Instant) -> Vec<(String, bool)> {
        if !queue.has_session(1) {
            queue.add_session(1, "r");
        }
        queue
            .take(1, 100, now)
            .into_iter()
            .map(|d| (d.key, d.deleted))
            .collect()
    }

    #[test]
    fn a_deletion_of_a_key_owned_elsewhere_is_delivered_once_the_key_moves_here() {
        let now = Instant::now();
        // d0 and d1; the key is d1's. d1 leaves: the key moves to d0.
        let key = key_of("d1", &["d0", "d1"]);
        let before = fixed("d0", &["d0", "d1"]);
        let mut queue = queue();
        let mut p = Partition::new("g", before.clone(), REMEMBER);
        assert!(!p.admits(&before, KeyRef::new(&key), Some(true), now));
        assert_eq!(taken(&mut queue, now), []);
        // The ring changes; the handover holds the key, then completes.
        let during = moving("d0", &["d0"], &["d0", "d1"]);
        let (_, pending) = p.apply(&during, &mut queue, now);
        assert!(!pending);
        assert_eq!(
            taken(&mut queue, now),
            [],
            "held while the handover holds it"
        );
        let after = fixed("d0", &["d0"]);
        p.apply(&after, &mut queue, now);
        assert_eq!(taken(&mut queue, now), [(key, true)]);
    }

    #[test]
    fn a_key_seen_to_exist_after_its_deletion_is_not_delivered_as_deleted() {
        let now = Instant::now();
        let key = key_of("d1", &["d0", "d1"]);
        let before = fixed("d0", &["d0", "d1"]);
        let mut queue = queue();
        let mut p = Partition::new("g", before.clone(), REMEMBER);
        assert!(!p.admits(&before, KeyRef::new(&key), Some(true), now));
        // Re-created before the key moves here.
        p.exists_elsewhere(&before, KeyRef::new(&key));
        p.apply(&fixed("d0", &["d0"]), &mut queue, now);
        assert_eq!(taken(&mut queue, now), []);
    }

    #[test]
    fn a_deletion_held_for_a_key_that_moves_away_again_is_remembered_and_not_delivered() {
        let now = Instant::now();
        // d0 takes over d1's key; while the handover holds it, the key is deleted; the ring
        // flaps back before the handover completes.
        let key = key_of("d1", &["d0", "d1"]);
        let mut queue = queue();
        let during = moving("d0", &["d0"], &["d0", "d1"]);
        let mut p = Partition::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
        p.apply(&during, &mut queue, now);
        assert!(!p.admits(&during, KeyRef::new(&key), Some(true), now));
        let back = fixed("d0", &["d0", "d1"]);
        p.apply(&back, &mut queue, now);
        assert_eq!(taken(&mut queue, now), []);
        // It is remembered: a peer that now owns the key gets it.
        let owned = p.recent_deletions_owned_by(&Ring::new(["d0", "d1"]), "d1", now);
        assert_eq!(
            owned.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
            [key]
        );
    }

    #[test]
    fn a_served_key_goes_to_the_queue_and_one_owned_while_nothing_is_served_is_kept() {
        let now = Instant::now();
        let key = key_of("d0", &["d0", "d1"]);
        let serving = fixed("d0", &["d0", "d1"]);
        let mut p = Partition::new("g", serving.clone(), REMEMBER);
        assert!(p.admits(&serving, KeyRef::new(&key), Some(false), now));
        let starting = Arc::new(serving.closed());
        assert!(!p.admits(&starting, KeyRef::new(&key), Some(false), now));
        assert!(Partition::keeps(&starting, &queue(), KeyRef::new(&key)));
        let other = key_of("d1", &["d0", "d1"]);
        assert!(!Partition::keeps(&starting, &queue(), KeyRef::new(&other)));
        assert!(
            !Partition::keeps(&serving, &queue(), KeyRef::new(&key)),
            "served keys need no keeping"
        );
    }

    #[test]
    fn keys_that_moved_away_hold_back_the_release_until_delivered_and_settled() {
        let now = Instant::now();
        let key = key_of("d1", &["d0", "d1"]);
        let mut queue = queue();
        let alone = fixed("d0", &["d0"]);
        let mut p = Partition::new("g", alone.clone(), REMEMBER);
        queue.add_session(1, "r");
        queue.change(&key, Change::related(Reason::Owned));
        // d1 joins: the key moves away while queued here; it is delivered here first.
        let joined = moving("d0", &["d0", "d1"], &["d0"]);
        let (_, pending) = p.apply(&joined, &mut queue, now);
        assert!(pending, "the queued key holds back the release");
        let delivered = queue.take(1, 10, now);
        assert_eq!(delivered.len(), 1);
        let (_, pending) = p.apply(&joined, &mut queue, now);
        assert!(pending, "in flight still holds it back");
        queue.ack(1, delivered[0].id, crate::queue::Outcome::Success, now);
        let (_, pending) = p.apply(&joined, &mut queue, now);
        assert!(!pending);
    }

    /// A moved key ready for a group with no session left (its replicas hung until their
    /// sessions expired) does not hold the release back: it is left to its new owner, and a
    /// deletion among such keys is remembered for it.
    #[test]
    fn keys_that_moved_away_ready_for_no_session_are_left_to_the_new_owner() {
        let now = Instant::now();
        let key = key_of("d1", &["d0", "d1"]);
        let mut queue = queue();
        let mut p = Partition::new("g", fixed("d0", &["d0"]), REMEMBER);
        queue.change(&key, Change::deletion());
        let joined = moving("d0", &["d0", "d1"], &["d0"]);
        let (_, pending) = p.apply(&joined, &mut queue, now);
        assert!(!pending, "nothing holds the release back");
        assert!(queue.is_empty());
        let ring = Ring::new(["d0", "d1"]);
        assert_eq!(
            p.recent_deletions_owned_by(&ring, "d1", now)
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>(),
            [key],
            "the deletion is remembered for d1"
        );
    }
}
