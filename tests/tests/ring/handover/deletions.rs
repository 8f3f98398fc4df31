//! Deletions in transit: made while a key's dispatcher is dead, restarting, cut off from its
//! peers or handing the key over, each is delivered by the key's next owner.

use super::support::*;

/// Deletions are not lost in transit: a deletion the old owner had queued is delivered by it
/// before it releases the ring, and a deletion that happens while the new owner holds the
/// moved keys is delivered by the new owner once the handover completes (a re-list cannot show
/// it).
#[tokio::test]
async fn deletions_in_transit_are_delivered() -> TestResult {
    let two = Ring::new((0..2).map(name));
    let moving = |ns: &str| names_owned_by(&two, ns, 30, "dispatcher-1");
    // Enough keys move to dispatcher-1.
    let (ns, api) =
        with_configmaps_where("deletions-in-transit", 30, |ns| moving(ns).len() >= 3).await?;
    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    let moving = moving(ns.name());
    let mut ds = BTreeMap::new();
    // The test's raw sessions sit idle while the other one is driven: give them a ttl no
    // loaded machine outlasts (no member dies here, so the longer bound costs nothing).
    let patient = |i: usize| {
        let mut c = config(ns.name(), i, Duration::from_secs(30));
        c.settings.limits.default_ttl = Duration::from_secs(30);
        c
    };
    ds.insert(0, TestDispatcher::start(patient(0)).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open(&ds[&0], GROUP, "replica-0", subs()).await?;
    let all = s0
        .collect_until(Duration::from_secs(20), |got| got.len() >= 30)
        .await;
    assert_eq!(all.len(), 30);

    // Hold one moving key in flight on dispatcher-0, so it cannot release the ring; queue a
    // deletion of another moving key there; then let dispatcher-1 join.
    api.patch(
        &moving[0],
        &PatchParams::apply("t").force(),
        &Patch::Apply(
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"x": "1"}}),
        ),
    )
    .await?;
    let held = s0.hold(Duration::from_secs(10)).await?;
    assert_eq!(
        held.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        [key(&moving[0])]
    );
    api.delete(&moving[1], &DeleteParams::default()).await?;
    // Queued before the join: seen by dispatcher-0's watch while it still owns the key (seen
    // after it adopts the ring with dispatcher-1, it is also a deletion remembered for the new
    // owner, which delivers it too).
    let d0 = &ds[&0];
    eventually(
        Duration::from_secs(10),
        "dispatcher-0's watch showing the deletion",
        || async { (d0.watch_total(|c| &c.deleted) >= 1).then_some(()) },
    )
    .await?;
    // The joiner lists alone: a list shared with dispatcher-0 may be one it made before the
    // deletion (kept for late readers a second after its end), and a watch from it shows the
    // joiner the deletion again, which it then delivers too (CONTRACT.md, "Deletions").
    let mut joiner = patient(1);
    joiner.share_lists = false;
    ds.insert(1, TestDispatcher::start(joiner).await?);
    let mut s1 = TestSession::open(&ds[&1], GROUP, "replica-1", subs()).await?;
    // dispatcher-1 waits for dispatcher-0's release; meanwhile another moving key is deleted.
    let mut slice1 = ds[&1].handles.slice.clone();
    tokio::time::timeout(
        Duration::from_secs(30),
        slice1.wait_for(|s| s.ring.members().len() == 2),
    )
    .await??;
    assert!(!ds[&1].handles.slice.borrow().is_settled());
    api.delete(&moving[2], &DeleteParams::default()).await?;

    // dispatcher-0 delivers the deletion it had queued, though the key has moved.
    let from0 = s0
        .collect_until(Duration::from_secs(10), |got| {
            got.iter().any(|r| r.key == key(&moving[1]))
        })
        .await;
    let d1 = from0.iter().find(|r| r.key == key(&moving[1]));
    assert!(
        d1.is_some_and(|r| r.deleted),
        "queued deletion delivered by the old owner: {from0:?}"
    );
    // Acking the held key releases the ring; dispatcher-1 completes its handover and delivers
    // the deletion that happened meanwhile.
    s0.ack(&[held[0].delivery_id]).await?;
    settled(&ds, Duration::from_secs(30)).await;
    let from1 = s1
        .collect_until(Duration::from_secs(10), |got| {
            got.iter().any(|r| r.key == key(&moving[2]))
        })
        .await;
    let d2 = from1.iter().find(|r| r.key == key(&moving[2]));
    assert!(
        d2.is_some_and(|r| r.deleted),
        "held deletion delivered by the new owner: {from1:?}"
    );
    assert!(
        from1.iter().all(|r| r.key != key(&moving[1])),
        "the deletion the old owner delivered is not delivered twice"
    );
    stop_all([], ds, []).await;
    Ok(())
}

/// A deletion made while its key's dispatcher lies dead, before the survivors have noticed, is
/// delivered by the key's new owner once it takes the slice over: the key was never in the new
/// owner's index and a re-list cannot show a deletion, so only the deletions it remembered of
/// keys owned elsewhere can tell it.
#[tokio::test]
async fn a_deletion_while_its_dispatcher_is_dead_is_delivered_by_the_new_owner() -> TestResult {
    const OBJECTS: usize = 60;
    let three = Ring::new((0..3).map(name));
    // Keys of dispatcher-1 that go to dispatcher-0 when it dies: at least one.
    let (ns, api) = with_configmaps_where("deleted-while-dead", OBJECTS, |ns| {
        !from_one_to_zero(ns, OBJECTS).is_empty()
    })
    .await?;
    let moving = from_one_to_zero(ns.name(), OBJECTS);
    let mut ds = start_settled(ns.name(), 3, BOUND).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open(&ds[&0], GROUP, "replica-0", subs()).await?;
    let mine = names_owned_by(&three, ns.name(), OBJECTS, "dispatcher-0").len();
    let first = s0
        .collect_until(Duration::from_secs(20), |got| got.len() >= mine)
        .await;
    assert_eq!(first.len(), mine, "dispatcher-0 delivers its own keys");

    // kill -9, then delete at once: the survivors still see dispatcher-1's Lease as live.
    let killed_at = Instant::now();
    if let Some(d) = ds.remove(&1) {
        d.kill();
    }
    api.delete(&moving[0], &DeleteParams::default()).await?;
    let key = format!("/ConfigMap/{}/{}", ns.name(), moving[0]);
    expect_deletion(
        &mut s0,
        &key,
        Duration::from_secs(30),
        "while dispatcher-1 was dead",
    )
    .await;
    println!(
        "deletion made right after dispatcher-1's kill delivered by dispatcher-0 {:?} after the kill (lease 2 s + grace 0.5 s + bound {BOUND:?})",
        killed_at.elapsed()
    );
    stop_all([], ds, []).await;
    Ok(())
}

/// A dispatcher killed and restarted before the others drop it from the ring: no key moves, and
/// its new process starts with an empty key index, so a deletion of one of its keys made while
/// it was down reaches a controller only because its new process asks its peers for the
/// deletions they remembered of its keys.
#[tokio::test]
async fn a_deletion_while_its_dispatcher_restarts_is_delivered_by_its_new_process() -> TestResult {
    let (ns, api, of_victim) = victim_of_three("deleted-while-restarting").await?;
    let mut ds = start_settled(ns.name(), 3, BOUND).await?;
    let _sessions = sessions_of_three(&ds, ns.name(), &of_victim).await?;

    let killed_at = Instant::now();
    if let Some(d) = ds.remove(&1) {
        d.kill();
    }
    api.delete(&of_victim[0], &DeleteParams::default()).await?;
    ds.insert(1, start(ns.name(), 1).await?);
    restarted_delivers(
        &ds,
        ns.name(),
        &of_victim[0],
        "replica-1",
        "while dispatcher-1 restarted",
    )
    .await?;
    println!(
        "deletion made while dispatcher-1 restarted delivered by its new process {:?} after the kill (its predecessor's reconciles waited out: bound {BOUND:?})",
        killed_at.elapsed()
    );
    stop_all([], ds, []).await;
    Ok(())
}

/// As above, but the first OpenSession to the restarted dispatcher gives up (a replica killed,
/// a client deadline) while the group it made waits for its watch's first list, which a stalled
/// path to the API server holds back. The call that makes a group is the one that has it ask
/// the peers for the deletions they remember; it must finish that even when its caller is gone,
/// or the group (made, and found by the next session) never asks and the deletion is lost.
#[tokio::test]
async fn a_deletion_while_its_dispatcher_restarts_is_delivered_even_if_the_first_open_gives_up()
-> TestResult {
    let (ns, api, of_victim) = victim_of_three("deleted-first-open-gone").await?;
    let mut ds = start_settled(ns.name(), 3, BOUND).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let _sessions = sessions_of_three(&ds, ns.name(), &of_victim).await?;

    if let Some(d) = ds.remove(&1) {
        d.kill();
    }
    api.delete(&of_victim[0], &DeleteParams::default()).await?;
    // Its new process reaches the API server through a proxy, stalled once it has started. It
    // lists alone: a list a peer made for it (`--share-lists`) would come by another path.
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    let mut restarted = config(ns.name(), 1, BOUND);
    restarted.share_lists = false;
    ds.insert(
        1,
        TestDispatcher::start_with(restarted, "127.0.0.1:0", Some(proxy.addr), None).await?,
    );
    // Another group, watching the same ConfigMaps through a selector (a watch of its own),
    // has the new process resolve the resource first: the open below then waits only for its
    // own watch's list.
    let warm = Subscription {
        label_selector: "kube-dispatch.dev/warm-up=1".into(),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let _warm = TestSession::open(&ds[&1], "warm-up", "replica-w", vec![warm]).await?;
    proxy.set(Fault::Stall);
    let first = tokio::time::timeout(
        Duration::from_millis(500),
        TestSession::open(&ds[&1], GROUP, "replica-1", subs()),
    )
    .await;
    assert!(
        first.is_err(),
        "the first open must give up while the group's watch lists"
    );
    proxy.set(Fault::None);
    restarted_delivers(
        &ds,
        ns.name(),
        &of_victim[0],
        "replica-1b",
        "while dispatcher-1 restarted, its first session abandoned",
    )
    .await?;
    stop_all([], ds, []).await;
    Ok(())
}

/// A deletion made the instant a handover completes, of a key that moved to the joining
/// dispatcher: its watch's stream must still be running then, since the list that finds the
/// keys that moved is older than the deletion or newer, and shows neither way that it happened.
/// The joining dispatcher reaches the API server over a slow path (60 ms a hop), so its
/// list starts well after the deletion; a watch that restarted to list would never see it.
#[tokio::test]
async fn a_deletion_as_a_handover_completes_is_delivered() -> TestResult {
    let two = Ring::new([name(0), name(1)]);
    let moving = |ns: &str| names_owned_by(&two, ns, 30, "dispatcher-1");
    // A key moves to dispatcher-1.
    let (ns, api) =
        with_configmaps_where("deleted-at-handover", 30, |ns| !moving(ns).is_empty()).await?;
    let moving = moving(ns.name());
    let mut ds = start_settled(ns.name(), 1, BOUND).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open(&ds[&0], GROUP, "replica-0", subs()).await?;
    let first = s0
        .collect_until(Duration::from_secs(20), |got| got.len() >= 30)
        .await;
    assert_eq!(first.len(), 30, "dispatcher-0 delivers every key");

    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    proxy.set(Fault::Latency(Duration::from_millis(60)));
    let joining = TestDispatcher::start_with(
        config(ns.name(), 1, BOUND),
        "127.0.0.1:0",
        Some(proxy.addr),
        None,
    )
    .await?;
    // The group is served on dispatcher-1 before the handover completes (so it has asked its
    // peers for their remembered deletions already, and will not again).
    let mut s1 = TestSession::open(&joining, GROUP, "replica-1", subs()).await?;
    let key = format!("/ConfigMap/{}/{}", ns.name(), moving[0]);
    let delete_at_handover = async {
        let mut slice = joining.handles.slice.clone();
        tokio::time::timeout(
            Duration::from_secs(30),
            slice.wait_for(|s| s.settled.as_ref().is_some_and(|r| r.members().len() == 2)),
        )
        .await
        .expect("dispatcher-1 completes its handover")
        .expect("dispatcher-1 runs");
        api.delete(&moving[0], &DeleteParams::default())
            .await
            .expect("the key is deleted");
        Instant::now()
    };
    let ((), deleted_at) = tokio::join!(
        expect_deletion(
            &mut s1,
            &key,
            Duration::from_secs(30),
            "as dispatcher-1's handover completed",
        ),
        delete_at_handover,
    );
    println!(
        "deletion made as the handover completed delivered by dispatcher-1 {:?} later",
        deleted_at.elapsed()
    );
    ds.insert(1, joining);
    stop_all([], ds, []).await;
    Ok(())
}

/// As above, but the peers cannot be reached when the restarted dispatcher first asks them (a
/// network cut between dispatchers): it asks again until they answer, so the deletion is still
/// delivered once the cut ends.
#[tokio::test]
async fn a_deletion_while_its_dispatcher_restarts_is_delivered_after_a_cut_between_peers()
-> TestResult {
    let (ns, api, of_victim) = victim_of_three("deleted-while-peers-cut").await?;
    // Dispatchers 0 and 2 advertise a proxy in front of them: the path their peers take.
    let mut proxies = BTreeMap::new();
    let mut ds = BTreeMap::new();
    for i in [0, 2] {
        let proxy = FaultProxy::start("127.0.0.1:1".parse()?).await?;
        let d = TestDispatcher::start_with(
            config(ns.name(), i, BOUND),
            "127.0.0.1:0",
            None,
            Some(proxy.addr.to_string()),
        )
        .await?;
        proxy.retarget(d.addr);
        proxies.insert(i, proxy);
        ds.insert(i, d);
    }
    ds.insert(1, start(ns.name(), 1).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let _sessions = sessions_of_three(&ds, ns.name(), &of_victim).await?;

    for proxy in proxies.values() {
        proxy.set(Fault::Cut);
    }
    if let Some(d) = ds.remove(&1) {
        d.kill();
    }
    api.delete(&of_victim[0], &DeleteParams::default()).await?;
    ds.insert(1, start(ns.name(), 1).await?);
    let mut s1 = TestSession::open(&ds[&1], GROUP, "replica-1", subs()).await?;
    let key = format!("/ConfigMap/{}/{}", ns.name(), of_victim[0]);
    // Its new process serves its keys again (after the bound for its predecessor's
    // reconciles) while its peers are still unreachable: the deletion cannot be known yet.
    let mut slice = ds[&1].handles.slice.clone();
    tokio::time::timeout(Duration::from_secs(30), slice.wait_for(|s| s.is_settled())).await??;
    // (Briefly: the peers remember a deletion only for the transit window, 5.9 s here, and
    // most of it went by while the predecessor's reconciles were waited out.)
    let meanwhile = s1
        .collect_until(Duration::from_millis(500), |got| {
            got.iter().any(|r| r.key == key)
        })
        .await;
    assert!(
        !meanwhile.iter().any(|r| r.key == key && r.deleted),
        "the deletion is known only to the unreachable peers"
    );
    let healed_at = Instant::now();
    for proxy in proxies.values() {
        proxy.set(Fault::None);
    }
    expect_deletion(
        &mut s1,
        &key,
        Duration::from_secs(30),
        "while dispatcher-1 restarted, its peers cut off",
    )
    .await;
    println!(
        "deletion learnt from peers cut off at first delivered {:?} after the cut ended",
        healed_at.elapsed()
    );
    stop_all([], ds, []).await;
    Ok(())
}
