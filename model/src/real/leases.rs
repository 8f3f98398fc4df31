//! The dispatchers' side of a step: a tick's judging and renewals, Lease writes and deletions,
//! and a dispatcher's restart and stop.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use kube_dispatch_core::{key::KeyRef, leases::LeaseState, queue::Change, transit::GroupEvent};

use super::{Real, TICK};
use crate::{Action, Lease, Protocol, State, dispatcher_name};

impl Real {
    /// Writes dispatcher `d`'s Lease (a renewal, `answered` or not) releasing `released`, with
    /// the sessions and reports the model's write lists (`written`), and shows the write to
    /// every dispatcher whose Lease watch runs.
    pub(super) fn write(
        &mut self,
        d: usize,
        released: Option<u8>,
        answered: bool,
        written: &Lease,
    ) {
        self.write_marked(d, released, answered, false, written);
    }

    /// The tags of the model's session bits (`Protocol::sid`), each with the dispatcher it names:
    /// of the session with that id opened last (the model forgets the reports of an id's
    /// earlier session when it is used again).
    pub(super) fn tags(&self, bits: u32) -> Vec<(usize, u64)> {
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
    pub(super) fn write_marked(
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
            warming: written.warming,
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
    pub(super) fn delete(&mut self, d: usize, drained: bool) {
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
    pub(super) fn judge(&mut self, d: usize) {
        let (now, grace, duration) = (self.now(), self.grace, self.duration);
        let objects = self.objects();
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        p.live = p.handover.judge(&mut p.observations, grace, now).0;
        let fenced = p.warming || p.renewed.is_none_or(|at| now >= at + duration);
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

    /// A tick: timers advance, then each dispatcher in turn judges and renews.
    pub(super) fn tick(
        &mut self,
        model: &Protocol,
        action: Action,
        after: &State,
    ) -> Result<(), String> {
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
            if self.processes[d].is_some() {
                self.judge(d);
                self.renew(model, d, unanswered != Some(d), after)?;
            }
        }
        Ok(())
    }

    /// Dispatcher `d` renews its Lease with the ring its queues and its gate let it release.
    pub(super) fn renew(
        &mut self,
        model: &Protocol,
        d: usize,
        answered: bool,
        after: &State,
    ) -> Result<(), String> {
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
        self.write(d, released, answered, &after.leases[d]);
        Ok(())
    }

    /// Dispatcher `d` starts again: its Lease watch lists the Leases, then it writes its own.
    pub(super) fn restart(&mut self, d: usize, after: &State) {
        let now = self.now();
        // A Lease of its own still there was not released: its previous process died (unless
        // it was marked warming: that process handed nothing out). The sessions it listed are
        // all its process may have handed keys to.
        let predecessor = self.leases[d]
            .as_ref()
            .filter(|l| !l.warming)
            .map(|l| l.sessions.clone());
        let mut process = self.process(d, now, predecessor);
        process.warming = after.dispatchers[d].warming;
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

    /// Dispatcher `d`, warming up, is ready: it renews its Lease without the mark, and its gate
    /// opens as a member's (`membership::run`).
    pub(super) fn warm(&mut self, model: &Protocol, d: usize, after: &State) -> Result<(), String> {
        if let Some(p) = &mut self.processes[d] {
            p.warming = false;
        }
        self.renew(model, d, true, after)
    }

    /// Dispatcher `d` stops: the drain's last renewal writes the drained mark, then the Lease
    /// is deleted (`membership::run`).
    pub(super) fn stop(&mut self, d: usize, before: &State) {
        let released = self.leases[d].as_ref().and_then(|l| l.released.clone());
        let released = released.and_then(|id| {
            (0..1u8 << self.processes.len()).find(|m| self.ids[usize::from(*m)] == id)
        });
        self.write_marked(d, released, false, true, &before.leases[d]);
        self.processes[d] = None;
        self.delete(d, true);
    }
}
