//! A group's life in the table: made for its first session (its watches started), replaced
//! when its subscriptions change while it has no session, and dropped once idle for its grace;
//! with the limits a tenant is held to (`kube_dispatch_core::quota`).

use std::{collections::HashMap, sync::Arc};

use kube_dispatch_core::{
    queue::pool::Pools,
    quota::{Exceeded, Held},
    subscription::GroupSpec,
};
use kube_dispatch_server::auth::{Caller, GroupId};
use tokio::time::Instant;
use tracing::info;

use super::{GroupEntry, GroupTable, SessionError};
use crate::{group::Group, watch::registry::Subscriber};

impl GroupTable {
    /// Finds or creates the group for a new session of `replica`; returns it and whether it
    /// was created.
    pub(super) fn group_for(
        &self,
        id: &GroupId,
        replica: &str,
        spec: &GroupSpec,
        caller: &Caller,
    ) -> Result<(Arc<Group>, bool), SessionError> {
        let mut groups = self.groups();
        let user = caller.identity().map(|i| i.username.clone());
        let existing = groups.get(id);
        // A replica reopening replaces its session: it takes no new slot.
        let replacing = existing.is_some_and(|e| e.group.has_replica(replica));
        if let Some(user) = &user {
            // A group re-created with new subscriptions replaces one of the same owner.
            self.check_identity_limits(&groups, id, user, existing.is_none(), replacing)?;
        }
        if let Some(entry) = existing {
            if entry.group.spec == *spec {
                self.settings
                    .limits
                    .quotas()
                    .group_session(entry.group.session_count(), replacing)
                    .map_err(|e| self.refusal(e, id, None))?;
                return Ok((entry.group.clone(), false));
            }
            if entry.group.session_count() > 0 {
                return Err(SessionError::SubscriptionsDiffer {
                    group: id.name.clone(),
                });
            }
            // Deliveries of a session that was closed or replaced may still run: a group
            // made anew would hand their keys out again at once.
            if entry.group.in_flight() > 0 {
                return Err(SessionError::HeldInFlight {
                    group: id.name.clone(),
                });
            }
            // No session left: the new subscriptions replace the old ones.
            if let Some(old) = groups.remove(id) {
                self.release(&old);
            }
        }
        // Groups without sessions linger for their grace; bound them with the sessions, so a
        // client opening sessions under ever new group names cannot grow this map.
        self.settings
            .limits
            .quotas()
            .group(groups.len())
            .map_err(|e| self.refusal(e, id, None))?;
        let cancel = self.shutdown.child_token();
        let group = Group::spawn(
            id.clone(),
            spec.clone(),
            self.settings.queue,
            Pools {
                bodies: self.settings.bodies.clone(),
                memos: self.settings.memos.clone(),
            },
            self.recent_deletions,
            self.slice.clone(),
            cancel.clone(),
        );
        groups.insert(
            id.clone(),
            GroupEntry {
                group: group.clone(),
                cancel,
                empty_since: None,
                creator: user,
            },
        );
        Ok((group, true))
    }

    /// Whether `user` may take one more session (unless `replacing` its own), and one more
    /// group when `creating` one. Counted over the groups `user` owns: at most
    /// `--max-sessions` groups, so a scan costs microseconds, and no count can drift from the
    /// table.
    fn check_identity_limits(
        &self,
        groups: &HashMap<GroupId, GroupEntry>,
        group: &GroupId,
        user: &str,
        creating: bool,
        replacing: bool,
    ) -> Result<(), SessionError> {
        let mut held = Held::default();
        for entry in groups.values() {
            if entry.creator.as_deref() == Some(user) {
                held.groups += 1;
                held.sessions += entry.group.session_count();
            }
        }
        self.settings
            .limits
            .quotas()
            .identity(held, creating, replacing)
            .map_err(|e| self.refusal(e, group, Some(user)))
    }

    /// What a caller is told when a new session of `group` would pass a limit (`user`'s, for
    /// the identity's limits).
    pub(super) fn refusal(
        &self,
        exceeded: Exceeded,
        group: &GroupId,
        user: Option<&str>,
    ) -> SessionError {
        let identity = self.settings.identity.clone();
        match exceeded {
            Exceeded::Sessions { max } => SessionError::TooManySessions { identity, max },
            Exceeded::GroupSessions { max } => SessionError::TooManyGroupSessions {
                group: group.name.clone(),
                max,
            },
            Exceeded::Groups { count } => SessionError::TooManyGroups {
                identity,
                count,
                grace: self.settings.idle_group_grace,
            },
            Exceeded::IdentityGroups { max } => SessionError::TooManyOfIdentity {
                user: user.unwrap_or_default().to_owned(),
                what: "controller groups (idle ones included)",
                max,
                identity,
            },
            Exceeded::IdentitySessions { max } => SessionError::TooManyOfIdentity {
                user: user.unwrap_or_default().to_owned(),
                what: "sessions",
                max,
                identity,
            },
        }
    }

    /// Stops what `entry`'s group holds: its watch subscriptions and its timers.
    fn release(&self, entry: &GroupEntry) {
        for sub in &entry.group.spec.subscriptions {
            self.watches.unsubscribe(&sub.watch, &entry.group);
        }
        entry.cancel.cancel();
    }

    /// Whether `group` is still the one the table holds under its id: a group replaced while
    /// it was starting its watches (another session of its id, with other subscriptions, found
    /// it without sessions) is not.
    fn is_current(&self, group: &Arc<Group>) -> bool {
        self.groups()
            .get(&group.id)
            .is_some_and(|e| Arc::ptr_eq(&e.group, group))
    }

    pub(super) async fn subscribe_all(&self, group: &Arc<Group>) -> Result<(), SessionError> {
        let mut watched = Vec::with_capacity(group.spec.subscriptions.len());
        // The owned subscriptions first: the group takes their children's indexes before any
        // watch of owners starts, whose first list then waits for the children's (so a cold
        // start's owners are requested with their children complete).
        let (owned, others): (Vec<_>, Vec<_>) = group
            .spec
            .subscriptions
            .iter()
            .partition(|sub| sub.owner.is_some());
        for sub in owned.into_iter().chain(others) {
            let subscriber = Subscriber {
                group: group.clone(),
                payload: sub.payload,
                owner: sub.owner.clone(),
                named_by: sub.named_by.clone(),
                changes_of: sub.changes_of,
            };
            let subscribed = self.watches.subscribe(&sub.watch, subscriber).await;
            if let (Ok(index), Some(kind)) = (&subscribed, &sub.owner) {
                group.owns_from(kind.clone(), index.clone());
            }
            if let Ok(index) = &subscribed {
                watched.push(index.clone());
            }
            // Replaced meanwhile: nothing may keep feeding (and holding bodies for) a group
            // the table no longer knows.
            let replaced = !self.is_current(group);
            if subscribed.is_err() || replaced {
                let entry = {
                    let mut groups = self.groups();
                    match groups.get(&group.id) {
                        Some(e) if Arc::ptr_eq(&e.group, group) => groups.remove(&group.id),
                        _ => None,
                    }
                };
                match entry {
                    Some(entry) => self.release(&entry),
                    // Released when it was replaced; what it subscribed to since goes too.
                    None => {
                        for sub in &group.spec.subscriptions {
                            self.watches.unsubscribe(&sub.watch, group);
                        }
                    }
                }
                subscribed?;
                return Err(SessionError::SubscriptionsDiffer {
                    group: group.id.name.clone(),
                });
            }
        }
        group.subscribed(watched);
        Ok(())
    }

    /// Drops the groups that have had no session for `--idle-group-grace` by `now`; returns
    /// the groups left.
    pub(crate) fn drop_idle_groups(&self, now: Instant) -> Vec<Arc<Group>> {
        let mut groups = self.groups();
        let grace = self.settings.idle_group_grace;
        let mut idle = Vec::new();
        for (id, entry) in groups.iter_mut() {
            // Deliveries held after their session closed keep it too: dropped, the group
            // would forget them, and a new one hand their keys out again at once.
            if entry.group.session_count() > 0 || entry.group.in_flight() > 0 {
                entry.empty_since = None;
            } else if let Some(since) = entry.empty_since {
                if now.duration_since(since) >= grace {
                    idle.push(id.clone());
                }
            } else {
                entry.empty_since = Some(now);
            }
        }
        for id in idle {
            if let Some(entry) = groups.remove(&id) {
                info!(group = %id, "dropping group: no session for {grace:?}");
                self.release(&entry);
            }
        }
        groups.values().map(|e| e.group.clone()).collect()
    }
}
