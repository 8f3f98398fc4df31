//! A model of kube-dispatch's delivery protocol, checked exhaustively with
//! [stateright](https://docs.rs/stateright): dispatchers with their Leases, sessions and work
//! queues, the handover gate, controller replicas with their fencing, and the network between
//! them, under crashes, restarts, cuts, lost and reordered messages and drifting clocks.
//!
//! The model is one transition function over one state; the tests at the end replay paths
//! through it.
//!
//! Start at [`Protocol`]: [`Protocol::new`] builds the model from a [`Config`], and
//! `Protocol::checker()` (stateright's [`Model`](stateright::Model) trait) explores it. `make test` runs a bounded
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
//!   watch has listed; if it finds its Lease still there, it waits out its previous process as
//!   a member that died (below: `bound`, or each session that Lease listed reported) before
//!   serving, and releases no ring meanwhile. With [`Config::warm_up`] (the dispatcher as it
//!   is) it warms up first: its Lease, marked warming, makes it no member, until a step ends
//!   the warm-up with a member's renewal. A graceful stop, made only with nothing in flight,
//!   deletes the Lease with the drained mark (the others then drop it at once, and judge it
//!   released even if a new process of it, warming up, writes the Lease again before they
//!   judge; a member's write, or a deletion without the mark, ends that).
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
//!   (`Slice::may_serve_more_than`). The real dispatcher spares that list where its groups
//!   kept up with every served key while it handed nothing out (`Slice::kept_since`); the
//!   model lists at every growth, and so covers the list, not its sparing.
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
//!   left to the tests against the API server. A group that lists the owners itself
//!   (`Config::owners_listed`) queues a served key only once the dispatcher knows its object,
//!   and leaves a key it does not know to the list that shows it; a change of an owned object
//!   whose owner does not exist then asks for no reconcile.
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
//!   session there, ended to a dispatcher that is up, that one itself included (a restarted
//!   dispatcher asks about its previous process's sessions) ([`Action::Report`]: a superset of
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

mod config;
mod enabled;
mod membership;
mod model;
mod properties;
mod queues;
pub mod real;
pub mod replay;
mod state;
mod steps;

pub use config::{Budget, Closes, Config, DELIVERIES, Deletions, Takeover, Timing, Variant, Views};
pub use state::{Action, Dispatcher, Key, Lease, Message, Replica, ReplicaSession, Run, State};
use state::{Seen, bit, dispatcher_name, has, send_ack};

use kube_dispatch_proto::{RequestKey, Ring};

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
            releases: 0,
            warming: false,
            stale: 0,
            gone: 0,
            tomb: 0,
            nameless: 0,
            objectless: 0,
            held_deletions: 0,
            held_index: 0,
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
            | Action::IndexHeld(_)
            | Action::Warm(_)
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
                let ready = disp.ready();
                disp.settled.is_none() || keys == ready & self.takeable(usize::from(r))
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
