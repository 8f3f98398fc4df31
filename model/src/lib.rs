//! A model of kube-dispatch's delivery protocol, checked exhaustively with
//! [stateright](https://docs.rs/stateright): dispatchers with their Leases, sessions and work
//! queues, the handover gate, controller replicas with their fencing, and the network between
//! them, under crashes, restarts, cuts, lost and reordered messages and drifting clocks.
//!
//! The model is one transition function over one state; the tests at the end replay paths
//! through it.
//!
//! Start at [`Protocol`]: [`Protocol::new`] builds the model from a [`Config`], and
//! `Protocol::checker()` (stateright's [`Model`] trait) explores it. `make test` runs a bounded
//! check (`tests` below); `make model` runs a deeper one (`src/main.rs`). [`real::walk`] steps
//! the real code (`kube_dispatch_core::leases`, `::handover`, `::queue`, `::transit`) in
//! lock-step with the model, so what the checker proves of the model's Leases, gate and queues
//! holds of the code's.
//!
//! # What is modelled
//!
//! Time advances in ticks ([`Action::Tick`]); every deadline is a countdown, so the state space
//! is finite however long a run lasts. Between ticks any enabled action may happen, in any
//! order, which models arbitrary delays of messages and of every process's steps.
//!
//! - **Leases** (`dispatcher/src/k8s/membership.rs`): a dispatcher renews its Lease (publishing the
//!   ring it has released); it fences itself `lease` ticks after its last *answered* renewal;
//!   the others drop it `lease + grace` ticks after the renewal they saw. A renewal may reach
//!   the API server and its answer be lost. A dispatcher cut off from the API server neither
//!   renews nor observes. A dispatcher judges membership only on a whole view of the Leases
//!   that shows its own last renewal ([`Views::Whole`]); [`Views::Partial`] models the older
//!   code that judged on every event of its Lease watch's first list, and shows its overlap.
//! - **Restarts and graceful stops**: a restarted dispatcher renews its Lease before its Lease
//!   watch has listed; it waits `bound` before serving if it finds its Lease still there. A
//!   graceful stop, made only with nothing in flight, deletes the Lease with the drained mark
//!   (the others then drop it at once).
//! - **Lease deletions** (`core/src/leases.rs`): a Lease deleted without the drained mark (by
//!   hand, a cleanup job), of a live, cut-off or dead dispatcher, is a member that died: the
//!   others wait out `bound`, even if its holder writes it again before they judge, and release
//!   no ring meanwhile (`Handover::waits_on_dead`), so a dispatcher that joins or restarts and
//!   never saw the death waits too. A dispatcher off its own ring serves nothing.
//! - **CloseSession**: a client may close a session while its reconciles still run (the SDK
//!   does not); the dispatcher takes no more calls on it and holds its keys in flight until
//!   the session would have expired. The replica reopens only once that has happened.
//! - **The handover gate** (`core/src/handover.rs`): on a change of the live members a
//!   dispatcher adopts the new ring, trims its queue (moved keys in flight, or ready while it was
//!   serving, are delivered here first and then forgotten), releases the ring once none is left,
//!   and serves moved-in keys only when every other member has released the ring in a Lease
//!   write seen after the adoption, every member that died has been gone for `bound`, and, after
//!   a crash, `bound` has passed since its restart. Then a list beside its watch queues the
//!   served keys it does not know; so does a member leaving a ring no handover completed to
//!   (`Slice::may_serve_more_than`).
//! - **The queue** (`core/src/queue/`): a key is absent, idle, ready or in flight on one
//!   session; a change while in flight marks it dirty; an ack settles it; an expired session or a
//!   delivery past `max_reconcile` puts it back. Any session may take any ready key (a superset
//!   of the consistent-hash assignment). A queue records a change of a key it serves, keeps
//!   while it hands out nothing, or holds on its way out (`GroupEvent::Exists`).
//! - **Sessions**: a poll renews the session when it arrives and again when it is answered; an
//!   ack renews it when it arrives; a session expires `ttl` ticks after its last renewal. A
//!   reopening replica replaces its old session, whose keys in flight stay held until it would
//!   have expired.
//! - **Replicas** (`controller-sdk/src/fence.rs`): a replica polls one call at a time per
//!   session, and counts its fence (`fence` ticks) and each delivery's limit (`limit` ticks) from
//!   when it *sent* the poll, plus the time the dispatcher held it; when either runs out it
//!   cancels at once (time does not pass until it has). A replica runs one reconcile of a key at
//!   a time, reopens a session only after cancelling what the old one handed it, and may crash.
//! - **The network**: messages in flight may be delivered in any order, or lost (within the
//!   budget). A replica's clock may run slow by up to `drift` ticks over a run.
//! - **Changes**: an object changes (within the budget); dispatchers that record its key queue
//!   it; one cut off re-lists when it is back (the keys it missed, and a sweep of the deleted).
//! - **Deletions** (`core/src/transit.rs`): an object is deleted (within the budget), and may
//!   be created again; a dispatcher serving its key queues the deletion (forgotten once
//!   acknowledged; a deletion not yet delivered when the name is re-used goes first),
//!   one owning it without serving it yet holds it for the end of the handover, and any other
//!   remembers it in case the key moves there; a restarted dispatcher asks its live peers for
//!   what they remember of its keys once it serves.
//!
//! - **Owned objects**: an object a key's object owns changes (within the budget); every
//!   dispatcher that records the key queues it without touching what it knows of the key's own
//!   object (`GroupEvent::OwnedChanged`), and one cut off re-lists. Which owner a child names, and
//!   the children index that tells old and new owners (`core/src/children.rs`), are
//!   left to the tests against the API server.
//!
//! - **Controller groups** (`Config::groups`): one or two groups subscribe to the same objects;
//!   each has a queue and a transit of its own at every dispatcher (a key of the model's
//!   dispatchers and replicas is an entry per group and object), a replica takes only its
//!   group's keys, and a dispatcher releases its ring only once every group's queue has handed
//!   over (`Slice::released`, asked of each group by `GroupTable::release_ring`).
//!
//! - **Groups made lazily** (`Config::lazy_groups`): a group exists at a dispatcher only from
//!   the first session one of its replicas opens there since the dispatcher started, as
//!   `GroupTable::open` makes it; it is then shown what exists and asks the peers for the
//!   deletions they remember. The checker finds a deletion lost this way when the only peer
//!   that remembers it restarts too (a known gap, `dispatcher/HANDOVER.md`), so the other
//!   checks make every group at start. The model makes, lists and asks in one step, where the
//!   dispatcher waits for the group's first list (longer during a cut), and the lock-step
//!   does not step lazy groups.
//!
//! - **Takeover by reports** (`Config::takeover`, `core/src/handover.rs`): a dispatcher lists
//!   on its Lease each session it holds and each that keys in flight were handed to, and hands
//!   a session keys only once a write listing it was answered. A replica may at any time fence
//!   its session on a dispatcher (cancelling what it handed out) and report it, or its last
//!   session there, ended to another dispatcher that is up ([`Action::Report`]: a superset of
//!   reporting when a live dispatcher asks), whose next Lease write carries the report. A
//!   dispatcher that finds a member dead remembers the sessions its Lease listed (none known
//!   if the Lease was deleted, or written by a process that waits out its previous one; both
//!   deaths' sessions when it dies again while waited out), and stops waiting for it once
//!   each is reported on some Lease.
//!   A replica's sessions on one dispatcher alternate between two ids; reports of an id's
//!   earlier session are forgotten when it is used again, as real ids are never reused.
//!
//! Not modelled: the drain that precedes a graceful stop, the load balancer (placement only
//! chooses which dispatchers a replica polls: here every replica may poll every dispatcher),
//! the bounds of the deletions remembered (here for ever), body budgets and backoff delays.
//!
//! # Properties
//!
//! - `exclusive` (always): no two replicas run a reconcile of one key at once. Each fix it
//!   depends on has a variant that reverts it ([`Variant`], [`Views`], [`Deletions`],
//!   `Config::withhold`, [`Closes`]) and a test with the path that then overlaps.
//! - `settles` (always): from every reachable state, once faults stop, a fair schedule
//!   reconciles every changed key: a reconcile of it starts after its last change.
//! - Reachability (sometimes), so the check cannot pass vacuously: a key is reconciled, a
//!   handover completes after a dispatcher crash, a session is fenced by a replica, the wait
//!   for a member that died ends by reports.

#![forbid(unsafe_code)]

pub mod real;
pub mod replay;
mod steps;

use std::fmt;

use kube_dispatch_proto::{RequestKey, Ring};
use stateright::{Model, Property};

/// Delivery numbers are counted modulo this, so that an ack of an older delivery (still on its
/// way) does not settle a newer one. The network keeps at most one ack per key and pair (see
/// `send_ack`), so a wrongly matched ack is rare; it could only settle a key early, which adds
/// behaviours (a possible false alarm) and never hides an overlap.
pub const DELIVERIES: u8 = 2;

/// Durations of the model, in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// A dispatcher expires a session this long after its last renewal.
    pub ttl: u8,
    /// A replica counts a session as lost this long after sending its last renewing call
    /// (three quarters of the ttl in the SDK).
    pub fence: u8,
    /// A dispatcher voids a delivery not acknowledged this long after handing it out.
    pub max_reconcile: u8,
    /// A replica cancels a delivery this long after sending the poll that brought it (nine
    /// tenths of the maximum reconcile time in the SDK, rounded down).
    pub limit: u8,
    /// A dispatcher fences itself this long after its last answered Lease renewal.
    pub lease: u8,
    /// The others drop a member this long after the lease duration.
    pub grace: u8,
    /// `T`: the larger of the session ttl and the maximum reconcile time.
    pub bound: u8,
}

impl Timing {
    /// One tick is a quarter of a session ttl.
    pub const COARSE: Self = Self {
        ttl: 4,
        fence: 3,
        max_reconcile: 4,
        limit: 3,
        lease: 4,
        grace: 1,
        bound: 4,
    };
    /// One tick is an eighth of a session ttl: room for a replica clock that drifts.
    pub const FINE: Self = Self {
        ttl: 8,
        fence: 6,
        max_reconcile: 8,
        limit: 7,
        lease: 8,
        grace: 2,
        bound: 8,
    };
}

/// How many faults of each kind a run may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Budget {
    /// Dispatcher crashes (kill -9; each may be followed by a restart).
    pub dispatcher_crashes: u8,
    /// Graceful stops of a dispatcher with nothing in flight, which delete its Lease (each may
    /// be followed by a restart).
    pub graceful_stops: u8,
    /// Replica crashes.
    pub replica_crashes: u8,
    /// Cuts between a dispatcher and the API server (each healed at some point).
    pub api_cuts: u8,
    /// Lease renewals whose answer is lost.
    pub lost_renewal_answers: u8,
    /// Messages lost between replicas and dispatchers.
    pub lost_messages: u8,
    /// Object changes.
    pub changes: u8,
    /// Ticks a replica's clock may fall behind.
    pub drift: u8,
    /// Lease deletions without the drained mark (`kubectl delete lease`, a cleanup job), of a
    /// live, stalled or dead dispatcher.
    pub lease_deletions: u8,
    /// CloseSession calls sent while reconciles of the session still run: a client that breaks
    /// the contract (the SDK closes only once they have ended).
    pub closes: u8,
    /// Object deletions (a change of a deleted object creates it again, under a new uid).
    pub deletions: u8,
    /// Changes of an owned object, which its owner's key must be reconciled for.
    pub owned_changes: u8,
    /// Reports by a replica that a session ended ([`Action::Report`]): the sessions of a
    /// dispatcher that died end before the bound once each is reported.
    pub reports: u8,
}

impl Budget {
    /// No fault at all.
    pub const NONE: Self = Self {
        dispatcher_crashes: 0,
        graceful_stops: 0,
        replica_crashes: 0,
        api_cuts: 0,
        lost_renewal_answers: 0,
        lost_messages: 0,
        changes: 0,
        drift: 0,
        lease_deletions: 0,
        closes: 0,
        deletions: 0,
        owned_changes: 0,
        reports: 0,
    };
}

/// Which replica behaviour the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The SDK as it is: deadlines count from the send of the call (`fence.rs`).
    SendTime,
    /// Deadlines count from when the answer arrived, and a reconcile's limit from when it
    /// started: the SDK before `fence.rs`. The check finds an overlap.
    ArrivalTime,
}

/// What a dispatcher judges membership on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Views {
    /// The dispatcher as it is: only a whole view of the Leases that shows its own last
    /// renewal (`k8s/membership.rs`).
    Whole,
    /// Every Lease event, including each one of the list its Lease watch starts with after a
    /// restart or a cut: it may judge on a part of the Leases. The check finds an overlap.
    Partial,
}

/// What the others make of a Lease that disappears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletions {
    /// The dispatcher as it is: only a Lease deleted with its holder's drained mark is a
    /// release; otherwise its holder died (`core/src/leases.rs`).
    Died,
    /// Every deleted Lease is a release: the code before the drained mark. The check finds an
    /// overlap.
    Released,
}

/// What a dispatcher does with the keys in flight on a session closed by CloseSession.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closes {
    /// The dispatcher as it is: they stay held until the session would have expired
    /// (`GroupQueue::remove_session_holding`).
    Hold,
    /// They go back to the queue at once, trusting the client to have stopped: the code before.
    /// The check finds an overlap with a client that closes while it still reconciles.
    Release,
}

/// How the others take over the keys of a dispatcher that died.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// They wait out the bound: replicas report nothing.
    Bound,
    /// The dispatcher as it is: it hands keys to a session only once a Lease write listing it
    /// was answered; a replica fences a session on request and reports it ended to a live
    /// dispatcher, whose next Lease write carries the report; the others stop waiting for a
    /// member that died once every session its Lease listed is reported ended
    /// (`Handover::judge`).
    Reports,
    /// As `Reports`, but a dispatcher hands keys to a session its Lease does not list yet. The
    /// check finds an overlap.
    Unlisted,
    /// As `Reports`, but a replica reports a session ended before its reconciles from it have.
    /// The check finds an overlap.
    ReportFirst,
}

impl Takeover {
    fn reports(self) -> bool {
        self != Self::Bound
    }
}

/// What to check.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Dispatchers (2 or 3).
    pub dispatchers: usize,
    /// Controller replicas (1 to 3); replica `r` belongs to group `r % groups`.
    pub replicas: usize,
    /// Controller groups subscribed to the same objects (1 or 2). Each has a queue and a
    /// transit of its own at every dispatcher, and a dispatcher releases its ring only once
    /// every group's queue has handed over (`GroupTable::release_ring`).
    pub groups: usize,
    /// Keys (1 or 2): objects, each queued once per group.
    pub keys: usize,
    /// Whether a controller group exists at a dispatcher only once one of its replicas opened
    /// a session there since the dispatcher started (as `GroupTable::open` makes it; its watch's
    /// list then shows it what exists, and it asks the peers for the deletions they remember),
    /// rather than at every dispatcher from the start. Groups are never dropped.
    pub lazy_groups: bool,
    /// Durations.
    pub timing: Timing,
    /// Faults.
    pub budget: Budget,
    /// Replica behaviour.
    pub variant: Variant,
    /// What dispatchers judge membership on.
    pub views: Views,
    /// What a deleted Lease means.
    pub deletions: Deletions,
    /// Whether a dispatcher releases no ring while it waits out a member that died (the
    /// dispatcher as it is); without, a dispatcher that joins meanwhile and never saw the dead
    /// member overlaps.
    pub withhold: bool,
    /// What CloseSession does with keys in flight.
    pub closes: Closes,
    /// Whether a dispatcher lists the keys that come back to it without a handover (a member
    /// left its ring before a handover to the larger ring completed) as it does after a
    /// handover: the dispatcher as it is (`Slice::may_serve_more_than`). Without, a change
    /// made while such a member came and went is never delivered.
    pub relist_returning: bool,
    /// Check `settles` too (a fair run from every state with a change pending: the costly part).
    pub liveness: bool,
    /// How the keys of a dispatcher that died are taken over.
    pub takeover: Takeover,
}

/// A key in a dispatcher's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// Not indexed.
    Absent,
    /// Indexed, nothing to do.
    Idle,
    /// Waiting for a session to take it; `leaving` when the ring moved it away (delivered here
    /// once more, then forgotten).
    Ready {
        /// Moved away: forgotten once delivered and settled.
        leaving: bool,
    },
    /// Handed to the session of `replica`.
    InFlight {
        /// The replica holding it.
        replica: u8,
        /// Ticks until the delivery is void.
        deadline: u8,
        /// Which delivery, so that an old ack never settles a newer one (modulo [`DELIVERIES`]).
        delivery: u8,
        /// Which of the replica's sessions here it was handed to (0 or 1: its sessions
        /// alternate), as the Lease lists them.
        session: u8,
        /// Changed meanwhile: queue again when settled.
        dirty: bool,
        /// Moved away: forgotten once settled.
        leaving: bool,
    },
}

impl Key {
    /// The same key, marked as moved away or not (idle and absent keys have no mark).
    fn leaving(self, leaving: bool) -> Self {
        match self {
            Self::Ready { .. } => Self::Ready { leaving },
            Self::InFlight {
                replica,
                deadline,
                delivery,
                session,
                dirty,
                ..
            } => Self::InFlight {
                replica,
                deadline,
                delivery,
                session,
                dirty,
                leaving,
            },
            other => other,
        }
    }
}

/// A dispatcher process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Dispatcher {
    /// Running (false after a crash, until restarted).
    pub up: bool,
    /// Reaches the API server.
    pub api: bool,
    /// Its Lease watch is listing (after a start or a cut) and has not yet shown its own
    /// renewal.
    pub listing: bool,
    /// Ticks until it fences itself, from its last answered renewal.
    pub own_lease: u8,
    /// The live members as it last observed them (a bit per dispatcher).
    pub ring: u8,
    /// The ring of its last completed handover; `None` while it hands out nothing.
    pub settled: Option<u8>,
    /// Members whose release of `ring` it saw in a Lease write after adopting `ring`.
    pub fresh: u8,
    /// Members that wrote their Lease since it adopted `ring`.
    pub written: u8,
    /// Per member: ticks left of the wait for one that died (0: none).
    pub died: Vec<u8>,
    /// Per member: ticks left of its Lease's liveness as this dispatcher saw it, from when it
    /// saw it written (`Observations::live`: a Lease first seen on a list counts from then).
    pub view: Vec<u8>,
    /// Leases written or deleted while it was cut off from the API server: re-listed when it is
    /// back.
    pub missed: u8,
    /// Members whose Lease it saw deleted without the drained mark since it last judged
    /// (`Observations::take_deaths`): they died, even if renewed again meanwhile.
    pub deaths: u8,
    /// Ticks left before it may hand out anything after a crash of its previous process.
    pub hold: u8,
    /// Keys whose change it missed while cut off from the API server (a bit each): its queue
    /// holds an older version of them, which the re-list when it is back replaces.
    pub stale: u8,
    /// Keys whose queue entry records the object's deletion (a bit each): forgotten once that
    /// delivery is acknowledged.
    pub gone: u8,
    /// Keys whose object was created again before the deletion of the earlier one was
    /// delivered (a bit each): that deletion goes first (`GroupQueue`'s tombstones).
    pub tomb: u8,
    /// Keys whose queue entry knows no uid (a bit each): made by a deletion known by its key
    /// alone (held through a handover, or asked of a peer). Created again, such a key has no
    /// tombstone: the earlier object cannot be told apart, and the new one is delivered.
    pub nameless: u8,
    /// Keys whose queue entry was made by a change of an owned object alone and knows no
    /// version of the key's own object (a bit each): a list still shows it that object.
    pub objectless: u8,
    /// Deletions its transit holds for keys it owns on its ring but does not serve yet,
    /// queued once it does (`Transit`'s held deletions).
    pub held_deletions: u8,
    /// Deletions of keys owned elsewhere it remembers, in case they move here (`Transit`'s
    /// recent deletions; the model remembers them for ever).
    pub recent: u8,
    /// The controller groups that exist here (a bit each): every group from the start, or,
    /// with [`Config::lazy_groups`], those a replica opened a session of since it started
    /// (`GroupTable::open`). A group that does not exist records nothing.
    pub groups: u8,
    /// The groups that have asked its peers for the deletions they remember of their keys
    /// (once each, when the group exists and the dispatcher serves:
    /// `peer::fetch_recent_deletions`).
    pub asked: u8,
    /// Its queue, per key.
    pub keys: Vec<Key>,
    /// Per replica: ticks until its session expires, if it has one.
    pub sessions: Vec<Option<u8>>,
    /// Per replica: a poll held here, with the replica's countdown frozen while held.
    pub held: Vec<Option<u8>>,
    /// Per replica: its session was closed by CloseSession; it takes no call, and its keys in
    /// flight are held until it expires.
    pub closed: Vec<bool>,
    /// Next delivery number per key (modulo [`DELIVERIES`]).
    pub next_delivery: Vec<u8>,
    /// Per replica (a bit each): which of its sessions it holds here (0 or 1).
    pub generations: u8,
    /// Replicas whose session here a Lease write it saw answered listed (a bit each): only
    /// these are handed keys ([`Takeover::Reports`]).
    pub listed: u8,
    /// Per member: the sessions its Lease listed when it was found dead ([`Protocol::sid`]
    /// bits), if known: its wait ends once each is reported ended.
    pub awaiting: Vec<Option<u32>>,
    /// Sessions reported ended to it ([`Protocol::sid`] bits), carried by its Lease writes.
    pub reported: u32,
}

/// A dispatcher's Lease as the API server holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The ring its holder released, if any.
    pub released: Option<u8>,
    /// It exists on the API server (a Lease deleted, cleanly or not, does not until its holder
    /// renews it again).
    pub exists: bool,
    /// Deleted by a graceful stop with the drained mark: its holder left nothing in flight.
    pub drained: bool,
    /// The sessions it lists ([`Protocol::sid`] bits): every session its holder may have handed
    /// keys to that may still run them.
    pub sessions: u32,
    /// Whether `sessions` is all of them: not while its holder waits out its previous process
    /// (whose sessions it does not know).
    pub known: bool,
    /// Sessions of others reported ended to its holder ([`Protocol::sid`] bits).
    pub ended: u32,
}

/// A replica's session on one dispatcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaSession {
    /// Ticks until the replica counts the session as lost.
    pub fence: u8,
    /// A poll is out.
    pub polling: bool,
}

/// A reconcile a replica runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// The dispatcher that delivered it.
    pub dispatcher: u8,
    /// Which delivery.
    pub delivery: u8,
    /// Ticks until the replica cancels it.
    pub deadline: u8,
}

/// A controller replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Running.
    pub up: bool,
    /// Per dispatcher.
    pub sessions: Vec<Option<ReplicaSession>>,
    /// Per key.
    pub running: Vec<Option<Run>>,
    /// Per dispatcher (a bit each): which of its sessions there is the latest (0 or 1).
    pub generations: u8,
}

/// A message between a replica and a dispatcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    /// A poll on its way; `countdown` is the replica's deadline counted from the send.
    Poll {
        /// From.
        replica: u8,
        /// To.
        dispatcher: u8,
        /// Ticks of the replica's fence left, counted from the send.
        countdown: u8,
    },
    /// The answer to a poll: the keys handed out (a bit each) with their delivery numbers.
    Answer {
        /// To.
        replica: u8,
        /// From.
        dispatcher: u8,
        /// Keys handed out.
        keys: u8,
        /// Delivery number per key (2 bits each).
        deliveries: u8,
        /// The poll's countdown, frozen while the dispatcher held it.
        countdown: u8,
    },
    /// A report that the replica's session on `about` ended, to `dispatcher`.
    Report {
        /// From.
        replica: u8,
        /// To.
        dispatcher: u8,
        /// The session ([`Protocol::sid`]).
        session: u8,
    },
    /// CloseSession.
    Close {
        /// From.
        replica: u8,
        /// To.
        dispatcher: u8,
    },
    /// An ack of one delivery.
    Ack {
        /// From.
        replica: u8,
        /// To.
        dispatcher: u8,
        /// The key.
        key: u8,
        /// Which delivery.
        delivery: u8,
    },
}

impl Message {
    fn between(&self) -> (u8, u8) {
        match *self {
            Self::Poll {
                replica,
                dispatcher,
                ..
            }
            | Self::Answer {
                replica,
                dispatcher,
                ..
            }
            | Self::Ack {
                replica,
                dispatcher,
                ..
            }
            | Self::Report {
                replica,
                dispatcher,
                ..
            }
            | Self::Close {
                replica,
                dispatcher,
            } => (replica, dispatcher),
        }
    }
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// Dispatchers.
    pub dispatchers: Vec<Dispatcher>,
    /// Their Leases.
    pub leases: Vec<Lease>,
    /// Replicas.
    pub replicas: Vec<Replica>,
    /// Messages in flight, sorted.
    pub messages: Vec<Message>,
    /// Keys changed since their last reconcile began (a bit each).
    pub pending: u8,
    /// Keys whose object exists (a bit each).
    pub objects: u8,
    /// Faults left.
    pub left: Budget,
    /// What has happened, for the reachability properties: a bit per event kind.
    pub seen: u8,
}

/// Events the reachability properties look for.
#[derive(Clone, Copy, Debug)]
enum Seen {
    Reconciled = 1,
    HandoverAfterCrash = 2,
    Fenced = 4,
    Crashed = 8,
    LeaseDeleted = 16,
    HandoverAfterDeletion = 32,
    ReleaseWaitsForAnotherGroup = 64,
    TakeoverByReports = 128,
}

/// A step of the system or its environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time passes by one tick; every dispatcher that reaches the API server observes the
    /// Leases and renews its own (renewals come many times a lease duration, and the watch
    /// shows changes at once; what matters is when they stop).
    Tick,
    /// Time passes by one tick, except on replica `r`'s clock.
    Lag(u8),
    /// Time passes by one tick, and the answer to dispatcher `d`'s Lease renewal is lost.
    TickRenewalUnanswered(u8),
    /// Dispatcher `d` loses the API server.
    CutApi(u8),
    /// Dispatcher `d` reaches the API server again (and re-lists).
    HealApi(u8),
    /// Dispatcher `d` is killed.
    Crash(u8),
    /// Dispatcher `d` starts again, and renews its Lease before its Lease watch lists.
    Restart(u8),
    /// Dispatcher `d` stops gracefully: it has nothing in flight, and deletes its Lease.
    Stop(u8),
    /// Dispatcher `d`, listing, has seen only the Leases in the mask (its own among them).
    Glimpse(u8, u8),
    /// Replica `r` is killed.
    CrashReplica(u8),
    /// Replica `r` starts again.
    RestartReplica(u8),
    /// Replica `r` opens a session on dispatcher `d`.
    Open(u8, u8),
    /// Replica `r` sends a poll to dispatcher `d`.
    Poll(u8, u8),
    /// The poll of replica `r` reaches dispatcher `d`, which holds it.
    Arrive(u8, u8),
    /// Dispatcher `d` answers the held poll of replica `r`, handing out the keys in the mask.
    Answer(u8, u8, u8),
    /// The answer reaches replica `r`.
    Receive(u8, u8),
    /// Replica `r` finishes its reconcile of key `k`.
    Finish(u8, u8),
    /// An ack from replica `r` of key `k` reaches dispatcher `d`.
    AckArrives(u8, u8, u8),
    /// Message number `i` is lost.
    Lose(u8),
    /// Dispatcher `d` expires the session of replica `r`.
    Expire(u8, u8),
    /// Dispatcher `d` voids the delivery of key `k`.
    Void(u8, u8),
    /// The object of key `k` changes, or is created again if it was deleted.
    Change(u8),
    /// The object of key `k` is deleted.
    Delete(u8),
    /// An object owned by the object of key `k` changes.
    OwnedChange(u8),
    /// Replica `r` counts its session on dispatcher `d` as lost and cancels what it handed out.
    Fence(u8, u8),
    /// Replica `r` cancels its reconcile of key `k` at its limit.
    Cancel(u8, u8),
    /// Dispatcher `d`'s Lease is deleted without the drained mark.
    DeleteLease(u8),
    /// Replica `r` closes its session on dispatcher `d` (CloseSession) while its reconciles
    /// from it may still run.
    Close(u8, u8),
    /// The CloseSession of replica `r` reaches dispatcher `d`.
    CloseArrives(u8, u8),
    /// Replica `r` fences its session on dispatcher `d` if it still holds it (cancelling what
    /// it handed out), and reports that session, or its last one there, ended to dispatcher
    /// `x`: as a live dispatcher asks it to of one that died.
    Report(u8, u8, u8),
    /// The report of replica `r` reaches dispatcher `x`.
    ReportArrives(u8, u8),
}

/// The model: a [`Config`] and the key ownership of every ring, computed with the real ring.
#[derive(Clone, Debug)]
pub struct Protocol {
    /// What it checks.
    pub config: Config,
    /// `owners[ring][entry]`: the owner of each queue entry's key on each ring (a bit mask
    /// of members).
    owners: Vec<Vec<Option<u8>>>,
    /// The request key of each object, as the wire spells it.
    keys: Vec<String>,
}

fn bit(i: impl Into<usize>) -> u8 {
    1u8 << i.into()
}

fn has(mask: u8, i: impl Into<usize>) -> bool {
    mask & bit(i) != 0
}

fn dispatcher_name(i: usize) -> String {
    format!("dispatcher-{i}")
}

impl Protocol {
    /// The model of `config`. Its keys are real request keys, chosen so that on the full ring
    /// key `k` is owned by dispatcher `k` (modulo the dispatchers), and placed on every ring by
    /// the real consistent-hash ring (`kube_dispatch_proto::Ring`).
    pub fn new(config: Config) -> Self {
        let n = config.dispatchers;
        let full = Ring::new((0..n).map(dispatcher_name));
        let keys: Vec<RequestKey> = (0..config.keys)
            .map(|k| {
                let want = dispatcher_name(k % n);
                (0u32..)
                    .map(|i| RequestKey::new("", "ConfigMap", "model", format!("cm-{i}")))
                    .find(|key| full.owner(key) == Some(want.as_str()))
                    .unwrap_or_else(|| RequestKey::new("", "ConfigMap", "model", "cm"))
            })
            .collect();
        let owners = (0..1usize << n)
            .map(|mask| {
                let ring = Ring::new((0..n).filter(|d| mask & (1 << d) != 0).map(dispatcher_name));
                // Every group queues every key: an entry per group and key, group-major.
                (0..config.groups)
                    .flat_map(|_| &keys)
                    .map(|key| {
                        let owner = ring.owner(key)?;
                        (0..n)
                            .find(|d| dispatcher_name(*d) == owner)
                            .and_then(|d| u8::try_from(d).ok())
                    })
                    .collect()
            })
            .collect();
        let keys = keys.iter().map(ToString::to_string).collect();
        Self {
            config,
            owners,
            keys,
        }
    }

    fn owner(&self, ring: u8, key: usize) -> Option<u8> {
        self.owners[usize::from(ring)][key]
    }

    /// Queue entries per dispatcher: one per group and key, group-major. In the model's
    /// dispatchers, replicas and properties a "key" is such an entry; the actions that change
    /// objects ([`Action::Change`], [`Action::Delete`], [`Action::OwnedChange`]) name the
    /// object, and reach every group's entry of it.
    pub fn entries(&self) -> usize {
        self.config.keys * self.config.groups
    }

    /// The object of queue entry `e`.
    pub fn object(&self, e: usize) -> usize {
        e % self.config.keys
    }

    /// The group of queue entry `e`.
    pub fn group(&self, e: usize) -> usize {
        e / self.config.keys
    }

    /// The group replica `r` belongs to.
    pub fn group_of(&self, r: usize) -> usize {
        r % self.config.groups
    }

    /// The entries of object `k`, one per group (a bit each).
    fn entries_of(&self, k: usize) -> u8 {
        (0..self.config.groups).fold(0, |m, g| m | bit(g * self.config.keys + k))
    }

    /// The bit of replica `r`'s session on dispatcher `d` with generation `generation` (0 or
    /// 1), in a Lease's lists of sessions: the model's session ids.
    pub fn sid(&self, r: usize, d: usize, generation: u8) -> u32 {
        1u32 << ((r * self.config.dispatchers + d) * 2 + usize::from(generation & 1))
    }

    /// The sessions `d` lists on its Lease: each it holds, and each that keys in flight were
    /// handed to (a replaced session's keys stay held until it would have expired).
    fn listing(&self, disp: &Dispatcher, d: usize) -> u32 {
        let held = disp
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .fold(0, |m, (r, _)| {
                m | self.sid(r, d, u8::from(has(disp.generations, r)))
            });
        disp.keys.iter().fold(held, |m, key| match *key {
            Key::InFlight {
                replica, session, ..
            } => m | self.sid(usize::from(replica), d, session),
            _ => m,
        })
    }

    /// The entries replica `r`'s group may take (a bit each).
    fn takeable(&self, r: usize) -> u8 {
        self.of_group(self.group_of(r))
    }

    /// The entries of group `g` (a bit each).
    pub(crate) fn of_group(&self, g: usize) -> u8 {
        (0..self.config.keys).fold(0, |m, k| m | bit(g * self.config.keys + k))
    }

    /// Every group (a bit each).
    fn all_groups(&self) -> u8 {
        u8::try_from((1usize << self.config.groups) - 1).unwrap_or(u8::MAX)
    }

    /// The entries of the groups that exist at `disp` (a bit each).
    fn present(&self, disp: &Dispatcher) -> u8 {
        (0..self.config.groups)
            .filter(|g| has(disp.groups, *g))
            .fold(0, |m, g| m | self.of_group(g))
    }

    /// What each dispatcher remembers of deletions of keys it does not own (a bit per queue
    /// entry), if it is up: what its peers answer when asked.
    fn remembered(state: &State) -> Vec<Option<u8>> {
        state
            .dispatchers
            .iter()
            .map(|x| x.up.then_some(x.recent))
            .collect()
    }

    /// Group `g` at `d` asks its live peers for the deletions they remember of keys `d` owns
    /// (`peer::fetch_recent_deletions`): `peers` is what each peer remembers, if up.
    fn ask_peers(&self, disp: &mut Dispatcher, d: usize, g: usize, peers: &[Option<u8>]) {
        disp.asked |= bit(g);
        let ring = disp.ring;
        let remembered = peers
            .iter()
            .enumerate()
            .filter(|(p, _)| *p != d && has(ring, *p))
            .fold(0u8, |m, (_, recent)| m | recent.unwrap_or(0))
            & self.of_group(g);
        for k in 0..disp.keys.len() {
            if has(remembered, k) && self.owns(ring, k, d) {
                self.deleted(disp, d, k, false);
            }
        }
    }

    fn owns(&self, ring: u8, key: usize, d: usize) -> bool {
        self.owner(ring, key).map(usize::from) == Some(d)
    }

    /// Whether dispatcher `d` serves `key`: it owns it on its ring and on its settled ring.
    fn serves(&self, disp: &Dispatcher, d: usize, key: usize) -> bool {
        disp.settled
            .is_some_and(|settled| self.owns(disp.ring, key, d) && self.owns(settled, key, d))
    }

    fn all(&self) -> u8 {
        u8::try_from((1usize << self.config.dispatchers) - 1).unwrap_or(u8::MAX)
    }

    fn fresh_dispatcher(&self, up: bool) -> Dispatcher {
        let (n, k, r) = (
            self.config.dispatchers,
            self.entries(),
            self.config.replicas,
        );
        Dispatcher {
            up,
            api: true,
            listing: up,
            own_lease: 0,
            ring: 0,
            settled: None,
            fresh: 0,
            written: 0,
            died: vec![0; n],
            view: vec![0; n],
            missed: 0,
            deaths: 0,
            hold: 0,
            stale: 0,
            gone: 0,
            tomb: 0,
            nameless: 0,
            objectless: 0,
            held_deletions: 0,
            recent: 0,
            groups: if self.config.lazy_groups {
                0
            } else {
                self.all_groups()
            },
            asked: 0,
            keys: vec![Key::Absent; k],
            sessions: vec![None; r],
            held: vec![None; r],
            closed: vec![false; r],
            next_delivery: vec![0; k],
            generations: 0,
            listed: 0,
            awaiting: vec![None; n],
            reported: 0,
        }
    }

    /// The ring `d` has released: its ring, once no key that moved away is queued or in flight,
    /// and while it waits out no member that died (`Handover::waits_on_dead`).
    fn release(&self, disp: &Dispatcher, d: usize) -> Option<u8> {
        if self.config.withhold && disp.died.iter().any(|w| *w > 0) {
            return None;
        }
        self.queue_release(disp, d)
    }

    /// The ring `d`'s queue lets it release: its ring, once no key that moved away is queued
    /// or in flight.
    fn queue_release(&self, disp: &Dispatcher, d: usize) -> Option<u8> {
        let moving = self.moving(disp, d) != 0;
        (has(disp.ring, d) && !moving).then_some(disp.ring)
    }

    /// Whether `d`, on its ring, releases it not yet only because a group after the first still
    /// delivers a key that moved away, the first group having handed over: the case a release
    /// that asked the first group alone would get wrong.
    pub(crate) fn waits_for_a_later_group(&self, disp: &Dispatcher, d: usize) -> bool {
        let moving = self.moving(disp, d);
        disp.up && has(disp.ring, d) && moving != 0 && !has(moving, 0usize)
    }

    /// The groups (a bit each) whose queue at `d` still holds a key that moved away, queued or
    /// in flight.
    pub(crate) fn moving(&self, disp: &Dispatcher, d: usize) -> u8 {
        disp.keys
            .iter()
            .enumerate()
            .filter(|(k, key)| {
                let leaving = matches!(
                    key,
                    Key::Ready { leaving: true } | Key::InFlight { leaving: true, .. }
                );
                leaving && !self.owns(disp.ring, *k, d)
            })
            .fold(0, |m, (k, _)| m | bit(self.group(k)))
    }

    /// Trims `d`'s queue to what it serves now (`Transit::trim`): while it serves, the keys
    /// it does not serve moved; while it hands out nothing but is on its ring, the keys it does
    /// not own. A moved key in flight (or queued, when it served until now) stays until it
    /// settles and is then forgotten; any other moved key is forgotten at once; a key that did
    /// not move is no longer on its way out. Off its own ring it keeps its index as it is.
    fn trim_to_slice(&self, disp: &mut Dispatcher, d: usize, was_serving: bool) {
        if disp.settled.is_some() || has(disp.ring, d) {
            let drain = disp.settled.is_some() && was_serving;
            for k in 0..disp.keys.len() {
                let moved = if disp.settled.is_some() {
                    !self.serves(disp, d, k)
                } else {
                    !self.owns(disp.ring, k, d)
                };
                let key = &mut disp.keys[k];
                *key = match *key {
                    _ if !moved => key.leaving(false),
                    Key::InFlight { .. } => key.leaving(true),
                    Key::Ready { .. } if drain => key.leaving(true),
                    _ => Key::Absent,
                };
            }
        }
        // The transit's deletions: held ones of keys that moved away again are remembered as
        // owned elsewhere; remembered ones of keys that moved here are held; held ones of keys
        // now served are queued.
        let owned = (0..disp.keys.len())
            .filter(|k| self.owns(disp.ring, *k, d))
            .fold(0u8, |m, k| m | bit(k));
        let away = disp.held_deletions & !owned;
        disp.held_deletions &= !away;
        disp.recent |= away;
        let moved_in = disp.recent & owned;
        disp.recent &= !moved_in;
        disp.held_deletions |= moved_in;
        for k in 0..disp.keys.len() {
            if has(disp.held_deletions, k) && self.serves(disp, d, k) {
                disp.held_deletions &= !bit(k);
                Self::queue_deletion(disp, k, false);
            }
        }
    }

    /// Forgets the keys that moved away and wait ready for a group with no session here to take
    /// them (its replicas gone, closed, or expired), remembering their deletions for the new
    /// owner (`GroupQueue::abandon_leaving_ready`, from `Transit::trim`): held for a session
    /// that may not come, they would hold the release back for every group.
    fn abandon(&self, disp: &mut Dispatcher) {
        for k in 0..disp.keys.len() {
            if disp.keys[k] != (Key::Ready { leaving: true }) {
                continue;
            }
            let g = self.group(k);
            let taken = (0..disp.sessions.len())
                .any(|r| self.group_of(r) == g && disp.sessions[r].is_some() && !disp.closed[r]);
            if taken {
                continue;
            }
            if has(disp.gone, k) {
                disp.recent |= bit(k);
            }
            disp.keys[k] = Key::Absent;
        }
    }

    /// Queues a change of `key` at `d` (`GroupQueue::change`).
    fn queue(key: &mut Key) {
        *key = match *key {
            Key::Absent | Key::Idle => Key::Ready { leaving: false },
            Key::InFlight {
                replica,
                deadline,
                delivery,
                session,
                leaving,
                ..
            } => Key::InFlight {
                replica,
                deadline,
                delivery,
                session,
                dirty: true,
                leaving,
            },
            ready => ready,
        };
    }

    /// Whether `d` records a change of `key` in its queue (`GroupEvent::Exists`): it serves the
    /// key; or, while it hands out nothing, it knows the key or owns it on its ring
    /// (`Transit::keeps`); or the key moved away and is still here, queued or in flight
    /// (`GroupQueue::is_leaving`).
    fn records(&self, disp: &Dispatcher, d: usize, key: usize) -> bool {
        let leaving = matches!(
            disp.keys[key],
            Key::Ready { leaving: true } | Key::InFlight { leaving: true, .. }
        );
        let keeps = disp.settled.is_none()
            && (disp.keys[key] != Key::Absent || self.owns(disp.ring, key, d));
        self.serves(disp, d, key) || keeps || leaving
    }

    /// The list beside the watch when the keys `d` serves may have grown (`GroupEvent::Listed`):
    /// every served key it does not know is queued; keys it knows it has kept up with.
    fn fill(&self, disp: &mut Dispatcher, d: usize, objects: u8) {
        let present = self.present(disp);
        for k in (0..disp.keys.len()).filter(|k| has(present, *k)) {
            let unknown = disp.keys[k] == Key::Absent || has(disp.objectless, k);
            if self.serves(disp, d, k) && has(objects, self.object(k)) && unknown {
                disp.objectless &= !bit(k);
                disp.nameless &= !bit(k);
                Self::queue(&mut disp.keys[k]);
            }
        }
    }

    /// `d`'s watch shows the object of `key`, `created` again after a deletion or changed
    /// (`Transit::record` of `GroupEvent::Exists` and `ExistsElsewhere`): a deletion held or
    /// remembered for it is forgotten unless the key is served; the queue records it if it
    /// records the key ([`Protocol::records`]), a deletion of the earlier object not yet
    /// delivered going first.
    fn exists(&self, disp: &mut Dispatcher, d: usize, key: usize, created: bool) {
        if !self.serves(disp, d, key) {
            if self.owns(disp.ring, key, d) {
                disp.held_deletions &= !bit(key);
            }
            disp.recent &= !bit(key);
        }
        if !self.records(disp, d, key) {
            return;
        }
        if created && has(disp.gone, key) {
            let pending = match disp.keys[key] {
                Key::Ready { .. } => true,
                Key::InFlight { dirty, .. } => dirty,
                _ => false,
            };
            if pending && !has(disp.nameless, key) {
                disp.tomb |= bit(key);
            }
            disp.gone &= !bit(key);
        }
        disp.nameless &= !bit(key);
        disp.objectless &= !bit(key);
        Self::queue(&mut disp.keys[key]);
    }

    /// Queues the deletion of `key` at `d` (`GroupQueue::change` of a deletion).
    /// `named`: the deletion carries the object's uid (seen on the watch); otherwise it is
    /// known by its key alone.
    fn queue_deletion(disp: &mut Dispatcher, key: usize, named: bool) {
        if named {
            disp.nameless &= !bit(key);
        } else if disp.keys[key] == Key::Absent {
            disp.nameless |= bit(key);
        }
        Self::queue(&mut disp.keys[key]);
        disp.gone |= bit(key);
        disp.objectless &= !bit(key);
    }

    /// A deletion `d`'s watch shows (`Transit::record` of `GroupEvent::Deleted`): queued if it serves
    /// the key; held for the end of a handover if it owns it on its ring; remembered if it is
    /// owned elsewhere (and queued too if the key is on its way out).
    fn deleted(&self, disp: &mut Dispatcher, d: usize, key: usize, named: bool) {
        if self.serves(disp, d, key) {
            Self::queue_deletion(disp, key, named);
            return;
        }
        if self.owns(disp.ring, key, d) {
            disp.held_deletions |= bit(key);
        } else {
            disp.recent |= bit(key);
        }
        // Still here on its way out: recorded too, so that if its object is created again,
        // the earlier object's deletion goes first.
        if matches!(
            disp.keys[key],
            Key::Ready { leaving: true } | Key::InFlight { leaving: true, .. }
        ) {
            Self::queue_deletion(disp, key, named);
        }
    }

    /// The re-list of `d`'s watch once it reaches the API server again (`GroupEvent::Exists` of
    /// each object): every key it records that it did not know, or whose change it missed, is
    /// queued.
    fn relist(&self, disp: &mut Dispatcher, d: usize, objects: u8) {
        let present = self.present(disp);
        for k in (0..disp.keys.len()).filter(|k| has(present, *k)) {
            if !has(objects, self.object(k)) {
                // The sweep at the end of the list: a key known here, live as far as it knows,
                // whose object the list did not show was deleted meanwhile (`GroupQueue::sweep`).
                if disp.keys[k] != Key::Absent && !has(disp.gone, k) {
                    Self::queue_deletion(disp, k, false);
                }
            } else if disp.keys[k] == Key::Absent || has(disp.stale, k) {
                // Its version here is older: shown as a change (as created again, if the queue
                // recorded its deletion).
                self.exists(disp, d, k, true);
            }
        }
        disp.stale = 0;
    }

    /// Puts a key back after its delivery ended without an ack (session gone, void).
    fn requeue(key: &mut Key) {
        if let Key::InFlight { leaving, .. } = *key {
            *key = if leaving {
                Key::Absent
            } else {
                Key::Ready { leaving: false }
            };
        }
    }

    /// Replica `r`'s deadlines that have run out: it must act on them before time passes.
    fn urgent(state: &State) -> bool {
        state.replicas.iter().any(|rep| {
            rep.up
                && (rep.sessions.iter().flatten().any(|s| s.fence == 0)
                    || rep.running.iter().flatten().any(|run| run.deadline == 0))
        })
    }

    /// A tick: every countdown runs down (but replica `lagging`'s), then every dispatcher that
    /// reaches the API server observes the Leases and renews its own (the answer to
    /// `unanswered`'s renewal is lost).
    fn tick(&self, state: &mut State, lagging: Option<usize>, unanswered: Option<usize>) {
        for (r, rep) in state.replicas.iter_mut().enumerate() {
            if !rep.up || lagging == Some(r) {
                continue;
            }
            for s in rep.sessions.iter_mut().flatten() {
                s.fence = s.fence.saturating_sub(1);
            }
            for run in rep.running.iter_mut().flatten() {
                run.deadline = run.deadline.saturating_sub(1);
            }
        }
        for m in &mut state.messages {
            match m {
                Message::Poll {
                    replica, countdown, ..
                }
                | Message::Answer {
                    replica, countdown, ..
                } if lagging != Some(usize::from(*replica)) => {
                    *countdown = countdown.saturating_sub(1);
                }
                _ => {}
            }
        }
        state.messages.sort_unstable();
        for (d, disp) in state.dispatchers.iter_mut().enumerate() {
            if !disp.up {
                continue;
            }
            for s in disp.sessions.iter_mut().flatten() {
                *s = s.saturating_sub(1);
            }
            for key in &mut disp.keys {
                if let Key::InFlight { deadline, .. } = key {
                    *deadline = deadline.saturating_sub(1);
                }
            }
            for w in disp.died.iter_mut().chain(&mut disp.view) {
                *w = w.saturating_sub(1);
            }
            for (w, awaiting) in disp.died.iter().zip(&mut disp.awaiting) {
                if *w == 0 {
                    *awaiting = None;
                }
            }
            disp.hold = disp.hold.saturating_sub(1);
            if disp.own_lease == 1 {
                // Its Lease ran out unrenewed: it fences itself and hands out nothing.
                disp.own_lease = 0;
                let was = disp.settled.take().is_some();
                self.trim_to_slice(disp, d, was);
            } else {
                disp.own_lease = disp.own_lease.saturating_sub(1);
            }
        }
        for d in 0..state.dispatchers.len() {
            if state.dispatchers[d].up && state.dispatchers[d].api {
                self.observe(state, d);
                self.renew(state, d, unanswered != Some(d));
            }
        }
    }

    /// The members whose Lease is live as `disp` saw them.
    fn live(disp: &Dispatcher) -> u8 {
        disp.view
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0)
            .fold(0u8, |m, (i, _)| m | bit(i))
    }

    /// Every dispatcher whose Lease watch runs sees Lease `x` written (`written`) or deleted;
    /// one cut off will re-list it when it is back.
    fn show_lease(&self, state: &mut State, x: usize, written: bool) {
        let t = self.config.timing;
        for disp in &mut state.dispatchers {
            if !disp.up {
                continue;
            }
            if disp.api {
                disp.view[x] = if written { t.lease + t.grace } else { 0 };
            } else {
                disp.missed |= bit(x);
            }
        }
    }

    /// `disp` finds member `x` dead, with the sessions its Lease listed if known: waited out for
    /// the bound, or until each is reported ended; if already waited out (an earlier process of
    /// it died too), for both (`Handover::died_with`).
    fn mourn(disp: &mut Dispatcher, x: usize, bound: u8, listed: Option<u32>) {
        let before = (disp.died[x] > 0).then_some(disp.awaiting[x]);
        disp.died[x] = bound;
        disp.awaiting[x] = match before {
            None => listed,
            Some(earlier) => earlier.zip(listed).map(|(a, b)| a | b),
        };
    }

    /// `d` observes every Lease: a whole and current view.
    fn observe(&self, state: &mut State, d: usize) {
        let live = Self::live(&state.dispatchers[d]);
        if has(live, d) {
            state.dispatchers[d].listing = false;
        }
        self.judge(state, d, live);
    }

    /// `d` judges membership on a view of the Leases in which the members `live` are live
    /// (`membership::run` and `Handover::update`).
    fn judge(&self, state: &mut State, d: usize, live: u8) {
        let t = self.config.timing;
        let leases = state.leases.clone();
        let objects = state.objects;
        let peers = Self::remembered(state);
        let disp = &mut state.dispatchers[d];
        let (ring_before, settled_before) = (disp.ring, disp.settled);
        let mut by_reports = false;
        if disp.own_lease == 0 {
            // Fenced: releases seen so far may predate what the others did meanwhile.
            disp.fresh = 0;
            disp.written = 0;
        }
        // A death seen of a member live again (a new process of it): its old one's reconciles
        // are waited out. One still gone is counted as it leaves the ring, or was already.
        for x in 0..leases.len() {
            if has(disp.deaths, x) && has(live, x) {
                Self::mourn(disp, x, t.bound, None);
            }
        }
        disp.deaths = 0;
        if live != disp.ring {
            let gone = disp.ring & !live;
            for (x, lease) in leases.iter().enumerate() {
                // Only a Lease deleted with the drained mark was released: its holder left
                // nothing in flight. Expired, or deleted without the mark, its holder died.
                let died = match self.config.deletions {
                    Deletions::Died => !lease.drained,
                    Deletions::Released => lease.exists,
                };
                if has(gone, x) && died {
                    // Deleted, or written by a process that waits out its previous one, its
                    // Lease lists nothing to go by.
                    let listed = (lease.exists && lease.known).then_some(lease.sessions);
                    Self::mourn(disp, x, t.bound, listed);
                }
            }
            disp.ring = live;
            disp.fresh = 0;
            disp.written = 0;
            let was = disp.settled.is_some();
            if !has(live, d) {
                // Off its own ring at once (one slice, as `Handover::update` publishes it).
                disp.settled = None;
            }
            self.trim_to_slice(disp, d, was);
        }
        if !has(disp.ring, d) {
            // Off its own ring (its Lease gone from the view): it hands out nothing, and
            // releases seen so far may predate what the others did meanwhile.
            disp.fresh = 0;
            disp.written = 0;
            let was = disp.settled.take().is_some();
            self.trim_to_slice(disp, d, was);
        }
        // A member that died is waited out no longer once every session its Lease listed is
        // reported ended on a Lease.
        if self.config.takeover.reports() {
            let ended = leases.iter().fold(0u32, |m, l| m | l.ended);
            for x in 0..leases.len() {
                if disp.died[x] > 0
                    && let Some(listed) = disp.awaiting[x]
                    && listed & !ended == 0
                {
                    disp.died[x] = 0;
                    disp.awaiting[x] = None;
                    by_reports |= listed != 0;
                }
            }
        }
        // As the gate reads the Leases now: a release a member has since withdrawn (a new
        // process of it writes none yet) counts no more.
        disp.fresh = 0;
        for (p, lease) in leases.iter().enumerate() {
            if p != d
                && has(disp.ring, p)
                && has(disp.written, p)
                && lease.released == Some(disp.ring)
            {
                disp.fresh |= bit(p);
            }
        }
        let others = disp.ring & !bit(d);
        let open = disp.own_lease > 0
            && has(disp.ring, d)
            && disp.hold == 0
            && disp.died.iter().all(|w| *w == 0)
            && disp.settled != Some(disp.ring)
            && disp.fresh & others == others;
        if open {
            let was = disp.settled.is_some();
            disp.settled = Some(disp.ring);
            self.trim_to_slice(disp, d, was);
        }
        // Each group's transit trims its queue as the slice is published (`Transit::trim`).
        self.abandon(disp);
        // A list beside its watch shows it the served keys it does not know when the keys it
        // serves may have grown (`Slice::may_serve_more_than`): it serves what it owns on its
        // ring and its settled ring together, so only when it starts serving or a member drops
        // out of both. The old dispatcher listed only when its settled ring changed.
        let grows = match (settled_before, disp.settled) {
            (_, None) => false,
            (Some(before), Some(now)) if has(ring_before, d) => {
                if self.config.relist_returning {
                    (ring_before | before) & !(disp.ring | now) != 0
                } else {
                    before != now
                }
            }
            (_, Some(_)) => has(disp.ring, d),
        };
        if grows {
            self.fill(disp, d, objects);
        }
        if open {
            // Each group there that has not yet asks its live peers for the deletions they
            // remember of keys it owns.
            for g in 0..self.config.groups {
                if has(disp.groups, g) && !has(disp.asked, g) {
                    self.ask_peers(disp, d, g, &peers);
                }
            }
            if state.seen & Seen::Crashed as u8 != 0 {
                state.seen |= Seen::HandoverAfterCrash as u8;
            }
            if state.seen & Seen::LeaseDeleted as u8 != 0 {
                state.seen |= Seen::HandoverAfterDeletion as u8;
            }
        }
        if by_reports {
            state.seen |= Seen::TakeoverByReports as u8;
        }
    }

    fn renew(&self, state: &mut State, d: usize, answered: bool) {
        let t = self.config.timing;
        // Each group trimmed to the slice as its release is asked (`GroupTable::release_ring`).
        self.abandon(&mut state.dispatchers[d]);
        let released = self.release(&state.dispatchers[d], d);
        if self.waits_for_a_later_group(&state.dispatchers[d], d) {
            state.seen |= Seen::ReleaseWaitsForAnotherGroup as u8;
        }
        let disp = &state.dispatchers[d];
        state.leases[d] = Lease {
            released,
            exists: true,
            drained: false,
            sessions: self.listing(disp, d),
            known: disp.hold == 0,
            ended: disp.reported,
        };
        if answered {
            let disp = &mut state.dispatchers[d];
            disp.own_lease = t.lease;
            // Its sessions are listed: it may hand them keys.
            disp.listed = disp
                .sessions
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_some())
                .fold(0, |m, (r, _)| m | bit(r));
        }
        for (o, disp) in state.dispatchers.iter_mut().enumerate() {
            if o != d {
                disp.written |= bit(d);
            }
        }
        self.show_lease(state, d, true);
    }

    /// Whether no two replicas run a reconcile of one key (of one group) at once.
    pub fn exclusive(&self, state: &State) -> bool {
        (0..self.entries()).all(|k| {
            state
                .replicas
                .iter()
                .filter(|r| r.up && r.running[k].is_some())
                .count()
                <= 1
        })
    }

    /// Whether a fair schedule with no more faults brings every changed key to a reconcile.
    pub fn settles(&self, state: &State) -> bool {
        let t = self.config.timing;
        let rounds = 4 * (usize::from(t.lease + t.grace + t.bound + t.ttl + t.max_reconcile));
        let mut s = state.clone();
        s.left = Budget::NONE;
        for _ in 0..rounds {
            if s.pending == 0 {
                return true;
            }
            // The system's own steps (no faults), each at most once a round so that no
            // replica polling and being answered over and over starves the others (the model
            // answers an empty poll at once, where the dispatcher holds it), until none is
            // left; then Lease work and a tick.
            let mut taken = Vec::new();
            for _ in 0..64 {
                let mut actions = Vec::new();
                self.actions(&s, &mut actions);
                let next = actions
                    .into_iter()
                    .filter(|a| self.fair(&s, a) && !taken.contains(a))
                    .find_map(|a| Some((a, self.next_state(&s, a)?)));
                match next {
                    Some((action, next)) => {
                        taken.push(action);
                        s = next;
                    }
                    None => break,
                }
            }
            if let Some(next) = self.next_state(&s, Action::Tick) {
                s = next;
            }
        }
        s.pending == 0
    }
}

/// Sends an ack. An older ack of the same key between the same pair, still on its way, would
/// settle nothing the newer one does not (the dispatcher matches deliveries): it is dropped,
/// which bounds the network to one ack per key and pair.
fn send_ack(messages: &mut Vec<Message>, r: u8, d: u8, k: u8, delivery: u8) {
    messages.retain(|m| {
        !matches!(*m, Message::Ack { replica, dispatcher, key, .. } if (replica, dispatcher, key) == (r, d, k))
    });
    messages.push(Message::Ack {
        replica: r,
        dispatcher: d,
        key: k,
        delivery,
    });
}

impl Protocol {
    /// Whether the fair schedule of [`Protocol::settles`] takes `action` in `state`: every step
    /// of the system and every recovery, no fault, and an answer hands out all that is ready.
    fn fair(&self, state: &State, action: &Action) -> bool {
        match *action {
            // A dispatcher scaled down (stopped with its Lease drained) stays down while
            // another runs: the others must serve its keys.
            Action::Restart(d) => {
                let lease = state.leases[usize::from(d)];
                !(lease.drained && !lease.exists && state.dispatchers.iter().any(|x| x.up))
            }
            Action::HealApi(_)
            | Action::RestartReplica(_)
            | Action::Open(..)
            | Action::Poll(..)
            | Action::Arrive(..)
            | Action::Receive(..)
            | Action::Finish(..)
            | Action::AckArrives(..)
            | Action::Expire(..)
            | Action::Void(..)
            | Action::Fence(..)
            | Action::Cancel(..)
            | Action::CloseArrives(..)
            | Action::ReportArrives(..) => true,
            Action::Answer(r, d, keys) => {
                let disp = &state.dispatchers[usize::from(d)];
                let ready = disp
                    .keys
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| matches!(k, Key::Ready { .. }))
                    .fold(0u8, |m, (i, _)| m | bit(i));
                disp.settled.is_none() || keys == ready & self.takeable(usize::from(r))
            }
            _ => false,
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let t = self.config.timing;
        let all = self.all();
        let dispatchers = (0..self.config.dispatchers)
            .map(|d| {
                let mut disp = self.fresh_dispatcher(true);
                // Settled: its Lease watch has listed.
                disp.listing = false;
                disp.view = vec![t.lease + t.grace; self.config.dispatchers];
                disp.own_lease = t.lease;
                disp.ring = all;
                disp.settled = Some(all);
                disp.fresh = all & !bit(d);
                disp.groups = self.all_groups();
                disp.asked = self.all_groups();
                // Every object has just been created: its key is ready at its owner, in every
                // group's queue.
                for k in 0..self.entries() {
                    if self.owns(all, k, d) {
                        disp.keys[k] = Key::Ready { leaving: false };
                    }
                }
                disp
            })
            .collect();
        vec![State {
            dispatchers,
            leases: vec![
                Lease {
                    released: Some(all),
                    exists: true,
                    drained: false,
                    sessions: 0,
                    known: true,
                    ended: 0,
                };
                self.config.dispatchers
            ],
            replicas: vec![
                Replica {
                    up: true,
                    sessions: vec![None; self.config.dispatchers],
                    running: vec![None; self.entries()],
                    generations: 0,
                };
                self.config.replicas
            ],
            messages: Vec::new(),
            pending: u8::try_from((1usize << self.entries()) - 1).unwrap_or(u8::MAX),
            objects: u8::try_from((1usize << self.config.keys) - 1).unwrap_or(u8::MAX),
            left: self.config.budget,
            seen: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let n = |x: usize| u8::try_from(x).unwrap_or_default();
        let urgent = Self::urgent(state);
        if !urgent {
            actions.push(Action::Tick);
            if state.left.drift > 0 {
                for r in 0..state.replicas.len() {
                    if state.replicas[r].up {
                        actions.push(Action::Lag(n(r)));
                    }
                }
            }
        }
        for (d, disp) in state.dispatchers.iter().enumerate() {
            let d8 = n(d);
            if disp.up {
                if disp.api {
                    if state.left.lost_renewal_answers > 0 && !urgent {
                        actions.push(Action::TickRenewalUnanswered(d8));
                    }
                    if state.left.api_cuts > 0 {
                        actions.push(Action::CutApi(d8));
                    }
                } else {
                    actions.push(Action::HealApi(d8));
                }
                if state.left.dispatcher_crashes > 0 {
                    actions.push(Action::Crash(d8));
                }
                if state.left.graceful_stops > 0
                    && !disp.keys.iter().any(|k| matches!(k, Key::InFlight { .. }))
                {
                    actions.push(Action::Stop(d8));
                }
                if self.config.views == Views::Partial && disp.listing && disp.api {
                    // Every part of the live Leases that shows its own.
                    let live = Self::live(disp);
                    if has(live, d) {
                        let mut part = live;
                        loop {
                            if has(part, d) && part != live {
                                actions.push(Action::Glimpse(d8, part));
                            }
                            if part == 0 {
                                break;
                            }
                            part = (part - 1) & live;
                        }
                    }
                }
                for (r, s) in disp.sessions.iter().enumerate() {
                    if *s == Some(0) {
                        actions.push(Action::Expire(d8, n(r)));
                    }
                    if disp.held[r].is_some() {
                        let ready = disp
                            .keys
                            .iter()
                            .enumerate()
                            .filter(|(_, k)| matches!(k, Key::Ready { .. }))
                            .fold(0u8, |m, (i, _)| m | bit(i));
                        let can_take = if disp.settled.is_some() {
                            ready & self.takeable(r)
                        } else {
                            0
                        };
                        // Every subset of the ready keys.
                        let mut sub = can_take;
                        loop {
                            actions.push(Action::Answer(n(r), d8, sub));
                            if sub == 0 {
                                break;
                            }
                            sub = (sub - 1) & can_take;
                        }
                    }
                }
                for (k, key) in disp.keys.iter().enumerate() {
                    if matches!(key, Key::InFlight { deadline: 0, .. }) {
                        actions.push(Action::Void(d8, n(k)));
                    }
                }
            } else {
                actions.push(Action::Restart(d8));
            }
        }
        for (r, rep) in state.replicas.iter().enumerate() {
            let r8 = n(r);
            if !rep.up {
                actions.push(Action::RestartReplica(r8));
                continue;
            }
            if state.left.replica_crashes > 0 {
                actions.push(Action::CrashReplica(r8));
            }
            for (d, s) in rep.sessions.iter().enumerate() {
                match s {
                    None => {
                        let clear = rep
                            .running
                            .iter()
                            .flatten()
                            .all(|run| usize::from(run.dispatcher) != d);
                        let disp = &state.dispatchers[d];
                        if clear && disp.up && !disp.closed[r] {
                            actions.push(Action::Open(r8, n(d)));
                        }
                    }
                    Some(s) if s.fence == 0 => actions.push(Action::Fence(r8, n(d))),
                    Some(s) => {
                        if !s.polling {
                            actions.push(Action::Poll(r8, n(d)));
                        }
                        if state.left.closes > 0 {
                            actions.push(Action::Close(r8, n(d)));
                        }
                    }
                }
            }
            if state.left.reports > 0 && self.config.takeover.reports() {
                // A replica reports the sessions of a dispatcher the live ones found dead:
                // modelled as of any dispatcher it ever had a session on, to any other that is up.
                for d in 0..state.dispatchers.len() {
                    for (x, disp) in state.dispatchers.iter().enumerate() {
                        if x != d && disp.up {
                            actions.push(Action::Report(r8, n(d), n(x)));
                        }
                    }
                }
            }
            for (k, run) in rep.running.iter().enumerate() {
                if let Some(run) = run {
                    actions.push(if run.deadline == 0 {
                        Action::Cancel(r8, n(k))
                    } else {
                        Action::Finish(r8, n(k))
                    });
                }
            }
        }
        for (i, m) in state.messages.iter().enumerate() {
            match *m {
                Message::Poll {
                    replica,
                    dispatcher,
                    ..
                } => actions.push(Action::Arrive(replica, dispatcher)),
                Message::Answer {
                    replica,
                    dispatcher,
                    ..
                } => actions.push(Action::Receive(replica, dispatcher)),
                Message::Ack {
                    replica,
                    dispatcher,
                    key,
                    ..
                } => actions.push(Action::AckArrives(replica, dispatcher, key)),
                Message::Close {
                    replica,
                    dispatcher,
                } => actions.push(Action::CloseArrives(replica, dispatcher)),
                Message::Report {
                    replica,
                    dispatcher,
                    ..
                } => actions.push(Action::ReportArrives(replica, dispatcher)),
            }
            if state.left.lost_messages > 0 {
                actions.push(Action::Lose(n(i)));
            }
        }
        if state.left.changes > 0 {
            for k in 0..self.config.keys {
                actions.push(Action::Change(n(k)));
            }
        }
        if state.left.owned_changes > 0 {
            for k in 0..self.config.keys {
                actions.push(Action::OwnedChange(n(k)));
            }
        }
        if state.left.deletions > 0 {
            for k in 0..self.config.keys {
                if has(state.objects, k) {
                    actions.push(Action::Delete(n(k)));
                }
            }
        }
        if state.left.lease_deletions > 0 {
            for (d, lease) in state.leases.iter().enumerate() {
                if lease.exists {
                    actions.push(Action::DeleteLease(n(d)));
                }
            }
        }
    }

    #[allow(clippy::too_many_lines)]
    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => self.step_tick(&mut s)?,
            Action::Lag(r) => self.step_lag(&mut s, r)?,
            Action::TickRenewalUnanswered(d) => self.step_tick_renewal_unanswered(&mut s, d)?,
            Action::CutApi(d) => self.step_cut_api(&mut s, d)?,
            Action::HealApi(d) => self.step_heal_api(&mut s, d)?,
            Action::Crash(d) => self.step_crash(&mut s, d)?,
            Action::Restart(d) => self.step_restart(&mut s, d)?,
            Action::Stop(d) => self.step_stop(&mut s, d)?,
            Action::Glimpse(d, part) => self.step_glimpse(&mut s, d, part)?,
            Action::CrashReplica(r) => self.step_crash_replica(&mut s, r)?,
            Action::RestartReplica(r) => self.step_restart_replica(&mut s, r)?,
            Action::Open(r, d) => self.step_open(&mut s, r, d)?,
            Action::Poll(r, d) => self.step_poll(&mut s, r, d)?,
            Action::Arrive(r, d) => self.step_arrive(&mut s, r, d)?,
            Action::Answer(r, d, take) => self.step_answer(&mut s, r, d, take)?,
            Action::Receive(r, d) => self.step_receive(&mut s, r, d)?,
            Action::Finish(r, k) => self.step_finish(&mut s, r, k)?,
            Action::AckArrives(r, d, k) => self.step_ack_arrives(&mut s, r, d, k)?,
            Action::Lose(i) => self.step_lose(&mut s, i)?,
            Action::Expire(d, r) => self.step_expire(&mut s, d, r)?,
            Action::Void(d, k) => self.step_void(&mut s, d, k)?,
            Action::Change(k) => self.step_change(&mut s, k)?,
            Action::OwnedChange(k) => self.step_owned_change(&mut s, k)?,
            Action::Delete(k) => self.step_delete(&mut s, k)?,
            Action::Fence(r, d) => self.step_fence(&mut s, r, d)?,
            Action::DeleteLease(d) => self.step_delete_lease(&mut s, d)?,
            Action::Close(r, d) => self.step_close(&mut s, r, d)?,
            Action::CloseArrives(r, d) => self.step_close_arrives(&mut s, r, d)?,
            Action::Report(r, d, x) => self.step_report(&mut s, r, d, x)?,
            Action::ReportArrives(r, x) => self.step_report_arrives(&mut s, r, x)?,
            Action::Cancel(r, k) => self.step_cancel(&mut s, r, k)?,
        }
        s.messages.sort_unstable();
        // What a queue records of a key it forgot goes with it.
        for disp in &mut s.dispatchers {
            let known = disp
                .keys
                .iter()
                .enumerate()
                .filter(|(_, k)| **k != Key::Absent)
                .fold(0u8, |m, (k, _)| m | bit(k));
            disp.gone &= known;
            disp.tomb &= known;
            disp.nameless &= known;
            disp.objectless &= known;
            disp.stale &= known;
        }
        Some(s)
    }

    /// `settles` only when [`Config::liveness`] is set, and the handover after a crash only
    /// when a crash and a second dispatcher make it possible.
    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![Property::always("exclusive", |m: &Self, s: &State| {
            m.exclusive(s)
        })];
        if self.config.liveness {
            properties.push(Property::always("settles", |m: &Self, s: &State| {
                s.pending == 0 || m.settles(s)
            }));
        }
        properties.push(Property::sometimes(
            "a key is reconciled",
            |_, s: &State| s.seen & Seen::Reconciled as u8 != 0,
        ));
        if self.config.dispatchers > 1 && self.config.budget.dispatcher_crashes > 0 {
            properties.push(Property::sometimes(
                "a handover completes after a crash",
                |_, s: &State| s.seen & Seen::HandoverAfterCrash as u8 != 0,
            ));
        }
        if self.config.dispatchers > 1 && self.config.budget.lease_deletions > 0 {
            properties.push(Property::sometimes(
                "a handover completes after a Lease deletion",
                |_, s: &State| s.seen & Seen::HandoverAfterDeletion as u8 != 0,
            ));
        }
        if self.config.dispatchers > 1 && self.config.groups > 1 {
            properties.push(Property::sometimes(
                "a release waits for another group's handover",
                |_, s: &State| s.seen & Seen::ReleaseWaitsForAnotherGroup as u8 != 0,
            ));
        }
        if self.config.takeover == Takeover::Reports
            && self.config.dispatchers > 1
            && self.config.budget.dispatcher_crashes > 0
            && self.config.budget.reports > 0
        {
            properties.push(Property::sometimes(
                "a member that died is waited out no longer once its sessions are reported ended",
                |_, s: &State| s.seen & Seen::TakeoverByReports as u8 != 0,
            ));
        }
        properties.push(Property::sometimes(
            "a replica fences a session",
            |_, s: &State| s.seen & Seen::Fenced as u8 != 0,
        ));
        properties
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.budget;
        write!(
            f,
            "{} dispatchers, {} replicas in {} groups (made lazily: {}), {} keys, {:?} replica, {:?} Lease views, deleted Leases {:?}, releases withheld while a member is waited out: {}, closed sessions {:?}, keys coming back without a handover listed: {}; timing {:?}; faults: {} dispatcher crashes, {} graceful stops, {} replica crashes, {} API cuts, {} lost renewal answers, {} lost messages, {} changes, {} ticks of drift, {} Lease deletions, {} early CloseSessions, {} deletions, {} owned changes",
            self.dispatchers,
            self.replicas,
            self.groups,
            self.lazy_groups,
            self.keys,
            self.variant,
            self.views,
            self.deletions,
            self.withhold,
            self.closes,
            self.relist_returning,
            self.timing,
            b.dispatcher_crashes,
            b.graceful_stops,
            b.replica_crashes,
            b.api_cuts,
            b.lost_renewal_answers,
            b.lost_messages,
            b.changes,
            b.drift,
            b.lease_deletions,
            b.closes,
            b.deletions,
            b.owned_changes
        )
    }
}

#[cfg(test)]
mod tests {
    use stateright::{Checker, HasDiscoveries};

    use super::*;

    fn config(dispatchers: usize, variant: Variant, budget: Budget) -> Config {
        Config {
            dispatchers,
            replicas: 2,
            groups: 1,
            keys: 1,
            lazy_groups: false,
            timing: Timing::COARSE,
            budget,
            variant,
            views: Views::Whole,
            deletions: Deletions::Died,
            withhold: true,
            closes: Closes::Hold,
            relist_returning: true,
            liveness: true,
            takeover: Takeover::Bound,
        }
    }

    const NO_FAULTS: Budget = Budget::NONE;

    fn replay(model: &Protocol, path: &[Action]) -> State {
        let mut s = model.init_states().remove(0);
        for (i, a) in path.iter().enumerate() {
            let mut enabled = Vec::new();
            model.actions(&s, &mut enabled);
            assert!(enabled.contains(a), "step {i}: {a:?} is not enabled");
            s = model
                .next_state(&s, *a)
                .unwrap_or_else(|| panic!("step {i}: {a:?} changed nothing"));
        }
        s
    }

    fn running(s: &State) -> usize {
        s.replicas.iter().filter(|r| r.running[0].is_some()).count()
    }

    /// Replica 0's answer takes two ticks to arrive; its next poll never does. Counting its
    /// fence from the answer's arrival, replica 0 still runs when the dispatcher, a ttl after
    /// answering, expires its session and hands the key to replica 1. Counting from the send,
    /// replica 0 must cancel first: the same steps are not possible.
    #[test]
    fn a_fence_counted_from_the_answers_arrival_overlaps_one_counted_from_the_send_does_not() {
        use Action::*;
        let path = [
            Open(0, 0),
            Open(1, 0),
            Poll(0, 0),
            Arrive(0, 0),
            Answer(0, 0, 1),
            Tick,
            Tick,
            Receive(0, 0),
            Poll(0, 0),
            Poll(1, 0),
            Tick,
            Arrive(1, 0),
            Answer(1, 0, 0),
            Receive(1, 0),
            Poll(1, 0),
            Arrive(1, 0),
            Tick,
            Expire(0, 0),
            Answer(1, 0, 1),
            Receive(1, 0),
        ];
        let old = Protocol::new(config(1, Variant::ArrivalTime, NO_FAULTS));
        assert_eq!(
            running(&replay(&old, &path)),
            2,
            "both replicas run the key"
        );
        let new = Protocol::new(config(1, Variant::SendTime, NO_FAULTS));
        let mut s = new.init_states().remove(0);
        for a in path {
            let mut enabled = Vec::new();
            new.actions(&s, &mut enabled);
            if !enabled.contains(&a) {
                // Replica 0's fence ran out first: it must cancel before time passes.
                assert_eq!(a, Tick);
                assert!(enabled.contains(&Fence(0, 0)));
                return;
            }
            s = new.next_state(&s, a).unwrap_or_else(|| panic!("{a:?}"));
            assert!(running(&s) <= 1);
        }
        panic!("the fence counted from the send never ran out first");
    }

    /// The checker finds that overlap by itself in the old variant.
    #[test]
    fn the_checker_finds_the_overlap_of_the_old_fencing() {
        let checker = Protocol::new(config(1, Variant::ArrivalTime, NO_FAULTS))
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        let path = checker.discovery("exclusive").expect("an overlap is found");
        assert!(running(path.last_state()) == 2);
    }

    /// Dispatcher 0 stops gracefully and dispatcher 1 takes its key over; dispatcher 0 starts
    /// again, renews, and its Lease watch lists. Judging membership on every Lease event (the
    /// code before `k8s/membership.rs` waited for a whole view), it finds itself alone after its
    /// own Lease, serves the key at once, and a replica takes it from each dispatcher. Judging
    /// on whole views only, the same steps are not possible.
    #[test]
    fn membership_judged_on_a_partial_view_of_the_leases_overlaps_and_on_a_whole_view_does_not() {
        use Action::*;
        let budget = Budget {
            graceful_stops: 1,
            ..NO_FAULTS
        };
        let path = [
            Stop(0),
            Tick,
            Open(0, 1),
            Poll(0, 1),
            Arrive(0, 1),
            Answer(0, 1, 1),
            Receive(0, 1),
            Restart(0),
            Glimpse(0, 0b01),
            Open(1, 0),
            Poll(1, 0),
            Arrive(1, 0),
            Answer(1, 0, 1),
            Receive(1, 0),
        ];
        let partial = Protocol::new(Config {
            views: Views::Partial,
            ..config(2, Variant::SendTime, budget)
        });
        assert_eq!(
            running(&replay(&partial, &path)),
            2,
            "both replicas run the key"
        );
        let whole = Protocol::new(config(2, Variant::SendTime, budget));
        let glimpse = path.iter().position(|a| matches!(a, Glimpse(..))).unwrap();
        let s = replay(&whole, &path[..glimpse]);
        let mut enabled = Vec::new();
        whole.actions(&s, &mut enabled);
        assert!(!enabled.contains(&path[glimpse]));
        // Without the partial view, dispatcher 0 cannot serve the key to replica 1.
        assert!(
            whole
                .next_state(&s, Open(1, 0))
                .and_then(|s| whole.next_state(&s, Poll(1, 0)))
                .and_then(|s| whole.next_state(&s, Arrive(1, 0)))
                .and_then(|s| whole.next_state(&s, Answer(1, 0, 1)))
                .is_none(),
            "dispatcher 0 serves the key before a whole view"
        );
    }

    /// The checker finds that overlap by itself: with a graceful stop and no other fault, every
    /// path of up to 16 steps, depth first. Judging on whole views, none of those paths
    /// overlaps.
    #[test]
    fn the_checker_finds_the_overlap_of_partial_lease_views_and_none_with_whole_views() {
        let explore = |views| {
            let config = Config {
                views,
                liveness: false,
                ..config(
                    2,
                    Variant::SendTime,
                    Budget {
                        graceful_stops: 1,
                        ..NO_FAULTS
                    },
                )
            };
            Protocol::new(config)
                .checker()
                .target_max_depth(16)
                .spawn_dfs()
                .join()
        };
        let partial = explore(Views::Partial);
        let path = partial.discovery("exclusive").expect("an overlap is found");
        assert!(running(path.last_state()) == 2);
        let actions = path.into_actions();
        assert!(
            actions.iter().any(|a| matches!(a, Action::Glimpse(..)))
                && actions.iter().any(|a| matches!(a, Action::Stop(..))),
            "the overlap follows a graceful stop and a partial view: {actions:#?}"
        );
        let whole = explore(Views::Whole);
        assert!(whole.is_done());
        if let Some(path) = whole.discovery("exclusive") {
            panic!("whole views overlap: {:#?}", path.into_actions());
        }
        println!(
            "a graceful stop, whole views: {} unique states within 16 steps",
            whole.unique_state_count()
        );
    }

    /// Replica `r` opens a session on dispatcher `d`, polls, and starts reconciling key 0.
    fn takes(r: u8, d: u8) -> [Action; 5] {
        use Action::*;
        [
            Open(r, d),
            Poll(r, d),
            Arrive(r, d),
            Answer(r, d, 1),
            Receive(r, d),
        ]
    }

    /// `path` ends with two replicas running one key in `bad`; in `good`, the same steps are
    /// not possible, and none of those that are overlaps.
    fn overlaps_only_in(bad: Config, good: Config, path: &[Action]) {
        assert_eq!(
            running(&replay(&Protocol::new(bad), path)),
            2,
            "both replicas run the key ({bad})"
        );
        let model = Protocol::new(good);
        let mut s = model.init_states().remove(0);
        for a in path {
            let mut enabled = Vec::new();
            model.actions(&s, &mut enabled);
            let Some(next) = enabled
                .contains(a)
                .then(|| model.next_state(&s, *a))
                .flatten()
            else {
                return;
            };
            s = next;
            assert!(running(&s) <= 1, "{a:?} overlaps ({good})");
        }
        panic!("the steps that overlap in {bad} are all possible in {good}");
    }

    /// A dispatcher cut off from the API server (a partitioned node) has its Lease deleted by
    /// hand while its replica reconciles: taken for a release (the code before the drained
    /// mark), the other dispatcher hands the key out at the next tick; taken for a death, it
    /// waits the reconcile out.
    #[test]
    fn a_deleted_lease_taken_for_a_release_overlaps_and_taken_for_a_death_does_not() {
        use Action::*;
        let budget = Budget {
            api_cuts: 1,
            lease_deletions: 1,
            ..NO_FAULTS
        };
        let good = config(2, Variant::SendTime, budget);
        let bad = Config {
            deletions: Deletions::Released,
            ..good
        };
        let path = [
            takes(0, 0).as_slice(),
            &[CutApi(0), DeleteLease(0), Tick],
            &takes(1, 1),
        ]
        .concat();
        overlaps_only_in(bad, good, &path);
    }

    /// A dispatcher is killed while its replica reconciles and its Lease is deleted by hand;
    /// it restarts at once, finds no Lease, so no wait of its own. Only the other dispatcher,
    /// which saw the deletion and releases no ring while it waits, keeps it from serving the
    /// key again before the killed process's reconcile is over.
    #[test]
    fn a_dispatcher_restarted_after_its_lease_was_deleted_waits_for_the_others_withheld_release() {
        use Action::*;
        let budget = Budget {
            dispatcher_crashes: 1,
            lease_deletions: 1,
            ..NO_FAULTS
        };
        let good = config(2, Variant::SendTime, budget);
        let bad = Config {
            withhold: false,
            ..good
        };
        let path = [
            takes(0, 0).as_slice(),
            &[Crash(0), DeleteLease(0), Restart(0), Tick, Tick],
            &takes(1, 0),
        ]
        .concat();
        overlaps_only_in(bad, good, &path);
    }

    /// A client closes its session while it still reconciles (the SDK never does): released
    /// at once, the key goes to the other replica; held until the session would have expired,
    /// it does not.
    #[test]
    fn an_early_close_session_released_at_once_overlaps_and_held_does_not() {
        use Action::*;
        let budget = Budget {
            closes: 1,
            ..NO_FAULTS
        };
        let good = config(1, Variant::SendTime, budget);
        let bad = Config {
            closes: Closes::Release,
            ..good
        };
        let path = [
            takes(0, 0).as_slice(),
            &[Close(0, 0), CloseArrives(0, 0)],
            &takes(1, 0),
        ]
        .concat();
        overlaps_only_in(bad, good, &path);
    }

    /// Dispatcher `j` is scaled down and up again, and down once more before a handover to the
    /// ring of two completes; meanwhile a key `j` would own changes. The other dispatcher, still
    /// settled on the ring of one, serves the key again without a handover: unless it lists it,
    /// the change is never delivered (the scaled-down dispatcher does not come back).
    #[test]
    fn a_change_while_a_joining_dispatcher_comes_and_goes_is_delivered_only_if_listed() {
        use Action::*;
        let budget = Budget {
            graceful_stops: 2,
            changes: 1,
            ..NO_FAULTS
        };
        let good = Config {
            keys: 2,
            ..config(2, Variant::SendTime, budget)
        };
        let bad = Config {
            relist_returning: false,
            ..good
        };
        let model = Protocol::new(good);
        // The joiner must judge first in a tick (dispatcher 0), so that the other adopts the
        // ring of two after the joiner's release and completes no handover to it.
        let k = (0..2u8)
            .find(|k| model.owner(model.all(), usize::from(*k)) == Some(0))
            .expect("a key dispatcher-0 owns on the ring of two");
        let path = [
            // Dispatcher 0 goes; dispatcher 1 takes over every key and reconciles k.
            &[Stop(0), Tick][..],
            &[Open(0, 1), Poll(0, 1), Arrive(0, 1), Answer(0, 1, bit(k))],
            &[Receive(0, 1), Finish(0, k), AckArrives(0, 1, k)],
            // Dispatcher 0 comes back; dispatcher 1 sees it and lets k go; k changes; 0 goes.
            &[Restart(0), Tick, Change(k), Stop(0), Tick],
        ]
        .concat();
        let s = replay(&model, &path);
        assert_eq!(
            s.dispatchers[1].settled,
            Some(bit(1usize)),
            "no handover between"
        );
        assert!(model.settles(&s), "listed, the change is delivered");
        let bad_model = Protocol::new(bad);
        let s = replay(&bad_model, &path);
        assert!(
            !bad_model.settles(&s),
            "unlisted, the change is never delivered"
        );
    }

    /// The real code (`core::leases`, `core::handover`, `core::queue`, `core::transit`)
    /// steps in lock-step with the model on random walks of two keys and two replicas with
    /// Lease deletions of live and dead dispatchers, crashes, graceful stops, lost renewal
    /// answers, changes, replica crashes and early CloseSessions (not API cuts: see `real`).
    /// A mutated copy of the code (held keys released at once, a change in flight forgotten at
    /// the ack, a moved key's drain skipped, keys on their way out not recognised) parts from
    /// the model within a few walks.
    #[test]
    fn the_real_code_steps_in_lock_step_with_the_model() {
        // Replica r belongs to group r % groups: with two groups, replicas 0 and 2 share one.
        for (dispatchers, groups, replicas) in [(2, 1, 2), (3, 1, 2), (3, 2, 3)] {
            let budget = Budget {
                dispatcher_crashes: 2,
                graceful_stops: 1,
                replica_crashes: 1,
                lost_renewal_answers: 2,
                lease_deletions: 3,
                changes: 3,
                closes: 2,
                deletions: 1,
                owned_changes: 2,
                reports: 3,
                ..NO_FAULTS
            };
            let model = Protocol::new(Config {
                keys: 2,
                groups,
                replicas,
                liveness: false,
                takeover: Takeover::Reports,
                ..config(dispatchers, Variant::SendTime, budget)
            });
            let mut total = real::Walked::default();
            for seed in 0..2000 {
                match real::walk(&model, seed, 120) {
                    Ok(w) => {
                        total.steps += w.steps;
                        total.deletions += w.deletions;
                        total.handovers += w.handovers;
                        total.deliveries += w.deliveries;
                        total.object_deletions += w.object_deletions;
                        total.deletions_in_transit += w.deletions_in_transit;
                        total.tombstones += w.tombstones;
                        total.waits_for_group += w.waits_for_group;
                        total.takeovers_by_reports += w.takeovers_by_reports;
                    }
                    Err(d) => {
                        panic!("{dispatchers} dispatchers, {groups} groups, seed {seed}: {d}")
                    }
                }
            }
            println!(
                "{dispatchers} dispatchers, {replicas} replicas in {groups} groups: 2000 walks, {} steps, {} Lease deletions, {} handovers, {} answers with keys, {} object deletions, {} deletions queued from a transit's memory, {} tombstones handed out, {} releases waiting for another group, {} dead members taken over by reports, in lock-step",
                total.steps,
                total.deletions,
                total.handovers,
                total.deliveries,
                total.object_deletions,
                total.deletions_in_transit,
                total.tombstones,
                total.waits_for_group,
                total.takeovers_by_reports
            );
            assert!(total.takeovers_by_reports > 20);
            assert!(total.deletions > 1000 && total.handovers > 1000 && total.deliveries > 1000);
            assert!(total.object_deletions > 1000 && total.deletions_in_transit > 100);
            assert!(total.tombstones > 20);
            if groups > 1 {
                assert!(total.waits_for_group > 20);
            }
        }
    }

    /// The keys of a dispatcher that died are served before the bound once every session its
    /// Lease listed is reported ended: on random paths of up to 60 steps with two crashes (a
    /// dispatcher may die again after a restart), an API cut, lost messages, a replica crash
    /// and reports, no two replicas overlap, and such
    /// takeovers, with sessions reported, are reached. (Breadth first, the check reaches only
    /// 9 steps, too few for a death to be found; depth first, it stays on the first paths.
    /// Random paths are a weaker check than either: they did not find the overlaps of the
    /// broken rules below, which the replayed paths show.)
    #[test]
    fn a_takeover_once_every_listed_session_is_reported_ended_never_overlaps() {
        let budget = Budget {
            dispatcher_crashes: 2,
            api_cuts: 1,
            lost_messages: 1,
            replica_crashes: 1,
            changes: 1,
            reports: 2,
            ..NO_FAULTS
        };
        let config = Config {
            liveness: false,
            takeover: Takeover::Reports,
            ..config(2, Variant::SendTime, budget)
        };
        let checker = Protocol::new(config)
            .checker()
            .threads(2)
            .target_max_depth(60)
            .target_state_count(4_000_000)
            .spawn_simulation(7, stateright::UniformChooser)
            .join();
        if let Some(path) = checker.discovery("exclusive") {
            panic!("exclusive violated ({config}):\n{:#?}", path.into_actions());
        }
        println!(
            "takeover by reports: {} states on random paths",
            checker.state_count(),
        );
        let path = checker
            .discovery(
                "a member that died is waited out no longer once its sessions are reported ended",
            )
            .expect("a takeover by reports is reached");
        let actions = path.into_actions();
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::ReportArrives(..))),
            "{actions:#?}"
        );
    }

    /// A dispatcher cut off from the API server (a partitioned node) can write no Lease, so a
    /// session opened there meanwhile is listed nowhere. Handed keys all the same, its
    /// reconcile runs on when the other dispatcher, finding no session on the cut-off one's
    /// Lease to wait for, takes its keys over at once; handed keys only once listed, it gets
    /// none.
    #[test]
    fn keys_for_a_session_no_lease_lists_overlap_with_a_takeover_by_reports() {
        use Action::*;
        let budget = Budget {
            api_cuts: 1,
            ..NO_FAULTS
        };
        let good = Config {
            takeover: Takeover::Reports,
            ..config(2, Variant::SendTime, budget)
        };
        let bad = Config {
            takeover: Takeover::Unlisted,
            ..good
        };
        let path = [
            &[CutApi(0), Tick, Tick, Tick][..],
            &takes(0, 0),
            &[Tick, Tick],
            &takes(1, 1),
        ]
        .concat();
        overlaps_only_in(bad, good, &path);
        // Waiting out the bound, it does not take the key over then either.
        overlaps_only_in(
            bad,
            Config {
                takeover: Takeover::Bound,
                ..good
            },
            &path,
        );
    }

    /// A replica reports its session on a cut-off dispatcher ended but lets its reconcile run
    /// on: the other dispatcher, carrying the report on its Lease, takes the key over as soon
    /// as it finds the cut-off one dead, while the reconcile still runs. Reporting only once
    /// the reconcile is cancelled, the same steps never overlap.
    #[test]
    fn a_session_reported_ended_before_its_reconcile_overlaps_and_after_it_does_not() {
        use Action::*;
        let budget = Budget {
            api_cuts: 1,
            reports: 1,
            ..NO_FAULTS
        };
        let good = Config {
            takeover: Takeover::Reports,
            ..config(2, Variant::SendTime, budget)
        };
        let bad = Config {
            takeover: Takeover::ReportFirst,
            ..good
        };
        let path = [
            &[Open(0, 0), Tick, CutApi(0)][..],
            &[Poll(0, 0), Arrive(0, 0), Answer(0, 0, 0), Receive(0, 0)],
            &[Tick, Poll(0, 0), Arrive(0, 0), Tick, Tick],
            &[
                Answer(0, 0, 1),
                Receive(0, 0),
                Report(0, 0, 1),
                ReportArrives(0, 1),
            ],
            // Replica 1's session is listed by dispatcher 1's next write.
            &[Tick, Open(1, 1), Tick],
            &[Poll(1, 1), Arrive(1, 1), Answer(1, 1, 1), Receive(1, 1)],
        ]
        .concat();
        let bad_end = replay(&Protocol::new(bad), &path);
        assert_eq!(running(&bad_end), 2, "both replicas run the key ({bad})");
        assert_ne!(bad_end.seen & Seen::TakeoverByReports as u8, 0);
        let good_end = replay(&Protocol::new(good), &path);
        assert_eq!(
            running(&good_end),
            1,
            "only replica 1 runs the key ({good})"
        );
        assert!(good_end.replicas[1].running[0].is_some());
        assert_ne!(
            good_end.seen & Seen::TakeoverByReports as u8,
            0,
            "the key was taken over by the report, before the bound"
        );
    }

    /// Explores `config` depth first to `depth` steps for `states` states (revisits included);
    /// panics with the path to any violation.
    fn check_deep(config: Config, depth: usize, states: usize) -> impl Checker<Protocol> {
        let checker = Protocol::new(config)
            .checker()
            .target_max_depth(depth)
            .target_state_count(states)
            .spawn_dfs()
            .join();
        for property in ["exclusive", "settles"] {
            if let Some(path) = checker.discovery(property) {
                panic!(
                    "{property} violated ({config}):\n{:#?}",
                    path.into_actions()
                );
            }
        }
        checker
    }

    /// Explores `config` breadth first for `states` states (revisits included); panics with the
    /// path to any violation; returns the unique states and the depth reached.
    fn check_bounded(config: Config, states: usize) -> (usize, usize) {
        let checker = Protocol::new(config)
            .checker()
            .threads(2)
            .target_state_count(states)
            .spawn_bfs()
            .join();
        for property in ["exclusive", "settles"] {
            if let Some(path) = checker.discovery(property) {
                panic!(
                    "{property} violated ({config}):\n{:#?}\nlast state: {:#?}",
                    path.clone().into_actions(),
                    path.last_state()
                );
            }
        }
        (checker.unique_state_count(), checker.max_depth())
    }

    /// The sessions, polls, acks and fencing of one dispatcher and two replicas, with a replica
    /// crash, a dispatcher crash, a lost message and a change: bounded breadth-first.
    #[test]
    fn one_dispatcher_two_replicas_never_overlap_and_settle() {
        let budget = Budget {
            dispatcher_crashes: 1,
            replica_crashes: 1,
            lost_messages: 1,
            changes: 1,
            closes: 1,
            ..NO_FAULTS
        };
        let (states, depth) = check_bounded(config(1, Variant::SendTime, budget), 4_000_000);
        println!("one dispatcher: {states} unique states, depth {depth}");
        assert!(states >= 500_000, "only {states} states explored");
    }

    /// Two dispatchers, every fault once, explored depth first to 80 steps: deep enough for a
    /// crashed dispatcher's keys to be handed over and back, which breadth first does not reach
    /// within the budget.
    #[test]
    fn two_dispatchers_on_deep_paths_never_overlap_and_settle() {
        let budget = Budget {
            dispatcher_crashes: 1,
            graceful_stops: 1,
            replica_crashes: 1,
            api_cuts: 1,
            lost_renewal_answers: 1,
            lost_messages: 1,
            changes: 2,
            drift: 0,
            lease_deletions: 1,
            closes: 1,
            deletions: 1,
            owned_changes: 1,
            reports: 0,
        };
        let checker = check_deep(config(2, Variant::SendTime, budget), 80, 3_000_000);
        assert!(
            checker
                .discovery("a handover completes after a crash")
                .is_some(),
            "no handover after a crash was reached"
        );
        println!(
            "two dispatchers, depth first: {} unique states, depth {}",
            checker.unique_state_count(),
            checker.max_depth()
        );
    }

    /// A known gap, found by the checker once groups are made as the dispatcher makes them
    /// (`--lazy-groups`, breadth first, 7.7 million states): dispatcher 0 restarts, and before
    /// any replica opens a session there (so it has no group, and no watch, for the key), the
    /// key's object changes and is deleted. Only dispatcher 1 remembers the deletion, and its
    /// Lease is deleted and it restarts before dispatcher 0's group is made and asks: the memory
    /// goes with it, and the deletion is never delivered. With every group made at start, the
    /// restarted dispatcher's own watch holds the deletion and delivers it.
    #[test]
    fn a_deletion_before_a_restarted_dispatchers_group_is_made_is_lost_if_its_peer_restarts_too() {
        use Action::*;
        let budget = Budget {
            dispatcher_crashes: 1,
            graceful_stops: 1,
            lease_deletions: 1,
            changes: 1,
            deletions: 1,
            ..NO_FAULTS
        };
        let eager = config(2, Variant::SendTime, budget);
        let lazy = Config {
            lazy_groups: true,
            ..eager
        };
        // Key 0 is reconciled first, so the deletion is of an object the controllers saw.
        let path = [
            takes(0, 0).as_slice(),
            &[Finish(0, 0), AckArrives(0, 0, 0)],
            &[Crash(0), Restart(0), Change(0), Delete(0)],
            &[DeleteLease(1), Stop(1), Restart(1), Open(1, 1), Poll(1, 1)],
        ]
        .concat();
        let model = Protocol::new(lazy);
        let s = replay(&model, &path);
        assert!(!model.settles(&s), "the deletion is delivered after all");
        let model = Protocol::new(eager);
        let s = replay(&model, &path);
        assert!(model.settles(&s));
    }

    /// Every dispatcher's watch is broken when key 0's object is deleted (an API-server restart
    /// expires them all at once): no watch sees the deletion, so no peer remembers it, and only
    /// the owner's re-list finds it, by its sweep. If the owner dies before delivering it, the
    /// deletion is lost (`dispatcher/HANDOVER.md`, "Known gaps"; the dispatcher narrows the
    /// window by retrying its watch within 2 s and listing at once on 410 Gone). With the peer's
    /// watch running, the peer remembers the deletion and the restarted owner delivers it.
    #[test]
    fn a_deletion_while_every_watch_is_broken_is_lost_if_its_owner_dies_before_delivering_it() {
        use Action::*;
        let budget = Budget {
            dispatcher_crashes: 1,
            api_cuts: 2,
            changes: 1,
            deletions: 1,
            ..NO_FAULTS
        };
        let model = Protocol::new(config(2, Variant::SendTime, budget));
        assert_eq!(model.owner(model.all(), 0), Some(0));
        let reconciled = [takes(0, 0).as_slice(), &[Finish(0, 0), AckArrives(0, 0, 0)]].concat();
        let every_watch_broken = [
            reconciled.as_slice(),
            &[CutApi(0), CutApi(1), Delete(0), HealApi(0), HealApi(1)],
            &[Crash(0), Restart(0)],
        ]
        .concat();
        let s = replay(&model, &every_watch_broken);
        assert!(
            !model.settles(&s),
            "the deletion is delivered after all: the model no longer shows the gap"
        );
        let owner_broken = [
            reconciled.as_slice(),
            &[CutApi(0), Delete(0), HealApi(0)],
            &[Crash(0), Restart(0)],
        ]
        .concat();
        let s = replay(&model, &owner_broken);
        assert!(model.settles(&s));
    }

    /// Two controller groups: dispatcher 1 stops, dispatcher 0 takes key 1 and hands it to a
    /// replica of each group; group 0's reconcile ends, group 1's still runs when dispatcher 1
    /// comes back. Dispatcher 0 releases the ring of two only once group 1's delivery is
    /// acknowledged too (a release that asked the first group alone would not wait), and
    /// dispatcher 1 serves key 1 only after that release.
    #[test]
    fn a_ring_is_released_only_once_every_group_has_handed_over() {
        use Action::*;
        let budget = Budget {
            graceful_stops: 1,
            ..NO_FAULTS
        };
        let model = Protocol::new(Config {
            groups: 2,
            replicas: 2,
            keys: 2,
            ..config(2, Variant::SendTime, budget)
        });
        // Entries: group 0's keys 0 and 1, then group 1's; replica r is in group r.
        let (g0_k1, g1_k1) = (1u8, 3u8);
        assert_eq!(model.owner(model.all(), 1), Some(1));
        let take = |r: u8, e: u8| [Open(r, 0), Poll(r, 0), Arrive(r, 0), Answer(r, 0, bit(e))];
        let path = [
            &[Stop(1), Tick][..],
            &take(1, g1_k1),
            &[Receive(1, 0)],
            &take(0, g0_k1),
            &[Receive(0, 0), Finish(0, g0_k1), AckArrives(0, 0, g0_k1)],
            &[Restart(1), Tick],
        ]
        .concat();
        let s = replay(&model, &path);
        assert_eq!(s.dispatchers[0].ring, 0b11);
        assert_eq!(
            model.moving(&s.dispatchers[0], 0),
            0b10,
            "group 1 still delivers key 1"
        );
        assert_eq!(s.leases[0].released, None);
        assert!(s.seen & Seen::ReleaseWaitsForAnotherGroup as u8 != 0);
        assert_eq!(s.dispatchers[1].settled, None);
        let done = [Finish(1, g1_k1), AckArrives(1, 0, g1_k1), Tick, Tick];
        let s = replay(&model, &[path.as_slice(), &done].concat());
        assert_eq!(s.leases[0].released, Some(0b11));
        assert_eq!(s.dispatchers[1].settled, Some(0b11));
    }

    /// Two controller groups on two dispatchers (replicas 0 and 2 in one group, replica 1 in
    /// the other), with a dispatcher crash, a graceful stop, a Lease deletion, a change and a
    /// deletion, explored depth first: no group's replicas overlap, and every change settles.
    #[test]
    fn two_groups_never_overlap_and_settle() {
        let budget = Budget {
            dispatcher_crashes: 1,
            graceful_stops: 1,
            lease_deletions: 1,
            changes: 1,
            deletions: 1,
            ..NO_FAULTS
        };
        let config = Config {
            groups: 2,
            replicas: 3,
            keys: 2,
            ..config(2, Variant::SendTime, budget)
        };
        let checker = check_deep(config, 60, 3_000_000);
        assert!(checker.unique_state_count() >= 1_000_000);
        println!(
            "two groups, depth first: {} unique states, depth {}",
            checker.unique_state_count(),
            checker.max_depth()
        );
    }

    /// Two dispatchers with their Leases and the handover gate, a dispatcher crash, a cut from
    /// the API server and a lost renewal answer: bounded breadth-first.
    #[test]
    fn two_dispatchers_never_overlap_and_settle() {
        let budget = Budget {
            dispatcher_crashes: 1,
            api_cuts: 1,
            lost_renewal_answers: 1,
            lease_deletions: 1,
            ..NO_FAULTS
        };
        let (states, depth) = check_bounded(config(2, Variant::SendTime, budget), 3_000_000);
        println!("two dispatchers: {states} unique states, depth {depth}");
        assert!(states >= 500_000, "only {states} states explored");
    }
}
