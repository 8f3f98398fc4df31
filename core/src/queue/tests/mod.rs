//! The queue's unit and property tests: one per rule of the contract (`CONTRACT.md`) and per
//! invariant the operations must keep.

use std::collections::HashSet;

use super::*;

mod bodies;
mod changes;
mod delivery;
mod figures;
mod invariants;
mod leaving;
mod retries;

const MS: Duration = Duration::from_millis(1);

fn queue() -> GroupQueue {
    GroupQueue::new(QueueConfig {
        backoff: Backoff {
            base: 5 * MS,
            cap: Duration::from_secs(1),
        },
        max_reconcile_time: Duration::from_secs(10),
        body_budget: 100,
        memo_budget: 1000,
        keep_delivered_bodies: false,
    })
}

fn change(reason: Reason, rv: u32) -> Change {
    Change {
        reason,
        resource_version: rv.to_string(),
        uid: "uid-1".into(),
        body: None,
        deleted: reason == Reason::Deleted,
        trace: None,
    }
}

fn with_body(reason: Reason, rv: u32, len: usize) -> Change {
    Change {
        body: Some(vec![b'x'; len].into()),
        ..change(reason, rv)
    }
}

fn keys(deliveries: &[Delivery]) -> Vec<&str> {
    deliveries.iter().map(|d| &*d.key).collect()
}

impl GroupQueue {
    /// Checks the invariants that every operation must keep.
    fn check(&self) {
        let in_flight = self.check_flights();
        let ready = self.check_lanes();
        self.check_entries(&in_flight, &ready);
    }

    /// Each delivery in flight is one key's, recorded in its flight; returns those keys.
    fn check_flights(&self) -> HashSet<Key> {
        let mut in_flight = HashSet::new();
        for (id, s) in &self.sessions {
            for (delivery, (key, _)) in &s.in_flight {
                assert!(in_flight.insert(key.clone()), "{key:?} in flight twice");
                assert!(matches!(self.entries[key].state, State::InFlight { .. }));
                assert_eq!(
                    self.flights.get(key).map(|f| (f.session, f.delivery)),
                    Some((*id, *delivery))
                );
            }
        }
        assert_eq!(self.flights.len(), in_flight.len());
        assert!(
            self.held.iter().all(|k| !in_flight.contains(k)),
            "held and in flight"
        );
        in_flight
    }

    /// Every ready key has its place in its lane, in the lanes of the session it is assigned
    /// to; the other places are stale, and the queue counts at least as many. Returns the
    /// ready keys.
    fn check_lanes(&self) -> HashSet<Key> {
        let mut replicas: Vec<&str> = self.sessions.values().map(|s| &*s.replica).collect();
        replicas.sort_unstable();
        assert_eq!(
            self.ring.members(),
            replicas,
            "the ring of the sessions' replicas"
        );
        assert!(self.ring_is_current());
        let mut ready = HashSet::new();
        let mut stale = 0;
        let lanes = self
            .sessions
            .iter()
            .map(|(id, s)| (Some(*id), &s.ready))
            .chain(std::iter::once((None, &self.unassigned)));
        for (session, lanes) in lanes {
            for (lane, q) in lanes.iter() {
                if !self.is_place(lane, q) {
                    stale += 1;
                    continue;
                }
                let assigned = self
                    .assign(&q.key)
                    .filter(|id| self.sessions.contains_key(id));
                assert_eq!(assigned, session, "{:?} queued for another session", q.key);
                if !ready.insert(q.key.clone()) {
                    // A second place of a key promoted where it already waited.
                    stale += 1;
                }
            }
        }
        assert!(
            stale <= self.stale,
            "{stale} stale places, {} counted",
            self.stale
        );
        assert_eq!(ready.len(), self.ready_count, "ready keys counted");
        ready
    }

    /// Each key's state agrees with where it is (a lane, a flight, a timer), its prefix is
    /// interned, and bodies, memos and tombstones belong to known keys within their budgets.
    fn check_entries(&self, in_flight: &HashSet<Key>, ready: &HashSet<Key>) {
        let prefixes: HashSet<String> = self
            .entries
            .keys()
            .map(|k| {
                let mut text = self.prefixes.text(k);
                text.truncate(text.rfind('/').map_or(0, |slash| slash + 1));
                text
            })
            .collect();
        assert_eq!(
            self.prefixes.len(),
            prefixes.len(),
            "a prefix outlived its keys"
        );
        for (key, e) in &self.entries {
            let text = self.prefixes.text(key);
            assert_eq!(
                self.prefixes.find(&text).as_ref(),
                Some(key),
                "{text}'s prefix"
            );
            match e.state {
                State::Ready { .. } => assert!(ready.contains(key), "{key:?} ready nowhere"),
                State::InFlight { .. } => assert!(
                    in_flight.contains(key)
                        || self.held.contains(key) && self.timer_slots.contains_key(key),
                    "{key:?} in flight nowhere"
                ),
                State::Delayed => assert!(
                    self.timer_slots.contains_key(key),
                    "{key:?} delayed without timer"
                ),
                State::Idle => assert!(
                    !self.timer_slots.contains_key(key),
                    "{key:?} idle with a timer"
                ),
            }
            if let Some(slot) = self.timer_slots.get(key) {
                assert_eq!(self.timers.get(slot), Some(key));
            }
        }
        assert_eq!(self.timers.len(), self.timer_slots.len());
        assert!(
            self.timer_slots
                .keys()
                .all(|k| self.entries.contains_key(k))
        );
        assert!(self.bodies.keys().all(|k| self.entries.contains_key(k)));
        assert!(self.tombstones.keys().all(|k| self.entries.contains_key(k)));
        let bodies: usize = self.bodies.values().map(|b| b.len()).sum();
        assert_eq!(bodies, self.body_bytes);
        assert!(self.body_bytes <= self.config.body_budget);
        assert!(self.memos.keys().all(|k| self.entries.contains_key(k)));
        let memos: usize = self.memos.values().map(|(_, m)| m.len()).sum();
        assert_eq!(memos, self.memo_bytes);
        assert!(self.memo_bytes <= self.config.memo_budget);
    }
}
