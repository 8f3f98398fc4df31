//! What the tests of this module share.

pub(super) use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
pub(super) use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
pub(super) use kube_dispatch_core::{handover::Slice, queue::KeyState};
pub(super) use kube_dispatch_dispatcher::config::ServeConfig;
pub(super) use kube_dispatch_loadbalancer::placement::Placement;
pub(super) use kube_dispatch_proto::{
    RequestKey, Ring,
    lease::{RELEASED_ANNOTATION, SESSIONS_ANNOTATION, SESSIONS_OVERFLOW},
    v1::{CloseSessionRequest, Subscription},
};
pub(super) use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
    eventually,
    faultproxy::{Fault, FaultProxy},
    isolated::Isolated,
    journal::{Journal, JournalReplica, write_configmaps, write_round},
    leases::lease_versions,
    loadbalancer::TestLoadBalancer,
};
pub(super) use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};
pub(super) use tokio::time::Instant;
pub(super) use tokio_util::sync::CancellationToken;

/// `T` of the test dispatchers: their longest session ttl and reconcile time.
pub(super) const BOUND: Duration = Duration::from_secs(3);

/// Session ttl of the test replicas.
pub(super) const TTL: Duration = Duration::from_secs(3);

pub(super) const GROUP: &str = "journal";

pub(super) fn name(i: usize) -> String {
    format!("dispatcher-{i}")
}

pub(super) fn config(namespace: &str, i: usize, bound: Duration) -> ServeConfig {
    lease_config(namespace, &name(i), bound)
}

pub(super) async fn start(namespace: &str, i: usize) -> TestResult<TestDispatcher> {
    Ok(TestDispatcher::start(config(namespace, i, BOUND)).await?)
}

/// Starts dispatcher `i` again at `address`, where a process of it was killed a moment ago,
/// reaching the API server through `api` when given: the killed runtime lets go of its
/// listener as its tasks drop, so the address is tried again while it is in use, for 5 s.
pub(super) async fn restart_at(
    namespace: &str,
    i: usize,
    address: &str,
    bound: Duration,
    api: Option<std::net::SocketAddr>,
) -> TestResult<TestDispatcher> {
    let began = Instant::now();
    loop {
        match TestDispatcher::start_with(config(namespace, i, bound), address, api, None).await {
            Ok(d) => return Ok(d),
            Err(e)
                if began.elapsed() < Duration::from_secs(5) && e.to_string().contains("in use") =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Starts dispatchers `0..n` with handover bound `bound` and waits until they have settled.
pub(super) async fn start_settled(
    namespace: &str,
    n: usize,
    bound: Duration,
) -> TestResult<BTreeMap<usize, TestDispatcher>> {
    let mut ds = BTreeMap::new();
    for i in 0..n {
        ds.insert(i, TestDispatcher::start(config(namespace, i, bound)).await?);
    }
    let took = settled(&ds, Duration::from_secs(30)).await;
    println!("{n} dispatchers settled in {took:?}");
    Ok(ds)
}

/// Starts writing ConfigMaps `cm-0..count` (created, then one updated every `period`) and waits
/// until the creations have been reconciled, so the writes are going before anything moves.
pub(super) async fn start_writing(
    api: &Api<ConfigMap>,
    count: usize,
    period: Duration,
    journal: &Journal,
) -> Result<
    (
        tokio::task::JoinHandle<Result<usize, kube_dispatch_tests::FixtureError>>,
        CancellationToken,
    ),
    kube_dispatch_tests::FixtureError,
> {
    let stop = CancellationToken::new();
    let writer = tokio::spawn(write_configmaps(
        api.clone(),
        count,
        period,
        journal.clone(),
        stop.clone(),
    ));
    kube_dispatch_tests::eventually(
        Duration::from_secs(60),
        format!("{count} creations reconciled"),
        || std::future::ready((journal.len() >= count).then_some(())),
    )
    .await?;
    Ok((writer, stop))
}

/// Starts replicas `replica-0..n` of the journal controller, registered with `lb`.
pub(super) fn start_replicas(
    namespace: &str,
    n: usize,
    lb: &TestLoadBalancer,
    journal: &Journal,
    work: Duration,
    ttl: Duration,
) -> Result<Vec<Isolated>, kube_dispatch_tests::FixtureError> {
    (0..n)
        .map(|i| {
            let replica = format!("replica-{i}");
            JournalReplica::new(namespace, GROUP, &replica, journal)
                .load_balancer(lb.addr)
                .work(work)
                .ttl(ttl)
                .isolated()
        })
        .collect()
}

/// Stops everything gracefully.
pub(super) async fn stop_all(
    replicas: impl IntoIterator<Item = Isolated>,
    ds: BTreeMap<usize, TestDispatcher>,
    lbs: impl IntoIterator<Item = TestLoadBalancer>,
) {
    for r in replicas {
        r.stop().await;
    }
    for (_, d) in ds {
        d.stop().await;
    }
    for lb in lbs {
        lb.stop().await;
    }
}

/// Waits until every dispatcher of `ds` sees exactly the members `want` and has completed its
/// handover; returns how long that took.
pub(super) async fn settled(ds: &BTreeMap<usize, TestDispatcher>, timeout: Duration) -> Duration {
    let begin = Instant::now();
    let want: Vec<String> = ds.keys().map(|i| name(*i)).collect();
    for (i, d) in ds {
        let mut slice = d.handles.slice.clone();
        // The Ref `wait_for` returns is a read lock on the slice: kept while `borrow` reads it
        // again, it deadlocks with the dispatcher's next write, which waits between the two.
        let reached = tokio::time::timeout_at(
            begin + timeout,
            slice.wait_for(|s| s.ring.members() == want.as_slice() && s.is_settled()),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        let now = d.handles.slice.borrow().clone();
        assert!(
            reached,
            "{} never settled on {want:?}: it sees {:?}, settled on {:?}",
            name(*i),
            now.ring.members(),
            now.settled.as_ref().map(|s| s.members().to_vec())
        );
    }
    begin.elapsed()
}

pub(super) fn edges(p: &Placement) -> BTreeSet<(String, String)> {
    p.iter()
        .flat_map(|(r, ds)| ds.iter().map(move |d| (r.clone(), d.clone())))
        .collect()
}

/// Waits until the load balancer's placement of the group covers exactly `dispatchers` with
/// exactly `replicas`; returns it and the time it took.
pub(super) async fn placed(
    lb: &TestLoadBalancer,
    dispatchers: usize,
    replicas: usize,
    timeout: Duration,
) -> (Placement, Duration) {
    let begin = Instant::now();
    loop {
        let placement = lb
            .handles
            .registry
            .placements()
            .into_iter()
            .find_map(|(id, placement)| (id.name == GROUP).then_some(placement))
            .unwrap_or_default();
        let covered: BTreeSet<&String> = placement.values().flatten().collect();
        if placement.len() == replicas
            && covered.len() == dispatchers
            && placement.values().all(|ds| !ds.is_empty())
        {
            return (placement, begin.elapsed());
        }
        assert!(
            begin.elapsed() < timeout,
            "placement never covered {dispatchers} dispatchers with {replicas} replicas: {placement:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every final state of `api`'s ConfigMaps is reconciled within `within`, and no two
/// reconciles of one key overlapped; returns the final resourceVersions.
pub(super) async fn assert_finals_reconciled(
    api: &Api<ConfigMap>,
    journal: &Journal,
    within: Duration,
) -> TestResult<BTreeMap<String, u64>> {
    let finals = Journal::finals(api).await?;
    let missing = journal.await_reconciled(&finals, within).await;
    assert!(
        missing.is_empty(),
        "final states never reconciled: {missing:?}"
    );
    assert_no_overlap(journal);
    Ok(finals)
}

pub(super) fn assert_no_overlap(journal: &Journal) {
    let overlaps = journal.overlaps();
    assert!(
        overlaps.is_empty(),
        "{} pairs of reconciles of one key overlapped, e.g. {:?}",
        overlaps.len(),
        overlaps.first()
    );
}

/// A namespace of its own holding ConfigMaps `cm-0..count`, and their API.
pub(super) async fn with_configmaps(
    prefix: &str,
    count: usize,
) -> TestResult<(TestNamespace, Api<ConfigMap>)> {
    with_configmaps_where(prefix, count, |_| true).await
}

/// As [`with_configmaps`], in the first namespace whose name `accept` takes: how the keys fall
/// on a ring depends on the namespace's name, so a test that needs keys to move a certain way
/// says so here.
pub(super) async fn with_configmaps_where(
    prefix: &str,
    count: usize,
    accept: impl Fn(&str) -> bool,
) -> TestResult<(TestNamespace, Api<ConfigMap>)> {
    let ns = TestNamespace::create_where(prefix, accept).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    write_round(&api, count, 0, &Journal::default()).await?;
    Ok((ns, api))
}

/// A namespace of its own holding ConfigMaps `cm-0..30`, their API, and the names of those
/// dispatcher-1 owns on the ring of three (at least one).
pub(super) async fn victim_of_three(
    prefix: &str,
) -> TestResult<(TestNamespace, Api<ConfigMap>, Vec<String>)> {
    let three = Ring::new((0..3).map(name));
    let of_victim = |ns: &str| names_owned_by(&three, ns, 30, "dispatcher-1");
    let (ns, api) = with_configmaps_where(prefix, 30, |ns| !of_victim(ns).is_empty()).await?;
    let of_victim = of_victim(ns.name());
    Ok((ns, api, of_victim))
}

/// Of ConfigMaps `cm-0..count` in `namespace`, the names `member` owns on `ring`.
pub(super) fn names_owned_by(
    ring: &Ring,
    namespace: &str,
    count: usize,
    member: &str,
) -> Vec<String> {
    (0..count)
        .map(|i| format!("cm-{i}"))
        .filter(|n| ring.owner(&RequestKey::new("", "ConfigMap", namespace, n)) == Some(member))
        .collect()
}

/// Of ConfigMaps `cm-0..count` in `namespace`, in name order, those dispatcher-1 owns on the
/// ring of three and dispatcher-0 takes when dispatcher-1 leaves it.
pub(super) fn from_one_to_zero(namespace: &str, count: usize) -> Vec<String> {
    let three = Ring::new((0..3).map(name));
    let two = Ring::new([name(0), name(2)]);
    let to_zero = names_owned_by(&two, namespace, count, "dispatcher-0");
    let mut moving: Vec<String> = names_owned_by(&three, namespace, count, "dispatcher-1")
        .into_iter()
        .filter(|n| to_zero.contains(n))
        .collect();
    moving.sort();
    moving
}

/// Opens a session of the group on dispatchers 0, 1 and 2, so the group exists on every one
/// and the peers remember deletions of keys they do not own (an idle group is kept 30 s), and
/// waits until dispatcher-1 has delivered its keys `of_victim`.
pub(super) async fn sessions_of_three(
    ds: &BTreeMap<usize, TestDispatcher>,
    namespace: &str,
    of_victim: &[String],
) -> TestResult<Vec<TestSession>> {
    let mut sessions = Vec::new();
    for i in [0, 2, 1] {
        let subs = vec![subscription("v1", "ConfigMap", namespace)];
        sessions.push(TestSession::open(&ds[&i], GROUP, &format!("replica-{i}"), subs).await?);
    }
    if let Some(s1) = sessions.last_mut() {
        let first = s1
            .collect_until(Duration::from_secs(20), |got| got.len() >= of_victim.len())
            .await;
        assert_eq!(
            first.len(),
            of_victim.len(),
            "dispatcher-1 delivers its keys"
        );
    }
    Ok(sessions)
}

/// Polls `session` until it is handed the deletion of `key` (made `when`); fails with what it
/// was handed instead after `timeout`.
pub(super) async fn expect_deletion(
    session: &mut TestSession,
    key: &str,
    timeout: Duration,
    when: &str,
) {
    let got = session
        .collect_until(timeout, |got| got.iter().any(|r| r.key == key && r.deleted))
        .await;
    let seen: Vec<(&str, bool)> = got.iter().map(|r| (r.key.as_str(), r.deleted)).collect();
    assert!(
        seen.contains(&(key, true)),
        "the deletion of {key} made {when} was never delivered; delivered (key, deleted): {seen:?}"
    );
}

/// Dispatcher-1, restarted before dispatcher-0 dropped it from the ring, delivers the deletion
/// of ConfigMap `name` (made `when`) to a session of `replica` opened on it now.
pub(super) async fn restarted_delivers(
    ds: &BTreeMap<usize, TestDispatcher>,
    namespace: &str,
    name: &str,
    replica: &str,
    when: &str,
) -> kube_dispatch_tests::TestResult {
    assert_eq!(
        ds[&0].handles.slice.borrow().ring.members().len(),
        3,
        "restarted before dispatcher-0 dropped it from the ring"
    );
    let subs = vec![subscription("v1", "ConfigMap", namespace)];
    let mut s1 = TestSession::open(&ds[&1], GROUP, replica, subs).await?;
    let key = format!("/ConfigMap/{namespace}/{name}");
    expect_deletion(&mut s1, &key, Duration::from_secs(30), when).await;
    Ok(())
}

/// With the victim stalled: changes every object, waits until the survivors serve every key,
/// kills the victim, and checks that every final state was reconciled with no overlap. Returns
/// how long after `since` the survivors took over.
pub(super) async fn taken_over(
    api: &Api<ConfigMap>,
    ds: &BTreeMap<usize, TestDispatcher>,
    journal: &Journal,
    victim: Option<TestDispatcher>,
    since: Instant,
) -> TestResult<Duration> {
    write_round(api, 9, 1, journal).await?;
    settled(ds, Duration::from_secs(30)).await;
    let took = since.elapsed();
    if let Some(d) = victim {
        d.kill();
    }
    assert_finals_reconciled(api, journal, Duration::from_secs(60)).await?;
    Ok(took)
}

/// The owner of ConfigMap key `namespace/object` on the ring of the three test dispatchers.
pub(super) fn owner_of_three(key: &str) -> Option<String> {
    let (namespace, object) = key.split_once('/').unwrap_or_default();
    Ring::new((0..3).map(name))
        .owner(&RequestKey::new("", "ConfigMap", namespace, object))
        .map(str::to_owned)
}

/// The dispatcher (index and name) owning a key being reconciled now: which dispatcher owns
/// which key depends on the namespace's name, and any one of them may own none.
pub(super) async fn owner_of_a_running_key(journal: &Journal) -> TestResult<(usize, String)> {
    let victim = eventually(Duration::from_secs(30), "a reconcile running", || {
        std::future::ready(
            journal
                .running()
                .iter()
                .find_map(|r| owner_of_three(&r.key)),
        )
    })
    .await?;
    let index = (0..3)
        .find(|i| name(*i) == victim)
        .ok_or("the victim is on the ring")?;
    Ok((index, victim))
}

/// A session on `dispatcher` of a client that never reports it ended (a replica cut off from
/// the others, an SDK without reports), once it has been handed keys of ConfigMaps in
/// `namespace`: the dispatcher's Lease lists it.
pub(super) async fn silent_session(
    dispatcher: &TestDispatcher,
    namespace: &str,
) -> TestResult<TestSession> {
    let subscriptions = vec![subscription("v1", "ConfigMap", namespace)];
    let mut session = TestSession::open(dispatcher, "silent", "silent-0", subscriptions).await?;
    let got = session
        .collect_until(Duration::from_secs(20), |got| !got.is_empty())
        .await;
    assert!(!got.is_empty(), "the silent session is handed keys");
    Ok(session)
}

/// A dispatcher stalls (as under SIGSTOP: its connections stay open, nothing answers) while
/// reconciles it handed out run, with sessions that outlive its Lease, and is then killed with
/// kill -9. Its keys are taken over once its Lease has expired and every session it listed has
/// been reported ended by its replica (which, asked by the survivors, cancels the reconciles
/// the session handed out and waits for them to return first), or, when a session's holder is
/// silent, after the handover bound. Either way no reconcile it started overlaps one of the new
/// owner's, and nothing is lost. Returns the takeover's time after the kill, and the victim.
pub(super) async fn stalled_then_killed(
    label: &str,
    silent: bool,
) -> TestResult<(Duration, String)> {
    // Sessions (6 s ttl, fenced at 4.5 s) outlive the Lease (2 s + 0.5 s grace): only the
    // bound or the replicas' reports keep the survivors from handing out keys whose
    // reconciles still run.
    const LONG: Duration = Duration::from_secs(6);
    let ns = TestNamespace::create(label).await?;
    let journal = Journal::default();
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let mut ds = start_settled(ns.name(), 3, LONG).await?;
    let work = Duration::from_secs(4);
    // As many replicas as dispatchers: each polls one, so every key that moves changes
    // replica, and an early takeover would show as overlapping reconciles.
    let replicas = start_replicas(ns.name(), 3, &lb, &journal, work, LONG)?;
    placed(&lb, 3, 3, Duration::from_secs(30)).await;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    // Few enough objects that no replica is saturated (4 reconciles at once each): a key
    // handed out is started at once.
    write_round(&api, 9, 0, &journal).await?;

    // Stall a dispatcher while reconciles of its keys run, then change every object. The
    // victim is the owner of a key in flight: which dispatcher owns which of the nine keys
    // depends on the namespace's name, and any one of them may own none.
    let owner = owner_of_three;
    let (victim_index, victim_name) = owner_of_a_running_key(&journal).await?;
    let owned_by_victim = |key: &str| owner(key).as_deref() == Some(victim_name.as_str());
    // A client that holds a session there and never reports it ended (a replica cut off from
    // the others, an SDK without reports): it is handed keys, so the victim's Lease lists it.
    let _silent = if silent {
        Some(silent_session(&ds[&victim_index], ns.name()).await?)
    } else {
        None
    };
    // The replicas see no error: their polls hang until they fence the session themselves, or
    // a survivor names the victim dead.
    let killed_at = Instant::now();
    let victim = ds.remove(&victim_index);
    if let Some(d) = &victim {
        d.freeze(Duration::from_secs(15));
    }
    let victims = journal
        .running()
        .into_iter()
        .filter(|r| owned_by_victim(&r.key))
        .count();
    assert!(victims > 0, "a reconcile of the victim's keys runs");
    let took = taken_over(&api, &ds, &journal, victim, killed_at).await?;
    println!(
        "{victim_name} stalled with {victims} reconciles of its keys running, then killed: survivors took its slice over {took:?} after the kill; no overlap; all final states reconciled {:?} after the kill",
        killed_at.elapsed()
    );
    stop_all(replicas, ds, [lb]).await;
    Ok((took, victim_name))
}

/// Three dispatchers with handover bound [`DeletedLease::BOUND`], three replicas whose
/// sessions outlive the Leases, reconciles of 4 s running; then the dispatcher owning one of
/// them stops answering (a partitioned node) and its Lease is deleted by hand (`kubectl delete
/// lease`, a cleanup job).
pub(super) struct DeletedLease {
    pub(super) ns: TestNamespace,
    pub(super) journal: Journal,
    pub(super) lb: TestLoadBalancer,
    /// The survivors.
    pub(super) ds: BTreeMap<usize, TestDispatcher>,
    pub(super) replicas: Vec<Isolated>,
    pub(super) api: Api<ConfigMap>,
    pub(super) leases: Api<k8s_openapi::api::coordination::v1::Lease>,
    pub(super) victim: Option<TestDispatcher>,
    pub(super) victim_name: String,
    /// Reconciles of the victim's keys running when it stalled.
    pub(super) running: usize,
    pub(super) deleted_at: Instant,
}

impl DeletedLease {
    pub(super) const BOUND: Duration = Duration::from_secs(6);

    pub(super) async fn start(label: &str) -> TestResult<Self> {
        let ns = TestNamespace::create(label).await?;
        let journal = Journal::default();
        let mut lb = TestLoadBalancer::start(ns.name()).await?;
        assert!(lb.leads_within(Duration::from_secs(15)).await);
        let mut ds = start_settled(ns.name(), 3, Self::BOUND).await?;
        let replicas = start_replicas(
            ns.name(),
            3,
            &lb,
            &journal,
            Duration::from_secs(4),
            Self::BOUND,
        )?;
        placed(&lb, 3, 3, Duration::from_secs(30)).await;
        let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
        write_round(&api, 9, 0, &journal).await?;
        let (victim_index, victim_name) = owner_of_a_running_key(&journal).await?;
        let victim = ds.remove(&victim_index);
        if let Some(d) = &victim {
            d.freeze(Duration::from_secs(20));
        }
        let running = journal
            .running()
            .into_iter()
            .filter(|r| owner_of_three(&r.key).as_deref() == Some(victim_name.as_str()))
            .count();
        let leases = Api::namespaced(ns.client(), ns.name());
        leases
            .delete(&victim_name, &DeleteParams::default())
            .await?;
        Ok(Self {
            ns,
            journal,
            lb,
            ds,
            replicas,
            api,
            leases,
            victim,
            victim_name,
            running,
            deleted_at: Instant::now(),
        })
    }
}

/// The deliveries in `got`, as (key, resourceVersion), for a failure message.
pub(super) fn delivered(got: &[kube_dispatch_proto::v1::ReconcileRequest]) -> Vec<(&str, &str)> {
    got.iter()
        .map(|r| (r.key.as_str(), r.resource_version.as_str()))
        .collect()
}

/// Collects from `session` until every key of `names` in `namespace` is delivered, and checks
/// that the first delivery is `name`'s, at `rv` or newer: a change made while a handover held
/// its key goes ahead of the keys the handover brings, which would otherwise come in name
/// order (`name` is the last of them).
pub(super) async fn first_delivered(
    session: &mut TestSession,
    namespace: &str,
    names: &[String],
    (name, rv): (&str, u64),
) -> Duration {
    let key = |n: &str| format!("/ConfigMap/{namespace}/{n}");
    let since = Instant::now();
    let got = session
        .collect_until(Duration::from_secs(30), |got| {
            names.iter().all(|n| got.iter().any(|r| r.key == key(n)))
        })
        .await;
    let first = got.first().expect("the moved keys are delivered");
    assert_eq!(
        first.key,
        key(name),
        "the key written during the handover goes first; delivered: {:?}",
        delivered(&got)
    );
    assert!(
        first.resource_version.parse::<u64>().unwrap_or(0) >= rv,
        "{name} is delivered at its write (rv {rv}) or later; delivered: {:?}",
        delivered(&got)
    );
    since.elapsed()
}
