//! Judging members on the Leases when a release and something else happened between two
//! judgements: a quick restart warming up, a death, a re-list.

use super::*;

/// Lease of `holder` at resourceVersion `rv` (also its renew time), listing session 9.
fn state(holder: &str, rv: u128, drained: bool, warming: bool) -> LeaseState {
    LeaseState {
        holder: holder.into(),
        renew_time: format!("t{rv}"),
        duration: 10 * SEC,
        resource_version: rv,
        drained,
        warming,
        sessions: Some(BTreeSet::from([9])),
        ..LeaseState::default()
    }
}

/// d2's view at `t0` of a ring of d0, d1 and d2, all live, judged and served.
fn three_members(t0: Instant) -> (Observations, Handover) {
    let mut o = Observations::default();
    for (name, rv) in [("d0", 1), ("d1", 2), ("d2", 3)] {
        o.observe(name, state(name, rv, false, false), t0);
    }
    let mut h = Handover::new("d2", T, t0, false);
    let (live, _) = h.judge(&mut o, SEC, t0);
    h.update(&live, o.newest(), false, t0);
    (o, h)
}

/// A member that drains and deletes its Lease, then restarts and writes it again warming up
/// to join, all before the next judgement (a quick restart, or a view that lagged over both):
/// a release, not a death, so nothing waits for the bound. Once a new process of it has joined,
/// a later absence is judged on its own Lease again.
#[test]
fn a_member_that_drained_and_restarted_warming_before_a_judgement_released() {
    let t0 = Instant::now();
    let (mut o, mut h) = three_members(t0);
    o.observe("d1", state("d1", 4, true, false), t0 + SEC);
    o.deleted("d1", Some(state("d1", 5, true, false)), t0 + SEC);
    o.observe("d1", state("d1", 6, false, true), t0 + SEC);
    let (live, gone) = h.judge(&mut o, SEC, t0 + SEC);
    h.update(&live, o.newest(), false, t0 + SEC);
    assert_eq!(gone, [("d1".to_owned(), false)], "released, not died");
    assert!(!h.waits_on_dead(t0 + SEC));
    // The new process joins, then is killed: its Lease expires, and it died.
    o.observe("d1", state("d1", 7, false, false), t0 + 2 * SEC);
    let (live, gone) = h.judge(&mut o, SEC, t0 + 2 * SEC);
    h.update(&live, o.newest(), false, t0 + 2 * SEC);
    assert!(live.contains_key("d1") && gone.is_empty());
    let expired = t0 + 2 * SEC + 12 * SEC;
    for (name, rv) in [("d0", 8), ("d2", 9)] {
        o.observe(name, state(name, rv, false, false), expired);
    }
    let (_, gone) = h.judge(&mut o, SEC, expired);
    assert_eq!(gone, [("d1".to_owned(), true)]);
    assert!(h.waits_on_dead(expired));
}

/// What a judgement cannot vouch for outweighs a release seen since the last one: a deletion
/// without the drained mark (a process killed, its Lease deleted; a new one warming up, stopped
/// cleanly, and a third warming up), whose sessions are then unknown whatever the Lease lists
/// now; and a re-list that shows a released Lease again (it may hide a process that joined
/// and died, whose sessions its Lease no longer lists).
#[test]
fn a_death_or_a_relist_since_the_last_judgement_outweighs_a_release() {
    let t0 = Instant::now();
    let (mut o, mut h) = three_members(t0);
    let t1 = t0 + SEC;
    o.deleted("d1", None, t1);
    o.observe("d1", state("d1", 4, false, true), t1);
    o.deleted("d1", Some(state("d1", 5, true, true)), t1);
    o.observe("d1", state("d1", 6, false, true), t1);
    o.deleted("d0", Some(state("d0", 7, true, false)), t1);
    o.observe("d0", state("d0", 8, false, true), t1);
    o.relisted(|name| ["d0", "d1", "d2"].contains(&name), t1);
    let (live, gone) = h.judge(&mut o, SEC, t1);
    h.update(&live, o.newest(), false, t1);
    assert_eq!(gone, [("d0".to_owned(), true), ("d1".to_owned(), true)]);
    assert!(h.waits_on_dead(t1 + T - SEC));
    assert_eq!(h.awaited().count(), 0, "their sessions are unknown");
}

/// A member waited out once (its Lease deleted without the drained mark and written again)
/// that dies again after that wait ran out is waited out for the later death alone: by the
/// sessions its Lease lists, not as unknown ones carried over from the wait that ended.
#[test]
fn a_second_death_after_the_first_wait_ran_out_is_judged_on_its_own() {
    let t0 = Instant::now();
    let (mut o, mut h) = three_members(t0);
    let t1 = t0 + SEC;
    o.deleted("d1", None, t1);
    o.observe("d1", state("d1", 4, false, false), t1);
    let (live, _) = h.judge(&mut o, SEC, t1);
    h.update(&live, o.newest(), false, t1);
    assert!(
        h.waits_on_dead(t1) && h.awaited().count() == 0,
        "unknown sessions"
    );
    // The wait runs out; d1's Lease, last written at t1, expires later still.
    let t2 = t1 + T + 12 * SEC;
    for (name, rv) in [("d0", 5), ("d2", 6)] {
        o.observe(name, state(name, rv, false, false), t2);
    }
    let (_, gone) = h.judge(&mut o, SEC, t2);
    assert_eq!(gone, [("d1".to_owned(), true)]);
    assert!(h.waits_on_dead(t2));
    let awaited: Vec<_> = h.awaited().collect();
    assert_eq!(awaited, [("d1", &BTreeSet::from([9]))]);
}
