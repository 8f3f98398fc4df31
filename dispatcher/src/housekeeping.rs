//! The dispatcher's housekeeping: four times a second, and whenever the slice changes, it
//! expires sessions, drops idle groups, trims queues to the slice and releases the ring, shares
//! the body pool out, logs queue status and resyncs keys.

use std::{collections::HashMap, sync::Arc, time::Duration};

use kube_dispatch_server::auth::GroupId;
use tokio::time::Instant;
use tracing::info;

use crate::{group::Group, table::GroupTable};

/// Runs until `groups` shuts down.
pub(crate) async fn run(groups: Arc<GroupTable>) {
    const TICK: Duration = Duration::from_millis(250);
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut slice_changes = Some(groups.slices());
    let mut status = QueueStatus::default();
    let settings = groups.settings().clone();
    let mut last_resync = Instant::now();
    loop {
        let changed = async {
            match slice_changes.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        let fixed = tokio::select! {
            () = groups.shutdown().cancelled() => return,
            _ = ticker.tick() => false,
            changed = changed => !changed,
        };
        if fixed {
            // The slice's sender is gone (a fixed ring): ticks alone remain.
            slice_changes = None;
        }
        let now = Instant::now();
        groups.expire_sessions(now);
        let live = groups.drop_idle_groups(now);
        groups.release_ring(&live);
        groups.share_bodies(&live, now);
        status.log(&live, settings.status_interval, now);
        // Each key once per interval, spread evenly over the time since the last pass (a
        // pass also runs when the slice changes, so passes are not a tick apart). After a
        // stall (a paused process) at most a second's share is owed: a whole group resynced
        // under one hold of its lock would stall its polls, and resync is level-triggered.
        let elapsed = now
            .saturating_duration_since(last_resync)
            .min(Duration::from_secs(1));
        last_resync = now;
        let interval = settings.resync_interval;
        if !interval.is_zero() {
            for group in live {
                group.resync_due(elapsed, interval);
            }
        }
    }
}

/// The periodic `queue status` log lines: one per group whose figures changed since its last.
#[derive(Default)]
struct QueueStatus {
    last: Option<Instant>,
    /// (keys, ready, in flight, sessions) as last logged, per group; groups are bounded.
    logged: HashMap<GroupId, (usize, usize, usize, usize)>,
}

impl QueueStatus {
    fn log(&mut self, groups: &[Arc<Group>], interval: Duration, now: Instant) {
        if interval.is_zero()
            || self
                .last
                .is_some_and(|at| now.duration_since(at) < interval)
        {
            return;
        }
        self.last = Some(now);
        self.logged
            .retain(|id, _| groups.iter().any(|g| &g.id == id));
        for group in groups {
            let f = group.figures();
            let figures = (f.queue.keys, f.queue.ready, f.queue.in_flight, f.sessions);
            if self.logged.insert(group.id.clone(), figures) != Some(figures) {
                let (keys, ready, in_flight, sessions) = figures;
                info!(group = %group.id, keys, ready, in_flight, sessions, "queue status");
            }
        }
    }
}
