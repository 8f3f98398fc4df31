//! The real membership code stepped in lock-step with the model: what each dispatcher of a run
//! makes of the Leases ([`kube_dispatch_core::leases::Observations`]) and its handover gate
//! ([`kube_dispatch_core::handover::Handover`]: `judge`, `update`, `waits_on_dead`), fed the
//! Lease writes and deletions of the model's run on a virtual clock, one second a tick.
//!
//! After every step, every Lease's release, and each dispatcher's ring, settled ring, whether
//! it waits out a member that died and whether it hands out keys now ([`Slice::hands_out`])
//! must be the model's. The ring it offers to release is the model's queue's; the code decides
//! whether to write it ([`Handover::releasable`]). A change to the code that the model does not make (a Lease deletion
//! taken for a release, a death missed, a release not withheld) shows as a divergence with the
//! path that leads to it, and the properties the checker proves of the model then say nothing
//! of the code.
//!
//! What is not stepped: the queue (the model's own), the membership loop's I/O around `judge`
//! (the Lease watch's list, the renewals' requests), partial views, and API cuts. Cut off, the
//! code goes on judging the Leases as it last saw them (each ageing out of its view), while the
//! model's dispatcher judges nothing until it is back and then reads the Leases as they are:
//! stepping cuts would need the model to keep each dispatcher's own copy of every Lease.
//! Walks with cuts did find one difference worth fixing before they were set aside: a re-list
//! counted a Lease already mourned as a new death, and restarted the wait.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use kube_dispatch_core::{
    handover::{Handover, Slice},
    leases::{LeaseState, Observations, Peer},
};
use kube_dispatch_proto::{Ring, lease::ring_id};

use crate::{Action, Protocol, State, bit, dispatcher_name, has};

/// A tick of the model on the real code's clock.
pub const TICK: Duration = Duration::from_secs(1);

/// One dispatcher process as the real code holds it.
#[derive(Debug)]
struct Process {
    observations: Observations,
    handover: Handover,
    /// Start of its last renewal the API server answered.
    renewed: Option<Instant>,
    /// The live members of its last judged view.
    live: BTreeMap<String, Peer>,
    slice: Option<Slice>,
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
        };
        let now = real.now();
        for d in 0..n {
            real.processes[d] = Some(Process {
                observations: Observations::default(),
                handover: Handover::new(&dispatcher_name(d), real.bound, now, false),
                renewed: None,
                live: BTreeMap::new(),
                slice: None,
            });
        }
        // Every Lease written, the full ring adopted, then written again with the ring
        // released: the gate opens on a ring whose every other member released it since.
        for d in 0..n {
            real.write(d, None, true);
        }
        for d in 0..n {
            real.judge(d);
        }
        for d in 0..n {
            real.write(d, init.leases[d].released, true);
        }
        for d in 0..n {
            real.judge(d);
        }
        real
    }

    fn id(&self, members: u8) -> String {
        self.ids[usize::from(members)].clone()
    }

    fn now(&self) -> Instant {
        self.base + TICK * self.ticks
    }

    /// Writes dispatcher `d`'s Lease (a renewal, `answered` or not) releasing `released`, and
    /// shows the write to every dispatcher whose Lease watch runs.
    fn write(&mut self, d: usize, released: Option<u8>, answered: bool) {
        self.write_marked(d, released, answered, false);
    }

    /// As [`Real::write`], with the drained mark when `drained`.
    fn write_marked(&mut self, d: usize, released: Option<u8>, answered: bool, drained: bool) {
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
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        p.live = p.handover.judge(&mut p.observations, grace, now).0;
        let fenced = p.renewed.is_none_or(|at| now >= at + duration);
        p.slice = Some(
            p.handover
                .update(&p.live, p.observations.newest(), fenced, now),
        );
    }

    /// Takes the model's step `action`, which led to `after`, then compares.
    pub fn step(&mut self, model: &Protocol, action: Action, after: &State) -> Result<(), String> {
        match action {
            Action::Tick | Action::Lag(_) | Action::TickRenewalUnanswered(_) => {
                self.ticks += 1;
                let unanswered = match action {
                    Action::TickRenewalUnanswered(d) => Some(usize::from(d)),
                    _ => None,
                };
                // As the model's tick: each dispatcher in turn judges, then renews with what
                // its queue (the model's) and its gate (the code's) let it release.
                for d in 0..self.processes.len() {
                    if self.processes[d].is_none() {
                        continue;
                    }
                    self.judge(d);
                    let now = self.now();
                    // The model's queue as it was when this dispatcher renewed (its state after
                    // the tick: no later step of the tick changes it), filtered by the gate.
                    let queued = model.queue_release(&after.dispatchers[d], d);
                    let released = self.processes[d].as_ref().and_then(|p| {
                        let id = queued.map(|m| self.id(m));
                        let id = if model.config.withhold {
                            p.handover.releasable(id, now)
                        } else {
                            id
                        };
                        id.and(queued)
                    });
                    self.write(d, released, unanswered != Some(d));
                }
            }
            Action::Crash(d) => self.processes[usize::from(d)] = None,
            Action::Restart(d) => {
                let d = usize::from(d);
                let now = self.now();
                // A Lease of its own still there was not released: its previous process died.
                let predecessor_died = self.leases[d].is_some();
                // Its Lease watch's first list.
                let mut observations = Observations::default();
                for (x, lease) in self.leases.iter().enumerate() {
                    if let Some(state) = lease {
                        observations.observe(&dispatcher_name(x), state.clone(), now);
                    }
                }
                self.processes[d] = Some(Process {
                    observations,
                    handover: Handover::new(&dispatcher_name(d), self.bound, now, predecessor_died),
                    renewed: None,
                    live: BTreeMap::new(),
                    slice: None,
                });
                self.write(d, None, true);
            }
            Action::Stop(d) => {
                // The drain's last renewal writes the drained mark, then the Lease is deleted
                // (`membership::run`).
                let d = usize::from(d);
                let released = self.leases[d].as_ref().and_then(|l| l.released.clone());
                let released = released.and_then(|id| {
                    (0..1u8 << self.processes.len()).find(|m| self.ids[usize::from(*m)] == id)
                });
                self.write_marked(d, released, false, true);
                self.processes[d] = None;
                self.delete(d, true);
            }
            Action::DeleteLease(d) => self.delete(usize::from(d), false),
            Action::Glimpse(..) => return Err("partial views are not stepped".into()),
            Action::CutApi(_) | Action::HealApi(_) => {
                return Err("API cuts are not stepped".into());
            }
            _ => {}
        }
        self.compare(after)
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
        }
        Ok(())
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
}

/// Walks `steps` random steps of `model` from its initial state (seeded by `seed`), stepping the
/// real code alongside and comparing after each. Partial Lease views are not taken; API cuts
/// are not stepped, so a budget with cuts fails the walk.
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
    for _ in 0..steps {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        actions.retain(|a| !matches!(a, Action::Glimpse(..)));
        if actions.is_empty() {
            break;
        }
        let action = actions[rng.below(actions.len())];
        let Some(next) = model.next_state(&state, action) else {
            continue;
        };
        path.push(action);
        walked.steps += 1;
        if matches!(action, Action::DeleteLease(_)) {
            walked.deletions += 1;
        }
        walked.handovers += state
            .dispatchers
            .iter()
            .zip(&next.dispatchers)
            .filter(|(a, b)| b.settled.is_some() && a.settled != b.settled)
            .count();
        if let Err(what) = real.step(model, action, &next) {
            return Err(Divergence { path, what });
        }
        state = next;
    }
    Ok(walked)
}
