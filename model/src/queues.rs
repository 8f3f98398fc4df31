//! What a dispatcher's queues make of keys: what they hold, release and forget as the slice
//! changes, what a list or the stream shows, and deletions.

use crate::{Dispatcher, Key, Protocol, bit, has};

impl Protocol {
    /// The ring `d` has released: its ring, once no key that moved away is queued or in flight,
    /// and while it waits out no member that died (`Handover::waits_on_dead`).
    pub(super) fn release(&self, disp: &Dispatcher, d: usize) -> Option<u8> {
        if self.config.withhold && disp.died.iter().any(|w| *w > 0) {
            return None;
        }
        self.queue_release(disp, d)
    }

    /// The ring `d`'s queue lets it release: its ring, once no key that moved away is queued
    /// or in flight.
    pub(super) fn queue_release(&self, disp: &Dispatcher, d: usize) -> Option<u8> {
        let moving = self.moving(disp, d) != 0;
        (has(disp.ring, d) && !moving).then_some(disp.ring)
    }

    /// Whether `d`, on its ring, releases it not yet only because a group after the first still
    /// delivers a key that moved away, the first group having handed over: the case a release
    /// that asked the first group alone would get wrong.
    pub(crate) fn waits_for_a_later_group(&self, disp: &Dispatcher, d: usize) -> bool {
        let moving = self.moving(disp, d);
        disp.up && has(disp.ring, d) && moving != 0 && !has(moving, 0usize)
    }

    /// The groups (a bit each) whose queue at `d` still holds a key that moved away, queued or
    /// in flight.
    pub(crate) fn moving(&self, disp: &Dispatcher, d: usize) -> u8 {
        disp.keys
            .iter()
            .enumerate()
            .filter(|(k, key)| {
                let leaving = matches!(
                    key,
                    Key::Ready { leaving: true } | Key::InFlight { leaving: true, .. }
                );
                leaving && !self.owns(disp.ring, *k, d)
            })
            .fold(0, |m, (k, _)| m | bit(self.group(k)))
    }

    /// Trims `d`'s queue to what it serves now (`Transit::trim`): while it serves, the keys
    /// it does not serve moved; while it hands out nothing but is on its ring, the keys it does
    /// not own. A moved key in flight (or queued, when it served until now) stays until it
    /// settles and is then forgotten; any other moved key is forgotten at once; a key that did
    /// not move is no longer on its way out. Off its own ring it keeps its index as it is.
    pub(super) fn trim_to_slice(&self, disp: &mut Dispatcher, d: usize, was_serving: bool) {
        if disp.settled.is_some() || has(disp.ring, d) {
            let drain = disp.settled.is_some() && was_serving;
            for k in 0..disp.keys.len() {
                let moved = if disp.settled.is_some() {
                    !self.serves(disp, d, k)
                } else {
                    !self.owns(disp.ring, k, d)
                };
                let key = &mut disp.keys[k];
                *key = match *key {
                    _ if !moved => key.leaving(false),
                    Key::InFlight { .. } => key.leaving(true),
                    Key::Ready { .. } if drain => key.leaving(true),
                    _ => Key::Absent,
                };
            }
        }
        // The transit's deletions: held ones of keys that moved away again are remembered as
        // owned elsewhere; remembered ones of keys that moved here are held; held ones of keys
        // now served are queued.
        let owned = (0..disp.keys.len())
            .filter(|k| self.owns(disp.ring, *k, d))
            .fold(0u8, |m, k| m | bit(k));
        // The index of held keys forgets the keys that moved away (their new owner lists them);
        // off its own ring, it stays as it was.
        if has(disp.ring, d) {
            disp.held_index &= owned;
        }
        let away = disp.held_deletions & !owned;
        disp.held_deletions &= !away;
        disp.recent |= away;
        let moved_in = disp.recent & owned;
        disp.recent &= !moved_in;
        disp.held_deletions |= moved_in;
        for k in 0..disp.keys.len() {
            if has(disp.held_deletions, k) && self.serves(disp, d, k) {
                disp.held_deletions &= !bit(k);
                Self::queue_deletion(disp, k, false);
            }
        }
    }

    /// Forgets the keys that moved away and wait ready for a group with no session here to take
    /// them (its replicas gone, closed, or expired), remembering their deletions for the new
    /// owner (`GroupQueue::abandon_leaving_ready`, from `Transit::trim`): held for a session
    /// that may not come, they would hold the release back for every group.
    pub(super) fn abandon(&self, disp: &mut Dispatcher) {
        for k in 0..disp.keys.len() {
            if disp.keys[k] != (Key::Ready { leaving: true }) {
                continue;
            }
            let g = self.group(k);
            let taken = (0..disp.sessions.len())
                .any(|r| self.group_of(r) == g && disp.sessions[r].is_some() && !disp.closed[r]);
            if taken {
                continue;
            }
            if has(disp.gone, k) {
                disp.recent |= bit(k);
            }
            disp.keys[k] = Key::Absent;
        }
    }

    /// Queues a change of `key` at `d` (`GroupQueue::change`).
    pub(super) fn queue(key: &mut Key) {
        *key = match *key {
            Key::Absent | Key::Idle => Key::Ready { leaving: false },
            Key::InFlight {
                replica,
                deadline,
                delivery,
                session,
                leaving,
                ..
            } => Key::InFlight {
                replica,
                deadline,
                delivery,
                session,
                dirty: true,
                leaving,
            },
            ready => ready,
        };
    }

    /// Whether `d` records a change of `key` in its queue (`GroupEvent::Exists`): it serves the
    /// key; or, while it hands out nothing, it knows the key or owns it on its ring
    /// (`Transit::keeps`); or the key moved away and is still here, queued or in flight
    /// (`GroupQueue::is_leaving`).
    pub(super) fn records(&self, disp: &Dispatcher, d: usize, key: usize) -> bool {
        let leaving = matches!(
            disp.keys[key],
            Key::Ready { leaving: true } | Key::InFlight { leaving: true, .. }
        );
        let keeps = disp.settled.is_none()
            && (disp.keys[key] != Key::Absent || self.owns(disp.ring, key, d));
        self.serves(disp, d, key) || keeps || leaving
    }

    /// The list beside the watch when the keys `d` serves may have grown (`GroupEvent::Listed`):
    /// every served key it does not know is queued; keys it knows it has kept up with.
    pub(super) fn fill(&self, disp: &mut Dispatcher, d: usize, objects: u8) {
        let present = self.present(disp);
        for k in (0..disp.keys.len()).filter(|k| has(present, *k)) {
            let unknown = disp.keys[k] == Key::Absent || has(disp.objectless, k);
            if self.serves(disp, d, k) && has(objects, self.object(k)) && unknown {
                disp.objectless &= !bit(k);
                disp.nameless &= !bit(k);
                disp.held_index &= !bit(k);
                Self::queue(&mut disp.keys[k]);
            }
        }
    }

    /// `d`'s watch shows the object of `key`, `created` again after a deletion or changed
    /// (`Transit::record` of `GroupEvent::Exists` and `ExistsElsewhere`): a deletion held or
    /// remembered for it is forgotten unless the key is served; the queue records it if it
    /// records the key ([`Protocol::records`]), a deletion of the earlier object not yet
    /// delivered going first.
    pub(super) fn exists(&self, disp: &mut Dispatcher, d: usize, key: usize, created: bool) {
        if !self.serves(disp, d, key) {
            if self.owns(disp.ring, key, d) {
                disp.held_deletions &= !bit(key);
            }
            disp.recent &= !bit(key);
        }
        if self.indexes_held(disp, d, key) {
            disp.held_index |= bit(key);
        }
        if !self.records(disp, d, key) {
            return;
        }
        disp.held_index &= !bit(key);
        if created && has(disp.gone, key) {
            let pending = match disp.keys[key] {
                Key::Ready { .. } => true,
                Key::InFlight { dirty, .. } => dirty,
                _ => false,
            };
            if pending && !has(disp.nameless, key) {
                disp.tomb |= bit(key);
            }
            disp.gone &= !bit(key);
        }
        disp.nameless &= !bit(key);
        disp.objectless &= !bit(key);
        Self::queue(&mut disp.keys[key]);
    }

    /// Queues the deletion of `key` at `d` (`GroupQueue::change` of a deletion).
    /// `named`: the deletion carries the object's uid (seen on the watch); otherwise it is
    /// known by its key alone.
    pub(super) fn queue_deletion(disp: &mut Dispatcher, key: usize, named: bool) {
        if named {
            disp.nameless &= !bit(key);
        } else if disp.keys[key] == Key::Absent {
            disp.nameless |= bit(key);
        }
        Self::queue(&mut disp.keys[key]);
        disp.gone |= bit(key);
        disp.objectless &= !bit(key);
    }

    /// A deletion `d`'s watch shows (`Transit::record` of `GroupEvent::Deleted`): queued if it serves
    /// the key; held for the end of a handover if it owns it on its ring; remembered if it is
    /// owned elsewhere (and queued too if the key is on its way out).
    pub(super) fn deleted(&self, disp: &mut Dispatcher, d: usize, key: usize, named: bool) {
        disp.held_index &= !bit(key);
        if self.serves(disp, d, key) {
            Self::queue_deletion(disp, key, named);
            return;
        }
        if self.owns(disp.ring, key, d) {
            disp.held_deletions |= bit(key);
        } else {
            disp.recent |= bit(key);
        }
        // Still here on its way out: recorded too, so that if its object is created again,
        // the earlier object's deletion goes first.
        if matches!(
            disp.keys[key],
            Key::Ready { leaving: true } | Key::InFlight { leaving: true, .. }
        ) {
            Self::queue_deletion(disp, key, named);
        }
    }

    /// The re-list of `d`'s watch once it reaches the API server again (`GroupEvent::Exists` of
    /// each object): every key it records that it did not know, or whose change it missed, is
    /// queued.
    pub(super) fn relist(&self, disp: &mut Dispatcher, d: usize, objects: u8) {
        let present = self.present(disp);
        for k in (0..disp.keys.len()).filter(|k| has(present, *k)) {
            if !has(objects, self.object(k)) {
                // The sweep at the end of the list: a key known here, live as far as it knows,
                // whose object the list did not show was deleted meanwhile (`GroupQueue::sweep`).
                if disp.keys[k] != Key::Absent && !has(disp.gone, k) {
                    Self::queue_deletion(disp, k, false);
                }
            } else if disp.keys[k] == Key::Absent || has(disp.stale, k) {
                // Its version here is older: shown as a change (as created again, if the queue
                // recorded its deletion).
                self.exists(disp, d, k, true);
            }
        }
        disp.stale = 0;
        // The sweep of the index of held keys: a key it knew exists that the list did not
        // show was deleted meanwhile, as if the watch had seen it (`Transit::sweep`).
        for k in 0..disp.keys.len() {
            if has(disp.held_index, k) && !has(objects, self.object(k)) {
                self.deleted(disp, d, k, false);
            }
        }
    }

    /// The keys `d`, serving, owns on its ring and does not serve, whose objects exist and
    /// which neither its queue nor its index of held keys knows: what the list a handover's
    /// start asks for would add to the index ([`crate::Action::IndexHeld`]).
    pub(crate) fn unindexed_held(&self, disp: &Dispatcher, d: usize, objects: u8) -> u8 {
        if !disp.up || !disp.api || disp.settled.is_none() {
            return 0;
        }
        let present = self.present(disp);
        (0..disp.keys.len())
            .filter(|k| has(present, *k) && !has(disp.held_index, *k))
            .filter(|k| has(objects, self.object(*k)) && self.indexes_held(disp, d, *k))
            .fold(0, |m, k| m | bit(k))
    }

    /// Whether `d`'s index of held keys takes `key` when its watch shows its object: it owns
    /// the key on its ring, and its queue does not record it ([`Protocol::records`]: not
    /// served, nor kept while it hands out nothing, nor on its way out).
    fn indexes_held(&self, disp: &Dispatcher, d: usize, key: usize) -> bool {
        self.owns(disp.ring, key, d) && !self.records(disp, d, key) && disp.keys[key] == Key::Absent
    }

    /// Puts a key back after its delivery ended without an ack (session gone, void).
    pub(super) fn requeue(key: &mut Key) {
        if let Key::InFlight { leaving, .. } = *key {
            *key = if leaving {
                Key::Absent
            } else {
                Key::Ready { leaving: false }
            };
        }
    }
}
