use std::time::Duration;

use super::*;
use crate::{backoff::Backoff, queue::QueueConfig};

const REMEMBER: RecentDeletionsConfig = RecentDeletionsConfig {
    window: Duration::from_secs(60),
    capacity: 100,
};

fn queue() -> GroupQueue {
    GroupQueue::new(QueueConfig {
        backoff: Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        },
        max_reconcile_time: Duration::from_secs(30),
        body_budget: 1 << 20,
        memo_budget: 1 << 20,
        keep_delivered_bodies: false,
    })
}

/// A key that `owner` owns on a ring of `members`.
fn key_of(owner: &str, members: &[&str]) -> String {
    let ring = Ring::new(members.iter().copied());
    (0..1000)
        .map(|i| format!("/ConfigMap/ns/k-{i}"))
        .find(|k| ring.owner_of_hash(hash64(k.as_bytes())) == Some(owner))
        .expect("one of 1000 keys falls on the owner")
}

/// `identity` on a ring of `members`, in the middle of a handover from `settled`.
fn moving(identity: &str, members: &[&str], settled: &[&str]) -> Arc<Slice> {
    let mut slice = Slice::fixed(identity, Ring::new(members.iter().copied()));
    slice.settled = Some(Arc::new(Ring::new(settled.iter().copied())));
    Arc::new(slice)
}

fn fixed(identity: &str, members: &[&str]) -> Arc<Slice> {
    Arc::new(Slice::fixed(identity, Ring::new(members.iter().copied())))
}

/// What `queue` hands out to one session.
fn handed(queue: &mut GroupQueue, now: Instant) -> Vec<crate::queue::Delivery> {
    if !queue.has_session(1) {
        queue.add_session(1, "r");
    }
    queue.take(1, 100, now)
}

/// The keys `queue` hands out, with whether each is a deletion.
fn taken(queue: &mut GroupQueue, now: Instant) -> Vec<(String, bool)> {
    handed(queue, now)
        .into_iter()
        .map(|d| (d.key, d.deleted))
        .collect()
}

#[test]
fn a_deletion_of_a_key_owned_elsewhere_is_delivered_once_the_key_moves_here() {
    let now = Instant::now();
    // d0 and d1; the key is d1's. d1 leaves: the key moves to d0.
    let key = key_of("d1", &["d0", "d1"]);
    let before = fixed("d0", &["d0", "d1"]);
    let mut queue = queue();
    let mut p = Transit::new("g", before.clone(), REMEMBER);
    assert!(!p.admits(&before, KeyRef::new(&key), Some(true), now));
    assert_eq!(taken(&mut queue, now), []);
    // The ring changes; the handover holds the key, then completes.
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    let (_, pending) = p.trim(&during, &mut queue, now);
    assert!(!pending);
    assert_eq!(
        taken(&mut queue, now),
        [],
        "held while the handover holds it"
    );
    let after = fixed("d0", &["d0"]);
    p.trim(&after, &mut queue, now);
    assert_eq!(taken(&mut queue, now), [(key, true)]);
}

#[test]
fn a_key_seen_to_exist_after_its_deletion_is_not_delivered_as_deleted() {
    let now = Instant::now();
    let key = key_of("d1", &["d0", "d1"]);
    let before = fixed("d0", &["d0", "d1"]);
    let mut queue = queue();
    let mut p = Transit::new("g", before.clone(), REMEMBER);
    assert!(!p.admits(&before, KeyRef::new(&key), Some(true), now));
    // Re-created before the key moves here.
    p.exists_elsewhere(&before, KeyRef::new(&key));
    p.trim(&fixed("d0", &["d0"]), &mut queue, now);
    assert_eq!(taken(&mut queue, now), []);
}

#[test]
fn a_deletion_held_for_a_key_that_moves_away_again_is_remembered_and_not_delivered() {
    let now = Instant::now();
    // d0 takes over d1's key; while the handover holds it, the key is deleted; the ring
    // flaps back before the handover completes.
    let key = key_of("d1", &["d0", "d1"]);
    let mut queue = queue();
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    let mut p = Transit::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
    p.trim(&during, &mut queue, now);
    assert!(!p.admits(&during, KeyRef::new(&key), Some(true), now));
    let back = fixed("d0", &["d0", "d1"]);
    p.trim(&back, &mut queue, now);
    assert_eq!(taken(&mut queue, now), []);
    // It is remembered: a peer that now owns the key gets it.
    let owned = p.recent_deletions_owned_by(&Ring::new(["d0", "d1"]), "d1", now);
    assert_eq!(
        owned.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        [key]
    );
}

#[test]
fn a_served_key_goes_to_the_queue_and_one_owned_while_nothing_is_served_is_kept() {
    let now = Instant::now();
    let key = key_of("d0", &["d0", "d1"]);
    let serving = fixed("d0", &["d0", "d1"]);
    let mut p = Transit::new("g", serving.clone(), REMEMBER);
    assert!(p.admits(&serving, KeyRef::new(&key), Some(false), now));
    let starting = Arc::new(serving.closed());
    assert!(!p.admits(&starting, KeyRef::new(&key), Some(false), now));
    assert!(Transit::keeps(&starting, &queue(), KeyRef::new(&key)));
    let other = key_of("d1", &["d0", "d1"]);
    assert!(!Transit::keeps(&starting, &queue(), KeyRef::new(&other)));
    assert!(
        !Transit::keeps(&serving, &queue(), KeyRef::new(&key)),
        "served keys need no keeping"
    );
}

#[test]
fn keys_that_moved_away_hold_back_the_release_until_delivered_and_settled() {
    let now = Instant::now();
    let key = key_of("d1", &["d0", "d1"]);
    let mut queue = queue();
    let alone = fixed("d0", &["d0"]);
    let mut p = Transit::new("g", alone.clone(), REMEMBER);
    queue.add_session(1, "r");
    queue.change(&key, Change::related(Reason::Owned));
    // d1 joins: the key moves away while queued here; it is delivered here first.
    let joined = moving("d0", &["d0", "d1"], &["d0"]);
    let (_, pending) = p.trim(&joined, &mut queue, now);
    assert!(pending, "the queued key holds back the release");
    let delivered = queue.take(1, 10, now);
    assert_eq!(delivered.len(), 1);
    let (_, pending) = p.trim(&joined, &mut queue, now);
    assert!(pending, "in flight still holds it back");
    queue.ack(1, delivered[0].id, crate::queue::Outcome::Success, now);
    let (_, pending) = p.trim(&joined, &mut queue, now);
    assert!(!pending);
}

/// A moved key ready for a group with no session left (its replicas hung until their
/// sessions expired) does not hold the release back: it is left to its new owner, and a
/// deletion among such keys is remembered for it.
#[test]
fn keys_that_moved_away_ready_for_no_session_are_left_to_the_new_owner() {
    let now = Instant::now();
    let key = key_of("d1", &["d0", "d1"]);
    let mut queue = queue();
    let mut p = Transit::new("g", fixed("d0", &["d0"]), REMEMBER);
    queue.change(&key, Change::deletion());
    let joined = moving("d0", &["d0", "d1"], &["d0"]);
    let (_, pending) = p.trim(&joined, &mut queue, now);
    assert!(!pending, "nothing holds the release back");
    assert!(queue.is_empty());
    let ring = Ring::new(["d0", "d1"]);
    assert_eq!(
        p.recent_deletions_owned_by(&ring, "d1", now)
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>(),
        [key],
        "the deletion is remembered for d1"
    );
}

/// Keys that `owner` owns on a ring of `members`, `n` of them, in name order.
fn keys_of(owner: &str, members: &[&str], n: usize) -> Vec<String> {
    let ring = Ring::new(members.iter().copied());
    let mut keys: Vec<String> = (0..100_000)
        .map(|i| format!("/ConfigMap/ns/k-{i:06}"))
        .filter(|k| ring.owner_of_hash(hash64(k.as_bytes())) == Some(owner))
        .take(n)
        .collect();
    keys.sort();
    keys
}

fn seen(rv: u32) -> Observed {
    Observed {
        resource_version: rv.to_string(),
        uid: "uid-1".into(),
        body: None,
        trace: None,
        fingerprint: None,
    }
}

/// The watch's list shows `key` at `rv`.
fn exists(key: &str, rv: u32, epoch: u32) -> GroupEvent<'_> {
    GroupEvent::Exists {
        key: KeyRef::new(key),
        object: seen(rv),
        epoch,
        origin: Origin::List,
    }
}

/// The watch's stream shows `key` at `rv`.
fn streamed(key: &str, rv: u32, epoch: u32) -> GroupEvent<'_> {
    GroupEvent::Exists {
        key: KeyRef::new(key),
        object: seen(rv),
        epoch,
        origin: Origin::Stream,
    }
}

/// The keys `queue` hands out, with their resourceVersions.
fn versions(queue: &mut GroupQueue, now: Instant) -> Vec<(String, String)> {
    handed(queue, now)
        .into_iter()
        .map(|d| (d.key, d.resource_version))
        .collect()
}

/// d1 leaves and d0 takes its keys over: a write made while the handover holds them is
/// delivered first when it completes, ahead of the keys the list beside the watch brings
/// in name order, and once.
#[test]
fn a_change_a_handover_held_goes_ahead_of_the_keys_it_brings() {
    let now = Instant::now();
    let moved = keys_of("d1", &["d0", "d1"], 5);
    let last = moved[4].as_str();
    let mut queue = queue();
    let mut p = Transit::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    p.trim(&during, &mut queue, now);
    p.record(&during, &mut queue, streamed(last, 7, 1), now);
    p.record(&during, &mut queue, streamed(last, 8, 1), now);
    assert_eq!(
        versions(&mut queue, now),
        [],
        "held while the handover holds it"
    );
    assert_eq!(p.figures().held_changes, 1);
    let after = fixed("d0", &["d0"]);
    p.trim(&after, &mut queue, now);
    assert_eq!(p.figures().held_changes, 0);
    for key in &moved {
        let listed = GroupEvent::Listed {
            key: KeyRef::new(key),
            object: seen(8),
            epoch: 1,
        };
        p.record(&after, &mut queue, listed, now);
    }
    let got = versions(&mut queue, now);
    let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    let mut expected = vec![last];
    expected.extend(moved[..4].iter().map(String::as_str));
    assert_eq!(keys, expected);
    assert_eq!(got[0].1, "8", "the latest version seen");
}

/// A starting dispatcher keeps its keys until its gate opens; a key written meanwhile is
/// delivered first then, and the list that filled its index does not count as a change.
#[test]
fn a_change_of_a_kept_key_goes_first_when_the_gate_opens() {
    let now = Instant::now();
    let mine = keys_of("d0", &["d0", "d1"], 3);
    let serving = fixed("d0", &["d0", "d1"]);
    let starting = Arc::new(serving.closed());
    let mut queue = queue();
    let mut p = Transit::new("g", starting.clone(), REMEMBER);
    for key in &mine {
        p.record(&starting, &mut queue, exists(key, 1, 1), now);
    }
    // A re-list showing the same version changes nothing; a new version of the last does.
    p.record(&starting, &mut queue, exists(&mine[1], 1, 2), now);
    p.record(&starting, &mut queue, streamed(&mine[2], 2, 2), now);
    assert_eq!(p.figures().held_changes, 1);
    p.trim(&serving, &mut queue, now);
    let got = versions(&mut queue, now);
    let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, [&mine[2], &mine[0], &mine[1]]);
}

/// A change held for a key is forgotten when its object is deleted (the deletion is held
/// instead), when a re-list does not show it, and when the key moves away again; and at
/// most `MAX_HELD_CHANGES` are held.
#[test]
fn held_changes_are_forgotten_when_they_no_longer_matter_and_bounded() {
    let now = Instant::now();
    let (moved, mut queue, mut p, during) = holding(3, 2, now);
    let deleted = GroupEvent::Deleted {
        key: KeyRef::new(&moved[0]),
        change: Change::deletion(),
    };
    p.record(&during, &mut queue, deleted, now);
    assert_eq!(p.figures().held, 1, "the deletion is held");
    // A re-list (epoch 2) shows the third key only.
    p.record(&during, &mut queue, streamed(&moved[2], 2, 2), now);
    p.sweep(&during, &mut queue, (2, |_: &str| true), now);
    assert_eq!(p.figures().held_changes, 1);
    assert_eq!(
        p.figures().held,
        2,
        "the second key, not shown by the re-list, was deleted while the watch was away"
    );
    // The ring flaps back: the change is the old owner's again.
    p.trim(&fixed("d0", &["d0", "d1"]), &mut queue, now);
    assert_eq!(p.figures().held_changes, 0);

    let many = keys_of("d1", &["d0", "d1"], MAX_HELD_CHANGES + 1);
    p.trim(&during, &mut queue, now);
    for key in &many {
        p.record(&during, &mut queue, streamed(key, 3, 1), now);
    }
    assert_eq!(p.figures().held_changes, MAX_HELD_CHANGES);
    // Past the bound a change is delivered still, in the handover's order.
    let after = fixed("d0", &["d0"]);
    p.trim(&after, &mut queue, now);
    for key in &many {
        let listed = GroupEvent::Listed {
            key: KeyRef::new(key),
            object: seen(3),
            epoch: 1,
        };
        p.record(&after, &mut queue, listed, now);
    }
    queue.add_session(1, "r");
    assert_eq!(queue.take(1, usize::MAX, now).len(), MAX_HELD_CHANGES + 1);
}

/// A list shows every object, changed or not: what it shows of held or kept keys is not
/// remembered as a change, nor is a child it shows.
#[test]
fn what_a_list_shows_is_no_change_to_hurry() {
    let now = Instant::now();
    let (moved, mut queue, mut p, during) = handing_over(2, now);
    p.record(&during, &mut queue, exists(&moved[0], 2, 2), now);
    let owned = GroupEvent::OwnedChanged {
        key: KeyRef::new(&moved[1]),
        origin: Origin::List,
        owners_listed: false,
    };
    p.record(&during, &mut queue, owned, now);
    assert_eq!(p.figures().held_changes, 0);
    let owned = GroupEvent::OwnedChanged {
        key: KeyRef::new(&moved[1]),
        origin: Origin::Stream,
        owners_listed: false,
    };
    p.record(&during, &mut queue, owned, now);
    assert_eq!(
        p.figures().held_changes,
        1,
        "a child's change in the stream is"
    );
}

/// A version remembered while the handover held the key, then a newer one queued once the
/// key is kept (the slice closed meanwhile): the gate opening delivers the newer one, with
/// its body, not the remembered one.
#[test]
fn a_remembered_version_never_replaces_a_newer_one_queued_since() {
    let now = Instant::now();
    let key = key_of("d1", &["d0", "d1"]);
    let mut queue = queue();
    let mut p = Transit::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    p.trim(&during, &mut queue, now);
    p.record(&during, &mut queue, streamed(&key, 10, 1), now);
    let closed = Arc::new(fixed("d0", &["d0"]).closed());
    p.trim(&closed, &mut queue, now);
    let newer = GroupEvent::Exists {
        key: KeyRef::new(&key),
        object: Observed {
            body: Some(Arc::from(&b"{}"[..])),
            ..seen(12)
        },
        epoch: 1,
        origin: Origin::Stream,
    };
    p.record(&closed, &mut queue, newer, now);
    p.trim(&fixed("d0", &["d0"]), &mut queue, now);
    let got = handed(&mut queue, now);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].resource_version, "12");
    assert!(got[0].body.is_some(), "delivered with its body");
}

/// A change remembered without its body is queued first at its version; the list beside
/// the watch then brings the body of that version.
#[test]
fn the_list_beside_the_watch_fills_the_body_of_a_remembered_change() {
    let now = Instant::now();
    let key = key_of("d1", &["d0", "d1"]);
    let mut queue = queue();
    let mut p = Transit::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    p.trim(&during, &mut queue, now);
    p.record(&during, &mut queue, streamed(&key, 7, 1), now);
    let after = fixed("d0", &["d0"]);
    p.trim(&after, &mut queue, now);
    let listed = GroupEvent::Listed {
        key: KeyRef::new(&key),
        object: Observed {
            body: Some(Arc::from(&b"{}"[..])),
            ..seen(7)
        },
        epoch: 1,
    };
    p.record(&after, &mut queue, listed, now);
    let got = handed(&mut queue, now);
    assert_eq!(got.len(), 1);
    assert!(got[0].body.is_some(), "delivered with the listed body");
}

/// In a group that lists the owners itself, a child's change queues an owner served here only
/// if the queue knows the owner's object (a re-list, or the stream); an owner not known yet
/// (its list, or the list beside the stream for owners that just came here, has not shown it)
/// is left to that list, which brings its body, and is not queued without it. A change of an
/// owner a handover holds is remembered, as before, to go first once the handover completes.
#[test]
fn a_childs_change_queues_only_an_owner_the_queue_knows() {
    let now = Instant::now();
    for origin in [Origin::List, Origin::Stream] {
        let mut queue = queue();
        let slice = fixed("d0", &["d0"]);
        let mut p = Transit::new("g", slice.clone(), REMEMBER);
        let owner = "/ConfigMap/ns/owner";
        let changed = || GroupEvent::OwnedChanged {
            key: KeyRef::new(owner),
            origin,
            owners_listed: true,
        };
        assert!(p.record(&slice, &mut queue, changed(), now).is_empty());
        assert!(
            !queue.contains(owner),
            "{origin:?}: an unknown owner is left to its list"
        );

        p.record(&slice, &mut queue, exists(owner, 2, 1), now);
        let first = handed(&mut queue, now);
        assert_eq!(first.len(), 1, "{first:?}");
        queue.ack(1, first[0].id, crate::queue::Outcome::Success, now);
        p.record(&slice, &mut queue, changed(), now);
        let again = handed(&mut queue, now);
        assert_eq!(
            again.len(),
            1,
            "{origin:?}: a known owner is queued: {again:?}"
        );
        assert_eq!(again[0].reason, Reason::Owned);
    }
    // Held by a handover: remembered to go first.
    let mut queue = queue();
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    let mut p = Transit::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
    p.trim(&during, &mut queue, now);
    let moved = key_of("d1", &["d0", "d1"]);
    let changed = GroupEvent::OwnedChanged {
        key: KeyRef::new(&moved),
        origin: Origin::Stream,
        owners_listed: true,
    };
    p.record(&during, &mut queue, changed, now);
    assert_eq!(p.figures().held_changes, 1);
}

/// d1 dies and d0 holds its keys until the wait for it ends. The list a handover's start asks
/// for indexes the held keys; a re-list after a gap of the watch (410 Gone) that does not show
/// one of them reveals its deletion, which nobody else knows (the old owner is dead), and the
/// deletion is delivered once the handover completes.
#[test]
fn a_held_key_deleted_in_a_gap_of_the_watch_is_found_by_the_re_list() {
    let now = Instant::now();
    let (moved, mut queue, mut p, during) = handing_over(4, now);
    // The list beside the stream (epoch 1) shows the first three; the stream shows the
    // fourth created after it.
    for key in &moved[..3] {
        let listed = GroupEvent::Listed {
            key: KeyRef::new(key),
            object: seen(2),
            epoch: 1,
        };
        p.record(&during, &mut queue, listed, now);
    }
    p.record(&during, &mut queue, streamed(&moved[3], 3, 1), now);
    assert_eq!(p.figures().held_keys, 4);
    assert_eq!(taken(&mut queue, now), [], "held: nothing is handed out");
    // The stream shows the third deleted: held as before, and out of the index.
    let deleted = GroupEvent::Deleted {
        key: KeyRef::new(&moved[2]),
        change: Change::deletion(),
    };
    p.record(&during, &mut queue, deleted, now);
    assert_eq!((p.figures().held, p.figures().held_keys), (1, 3));
    // The watch cannot resume: its re-list (epoch 2) shows the second and the fourth.
    for key in [&moved[1], &moved[3]] {
        p.record(&during, &mut queue, exists(key, 4, 2), now);
    }
    p.sweep(&during, &mut queue, (2, |_: &str| true), now);
    assert_eq!((p.figures().held, p.figures().held_keys), (2, 2));
    assert_eq!(taken(&mut queue, now), [], "still held");
    // The handover completes: both deletions go first, then the keys that exist, once the
    // list beside the stream shows them.
    let after = fixed("d0", &["d0"]);
    p.trim(&after, &mut queue, now);
    for key in [&moved[1], &moved[3]] {
        let listed = GroupEvent::Listed {
            key: KeyRef::new(key),
            object: seen(4),
            epoch: 2,
        };
        p.record(&after, &mut queue, listed, now);
    }
    assert_eq!(p.figures().held_keys, 0, "the queue knows them now");
    let mut got = taken(&mut queue, now);
    got[..2].sort();
    let mut expected = vec![(moved[0].clone(), true), (moved[2].clone(), true)];
    expected.sort();
    expected.extend([(moved[1].clone(), false), (moved[3].clone(), false)]);
    assert_eq!(got, expected);
}

/// The index of held keys keeps only keys a handover holds: a key shown while served, kept
/// while nothing is handed out, or owned elsewhere is not entered, and an entry goes when the
/// key moves away again (its new owner lists it) or its sweep is for another subscription.
#[test]
fn the_index_of_held_keys_keeps_only_keys_a_handover_holds() {
    let now = Instant::now();
    let mine = key_of("d0", &["d0", "d1"]);
    let theirs = keys_of("d1", &["d0", "d1", "d2"], 1).remove(0);
    let (moved, mut queue, mut p, during) = handing_over(2, now);
    p.record(&during, &mut queue, streamed(&mine, 1, 1), now);
    for key in &moved {
        p.record(&during, &mut queue, streamed(key, 1, 1), now);
    }
    assert_eq!(p.figures().held_keys, 2, "only the moved keys");
    // A sweep of another subscription's keys leaves them.
    p.sweep(&during, &mut queue, (2, |key: &str| key == mine), now);
    assert_eq!((p.figures().held, p.figures().held_keys), (0, 2));
    // Fenced: the queue keeps what it owns; a key it shows goes there, out of the index.
    let fenced = Arc::new(during.closed());
    p.trim(&fenced, &mut queue, now);
    p.record(&fenced, &mut queue, streamed(&moved[0], 2, 1), now);
    assert_eq!(p.figures().held_keys, 1);
    // The ring flaps back: the moved keys are d1's again, and so is listing them.
    let back = moving("d0", &["d0", "d1", "d2"], &["d0", "d1"]);
    p.trim(&back, &mut queue, now);
    assert_eq!(p.figures().held_keys, 0);
    p.record(&back, &mut queue, streamed(&theirs, 1, 1), now);
    assert_eq!(p.figures().held_keys, 0, "a key owned elsewhere");
}

/// Off its own ring (cut off long enough that its own Lease looks lapsed to it), a dispatcher
/// owns nothing and keeps what it knew: the index of held keys keeps its keys, follows what its
/// watch shows of them, and a re-list's sweep finds only the deletions; nothing that exists is
/// taken for deleted, and the deletion found is delivered once the key is served here again.
#[test]
fn off_its_own_ring_the_index_of_held_keys_keeps_up_with_its_keys() {
    let now = Instant::now();
    let (moved, mut queue, mut p, _) = holding(2, 1, now);
    assert_eq!(p.figures().held_keys, 2);
    let off = Arc::new(Slice::fixed("d0", Ring::new(["d1"])).closed());
    p.trim(&off, &mut queue, now);
    assert_eq!(p.figures().held_keys, 2, "kept off its own ring");
    // The re-list (epoch 2) shows the first only.
    p.record(&off, &mut queue, exists(&moved[0], 2, 2), now);
    p.sweep(&off, &mut queue, (2, |_: &str| true), now);
    assert_eq!(
        (p.figures().held_keys, p.figures().remembered),
        (1, 1),
        "the second's deletion is remembered, the first still known"
    );
    // Back on its ring, serving: only the deletion is delivered ahead of the list.
    let back = fixed("d0", &["d0"]);
    p.trim(&back, &mut queue, now);
    assert_eq!(taken(&mut queue, now), [(moved[1].clone(), true)]);
}

/// d1 leaves a ring of d0 and d1, and d0's handover holds `n` of its keys, each shown by the
/// watch's stream at resourceVersion `rv` in list epoch 1: the keys, d0's queue and transit, and
/// the slice that holds them.
fn holding(n: usize, rv: u32, now: Instant) -> (Vec<String>, GroupQueue, Transit, Arc<Slice>) {
    let (moved, mut queue, mut p, during) = handing_over(n, now);
    for key in &moved {
        p.record(&during, &mut queue, streamed(key, rv, 1), now);
    }
    (moved, queue, p, during)
}

/// d1 leaves a ring of d0 and d1, and d0's handover holds `n` of its keys, none seen yet: the
/// keys, d0's queue and transit, and the slice that holds them.
fn handing_over(n: usize, now: Instant) -> (Vec<String>, GroupQueue, Transit, Arc<Slice>) {
    let moved = keys_of("d1", &["d0", "d1"], n);
    let mut queue = queue();
    let mut p = Transit::new("g", fixed("d0", &["d0", "d1"]), REMEMBER);
    let during = moving("d0", &["d0"], &["d0", "d1"]);
    p.trim(&during, &mut queue, now);
    (moved, queue, p, during)
}
