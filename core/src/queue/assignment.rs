//! Sessions and the assignment of keys to them: keys go to the session whose replica owns them
//! on a ring of the live sessions' replica ids, so a replica keeps its keys while membership is
//! stable.

use std::time::Instant;

use kube_dispatch_proto::Ring;

use super::{
    GroupQueue, Lane, Queued, Session, SessionId, dedup,
    keys::{HashSet, Key},
    lanes::Lanes,
};

/// Most replicas that join or leave the ring at once one by one; more rebuild it.
const MOST_CHANGED_ONE_BY_ONE: usize = 4;

impl GroupQueue {
    /// Adds a session for `replica`. A replica has one session per group: an older session of
    /// the same replica still here is removed first and its in-flight keys are released at once
    /// (a caller that cannot trust the replica to have stopped them passes them to
    /// [`GroupQueue::add_session_replacing`]). Returns the sessions that now have ready keys.
    pub fn add_session(&mut self, id: SessionId, replica: &str) -> Vec<SessionId> {
        if let Some(old) = self.replica_sessions.get(replica).copied() {
            self.remove_session_inner(old, None);
        }
        self.sessions.insert(
            id,
            Session {
                replica: replica.to_owned(),
                ..Session::default()
            },
        );
        self.replica_sessions.insert(replica.to_owned(), id);
        self.rebalance()
    }

    /// Adds a session for `replica` in place of its older sessions `older`, each removed as
    /// [`GroupQueue::remove_session_holding`] removes it (in flight until its time): one
    /// rebalance for it all, so a replica that reconnects keeps its ring place and its keys
    /// never pass through other sessions. Returns the sessions that now have ready keys.
    pub fn add_session_replacing(
        &mut self,
        id: SessionId,
        replica: &str,
        older: &[(SessionId, Instant)],
    ) -> Vec<SessionId> {
        for &(old, until) in older {
            self.remove_session_inner(old, Some(until));
        }
        self.add_session(id, replica)
    }

    /// Removes a session (closed or expired). Its in-flight keys become ready again at once,
    /// keeping their place by first enqueue. Returns the sessions that now have ready keys.
    pub fn remove_session(&mut self, id: SessionId) -> Vec<SessionId> {
        if self.remove_session_inner(id, None) {
            self.rebalance()
        } else {
            Vec::new()
        }
    }

    /// Removes a session whose client may not have stopped its reconciles (it closed the
    /// session, or opened a new one for its replica): its ready keys go to the others at once,
    /// its in-flight keys stay in flight until `until` (when it would have expired, so its
    /// client has fenced itself by then) or their delivery deadline, whichever comes first.
    /// Returns the sessions that now have ready keys.
    pub fn remove_session_holding(&mut self, id: SessionId, until: Instant) -> Vec<SessionId> {
        if self.remove_session_inner(id, Some(until)) {
            self.rebalance()
        } else {
            Vec::new()
        }
    }

    pub(super) fn remove_session_inner(
        &mut self,
        id: SessionId,
        hold_until: Option<Instant>,
    ) -> bool {
        let Some(session) = self.sessions.remove(&id) else {
            return false;
        };
        if self.replica_sessions.get(&session.replica) == Some(&id) {
            self.replica_sessions.remove(&session.replica);
        }
        // Its ready keys go back to the pool; rebalance() hands them out again.
        self.unassigned.append(session.ready);
        for (key, _) in session.in_flight.into_values() {
            if let Some(until) = hold_until {
                let deadline = self.timer_slots.get(&key).map_or(until, |(at, _)| *at);
                self.flights.remove(&key);
                self.set_timer(key.clone(), deadline.min(until));
                self.held.insert(key);
            } else {
                self.release(&key);
            }
        }
        true
    }

    /// An in-flight key whose session is gone: forgotten if the ring moved it away, else
    /// ready again.
    pub(super) fn release(&mut self, key: &Key) {
        if self.leaving.remove(key) {
            self.remove_entry(key);
        } else {
            self.requeue_now(key);
        }
    }

    /// Whether the session exists.
    pub fn has_session(&self, id: SessionId) -> bool {
        self.sessions.contains_key(&id)
    }

    /// Whether session `id` has nothing in flight (or is unknown here): each key it was handed
    /// was acknowledged, which its client does once the reconcile has returned, or ran out its
    /// delivery, by when its client has cancelled it. What it was handed runs no more on the
    /// same fence this queue trusts when it hands such a key out again.
    pub fn has_nothing_in_flight(&self, id: SessionId) -> bool {
        self.sessions
            .get(&id)
            .is_none_or(|s| s.in_flight.is_empty())
    }

    pub(super) fn assign(&self, key: &Key) -> Option<SessionId> {
        let replica = self.ring.owner_of_hash(self.prefixes.hash64(key))?;
        self.replica_sessions.get(replica).copied()
    }

    /// Rebuilds the replica ring and hands every ready key to the session that owns it now,
    /// in its lane, keeping first-enqueue order; stale places are dropped on the way. When the
    /// sessions' replicas are the ring's members still (a replica's session replaced), the
    /// ring and every placed key stay: only the unassigned keys are placed.
    pub(super) fn rebalance(&mut self) -> Vec<SessionId> {
        if self.ring_is_current() {
            return self.place_unassigned();
        }
        self.update_ring();
        let mut all = std::mem::take(&mut self.unassigned);
        for s in self.sessions.values_mut() {
            all.append(std::mem::take(&mut s.ready));
        }
        let (wake, _) = self.place_all(all);
        self.stale = 0;
        wake
    }

    /// Makes the ring the sessions' replicas': a replica more or less computes only its
    /// points (a storm of new sessions costs each its own), many at once rebuild it.
    fn update_ring(&mut self) {
        let gone: Vec<String> = self
            .ring
            .members()
            .iter()
            .filter(|m| !self.replica_sessions.contains_key(m.as_str()))
            .cloned()
            .collect();
        let new: Vec<String> = self
            .replica_sessions
            .keys()
            .filter(|r| !self.ring.contains(r))
            .cloned()
            .collect();
        let ring = std::mem::replace(&mut self.ring, Ring::new(Vec::<String>::new()));
        self.ring = if gone.len() + new.len() > MOST_CHANGED_ONE_BY_ONE {
            Ring::new(self.replica_sessions.keys().cloned())
        } else {
            let ring = gone.iter().fold(ring, |r, m| r.without_member(m));
            new.iter().fold(ring, |r, m| r.with_member(m))
        };
    }

    /// Whether the ring's members are the replicas of the sessions (one session each).
    pub(super) fn ring_is_current(&self) -> bool {
        self.ring.members().len() == self.replica_sessions.len()
            && self
                .replica_sessions
                .keys()
                .all(|replica| self.ring.contains(replica))
    }

    /// Places the unassigned keys, on a ring that did not change. Each goes to the back of
    /// its owner's lane, which keeps first-enqueue order: while the ring is unchanged a key is
    /// unassigned only if its owner's session was just replaced (the new one has no key yet)
    /// or it was just released from flight (its place is the newest).
    fn place_unassigned(&mut self) -> Vec<SessionId> {
        let unassigned = std::mem::take(&mut self.unassigned);
        let (wake, dropped) = self.place_all(unassigned);
        self.stale = self.stale.saturating_sub(dropped);
        wake
    }

    /// Places each of `lanes`' keys still ready in its lane, once, in first-enqueue order.
    /// Returns the sessions given keys, and how many stale places were dropped.
    fn place_all(&mut self, mut lanes: Lanes) -> (Vec<SessionId>, usize) {
        let (mut wake, mut dropped) = (Vec::new(), 0);
        let mut seen: HashSet<Key> = HashSet::default();
        for lane in [Lane::Live, Lane::Listed] {
            let mut ready: Vec<Queued> = std::mem::take(lanes.lane(lane)).into();
            ready.sort_unstable_by_key(|q| q.seq);
            for queued in ready {
                if !self.is_place(lane, &queued) || !seen.insert(queued.key.clone()) {
                    dropped += 1;
                    continue;
                }
                wake.extend(self.place(queued, lane));
            }
        }
        (dedup(wake), dropped)
    }
}
