//! The leader's state: live dispatchers, registered replicas per group, and the placement of
//! each group, pushed to every replica's stream when it changes.
//!
//! Bounds: at most `max_registrations` replicas over all groups (registrations past it are
//! refused); a replica whose streams have all ended is kept for the grace, then removed. Each
//! replica holds one `watch` slot (its latest assignment), never a queue.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use kube_dispatch_proto::v1::Assignment;
use kube_dispatch_runtime::auth::{GroupOwners, NotOwner};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::placement::{Placement, place};

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The registry is full.
    #[error("the load balancer holds {0} registrations, the most allowed")]
    Full(usize),
    /// The group's replicas run as another identity.
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
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
}

#[derive(Debug, Default)]
struct GroupState {
    replicas: BTreeMap<String, Replica>,
    placement: Placement,
    /// The user whose replica registered the group first; kept while any replica is
    /// registered. `None` when the load balancer takes anonymous calls.
    owner: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Dispatcher name to address.
    dispatchers: BTreeMap<String, String>,
    groups: BTreeMap<String, GroupState>,
    registrations: usize,
    /// The next [`Replica::epoch`].
    next_epoch: u64,
    /// Assignments sent to replicas, and of those, changes to one already made.
    assignments: u64,
    moves: u64,
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
    owners: GroupOwners,
}

/// Keeps a registration stream counted; dropping it starts the replica's grace.
#[derive(Debug)]
pub struct StreamGuard {
    registry: Arc<Registry>,
    group: String,
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
    /// An empty registry that holds at most `max_registrations` replicas, and places a
    /// replica only in a group its user may use (`owners`).
    pub fn new(max_registrations: usize, owners: GroupOwners) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            max_registrations,
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

    /// Registers a stream of `replica` in `group`; the receiver holds its assignment, current
    /// at once.
    pub fn register(
        self: &Arc<Self>,
        group: &str,
        replica: &str,
        user: Option<&str>,
    ) -> Result<(watch::Receiver<Assignment>, StreamGuard), RegisterError> {
        let mut inner = self.inner();
        self.owners.check(
            group,
            inner.groups.get(group).and_then(|g| g.owner.as_deref()),
            user,
        )?;
        let known = inner
            .groups
            .get(group)
            .is_some_and(|g| g.replicas.contains_key(replica));
        if !known && inner.registrations >= self.max_registrations {
            return Err(RegisterError::Full(self.max_registrations));
        }
        let fresh = inner.next_epoch;
        inner.next_epoch += 1;
        let (receiver, epoch) = {
            let state = inner
                .groups
                .entry(group.to_owned())
                .or_insert_with(|| GroupState {
                    owner: user.map(str::to_owned),
                    ..GroupState::default()
                });
            let entry = state
                .replicas
                .entry(replica.to_owned())
                .or_insert_with(|| Replica {
                    assignment: watch::channel(Assignment::default()).0,
                    streams: 0,
                    gone_since: None,
                    epoch: fresh,
                });
            entry.streams += 1;
            entry.gone_since = None;
            (entry.assignment.subscribe(), entry.epoch)
        };
        if !known {
            inner.registrations += 1;
            info!(group, replica, "replica registered");
            replace(&mut inner, group);
        }
        Ok((
            receiver,
            StreamGuard {
                registry: self.clone(),
                group: group.to_owned(),
                replica: replica.to_owned(),
                epoch,
            },
        ))
    }

    fn stream_ended(&self, group: &str, replica: &str, epoch: u64, now: Instant) {
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
                    group,
                    replica, "registration stream ended; keeping the replica's place for the grace"
                );
                r.gone_since = Some(now);
            }
        }
    }

    /// Sets the live dispatchers (name to address) and re-places every group if they changed.
    pub fn set_dispatchers(&self, dispatchers: BTreeMap<String, String>) {
        let mut inner = self.inner();
        if inner.dispatchers == dispatchers {
            return;
        }
        info!(dispatchers = ?dispatchers.keys().collect::<Vec<_>>(), "dispatchers changed");
        inner.dispatchers = dispatchers;
        let groups: Vec<String> = inner.groups.keys().cloned().collect();
        for group in groups {
            replace(&mut inner, &group);
        }
    }

    /// Removes the replicas whose streams ended `grace` or longer before `now`.
    pub fn expire(&self, now: Instant, grace: Duration) {
        let mut inner = self.inner();
        let mut changed = Vec::new();
        for (name, state) in &mut inner.groups {
            let before = state.replicas.len();
            state.replicas.retain(|replica, r| {
                let keep = r
                    .gone_since
                    .is_none_or(|since| now.saturating_duration_since(since) < grace);
                if !keep {
                    info!(group = %name, replica, "replica removed: no registration stream for the grace");
                }
                keep
            });
            if state.replicas.len() != before {
                changed.push((name.clone(), before - state.replicas.len()));
            }
        }
        for (group, removed) in changed {
            inner.registrations -= removed;
            replace(&mut inner, &group);
        }
        inner.groups.retain(|_, g| !g.replicas.is_empty());
    }

    /// Removes `replica` from `group` now (it is shutting down), without the grace, and
    /// re-places the group; `Ok(false)` when it was not registered.
    pub fn leave(&self, group: &str, replica: &str, user: Option<&str>) -> Result<bool, NotOwner> {
        let mut inner = self.inner();
        let Some(state) = inner.groups.get_mut(group) else {
            return Ok(false);
        };
        self.owners.check(group, state.owner.as_deref(), user)?;
        if state.replicas.remove(replica).is_none() {
            return Ok(false);
        }
        info!(group, replica, "replica left");
        inner.registrations -= 1;
        replace(&mut inner, group);
        inner.groups.retain(|_, g| !g.replicas.is_empty());
        Ok(true)
    }

    /// Drops every registration (this replica stopped leading): their streams end, and the
    /// replicas register with the new leader.
    pub fn clear(&self) {
        let mut inner = self.inner();
        inner.groups.clear();
        inner.registrations = 0;
    }

    /// The placement of every group: replica to dispatcher names.
    pub fn placements(&self) -> BTreeMap<String, Placement> {
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

/// Recomputes the placement of `group` and pushes every changed assignment.
fn replace(inner: &mut Inner, group: &str) {
    let dispatchers: Vec<String> = inner.dispatchers.keys().cloned().collect();
    let addresses = inner.dispatchers.clone();
    let Some(state) = inner.groups.get_mut(group) else {
        return;
    };
    let (mut sent, mut moved) = (0, 0);
    let replicas: Vec<String> = state.replicas.keys().cloned().collect();
    let placement = place(&dispatchers, &replicas, &state.placement);
    if placement != state.placement {
        debug!(group, ?placement, "placement changed");
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
mod tests {
    use super::*;

    fn dispatchers(n: usize) -> BTreeMap<String, String> {
        (0..n)
            .map(|i| (format!("d{i}"), format!("10.0.0.{i}:7070")))
            .collect()
    }

    #[test]
    fn replicas_are_told_their_dispatchers_and_every_change() {
        let registry = Registry::new(10, GroupOwners::default());
        registry.set_dispatchers(dispatchers(3));
        let (mut a, _ga) = registry.register("g", "a", None).unwrap();
        assert_eq!(a.borrow_and_update().dispatchers.len(), 3);
        let (mut b, gb) = registry.register("g", "b", None).unwrap();
        assert!(a.has_changed().unwrap(), "a gives up a dispatcher to b");
        let (na, nb) = (
            a.borrow_and_update().dispatchers.len(),
            b.borrow_and_update().dispatchers.len(),
        );
        assert_eq!((na.min(nb), na.max(nb)), (1, 2));
        // b's stream ends: b keeps its place for the grace, then a takes everything again.
        drop(gb);
        let now = Instant::now();
        registry.expire(now, Duration::from_secs(5));
        assert!(!a.has_changed().unwrap());
        registry.expire(now + Duration::from_secs(5), Duration::from_secs(5));
        assert_eq!(a.borrow_and_update().dispatchers.len(), 3);
        assert_eq!(registry.len(), 1);
        assert!(b.has_changed().is_err(), "b's assignment is dropped");
    }

    #[test]
    fn a_replica_that_leaves_hands_its_dispatchers_over_at_once() {
        let registry = Registry::new(10, GroupOwners::default());
        registry.set_dispatchers(dispatchers(3));
        let (mut a, _ga) = registry.register("g", "a", None).unwrap();
        let (b, gb) = registry.register("g", "b", None).unwrap();
        a.borrow_and_update();
        assert!(registry.leave("g", "b", None).unwrap());
        // No grace: a polls all three dispatchers now, while b's stream is still open.
        assert_eq!(a.borrow_and_update().dispatchers.len(), 3);
        assert!(
            b.has_changed().is_err(),
            "b's assignment is dropped, so its stream ends"
        );
        assert_eq!(registry.len(), 1);
        assert!(!registry.leave("g", "b", None).unwrap(), "gone already");
        assert!(
            !registry.leave("other", "b", None).unwrap(),
            "no such group"
        );
        // Back under the same id (a restarted pod) before its old stream is seen to end: the
        // old stream ending must not count against the new registration.
        let (_b2, _gb2) = registry.register("g", "b", None).unwrap();
        drop(gb);
        registry.expire(
            Instant::now() + Duration::from_secs(60),
            Duration::from_secs(5),
        );
        assert_eq!(registry.len(), 2, "b's new registration stays");
        assert_eq!(a.borrow_and_update().dispatchers.len(), 2);
    }

    #[test]
    fn figures_count_replicas_assignments_and_moves() {
        let registry = Registry::new(10, GroupOwners::default());
        registry.set_dispatchers(dispatchers(2));
        let (_a, _ga) = registry.register("g", "a", None).unwrap();
        let (_b, _gb) = registry.register("g", "b", None).unwrap();
        let before = registry.figures();
        assert_eq!(
            (before.replicas, before.groups, before.dispatchers),
            (2, 1, 2)
        );
        // A third dispatcher: someone's dispatchers change.
        registry.set_dispatchers(dispatchers(3));
        let after = registry.figures();
        assert!(after.assignments > before.assignments);
        assert!(after.moves > before.moves);
    }

    #[test]
    fn a_reconnect_within_the_grace_moves_nothing() {
        let registry = Registry::new(10, GroupOwners::default());
        registry.set_dispatchers(dispatchers(2));
        let (_a, ga) = registry.register("g", "a", None).unwrap();
        let (_b, _gb) = registry.register("g", "b", None).unwrap();
        let before = registry.placements();
        drop(ga);
        let (mut again, _ga) = registry.register("g", "a", None).unwrap();
        registry.expire(
            Instant::now() + Duration::from_secs(60),
            Duration::from_secs(5),
        );
        assert_eq!(registry.placements(), before);
        assert_eq!(again.borrow_and_update().dispatchers.len(), 1);
    }

    #[test]
    fn registrations_are_bounded() {
        let registry = Registry::new(2, GroupOwners::default());
        let _a = registry.register("g", "a", None).unwrap();
        let _b = registry.register("h", "b", None).unwrap();
        assert_eq!(
            registry.register("g", "c", None).unwrap_err(),
            RegisterError::Full(2)
        );
        // Another stream of a known replica is not a new registration.
        assert!(registry.register("g", "a", None).is_ok());
    }

    #[test]
    fn a_listed_group_is_placed_for_its_listed_users_only() {
        let owners = GroupOwners::from_pairs([
            ("g".to_owned(), "team-a".to_owned()),
            ("g".to_owned(), "team-b".to_owned()),
        ]);
        let registry = Registry::new(10, owners);
        assert!(registry.register("g", "c", Some("team-c")).is_err());
        let _b = registry.register("g", "b", Some("team-b")).unwrap();
        assert!(registry.register("g", "a", Some("team-a")).is_ok());
        assert!(registry.register("g", "c", Some("team-c")).is_err());
    }

    #[test]
    fn a_group_is_placed_only_for_the_user_that_registered_it() {
        let registry = Registry::new(10, GroupOwners::default());
        let _a = registry.register("g", "a", Some("team-a")).unwrap();
        let refused = registry.register("g", "b", Some("team-b")).unwrap_err();
        assert!(
            refused
                .to_string()
                .starts_with("group \"g\" belongs to team-a, not team-b"),
            "{refused}"
        );
        assert!(registry.register("g", "b", None).is_err());
        assert!(registry.register("g", "c", Some("team-a")).is_ok());
        assert!(registry.register("h", "b", Some("team-b")).is_ok());
    }

    #[test]
    fn with_no_dispatcher_the_assignment_is_empty() {
        let registry = Registry::new(2, GroupOwners::default());
        let (mut a, _g) = registry.register("g", "a", None).unwrap();
        let first = a.borrow_and_update().clone();
        assert!(first.dispatchers.is_empty());
        assert_eq!(first.generation, 1);
        registry.set_dispatchers(dispatchers(1));
        assert_eq!(a.borrow_and_update().dispatchers, ["10.0.0.0:7070"]);
    }
}
