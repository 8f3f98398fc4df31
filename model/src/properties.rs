//! The properties the model checks, as predicates on a state: no key reconciled by two replicas
//! at once, and every change settled.

use stateright::Model;

use crate::{Action, Budget, Protocol, State};

impl Protocol {
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
