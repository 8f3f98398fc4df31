//! The load balancer's replicas come and go, and its standby takes over.

use super::support::*;

/// Replicas join and leave (one is killed), then the load-balancer leader is killed: placement
/// converges each time, a standby takes over, and reconciles never stop.
#[tokio::test]
async fn replicas_come_and_go_and_the_load_balancer_fails_over() -> TestResult {
    let ns = TestNamespace::create("lb-failover").await?;
    let journal = Journal::default();
    let mut first = TestLoadBalancer::start(ns.name()).await?;
    assert!(first.leads_within(Duration::from_secs(15)).await);
    let mut second = TestLoadBalancer::start(ns.name()).await?;
    assert!(!second.leads());
    let ds = start_settled(ns.name(), 3, BOUND).await?;
    // Replicas are pointed at the standby: it redirects them to the leader.
    let work = Duration::from_millis(10);
    let r0 = JournalReplica::new(ns.name(), GROUP, "replica-0", &journal)
        .load_balancer(second.addr)
        .work(work)
        .ttl(TTL)
        .isolated()?;
    let (_, _) = placed(&first, 3, 1, Duration::from_secs(30)).await;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (writer, stop) = start_writing(&api, 40, Duration::from_millis(50), &journal).await?;

    let r1 = JournalReplica::new(ns.name(), GROUP, "replica-1", &journal)
        .load_balancer(second.addr)
        .work(work)
        .ttl(TTL)
        .isolated()?;
    let r2 = JournalReplica::new(ns.name(), GROUP, "replica-2", &journal)
        .load_balancer(second.addr)
        .work(work)
        .ttl(TTL)
        .isolated()?;
    let (_, joined) = placed(&first, 3, 3, Duration::from_secs(30)).await;
    r0.kill();
    journal.killed("replica-0");
    let (_, left) = placed(&first, 3, 2, Duration::from_secs(30)).await;

    let failover_at = Instant::now();
    first.kill();
    assert!(
        second.leads_within(Duration::from_secs(15)).await,
        "the standby never took over"
    );
    let took_lead = failover_at.elapsed();
    let (_, rebuilt) = placed(&second, 3, 2, Duration::from_secs(30)).await;
    // Keep writing a little under the new leader.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    writer.await??;
    assert_finals_reconciled(&api, &journal, Duration::from_secs(30)).await?;
    let delays: Vec<Duration> = journal.delays().into_iter().map(|(_, d)| d).collect();
    let worst = delays.iter().max().copied().unwrap_or_default();
    let during_failover = journal
        .delays()
        .into_iter()
        .filter(|(w, _)| w.at >= failover_at)
        .map(|(_, d)| d)
        .max()
        .unwrap_or_default();
    // A killed replica's keys wait for its sessions to expire (3 s ttl); nothing else should
    // hold a write back that long. Generous for a loaded machine.
    assert!(
        worst < Duration::from_secs(15),
        "a write waited {worst:?} for its reconcile"
    );
    println!(
        "replicas joined: placement converged in {joined:?}; replica killed: converged in {left:?} (grace 2 s); load balancer leader killed: standby led after {took_lead:?}, placement rebuilt {rebuilt:?} later; longest write-to-reconcile delay {worst:?} overall, {during_failover:?} during the failover"
    );
    stop_all([r1, r2], ds, [second]).await;
    Ok(())
}

/// A load balancer stopped gracefully (as in a rolling update) releases its leader Lease, and
/// the standby takes over at once: not when the Lease would have expired, a whole Lease
/// duration later, while controllers find no leader to place them.
#[tokio::test]
async fn a_standby_load_balancer_takes_over_as_soon_as_the_leader_releases() -> TestResult {
    let ns = TestNamespace::create("lb-release").await?;
    let lease = Duration::from_secs(60);
    let mut first = TestLoadBalancer::start_with_lease(ns.name(), lease).await?;
    assert!(first.leads_within(Duration::from_secs(15)).await);
    let mut second = TestLoadBalancer::start_with_lease(ns.name(), lease).await?;
    // The Lease is held for another minute. The standby's election reads it as it starts; were
    // that read to come only after the release below, it would find the Lease free and take it
    // at once too (which is no less right, but proves less).
    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    let held = leases.get("kube-dispatch-loadbalancer").await?;
    assert_eq!(holder(held), Some(first.addr.to_string()));
    assert!(!second.leads());
    let released = Instant::now();
    first.stop().await;
    assert!(
        second.leads_within(Duration::from_secs(20)).await,
        "the standby did not take over within 20 s of the release (the Lease lasts {lease:?})"
    );
    let taken = leases.get("kube-dispatch-loadbalancer").await?;
    assert_eq!(holder(taken), Some(second.addr.to_string()));
    println!(
        "the standby led {:?} after the leader was told to stop",
        released.elapsed()
    );
    second.stop().await;
    Ok(())
}

/// A standby load balancer that takes over (a rolling update of the load balancers) places
/// every replica where the old leader had: the replicas register again saying which
/// dispatchers they poll, and it places nobody until they are back (its settle, 3 s here), so
/// no assignment changes and no session moves. The old leader placed them one at a time, which
/// ends elsewhere than placing both at once from scratch.
#[tokio::test]
async fn a_new_load_balancer_leader_keeps_every_replica_where_it_was() -> TestResult {
    let (ns, _api) = with_configmaps("lb-keeps", 10).await?;
    let ds = start_settled(ns.name(), 3, BOUND).await?;
    let lease = Duration::from_secs(60);
    let mut first = TestLoadBalancer::start_settling(ns.name(), lease, Duration::ZERO).await?;
    assert!(first.leads_within(Duration::from_secs(15)).await);
    let mut second =
        TestLoadBalancer::start_settling(ns.name(), lease, Duration::from_secs(3)).await?;
    let journal = Journal::default();
    // Registered through the standby, which names the leader: once the leader stops, the
    // standby is where the replicas register again. One, then the other.
    let replica = |i: usize| {
        JournalReplica::new(ns.name(), GROUP, &format!("replica-{i}"), &journal)
            .load_balancer(second.addr)
            .ttl(TTL)
            .isolated()
    };
    let mut replicas = vec![replica(0)?];
    placed(&first, 3, 1, Duration::from_secs(30)).await;
    replicas.push(replica(1)?);
    let (before, _) = placed(&first, 3, 2, Duration::from_secs(30)).await;
    let names = |n: usize, of: &str| (0..n).map(|i| format!("{of}-{i}")).collect::<Vec<_>>();
    let scratch = kube_dispatch_loadbalancer::placement::place(
        &names(3, "dispatcher"),
        &names(2, "replica"),
        &Placement::new(),
    );
    assert_ne!(
        before, scratch,
        "placed one at a time as from scratch: the test would prove nothing"
    );
    let took_over = Instant::now();
    first.stop().await;
    assert!(second.leads_within(Duration::from_secs(20)).await);
    let deadline = Instant::now() + Duration::from_secs(20);
    while second.handles.registry.figures().assignments < 2 {
        assert!(
            Instant::now() < deadline,
            "the new leader never assigned both replicas"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (after, _) = placed(&second, 3, 2, Duration::from_secs(5)).await;
    assert_eq!(
        after, before,
        "the new leader placed the replicas elsewhere"
    );
    assert_eq!(
        second.handles.registry.figures().moves,
        0,
        "an assignment the new leader sent changed"
    );
    println!(
        "the new leader placed both replicas where they were, {:?} after the old one was told to stop",
        took_over.elapsed()
    );
    stop_all(replicas, ds, [second]).await;
    Ok(())
}

/// A leader whose Lease is taken from it (another holder written in, as a standby that took an
/// expired Lease would) stops leading when it sees that, not at its next renewal a Lease
/// duration later: two load balancers never place replicas side by side for long.
#[tokio::test]
async fn a_load_balancer_whose_lease_is_taken_stops_leading_at_once() -> TestResult {
    let ns = TestNamespace::create("lb-taken").await?;
    let mut lb = TestLoadBalancer::start_with_lease(ns.name(), Duration::from_secs(60)).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    let taken = serde_json::json!({ "spec": { "holderIdentity": "another-load-balancer:7071" } });
    leases
        .patch(
            "kube-dispatch-loadbalancer",
            &PatchParams::default(),
            &Patch::Merge(&taken),
        )
        .await?;
    let mut leading = lb.handles.leading.clone();
    // Not the borrow `wait_for` returns: held on, it would block the load balancer's own
    // update of the channel when it stops.
    let stepped_down = tokio::time::timeout(Duration::from_secs(20), leading.wait_for(|l| !*l))
        .await
        .is_ok_and(|waited| waited.is_ok());
    assert!(
        stepped_down,
        "still leading 20 s after its Lease was taken (it renews 55 s after taking it)"
    );
    lb.stop().await;
    Ok(())
}

/// A leader renews its Lease once a renew period (the Lease duration less the grace), and not
/// more: the Lease's writes, counted by a watch of it over several periods once the leader's
/// first renewal is past. (The election once cut its Lease manager's renewal short at the
/// renewal's own watch event, and the manager renewed again at once, about 13 times a second
/// for as long as it led.)
#[tokio::test]
async fn a_leading_load_balancer_renews_its_lease_once_a_renew_period() -> TestResult {
    let ns = TestNamespace::create("lb-renewals").await?;
    // Renewed every 2 s: 3 s less the test load balancers' grace of 1 s.
    let mut lb = TestLoadBalancer::start_with_lease(ns.name(), Duration::from_secs(3)).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    let window = Duration::from_secs(9);
    // 9 s at one renewal each 2 s: 4 or 5, and the Lease as it stood at the start; 7 at most.
    let versions = lease_versions(leases, "kube-dispatch-loadbalancer", window, 7).await?;
    for lease in versions.values() {
        assert_eq!(
            lease.spec.as_ref().and_then(|s| s.holder_identity.clone()),
            Some(lb.addr.to_string()),
            "the Lease changed hands"
        );
    }
    assert!(
        versions.len() >= 4,
        "only {} versions of the Lease within {window:?}: the leader does not renew it every 2 s",
        versions.len()
    );
    println!(
        "{} versions of the leader Lease in {window:?}",
        versions.len()
    );
    lb.stop().await;
    Ok(())
}

/// The only load balancer is killed (no standby: both of its pods lost), and a dispatcher joins
/// while none leads. Replicas given the dispatchers' Service look it up once registration has
/// failed for 10 s and poll the joiner beside what they were assigned, so the keys that move to
/// it are reconciled with no load balancer to place anyone: every final state reconciled, no two
/// reconciles of a key at once. (Without the Service, nobody would poll the joiner: its keys
/// would wait for a load balancer.) The test node has no cluster DNS; the resolver is the
/// Service's endpoints as the test keeps them.
#[tokio::test]
async fn replicas_without_a_load_balancer_poll_a_joining_dispatcher_found_in_the_service()
-> TestResult {
    use std::{
        net::SocketAddr,
        sync::{Arc, Mutex},
    };

    use kube_dispatch_controller::DispatcherService;

    let (ns, api) = with_configmaps("lb-none", 0).await?;
    let journal = Journal::default();
    let mut ds = start_settled(ns.name(), 2, BOUND).await?;
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let endpoints: Arc<Mutex<Vec<SocketAddr>>> =
        Arc::new(Mutex::new(ds.values().map(|d| d.addr).collect()));
    let service = {
        let endpoints = endpoints.clone();
        DispatcherService::with_resolver("kube-dispatch-dispatcher.test.svc:7070", move |_| {
            let now = endpoints.lock().expect("not poisoned").clone();
            async move { Ok(now) }
        })
    };
    let replicas = (0..2)
        .map(|i| {
            JournalReplica::new(ns.name(), GROUP, &format!("replica-{i}"), &journal)
                .load_balancer(lb.addr)
                .dispatcher_service(service.clone())
                .work(Duration::from_millis(10))
                .ttl(TTL)
                .isolated()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // One dispatcher each: the Service then adds the other one as well as the joiner.
    let (before, _) = placed(&lb, 2, 2, Duration::from_secs(30)).await;
    assert!(before.values().all(|ds| ds.len() == 1), "{before:?}");
    let (writer, stop) = start_writing(&api, 40, Duration::from_millis(50), &journal).await?;

    lb.kill();
    let killed = Instant::now();
    ds.insert(2, start(ns.name(), 2).await?);
    endpoints.lock().expect("not poisoned").push(ds[&2].addr);
    // The ring moves without a load balancer: the joiner owns its keys from here on.
    let joined = settled(&ds, Duration::from_secs(30)).await;
    let polled_by = |d: &TestDispatcher| -> Vec<String> {
        d.handles
            .groups
            .named(GROUP)
            .iter()
            .flat_map(|g| g.replicas())
            .collect()
    };
    eventually(
        Duration::from_secs(40),
        "both replicas polling the joiner",
        || std::future::ready((polled_by(&ds[&2]) == ["replica-0", "replica-1"]).then_some(())),
    )
    .await?;
    let found = killed.elapsed();
    // Writes go on under the three, with no load balancer.
    let written = journal.writes_len();
    journal
        .await_writes(written, 40, Duration::from_secs(30))
        .await?;
    stop.cancel();
    writer.await??;
    assert_finals_reconciled(&api, &journal, Duration::from_secs(30)).await?;
    // The joiner's keys were reconciled, so someone polled it.
    let owned_by_joiner = Journal::finals(&api)
        .await?
        .into_keys()
        .filter(|key| owner_of_three(key).as_deref() == Some("dispatcher-2"))
        .count();
    assert!(owned_by_joiner > 0, "the joiner owns none of the 40 keys");
    let worst = journal
        .delays()
        .into_iter()
        .filter(|(w, _)| w.at >= killed)
        .map(|(_, d)| d)
        .max()
        .unwrap_or_default();
    println!(
        "load balancer killed: the ring of three settled {joined:?} after the join, both replicas polled the joiner {found:?} after the kill (the Service is looked up once registration has failed for 10 s); it owns {owned_by_joiner} of 40 keys; longest write-to-reconcile delay after the kill {worst:?}"
    );
    stop_all(replicas, ds, Vec::<TestLoadBalancer>::new()).await;
    Ok(())
}
