//! What a process knows of the dispatcher Leases it watches, and which members are live.
//!
//! A member is live while its Lease has changed within its duration plus a grace, judged by when
//! *this* process last saw it change (as client-go's leader election does), never by comparing
//! the renew time written by another machine's clock with ours. Time is a parameter: the caller
//! passes the `Instant` of each observation and of each question.
//!
//! A Lease that disappears is a release only when its holder marked it drained before deleting
//! it (nothing it handed out is still running). Deleted otherwise (by hand, a cleanup job, a
//! bug), or missing from a re-list, it is a member that died: it is kept, no longer live, as a
//! tombstone for [`TOMBSTONE_TTL`], so the dispatchers wait out its reconciles as for one whose
//! Lease expired.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

/// A live member as its Lease shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// The ring id it has released, if any.
    pub released: Option<String>,
    /// The newest Lease resourceVersion its holder had seen when it wrote the release
    /// ([`u128::MAX`] when it does not say: a dispatcher older than the rule).
    pub released_after: u128,
    /// The resourceVersion of its Lease as last seen. Resource versions of one resource are
    /// comparable integers (KEP-5504, stable since Kubernetes 1.35).
    pub resource_version: u128,
    /// Where it serves, if it says.
    pub address: Option<String>,
    /// The ring it waits for the others to release, and the newest Lease resourceVersion it had
    /// seen when it adopted that ring: releases written up to then do not count for it.
    pub awaits: Option<(String, u128)>,
    /// Whether it is still warming up to join ([`LeaseState::warming`]): not a member yet.
    pub warming: bool,
    /// Its tier capabilities ([`LeaseState::capabilities`]).
    pub capabilities: BTreeSet<String>,
}

impl Peer {
    /// Whether its Lease lists tier capability `capability`
    /// (`kube_dispatch_proto::capabilities::tier`): a Peer call or Lease mark that needs it is
    /// used towards this member only then.
    pub fn lists(&self, capability: &str) -> bool {
        self.capabilities.contains(capability)
    }
}

/// Whether every one of `peers` lists tier capability `capability`: a change to the Leases'
/// format that a member without it could not follow is made only while this holds (and undone
/// at the next write once it no longer does). True of no peers at all.
pub fn all_list<'a>(peers: impl IntoIterator<Item = &'a Peer>, capability: &str) -> bool {
    peers.into_iter().all(|p| p.lists(capability))
}

/// The members of `live` other than `identity` that say where they serve: name to `host:port`.
pub fn addresses(live: &BTreeMap<String, Peer>, identity: &str) -> BTreeMap<String, String> {
    live.iter()
        .filter(|(name, _)| *name != identity)
        .filter_map(|(name, peer)| Some((name.clone(), peer.address.clone()?)))
        .collect()
}

/// Those of `peers` whose Lease in `live` lists tier capability `capability`.
pub fn listing(
    peers: &BTreeMap<String, String>,
    live: &BTreeMap<String, Peer>,
    capability: &str,
) -> BTreeSet<String> {
    peers
        .keys()
        .filter(|name| live.get(*name).is_some_and(|p| p.lists(capability)))
        .cloned()
        .collect()
}

/// A Lease as this process last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseState {
    /// Holder identity; empty when released.
    pub holder: String,
    /// Renew time as written.
    pub renew_time: String,
    /// Lease duration.
    pub duration: Duration,
    /// The ring id the holder released.
    pub released: Option<String>,
    /// The newest Lease resourceVersion the holder had seen when it wrote the release.
    pub released_after: Option<u128>,
    /// Where the holder serves.
    pub address: Option<String>,
    /// The ring the holder waits for the others to release, with the newest Lease
    /// resourceVersion it had seen when it adopted that ring.
    pub awaits: Option<(String, u128)>,
    /// What the holder places keys by (`name` or `namespace`), if it says.
    pub ring_key: Option<String>,
    /// The Lease's resourceVersion as an integer (0 if not one).
    pub resource_version: u128,
    /// Whether the holder marked the Lease drained: it stopped with nothing in flight and
    /// deletes the Lease next.
    pub drained: bool,
    /// Whether the holder is warming up to join the ring: it lists what it will own while the
    /// others keep serving it, and is not a member until the mark is gone
    /// (`kube_dispatch_proto::lease::WARMING_ANNOTATION`).
    pub warming: bool,
    /// The tags of the sessions the holder may have handed keys to
    /// (`kube_dispatch_proto::lease::SESSIONS_ANNOTATION`); `None` when unknown: not listed (an
    /// older dispatcher), or more than it lists.
    pub sessions: Option<BTreeSet<u64>>,
    /// Sessions of members that died which replicas reported to the holder as ended, per member
    /// (`kube_dispatch_proto::lease::ENDED_ANNOTATION`).
    pub ended: BTreeMap<String, BTreeSet<u64>>,
    /// The holder's tier capabilities (`kube_dispatch_proto::lease::CAPABILITIES_ANNOTATION`);
    /// empty for a dispatcher of release 0.1.0.
    pub capabilities: BTreeSet<String>,
}

/// How long a Lease deleted without being drained is remembered (as a member that died). Longer
/// than any handover bound a dispatcher runs with; bounded so that names come and go freely.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(600);

/// What this process knows of the Leases it watches.
#[derive(Debug, Default)]
pub struct Observations {
    leases: HashMap<String, Seen>,
    newest: u128,
    /// Leases deleted without the drained mark since the last [`Observations::take_deaths`],
    /// even if written again (or drained and deleted) since: a holder killed, its Lease
    /// deleted and a new process started between two judgements never looks gone, yet its
    /// reconciles may still run. So is a release still pending at a re-list
    /// ([`Observations::relisted`]), which may hide such a death. At most one entry per Lease
    /// name seen; emptied by each judgement.
    deaths: BTreeSet<String>,
    /// Leases deleted with the drained mark since the last [`Observations::take_releases`],
    /// unless written since by a holder that is a member (not warming up) or deleted again
    /// without the mark: a member that left cleanly and whose name a new process, still
    /// warming up, took again before anyone judged (a quick restart, a judgement delayed by
    /// a lagging view) is a release, not a member that died; a re-list turns what is left into
    /// deaths ([`Observations::relisted`]). At most one entry per Lease name seen; emptied by
    /// each judgement (a reader that never judges, the load balancer, keeps at most that, as
    /// with `deaths`).
    releases: BTreeSet<String>,
}

#[derive(Debug)]
struct Seen {
    state: LeaseState,
    /// When this process saw the holder or renew time change.
    changed_at: Instant,
    /// When this process saw the Lease deleted (or missing from a re-list) without having been
    /// drained: a member that died, not live any more.
    deleted_at: Option<Instant>,
}

impl Observations {
    /// Records the state of Lease `name` as seen at `now`.
    pub fn observe(&mut self, name: &str, state: LeaseState, now: Instant) {
        self.newest = self.newest.max(state.resource_version);
        if !state.holder.is_empty() && !state.warming {
            // A member again: it may hand keys out, so a later absence is no release.
            self.releases.remove(name);
        }
        match self.leases.get_mut(name) {
            Some(seen)
                if seen.state.holder == state.holder
                    && seen.state.renew_time == state.renew_time =>
            {
                seen.state = state;
                // There, whatever a re-list made of it.
                seen.deleted_at = None;
            }
            _ => {
                self.leases.insert(
                    name.to_owned(),
                    Seen {
                        state,
                        changed_at: now,
                        deleted_at: None,
                    },
                );
            }
        }
    }

    /// Records that Lease `name` was deleted, `last` being its final state when the deletion
    /// says (a watch's delete event): forgotten if it was drained (a clean release), else kept
    /// as a member that died.
    pub fn deleted(&mut self, name: &str, last: Option<LeaseState>, now: Instant) {
        let Some(seen) = self.leases.get_mut(name) else {
            // Never seen live here: nothing of it to wait for.
            return;
        };
        if let Some(last) = last {
            seen.state.drained |= last.drained;
        }
        if seen.state.drained {
            self.leases.remove(name);
            self.releases.insert(name.to_owned());
        } else if seen.deleted_at.is_none() {
            // A death once: a re-list that misses a Lease already mourned is no new one.
            seen.deleted_at = Some(now);
            self.deaths.insert(name.to_owned());
            self.releases.remove(name);
        }
    }

    /// The Leases deleted without the drained mark since the last call, live again or not.
    pub fn take_deaths(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.deaths)
    }

    /// The Leases deleted with the drained mark since the last call whose name no member has
    /// written since (a new process still warming up may have): their holders released.
    pub fn take_releases(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.releases)
    }

    /// Forgets the tombstones older than [`TOMBSTONE_TTL`] at `now`.
    pub fn prune(&mut self, now: Instant) {
        self.leases.retain(|_, s| {
            s.deleted_at
                .is_none_or(|at| now.saturating_duration_since(at) < TOMBSTONE_TTL)
        });
    }

    /// Whether Lease `name` is known (live or not).
    pub fn knows(&self, name: &str) -> bool {
        self.leases.contains_key(name)
    }

    /// The sessions member `name` listed on its Lease as last seen ([`LeaseState::sessions`]):
    /// every session it may have handed keys to. `None` when they are unknown: not listed, more
    /// than it lists, or its Lease was deleted without the drained mark (whoever deleted it may
    /// have done so after a write this process never saw).
    pub fn published_sessions(&self, name: &str) -> Option<&BTreeSet<u64>> {
        let seen = self.leases.get(name)?;
        // Deleted, or written by a process warming up (a member found dead then is an earlier
        // process, whose sessions this one's Lease does not list): unknown.
        if seen.deleted_at.is_some() || seen.state.warming {
            return None;
        }
        seen.state.sessions.as_ref()
    }

    /// Whether each of `tags`, sessions of member `name`, is reported ended on a Lease this
    /// process knows ([`LeaseState::ended`]): whichever member a replica told, its Lease carries
    /// the report to the others. A deleted Lease carries nothing: a process that starts later
    /// never sees it, so every process counts the same reports (what the protocol model
    /// assumes), at the cost of waiting out the bound when a relaying member's Lease is
    /// deleted before the wait ends.
    pub fn all_ended(&self, name: &str, tags: &BTreeSet<u64>) -> bool {
        tags.iter().all(|tag| {
            self.leases.values().any(|s| {
                s.deleted_at.is_none() && s.state.ended.get(name).is_some_and(|e| e.contains(tag))
            })
        })
    }

    /// Lease `name` as last seen.
    pub fn state(&self, name: &str) -> Option<&LeaseState> {
        self.leases.get(name).map(|s| &s.state)
    }

    /// After a re-list (each Lease it showed [`Observations::observe`]d first): the Leases for
    /// which `listed` is false were deleted while the watch was away
    /// ([`Observations::deleted`], without their final state), and every release still
    /// pending becomes a death.
    pub fn relisted(&mut self, listed: impl Fn(&str) -> bool, now: Instant) {
        let gone: Vec<String> = self
            .leases
            .keys()
            .filter(|name| !listed(name))
            .cloned()
            .collect();
        for name in gone {
            self.deleted(&name, None, now);
        }
        // A release that no member's write has ended (the re-list showed the Lease warming up,
        // or not at all) may hide a process of its name that joined, handed keys out and died
        // while the watch was away (its Lease deleted by hand, say): counted as a death, its
        // sessions unknown. A Lease this process forgot at its drained deletion is not in the
        // list above, so this is the only place its death can be found.
        let hidden = std::mem::take(&mut self.releases);
        self.deaths.extend(hidden);
    }

    /// The newest Lease resourceVersion seen.
    pub fn newest(&self) -> u128 {
        self.newest
    }

    /// The members live at `now`: Leases with a holder that changed within their duration
    /// plus `grace`.
    pub fn live(&self, now: Instant, grace: Duration) -> BTreeMap<String, Peer> {
        self.leases
            .iter()
            .filter(|(_, s)| !s.state.holder.is_empty() && s.deleted_at.is_none())
            .filter(|(_, s)| {
                now.saturating_duration_since(s.changed_at) <= s.state.duration + grace
            })
            .map(|(name, s)| {
                (
                    name.clone(),
                    Peer {
                        released: s.state.released.clone(),
                        released_after: s.state.released_after.unwrap_or(u128::MAX),
                        resource_version: s.state.resource_version,
                        address: s.state.address.clone(),
                        awaits: s.state.awaits.clone(),
                        warming: s.state.warming,
                        capabilities: s.state.capabilities.clone(),
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn lease(holder: &str, renew: &str, rv: u128) -> LeaseState {
        LeaseState {
            holder: holder.into(),
            renew_time: renew.into(),
            duration: 10 * SEC,
            released: None,
            released_after: None,
            address: None,
            awaits: None,
            ring_key: None,
            resource_version: rv,
            drained: false,
            warming: false,
            sessions: None,
            ended: BTreeMap::new(),
            capabilities: BTreeSet::new(),
        }
    }

    #[test]
    fn a_member_lists_what_its_lease_says_and_all_list_needs_every_one() {
        let mut obs = Observations::default();
        let t0 = Instant::now();
        let mut newer = lease("d-0", "r1", 1);
        newer.capabilities = BTreeSet::from(["peer-groups".to_owned(), "warming".to_owned()]);
        obs.observe("d-0", newer, t0);
        // A 0.1.0 dispatcher: no list.
        obs.observe("d-1", lease("d-1", "r1", 2), t0);
        let live = obs.live(t0, Duration::ZERO);
        assert!(live["d-0"].lists("peer-groups"));
        assert!(!live["d-0"].lists("session-reports"));
        assert!(!live["d-1"].lists("peer-groups"));
        assert!(!all_list(live.values(), "warming"));
        assert!(all_list(
            live.values().filter(|p| p.lists("warming")),
            "warming"
        ));
        assert!(all_list(std::iter::empty(), "warming"));
    }

    #[test]
    fn a_member_lives_while_its_lease_changes() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        o.observe("a", lease("a", "t1", 1), t0);
        o.observe("b", lease("b", "t1", 2), t0);
        assert_eq!(o.live(t0 + 10 * SEC, SEC).len(), 2);
        // a renews, b falls silent: seeing b's unchanged lease again does not renew it, though
        // its release is taken.
        o.observe("a", lease("a", "t2", 3), t0 + 8 * SEC);
        o.observe(
            "b",
            LeaseState {
                released: Some("r".into()),
                ..lease("b", "t1", 4)
            },
            t0 + 8 * SEC,
        );
        assert_eq!(
            o.live(t0 + 9 * SEC, SEC)["b"].released.as_deref(),
            Some("r")
        );
        let live = o.live(t0 + 12 * SEC, SEC);
        assert_eq!(live.into_keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(o.newest(), 4);
    }

    #[test]
    fn drained_and_unheld_leases_are_not_members() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        o.observe("a", lease("", "t1", 1), t0);
        o.observe("b", lease("b", "t1", 2), t0);
        let drained = LeaseState {
            drained: true,
            ..lease("b", "t1", 3)
        };
        o.deleted("b", Some(drained), t0);
        assert!(o.knows("a") && !o.knows("b"), "a drained Lease is released");
        assert!(o.live(t0, SEC).is_empty());
    }

    /// A Lease deleted without being drained, or missing from a re-list, is a member that died:
    /// not live, still known (so its reconciles are waited out), forgotten after the tombstone's
    /// time.
    #[test]
    fn a_lease_deleted_undrained_is_a_member_that_died() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        for (name, rv) in [("a", 1), ("b", 2), ("c", 3)] {
            o.observe(name, lease(name, "t1", rv), t0);
        }
        o.deleted("b", Some(lease("b", "t1", 4)), t0 + SEC);
        o.relisted(|name| name != "c", t0 + SEC);
        assert_eq!(o.live(t0 + SEC, SEC).into_keys().collect::<Vec<_>>(), ["a"]);
        assert!(o.knows("b") && o.knows("c"));
        assert_eq!(o.state("b").map(|s| s.resource_version), Some(2));
        // Seen again (recreated by its holder): live again.
        o.observe("c", lease("c", "t2", 5), t0 + 2 * SEC);
        assert!(o.live(t0 + 2 * SEC, SEC).contains_key("c"));
        o.prune(t0 + SEC + TOMBSTONE_TTL);
        assert!(!o.knows("b") && o.knows("c"));
        // A deletion of a Lease never seen is nothing to wait for.
        o.deleted("z", None, t0);
        assert!(!o.knows("z"));
    }

    /// A Lease deleted without the drained mark and written again before anyone judged (a
    /// holder killed, its Lease deleted, a new process started) is a death all the same, taken
    /// once; a drained one is not.
    #[test]
    fn a_lease_deleted_undrained_and_written_again_is_a_death_taken_once() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        o.observe("a", lease("a", "t1", 1), t0);
        o.observe("b", lease("b", "t1", 2), t0);
        o.deleted("a", None, t0 + SEC);
        o.observe("a", lease("a", "t2", 3), t0 + SEC);
        let drained = LeaseState {
            drained: true,
            ..lease("b", "t1", 4)
        };
        o.deleted("b", Some(drained), t0 + SEC);
        assert!(o.live(t0 + SEC, SEC).contains_key("a"));
        assert_eq!(o.take_deaths().into_iter().collect::<Vec<_>>(), ["a"]);
        assert!(o.take_deaths().is_empty());
        assert_eq!(o.take_releases().into_iter().collect::<Vec<_>>(), ["b"]);
        // Deleted again and missed by later re-lists: one death, not one per re-list.
        o.deleted("a", None, t0 + 2 * SEC);
        o.relisted(|name| !["a", "b"].contains(&name), t0 + 3 * SEC);
        o.relisted(|name| !["a", "b"].contains(&name), t0 + 4 * SEC);
        assert_eq!(o.take_deaths().len(), 1);
    }

    /// A Lease drained and deleted is a release until a member (not a process warming up)
    /// writes it again, or it is deleted again without the mark; taken once.
    #[test]
    fn a_drained_lease_is_a_release_until_a_member_writes_it_again() {
        let t0 = Instant::now();
        let drained = |name: &str, rv| LeaseState {
            drained: true,
            ..lease(name, "t1", rv)
        };
        let warming = |name: &str, rv| LeaseState {
            warming: true,
            ..lease(name, "t2", rv)
        };
        let mut o = Observations::default();
        for (name, rv) in [("a", 1), ("b", 2), ("c", 3)] {
            o.observe(name, lease(name, "t1", rv), t0);
        }
        for (name, rv) in [("a", 4), ("b", 5), ("c", 6)] {
            o.deleted(name, Some(drained(name, rv)), t0 + SEC);
        }
        o.observe("a", warming("a", 7), t0 + SEC);
        o.observe("b", lease("b", "t2", 8), t0 + SEC);
        o.observe("c", warming("c", 9), t0 + SEC);
        o.deleted("c", None, t0 + 2 * SEC);
        assert_eq!(o.take_releases().into_iter().collect::<Vec<_>>(), ["a"]);
        assert!(o.take_releases().is_empty());
        assert_eq!(o.take_deaths().into_iter().collect::<Vec<_>>(), ["c"]);
        assert_eq!(
            o.published_sessions("a"),
            None,
            "a warming Lease lists no member's"
        );
    }

    /// A re-list ends every release pending: one whose Lease it shows warming up, or does not
    /// show at all (forgotten at its drained deletion), may hide a process that joined, handed
    /// keys out and died while the watch was away; one it shows written by a member is over.
    #[test]
    fn a_relist_turns_every_pending_release_into_a_death() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        for (name, rv) in [("a", 1), ("b", 2), ("c", 3)] {
            o.observe(name, lease(name, "t1", rv), t0);
        }
        for (name, rv) in [("a", 4), ("b", 5), ("c", 6)] {
            let drained = LeaseState {
                drained: true,
                ..lease(name, "t1", rv)
            };
            o.deleted(name, Some(drained), t0 + SEC);
        }
        let t2 = t0 + 2 * SEC;
        let warming = LeaseState {
            warming: true,
            ..lease("a", "t2", 7)
        };
        o.observe("a", warming, t2);
        o.observe("b", lease("b", "t2", 8), t2);
        o.relisted(|name| ["a", "b"].contains(&name), t2);
        assert!(o.take_releases().is_empty());
        assert_eq!(o.take_deaths().into_iter().collect::<Vec<_>>(), ["a", "c"]);
    }

    /// The sessions a member listed are known while its Lease is (expired or not), and not once
    /// it was deleted without the drained mark; a report of a session ended counts from any
    /// Lease that is not deleted, and only for the member it names.
    #[test]
    fn published_sessions_and_the_reports_of_their_end() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        let tags = BTreeSet::from([1, 2]);
        o.observe(
            "a",
            LeaseState {
                sessions: Some(tags.clone()),
                ..lease("a", "t1", 1)
            },
            t0,
        );
        o.observe("b", lease("b", "t1", 2), t0);
        assert_eq!(o.published_sessions("a"), Some(&tags));
        assert_eq!(o.published_sessions("b"), None, "not listed: unknown");
        assert!(!o.all_ended("a", &tags));
        let reports = |ended: &[(&str, u64)], rv| {
            let mut map: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
            for (member, tag) in ended {
                map.entry((*member).to_owned()).or_default().insert(*tag);
            }
            LeaseState {
                ended: map,
                ..lease("b", "t2", rv)
            }
        };
        o.observe("b", reports(&[("a", 1), ("c", 2)], 3), t0 + SEC);
        assert!(
            !o.all_ended("a", &tags),
            "session 2 of c is not session 2 of a"
        );
        o.observe("c", reports(&[("a", 2)], 4), t0 + SEC);
        assert!(o.all_ended("a", &tags), "one from b, one from c");
        assert!(o.all_ended("a", &BTreeSet::new()));
        o.deleted("a", None, t0 + 2 * SEC);
        assert_eq!(
            o.published_sessions("a"),
            None,
            "deleted undrained: unknown"
        );
        o.deleted("c", None, t0 + 2 * SEC);
        assert!(
            !o.all_ended("a", &tags),
            "a deleted Lease carries no report"
        );
    }
}
