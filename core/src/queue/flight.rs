//! Handing keys out and settling them: a take marks ready keys in flight within the answer's
//! bounds, an ack (or the reconcile deadline) settles them as a success, a failure or a requeue.

use std::time::Instant;

use kube_dispatch_proto::v1::Reason;

use super::{
    AckResult, Delivery, DeliveryId, Flight, GroupQueue, Lane, MAX_WAITING_PER_TAKE, Outcome,
    Queued, SessionId, State, keys::Key, later,
};

impl GroupQueue {
    /// Takes up to `max` ready keys of `session`, oldest first, and marks them in flight until
    /// `now + max_reconcile_time`.
    pub fn take(&mut self, session: SessionId, max: usize, now: Instant) -> Vec<Delivery> {
        self.take_within(session, max, usize::MAX, now)
    }

    /// As [`Self::take`], keeping the deliveries' [`Delivery::size_bound`]s within `max_bytes`
    /// in all: taking stops before a key that would pass it, and the first key, if its body
    /// alone would, is delivered without its body (the controller reads the object fresh).
    /// So however large the objects, one answer never passes what the client accepts.
    pub fn take_within(
        &mut self,
        session: SessionId,
        max: usize,
        max_bytes: usize,
        now: Instant,
    ) -> Vec<Delivery> {
        self.take_within_sized(session, max, max_bytes, now, |_, _| Some(0))
    }

    /// As [`GroupQueue::take_within`], with `extra(key, waits)` more bytes counted for each key:
    /// what the caller adds to its delivery (an owner's children). A key alone past the bound
    /// loses its body, not what `extra` counts. When `waits` is `Some` (when the key became
    /// ready, or `now` if unknown: the key's own object exists, as a deletion's does not, and it
    /// is not on its way to another dispatcher), `extra` may answer `None` instead: the key
    /// stays ready and is not handed out now (an owner whose children are being listed). Such
    /// keys go back to the end of their lane, so the keys behind them are taken; the take ends
    /// once it has passed over [`MAX_WAITING_PER_TAKE`] of them.
    pub fn take_within_sized(
        &mut self,
        session: SessionId,
        max: usize,
        max_bytes: usize,
        now: Instant,
        mut extra: impl FnMut(&str, Option<Instant>) -> Option<usize>,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut waiting: Vec<(Lane, Queued)> = Vec::new();
        while out.len() < max {
            let Some((lane, queued)) = self.sessions.get_mut(&session).and_then(|s| s.ready.pop())
            else {
                break;
            };
            if !self
                .entries
                .get(&queued.key)
                .is_some_and(|e| e.state == lane.ready())
            {
                // A place the key left (moved to the live lane, delivered from another).
                self.stale = self.stale.saturating_sub(1);
                continue;
            }
            let text = self.prefixes.text(&queued.key);
            let tombstone = self.tombstones.contains_key(&queued.key);
            let body_len = match self.bodies.get(&queued.key) {
                Some(b) if !tombstone => b.len(),
                _ => 0,
            };
            let memo_len = self.memos.get(&queued.key).map_or(0, |(_, m)| m.len());
            let waits = (!tombstone
                && !self.leaving.contains(&queued.key)
                && self.entries.get(&queued.key).is_some_and(|e| !e.deleted))
            .then(|| queued.since.unwrap_or(now));
            let added = match extra(&text, waits) {
                Some(added) => added,
                None if waits.is_some() => {
                    waiting.push((lane, queued));
                    if waiting.len() >= MAX_WAITING_PER_TAKE {
                        break;
                    }
                    continue;
                }
                None => 0,
            };
            let added = added.saturating_add(memo_len);
            let size = Delivery::size_bound_of(&text, body_len).saturating_add(added);
            if !out.is_empty() && bytes.saturating_add(size) > max_bytes {
                // Over the answer's bound: the next answer takes it, first.
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.ready.lane(lane).push_front(queued);
                }
                break;
            }
            let Queued { since, key, .. } = queued;
            self.ready_count -= 1;
            // Alone past the bound: delivered without its body, which the controller reads.
            let keep_body = size <= max_bytes;
            bytes = bytes.saturating_add(if keep_body {
                size
            } else {
                Delivery::size_bound_of(&text, 0).saturating_add(added)
            });
            out.extend(self.hand_out(session, (key, lane), text, since, keep_body, now));
        }
        // The keys passed over wait at the end of their lanes, still ready, in their order.
        if let Some(s) = self.sessions.get_mut(&session) {
            for (lane, queued) in waiting {
                s.ready.lane(lane).push_back(queued);
            }
        }
        // Fewer ready keys now: the stale places stay within their bound of the ready keys.
        self.compact_if_stale();
        out
    }

    /// Marks `key`, ready and just taken from `session`'s lanes, in flight there until its
    /// reconcile deadline, and makes its delivery: the deletion of an earlier object of its
    /// name first, if one is still to be delivered, else its own state with its body (if
    /// `keep_body`), trace and memo.
    fn hand_out(
        &mut self,
        session: SessionId,
        (key, lane): (Key, Lane),
        text: String,
        since: Option<Instant>,
        keep_body: bool,
        now: Instant,
    ) -> Option<Delivery> {
        let id = self.next_delivery;
        self.next_delivery += 1;
        let queued = since.map(|since| now.saturating_duration_since(since));
        let listed = lane == Lane::Listed;
        let tombstone = self.tombstones.remove(&key);
        // A resync carries no body (CONTRACT.md: its controller reads the object fresh), even
        // one kept from the key's last delivery.
        let resync = self
            .entries
            .get(&key)
            .is_some_and(|e| e.reason == Reason::Resync);
        // The body and trace go with the key's own state, not with an earlier deletion.
        let (body, trace) = match tombstone {
            Some(_) => (None, None),
            None => (
                self.body_to_deliver(&key, keep_body && !resync),
                self.traces.remove(&key),
            ),
        };
        let entry = self.entries.get_mut(&key)?;
        // A memo its ack leaves is for the live object it delivers, and only that.
        let object = (!entry.deleted && tombstone.is_none()).then(|| entry.uid.clone());
        self.flights.insert(
            key.clone(),
            Flight {
                session,
                delivery: id,
                object,
            },
        );
        let delivery = match tombstone {
            Some((uid, rv)) => {
                // The earlier object's deletion; the new object goes once it is acknowledged.
                entry.state = State::InFlight { dirty: true };
                self.counts.deliveries[Reason::Deleted as usize] += 1;
                Delivery {
                    queued,
                    listed,
                    id,
                    key: text,
                    reason: Reason::Deleted,
                    resource_version: rv.to_string(),
                    uid: uid.to_string(),
                    body: None,
                    deleted: true,
                    attempt: 0,
                    trace: None,
                    memo: None,
                }
            }
            None => {
                entry.state = State::InFlight { dirty: false };
                // Only to the object it was left for; a deletion needs none.
                let memo = match self.memos.get(&key) {
                    Some((uid, memo)) if *uid == entry.uid && !entry.deleted => Some(memo.clone()),
                    _ => None,
                };
                self.counts.deliveries[(entry.reason as usize).min(9)] += 1;
                Delivery {
                    queued,
                    listed,
                    id,
                    key: text,
                    reason: entry.reason,
                    resource_version: entry.resource_version.to_string(),
                    uid: entry.uid.to_string(),
                    body,
                    deleted: entry.deleted,
                    attempt: entry.failures,
                    trace,
                    memo,
                }
            }
        };
        if let Some(s) = self.sessions.get_mut(&session) {
            s.in_flight.insert(id, (key.clone(), now));
        }
        self.set_timer(key, later(now, self.config.max_reconcile_time));
        Some(delivery)
    }

    /// Settles a delivery as acknowledged. Returns whether it was in flight, and the sessions
    /// that now have ready keys.
    pub fn ack(
        &mut self,
        session: SessionId,
        delivery: DeliveryId,
        outcome: Outcome,
        now: Instant,
    ) -> (AckResult, Vec<SessionId>) {
        let requeue = matches!(outcome, Outcome::Requeue(_));
        let failure = outcome == Outcome::Failure;
        let (result, wake) = self.settle(session, delivery, outcome, now);
        let counter = match result {
            AckResult::Unknown => &mut self.counts.acks_unknown,
            AckResult::Settled { .. } if failure => &mut self.counts.acks_failure,
            AckResult::Settled { .. } if requeue => &mut self.counts.acks_requeue,
            AckResult::Settled { .. } => &mut self.counts.acks_success,
        };
        *counter += 1;
        (result, wake)
    }

    /// Settles a delivery (acknowledged, or past its deadline).
    pub(super) fn settle(
        &mut self,
        session: SessionId,
        delivery: DeliveryId,
        outcome: Outcome,
        now: Instant,
    ) -> (AckResult, Vec<SessionId>) {
        let Some((key, taken)) = self
            .sessions
            .get_mut(&session)
            .and_then(|s| s.in_flight.remove(&delivery))
        else {
            return (AckResult::Unknown, Vec::new());
        };
        let settled = AckResult::Settled {
            worked: now.saturating_duration_since(taken),
        };
        let Some(entry) = self.entries.get_mut(&key) else {
            return (AckResult::Unknown, Vec::new());
        };
        let State::InFlight { dirty } = entry.state else {
            return (AckResult::Unknown, Vec::new());
        };
        self.flights.remove(&key);
        self.cancel_timer(&key);
        if self.leaving.remove(&key) {
            // Moved to another dispatcher while in flight: that one reconciles it next.
            self.remove_entry(&key);
            return (settled, Vec::new());
        }
        let Some(entry) = self.entries.get_mut(&key) else {
            return (AckResult::Unknown, Vec::new());
        };
        let delay = match outcome {
            Outcome::Success => {
                entry.failures = 0;
                None
            }
            Outcome::Failure => {
                self.counts.retries += 1;
                entry.failures = entry.failures.saturating_add(1);
                Some((Reason::Retry, self.config.backoff.delay(entry.failures)))
            }
            Outcome::Requeue(after) => {
                entry.failures = 0;
                Some((Reason::Requeue, after))
            }
        };
        entry.state = State::Idle;
        let wake = match delay {
            // A change arrived during the reconcile: it wins over any delay, and its reason
            // (recorded by `change`) is the one delivered.
            _ if dirty => self.enqueue(key, Lane::Live),
            Some((reason, delay)) => {
                entry.reason = reason;
                entry.state = State::Delayed;
                self.set_timer(key, later(now, delay));
                Vec::new()
            }
            None => {
                if entry.deleted {
                    self.remove_entry(&key);
                }
                Vec::new()
            }
        };
        (settled, wake)
    }
}
