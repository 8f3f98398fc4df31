//! Fencing (`CONTRACT.md`, section 3.3) on a slow path: a replica whose calls to its dispatcher are
//! slow, then stop getting through, stops its reconciles before the dispatcher hands their keys
//! to another replica.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube_dispatch_controller::Health;
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
    eventually,
    faultproxy::{Fault, FaultProxy},
    journal::{Journal, JournalReplica, write_round},
};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(4);

/// A replica of one reconcile at a time, polling `dispatcher`, each reconcile taking `work`
/// (`None`: until cancelled); stops gracefully when the token is cancelled.
fn replica(
    client: kube::Client,
    namespace: &str,
    dispatcher: String,
    name: &str,
    journal: &Journal,
    work: Option<Duration>,
) -> (CancellationToken, Health) {
    let replica = JournalReplica::new(namespace, "fencing", name, journal)
        .dispatcher(dispatcher)
        .concurrency(1)
        .ttl(TTL);
    match work {
        Some(work) => replica.work(work),
        None => replica.hang(),
    }
    .spawn(client)
}

/// A namespace with one ConfigMap, `cm-0`, and a dispatcher that lets a reconcile run for a
/// minute.
struct Setup {
    ns: TestNamespace,
    client: kube::Client,
    dispatcher: TestDispatcher,
    journal: Journal,
    api: Api<ConfigMap>,
    /// The ConfigMap's key in the journal.
    key: String,
}

async fn setup(name: &str) -> Result<Setup, Box<dyn std::error::Error + Send + Sync>> {
    let ns = TestNamespace::create(name).await?;
    let client = Cluster::shared().client().await?;
    let mut config = test_config("d0", &["d0"]);
    config.settings.queue.max_reconcile_time = Duration::from_secs(60);
    let dispatcher = TestDispatcher::start(config).await?;
    let journal = Journal::default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    write_round(&api, 1, 0, &journal).await?;
    let key = format!("{}/cm-0", ns.name());
    Ok(Setup {
        ns,
        client,
        dispatcher,
        journal,
        api,
        key,
    })
}

/// Starts replica B, whose reconciles take 20 ms, on `dispatcher`, and waits until its session
/// is open.
async fn replica_b(
    client: &kube::Client,
    ns: &TestNamespace,
    dispatcher: String,
    journal: &Journal,
) -> CancellationToken {
    let (stop, health) = replica(
        client.clone(),
        ns.name(),
        dispatcher,
        "replica-b",
        journal,
        Some(Duration::from_millis(20)),
    );
    assert!(
        until(Duration::from_secs(30), || health.ready()).await,
        "replica B opened no session"
    );
    stop
}

/// Whether `replica` has begun a reconcile of `key`.
fn reconciled_by(journal: &Journal, key: &str, replica: &'static str) -> impl FnMut() -> bool {
    let (journal, key) = (journal.clone(), key.to_owned());
    move || {
        journal
            .reconciles()
            .iter()
            .any(|r| r.key == key && r.replica == replica)
    }
}

/// Whether `condition` holds within `timeout` ([`eventually`]).
async fn until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    eventually(timeout, "condition", || {
        std::future::ready(condition().then_some(()))
    })
    .await
    .is_ok()
}

/// Replica A holds a key (its reconcile runs on, so A is saturated and renews with bare acks)
/// when its path to the dispatcher slows to 400 ms each way, then stalls. The dispatcher renews
/// A's session when each ack arrives, so it expires the session a ttl after the last one that
/// got through and hands the key to replica B. A must have cancelled its reconcile by then.
///
/// A replica that counted its fence from when an answer arrived, plus the wait for a free slot
/// that followed it, ran late by that transit and wait: A was still reconciling when B began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_a_slow_path_stops_before_its_key_moves() -> TestResult {
    let Setup {
        ns,
        client,
        dispatcher,
        journal,
        key,
        ..
    } = setup("fencing-slow").await?;
    let proxy = FaultProxy::start(dispatcher.addr).await?;

    let by = |replica: &'static str| reconciled_by(&journal, &key, replica);
    let (stop_a, _) = replica(
        client.clone(),
        ns.name(),
        proxy.addr.to_string(),
        "replica-a",
        &journal,
        None,
    );
    assert!(
        until(Duration::from_secs(30), by("replica-a")).await,
        "replica A never got the key"
    );
    let stop_b = replica_b(&client, &ns, dispatcher.addr.to_string(), &journal).await;

    // Slow, for long enough that every renewal A counts on went over the slow path (its fence
    // is 3 s); then nothing gets through.
    proxy.set(Fault::Latency(Duration::from_millis(400)));
    tokio::time::sleep(TTL).await;
    proxy.set(Fault::Stall);
    assert!(
        until(TTL * 4, by("replica-b")).await,
        "the key never went to replica B"
    );

    let runs: Vec<_> = journal
        .reconciles()
        .into_iter()
        .filter(|r| r.key == key)
        .collect();
    let a = runs
        .iter()
        .find(|r| r.replica == "replica-a")
        .ok_or("A's reconcile is missing")?;
    let b = runs
        .iter()
        .find(|r| r.replica == "replica-b")
        .ok_or("B's reconcile is missing")?;
    let a_end = a.end.ok_or("A was still reconciling when B began")?;
    assert!(
        a_end <= b.start,
        "A's reconcile ended {:?} after B's began",
        a_end - b.start
    );
    assert!(journal.overlaps().is_empty(), "{:?}", journal.overlaps());
    stop_a.cancel();
    stop_b.cancel();
    Ok(())
}

/// Replica A is stopped gracefully while it reconciles a key for longer than its session's
/// ttl. It keeps renewing the session until the reconcile ends, then closes it, and only then
/// does the key go to replica B. A replica that stopped renewing while it drained let the
/// session expire under its running reconcile, and B began while A was still at work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopping_keeps_its_session_until_its_reconciles_end() -> TestResult {
    let Setup {
        ns,
        client,
        dispatcher,
        journal,
        api,
        key,
    } = setup("fencing-drain").await?;
    let address = dispatcher.addr.to_string();

    let work = TTL * 2;
    let (stop_a, _) = replica(
        client.clone(),
        ns.name(),
        address.clone(),
        "replica-a",
        &journal,
        Some(work),
    );
    assert!(
        until(
            Duration::from_secs(30),
            reconciled_by(&journal, &key, "replica-a")
        )
        .await,
        "replica A never got the key"
    );
    let stop_b = replica_b(&client, &ns, address, &journal).await;
    // The key is in flight on A, so it stays with A; A is asked to stop.
    stop_a.cancel();
    // Touch the object, so that B has a change to reconcile once the key is free.
    write_round(&api, 1, 1, &journal).await?;
    assert!(
        until(work * 2, reconciled_by(&journal, &key, "replica-b")).await,
        "the key never went to replica B"
    );
    assert!(journal.overlaps().is_empty(), "{:?}", journal.overlaps());
    let runs = journal.reconciles();
    let a = runs
        .iter()
        .find(|r| r.key == key && r.replica == "replica-a")
        .ok_or("A's reconcile is missing")?;
    let a_took = a.end.ok_or("A's reconcile never ended")? - a.start;
    assert!(
        a_took >= work,
        "A's reconcile was cut short after {a_took:?}, not run to its end"
    );
    stop_b.cancel();
    Ok(())
}

/// A replica told to stop while the dispatcher's answer to its poll is on its way (here a slow
/// path, 500 ms each way) still takes that answer and runs what it delivers before its session
/// closes, as it lets every running reconcile finish: the change is reconciled at once, with
/// the object the dispatcher sent, and no other replica runs the key meanwhile. A replica that
/// dropped the poll left the delivery in flight on its session until the session expired (a
/// ttl), and nobody reconciled the change meanwhile (8 s in the e2e's rolling update, when the
/// load balancer moved a dispatcher to another replica); one that handed it back sent it to
/// another replica only once its session closed, without its object, which that replica read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopping_with_an_answer_on_its_way_runs_it_before_it_closes() -> TestResult {
    const SLOW: Duration = Duration::from_millis(500);
    // Long enough that A's poll (which waits a quarter of it, at most 5 s) is still waiting at
    // the dispatcher when the change comes, and that its expiry is far past the bound below.
    const A_TTL: Duration = Duration::from_secs(20);
    let Setup {
        ns,
        client,
        dispatcher,
        journal,
        api,
        key,
    } = setup("fencing-stop").await?;
    let proxy = FaultProxy::start(dispatcher.addr).await?;
    let (stop_a, _) = JournalReplica::new(ns.name(), "fencing", "replica-a", &journal)
        .dispatcher(proxy.addr.to_string())
        .concurrency(1)
        .ttl(A_TTL)
        .work(Duration::from_millis(20))
        .spawn(client.clone());
    assert!(
        until(Duration::from_secs(30), || journal
            .reconciles()
            .iter()
            .any(|r| r.key == key && r.end.is_some()))
        .await,
        "replica A never reconciled the key"
    );
    // Its reconcile over, A polls again at once; that poll reaches the dispatcher on the fast
    // path and waits there. Then the path slows.
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.set(Fault::Latency(SLOW));

    write_round(&api, 1, 1, &journal).await?;
    let written = tokio::time::Instant::now();
    // The dispatcher answers A's waiting poll within milliseconds of the change; the answer
    // is on the slow path for 500 ms. A is told to stop in the middle of that.
    tokio::time::sleep(SLOW / 2).await;
    stop_a.cancel();
    let stop_b = replica_b(&client, &ns, dispatcher.addr.to_string(), &journal).await;
    let changed = || {
        journal
            .reconciles()
            .into_iter()
            .filter(|r| r.key == key && r.replica == "replica-a" && r.end.is_some())
            .nth(1)
    };
    assert!(
        until(Duration::from_secs(10), || changed().is_some()).await,
        "replica A did not run the change it had in hand within 10 s: it was left in flight until its session would expire"
    );
    let a = changed().ok_or("A's second reconcile is missing")?;
    let after = a.start.saturating_duration_since(written);
    println!("replica A began the change {after:?} after it was written, while stopping");
    // The answer's way to A over a path that forwards each chunk 500 ms late, against A's
    // session expiring 20 s after the answer.
    assert!(
        after < A_TTL / 4,
        "the change was begun {after:?} after it was written"
    );
    let a_end = a.end.ok_or("A's reconcile has no end")?;
    for b in journal
        .reconciles()
        .iter()
        .filter(|r| r.key == key && r.replica == "replica-b")
    {
        assert!(
            b.start >= a_end,
            "replica B began the key at {:?} while A ran it until {a_end:?}",
            b.start
        );
    }
    stop_b.cancel();
    Ok(())
}
