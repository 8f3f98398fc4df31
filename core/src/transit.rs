//! Keys in transit between dispatchers: what a controller group on one dispatcher keeps besides
//! its queue as the ring changes. The slice the queue was last trimmed to, the changes and
//! deletions of keys a handover holds, and the recent deletions of keys other dispatchers own
//! (`dispatcher/HANDOVER.md`, "Deletions in transit"). Pure: the caller passes the slice, the
//! queue and the time, and holds one lock around the queue and its [`Transit`].
//!
//! A group takes every event of a key through [`Transit::record`] ([`GroupEvent`] says what was
//! seen, and [`Origin`] where), and every change of the slice through [`Transit::trim`].

use std::{collections::HashSet, sync::Arc, time::Instant};

use indexmap::IndexMap;
use kube_dispatch_proto::{Ring, key::hash64, v1::Reason};
use tracing::{debug, warn};

mod event;
pub use event::{GroupEvent, Origin};
mod held_keys;
use held_keys::HeldKeys;

use crate::{
    handover::Slice,
    key::KeyRef,
    queue::{Change, GroupQueue, Lane, Observed, SessionId},
    recent_deletions::{RecentDeletions, RecentDeletionsConfig},
};

/// The most changes a group remembers of keys a handover holds ([`Transit`]'s `changed`):
/// about 150 bytes each (a key, a resourceVersion and a uid), so at most about 600 KiB a group.
/// Past it a change is still delivered, only not ahead of the keys the handover brings.
pub const MAX_HELD_CHANGES: usize = 4096;

/// A change of a key the ring gave this dispatcher that it could not hand out yet: once the key
/// is served here it goes ahead of the keys the handover brought, which otherwise reach the
/// queue in a list's (name) order, so a write made during a handover does not wait behind
/// every key that moved.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HeldChange {
    /// The queue holds the key already (kept while nothing may be handed out): only its place
    /// changes.
    Queued,
    /// The object as the watch last showed it, without its body, and the list epoch it was
    /// seen in.
    Seen {
        resource_version: String,
        uid: String,
        epoch: u32,
    },
    /// An object it owns or names changed.
    Related(Reason),
}

/// What a [`Transit`] holds, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransitFigures {
    /// Deletions held for the end of a handover.
    pub held: usize,
    /// Deletions of keys owned elsewhere remembered.
    pub remembered: usize,
    /// Changes of keys a handover holds, to go first when it ends (at most
    /// [`MAX_HELD_CHANGES`]).
    pub held_changes: usize,
    /// Keys the ring gave this dispatcher whose objects it knows exist but no queue here
    /// knows yet ([`Transit`]'s `held_keys`).
    pub held_keys: usize,
}

/// What one group keeps of keys in transit (see the module's doc). Every method takes the slice current at the call:
/// the one the group's caller read under the same lock as the queue.
#[derive(Debug)]
pub struct Transit {
    /// The group, for logs.
    group: Arc<str>,
    /// The slice the queue was last trimmed to.
    trimmed_to: Option<Arc<Slice>>,
    /// Keys that moved here whose objects were deleted while the handover held them: queued as
    /// deleted once the handover completes (a re-list cannot show a deletion). At most one per
    /// key of the slice.
    held: HashSet<String>,
    /// Recent deletions of keys other dispatchers own: when the ring gives such a key to this
    /// dispatcher, its deletion joins `held`, since it may have happened after the old owner
    /// stopped delivering. Bounded by its config.
    recent: RecentDeletions,
    /// Changes of keys the ring gave this dispatcher, made while it could not hand them out
    /// (the handover held them, or its gate was closed), about in the order first seen: they go
    /// first once the keys are served here ([`GroupQueue::promote`]). Forgotten if the key
    /// moves away again, is deleted (the deletion is held instead) or a re-list does not show
    /// it. At most [`MAX_HELD_CHANGES`].
    changed: IndexMap<String, HeldChange, foldhash::fast::RandomState>,
    /// Changes not remembered in `changed` because it was full, for logs.
    changed_overflow: u64,
    /// The index of held keys: which keys the handover holds exist, for the sweep of a
    /// re-list to find their deletions ([`Transit::sweep`]).
    held_keys: HeldKeys,
}

impl Transit {
    /// The transit of `group`, whose queue is empty and trimmed to `slice`.
    pub fn new(group: &str, slice: Arc<Slice>, recent: RecentDeletionsConfig) -> Self {
        Self {
            group: group.into(),
            trimmed_to: Some(slice),
            held: HashSet::new(),
            recent: RecentDeletions::new(recent),
            changed: IndexMap::default(),
            changed_overflow: 0,
            held_keys: HeldKeys::default(),
        }
    }

    /// The queue took a version of `key`'s object: a version remembered for it is older, and
    /// only the key's place remains to change.
    fn queued_now(&mut self, key: &str) {
        if let Some(held) = self.changed.get_mut(key)
            && matches!(held, HeldChange::Seen { .. })
        {
            *held = HeldChange::Queued;
        }
    }

    /// Remembers `change` of `key`, which this dispatcher owns but cannot hand out yet.
    fn hold_change(&mut self, key: &str, change: HeldChange) {
        if let Some(held) = self.changed.get_mut(key) {
            // The object's latest version replaces an earlier one or a related change; a
            // related change adds nothing to a version, which is delivered anyway.
            if matches!(change, HeldChange::Seen { .. }) {
                *held = change;
            }
            return;
        }
        if self.changed.len() >= MAX_HELD_CHANGES {
            self.changed_overflow += 1;
            if self.changed_overflow.is_power_of_two() {
                debug!(
                    group = %self.group,
                    held = self.changed.len(),
                    missed = self.changed_overflow,
                    "too many changes of keys a handover holds to remember: the rest are delivered in the order the handover brings their keys"
                );
            }
            return;
        }
        self.changed.insert(key.to_owned(), change);
    }

    /// What the end of the re-list of epoch `epoch` reveals of the keys `belongs` accepts
    /// (those of its subscription) that no queue here knows: a key of the index of held keys
    /// the list did not show was deleted while the watch was away, and its deletion is held
    /// (or queued, if the key is served now), as if the watch had seen it; changes
    /// remembered of such keys are forgotten. Call when a re-list ends, after
    /// [`GroupQueue::sweep`], with `queue` trimmed to `slice`. Returns the sessions to wake.
    pub fn sweep(
        &mut self,
        slice: &Slice,
        queue: &mut GroupQueue,
        (epoch, belongs): (u32, impl Fn(&str) -> bool),
        now: Instant,
    ) -> Vec<SessionId> {
        self.changed.retain(|key, change| match change {
            HeldChange::Seen { epoch: seen, .. } => *seen == epoch || !belongs(key),
            HeldChange::Queued | HeldChange::Related(_) => true,
        });
        let mut wake = Vec::new();
        for key in self.held_keys.swept(epoch, &belongs) {
            debug!(group = %self.group, key, "a key held by a handover was deleted while the watch was away: its deletion is held");
            wake.extend(self.record(
                slice,
                queue,
                GroupEvent::Deleted {
                    key: KeyRef::new(&key),
                    change: Change::deletion(),
                },
                now,
            ));
        }
        wake
    }

    /// What `event` means for the group under `slice`: recorded in `queue` if the key is
    /// served here, or kept while nothing may be handed out (`Transit::keeps`), or on its
    /// way out ([`GroupQueue::is_leaving`]; if the ring brings it back before it settles, the
    /// change is delivered, and a list that follows skips keys known here); otherwise left to
    /// the transit: a deletion held for a handover, or remembered for a key owned elsewhere.
    /// A change of a key this dispatcher owns but cannot hand out yet is also remembered, to go
    /// first once it can (`dispatcher/HANDOVER.md`, "Changes made during a handover"), when
    /// the event comes from the watch's stream ([`Origin::Stream`]): a list shows every object,
    /// changed or not. Call with `queue` trimmed to `slice` ([`Transit::trim`]). Returns the
    /// sessions to wake.
    pub fn record(
        &mut self,
        slice: &Slice,
        queue: &mut GroupQueue,
        event: GroupEvent<'_>,
        now: Instant,
    ) -> Vec<SessionId> {
        match event {
            GroupEvent::Exists {
                key,
                object,
                epoch,
                origin,
            } => {
                if self.admits(slice, key, Some(false), now) {
                    self.queued_now(key.text());
                    self.held_keys.forget(key.text());
                    return queue.observe_in(key.text(), object, epoch, origin.lane());
                }
                return self.hold_object(slice, queue, (key, object, epoch), origin);
            }
            GroupEvent::ExistsElsewhere {
                key,
                object,
                epoch,
                origin,
            } => {
                self.exists_elsewhere(slice, key);
                if slice.serves_key(key) {
                    self.queued_now(key.text());
                    self.held_keys.forget(key.text());
                    return queue.observe_in(key.text(), object, epoch, origin.lane());
                }
                return self.hold_object(slice, queue, (key, object, epoch), origin);
            }
            GroupEvent::Deleted { key, change } => {
                debug_assert!(change.deleted, "a deletion: {change:?}");
                // Recorded too if the key is still here on its way out, so that its earlier
                // object's deletion goes first if it is created again.
                // A change held for the key is superseded: its deletion is held instead.
                self.changed.swap_remove(key.text());
                self.held_keys.forget(key.text());
                if self.admits(slice, key, Some(true), now) || queue.is_leaving(key.text()) {
                    return queue.change(key.text(), change);
                }
            }
            GroupEvent::OwnedChanged {
                key,
                origin,
                owners_listed,
            } => {
                let left_to_list =
                    owners_listed && slice.serves_key(key) && !queue.knows_object(key.text());
                if !left_to_list {
                    return self.hold_related(slice, queue, (key, Reason::Owned), origin);
                }
            }
            GroupEvent::NamedChanged { key, origin } => {
                return self.hold_related(slice, queue, (key, Reason::Referenced), origin);
            }
            GroupEvent::Triggered { key } => {
                if slice.serves_key(key) && queue.knows_live(key.text()) {
                    return queue.change(key.text(), Change::related(Reason::Triggered));
                }
            }
            GroupEvent::Listed { key, object, epoch } => {
                if slice.serves_key(key) {
                    self.held_keys.forget(key.text());
                    if !queue.knows_object(key.text()) {
                        return queue.observe_in(key.text(), object, epoch, Lane::Listed);
                    }
                    // A change remembered during the handover was queued at this version
                    // without its body: the list brings it.
                    queue.fill_body(key.text(), object);
                } else {
                    // The list a handover's start asks for fills the index of held keys.
                    self.index_held(slice, queue, key, epoch);
                }
            }
            GroupEvent::ListedOwned { key } => {
                if slice.serves_key(key) && !queue.contains(key.text()) {
                    return queue.change_in(
                        key.text(),
                        Change::related(Reason::Owned),
                        Lane::Listed,
                    );
                }
            }
        }
        Vec::new()
    }

    /// The object of `key`, not served here, exists as `object`: recorded in `queue` if the
    /// key is kept there or on its way out, its change remembered to go first if this
    /// dispatcher owns it ([`HeldChange`]), else nothing.
    fn hold_object(
        &mut self,
        slice: &Slice,
        queue: &mut GroupQueue,
        (key, object, epoch): (KeyRef<'_>, Observed, u32),
        origin: Origin,
    ) -> Vec<SessionId> {
        let text = key.text();
        let lane = origin.lane();
        let streamed = origin == Origin::Stream;
        if Self::keeps(slice, queue, key) {
            // A new version of a key the queue holds already; its first sight (the list
            // that fills a starting dispatcher's index) is no change to hurry.
            if streamed
                && queue.knows_live(text)
                && !queue.knows_version(text, &object.resource_version)
            {
                self.hold_change(text, HeldChange::Queued);
            } else {
                self.queued_now(text);
            }
            self.held_keys.forget(text);
            return queue.observe_in(text, object, epoch, lane);
        }
        if queue.is_leaving(text) {
            self.queued_now(text);
            self.held_keys.forget(text);
            return queue.observe_in(text, object, epoch, lane);
        }
        self.index_held(slice, queue, key, epoch);
        if streamed && slice.owns_key(key) {
            self.hold_change(
                text,
                HeldChange::Seen {
                    resource_version: object.resource_version,
                    uid: object.uid,
                    epoch,
                },
            );
        }
        Vec::new()
    }

    /// The object of `key` exists as of list epoch `epoch`, and no queue here knows it: the
    /// index of held keys records it if this dispatcher owns the key (the handover holds it),
    /// so that a re-list that does not show it reveals its deletion, and keeps up with it if it
    /// knows it already, whoever owns it now (off its own ring the index stays as it was).
    fn index_held(&mut self, slice: &Slice, queue: &GroupQueue, key: KeyRef<'_>, epoch: u32) {
        let text = key.text();
        let held = slice.owns_key(key) && !queue.contains(text) && !Self::keeps(slice, queue, key);
        self.held_keys.seen(text, epoch, held);
    }

    /// An object the object of `key` owns or names changed (`reason`): recorded in `queue` if
    /// the key is served, kept or on its way out, and remembered to go first if this
    /// dispatcher owns it but cannot hand it out yet.
    fn hold_related(
        &mut self,
        slice: &Slice,
        queue: &mut GroupQueue,
        (key, reason): (KeyRef<'_>, Reason),
        origin: Origin,
    ) -> Vec<SessionId> {
        let text = key.text();
        let lane = origin.lane();
        let streamed = origin == Origin::Stream;
        if slice.serves_key(key) {
            return queue.change_in(text, Change::related(reason), lane);
        }
        if Self::keeps(slice, queue, key) {
            if streamed {
                self.hold_change(text, HeldChange::Queued);
            }
            return queue.change_in(text, Change::related(reason), lane);
        }
        if queue.is_leaving(text) {
            return queue.change_in(text, Change::related(reason), lane);
        }
        if streamed && slice.owns_key(key) {
            self.hold_change(text, HeldChange::Related(reason));
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

    /// Deletions held for the end of a handover, deletions of keys owned elsewhere remembered,
    /// and changes held to go first at the end of a handover, for metrics.
    pub fn figures(&self) -> TransitFigures {
        TransitFigures {
            held: self.held.len(),
            remembered: self.recent.len(),
            held_changes: self.changed.len(),
            held_keys: self.held_keys.len(),
        }
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
    pub fn trim(
        &mut self,
        slice: &Arc<Slice>,
        queue: &mut GroupQueue,
        now: Instant,
    ) -> (Vec<SessionId>, bool) {
        let mut wake = Vec::new();
        if !self
            .trimmed_to
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(a, slice))
        {
            // While nothing may be handed out (fenced, draining, starting, or not on the ring it
            // sees, e.g. cut off from the API server), the keys still owned stay indexed: once
            // the gate opens again, a re-list shows which of them were deleted meanwhile,
            // perhaps while the watch was down too.
            if slice.settled.is_some() {
                // Keys that moved away are delivered here first only if this dispatcher was
                // serving them until now (not when it comes back from handing out nothing).
                let was_serving = self
                    .trimmed_to
                    .as_ref()
                    .is_some_and(|a| a.settled.is_some());
                queue.forget_where(|key| !slice.serves_str(key), was_serving);
            } else if slice.is_member() {
                queue.forget_where(|key| !slice.owns_str(key), false);
            }
            // Not on its own ring: it owns nothing it could hand out or release, so the index
            // stays as it was until it is back on a ring.
            self.trimmed_to = Some(slice.clone());
            wake = self.release_held(slice, queue, now);
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

    /// The slice changed to `slice`: held deletions and changes of keys that moved away again
    /// are remembered for their new owner or dropped, remembered deletions of keys that moved
    /// here are held, and what is held of keys now served here is queued, ahead of the keys the
    /// handover brings. Returns the sessions to wake.
    fn release_held(
        &mut self,
        slice: &Slice,
        queue: &mut GroupQueue,
        now: Instant,
    ) -> Vec<SessionId> {
        let mut wake = Vec::new();
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
        // Changes of keys that moved away again are their new owner's to deliver, and their
        // objects its to list.
        self.changed.retain(|key, _| slice.owns_str(key));
        if slice.is_member() {
            self.held_keys.retain_owned(slice);
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
        for key in &released {
            debug!(group = %self.group, key, "held deletion queued: the handover completed");
            self.held.remove(key);
            wake.extend(queue.change(key, Change::deletion()));
        }
        // Changes made while the handover held their keys go first: deletions, then the
        // rest in the order they were seen.
        let mut first = released;
        let changed = std::mem::take(&mut self.changed);
        for (key, change) in changed {
            if !slice.serves_str(&key) {
                self.changed.insert(key, change);
                continue;
            }
            match change {
                HeldChange::Queued => {}
                HeldChange::Seen {
                    resource_version,
                    uid,
                    epoch,
                } => {
                    let object = Observed {
                        resource_version,
                        uid,
                        body: None,
                        trace: None,
                        fingerprint: None,
                    };
                    wake.extend(queue.observe(&key, object, epoch));
                }
                HeldChange::Related(reason) => {
                    wake.extend(queue.change(&key, Change::related(reason)));
                }
            }
            first.push(key);
        }
        if !first.is_empty() {
            debug!(group = %self.group, keys = first.len(), "changes made while a handover held their keys go first");
            queue.promote(first.iter().map(String::as_str));
        }
        wake
    }
}

#[cfg(test)]
mod tests;
