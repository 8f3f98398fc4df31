//! Paths the model must find or rule out, each replayed step by step: old rules that overlap,
//! the current ones that do not, and the real code stepped in lock-step with the model.

use stateright::{Checker, HasDiscoveries, Model};

use super::*;

/// Replica 0's answer takes two ticks to arrive; its next poll never does. Counting its
/// fence from the answer's arrival, replica 0 still runs when the dispatcher, a ttl after
/// answering, expires its session and hands the key to replica 1. Counting from the send,
/// replica 0 must cancel first: the same steps are not possible.
#[test]
fn a_fence_counted_from_the_answers_arrival_overlaps_one_counted_from_the_send_does_not() {
    use Action::*;
    let path = [
        Open(0, 0),
        Open(1, 0),
        Poll(0, 0),
        Arrive(0, 0),
        Answer(0, 0, 1),
        Tick,
        Tick,
        Receive(0, 0),
        Poll(0, 0),
        Poll(1, 0),
        Tick,
        Arrive(1, 0),
        Answer(1, 0, 0),
        Receive(1, 0),
        Poll(1, 0),
        Arrive(1, 0),
        Tick,
        Expire(0, 0),
        Answer(1, 0, 1),
        Receive(1, 0),
    ];
    let old = Protocol::new(config(1, Variant::ArrivalTime, NO_FAULTS));
    assert_eq!(
        running(&replay(&old, &path)),
        2,
        "both replicas run the key"
    );
    let new = Protocol::new(config(1, Variant::SendTime, NO_FAULTS));
    let mut s = new.init_states().remove(0);
    for a in path {
        let mut enabled = Vec::new();
        new.actions(&s, &mut enabled);
        if !enabled.contains(&a) {
            // Replica 0's fence ran out first: it must cancel before time passes.
            assert_eq!(a, Tick);
            assert!(enabled.contains(&Fence(0, 0)));
            return;
        }
        s = new.next_state(&s, a).unwrap_or_else(|| panic!("{a:?}"));
        assert!(running(&s) <= 1);
    }
    panic!("the fence counted from the send never ran out first");
}

/// The checker finds that overlap by itself in the old variant.
#[test]
fn the_checker_finds_the_overlap_of_the_old_fencing() {
    let checker = Protocol::new(config(1, Variant::ArrivalTime, NO_FAULTS))
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let path = checker.discovery("exclusive").expect("an overlap is found");
    assert!(running(path.last_state()) == 2);
}

/// Dispatcher 0 stops gracefully and dispatcher 1 takes its key over; dispatcher 0 starts
/// again, renews, and its Lease watch lists. Judging membership on every Lease event (the
/// code before `k8s/membership.rs` waited for a whole view), it finds itself alone after its
/// own Lease, serves the key at once, and a replica takes it from each dispatcher. Judging
/// on whole views only, the same steps are not possible.
#[test]
fn membership_judged_on_a_partial_view_of_the_leases_overlaps_and_on_a_whole_view_does_not() {
    use Action::*;
    let budget = Budget {
        graceful_stops: 1,
        ..NO_FAULTS
    };
    let path = [
        Stop(0),
        Tick,
        Open(0, 1),
        Poll(0, 1),
        Arrive(0, 1),
        Answer(0, 1, 1),
        Receive(0, 1),
        Restart(0),
        Warm(0),
        Glimpse(0, 0b01),
        Open(1, 0),
        Poll(1, 0),
        Arrive(1, 0),
        Answer(1, 0, 1),
        Receive(1, 0),
    ];
    let partial = Protocol::new(Config {
        views: Views::Partial,
        ..config(2, Variant::SendTime, budget)
    });
    assert_eq!(
        running(&replay(&partial, &path)),
        2,
        "both replicas run the key"
    );
    let whole = Protocol::new(config(2, Variant::SendTime, budget));
    let glimpse = path.iter().position(|a| matches!(a, Glimpse(..))).unwrap();
    let s = replay(&whole, &path[..glimpse]);
    let mut enabled = Vec::new();
    whole.actions(&s, &mut enabled);
    assert!(!enabled.contains(&path[glimpse]));
    // Without the partial view, dispatcher 0 cannot serve the key to replica 1.
    assert!(
        whole
            .next_state(&s, Open(1, 0))
            .and_then(|s| whole.next_state(&s, Poll(1, 0)))
            .and_then(|s| whole.next_state(&s, Arrive(1, 0)))
            .and_then(|s| whole.next_state(&s, Answer(1, 0, 1)))
            .is_none(),
        "dispatcher 0 serves the key before a whole view"
    );
}

/// The checker finds that overlap by itself: with a graceful stop and no other fault, every
/// path of up to 16 steps, depth first. Judging on whole views, none of those paths
/// overlaps.
#[test]
fn the_checker_finds_the_overlap_of_partial_lease_views_and_none_with_whole_views() {
    let explore = |views| {
        let config = Config {
            views,
            liveness: false,
            ..config(
                2,
                Variant::SendTime,
                Budget {
                    graceful_stops: 1,
                    ..NO_FAULTS
                },
            )
        };
        Protocol::new(config)
            .checker()
            .target_max_depth(16)
            .spawn_dfs()
            .join()
    };
    let partial = explore(Views::Partial);
    let path = partial.discovery("exclusive").expect("an overlap is found");
    assert!(running(path.last_state()) == 2);
    let actions = path.into_actions();
    assert!(
        actions.iter().any(|a| matches!(a, Action::Glimpse(..)))
            && actions.iter().any(|a| matches!(a, Action::Stop(..))),
        "the overlap follows a graceful stop and a partial view: {actions:#?}"
    );
    let whole = explore(Views::Whole);
    assert!(whole.is_done());
    if let Some(path) = whole.discovery("exclusive") {
        panic!("whole views overlap: {:#?}", path.into_actions());
    }
    println!(
        "a graceful stop, whole views: {} unique states within 16 steps",
        whole.unique_state_count()
    );
}

/// `path` ends with two replicas running one key in `bad`; in `good`, the same steps are
/// not possible, and none of those that are overlaps.
fn overlaps_only_in(bad: Config, good: Config, path: &[Action]) {
    assert_eq!(
        running(&replay(&Protocol::new(bad), path)),
        2,
        "both replicas run the key ({bad})"
    );
    let model = Protocol::new(good);
    let mut s = model.init_states().remove(0);
    for a in path {
        let mut enabled = Vec::new();
        model.actions(&s, &mut enabled);
        let Some(next) = enabled
            .contains(a)
            .then(|| model.next_state(&s, *a))
            .flatten()
        else {
            return;
        };
        s = next;
        assert!(running(&s) <= 1, "{a:?} overlaps ({good})");
    }
    panic!("the steps that overlap in {bad} are all possible in {good}");
}

/// A dispatcher cut off from the API server (a partitioned node) has its Lease deleted by
/// hand while its replica reconciles: taken for a release (the code before the drained
/// mark), the other dispatcher hands the key out at the next tick; taken for a death, it
/// waits the reconcile out.
#[test]
fn a_deleted_lease_taken_for_a_release_overlaps_and_taken_for_a_death_does_not() {
    use Action::*;
    let budget = Budget {
        api_cuts: 1,
        lease_deletions: 1,
        ..NO_FAULTS
    };
    let good = config(2, Variant::SendTime, budget);
    let bad = Config {
        deletions: Deletions::Released,
        ..good
    };
    let path = [
        takes(0, 0).as_slice(),
        &[CutApi(0), DeleteLease(0), Tick],
        &takes(1, 1),
    ]
    .concat();
    overlaps_only_in(bad, good, &path);
}

/// A dispatcher is killed while its replica reconciles and its Lease is deleted by hand;
/// it restarts at once, finds no Lease, so no wait of its own. Only the other dispatcher,
/// which saw the deletion and releases no ring while it waits, keeps it from serving the
/// key again before the killed process's reconcile is over.
#[test]
fn a_dispatcher_restarted_after_its_lease_was_deleted_waits_for_the_others_withheld_release() {
    use Action::*;
    let budget = Budget {
        dispatcher_crashes: 1,
        lease_deletions: 1,
        ..NO_FAULTS
    };
    let good = config(2, Variant::SendTime, budget);
    let bad = Config {
        withhold: false,
        ..good
    };
    let path = [
        takes(0, 0).as_slice(),
        &[Crash(0), DeleteLease(0), Restart(0), Warm(0), Tick, Tick],
        &takes(1, 0),
    ]
    .concat();
    overlaps_only_in(bad, good, &path);
}

/// A client closes its session while it still reconciles (the SDK never does): released
/// at once, the key goes to the other replica; held until the session would have expired,
/// it does not.
#[test]
fn an_early_close_session_released_at_once_overlaps_and_held_does_not() {
    use Action::*;
    let budget = Budget {
        closes: 1,
        ..NO_FAULTS
    };
    let good = config(1, Variant::SendTime, budget);
    let bad = Config {
        closes: Closes::Release,
        ..good
    };
    let path = [
        takes(0, 0).as_slice(),
        &[Close(0, 0), CloseArrives(0, 0)],
        &takes(1, 0),
    ]
    .concat();
    overlaps_only_in(bad, good, &path);
}

/// Dispatcher `j` is scaled down and up again, and down once more before a handover to the
/// ring of two completes; meanwhile a key `j` would own changes. The other dispatcher, still
/// settled on the ring of one, serves the key again without a handover: unless it lists it,
/// the change is never delivered (the scaled-down dispatcher does not come back).
#[test]
fn a_change_while_a_joining_dispatcher_comes_and_goes_is_delivered_only_if_listed() {
    use Action::*;
    let budget = Budget {
        graceful_stops: 2,
        changes: 1,
        ..NO_FAULTS
    };
    let good = Config {
        keys: 2,
        ..config(2, Variant::SendTime, budget)
    };
    let bad = Config {
        relist_returning: false,
        ..good
    };
    let model = Protocol::new(good);
    // The joiner must judge first in a tick (dispatcher 0), so that the other adopts the
    // ring of two after the joiner's release and completes no handover to it.
    let k = (0..2u8)
        .find(|k| model.owner(model.all(), usize::from(*k)) == Some(0))
        .expect("a key dispatcher-0 owns on the ring of two");
    let path = [
        // Dispatcher 0 goes; dispatcher 1 takes over every key and reconciles k.
        &[Stop(0), Tick][..],
        &[Open(0, 1), Poll(0, 1), Arrive(0, 1), Answer(0, 1, bit(k))],
        &[Receive(0, 1), Finish(0, k), AckArrives(0, 1, k)],
        // Dispatcher 0 comes back; dispatcher 1 sees it and lets k go; k changes; 0 goes.
        &[Restart(0), Warm(0), Tick, Change(k), Stop(0), Tick],
    ]
    .concat();
    let s = replay(&model, &path);
    assert_eq!(
        s.dispatchers[1].settled,
        Some(bit(1usize)),
        "no handover between"
    );
    assert!(model.settles(&s), "listed, the change is delivered");
    let bad_model = Protocol::new(bad);
    let s = replay(&bad_model, &path);
    assert!(
        !bad_model.settles(&s),
        "unlisted, the change is never delivered"
    );
}

/// The real code (`core::leases`, `core::handover`, `core::queue`, `core::transit`)
/// steps in lock-step with the model on random walks of two keys and two replicas with
/// Lease deletions of live and dead dispatchers, crashes, graceful stops, lost renewal
/// answers, changes, replica crashes and early CloseSessions (not API cuts: see `real`).
/// A mutated copy of the code (held keys released at once, a change in flight forgotten at
/// the ack, a moved key's drain skipped, keys on their way out not recognised) parts from
/// the model within a few walks.
#[test]
fn the_real_code_steps_in_lock_step_with_the_model() {
    // Replica r belongs to group r % groups: with two groups, replicas 0 and 2 share one.
    for (dispatchers, groups, replicas) in [(2, 1, 2), (3, 1, 2), (3, 2, 3)] {
        let budget = Budget {
            dispatcher_crashes: 2,
            graceful_stops: 1,
            replica_crashes: 1,
            lost_renewal_answers: 2,
            lease_deletions: 3,
            changes: 3,
            closes: 2,
            deletions: 1,
            owned_changes: 2,
            reports: 3,
            ..NO_FAULTS
        };
        let model = Protocol::new(Config {
            keys: 2,
            groups,
            replicas,
            liveness: false,
            takeover: Takeover::Reports,
            warm_up: true,
            ..config(dispatchers, Variant::SendTime, budget)
        });
        let total = real::walks(&model, 0..2000, 120).unwrap_or_else(|(seed, d)| {
            panic!("{dispatchers} dispatchers, {groups} groups, seed {seed}: {d}")
        });
        println!(
            "{dispatchers} dispatchers, {replicas} replicas in {groups} groups: 2000 walks, {} steps, {} Lease deletions, {} handovers, {} answers with keys, {} object deletions, {} deletions queued from a transit's memory, {} tombstones handed out, {} releases waiting for another group, {} dead members taken over by reports ({} of them a restarted dispatcher's previous process), {} warm-ups, {} members judged released while a new process warmed up, in lock-step",
            total.steps,
            total.deletions,
            total.handovers,
            total.deliveries,
            total.object_deletions,
            total.deletions_in_transit,
            total.tombstones,
            total.waits_for_group,
            total.takeovers_by_reports,
            total.restarts_by_reports,
            total.warm_ups,
            total.released_while_warming
        );
        assert!(total.takeovers_by_reports > 20 && total.restarts_by_reports > 5);
        assert!(total.warm_ups > 100 && total.released_while_warming > 5);
        assert!(total.deletions > 1000 && total.handovers > 1000 && total.deliveries > 1000);
        assert!(total.object_deletions > 1000 && total.deletions_in_transit > 100);
        assert!(total.tombstones > 20);
        if groups > 1 {
            assert!(total.waits_for_group > 20);
        }
    }
}

/// The real code's `Transit::record` leaves a key it does not know to the owners' list as the
/// model does (`owners_listed`): random walks in lock-step, with owned changes, deletions and
/// restarts.
#[test]
fn the_real_code_leaves_unknown_owners_to_their_list_as_the_model_does() {
    let budget = Budget {
        dispatcher_crashes: 2,
        graceful_stops: 1,
        lease_deletions: 2,
        changes: 3,
        deletions: 2,
        owned_changes: 4,
        ..NO_FAULTS
    };
    let model = Protocol::new(Config {
        keys: 2,
        owners_listed: true,
        liveness: false,
        takeover: Takeover::Reports,
        ..config(3, Variant::SendTime, budget)
    });
    let walked =
        real::walks(&model, 0..600, 120).unwrap_or_else(|(seed, d)| panic!("seed {seed}: {d}"));
    println!(
        "owners listed: 600 walks, {} steps, {} answers with keys, {} object deletions, in lock-step",
        walked.steps, walked.deliveries, walked.object_deletions
    );
    assert!(walked.deliveries > 300 && walked.object_deletions > 100);
}

/// The keys of a dispatcher that died are served before the bound once every session its
/// Lease listed is reported ended: on random paths of up to 60 steps with two crashes (a
/// dispatcher may die again after a restart), an API cut, lost messages, a replica crash
/// and reports, no two replicas overlap, and such
/// takeovers, with sessions reported, are reached. (Breadth first, the check reaches only
/// 9 steps, too few for a death to be found; depth first, it stays on the first paths.
/// Random paths are a weaker check than either: they did not find the overlaps of the
/// broken rules below, which the replayed paths show.)
#[test]
fn a_takeover_once_every_listed_session_is_reported_ended_never_overlaps() {
    let budget = Budget {
        dispatcher_crashes: 2,
        api_cuts: 1,
        lost_messages: 1,
        replica_crashes: 1,
        changes: 1,
        reports: 2,
        ..NO_FAULTS
    };
    let config = Config {
        liveness: false,
        takeover: Takeover::Reports,
        enabled_only: true,
        ..config(2, Variant::SendTime, budget)
    };
    let checker = Protocol::new(config)
        .checker()
        .threads(2)
        .target_max_depth(60)
        .target_state_count(4_000_000)
        .spawn_simulation(7, stateright::UniformChooser)
        .join();
    if let Some(path) = checker.discovery("exclusive") {
        panic!("exclusive violated ({config}):\n{:#?}", path.into_actions());
    }
    println!(
        "takeover by reports: {} states on random paths",
        checker.state_count(),
    );
    let path = checker
        .discovery(
            "a member that died is waited out no longer once its sessions are reported ended",
        )
        .expect("a takeover by reports is reached");
    let actions = path.into_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::ReportArrives(..))),
        "{actions:#?}"
    );
}

/// A dispatcher cut off from the API server (a partitioned node) can write no Lease, so a
/// session opened there meanwhile is listed nowhere. Handed keys all the same, its
/// reconcile runs on when the other dispatcher, finding no session on the cut-off one's
/// Lease to wait for, takes its keys over at once; handed keys only once listed, it gets
/// none.
#[test]
fn keys_for_a_session_no_lease_lists_overlap_with_a_takeover_by_reports() {
    use Action::*;
    let budget = Budget {
        api_cuts: 1,
        ..NO_FAULTS
    };
    let good = Config {
        takeover: Takeover::Reports,
        ..config(2, Variant::SendTime, budget)
    };
    let bad = Config {
        takeover: Takeover::Unlisted,
        ..good
    };
    let path = [
        &[CutApi(0), Tick, Tick, Tick][..],
        &takes(0, 0),
        &[Tick, Tick],
        &takes(1, 1),
    ]
    .concat();
    overlaps_only_in(bad, good, &path);
    // Waiting out the bound, it does not take the key over then either.
    overlaps_only_in(
        bad,
        Config {
            takeover: Takeover::Bound,
            ..good
        },
        &path,
    );
}

/// A replica reports its session on a cut-off dispatcher ended but lets its reconcile run
/// on: the other dispatcher, carrying the report on its Lease, takes the key over as soon
/// as it finds the cut-off one dead, while the reconcile still runs. Reporting only once
/// the reconcile is cancelled, the same steps never overlap.
#[test]
fn a_session_reported_ended_before_its_reconcile_overlaps_and_after_it_does_not() {
    use Action::*;
    let budget = Budget {
        api_cuts: 1,
        reports: 1,
        ..NO_FAULTS
    };
    let good = Config {
        takeover: Takeover::Reports,
        ..config(2, Variant::SendTime, budget)
    };
    let bad = Config {
        takeover: Takeover::ReportFirst,
        ..good
    };
    let path = [
        &[Open(0, 0), Tick, CutApi(0)][..],
        &[Poll(0, 0), Arrive(0, 0), Answer(0, 0, 0), Receive(0, 0)],
        &[Tick, Poll(0, 0), Arrive(0, 0), Tick, Tick],
        &[
            Answer(0, 0, 1),
            Receive(0, 0),
            Report(0, 0, 1),
            ReportArrives(0, 1),
        ],
        // Replica 1's session is listed by dispatcher 1's next write.
        &[Tick, Open(1, 1), Tick],
        &[Poll(1, 1), Arrive(1, 1), Answer(1, 1, 1), Receive(1, 1)],
    ]
    .concat();
    let bad_end = replay(&Protocol::new(bad), &path);
    assert_eq!(running(&bad_end), 2, "both replicas run the key ({bad})");
    assert_ne!(bad_end.seen & Seen::TakeoverByReports as u8, 0);
    let good_end = replay(&Protocol::new(good), &path);
    assert_eq!(
        running(&good_end),
        1,
        "only replica 1 runs the key ({good})"
    );
    assert!(good_end.replicas[1].running[0].is_some());
    assert_ne!(
        good_end.seen & Seen::TakeoverByReports as u8,
        0,
        "the key was taken over by the report, before the bound"
    );
}
