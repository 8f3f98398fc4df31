//! Bodies and memos within their budgets and pools, and answers within their bytes.

use super::*;

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
    let taken = q.take_within_sized(1, 16, limit, now, |_, _| Some(1000));
    assert_eq!(
        taken.len(),
        2,
        "two keys and their additions fill the answer"
    );
    let rest = q.take_within_sized(1, 16, limit, now, |_, _| Some(0));
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

/// A group whose keys are queued by changes to other objects keeps a delivered body with its
/// key: the delivery for a child's change carries the owner as the watch last showed it, a
/// retry carries it too, and a change of the owner's own object replaces it. Without the
/// setting, such a delivery carries no body (the controller reads the object).
#[test]
fn a_delivered_body_stays_for_an_owned_change_where_the_group_keeps_them() {
    for keep in [true, false] {
        let now = Instant::now();
        let mut q = GroupQueue::new(QueueConfig {
            keep_delivered_bodies: keep,
            ..queue().config
        });
        q.add_session(1, "a");
        q.change("owner", with_body(Reason::Added, 7, 10));
        let d = q.take(1, 1, now);
        assert_eq!(d[0].body.as_ref().map(|b| b.len()), Some(10));
        q.ack(1, d[0].id, Outcome::Success, now);
        assert_eq!(q.body_bytes(), if keep { 10 } else { 0 });
        q.check();

        q.change("owner", Change::related(Reason::Owned));
        let d = q.take(1, 1, now);
        assert_eq!(
            (d[0].reason, d[0].resource_version.as_str()),
            (Reason::Owned, "7")
        );
        assert_eq!(
            d[0].body.as_ref().map(|b| b.len()),
            keep.then_some(10),
            "keep: {keep}"
        );
        // A failure: the retry carries it as well.
        q.ack(1, d[0].id, Outcome::Failure, now);
        let later = now + Duration::from_secs(2);
        q.advance(later);
        let d = q.take(1, 1, later);
        assert_eq!(d[0].reason, Reason::Retry);
        assert_eq!(d[0].body.is_some(), keep, "keep: {keep}");
        q.ack(1, d[0].id, Outcome::Success, later);

        // A resync carries no body, even a kept one: its controller reads the object fresh.
        q.resync("owner");
        let d = q.take(1, 1, later);
        assert_eq!((d[0].reason, d[0].body.as_ref()), (Reason::Resync, None));
        q.ack(1, d[0].id, Outcome::Success, later);
        // The owner's own change replaces what was kept.
        q.change("owner", with_body(Reason::Modified, 8, 20));
        assert_eq!(q.body_bytes(), 20);
        let d = q.take(1, 1, later);
        assert_eq!(
            (
                d[0].resource_version.as_str(),
                d[0].body.as_ref().map(|b| b.len())
            ),
            ("8", Some(20))
        );
        q.ack(1, d[0].id, Outcome::Success, later);
        q.check();
        // Deleted, the key and what it kept are forgotten once the deletion is delivered.
        q.change("owner", change(Reason::Deleted, 9));
        let d = q.take(1, 1, later);
        q.ack(1, d[0].id, Outcome::Success, later);
        assert_eq!((q.len(), q.body_bytes()), (0, 0));
        q.check();
    }
}

/// Delivered bodies take at most half the group's budget, and only while the pool is at most a
/// quarter full, so that ready keys' bodies always have the other half of the budget and
/// children's bodies a quarter of the pool; a group held to a share sheds them first.
#[test]
fn delivered_bodies_are_kept_within_half_the_budget_and_a_quarter_of_the_pool() {
    let now = Instant::now();
    let pool = BodyPool::new(1000);
    let mut q = GroupQueue::with_pool(
        QueueConfig {
            keep_delivered_bodies: true,
            ..queue().config
        },
        pool.clone(),
    );
    q.add_session(1, "a");
    for (i, len) in [30, 30, 30].into_iter().enumerate() {
        q.change(&format!("k{i}"), with_body(Reason::Added, 1, len));
    }
    // 90 of the budget's 100 held: past half, each delivered body goes, until 30 are left.
    let d = q.take(1, 3, now);
    assert!(d.iter().all(|d| d.body.is_some()));
    assert_eq!(q.body_bytes(), 30);
    assert_eq!(pool.used(), 30);
    for d in &d {
        q.ack(1, d.id, Outcome::Success, now);
    }
    q.check();
    // A pool more than a quarter full keeps no delivered body, whatever the group's budget.
    assert!(pool.take(300));
    q.change("k3", with_body(Reason::Added, 1, 10));
    let d = q.take(1, 1, now);
    assert!(d[0].body.is_some());
    assert_eq!(q.body_bytes(), 30, "the pool is past a quarter: not kept");
    q.ack(1, d[0].id, Outcome::Success, now);
    pool.give_back(300);
    // Held to a share, the group sheds what it kept before the bodies of ready keys.
    q.change("k4", with_body(Reason::Added, 1, 40));
    assert_eq!(q.body_bytes(), 70);
    assert_eq!(q.hold_bodies_to(Some(40)), 30);
    let d = q.take(1, 1, now);
    assert_eq!(
        (d[0].key.as_str(), d[0].body.as_ref().map(|b| b.len())),
        ("k4", Some(40)),
        "the ready key kept its body"
    );
    q.check();
}
