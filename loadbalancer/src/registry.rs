//! The leader's state: live dispatchers, registered replicas per group, and the placement of
//! each group, pushed to every replica's stream when it changes.
//!
//! Groups are keyed by [`GroupId`]: one name used by two users is two groups, so no user can
//! join, squat or move another's group, and nothing about ownership is lost when leadership
//! moves (the new leader learns each group's owner from the registrations themselves).
//!
//! Bounds: at most `max_registrations` replicas over all groups, and `max_per_identity` per
//! user (registrations past either are refused); a replica whose streams have all ended is
//! kept for the grace, then removed. Each replica holds one `watch` slot (its latest
//! assignment), never a queue.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use kube_dispatch_proto::v1::Assignment;
use kube_dispatch_server::auth::{GroupId, GroupOwners, NotOwner};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::placement::{Placement, place};

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The registry is full.
    #[error("the load balancer holds {0} registrations, the most allowed")]
    Full(usize),
    /// The caller's identity holds as many registrations as one may.
    #[error(
        "{user} holds {max} registrations on this load balancer, the most one identity may (--max-registrations-per-identity)"
    )]
    FullForIdentity {
        /// The caller.
        user: String,
        /// The bound.
        max: usize,
    },
    /// The group is listed with `--group-owner` for other users.
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
    /// In a group shared by several users, a replica id another user registered.
    #[error(
        "replica {replica:?} of group {group:?} is registered by {holder}, not {caller}: give each replica an id of its own"
    )]
    ReplicaOfAnother {
        /// The group.
        group: String,
        /// The replica id.
        replica: String,
        /// The user that registered it.
        holder: String,
        /// The caller.
        caller: String,
    },
}

#[derive(Debug)]
struct Replica {
    assignment: watch::Sender<Assignment>,
    /// Open registration streams of this replica (a reconnect may overlap the old stream).
    streams: usize,
    /// When its last stream ended.
    gone_since: Option<Instant>,
    /// Which registration this entry is: a replica that left (or a leadership that was lost)
    /// and registered again gets a new one, and the streams of the old one no longer count.
    epoch: u64,
    /// The user that registered it; `None` when the load balancer takes anonymous calls.
    user: Option<String>,
}

#[derive(Debug, Default)]
struct GroupState {
    replicas: BTreeMap<String, Replica>,
    placement: Placement,
    /// While the registry settles: the dispatcher addresses each replica registered since said
    /// it polls (at most [`MAX_POLLED`] each), made its placement when the settle ends.
    polled: BTreeMap<String, Vec<String>>,
}

/// Most dispatcher addresses of a registration that are read ([`Registry::register`]).
pub const MAX_POLLED: usize = 64;

#[derive(Debug, Default)]
struct Inner {
    /// Dispatcher name to address.
    dispatchers: BTreeMap<String, String>,
    groups: BTreeMap<GroupId, GroupState>,
    registrations: usize,
    /// Registrations per user (authenticated callers only); a user with none has no entry.
    per_user: HashMap<String, usize>,
    /// The next [`Replica::epoch`].
    next_epoch: u64,
    /// Assignments sent to replicas, and of those, changes to one already made.
    assignments: u64,
    moves: u64,
    /// This load balancer has just become the leader ([`Registry::settle`]): replicas register
    /// again with the dispatchers they poll, and nothing is placed until
    /// [`Registry::settled`], so they are placed where they are.
    settling: bool,
    /// The settle's time is up, but the dispatchers were not known then: it ends once they are.
    settle_due: bool,
    /// Whether the live dispatchers are known ([`Registry::set_dispatchers`] called once, after
    /// the Lease watch listed): before, an empty set means nothing.
    dispatchers_known: bool,
}

/// The registry's figures, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegistryFigures {
    /// Replicas registered.
    pub replicas: usize,
    /// Controller groups with a replica registered.
    pub groups: usize,
    /// Live dispatchers known.
    pub dispatchers: usize,
    /// Assignments sent to replicas.
    pub assignments: u64,
    /// Of those, changes to an assignment already made (a replica's dispatchers moved).
    pub moves: u64,
}

/// The registry of one load balancer leader.
#[derive(Debug)]
pub struct Registry {
    inner: Mutex<Inner>,
    max_registrations: usize,
    max_per_identity: usize,
    owners: GroupOwners,
}

/// Keeps a registration stream counted; dropping it starts the replica's grace.
#[derive(Debug)]
pub struct StreamGuard {
    registry: Arc<Registry>,
    group: GroupId,
    replica: String,
    epoch: u64,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.registry
            .stream_ended(&self.group, &self.replica, self.epoch, Instant::now());
    }
}

impl Registry {
    /// An empty registry that holds at most `max_registrations` replicas, `max_per_identity`
    /// of them per user, and places a replica only in a group its user may use (`owners`).
    pub fn new(
        max_registrations: usize,
        max_per_identity: usize,
        owners: GroupOwners,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            max_registrations,
            max_per_identity,
            owners,
        })
    }

    /// The registry's figures now.
    pub fn figures(&self) -> RegistryFigures {
        let inner = self.inner();
        RegistryFigures {
            replicas: inner.registrations,
            groups: inner.groups.len(),
            dispatchers: inner.dispatchers.len(),
            assignments: inner.assignments,
            moves: inner.moves,
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a stream of `replica` in `group`, which polls the dispatchers at `polled`
    /// (host:port) now; the receiver holds its assignment, current at once unless the registry
    /// is settling (an assignment of generation 0 is none yet). While it settles, the replica
    /// is placed where it is once the settle ends, as far as the rules allow; the first
    /// [`MAX_POLLED`] addresses are read, and `polled` is ignored otherwise.
    pub fn register(
        self: &Arc<Self>,
        group: &str,
        replica: &str,
        user: Option<&str>,
        polled: &[String],
    ) -> Result<(watch::Receiver<Assignment>, StreamGuard), RegisterError> {
        let id = self.owners.group_id(group, user)?;
        let mut inner = self.inner();
        let holder = inner
            .groups
            .get(&id)
            .and_then(|g| g.replicas.get(replica))
            .map(|r| r.user.as_deref());
        if let (Some(Some(holder)), Some(caller)) = (holder, user)
            && holder != caller
        {
            return Err(RegisterError::ReplicaOfAnother {
                group: group.to_owned(),
                replica: replica.to_owned(),
                holder: holder.to_owned(),
                caller: caller.to_owned(),
            });
        }
        let known = holder.is_some();
        if !known {
            if inner.registrations >= self.max_registrations {
                return Err(RegisterError::Full(self.max_registrations));
            }
            if let Some(user) = user
                && inner.per_user.get(user).copied().unwrap_or(0) >= self.max_per_identity
            {
                return Err(RegisterError::FullForIdentity {
                    user: user.to_owned(),
                    max: self.max_per_identity,
                });
            }
        }
        let fresh = inner.next_epoch;
        inner.next_epoch += 1;
        let settling = inner.settling;
        let (receiver, epoch) = {
            let state = inner.groups.entry(id.clone()).or_default();
            if settling && !polled.is_empty() {
                let polled = polled.iter().take(MAX_POLLED).cloned().collect();
                state.polled.insert(replica.to_owned(), polled);
            }
            let entry = state
                .replicas
                .entry(replica.to_owned())
                .or_insert_with(|| Replica {
                    assignment: watch::channel(Assignment::default()).0,
                    streams: 0,
                    gone_since: None,
                    epoch: fresh,
                    user: user.map(str::to_owned),
                });
            entry.streams += 1;
            entry.gone_since = None;
            (entry.assignment.subscribe(), entry.epoch)
        };
        if !known {
            inner.registrations += 1;
            if let Some(user) = user {
                *inner.per_user.entry(user.to_owned()).or_default() += 1;
            }
            info!(group = %id, replica, "replica registered");
            replace(&mut inner, &id);
            place_new_group(&mut inner, &id);
        }
        Ok((
            receiver,
            StreamGuard {
                registry: self.clone(),
                group: id,
                replica: replica.to_owned(),
                epoch,
            },
        ))
    }

    fn stream_ended(&self, group: &GroupId, replica: &str, epoch: u64, now: Instant) {
        let mut inner = self.inner();
        if let Some(r) = inner
            .groups
            .get_mut(group)
            .and_then(|g| g.replicas.get_mut(replica))
            .filter(|r| r.epoch == epoch)
        {
            r.streams = r.streams.saturating_sub(1);
            if r.streams == 0 {
                debug!(
                    group = %group,
                    replica, "registration stream ended; keeping the replica's place for the grace"
                );
                r.gone_since = Some(now);
            }
        }
    }

    /// Sets the live dispatchers (name to address) and re-places every group if they changed.
    pub fn set_dispatchers(&self, dispatchers: BTreeMap<String, String>) {
        let mut inner = self.inner();
        let changed = inner.dispatchers != dispatchers;
        if changed {
            info!(dispatchers = ?dispatchers.keys().collect::<Vec<_>>(), "dispatchers changed");
            inner.dispatchers = dispatchers;
        }
        if !inner.dispatchers_known {
            inner.dispatchers_known = true;
            Self::end_settle(&mut inner);
            let groups: Vec<GroupId> = inner.groups.keys().cloned().collect();
            for group in groups {
                place_new_group(&mut inner, &group);
            }
        } else if changed && inner.settling {
            // A dispatcher joined or left during the settle: it must be polled (or its
            // replicas placed elsewhere) now, not when the settle ends. Those back by now are
            // placed where they are; the rest by the rules when they come.
            inner.settle_due = true;
            Self::end_settle(&mut inner);
            return;
        }
        if !changed || inner.settling {
            return;
        }
        let groups: Vec<GroupId> = inner.groups.keys().cloned().collect();
        for group in groups {
            replace(&mut inner, &group);
        }
    }

    /// Removes the replicas whose streams ended `grace` or longer before `now`.
    pub fn expire(&self, now: Instant, grace: Duration) {
        let mut inner = self.inner();
        let mut changed = Vec::new();
        let mut users = Vec::new();
        for (name, state) in &mut inner.groups {
            let before = state.replicas.len();
            state.replicas.retain(|replica, r| {
                let keep = r
                    .gone_since
                    .is_none_or(|since| now.saturating_duration_since(since) < grace);
                if !keep {
                    info!(group = %name, replica, "replica removed: no registration stream for the grace");
                    users.push(r.user.take());
                }
                keep
            });
            if state.replicas.len() != before {
                changed.push(name.clone());
            }
        }
        for user in users {
            forget(&mut inner, user);
        }
        for group in changed {
            replace(&mut inner, &group);
        }
        inner.groups.retain(|_, g| !g.replicas.is_empty());
    }

    /// Removes `replica` from `group` now (it is shutting down), without the grace, and
    /// re-places the group; `Ok(false)` when it was not registered.
    pub fn leave(&self, group: &str, replica: &str, user: Option<&str>) -> Result<bool, NotOwner> {
        let id = self.owners.group_id(group, user)?;
        let mut inner = self.inner();
        let Some(state) = inner.groups.get_mut(&id) else {
            return Ok(false);
        };
        // In a shared group, only the user that registered a replica takes it out.
        let theirs = state
            .replicas
            .get(replica)
            .is_some_and(|r| user.is_none() || r.user.as_deref() == user);
        if !theirs {
            return Ok(false);
        }
        let Some(left) = state.replicas.remove(replica) else {
            return Ok(false);
        };
        info!(group = %id, replica, "replica left");
        forget(&mut inner, left.user);
        replace(&mut inner, &id);
        inner.groups.retain(|_, g| !g.replicas.is_empty());
        Ok(true)
    }

    /// Drops every registration (this replica stopped leading): their streams end, and the
    /// replicas register with the new leader.
    pub fn clear(&self) {
        let mut inner = self.inner();
        inner.groups.clear();
        inner.registrations = 0;
        inner.per_user.clear();
        inner.settling = false;
        inner.settle_due = false;
    }

    /// This load balancer has just become the leader: until [`Registry::settled`], replicas
    /// register (each saying which dispatchers it polls) but nothing is placed, so that once
    /// they are all back each is placed where it was and a change of leader moves no
    /// connection. Meanwhile replicas keep polling what they were assigned last. A group none
    /// of whose replicas has said it polls a dispatcher has nothing to keep: its replicas are
    /// placed at once (a tier and its controllers starting together), and may move when the
    /// settle ends if one of the group's replicas comes back saying what it polls.
    pub fn settle(&self) {
        self.inner().settling = true;
    }

    /// Ends [`Registry::settle`]: every group is placed, keeping the dispatchers each replica
    /// said it polls where the rules allow. With the dispatchers not known yet (a Lease watch
    /// that has not listed), the settle lasts until they are.
    pub fn settled(&self) {
        let mut inner = self.inner();
        if inner.settling {
            inner.settle_due = true;
            Self::end_settle(&mut inner);
        }
    }

    /// Ends the settle if its time is up and the dispatchers are known; see
    /// [`Registry::settled`].
    fn end_settle(inner: &mut Inner) {
        if !inner.settle_due || !inner.dispatchers_known {
            return;
        }
        inner.settling = false;
        inner.settle_due = false;
        let moves = inner.moves;
        let groups: Vec<GroupId> = inner.groups.keys().cloned().collect();
        for group in &groups {
            replace(inner, group);
        }
        info!(
            groups = groups.len(),
            replicas = inner.registrations,
            moved = inner.moves - moves,
            "placed the replicas registered since this load balancer leads"
        );
    }

    /// The placement of every group: replica to dispatcher names.
    pub fn placements(&self) -> BTreeMap<GroupId, Placement> {
        self.inner()
            .groups
            .iter()
            .map(|(name, g)| (name.clone(), g.placement.clone()))
            .collect()
    }

    /// Number of registered replicas over all groups.
    pub fn len(&self) -> usize {
        self.inner().registrations
    }

    /// Whether no replica is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Counts one registration of `user` less.
fn forget(inner: &mut Inner, user: Option<String>) {
    inner.registrations -= 1;
    if let Some(user) = user
        && let std::collections::hash_map::Entry::Occupied(mut count) = inner.per_user.entry(user)
    {
        *count.get_mut() -= 1;
        if *count.get() == 0 {
            count.remove();
        }
    }
}

/// Recomputes the placement of `group` and pushes every changed assignment; nothing while the
/// registry settles ([`Registry::settle`]).
fn replace(inner: &mut Inner, group: &GroupId) {
    if !inner.settling {
        place_group(inner, group);
    }
}

/// During a settle, places `group` if none of its replicas has said it polls a dispatcher
/// (there is no placement of it to keep) and the dispatchers are known; see
/// [`Registry::settle`]. A replica of an SDK that does not say what it polls (0.1.0) looks
/// new too: its group is placed again at each of its replicas' registrations.
fn place_new_group(inner: &mut Inner, group: &GroupId) {
    let new = inner.groups.get(group).is_some_and(|g| g.polled.is_empty());
    if inner.settling && inner.dispatchers_known && new {
        place_group(inner, group);
    }
}

/// Places the replicas of `group` on the live dispatchers, keeping where each is as far as
/// the rules allow, and tells each whose dispatchers changed.
fn place_group(inner: &mut Inner, group: &GroupId) {
    let dispatchers: Vec<String> = inner.dispatchers.keys().cloned().collect();
    let addresses = inner.dispatchers.clone();
    let Some(state) = inner.groups.get_mut(group) else {
        return;
    };
    // What the replicas registered during the settle poll, by name: their previous placement.
    for (replica, polled) in std::mem::take(&mut state.polled) {
        let names: BTreeSet<String> = addresses
            .iter()
            .filter(|(_, address)| polled.contains(address))
            .map(|(name, _)| name.clone())
            .collect();
        if !names.is_empty() && state.replicas.contains_key(&replica) {
            state.placement.insert(replica, names);
        }
    }
    let (mut sent, mut moved) = (0, 0);
    let replicas: Vec<String> = state.replicas.keys().cloned().collect();
    let placement = place(&dispatchers, &replicas, &state.placement);
    if placement != state.placement {
        debug!(group = %group, ?placement, "placement changed");
    }
    state.placement = placement;
    for (name, replica) in &state.replicas {
        let assigned: BTreeSet<String> = state
            .placement
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|d| addresses.get(d).cloned())
            .collect();
        let assigned: Vec<String> = assigned.into_iter().collect();
        replica.assignment.send_if_modified(|a| {
            if a.dispatchers == assigned && a.generation > 0 {
                return false;
            }
            sent += 1;
            if a.generation > 0 {
                moved += 1;
            }
            a.dispatchers = assigned;
            a.generation += 1;
            true
        });
    }
    inner.assignments += sent;
    inner.moves += moved;
}

#[cfg(test)]
mod tests;
