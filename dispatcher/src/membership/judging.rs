//! Judging the members from the Leases seen, and publishing what this dispatcher serves: the
//! ring and the handover gate ([`kube_dispatch_core::handover::Handover`]), fenced while this dispatcher's own Lease is not
//! current.

use std::{sync::Arc, time::Instant};

use tracing::{error, info, warn};

use super::{Membership, lease::delete_dead_lease};

impl Membership {
    /// A loop that did not run for a Lease's duration (the process was paused, its node
    /// frozen) was fenced all that time, and the others may have taken its keys over: say so
    /// before a renewal can make it look current, so it serves nothing until a fresh handover
    /// completes.
    pub(super) fn fence_after_a_pause(&mut self, resumed: Instant) {
        if self
            .renewed
            .is_some_and(|at| resumed >= at + self.config.duration)
        {
            let next = self.handover.update(
                &self.live,
                self.lease_watch.observations.newest(),
                true,
                resumed,
            );
            self.slice.send_if_modified(|current| {
                let changed = current.settled.is_some();
                if changed {
                    *current = Arc::new(next);
                }
                changed
            });
        }
    }

    /// Judges the members at `now`, if the view of the Leases is whole and current; returns
    /// whether it was.
    ///
    /// Members are judged only on a view of the Leases that is whole (no list under way) and
    /// current: it shows this dispatcher's last accepted renewal, and so every Lease write
    /// before it. A partial or lagging view makes live members look absent or silent (the
    /// first list shows one Lease at a time; a watch that reconnects after a cut replays
    /// late), and a dispatcher that took it for the truth could find itself alone and serve
    /// keys others still hand out. Meanwhile the last such view stands.
    pub(super) fn judge(&mut self, now: Instant) -> bool {
        let config = &self.config;
        let listing = self.lease_watch.listing();
        let observations = &mut self.lease_watch.observations;
        if listing || observations.newest() < self.written {
            let since = *self.behind_since.get_or_insert(now);
            if !self.behind_warned && now >= since + config.duration {
                self.behind_warned = true;
                warn!(behind_for = ?(now - since), "the watch of dispatcher Leases lags this dispatcher's own renewals: membership changes wait until it catches up");
            }
            return false;
        }
        if self.behind_warned {
            info!("the watch of dispatcher Leases caught up");
        }
        self.behind_since = None;
        self.behind_warned = false;
        let gone;
        (self.live, gone) = self.handover.judge(observations, config.grace, now);
        for (gone, died) in gone {
            if died {
                self.lease_metrics.judged_dead();
                warn!(member = %gone, "dispatcher judged dead (its Lease expired, was deleted without the drained mark, or a re-list of the Leases could not vouch for its release): taking over its keys once reconciles it handed out are over");
                // A Lease this process no longer knows (forgotten at its drained deletion, its
                // release undone by a re-list) leaves nothing to collect.
                if let Some(rv) = observations.state(&gone).map(|s| s.resource_version) {
                    self.dead.insert(gone, (now, rv));
                }
            } else {
                info!(member = %gone, "dispatcher drained and released its Lease");
            }
        }
        let ours = self.ring_key.as_str();
        for member in self.live.keys() {
            let theirs = observations
                .state(member)
                .and_then(|s| s.ring_key.as_deref());
            if let Some(theirs) = theirs
                && theirs != ours
                && self.mismatched.insert(member.clone())
            {
                error!(
                    member = %member,
                    theirs,
                    ours,
                    "a live dispatcher places keys by another ring key (--ring-key): no handover with it can complete, and keys that move stay held; give every dispatcher of the tier the same"
                );
            }
        }
        let live = &self.live;
        self.mismatched.retain(|m| live.contains_key(m));
        true
    }

    /// A dead member's Lease stays behind; once the bound has passed, nothing it handed out
    /// can still run, so delete the Lease (if it is still the one seen dead): dispatchers that
    /// start later then need not wait the bound out for it again.
    pub(super) async fn collect_dead(&mut self, now: Instant) {
        let config = &self.config;
        let collect: Vec<(String, u128)> = self
            .dead
            .iter()
            .filter(|(name, _)| !self.live.contains_key(*name))
            .filter(|(_, (since, _))| now >= *since + config.handover_bound + config.grace)
            .map(|(name, (_, rv))| (name.clone(), *rv))
            .collect();
        for (name, rv) in collect {
            self.dead.remove(&name);
            // Bounded for the same reason as the renewal; an unanswered delete is retried by
            // nobody, and the Lease then merely costs later joiners the bound.
            let _ = tokio::time::timeout(
                config.renew_period,
                delete_dead_lease(&self.leases, &name, rv),
            )
            .await;
        }
        let live = &self.live;
        self.dead.retain(|name, _| !live.contains_key(name));
    }

    /// Updates the handover gate at `now` (fenced while this dispatcher's Lease is not
    /// current), carries the reports of ended sessions, names the dead members to replicas
    /// (only on a view just `judged` whole and current), asks for the writes that must not
    /// wait for the period, and publishes the slice.
    pub(super) fn publish(&mut self, now: Instant, judged: bool) {
        // Warming up, this dispatcher is no member in the others' eyes, and hands out nothing
        // as if fenced: alone in its own view, its gate would open at once.
        let fenced = self.mark_accepted
            || self
                .renewed
                .is_none_or(|at| now >= at + self.config.duration);
        let next = self.handover.update(
            &self.live,
            self.lease_watch.observations.newest(),
            fenced,
            now,
        );
        self.carry_reports(now);
        // Replicas are asked about members that died and are not live again (a new process of
        // one lists sessions of its own), and only on a view just judged whole and current: a
        // fenced dispatcher names nobody, and one whose view lags (just unfenced, or after a
        // pause, every Lease looks old in it) leaves the list as it was until its watch has
        // caught up. Itself only for its previous process, which died (answers say so apart
        // from the dead members: `Named::for_replicas`).
        if fenced {
            self.sessions.fenced();
        } else if judged {
            self.sessions.judged_dead(
                self.handover
                    .awaited()
                    .filter(|(member, _)| {
                        *member == self.config.identity || !self.live.contains_key(*member)
                    })
                    .map(|(member, tags)| (member.to_owned(), tags.clone()))
                    .collect(),
            );
        }
        self.ask_for_writes(now, fenced);
        let why = self.handover.waiting_for(&self.live);
        if why != self.waiting {
            if let Some(why) = &why {
                info!(waiting_for = %why, "handover pending: keys that moved here are held");
            }
            self.waiting = why;
        }
        self.slice.send_if_modified(|current| {
            // The first slice of a stretch in which nothing is handed out goes out whatever it
            // looks like: watches that list under it spare their lists when the gate opens.
            let same = current.ring.members() == next.ring.members()
                && current.settled.as_ref().map(|s| s.members())
                    == next.settled.as_ref().map(|s| s.members())
                && !next.begins_a_stretch();
            if !same {
                *current = Arc::new(next);
            }
            !same
        });
    }

    /// Reports of sessions a member that died listed (checked as they arrived) are carried on
    /// the Lease, written at once: each member ends its wait once it sees every such session
    /// reported.
    fn carry_reports(&mut self, now: Instant) {
        let mut carried = false;
        for (member, tag) in self.sessions.take_reports() {
            if self.relayed.report(&member, tag, now) {
                info!(%member, session = format_args!("{tag:016x}"), "a replica reported a session of a dispatcher that died ended");
                carried = true;
            }
        }
        if carried {
            self.renew_tick.reset_immediately();
        }
    }

    /// Renews at once rather than at the next period when a write must not wait.
    ///
    /// - The wait for a member that died is over: the release goes out now.
    /// - A joiner publishes what it awaits at once, and a member whose release came before a
    ///   peer adopted the ring writes it again at once: releases count only after the
    ///   adoption, and the periodic renewal would leave the joiner's keys held for up to a
    ///   renew period (`HANDOVER.md`, "Awaits"). A fenced dispatcher's marker moves with
    ///   every Lease write it sees (`Handover::update`) and its renewals may be failing: it
    ///   goes out with the renewals alone.
    fn ask_for_writes(&mut self, now: Instant, fenced: bool) {
        if self.withheld && !self.handover.waits_on_dead(now) {
            self.withheld = false;
            self.renew_tick.reset_immediately();
        }
        let awaits = self.handover.awaits();
        if awaits != self.awaits_asked {
            if awaits.is_some() && !fenced {
                self.renew_tick.reset_immediately();
            }
            self.awaits_asked = awaits;
        }
        let releasing = self
            .handover
            .releasable(self.released.borrow().clone(), now);
        if let Some(at) = self
            .handover
            .owed_release(&self.live, releasing.as_deref(), &self.own)
            && self.owed_asked.is_none_or(|asked| at > asked)
        {
            self.owed_asked = Some(at);
            self.renew_tick.reset_immediately();
        }
    }
}
