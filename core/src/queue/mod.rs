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
//!   bodies are kept for ready keys only within `body_budget` bytes, past which a key is
//!   delivered without its body; with `keep_delivered_bodies`, delivered bodies stay with
//!   their keys within half of it. A key moved from the listed lane to the live one leaves its
//!   old place behind until it is passed over or the lanes are compacted, which they are in
//!   one pass as soon as such places outnumber both the ready keys and [`STALE_SLACK`]: the
//!   lanes hold a place per ready key and at most as many stale ones as there were ready keys
//!   (or [`STALE_SLACK`]) at the last move. Nothing grows with the event rate.
//!
//! Time is passed in as `now`, so the logic is tested without a clock; the caller sleeps until
//! [`GroupQueue::next_deadline`] and calls [`GroupQueue::advance`].

use std::{
    collections::BTreeMap,
    num::NonZeroU64,
    sync::Arc,
    time::{Duration, Instant},
};

use indexmap::IndexMap;
use kube_dispatch_proto::{Ring, v1::Reason};

use crate::backoff::Backoff;

mod assignment;
mod bodies;
mod changes;
mod compact;
mod flight;
mod keys;
mod lanes;
mod leaving;
pub mod pool;
mod status;
mod timers;
use compact::{Rv, Uid};
pub use keys::Key;
use keys::{HashMap, HashSet, Prefixes};
/// A change of a related reason leaves the key's own state as it was.
pub use kube_dispatch_proto::is_related;
use lanes::Lanes;
pub use lanes::STALE_SLACK;

/// Most ready keys one take passes over because its caller says they wait
/// ([`GroupQueue::take_within_sized`]): the take ends there, so it never looks at more than this
/// beyond what it hands out; the next take begins with the keys behind them.
pub const MAX_WAITING_PER_TAKE: usize = 1024;
use pool::BodyPool;
pub use status::{KeyState, KeyStatus, QueueCounts, QueueFigures};

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
    /// Most bytes of object bodies held for ready keys (and kept from deliveries, within half
    /// of it); past it keys are delivered without body.
    pub body_budget: usize,
    /// Most bytes of memos ([`GroupQueue::leave_memo`]) the group keeps, each at most
    /// [`kube_dispatch_proto::MAX_MEMO_BYTES`]; past it a memo is not kept and the key's next
    /// delivery carries none.
    pub memo_budget: usize,
    /// Whether a delivered body stays with its key for the key's next delivery, within half
    /// the body budget and while the pool is at most half full: for groups whose keys are
    /// queued by changes to other objects (owned, named), whose deliveries would otherwise
    /// carry no body of the key's own object and cost its controller a read.
    pub keep_delivered_bodies: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            max_reconcile_time: Duration::from_secs(60),
            body_budget: 256 * 1024 * 1024,
            memo_budget: 16 * 1024 * 1024,
            keep_delivered_bodies: false,
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
    /// Whether it waited in the listed lane (a resync, a list after a restart or a handover, a
    /// trigger of every key), which gives way to changes.
    pub listed: bool,
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

/// Everything the queue keeps about an idle key: 64 bytes, with the key's 32 and the map's
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
    /// The change filter's hash of the version recorded ([`Observed::fingerprint`]); `None`
    /// when the subscription has no filter or no version was recorded with one.
    fingerprint: Option<NonZeroU64>,
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
    /// For a subscription with a change filter: a hash of the parts it compares
    /// ([`crate::subscription::Parts`]). A change whose hash equals the one recorded for the key
    /// is not delivered ([`GroupQueue::observe_in`]).
    pub fingerprint: Option<NonZeroU64>,
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

#[derive(Debug, Default)]
struct Session {
    replica: String,
    ready: Lanes,
    /// Each delivery in flight: its key, and when it was handed out.
    in_flight: HashMap<DeliveryId, (Key, Instant)>,
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
    /// What [`GroupQueue::resync_due`] owes beyond the whole keys it resynced: keys times
    /// nanoseconds, less than one interval's worth.
    resync_carry: u128,
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
    /// Bodies of queued keys, and of delivered ones where the group keeps them, within the
    /// budget; beside the entries for the same reason.
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
            resync_carry: 0,
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
