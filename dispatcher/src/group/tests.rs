use kube_dispatch_proto::{RequestKey, Ring, v1::Reason};

use super::*;
use kube_dispatch_core::{
    backoff::Backoff,
    handover::LeaseDeadline,
    key::KeyRef,
    queue::{Change, Observed, Outcome},
    subscription::GroupSpec,
    transit::{GroupEvent, Origin},
};

fn group(cancel: &CancellationToken) -> Arc<Group> {
    let config = QueueConfig {
        backoff: Backoff {
            base: Duration::from_secs(10),
            cap: Duration::from_secs(60),
        },
        max_reconcile_time: Duration::from_secs(30),
        body_budget: 0,
        memo_budget: 1 << 20,
        keep_delivered_bodies: false,
    };
    let slice = Slice::fixed("d0", kube_dispatch_proto::Ring::new(["d0"]));
    Group::spawn(
        GroupId::shared("g"),
        GroupSpec::new(Vec::new()),
        config,
        Pools::unbounded(),
        RecentDeletionsConfig::NONE,
        watch::channel(Arc::new(slice)).1,
        cancel.clone(),
    )
}

fn modified() -> Change {
    Change {
        reason: Reason::Modified,
        resource_version: "1".into(),
        uid: String::new(),
        body: None,
        deleted: false,
        trace: None,
    }
}

/// A deletion of a key owned elsewhere is remembered; when the ring gives the key here it
/// is held, and delivered once the handover completes. A key whose object came back is not.
#[tokio::test(start_paused = true)]
async fn deletions_of_keys_that_move_here_are_delivered_after_the_handover() {
    let cancel = CancellationToken::new();
    let two = Slice::fixed("d0", Ring::new(["d0", "d1"]));
    let (tx, rx) = watch::channel(Arc::new(two.clone()));
    let g = Group::spawn(
        GroupId::shared("g"),
        GroupSpec::new(Vec::new()),
        QueueConfig::default(),
        Pools::unbounded(),
        RecentDeletionsConfig {
            window: Duration::from_secs(60),
            capacity: 16,
        },
        rx,
        cancel.clone(),
    );
    g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
        .unwrap();
    // Two keys d1 owns on the ring of two.
    let of_d1: Vec<String> = (0..100)
        .map(|i| format!("/ConfigMap/ns/cm-{i}"))
        .filter(|k| !two.owns_str(k))
        .take(2)
        .collect();
    let [gone, back] = <[String; 2]>::try_from(of_d1).expect("d1 owns keys");
    let deleted = || Change {
        reason: Reason::Deleted,
        deleted: true,
        ..modified()
    };
    for key in [&gone, &back] {
        g.record(GroupEvent::Deleted {
            key: KeyRef::from(key),
            change: deleted(),
        });
    }
    // The object of `back` is created again.
    let name = back.trim_start_matches("/ConfigMap/ns/");
    g.record(GroupEvent::ExistsElsewhere {
        key: KeyRef::from(&RequestKey::new("", "ConfigMap", "ns", name).to_string()),
        object: Observed {
            resource_version: "9".into(),
            uid: "u9".into(),
            body: None,
            trace: None,
            fingerprint: None,
        },
        epoch: 0,
        origin: Origin::List,
    });
    assert!(
        g.take(1, 10, usize::MAX).is_empty(),
        "nothing of d1's is delivered here"
    );

    // d1 dies: d0 owns its keys but holds them until the handover completes.
    let mut held = two.clone();
    held.ring = Arc::new(Ring::new(["d0"]));
    tx.send_replace(Arc::new(held.clone()));
    g.trim_to_slice();
    assert!(
        g.take(1, 10, usize::MAX).is_empty(),
        "held until the handover completes"
    );

    // d1 flaps back before the handover completes: the key moves away again, its deletion
    // is remembered as one owned elsewhere, and moves back with the key.
    tx.send_replace(Arc::new(two.clone()));
    g.trim_to_slice();
    assert!(
        g.take(1, 10, usize::MAX).is_empty(),
        "nothing of d1's is delivered here"
    );
    tx.send_replace(Arc::new(held.clone()));
    g.trim_to_slice();

    held.settled = Some(held.ring.clone());
    tx.send_replace(Arc::new(held));
    g.trim_to_slice();
    let got: Vec<(String, bool)> = g
        .take(1, 10, usize::MAX)
        .iter()
        .map(|d| (d.key.clone(), d.deleted))
        .collect();
    assert_eq!(got, vec![(gone, true)]);
    cancel.cancel();
}

/// The watch shows `key`'s object at `rv`.
fn exists(g: &Group, key: &str, rv: &str) {
    g.record(GroupEvent::Exists {
        key: KeyRef::from(key),
        object: observed(rv),
        epoch: 1,
        origin: Origin::List,
    });
}

/// A list beside the watch shows `key`'s object at `rv`.
fn listed(g: &Group, key: &str, rv: &str) {
    g.record(GroupEvent::Listed {
        key: KeyRef::from(key),
        object: observed(rv),
        epoch: 1,
    });
}

fn observed(rv: &str) -> Observed {
    Observed {
        resource_version: rv.into(),
        uid: "u".into(),
        body: None,
        trace: None,
        fingerprint: None,
    }
}

/// Delivered (key, reason, resourceVersion), each acknowledged.
fn take_all(g: &Group) -> Vec<(String, Reason, String)> {
    let got = g.take(1, 100, usize::MAX);
    let acks = got
        .iter()
        .map(|d| (d.id, Outcome::Success).into())
        .collect();
    g.ack(1, acks);
    got.iter()
        .map(|d| (d.key.clone(), d.reason, d.resource_version.clone()))
        .collect()
}

/// A list beside the watch's stream may be older than what the stream showed: it adds only
/// keys served here of which the group knows no version, and never undoes what it knows.
#[tokio::test(start_paused = true)]
async fn a_list_beside_the_stream_adds_only_keys_not_known() {
    let cancel = CancellationToken::new();
    let two = Slice::fixed("d0", Ring::new(["d0", "d1"]));
    let g = Group::spawn(
        GroupId::shared("g"),
        GroupSpec::new(Vec::new()),
        QueueConfig::default(),
        Pools::unbounded(),
        RecentDeletionsConfig::NONE,
        watch::channel(Arc::new(two.clone())).1,
        cancel.clone(),
    );
    g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
        .unwrap();
    let mine: Vec<String> = (0..100)
        .map(|i| format!("/ConfigMap/ns/cm-{i}"))
        .filter(|k| two.owns_str(k))
        .take(4)
        .collect();
    let elsewhere = (0..100)
        .map(|i| format!("/ConfigMap/ns/cm-{i}"))
        .find(|k| !two.owns_str(k))
        .expect("d1 owns a key");
    let [seen, gone, owner, new] = <[String; 4]>::try_from(mine).expect("d0 owns keys");
    exists(&g, &seen, "5");
    g.record(GroupEvent::Deleted {
        key: KeyRef::from(&gone),
        change: Change::deletion(),
    });
    g.record(GroupEvent::OwnedChanged {
        key: KeyRef::from(&owner),
        origin: Origin::List,
        owners_listed: false,
    });
    assert_eq!(take_all(&g).len(), 3);

    listed(&g, &seen, "3");
    listed(&g, &elsewhere, "3");
    listed(&g, &owner, "4");
    listed(&g, &new, "6");
    let mut got = take_all(&g);
    got.sort();
    assert_eq!(
        got,
        vec![
            (owner.clone(), Reason::Added, "4".into()),
            (new.clone(), Reason::Added, "6".into()),
        ],
        "only the key never seen and the owner known only by an owned object's change"
    );
    // What the list added is known now: an older list adds nothing again.
    listed(&g, &new, "6");
    assert!(take_all(&g).is_empty());
    cancel.cancel();
}

/// An object that others name changes: shown by the watch's stream, the objects naming it
/// are reconciled ahead of the keys a list brought (the live lane); shown by a list, they
/// wait behind them (the listed lane).
#[tokio::test(start_paused = true)]
async fn a_named_objects_change_on_the_stream_goes_ahead_of_listed_keys() {
    let cancel = CancellationToken::new();
    let g = group(&cancel);
    g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
        .unwrap();
    let (streamed, relisted) = ("/ConfigMap/ns/by-stream", "/ConfigMap/ns/by-list");
    let (secret, other) = ("/Secret/ns/streamed", "/Secret/ns/relisted");
    exists(&g, streamed, "1");
    exists(&g, relisted, "1");
    g.names(streamed, vec![secret.into()], 1, false);
    g.names(relisted, vec![other.into()], 1, false);
    for target in [secret, other] {
        g.named_object_seen(target, "1", 1, false, Origin::Stream);
    }
    assert_eq!(take_all(&g).len(), 2, "both referrers reconciled once");

    let brought: Vec<String> = (0..3)
        .map(|i| format!("/ConfigMap/ns/listed-{i}"))
        .collect();
    for key in &brought {
        listed(&g, key, "1");
    }
    g.named_object_seen(other, "2", 1, false, Origin::List);
    g.named_object_seen(secret, "2", 1, false, Origin::Stream);
    let got: Vec<(String, Reason)> = take_all(&g)
        .into_iter()
        .map(|(key, reason, _)| (key, reason))
        .collect();
    let mut want = vec![(streamed.to_owned(), Reason::Referenced)];
    want.extend(brought.into_iter().map(|k| (k, Reason::Added)));
    want.push((relisted.to_owned(), Reason::Referenced));
    assert_eq!(got, want);
    cancel.cancel();
}

/// A group of no subscription on the slices `rx` sends, with one session (replica `a`).
fn one_session_group(rx: watch::Receiver<Arc<Slice>>, cancel: &CancellationToken) -> Arc<Group> {
    let g = Group::spawn(
        GroupId::shared("g"),
        GroupSpec::new(Vec::new()),
        QueueConfig::default(),
        Pools::unbounded(),
        RecentDeletionsConfig::NONE,
        rx,
        cancel.clone(),
    );
    g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
        .unwrap();
    g
}

/// A settled slice whose Lease deadline has passed hands out nothing: a process paused
/// past its Lease answers no poll from its old slice before its membership loop has run.
#[tokio::test(start_paused = true)]
async fn nothing_is_handed_out_past_the_lease_deadline() {
    let cancel = CancellationToken::new();
    let now = std::time::Instant::now();
    let lease = Arc::new(LeaseDeadline::expired(now));
    let mut slice = Slice::fixed("d0", Ring::new(["d0"]));
    slice.lease = lease.clone();
    let (_tx, rx) = watch::channel(Arc::new(slice));
    let g = one_session_group(rx, &cancel);
    exists(&g, "k", "1");
    assert!(take_all(&g).is_empty(), "the Lease was never renewed");
    lease.extend_to(now + Duration::from_secs(3600));
    assert_eq!(take_all(&g).len(), 1, "a current Lease hands the key out");
    cancel.cancel();
}

/// While nothing may be handed out, a key kept in the index records the versions its
/// events show, and the changes of objects it owns, and is handed out once the gate opens:
/// no list shows it again then.
#[tokio::test(start_paused = true)]
async fn a_kept_key_records_new_versions_while_nothing_is_handed_out() {
    let cancel = CancellationToken::new();
    let settled = Slice::fixed("d0", Ring::new(["d0"]));
    let (tx, rx) = watch::channel(Arc::new(settled.clone()));
    let g = one_session_group(rx, &cancel);
    exists(&g, "k", "1");
    exists(&g, "owner", "1");
    assert_eq!(take_all(&g).len(), 2);

    let mut fenced = settled.clone();
    fenced.settled = None;
    tx.send_replace(Arc::new(fenced));
    g.trim_to_slice();
    exists(&g, "k", "2");
    exists(&g, "new", "2");
    g.record(GroupEvent::OwnedChanged {
        key: KeyRef::from("owner"),
        origin: Origin::List,
        owners_listed: false,
    });
    assert!(
        take_all(&g).is_empty(),
        "nothing is handed out while fenced"
    );

    tx.send_replace(Arc::new(settled));
    g.trim_to_slice();
    let mut got = take_all(&g);
    got.sort();
    assert_eq!(
        got,
        vec![
            ("k".to_owned(), Reason::Modified, "2".to_owned()),
            ("new".to_owned(), Reason::Added, "2".to_owned()),
            ("owner".to_owned(), Reason::Owned, "1".to_owned()),
        ],
        "the kept keys' changes, and a key it owns seen meanwhile, once the gate is open again"
    );
    cancel.cancel();
}

/// The driver fires a retry exactly when its backoff ends, and wakes the session's poll.
#[tokio::test(start_paused = true)]
async fn timers_fire_on_time_and_wake_the_session() {
    let cancel = CancellationToken::new();
    let g = group(&cancel);
    let (slot, _) = g
        .add_session(1, "s1".into(), "a", Duration::from_secs(60), None)
        .unwrap();
    exists(&g, "k", "1");
    let d = g.take(1, 10, usize::MAX);
    assert_eq!(d.len(), 1);
    let failed_at = Instant::now();
    assert_eq!(g.ack(1, vec![(d[0].id, Outcome::Failure).into()]), 0);
    // Consume the permit the first enqueue left, then wait for the retry's wake-up.
    slot.notify.notified().await;
    assert!(
        g.take(1, 10, usize::MAX).is_empty(),
        "not before the backoff"
    );
    tokio::time::timeout(Duration::from_secs(60), slot.notify.notified())
        .await
        .expect("the retry wakes the session");
    assert_eq!(failed_at.elapsed(), Duration::from_secs(10));
    let retry = g.take(1, 10, usize::MAX);
    assert_eq!((retry[0].reason, retry[0].attempt), (Reason::Retry, 1));
    cancel.cancel();
}

/// An unacknowledged delivery is void after the maximum reconcile time.
#[tokio::test(start_paused = true)]
async fn an_unacknowledged_delivery_expires_on_time() {
    let cancel = CancellationToken::new();
    let g = group(&cancel);
    g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
        .unwrap();
    exists(&g, "k", "1");
    let d = g.take(1, 10, usize::MAX);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(g.ack(1, vec![]), 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        g.ack(1, vec![(d[0].id, Outcome::Success).into()]),
        1,
        "the delivery expired"
    );
    cancel.cancel();
}

/// An owner whose children a watch is listing waits, ready, for that list to end, and is then
/// handed out with its children complete; a list still running `OWNER_WAITS_FOR_CHILDREN`
/// after it began holds it no longer: it is handed out with them incomplete. A key of another
/// kind never waits, nor does an owner's deletion.
#[tokio::test(start_paused = true)]
async fn an_owner_waits_a_bounded_time_for_the_list_of_its_children() {
    let cancel = CancellationToken::new();
    let g = group(&cancel);
    g.add_session(1, "s1".into(), "a", Duration::from_secs(600), None)
        .unwrap();
    let index = Arc::new(ChildIndex::default());
    index.follow(g.slice.borrow().clone());
    let secrets = kube_dispatch_core::subscription::OwnerKind {
        group: String::new(),
        version: "v1".into(),
        kind: "Secret".into(),
        namespaced: true,
    };
    g.owns_from(secrets, index.clone());
    let (owner, other) = ("/Secret/ns/owner", "/ConfigMap/ns/other");
    let taken = |g: &Group| {
        let taken = g.take_with_children(1, 10, usize::MAX);
        let acks = taken
            .deliveries
            .iter()
            .map(|(d, _)| (d.id, Outcome::Success).into())
            .collect();
        g.ack(1, acks);
        let got: Vec<(String, Option<bool>)> = taken
            .deliveries
            .iter()
            .map(|(d, of)| (d.key.clone(), of.as_ref().map(|of| of.complete)))
            .collect();
        (got, taken.look_again)
    };

    // The watch's first list runs: the owner waits, the other key does not.
    let began = Group::now();
    index.step_done(began);
    exists(&g, owner, "1");
    exists(&g, other, "1");
    let (got, again) = taken(&g);
    assert_eq!(got, [(other.to_owned(), None)]);
    assert_eq!(again, Some(began + OWNERS_LOOKED_AT_AGAIN));
    // It ends: the owner comes with its children complete, and nothing waits.
    tokio::time::advance(Duration::from_millis(200)).await;
    index.own_list_running(false);
    index.step_done(Group::now());
    assert_eq!(taken(&g), (vec![(owner.to_owned(), Some(true))], None));

    // A re-list that runs past the bound: the owner waits until then, no longer.
    index.own_list_running(true);
    let began = Group::now();
    index.step_done(began);
    exists(&g, owner, "2");
    tokio::time::advance(OWNER_WAITS_FOR_CHILDREN - Duration::from_millis(10)).await;
    index.step_done(Group::now());
    let (got, again) = taken(&g);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(again, Some(began + OWNER_WAITS_FOR_CHILDREN));
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(taken(&g), (vec![(owner.to_owned(), Some(false))], None));

    // A deletion goes at once, while the list still runs.
    g.record(GroupEvent::Deleted {
        key: KeyRef::from(owner),
        change: Change::deletion(),
    });
    let (got, _) = taken(&g);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, owner);
    cancel.cancel();
}
