//! Sessions opened, answered, acknowledged, closed and expired on a dispatcher's queue.

use kube_dispatch_core::queue::Outcome;

use super::{Real, TICK, replica_name};
use crate::{Key, Message, Protocol, State, bit};

impl Real {
    /// Dispatcher `d` answers the held poll of replica `r`: the keys its group's queue hands
    /// out, if it hands out anything now (`Group::take`), as the mask of the model's `Answer`.
    pub fn answer(&mut self, d: usize, r: usize) -> u8 {
        let now = self.now();
        let keys = self.keys.clone();
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return 0;
        };
        p.answered.clear();
        let (Some(slice), Some(session)) = (&p.slice, p.sessions[r]) else {
            return 0;
        };
        if !slice.hands_out(now) {
            return 0;
        }
        let mut mask = 0;
        for delivery in p.groups[g].queue.take(session, keys.len(), now) {
            if let Some(k) = keys.iter().position(|key| *key == delivery.key) {
                let e = g * keys.len() + k;
                mask |= bit(e);
                p.answered.push((e, delivery.id));
            }
        }
        mask
    }

    /// Replica `r` opens a session on dispatcher `d`, replacing the one it had there, whose
    /// keys in flight are held until it would have expired (`Group::add_session`).
    pub(super) fn open(&mut self, r: usize, d: usize, before: &State, after: &State) {
        if after.dispatchers[d].sessions[r].is_none() {
            return;
        }
        self.opens[r][d] += 1;
        let now = self.now();
        let id = self.next_session;
        self.next_session += 1;
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let queue = &mut p.groups[g].queue;
        if let (Some(old), Some(left)) = (p.sessions[r], before.dispatchers[d].sessions[r]) {
            queue.remove_session_holding(old, now + TICK * u32::from(left));
        }
        queue.add_session(id, &replica_name(r));
        p.sessions[r] = Some(id);
    }

    /// Records which real delivery each key of the model's answer is.
    pub(super) fn answered(&mut self, r: usize, d: usize, after: &State) -> Result<(), String> {
        let Some(p) = &mut self.processes[d] else {
            return Ok(());
        };
        for (k, id) in std::mem::take(&mut p.answered) {
            let Key::InFlight {
                replica, delivery, ..
            } = after.dispatchers[d].keys[k]
            else {
                return Err(format!(
                    "dispatcher-{d} handed key {k} out to replica-{r}, which the model did not"
                ));
            };
            debug_assert_eq!(usize::from(replica), r);
            p.deliveries.insert((k, delivery), id);
        }
        Ok(())
    }

    /// An ack of replica `r` reaches dispatcher `d`, if the model's dispatcher takes calls of
    /// that session.
    pub(super) fn ack(&mut self, r: usize, d: usize, k: u8, before: &State) {
        let disp = &before.dispatchers[d];
        if !disp.up || disp.sessions[r].is_none() || disp.closed[r] {
            return;
        }
        let delivery = before.messages.iter().find_map(|m| match *m {
            Message::Ack {
                replica,
                dispatcher,
                key,
                delivery,
            } if (usize::from(replica), usize::from(dispatcher), key) == (r, d, k) => {
                Some(delivery)
            }
            _ => None,
        });
        let now = self.now();
        let (g, _) = self.entry(usize::from(k));
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let (Some(session), Some(delivery)) = (p.sessions[r], delivery) else {
            return;
        };
        let id = p
            .deliveries
            .get(&(usize::from(k), delivery))
            .copied()
            .unwrap_or(0);
        p.groups[g].queue.ack(session, id, Outcome::Success, now);
    }

    /// CloseSession of replica `r` reaches dispatcher `d`: its keys in flight are held until
    /// the session would have expired (`Group::close_session`), or go back at once in the
    /// model's old variant.
    pub(super) fn close(&mut self, r: usize, d: usize, model: &Protocol, before: &State) {
        let disp = &before.dispatchers[d];
        let Some(left) = disp.sessions[r] else { return };
        if !disp.up || disp.closed[r] {
            return;
        }
        let now = self.now();
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let Some(session) = p.sessions[r] else { return };
        let queue = &mut p.groups[g].queue;
        match model.config.closes {
            crate::Closes::Hold => {
                queue.remove_session_holding(session, now + TICK * u32::from(left));
            }
            crate::Closes::Release => {
                queue.remove_session(session);
                p.sessions[r] = None;
            }
        }
    }

    /// Dispatcher `d` expires the session of replica `r` (a closed one's held keys go back at
    /// their timer).
    pub(super) fn expire(&mut self, r: usize, d: usize, before: &State) {
        let now = self.now();
        let closed = before.dispatchers[d].closed[r];
        let g = self.group_of(r);
        let Some(p) = &mut self.processes[d] else {
            return;
        };
        let queue = &mut p.groups[g].queue;
        if let Some(session) = p.sessions[r].take()
            && !closed
        {
            queue.remove_session(session);
        }
        queue.advance(now);
    }
}
