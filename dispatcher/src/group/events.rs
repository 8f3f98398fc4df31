//! What the group makes of events: each event of a key recorded against the slice current now,
//! the slice's changes trimming the queue, re-lists sweeping, resyncs and triggers.

use std::{
    sync::{Arc, MutexGuard},
    time::Duration,
};

use kube_dispatch_core::{
    handover::Slice,
    key::KeyRef,
    queue::{Change, SessionId},
    transit::GroupEvent,
};
use kube_dispatch_proto::{Ring, v1::Reason};

use super::{Group, KEYS_PER_HOLD, State};
#[cfg(doc)]
use kube_dispatch_core::{queue::GroupQueue, transit::Transit};

impl Group {
    /// The state, with the queue trimmed to the slice current now ([`Transit::trim`], which
    /// does nothing when that slice was applied already), and that slice; and the sessions the
    /// trim woke. Every decision against the slice is taken on a queue trimmed to it, under the
    /// state lock: a key the ring just moved away is already known to be on its way out.
    pub(super) fn current(&self) -> (MutexGuard<'_, State>, Arc<Slice>, Vec<SessionId>) {
        let mut state = self.state_now();
        let slice = self.slice.borrow().clone();
        let State { queue, transit, .. } = &mut *state;
        let (wake, _) = transit.trim(&slice, queue, Self::now());
        (state, slice, wake)
    }

    /// Records one event of a key, from a watch, a list beside it or a peer: the group's one
    /// entry for events. What it means for the group is decided in core
    /// ([`Transit::record`]), against the slice current now, on a queue trimmed to it, under
    /// the state lock.
    pub fn record(&self, event: GroupEvent<'_>) {
        self.record_all(std::iter::once(event));
    }

    /// [`Group::record`] of each of `events`, under one hold of the lock.
    pub(super) fn record_all<'k>(&self, events: impl IntoIterator<Item = GroupEvent<'k>>) {
        let (mut state, slice, mut wake) = self.current();
        let State { queue, transit, .. } = &mut *state;
        for event in events {
            wake.extend(transit.record(&slice, queue, event, Self::now()));
        }
        state.wake(wake);
    }

    /// The remembered deletions of keys `identity` owns on `ring`, for a peer that starts
    /// serving this group (`crate::grpc::peer`).
    pub fn recent_deletions_owned_by(&self, ring: &Ring, identity: &str) -> Vec<Arc<str>> {
        self.state()
            .transit
            .recent_deletions_owned_by(ring, identity, Self::now())
    }

    /// Deletions that peers remembered (`crate::grpc::peer`): each is taken as if this
    /// dispatcher's watch had seen it now: queued if the key is served, held if a handover
    /// holds it, else remembered in turn.
    pub fn deleted_in_transit(&self, keys: impl IntoIterator<Item = String>) {
        for key in keys {
            self.record(GroupEvent::Deleted {
                key: KeyRef::new(&key),
                change: Change::deletion(),
            });
        }
    }

    /// Trims the queue to the current slice if it changed ([`Transit::trim`]). Returns
    /// whether a key this dispatcher no longer owns is still queued or in flight, which holds
    /// back the release of the ring.
    pub fn trim_to_slice(&self) -> bool {
        let mut state = self.state_now();
        let slice = self.slice.borrow().clone();
        let State { queue, transit, .. } = &mut *state;
        let (wake, pending) = transit.trim(&slice, queue, Self::now());
        state.wake(wake);
        drop(state);
        // What the keys the ring moved away name is their new dispatcher's to know.
        self.references()
            .retain(|key| !slice.owned_elsewhere(KeyRef::new(key)));
        pending
    }

    /// Queues the deletions a finished re-list revealed, of keys the queue knows
    /// ([`GroupQueue::sweep`]) and of keys a handover holds ([`Transit::sweep`]).
    pub fn sweep(&self, epoch: u32, belongs: impl Fn(&str) -> bool) {
        let (mut state, slice, mut wake) = self.current();
        let State { queue, transit, .. } = &mut *state;
        wake.extend(queue.sweep(epoch, &belongs));
        wake.extend(transit.sweep(&slice, queue, (epoch, &belongs), Self::now()));
        state.wake(wake);
        drop(state);
        // The referrers deleted while the watch was away name nothing any more.
        self.references().swept_referrers(epoch, belongs);
    }

    /// Reconciles `keys` and, with `all`, every key it serves, whose objects exist
    /// (`Dispatcher.Trigger`): taken as related changes of reason TRIGGERED, so a trigger adds
    /// no key and a key in flight runs again after. Every key is taken under one hold of the
    /// group's lock per 1024 keys (`KEYS_PER_HOLD`), yielding between holds, so a trigger of every
    /// key of a large group never holds the lock (and a runtime worker) for long.
    pub async fn trigger(&self, keys: &[String], all: bool) {
        for chunk in keys.chunks(KEYS_PER_HOLD) {
            self.record_all(chunk.iter().map(|key| GroupEvent::Triggered {
                key: KeyRef::new(key),
            }));
            tokio::task::yield_now().await;
        }
        if !all {
            return;
        }
        let live = {
            let (state, slice, wake) = self.current();
            let live = state.queue.live_keys(|k| slice.serves_key(KeyRef::new(k)));
            state.wake(wake);
            live
        };
        for chunk in live.chunks(KEYS_PER_HOLD) {
            {
                let mut state = self.state_now();
                let wake = state.queue.touch(chunk, Reason::Triggered);
                state.wake(wake);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Resyncs the keys whose turn came in `elapsed`; see [`GroupQueue::resync_due`].
    pub fn resync_due(&self, elapsed: Duration, interval: Duration) {
        let mut state = self.state_now();
        let wake = state.queue.resync_due(elapsed, interval);
        state.wake(wake);
    }
}
