//! Keys the ring moves away: forgotten at once when idle, kept until they settle when in flight
//! (or ready, while draining), and what the handover asks of them.

use super::{
    GroupQueue, State,
    keys::{HashSet, Key},
};

impl GroupQueue {
    /// Forgets every key for which `moved` is true (the ring moved them away). Keys in flight
    /// are kept until they settle and then forgotten, whatever the outcome: their new owner
    /// reconciles them next. With `drain`, keys ready for delivery are kept too and delivered
    /// here first (this dispatcher still owns them until it releases the ring), so a change it
    /// saw, a deletion above all, is not dropped in transit; then they are forgotten likewise.
    /// Without it (nothing may be handed out), they are dropped. A key that moves back before
    /// it settles is kept as usual.
    pub fn forget_where(&mut self, moved: impl Fn(&str) -> bool, drain: bool) {
        let mut text = String::new();
        let mut leaving = HashSet::default();
        let mut keys = HashSet::default();
        for (k, e) in &self.entries {
            if !moved(self.prefixes.spell(k, &mut text)) {
                continue;
            }
            let pending = matches!(e.state, State::InFlight { .. })
                || drain && matches!(e.state, State::Ready { .. });
            if pending {
                leaving.insert(k.clone());
            } else {
                keys.insert(k.clone());
            }
        }
        self.leaving = leaving;
        if keys.is_empty() {
            return;
        }
        for queue in self
            .sessions
            .values_mut()
            .map(|s| &mut s.ready)
            .chain(std::iter::once(&mut self.unassigned))
        {
            queue.retain(|_, q| !keys.contains(&q.key));
        }
        for key in keys {
            self.cancel_timer(&key);
            self.remove_entry(&key);
        }
    }

    /// Whether a key that moved away and is accepted by `pred` is still here, queued or in
    /// flight. Only such keys can be: [`Self::forget_where`] removed every other moved key, and
    /// a moved key is forgotten when its delivery settles. Cheap: it looks at those keys alone.
    pub fn any_leaving(&self, pred: impl Fn(&str) -> bool) -> bool {
        let mut text = String::new();
        self.leaving
            .iter()
            .any(|k| pred(self.prefixes.spell(k, &mut text)))
    }

    /// Forgets the keys that moved away and wait ready for delivery while the group has no
    /// session to take them (its replicas are gone, or hung until their sessions expired):
    /// held for a session that may not come, they would hold the ring's release back for
    /// every group. Their new owner reconciles them from its own list; the ones whose pending
    /// change is a deletion, which no list shows, are returned for the caller to remember
    /// (peers ask for them). Keys in flight stay until they settle.
    pub fn abandon_leaving_ready(&mut self) -> Vec<String> {
        if !self.sessions.is_empty() || self.leaving.is_empty() {
            return Vec::new();
        }
        let ready: HashSet<Key> = self
            .leaving
            .iter()
            .filter(|k| {
                self.entries
                    .get(*k)
                    .is_some_and(|e| matches!(e.state, State::Ready { .. }))
            })
            .cloned()
            .collect();
        if ready.is_empty() {
            return Vec::new();
        }
        self.unassigned.retain(|_, q| !ready.contains(&q.key));
        let mut deletions = Vec::new();
        for key in ready {
            if self.entries.get(&key).is_some_and(|e| e.deleted) {
                deletions.push(self.prefixes.text(&key));
            }
            self.leaving.remove(&key);
            self.remove_entry(&key);
        }
        deletions
    }

    /// Whether `key` moved away and is still here, queued or in flight ([`Self::forget_where`]).
    pub fn is_leaving(&self, key: &str) -> bool {
        self.prefixes
            .find(key)
            .is_some_and(|key| self.leaving.contains(&key))
    }

    /// Whether any key accepted by `pred` is in flight or ready for delivery.
    #[cfg(test)]
    pub(crate) fn any_pending(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.any_in_flight(&pred)
            || self
                .sessions
                .values()
                .flat_map(|s| s.ready.iter())
                .chain(self.unassigned.iter())
                .any(|(lane, q)| self.is_place(lane, q) && pred(&self.prefixes.text(&q.key)))
    }

    /// Whether any key accepted by `pred` is in flight.
    #[cfg(test)]
    pub(crate) fn any_in_flight(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.sessions
            .values()
            .flat_map(|s| s.in_flight.values().map(|(key, _)| key))
            .any(|k| pred(&self.prefixes.text(k)))
    }
}
