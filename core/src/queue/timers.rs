//! Timers: a delayed key's retry or requeue-after, an in-flight key's reconcile deadline and a
//! held key's release, fired by [`GroupQueue::advance`] at the time the caller passes in.

use std::time::Instant;

use super::{Flight, GroupQueue, Lane, Outcome, Queued, SessionId, State, dedup, keys::Key};

impl GroupQueue {
    /// The earliest time at which [`Self::advance`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Fires every timer due at `now`: delayed keys become ready, and in-flight deliveries past
    /// the maximum reconcile time are treated as failures. Returns the sessions that now have
    /// ready keys.
    pub fn advance(&mut self, now: Instant) -> Vec<SessionId> {
        let mut wake = Vec::new();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.timer_slots.remove(&key);
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            match e.state {
                State::Delayed => {
                    e.state = State::Idle;
                    wake.extend(self.enqueue(key, Lane::Live));
                }
                State::InFlight { .. } => {
                    // Held since its session was closed or replaced: its client has fenced
                    // itself by now.
                    if self.held.remove(&key) {
                        self.release(&key);
                        // Placed at once, before the keys that become ready after it.
                        wake.extend(self.rebalance());
                    // Not acknowledged within the maximum reconcile time: a failure, counted
                    // as expired rather than as an acknowledgement.
                    } else if let Some(&Flight {
                        session, delivery, ..
                    }) = self.flights.get(&key)
                    {
                        self.counts.expired += 1;
                        wake.extend(self.settle(session, delivery, Outcome::Failure, now).1);
                    }
                }
                State::Idle | State::Ready { .. } => {}
            }
        }
        dedup(wake)
    }

    /// Puts an in-flight key back at once (its session ended).
    pub(super) fn requeue_now(&mut self, key: &Key) {
        self.cancel_timer(key);
        self.flights.remove(key);
        if let Some(entry) = self.entries.get_mut(key) {
            let seq = self.next_seq;
            self.next_seq += 1;
            entry.state = Lane::Live.ready();
            self.ready_count += 1;
            self.unassigned.live.push_back(Queued {
                seq,
                since: self.now,
                key: key.clone(),
            });
            self.counts.adds += 1;
        }
    }

    pub(super) fn set_timer(&mut self, key: Key, at: Instant) {
        self.cancel_timer(&key);
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.entries.contains_key(&key) {
            self.timer_slots.insert(key.clone(), (at, seq));
            self.timers.insert((at, seq), key);
        }
    }

    pub(super) fn cancel_timer(&mut self, key: &Key) {
        if let Some(slot) = self.timer_slots.remove(key) {
            self.timers.remove(&slot);
        }
    }
}
