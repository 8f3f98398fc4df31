//! Which actions a state allows, by the part of the system that takes them: in the order
//! `Model::actions` lists them (the clock, dispatchers, replicas, messages, objects).

use crate::{Action, Key, Message, Protocol, State, Views, has};

/// An index of the model's small collections, as actions carry it.
fn n(x: usize) -> u8 {
    u8::try_from(x).unwrap_or_default()
}

impl Protocol {
    /// Time passes (unless a step is urgent), and a replica's clock may lag.
    pub(crate) fn clock_actions(&self, state: &State, actions: &mut Vec<Action>) {
        if !Self::urgent(state) {
            actions.push(Action::Tick);
            if state.left.drift > 0 {
                for r in 0..state.replicas.len() {
                    if state.replicas[r].up {
                        actions.push(Action::Lag(n(r)));
                    }
                }
            }
        }
    }

    /// Each dispatcher's: cut off or healed, crashed, stopped, restarted; what a partial view of
    /// the Leases may show; sessions expiring, answers to held polls, deliveries voided.
    pub(crate) fn dispatcher_actions(&self, state: &State, actions: &mut Vec<Action>) {
        let urgent = Self::urgent(state);
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
                    if self.unindexed_held(disp, d, state.objects) != 0 {
                        actions.push(Action::IndexHeld(d8));
                    }
                } else {
                    actions.push(Action::HealApi(d8));
                }
                if state.left.dispatcher_crashes > 0 {
                    actions.push(Action::Crash(d8));
                }
                if disp.warming && disp.api {
                    actions.push(Action::Warm(d8));
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
                        let ready = disp.ready();
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
    }

    /// Each replica's: crashed or restarted, sessions opened, fenced, polled, closed, reports of
    /// sessions ended, and its reconciles finished or cancelled.
    pub(crate) fn replica_actions(&self, state: &State, actions: &mut Vec<Action>) {
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
                // modelled as of any dispatcher it ever had a session on, to any that is up
                // (itself included: a restarted dispatcher asks about its previous process).
                for d in 0..state.dispatchers.len() {
                    for (x, disp) in state.dispatchers.iter().enumerate() {
                        if disp.up {
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
    }

    /// Each message in flight arrives, or is lost while the budget allows.
    pub(crate) fn message_actions(&self, state: &State, actions: &mut Vec<Action>) {
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
    }

    /// The objects': changes, changes of owned objects, deletions, and Lease deletions.
    pub(crate) fn object_actions(&self, state: &State, actions: &mut Vec<Action>) {
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
}
