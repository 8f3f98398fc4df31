//! What the watch and the resync make of keys: changes, observed objects, the deletions a
//! re-list finds, resyncs and touches of related keys.

use std::time::Duration;

use kube_dispatch_proto::v1::Reason;

use super::{
    Change, Entry, GroupQueue, Lane, Observed, SessionId, State,
    compact::{Rv, Uid},
    dedup, is_related,
    keys::Key,
    merge_reason,
};

impl GroupQueue {
    /// Records a change to `key`, in the live lane. Returns the sessions that now have ready
    /// keys.
    pub fn change(&mut self, key: &str, change: Change) -> Vec<SessionId> {
        self.change_in(key, change, Lane::Live)
    }

    /// Records a change to `key`, queued in `lane` if it was not ready (and moved to the live
    /// lane if it waited in the listed one and `lane` is live). Returns the sessions that now
    /// have ready keys.
    pub fn change_in(&mut self, key: &str, change: Change, lane: Lane) -> Vec<SessionId> {
        let key = match self.prefixes.find(key) {
            Some(k) if self.entries.contains_key(&k) => k,
            _ => {
                let k = self.prefixes.retain(key);
                self.entries.insert(
                    k.clone(),
                    Entry {
                        state: State::Idle,
                        reason: change.reason,
                        resource_version: Rv::Empty,
                        uid: Uid::Empty,
                        deleted: false,
                        failures: 0,
                        seen: 0,
                        fingerprint: None,
                    },
                );
                k
            }
        };
        self.change_key(key, change, lane)
    }

    pub(super) fn change_key(&mut self, key: Key, change: Change, lane: Lane) -> Vec<SessionId> {
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        // The name re-used before the earlier object's deletion was delivered (or while it is
        // backing off): that deletion goes first, with its own uid, so the reconciler can tell
        // the two objects apart and nothing is lost.
        let deletion_pending = entry.deleted
            && match entry.state {
                State::Ready { .. } | State::Delayed => true,
                // In flight, the deletion came after the delivery when the key is dirty.
                State::InFlight { dirty, .. } => dirty,
                State::Idle => false,
            };
        if deletion_pending
            && !change.deleted
            && !change.uid.is_empty()
            && entry.uid != Uid::Empty
            && entry.uid != Uid::new(&change.uid)
        {
            self.tombstones
                .entry(key.clone())
                .or_insert_with(|| (entry.uid.clone(), entry.resource_version.clone()));
        }
        entry.reason = merge_reason(entry.state, entry.reason, change.reason);
        if let Some(trace) = change.trace {
            // The first change since the last delivery is the one the wait began with.
            self.traces.entry(key.clone()).or_insert(trace);
        }
        let owned = is_related(change.reason);
        // A change of an owned or a named object, or a trigger, says nothing about the key's own
        // object: its version, uid, state and body stay as they were (a body kept from its last
        // delivery is of that version).
        if !owned {
            if !change.resource_version.is_empty() {
                entry.resource_version = Rv::new(&change.resource_version);
            }
            if !change.uid.is_empty() {
                entry.uid = Uid::new(&change.uid);
            }
            entry.deleted = change.deleted;
            // Replace the body: the latest state is the one worth delivering.
            self.drop_body(&key);
            if let Some(body) = change.body
                && self.body_bytes + body.len() <= self.config.body_budget.min(self.body_share)
                && self.pool.take(body.len())
            {
                self.body_bytes += body.len();
                self.bodies.insert(key.clone(), body);
            }
        }
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        match entry.state {
            // Waiting behind listed keys: a live change goes ahead of them.
            State::Ready { listed: true } if lane == Lane::Live => self.move_to_live(key),
            State::Ready { .. } => Vec::new(),
            State::InFlight { .. } => {
                entry.state = State::InFlight { dirty: true };
                Vec::new()
            }
            State::Idle => self.enqueue(key, lane),
            // A retry or a requeue-after comes due in the live lane: a listed change that
            // brings it forward does not put it behind the listed keys.
            State::Delayed => {
                self.cancel_timer(&key);
                self.enqueue(key, Lane::Live)
            }
        }
    }

    /// Records that the object of `key` exists as `object`, seen in list epoch `epoch`: queued
    /// as added if the key is new (or was deleted), as modified if its resourceVersion changed,
    /// and not at all if this exact version was already seen (a re-list of an unchanged
    /// object), or if the subscription's change filter finds the parts it compares unchanged
    /// (equal [`Observed::fingerprint`]s) while the key is not waiting to be handed out: the
    /// recorded version stays (keys.md, "Change filters"). A change goes to the live lane: call
    /// with what the watch's stream shows. Returns the sessions that now have ready keys.
    pub fn observe(&mut self, key: &str, object: Observed, epoch: u32) -> Vec<SessionId> {
        self.observe_in(key, object, epoch, Lane::Live)
    }

    /// [`GroupQueue::observe`] with the lane a change goes to: [`Lane::Listed`] for what a
    /// list shows.
    pub fn observe_in(
        &mut self,
        key: &str,
        object: Observed,
        epoch: u32,
        lane: Lane,
    ) -> Vec<SessionId> {
        let known = self.prefixes.find(key);
        let reason = match known.as_ref().and_then(|k| self.entries.get_mut(k)) {
            Some(e) if !e.deleted && e.uid == Uid::new(&object.uid) => {
                e.seen = epoch;
                if e.resource_version.matches(&object.resource_version) {
                    return Vec::new();
                }
                // Waiting to be handed out, a change joins the delivery at no cost.
                let waiting = matches!(e.state, State::Ready { .. });
                if !waiting && object.fingerprint.is_some() && object.fingerprint == e.fingerprint {
                    // Not delivered, but the version moves on (so a re-list showing it again
                    // is no change), and a body held for an older one goes: a later delivery
                    // (a retry, a resync, a child's change) names this version. One kept from
                    // the key's last delivery is replaced by this version's, within the
                    // budget and the pool; any other is read at least as new.
                    e.resource_version = Rv::new(&object.resource_version);
                    self.counts.changes_filtered += 1;
                    if let Some(key) = known
                        && self.drop_body(&key).is_some()
                        && let Some(body) = object.body
                        && self.body_bytes + body.len()
                            <= self.config.body_budget.min(self.body_share)
                        && self.pool.take(body.len())
                    {
                        self.body_bytes += body.len();
                        self.bodies.insert(key, body);
                    }
                    return Vec::new();
                }
                Reason::Modified
            }
            _ => Reason::Added,
        };
        let fingerprint = object.fingerprint;
        let wake = self.change_in(
            key,
            Change {
                reason,
                resource_version: object.resource_version,
                uid: object.uid,
                body: object.body,
                deleted: false,
                trace: object.trace,
            },
            lane,
        );
        if let Some(e) = self
            .prefixes
            .find(key)
            .and_then(|k| self.entries.get_mut(&k))
        {
            e.seen = epoch;
            e.fingerprint = fingerprint;
        }
        wake
    }

    /// Queues as deleted every live key accepted by `belongs` (the keys of one subscription)
    /// that was not seen in list epoch `epoch`: the deletions that happened while the watch
    /// was down. Call when a re-list ends. Returns the sessions that now have ready keys.
    pub fn sweep(&mut self, epoch: u32, belongs: impl Fn(&str) -> bool) -> Vec<SessionId> {
        let mut text = String::new();
        let gone: Vec<Key> = self
            .entries
            .iter()
            .filter(|(k, e)| {
                !e.deleted && e.seen != epoch && belongs(self.prefixes.spell(k, &mut text))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut wake = Vec::new();
        for key in gone {
            wake.extend(self.change_key(key, Change::deletion(), Lane::Live));
        }
        dedup(wake)
    }

    /// Queues `key` for a resync if it is idle: nothing is known to have changed, so a key
    /// already queued, in flight or delayed is left alone, and no body is attached. Returns the
    /// sessions that now have ready keys.
    pub fn resync(&mut self, key: &str) -> Vec<SessionId> {
        match self.prefixes.find(key) {
            Some(key) => self.resync_key(key),
            None => Vec::new(),
        }
    }

    pub(super) fn resync_key(&mut self, key: Key) -> Vec<SessionId> {
        let Some(entry) = self.entries.get_mut(&key) else {
            return Vec::new();
        };
        if entry.state != State::Idle {
            return Vec::new();
        }
        entry.reason = Reason::Resync;
        self.enqueue(key, Lane::Listed)
    }

    /// The keys whose objects the queue knows exist (a version seen, not deleted) that `keep`
    /// accepts: a snapshot for [`GroupQueue::touch`], taken under the caller's lock in one pass
    /// and handed back a chunk at a time, so no single hold of the lock is long.
    pub fn live_keys(&self, keep: impl Fn(&str) -> bool) -> Vec<Key> {
        let mut text = String::new();
        self.entries
            .iter()
            .filter(|(k, e)| e.is_live() && keep(self.prefixes.spell(k, &mut text)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Asks again for a reconcile of `keys` ([`GroupQueue::live_keys`]) whose objects still
    /// exist, as a related change of `reason` ([`Change::related`]): queued if idle, coalesced
    /// if ready, run again after the reconcile in flight. Returns the sessions that now have
    /// ready keys.
    pub fn touch(&mut self, keys: &[Key], reason: Reason) -> Vec<SessionId> {
        let mut wake = Vec::new();
        for key in keys {
            if self.entries.get(key).is_some_and(Entry::is_live) {
                wake.extend(self.change_key(key.clone(), Change::related(reason), Lane::Listed));
            }
        }
        dedup(wake)
    }

    /// Resyncs the keys whose turn came in the `elapsed` time since the last call, so that
    /// every key is resynced once per `interval`, evenly spread: `len * elapsed / interval`
    /// keys, the fraction of a key carried to the next call (rounded up instead, a queue of
    /// fewer keys than an interval has calls would resync one key at every call: each key
    /// every few seconds, not once an interval). Returns the sessions that now have ready keys.
    pub fn resync_due(&mut self, elapsed: Duration, interval: Duration) -> Vec<SessionId> {
        let interval = interval.as_nanos().max(1);
        let owed = self.resync_carry + self.entries.len() as u128 * elapsed.as_nanos();
        self.resync_carry = owed % interval;
        self.resync_batch(usize::try_from(owed / interval).unwrap_or(usize::MAX))
    }

    /// Resyncs the next `n` keys in index order, wrapping around. Returns the sessions that now
    /// have ready keys.
    pub fn resync_batch(&mut self, n: usize) -> Vec<SessionId> {
        let mut wake = Vec::new();
        for _ in 0..n.min(self.entries.len()) {
            if self.resync_cursor >= self.entries.len() {
                self.resync_cursor = 0;
            }
            let Some((key, _)) = self.entries.get_index(self.resync_cursor) else {
                break;
            };
            let key = key.clone();
            self.resync_cursor += 1;
            wake.extend(self.resync_key(key));
        }
        dedup(wake)
    }
}
