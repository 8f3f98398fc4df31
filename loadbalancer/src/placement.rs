//! Placement of one controller group's replicas onto dispatchers: pure logic, no I/O.
//!
//! Rules:
//! - every live dispatcher is polled by at least one replica of the group;
//! - with at least as many replicas as dispatchers, each replica polls one dispatcher and the
//!   replicas per dispatcher differ by at most one;
//! - with fewer replicas than dispatchers, each dispatcher is polled by one replica and the
//!   dispatchers per replica differ by at most one;
//! - a change keeps every previous assignment that the rules allow, so few connections move.
//!
//! Both regimes are one problem with the roles swapped: every member of the larger side gets
//! exactly one partner on the smaller side, and partners' loads are balanced.

use std::collections::{BTreeMap, BTreeSet};

/// Which dispatchers each replica polls.
pub type Placement = BTreeMap<String, BTreeSet<String>>;

/// Places `replicas` onto `dispatchers`, keeping what it can of `previous`. Replicas get no
/// dispatcher when there is none; dispatchers get no replica when there is none.
pub fn place(dispatchers: &[String], replicas: &[String], previous: &Placement) -> Placement {
    let dispatchers: BTreeSet<&str> = dispatchers.iter().map(String::as_str).collect();
    let replicas: BTreeSet<&str> = replicas.iter().map(String::as_str).collect();
    let mut placement: Placement = replicas
        .iter()
        .map(|r| ((*r).to_owned(), BTreeSet::new()))
        .collect();
    if dispatchers.is_empty() || replicas.is_empty() {
        return placement;
    }
    let previous_edges: BTreeSet<(&str, &str)> = previous
        .iter()
        .flat_map(|(r, ds)| ds.iter().map(move |d| (r.as_str(), d.as_str())))
        .filter(|(r, d)| replicas.contains(r) && dispatchers.contains(d))
        .collect();
    if replicas.len() >= dispatchers.len() {
        // Each replica gets one dispatcher.
        for (r, d) in match_balanced(&replicas, &dispatchers, &previous_edges) {
            placement
                .entry(r.to_owned())
                .or_default()
                .insert(d.to_owned());
        }
    } else {
        // Each dispatcher gets one replica.
        let flipped: BTreeSet<(&str, &str)> =
            previous_edges.iter().map(|(r, d)| (*d, *r)).collect();
        for (d, r) in match_balanced(&dispatchers, &replicas, &flipped) {
            placement
                .entry(r.to_owned())
                .or_default()
                .insert(d.to_owned());
        }
    }
    placement
}

/// Gives each member of `many` exactly one partner in `few` (`many.len() >= few.len() > 0`),
/// with partner loads within one of each other, keeping edges of `previous` where it can.
fn match_balanced<'a>(
    many: &BTreeSet<&'a str>,
    few: &BTreeSet<&'a str>,
    previous: &BTreeSet<(&'a str, &'a str)>,
) -> BTreeMap<&'a str, &'a str> {
    // Keep one previous partner per member.
    let mut partner: BTreeMap<&str, &str> = BTreeMap::new();
    for (m, f) in previous {
        partner.entry(m).or_insert(f);
    }
    let mut members_of: BTreeMap<&str, Vec<&str>> = few.iter().map(|f| (*f, Vec::new())).collect();
    for (m, f) in &partner {
        members_of.entry(f).or_default().push(m);
    }
    // Capacities: `extra` partners take one more than the others. Give the larger capacities
    // to the partners that already hold the most, so the fewest members move.
    let low = many.len() / few.len();
    let extra = many.len() % few.len();
    let mut by_load: Vec<&str> = few.iter().copied().collect();
    by_load.sort_by_key(|f| std::cmp::Reverse(members_of[f].len()));
    let capacity: BTreeMap<&str, usize> = by_load
        .iter()
        .enumerate()
        .map(|(i, f)| (*f, low + usize::from(i < extra)))
        .collect();
    // Over capacity: the members that sort last leave.
    for (f, members) in &mut members_of {
        while members.len() > capacity[f] {
            if let Some(m) = members.pop() {
                partner.remove(m);
            }
        }
    }
    // Members without a partner go to the least loaded partner with room.
    for m in many {
        if partner.contains_key(m) {
            continue;
        }
        let target = members_of
            .iter()
            .filter(|(f, ms)| ms.len() < capacity[*f])
            .min_by_key(|(_, ms)| ms.len())
            .map(|(f, _)| *f);
        if let Some(f) = target {
            partner.insert(m, f);
            members_of.entry(f).or_default().push(m);
        }
    }
    partner
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    /// Checks the placement rules; returns the number of (replica, dispatcher) edges.
    fn check(dispatchers: &[String], replicas: &[String], p: &Placement) -> usize {
        let mut per_dispatcher: BTreeMap<&str, usize> =
            dispatchers.iter().map(|d| (d.as_str(), 0)).collect();
        for (r, ds) in p {
            assert!(replicas.contains(r), "unknown replica {r}");
            for d in ds {
                *per_dispatcher
                    .get_mut(d.as_str())
                    .expect("known dispatcher") += 1;
            }
        }
        if dispatchers.is_empty() || replicas.is_empty() {
            assert!(p.values().all(BTreeSet::is_empty));
            return 0;
        }
        let loads: Vec<usize> = per_dispatcher.values().copied().collect();
        let per_replica: Vec<usize> = p.values().map(BTreeSet::len).collect();
        assert!(
            loads.iter().all(|l| *l >= 1),
            "a dispatcher nobody polls: {p:?}"
        );
        assert!(
            per_replica.iter().all(|l| *l >= 1),
            "a replica with nothing to poll: {p:?}"
        );
        let spread = |v: &[usize]| v.iter().max().unwrap() - v.iter().min().unwrap();
        assert!(
            spread(&loads) <= 1,
            "replicas per dispatcher unbalanced: {p:?}"
        );
        assert!(
            spread(&per_replica) <= 1,
            "dispatchers per replica unbalanced: {p:?}"
        );
        per_replica.iter().sum()
    }

    fn edges(p: &Placement) -> BTreeSet<(String, String)> {
        p.iter()
            .flat_map(|(r, ds)| ds.iter().map(move |d| (r.clone(), d.clone())))
            .collect()
    }

    #[test]
    fn fewer_replicas_poll_several_dispatchers_evenly() {
        let p = place(&names("d", 5), &names("r", 2), &Placement::new());
        assert_eq!(check(&names("d", 5), &names("r", 2), &p), 5);
        let sizes: Vec<usize> = p.values().map(BTreeSet::len).collect();
        assert_eq!(sizes, [3, 2]);
    }

    #[test]
    fn nothing_to_place_onto() {
        let p = place(&[], &names("r", 2), &Placement::new());
        assert!(p.values().all(BTreeSet::is_empty));
        assert!(place(&names("d", 2), &[], &Placement::new()).is_empty());
    }

    proptest! {
        #[test]
        fn rules_hold_and_a_valid_placement_is_kept(d in 0usize..8, r in 0usize..12) {
            let (ds, rs) = (names("d", d), names("r", r));
            let p = place(&ds, &rs, &Placement::new());
            check(&ds, &rs, &p);
            prop_assert_eq!(place(&ds, &rs, &p), p, "a valid placement must be stable");
        }

        /// With at least as many replicas as dispatchers, a new replica moves nobody else.
        #[test]
        fn a_new_replica_moves_nobody(d in 1usize..8, extra in 0usize..8) {
            let ds = names("d", d);
            let before_replicas = names("r", d + extra);
            let before = place(&ds, &before_replicas, &Placement::new());
            let after_replicas = names("r", d + extra + 1);
            let after = place(&ds, &after_replicas, &before);
            check(&ds, &after_replicas, &after);
            prop_assert!(edges(&before).is_subset(&edges(&after)));
        }

        /// A lost dispatcher moves only the replicas that polled it.
        #[test]
        fn a_lost_dispatcher_moves_only_its_replicas(d in 2usize..8, extra in 0usize..8, lost in 0usize..8) {
            let ds = names("d", d);
            let rs = names("r", d + extra);
            let before = place(&ds, &rs, &Placement::new());
            let gone = ds[lost % d].clone();
            let remaining: Vec<String> = ds.iter().filter(|x| **x != gone).cloned().collect();
            let after = place(&remaining, &rs, &before);
            check(&remaining, &rs, &after);
            for (r, was) in &before {
                if !was.contains(&gone) {
                    prop_assert_eq!(&after[r], was, "replica {} moved though its dispatcher stayed", r);
                }
            }
        }
    }
}
