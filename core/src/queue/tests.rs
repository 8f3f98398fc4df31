//! The queue's unit and property tests: one per rule of the contract (`CONTRACT.md`) and per
//! invariant the operations must keep.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

const MS: Duration = Duration::from_millis(1);

fn queue() -> GroupQueue {
    GroupQueue::new(QueueConfig {
        backoff: Backoff {
            base: 5 * MS,
            cap: Duration::from_secs(1),
        },
        max_reconcile_time: Duration::from_secs(10),
        body_budget: 100,
        memo_budget: 1000,
    })
}

fn change(reason: Reason, rv: u32) -> Change {
    Change {
        reason,
        resource_version: rv.to_string(),
        uid: "uid-1".into(),
        body: None,
        deleted: reason == Reason::Deleted,
        trace: None,
    }
}

fn with_body(reason: Reason, rv: u32, len: usize) -> Change {
    Change {
        body: Some(vec![b'x'; len].into()),
        ..change(reason, rv)
    }
}

fn keys(deliveries: &[Delivery]) -> Vec<&str> {
    deliveries.iter().map(|d| &*d.key).collect()
}

impl GroupQueue {
    /// Checks the invariants that every operation must keep.
    fn check(&self) {
        let mut in_flight = HashSet::new();
        for (id, s) in &self.sessions {
            for (delivery, (key, _)) in &s.in_flight {
                assert!(in_flight.insert(key.clone()), "{key:?} in flight twice");
                assert!(matches!(self.entries[key].state, State::InFlight { .. }));
                assert_eq!(
                    self.flights.get(key).map(|f| (f.session, f.delivery)),
                    Some((*id, *delivery))
                );
            }
        }
        assert_eq!(self.flights.len(), in_flight.len());
        assert!(
            self.held.iter().all(|k| !in_flight.contains(k)),
            "held and in flight"
        );
        let prefixes: HashSet<String> = self
            .entries
            .keys()
            .map(|k| {
                let mut text = self.prefixes.text(k);
                text.truncate(text.rfind('/').map_or(0, |slash| slash + 1));
                text
            })
            .collect();
        assert_eq!(
            self.prefixes.len(),
            prefixes.len(),
            "a prefix outlived its keys"
        );
        // Every ready key has its place in its lane, in the lanes of the session it is
        // assigned to; the other places are stale, and the queue counts at least as many.
        let mut ready = HashSet::new();
        let mut stale = 0;
        let lanes = self
            .sessions
            .iter()
            .map(|(id, s)| (Some(*id), &s.ready))
            .chain(std::iter::once((None, &self.unassigned)));
        for (session, lanes) in lanes {
            for (lane, q) in lanes.iter() {
                if !self.is_place(lane, q) {
                    stale += 1;
                    continue;
                }
                let assigned = self
                    .assign(&q.key)
                    .filter(|id| self.sessions.contains_key(id));
                assert_eq!(assigned, session, "{:?} queued for another session", q.key);
                if !ready.insert(q.key.clone()) {
                    // A second place of a key promoted where it already waited.
                    stale += 1;
                }
            }
        }
        assert!(
            stale <= self.stale,
            "{stale} stale places, {} counted",
            self.stale
        );
        assert_eq!(ready.len(), self.ready_count, "ready keys counted");
        for (key, e) in &self.entries {
            let text = self.prefixes.text(key);
            assert_eq!(
                self.prefixes.find(&text).as_ref(),
                Some(key),
                "{text}'s prefix"
            );
            match e.state {
                State::Ready { .. } => assert!(ready.contains(key), "{key:?} ready nowhere"),
                State::InFlight { .. } => assert!(
                    in_flight.contains(key)
                        || self.held.contains(key) && self.timer_slots.contains_key(key),
                    "{key:?} in flight nowhere"
                ),
                State::Delayed => assert!(
                    self.timer_slots.contains_key(key),
                    "{key:?} delayed without timer"
                ),
                State::Idle => assert!(
                    !self.timer_slots.contains_key(key),
                    "{key:?} idle with a timer"
                ),
            }
            if let Some(slot) = self.timer_slots.get(key) {
                assert_eq!(self.timers.get(slot), Some(key));
            }
        }
        assert_eq!(self.timers.len(), self.timer_slots.len());
        assert!(
            self.timer_slots
                .keys()
                .all(|k| self.entries.contains_key(k))
        );
        assert!(self.bodies.keys().all(|k| self.entries.contains_key(k)));
        assert!(self.tombstones.keys().all(|k| self.entries.contains_key(k)));
        let bodies: usize = self.bodies.values().map(|b| b.len()).sum();
        assert_eq!(bodies, self.body_bytes);
        assert!(self.body_bytes <= self.config.body_budget);
        assert!(self.memos.keys().all(|k| self.entries.contains_key(k)));
        let memos: usize = self.memos.values().map(|(_, m)| m.len()).sum();
        assert_eq!(memos, self.memo_bytes);
        assert!(self.memo_bytes <= self.config.memo_budget);
    }
}

#[test]
fn an_idle_key_stays_small() {
    // With the map's hash and the key, 96 bytes a key before the hash table's own slots.
    assert_eq!(std::mem::size_of::<Entry>(), 56);
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

#[test]
fn bodies_are_kept_within_the_budget_and_released_on_delivery() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k1", with_body(Reason::Added, 1, 60));
    q.change("k2", with_body(Reason::Added, 1, 60)); // over the 100-byte budget: no body
    q.change("k1", with_body(Reason::Modified, 2, 30)); // replaces k1's body
    assert_eq!(q.body_bytes(), 30);
    q.check();
    let d = q.take(1, 10, now);
    assert_eq!(d[0].body.as_ref().map(|b| b.len()), Some(30));
    assert_eq!(
        d[1].body, None,
        "delivered without body; the controller reads it fresh"
    );
    assert_eq!(q.body_bytes(), 0);
}

#[test]
fn deleted_keys_are_forgotten_once_delivered() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", change(Reason::Added, 1));
    let d = q.take(1, 1, now);
    q.ack(1, d[0].id, Outcome::Success, now);
    q.change("k", change(Reason::Deleted, 2));
    let d = q.take(1, 1, now);
    assert!(d[0].deleted);
    assert_eq!(q.len(), 1);
    q.ack(1, d[0].id, Outcome::Success, now);
    assert_eq!(q.len(), 0, "memory follows live keys");
}

/// Groups sharing a pool hold no more than its capacity between them; a group over its share
/// sheds bodies (its keys then go without), and a group dropped gives everything back.
#[test]
fn a_pool_bounds_the_bodies_of_every_group_and_is_shared_out() {
    let now = Instant::now();
    let pool = BodyPool::new(150);
    let config = queue().config;
    let (mut hog, mut other) = (
        GroupQueue::with_pool(config, pool.clone()),
        GroupQueue::with_pool(config, pool.clone()),
    );
    hog.change("a", with_body(Reason::Added, 1, 50));
    hog.change("b", with_body(Reason::Added, 1, 50));
    other.change("c", with_body(Reason::Added, 1, 40));
    other.change("d", with_body(Reason::Added, 1, 40)); // 180 > 150: no body
    assert_eq!(
        (pool.used(), hog.body_bytes(), other.body_bytes()),
        (140, 100, 40)
    );
    // An even share is 75 each: the hog gives back what it holds past it, and while the pool
    // is short takes no more than its share.
    assert_eq!(hog.hold_bodies_to(Some(75)), 50);
    hog.change("e", with_body(Reason::Added, 1, 30));
    assert_eq!(hog.body_bytes(), 50, "75 is the hog's share");
    other.change("d", with_body(Reason::Modified, 2, 40));
    assert_eq!((pool.used(), other.body_bytes()), (130, 80));
    assert_eq!(hog.hold_bodies_to(None), 0);
    hog.add_session(1, "r");
    let bodies = hog
        .take(1, 10, now)
        .iter()
        .filter(|d| d.body.is_some())
        .count();
    assert_eq!(
        bodies, 1,
        "the shed key, and the one past the share, go without"
    );
    assert_eq!(pool.used(), 80, "delivered bodies leave the pool");
    drop(other);
    assert_eq!(pool.used(), 0, "a dropped group gives its bodies back");
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

#[test]
fn resync_queues_only_idle_keys_and_carries_no_body() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("idle", with_body(Reason::Added, 1, 10));
    q.change("busy", change(Reason::Added, 1));
    let d = q.take(1, 10, now);
    q.ack(1, d[0].id, Outcome::Success, now); // "idle" settles; "busy" stays in flight
    q.resync("idle");
    q.resync("busy");
    q.resync("unknown");
    let d = q.take(1, 10, now);
    assert_eq!(keys(&d), ["idle"]);
    assert_eq!((d[0].reason, d[0].body.clone()), (Reason::Resync, None));
}

#[test]
fn an_owned_or_named_change_keeps_the_pending_state_of_the_key_itself() {
    for related in [Reason::Owned, Reason::Referenced] {
        let now = Instant::now();
        let mut q = queue();
        q.add_session(1, "a");
        q.change("owner", with_body(Reason::Added, 7, 10));
        q.change("owner", Change::related(related));
        let d = q.take(1, 1, now);
        assert_eq!(
            (d[0].reason, d[0].resource_version.as_str()),
            (Reason::Added, "7"),
            "{related:?}"
        );
        assert_eq!(d[0].body.as_ref().map(|b| b.len()), Some(10));
        q.ack(1, d[0].id, Outcome::Success, now);
        // Settled: a related change alone is delivered as such.
        q.change("owner", Change::related(related));
        let d = q.take(1, 1, now);
        assert_eq!(d[0].reason, related);
        q.ack(1, d[0].id, Outcome::Success, now);
        // A pending deletion stays a deletion.
        q.change("owner", change(Reason::Deleted, 9));
        q.change("owner", Change::related(related));
        let d = q.take(1, 1, now);
        assert_eq!(
            (d[0].reason, d[0].deleted),
            (Reason::Deleted, true),
            "{related:?}"
        );
        q.ack(1, d[0].id, Outcome::Success, now);
    }
}

#[test]
fn resync_batches_walk_every_key_once_per_cycle() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    for i in 0..10 {
        q.change(&format!("k{i}"), change(Reason::Added, 1));
    }
    for d in q.take(1, 100, now) {
        q.ack(1, d.id, Outcome::Success, now);
    }
    let mut seen = Vec::new();
    for _ in 0..5 {
        q.resync_batch(2);
        for d in q.take(1, 100, now) {
            assert_eq!(d.reason, Reason::Resync);
            seen.push(d.key.to_string());
            q.ack(1, d.id, Outcome::Success, now);
        }
    }
    seen.sort();
    let mut all: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    all.sort();
    assert_eq!(seen, all);
}

fn observed(rv: u32) -> Observed {
    Observed {
        resource_version: rv.to_string(),
        uid: "uid-1".into(),
        body: None,
        trace: None,
    }
}

#[test]
fn a_relist_delivers_only_what_changed_and_the_deletes_it_missed() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    // First list, epoch 1: everything is new.
    for k in [
        "/ConfigMap/ns/a",
        "/ConfigMap/ns/b",
        "/ConfigMap/ns/c",
        "/Secret/ns/s",
    ] {
        q.observe(k, observed(1), 1);
    }
    let d = q.take(1, 10, now);
    assert!(d.iter().all(|d| d.reason == Reason::Added));
    for d in d {
        q.ack(1, d.id, Outcome::Success, now);
    }
    // Re-list, epoch 2: a unchanged, b changed, c gone; Secrets belong to another watch.
    q.observe("/ConfigMap/ns/a", observed(1), 2);
    q.observe("/ConfigMap/ns/b", observed(2), 2);
    q.sweep(2, |k| k.starts_with("/ConfigMap/"));
    let d = q.take(1, 10, now);
    let got: Vec<(&str, Reason)> = d.iter().map(|d| (&*d.key, d.reason)).collect();
    assert_eq!(
        got,
        [
            ("/ConfigMap/ns/b", Reason::Modified),
            ("/ConfigMap/ns/c", Reason::Deleted)
        ]
    );
    assert!(d[1].deleted);
    for d in d {
        q.ack(1, d.id, Outcome::Success, now);
    }
    assert_eq!(q.len(), 3, "the deleted key is forgotten");
    // A re-created object (new uid) is an addition.
    q.observe(
        "/ConfigMap/ns/a",
        Observed {
            uid: "uid-2".into(),
            ..observed(9)
        },
        3,
    );
    assert_eq!(q.take(1, 1, now)[0].reason, Reason::Added);
}

#[derive(Clone, Debug)]
enum Op {
    Change(u8, bool),
    AddSession(u8),
    RemoveSession(u8),
    CloseSession(u8, u16),
    Take(u8, u8),
    Ack(u8, u8),
    Advance(u16),
    Resync(u8),
    Promote(u8),
    /// A change a list shows ([`Lane::Listed`]).
    Listed(u8),
    /// A take whose bytes fit one key with its body at most.
    TakeSmall(u8),
    /// The ring moves the keys of one namespace away (`drain`: ready keys are delivered here
    /// first).
    Forget(u8, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, any::<bool>()).prop_map(|(k, d)| Op::Change(k, d)),
        1 => (0u8..4).prop_map(Op::AddSession),
        1 => (0u8..4).prop_map(Op::RemoveSession),
        1 => (0u8..4, 0u16..5_000).prop_map(|(s, ms)| Op::CloseSession(s, ms)),
        3 => (0u8..4, 1u8..5).prop_map(|(s, n)| Op::Take(s, n)),
        3 => (0u8..4, 0u8..3).prop_map(|(s, o)| Op::Ack(s, o)),
        1 => (0u16..20_000).prop_map(Op::Advance),
        1 => (0u8..12).prop_map(Op::Resync),
        1 => (0u8..12).prop_map(Op::Promote),
        2 => (0u8..12).prop_map(Op::Listed),
        1 => (0u8..4).prop_map(Op::TakeSmall),
        1 => (0u8..3, any::<bool>()).prop_map(|(n, d)| Op::Forget(n, d)),
    ]
}

/// Key `k` of the property test: three namespaces, so prefixes come and go with their keys.
fn prop_key(k: u8) -> String {
    format!("/ConfigMap/ns-{}/k{k}", k % 3)
}

proptest! {
    /// Whatever happens, the invariants hold, and once every session works the queue dry,
    /// every key changed after its last delivery began has been delivered again: nothing lost.
    #[test]
    fn nothing_is_lost_and_invariants_hold(ops in prop::collection::vec(op(), 1..200)) {
        let mut now = Instant::now();
        let mut q = queue();
        let mut outstanding: HashMap<u64, Vec<DeliveryId>> = HashMap::default();
        // Keys changed since their last delivery started.
        let mut owed: HashSet<String> = HashSet::new();
        for op in ops {
            match op {
                Op::Change(k, deleted) => {
                    let reason = if deleted { Reason::Deleted } else { Reason::Modified };
                    q.change(&prop_key(k), with_body(reason, 1, 20));
                    // A key the ring moved away is its new owner's to reconcile.
                    if !q.is_leaving(&prop_key(k)) {
                        owed.insert(prop_key(k));
                    }
                }
                Op::AddSession(s) => {
                    q.add_session(u64::from(s), &format!("replica-{s}"));
                }
                Op::RemoveSession(s) => {
                    q.remove_session(u64::from(s));
                    outstanding.remove(&u64::from(s));
                }
                Op::CloseSession(s, ms) => {
                    q.remove_session_holding(u64::from(s), now + Duration::from_millis(u64::from(ms)));
                    outstanding.remove(&u64::from(s));
                }
                Op::Take(s, n) => {
                    for d in q.take(u64::from(s), usize::from(n), now) {
                        owed.remove(&*d.key);
                        outstanding.entry(u64::from(s)).or_default().push(d.id);
                    }
                }
                Op::Ack(s, o) => {
                    if let Some(id) = outstanding.get_mut(&u64::from(s)).and_then(|v| v.pop()) {
                        let outcome = match o {
                            0 => Outcome::Success,
                            1 => Outcome::Failure,
                            _ => Outcome::Requeue(Duration::from_millis(50)),
                        };
                        q.ack(u64::from(s), id, outcome, now);
                    }
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(u64::from(ms));
                    q.advance(now);
                }
                Op::Resync(k) => {
                    q.resync(&prop_key(k));
                }
                Op::Promote(k) => {
                    q.promote([prop_key(k).as_str()]);
                }
                Op::Listed(k) => {
                    q.change_in(&prop_key(k), with_body(Reason::Modified, 2, 20), Lane::Listed);
                    if !q.is_leaving(&prop_key(k)) {
                        owed.insert(prop_key(k));
                    }
                }
                Op::TakeSmall(s) => {
                    for d in q.take_within(u64::from(s), 3, 300, now) {
                        owed.remove(&*d.key);
                        outstanding.entry(u64::from(s)).or_default().push(d.id);
                    }
                }
                Op::Forget(n, drain) => {
                    let moved = format!("/ns-{n}/");
                    q.forget_where(|key| key.contains(&moved), drain);
                    // Their new owner reconciles them; here they may still be delivered.
                    owed.retain(|key| !key.contains(&moved));
                }
            }
            q.check();
        }
        // Work the queue dry with one session; failures and requeues are retried, then done.
        q.add_session(99, "drain");
        for s in 0..4 {
            q.remove_session(s);
        }
        for _ in 0..1000 {
            now += Duration::from_secs(2);
            q.advance(now);
            let batch = q.take(99, 100, now);
            for d in &batch {
                owed.remove(&*d.key);
                q.ack(99, d.id, Outcome::Success, now);
            }
            q.check();
            if batch.is_empty() && q.next_deadline().is_none() {
                break;
            }
        }
        prop_assert!(owed.is_empty(), "changes never delivered: {:?}", owed);
        prop_assert_eq!(q.ready_len(), 0);
        prop_assert_eq!(q.body_bytes(), 0);
    }
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
fn a_delivery_carries_the_trace_of_the_first_change_since_the_last_one() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    let traced = |rv: u32, trace: &str| Change {
        trace: Some(trace.into()),
        ..change(Reason::Modified, rv)
    };
    // Two changes coalesce: the first one's trace, the wait having begun with it.
    q.change("k", traced(1, "first"));
    q.change("k", traced(2, "second"));
    let d = q.take(1, 1, now);
    assert_eq!(d[0].trace.as_deref(), Some("first"));
    // A change while in flight is delivered after the ack, with its own trace.
    q.change("k", traced(3, "during"));
    q.ack(1, d[0].id, Outcome::Success, now);
    let d = q.take(1, 1, now);
    assert_eq!(d[0].trace.as_deref(), Some("during"));
    // A retry of it carries none: no change caused it.
    q.ack(1, d[0].id, Outcome::Failure, now);
    q.advance(now + Duration::from_secs(2));
    let d = q.take(1, 1, now + Duration::from_secs(2));
    assert_eq!((d[0].reason, d[0].trace.as_deref()), (Reason::Retry, None));
    // A deleted key leaves nothing behind.
    q.change("gone", traced(4, "gone"));
    q.forget_where(|k| k == "gone", false);
    assert!(q.traces.is_empty(), "{:?}", q.traces);
    q.check();
}

fn object(reason: Reason, rv: u32, uid: &str) -> Change {
    Change {
        uid: uid.into(),
        ..change(reason, rv)
    }
}

#[test]
fn a_name_deleted_and_created_again_between_polls_is_delivered_as_both() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", object(Reason::Added, 1, "uid-a"));
    let d = q.take(1, 1, now);
    q.ack(1, d[0].id, Outcome::Success, now);
    // Deleted, then created again under a new uid, both before the next poll.
    q.change("k", object(Reason::Deleted, 2, "uid-a"));
    q.change("k", object(Reason::Added, 3, "uid-b"));
    q.check();
    // The deletion of the first object comes first, on its own: the key stays exclusive.
    let d = q.take(1, 10, now);
    assert_eq!(d.len(), 1);
    assert_eq!(
        (
            d[0].reason,
            d[0].uid.as_str(),
            d[0].deleted,
            d[0].resource_version.as_str()
        ),
        (Reason::Deleted, "uid-a", true, "2")
    );
    assert!(
        q.take(1, 10, now).is_empty(),
        "nothing more while it is in flight"
    );
    q.ack(1, d[0].id, Outcome::Success, now);
    // Then the new object.
    let d = q.take(1, 10, now);
    assert_eq!(
        (
            d[0].reason,
            d[0].uid.as_str(),
            d[0].deleted,
            d[0].resource_version.as_str()
        ),
        (Reason::Added, "uid-b", false, "3")
    );
    q.ack(1, d[0].id, Outcome::Success, now);
    q.check();
}

#[test]
fn a_name_re_used_while_in_flight_delivers_the_deletion_after_the_ack() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", object(Reason::Added, 1, "uid-a"));
    let first = q.take(1, 1, now);
    // While uid-a is reconciled: deleted, and a new object under the name.
    q.change("k", object(Reason::Deleted, 2, "uid-a"));
    q.change("k", object(Reason::Added, 3, "uid-b"));
    assert!(q.take(1, 10, now).is_empty());
    q.ack(1, first[0].id, Outcome::Success, now);
    let d = q.take(1, 10, now);
    assert_eq!((d[0].uid.as_str(), d[0].deleted), ("uid-a", true));
    q.ack(1, d[0].id, Outcome::Success, now);
    let d = q.take(1, 10, now);
    assert_eq!((d[0].uid.as_str(), d[0].deleted), ("uid-b", false));
    q.check();
}

#[test]
fn a_deletion_delivered_before_the_name_is_re_used_is_not_delivered_twice() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    q.change("k", object(Reason::Added, 1, "uid-a"));
    let d = q.take(1, 1, now);
    q.ack(1, d[0].id, Outcome::Success, now);
    q.change("k", object(Reason::Deleted, 2, "uid-a"));
    // The deletion is being reconciled when the new object appears.
    let deletion = q.take(1, 1, now);
    assert!(deletion[0].deleted);
    q.change("k", object(Reason::Added, 3, "uid-b"));
    q.ack(1, deletion[0].id, Outcome::Success, now);
    let d = q.take(1, 10, now);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].uid.as_str(), d[0].deleted), ("uid-b", false));
    q.check();
}

/// What the caller adds to a delivery (an owner's children) counts within the answer's bytes:
/// a key it would take past the bound waits for the next answer, first.
#[test]
fn what_the_caller_adds_counts_within_the_answers_bytes() {
    let mut q = GroupQueue::new(QueueConfig::default());
    let now = Instant::now();
    q.add_session(1, "r");
    for i in 0..4 {
        q.change(&format!("/ConfigMap/ns/o-{i}"), change(Reason::Added, 1));
    }
    let key_bytes = Delivery::size_bound_of("/ConfigMap/ns/o-0", 0);
    let limit = 2 * (key_bytes + 1000);
    let taken = q.take_within_sized(1, 16, limit, now, |_| 1000);
    assert_eq!(
        taken.len(),
        2,
        "two keys and their additions fill the answer"
    );
    let rest = q.take_within_sized(1, 16, limit, now, |_| 0);
    let keys: Vec<&str> = rest.iter().map(|d| d.key.as_str()).collect();
    assert_eq!(keys, ["/ConfigMap/ns/o-2", "/ConfigMap/ns/o-3"]);
    q.check();
}

/// However large the objects, one answer stays within the bytes the client accepts: taking
/// stops before a key that would pass it (the next answer takes it first), and an object too
/// large for any answer goes without its body.
#[test]
fn an_answer_stays_within_its_bytes() {
    const MIB: usize = 1024 * 1024;
    let mut q = GroupQueue::new(QueueConfig {
        body_budget: 64 * MIB,
        ..QueueConfig::default()
    });
    let now = Instant::now();
    q.add_session(1, "r");
    for i in 0..6 {
        q.change(
            &format!("/ConfigMap/ns/big-{i}"),
            with_body(Reason::Added, 1, MIB),
        );
    }
    q.change("/ConfigMap/ns/huge", with_body(Reason::Added, 1, 5 * MIB));
    let limit = 4 * MIB;
    let mut answers = Vec::new();
    loop {
        let got = q.take_within(1, 16, limit, now);
        if got.is_empty() {
            break;
        }
        let bytes: usize = got.iter().map(Delivery::size_bound).sum();
        assert!(bytes <= limit, "{bytes} bytes in one answer");
        answers.push(got);
        q.check();
    }
    let sizes: Vec<Vec<(String, usize)>> = answers
        .iter()
        .map(|a| {
            a.iter()
                .map(|d| (d.key.clone(), d.body.as_ref().map_or(0, |b| b.len())))
                .collect()
        })
        .collect();
    let big = |i: usize| (format!("/ConfigMap/ns/big-{i}"), MIB);
    assert_eq!(
        sizes,
        [
            vec![big(0), big(1), big(2)],
            vec![big(3), big(4), big(5)],
            vec![("/ConfigMap/ns/huge".to_owned(), 0)],
        ],
        "in order of first enqueue, three to an answer, the huge one without its body"
    );
    assert_eq!(q.body_bytes(), 0, "the dropped body left the budget");
}

/// A memo comes back with the next delivery of the same object only: replaced by each ack,
/// dropped for a new object of the same name, never on a deletion, and gone with the key.
#[test]
fn a_memo_comes_back_to_the_same_object_only() {
    let mut q = queue();
    let now = Instant::now();
    q.add_session(1, "r");
    q.change("k", change(Reason::Added, 1));
    let d = q.take(1, 10, now);
    assert_eq!(d[0].memo, None);
    assert!(q.leave_memo(1, d[0].id, b"wrote c0@5"));
    q.ack(1, d[0].id, Outcome::Success, now);
    assert_eq!(q.memo_bytes, 10);
    q.change("k", change(Reason::Modified, 2));
    let d = q.take(1, 10, now);
    assert_eq!(d[0].memo.as_deref(), Some(&b"wrote c0@5"[..]));
    // A failed reconcile's memo is kept too; an empty one removes it.
    assert!(q.leave_memo(1, d[0].id, b"wrote c0@6"));
    q.ack(1, d[0].id, Outcome::Failure, now);
    q.advance(later(now, Duration::from_secs(2)));
    let d = q.take(1, 10, later(now, Duration::from_secs(2)));
    assert_eq!(d[0].memo.as_deref(), Some(&b"wrote c0@6"[..]));
    assert!(!q.leave_memo(1, d[0].id, b""));
    q.ack(1, d[0].id, Outcome::Success, now);
    assert_eq!(q.memo_bytes, 0);
    q.check();

    // Settles `d` leaving `memo`, then changes the key to `next` and takes it again.
    let round = |q: &mut GroupQueue, d: &Delivery, memo: &[u8], next: Change| {
        q.leave_memo(1, d.id, memo);
        q.ack(1, d.id, Outcome::Success, now);
        q.change("k", next);
        q.take(1, 10, now)
    };
    let of_uid_2 = |c: Change| Change {
        uid: "uid-2".into(),
        ..c
    };
    // The name taken by another object: its first delivery carries nothing.
    q.change("k", change(Reason::Modified, 3));
    let d = q.take(1, 10, now);
    let d = round(
        &mut q,
        &d[0],
        b"for uid-1",
        of_uid_2(change(Reason::Added, 4)),
    );
    assert!(d.iter().all(|d| d.memo.is_none()), "{d:?}");
    // A deletion carries none and takes the memo with the key.
    let d = round(
        &mut q,
        &d[0],
        b"for uid-2",
        of_uid_2(change(Reason::Deleted, 5)),
    );
    assert_eq!((d[0].deleted, d[0].memo.clone()), (true, None));
    q.ack(1, d[0].id, Outcome::Success, now);
    assert_eq!((q.len(), q.memo_bytes), (0, 0));
    // Nothing is kept for a delivery not in flight.
    assert!(!q.leave_memo(1, d[0].id, b"late"));
    q.check();
}

/// Memos stay within the group's budget: past it they are refused and counted, never kept.
#[test]
fn memos_stay_within_their_budget() {
    let mut q = queue(); // a budget of 1000 bytes
    let now = Instant::now();
    q.add_session(1, "r");
    for i in 0..3 {
        q.change(&format!("k{i}"), change(Reason::Added, 1));
    }
    let d = q.take(1, 10, now);
    let kept: Vec<bool> = d.iter().map(|d| q.leave_memo(1, d.id, &[0; 400])).collect();
    assert_eq!(kept, [true, true, false]);
    assert!(
        !q.leave_memo(1, d[2].id, &[0; 513]),
        "past the wire's bound"
    );
    assert_eq!(q.memo_bytes, 800);
    assert_eq!(q.figures(now).counts.memos_refused, 2);
    // Replacing a memo gives its bytes back first.
    assert!(q.leave_memo(1, d[0].id, &[0; 500]));
    assert_eq!(q.memo_bytes, 900);
}

/// A memo is for the object its delivery showed: one left after another object took the name
/// during the reconcile, or with the deletion of the earlier object, is not kept.
#[test]
fn a_memo_is_not_kept_across_a_name_taken_during_the_reconcile() {
    let mut q = queue();
    let now = Instant::now();
    q.add_session(1, "r");
    q.change("k", change(Reason::Added, 1));
    let a = q.take(1, 10, now);
    // While A is reconciled, A is deleted and B takes its name.
    q.change("k", change(Reason::Deleted, 2));
    let b = |c: Change| Change {
        uid: "uid-2".into(),
        ..c
    };
    q.change("k", b(change(Reason::Added, 3)));
    assert!(!q.leave_memo(1, a[0].id, b"for A"), "A's memo, B's name");
    q.ack(1, a[0].id, Outcome::Success, now);
    // A's deletion, then B.
    let deletion = q.take(1, 10, now);
    assert_eq!(
        (deletion[0].deleted, deletion[0].memo.clone()),
        (true, None)
    );
    assert!(!q.leave_memo(1, deletion[0].id, b"for A's deletion"));
    q.ack(1, deletion[0].id, Outcome::Success, now);
    let first_of_b = q.take(1, 10, now);
    assert_eq!(first_of_b[0].uid, "uid-2");
    assert_eq!(first_of_b[0].memo, None);
    assert_eq!(q.memo_bytes, 0);
    q.check();
}

/// Memos count in the process's memo pool, apart from bodies, and a group dropped with memos
/// gives their bytes back; past the pool, a memo is refused.
#[test]
fn memos_take_from_their_own_pool_and_a_dropped_group_gives_them_back() {
    let pools = pool::Pools {
        bodies: BodyPool::new(1 << 20),
        memos: BodyPool::new(500),
    };
    let mut q = GroupQueue::with_pools(QueueConfig::default(), pools.clone());
    let now = Instant::now();
    q.add_session(1, "r");
    q.change("a", change(Reason::Added, 1));
    q.change("b", change(Reason::Added, 1));
    let d = q.take(1, 10, now);
    assert!(q.leave_memo(1, d[0].id, &[0; 300]));
    assert!(!q.leave_memo(1, d[1].id, &[0; 300]), "past the memo pool");
    assert_eq!((pools.memos.used(), pools.bodies.used()), (300, 0));
    drop(q);
    assert_eq!(pools.memos.used(), 0);
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
