//! Time and membership: the clock's tick, the Leases each dispatcher sees, how it judges the
//! others, and its renewals.

use crate::{Deletions, Dispatcher, Key, Lease, Message, Protocol, Seen, State, bit, has};

impl Protocol {
    /// Replica `r`'s deadlines that have run out: it must act on them before time passes.
    pub(super) fn urgent(state: &State) -> bool {
        state.replicas.iter().any(|rep| {
            rep.up
                && (rep.sessions.iter().flatten().any(|s| s.fence == 0)
                    || rep.running.iter().flatten().any(|run| run.deadline == 0))
        })
    }

    /// A tick: every countdown runs down (but replica `lagging`'s), then every dispatcher that
    /// reaches the API server observes the Leases and renews its own (the answer to
    /// `unanswered`'s renewal is lost).
    pub(super) fn tick(
        &self,
        state: &mut State,
        lagging: Option<usize>,
        unanswered: Option<usize>,
    ) {
        for (r, rep) in state.replicas.iter_mut().enumerate() {
            if !rep.up || lagging == Some(r) {
                continue;
            }
            for s in rep.sessions.iter_mut().flatten() {
                s.fence = s.fence.saturating_sub(1);
            }
            for run in rep.running.iter_mut().flatten() {
                run.deadline = run.deadline.saturating_sub(1);
            }
        }
        for m in &mut state.messages {
            match m {
                Message::Poll {
                    replica, countdown, ..
                }
                | Message::Answer {
                    replica, countdown, ..
                } if lagging != Some(usize::from(*replica)) => {
                    *countdown = countdown.saturating_sub(1);
                }
                _ => {}
            }
        }
        state.messages.sort_unstable();
        for (d, disp) in state.dispatchers.iter_mut().enumerate() {
            if !disp.up {
                continue;
            }
            for s in disp.sessions.iter_mut().flatten() {
                *s = s.saturating_sub(1);
            }
            for key in &mut disp.keys {
                if let Key::InFlight { deadline, .. } = key {
                    *deadline = deadline.saturating_sub(1);
                }
            }
            for w in disp.died.iter_mut().chain(&mut disp.view) {
                *w = w.saturating_sub(1);
            }
            for (w, awaiting) in disp.died.iter().zip(&mut disp.awaiting) {
                if *w == 0 {
                    *awaiting = None;
                }
            }
            if disp.own_lease == 1 {
                // Its Lease ran out unrenewed: it fences itself and hands out nothing.
                disp.own_lease = 0;
                let was = disp.settled.take().is_some();
                self.trim_to_slice(disp, d, was);
            } else {
                disp.own_lease = disp.own_lease.saturating_sub(1);
            }
        }
        for d in 0..state.dispatchers.len() {
            if state.dispatchers[d].up && state.dispatchers[d].api {
                self.observe(state, d);
                self.renew(state, d, unanswered != Some(d));
            }
        }
    }

    /// The members whose Lease is live as `disp` saw them.
    pub(super) fn live(disp: &Dispatcher) -> u8 {
        disp.view
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0)
            .fold(0u8, |m, (i, _)| m | bit(i))
    }

    /// Every dispatcher whose Lease watch runs sees Lease `x` written (`written`) or deleted;
    /// one cut off will re-list it when it is back. A Lease marked warming counts as no
    /// member's but to its writer, which counts itself and hands out nothing (`Handover::judge`,
    /// fenced while warming); one deleted with the drained mark is a release until a member
    /// writes it again (`Observations::take_releases`).
    pub(super) fn show_lease(&self, state: &mut State, x: usize, written: bool) {
        let t = self.config.timing;
        let lease = state.leases[x];
        for (o, disp) in state.dispatchers.iter_mut().enumerate() {
            if !disp.up {
                continue;
            }
            if disp.api {
                disp.view[x] = if written && lease.member_to(x, o) {
                    t.lease + t.grace
                } else {
                    0
                };
                if written && !lease.warming {
                    disp.releases &= !bit(x);
                } else if !written && lease.drained {
                    disp.releases |= bit(x);
                }
            } else {
                disp.missed |= bit(x);
            }
        }
    }

    /// `disp` finds member `x` dead, with the sessions its Lease listed if known: waited out for
    /// the bound, or until each is reported ended; if already waited out (an earlier process of
    /// it died too), for both (`Handover::died_with`).
    pub(super) fn mourn(disp: &mut Dispatcher, x: usize, bound: u8, listed: Option<u32>) {
        let before = (disp.died[x] > 0).then_some(disp.awaiting[x]);
        disp.died[x] = bound;
        disp.awaiting[x] = match before {
            None => listed,
            Some(earlier) => earlier.zip(listed).map(|(a, b)| a | b),
        };
    }

    /// `d` observes every Lease: a whole and current view.
    pub(super) fn observe(&self, state: &mut State, d: usize) {
        let live = Self::live(&state.dispatchers[d]);
        if has(live, d) {
            state.dispatchers[d].listing = false;
        }
        self.judge(state, d, live);
    }

    /// `d` judges membership on a view of the Leases in which the members `live` are live
    /// (`membership::run` and `Handover::update`).
    pub(super) fn judge(&self, state: &mut State, d: usize, live: u8) {
        let t = self.config.timing;
        let leases = state.leases.clone();
        let objects = state.objects;
        let peers = Self::remembered(state);
        let disp = &mut state.dispatchers[d];
        let (ring_before, settled_before) = (disp.ring, disp.settled);
        if disp.own_lease == 0 || disp.warming {
            // Fenced (warming up counts as fenced: it hands out nothing): releases seen so far
            // may predate what the others did meanwhile.
            disp.fresh = 0;
            disp.written = 0;
        }
        // A death seen of a member live again (a new process of it): its old one's reconciles
        // are waited out. One still gone is counted as it leaves the ring, or was already.
        for x in 0..leases.len() {
            if has(disp.deaths, x) && has(live, x) {
                Self::mourn(disp, x, t.bound, None);
            }
        }
        let deaths = std::mem::take(&mut disp.deaths);
        let releases = std::mem::take(&mut disp.releases);
        if live != disp.ring {
            self.ring_changed(disp, d, live, &leases, (deaths, releases));
        }
        if !has(disp.ring, d) {
            // Off its own ring (its Lease gone from the view): it hands out nothing, and
            // releases seen so far may predate what the others did meanwhile.
            disp.fresh = 0;
            disp.written = 0;
            let was = disp.settled.take().is_some();
            self.trim_to_slice(disp, d, was);
        }
        // A member that died is waited out no longer once every session its Lease listed is
        // reported ended on a Lease.
        let by_reports = self.config.takeover.reports() && Self::ended_by_reports(disp, &leases);
        // As the gate reads the Leases now: a release a member has since withdrawn (a new
        // process of it writes none yet) counts no more.
        disp.fresh = 0;
        for (p, lease) in leases.iter().enumerate() {
            if p != d
                && has(disp.ring, p)
                && has(disp.written, p)
                && lease.released == Some(disp.ring)
            {
                disp.fresh |= bit(p);
            }
        }
        let others = disp.ring & !bit(d);
        let open = disp.own_lease > 0
            && !disp.warming
            && has(disp.ring, d)
            && disp.died.iter().all(|w| *w == 0)
            && disp.settled != Some(disp.ring)
            && disp.fresh & others == others;
        if open {
            let was = disp.settled.is_some();
            disp.settled = Some(disp.ring);
            self.trim_to_slice(disp, d, was);
        }
        // Each group's transit trims its queue as the slice is published (`Transit::trim`).
        self.abandon(disp);
        // A list beside its watch shows it the served keys it does not know when they may have
        // grown.
        let grows = self.grows(disp, d, (ring_before, settled_before));
        if grows {
            self.fill(disp, d, objects);
        }
        if open {
            // Each group there that has not yet asks its live peers for the deletions they
            // remember of keys it owns.
            for g in 0..self.config.groups {
                if has(disp.groups, g) && !has(disp.asked, g) {
                    self.ask_peers(disp, d, g, &peers);
                }
            }
            if state.seen & Seen::Crashed as u8 != 0 {
                state.seen |= Seen::HandoverAfterCrash as u8;
            }
            if state.seen & Seen::LeaseDeleted as u8 != 0 {
                state.seen |= Seen::HandoverAfterDeletion as u8;
            }
        }
        if by_reports {
            state.seen |= Seen::TakeoverByReports as u8;
        }
    }

    /// The ring `d` judges changed to `live`: members gone from it that died are waited out,
    /// and its slice is trimmed to the new ring (off its own ring at once if it left it).
    /// `deaths` and `releases` are the Lease deletions without and with the drained mark seen
    /// since the last judgement.
    fn ring_changed(
        &self,
        disp: &mut Dispatcher,
        d: usize,
        live: u8,
        leases: &[Lease],
        (deaths, releases): (u8, u8),
    ) {
        let t = self.config.timing;
        let gone = disp.ring & !live;
        for (x, lease) in leases.iter().enumerate() {
            // Only a Lease deleted with the drained mark was released: its holder left
            // nothing in flight, even if a new process of it, warming up, wrote it again
            // since. Expired, or deleted without the mark, its holder died, even if a later
            // process of it drained since (`Handover::judge`).
            let died = match self.config.deletions {
                Deletions::Died => !(lease.drained || has(releases, x)) || has(deaths, x),
                Deletions::Released => lease.exists,
            };
            if has(gone, x) && died {
                // Deleted (since the last judgement, whatever came after), or written by a
                // process that waits out its previous one, its Lease lists nothing to go by.
                // Written warming up, it lists a later process's sessions, not the dead one's.
                let known = lease.exists && lease.known && !lease.warming && !has(deaths, x);
                let listed = known.then_some(lease.sessions);
                Self::mourn(disp, x, t.bound, listed);
            }
        }
        disp.ring = live;
        disp.fresh = 0;
        disp.written = 0;
        let was = disp.settled.is_some();
        if !has(live, d) {
            // Off its own ring at once (one slice, as `Handover::update` publishes it).
            disp.settled = None;
        }
        self.trim_to_slice(disp, d, was);
    }

    /// Stops waiting for each member that died whose listed sessions are all reported ended on
    /// some Lease; returns whether one of them listed any (a takeover by reports).
    fn ended_by_reports(disp: &mut Dispatcher, leases: &[Lease]) -> bool {
        let mut by_reports = false;
        let ended = leases.iter().fold(0u32, |m, l| m | l.ended);
        for x in 0..leases.len() {
            if disp.died[x] > 0
                && let Some(listed) = disp.awaiting[x]
                && listed & !ended == 0
            {
                disp.died[x] = 0;
                disp.awaiting[x] = None;
                by_reports |= listed != 0;
            }
        }
        by_reports
    }

    /// Whether the keys `d` serves may have grown since it served on `before` (its ring and its
    /// settled ring then), so that a list beside its watch shows it the served keys it does not
    /// know (`Slice::may_serve_more_than`): it serves what it owns on its ring and its settled
    /// ring together, so only when it starts serving or a member drops out of both. The old
    /// dispatcher listed only when its settled ring changed.
    fn grows(&self, disp: &Dispatcher, d: usize, before: (u8, Option<u8>)) -> bool {
        let (ring_before, settled_before) = before;
        match (settled_before, disp.settled) {
            (_, None) => false,
            (Some(before), Some(now)) if has(ring_before, d) => {
                if self.config.relist_returning {
                    (ring_before | before) & !(disp.ring | now) != 0
                } else {
                    before != now
                }
            }
            (_, Some(_)) => has(disp.ring, d),
        }
    }

    pub(super) fn renew(&self, state: &mut State, d: usize, answered: bool) {
        let t = self.config.timing;
        // Each group trimmed to the slice as its release is asked (`GroupTable::release_ring`).
        self.abandon(&mut state.dispatchers[d]);
        let released = self.release(&state.dispatchers[d], d);
        if self.waits_for_a_later_group(&state.dispatchers[d], d) {
            state.seen |= Seen::ReleaseWaitsForAnotherGroup as u8;
        }
        let disp = &state.dispatchers[d];
        state.leases[d] = Lease {
            // Warming up, it counts itself on its ring and releases as a member would; nobody
            // counts a release of one that is no member of theirs.
            released,
            exists: true,
            drained: false,
            warming: disp.warming,
            sessions: self.listing(disp, d),
            // Waiting out a member that died, or its own previous process, it lists
            // `overflow` (`Handover::waits_on_dead`).
            known: disp.died.iter().all(|w| *w == 0),
            ended: disp.reported,
        };
        if answered {
            let disp = &mut state.dispatchers[d];
            disp.own_lease = t.lease;
            // Its sessions are listed: it may hand them keys.
            disp.listed = disp
                .sessions
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_some())
                .fold(0, |m, (r, _)| m | bit(r));
        }
        for (o, disp) in state.dispatchers.iter_mut().enumerate() {
            if o != d {
                disp.written |= bit(d);
            }
        }
        self.show_lease(state, d, true);
    }
}
