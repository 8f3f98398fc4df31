//! What the model is asked to check: the timing, the budget of faults, the variant of the rules,
//! and the configuration that holds them.

use std::fmt;

#[cfg(doc)]
use crate::Action;

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
    pub(crate) fn reports(self) -> bool {
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
    /// Whether the group lists the owners itself (`GroupSpec::lists_owners_of`): a change of an
    /// owned object queues a served key only once the dispatcher knows the key's object, and a
    /// key it does not know yet is left to the list that shows it (`GroupEvent::OwnedChanged`'s
    /// `owners_listed`). A change of an object whose owner does not exist asks for no reconcile
    /// then (nothing shows the owner). Without, every change of an owned object queues the key.
    pub owners_listed: bool,
    /// Check `settles` too (a fair run from every state with a change pending: the costly part).
    pub liveness: bool,
    /// How the keys of a dispatcher that died are taken over.
    pub takeover: Takeover,
    /// Whether a restarted dispatcher warms up before it joins, as the dispatcher does: its
    /// Lease, written marked warming, makes it no member, and [`Action::Warm`] ends the warm-up
    /// with a member's renewal. Without, it renews as a member at once (a warm-up that ends
    /// before anyone judges).
    pub warm_up: bool,
    /// Whether `Model::actions` lists only the actions that lead to a state, for random walks:
    /// stateright's simulation records the index of an action it skipped (no next state) as a
    /// step, so a path through one cannot be replayed. Exhaustive checks skip such actions
    /// themselves, at half the cost.
    pub enabled_only: bool,
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.budget;
        write!(
            f,
            "{} dispatchers, {} replicas in {} groups (made lazily: {}), {} keys, {:?} replica, {:?} Lease views, deleted Leases {:?}, releases withheld while a member is waited out: {}, closed sessions {:?}, keys coming back without a handover listed: {}, owners listed by the group: {}, restarts warm up: {}; timing {:?}; faults: {} dispatcher crashes, {} graceful stops, {} replica crashes, {} API cuts, {} lost renewal answers, {} lost messages, {} changes, {} ticks of drift, {} Lease deletions, {} early CloseSessions, {} deletions, {} owned changes",
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
            self.owners_listed,
            self.warm_up,
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
