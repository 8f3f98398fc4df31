//! Retries, requeues, the maximum reconcile time, and the keys of a session closed before its
//! fence.

use super::*;

#[test]
fn failures_back_off_exponentially_and_success_resets() {
    let mut now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    for (attempt, delay) in [(0, 5), (1, 10), (2, 20), (3, 40)] {
        let d = q.take(1, 1, now);
        assert_eq!((d.len(), d[0].attempt), (1, attempt));
        q.ack(1, d[0].id, Outcome::Failure, now);
        assert_eq!(q.next_deadline(), Some(now + delay * MS));
        assert!(
            q.advance(now + delay * MS - MS).is_empty(),
            "not before the backoff"
        );
        now += delay * MS;
        assert_eq!(q.advance(now), vec![1]);
        q.check();
    }
    let d = q.take(1, 1, now);
    assert_eq!(d[0].reason, Reason::Retry);
    q.ack(1, d[0].id, Outcome::Success, now);
    q.change("k", change(Reason::Modified, 2));
    assert_eq!(q.take(1, 1, now)[0].attempt, 0);
}

#[test]
fn requeue_after_is_honoured() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    let d = q.take(1, 1, now);
    q.ack(1, d[0].id, Outcome::Requeue(Duration::from_secs(30)), now);
    assert!(q.advance(now + Duration::from_secs(30) - MS).is_empty());
    assert!(q.take(1, 1, now).is_empty());
    assert_eq!(q.advance(now + Duration::from_secs(30)), vec![1]);
    let d = q.take(1, 1, now);
    assert_eq!((keys(&d), d[0].reason), (vec!["k"], Reason::Requeue));
}

#[test]
fn a_change_cuts_a_backoff_short() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    let d = q.take(1, 1, now);
    q.ack(1, d[0].id, Outcome::Requeue(Duration::from_secs(300)), now);
    q.change("k", change(Reason::Modified, 2));
    let d = q.take(1, 1, now);
    assert_eq!((d.len(), d[0].reason), (1, Reason::Modified));
    assert_eq!(
        q.next_deadline(),
        Some(now + Duration::from_secs(10)),
        "only the reconcile deadline"
    );
    q.check();
}

#[test]
fn an_unacknowledged_delivery_expires_after_the_max_reconcile_time() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    let d = q.take(1, 1, now);
    let deadline = now + Duration::from_secs(10);
    assert_eq!(q.next_deadline(), Some(deadline));
    q.advance(deadline);
    q.check();
    // Treated as a failure: retried after the first backoff step, and the old id is void.
    assert_eq!(
        q.ack(1, d[0].id, Outcome::Success, deadline).0,
        AckResult::Unknown
    );
    q.advance(deadline + 5 * MS);
    let again = q.take(1, 1, deadline + 5 * MS);
    assert_eq!((again[0].reason, again[0].attempt), (Reason::Retry, 1));
}

/// A session closed (or replaced) with deliveries in flight: its client may not have stopped
/// them, so they stay in flight until the session would have expired (or their deadline,
/// sooner), and only then go to another session; what it had acknowledged and what was only
/// queued for it go at once.
#[test]
fn a_closed_sessions_keys_in_flight_wait_for_its_fence() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.add_session(2, "b");
    for key in ["k1", "k2", "k3", "k4"] {
        q.change(key, change(Reason::Added, 1));
    }
    let mut taken = q.take(1, 10, now);
    taken.extend(q.take(2, 10, now));
    let of_a: Vec<&str> = taken.iter().filter(|_| true).map(|d| &*d.key).collect();
    assert_eq!(of_a.len(), 4);
    let a_keys: Vec<String> = q.sessions[&1]
        .in_flight
        .values()
        .map(|(k, _)| q.prefixes.text(k))
        .collect();
    assert!(!a_keys.is_empty(), "a holds keys: {taken:?}");
    let until = now + Duration::from_secs(3);
    q.remove_session_holding(1, until);
    q.check();
    assert_eq!(q.in_flight_len(), 4, "a's keys are still in flight");
    // A change meanwhile is kept for after.
    q.change(&a_keys[0], change(Reason::Modified, 2));
    assert!(q.take(2, 10, now + Duration::from_secs(2)).is_empty());
    // Its fence has passed: b gets a's keys.
    q.advance(until);
    q.check();
    let mut again: Vec<String> = q
        .take(2, 10, until)
        .iter()
        .map(|d| d.key.to_string())
        .collect();
    again.sort();
    let mut expected = a_keys.clone();
    expected.sort();
    assert_eq!(again, expected);
}
