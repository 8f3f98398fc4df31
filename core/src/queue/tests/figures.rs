//! What a queue tells of itself: figures, counters and one key's status.

use super::*;

#[test]
fn figures_and_counters_follow_what_the_queue_does() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for k in ["ok", "fail", "requeue", "slow"] {
        q.change(k, change(Reason::Added, 1));
    }
    q.change("ok", change(Reason::Modified, 2));
    let f = q.figures(now);
    assert_eq!((f.keys, f.ready, f.in_flight, f.delayed), (4, 4, 0, 0));
    assert_eq!(f.counts.adds, 4, "a change to a queued key is no add");

    let d = q.take(1, 4, now);
    assert!(
        d.iter().all(|d| d.queued.is_none()),
        "no time said as they became ready"
    );
    let id = |k: &str| d.iter().find(|d| &*d.key == k).unwrap().id;
    let at = now + Duration::from_secs(2);
    let f = q.figures(at);
    assert_eq!((f.ready, f.in_flight), (0, 4));
    assert_eq!((f.unfinished, f.longest), (8 * 1000 * MS, 2000 * MS));
    // A change to a key queued as added keeps it added.
    assert_eq!(f.counts.deliveries[Reason::Added as usize], 4);

    assert_eq!(
        q.ack(1, id("ok"), Outcome::Success, at).0,
        AckResult::Settled { worked: 2000 * MS }
    );
    q.ack(1, id("fail"), Outcome::Failure, at);
    q.ack(
        1,
        id("requeue"),
        Outcome::Requeue(Duration::from_secs(60)),
        at,
    );
    assert_eq!(
        q.ack(1, id("ok"), Outcome::Success, at).0,
        AckResult::Unknown
    );
    // "slow" passes the maximum reconcile time (10 s).
    let late = now + Duration::from_secs(10);
    q.advance(late);
    let f = q.figures(late);
    assert_eq!(
        (f.ready, f.in_flight, f.delayed),
        (1, 0, 2),
        "fail is ready again after its backoff; requeue and slow wait"
    );
    let c = f.counts;
    assert_eq!(
        (
            c.acks_success,
            c.acks_failure,
            c.acks_requeue,
            c.acks_unknown
        ),
        (1, 1, 1, 1)
    );
    assert_eq!((c.retries, c.expired), (2, 1), "a failure and an expiry");
    let later = late + Duration::from_secs(60);
    q.at(later).advance(later);
    assert_eq!(
        q.figures(late).counts.adds,
        7,
        "three timers made keys ready again"
    );
    let d = q.take(1, 4, later + 3 * MS);
    assert_eq!(d.len(), 3);
    // "fail" became ready before the time was said; the others as the timers fired.
    let waited: Vec<_> = d.iter().map(|d| (&*d.key, d.queued)).collect();
    assert!(waited.contains(&("requeue", Some(3 * MS))), "{waited:?}");
    assert!(waited.contains(&("slow", Some(3 * MS))), "{waited:?}");
    assert!(waited.contains(&("fail", None)), "{waited:?}");
    q.check();
}

#[test]
fn key_status_follows_a_key_through_every_state() {
    let t0 = Instant::now();
    let mut q = queue();
    assert_eq!(q.key_status("k", t0), None);
    // Queued with no session: no replica, waiting since it was made ready.
    q.at(t0).change("k", change(Reason::Added, 1));
    let s = q.key_status("k", t0 + 3 * MS).unwrap();
    assert_eq!(
        (s.state, s.replica, s.wait, s.resource_version.as_str()),
        (KeyState::Queued, None, Some(3 * MS), "1")
    );
    // Assigned to replica a once it has a session.
    q.add_session(1, "a");
    let s = q.key_status("k", t0 + 4 * MS).unwrap();
    assert_eq!(
        (s.state, s.replica.as_deref()),
        (KeyState::Queued, Some("a"))
    );
    // In flight on a; a change meanwhile is shown.
    let d = q.take(1, 1, t0 + 5 * MS);
    q.change("k", change(Reason::Modified, 2));
    let s = q.key_status("k", t0 + 9 * MS).unwrap();
    assert_eq!(
        (s.state, s.replica.as_deref(), s.wait, s.changed_in_flight),
        (KeyState::InFlight, Some("a"), Some(4 * MS), true)
    );
    // The change is delivered after the ack; its failure backs the key off.
    q.ack(1, d[0].id, Outcome::Success, t0 + 10 * MS);
    let d = q.take(1, 1, t0 + 10 * MS);
    q.ack(1, d[0].id, Outcome::Failure, t0 + 11 * MS);
    let s = q.key_status("k", t0 + 12 * MS).unwrap();
    assert_eq!(
        (s.state, s.failures, s.wait),
        (KeyState::BackingOff, 1, Some(4 * MS)),
        "the first backoff is 5 ms, 1 ms of it gone"
    );
    let f = q.figures(t0 + 12 * MS);
    assert_eq!((f.delayed, f.backing_off), (1, 1));
    // Delivered again and requeued: waiting for the requeue-after, failures reset.
    q.advance(t0 + 16 * MS);
    let d = q.take(1, 1, t0 + 16 * MS);
    q.ack(
        1,
        d[0].id,
        Outcome::Requeue(Duration::from_secs(30)),
        t0 + 17 * MS,
    );
    let s = q.key_status("k", t0 + 17 * MS).unwrap();
    assert_eq!(
        (s.state, s.failures, s.wait),
        (KeyState::RequeueAfter, 0, Some(Duration::from_secs(30)))
    );
    let f = q.figures(t0 + 17 * MS);
    assert_eq!((f.delayed, f.backing_off), (1, 0));
    // Delivered and settled: idle.
    q.advance(t0 + Duration::from_secs(31));
    let d = q.take(1, 1, t0 + Duration::from_secs(31));
    q.ack(1, d[0].id, Outcome::Success, t0 + Duration::from_secs(31));
    let s = q.key_status("k", t0 + Duration::from_secs(31)).unwrap();
    assert_eq!((s.state, s.wait, s.deleted), (KeyState::Idle, None, false));
    q.check();
}

#[test]
fn the_oldest_ready_key_is_the_live_one_waiting_longest_where_it_is_delivered_from() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.at(now).change("first", change(Reason::Added, 1));
    q.at(now + Duration::from_secs(1))
        .change("second", change(Reason::Added, 1));
    q.at(now + Duration::from_secs(2))
        .change("third", change(Reason::Added, 1));
    let at = now + Duration::from_secs(5);
    assert_eq!(q.figures(at).oldest_ready, 5000 * MS);
    // Once the first is delivered, the second is the oldest still ready; the one in flight
    // counts no more.
    let d = q.take(1, 1, at);
    assert_eq!(&*d[0].key, "first");
    assert_eq!(q.figures(at).oldest_ready, 4000 * MS);
    // A key promoted ahead of the others waits from its move, as its delivery will say: the
    // oldest is the third.
    q.at(at).promote(["second"]);
    assert_eq!(q.figures(at).oldest_ready, 3000 * MS);
    q.take(1, 2, at);
    assert_eq!(q.figures(at).oldest_ready, Duration::ZERO, "none ready");
    q.check();
}
