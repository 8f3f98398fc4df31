//! Keys the ring moves away: forgotten when they settle, drained, abandoned, or kept when they
//! move back.

use super::*;

#[test]
fn keys_moved_away_in_flight_are_forgotten_when_they_settle_whatever_the_outcome() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for k in [
        "stay",
        "gone-ok",
        "gone-fail",
        "gone-dirty",
        "gone-lost",
        "gone-queued",
    ] {
        q.change(k, change(Reason::Added, 1));
    }
    let taken = q.take(1, 5, now);
    assert_eq!(taken.len(), 5, "gone-queued stays ready");
    let id = |k: &str| taken.iter().find(|d| &*d.key == k).unwrap().id;
    q.change("gone-dirty", change(Reason::Modified, 2));
    q.forget_where(|k| k.starts_with("gone"), false);
    q.check();
    assert!(q.any_in_flight(|k| k.starts_with("gone")));
    assert!(
        !q.contains("gone-queued"),
        "a queued key is dropped at once"
    );
    assert!(q.is_leaving("gone-ok") && !q.is_leaving("gone-queued"));
    // Whatever the outcome, a moved key is not requeued here.
    assert_eq!(
        q.ack(1, id("gone-ok"), Outcome::Success, now).0,
        AckResult::Settled {
            worked: Duration::ZERO
        }
    );
    assert_eq!(
        q.ack(1, id("gone-fail"), Outcome::Failure, now).0,
        AckResult::Settled {
            worked: Duration::ZERO
        }
    );
    assert_eq!(
        q.ack(1, id("gone-dirty"), Outcome::Success, now).0,
        AckResult::Settled {
            worked: Duration::ZERO
        }
    );
    // A lost session does not requeue it either.
    assert!(!q.is_leaving("gone-ok"), "forgotten once settled");
    q.remove_session(1);
    q.add_session(2, "b");
    assert!(!q.any_in_flight(|k| k.starts_with("gone")));
    assert_eq!(keys(&q.take(2, 10, now)), ["stay"]);
    assert_eq!(q.len(), 1);
    q.check();
}

#[test]
fn moved_keys_ready_for_delivery_are_delivered_here_first_when_draining() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("deleted", change(Reason::Deleted, 2));
    q.change("updated", change(Reason::Modified, 3));
    q.change("idle", change(Reason::Added, 1));
    let first = q.take(1, 1, now);
    assert_eq!(keys(&first), ["deleted"]);
    q.ack(1, first[0].id, Outcome::Success, now);
    q.forget_where(|k| k != "stays", true);
    q.check();
    // "deleted" was delivered and forgotten; "updated" is still to be delivered here.
    assert!(q.any_pending(|k| k == "updated"));
    assert!(q.any_leaving(|k| k == "updated"));
    let rest = q.take(1, 10, now);
    assert_eq!(keys(&rest), ["updated", "idle"]);
    for d in &rest {
        q.ack(1, d.id, Outcome::Failure, now);
    }
    assert!(
        !q.any_pending(|_| true) && !q.any_leaving(|_| true),
        "settled moved keys are forgotten, not retried here"
    );
    assert!(q.is_empty());
    q.check();
}

/// Moved keys ready for a group whose last session went away (its replica hung until the
/// session expired) are not held for a session that will not come: they are forgotten, the
/// deletions among them returned to be remembered for the new owner; a key in flight still
/// waits until it settles.
#[test]
fn moved_keys_ready_for_no_session_are_abandoned_and_their_deletions_returned() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("flying", change(Reason::Added, 1));
    let flying = q.take(1, 1, now);
    q.change("deleted", change(Reason::Deleted, 2));
    q.change("updated", change(Reason::Modified, 3));
    q.forget_where(|_| true, true);
    assert!(
        q.abandon_leaving_ready().is_empty(),
        "a session may still take them"
    );
    assert!(q.any_leaving(|k| k == "updated"));
    q.remove_session_holding(1, now + std::time::Duration::from_secs(3));
    assert_eq!(q.abandon_leaving_ready(), ["deleted"]);
    q.check();
    assert!(!q.any_leaving(|k| k != "flying"), "the ready ones are gone");
    assert!(q.any_leaving(|k| k == "flying"), "the one in flight waits");
    assert_eq!(keys(&flying), ["flying"]);
}

#[test]
fn a_key_that_moves_back_while_in_flight_is_kept() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    let d = q.take(1, 1, now);
    q.forget_where(|_| true, true);
    q.forget_where(|_| false, true);
    q.change("k", change(Reason::Modified, 2));
    q.ack(1, d[0].id, Outcome::Success, now);
    let again = q.take(1, 1, now);
    assert_eq!(
        (keys(&again), again[0].resource_version.as_str()),
        (vec!["k"], "2")
    );
    q.check();
}
