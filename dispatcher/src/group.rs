//! A controller group on this dispatcher: its subscriptions, its work queue and its sessions.
//!
//! The [`GroupQueue`] holds the logic; this module adds the clock and the wake-ups: each
//! session has a [`Notify`] its long-poll waits on, and a driver task fires the queue's timers.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    queue::{
        AckResult, Change, Delivery, DeliveryId, GroupQueue, Observed, Outcome, QueueConfig,
        SessionId,
    },
    subscription::GroupSpec,
};

/// A live session of the group.
#[derive(Debug)]
pub struct SessionSlot {
    /// Signalled when the session has ready keys, or is closed.
    pub notify: Notify,
    /// When the session expires unless renewed.
    pub expires_at: Mutex<Instant>,
    /// The replica that holds it.
    pub replica: String,
    /// How long the session lives without renewal.
    pub ttl: Duration,
    /// The session id on the wire.
    pub wire_id: String,
}

/// One controller group.
#[derive(Debug)]
pub struct Group {
    /// The group's name.
    pub name: String,
    /// What every session of the group subscribes to.
    pub spec: GroupSpec,
    queue: Mutex<GroupQueue>,
    sessions: Mutex<HashMap<SessionId, Arc<SessionSlot>>>,
    /// Wakes the timer driver when a timer may have moved earlier.
    timers_changed: Notify,
}

impl Group {
    /// A group with an empty queue; its timer driver runs until `cancel`, which must be
    /// cancelled when the group is dropped from the dispatcher.
    pub fn spawn(
        name: String,
        spec: GroupSpec,
        config: QueueConfig,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let group = Arc::new(Self {
            name,
            spec,
            queue: Mutex::new(GroupQueue::new(config)),
            sessions: Mutex::new(HashMap::new()),
            timers_changed: Notify::new(),
        });
        tokio::spawn(drive_timers(group.clone(), cancel));
        group
    }

    fn queue(&self) -> MutexGuard<'_, GroupQueue> {
        // A panic while holding the lock would leave the queue unusable: recover the data, the
        // queue's operations keep their invariants step by step.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<SessionSlot>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self, sessions: Vec<SessionId>) {
        if sessions.is_empty() {
            return;
        }
        let slots = self.slots();
        for id in sessions {
            if let Some(slot) = slots.get(&id) {
                slot.notify.notify_one();
            }
        }
    }

    /// Adds a session; returns its slot and the slots of the sessions it replaced (an older
    /// session of the same replica).
    pub fn add_session(
        &self,
        id: SessionId,
        wire_id: String,
        replica: &str,
        ttl: Duration,
    ) -> (Arc<SessionSlot>, Vec<Arc<SessionSlot>>) {
        let slot = Arc::new(SessionSlot {
            notify: Notify::new(),
            expires_at: Mutex::new(Instant::now() + ttl),
            replica: replica.to_owned(),
            ttl,
            wire_id,
        });
        let (wake, replaced) = {
            let mut queue = self.queue();
            let before: Vec<SessionId> = self.slots().keys().copied().collect();
            let wake = queue.add_session(id, replica);
            let replaced: Vec<SessionId> = before
                .into_iter()
                .filter(|s| !queue.has_session(*s))
                .collect();
            (wake, replaced)
        };
        let mut replaced_slots = Vec::new();
        {
            let mut slots = self.slots();
            for old in replaced {
                if let Some(old) = slots.remove(&old) {
                    old.notify.notify_one();
                    replaced_slots.push(old);
                }
            }
            slots.insert(id, slot.clone());
        }
        self.wake(wake);
        (slot, replaced_slots)
    }

    /// Removes a session (closed or expired); its in-flight keys are re-delivered at once.
    pub fn remove_session(&self, id: SessionId) {
        let wake = self.queue().remove_session(id);
        if let Some(slot) = self.slots().remove(&id) {
            slot.notify.notify_one();
        }
        self.wake(wake);
    }

    /// Whether the session is live in this group.
    pub fn has_session(&self, id: SessionId) -> bool {
        self.slots().contains_key(&id)
    }

    /// Whether `replica` holds a live session of the group.
    pub fn has_replica(&self, replica: &str) -> bool {
        self.slots().values().any(|s| s.replica == replica)
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.slots().len()
    }

    /// Records a change to a key this dispatcher owns.
    pub fn change(&self, key: &str, change: Change) {
        let wake = self.queue().change(key, change);
        self.wake(wake);
    }

    /// Records that an object exists; see [`GroupQueue::observe`].
    pub fn observe(&self, key: &str, object: Observed, epoch: u32) {
        let wake = self.queue().observe(key, object, epoch);
        self.wake(wake);
    }

    /// Queues the deletions a finished re-list revealed; see [`GroupQueue::sweep`].
    pub fn sweep(&self, epoch: u32, belongs: impl Fn(&str) -> bool) {
        let wake = self.queue().sweep(epoch, belongs);
        self.wake(wake);
    }

    /// Forgets the keys this dispatcher no longer owns.
    pub fn forget_where(&self, moved: impl Fn(&str) -> bool) {
        self.queue().forget_where(moved);
    }

    /// Resyncs up to `n` keys; see [`GroupQueue::resync_batch`].
    pub fn resync_batch(&self, n: usize) {
        let wake = self.queue().resync_batch(n);
        self.wake(wake);
    }

    /// Number of keys known, and of keys ready.
    pub fn sizes(&self) -> (usize, usize) {
        let q = self.queue();
        (q.len(), q.ready_len())
    }

    /// Settles deliveries; returns how many were not in flight on the session.
    pub fn ack(&self, session: SessionId, acks: Vec<(DeliveryId, Outcome)>) -> usize {
        let now = Instant::now().into_std();
        let mut unknown = 0;
        let mut wake = Vec::new();
        {
            let mut queue = self.queue();
            for (id, outcome) in acks {
                let (result, w) = queue.ack(session, id, outcome, now);
                if result == AckResult::Unknown {
                    unknown += 1;
                }
                wake.extend(w);
            }
        }
        self.timers_changed.notify_one();
        self.wake(wake);
        unknown
    }

    /// Takes up to `max` ready keys for the session.
    pub fn take(&self, session: SessionId, max: usize) -> Vec<Delivery> {
        let out = self.queue().take(session, max, Instant::now().into_std());
        if !out.is_empty() {
            self.timers_changed.notify_one();
        }
        out
    }
}

/// Fires the group's timers (retries, requeues, reconcile deadlines) on time, until `cancel`.
async fn drive_timers(group: Arc<Group>, cancel: CancellationToken) {
    loop {
        let changed = group.timers_changed.notified();
        tokio::pin!(changed);
        // Register before reading the deadline, so a change made in between is not missed.
        changed.as_mut().enable();
        let next = group.queue().next_deadline();
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = &mut changed => continue,
            () = sleep => {}
        }
        let wake = group.queue().advance(Instant::now().into_std());
        group.wake(wake);
    }
}

#[cfg(test)]
mod tests {
    use kube_dispatch_proto::v1::Reason;

    use super::*;
    use crate::{backoff::Backoff, subscription::GroupSpec};

    fn group(cancel: &CancellationToken) -> Arc<Group> {
        let config = QueueConfig {
            backoff: Backoff {
                base: Duration::from_secs(10),
                cap: Duration::from_secs(60),
            },
            max_reconcile_time: Duration::from_secs(30),
            body_budget: 0,
        };
        Group::spawn(
            "g".into(),
            GroupSpec::new(Vec::new()),
            config,
            cancel.clone(),
        )
    }

    fn modified() -> Change {
        Change {
            reason: Reason::Modified,
            resource_version: "1".into(),
            uid: String::new(),
            body: None,
            deleted: false,
        }
    }

    /// The driver fires a retry exactly when its backoff ends, and wakes the session's poll.
    #[tokio::test(start_paused = true)]
    async fn timers_fire_on_time_and_wake_the_session() {
        let cancel = CancellationToken::new();
        let g = group(&cancel);
        let (slot, _) = g.add_session(1, "s1".into(), "a", Duration::from_secs(60));
        g.change("k", modified());
        let d = g.take(1, 10);
        assert_eq!(d.len(), 1);
        let failed_at = Instant::now();
        assert_eq!(g.ack(1, vec![(d[0].id, Outcome::Failure)]), 0);
        // Consume the permit the first enqueue left, then wait for the retry's wake-up.
        slot.notify.notified().await;
        assert!(g.take(1, 10).is_empty(), "not before the backoff");
        tokio::time::timeout(Duration::from_secs(60), slot.notify.notified())
            .await
            .expect("the retry wakes the session");
        assert_eq!(failed_at.elapsed(), Duration::from_secs(10));
        let retry = g.take(1, 10);
        assert_eq!((retry[0].reason, retry[0].attempt), (Reason::Retry, 1));
        cancel.cancel();
    }

    /// An unacknowledged delivery is void after the maximum reconcile time.
    #[tokio::test(start_paused = true)]
    async fn an_unacknowledged_delivery_expires_on_time() {
        let cancel = CancellationToken::new();
        let g = group(&cancel);
        g.add_session(1, "s1".into(), "a", Duration::from_secs(600));
        g.change("k", modified());
        let d = g.take(1, 10);
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(g.ack(1, vec![]), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            g.ack(1, vec![(d[0].id, Outcome::Success)]),
            1,
            "the delivery expired"
        );
        cancel.cancel();
    }
}
