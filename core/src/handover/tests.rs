use kube_dispatch_proto::key::hash64;

use super::*;
use crate::leases::{LeaseState, Observations};

const SEC: Duration = Duration::from_secs(1);
const T: Duration = Duration::from_secs(30);

mod judging;

fn peers(entries: &[(&str, Option<&Ring>, u128)]) -> BTreeMap<String, Peer> {
    entries
        .iter()
        .map(|(name, released, rv)| {
            (
                (*name).to_owned(),
                Peer {
                    released: released.map(ring_id),
                    released_after: u128::MAX,
                    resource_version: *rv,
                    address: None,
                    awaits: None,
                    warming: false,
                    capabilities: BTreeSet::new(),
                },
            )
        })
        .collect()
}

fn ring(members: &[&str]) -> Ring {
    Ring::new(members.iter().copied())
}

/// A key hash owned by `owner` on `a` and by `other` on `b`.
fn moved_key(a: &Ring, b: &Ring, owner: &str, other: &str) -> u64 {
    (0u64..)
        .map(|i| hash64(&i.to_le_bytes()))
        .find(|h| a.owner_of_hash(*h) == Some(owner) && b.owner_of_hash(*h) == Some(other))
        .unwrap()
}

/// d0 serves alone; d1 joins and leaves again before any handover completes: d0 serves
/// the keys d1 took on the ring again without a handover, so only a list shows what
/// changed in them meanwhile. A member joining never does, and a completed handover does.
#[test]
fn keys_that_come_back_without_a_handover_may_be_served_anew() {
    let now = Instant::now();
    let (alone, both) = (ring(&["d0"]), ring(&["d0", "d1"]));
    let mut h = Handover::new("d0", T, now, false);
    let serving = h.update(&peers(&[("d0", None, 1)]), 1, false, now);
    let joined = h.update(&peers(&[("d0", None, 1), ("d1", None, 2)]), 2, false, now);
    let k = moved_key(&alone, &both, "d0", "d1");
    assert!(serving.serves_hash(k) && !joined.serves_hash(k));
    assert!(!joined.may_serve_more_than(&serving), "a member joined");
    let left = h.update(&peers(&[("d0", None, 3)]), 3, false, now);
    assert!(left.serves_hash(k));
    assert_eq!(
        left.settled.as_ref().map(|r| r.members()),
        serving.settled.as_ref().map(|r| r.members()),
        "no handover between"
    );
    assert!(left.may_serve_more_than(&joined), "d1 left the ring");
    assert!(!left.may_serve_more_than(&left));
    assert!(
        !left.closed().may_serve_more_than(&joined),
        "nothing served"
    );
    assert!(left.may_serve_more_than(&left.closed()), "served again");
}

/// The served set is what d0 owns on its ring and on its settled ring together: it grows
/// only when a member drops out of both, never on a death or a join alone.
#[test]
fn only_a_member_dropping_out_of_ring_and_settled_ring_lets_more_be_served() {
    let slice = |ring_of: &[&str], settled: &[&str]| Slice {
        settled: Some(Arc::new(ring(settled))),
        ..Slice::fixed("d0", ring(ring_of))
    };
    let three = slice(&["d0", "d1", "d2"], &["d0", "d1", "d2"]);
    let d2_died = slice(&["d0", "d1"], &["d0", "d1", "d2"]);
    let taken_over = slice(&["d0", "d1"], &["d0", "d1"]);
    let d3_joins = slice(&["d0", "d1", "d3"], &["d0", "d1"]);
    let d3_joined = slice(&["d0", "d1", "d3"], &["d0", "d1", "d3"]);
    assert!(
        !d2_died.may_serve_more_than(&three),
        "held until the handover"
    );
    assert!(
        taken_over.may_serve_more_than(&d2_died),
        "d2's keys served here now"
    );
    assert!(!d3_joins.may_serve_more_than(&taken_over));
    assert!(
        !d3_joined.may_serve_more_than(&d3_joins),
        "a join only gives keys away"
    );
    assert!(
        taken_over.may_serve_more_than(&d3_joins),
        "d3 left before its handover"
    );
    // For every key, served on the later slice and not on the earlier implies the rule
    // said so.
    let slices = [&three, &d2_died, &taken_over, &d3_joins, &d3_joined];
    for a in slices {
        for b in slices {
            let grew = (0u64..2000)
                .map(|i| hash64(&i.to_le_bytes()))
                .any(|h| b.serves_hash(h) && !a.serves_hash(h));
            assert!(!grew || b.may_serve_more_than(a), "{a:?} to {b:?}");
        }
    }
}

#[test]
fn a_lone_dispatcher_serves_at_once() {
    let now = Instant::now();
    let mut h = Handover::new("d0", T, now, false);
    let s = h.update(&peers(&[("d0", None, 1)]), 1, false, now);
    assert!(s.is_settled());
    assert!(s.serves_hash(42));
}

#[test]
fn a_joining_member_waits_for_a_fresh_release_by_every_other() {
    let now = Instant::now();
    let (r1, r2) = (ring(&["d0"]), ring(&["d0", "d1"]));
    let mut h = Handover::new("d1", T, now, false);
    // d0 released the old ring, and even the new ring before d1 adopted it: not enough.
    let s = h.update(
        &peers(&[("d0", Some(&r2), 5), ("d1", None, 6)]),
        6,
        false,
        now,
    );
    assert!(!s.is_settled());
    let k = moved_key(&r1, &r2, "d0", "d1");
    assert!(s.owns_hash(k) && !s.serves_hash(k));
    let s = h.update(
        &peers(&[("d0", Some(&r1), 7), ("d1", None, 6)]),
        7,
        false,
        now,
    );
    assert!(
        !s.serves_hash(k),
        "a release of another ring does not count"
    );
    assert!(
        h.waiting_for(&peers(&[("d0", Some(&r1), 7)]))
            .unwrap()
            .contains("d0")
    );
    let s = h.update(
        &peers(&[("d0", Some(&r2), 8), ("d1", None, 6)]),
        8,
        false,
        now,
    );
    assert!(s.serves_hash(k));
    assert!(h.waiting_for(&peers(&[("d0", Some(&r2), 8)])).is_none());
}

#[test]
fn a_joiner_says_what_it_awaits_and_a_member_that_released_too_early_owes_a_release() {
    let now = Instant::now();
    let r2 = ring(&["d0", "d1"]);
    let id = ring_id(&r2);
    let mut joiner = Handover::new("d1", T, now, false);
    // d0 released the new ring at resourceVersion 5, before d1 adopted it having seen 6.
    let live = peers(&[("d0", Some(&r2), 5), ("d1", None, 6)]);
    assert!(!joiner.update(&live, 6, false, now).is_settled());
    assert_eq!(joiner.awaits(), Some((id.clone(), 6)));

    // d0, settled on the same ring, sees what d1 awaits.
    let member = Handover::new("d0", T, now, false);
    let mut seen = peers(&[("d0", Some(&r2), 5), ("d1", Some(&r2), 7)]);
    seen.get_mut("d1").unwrap().awaits = Some((id.clone(), 6));
    let write = |rv: u128, after: u128| Peer {
        released: Some(id.clone()),
        released_after: after,
        resource_version: rv,
        ..Peer::default()
    };
    // Its last write (5) came before d1's adoption (6): it owes one now.
    assert_eq!(member.owed_release(&seen, Some(&id), &write(5, 5)), Some(6));
    assert_eq!(member.owed_release(&seen, Some(&id), &write(6, 6)), Some(6));
    // A later write by a holder that had not seen all d1 had seen does not count either.
    assert_eq!(member.owed_release(&seen, Some(&id), &write(8, 5)), Some(6));
    // Once it wrote again having seen d1's adoption, nothing more: one write per adoption.
    assert_eq!(member.owed_release(&seen, Some(&id), &write(8, 7)), None);
    // A last write of another ring (or of none) owes the ring released now.
    let other = Peer {
        released: Some("other".into()),
        ..write(8, 7)
    };
    assert_eq!(member.owed_release(&seen, Some(&id), &other), Some(6));
    // Releasing another ring, or none, answers nothing.
    assert_eq!(
        member.owed_release(&seen, Some("other"), &write(5, 5)),
        None
    );
    assert_eq!(member.owed_release(&seen, None, &write(5, 5)), None);
    // Its own marker is not a peer's.
    let mut own = peers(&[("d0", Some(&r2), 5)]);
    own.get_mut("d0").unwrap().awaits = Some((id.clone(), 6));
    assert_eq!(member.owed_release(&own, Some(&id), &write(5, 5)), None);

    // The write d1 then sees counts, and d1 awaits nothing more.
    let live = peers(&[("d0", Some(&r2), 8), ("d1", None, 7)]);
    assert!(joiner.update(&live, 8, false, now).is_settled());
    assert_eq!(joiner.awaits(), None);
    // Off its ring, a dispatcher awaits nothing.
    let outside = Handover::new("d9", T, now, false);
    assert_eq!(outside.awaits(), None);
}

#[test]
fn keys_owned_on_both_rings_are_served_during_the_handover() {
    let now = Instant::now();
    let (r2, r3) = (ring(&["d0", "d1"]), ring(&["d0", "d1", "d2"]));
    let mut h = Handover::new("d0", T, now, false);
    // Adopted when d1's Lease was seen (rv 2); d1's next renewal releases it.
    let live2 = peers(&[("d0", None, 1), ("d1", Some(&r2), 2)]);
    assert!(!h.update(&live2, 2, false, now).is_settled());
    let live2 = peers(&[("d0", None, 1), ("d1", Some(&r2), 3)]);
    assert!(h.update(&live2, 3, false, now).is_settled());
    let s = h.update(
        &peers(&[("d0", None, 1), ("d1", Some(&r2), 3), ("d2", None, 4)]),
        4,
        false,
        now,
    );
    assert!(!s.is_settled());
    let kept = moved_key(&r2, &r3, "d0", "d0");
    let gone = moved_key(&r2, &r3, "d0", "d2");
    assert!(s.serves_hash(kept));
    assert!(!s.serves_hash(gone) && !s.owns_hash(gone));
    // d1 gains nothing from d0 here, but the gate is for the whole ring: it waits on d1
    // and d2 alike.
    let s = h.update(
        &peers(&[("d0", None, 1), ("d1", Some(&r3), 5), ("d2", Some(&r3), 6)]),
        6,
        false,
        now,
    );
    assert!(s.is_settled());
}

#[test]
fn a_dead_member_is_waited_out_for_the_bound() {
    let t0 = Instant::now();
    let (r2, r1) = (ring(&["d0", "d1"]), ring(&["d0"]));
    let mut h = Handover::new("d0", T, t0, false);
    h.update(&peers(&[("d0", None, 1), ("d1", None, 2)]), 2, false, t0);
    let live = peers(&[("d0", None, 1), ("d1", Some(&r2), 3)]);
    assert!(h.update(&live, 3, false, t0).is_settled());
    h.died("d1", t0 + SEC);
    let k = moved_key(&r2, &r1, "d1", "d0");
    let live = peers(&[("d0", None, 3)]);
    assert!(!h.update(&live, 3, false, t0 + SEC).serves_hash(k));
    assert!(!h.update(&live, 3, false, t0 + T).serves_hash(k));
    assert!(h.waiting_for(&live).unwrap().contains("d1 (died)"));
    assert!(h.update(&live, 3, false, t0 + SEC + T).serves_hash(k));
}

#[test]
fn a_restart_after_a_crash_waits_out_the_previous_process() {
    let t0 = Instant::now();
    let mut h = Handover::new("d0", T, t0, true);
    let live = peers(&[("d0", None, 1)]);
    assert!(!h.update(&live, 1, false, t0).is_settled());
    assert!(!h.update(&live, 1, false, t0 + T - SEC).is_settled());
    assert!(h.update(&live, 1, false, t0 + T).is_settled());
}

/// A restart after a crash whose predecessor's Lease listed its sessions: the wait ends once
/// each is reported ended on some Lease (here this dispatcher's own, which carries the reports
/// replicas sent it), not before, and meanwhile no ring is released and the previous process
/// is awaited as a member that died.
#[test]
fn a_restart_after_a_crash_serves_once_the_previous_processs_sessions_are_reported_ended() {
    let t0 = Instant::now();
    let mut o = Observations::default();
    let mut h = Handover::new("d0", T, t0, true).predecessor_listed(Some(BTreeSet::from([7, 8])));
    o.observe("d0", lease_of("d0", "t1", 1), t0);
    let (live, _) = h.judge(&mut o, SEC, t0);
    assert!(!h.update(&live, o.newest(), false, t0).is_settled());
    assert!(h.holds_for_predecessor(t0) && h.waits_on_dead(t0));
    assert_eq!(h.releasable(Some("ring".into()), t0), None);
    let awaited: Vec<(&str, &BTreeSet<u64>)> = h.awaited().collect();
    assert_eq!(awaited, [("d0", &BTreeSet::from([7, 8]))]);
    assert!(
        h.waiting_for(&live)
            .unwrap()
            .contains("previous process (died) to be gone for 30s or its 2 listed sessions")
    );
    // One of the two reported: still held.
    o.observe(
        "d0",
        LeaseState {
            ended: ended("d0", &[7]),
            ..lease_of("d0", "t2", 2)
        },
        t0 + SEC,
    );
    let (live, _) = h.judge(&mut o, SEC, t0 + SEC);
    assert!(!h.update(&live, o.newest(), false, t0 + SEC).is_settled());
    // Both: served, long before the bound.
    o.observe(
        "d0",
        LeaseState {
            ended: ended("d0", &[7, 8]),
            ..lease_of("d0", "t3", 3)
        },
        t0 + 2 * SEC,
    );
    let (live, _) = h.judge(&mut o, SEC, t0 + 2 * SEC);
    assert!(
        h.update(&live, o.newest(), false, t0 + 2 * SEC)
            .is_settled()
    );
    assert!(!h.holds_for_predecessor(t0 + 2 * SEC) && !h.waits_on_dead(t0 + 2 * SEC));
}

/// Sessions listed by a predecessor that did not die change nothing, and a predecessor whose
/// sessions are unknown is waited out for the whole bound, whatever is reported.
#[test]
fn a_predecessors_sessions_count_only_when_it_died_and_they_are_known() {
    let t0 = Instant::now();
    let clean = Handover::new("d0", T, t0, false).predecessor_listed(Some(BTreeSet::new()));
    assert!(!clean.holds_for_predecessor(t0) && clean.awaited().count() == 0);
    let mut o = Observations::default();
    let mut h = Handover::new("d0", T, t0, true).predecessor_listed(None);
    o.observe(
        "d0",
        LeaseState {
            ended: ended("d0", &[7]),
            ..lease_of("d0", "t1", 1)
        },
        t0,
    );
    let (live, _) = h.judge(&mut o, SEC, t0 + SEC);
    assert!(!h.update(&live, o.newest(), false, t0 + SEC).is_settled());
    assert_eq!(h.awaited().count(), 0);
    assert!(h.holds_for_predecessor(t0 + T - SEC));
    o.observe("d0", lease_of("d0", "t2", 2), t0 + T);
    let (live, _) = h.judge(&mut o, SEC, t0 + T);
    assert!(h.update(&live, o.newest(), false, t0 + T).is_settled());
}

#[test]
fn a_fenced_dispatcher_serves_nothing_and_needs_fresh_releases_after() {
    let now = Instant::now();
    let r = ring(&["d0", "d1"]);
    let mut h = Handover::new("d0", T, now, false);
    h.update(&peers(&[("d0", None, 1), ("d1", None, 2)]), 2, false, now);
    let live = peers(&[("d0", None, 1), ("d1", Some(&r), 3)]);
    assert!(h.update(&live, 3, false, now).is_settled());
    let s = h.update(&live, 9, true, now);
    assert!(s.settled.is_none() && !s.serves_hash(1) && !s.serves_hash(2));
    // Renewing again: d1's release from before the cut does not count.
    assert!(h.update(&live, 9, false, now).settled.is_none());
    let live = peers(&[("d0", None, 1), ("d1", Some(&r), 10)]);
    assert!(h.update(&live, 10, false, now).is_settled());
}

#[test]
fn a_member_off_its_own_ring_serves_nothing() {
    let now = Instant::now();
    let mut h = Handover::new("d9", T, now, false);
    let s = h.update(&peers(&[("d0", None, 1)]), 1, false, now);
    assert!(s.settled.is_none());
    assert!(!s.owns_hash(7));
}

/// A slice hands out keys only while the Lease renewal behind it is current, whenever
/// the gate last looked: a process paused past its Lease resumes fenced.
#[test]
fn a_settled_slice_hands_out_nothing_once_its_lease_has_run_out() {
    let t0 = Instant::now();
    let h = &mut Handover::new("d0", T, t0, false);
    let s = h.update(&peers(&[("d0", None, 1)]), 1, false, t0);
    assert!(s.is_settled());
    assert!(!s.hands_out(t0), "no renewal accepted yet");
    assert_eq!(h.renewed(t0 + 10 * SEC), Some(t0), "never current before");
    assert!(s.hands_out(t0 + 9 * SEC));
    assert!(!s.hands_out(t0 + 10 * SEC), "the Lease ran out");
    // An older renewal's answer arriving late never moves the deadline back.
    assert_eq!(h.renewed(t0 + 5 * SEC), Some(t0 + 10 * SEC));
    assert!(s.hands_out(t0 + 9 * SEC));
    // A renewal answered after the Lease ran out says so: the deadline before it passed.
    let before = h.renewed(t0 + 20 * SEC).expect("a Lease");
    assert!(before <= t0 + 12 * SEC && s.hands_out(t0 + 12 * SEC));
    assert_eq!(LeaseDeadline::unlimited().extend_to(t0), None);
    assert!(
        !s.closed().hands_out(t0),
        "a closed slice hands out nothing"
    );
    assert!(Slice::fixed("d0", ring(&["d0"])).hands_out(t0 + T * 1000));
}

/// Judged on the Leases: a member whose Lease expired, or was deleted without the drained
/// mark even if written again since, died and is waited out; one that drained and deleted
/// its Lease released.
#[test]
fn judged_members_that_died_are_waited_out_and_drained_ones_are_not() {
    let t0 = Instant::now();
    let state = |holder: &str, renew: &str, rv: u128, drained: bool| LeaseState {
        holder: holder.into(),
        renew_time: renew.into(),
        duration: 10 * SEC,
        resource_version: rv,
        drained,
        ..LeaseState::default()
    };
    let mut o = Observations::default();
    for (name, rv) in [("d0", 1), ("d1", 2), ("d2", 3)] {
        o.observe(name, state(name, "t1", rv, false), t0);
    }
    let mut h = Handover::new("d0", T, t0, false);
    let (live, gone) = h.judge(&mut o, SEC, t0);
    h.update(&live, o.newest(), false, t0);
    assert_eq!(live.len(), 3);
    assert!(gone.is_empty() && !h.waits_on_dead(t0));
    // d1 drains and deletes its Lease: released.
    o.deleted("d1", Some(state("d1", "t1", 4, true)), t0 + SEC);
    let (live, gone) = h.judge(&mut o, SEC, t0 + SEC);
    h.update(&live, o.newest(), false, t0 + SEC);
    assert_eq!(gone, [("d1".to_owned(), false)]);
    assert!(!h.waits_on_dead(t0 + SEC));
    // d2 is killed, its Lease deleted, and a new process writes it again before the next
    // judgement: never seen gone, yet the old process's reconciles are waited out.
    o.deleted("d2", None, t0 + 2 * SEC);
    o.observe("d2", state("d2", "t2", 5, false), t0 + 2 * SEC);
    let (live, gone) = h.judge(&mut o, SEC, t0 + 2 * SEC);
    assert!(live.contains_key("d2") && gone.is_empty());
    assert!(h.waits_on_dead(t0 + 2 * SEC));
    assert!(!h.waits_on_dead(t0 + 2 * SEC + T));
    // d2 stops renewing: it dies once, when its Lease expires; the collector deleting the
    // expired Lease later is no second death.
    let expired = t0 + 2 * SEC + 12 * SEC;
    o.observe("d0", state("d0", "t3", 6, false), expired);
    let (live, gone) = h.judge(&mut o, SEC, expired);
    h.update(&live, o.newest(), false, expired);
    assert_eq!(gone, [("d2".to_owned(), true)]);
    o.deleted("d2", None, expired + T);
    o.observe("d0", state("d0", "t4", 7, false), expired + T);
    let (live, _) = h.judge(&mut o, SEC, expired + T);
    h.update(&live, o.newest(), false, expired + T);
    assert!(!h.waits_on_dead(expired + T));
}

/// A dispatcher warming up to join is no member for the others, so they keep serving what
/// would move to it; once its mark is gone it joins like any other. It counts itself.
#[test]
fn a_warming_dispatcher_joins_only_once_its_mark_is_gone() {
    let t0 = Instant::now();
    let state = |holder: &str, rv: u128, warming: bool| LeaseState {
        holder: holder.into(),
        renew_time: format!("t{rv}"),
        duration: 10 * SEC,
        resource_version: rv,
        warming,
        ..LeaseState::default()
    };
    let mut o = Observations::default();
    o.observe("d0", state("d0", 1, false), t0);
    o.observe("d1", state("d1", 2, true), t0);
    let mut d0 = Handover::new("d0", T, t0, false);
    let mut d1 = Handover::new("d1", T, t0, false);
    let (live, gone) = d0.judge(&mut o, SEC, t0);
    assert_eq!(live.keys().collect::<Vec<_>>(), ["d0"]);
    assert!(gone.is_empty());
    let slice = d0.update(&live, o.newest(), false, t0);
    assert_eq!(slice.ring.members(), ["d0"]);
    assert!(slice.settled.is_some(), "d0 keeps serving every key");
    let (live, _) = d1.judge(&mut o, SEC, t0);
    assert_eq!(live.keys().collect::<Vec<_>>(), ["d0", "d1"]);
    let slice = d1.update(&live, o.newest(), false, t0);
    assert!(slice.settled.is_none(), "the joiner serves nothing yet");
    // Warmed up: the mark goes, and d0 adopts the ring of two. Its keys that move are no
    // longer served (they go once the handover completes), and it is not a death.
    o.observe("d1", state("d1", 3, false), t0 + SEC);
    let (live, gone) = d0.judge(&mut o, SEC, t0 + SEC);
    assert_eq!(live.keys().collect::<Vec<_>>(), ["d0", "d1"]);
    assert!(gone.is_empty() && !d0.waits_on_dead(t0 + SEC));
    let slice = d0.update(&live, o.newest(), false, t0 + SEC);
    assert_eq!(slice.ring.members(), ["d0", "d1"]);
}

/// A Lease of `holder` renewed at `renew` (10 s), listing no session unless changed.
fn lease_of(holder: &str, renew: &str, rv: u128) -> LeaseState {
    LeaseState {
        holder: holder.into(),
        renew_time: renew.into(),
        duration: 10 * SEC,
        resource_version: rv,
        sessions: Some(BTreeSet::new()),
        ..LeaseState::default()
    }
}

/// The sessions of `member` a Lease reports ended.
fn ended(member: &str, tags: &[u64]) -> BTreeMap<String, BTreeSet<u64>> {
    BTreeMap::from([(member.to_owned(), tags.iter().copied().collect())])
}

/// A member that died whose Lease listed its sessions is waited out only until each is
/// reported ended, on any member's Lease.
#[test]
fn a_member_that_died_is_waited_out_until_its_listed_sessions_are_reported_ended() {
    let t0 = Instant::now();
    let mut o = Observations::default();
    o.observe("d0", lease_of("d0", "t1", 1), t0);
    o.observe(
        "d1",
        LeaseState {
            sessions: Some(BTreeSet::from([7, 8])),
            ..lease_of("d1", "t1", 2)
        },
        t0,
    );
    o.observe(
        "d2",
        LeaseState {
            sessions: None,
            ..lease_of("d2", "t1", 3)
        },
        t0,
    );
    let mut h = Handover::new("d0", T, t0, false);
    let (live, _) = h.judge(&mut o, SEC, t0);
    h.update(&live, o.newest(), false, t0);
    // d1 and d2 stop renewing.
    let expired = t0 + 12 * SEC;
    o.observe("d0", lease_of("d0", "t2", 4), expired);
    let (live, gone) = h.judge(&mut o, SEC, expired);
    h.update(&live, o.newest(), false, expired);
    assert_eq!(gone.len(), 2);
    assert!(h.waits_on_dead(expired));
    // One of d1's sessions reported ended on d0's Lease, and a session of d2 (unknown):
    // both still waited out.
    let now = expired + SEC;
    o.observe(
        "d0",
        LeaseState {
            ended: BTreeMap::from([
                ("d1".to_owned(), BTreeSet::from([7])),
                ("d2".to_owned(), BTreeSet::from([7, 8])),
            ]),
            ..lease_of("d0", "t3", 5)
        },
        now,
    );
    let (live, _) = h.judge(&mut o, SEC, now);
    h.update(&live, o.newest(), false, now);
    assert!(h.waits_on_dead(now));
    assert!(h.waiting_for(&live).unwrap().contains("d1 (died)"));
    // The other reported on a third member's Lease: d1 is waited out no more, d2 is, until
    // the bound.
    o.observe(
        "d3",
        LeaseState {
            ended: ended("d1", &[8]),
            ..lease_of("d3", "t1", 6)
        },
        now,
    );
    let (live, _) = h.judge(&mut o, SEC, now);
    h.update(&live, o.newest(), false, now);
    let waiting = h.waiting_for(&live).unwrap();
    assert!(
        !waiting.contains("d1 (died)") && waiting.contains("d2 (died)"),
        "{waiting}"
    );
    assert!(h.waits_on_dead(now));
    assert!(!h.waits_on_dead(expired + T));
}

/// A member whose Lease was deleted without the drained mark: its sessions are not known,
/// whatever is reported, so it is waited out for the bound.
#[test]
fn a_member_whose_lease_was_deleted_undrained_is_waited_out_for_the_bound() {
    let t0 = Instant::now();
    let mut o = Observations::default();
    o.observe("d0", lease_of("d0", "t1", 1), t0);
    o.observe(
        "d1",
        LeaseState {
            sessions: Some(BTreeSet::from([7])),
            ..lease_of("d1", "t1", 2)
        },
        t0,
    );
    let mut h = Handover::new("d0", T, t0, false);
    let (live, _) = h.judge(&mut o, SEC, t0);
    h.update(&live, o.newest(), false, t0);
    o.deleted("d1", None, t0 + SEC);
    o.observe(
        "d0",
        LeaseState {
            ended: ended("d1", &[7]),
            ..lease_of("d0", "t2", 3)
        },
        t0 + SEC,
    );
    let (live, gone) = h.judge(&mut o, SEC, t0 + SEC);
    h.update(&live, o.newest(), false, t0 + SEC);
    assert_eq!(gone, [("d1".to_owned(), true)]);
    assert!(h.waits_on_dead(t0 + SEC) && h.waits_on_dead(t0 + SEC + T - SEC));
}

/// A member that listed no session at all is waited out for nothing.
#[test]
fn a_member_that_died_listing_no_session_is_not_waited_out() {
    let t0 = Instant::now();
    let expired = t0 + 12 * SEC;
    let mut o = Observations::default();
    o.observe("d0", lease_of("d0", "t1", 1), t0);
    o.observe("d1", lease_of("d1", "t1", 2), t0);
    let mut h = Handover::new("d0", T, t0, false);
    let (live, _) = h.judge(&mut o, SEC, t0);
    h.update(&live, o.newest(), false, t0);
    o.observe("d0", lease_of("d0", "t2", 3), expired);
    let (live, gone) = h.judge(&mut o, SEC, expired);
    h.update(&live, o.newest(), false, expired);
    assert_eq!(gone, [("d1".to_owned(), true)]);
    assert!(!h.waits_on_dead(expired));
}

/// A member that dies again while its first death is waited out (its pod restarted and
/// killed again) is waited out for the sessions of both processes, and for the bound from
/// the later death when either's sessions are unknown.
#[test]
fn a_member_that_dies_twice_is_waited_out_for_both_deaths() {
    let t0 = Instant::now();
    let mut h = Handover::new("d0", T, t0, false);
    h.died_with("d1", t0, Some(BTreeSet::from([1, 2])));
    h.died_with("d1", t0 + SEC, Some(BTreeSet::from([3])));
    let awaited: Vec<(&str, &BTreeSet<u64>)> = h.awaited().collect();
    assert_eq!(awaited, [("d1", &BTreeSet::from([1, 2, 3]))]);
    assert!(
        h.waits_on_dead(t0 + T),
        "the bound counts from the later death"
    );
    h.died_with("d1", t0 + 2 * SEC, None);
    assert_eq!(
        h.awaited().count(),
        0,
        "unknown sessions: only the bound ends the wait"
    );
    h.died_with("d1", t0 + 3 * SEC, Some(BTreeSet::from([4])));
    assert_eq!(h.awaited().count(), 0, "still unknown");
    assert!(h.waits_on_dead(t0 + 3 * SEC + T - SEC));
}

/// A release counts only from a holder that had seen every Lease write this dispatcher had
/// seen when it adopted the ring: one whose watch lags may not know of a member that died.
#[test]
fn a_release_written_behind_this_dispatchers_view_does_not_count() {
    let now = Instant::now();
    let r = ring(&["d0", "d1"]);
    let mut h = Handover::new("d1", T, now, false);
    let behind = |rv, after| {
        let mut p = peers(&[("d0", Some(&r), rv), ("d1", None, 6)]);
        if let Some(d0) = p.get_mut("d0") {
            d0.released_after = after;
        }
        p
    };
    // Adopted at resourceVersion 6; d0 writes its release at 7, having seen only 5.
    assert!(!h.update(&behind(5, 5), 6, false, now).is_settled());
    assert!(!h.update(&behind(7, 5), 7, false, now).is_settled());
    assert!(
        h.waiting_for(&behind(7, 5))
            .is_some_and(|w| w.contains("d0 to release"))
    );
    assert!(h.update(&behind(8, 7), 8, false, now).is_settled());
}

/// A member that died is waited out for the bound from when it was noticed, and no
/// longer.
#[test]
fn a_member_that_died_is_waited_out_for_the_bound() {
    let t0 = Instant::now();
    let mut h = Handover::new("d0", T, t0, false);
    assert!(!h.waits_on_dead(t0));
    h.died("d1", t0 + SEC);
    assert!(h.waits_on_dead(t0 + SEC));
    assert!(h.waits_on_dead(t0 + SEC + T - SEC));
    assert!(!h.waits_on_dead(t0 + SEC + T));
}

#[test]
fn a_fixed_slice_serves_what_it_owns() {
    let s = Slice::fixed("d0", ring(&["d0", "d1"]));
    assert!(s.is_settled());
    let k = moved_key(&s.ring, &s.ring, "d0", "d0");
    assert!(s.serves_hash(k));
    assert!(!s.closed().serves_hash(k));
}

#[test]
fn a_ring_is_released_only_once_every_group_has_handed_over_and_every_group_is_asked() {
    let on = Slice::fixed("d0", ring(&["d0", "d1"]));
    let asked = std::cell::Cell::new(0);
    let groups = |moving: &'static [bool]| {
        moving.iter().map(|m| {
            asked.set(asked.get() + 1);
            *m
        })
    };
    assert_eq!(
        on.released(groups(&[false, false])),
        Some(ring_id(&on.ring))
    );
    // One group still delivering a key that moved away holds the release back, and the
    // groups after it are still asked (each answer trims its group).
    asked.set(0);
    assert_eq!(on.released(groups(&[true, false, false])), None);
    assert_eq!(asked.get(), 3);
    assert_eq!(on.released(groups(&[false, false, true])), None);
    // No groups: nothing moving.
    assert_eq!(on.released(groups(&[])), Some(ring_id(&on.ring)));
    // Off its own ring, it releases nothing, even with every group handed over; handing
    // out nothing does not hold the release back.
    let off = Slice::fixed("d2", ring(&["d0", "d1"]));
    assert_eq!(off.released(groups(&[false])), None);
    assert_eq!(
        on.closed().released(groups(&[false])),
        Some(ring_id(&on.ring))
    );
}
