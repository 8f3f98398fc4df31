//! The model's state: dispatchers and their keys, Leases, replicas and their sessions, messages
//! in flight, and the actions that move them.

use crate::Budget;
#[cfg(doc)]
use crate::{Config, DELIVERIES, Protocol, Takeover};

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

impl Dispatcher {
    /// Its keys ready for delivery, as a mask.
    pub(crate) fn ready(&self) -> u8 {
        self.keys
            .iter()
            .enumerate()
            .filter(|(_, k)| matches!(k, Key::Ready { .. }))
            .fold(0u8, |m, (i, _)| m | bit(i))
    }
}

impl Key {
    /// The same key, marked as moved away or not (idle and absent keys have no mark).
    pub(crate) fn leaving(self, leaving: bool) -> Self {
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
    /// Per member: ticks left of the wait for one that died (0: none); its own entry, for its
    /// previous process, which died (`Handover::new` with `predecessor_died`).
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
    /// Members whose Lease it saw deleted with the drained mark since it last judged, and
    /// written since by no member (`Observations::take_releases`): they released, even if a
    /// new process of theirs, warming up, wrote the Lease again meanwhile.
    pub releases: u8,
    /// Its process warms up ([`Config::warm_up`]): its Lease is marked warming, and it is no
    /// member until [`Action::Warm`].
    pub warming: bool,
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
    /// Keys its transit's index of held keys knows exist (a bit each): keys it owns on its
    /// ring but does not serve, which its queue does not know, shown by the list a handover's
    /// start asks for ([`Action::IndexHeld`]) or by its watch since. A re-list that does not
    /// show one reveals its deletion (`Transit`'s `held_keys`, `Transit::sweep`).
    pub held_index: u8,
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
    /// Written by a process warming up to join ([`Config::warm_up`]): not a member's.
    pub warming: bool,
    /// The sessions it lists ([`Protocol::sid`] bits): every session its holder may have handed
    /// keys to that may still run them.
    pub sessions: u32,
    /// Whether `sessions` is all of them: not while its holder waits out its previous process
    /// (whose sessions it does not know) or a member that died (whose reconciles a dispatcher
    /// that never saw it relies on this one's wait alone to wait out).
    pub known: bool,
    /// Sessions of others reported ended to its holder ([`Protocol::sid`] bits).
    pub ended: u32,
}

impl Lease {
    /// Whether dispatcher `o` counts this Lease, dispatcher `x`'s, as a member's while it
    /// exists: one marked warming counts only to its writer, which counts itself a member and
    /// hands out nothing (`Handover::judge`).
    pub(crate) fn member_to(&self, x: usize, o: usize) -> bool {
        !self.warming || x == o
    }
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
    pub(crate) fn between(&self) -> (u8, u8) {
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
pub(crate) enum Seen {
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
    /// The list beside the watch of dispatcher `d` that a handover's start asks for (a member
    /// left its ring while it serves) shows the keys the handover holds, and its index of held
    /// keys records them (`Slice::may_hold_more_than`). Taken at any time after, or never
    /// (a cut first): how long that list takes is the window in which a deletion of a held
    /// key in a gap of the watch is not found.
    IndexHeld(u8),
    /// Dispatcher `d` reaches the API server again (and re-lists).
    HealApi(u8),
    /// Dispatcher `d` is killed.
    Crash(u8),
    /// Dispatcher `d` starts again, and renews its Lease before its Lease watch lists (marked
    /// warming with [`Config::warm_up`]).
    Restart(u8),
    /// Dispatcher `d`, warming up, is ready: it renews its Lease as a member.
    Warm(u8),
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

pub(crate) fn bit(i: impl Into<usize>) -> u8 {
    1u8 << i.into()
}

pub(crate) fn has(mask: u8, i: impl Into<usize>) -> bool {
    mask & bit(i) != 0
}

pub(crate) fn dispatcher_name(i: usize) -> String {
    format!("dispatcher-{i}")
}

/// Sends an ack. An older ack of the same key between the same pair, still on its way, would
/// settle nothing the newer one does not (the dispatcher matches deliveries): it is dropped,
/// which bounds the network to one ack per key and pair.
pub(crate) fn send_ack(messages: &mut Vec<Message>, r: u8, d: u8, k: u8, delivery: u8) {
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
