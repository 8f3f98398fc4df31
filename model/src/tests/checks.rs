//! Bounded checks of the whole model: no overlap and every change settled, on the configurations
//! `make test` can afford, and the gaps the model finds where the contract says a window
//! remains.

use stateright::{Checker, Model};

use super::*;

/// Explores `config` depth first to `depth` steps for `states` states (revisits included);
/// panics with the path to any violation.
fn check_deep(config: Config, depth: usize, states: usize) -> impl Checker<Protocol> {
    let checker = Protocol::new(config)
        .checker()
        .target_max_depth(depth)
        .target_state_count(states)
        .spawn_dfs()
        .join();
    for property in ["exclusive", "settles"] {
        if let Some(path) = checker.discovery(property) {
            panic!(
                "{property} violated ({config}):\n{:#?}",
                path.into_actions()
            );
        }
    }
    checker
}

/// Explores `config` breadth first for `states` states (revisits included); panics with the
/// path to any violation; returns the unique states and the depth reached.
fn check_bounded(config: Config, states: usize) -> (usize, usize) {
    let checker = Protocol::new(config)
        .checker()
        .threads(2)
        .target_state_count(states)
        .spawn_bfs()
        .join();
    for property in ["exclusive", "settles"] {
        if let Some(path) = checker.discovery(property) {
            panic!(
                "{property} violated ({config}):\n{:#?}\nlast state: {:#?}",
                path.clone().into_actions(),
                path.last_state()
            );
        }
    }
    (checker.unique_state_count(), checker.max_depth())
}

/// The sessions, polls, acks and fencing of one dispatcher and two replicas, with a replica
/// crash, a dispatcher crash, a lost message and a change: bounded breadth-first.
#[test]
fn one_dispatcher_two_replicas_never_overlap_and_settle() {
    let budget = Budget {
        dispatcher_crashes: 1,
        replica_crashes: 1,
        lost_messages: 1,
        changes: 1,
        closes: 1,
        ..NO_FAULTS
    };
    let (states, depth) = check_bounded(config(1, Variant::SendTime, budget), 4_000_000);
    println!("one dispatcher: {states} unique states, depth {depth}");
    assert!(states >= 500_000, "only {states} states explored");
}

/// Two dispatchers, every fault once, explored depth first to 80 steps: deep enough for a
/// crashed dispatcher's keys to be handed over and back, which breadth first does not reach
/// within the budget.
#[test]
fn two_dispatchers_on_deep_paths_never_overlap_and_settle() {
    let budget = Budget {
        dispatcher_crashes: 1,
        graceful_stops: 1,
        replica_crashes: 1,
        api_cuts: 1,
        lost_renewal_answers: 1,
        lost_messages: 1,
        changes: 2,
        drift: 0,
        lease_deletions: 1,
        closes: 1,
        deletions: 1,
        owned_changes: 1,
        reports: 0,
    };
    let checker = check_deep(config(2, Variant::SendTime, budget), 80, 3_000_000);
    assert!(
        checker
            .discovery("a handover completes after a crash")
            .is_some(),
        "no handover after a crash was reached"
    );
    println!(
        "two dispatchers, depth first: {} unique states, depth {}",
        checker.unique_state_count(),
        checker.max_depth()
    );
}

/// A group that lists the owners itself (`owners_listed`): a change of an owned object queues
/// a served key only once the dispatcher knows the key's object, and leaves an unknown one to
/// the list that shows it. Nothing overlaps, and every change of an owned object whose owner
/// exists comes to a reconcile of the owner: with a dispatcher crash around a deletion, and
/// with a cut from the API server and a graceful stop (without a deletion: a deletion made
/// while no watch runs is a gap of its own, `dispatcher/HANDOVER.md`); breadth first, then
/// depth first to 80 steps.
#[test]
fn owners_listed_by_their_group_never_overlap_and_settle() {
    let owners_listed = |budget| Config {
        owners_listed: true,
        ..config(2, Variant::SendTime, budget)
    };
    let crash = Budget {
        dispatcher_crashes: 1,
        changes: 1,
        deletions: 1,
        owned_changes: 2,
        ..NO_FAULTS
    };
    let (states, depth) = check_bounded(owners_listed(crash), 1_500_000);
    println!("owners listed, a crash and a deletion: {states} unique states, depth {depth}");
    let cut = Budget {
        graceful_stops: 1,
        api_cuts: 1,
        changes: 1,
        owned_changes: 2,
        ..NO_FAULTS
    };
    let (states, depth) = check_bounded(owners_listed(cut), 1_500_000);
    println!("owners listed, a cut and a stop: {states} unique states, depth {depth}");
    for budget in [crash, cut] {
        let checker = check_deep(owners_listed(budget), 80, 1_500_000);
        println!(
            "owners listed, depth first: {} unique states, depth {}",
            checker.unique_state_count(),
            checker.max_depth()
        );
    }
}

/// A known gap, found by the checker once groups are made as the dispatcher makes them
/// (`--lazy-groups`, breadth first, 7.7 million states): dispatcher 0 restarts, and before
/// any replica opens a session there (so it has no group, and no watch, for the key), the
/// key's object changes and is deleted. Only dispatcher 1 remembers the deletion, and its
/// Lease is deleted and it restarts before dispatcher 0's group is made and asks: the memory
/// goes with it, and the deletion is never delivered. With every group made at start, the
/// restarted dispatcher's own watch holds the deletion and delivers it.
#[test]
fn a_deletion_before_a_restarted_dispatchers_group_is_made_is_lost_if_its_peer_restarts_too() {
    use Action::*;
    let budget = Budget {
        dispatcher_crashes: 1,
        graceful_stops: 1,
        lease_deletions: 1,
        changes: 1,
        deletions: 1,
        ..NO_FAULTS
    };
    let eager = config(2, Variant::SendTime, budget);
    let lazy = Config {
        lazy_groups: true,
        ..eager
    };
    // Key 0 is reconciled first, so the deletion is of an object the controllers saw.
    let path = [
        reconciled().as_slice(),
        &[Crash(0), Restart(0), Change(0), Delete(0)],
        &[DeleteLease(1), Stop(1), Restart(1), Open(1, 1), Poll(1, 1)],
    ]
    .concat();
    let model = Protocol::new(lazy);
    let s = replay(&model, &path);
    assert!(!model.settles(&s), "the deletion is delivered after all");
    let model = Protocol::new(eager);
    let s = replay(&model, &path);
    assert!(model.settles(&s));
}

/// Every dispatcher's watch is broken when key 0's object is deleted (an API-server restart
/// expires them all at once): no watch sees the deletion, so no peer remembers it, and only
/// the owner's re-list finds it, by its sweep. If the owner dies before delivering it, the
/// deletion is lost (`dispatcher/HANDOVER.md`, "Known gaps"; the dispatcher narrows the
/// window by retrying its watch within 2 s and listing at once on 410 Gone). With the peer's
/// watch running, the peer remembers the deletion and the restarted owner delivers it.
#[test]
fn a_deletion_while_every_watch_is_broken_is_lost_if_its_owner_dies_before_delivering_it() {
    use Action::*;
    let budget = Budget {
        dispatcher_crashes: 1,
        api_cuts: 2,
        changes: 1,
        deletions: 1,
        ..NO_FAULTS
    };
    let model = Protocol::new(config(2, Variant::SendTime, budget));
    assert_eq!(model.owner(model.all(), 0), Some(0));
    let done = reconciled();
    let every_watch_broken = [
        done.as_slice(),
        &[CutApi(0), CutApi(1), Delete(0), HealApi(0), HealApi(1)],
        &[Crash(0), Restart(0)],
    ]
    .concat();
    let s = replay(&model, &every_watch_broken);
    assert!(
        !model.settles(&s),
        "the deletion is delivered after all: the model no longer shows the gap"
    );
    let owner_broken = [
        done.as_slice(),
        &[CutApi(0), Delete(0), HealApi(0)],
        &[Crash(0), Restart(0)],
    ]
    .concat();
    let s = replay(&model, &owner_broken);
    assert!(model.settles(&s));
}

/// A key held by a handover (dispatcher 1 owns key 0 once dispatcher 0 died, and holds it
/// until its handover completes) is in no queue there, but in its index of held keys once the
/// list the handover's start asks for has shown it: if its object is deleted while dispatcher
/// 1's watch is broken, the re-list when the watch is back does not show it, and the sweep
/// holds its deletion, delivered once the handover completes. Cut off before that list, the
/// index does not know the key, the old owner, dead, remembers nothing, and the deletion is
/// never delivered: the window that remains (`dispatcher/HANDOVER.md`, "Deletions in a gap of
/// the watch"). The same deletion while the watch runs is held and delivered.
#[test]
fn a_deletion_of_a_key_held_by_a_handover_in_a_gap_of_its_watch_is_found_once_it_is_indexed() {
    use Action::*;
    let budget = Budget {
        dispatcher_crashes: 1,
        api_cuts: 1,
        changes: 1,
        deletions: 1,
        ..NO_FAULTS
    };
    let model = Protocol::new(config(2, Variant::SendTime, budget));
    assert_eq!(model.owner(model.all(), 0), Some(0));
    let mut s = replay(&model, &[reconciled().as_slice(), &[Crash(0)]].concat());
    // Time passes until dispatcher 1 counts dispatcher 0 gone and owns key 0, which it holds
    // until its handover completes (the dead owner's bound). Replica 0 fences its session on
    // the dead dispatcher when its clock says so, before time passes further.
    let mut steps = 0;
    while s.dispatchers[1].ring != bit(1u8) {
        let mut enabled = Vec::new();
        model.actions(&s, &mut enabled);
        let step = if enabled.contains(&Tick) {
            Tick
        } else {
            *enabled
                .iter()
                .find(|a| matches!(a, Fence(..)))
                .expect("time passes, or a replica fences")
        };
        s = model.next_state(&s, step).expect("a step");
        steps += 1;
        assert!(steps < 32, "dispatcher 1 never took dispatcher 0's keys");
    }
    assert_eq!(model.owner(s.dispatchers[1].ring, 0), Some(1));
    assert_ne!(s.dispatchers[1].settled, Some(bit(1u8)), "key 0 is held");
    assert_eq!(
        s.dispatchers[1].held_index, 0,
        "the list has not shown it yet"
    );
    let held = s.clone();
    let indexed = replay_from(&model, s.clone(), &[IndexHeld(1)]);
    assert_eq!(indexed.dispatchers[1].held_index, bit(0u8));
    let found = replay_from(&model, indexed, &[CutApi(1), Delete(0), HealApi(1)]);
    assert_eq!(
        found.dispatchers[1].held_deletions,
        bit(0u8),
        "the re-list's sweep holds the deletion"
    );
    assert!(model.settles(&found));
    let in_a_gap = replay_from(&model, s, &[CutApi(1), Delete(0), HealApi(1)]);
    assert!(
        !model.settles(&in_a_gap),
        "the deletion is delivered after all: the model no longer shows the window before the list"
    );
    let watched = replay_from(&model, held, &[Delete(0)]);
    assert!(model.settles(&watched));
}

/// A lone dispatcher killed while a reconcile it handed out runs, its Lease deleted by hand,
/// and restarted finds no Lease: no member saw the deletion, so nothing makes it wait, and it
/// hands the key to another replica while the first still runs it (`dispatcher/HANDOVER.md`,
/// "A Lease deleted without the mark"). Beside a second dispatcher, which saw the deletion,
/// the same steps keep the key to one replica.
#[test]
fn a_lone_dispatcher_whose_lease_is_deleted_by_hand_while_dead_serves_at_once() {
    use Action::*;
    let budget = Budget {
        dispatcher_crashes: 1,
        lease_deletions: 1,
        ..NO_FAULTS
    };
    let path = [
        takes(0, 0).as_slice(),
        &[Crash(0), DeleteLease(0), Restart(0), Warm(0), Tick],
        &[Open(1, 0), Poll(1, 0), Arrive(1, 0)],
    ]
    .concat();
    let alone = Protocol::new(config(1, Variant::SendTime, budget));
    let s = replay(&alone, &path);
    assert_eq!(running(&s), 1, "replica 0 still reconciles key 0");
    let handed = replay_from(&alone, s, &[Answer(1, 0, 1), Receive(1, 0)]);
    assert!(
        !alone.exclusive(&handed),
        "the key is kept to one replica after all: the model no longer shows the gap"
    );
    let beside = Protocol::new(config(2, Variant::SendTime, budget));
    assert_eq!(beside.owner(beside.all(), 0), Some(0));
    let s = replay(&beside, &path);
    let mut enabled = Vec::new();
    beside.actions(&s, &mut enabled);
    assert_eq!(
        s.dispatchers[0].settled, None,
        "the restarted dispatcher hands out nothing"
    );
    assert!(
        s.dispatchers[1].died[0] > 0,
        "the other waits out the one that died"
    );
    assert!(
        !enabled.contains(&Answer(1, 0, 1)),
        "with a member that saw the deletion, the restarted dispatcher waits: {enabled:?}"
    );
}

/// Two controller groups: dispatcher 1 stops, dispatcher 0 takes key 1 and hands it to a
/// replica of each group; group 0's reconcile ends, group 1's still runs when dispatcher 1
/// comes back. Dispatcher 0 releases the ring of two only once group 1's delivery is
/// acknowledged too (a release that asked the first group alone would not wait), and
/// dispatcher 1 serves key 1 only after that release.
#[test]
fn a_ring_is_released_only_once_every_group_has_handed_over() {
    use Action::*;
    let budget = Budget {
        graceful_stops: 1,
        ..NO_FAULTS
    };
    let model = Protocol::new(Config {
        groups: 2,
        replicas: 2,
        keys: 2,
        ..config(2, Variant::SendTime, budget)
    });
    // Entries: group 0's keys 0 and 1, then group 1's; replica r is in group r.
    let (g0_k1, g1_k1) = (1u8, 3u8);
    assert_eq!(model.owner(model.all(), 1), Some(1));
    let take = |r: u8, e: u8| [Open(r, 0), Poll(r, 0), Arrive(r, 0), Answer(r, 0, bit(e))];
    let path = [
        &[Stop(1), Tick][..],
        &take(1, g1_k1),
        &[Receive(1, 0)],
        &take(0, g0_k1),
        &[Receive(0, 0), Finish(0, g0_k1), AckArrives(0, 0, g0_k1)],
        &[Restart(1), Warm(1), Tick],
    ]
    .concat();
    let s = replay(&model, &path);
    assert_eq!(s.dispatchers[0].ring, 0b11);
    assert_eq!(
        model.moving(&s.dispatchers[0], 0),
        0b10,
        "group 1 still delivers key 1"
    );
    assert_eq!(s.leases[0].released, None);
    assert!(s.seen & Seen::ReleaseWaitsForAnotherGroup as u8 != 0);
    assert_eq!(s.dispatchers[1].settled, None);
    let done = [Finish(1, g1_k1), AckArrives(1, 0, g1_k1), Tick, Tick];
    let s = replay(&model, &[path.as_slice(), &done].concat());
    assert_eq!(s.leases[0].released, Some(0b11));
    assert_eq!(s.dispatchers[1].settled, Some(0b11));
}

/// Two controller groups on two dispatchers (replicas 0 and 2 in one group, replica 1 in
/// the other), with a dispatcher crash, a graceful stop, a Lease deletion, a change and a
/// deletion, explored depth first: no group's replicas overlap, and every change settles.
#[test]
fn two_groups_never_overlap_and_settle() {
    let budget = Budget {
        dispatcher_crashes: 1,
        graceful_stops: 1,
        lease_deletions: 1,
        changes: 1,
        deletions: 1,
        ..NO_FAULTS
    };
    let config = Config {
        groups: 2,
        replicas: 3,
        keys: 2,
        ..config(2, Variant::SendTime, budget)
    };
    let checker = check_deep(config, 60, 3_000_000);
    assert!(checker.unique_state_count() >= 1_000_000);
    println!(
        "two groups, depth first: {} unique states, depth {}",
        checker.unique_state_count(),
        checker.max_depth()
    );
}

/// Two dispatchers with their Leases and the handover gate, a dispatcher crash, a cut from
/// the API server and a lost renewal answer: bounded breadth-first.
#[test]
fn two_dispatchers_never_overlap_and_settle() {
    let budget = Budget {
        dispatcher_crashes: 1,
        api_cuts: 1,
        lost_renewal_answers: 1,
        lease_deletions: 1,
        ..NO_FAULTS
    };
    let (states, depth) = check_bounded(config(2, Variant::SendTime, budget), 3_000_000);
    println!("two dispatchers: {states} unique states, depth {depth}");
    assert!(states >= 500_000, "only {states} states explored");
}

/// Dispatcher 0 crashes while replica 0 reconciles its key; its Lease is deleted by hand, and
/// a new process of it starts and stops cleanly (its Lease drained and deleted) before
/// dispatcher 1 judges: the deletion dispatcher 1 saw still counts (`Handover::judge`), so it
/// waits out the crashed process's reconcile rather than hand the key to another replica.
#[test]
fn a_death_seen_before_a_later_process_drained_is_still_waited_out() {
    use Action::*;
    let budget = Budget {
        dispatcher_crashes: 1,
        graceful_stops: 1,
        lease_deletions: 1,
        ..NO_FAULTS
    };
    let model = Protocol::new(config(2, Variant::SendTime, budget));
    assert_eq!(model.owner(model.all(), 0), Some(0));
    let path = [
        takes(0, 0).as_slice(),
        &[Crash(0), DeleteLease(0), Restart(0), Stop(0), Tick],
    ]
    .concat();
    let s = replay(&model, &path);
    assert_eq!(running(&s), 1, "replica 0 still reconciles key 0");
    assert!(
        s.dispatchers[1].died[0] > 0,
        "dispatcher 1 waits out dispatcher 0"
    );
    let s = replay_from(&model, s, &[Open(1, 1), Poll(1, 1), Arrive(1, 1)]);
    let mut enabled = Vec::new();
    model.actions(&s, &mut enabled);
    assert!(
        !enabled.contains(&Answer(1, 1, 1)),
        "dispatcher 1 hands key 0 to replica 1 while replica 0 reconciles it: {enabled:?}"
    );
}

/// Dispatcher 1 stops cleanly (its Lease drained and deleted) and a new process of it starts
/// warming up, writing its Lease again marked warming, before dispatcher 0 judges: dispatcher 0
/// judges it released, not dead (`Observations::take_releases`), and serves its keys at once
/// rather than after the bound. Once the new process has warmed up, the two share the ring
/// again.
#[test]
fn a_drained_member_restarted_warming_up_before_a_judgement_is_released() {
    use Action::*;
    let budget = Budget {
        graceful_stops: 1,
        ..NO_FAULTS
    };
    let model = Protocol::new(config(2, Variant::SendTime, budget));
    let s = replay(&model, &[Stop(1), Restart(1), Tick]);
    assert!(s.leases[1].exists && s.leases[1].warming);
    let d0 = &s.dispatchers[0];
    assert_eq!(d0.ring, 0b01, "a dispatcher warming up is no member");
    assert_eq!(
        d0.died[1], 0,
        "dispatcher 0 does not wait out dispatcher 1: {d0:#?}"
    );
    assert_eq!(d0.settled, Some(0b01), "dispatcher 0 serves every key");
    assert_eq!(
        s.dispatchers[1].settled, None,
        "warming up, it hands out nothing"
    );
    let s = replay_from(&model, s, &[Warm(1), Tick, Tick, Tick]);
    for (d, disp) in s.dispatchers.iter().enumerate() {
        assert_eq!(disp.settled, Some(0b11), "dispatcher {d}: {disp:#?}");
    }
}
