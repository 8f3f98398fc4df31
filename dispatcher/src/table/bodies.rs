//! The process's body pool, shared out over the groups once it runs short
//! ([`kube_dispatch_core::quota::body_shares`]).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use kube_dispatch_core::quota::body_shares;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::GroupTable;
use crate::group::Group;

impl GroupTable {
    /// Shares the process's body pool out once it runs short: evenly over the users that have
    /// groups here, and a user's share evenly over its groups. Each group holding more than
    /// its share drops bodies down to it, and takes no more than its share until the pool has
    /// not been short for [`BODY_HOLD`]: no group, and no identity however many groups it
    /// opens, can keep the others' bodies out. Keys whose bodies are dropped are delivered
    /// without them (their controllers read the objects).
    pub(crate) fn share_bodies(&self, groups: &[Arc<Group>], now: Instant) {
        let pool = &self.settings.bodies;
        let mut held_until = self
            .bodies_held_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let spell_began = if pool.is_short() {
            held_until.replace(now + BODY_HOLD).is_none()
        } else {
            match *held_until {
                Some(until) if now >= until => {
                    *held_until = None;
                    for group in groups {
                        group.hold_bodies_to(None);
                    }
                    info!(
                        "the body pool has had room for {BODY_HOLD:?}: groups take bodies up to their own budget again"
                    );
                    return;
                }
                Some(_) => false,
                None => return,
            }
        };
        drop(held_until);
        let owners: Vec<Option<&str>> = groups.iter().map(|g| g.id.owner.as_deref()).collect();
        // Shares of what children's bodies (at most half) leave: a share is there to take.
        let shares = body_shares(pool.shared_capacity(), &owners);
        let mut freed = 0;
        for (group, share) in groups.iter().zip(shares) {
            let shed = group.hold_bodies_to(Some(share));
            if shed > 0 {
                debug!(group = %group.id, shed, share, "bodies dropped: the body pool is short and this group held more than its share");
                freed += shed;
            }
        }
        self.counters
            .shed_body_bytes
            .fetch_add(freed as u64, Ordering::Relaxed);
        if spell_began {
            warn!(
                used = pool.used(),
                capacity = pool.capacity(),
                users = owners
                    .iter()
                    .collect::<std::collections::HashSet<_>>()
                    .len(),
                freed,
                "the body pool (--max-body-bytes) is nearly spent: each user gets an even share, groups over theirs drop bodies and their keys go without (controllers read the objects)"
            );
        }
    }
}

/// How long groups stay held to their shares of the body pool after it was last short: long
/// enough that a group refilling what it dropped does not make the pool swing every tick.
const BODY_HOLD: Duration = Duration::from_secs(60);
