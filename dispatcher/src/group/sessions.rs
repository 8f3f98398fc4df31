//! The group's sessions: opened, closed and expired under the group's lock beside the queue's
//! half of them, and the deliveries they take and acknowledge.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube_dispatch_core::{
    ack::Acked,
    children::OwnerChildren,
    queue::{AckResult, Delivery, SessionId},
};
use tokio::{sync::Notify, time::Instant};

use super::{Ended, Group, SessionSlot, State, children_of, waits_for_children};
#[cfg(doc)]
use kube_dispatch_core::queue::GroupQueue;

impl Group {
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
    ) -> Result<(Arc<SessionSlot>, Vec<Ended>), String> {
        let slot = Arc::new(SessionSlot {
            notify: Notify::new(),
            expires_at: Mutex::new(Instant::now() + ttl),
            replica: replica.to_owned(),
            ttl,
            wire_id,
            opener: opener.map(str::to_owned),
            stopping: std::sync::atomic::AtomicBool::new(false),
            told_dead: std::sync::atomic::AtomicU64::new(0),
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
            let mut older = Vec::new();
            let mut idle = HashMap::new();
            for (old, slot) in sessions.iter().filter(|(_, s)| s.replica == replica) {
                let until = *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner());
                idle.insert(*old, queue.has_nothing_in_flight(*old));
                older.push((*old, until.into_std()));
            }
            // One step: the replica keeps its place on the group's ring.
            let wake = queue.add_session_replacing(id, replica, &older);
            let mut replaced = Vec::new();
            for old in before {
                if !queue.has_session(old)
                    && let Some(slot) = sessions.remove(&old)
                {
                    slot.notify.notify_one();
                    let idle = idle.get(&old).copied().unwrap_or(false);
                    replaced.push(Ended { slot, idle });
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
    /// [`GroupQueue::remove_session_holding`]. Returns whether it had nothing in flight; false
    /// when it was not live (whatever ended it said so then).
    pub fn close_session(&self, id: SessionId) -> bool {
        let idle = {
            let mut state = self.state_now();
            let idle = state.queue.has_nothing_in_flight(id);
            let Some(slot) = state.sessions.remove(&id) else {
                return false;
            };
            let until = *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner());
            let wake = state.queue.remove_session_holding(id, until.into_std());
            slot.notify.notify_one();
            state.wake(wake);
            idle
        };
        self.timers_changed.notify_one();
        idle
    }

    /// Removes a session that expired (or every session, when draining): its in-flight keys
    /// are re-delivered at once. Returns whether it had nothing in flight; false when it was
    /// not live.
    pub fn remove_session(&self, id: SessionId) -> bool {
        self.state_now()
            .remove_session(id)
            .is_some_and(|ended| ended.idle)
    }

    /// Removes the sessions not renewed by `now`, as [`Group::remove_session`] does; returns
    /// them, each with whether it had nothing in flight.
    pub fn expire_sessions(&self, now: Instant) -> Vec<Ended> {
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
            .deliveries
            .into_iter()
            .map(|(delivery, _)| delivery)
            .collect()
    }

    /// Takes up to `max` ready keys for the session, within `max_bytes`
    /// ([`kube_dispatch_core::queue::GroupQueue::take_within_sized`]), with each owner's
    /// children as the watches of its owned subscriptions know them, read after the key was
    /// taken (so at least as new as the change that queued it), their bytes counted within
    /// `max_bytes`. `None` for a key of a kind no owned subscription maps to. An owner whose
    /// children are incomplete because a watch is listing them, for less than
    /// [`super::OWNER_WAITS_FOR_CHILDREN`], stays ready instead (its reconcile would read them
    /// itself): [`Taken::look_again`] says when.
    pub fn take_with_children(&self, session: SessionId, max: usize, max_bytes: usize) -> Taken {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let bodies = self.takes_children_bodies();
        let mut children: HashMap<String, OwnerChildren> = HashMap::new();
        let now = Self::now();
        let mut look_again: Option<std::time::Instant> = None;
        let out = {
            // On a queue trimmed to the slice current now: a poll woken by a change of the
            // slice may come before the membership loop has trimmed the groups to it.
            let (mut state, slice, wake) = self.current();
            state.wake(wake);
            let queue = &mut state.queue;
            // While nothing may be handed out, owned keys stay queued (`apply_slice`). The
            // Lease deadline is kept in real time, as the membership loop keeps it.
            if !slice.hands_out(std::time::Instant::now()) {
                return Taken::default();
            }
            // The state lock, then an index's: the fan-out never holds an index while it
            // calls into a group.
            queue.take_within_sized(session, max, max_bytes, now, |key, waits| {
                if let Some(until) =
                    waits.and_then(|ready| waits_for_children(&owned, key, ready, now))
                {
                    let next = until.min(now + super::OWNERS_LOOKED_AT_AGAIN);
                    look_again = Some(look_again.map_or(next, |l| l.min(next)));
                    return None;
                }
                let Some(mut of) = children_of(&owned, key) else {
                    return Some(0);
                };
                if !bodies {
                    of.without_bodies();
                }
                // Half the answer at most, so a key alone in it fits with its children.
                of.fit(max_bytes / 2);
                let bytes = of.wire_bound();
                children.insert(key.to_owned(), of);
                Some(bytes)
            })
        };
        for queued in out.iter().filter_map(|d| d.queued) {
            self.queue_duration.observe(queued.as_secs_f64());
        }
        if !out.is_empty() {
            self.timers_changed.notify_one();
        }
        Taken {
            deliveries: out
                .into_iter()
                .map(|d| {
                    let of = children.remove(&d.key);
                    (d, of)
                })
                .collect(),
            look_again,
        }
    }
}

/// What a session's take got ([`Group::take_with_children`]).
#[derive(Debug, Default)]
pub struct Taken {
    /// The deliveries, each with its owner's children if its kind is an owner's.
    pub deliveries: Vec<(Delivery, Option<OwnerChildren>)>,
    /// When to take again for owners left ready because their children are being listed:
    /// nothing else wakes the session when that list ends.
    pub look_again: Option<std::time::Instant>,
}
