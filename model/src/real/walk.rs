//! The lock-step walk: random steps of the model, the real code stepped alongside and compared
//! after each, and what the walk reached.

use super::{Divergence, Real};
use crate::{Action, Key, Protocol, State, Takeover, has};

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
    /// Of those, restarted dispatchers' waits for their own previous process.
    pub restarts_by_reports: usize,
    /// Restarted dispatchers that warmed up and joined ([`crate::Config::warm_up`]).
    pub warm_ups: usize,
    /// Members judged released (dropped from a ring with no wait) while a new process of
    /// theirs, warming up, had written their Lease again since their drain.
    pub released_while_warming: usize,
}

impl std::ops::AddAssign for Walked {
    fn add_assign(&mut self, w: Self) {
        self.steps += w.steps;
        self.deletions += w.deletions;
        self.handovers += w.handovers;
        self.deliveries += w.deliveries;
        self.object_deletions += w.object_deletions;
        self.deletions_in_transit += w.deletions_in_transit;
        self.tombstones += w.tombstones;
        self.waits_for_group += w.waits_for_group;
        self.takeovers_by_reports += w.takeovers_by_reports;
        self.restarts_by_reports += w.restarts_by_reports;
        self.warm_ups += w.warm_ups;
        self.released_while_warming += w.released_while_warming;
    }
}

/// A [`walk`] of `steps` steps from each seed of `seeds`, what they reached added up; the
/// first divergence, with its seed, ends them.
pub fn walks(
    model: &Protocol,
    seeds: std::ops::Range<u64>,
    steps: usize,
) -> Result<Walked, (u64, Divergence)> {
    let mut total = Walked::default();
    for seed in seeds {
        total += walk(model, seed, steps).map_err(|d| (seed, d))?;
    }
    Ok(total)
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
        let Some(action) = choose(model, &state, &mut rng, &mut real) else {
            break;
        };
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
        if is_tick(action) {
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
            walked.count(model, action, &before, &next);
            // Timeouts due at one tick fire together in the code: compared once all are taken.
            let last = i + 1 == batch;
            let result = if last {
                real.step(model, action, &before, &next)
            } else {
                real.apply(model, action, &before, &next)
            };
            if std::env::var_os("KD_MODEL_TRACE").is_some() {
                trace(&real, action, &next);
            }
            if let Err(what) = result {
                return Err(Divergence { path, what });
            }
        }
        state = next;
    }
    Ok(walked)
}

/// Whether `action` is one of the model's ticks.
fn is_tick(action: Action) -> bool {
    matches!(
        action,
        Action::Tick | Action::Lag(_) | Action::TickRenewalUnanswered(_)
    )
}

/// The walk's next step from `state`, drawn by `rng`; an answer carries the keys the code
/// hands out. `None` when the model allows no step.
fn choose(model: &Protocol, state: &State, rng: &mut Rng, real: &mut Real) -> Option<Action> {
    use stateright::Model;
    let mut actions = Vec::new();
    model.actions(state, &mut actions);
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
        return None;
    }
    let action = actions[rng.below(actions.len())];
    let Action::Answer(r, d, _) = action else {
        return Some(action);
    };
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
    Some(Action::Answer(r, d, keys))
}

impl Walked {
    /// Counts what the step `action` from `before` to `next` reached.
    fn count(&mut self, model: &Protocol, action: Action, before: &State, next: &State) {
        self.steps += 1;
        if matches!(action, Action::DeleteLease(_)) {
            self.deletions += 1;
        }
        if matches!(action, Action::Answer(_, _, keys) if keys != 0) {
            self.deliveries += 1;
        }
        if matches!(action, Action::Delete(_)) {
            self.object_deletions += 1;
        }
        if matches!(action, Action::Warm(_)) {
            self.warm_ups += 1;
        }
        for (d, (a, b)) in before.dispatchers.iter().zip(&next.dispatchers).enumerate() {
            let dropped = a.ring & !b.ring;
            self.released_while_warming += next
                .leases
                .iter()
                .enumerate()
                .filter(|(x, l)| {
                    b.up && *x != d && has(dropped, *x) && l.warming && b.died[*x] == 0
                })
                .count();
        }
        if let Action::Answer(_, d, keys) = action {
            self.tombstones += usize::from(before.dispatchers[usize::from(d)].tomb & keys != 0);
        }
        self.deletions_in_transit += before
            .dispatchers
            .iter()
            .zip(&next.dispatchers)
            .filter(|(a, b)| {
                (a.held_deletions | a.recent) & !(b.held_deletions | b.recent) & b.gone != 0
            })
            .count();
        if is_tick(action) {
            self.waits_for_group += next
                .dispatchers
                .iter()
                .enumerate()
                .filter(|(d, disp)| model.waits_for_a_later_group(disp, *d))
                .count();
        }
        // A wait ends early only by reports: ticks count it down one at a time.
        let ended = |a: &crate::Dispatcher, b: &crate::Dispatcher, x: usize| {
            a.died[x] > 1 && b.died[x] == 0
        };
        for (d, (a, b)) in before.dispatchers.iter().zip(&next.dispatchers).enumerate() {
            self.takeovers_by_reports += (0..a.died.len()).filter(|x| ended(a, b, *x)).count();
            self.restarts_by_reports += usize::from(ended(a, b, d));
        }
        self.handovers += before
            .dispatchers
            .iter()
            .zip(&next.dispatchers)
            .filter(|(a, b)| b.settled.is_some() && a.settled != b.settled)
            .count();
    }
}

/// Prints each dispatcher's keys in the model and in the code after `action`
/// (`KD_MODEL_TRACE`).
fn trace(real: &Real, action: Action, next: &State) {
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
