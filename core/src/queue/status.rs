//! What a queue tells of itself: its sizes, its figures for metrics and one key's status for
//! operators. Nothing here changes the queue.

use std::time::{Duration, Instant};

use kube_dispatch_proto::v1::Reason;

use super::{Entry, GroupQueue, Lane, State, compact::Rv};

/// Places of each session's live lane [`GroupQueue::figures`] looks at for the oldest ready
/// key.
pub(super) const OLDEST_SCAN: usize = 1024;

/// What a queue has done since it was made, for metrics: counters that only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Keys made ready: by a change, a resync, a timer or a session that ended (the
    /// `workqueue_adds_total` of controller-runtime).
    pub adds: u64,
    /// Deliveries that failed and wait for their backoff: failure acks and deliveries past the
    /// maximum reconcile time (`workqueue_retries_total`).
    pub retries: u64,
    /// Deliveries handed out, by [`Reason`] (indexed by its number).
    pub deliveries: [u64; 10],
    /// Acknowledgements that settled a delivery as a success.
    pub acks_success: u64,
    /// ... as a failure.
    pub acks_failure: u64,
    /// ... as a requeue.
    pub acks_requeue: u64,
    /// Acknowledgements of deliveries not in flight on that session (late, or never made).
    pub acks_unknown: u64,
    /// Deliveries not acknowledged within the maximum reconcile time.
    pub expired: u64,
    /// Memos not kept because the group's memo budget or the process's memo pool was full.
    pub memos_refused: u64,
    /// Changes not delivered: the subscription's change filter found the parts it compares
    /// as recorded ([`super::Observed::fingerprint`]).
    pub changes_filtered: u64,
}

/// A queue's figures at one instant, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueFigures {
    /// Keys known.
    pub keys: usize,
    /// Keys ready for delivery (`workqueue_depth`).
    pub ready: usize,
    /// Deliveries in flight.
    pub in_flight: usize,
    /// Keys waiting for a retry backoff or a requeue delay.
    pub delayed: usize,
    /// Of those, the keys backing off after a failure (the rest wait for a requeue-after).
    pub backing_off: usize,
    /// Bytes of object bodies held for ready keys, and kept from deliveries
    /// ([`super::QueueConfig::keep_delivered_bodies`]).
    pub body_bytes: usize,
    /// Bytes of memos kept.
    pub memo_bytes: usize,
    /// Time the deliveries in flight have been out, summed (`workqueue_unfinished_work_seconds`).
    pub unfinished: Duration,
    /// The longest any delivery in flight has been out
    /// (`workqueue_longest_running_processor_seconds`).
    pub longest: Duration,
    /// How long the live key ready the longest has waited for delivery, as its delivery would
    /// say (zero with none ready, or when the caller never said what time it was).
    pub oldest_ready: Duration,
    /// The counters.
    pub counts: QueueCounts,
}

/// Where a key stands in a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// Known; nothing to do until a change or a resync.
    Idle,
    /// Ready for delivery.
    Queued,
    /// Handed to a session and not yet acknowledged.
    InFlight,
    /// Failed; waiting for its backoff.
    BackingOff,
    /// Acknowledged with a requeue-after; waiting for the delay.
    RequeueAfter,
}

/// What a queue knows of one key at one instant, for operators ([`GroupQueue::key_status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    /// Where it stands.
    pub state: KeyState,
    /// Queued: the replica whose session it is assigned to (none while the group has no
    /// session); in flight: the replica reconciling it.
    pub replica: Option<String>,
    /// In flight: how long it has been out; queued: how long it has waited, when known;
    /// backing off or requeued: how long until it is ready again.
    pub wait: Option<Duration>,
    /// Consecutive failures.
    pub failures: u32,
    /// In flight, with a change since: it is queued once more when acknowledged.
    pub changed_in_flight: bool,
    /// In flight, and the ring moved it away: forgotten here when acknowledged.
    pub leaving: bool,
    /// Whether the object was last seen deleted.
    pub deleted: bool,
    /// The last resourceVersion seen.
    pub resource_version: String,
}

impl GroupQueue {
    /// The queue's figures at `now`: sizes, the age of deliveries in flight and of the oldest
    /// live ready key, and the counters. Costs one pass over the deliveries in flight, one over
    /// the keys with a timer, and one over at most 1024 ready places a session.
    pub fn figures(&self, now: Instant) -> QueueFigures {
        let mut unfinished = Duration::ZERO;
        let mut longest = Duration::ZERO;
        let mut in_flight = 0;
        for (_, taken) in self.sessions.values().flat_map(|s| s.in_flight.values()) {
            let out = now.saturating_duration_since(*taken);
            unfinished += out;
            longest = longest.max(out);
            in_flight += 1;
        }
        let backing_off = self
            .timer_slots
            .keys()
            .filter_map(|key| self.entries.get(key))
            .filter(|e| e.state == State::Delayed && e.reason == Reason::Retry)
            .count();
        QueueFigures {
            keys: self.entries.len(),
            ready: self.ready_len(),
            in_flight,
            // Every delayed key and every in-flight key has one timer.
            delayed: self.timer_slots.len().saturating_sub(in_flight),
            backing_off,
            body_bytes: self.body_bytes,
            memo_bytes: self.memo_bytes,
            unfinished,
            longest,
            oldest_ready: self.oldest_ready(now),
            counts: self.counts,
        }
    }

    /// How long the live key ready the longest has waited at `now`, at the place it is
    /// delivered from (the front-most of its places, as [`GroupQueue::take`] finds it); keys in
    /// the listed lane, which give way to changes by design, do not count. Looks at the first
    /// [`OLDEST_SCAN`] places of each live lane: the lanes are first in, first out, but for the
    /// keys a handover moves ahead of the others (at most 4096 for all sessions), so one that
    /// waits longer sits past them only in a pathological case.
    fn oldest_ready(&self, now: Instant) -> Duration {
        let mut seen = super::keys::HashSet::default();
        self.sessions
            .values()
            .map(|s| &s.ready.live)
            .chain(std::iter::once(&self.unassigned.live))
            .flat_map(|live| live.iter().take(OLDEST_SCAN))
            .filter(|q| self.is_place(Lane::Live, q) && seen.insert(q.key.clone()))
            .filter_map(|q| q.since)
            .map(|since| now.saturating_duration_since(since))
            .max()
            .unwrap_or_default()
    }

    /// What the queue knows of `key` at `now`; `None` for a key it does not know. A queued
    /// key's waiting time costs a pass over its session's ready keys.
    pub fn key_status(&self, key: &str, now: Instant) -> Option<KeyStatus> {
        let key = self.prefixes.find(key)?;
        let key = &key;
        let entry = self.entries.get(key)?;
        let timer = || {
            self.timer_slots
                .get(key)
                .map(|(at, _)| at.saturating_duration_since(now))
        };
        let mut status = KeyStatus {
            state: KeyState::Idle,
            replica: None,
            wait: None,
            failures: entry.failures,
            changed_in_flight: false,
            leaving: false,
            deleted: entry.deleted,
            resource_version: entry.resource_version.to_string(),
        };
        match entry.state {
            State::Idle => {}
            State::Ready { listed } => {
                status.state = KeyState::Queued;
                let assigned = self.assign(key);
                let ready = match assigned.and_then(|id| self.sessions.get(&id)) {
                    Some(session) => {
                        status.replica = Some(session.replica.clone());
                        &session.ready
                    }
                    None => &self.unassigned,
                };
                let lane = Lane::of(listed);
                status.wait = ready
                    .iter()
                    .find(|(l, q)| *l == lane && &q.key == key)
                    .and_then(|(_, q)| q.since)
                    .map(|since| now.saturating_duration_since(since));
            }
            State::InFlight { dirty } => {
                status.state = KeyState::InFlight;
                status.changed_in_flight = dirty;
                status.leaving = self.leaving.contains(key);
                if let Some((s, delivery)) = self
                    .flights
                    .get(key)
                    .and_then(|f| Some((self.sessions.get(&f.session)?, &f.delivery)))
                {
                    status.replica = Some(s.replica.clone());
                    status.wait = s
                        .in_flight
                        .get(delivery)
                        .map(|(_, taken)| now.saturating_duration_since(*taken));
                }
            }
            State::Delayed => {
                status.state = if entry.reason == Reason::Retry {
                    KeyState::BackingOff
                } else {
                    KeyState::RequeueAfter
                };
                status.wait = timer();
            }
        }
        Some(status)
    }

    /// Number of keys the queue knows.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the queue knows `key` (live, deleted and not yet forgotten, queued or in flight).
    pub fn contains(&self, key: &str) -> bool {
        self.prefixes
            .find(key)
            .is_some_and(|key| self.entries.contains_key(&key))
    }

    /// Whether the queue knows the object of `key`: its deletion, or a version of it (not only
    /// that an owned object of it changed).
    pub fn knows_object(&self, key: &str) -> bool {
        self.prefixes
            .find(key)
            .and_then(|key| self.entries.get(&key))
            .is_some_and(|e| e.deleted || e.resource_version != Rv::Empty)
    }

    /// Whether the queue knows that the object of `key` exists at `resource_version` exactly.
    pub fn knows_version(&self, key: &str, resource_version: &str) -> bool {
        self.prefixes
            .find(key)
            .and_then(|key| self.entries.get(&key))
            .is_some_and(|e| !e.deleted && e.resource_version.matches(resource_version))
    }

    /// Whether the queue knows that the object of `key` exists: a version of it seen, and not
    /// deleted since.
    pub fn knows_live(&self, key: &str) -> bool {
        self.prefixes
            .find(key)
            .and_then(|key| self.entries.get(&key))
            .is_some_and(Entry::is_live)
    }

    /// Whether the queue knows no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys ready for delivery, over all sessions.
    pub fn ready_len(&self) -> usize {
        self.ready_count
    }

    /// Number of deliveries in flight.
    pub fn in_flight_len(&self) -> usize {
        self.sessions
            .values()
            .map(|s| s.in_flight.len())
            .sum::<usize>()
            + self.held.len()
    }
}
