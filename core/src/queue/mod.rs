//! The work queue of one controller group on one dispatcher: pure logic, no I/O, no clock.
//!
//! The queue is one state machine: each operation moves a key between the same states and
//! keeps the same invariants (`tests.rs` beside it checks them).
//!
//! It implements the delivery contract (`CONTRACT.md`) for the keys this dispatcher owns:
//!
//! - **Coalescing.** A key is queued at most once; while it is in flight, further changes mark
//!   it dirty, and it is queued once more when the in-flight delivery is acknowledged.
//! - **Exclusivity.** A key in flight on one session is handed to no other session until it is
//!   acknowledged, its delivery passes the maximum reconcile time, or its session ends.
//! - **Retries.** A failure delays the key by per-key exponential [`Backoff`]; a requeue delays it
//!   by the requested time; a success resets the failure count.
//! - **Fairness.** Each session has two FIFOs of ready keys, each ordered by first enqueue: the
//!   live lane (changes the watch's stream showed, retries, requeues) and the listed lane (keys a
//!   list brought: a cold start, a re-list, a handover; resyncs; triggers of every key). A
//!   session is handed its live keys first, so a write made while thousands of listed keys wait
//!   is reconciled next rather than after them; a listed key whose object then changes moves to
//!   the live lane ([`Lane`]). Keys are assigned to sessions by consistent hashing over the live
//!   sessions' replica ids, so a replica keeps the same keys while membership is stable.
//! - **Bounds.** Memory is one compact entry per known key: 96 bytes with its key and no
//!   allocation when the uid and resourceVersion have their usual forms and the name is at most
//!   23 bytes (the key's `group/kind/namespace/` prefix is interned once per queue, see
//!   `keys.rs`), plus one timer and one flight record per delayed or in-flight key. Object
//!   bodies are kept only for ready keys and only within `body_budget` bytes; past it a key is
//!   delivered without its body. A key moved from the listed lane to the live one leaves its
//!   old place behind until it is passed over or the lanes are compacted, which they are in
//!   one pass as soon as such places outnumber both the ready keys and [`STALE_SLACK`]: the
//!   lanes hold a place per ready key and at most as many stale ones as there were ready keys
//!   (or [`STALE_SLACK`]) at the last move. Nothing grows with the event rate.
//!
//! Time is passed in as `now`, so the logic is tested without a clock; the caller sleeps until
//! [`GroupQueue::next_deadline`] and calls [`GroupQueue::advance`].

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant},
};

use indexmap::IndexMap;
use kube_dispatch_proto::{Ring, v1::Reason};

use crate::backoff::Backoff;

mod compact;
mod keys;
pub mod pool;
use compact::{Rv, Uid};
pub use keys::Key;
use keys::{HashMap, HashSet, Prefixes};
use pool::BodyPool;

/// Identifies a session within the dispatcher.
pub type SessionId = u64;
/// Identifies one delivery of a key to a session.
pub type DeliveryId = u64;

/// Settings of a group queue. The defaults are the dispatcher flags' defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// Delay of retries after failures.
    pub backoff: Backoff,
    /// A delivery not acknowledged within this time is treated as failed and retried.
    pub max_reconcile_time: Duration,
    /// Most bytes of object bodies held for ready keys; past it keys are delivered without body.
    pub body_budget: usize,
    /// Most bytes of memos ([`GroupQueue::leave_memo`]) the group keeps, each at most
    /// [`kube_dispatch_proto::MAX_MEMO_BYTES`]; past it a memo is not kept and the key's next
    /// delivery carries none.
    pub memo_budget: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            max_reconcile_time: Duration::from_secs(60),
            body_budget: 64 * 1024 * 1024,
            memo_budget: 16 * 1024 * 1024,
        }
    }
}

/// Which of its session's two FIFOs a ready key waits in (see the module's "Fairness").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// A change the watch's stream showed (or a retry, a requeue, a deletion): handed out
    /// before any listed key.
    Live,
    /// A key a list brought, a resync, a trigger of every key: handed out when no live key
    /// waits. Like the low priority controller-runtime's priority queue gives the objects of
    /// an informer's initial list and its resyncs.
    Listed,
}

impl Lane {
    fn of(listed: bool) -> Self {
        if listed { Lane::Listed } else { Lane::Live }
    }

    fn ready(self) -> State {
        State::Ready {
            listed: self == Lane::Listed,
        }
    }
}

/// A change to a key, as the watch saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Why the key should be reconciled.
    pub reason: Reason,
    /// The resourceVersion of the change; empty if unknown (resync).
    pub resource_version: String,
    /// The object's uid, if known.
    pub uid: String,
    /// The object in the subscription's payload mode, if the subscription carries one.
    pub body: Option<Arc<[u8]>>,
    /// Whether the object is gone.
    pub deleted: bool,
    /// The trace context of the span that saw the change (a W3C `traceparent`), when traces
    /// are exported.
    pub trace: Option<Arc<str>>,
}

impl Change {
    /// A deletion known only by its key: found by a re-list, held through a handover, or
    /// remembered by a peer.
    pub fn deletion() -> Self {
        Self {
            reason: Reason::Deleted,
            resource_version: String::new(),
            uid: String::new(),
            body: None,
            deleted: true,
            trace: None,
        }
    }

    /// A change of an object related to the key's object: owned by it ([`Reason::Owned`]) or
    /// named by it ([`Reason::Referenced`]).
    pub fn related(reason: Reason) -> Self {
        Self {
            reason,
            resource_version: String::new(),
            uid: String::new(),
            body: None,
            deleted: false,
            trace: None,
        }
    }
}

/// One reconcile request handed to a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// How long the key waited ready for delivery (`workqueue_queue_duration_seconds`), when
    /// the caller said what time it was as it became ready ([`GroupQueue::at`]).
    pub queued: Option<Duration>,
    /// Identifies this delivery in acknowledgements.
    pub id: DeliveryId,
    /// The request key.
    pub key: String,
    /// Why it is delivered.
    pub reason: Reason,
    /// The last resourceVersion seen for the key.
    pub resource_version: String,
    /// The object's uid, if known.
    pub uid: String,
    /// The object body, if it was kept.
    pub body: Option<Arc<[u8]>>,
    /// Whether the object is gone.
    pub deleted: bool,
    /// Consecutive failures before this delivery.
    pub attempt: u32,
    /// The trace context of the first change that queued the key since its last delivery.
    pub trace: Option<Arc<str>>,
    /// The memo the last acknowledged reconcile of this object left here, if any.
    pub memo: Option<Arc<[u8]>>,
}

impl Delivery {
    /// What the wire adds to a delivery beyond its key (sent twice: as text and as its parts)
    /// and its body: resourceVersion, uid and trace context (under 64 bytes each from a
    /// Kubernetes API server), the kind's version and the fields' tags.
    pub const METADATA_BOUND: usize = 256;

    /// An upper bound of the bytes this delivery takes in a poll's answer.
    pub fn size_bound(&self) -> usize {
        Self::size_bound_of(&self.key, self.body.as_ref().map_or(0, |b| b.len()))
            .saturating_add(self.memo.as_ref().map_or(0, |m| m.len()))
    }

    fn size_bound_of(key: &str, body: usize) -> usize {
        body.saturating_add(2 * key.len() + Self::METADATA_BOUND)
    }
}

/// `now + delay`, or the farthest instant this platform holds: a delay from the network cannot
/// overflow a timer.
pub fn later(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay).unwrap_or_else(|| {
        // About 30 years: later than any process lives.
        now.checked_add(Duration::from_secs(1 << 30)).unwrap_or(now)
    })
}

/// The outcome of a reconcile, as acknowledged by the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done; deliver again only on a change or resync.
    Success,
    /// Failed; retry with backoff.
    Failure,
    /// Done; deliver again after the delay.
    Requeue(Duration),
}

/// What an acknowledgement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckResult {
    /// The delivery was in flight on that session and is now settled, `worked` after it was
    /// handed out.
    Settled {
        /// From the delivery to its acknowledgement.
        worked: Duration,
    },
    /// The delivery was not in flight on that session (already settled, expired, or never
    /// made); nothing changed.
    Unknown,
}

/// A key's delivery in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Flight {
    session: SessionId,
    delivery: DeliveryId,
    /// The uid of the live object it delivered: the one a memo its ack leaves is for. `None`
    /// for a deletion.
    object: Option<Uid>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing to do until a change.
    Idle,
    /// In a session's (or the unassigned) ready FIFO of that lane (`listed`: [`Lane::Listed`]).
    Ready {
        /// In the listed lane.
        listed: bool,
    },
    /// Handed to a session (which one: [`GroupQueue::flights`]).
    InFlight {
        /// A change arrived while in flight: queue once more when settled.
        dirty: bool,
    },
    /// Waiting for a retry backoff or a requeue delay.
    Delayed,
}

/// Everything the queue keeps about an idle key: 56 bytes, with the key's 32 and the map's
/// own 8 per entry (the core's `stays_small` test holds them to it).
#[derive(Debug)]
struct Entry {
    state: State,
    reason: Reason,
    resource_version: Rv,
    uid: Uid,
    deleted: bool,
    failures: u32,
    /// The list epoch of the watch in which the object was last seen; see [`GroupQueue::sweep`].
    seen: u32,
}

impl Entry {
    /// Whether the queue knows the key's object exists: a version of it seen, and not deleted
    /// since.
    fn is_live(&self) -> bool {
        !self.deleted && self.resource_version != Rv::Empty
    }
}

/// An object as a watch event or list shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Its resourceVersion.
    pub resource_version: String,
    /// Its uid.
    pub uid: String,
    /// Its body in the subscription's payload mode, if any.
    pub body: Option<Arc<[u8]>>,
    /// The trace context of the span that saw it, when traces are exported.
    pub trace: Option<Arc<str>>,
}

/// A key in a ready FIFO.
#[derive(Debug)]
struct Queued {
    /// Orders keys by first enqueue.
    seq: u64,
    /// When it became ready, if the caller said what time it is ([`GroupQueue::at`]).
    since: Option<Instant>,
    key: Key,
}

/// The two FIFOs of ready keys of a session (or of the keys no session is assigned). A key's
/// place is valid while its entry is ready in that lane; other places are stale, passed over
/// when reached and dropped when the lanes are compacted.
#[derive(Debug, Default)]
struct Lanes {
    live: VecDeque<Queued>,
    listed: VecDeque<Queued>,
}

impl Lanes {
    fn lane(&mut self, lane: Lane) -> &mut VecDeque<Queued> {
        match lane {
            Lane::Live => &mut self.live,
            Lane::Listed => &mut self.listed,
        }
    }

    /// The next place to look at: live first.
    fn pop(&mut self) -> Option<(Lane, Queued)> {
        if let Some(q) = self.live.pop_front() {
            return Some((Lane::Live, q));
        }
        self.listed.pop_front().map(|q| (Lane::Listed, q))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.live.len() + self.listed.len()
    }

    fn iter(&self) -> impl Iterator<Item = (Lane, &Queued)> {
        self.live
            .iter()
            .map(|q| (Lane::Live, q))
            .chain(self.listed.iter().map(|q| (Lane::Listed, q)))
    }

    fn retain(&mut self, mut keep: impl FnMut(Lane, &Queued) -> bool) {
        self.live.retain(|q| keep(Lane::Live, q));
        self.listed.retain(|q| keep(Lane::Listed, q));
    }

    fn append(&mut self, other: Lanes) {
        self.live.extend(other.live);
        self.listed.extend(other.listed);
    }
}

/// Stale places (a key's old place in a lane it moved out of) the lanes may hold beyond the
/// ready keys before they are compacted, so a few moves never cost a pass. (Small in the queue's own tests, so random
/// operations compact too.)
#[cfg(not(test))]
pub const STALE_SLACK: usize = 1024;
/// Stale places the lanes may hold beyond the ready keys before they are compacted.
#[cfg(test)]
pub const STALE_SLACK: usize = 4;

#[derive(Debug, Default)]
struct Session {
    replica: String,
    ready: Lanes,
    /// Each delivery in flight: its key, and when it was handed out.
    in_flight: HashMap<DeliveryId, (Key, Instant)>,
}

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
    /// Bytes of object bodies held for ready keys.
    pub body_bytes: usize,
    /// Bytes of memos kept.
    pub memo_bytes: usize,
    /// Time the deliveries in flight have been out, summed (`workqueue_unfinished_work_seconds`).
    pub unfinished: Duration,
    /// The longest any delivery in flight has been out
    /// (`workqueue_longest_running_processor_seconds`).
    pub longest: Duration,
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

/// The sequence number of the first key enqueued at the back of a new queue: the numbers below
/// it are for keys moved ahead ([`GroupQueue::promote`]), so an order by number (a rebalance's)
/// keeps them first. Either way 2^63 numbers, more than a queue hands out.
const FRONT: u64 = 1 << 63;

/// The work queue of one group.
#[derive(Debug)]
pub struct GroupQueue {
    config: QueueConfig,
    /// Indexed, so resync can walk the keys with a cursor.
    entries: IndexMap<Key, Entry, foldhash::fast::RandomState>,
    /// The prefixes of the keys in `entries`.
    prefixes: Prefixes,
    /// The session and delivery of each key in flight.
    flights: HashMap<Key, Flight>,
    resync_cursor: usize,
    sessions: BTreeMap<SessionId, Session>,
    /// Replica id ring over the live sessions; keys are assigned to the session whose replica
    /// owns them.
    ring: Ring,
    replica_sessions: HashMap<String, SessionId>,
    /// Ready keys while the group has no session.
    unassigned: Lanes,
    /// Keys ready, in either lane.
    ready_count: usize,
    /// Places in the lanes that may be stale (see [`Lanes`]): counted as they are left
    /// behind, reset when the lanes are compacted.
    stale: usize,
    timers: BTreeMap<(Instant, u64), Key>,
    /// The timer slot of each key that has one (a delayed key's retry, an in-flight key's
    /// reconcile deadline); kept beside the entries so idle keys pay nothing for it.
    timer_slots: HashMap<Key, (Instant, u64)>,
    /// Bodies of queued keys, within the budget; beside the entries for the same reason.
    bodies: HashMap<Key, Arc<[u8]>>,
    /// The trace context of the first traced change of each key since its last delivery; empty
    /// unless traces are exported. At most one per key.
    traces: HashMap<Key, Arc<str>>,
    /// The uid and resourceVersion of an object whose deletion was not delivered yet when an
    /// object of another uid took its name: delivered first, as a deletion, before the new
    /// object. At most one per key.
    tombstones: HashMap<Key, (Uid, Rv)>,
    /// The memo the last acknowledged reconcile of a key left ([`GroupQueue::leave_memo`]),
    /// with the uid of the object it was left for: handed back only to that object. Beside the
    /// entries so keys without one pay nothing; at most `config.memo_budget` bytes, counted in
    /// the process's memo pool too.
    memos: HashMap<Key, (Uid, Arc<[u8]>)>,
    memo_bytes: usize,
    body_bytes: usize,
    /// The process's bytes of bodies, which `body_bytes` are part of.
    pool: BodyPool,
    /// The process's bytes of memos, which `memo_bytes` are part of.
    memo_pool: BodyPool,
    /// The most bytes of bodies this group may take while the pool is short (its share, set
    /// by [`GroupQueue::hold_bodies_to`]); `usize::MAX` otherwise.
    body_share: usize,
    /// The next sequence number of a key enqueued at the back; starts at [`FRONT`] so that
    /// keys moved ahead ([`GroupQueue::promote`]) take the numbers below it.
    next_seq: u64,
    /// The lowest sequence number a key moved ahead took so far.
    front_seq: u64,
    next_delivery: DeliveryId,
    /// In-flight keys the ring moved away: forgotten when they settle, never requeued here.
    /// At most the number of keys in flight.
    leaving: HashSet<Key>,
    /// In-flight keys of sessions closed or replaced before they were acknowledged: still in
    /// flight (their reconciles may run, if the client did not stop them) until their timer,
    /// the time their session would have expired (or their delivery deadline, if sooner).
    /// At most the number of keys in flight.
    held: HashSet<Key>,
    counts: QueueCounts,
    /// The time of the current operation, as the caller last said ([`GroupQueue::at`]): when
    /// keys it makes ready became ready.
    now: Option<Instant>,
}

impl GroupQueue {
    /// An empty queue whose bodies are bounded by its own budget only.
    pub fn new(config: QueueConfig) -> Self {
        Self::with_pool(config, BodyPool::unbounded())
    }

    /// An empty queue whose bodies count against `pool` too, shared with other groups.
    pub fn with_pool(config: QueueConfig, pool: BodyPool) -> Self {
        Self::with_pools(
            config,
            pool::Pools {
                bodies: pool,
                memos: BodyPool::unbounded(),
            },
        )
    }

    /// An empty queue whose bodies and memos count against `pools` too, shared with other
    /// groups.
    pub fn with_pools(config: QueueConfig, pools: pool::Pools) -> Self {
        let pool::Pools {
            bodies: pool,
            memos: memo_pool,
        } = pools;
        Self {
            config,
            entries: IndexMap::default(),
            prefixes: Prefixes::default(),
            flights: HashMap::default(),
            resync_cursor: 0,
            sessions: BTreeMap::new(),
            ring: Ring::new(Vec::<String>::new()),
            replica_sessions: HashMap::default(),
            unassigned: Lanes::default(),
            ready_count: 0,
            stale: 0,
            timers: BTreeMap::new(),
            timer_slots: HashMap::default(),
            bodies: HashMap::default(),
            traces: HashMap::default(),
            tombstones: HashMap::default(),
            memos: HashMap::default(),
            memo_bytes: 0,
            body_bytes: 0,
            pool,
            memo_pool,
            body_share: usize::MAX,
            next_seq: FRONT,
            front_seq: FRONT,
            next_delivery: 1,
            leaving: HashSet::default(),
            held: HashSet::default(),
            counts: QueueCounts::default(),
            now: None,
        }
    }

    /// Says that the operations that follow happen at `now`, for the time keys wait ready
    /// ([`Delivery::queued`]); the queue reads no clock of its own.
    pub fn at(&mut self, now: Instant) -> &mut Self {
        self.now = Some(now);
        self
    }

    /// The queue's figures at `now`: sizes, the age of deliveries in flight, and the counters.
    /// Costs one pass over the deliveries in flight and one over the keys with a timer.
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
            counts: self.counts,
        }
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

    /// Places in the lanes, stale ones included (see the module's "Bounds").
    #[cfg(test)]
    fn places(&self) -> usize {
        self.unassigned.len() + self.sessions.values().map(|s| s.ready.len()).sum::<usize>()
    }

    /// Whether `q`, found in `lane`, is its key's place: the key is ready in that lane.
    fn is_place(&self, lane: Lane, q: &Queued) -> bool {
        self.entries
            .get(&q.key)
            .is_some_and(|e| e.state == lane.ready())
    }

    /// Drops the stale places once they outnumber the ready keys (and [`STALE_SLACK`]): one
    /// pass, after at least as many places were left behind, so each costs O(1) amortised.
    fn compact_if_stale(&mut self) {
        if self.stale <= STALE_SLACK.max(self.ready_count) {
            return;
        }
        let entries = &self.entries;
        let mut seen: HashSet<Key> = HashSet::default();
        for lanes in self
            .sessions
            .values_mut()
            .map(|s| &mut s.ready)
            .chain(std::iter::once(&mut self.unassigned))
        {
            lanes.retain(|lane, q| {
                entries.get(&q.key).is_some_and(|e| e.state == lane.ready())
                    && seen.insert(q.key.clone())
            });
        }
        self.stale = 0;
    }

    /// Moves the keys of `keys` that are ready ahead of every other ready key, in the order
    /// given, into the live lane: changes a handover held back go before the keys it brought,
    /// which reach the queue in a list's (name) order. Keys not ready are left where they are.
    /// O(1) a key moved (amortised: see [`STALE_SLACK`]); a moved key's wait
    /// ([`Delivery::queued`]) counts from the move.
    pub fn promote<'k>(&mut self, keys: impl IntoIterator<Item = &'k str>) {
        let mut promoted: Vec<Key> = Vec::new();
        let mut taken: HashSet<Key> = HashSet::default();
        for key in keys {
            if let Some(k) = self.prefixes.find(key)
                && self
                    .entries
                    .get(&k)
                    .is_some_and(|e| matches!(e.state, State::Ready { .. }))
                && taken.insert(k.clone())
            {
                promoted.push(k);
            }
        }
        if promoted.is_empty() {
            return;
        }
        let base = self.front_seq.saturating_sub(promoted.len() as u64);
        self.front_seq = base;
        // Each to the front of its session's live lane, the last given first, so the first
        // given goes first; their earlier places go stale.
        for (rank, key) in promoted.into_iter().enumerate().rev() {
            if let Some(e) = self.entries.get_mut(&key) {
                e.state = Lane::Live.ready();
            }
            self.stale += 1;
            let queued = Queued {
                seq: base + rank as u64,
                since: self.now,
                key,
            };
            let assigned = self.assign(&queued.key);
            match assigned.and_then(|id| self.sessions.get_mut(&id)) {
                Some(s) => s.ready.live.push_front(queued),
                None => self.unassigned.live.push_front(queued),
            }
        }
        self.compact_if_stale();
    }

    /// Bytes of object bodies held.
    pub fn body_bytes(&self) -> usize {
        self.body_bytes
    }

    /// Holds this group to `share` bytes of bodies while the pool is short (`None`: no longer
    /// short): drops bodies down to it and takes no more past it, so a group that keeps
    /// changing cannot take back what it gave; returns the bytes given back to the pool.
    pub fn hold_bodies_to(&mut self, share: Option<usize>) -> usize {
        self.body_share = share.unwrap_or(usize::MAX);
        share.map_or(0, |share| self.shed_bodies(share))
    }

    /// Drops bodies of ready keys until at most `keep` bytes are held (those keys are then
    /// delivered without body, and their controllers read the objects fresh); returns the
    /// bytes given back to the pool.
    fn shed_bodies(&mut self, keep: usize) -> usize {
        let mut freed = 0;
        if self.body_bytes <= keep {
            return 0;
        }
        let over = self.body_bytes - keep;
        self.bodies.retain(|_, body| {
            if freed >= over {
                return true;
            }
            freed += body.len();
            false
        });
        self.body_bytes -= freed;
        self.pool.give_back(freed);
        freed
    }

    /// Removes `key`'s body, giving its bytes back.
    fn drop_memo(&mut self, key: &Key) {
        if let Some((_, memo)) = self.memos.remove(key) {
            self.memo_bytes -= memo.len();
            self.memo_pool.give_back(memo.len());
        }
    }

    /// Keeps `memo` for the key of `delivery`, in flight on `session`, for the next delivery of
    /// the same object: a reconcile's note to its successor (what it wrote, at which versions),
    /// replacing the one kept before; an empty memo removes it. Call before the delivery's
    /// [`Self::ack`]. Nothing is kept for a delivery not in flight there, a deletion, or past
    /// the group's memo budget or the process's memo pool (counted in [`QueueCounts::memos_refused`]): a memo
    /// is a hint its reader must do without. Returns whether it was kept.
    pub fn leave_memo(&mut self, session: SessionId, delivery: DeliveryId, memo: &[u8]) -> bool {
        let Some(key) = self
            .sessions
            .get(&session)
            .and_then(|s| s.in_flight.get(&delivery))
            .map(|(key, _)| key.clone())
        else {
            return false;
        };
        self.drop_memo(&key);
        let Some(entry) = self.entries.get(&key) else {
            return false;
        };
        // Left for the object the delivery showed: not for its deletion, nor for another
        // object that took its name meanwhile.
        let for_it = self
            .flights
            .get(&key)
            .and_then(|f| f.object.as_ref())
            .is_some_and(|uid| *uid == entry.uid);
        if memo.is_empty() || !for_it || entry.deleted || self.leaving.contains(&key) {
            return false;
        }
        if memo.len() > kube_dispatch_proto::MAX_MEMO_BYTES
            || self.memo_bytes + memo.len() > self.config.memo_budget
            || !self.memo_pool.take(memo.len())
        {
            self.counts.memos_refused += 1;
            return false;
        }
        self.memo_bytes += memo.len();
        let uid = entry.uid.clone();
        self.memos.insert(key, (uid, Arc::from(memo)));
        true
    }

    fn drop_body(&mut self, key: &Key) -> Option<Arc<[u8]>> {
        let body = self.bodies.remove(key)?;
        self.body_bytes -= body.len();
        self.pool.give_back(body.len());
        Some(body)
    }

    /// Adds a session for `replica`. A replica has one session per group: an older session of
    /// the same replica still here is removed first and its in-flight keys are released at once
    /// (a caller that cannot trust the replica to have stopped them removes it first with
    /// [`GroupQueue::remove_session_holding`]). Returns the sessions that now have ready keys.
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

    fn remove_session_inner(&mut self, id: SessionId, hold_until: Option<Instant>) -> bool {
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
    fn release(&mut self, key: &Key) {
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

    /// Records a change to `key`, in the live lane. Returns the sessions that now have ready
    /// keys.
    pub fn change(&mut self, key: &str, change: Change) -> Vec<SessionId> {
        self.change_in(key, change, Lane::Live)
    }

    /// Records a change to `key`, queued in `lane` if it was not ready (and moved to the live
    /// lane if it waited in the listed one and `lane` is live). Returns the sessions that now
    /// have ready keys.
    pub fn change_in(&mut self, key: &str, change: Change, lane: Lane) -> Vec<SessionId> {
        let key = match self.prefixes.find(key) {
            Some(k) if self.entries.contains_key(&k) => k,
            _ => {
                let k = self.prefixes.retain(key);
                self.entries.insert(
                    k.clone(),
                    Entry {
                        state: State::Idle,
                        reason: change.reason,
                        resource_version: Rv::Empty,
                        uid: Uid::Empty,
                        deleted: false,
                        failures: 0,
                        seen: 0,
                    },
                );
                k
            }
        };
        self.change_key(key, change, lane)
    }

    fn change_key(&mut self, key: Key, change: Change, lane: Lane) -> Vec<SessionId> {
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        // The name re-used before the earlier object's deletion was delivered (or while it is
        // backing off): that deletion goes first, with its own uid, so the reconciler can tell
        // the two objects apart and nothing is lost.
        let deletion_pending = entry.deleted
            && match entry.state {
                State::Ready { .. } | State::Delayed => true,
                // In flight, the deletion came after the delivery when the key is dirty.
                State::InFlight { dirty, .. } => dirty,
                State::Idle => false,
            };
        if deletion_pending
            && !change.deleted
            && !change.uid.is_empty()
            && entry.uid != Uid::Empty
            && entry.uid != Uid::new(&change.uid)
        {
            self.tombstones
                .entry(key.clone())
                .or_insert_with(|| (entry.uid.clone(), entry.resource_version.clone()));
        }
        entry.reason = merge_reason(entry.state, entry.reason, change.reason);
        if let Some(trace) = change.trace {
            // The first change since the last delivery is the one the wait began with.
            self.traces.entry(key.clone()).or_insert(trace);
        }
        let owned = is_related(change.reason);
        if !change.resource_version.is_empty() {
            entry.resource_version = Rv::new(&change.resource_version);
        }
        if !change.uid.is_empty() {
            entry.uid = Uid::new(&change.uid);
        }
        // A change of an owned or a named object, or a trigger, says nothing about the key's own
        // object: its state and body stay as they were.
        if !owned {
            entry.deleted = change.deleted;
            // Replace the body: the latest state is the one worth delivering.
            self.drop_body(&key);
            if let Some(body) = change.body
                && self.body_bytes + body.len() <= self.config.body_budget.min(self.body_share)
                && self.pool.take(body.len())
            {
                self.body_bytes += body.len();
                self.bodies.insert(key.clone(), body);
            }
        }
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        match entry.state {
            // Waiting behind listed keys: a live change goes ahead of them.
            State::Ready { listed: true } if lane == Lane::Live => self.move_to_live(key),
            State::Ready { .. } => Vec::new(),
            State::InFlight { .. } => {
                entry.state = State::InFlight { dirty: true };
                Vec::new()
            }
            State::Idle => self.enqueue(key, lane),
            // A retry or a requeue-after comes due in the live lane: a listed change that
            // brings it forward does not put it behind the listed keys.
            State::Delayed => {
                self.cancel_timer(&key);
                self.enqueue(key, Lane::Live)
            }
        }
    }

    /// Moves a key ready in the listed lane to the back of the live lane; its listed place
    /// goes stale. Its wait ([`Delivery::queued`]) counts from the move.
    fn move_to_live(&mut self, key: Key) -> Vec<SessionId> {
        if let Some(e) = self.entries.get_mut(&key) {
            e.state = Lane::Live.ready();
        }
        self.stale += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        let queued = Queued {
            seq,
            since: self.now,
            key,
        };
        let wake = self.place(queued, Lane::Live);
        self.compact_if_stale();
        wake
    }

    /// Records that the object of `key` exists as `object`, seen in list epoch `epoch`: queued
    /// as added if the key is new (or was deleted), as modified if its resourceVersion changed,
    /// and not at all if this exact version was already seen (a re-list of an unchanged
    /// object). A change goes to the live lane: call with what the watch's stream shows.
    /// Returns the sessions that now have ready keys.
    pub fn observe(&mut self, key: &str, object: Observed, epoch: u32) -> Vec<SessionId> {
        self.observe_in(key, object, epoch, Lane::Live)
    }

    /// [`GroupQueue::observe`] with the lane a change goes to: [`Lane::Listed`] for what a
    /// list shows.
    pub fn observe_in(
        &mut self,
        key: &str,
        object: Observed,
        epoch: u32,
        lane: Lane,
    ) -> Vec<SessionId> {
        let known = self.prefixes.find(key);
        let reason = match known.as_ref().and_then(|k| self.entries.get_mut(k)) {
            Some(e) if !e.deleted && e.uid == Uid::new(&object.uid) => {
                e.seen = epoch;
                if e.resource_version.matches(&object.resource_version) {
                    return Vec::new();
                }
                Reason::Modified
            }
            _ => Reason::Added,
        };
        let wake = self.change_in(
            key,
            Change {
                reason,
                resource_version: object.resource_version,
                uid: object.uid,
                body: object.body,
                deleted: false,
                trace: object.trace,
            },
            lane,
        );
        if let Some(e) = self
            .prefixes
            .find(key)
            .and_then(|k| self.entries.get_mut(&k))
        {
            e.seen = epoch;
        }
        wake
    }

    /// Attaches the body of `object` to `key` if it is ready at exactly that version without
    /// one (it was queued from a version alone), within the body budget.
    pub fn fill_body(&mut self, key: &str, object: Observed) {
        let Some(body) = object.body else { return };
        let Some(key) = self.prefixes.find(key) else {
            return;
        };
        let fits = self.entries.get(&key).is_some_and(|e| {
            matches!(e.state, State::Ready { .. })
                && !e.deleted
                && e.uid == Uid::new(&object.uid)
                && e.resource_version.matches(&object.resource_version)
        }) && !self.bodies.contains_key(&key)
            && !self.tombstones.contains_key(&key)
            && self.body_bytes + body.len() <= self.config.body_budget.min(self.body_share);
        if fits && self.pool.take(body.len()) {
            self.body_bytes += body.len();
            self.bodies.insert(key, body);
        }
    }

    /// Queues as deleted every live key accepted by `belongs` (the keys of one subscription)
    /// that was not seen in list epoch `epoch`: the deletions that happened while the watch
    /// was down. Call when a re-list ends. Returns the sessions that now have ready keys.
    pub fn sweep(&mut self, epoch: u32, belongs: impl Fn(&str) -> bool) -> Vec<SessionId> {
        let mut text = String::new();
        let gone: Vec<Key> = self
            .entries
            .iter()
            .filter(|(k, e)| {
                !e.deleted && e.seen != epoch && belongs(self.prefixes.spell(k, &mut text))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut wake = Vec::new();
        for key in gone {
            wake.extend(self.change_key(key, Change::deletion(), Lane::Live));
        }
        dedup(wake)
    }

    /// Queues `key` for a resync if it is idle: nothing is known to have changed, so a key
    /// already queued, in flight or delayed is left alone, and no body is attached. Returns the
    /// sessions that now have ready keys.
    pub fn resync(&mut self, key: &str) -> Vec<SessionId> {
        match self.prefixes.find(key) {
            Some(key) => self.resync_key(key),
            None => Vec::new(),
        }
    }

    fn resync_key(&mut self, key: Key) -> Vec<SessionId> {
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        if entry.state != State::Idle {
            return Vec::new();
        }
        entry.reason = Reason::Resync;
        self.enqueue(key, Lane::Listed)
    }

    /// The keys whose objects the queue knows exist (a version seen, not deleted) that `keep`
    /// accepts: a snapshot for [`GroupQueue::touch`], taken under the caller's lock in one pass
    /// and handed back a chunk at a time, so no single hold of the lock is long.
    pub fn live_keys(&self, keep: impl Fn(&str) -> bool) -> Vec<Key> {
        let mut text = String::new();
        self.entries
            .iter()
            .filter(|(k, e)| e.is_live() && keep(self.prefixes.spell(k, &mut text)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Asks again for a reconcile of `keys` ([`GroupQueue::live_keys`]) whose objects still
    /// exist, as a related change of `reason` ([`Change::related`]): queued if idle, coalesced
    /// if ready, run again after the reconcile in flight. Returns the sessions that now have
    /// ready keys.
    pub fn touch(&mut self, keys: &[Key], reason: Reason) -> Vec<SessionId> {
        let mut wake = Vec::new();
        for key in keys {
            if self.entries.get(key).is_some_and(Entry::is_live) {
                wake.extend(self.change_key(key.clone(), Change::related(reason), Lane::Listed));
            }
        }
        dedup(wake)
    }

    /// Resyncs the next `n` keys in index order, wrapping around, so that calling this every
    /// tick with `n = len * tick / interval` resyncs every key once per interval, evenly spread.
    /// Returns the sessions that now have ready keys.
    pub fn resync_batch(&mut self, n: usize) -> Vec<SessionId> {
        let mut wake = Vec::new();
        for _ in 0..n.min(self.entries.len()) {
            if self.resync_cursor >= self.entries.len() {
                self.resync_cursor = 0;
            }
            let Some((key, _)) = self.entries.get_index(self.resync_cursor) else {
                break;
            };
            let key = key.clone();
            self.resync_cursor += 1;
            wake.extend(self.resync_key(key));
        }
        dedup(wake)
    }

    /// Forgets every key for which `moved` is true (the ring moved them away). Keys in flight
    /// are kept until they settle and then forgotten, whatever the outcome: their new owner
    /// reconciles them next. With `drain`, keys ready for delivery are kept too and delivered
    /// here first (this dispatcher still owns them until it releases the ring), so a change it
    /// saw, a deletion above all, is not dropped in transit; then they are forgotten likewise.
    /// Without it (nothing may be handed out), they are dropped. A key that moves back before
    /// it settles is kept as usual.
    pub fn forget_where(&mut self, moved: impl Fn(&str) -> bool, drain: bool) {
        let mut text = String::new();
        let mut leaving = HashSet::default();
        let mut keys = HashSet::default();
        for (k, e) in &self.entries {
            if !moved(self.prefixes.spell(k, &mut text)) {
                continue;
            }
            let pending = matches!(e.state, State::InFlight { .. })
                || drain && matches!(e.state, State::Ready { .. });
            if pending {
                leaving.insert(k.clone());
            } else {
                keys.insert(k.clone());
            }
        }
        self.leaving = leaving;
        if keys.is_empty() {
            return;
        }
        for queue in self
            .sessions
            .values_mut()
            .map(|s| &mut s.ready)
            .chain(std::iter::once(&mut self.unassigned))
        {
            queue.retain(|_, q| !keys.contains(&q.key));
        }
        for key in keys {
            self.cancel_timer(&key);
            self.remove_entry(&key);
        }
    }

    /// Whether a key that moved away and is accepted by `pred` is still here, queued or in
    /// flight. Only such keys can be: [`Self::forget_where`] removed every other moved key, and
    /// a moved key is forgotten when its delivery settles. Cheap: it looks at those keys alone.
    pub fn any_leaving(&self, pred: impl Fn(&str) -> bool) -> bool {
        let mut text = String::new();
        self.leaving
            .iter()
            .any(|k| pred(self.prefixes.spell(k, &mut text)))
    }

    /// Forgets the keys that moved away and wait ready for delivery while the group has no
    /// session to take them (its replicas are gone, or hung until their sessions expired):
    /// held for a session that may not come, they would hold the ring's release back for
    /// every group. Their new owner reconciles them from its own list; the ones whose pending
    /// change is a deletion, which no list shows, are returned for the caller to remember
    /// (peers ask for them). Keys in flight stay until they settle.
    pub fn abandon_leaving_ready(&mut self) -> Vec<String> {
        if !self.sessions.is_empty() || self.leaving.is_empty() {
            return Vec::new();
        }
        let ready: HashSet<Key> = self
            .leaving
            .iter()
            .filter(|k| {
                self.entries
                    .get(*k)
                    .is_some_and(|e| matches!(e.state, State::Ready { .. }))
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            return Vec::new();
        }
        self.unassigned.retain(|_, q| !ready.contains(&q.key));
        let mut deletions = Vec::new();
        for key in ready {
            if self.entries.get(&key).is_some_and(|e| e.deleted) {
                deletions.push(self.prefixes.text(&key));
            }
            self.leaving.remove(&key);
            self.remove_entry(&key);
        }
        deletions
    }

    /// Whether `key` moved away and is still here, queued or in flight ([`Self::forget_where`]).
    pub fn is_leaving(&self, key: &str) -> bool {
        self.prefixes
            .find(key)
            .is_some_and(|key| self.leaving.contains(&key))
    }

    /// Whether any key accepted by `pred` is in flight or ready for delivery.
    #[cfg(test)]
    pub(crate) fn any_pending(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.any_in_flight(&pred)
            || self
                .sessions
                .values()
                .flat_map(|s| s.ready.iter())
                .chain(self.unassigned.iter())
                .any(|(lane, q)| self.is_place(lane, q) && pred(&self.prefixes.text(&q.key)))
    }

    /// Whether any key accepted by `pred` is in flight.
    #[cfg(test)]
    pub(crate) fn any_in_flight(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.sessions
            .values()
            .flat_map(|s| s.in_flight.values().map(|(key, _)| key))
            .any(|k| pred(&self.prefixes.text(k)))
    }

    /// Number of deliveries in flight.
    pub fn in_flight_len(&self) -> usize {
        self.sessions
            .values()
            .map(|s| s.in_flight.len())
            .sum::<usize>()
            + self.held.len()
    }

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
        self.take_within_sized(session, max, max_bytes, now, |_| 0)
    }

    /// As [`GroupQueue::take_within`], with `extra(key)` more bytes counted for each key: what
    /// the caller adds to its delivery (an owner's children). A key alone past the bound loses
    /// its body, not what `extra` counts.
    pub fn take_within_sized(
        &mut self,
        session: SessionId,
        max: usize,
        max_bytes: usize,
        now: Instant,
        mut extra: impl FnMut(&str) -> usize,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let deadline = later(now, self.config.max_reconcile_time);
        while out.len() < max {
            let Some((lane, queued)) = self.sessions.get_mut(&session).and_then(|s| s.ready.pop())
            else {
                break;
            };
            let Some(entry) = self
                .entries
                .get_mut(&queued.key)
                .filter(|e| e.state == lane.ready())
            else {
                // A place the key left (moved to the live lane, delivered from another).
                self.stale = self.stale.saturating_sub(1);
                continue;
            };
            let text = self.prefixes.text(&queued.key);
            let tombstone = self.tombstones.contains_key(&queued.key);
            let body_len = match self.bodies.get(&queued.key) {
                Some(b) if !tombstone => b.len(),
                _ => 0,
            };
            let memo_len = self.memos.get(&queued.key).map_or(0, |(_, m)| m.len());
            let added = extra(&text).saturating_add(memo_len);
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
            let id = self.next_delivery;
            self.next_delivery += 1;
            // A memo its ack leaves is for the live object it delivers, and only that.
            let object =
                (!entry.deleted && !self.tombstones.contains_key(&key)).then(|| entry.uid.clone());
            self.flights.insert(
                key.clone(),
                Flight {
                    session,
                    delivery: id,
                    object,
                },
            );
            if let Some((uid, rv)) = self.tombstones.remove(&key) {
                // The earlier object's deletion; the new object goes once it is acknowledged.
                entry.state = State::InFlight { dirty: true };
                self.counts.deliveries[Reason::Deleted as usize] += 1;
                out.push(Delivery {
                    queued: since.map(|since| now.saturating_duration_since(since)),
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
                });
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.in_flight.insert(id, (key.clone(), now));
                }
                self.set_timer(key, deadline);
                continue;
            }
            entry.state = State::InFlight { dirty: false };
            let body = self.bodies.remove(&key);
            if let Some(b) = &body {
                self.body_bytes -= b.len();
                self.pool.give_back(b.len());
            }
            let body = body.filter(|_| keep_body);
            let trace = self.traces.remove(&key);
            // Only to the object it was left for; a deletion needs none.
            let memo = match self.memos.get(&key) {
                Some((uid, memo)) if *uid == entry.uid && !entry.deleted => Some(memo.clone()),
                _ => None,
            };
            self.counts.deliveries[(entry.reason as usize).min(9)] += 1;
            out.push(Delivery {
                queued: since.map(|since| now.saturating_duration_since(since)),
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
            });
            if let Some(s) = self.sessions.get_mut(&session) {
                s.in_flight.insert(id, (key.clone(), now));
            }
            self.set_timer(key, deadline);
        }
        // Fewer ready keys now: the stale places stay within their bound of the ready keys.
        self.compact_if_stale();
        out
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
    fn settle(
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

    /// The earliest time at which [`Self::advance`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Fires every timer due at `now`: delayed keys become ready, and in-flight deliveries past
    /// the maximum reconcile time are treated as failures. Returns the sessions that now have
    /// ready keys.
    pub fn advance(&mut self, now: Instant) -> Vec<SessionId> {
        let mut wake = Vec::new();
        let mut released = false;
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
                        released = true;
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
        if released {
            wake.extend(self.rebalance());
        }
        dedup(wake)
    }

    /// Puts an in-flight key back at once (its session ended).
    fn requeue_now(&mut self, key: &Key) {
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

    fn remove_entry(&mut self, key: &Key) {
        // swap_remove moves the last key into the hole: a resync cycle may visit it twice or
        // skip it once, which level-triggered resync tolerates.
        self.cancel_timer(key);
        self.flights.remove(key);
        self.held.remove(key);
        if let Some(entry) = self.entries.swap_remove(key) {
            self.prefixes.release(key);
            if matches!(entry.state, State::Ready { .. }) {
                // Its place goes stale. The callers that remove ready keys drop their places
                // first; counted anyway, so the count stays at least the stale places.
                self.ready_count -= 1;
                self.stale += 1;
            }
        }
        self.drop_body(key);
        self.traces.remove(key);
        self.tombstones.remove(key);
        self.drop_memo(key);
    }

    /// Makes an idle or delayed key ready, at the back of `lane` of the session that owns it.
    fn enqueue(&mut self, key: Key, lane: Lane) -> Vec<SessionId> {
        self.counts.adds += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        entry.state = lane.ready();
        self.ready_count += 1;
        let queued = Queued {
            seq,
            since: self.now,
            key,
        };
        self.place(queued, lane)
    }

    /// Puts `queued` at the back of `lane` of the session its key is assigned to (or of the
    /// unassigned keys). Returns that session.
    fn place(&mut self, queued: Queued, lane: Lane) -> Vec<SessionId> {
        let assigned = self.assign(&queued.key);
        match assigned.and_then(|id| Some((id, self.sessions.get_mut(&id)?))) {
            Some((id, s)) => {
                s.ready.lane(lane).push_back(queued);
                vec![id]
            }
            None => {
                self.unassigned.lane(lane).push_back(queued);
                Vec::new()
            }
        }
    }

    fn assign(&self, key: &Key) -> Option<SessionId> {
        let replica = self.ring.owner_of_hash(self.prefixes.hash64(key))?;
        self.replica_sessions.get(replica).copied()
    }

    /// Rebuilds the replica ring and hands every ready key to the session that owns it now,
    /// in its lane, keeping first-enqueue order; stale places are dropped on the way.
    fn rebalance(&mut self) -> Vec<SessionId> {
        self.ring = Ring::new(self.sessions.values().map(|s| s.replica.clone()));
        let mut all = std::mem::take(&mut self.unassigned);
        for s in self.sessions.values_mut() {
            all.append(std::mem::take(&mut s.ready));
        }
        let mut wake = Vec::new();
        let mut seen: HashSet<Key> = HashSet::default();
        for lane in [Lane::Live, Lane::Listed] {
            let mut ready: Vec<Queued> = std::mem::take(all.lane(lane)).into();
            ready.sort_unstable_by_key(|q| q.seq);
            for queued in ready {
                if !self.is_place(lane, &queued) || !seen.insert(queued.key.clone()) {
                    continue;
                }
                wake.extend(self.place(queued, lane));
            }
        }
        self.stale = 0;
        dedup(wake)
    }

    fn set_timer(&mut self, key: Key, at: Instant) {
        self.cancel_timer(&key);
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.entries.contains_key(&key) {
            self.timer_slots.insert(key.clone(), (at, seq));
            self.timers.insert((at, seq), key);
        }
    }

    fn cancel_timer(&mut self, key: &Key) {
        if let Some(slot) = self.timer_slots.remove(key) {
            self.timers.remove(&slot);
        }
    }
}

/// The reason to deliver after a new change, given the reason of a change not yet delivered
/// (`pending`, meaningful while the key is ready or dirty in flight): an addition stays an
/// addition, and a change of the key's own object outranks a related one ([`is_related`]).
fn merge_reason(state: State, pending: Reason, new: Reason) -> Reason {
    let undelivered = matches!(state, State::Ready { .. } | State::InFlight { dirty: true });
    match (pending, new) {
        (Reason::Added, Reason::Modified) if undelivered => pending,
        (Reason::Added | Reason::Modified | Reason::Deleted, new)
            if undelivered && is_related(new) =>
        {
            pending
        }
        _ => new,
    }
}

/// Whether a change of this reason is about another object than the key's own (an owned one,
/// a named one) or about none (a trigger): it leaves the key's own state as it was.
pub fn is_related(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::Owned | Reason::Referenced | Reason::Triggered
    )
}

fn dedup(mut ids: Vec<SessionId>) -> Vec<SessionId> {
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl Drop for GroupQueue {
    fn drop(&mut self) {
        self.pool.give_back(self.body_bytes);
        self.memo_pool.give_back(self.memo_bytes);
    }
}

#[cfg(test)]
mod tests;
