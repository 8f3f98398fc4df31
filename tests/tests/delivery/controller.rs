//! Controllers written with the SDK, against in-process dispatchers and the real API server.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use kube_dispatch_controller::{Action, Controller};
use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
    journal::{Journal, key_of, rv_of},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const ANNOTATION: &str = "kube-dispatch.dev/reconciled-by";

/// What the test controller shares with the test.
struct Ctx {
    client: kube::Client,
    replica: String,
    /// Every reconcile, for the overlaps across replicas.
    journal: Journal,
    done: mpsc::UnboundedSender<(String, String)>,
    /// Take keys and never finish them (a replica about to be killed): reports
    /// `(name, "<replica>-held")` on `done` instead.
    hang: bool,
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Annotates each ConfigMap with the replica that reconciled it.
async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let name = cm.name_any();
    if ctx.hang {
        let _ = ctx.done.send((name, format!("{}-held", ctx.replica)));
        return std::future::pending().await;
    }
    let running = ctx
        .journal
        .start_reconcile(key_of(&cm), rv_of(&cm), false, &ctx.replica);
    // Long enough for overlaps to show if exclusivity were broken.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let api: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: ctx.replica } } });
    let result = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    drop(running);
    result?;
    let _ = ctx.done.send((name, ctx.replica.clone()));
    Ok(Action::await_change())
}

fn error_policy(_cm: Arc<ConfigMap>, _e: &ReconcileError, _ctx: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(200))
}

struct Replica {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    health: kube_dispatch_controller::Health,
}

impl Replica {
    /// Shuts the replica down gracefully and waits until it has.
    async fn shut_down(self) -> TestResult {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task).await??;
        Ok(())
    }
}

fn start_replica(
    client: kube::Client,
    ns: &str,
    dispatcher: &TestDispatcher,
    replica: &str,
    ttl: Duration,
    journal: &Journal,
    done: mpsc::UnboundedSender<(String, String)>,
) -> Replica {
    start_replica_at(
        client,
        ns,
        &dispatcher.addr.to_string(),
        replica,
        ttl,
        journal,
        done,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
fn start_replica_at(
    client: kube::Client,
    ns: &str,
    dispatcher: &str,
    replica: &str,
    ttl: Duration,
    journal: &Journal,
    done: mpsc::UnboundedSender<(String, String)>,
    hang: bool,
) -> Replica {
    let stop = CancellationToken::new();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        replica: replica.into(),
        journal: journal.clone(),
        done,
        hang,
    });
    let controller = Controller::<ConfigMap>::new(client, "annotator");
    let health = controller.health();
    let stream = controller
        .namespace(ns)
        .dispatchers([dispatcher.to_owned()])
        .credentials(kube_dispatch_tests::credentials())
        .replica_id(replica)
        .session_ttl(ttl)
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx);
    let task = tokio::spawn(stream.for_each(|_| async {}));
    Replica { stop, task, health }
}

async fn create(
    api: &Api<ConfigMap>,
    names: impl Iterator<Item = String>,
) -> Result<(), kube::Error> {
    for name in names {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name);
        api.create(&PostParams::default(), &cm).await?;
    }
    Ok(())
}

/// Waits until every name in `want` was reconciled; returns who reconciled each, last wins.
async fn reconciled(
    rx: &mut mpsc::UnboundedReceiver<(String, String)>,
    want: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let mut by = BTreeMap::new();
    while !want.iter().all(|n| by.contains_key(n)) {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some((name, replica))) => {
                by.insert(name, replica);
            }
            _ => panic!(
                "not all reconciled: missing {:?}",
                want.iter()
                    .filter(|n| !by.contains_key(*n))
                    .collect::<Vec<_>>()
            ),
        }
    }
    by
}

#[tokio::test]
async fn a_controller_reconciles_every_object_and_writes_through_its_client() -> TestResult {
    let ns = TestNamespace::create("sdk-basic").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let journal = Journal::default();
    let replica = start_replica(
        ns.client(),
        ns.name(),
        &d,
        "replica-a",
        Duration::from_secs(3),
        &journal,
        tx,
    );

    let names: BTreeSet<String> = (0..20).map(|i| format!("cm-{i}")).collect();
    create(&api, names.iter().cloned()).await?;
    let by = reconciled(&mut rx, &names).await;
    assert!(by.values().all(|r| r == "replica-a"));
    for name in &names {
        let cm = api.get(name).await?;
        assert_eq!(
            cm.annotations().get(ANNOTATION).map(String::as_str),
            Some("replica-a"),
            "{name}"
        );
    }
    assert!(journal.overlaps().is_empty());
    // It reconciled, so its session is open: ready and live.
    assert!(replica.health.ready() && replica.health.live());
    assert_eq!(replica.health.sessions(), 1);
    let health = replica.health.clone();
    replica.shut_down().await?;
    assert!(!health.live() && !health.ready());
    assert_eq!(health.sessions(), 0);
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn replicas_share_keys_without_overlap_and_a_stopped_one_hands_over_at_once() -> TestResult {
    let ns = TestNamespace::create("sdk-two-replicas").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let journal = Journal::default();
    // Sessions live 60 s: if the handover below waited for a ttl, it would not finish in the
    // 30 s the test allows.
    let ttl = Duration::from_secs(60);
    let a = start_replica(
        ns.client(),
        ns.name(),
        &d,
        "replica-a",
        ttl,
        &journal,
        tx.clone(),
    );
    let b = start_replica(
        ns.client(),
        ns.name(),
        &d,
        "replica-b",
        ttl,
        &journal,
        tx.clone(),
    );

    let first: BTreeSet<String> = (0..60).map(|i| format!("first-{i}")).collect();
    create(&api, first.iter().cloned()).await?;
    let by = reconciled(&mut rx, &first).await;
    let replicas: BTreeSet<&str> = by.values().map(String::as_str).collect();
    assert_eq!(
        replicas,
        BTreeSet::from(["replica-a", "replica-b"]),
        "both replicas work"
    );
    assert!(
        journal.overlaps().is_empty(),
        "overlapping reconciles: {:?}",
        journal.overlaps()
    );

    // Stopping a replica closes its session: its keys go to b without waiting for a ttl. Its
    // poll, held by the dispatcher for up to 5 s (the SDK's wait), is answered once it says it
    // stops (`AckRequest.stopping`): the stop does not wait it out.
    let stopping = std::time::Instant::now();
    a.shut_down().await?;
    assert!(
        stopping.elapsed() < Duration::from_secs(4),
        "the stop took {:?}",
        stopping.elapsed()
    );
    let second: BTreeSet<String> = (0..30).map(|i| format!("second-{i}")).collect();
    create(&api, second.iter().cloned()).await?;
    let by = reconciled(&mut rx, &second).await;
    assert!(second.iter().all(|n| by[n] == "replica-b"));
    assert!(journal.overlaps().is_empty());
    b.shut_down().await?;
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_killed_replica_loses_nothing_its_keys_go_to_another_after_the_ttl() -> TestResult {
    let ns = TestNamespace::create("sdk-killed-replica").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let journal = Journal::default();
    let ttl = Duration::from_secs(3);

    // Replica a runs on a runtime of its own, so it can be killed: dropping the runtime ends
    // its tasks and connections without closing its session, as a SIGKILL would.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (address, namespace, a_journal, a_tx) = (
        d.addr.to_string(),
        ns.name().to_owned(),
        Journal::default(),
        tx.clone(),
    );
    doomed.spawn(async move {
        let client = kube_dispatch_tests::Cluster::shared()
            .client()
            .await
            .expect("client");
        let _a = start_replica_at(
            client,
            &namespace,
            &address,
            "replica-a",
            ttl,
            &a_journal,
            a_tx,
            true,
        );
        std::future::pending::<()>().await;
    });

    // a is alone: it takes keys and holds them.
    let names: BTreeSet<String> = (0..10).map(|i| format!("cm-{i}")).collect();
    create(&api, names.iter().cloned()).await?;
    let mut held = BTreeSet::new();
    while held.len() < names.len() {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some((name, who))) if who == "replica-a-held" => {
                held.insert(name);
            }
            other => panic!("expected a to hold every key, got {other:?}"),
        }
    }

    let b = start_replica(ns.client(), ns.name(), &d, "replica-b", ttl, &journal, tx);
    doomed.shutdown_background();
    // Everything a held is reconciled by b once a's session expires; nothing is lost.
    let by = reconciled(&mut rx, &names).await;
    assert!(names.iter().all(|n| by[n] == "replica-b"), "{by:?}");
    assert!(journal.overlaps().is_empty());
    b.shut_down().await?;
    d.stop().await;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
#[error("never happens")]
struct Never;

#[tokio::test]
async fn a_controller_of_dynamic_objects_gets_them_with_their_content() -> TestResult {
    use kube::api::{ApiResource, DynamicObject};
    let ns = TestNamespace::create("sdk-dynamic").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let stop = CancellationToken::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, String)>();
    let resource = ApiResource::erase::<ConfigMap>(&());
    let stream = Controller::<DynamicObject>::new_with(ns.client(), "dynamic", resource)
        .namespace(ns.name())
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            |obj: Arc<DynamicObject>, tx: Arc<mpsc::UnboundedSender<(String, String)>>| async move {
                let value = obj.data["data"]["value"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let _ = tx.send((obj.name_any(), value));
                Ok::<_, Never>(Action::await_change())
            },
            |_, _: &Never, _| Action::await_change(),
            Arc::new(tx),
        );
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let mut want = BTreeMap::new();
    for i in 0..5 {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("dyn-{i}"));
        cm.data = Some([("value".to_owned(), format!("v{i}"))].into());
        api.create(&PostParams::default(), &cm).await?;
        want.insert(format!("dyn-{i}"), format!("v{i}"));
    }
    let mut got = BTreeMap::new();
    while got.len() < want.len() {
        let (name, value) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await?
            .expect("the controller runs");
        got.insert(name, value);
    }
    assert_eq!(got, want);
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    d.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_replica_reconnects_when_its_dispatcher_restarts() -> TestResult {
    let ns = TestNamespace::create("sdk-reconnect").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let config = test_config("dispatcher-0", &["dispatcher-0"]);
    let d = TestDispatcher::start(config.clone()).await?;
    let address = d.addr.to_string();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let journal = Journal::default();
    let replica = start_replica(
        ns.client(),
        ns.name(),
        &d,
        "replica-a",
        Duration::from_secs(3),
        &journal,
        tx,
    );
    create(&api, std::iter::once("before".to_owned())).await?;
    reconciled(&mut rx, &BTreeSet::from(["before".to_owned()])).await;

    // The dispatcher goes away (its sessions with it) and comes back on the same address.
    d.stop().await;
    let d = TestDispatcher::start_at(config, &address).await?;
    create(&api, std::iter::once("after".to_owned())).await?;
    reconciled(&mut rx, &BTreeSet::from(["after".to_owned()])).await;
    assert_eq!(
        replica.health.sessions(),
        1,
        "one session, on the new dispatcher"
    );
    replica.shut_down().await?;
    d.stop().await;
    Ok(())
}

/// `reconcile_on` reconciles exactly the objects its stream names (a name with no object is
/// ignored), `reconcile_all_on` every object, each once more; nothing else is reconciled.
#[tokio::test]
async fn triggers_reconcile_what_they_name_or_everything_and_nothing_else() -> TestResult {
    use kube::runtime::reflector::ObjectRef;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    let ns = TestNamespace::create("sdk-triggers").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    create(&api, ["a", "b", "c"].map(String::from).into_iter()).await?;
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let (keys, keys_rx) = mpsc::unbounded_channel::<ObjectRef<ConfigMap>>();
    let (all, all_rx) = mpsc::unbounded_channel::<()>();
    let (done, mut reconciled) = mpsc::unbounded_channel::<String>();
    let stop = CancellationToken::new();
    let outcomes = Controller::<ConfigMap>::new(ns.client(), "triggered")
        .namespace(ns.name())
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .replica_id("triggered-0")
        .reconcile_on(UnboundedReceiverStream::new(keys_rx))
        .reconcile_all_on(UnboundedReceiverStream::new(all_rx))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            |cm: Arc<ConfigMap>, done: Arc<mpsc::UnboundedSender<String>>| async move {
                let _ = done.send(cm.name_any());
                Ok::<_, ReconcileError>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_millis(200)),
            Arc::new(done),
        );
    let task = tokio::spawn(outcomes.for_each(|_| async {}));
    let mut next = async |n: usize| -> Vec<String> {
        let mut names = Vec::new();
        while names.len() < n {
            match tokio::time::timeout(Duration::from_secs(30), reconciled.recv()).await {
                Ok(Some(name)) => names.push(name),
                _ => panic!("{n} reconciles expected, got {names:?}"),
            }
        }
        names.sort();
        names
    };
    assert_eq!(
        next(3).await,
        ["a", "b", "c"],
        "each object once at the start"
    );

    keys.send(ObjectRef::new("missing").within(ns.name()))?;
    keys.send(ObjectRef::new("b").within(ns.name()))?;
    assert_eq!(next(1).await, ["b"], "the named object, once");
    all.send(())?;
    assert_eq!(next(3).await, ["a", "b", "c"], "every object, once");
    // Nothing else is pending: the next reconcile is the object created now.
    create(&api, std::iter::once("e".to_owned())).await?;
    assert_eq!(next(1).await, ["e"]);

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    d.stop().await;
    Ok(())
}

/// `owns_labelled`: the dispatcher watches only the children that carry the label, so a request
/// lists only those, never an unlabelled child of the same owner; a child that loses the label
/// leaves the list, and its owner is reconciled for it.
#[tokio::test]
async fn owned_children_selected_by_label_are_the_only_ones_a_request_lists() -> TestResult {
    use k8s_openapi::api::core::v1::Secret;
    use kube::Resource as _;

    let ns = TestNamespace::create("sdk-owns-labelled").await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let secrets: Api<Secret> = Api::namespaced(ns.client(), ns.name());
    let mut owner = ConfigMap::default();
    owner.metadata.name = Some("owner".to_owned());
    let owner = configmaps.create(&PostParams::default(), &owner).await?;
    let reference = owner
        .controller_owner_ref(&())
        .ok_or("a created ConfigMap has a uid")?;
    for (name, labelled) in [("in", true), ("out", false)] {
        let mut child = Secret::default();
        child.metadata.name = Some(name.to_owned());
        child.metadata.owner_references = Some(vec![reference.clone()]);
        if labelled {
            child.metadata.labels = Some([("set".to_owned(), "a".to_owned())].into());
        }
        secrets.create(&PostParams::default(), &child).await?;
    }
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    // Per reconcile, the children its request lists when it knows them all.
    let (done, mut listed) = mpsc::unbounded_channel::<Vec<String>>();
    let stop = CancellationToken::new();
    let outcomes = Controller::<ConfigMap>::new(ns.client(), "owns-labelled")
        .namespace(ns.name())
        .owns_labelled::<Secret>("set=a")
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(
            |cm: Arc<ConfigMap>, done: Arc<mpsc::UnboundedSender<Vec<String>>>| async move {
                let known = kube_dispatch_controller::children::of_this_reconcile()
                    .filter(|c| c.is_complete());
                // The owner's reconciles only (the namespace may hold other ConfigMaps).
                if let Some(children) = known.filter(|_| cm.name_any() == "owner") {
                    let names = children.of::<Secret>().map(|c| c.name.clone()).collect();
                    let _ = done.send(names);
                }
                Ok::<_, ReconcileError>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_millis(200)),
            Arc::new(done),
        );
    let task = tokio::spawn(outcomes.for_each(|_| async {}));
    // Reconciles until one lists `want`; none may list the unlabelled child.
    let mut until = async |want: &[&str]| -> TestResult {
        loop {
            let names = tokio::time::timeout(Duration::from_secs(30), listed.recv())
                .await
                .map_err(|_| format!("no reconcile listed {want:?} within 30 s"))?
                .ok_or("the controller stopped")?;
            assert!(
                !names.iter().any(|n| n == "out"),
                "an unlabelled child was listed: {names:?}"
            );
            if names == want {
                return Ok(());
            }
        }
    };
    until(&["in"]).await?;
    secrets
        .patch(
            "in",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": null}})),
        )
        .await?;
    until(&[]).await?;

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    d.stop().await;
    Ok(())
}
