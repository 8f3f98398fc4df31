//! A controller written as kube-rs controllers with finalizers are (kube-runtime's
//! `finalizer()` with its `Event::Apply` and `Event::Cleanup`, events through kube-runtime's
//! `Recorder`), on the SDK with its imports changed only, against an in-process dispatcher and
//! the real API server: the finalizer is added before the first `Apply`, and a deletion waits
//! for the `Cleanup`, after which the finalizer is removed and the object goes.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event as K8sEvent};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{
        events::{Event as Published, EventType, Recorder, Reporter},
        wait::{await_condition, conditions},
    },
};
// The port: `kube::runtime::{controller::Action, finalizer::{...}}` became these.
use kube_dispatch_controller::{
    Action, Controller,
    finalizer::{self, Event, finalizer},
};
use kube_dispatch_tests::{
    TestNamespace, TestResult,
    dispatcher::{TestDispatcher, test_config},
};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

const FINALIZER: &str = "example.kube-dispatch.dev/cleanup";
/// The test's objects carry it, and the controller selects by it: nothing else in the
/// namespace (its root CA ConfigMap) gets the finalizer.
const LABEL: (&str, &str) = ("example.kube-dispatch.dev/finalized", "yes");

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    /// Each `Apply` and `Cleanup` run: ("apply" or "cleanup", the object's name).
    runs: mpsc::UnboundedSender<(&'static str, String)>,
    /// A `Cleanup` finishes only with a permit from here: the test looks at the object first.
    cleanups: Semaphore,
}

async fn reconcile(
    cm: Arc<ConfigMap>,
    ctx: Arc<Ctx>,
) -> Result<Action, finalizer::Error<kube::Error>> {
    let api: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &cm.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, cm, |event| async {
        match event {
            Event::Apply(cm) => {
                let published = Published {
                    type_: EventType::Normal,
                    reason: "Reconciled".into(),
                    note: Some("behind the finalizer".into()),
                    action: "Reconcile".into(),
                    secondary: None,
                };
                ctx.recorder
                    .publish(&published, &cm.object_ref(&()))
                    .await?;
                let _ = ctx.runs.send(("apply", cm.name_any()));
                Ok(Action::requeue(Duration::from_secs(300)))
            }
            Event::Cleanup(cm) => {
                let _ = ctx.runs.send(("cleanup", cm.name_any()));
                if let Ok(permit) = ctx.cleanups.acquire().await {
                    permit.forget();
                }
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(_cm: Arc<ConfigMap>, _e: &finalizer::Error<kube::Error>, _: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_millis(200))
}

/// The next run reported, within 30 s.
async fn next(
    runs: &mut mpsc::UnboundedReceiver<(&'static str, String)>,
) -> (&'static str, String) {
    tokio::time::timeout(Duration::from_secs(30), runs.recv())
        .await
        .ok()
        .flatten()
        .expect("a reconcile within 30 s")
}

#[tokio::test]
async fn a_kube_rs_controller_with_a_finalizer_ports_by_its_imports() -> TestResult {
    let ns = TestNamespace::create("sdk-finalizer").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let (runs_tx, mut runs) = mpsc::unbounded_channel();
    let reporter = Reporter {
        controller: "finalizing-controller".into(),
        instance: Some("replica-a".into()),
    };
    let ctx = Arc::new(Ctx {
        client: ns.client(),
        recorder: Recorder::new(ns.client(), reporter),
        runs: runs_tx,
        cleanups: Semaphore::new(0),
    });
    let stop = CancellationToken::new();
    let stream = Controller::<ConfigMap>::new(ns.client(), "finalizing")
        .namespace(ns.name())
        .labels(format!("{}={}", LABEL.0, LABEL.1))
        .dispatchers([d.addr.to_string()])
        .credentials(kube_dispatch_tests::credentials())
        .replica_id("replica-a")
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, Arc::clone(&ctx));
    let task = tokio::spawn(stream.for_each(|_| async {}));

    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("guarded".into());
    cm.metadata.labels = Some([(LABEL.0.to_owned(), LABEL.1.to_owned())].into());
    api.create(&PostParams::default(), &cm).await?;
    // The first reconcile adds the finalizer; the change it makes is delivered, and that
    // reconcile runs `Apply`.
    assert_eq!(next(&mut runs).await, ("apply", "guarded".to_owned()));
    let guarded = api.get("guarded").await?;
    assert_eq!(guarded.finalizers(), [FINALIZER.to_owned()]);
    let events: Api<K8sEvent> = Api::namespaced(ns.client(), ns.name());
    let published = events.list(&ListParams::default()).await?;
    assert!(
        published.items.iter().any(|e| {
            e.reason.as_deref() == Some("Reconciled")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("guarded")
                && e.reporting_controller.as_deref() == Some("finalizing-controller")
        }),
        "the Apply published its event: {:?}",
        published
            .items
            .iter()
            .map(|e| &e.reason)
            .collect::<Vec<_>>()
    );

    // A deletion waits for the finalizer: the object stays, marked, until `Cleanup` ran.
    api.delete("guarded", &DeleteParams::default()).await?;
    loop {
        match next(&mut runs).await {
            ("cleanup", name) if name == "guarded" => break,
            // An `Apply` that was already on its way before the deletion.
            ("apply", _) => {}
            other => panic!("unexpected run {other:?}"),
        }
    }
    // While the cleanup runs, the object is still there, marked for deletion and held by the
    // finalizer.
    let held = api.get("guarded").await?;
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), [FINALIZER.to_owned()]);
    ctx.cleanups.add_permits(1);
    // Then the finalizer goes, and the object with it.
    let uid = guarded.uid().unwrap_or_default();
    let gone = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api.clone(), "guarded", conditions::is_deleted(&uid)),
    )
    .await;
    assert!(
        matches!(gone, Ok(Ok(_))),
        "the object went after its cleanup: {gone:?}"
    );

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    d.stop().await;
    Ok(())
}
