use stateright::Model;

use super::*;

mod checks;
mod scenarios;

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
        owners_listed: false,
        relist_returning: true,
        liveness: true,
        takeover: Takeover::Bound,
        warm_up: true,
        enabled_only: false,
    }
}

const NO_FAULTS: Budget = Budget::NONE;

fn replay(model: &Protocol, path: &[Action]) -> State {
    replay_from(model, model.init_states().remove(0), path)
}

/// [`replay`] from the state `s`.
fn replay_from(model: &Protocol, mut s: State, path: &[Action]) -> State {
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

/// Replica 0 reconciles key 0 on dispatcher 0 to the end: taken, finished, acknowledged.
fn reconciled() -> Vec<Action> {
    use Action::*;
    [takes(0, 0).as_slice(), &[Finish(0, 0), AckArrives(0, 0, 0)]].concat()
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
