//! Resyncs, re-lists, related changes, traces, and a name deleted and used again.

use std::{collections::HashMap, num::NonZeroU64, time::Duration};

use super::*;

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

/// Called every housekeeping tick (250 ms) with the default interval (10 minutes), resync
/// reaches each key once per interval, whether the group holds fewer keys than an interval has
/// ticks (rounded up per tick, 4 keys were resynced every second) or more, and never more than
/// a tick's share at once.
#[test]
fn resync_due_resyncs_each_key_once_per_interval() {
    let (tick, interval) = (Duration::from_millis(250), Duration::from_secs(600));
    let ticks = interval.as_millis() / tick.as_millis();
    for keys in [4usize, 3_000] {
        let now = Instant::now();
        let mut q = queue();
        q.add_session(1, "a");
        for i in 0..keys {
            q.change(&format!("k{i}"), change(Reason::Added, 1));
        }
        for d in q.take(1, keys, now) {
            q.ack(1, d.id, Outcome::Success, now);
        }
        let mut resynced: HashMap<String, u32> = HashMap::new();
        let most_at_once = keys.div_ceil(usize::try_from(ticks).unwrap_or(1));
        for _ in 0..2 * ticks {
            q.resync_due(tick, interval);
            let d = q.take(1, 1000, now);
            assert!(
                d.len() <= most_at_once,
                "{} keys resynced in one tick of {keys}",
                d.len()
            );
            for d in d {
                assert_eq!(d.reason, Reason::Resync);
                *resynced.entry(d.key.to_string()).or_default() += 1;
                q.ack(1, d.id, Outcome::Success, now);
            }
        }
        assert_eq!(resynced.len(), keys, "every key of {keys} resynced");
        assert!(
            resynced.values().all(|n| *n == 2),
            "each of {keys} keys resynced once per interval, over two intervals: {:?}",
            resynced.values().max()
        );
    }
}

fn observed(rv: u32) -> Observed {
    Observed {
        resource_version: rv.to_string(),
        uid: "uid-1".into(),
        body: None,
        trace: None,
        fingerprint: None,
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

/// `observed(rv)` with the change filter's hash `fingerprint`.
fn filtered(rv: u32, fingerprint: u64) -> Observed {
    Observed {
        fingerprint: NonZeroU64::new(fingerprint),
        ..observed(rv)
    }
}

#[test]
fn a_change_filter_skips_changes_that_leave_its_parts_as_recorded() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    let key = "/example.com/Site/ns/a";
    q.observe(key, filtered(1, 7), 1);
    let d = q.take(1, 10, now);
    assert_eq!(
        (d.len(), d[0].reason),
        (1, Reason::Added),
        "a creation goes"
    );
    q.ack(1, d[0].id, Outcome::Success, now);

    // A status write: the generation (the hash) is as recorded.
    assert!(q.observe(key, filtered(2, 7), 1).is_empty());
    assert!(q.take(1, 10, now).is_empty(), "not delivered");
    assert_eq!(q.counts.changes_filtered, 1);
    // A spec change: delivered at its version.
    q.observe(key, filtered(3, 8), 1);
    let d = q.take(1, 10, now);
    assert_eq!(
        (d[0].reason, d[0].resource_version.as_str()),
        (Reason::Modified, "3")
    );
    // In flight, a status write is not delivered again after the ack.
    q.observe(key, filtered(4, 8), 1);
    q.ack(1, d[0].id, Outcome::Success, now);
    assert!(q.take(1, 10, now).is_empty(), "filtered while in flight");
    // A re-list showing that version again is no change, and counts nothing.
    q.observe(key, filtered(4, 8), 2);
    assert_eq!(q.counts.changes_filtered, 2);
    // A resync goes, at the version last seen (the reconcile reads at least that).
    q.resync(key);
    let d = q.take(1, 10, now);
    assert_eq!(
        (d[0].reason, d[0].resource_version.as_str()),
        (Reason::Resync, "4")
    );
    q.ack(1, d[0].id, Outcome::Success, now);
    // Waiting to be handed out, a filtered change joins the delivery: its newest version.
    q.observe(key, filtered(5, 9), 1);
    q.observe(key, filtered(6, 9), 1);
    let d = q.take(1, 10, now);
    assert_eq!((d.len(), d[0].resource_version.as_str()), (1, "6"));
    q.ack(1, d[0].id, Outcome::Success, now);
    // Without a filter every change goes.
    q.observe(key, observed(7), 1);
    q.observe(key, observed(8), 1);
    assert_eq!(q.take(1, 10, now)[0].reason, Reason::Modified);
    q.check();
}

#[test]
fn a_change_filter_never_holds_back_a_new_object_of_the_name() {
    let now = Instant::now();
    let mut q = queue();
    q.add_session(1, "a");
    let key = "/example.com/Site/ns/a";
    q.observe(key, filtered(1, 7), 1);
    let d = q.take(1, 10, now);
    q.ack(1, d[0].id, Outcome::Success, now);
    // Deleted and created again with the same generation: both are delivered.
    q.change(key, change(Reason::Deleted, 2));
    let d = q.take(1, 10, now);
    assert!(d[0].deleted);
    q.ack(1, d[0].id, Outcome::Success, now);
    q.observe(
        key,
        Observed {
            uid: "uid-2".into(),
            ..filtered(3, 7)
        },
        1,
    );
    assert_eq!(q.take(1, 10, now)[0].reason, Reason::Added);
}

/// A change the filter skips moves a kept body on to its version: the delivery a child's change
/// causes next carries the object as it is now, not as it was delivered.
#[test]
fn a_filtered_change_moves_a_kept_body_on_to_its_version() {
    let now = Instant::now();
    let mut q = GroupQueue::new(QueueConfig {
        keep_delivered_bodies: true,
        ..queue().config
    });
    q.add_session(1, "a");
    let key = "/example.com/Site/ns/a";
    let body = |text: &str| Some(Arc::<[u8]>::from(text.as_bytes()));
    q.observe(
        key,
        Observed {
            body: body("v1"),
            ..filtered(1, 7)
        },
        1,
    );
    let d = q.take(1, 1, now);
    q.ack(1, d[0].id, Outcome::Success, now);
    // An annotation written: the filtered parts are as recorded, so nothing is delivered.
    q.observe(
        key,
        Observed {
            body: body("v2"),
            ..filtered(2, 7)
        },
        1,
    );
    assert_eq!(q.take(1, 1, now).len(), 0);
    q.change(key, Change::related(Reason::Owned));
    let d = q.take(1, 1, now);
    assert_eq!(
        (
            d[0].reason,
            d[0].resource_version.as_str(),
            d[0].body.as_deref()
        ),
        (Reason::Owned, "2", Some(&b"v2"[..]))
    );
    q.ack(1, d[0].id, Outcome::Success, now);
    q.check();
}
