//! The protocol as a stateright [`Model`]: its initial states, the actions each state allows,
//! what each action does (dispatched to `steps/`), and the properties checked.

use stateright::{Model, Property};

#[cfg(doc)]
use crate::Config;
use crate::{Action, Key, Lease, Protocol, Replica, Seen, State, Takeover, bit};

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let t = self.config.timing;
        let all = self.all();
        let dispatchers = (0..self.config.dispatchers)
            .map(|d| {
                let mut disp = self.fresh_dispatcher(true);
                // Settled: its Lease watch has listed.
                disp.listing = false;
                disp.view = vec![t.lease + t.grace; self.config.dispatchers];
                disp.own_lease = t.lease;
                disp.ring = all;
                disp.settled = Some(all);
                disp.fresh = all & !bit(d);
                disp.groups = self.all_groups();
                disp.asked = self.all_groups();
                // Every object has just been created: its key is ready at its owner, in every
                // group's queue.
                for k in 0..self.entries() {
                    if self.owns(all, k, d) {
                        disp.keys[k] = Key::Ready { leaving: false };
                    }
                }
                disp
            })
            .collect();
        vec![State {
            dispatchers,
            leases: vec![
                Lease {
                    released: Some(all),
                    exists: true,
                    drained: false,
                    warming: false,
                    sessions: 0,
                    known: true,
                    ended: 0,
                };
                self.config.dispatchers
            ],
            replicas: vec![
                Replica {
                    up: true,
                    sessions: vec![None; self.config.dispatchers],
                    running: vec![None; self.entries()],
                    generations: 0,
                };
                self.config.replicas
            ],
            messages: Vec::new(),
            pending: u8::try_from((1usize << self.entries()) - 1).unwrap_or(u8::MAX),
            objects: u8::try_from((1usize << self.config.keys) - 1).unwrap_or(u8::MAX),
            left: self.config.budget,
            seen: 0,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.clock_actions(state, actions);
        self.dispatcher_actions(state, actions);
        self.replica_actions(state, actions);
        self.message_actions(state, actions);
        self.object_actions(state, actions);
        if self.config.enabled_only {
            actions.retain(|a| self.next_state(state, *a).is_some());
        }
    }

    #[allow(clippy::too_many_lines)]
    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => self.step_tick(&mut s)?,
            Action::Lag(r) => self.step_lag(&mut s, r)?,
            Action::TickRenewalUnanswered(d) => self.step_tick_renewal_unanswered(&mut s, d)?,
            Action::CutApi(d) => self.step_cut_api(&mut s, d)?,
            Action::HealApi(d) => self.step_heal_api(&mut s, d)?,
            Action::IndexHeld(d) => self.step_index_held(&mut s, d)?,
            Action::Crash(d) => self.step_crash(&mut s, d)?,
            Action::Restart(d) => self.step_restart(&mut s, d)?,
            Action::Stop(d) => self.step_stop(&mut s, d)?,
            Action::Warm(d) => self.step_warm(&mut s, d)?,
            Action::Glimpse(d, part) => self.step_glimpse(&mut s, d, part)?,
            Action::CrashReplica(r) => self.step_crash_replica(&mut s, r)?,
            Action::RestartReplica(r) => self.step_restart_replica(&mut s, r)?,
            Action::Open(r, d) => self.step_open(&mut s, r, d)?,
            Action::Poll(r, d) => self.step_poll(&mut s, r, d)?,
            Action::Arrive(r, d) => self.step_arrive(&mut s, r, d)?,
            Action::Answer(r, d, take) => self.step_answer(&mut s, r, d, take)?,
            Action::Receive(r, d) => self.step_receive(&mut s, r, d)?,
            Action::Finish(r, k) => self.step_finish(&mut s, r, k)?,
            Action::AckArrives(r, d, k) => self.step_ack_arrives(&mut s, r, d, k)?,
            Action::Lose(i) => self.step_lose(&mut s, i)?,
            Action::Expire(d, r) => self.step_expire(&mut s, d, r)?,
            Action::Void(d, k) => self.step_void(&mut s, d, k)?,
            Action::Change(k) => self.step_change(&mut s, k)?,
            Action::OwnedChange(k) => self.step_owned_change(&mut s, k)?,
            Action::Delete(k) => self.step_delete(&mut s, k)?,
            Action::Fence(r, d) => self.step_fence(&mut s, r, d)?,
            Action::DeleteLease(d) => self.step_delete_lease(&mut s, d)?,
            Action::Close(r, d) => self.step_close(&mut s, r, d)?,
            Action::CloseArrives(r, d) => self.step_close_arrives(&mut s, r, d)?,
            Action::Report(r, d, x) => self.step_report(&mut s, r, d, x)?,
            Action::ReportArrives(r, x) => self.step_report_arrives(&mut s, r, x)?,
            Action::Cancel(r, k) => self.step_cancel(&mut s, r, k)?,
        }
        s.messages.sort_unstable();
        // What a queue records of a key it forgot goes with it.
        for disp in &mut s.dispatchers {
            let known = disp
                .keys
                .iter()
                .enumerate()
                .filter(|(_, k)| **k != Key::Absent)
                .fold(0u8, |m, (k, _)| m | bit(k));
            disp.gone &= known;
            disp.tomb &= known;
            disp.nameless &= known;
            disp.objectless &= known;
            disp.stale &= known;
        }
        Some(s)
    }

    /// `settles` only when [`Config::liveness`] is set, and the handover after a crash only
    /// when a crash and a second dispatcher make it possible.
    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![Property::always("exclusive", |m: &Self, s: &State| {
            m.exclusive(s)
        })];
        if self.config.liveness {
            properties.push(Property::always("settles", |m: &Self, s: &State| {
                s.pending == 0 || m.settles(s)
            }));
        }
        properties.push(Property::sometimes(
            "a key is reconciled",
            |_, s: &State| s.seen & Seen::Reconciled as u8 != 0,
        ));
        if self.config.dispatchers > 1 && self.config.budget.dispatcher_crashes > 0 {
            properties.push(Property::sometimes(
                "a handover completes after a crash",
                |_, s: &State| s.seen & Seen::HandoverAfterCrash as u8 != 0,
            ));
        }
        if self.config.dispatchers > 1 && self.config.budget.lease_deletions > 0 {
            properties.push(Property::sometimes(
                "a handover completes after a Lease deletion",
                |_, s: &State| s.seen & Seen::HandoverAfterDeletion as u8 != 0,
            ));
        }
        if self.config.dispatchers > 1 && self.config.groups > 1 {
            properties.push(Property::sometimes(
                "a release waits for another group's handover",
                |_, s: &State| s.seen & Seen::ReleaseWaitsForAnotherGroup as u8 != 0,
            ));
        }
        if self.config.takeover == Takeover::Reports
            && self.config.dispatchers > 1
            && self.config.budget.dispatcher_crashes > 0
            && self.config.budget.reports > 0
        {
            properties.push(Property::sometimes(
                "a member that died is waited out no longer once its sessions are reported ended",
                |_, s: &State| s.seen & Seen::TakeoverByReports as u8 != 0,
            ));
        }
        properties.push(Property::sometimes(
            "a replica fences a session",
            |_, s: &State| s.seen & Seen::Fenced as u8 != 0,
        ));
        properties
    }
}
