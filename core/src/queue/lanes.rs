//! The ready lanes: where a key waits for delivery, in which lane (live or listed) and in what
//! order, and how stale places (a key's old place in a lane it left) are kept within their bound.

use std::collections::VecDeque;

use super::{
    GroupQueue, Lane, Queued, SessionId, State,
    keys::{HashSet, Key},
};

/// The two FIFOs of ready keys of a session (or of the keys no session is assigned). A key's
/// place is valid while its entry is ready in that lane; other places are stale, passed over
/// when reached and dropped when the lanes are compacted.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    pub(super) live: VecDeque<Queued>,
    pub(super) listed: VecDeque<Queued>,
}

impl Lanes {
    pub(super) fn lane(&mut self, lane: Lane) -> &mut VecDeque<Queued> {
        match lane {
            Lane::Live => &mut self.live,
            Lane::Listed => &mut self.listed,
        }
    }

    /// The next place to look at: live first.
    pub(super) fn pop(&mut self) -> Option<(Lane, Queued)> {
        if let Some(q) = self.live.pop_front() {
            return Some((Lane::Live, q));
        }
        self.listed.pop_front().map(|q| (Lane::Listed, q))
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.live.len() + self.listed.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (Lane, &Queued)> {
        self.live
            .iter()
            .map(|q| (Lane::Live, q))
            .chain(self.listed.iter().map(|q| (Lane::Listed, q)))
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(Lane, &Queued) -> bool) {
        self.live.retain(|q| keep(Lane::Live, q));
        self.listed.retain(|q| keep(Lane::Listed, q));
    }

    pub(super) fn append(&mut self, other: Lanes) {
        self.live.extend(other.live);
        self.listed.extend(other.listed);
    }
}

/// Stale places (a key's old place in a lane it moved out of) the lanes may hold beyond the
/// ready keys before they are compacted, so a few moves never cost a pass. (Small in the queue's own tests, so random
/// operations compact too.)
#[cfg(not(test))]
pub const STALE_SLACK: usize = 1024;
/// Stale places the lanes may hold beyond the ready keys before they are compacted.
#[cfg(test)]
pub const STALE_SLACK: usize = 4;

impl GroupQueue {
    /// Places in the lanes, stale ones included (see the module's "Bounds").
    #[cfg(test)]
    pub(super) fn places(&self) -> usize {
        self.unassigned.len() + self.sessions.values().map(|s| s.ready.len()).sum::<usize>()
    }

    /// Whether `q`, found in `lane`, is its key's place: the key is ready in that lane.
    pub(super) fn is_place(&self, lane: Lane, q: &Queued) -> bool {
        self.entries
            .get(&q.key)
            .is_some_and(|e| e.state == lane.ready())
    }

    /// Drops the stale places once they outnumber the ready keys (and [`STALE_SLACK`]): one
    /// pass, after at least as many places were left behind, so each costs O(1) amortised.
    pub(super) fn compact_if_stale(&mut self) {
        if self.stale <= STALE_SLACK.max(self.ready_count) {
            return;
        }
        let entries = &self.entries;
        let mut seen: HashSet<Key> = HashSet::default();
        for lanes in self
            .sessions
            .values_mut()
            .map(|s| &mut s.ready)
            .chain(std::iter::once(&mut self.unassigned))
        {
            lanes.retain(|lane, q| {
                entries.get(&q.key).is_some_and(|e| e.state == lane.ready())
                    && seen.insert(q.key.clone())
            });
        }
        self.stale = 0;
    }

    /// Moves the keys of `keys` that are ready ahead of every other ready key, in the order
    /// given, into the live lane: changes a handover held back go before the keys it brought,
    /// which reach the queue in a list's (name) order. Keys not ready are left where they are.
    /// O(1) a key moved (amortised: see [`STALE_SLACK`]); a moved key's wait
    /// ([`Delivery::queued`](super::Delivery::queued)) counts from the move.
    pub fn promote<'k>(&mut self, keys: impl IntoIterator<Item = &'k str>) {
        let mut promoted: Vec<Key> = Vec::new();
        let mut taken: HashSet<Key> = HashSet::default();
        for key in keys {
            if let Some(k) = self.prefixes.find(key)
                && self
                    .entries
                    .get(&k)
                    .is_some_and(|e| matches!(e.state, State::Ready { .. }))
                && taken.insert(k.clone())
            {
                promoted.push(k);
            }
        }
        if promoted.is_empty() {
            return;
        }
        let base = self.front_seq.saturating_sub(promoted.len() as u64);
        self.front_seq = base;
        // Each to the front of its session's live lane, the last given first, so the first
        // given goes first; their earlier places go stale.
        for (rank, key) in promoted.into_iter().enumerate().rev() {
            if let Some(e) = self.entries.get_mut(&key) {
                e.state = Lane::Live.ready();
            }
            self.stale += 1;
            let queued = Queued {
                seq: base + rank as u64,
                since: self.now,
                key,
            };
            let assigned = self.assign(&queued.key);
            match assigned.and_then(|id| self.sessions.get_mut(&id)) {
                Some(s) => s.ready.live.push_front(queued),
                None => self.unassigned.live.push_front(queued),
            }
        }
        self.compact_if_stale();
    }

    /// Moves a key ready in the listed lane to the back of the live lane; its listed place
    /// goes stale. Its wait ([`Delivery::queued`](super::Delivery::queued)) counts from the move.
    pub(super) fn move_to_live(&mut self, key: Key) -> Vec<SessionId> {
        if let Some(e) = self.entries.get_mut(&key) {
            e.state = Lane::Live.ready();
        }
        self.stale += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        let queued = Queued {
            seq,
            since: self.now,
            key,
        };
        let wake = self.place(queued, Lane::Live);
        self.compact_if_stale();
        wake
    }

    /// Makes an idle or delayed key ready, at the back of `lane` of the session that owns it.
    pub(super) fn enqueue(&mut self, key: Key, lane: Lane) -> Vec<SessionId> {
        self.counts.adds += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        entry.state = lane.ready();
        self.ready_count += 1;
        let queued = Queued {
            seq,
            since: self.now,
            key,
        };
        self.place(queued, lane)
    }

    /// Puts `queued` at the back of `lane` of the session its key is assigned to (or of the
    /// unassigned keys). Returns that session.
    pub(super) fn place(&mut self, queued: Queued, lane: Lane) -> Vec<SessionId> {
        let assigned = self.assign(&queued.key);
        match assigned.and_then(|id| Some((id, self.sessions.get_mut(&id)?))) {
            Some((id, s)) => {
                s.ready.lane(lane).push_back(queued);
                vec![id]
            }
            None => {
                self.unassigned.lane(lane).push_back(queued);
                Vec::new()
            }
        }
    }
}
