//! Bodies and memos: the object bodies kept for ready keys (and, for groups that keep them,
//! delivered ones) within the group's budget and the process's pool, and the memos reconciles
//! leave for their successors.

use std::sync::Arc;

use super::{DeliveryId, GroupQueue, Observed, SessionId, State, compact::Uid, keys::Key};

/// Delivered bodies are kept only while the pool is at most `1 / KEPT_POOL_SHARE` full.
const KEPT_POOL_SHARE: usize = 4;

impl GroupQueue {
    /// Bytes of object bodies held.
    pub fn body_bytes(&self) -> usize {
        self.body_bytes
    }

    /// Holds this group to `share` bytes of bodies while the pool is short (`None`: no longer
    /// short): drops bodies down to it and takes no more past it, so a group that keeps
    /// changing cannot take back what it gave; returns the bytes given back to the pool.
    pub fn hold_bodies_to(&mut self, share: Option<usize>) -> usize {
        self.body_share = share.unwrap_or(usize::MAX);
        share.map_or(0, |share| self.shed_bodies(share))
    }

    /// Drops bodies until at most `keep` bytes are held, those kept from a delivery of a key
    /// not ready now first ([`super::QueueConfig::keep_delivered_bodies`]), then those of
    /// ready keys (which are then delivered without body, and their controllers read the
    /// objects fresh); returns the bytes given back to the pool.
    pub(super) fn shed_bodies(&mut self, keep: usize) -> usize {
        let mut freed = 0;
        if self.body_bytes <= keep {
            return 0;
        }
        let over = self.body_bytes - keep;
        for ready_too in [false, true] {
            let entries = &self.entries;
            self.bodies.retain(|key, body| {
                let ready = entries
                    .get(key)
                    .is_some_and(|e| matches!(e.state, State::Ready { .. }));
                if freed >= over || (ready && !ready_too) {
                    return true;
                }
                freed += body.len();
                false
            });
        }
        self.body_bytes -= freed;
        self.pool.give_back(freed);
        freed
    }

    /// Removes `key`'s body, giving its bytes back.
    pub(super) fn drop_memo(&mut self, key: &Key) {
        if let Some((_, memo)) = self.memos.remove(key) {
            self.memo_bytes -= memo.len();
            self.memo_pool.give_back(memo.len());
        }
    }

    /// Keeps `memo` for the key of `delivery`, in flight on `session`, for the next delivery of
    /// the same object: a reconcile's note to its successor (what it wrote, at which versions),
    /// replacing the one kept before; an empty memo removes it. Call before the delivery's
    /// [`Self::ack`]. Nothing is kept for a delivery not in flight there, a deletion, or past
    /// the group's memo budget or the process's memo pool (counted in [`QueueCounts::memos_refused`](super::QueueCounts::memos_refused)): a memo
    /// is a hint its reader must do without. Returns whether it was kept.
    pub fn leave_memo(&mut self, session: SessionId, delivery: DeliveryId, memo: &[u8]) -> bool {
        let Some(key) = self
            .sessions
            .get(&session)
            .and_then(|s| s.in_flight.get(&delivery))
            .map(|(key, _)| key.clone())
        else {
            return false;
        };
        self.drop_memo(&key);
        let Some(entry) = self.entries.get(&key) else {
            return false;
        };
        // Left for the object the delivery showed: not for its deletion, nor for another
        // object that took its name meanwhile.
        let for_it = self
            .flights
            .get(&key)
            .and_then(|f| f.object.as_ref())
            .is_some_and(|uid| *uid == entry.uid);
        if memo.is_empty() || !for_it || entry.deleted || self.leaving.contains(&key) {
            return false;
        }
        if memo.len() > kube_dispatch_proto::MAX_MEMO_BYTES
            || self.memo_bytes + memo.len() > self.config.memo_budget
            || !self.memo_pool.take(memo.len())
        {
            self.counts.memos_refused += 1;
            return false;
        }
        self.memo_bytes += memo.len();
        let uid = entry.uid.clone();
        self.memos.insert(key, (uid, Arc::from(memo)));
        true
    }

    pub(super) fn drop_body(&mut self, key: &Key) -> Option<Arc<[u8]>> {
        let body = self.bodies.remove(key)?;
        self.body_bytes -= body.len();
        self.pool.give_back(body.len());
        Some(body)
    }

    /// The body to deliver with `key`, if `deliver`. Dropped from the queue, unless the group
    /// keeps delivered bodies ([`super::QueueConfig::keep_delivered_bodies`]) and holds at most
    /// half its budget (or share) while the pool is at most a quarter full (children's bodies,
    /// [`super::pool::HeldBody`], are taken while it is at most half full: kept bodies leave them a
    /// quarter at least, whoever keeps them, and are shed first): then it stays, and the
    /// key's next delivery carries it too, until a change of the key's own object replaces or
    /// drops it. So a delivery for a change of an owned or named object, which says nothing
    /// about the key's own, carries the object as the watch last showed it, as a cache would
    /// have it, and ready keys' bodies keep the other half.
    pub(super) fn body_to_deliver(&mut self, key: &Key, deliver: bool) -> Option<Arc<[u8]>> {
        let room = self.config.body_budget.min(self.body_share) / 2;
        let keep = self.config.keep_delivered_bodies
            && self.body_bytes <= room
            && self.pool.used() <= self.pool.capacity() / KEPT_POOL_SHARE;
        if keep {
            return self.bodies.get(key).filter(|_| deliver).cloned();
        }
        self.drop_body(key).filter(|_| deliver)
    }

    /// Attaches the body of `object` to `key` if it is ready at exactly that version without
    /// one (it was queued from a version alone), within the body budget.
    pub fn fill_body(&mut self, key: &str, object: Observed) {
        let Some(body) = object.body else { return };
        let Some(key) = self.prefixes.find(key) else {
            return;
        };
        let fits = self.entries.get(&key).is_some_and(|e| {
            matches!(e.state, State::Ready { .. })
                && !e.deleted
                && e.uid == Uid::new(&object.uid)
                && e.resource_version.matches(&object.resource_version)
        }) && !self.bodies.contains_key(&key)
            && !self.tombstones.contains_key(&key)
            && self.body_bytes + body.len() <= self.config.body_budget.min(self.body_share);
        if fits && self.pool.take(body.len()) {
            self.body_bytes += body.len();
            self.bodies.insert(key, body);
        }
    }
}
