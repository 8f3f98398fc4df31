//! Dispatchers' steps: cut off from the API server and healed, crashed, restarted, stopped,
//! glimpsing part of a re-list, fenced, their Lease deleted.

use crate::{Deletions, Key, Lease, Message, Protocol, Seen, State, bit, has};

impl Protocol {
    /// [`Action::CutApi`].
    pub(crate) fn step_cut_api(&self, s: &mut State, d: u8) -> Option<()> {
        s.left.api_cuts = s.left.api_cuts.checked_sub(1)?;
        s.dispatchers[usize::from(d)].api = false;
        Some(())
    }

    /// [`Action::IndexHeld`].
    pub(crate) fn step_index_held(&self, s: &mut State, d: u8) -> Option<()> {
        let objects = s.objects;
        let disp = &mut s.dispatchers[usize::from(d)];
        let unindexed = self.unindexed_held(disp, usize::from(d), objects);
        if unindexed == 0 {
            return None;
        }
        disp.held_index |= unindexed;
        Some(())
    }

    /// [`Action::HealApi`].
    pub(crate) fn step_heal_api(&self, s: &mut State, d: u8) -> Option<()> {
        let t = self.config.timing;
        let disp = &mut s.dispatchers[usize::from(d)];
        disp.api = true;
        disp.listing = true;
        // The re-list shows what changed meanwhile: a Lease written counts as live from
        // now (a member's); one gone, if known, was deleted without a final state, so not
        // drained. A release it saw that no member's write ended (the Lease listed warming
        // up, or not at all) may hide a process of it that joined, handed keys out and died
        // meanwhile: a death (`Observations::relisted`).
        for (x, lease) in s.leases.iter().enumerate() {
            if has(disp.releases, x) {
                disp.releases &= !bit(x);
                if !lease.exists || lease.warming {
                    disp.deaths |= bit(x);
                }
            }
            if !has(disp.missed, x) {
                continue;
            }
            if lease.exists {
                disp.view[x] = if lease.member_to(x, usize::from(d)) {
                    t.lease + t.grace
                } else {
                    0
                };
            } else {
                if disp.view[x] > 0 || has(disp.ring, x) {
                    disp.deaths |= bit(x);
                }
                disp.view[x] = 0;
            }
        }
        disp.missed = 0;
        // Its watch re-lists when it is back.
        self.relist(disp, usize::from(d), s.objects);
        Some(())
    }

    /// [`Action::Crash`].
    pub(crate) fn step_crash(&self, s: &mut State, d: u8) -> Option<()> {
        s.left.dispatcher_crashes = s.left.dispatcher_crashes.checked_sub(1)?;
        s.dispatchers[usize::from(d)] = self.fresh_dispatcher(false);
        s.seen |= Seen::Crashed as u8;
        Some(())
    }

    /// [`Action::Restart`].
    pub(crate) fn step_restart(&self, s: &mut State, d: u8) -> Option<()> {
        let t = self.config.timing;
        let d = usize::from(d);
        let mut disp = self.fresh_dispatcher(true);
        // Its Lease watch's first list: every member's Lease there counts as live from now.
        for (x, lease) in s.leases.iter().enumerate() {
            if lease.exists && lease.member_to(x, d) {
                disp.view[x] = t.lease + t.grace;
            }
        }
        // A member's Lease still there was not released: its previous process may have left
        // reconciles running, waited out as a member that died (until each session its
        // Lease listed is reported ended, or the bound), and it joins at once. None there, or
        // one marked warming (its process handed nothing out), it sees nothing to wait for
        // (drained, or deleted by hand: then the others wait, and withhold their releases),
        // and warms up first ([`Config::warm_up`]).
        let lease = &s.leases[d];
        if lease.exists && !lease.warming {
            let listed = lease.known.then_some(lease.sessions);
            Self::mourn(&mut disp, d, t.bound, listed);
        } else {
            disp.warming = self.config.warm_up;
        }
        s.dispatchers[d] = disp;
        self.renew(s, d, true);
        // Its first renewal comes before it has judged anything: it releases no ring.
        s.leases[d].released = None;
        Some(())
    }

    /// [`Action::Warm`].
    pub(crate) fn step_warm(&self, s: &mut State, d: u8) -> Option<()> {
        let d = usize::from(d);
        let disp = &mut s.dispatchers[d];
        if !(disp.up && disp.api && disp.warming) {
            return None;
        }
        disp.warming = false;
        self.renew(s, d, true);
        Some(())
    }

    /// [`Action::Stop`].
    pub(crate) fn step_stop(&self, s: &mut State, d: u8) -> Option<()> {
        s.left.graceful_stops = s.left.graceful_stops.checked_sub(1)?;
        let d = usize::from(d);
        let disp = &s.dispatchers[d];
        // Waiting out a member that died (or its previous process), it leaves its Lease to
        // expire instead (`membership::run`): a crash, as far as the others can tell.
        if !disp.up
            || disp.keys.iter().any(|k| matches!(k, Key::InFlight { .. }))
            || disp.died.iter().any(|w| *w > 0)
        {
            return None;
        }
        s.dispatchers[d] = self.fresh_dispatcher(false);
        s.leases[d] = Lease {
            released: None,
            exists: false,
            drained: true,
            warming: false,
            sessions: 0,
            known: true,
            ended: 0,
        };
        self.show_lease(s, d, false);
        Some(())
    }

    /// [`Action::Glimpse`].
    pub(crate) fn step_glimpse(&self, s: &mut State, d: u8, part: u8) -> Option<()> {
        let d = usize::from(d);
        if !s.dispatchers[d].listing {
            return None;
        }
        self.judge(s, d, part);
        Some(())
    }

    /// [`Action::Fence`].
    pub(crate) fn step_fence(&self, s: &mut State, r: u8, d: u8) -> Option<()> {
        let rep = &mut s.replicas[usize::from(r)];
        if rep.sessions[usize::from(d)]?.fence != 0 {
            return None;
        }
        rep.sessions[usize::from(d)] = None;
        for run in &mut rep.running {
            if run.is_some_and(|x| x.dispatcher == d) {
                *run = None;
            }
        }
        s.messages.retain(|m| {
            !matches!(*m, Message::Answer { replica, dispatcher, .. } if (replica, dispatcher) == (r, d))
        });
        s.seen |= Seen::Fenced as u8;
        Some(())
    }

    /// [`Action::DeleteLease`].
    pub(crate) fn step_delete_lease(&self, s: &mut State, d: u8) -> Option<()> {
        s.left.lease_deletions = s.left.lease_deletions.checked_sub(1)?;
        let lease = &mut s.leases[usize::from(d)];
        if !lease.exists {
            return None;
        }
        // What it carried of sessions ended is gone with it: no reader counts a deleted
        // Lease's reports (`Observations::all_ended`), which a process started later never sees.
        *lease = Lease {
            released: None,
            exists: false,
            drained: false,
            warming: false,
            sessions: 0,
            known: false,
            ended: 0,
        };
        self.show_lease(s, usize::from(d), false);
        // Every dispatcher whose Lease watch runs sees the deletion: a death, whatever it saw
        // before.
        if self.config.deletions == Deletions::Died {
            for disp in &mut s.dispatchers {
                if disp.up && disp.api {
                    disp.deaths |= bit(d);
                    disp.releases &= !bit(d);
                }
            }
        }
        s.seen |= Seen::LeaseDeleted as u8;
        Some(())
    }
}
