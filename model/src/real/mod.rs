//! The real code stepped in lock-step with the model: what each dispatcher of a run makes of
//! the Leases ([`kube_dispatch_core::leases::Observations`]), its handover gate
//! ([`kube_dispatch_core::handover::Handover`]: `judge`, `update`, `waits_on_dead`), and each
//! controller group's queue and transit there ([`GroupQueue`], [`Transit`]: sessions
//! opened, replaced, closed and expired, keys handed out, acknowledged and run out, changes
//! recorded, the queue trimmed to each slice and filled by the list a growing slice brings),
//! and the ring its groups let it release ([`Slice::released`]), fed the Lease writes and
//! deletions, object changes and calls of the model's run on a virtual clock, one second a
//! tick.
//!
//! After every step, every Lease's release, each dispatcher's ring, settled ring, whether it
//! waits out a member that died, whether it hands out keys now ([`Slice::hands_out`]), the ring
//! its queue lets it release, and where every key stands in its queue (absent, idle, ready,
//! in flight to which replica, changed meanwhile, on its way out) must be the model's. Where
//! the model leaves a choice the code makes, the walk follows the code: an answer hands out what
//! the real queue hands out (a key waiting for a backoff counts as ready in the model, which
//! may hand it out sooner), and timeouts fire at the tick they are due. A change to the code
//! that the model does not make shows as a divergence with the path that leads to it, and the
//! properties the checker proves of the model then say nothing of the code.
//!
//! What is mirrored rather than called: which sessions a dispatcher lists on its Lease and
//! reports it carries (the model's write is given to the code's Observations), and that it
//! hands keys only to sessions a write listed; the code's gate then judges the Leases itself
//! (`Handover::judge` ends the wait for a member that died by reports).
//! Also mirrored: which event the dispatcher's watch makes of an object
//! (`FanOut::publish`: `GroupEvent::Exists`, or `ExistsElsewhere` by `Slice::owned_elsewhere`;
//! what the event then means is `Transit::record`, called), and the loop of
//! `GroupTable::release_ring` that asks each group, since they live with the I/O in the dispatcher
//! crate.
//!
//! What is not stepped: the membership loop's I/O around `judge` (the Lease watch's list, the
//! renewals' requests), partial views, and API cuts. Cut off, the code goes on judging the
//! Leases as it last saw them (each ageing out of its view), while the model's dispatcher
//! judges nothing until it is back and then reads the Leases as they are: stepping cuts would
//! need the model to keep each dispatcher's own copy of every Lease. Walks with cuts did find
//! one difference worth fixing before they were set aside: a re-list counted a Lease already
//! mourned as a new death, and restarted the wait.
//!
//! `KD_MODEL_TRACE=1` prints every step of a walk with each dispatcher's keys in the model and
//! in the code, to read a divergence.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use kube_dispatch_core::{
    backoff::Backoff,
    handover::{Handover, Slice},
    leases::{LeaseState, Observations, Peer},
    queue::{DeliveryId, GroupQueue, Observed, QueueConfig, SessionId},
    recent_deletions::RecentDeletionsConfig,
    transit::{GroupEvent, Transit},
};
use kube_dispatch_proto::{Ring, lease::ring_id};

use crate::{Action, Protocol, State, bit, dispatcher_name, has};

mod compare;
mod leases;
mod objects;
mod sessions;
mod walk;

pub use walk::{Walked, walk, walks};

/// A tick of the model on the real code's clock.
pub const TICK: Duration = Duration::from_secs(1);

/// What a group remembers of deletions of keys owned elsewhere (the model deletes nothing).
const RECENT: RecentDeletionsConfig = RecentDeletionsConfig {
    window: Duration::from_secs(60),
    capacity: 64,
};

/// One dispatcher process as the real code holds it.
#[derive(Debug)]
struct Process {
    observations: Observations,
    handover: Handover,
    /// Start of its last renewal the API server answered.
    renewed: Option<Instant>,
    /// The live members of its last judged view.
    live: BTreeMap<String, Peer>,
    slice: Option<Arc<Slice>>,
    /// Per controller group of the model: its queue and transit, there from the start.
    groups: Vec<GroupState>,
    /// Per replica: its session here (in its group's queue).
    sessions: Vec<Option<SessionId>>,
    /// The real delivery of each (queue entry, model delivery number) handed out here.
    deliveries: BTreeMap<(usize, u8), DeliveryId>,
    /// Entries the last [`Real::answer`] handed out, with their deliveries.
    answered: Vec<(usize, DeliveryId)>,
    /// Its groups have asked their peers for the deletions they remember of their keys.
    asked: bool,
    /// Warming up: its Lease is marked warming, and its gate is held as if fenced
    /// (`membership::publish`).
    warming: bool,
}

/// One controller group's state at a dispatcher (`Group`'s): its queue and its transit.
#[derive(Debug)]
struct GroupState {
    queue: GroupQueue,
    transit: Transit,
}

impl GroupState {
    /// Records an event as `Group::record` does ([`Transit::record`]).
    fn record(&mut self, slice: &Slice, event: GroupEvent<'_>, now: Instant) {
        self.transit.record(slice, &mut self.queue, event, now);
    }
}

impl Process {
    /// A process of dispatcher `identity` started at `now`; `predecessor`: the sessions its
    /// previous process's unreleased Lease listed, if that one died (`None` within: unknown).
    fn new(
        identity: &str,
        bound: Duration,
        now: Instant,
        predecessor: Option<Option<BTreeSet<u64>>>,
    ) -> Self {
        let died = predecessor.is_some();
        Self {
            observations: Observations::default(),
            handover: Handover::new(identity, bound, now, died)
                .predecessor_listed(predecessor.flatten()),
            renewed: None,
            live: BTreeMap::new(),
            slice: None,
            groups: Vec::new(),
            sessions: Vec::new(),
            deliveries: BTreeMap::new(),
            answered: Vec::new(),
            asked: false,
            warming: false,
        }
    }
}

/// The real code of every dispatcher of a run, and the Leases on the API server.
#[derive(Debug)]
pub struct Real {
    base: Instant,
    ticks: u32,
    /// The last resourceVersion written.
    rv: u128,
    /// Per dispatcher: its Lease on the API server, if it exists.
    leases: Vec<Option<LeaseState>>,
    /// Per dispatcher: its process, while up.
    processes: Vec<Option<Process>>,
    duration: Duration,
    grace: Duration,
    bound: Duration,
    /// The ring id of every set of members (a bit each), computed once.
    ids: Vec<String>,
    /// The objects' request keys and versions (each change makes a new one).
    keys: Vec<String>,
    /// The model, for its placement of queue entries in groups and of replicas in groups.
    model: Protocol,
    versions: Vec<u64>,
    exists: Vec<bool>,
    /// Per key: how many times its object was created (its uid).
    generations: Vec<u32>,
    queue: QueueConfig,
    next_session: SessionId,
    replicas: usize,
    /// Per replica and dispatcher: the sessions it opened there. The model's session ids
    /// alternate between two; the Leases' tags tell every session apart, as real ids do.
    opens: Vec<Vec<u64>>,
}

/// Where the real code and the model part.
#[derive(Debug)]
pub struct Divergence {
    /// The steps that lead there.
    pub path: Vec<Action>,
    /// What differs.
    pub what: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} after {:?}", self.what, self.path)
    }
}

fn mask(members: &[String]) -> u8 {
    members
        .iter()
        .filter_map(|m| m.strip_prefix("dispatcher-")?.parse::<usize>().ok())
        .fold(0, |m, i| m | bit(i))
}

fn ring_of(m: u8, n: usize) -> Ring {
    Ring::new((0..n).filter(|i| has(m, *i)).map(dispatcher_name))
}

impl Real {
    /// The real code at the model's initial state: every dispatcher settled on the full ring.
    pub fn new(model: &Protocol, init: &State) -> Self {
        let t = model.config.timing;
        let n = model.config.dispatchers;
        let mut real = Self {
            base: Instant::now(),
            ticks: 0,
            rv: 0,
            leases: vec![None; n],
            processes: (0..n).map(|_| None).collect(),
            duration: TICK * u32::from(t.lease),
            // Live while changed within `lease + grace` ticks, strictly, as the model's
            // countdown: the code's bound is inclusive.
            grace: TICK * u32::from(t.grace) - Duration::from_nanos(1),
            bound: TICK * u32::from(t.bound),
            ids: (0..1u8 << n).map(|m| ring_id(&ring_of(m, n))).collect(),
            keys: model.keys.clone(),
            model: model.clone(),
            versions: vec![1; model.keys.len()],
            exists: vec![true; model.keys.len()],
            generations: vec![0; model.keys.len()],
            // A retry's backoff ends within half the tick it begins in, and each tick's first
            // step wakes the keys whose backoff ended, so that a key backing off is ready by the
            // time anything is judged (the model counts it as ready; a ring change trims a
            // ready key and a key backing off differently).
            queue: QueueConfig {
                max_reconcile_time: TICK * u32::from(t.max_reconcile),
                backoff: Backoff {
                    cap: TICK / 2,
                    ..Backoff::default()
                },
                ..QueueConfig::default()
            },
            next_session: 1,
            replicas: model.config.replicas,
            opens: vec![vec![0; n]; model.config.replicas],
        };
        let now = real.now();
        for d in 0..n {
            real.processes[d] = Some(real.process(d, now, None));
        }
        // Every Lease written, the full ring adopted, then written again with the ring
        // released: the gate opens on a ring whose every other member released it since.
        for d in 0..n {
            real.write(d, None, true, &init.leases[d]);
        }
        for d in 0..n {
            real.judge(d);
        }
        for d in 0..n {
            real.write(d, init.leases[d].released, true, &init.leases[d]);
        }
        for d in 0..n {
            real.judge(d);
        }
        real
    }

    fn process(
        &self,
        d: usize,
        now: Instant,
        predecessor: Option<Option<BTreeSet<u64>>>,
    ) -> Process {
        let mut p = Process::new(&dispatcher_name(d), self.bound, now, predecessor);
        p.sessions = vec![None; self.replicas];
        // Before its first judgement, a slice with no ring and nothing served, as the model's
        // fresh dispatcher has. (The dispatcher publishes a ring of itself alone, `serve.rs`:
        // until its first judgement, a few milliseconds, it records changes and deletions of
        // keys others own as its own, and that judgement moves them where they would be.)
        let slice =
            Arc::new(Slice::fixed(&dispatcher_name(d), Ring::new(Vec::<String>::new())).closed());
        p.groups = (0..self.model.config.groups)
            .map(|_| GroupState {
                queue: GroupQueue::new(self.queue),
                transit: Transit::new("model", slice.clone(), RECENT),
            })
            .collect();
        p.slice = Some(slice);
        p
    }

    /// The group and the request key of the model's queue entry `e`.
    fn entry(&self, e: usize) -> (usize, &str) {
        (self.model.group(e), &self.keys[self.model.object(e)])
    }

    /// The group of replica `r`.
    fn group_of(&self, r: usize) -> usize {
        self.model.group_of(r)
    }

    fn observed(&self, k: usize) -> Observed {
        Observed {
            resource_version: self.versions[k].to_string(),
            uid: self.uid(k),
            body: None,
            trace: None,
            fingerprint: None,
        }
    }

    fn uid(&self, k: usize) -> String {
        format!("uid-{k}-{}", self.generations[k])
    }

    fn id(&self, members: u8) -> String {
        self.ids[usize::from(members)].clone()
    }

    fn now(&self) -> Instant {
        self.base + TICK * self.ticks
    }

    /// Takes the model's step `action`, which led from `before` to `after`, then compares.
    pub fn step(
        &mut self,
        model: &Protocol,
        action: Action,
        before: &State,
        after: &State,
    ) -> Result<(), String> {
        self.apply(model, action, before, after)?;
        self.compare(after)
    }

    /// Takes the model's step `action`, which led from `before` to `after`.
    fn apply(
        &mut self,
        model: &Protocol,
        action: Action,
        before: &State,
        after: &State,
    ) -> Result<(), String> {
        match action {
            Action::Tick | Action::Lag(_) | Action::TickRenewalUnanswered(_) => {
                self.tick(model, action, after)?;
            }
            Action::Crash(d) => self.processes[usize::from(d)] = None,
            Action::Restart(d) => self.restart(usize::from(d), after),
            Action::Warm(d) => self.warm(model, usize::from(d), after)?,
            Action::Stop(d) => self.stop(usize::from(d), before),
            Action::DeleteLease(d) => self.delete(usize::from(d), false),
            Action::Change(k) => self.change(usize::from(k), after),
            Action::Delete(k) => self.delete_object(usize::from(k), after),
            Action::OwnedChange(k) => self.owned_change(usize::from(k), after),
            Action::Open(r, d) => self.open(usize::from(r), usize::from(d), before, after),
            Action::Answer(r, d, _) => self.answered(usize::from(r), usize::from(d), after)?,
            Action::AckArrives(r, d, k) => self.ack(usize::from(r), usize::from(d), k, before),
            Action::CloseArrives(r, d) => {
                self.close(usize::from(r), usize::from(d), model, before);
            }
            Action::Expire(d, r) => self.expire(usize::from(r), usize::from(d), before),
            Action::Void(d, e) => {
                let now = self.now();
                let (g, _) = self.entry(usize::from(e));
                if let Some(p) = &mut self.processes[usize::from(d)] {
                    p.groups[g].queue.advance(now);
                }
            }
            Action::Glimpse(..) => return Err("partial views are not stepped".into()),
            Action::CutApi(_) | Action::HealApi(_) => {
                return Err("API cuts are not stepped".into());
            }
            _ => {}
        }
        Ok(())
    }
}

fn replica_name(r: usize) -> String {
    format!("replica-{r}")
}
