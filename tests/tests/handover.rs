//! Live rings against the real API server: dispatchers join, leave and die while objects are
//! written; controller replicas come and go; the load balancer leader dies. The journal checks
//! what matters: no key reconciled by two replicas at once, every final state reconciled, and
//! keys that moved reconciled again by their new owner.
//!
//! Every handover path, sharing the ring fixtures and journal checks.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use kube_dispatch_core::{handover::Slice, queue::KeyState};
use kube_dispatch_dispatcher::config::ServeConfig;
use kube_dispatch_loadbalancer::placement::Placement;
use kube_dispatch_proto::{RequestKey, Ring, lease::RELEASED_ANNOTATION, v1::Subscription};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
    eventually,
    faultproxy::{Fault, FaultProxy},
    isolated::Isolated,
    journal::{Journal, JournalReplica, write_configmaps, write_round},
    loadbalancer::TestLoadBalancer,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// `T` of the test dispatchers: their longest session ttl and reconcile time.
const BOUND: Duration = Duration::from_secs(3);
/// Session ttl of the test replicas.
const TTL: Duration = Duration::from_secs(3);
const GROUP: &str = "journal";

fn name(i: usize) -> String {
    format!("dispatcher-{i}")
}

fn config(namespace: &str, i: usize, bound: Duration) -> ServeConfig {
    lease_config(namespace, &name(i), bound)
}

async fn start(namespace: &str, i: usize) -> TestResult<TestDispatcher> {
    Ok(TestDispatcher::start(config(namespace, i, BOUND)).await?)
}

/// Starts dispatchers `0..n` with handover bound `bound` and waits until they have settled.
async fn start_settled(
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
async fn start_writing(
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
fn start_replicas(
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
async fn stop_all(
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
async fn settled(ds: &BTreeMap<usize, TestDispatcher>, timeout: Duration) -> Duration {
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

fn edges(p: &Placement) -> BTreeSet<(String, String)> {
    p.iter()
        .flat_map(|(r, ds)| ds.iter().map(move |d| (r.clone(), d.clone())))
        .collect()
}

/// Waits until the load balancer's placement of the group covers exactly `dispatchers` with
/// exactly `replicas`; returns it and the time it took.
async fn placed(
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

fn assert_no_overlap(journal: &Journal) {
    let overlaps = journal.overlaps();
    assert!(
        overlaps.is_empty(),
        "{} pairs of reconciles of one key overlapped, e.g. {:?}",
        overlaps.len(),
        overlaps.first()
    );
}

/// A namespace of its own holding ConfigMaps `cm-0..count`, and their API.
async fn with_configmaps(
    prefix: &str,
    count: usize,
) -> TestResult<(TestNamespace, Api<ConfigMap>)> {
    let ns = TestNamespace::create(prefix).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    write_round(&api, count, 0, &Journal::default()).await?;
    Ok((ns, api))
}

/// A namespace of its own holding ConfigMaps `cm-0..30`, their API, and the names of those
/// dispatcher-1 owns on the ring of three (at least one).
async fn victim_of_three(prefix: &str) -> TestResult<(TestNamespace, Api<ConfigMap>, Vec<String>)> {
    let (ns, api) = with_configmaps(prefix, 30).await?;
    let three = Ring::new((0..3).map(name));
    let of_victim = names_owned_by(&three, ns.name(), 30, "dispatcher-1");
    assert!(!of_victim.is_empty(), "dispatcher-1 owns a key");
    Ok((ns, api, of_victim))
}

/// Of ConfigMaps `cm-0..count` in `namespace`, the names `member` owns on `ring`.
fn names_owned_by(ring: &Ring, namespace: &str, count: usize, member: &str) -> Vec<String> {
    (0..count)
        .map(|i| format!("cm-{i}"))
        .filter(|n| ring.owner(&RequestKey::new("", "ConfigMap", namespace, n)) == Some(member))
        .collect()
}

/// Opens a session of the group on dispatchers 0, 1 and 2, so the group exists on every one
/// and the peers remember deletions of keys they do not own (an idle group is kept 30 s), and
/// waits until dispatcher-1 has delivered its keys `of_victim`.
async fn sessions_of_three(
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
async fn expect_deletion(session: &mut TestSession, key: &str, timeout: Duration, when: &str) {
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
async fn restarted_delivers(
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
    let finals = Journal::finals(&api).await?;
    let missing = journal
        .await_reconciled(&finals, Duration::from_secs(30))
        .await;
    assert!(
        missing.is_empty(),
        "final states never reconciled: {missing:?}"
    );
    assert_no_overlap(&journal);
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

/// With the victim stalled: changes every object, waits until the survivors serve every key,
/// kills the victim, and checks that every final state was reconciled with no overlap. Returns
/// how long after `since` the survivors took over.
async fn taken_over(
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
    let finals = Journal::finals(api).await?;
    let missing = journal
        .await_reconciled(&finals, Duration::from_secs(60))
        .await;
    assert!(
        missing.is_empty(),
        "final states never reconciled: {missing:?}"
    );
    assert_no_overlap(journal);
    Ok(took)
}

/// The owner of ConfigMap key `namespace/object` on the ring of the three test dispatchers.
fn owner_of_three(key: &str) -> Option<String> {
    let (namespace, object) = key.split_once('/').unwrap_or_default();
    Ring::new((0..3).map(name))
        .owner(&RequestKey::new("", "ConfigMap", namespace, object))
        .map(str::to_owned)
}

/// The dispatcher (index and name) owning a key being reconciled now: which dispatcher owns
/// which key depends on the namespace's name, and any one of them may own none.
async fn owner_of_a_running_key(journal: &Journal) -> TestResult<(usize, String)> {
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

/// A dispatcher stalls (as under SIGSTOP: its connections stay open, nothing answers) while
/// reconciles it handed out run, with sessions that outlive its Lease, and is then killed with
/// kill -9. Its keys are taken over once its Lease has expired and every session it listed has
/// been reported ended by its replica (which, asked by the survivors, cancels the reconciles
/// the session handed out and waits for them to return first), or, when a session's holder is
/// silent, after the handover bound. Either way no reconcile it started overlaps one of the new
/// owner's, and nothing is lost. Returns the takeover's time after the kill, and the victim.
async fn stalled_then_killed(label: &str, silent: bool) -> TestResult<(Duration, String)> {
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
        let mut session = TestSession::open(
            &ds[&victim_index],
            "silent",
            "silent-0",
            vec![subscription("v1", "ConfigMap", ns.name())],
        )
        .await?;
        let got = session
            .collect_until(Duration::from_secs(20), |got| !got.is_empty())
            .await;
        assert!(
            !got.is_empty(),
            "the silent session is handed the victim's keys"
        );
        Some(session)
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

/// Three dispatchers with handover bound [`DeletedLease::BOUND`], three replicas whose
/// sessions outlive the Leases, reconciles of 4 s running; then the dispatcher owning one of
/// them stops answering (a partitioned node) and its Lease is deleted by hand (`kubectl delete
/// lease`, a cleanup job).
struct DeletedLease {
    ns: TestNamespace,
    journal: Journal,
    lb: TestLoadBalancer,
    /// The survivors.
    ds: BTreeMap<usize, TestDispatcher>,
    replicas: Vec<Isolated>,
    api: Api<ConfigMap>,
    leases: Api<k8s_openapi::api::coordination::v1::Lease>,
    victim: Option<TestDispatcher>,
    victim_name: String,
    /// Reconciles of the victim's keys running when it stalled.
    running: usize,
    deleted_at: Instant,
}

impl DeletedLease {
    const BOUND: Duration = Duration::from_secs(6);

    async fn start(label: &str) -> TestResult<Self> {
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
    // The survivors release no ring while they wait the dead member out.
    let deadline = Instant::now() + Duration::from_secs(5);
    for i in t.ds.keys() {
        let leases = &t.leases;
        eventually(
            deadline.saturating_duration_since(Instant::now()),
            format!(
                "{} releasing no ring while it waits out {}",
                name(*i),
                t.victim_name
            ),
            || async move {
                match leases.get(&name(*i)).await {
                    Ok(lease) if lease.annotations().contains_key(RELEASED_ANNOTATION) => None,
                    answer => Some(answer),
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
    let finals = Journal::finals(&api).await?;
    let missing = journal
        .await_reconciled(&finals, Duration::from_secs(30))
        .await;
    assert!(
        missing.is_empty(),
        "final states never reconciled: {missing:?}"
    );
    assert_no_overlap(&journal);
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

/// Deletions are not lost in transit: a deletion the old owner had queued is delivered by it
/// before it releases the ring, and a deletion that happens while the new owner holds the
/// moved keys is delivered by the new owner once the handover completes (a re-list cannot show
/// it).
#[tokio::test]
async fn deletions_in_transit_are_delivered() -> TestResult {
    let (ns, api) = with_configmaps("deletions-in-transit", 30).await?;
    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    let moving = names_owned_by(&Ring::new((0..2).map(name)), ns.name(), 30, "dispatcher-1");
    assert!(
        moving.len() >= 3,
        "enough keys move to dispatcher-1: {moving:?}"
    );
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
    ds.insert(1, TestDispatcher::start(patient(1)).await?);
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
    // Enough objects that, whatever the namespace's random name, some key of dispatcher-1
    // moves to dispatcher-0 (with 30 it happened that none did).
    const OBJECTS: usize = 60;
    let (ns, api) = with_configmaps("deleted-while-dead", OBJECTS).await?;
    let three = Ring::new((0..3).map(name));
    let two = Ring::new([name(0), name(2)]);
    // Keys of dispatcher-1 that go to dispatcher-0 when it dies.
    let to_zero = names_owned_by(&two, ns.name(), OBJECTS, "dispatcher-0");
    let moving: Vec<String> = names_owned_by(&three, ns.name(), OBJECTS, "dispatcher-1")
        .into_iter()
        .filter(|n| to_zero.contains(n))
        .collect();
    assert!(
        !moving.is_empty(),
        "a key moves from dispatcher-1 to dispatcher-0"
    );
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

/// The deliveries in `got`, as (key, resourceVersion), for a failure message.
fn delivered(got: &[kube_dispatch_proto::v1::ReconcileRequest]) -> Vec<(&str, &str)> {
    got.iter()
        .map(|r| (r.key.as_str(), r.resource_version.as_str()))
        .collect()
}

/// Collects from `session` until every key of `names` in `namespace` is delivered, and checks
/// that the first delivery is `name`'s, at `rv` or newer: a change made while a handover held
/// its key goes ahead of the keys the handover brings, which would otherwise come in name
/// order (`name` is the last of them).
async fn first_delivered(
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

/// dispatcher-1 is killed; while dispatcher-0's handover of its keys waits out the bound, one of
/// them (the last by name) is written. dispatcher-0 did not index it (a key it did not own),
/// so it remembers the change, without its body, and delivers it first when the handover
/// completes, ahead of the keys that the list beside its watch brings in name order.
#[tokio::test]
async fn a_write_while_a_dead_dispatchers_keys_are_held_is_delivered_first() -> TestResult {
    const OBJECTS: usize = 60;
    let (ns, api) = with_configmaps("held-write", OBJECTS).await?;
    let three = Ring::new((0..3).map(name));
    let two = Ring::new([name(0), name(2)]);
    let to_zero = names_owned_by(&two, ns.name(), OBJECTS, "dispatcher-0");
    let mut moving: Vec<String> = names_owned_by(&three, ns.name(), OBJECTS, "dispatcher-1")
        .into_iter()
        .filter(|n| to_zero.contains(n))
        .collect();
    moving.sort();
    assert!(
        moving.len() >= 2,
        "two keys move from dispatcher-1 to dispatcher-0: {moving:?}"
    );
    let mut ds = start_settled(ns.name(), 3, BOUND).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open(&ds[&0], GROUP, "replica-0", subs()).await?;
    let mine = names_owned_by(&three, ns.name(), OBJECTS, "dispatcher-0").len();
    let first = s0
        .collect_until(Duration::from_secs(20), |got| got.len() >= mine)
        .await;
    assert_eq!(first.len(), mine, "dispatcher-0 delivers its own keys");
    // A session on dispatcher-1 that is handed keys (so its Lease lists it) and never reports
    // them ended: the survivors wait out the bound for it, which is the window this test needs.
    let mut s1 = TestSession::open(&ds[&1], GROUP, "replica-1", subs()).await?;
    let held = s1
        .collect_until(Duration::from_secs(20), |got| !got.is_empty())
        .await;
    assert!(!held.is_empty(), "dispatcher-1 hands replica-1 its keys");

    if let Some(d) = ds.remove(&1) {
        d.kill();
    }
    let mut ring0 = ds[&0].handles.slice.clone();
    tokio::time::timeout(
        Duration::from_secs(20),
        ring0.wait_for(|s| s.ring.members().len() == 2),
    )
    .await??;
    let group = ds[&0]
        .handles
        .groups
        .named(GROUP)
        .pop()
        .ok_or("dispatcher-0 has the group")?;
    let last = moving.last().ok_or("a moving key")?;
    let patch = Patch::Merge(serde_json::json!({ "data": { "during": "handover" } }));
    let written = api.patch(last, &PatchParams::default(), &patch).await?;
    let rv: u64 = written.resource_version().unwrap_or_default().parse()?;
    // dispatcher-0 remembers the change, which it does only while the handover holds the key.
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.figures().held_changes == 0 {
        assert!(
            Instant::now() < deadline,
            "dispatcher-0 never remembered the write (raise BOUND on a slow machine)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = first_delivered(&mut s0, ns.name(), &moving, (last, rv)).await;
    println!(
        "the write made while the handover held {} keys was delivered first, {took:?} after dispatcher-0 remembered it",
        moving.len()
    );
    stop_all([], ds, []).await;
    Ok(())
}

/// dispatcher-1 joins while dispatcher-0 has one of the keys that move to it in flight, so its
/// gate stays closed and it keeps its keys in its index. One of them (the last by name) is
/// written meanwhile: when dispatcher-0 releases and the gate opens, that key is delivered
/// first, ahead of the others kept in name order, to a poll that was waiting already (the
/// gate's opening wakes it: the keys were ready before, so nothing else would).
#[tokio::test]
async fn a_write_while_a_joining_dispatchers_gate_is_closed_is_delivered_first() -> TestResult {
    const COUNT: usize = 30;
    let (ns, api) = with_configmaps("kept-write", COUNT).await?;
    let two = Ring::new([name(0), name(1)]);
    let mut moving = names_owned_by(&two, ns.name(), COUNT, "dispatcher-1");
    moving.sort();
    assert!(moving.len() >= 3, "three keys move to dispatcher-1");
    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    // Longer than the test: the key held in flight stays in flight however slow the machine.
    let long = Duration::from_secs(60);
    let mut ds = start_settled(ns.name(), 1, long).await?;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open_for(&ds[&0], GROUP, "replica-0", subs(), long).await?;
    let first = s0
        .collect_until(Duration::from_secs(20), |got| got.len() >= COUNT)
        .await;
    assert_eq!(first.len(), COUNT, "dispatcher-0 delivers every key");
    let flying = &moving[0];
    let patch = |round: &str| Patch::Merge(serde_json::json!({ "data": { "round": round } }));
    api.patch(flying, &PatchParams::default(), &patch("1"))
        .await?;
    let in_flight = s0.hold(Duration::from_secs(10)).await?;
    assert_eq!(
        in_flight.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
        [key(flying)],
        "dispatcher-0 hands out the change of {flying}, which stays in flight"
    );

    let joining = TestDispatcher::start(config(ns.name(), 1, long)).await?;
    // The group is made once dispatcher-1 is on its own ring, so its first list indexes the
    // keys it owns there (kept while its gate is closed).
    let mut ring1 = joining.handles.slice.clone();
    tokio::time::timeout(
        Duration::from_secs(20),
        ring1.wait_for(|s| s.ring.members().len() == 2),
    )
    .await??;
    let mut s1 = TestSession::open_for(&joining, GROUP, "replica-1", subs(), long).await?;
    let group = joining
        .handles
        .groups
        .named(GROUP)
        .pop()
        .ok_or("dispatcher-1 has the group")?;
    let last = moving.last().ok_or("a moving key")?;
    let known_at = |at: Option<u64>| {
        group.key_status(&key(last)).is_some_and(|k| {
            at.is_none_or(|rv| k.resource_version.parse::<u64>().unwrap_or(0) >= rv)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !known_at(None) {
        assert!(
            Instant::now() < deadline,
            "dispatcher-1 never indexed {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let written = api
        .patch(last, &PatchParams::default(), &patch("2"))
        .await?;
    let rv: u64 = written.resource_version().unwrap_or_default().parse()?;
    while !known_at(Some(rv)) {
        assert!(
            Instant::now() < deadline,
            "dispatcher-1's watch never showed the write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        joining.handles.slice.borrow().settled.is_none(),
        "dispatcher-1's gate must still be closed"
    );
    // A poll waiting on dispatcher-1 (for up to 20 s) as dispatcher-0 lets its key go is
    // answered when the gate opens, with the written key first.
    let let_go = Instant::now();
    let flying_ids: Vec<u64> = in_flight.iter().map(|r| r.delivery_id).collect();
    let (answer, acked) = tokio::join!(
        tokio::time::timeout(
            Duration::from_secs(10),
            s1.poll_acking(&[], Duration::from_secs(20))
        ),
        s0.ack(&flying_ids),
    );
    acked?;
    let answer = answer
        .map_err(|_| "the poll waiting as the gate opened was not answered within 10 s")??;
    let took = let_go.elapsed();
    assert!(
        !answer.is_empty(),
        "the poll waiting as the gate opened was answered with nothing"
    );
    assert_eq!(
        answer[0].key,
        key(last),
        "the key written while the gate was closed goes first; delivered: {:?}",
        delivered(&answer)
    );
    assert!(answer[0].resource_version.parse::<u64>().unwrap_or(0) >= rv);
    println!(
        "the write made while dispatcher-1 kept {} keys was delivered first, to a poll waiting as the gate opened, {took:?} after dispatcher-0 let its key go",
        moving.len()
    );
    ds.insert(1, joining);
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
    // Its new process reaches the API server through a proxy, stalled once it has started.
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    ds.insert(
        1,
        TestDispatcher::start_with(
            config(ns.name(), 1, BOUND),
            "127.0.0.1:0",
            Some(proxy.addr),
            None,
        )
        .await?,
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
    let (ns, api) = with_configmaps("deleted-at-handover", 30).await?;
    let two = Ring::new([name(0), name(1)]);
    let moving = names_owned_by(&two, ns.name(), 30, "dispatcher-1");
    assert!(!moving.is_empty(), "a key moves to dispatcher-1");
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

/// dispatcher-1 joins and dies before any handover to the ring of two completes (it crashes as
/// it starts; stalled here, then killed), while two keys that would move to it change, one idle
/// on dispatcher-0 and one in flight there. dispatcher-0, still settled on the ring of one,
/// serves both again without a handover. Before, it listed only after a handover, so the idle
/// key's change waited for the next resync (never, here: resync is off); and the watch dropped
/// the change of the key in flight (owned elsewhere then), which a list would skip as known.
#[tokio::test]
async fn a_change_while_a_joining_dispatcher_comes_and_goes_is_delivered() -> TestResult {
    const COUNT: usize = 30;
    let (ns, api) = with_configmaps("flap", COUNT).await?;
    let two = Ring::new([name(0), name(1)]);
    let moving = names_owned_by(&two, ns.name(), COUNT, "dispatcher-1");
    assert!(moving.len() >= 2, "two keys move to dispatcher-1");
    let (idle, flying) = (&moving[0], &moving[1]);
    // A session and reconcile time longer than the test, so that the key held in flight stays
    // in flight however slow the machine: the bound only delays handovers, and none completes.
    let long = Duration::from_secs(60);
    let ds = start_settled(ns.name(), 1, long).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open_for(&ds[&0], GROUP, "replica-0", subs, long).await?;
    let first = s0
        .collect_until(Duration::from_secs(20), |got| got.len() >= COUNT)
        .await;
    assert_eq!(first.len(), COUNT, "dispatcher-0 delivers every key");
    let patch =
        |round: u32| Patch::Merge(serde_json::json!({ "data": { "round": round.to_string() } }));
    let key = |name: &str| format!("/ConfigMap/{}/{name}", ns.name());
    api.patch(flying, &PatchParams::default(), &patch(1))
        .await?;
    let in_flight = s0.hold(Duration::from_secs(10)).await?;
    assert_eq!(
        in_flight.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
        [key(flying)],
        "dispatcher-0 hands out the change of {flying}, which stays in flight"
    );

    // dispatcher-1 stalls as soon as dispatcher-0 has seen its first Lease, which releases no
    // ring: neither completes a handover to the ring of two.
    let joining = start(ns.name(), 1).await?;
    let mut ring0 = ds[&0].handles.slice.clone();
    tokio::time::timeout(
        Duration::from_secs(20),
        ring0.wait_for(|s| s.ring.members().len() == 2),
    )
    .await??;
    joining.freeze(Duration::from_secs(60));
    let seen = ds[&0].watch_total(|c| &c.applied);
    let mut rvs = BTreeMap::new();
    for name in [idle, flying] {
        let written = api.patch(name, &PatchParams::default(), &patch(2)).await?;
        let rv: u64 = written.resource_version().unwrap_or_default().parse()?;
        rvs.insert(key(name), rv);
    }
    // Once dispatcher-0's watch has shown both changes (while the keys are owned by
    // dispatcher-1 on the ring, which serves nothing yet), dispatcher-1 dies.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ds[&0].watch_total(|c| &c.applied) < seen + 2 {
        assert!(
            Instant::now() < deadline,
            "dispatcher-0's watch never showed the changes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let settled_on = |s: &Slice| s.settled.as_ref().map(|r| r.members().len());
    assert_eq!(
        settled_on(&ds[&0].handles.slice.borrow()),
        Some(1),
        "dispatcher-0 must still be settled on the ring of one"
    );
    joining.kill();
    tokio::time::timeout(
        Duration::from_secs(20),
        ring0.wait_for(|s| s.ring.members().len() == 1),
    )
    .await??;
    assert_eq!(
        settled_on(&ds[&0].handles.slice.borrow()),
        Some(1),
        "no handover came between"
    );
    let group = ds[&0]
        .handles
        .groups
        .named(GROUP)
        .pop()
        .ok_or("dispatcher-0 has the group")?;
    assert_eq!(
        group.key_status(&key(flying)).map(|k| k.state),
        Some(KeyState::InFlight),
        "{flying} is still in flight as it comes back"
    );

    let came_back = Instant::now();
    s0.ack(&in_flight.iter().map(|r| r.delivery_id).collect::<Vec<_>>())
        .await?;
    let missing = |got: &[kube_dispatch_proto::v1::ReconcileRequest]| -> Vec<String> {
        rvs.iter()
            .filter(|(k, rv)| {
                !got.iter()
                    .any(|r| &&r.key == k && r.resource_version.parse().unwrap_or(0) >= **rv)
            })
            .map(|(k, rv)| format!("{k} (rv {rv})"))
            .collect()
    };
    let got = s0
        .collect_until(Duration::from_secs(15), |got| missing(got).is_empty())
        .await;
    assert!(
        missing(&got).is_empty(),
        "changes made while dispatcher-1 came and went never delivered: {:?}; delivered: {:?}",
        missing(&got),
        got.iter()
            .map(|r| (&r.key, &r.resource_version))
            .collect::<Vec<_>>()
    );
    println!(
        "the changes made while dispatcher-1 came and went were delivered {:?} after the keys came back",
        came_back.elapsed()
    );
    stop_all([], ds, []).await;
    Ok(())
}

/// A dispatcher that starts while another has one of its keys in flight must wait for that
/// dispatcher's release. Its Lease watch's first list shows one Lease at a time, its own first
/// when its first renewal came before the list: judged on that partial view, it would find itself
/// alone, settle on a ring of one, and then serve all its keys at once on the real ring. It is
/// started several times, since which comes first, the renewal or the list, varies.
#[tokio::test]
async fn a_starting_dispatcher_judges_membership_on_a_whole_view_of_the_leases() -> TestResult {
    const LONG: Duration = Duration::from_secs(20);
    const ROUNDS: usize = 4;
    let (ns, api) = with_configmaps("whole-view", 10).await?;
    let two = Ring::new([name(0), name(1)]);
    let moving = names_owned_by(&two, ns.name(), 10, "dispatcher-0");
    assert!(!moving.is_empty(), "a key goes to dispatcher-0");
    let key = format!("/ConfigMap/{}/{}", ns.name(), moving[0]);
    let mut ds = BTreeMap::new();
    ds.insert(1, TestDispatcher::start(config(ns.name(), 1, LONG)).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let subs = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s1 = TestSession::open(&ds[&1], GROUP, "replica-1", subs()).await?;
    let first = s1
        .collect_until(Duration::from_secs(20), |got| got.len() >= 10)
        .await;
    assert_eq!(first.len(), 10, "dispatcher-1 delivers every key");
    let patch = serde_json::json!({ "data": { "v": "2" } });
    api.patch(&moving[0], &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let got = s1.hold(Duration::from_secs(10)).await?;
    let held: Vec<u64> = got
        .iter()
        .filter(|r| r.key == key)
        .map(|r| r.delivery_id)
        .collect();
    assert_eq!(held.len(), 1, "dispatcher-1 hands out the changed key");

    for round in 0..ROUNDS {
        let d0 = TestDispatcher::start(config(ns.name(), 0, LONG)).await?;
        let mut s0 = TestSession::open(&d0, GROUP, "replica-0", subs()).await?;
        let watching = Instant::now() + Duration::from_millis(1500);
        // Dispatcher-1's replica goes on with everything else (keys that come back to
        // dispatcher-1 when dispatcher-0 stops are handed out again).
        let keep_alive = async {
            let mut acks = Vec::new();
            while Instant::now() < watching {
                let got = s1.poll_acking(&acks, Duration::from_millis(500)).await?;
                acks = got.iter().map(|r| r.delivery_id).collect();
            }
            s1.ack(&acks).await
        };
        let (alive, during) = tokio::join!(
            keep_alive,
            s0.collect_until(Duration::from_millis(1500), |got| {
                got.iter().any(|r| r.key == key)
            })
        );
        alive?;
        assert!(
            !during.iter().any(|r| r.key == key),
            "start {round}: dispatcher-0 handed out {key} while dispatcher-1's replica was still reconciling it"
        );
        d0.stop().await;
    }

    // Once dispatcher-1's reconcile ends, a starting dispatcher-0 takes the key over. Its
    // replica keeps polling (had its session expired meanwhile, the key would wait on
    // dispatcher-1 for a session to finish it before the release).
    s1.ack(&held).await?;
    ds.insert(0, TestDispatcher::start(config(ns.name(), 0, LONG)).await?);
    let mut s0 = TestSession::open(&ds[&0], GROUP, "replica-0", subs()).await?;
    let keep_polling = async {
        loop {
            let _ = s1
                .collect_until(Duration::from_millis(500), |_| false)
                .await;
        }
    };
    let after = tokio::select! {
        after = s0.collect_until(Duration::from_secs(20), |got| {
            got.iter().any(|r| r.key == key)
        }) => after,
        () = keep_polling => unreachable!("polls until the other branch ends"),
    };
    assert!(
        after.iter().any(|r| r.key == key),
        "dispatcher-0 takes {key} over once dispatcher-1 let go"
    );
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

/// An owner's children stay complete across a handover and a dispatcher restart: the owner's
/// key moves to a joining dispatcher, whose first request for it caused by a child's change
/// says COMPLETE and lists every child as it is now; the same after that dispatcher restarts.
#[tokio::test]
async fn an_owners_children_are_complete_after_a_handover_and_a_restart() -> TestResult {
    use kube::{Resource as _, api::PostParams};
    use kube_dispatch_proto::v1::{ChildrenState, ReconcileRequest};
    use kube_dispatch_tests::{Widget, WidgetSpec, ensure_widget_crd, widget_ref};

    let ns = TestNamespace::create("children-handover").await?;
    ensure_widget_crd(&ns.client()).await?;
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    // An owner the joining dispatcher-1 will own.
    let two = Ring::new((0..2).map(name));
    let owner = (0..64)
        .map(|i| format!("w-{i}"))
        .find(|w| {
            let key = RequestKey::new("test.kube-dispatch.dev", "Widget", ns.name(), w);
            two.owner(&key) == Some("dispatcher-1")
        })
        .expect("some name lands on dispatcher-1");
    let key = format!("test.kube-dispatch.dev/Widget/{}/{owner}", ns.name());
    let w = widgets
        .create(
            &PostParams::default(),
            &Widget::new(&owner, WidgetSpec { size: 1 }),
        )
        .await?;
    let reference = w
        .controller_owner_ref(&())
        .ok_or("a created Widget has a uid")?;
    for child in ["c1", "c2"] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(child.into());
        cm.metadata.owner_references = Some(vec![reference.clone()]);
        configmaps.create(&PostParams::default(), &cm).await?;
    }
    let owned = || {
        vec![Subscription {
            owner: Some(widget_ref()),
            ..subscription("v1", "ConfigMap", ns.name())
        }]
    };
    // The children as the API server has them now: (name, resourceVersion).
    let now = async || -> TestResult<Vec<(String, String)>> {
        let mut kids: Vec<(String, String)> = configmaps
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(|c| (c.name_any(), c.resource_version().unwrap_or_default()))
            .collect();
        kids.sort();
        Ok(kids)
    };
    let shown = |r: &ReconcileRequest| -> Vec<(String, String)> {
        r.children
            .iter()
            .map(|c| {
                let name = c
                    .object
                    .as_ref()
                    .map(|o| o.name.clone())
                    .unwrap_or_default();
                (name, c.resource_version.clone())
            })
            .collect()
    };
    // Changes child `child`, then waits for the owner's first COMPLETE request on `session`
    // that shows the change.
    let complete_after_change = async |session: &mut TestSession, child: &str, value: &str| {
        let patch = serde_json::json!({ "data": { "v": value } });
        let changed = configmaps
            .patch(child, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("child changed")
            .resource_version()
            .unwrap_or_default();
        let shows = |r: &ReconcileRequest| {
            r.key == key
                && r.children_state == ChildrenState::Complete as i32
                && shown(r).contains(&(child.to_owned(), changed.clone()))
        };
        let got = session
            .collect_until(Duration::from_secs(30), |got| got.iter().any(shows))
            .await;
        got.into_iter()
            .find(shows)
            .unwrap_or_else(|| panic!("no complete request for {key} showing {child} changed"))
    };

    let mut ds = start_settled(ns.name(), 1, BOUND).await?;
    let mut s0 = TestSession::open(&ds[&0], "children", "replica-0", owned()).await?;
    let first = complete_after_change(&mut s0, "c1", "one").await;
    assert_eq!(shown(&first), now().await?, "on dispatcher-0");
    // The replica on dispatcher-0 goes on polling, as a real one does: what dispatcher-0 has
    // ready for it when the key moves away is delivered, so dispatcher-0 can release the ring.
    let replica_0 = tokio::spawn(async move {
        s0.collect_until(Duration::from_secs(3600), |_| false).await;
    });

    ds.insert(1, start(ns.name(), 1).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let mut s1 = TestSession::open(&ds[&1], "children", "replica-1", owned()).await?;
    let moved = complete_after_change(&mut s1, "c2", "two").await;
    assert_eq!(
        shown(&moved),
        now().await?,
        "on dispatcher-1 after the handover"
    );

    if let Some(d) = ds.remove(&1) {
        d.stop().await;
    }
    ds.insert(1, start(ns.name(), 1).await?);
    settled(&ds, Duration::from_secs(30)).await;
    let mut s1 = TestSession::open(&ds[&1], "children", "replica-1b", owned()).await?;
    let restarted = complete_after_change(&mut s1, "c1", "three").await;
    assert_eq!(
        shown(&restarted),
        now().await?,
        "on dispatcher-1 after its restart"
    );
    replica_0.abort();
    stop_all([], ds, []).await;
    Ok(())
}

/// A replica that stops polling (hung, or cut off from its dispatcher) holds back no
/// handover: the keys that were ready for it and move away are left to their new owner once
/// its session expires (3 s here), and the joining dispatcher settles then.
#[tokio::test]
async fn a_session_that_stops_polling_holds_no_handover_back() -> TestResult {
    let (ns, _api) = with_configmaps("idle-session", 30).await?;
    let mut ds = start_settled(ns.name(), 1, BOUND).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    // Opened, then never polled: every key is ready for it and stays so.
    let _hung = TestSession::open(&ds[&0], GROUP, "hung", subs).await?;
    ds.insert(1, start(ns.name(), 1).await?);
    let took = settled(&ds, Duration::from_secs(20)).await;
    println!("a dispatcher joined beside a hung session's keys and settled in {took:?}");
    stop_all([], ds, []).await;
    Ok(())
}
