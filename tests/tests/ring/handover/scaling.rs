//! Dispatchers join, leave, stall and die: keys are handed over without overlap or loss, and a
//! dead member is waited out only as long as its sessions and Lease say.

use super::support::*;

/// Scale 3 to 5 to 2 dispatchers while objects are written continuously: nothing is reconciled
/// twice at once, every final state is reconciled; then one more join with no writes: exactly
/// the keys that moved to the new dispatcher are reconciled again.
#[tokio::test]
async fn scaling_dispatchers_3_to_5_to_2_hands_keys_over_without_overlap_or_loss() -> TestResult {
    let ns = TestNamespace::create("scale").await?;
    let journal = Journal::default();
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let mut ds = start_settled(ns.name(), 3, BOUND).await?;
    // Reconciles take a while, so keys are in flight when the ring moves.
    let work = Duration::from_millis(60);
    let replicas = start_replicas(ns.name(), 2, &lb, &journal, work, TTL)?;
    let (mut placement, _) = placed(&lb, 3, 2, Duration::from_secs(30)).await;

    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (writer, stop) = start_writing(&api, 120, Duration::from_millis(25), &journal).await?;

    let mut moved = Vec::new();
    let mut step = |ds: &BTreeMap<usize, TestDispatcher>, next: Placement, took: Duration| {
        let (before, after) = (edges(&placement), edges(&next));
        let changed = before.symmetric_difference(&after).count();
        moved.push((ds.len(), changed, took));
        placement = next;
    };
    for i in 3..5 {
        journal
            .await_writes(journal.writes_len(), 40, Duration::from_secs(30))
            .await?;
        ds.insert(i, start(ns.name(), i).await?);
        let took = settled(&ds, Duration::from_secs(30)).await;
        let (next, _) = placed(&lb, ds.len(), 2, Duration::from_secs(30)).await;
        step(&ds, next, took);
    }
    for i in [4, 3, 2] {
        journal
            .await_writes(journal.writes_len(), 40, Duration::from_secs(30))
            .await?;
        if let Some(d) = ds.remove(&i) {
            d.stop().await;
        }
        let took = settled(&ds, Duration::from_secs(30)).await;
        let (next, _) = placed(&lb, ds.len(), 2, Duration::from_secs(30)).await;
        step(&ds, next, took);
    }
    journal
        .await_writes(journal.writes_len(), 40, Duration::from_secs(30))
        .await?;
    stop.cancel();
    let writes = writer.await??;
    let finals = assert_finals_reconciled(&api, &journal, Duration::from_secs(30)).await?;
    println!(
        "{writes} writes of {} objects, {} reconciles ({:.2} per write)",
        finals.len(),
        journal.len(),
        journal.len() as f64 / writes as f64
    );
    for (n, changed, took) in &moved {
        println!(
            "-> {n} dispatchers: handover settled in {took:?}, {changed} placement edges changed"
        );
    }

    // A join with no writes: only the keys that move to dispatcher-2 are reconciled again.
    let mark = journal.len();
    ds.insert(2, start(ns.name(), 2).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let ring = Ring::new((0..3).map(name));
    let to_new: BTreeSet<String> = finals
        .keys()
        .filter(|key| {
            let (namespace, object) = key.split_once('/').unwrap_or_default();
            ring.owner(&RequestKey::new("", "ConfigMap", namespace, object)) == Some("dispatcher-2")
        })
        .cloned()
        .collect();
    assert!(!to_new.is_empty());
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        let again: BTreeSet<String> = journal.reconciles()[mark..]
            .iter()
            .map(|r| r.key.clone())
            .collect();
        if to_new.is_subset(&again) || Instant::now() >= deadline {
            break again;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(again, to_new, "exactly the moved keys are resynced");
    println!(
        "join without writes: the {} keys that moved were resynced, no other",
        to_new.len()
    );
    assert_no_overlap(&journal);
    stop_all(replicas, ds, [lb]).await;
    Ok(())
}

/// Every session of the stalled and killed dispatcher is held by an SDK replica: asked by the
/// survivors once the victim's Lease has expired (2 s + 0.5 s grace), each cancels the
/// session's reconciles, waits for them, and reports the session ended; the survivors take the
/// keys over then, well before the handover bound, with no overlap.
#[tokio::test]
async fn a_stalled_then_killed_dispatchers_keys_are_taken_over_once_its_sessions_are_reported_ended()
-> TestResult {
    let (took, victim) = stalled_then_killed("kill-reported", false).await?;
    let expiry = Duration::from_millis(2500);
    // Its Lease was last renewed up to 0.4 s before the kill.
    assert!(
        took >= expiry - Duration::from_millis(400),
        "{victim} taken over after {took:?}, before its Lease expired"
    );
    assert!(
        took < expiry + Duration::from_secs(6),
        "{victim} taken over after {took:?}: the survivors waited out the bound (6 s) instead of the reports"
    );
    Ok(())
}

/// The same with one session of the victim held by a client that never reports it: the
/// survivors wait out the handover bound, as the fallback for a replica that is silent.
#[tokio::test]
async fn a_stalled_then_killed_dispatchers_keys_wait_for_the_bound_while_a_session_is_unreported()
-> TestResult {
    let (took, victim) = stalled_then_killed("kill-silent", true).await?;
    let floor = Duration::from_millis(2500) + Duration::from_secs(6);
    assert!(
        took >= floor - Duration::from_millis(400),
        "{victim} taken over after {took:?}, before the bound"
    );
    assert!(
        took <= floor + Duration::from_secs(10),
        "takeover took {took:?}"
    );
    Ok(())
}

/// A dispatcher is killed (kill -9) while reconciles it handed out run, and started again at
/// once at the same address, as a StatefulSet restarts its pod: its new process finds its Lease
/// unreleased, so its previous process may have left reconciles running. It tells the replicas
/// so; each, once the reconciles of the session it held there have returned, reports that
/// session ended, and the new process serves the keys once every session its previous process
/// listed is reported, long before the handover bound (20 s); no reconcile overlaps.
#[tokio::test]
async fn a_killed_and_restarted_dispatcher_serves_once_its_previous_sessions_are_reported_ended()
-> TestResult {
    let (took, victim) = killed_and_restarted("restart-reported", false).await?;
    assert!(
        took < Duration::from_secs(8),
        "{victim}'s new process served {took:?} after it started: it waited out the bound (20 s) instead of the reports"
    );
    Ok(())
}

/// The same with one session of the killed process held by a client that never reports it:
/// the new process waits out the handover bound, the fallback for a replica that is silent
/// (or runs an SDK older than the report).
#[tokio::test]
async fn a_killed_and_restarted_dispatcher_waits_out_the_bound_while_a_session_is_unreported()
-> TestResult {
    let (took, victim) = killed_and_restarted("restart-silent", true).await?;
    assert!(
        took >= RESTART_BOUND - Duration::from_millis(500),
        "{victim}'s new process served {took:?} after it started, before the bound"
    );
    assert!(
        took <= RESTART_BOUND + Duration::from_secs(10),
        "it served only {took:?} after it started"
    );
    Ok(())
}

const RESTART_BOUND: Duration = Duration::from_secs(20);

/// Three dispatchers with handover bound [`RESTART_BOUND`], three SDK replicas running 3 s
/// reconciles; the owner of a key being reconciled is killed and started again at its address,
/// with `silent` a client's session there that was handed keys and never reports. Checks that
/// no reconcile overlaps and every final state is reconciled; returns how long after its start
/// the new process served, and the victim.
async fn killed_and_restarted(label: &str, silent: bool) -> TestResult<(Duration, String)> {
    kube_dispatch_tests::log_to_file_from_env();
    let ns = TestNamespace::create(label).await?;
    let journal = Journal::default();
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let mut ds = start_settled(ns.name(), 3, RESTART_BOUND).await?;
    let work = Duration::from_secs(3);
    let replicas = start_replicas(ns.name(), 3, &lb, &journal, work, TTL)?;
    placed(&lb, 3, 3, Duration::from_secs(30)).await;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    write_round(&api, 9, 0, &journal).await?;
    let (victim_index, victim_name) = owner_of_a_running_key(&journal).await?;
    let _silent = if silent {
        Some(silent_session(&ds[&victim_index], ns.name()).await?)
    } else {
        None
    };
    let victim = ds.remove(&victim_index).ok_or("the victim runs")?;
    let addr = victim.addr.to_string();
    let running = journal
        .running()
        .into_iter()
        .filter(|r| owner_of_three(&r.key).as_deref() == Some(victim_name.as_str()))
        .count();
    assert!(running > 0, "a reconcile of the victim's keys runs");
    // Killed once its Lease lists the sessions open on it and no other: a session a replica
    // closed with nothing in flight (the replicas' placement still moves as they start) leaves
    // the Lease with the next write, within 200 ms; killed before that, the new process would
    // wait for a report that replica, no longer assigned the victim, has no reason to send,
    // and wait out the bound.
    let sessions = victim.handles.groups.lease_sessions();
    eventually(
        Duration::from_secs(5),
        format!("{victim_name}'s Lease listing exactly its open sessions"),
        || async { (!sessions.unwritten()).then_some(()) },
    )
    .await?;
    victim.kill();
    let started = Instant::now();
    let restarted = restart_at(ns.name(), victim_index, &addr, RESTART_BOUND, None).await?;
    ds.insert(victim_index, restarted);
    settled(&ds, RESTART_BOUND + Duration::from_secs(20)).await;
    let took = started.elapsed();
    write_round(&api, 9, 1, &journal).await?;
    assert_finals_reconciled(&api, &journal, Duration::from_secs(60)).await?;
    println!(
        "{victim_name} killed with {running} reconciles of its keys running, restarted at once: its new process served {took:?} after it started (bound {RESTART_BOUND:?}); no overlap; all final states reconciled"
    );
    stop_all(replicas, ds, [lb]).await;
    Ok((took, victim_name))
}

/// A session that ends with nothing in flight leaves the Lease with the dispatcher's next
/// write, and its replica, which closed it, would have no reason to report it
/// (`dispatcher/HANDOVER.md`, "Ending the wait for a member that died, by reports"). So a close
/// is answered once that write is accepted, and a replica asks again a close not confirmed. A
/// lone dispatcher is killed and started again at its address twice, after such a close each
/// time:
///
/// - the close is answered, and the Lease lists the session no more: the new process serves
///   at once, with no session of its previous process to wait for;
/// - its connection to the API server stalls as the session closes: the close is answered
///   UNAVAILABLE (the Lease may still list it), the client asks again as the SDK does, and the
///   new process takes that close as the session's report and serves long before the bound.
#[tokio::test]
async fn a_close_is_confirmed_once_the_lease_drops_the_session_or_its_next_process_takes_it_as_a_report()
-> TestResult {
    kube_dispatch_tests::log_to_file_from_env();
    const CLOSE_BOUND: Duration = Duration::from_secs(20);
    let ns = TestNamespace::create("close-confirmed").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    api.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "cm-0"}}))?,
    )
    .await?;
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    let first = config(ns.name(), 0, CLOSE_BOUND);
    let d = TestDispatcher::start_with(first, "127.0.0.1:0", Some(proxy.addr), None).await?;
    let mut ds = BTreeMap::from([(0, d)]);
    let mut proxy = Some(proxy);
    let mut took = Vec::new();
    for stalled in [false, true] {
        settled(&ds, Duration::from_secs(30)).await;
        let d = &ds[&0];
        let subscriptions = vec![subscription("v1", "ConfigMap", ns.name())];
        let mut session = TestSession::open(d, "close", "close-0", subscriptions).await?;
        // Handed a key: an accepted write lists the session. Every key is acknowledged.
        let got = session
            .collect_until(Duration::from_secs(20), |got| !got.is_empty())
            .await;
        assert!(!got.is_empty(), "the session is handed the key");
        let sessions = d.handles.groups.lease_sessions();
        if stalled {
            proxy.as_ref().ok_or("the proxy runs")?.set(Fault::Stall);
        }
        // Every key acknowledged: closed as the SDKs close a drained session.
        let close = CloseSessionRequest {
            session_id: session.id.clone(),
            reconciles_ended: true,
        };
        let answer = session.client.close_session(close.clone()).await;
        if stalled {
            let status = answer.expect_err("no Lease write goes through: not confirmed");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
            assert!(sessions.unwritten(), "the Lease may still list the session");
        } else {
            answer?;
            assert!(
                !sessions.unwritten(),
                "confirmed: an accepted write lists the session no more"
            );
        }
        let victim = ds.remove(&0).ok_or("the dispatcher runs")?;
        let addr = victim.addr.to_string();
        victim.kill();
        // The stalled write must not reach the API server late: the next process reaches it
        // directly.
        let api_via = if stalled {
            proxy.take();
            None
        } else {
            proxy.as_ref().map(|p| p.addr)
        };
        let restarted = restart_at(ns.name(), 0, &addr, CLOSE_BOUND, api_via).await?;
        let started = Instant::now();
        ds.insert(0, restarted);
        if stalled {
            closed_again_as_the_sdks_do(&session, &close, &ds[&0]).await?;
        }
        settled(&ds, CLOSE_BOUND + Duration::from_secs(20)).await;
        took.push(started.elapsed());
    }
    println!(
        "the new process served {:?} after it started with the close confirmed, {:?} with it confirmed by the new process (bound {CLOSE_BOUND:?})",
        took[0], took[1]
    );
    for (i, took) in took.iter().enumerate() {
        assert!(
            *took < CLOSE_BOUND / 2,
            "restart {i}: the new process served only after {took:?}: it waited for the closed session"
        );
    }
    for (_, d) in ds {
        d.stop().await;
    }
    Ok(())
}

/// The same through the SDK: a lone dispatcher's connection to the API server stalls, so its
/// Lease lapses and the load balancer assigns it to nobody; the replica closes its session
/// there with nothing in flight, the dispatcher cannot confirm the close, and the replica asks
/// again (`close_again`). The load balancer then stops, so the replica is not assigned the
/// dispatcher again (assigned again, it would report the session on its new session there),
/// and the dispatcher is killed and started again at its address: its next process takes the
/// repeated close as the session's report and serves long before the bound.
#[tokio::test]
async fn a_replica_closes_again_until_the_next_process_takes_the_close_as_a_report() -> TestResult {
    kube_dispatch_tests::log_to_file_from_env();
    const CLOSE_BOUND: Duration = Duration::from_secs(20);
    let ns = TestNamespace::create("close-again").await?;
    let journal = Journal::default();
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    let first = config(ns.name(), 0, CLOSE_BOUND);
    let d = TestDispatcher::start_with(first, "127.0.0.1:0", Some(proxy.addr), None).await?;
    let mut ds = BTreeMap::from([(0, d)]);
    settled(&ds, Duration::from_secs(30)).await;
    let replicas = start_replicas(ns.name(), 1, &lb, &journal, Duration::ZERO, TTL)?;
    write_round(&api, 3, 0, &journal).await?;
    assert_finals_reconciled(&api, &journal, Duration::from_secs(30)).await?;
    proxy.set(Fault::Stall);
    let groups = ds[&0].handles.groups.clone();
    eventually(
        Duration::from_secs(20),
        "the replica closing its session on the dispatcher whose Lease lapsed",
        || async { (groups.session_count() == 0).then_some(()) },
    )
    .await?;
    assert!(
        groups.lease_sessions().unwritten(),
        "no Lease write lists the closed session no more"
    );
    lb.stop().await;
    let victim = ds.remove(&0).ok_or("the dispatcher runs")?;
    let addr = victim.addr.to_string();
    victim.kill();
    drop(proxy);
    let restarted = restart_at(ns.name(), 0, &addr, CLOSE_BOUND, None).await?;
    let started = Instant::now();
    ds.insert(0, restarted);
    settled(&ds, CLOSE_BOUND + Duration::from_secs(20)).await;
    let took = started.elapsed();
    println!("the new process served {took:?} after it started (bound {CLOSE_BOUND:?})");
    assert!(
        took < CLOSE_BOUND / 2,
        "the new process served only after {took:?}: it waited for the session the replica closed"
    );
    assert_eq!(
        ds[&0].handles.groups.session_count(),
        0,
        "the replica was not assigned the dispatcher again"
    );
    stop_all(replicas, ds, []).await;
    Ok(())
}

/// The close of `session` asked again of `restarted`, the next process of the dispatcher that
/// held it: a close that does not say the session's reconciles ended is NOT_FOUND and leaves
/// the new process waiting; asked as the SDKs ask it, the close is confirmed.
async fn closed_again_as_the_sdks_do(
    session: &TestSession,
    close: &CloseSessionRequest,
    restarted: &TestDispatcher,
) -> TestResult {
    // A close that does not say the session's reconciles ended is no report.
    let unsure = CloseSessionRequest {
        reconciles_ended: false,
        ..close.clone()
    };
    eventually(
        Duration::from_secs(5),
        "the new process answering NOT_FOUND to a close with reconciles running",
        || {
            let (mut client, unsure) = (session.client.clone(), unsure.clone());
            async move {
                let answer = client.close_session(unsure).await;
                matches!(answer, Err(s) if s.code() == tonic::Code::NotFound).then_some(())
            }
        },
    )
    .await?;
    assert!(
        !restarted.handles.slice.borrow().is_settled(),
        "the new process still waits for the session"
    );
    // As the SDKs do (`close_again`): asked again until confirmed; the new process
    // answers UNAVAILABLE until it knows what its previous process listed.
    eventually(
        Duration::from_secs(5),
        "the new process confirming the close",
        || {
            let (mut client, close) = (session.client.clone(), close.clone());
            async move { client.close_session(close).await.ok() }
        },
    )
    .await?;
    Ok(())
}

/// A dispatcher stops answering while reconciles it handed out run, and its Lease is deleted by
/// hand ([`DeletedLease`]): a Lease deleted without its holder's drained mark is a member that
/// died, so the survivors take its keys over only once the handover bound has passed, never at
/// once (they did within 160 ms, taking it for a clean release); no reconcile it started
/// overlaps one of theirs, nothing is lost.
#[tokio::test]
async fn a_deleted_lease_of_a_stalled_dispatcher_is_waited_out() -> TestResult {
    let mut t = DeletedLease::start("deleted-lease").await?;
    let took = taken_over(&t.api, &t.ds, &t.journal, t.victim.take(), t.deleted_at).await?;
    let bound = DeletedLease::BOUND;
    assert!(
        took >= bound - Duration::from_millis(400),
        "taken over {took:?} after the Lease was deleted, before the bound {bound:?}"
    );
    assert!(
        took <= bound + Duration::from_secs(10),
        "takeover took {took:?}"
    );
    println!(
        "{} stalled with {} reconciles of its keys running, its Lease deleted: survivors took its slice over {took:?} after the deletion (bound {bound:?}); no overlap; all final states reconciled",
        t.victim_name, t.running
    );
    stop_all(t.replicas, t.ds, [t.lb]).await;
    drop(t.ns);
    Ok(())
}

/// As above, and a dispatcher joins while the survivors wait the dead member out (a new
/// member, as a scale-up or a survivor restarted with a drained Lease would be). It never saw
/// the dead member, whose Lease is gone: only the survivors, which release no ring while they
/// wait, keep it from serving the dead member's keys at once. It settles only after the bound;
/// no reconcile overlaps, nothing is lost.
#[tokio::test]
async fn a_dispatcher_joining_while_a_deleted_lease_is_waited_out_waits_too() -> TestResult {
    let mut t = DeletedLease::start("deleted-lease-join").await?;
    let bound = DeletedLease::BOUND;
    // The survivors release no ring while they wait the dead member out, and list no sessions
    // as all they handed keys to: were one to die too, the joiner, which never saw the dead
    // member, would end its wait for that one by reports, beside the dead member's reconciles.
    let deadline = Instant::now() + Duration::from_secs(5);
    for i in t.ds.keys() {
        let leases = &t.leases;
        eventually(
            deadline.saturating_duration_since(Instant::now()),
            format!(
                "{} releasing no ring and listing its sessions as overflow while it waits out {}",
                name(*i),
                t.victim_name
            ),
            || async move {
                match leases.get(&name(*i)).await {
                    Ok(lease)
                        if !lease.annotations().contains_key(RELEASED_ANNOTATION)
                            && lease
                                .annotations()
                                .get(SESSIONS_ANNOTATION)
                                .map(String::as_str)
                                == Some(SESSIONS_OVERFLOW) =>
                    {
                        Some(Ok(lease))
                    }
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            },
        )
        .await??;
    }
    let joiner = TestDispatcher::start(config(t.ns.name(), 3, bound)).await?;
    let want: Vec<String> = t.ds.keys().map(|i| name(*i)).chain([name(3)]).collect();
    let mut slice = joiner.handles.slice.clone();
    // The Ref `wait_for` returns holds the slice's lock: drop it at once.
    let settled_in_time = tokio::time::timeout(
        Duration::from_secs(30),
        slice.wait_for(|s| s.ring.members() == want.as_slice() && s.is_settled()),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(settled_in_time, "the joiner never settled");
    let joined = t.deleted_at.elapsed();
    assert!(
        joined >= bound - Duration::from_millis(400),
        "the joiner served the dead member's keys {joined:?} after its Lease was deleted, before the bound {bound:?}"
    );
    t.ds.insert(3, joiner);
    let took = taken_over(&t.api, &t.ds, &t.journal, t.victim.take(), t.deleted_at).await?;
    println!(
        "{} stalled, its Lease deleted, dispatcher-3 joined at once: it settled {joined:?} after the deletion, every survivor {took:?} after (bound {bound:?}); no overlap; all final states reconciled",
        t.victim_name
    );
    stop_all(t.replicas, t.ds, [t.lb]).await;
    drop(t.ns);
    Ok(())
}
