//! After each step: the code's Leases, rings and queues compared with the model's.

use std::time::Instant;

use kube_dispatch_core::queue::KeyState;

use super::{Process, Real, mask, replica_name};
use crate::{Key, State, has};

impl Real {
    /// Whether every Lease, and every dispatcher's ring, settled ring, wait for the dead and
    /// whether it hands out keys now, are the model's.
    pub(super) fn compare(&self, state: &State) -> Result<(), String> {
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
            for (k, modelled) in disp.keys.iter().enumerate() {
                let real = self.key(p, k, now);
                if !real.matches(*modelled) {
                    return Err(format!(
                        "dispatcher-{d}, key {k}: {modelled:?} in the model, {real:?} in the code"
                    ));
                }
                let (g, key) = self.entry(k);
                let deleted = p.groups[g]
                    .queue
                    .key_status(key, now)
                    .is_some_and(|s| s.deleted);
                if deleted != has(disp.gone, k) {
                    return Err(format!(
                        "dispatcher-{d}, key {k}: deletion recorded {} in the model, {deleted} in the code",
                        has(disp.gone, k)
                    ));
                }
            }
            for (g, group) in p.groups.iter().enumerate() {
                let figures = group.transit.figures();
                let figures = (figures.held, figures.remembered);
                let of_group = self.model.of_group(g);
                let modelled = (
                    (disp.held_deletions & of_group).count_ones() as usize,
                    (disp.recent & of_group).count_ones() as usize,
                );
                if figures != modelled {
                    return Err(format!(
                        "dispatcher-{d}, group {g}: deletions (held, remembered) {modelled:?} in the model, {figures:?} in the code"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Where the model's queue entry `e` stands in its group's queue at `p`.
    pub(super) fn key(&self, p: &Process, e: usize, now: Instant) -> RealKey {
        let (g, key) = self.entry(e);
        let queue = &p.groups[g].queue;
        let Some(status) = queue.key_status(key, now) else {
            return RealKey::Absent;
        };
        match status.state {
            KeyState::Idle => RealKey::Idle,
            KeyState::Queued | KeyState::BackingOff | KeyState::RequeueAfter => RealKey::Ready {
                leaving: queue.is_leaving(key),
            },
            KeyState::InFlight => RealKey::InFlight {
                replica: status.replica,
                dirty: status.changed_in_flight,
                leaving: status.leaving,
            },
        }
    }
}

/// A key as the real queue holds it, in the model's terms.
#[derive(Debug)]
pub(super) enum RealKey {
    Absent,
    Idle,
    /// Ready, or waiting for a backoff (the model hands out ready keys at any time, so it may
    /// hand out one the code still holds back: the code's choice is one of the model's).
    Ready {
        leaving: bool,
    },
    /// In flight on the session of `replica`; `None` when held after its session was closed or
    /// replaced.
    InFlight {
        replica: Option<String>,
        dirty: bool,
        leaving: bool,
    },
}

impl RealKey {
    fn matches(&self, modelled: Key) -> bool {
        match (self, modelled) {
            (Self::Absent, Key::Absent) | (Self::Idle, Key::Idle) => true,
            (Self::Ready { leaving }, Key::Ready { leaving: m }) => *leaving == m,
            (
                Self::InFlight {
                    replica,
                    dirty,
                    leaving,
                },
                Key::InFlight {
                    replica: r,
                    dirty: md,
                    leaving: ml,
                    ..
                },
            ) => {
                replica
                    .as_ref()
                    .is_none_or(|name| *name == replica_name(usize::from(r)))
                    && *dirty == md
                    && *leaving == ml
            }
            _ => false,
        }
    }
}
