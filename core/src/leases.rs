//! What a process knows of the dispatcher Leases it watches, and which members are live.
//!
//! A member is live while its Lease has changed within its duration plus a grace, judged by when
//! *this* process last saw it change (as client-go's leader election does), never by comparing
//! the renew time written by another machine's clock with ours. Time is a parameter: the caller
//! passes the `Instant` of each observation and of each question.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use crate::handover::Peer;

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
    /// Where the holder serves.
    pub address: Option<String>,
    /// What the holder places keys by (`name` or `namespace`), if it says.
    pub ring_key: Option<String>,
    /// The Lease's resourceVersion as an integer (0 if not one).
    pub resource_version: u128,
}

/// What this process knows of the Leases it watches.
#[derive(Debug, Default)]
pub struct Observations {
    leases: HashMap<String, Seen>,
    newest: u128,
}

#[derive(Debug)]
struct Seen {
    state: LeaseState,
    /// When this process saw the holder or renew time change.
    changed_at: Instant,
}

impl Observations {
    /// Records the state of Lease `name` as seen at `now`.
    pub fn observe(&mut self, name: &str, state: LeaseState, now: Instant) {
        self.newest = self.newest.max(state.resource_version);
        match self.leases.get_mut(name) {
            Some(seen)
                if seen.state.holder == state.holder
                    && seen.state.renew_time == state.renew_time =>
            {
                seen.state = state;
            }
            _ => {
                self.leases.insert(
                    name.to_owned(),
                    Seen {
                        state,
                        changed_at: now,
                    },
                );
            }
        }
    }

    /// Records that Lease `name` is gone (released).
    pub fn forget(&mut self, name: &str) {
        self.leases.remove(name);
    }

    /// Whether Lease `name` is known (live or not).
    pub fn knows(&self, name: &str) -> bool {
        self.leases.contains_key(name)
    }

    /// Lease `name` as last seen.
    pub fn state(&self, name: &str) -> Option<&LeaseState> {
        self.leases.get(name).map(|s| &s.state)
    }

    /// Keeps only the Leases for which `keep` is true (after a re-list).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.leases.retain(|name, _| keep(name));
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
            .filter(|(_, s)| !s.state.holder.is_empty())
            .filter(|(_, s)| {
                now.saturating_duration_since(s.changed_at) <= s.state.duration + grace
            })
            .map(|(name, s)| {
                (
                    name.clone(),
                    Peer {
                        released: s.state.released.clone(),
                        resource_version: s.state.resource_version,
                        address: s.state.address.clone(),
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
            address: None,
            ring_key: None,
            resource_version: rv,
        }
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
    fn released_and_unheld_leases_are_not_members() {
        let t0 = Instant::now();
        let mut o = Observations::default();
        o.observe("a", lease("", "t1", 1), t0);
        o.observe("b", lease("b", "t1", 2), t0);
        o.forget("b");
        assert!(o.knows("a") && !o.knows("b"));
        assert!(o.live(t0, SEC).is_empty());
    }
}
