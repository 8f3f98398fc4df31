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
    key::KeyRef,
    leases::{LeaseState, Observations, Peer},
    queue::{Change, DeliveryId, GroupQueue, KeyState, Observed, Outcome, QueueConfig, SessionId},
    recent_deletions::RecentDeletionsConfig,
    transit::{GroupEvent, Origin, Transit},
};
use kube_dispatch_proto::{Ring, lease::ring_id, v1::Reason};

use crate::{Action, Key, Lease, Message, Protocol, State, Takeover, bit, dispatcher_name, has};

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
    fn new(identity: &str, bound: Duration, now: Instant, died: bool) -> Self {
        Self {
            observations: Observations::default(),
            handover: Handover::new(identity, bound, now, died),
            renewed: None,
            live: BTreeMap::new(),
            slice: None,
            groups: Vec::new(),
            sessions: Vec::new(),
            deliveries: BTreeMap::new(),
            answered: Vec::new(),
            asked: false,
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
            real.processes[d] = Some(real.process(d, now, false));
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

    fn process(&self, d: usize, now: Instant, died: bool) -> Process {
        let mut p = Process::new(&dispatcher_name(d), self.bound, now, died);
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

    /// Writes dispatcher `d`'s Lease (a renewal, `answered` or not) releasing `released`, with
    /// the sessions and reports the model's write lists (`written`), and shows the write to
    /// every dispatcher whose Lease watch runs.
    fn write(&mut self, d: usize, released: Option<u8>, answered: bool, written: &Lease) {
        self.write_marked(d, released, answered, false, written);
    }

    /// The tags of the model's session bits (`Protocol::sid`), each with the dispatcher it names:
    /// of the session with that id opened last (the model forgets the reports of an id's
    /// earlier session when it is used again).
    fn tags(&self, bits: u32) -> Vec<(usize, u64)> {
        let n = self.processes.len();
        (0..32usize)
            .filter(|i| bits & (1 << i) != 0)
            .map(|i| {
                let (r, d, generation) = (i / 2 / n, i / 2 % n, i % 2);
                let opened = self.opens[r][d];
                let nth = if usize::try_from(opened % 2) == Ok(generation) {
                    opened
                } else {
                    opened.saturating_sub(1)
                };
                (d, nth << 8 | u64::try_from(i).unwrap_or_default())
            })
            .collect()
    }

    /// As [`Real::write`], with the drained mark when `drained`.
    fn write_marked(
        &mut self,
        d: usize,
        released: Option<u8>,
        answered: bool,
        drained: bool,
        written: &Lease,
    ) {
        let now = self.now();
        // What the writer had seen (`membership::run` writes it beside the release).
        let seen = self.processes[d]
            .as_ref()
            .map_or(self.rv, |p| p.observations.newest());
        self.rv += 1;
        let state = LeaseState {
            holder: dispatcher_name(d),
            renew_time: self.rv.to_string(),
            duration: self.duration,
            released: released.map(|m| self.id(m)),
            released_after: released.map(|_| seen),
            resource_version: self.rv,
            drained,
            sessions: written.known.then(|| {
                self.tags(written.sessions)
                    .into_iter()
                    .map(|(_, tag)| tag)
                    .collect()
            }),
            ended: self.tags(written.ended).into_iter().fold(
                BTreeMap::new(),
                |mut ended, (d, tag)| {
                    ended
                        .entry(dispatcher_name(d))
                        .or_insert_with(BTreeSet::new)
                        .insert(tag);
                    ended
                },
            ),
            ..LeaseState::default()
        };
        self.leases[d] = Some(state.clone());
        for p in self.processes.iter_mut().flatten() {
            p.observations
                .observe(&dispatcher_name(d), state.clone(), now);
        }
        if answered && let Some(p) = &mut self.processes[d] {
            p.renewed = Some(now);
            p.handover.renewed(now + self.duration);
        }
    }

    /// Deletes dispatcher `d`'s Lease, with the drained mark or not, in every watch's sight.
    fn delete(&mut self, d: usize, drained: bool) {
        let now = self.now();
        let Some(mut last) = self.leases[d].take() else {
            return;
        };
        last.drained = drained;
        for p in self.processes.iter_mut().flatten() {
            p.observations
                .deleted(&dispatcher_name(d), Some(last.clone()), now);
        }
    }

    /// Dispatcher `d` judges a whole view and updates its gate (as the membership loop does
    /// each round).
    fn judge(&mut self, d: usize) {
        let (now, grace, duration) = (self.now(), self.grace, self.duration);
        let objects = self.objects();
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        p.live = p.handover.judge(&mut p.observations, grace, now).0;
        let fenced = p.renewed.is_none_or(|at| now >= at + duration);
        let slice = Arc::new(
            p.handover
                .update(&p.live, p.observations.newest(), fenced, now),
        );
        let before = p.slice.replace(slice.clone());
        // Each group trims its queue to the slice (`Group::trim_to_slice`).
        for group in &mut p.groups {
            group.transit.trim(&slice, &mut group.queue, now);
        }
        // Its watch lists beside its stream when the keys served may have grown, and the list
        // shows each group the served keys it does not know (`WatchTask`, `GroupEvent::Listed`).
        let grows = before.map_or(slice.settled.is_some(), |b| slice.may_serve_more_than(&b));
        if grows {
            for group in &mut p.groups {
                for (key, object) in &objects {
                    if let Some(object) = object {
                        let (key, object, epoch) = (KeyRef::new(key), object.clone(), 0);
                        group.record(&slice, GroupEvent::Listed { key, object, epoch }, now);
                    }
                }
            }
        }
        // Once its groups serve, each asks its live peers for the deletions they remember of
        // its keys (`peer::fetch_recent_deletions`, per group), and records each as its watch
        // would.
        if p.asked || slice.settled.is_none() {
            return;
        }
        p.asked = true;
        let identity = dispatcher_name(d);
        let peers: Vec<String> = p.live.keys().filter(|m| **m != identity).cloned().collect();
        for g in 0..self.model.config.groups {
            let mut remembered = Vec::new();
            for (x, q) in self.processes.iter_mut().enumerate() {
                if let Some(q) = q
                    && peers.contains(&dispatcher_name(x))
                {
                    remembered.extend(q.groups[g].transit.recent_deletions_owned_by(
                        &slice.ring,
                        &identity,
                        now,
                    ));
                }
            }
            remembered.sort_unstable();
            remembered.dedup();
            if let Some(p) = &mut self.processes[d] {
                for key in remembered {
                    let (key, change) = (KeyRef::new(&key), Change::deletion());
                    p.groups[g].record(&slice, GroupEvent::Deleted { key, change }, now);
                }
            }
        }
    }

    /// Every key with its object as a list shows it now (`None` once deleted).
    fn objects(&self) -> Vec<(String, Option<Observed>)> {
        (0..self.keys.len())
            .map(|k| {
                (
                    self.keys[k].clone(),
                    self.exists[k].then(|| self.observed(k)),
                )
            })
            .collect()
    }

    /// An object is deleted: every dispatcher that reaches the API server records the deletion
    /// as `Group::apply` does (`GroupEvent::Deleted`).
    fn delete_object(&mut self, k: usize, model: &State) {
        let now = self.now();
        self.versions[k] += 1;
        self.exists[k] = false;
        let change = Change {
            reason: Reason::Deleted,
            resource_version: self.versions[k].to_string(),
            uid: self.uid(k),
            body: None,
            deleted: true,
            trace: None,
        };
        let key = self.keys[k].clone();
        for (d, p) in self.processes.iter_mut().enumerate() {
            if let Some(p) = p
                && model.dispatchers[d].api
                && let Some(slice) = &p.slice
            {
                for group in &mut p.groups {
                    let key = KeyRef::new(&key);
                    let change = change.clone();
                    group.record(slice, GroupEvent::Deleted { key, change }, now);
                }
            }
        }
    }

    /// An object changes: every dispatcher that reaches the API server sees it on its watch, and
    /// records it in its group's queue by the rules of `FanOut::publish` and `Transit::record`
    /// (`GroupEvent::Exists`; a key owned elsewhere: `GroupEvent::ExistsElsewhere`).
    fn change(&mut self, k: usize, model: &State) {
        let now = self.now();
        self.versions[k] += 1;
        if !self.exists[k] {
            // Created again, under a new uid.
            self.exists[k] = true;
            self.generations[k] += 1;
        }
        let object = self.observed(k);
        let key = self.keys[k].clone();
        for (d, p) in self.processes.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            let Some(slice) = &p.slice else { continue };
            if !model.dispatchers[d].api {
                continue;
            }
            let key = KeyRef::new(&key);
            for group in &mut p.groups {
                let (object, epoch) = (object.clone(), 0);
                let elsewhere = slice.owned_elsewhere(key);
                let event = GroupEvent::exists(key, object, (epoch, Origin::Stream), elsewhere);
                group.record(slice, event, now);
            }
        }
    }

    /// An object owned by the object of key `k` changes: every dispatcher that reaches the API
    /// server tells the owner's key as `Transit::record` does (`GroupEvent::OwnedChanged`).
    fn owned_change(&mut self, k: usize, model: &State) {
        let now = self.now();
        let key = self.keys[k].clone();
        for (d, p) in self.processes.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            let Some(slice) = &p.slice else { continue };
            if !model.dispatchers[d].api {
                continue;
            }
            let key = KeyRef::new(&key);
            for group in &mut p.groups {
                let origin = Origin::Stream;
                group.record(slice, GroupEvent::OwnedChanged { key, origin }, now);
            }
        }
    }

    /// Dispatcher `d` answers the held poll of replica `r`: the keys its group's queue hands
    /// out, if it hands out anything now (`Group::take`), as the mask of the model's `Answer`.
    pub fn answer(&mut self, d: usize, r: usize) -> u8 {
        let now = self.now();
        let keys = self.keys.clone();
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return 0;
        };
        p.answered.clear();
        let (Some(slice), Some(session)) = (&p.slice, p.sessions[r]) else {
            return 0;
        };
        if !slice.hands_out(now) {
            return 0;
        }
        let mut mask = 0;
        for delivery in p.groups[g].queue.take(session, keys.len(), now) {
            if let Some(k) = keys.iter().position(|key| *key == delivery.key) {
                let e = g * keys.len() + k;
                mask |= bit(e);
                p.answered.push((e, delivery.id));
            }
        }
        mask
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
                self.ticks += 1;
                let unanswered = match action {
                    Action::TickRenewalUnanswered(d) => Some(usize::from(d)),
                    _ => None,
                };
                // Backoffs begun last tick ended by now; deliveries due at this tick are the
                // model's `Void` steps after it, so the timers fire a quarter tick early.
                let backoffs_ended = self.now() - TICK / 4;
                for p in self.processes.iter_mut().flatten() {
                    for group in &mut p.groups {
                        group.queue.advance(backoffs_ended);
                    }
                }
                // As the model's tick: each dispatcher in turn judges, then renews with what
                // its queue (the model's) and its gate (the code's) let it release.
                for d in 0..self.processes.len() {
                    if self.processes[d].is_none() {
                        continue;
                    }
                    self.judge(d);
                    let now = self.now();
                    // What its queues let it release (`GroupTable::release_ring`): each group
                    // trimmed to the slice and asked whether a key that moved away is queued
                    // or in flight there; the model's must agree.
                    let queued = self.processes[d].as_mut().and_then(|p| {
                        let slice = p.slice.clone()?;
                        let released = slice.released(
                            p.groups
                                .iter_mut()
                                .map(|g| g.transit.trim(&slice, &mut g.queue, now).1),
                        );
                        let id = released?;
                        let m = (0..self.ids.len()).find(|m| self.ids[*m] == id);
                        m.and_then(|m| u8::try_from(m).ok())
                    });
                    let modelled = model.queue_release(&after.dispatchers[d], d);
                    if queued != modelled {
                        return Err(format!(
                            "dispatcher-{d}'s queue releases {queued:?} in the code, {modelled:?} in the model"
                        ));
                    }
                    let released = self.processes[d].as_ref().and_then(|p| {
                        let id = queued.map(|m| self.id(m));
                        let id = if model.config.withhold {
                            p.handover.releasable(id, now)
                        } else {
                            id
                        };
                        id.and(queued)
                    });
                    self.write(d, released, unanswered != Some(d), &after.leases[d]);
                }
            }
            Action::Crash(d) => self.processes[usize::from(d)] = None,
            Action::Restart(d) => {
                let d = usize::from(d);
                let now = self.now();
                // A Lease of its own still there was not released: its previous process died.
                let predecessor_died = self.leases[d].is_some();
                let mut process = self.process(d, now, predecessor_died);
                // Its Lease watch's first list.
                for (x, lease) in self.leases.iter().enumerate() {
                    if let Some(state) = lease {
                        process
                            .observations
                            .observe(&dispatcher_name(x), state.clone(), now);
                    }
                }
                self.processes[d] = Some(process);
                self.write(d, None, true, &after.leases[d]);
            }
            Action::Stop(d) => {
                // The drain's last renewal writes the drained mark, then the Lease is deleted
                // (`membership::run`).
                let d = usize::from(d);
                let released = self.leases[d].as_ref().and_then(|l| l.released.clone());
                let released = released.and_then(|id| {
                    (0..1u8 << self.processes.len()).find(|m| self.ids[usize::from(*m)] == id)
                });
                self.write_marked(d, released, false, true, &before.leases[d]);
                self.processes[d] = None;
                self.delete(d, true);
            }
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

    /// Replica `r` opens a session on dispatcher `d`, replacing the one it had there, whose
    /// keys in flight are held until it would have expired (`Group::add_session`).
    fn open(&mut self, r: usize, d: usize, before: &State, after: &State) {
        if after.dispatchers[d].sessions[r].is_none() {
            return;
        }
        self.opens[r][d] += 1;
        let now = self.now();
        let id = self.next_session;
        self.next_session += 1;
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let queue = &mut p.groups[g].queue;
        if let (Some(old), Some(left)) = (p.sessions[r], before.dispatchers[d].sessions[r]) {
            queue.remove_session_holding(old, now + TICK * u32::from(left));
        }
        queue.add_session(id, &replica_name(r));
        p.sessions[r] = Some(id);
    }

    /// Records which real delivery each key of the model's answer is.
    fn answered(&mut self, r: usize, d: usize, after: &State) -> Result<(), String> {
        let Some(p) = &mut self.processes[d] else {
            return Ok(());
        };
        for (k, id) in std::mem::take(&mut p.answered) {
            let Key::InFlight {
                replica, delivery, ..
            } = after.dispatchers[d].keys[k]
            else {
                return Err(format!(
                    "dispatcher-{d} handed key {k} out to replica-{r}, which the model did not"
                ));
            };
            debug_assert_eq!(usize::from(replica), r);
            p.deliveries.insert((k, delivery), id);
        }
        Ok(())
    }

    /// An ack of replica `r` reaches dispatcher `d`, if the model's dispatcher takes calls of
    /// that session.
    fn ack(&mut self, r: usize, d: usize, k: u8, before: &State) {
        let disp = &before.dispatchers[d];
        if !disp.up || disp.sessions[r].is_none() || disp.closed[r] {
            return;
        }
        let delivery = before.messages.iter().find_map(|m| match *m {
            Message::Ack {
                replica,
                dispatcher,
                key,
                delivery,
            } if (usize::from(replica), usize::from(dispatcher), key) == (r, d, k) => {
                Some(delivery)
            }
            _ => None,
        });
        let now = self.now();
        let (g, _) = self.entry(usize::from(k));
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let (Some(session), Some(delivery)) = (p.sessions[r], delivery) else {
            return;
        };
        let id = p
            .deliveries
            .get(&(usize::from(k), delivery))
            .copied()
            .unwrap_or(0);
        p.groups[g].queue.ack(session, id, Outcome::Success, now);
    }

    /// CloseSession of replica `r` reaches dispatcher `d`: its keys in flight are held until
    /// the session would have expired (`Group::close_session`), or go back at once in the
    /// model's old variant.
    fn close(&mut self, r: usize, d: usize, model: &Protocol, before: &State) {
        let disp = &before.dispatchers[d];
        let Some(left) = disp.sessions[r] else { return };
        if !disp.up || disp.closed[r] {
            return;
        }
        let now = self.now();
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let Some(session) = p.sessions[r] else { return };
        let queue = &mut p.groups[g].queue;
        match model.config.closes {
            crate::Closes::Hold => {
                queue.remove_session_holding(session, now + TICK * u32::from(left));
            }
            crate::Closes::Release => {
                queue.remove_session(session);
                p.sessions[r] = None;
            }
        }
    }

    /// Dispatcher `d` expires the session of replica `r` (a closed one's held keys go back at
    /// their timer).
    fn expire(&mut self, r: usize, d: usize, before: &State) {
        let now = self.now();
        let closed = before.dispatchers[d].closed[r];
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let queue = &mut p.groups[g].queue;
        if let Some(session) = p.sessions[r].take()
            && !closed
        {
            queue.remove_session(session);
        }
        queue.advance(now);
    }

    /// Whether every Lease, and every dispatcher's ring, settled ring, wait for the dead and
    /// whether it hands out keys now, are the model's.
    fn compare(&self, state: &State) -> Result<(), String> {
        let now = self.now();
        for (d, lease) in state.leases.iter().enumerate() {
            let real = self.leases[d].as_ref().map(|l| l.released.clone());
            let modelled = lease.exists.then(|| lease.released.map(|m| self.id(m)));
            if real != modelled {
                return Err(format!(
                    "Lease dispatcher-{d}: (exists, released) {modelled:?} in the model, {real:?} in the code"
                ));
            }
        }
        for (d, disp) in state.dispatchers.iter().enumerate() {
            let process = self.processes[d].as_ref();
            if process.is_some() != disp.up {
                return Err(format!(
                    "dispatcher-{d}: up {} in the model, {} in the code",
                    disp.up,
                    process.is_some()
                ));
            }
            let Some(p) = process else { continue };
            let Some(slice) = &p.slice else {
                // Not judged yet since it started: nothing served.
                if disp.settled.is_some() {
                    return Err(format!("dispatcher-{d} serves in the model before judging"));
                }
                continue;
            };
            let real = (
                mask(slice.ring.members()),
                slice.settled.as_ref().map(|r| mask(r.members())),
                p.handover.waits_on_dead(now),
                slice.hands_out(now),
            );
            let modelled = (
                disp.ring,
                disp.settled,
                disp.died.iter().any(|w| *w > 0),
                disp.settled.is_some() && disp.own_lease > 0,
            );
            if real != modelled {
                return Err(format!(
                    "dispatcher-{d}: (ring, settled, waits on the dead, hands out) {modelled:?} in the model, {real:?} in the code"
                ));
            }
            for (k, modelled) in disp.keys.iter().enumerate() {
                let real = self.key(p, k, now);
                if !real.matches(*modelled) {
                    return Err(format!(
                        "dispatcher-{d}, key {k}: {modelled:?} in the model, {real:?} in the code"
                    ));
                }
                let (g, key) = self.entry(k);
                let deleted = p.groups[g]
                    .queue
                    .key_status(key, now)
                    .is_some_and(|s| s.deleted);
                if deleted != has(disp.gone, k) {
                    return Err(format!(
                        "dispatcher-{d}, key {k}: deletion recorded {} in the model, {deleted} in the code",
                        has(disp.gone, k)
                    ));
                }
            }
            for (g, group) in p.groups.iter().enumerate() {
                let figures = group.transit.figures();
                let figures = (figures.held, figures.remembered);
                let of_group = self.model.of_group(g);
                let modelled = (
                    (disp.held_deletions & of_group).count_ones() as usize,
                    (disp.recent & of_group).count_ones() as usize,
                );
                if figures != modelled {
                    return Err(format!(
                        "dispatcher-{d}, group {g}: deletions (held, remembered) {modelled:?} in the model, {figures:?} in the code"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Where the model's queue entry `e` stands in its group's queue at `p`.
    fn key(&self, p: &Process, e: usize, now: Instant) -> RealKey {
        let (g, key) = self.entry(e);
        let queue = &p.groups[g].queue;
        let Some(status) = queue.key_status(key, now) else {
            return RealKey::Absent;
        };
        match status.state {
            KeyState::Idle => RealKey::Idle,
            KeyState::Queued | KeyState::BackingOff | KeyState::RequeueAfter => RealKey::Ready {
                leaving: queue.is_leaving(key),
            },
            KeyState::InFlight => RealKey::InFlight {
                replica: status.replica,
                dirty: status.changed_in_flight,
                leaving: status.leaving,
            },
        }
    }
}

fn replica_name(r: usize) -> String {
    format!("replica-{r}")
}

/// A key as the real queue holds it, in the model's terms.
#[derive(Debug)]
enum RealKey {
    Absent,
    Idle,
    /// Ready, or waiting for a backoff (the model hands out ready keys at any time, so it may
    /// hand out one the code still holds back: the code's choice is one of the model's).
    Ready {
        leaving: bool,
    },
    /// In flight on the session of `replica`; `None` when held after its session was closed or
    /// replaced.
    InFlight {
        replica: Option<String>,
        dirty: bool,
        leaving: bool,
    },
}

impl RealKey {
    fn matches(&self, modelled: Key) -> bool {
        match (self, modelled) {
            (Self::Absent, Key::Absent) | (Self::Idle, Key::Idle) => true,
            (Self::Ready { leaving }, Key::Ready { leaving: m }) => *leaving == m,
            (
                Self::InFlight {
                    replica,
                    dirty,
                    leaving,
                },
                Key::InFlight {
                    replica: r,
                    dirty: md,
                    leaving: ml,
                    ..
                },
            ) => {
                replica
                    .as_ref()
                    .is_none_or(|name| *name == replica_name(usize::from(r)))
                    && *dirty == md
                    && *leaving == ml
            }
            _ => false,
        }
    }
}

/// A small deterministic random generator (xorshift), so a walk is replayed by its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % u64::try_from(n).unwrap_or(1)).unwrap_or(0)
    }
}

/// What a lock-step walk reached.
#[derive(Debug, Default, Clone, Copy)]
pub struct Walked {
    /// Steps taken.
    pub steps: usize,
    /// Lease deletions without the drained mark.
    pub deletions: usize,
    /// Handovers completed (a dispatcher's settled ring changed to a ring it had not settled).
    pub handovers: usize,
    /// Answers that handed out keys.
    pub deliveries: usize,
    /// Objects deleted.
    pub object_deletions: usize,
    /// Deletions queued from a transit's memory (held through a handover, or remembered as
    /// owned elsewhere until the key moved here).
    pub deletions_in_transit: usize,
    /// Deletions of an earlier object handed out before the object created again under its
    /// name (tombstones).
    pub tombstones: usize,
    /// Lease renewals that released no ring because a group after the first still held a key
    /// that moved away while the first group had handed over.
    pub waits_for_group: usize,
    /// Members that died whose wait ended before the bound, every session their Lease listed
    /// having been reported ended.
    pub takeovers_by_reports: usize,
}

/// Walks `steps` random steps of `model` from its initial state (seeded by `seed`), stepping the
/// real code alongside and comparing after each. Partial Lease views are not taken; API cuts
/// are not stepped, so a budget with cuts fails the walk. Where the model leaves a choice the
/// code makes, the walk follows the code: an answer hands out what the real queue hands out,
/// and sessions expire and deliveries run out at the tick they are due (the queue's timers),
/// not some steps later.
pub fn walk(model: &Protocol, seed: u64, steps: usize) -> Result<Walked, Divergence> {
    use stateright::Model;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut state = model.init_states().remove(0);
    let mut real = Real::new(model, &state);
    let mut path = Vec::new();
    let mut walked = Walked::default();
    if let Err(what) = real.compare(&state) {
        return Err(Divergence { path, what });
    }
    while walked.steps < steps {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        actions.retain(|a| {
            !matches!(
                a,
                Action::Glimpse(..) | Action::Void(..) | Action::Expire(..)
            )
        });
        // One answer per held poll: its keys are the code's.
        actions.dedup_by(|a, b| match (*a, *b) {
            (Action::Answer(r, d, _), Action::Answer(s, e, _)) => (r, d) == (s, e),
            _ => false,
        });
        if actions.is_empty() {
            break;
        }
        let mut action = actions[rng.below(actions.len())];
        if let Action::Answer(r, d, _) = action {
            // A session the dispatcher's Lease does not list yet is handed nothing (mirrored:
            // the dispatcher's listing of its sessions is not core code).
            let unlisted = matches!(
                model.config.takeover,
                Takeover::Reports | Takeover::ReportFirst
            ) && !has(state.dispatchers[usize::from(d)].listed, r);
            let keys = if unlisted {
                0
            } else {
                real.answer(usize::from(d), usize::from(r))
            };
            action = Action::Answer(r, d, keys);
        }
        let mut taken = vec![action];
        let Some(mut next) = model.next_state(&state, action) else {
            if matches!(action, Action::Answer(..)) {
                path.push(action);
                return Err(Divergence {
                    path,
                    what: "the code hands out keys the model does not let it".into(),
                });
            }
            continue;
        };
        if matches!(
            action,
            Action::Tick | Action::Lag(_) | Action::TickRenewalUnanswered(_)
        ) {
            taken.extend(due(&next));
        }
        let mut before = state.clone();
        let batch = taken.len();
        for (i, action) in taken.into_iter().enumerate() {
            if i > 0 {
                before = next.clone();
                match model.next_state(&next, action) {
                    Some(after) => next = after,
                    None if i + 1 == batch => {
                        if let Err(what) = real.compare(&next) {
                            return Err(Divergence { path, what });
                        }
                        continue;
                    }
                    None => continue,
                }
            }
            path.push(action);
            walked.steps += 1;
            if matches!(action, Action::DeleteLease(_)) {
                walked.deletions += 1;
            }
            if matches!(action, Action::Answer(_, _, keys) if keys != 0) {
                walked.deliveries += 1;
            }
            if matches!(action, Action::Delete(_)) {
                walked.object_deletions += 1;
            }
            if let Action::Answer(_, d, keys) = action {
                walked.tombstones +=
                    usize::from(before.dispatchers[usize::from(d)].tomb & keys != 0);
            }
            walked.deletions_in_transit += before
                .dispatchers
                .iter()
                .zip(&next.dispatchers)
                .filter(|(a, b)| {
                    (a.held_deletions | a.recent) & !(b.held_deletions | b.recent) & b.gone != 0
                })
                .count();
            if matches!(
                action,
                Action::Tick | Action::Lag(_) | Action::TickRenewalUnanswered(_)
            ) {
                walked.waits_for_group += next
                    .dispatchers
                    .iter()
                    .enumerate()
                    .filter(|(d, disp)| model.waits_for_a_later_group(disp, *d))
                    .count();
            }
            // A wait ends early only by reports: ticks count it down one at a time.
            walked.takeovers_by_reports += before
                .dispatchers
                .iter()
                .zip(&next.dispatchers)
                .map(|(a, b)| {
                    a.died
                        .iter()
                        .zip(&b.died)
                        .filter(|(was, is)| **was > 1 && **is == 0)
                        .count()
                })
                .sum::<usize>();
            walked.handovers += before
                .dispatchers
                .iter()
                .zip(&next.dispatchers)
                .filter(|(a, b)| b.settled.is_some() && a.settled != b.settled)
                .count();
            // Timeouts due at one tick fire together in the code: compared once all are taken.
            let last = i + 1 == batch;
            let result = if last {
                real.step(model, action, &before, &next)
            } else {
                real.apply(model, action, &before, &next)
            };
            if std::env::var_os("KD_MODEL_TRACE").is_some() {
                let now = real.now();
                for (d, disp) in next.dispatchers.iter().enumerate() {
                    let keys: Vec<String> = (0..disp.keys.len())
                        .map(|k| {
                            let r = real.processes[d].as_ref().map(|p| real.key(p, k, now));
                            format!("{:?} / {:?}", disp.keys[k], r)
                        })
                        .collect();
                    eprintln!(
                        "{action:?} d{d}: ring {:b} settled {:?} real {:?}: {keys:?}",
                        disp.ring,
                        disp.settled,
                        real.processes[d]
                            .as_ref()
                            .and_then(|p| p.slice.as_ref())
                            .map(|s| (
                                s.ring.members().to_vec(),
                                s.settled.as_ref().map(|r| r.members().to_vec())
                            ))
                    );
                }
            }
            if let Err(what) = result {
                return Err(Divergence { path, what });
            }
        }
        state = next;
    }
    Ok(walked)
}

/// The timeouts due in `state`, as the code's timers fire them at the tick: deliveries past
/// their deadline first, then sessions past their ttl.
fn due(state: &State) -> Vec<Action> {
    let n = |x: usize| u8::try_from(x).unwrap_or_default();
    let mut due = Vec::new();
    for (d, disp) in state.dispatchers.iter().enumerate() {
        for (k, key) in disp.keys.iter().enumerate() {
            if matches!(key, Key::InFlight { deadline: 0, .. }) {
                due.push(Action::Void(n(d), n(k)));
            }
        }
    }
    for (d, disp) in state.dispatchers.iter().enumerate() {
        for (r, session) in disp.sessions.iter().enumerate() {
            if *session == Some(0) {
                due.push(Action::Expire(n(d), n(r)));
            }
        }
    }
    due
}
