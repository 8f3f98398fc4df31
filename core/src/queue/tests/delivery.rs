//! Coalescing, exclusivity, order of first enqueue, the live and listed lanes, and the
//! assignment of keys to sessions.

use super::*;

#[test]
fn an_idle_key_stays_small() {
    // With the map's hash and the key, 104 bytes a key before the hash table's own slots.
    assert_eq!(std::mem::size_of::<Entry>(), 64);
    assert_eq!(std::mem::size_of::<Key>(), 32);
}

#[test]
fn changes_to_a_queued_key_coalesce_into_one_delivery() {
    let now = Instant::now();
    let mut q = queue();
    assert!(
        q.change("k", change(Reason::Added, 1)).is_empty(),
        "no session yet"
    );
    for rv in 2..=100 {
        q.change("k", change(Reason::Modified, rv));
    }
    assert_eq!(q.add_session(1, "replica-a"), vec![1]);
    let got = q.take(1, 10, now);
    q.check();
    assert_eq!(keys(&got), ["k"]);
    assert_eq!(
        got[0].reason,
        Reason::Added,
        "an undelivered addition stays an addition"
    );
    assert_eq!(
        got[0].resource_version, "100",
        "the latest change is delivered"
    );
    assert!(q.take(1, 10, now).is_empty());
}

#[test]
fn changes_while_in_flight_yield_exactly_one_more_delivery() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    let first = q.take(1, 10, now);
    for rv in 2..=101 {
        assert!(q.change("k", change(Reason::Modified, rv)).is_empty());
    }
    assert!(q.take(1, 10, now).is_empty(), "never twice in flight");
    let (result, wake) = q.ack(1, first[0].id, Outcome::Success, now);
    assert!(matches!(result, AckResult::Settled { .. }));
    assert_eq!(wake, vec![1]);
    let second = q.take(1, 10, now);
    assert_eq!(keys(&second), ["k"]);
    assert_eq!(
        (second[0].reason, second[0].resource_version.as_str()),
        (Reason::Modified, "101")
    );
    q.ack(1, second[0].id, Outcome::Success, now);
    assert!(q.take(1, 10, now).is_empty());
    q.check();
}

#[test]
fn a_key_in_flight_is_never_handed_to_another_session() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for i in 0..50 {
        q.change(&format!("k{i}"), change(Reason::Added, 1));
    }
    let held = q.take(1, 50, now);
    assert_eq!(held.len(), 50);
    // A second replica joins and changes arrive for every key: all stay with session 1.
    q.add_session(2, "b");
    for i in 0..50 {
        q.change(&format!("k{i}"), change(Reason::Modified, 2));
    }
    assert!(q.take(2, 100, now).is_empty());
    assert!(q.take(1, 100, now).is_empty());
    q.check();
    // Session 1 ends: its keys go to the live session at once.
    assert_eq!(q.remove_session(1), vec![2]);
    assert_eq!(q.take(2, 100, now).len(), 50);
    q.check();
    // Acks from the ended session are ignored.
    assert_eq!(
        q.ack(1, held[0].id, Outcome::Success, now).0,
        AckResult::Unknown
    );
}

#[test]
fn keys_are_served_in_order_of_first_enqueue() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for k in ["c", "a", "b", "d"] {
        q.change(k, change(Reason::Added, 1));
    }
    q.change("a", change(Reason::Modified, 2)); // does not move "a" back
    assert_eq!(keys(&q.take(1, 10, now)), ["c", "a", "b", "d"]);
}

#[test]
fn promoted_keys_go_first_in_the_order_given_and_stay_first_through_a_rebalance() {
    let now = Instant::now();
    let mut q = queue();
    for k in ["a", "b", "c", "d", "e"] {
        q.change(k, change(Reason::Added, 1));
    }
    // No session yet: the keys wait unassigned. "x" is unknown and "c" is delivered below
    // before it is promoted; neither moves anything.
    q.promote(["d", "x", "b"]);
    q.add_session(1, "r");
    assert_eq!(keys(&q.take(1, 1, now)), ["d"]);
    q.change("c", change(Reason::Modified, 2));
    q.promote(["e"]);
    // A second session rebalances by sequence number: the promoted keys keep their place.
    q.add_session(2, "s");
    q.remove_session(2);
    assert_eq!(keys(&q.take(1, 10, now)), ["e", "b", "a", "c"]);
    q.check();
}

#[test]
fn sessions_keep_their_keys_while_membership_is_stable() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.add_session(2, "b");
    // Which of `sessions` gets `key` when it changes.
    let owner = |q: &mut GroupQueue, sessions: [u64; 2], key: &str| {
        q.change(key, change(Reason::Modified, 1));
        let mut got = None;
        for s in sessions {
            for d in q.take(s, 10, now) {
                assert_eq!(got.replace(s), None, "{key} delivered twice");
                q.ack(s, d.id, Outcome::Success, now);
            }
        }
        got.expect("delivered to one of the sessions")
    };
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let first: Vec<u64> = keys.iter().map(|k| owner(&mut q, [1, 2], k)).collect();
    let second: Vec<u64> = keys.iter().map(|k| owner(&mut q, [1, 2], k)).collect();
    assert_eq!(first, second);
    assert!(
        first.contains(&1) && first.contains(&2),
        "both sessions get keys: {first:?}"
    );
    // The same replica reconnecting (new session id) gets the same keys back.
    q.add_session(3, "a");
    assert!(!q.has_session(1), "the replica's old session is replaced");
    let third: Vec<u64> = keys.iter().map(|k| owner(&mut q, [3, 2], k)).collect();
    let expected: Vec<u64> = first.iter().map(|&s| if s == 1 { 3 } else { 2 }).collect();
    assert_eq!(third, expected);
}

/// A replica whose session is replaced (it reconnected) keeps its place on the ring: its
/// ready keys go to the new session in their order, its key in flight stays held until the old
/// session's time, and no other session is woken or loses a key.
#[test]
fn a_replaced_session_hands_its_keys_to_its_successor_and_moves_no_other() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.add_session(2, "b");
    for i in 0..40 {
        q.change(&format!("k{i}"), change(Reason::Added, 1));
    }
    let ready_of = |q: &GroupQueue, id: u64| -> Vec<String> {
        q.sessions[&id]
            .ready
            .iter()
            .map(|(_, queued)| q.prefixes.text(&queued.key))
            .collect()
    };
    let flying = q.take(1, 1, now);
    assert_eq!(flying.len(), 1);
    let (of_a, of_b) = (ready_of(&q, 1), ready_of(&q, 2));
    assert!(!of_a.is_empty() && !of_b.is_empty(), "{of_a:?} {of_b:?}");

    let held_until = now + Duration::from_secs(5);
    let woken = q.add_session_replacing(3, "a", &[(1, held_until)]);
    q.check();
    assert_eq!(woken, vec![3], "only the new session is woken");
    assert!(!q.has_session(1));
    assert_eq!(ready_of(&q, 2), of_b, "the other session keeps its keys");
    let taken: Vec<String> = q
        .take(3, 100, now)
        .iter()
        .map(|d| d.key.to_string())
        .collect();
    assert_eq!(taken, of_a, "the successor has them, in their order");

    // The key in flight comes back only once the old session's time is up.
    q.advance(held_until - MS);
    assert!(q.take(3, 10, held_until - MS).is_empty());
    q.advance(held_until);
    let back = q.take(3, 10, held_until);
    assert_eq!(keys(&back), [&*flying[0].key]);
    q.check();
}

/// Keys that become ready in one advance of the clock are handed out in the order they became
/// ready: a key held from a replaced session goes before a retry that falls due after it.
#[test]
fn a_held_key_released_before_a_retry_falls_due_goes_first() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("retried", change(Reason::Added, 1));
    let failed = q.take(1, 1, now);
    q.ack(1, failed[0].id, Outcome::Failure, now);
    let retry_at = q.next_deadline().expect("the retry's timer");
    q.change("held", change(Reason::Added, 1));
    assert_eq!(keys(&q.take(1, 1, now)), ["held"]);
    q.add_session_replacing(2, "a", &[(1, retry_at - MS)]);
    q.advance(retry_at);
    q.check();
    assert_eq!(keys(&q.take(2, 10, retry_at)), ["held", "retried"]);
}

/// A change the watch's stream shows goes ahead of the keys a list brought, and a listed key
/// whose object then changes moves ahead with it, delivered once at its new version. A listed
/// change of a key waiting live leaves it where it is.
#[test]
fn live_changes_go_ahead_of_listed_keys() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for k in ["l1", "l2", "l3", "l4"] {
        q.change_in(k, change(Reason::Added, 1), Lane::Listed);
    }
    q.change("new", change(Reason::Added, 1));
    q.change("l3", change(Reason::Modified, 2));
    q.change_in("new", change(Reason::Modified, 2), Lane::Listed);
    q.check();
    assert_eq!(q.ready_len(), 5);
    let got = q.take(1, 10, now);
    assert_eq!(keys(&got), ["new", "l3", "l1", "l2", "l4"]);
    // Each delivery says which lane it waited in: the live ones are the tier's latency.
    let listed: Vec<bool> = got.iter().map(|d| d.listed).collect();
    assert_eq!(listed, [false, false, true, true, true]);
    assert_eq!(
        (got[1].reason, got[1].resource_version.as_str()),
        (Reason::Added, "2"),
        "an addition not yet delivered stays one"
    );
    assert_eq!(q.ready_len(), 0);
    q.check();
}

/// Resyncs wait in the listed lane: a change made after them is delivered first.
#[test]
fn resyncs_wait_behind_live_changes() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for k in ["a", "b"] {
        q.change(k, change(Reason::Added, 1));
    }
    for d in q.take(1, 2, now) {
        q.ack(1, d.id, Outcome::Success, now);
    }
    q.resync("a");
    q.change("b", change(Reason::Modified, 2));
    q.check();
    let got = q.take(1, 2, now);
    assert_eq!(keys(&got), ["b", "a"]);
    assert_eq!(got[1].reason, Reason::Resync);
}

/// Keys moved from the listed lane leave their places behind; once those outnumber the ready
/// keys (and the slack), one pass drops them, so the places stay within their bound of the
/// ready keys as those are taken, and every key is still delivered once, in the order of its
/// move.
#[test]
fn places_left_by_moved_keys_are_compacted() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    let n = 200;
    for i in 0..n {
        q.change_in(&format!("k{i}"), change(Reason::Added, 1), Lane::Listed);
    }
    let mut delivered = Vec::new();
    let mut compacted = 0;
    for i in 0..n {
        q.change(&format!("k{i}"), change(Reason::Modified, 2));
        // Take the live key at once: the ready keys fall, the stale places grow.
        delivered.extend(q.take(1, 1, now).into_iter().map(|d| d.key));
        if q.stale == 0 {
            compacted += 1;
        }
        assert!(
            q.places() <= q.ready_len() + STALE_SLACK.max(q.ready_len()) + 1,
            "{} places for {} ready keys after {i} moves",
            q.places(),
            q.ready_len()
        );
        q.check();
    }
    assert!(compacted > 0, "the places were never compacted");
    let want: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    assert_eq!(delivered, want);
    assert_eq!((q.ready_len(), q.places()), (0, 0));
}

/// Keys the caller says wait (owners whose children are being listed) stay ready and are not
/// handed out, while the keys behind them are; they keep coalescing changes, and are handed
/// out by the next take that lets them. A deletion never waits.
#[test]
fn keys_that_wait_stay_ready_and_the_keys_behind_them_are_taken() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for k in ["owner-1", "other", "owner-2"] {
        q.change(k, change(Reason::Added, 1));
    }
    let waits = |key: &str, waits: Option<Instant>| {
        (!(waits.is_some() && key.starts_with("owner"))).then_some(0)
    };
    let got = q.take_within_sized(1, 10, usize::MAX, now, waits);
    q.check();
    assert_eq!(keys(&got), ["other"], "only the key that does not wait");
    q.change("owner-1", change(Reason::Modified, 2));
    q.change("owner-2", change(Reason::Deleted, 3));
    let got = q.take_within_sized(1, 10, usize::MAX, now, waits);
    q.check();
    assert_eq!(keys(&got), ["owner-2"], "a deletion does not wait");
    assert!(got[0].deleted);
    let got = q.take_within_sized(1, 10, usize::MAX, now, |_, _| Some(0));
    q.check();
    assert_eq!(keys(&got), ["owner-1"]);
    assert_eq!(
        (got[0].reason, got[0].resource_version.as_str()),
        (Reason::Added, "2"),
        "it waited ready: the change joined its delivery"
    );
}

/// A take passes over at most `MAX_WAITING_PER_TAKE` keys that wait and ends there; the next
/// one begins with the keys behind them. A key on its way to another dispatcher (delivered
/// here first while this one drains) never waits.
#[test]
fn a_take_passes_over_a_bounded_number_of_waiting_keys_and_leaving_ones_go() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for i in 0..MAX_WAITING_PER_TAKE {
        q.change(&format!("owner-{i:05}"), change(Reason::Added, 1));
    }
    q.change("other", change(Reason::Added, 1));
    let waits = |key: &str, waits: Option<Instant>| {
        (!(waits.is_some() && key.starts_with("owner"))).then_some(0)
    };
    assert!(
        q.take_within_sized(1, 10, usize::MAX, now, waits)
            .is_empty(),
        "the take ends once it passed over the bound"
    );
    q.check();
    let got = q.take_within_sized(1, 10, usize::MAX, now, waits);
    q.check();
    assert_eq!(keys(&got), ["other"]);
    q.forget_where(|key| key == "owner-00007", true);
    let got = q.take_within_sized(1, 10, usize::MAX, now, waits);
    q.check();
    assert_eq!(keys(&got), ["owner-00007"], "a leaving key does not wait");
}
