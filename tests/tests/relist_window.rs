//! A deletion made as a handover completes is delivered (`dispatcher/HANDOVER.md`, "Deletions
//! in transit"). When its gate opens, a dispatcher lists the keys that moved to it. A watch
//! that restarted to do so missed what happened between its last event and the new list's
//! snapshot: a key that had just moved here was in no index yet, the list no longer showed its
//! object, and the new stream began after the deletion. The list now runs beside the stream.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::DeleteParams};
use kube_dispatch_dispatcher::serve::Membership;
use kube_dispatch_tests::{
    Cluster, TestNamespace,
    dispatcher::{TestDispatcher, TestSession, lease_membership, subscription, test_config},
    faultproxy::{Fault, FaultProxy},
    journal::{Journal, write_round},
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn a_deletion_as_the_handover_completes_is_delivered() -> TestResult {
    let ns = TestNamespace::create("handover-window").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    write_round(&api, 10, 0, &Journal::default()).await?;
    let config = || {
        let mut config = test_config("dispatcher-0", &[]);
        let mut membership = lease_membership(ns.name(), "dispatcher-0", Duration::from_secs(3));
        if let Membership::Leases(lease) = &mut membership {
            // Renewals cross a slow path below: a long Lease keeps them in time.
            lease.duration = Duration::from_secs(10);
            lease.renew_period = Duration::from_secs(1);
        }
        config.membership = membership;
        config.settings.limits.max_ttl = Duration::from_secs(3);
        config.settings.queue.max_reconcile_time = Duration::from_secs(3);
        config
    };

    // A first process is killed: its successor finds the Lease unreleased and holds every key
    // until the first one's reconciles are surely over, then its gate opens and it lists.
    let first = TestDispatcher::start(config()).await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        first.handles.slice.clone().wait_for(|s| s.is_settled()),
    )
    .await??;
    first.kill();

    // The successor reaches the API server over a slow path (every chunk of bytes waits 150 ms),
    // so a list it starts when its gate opens takes its snapshot after cm-3, deleted at that
    // moment, is gone, and the deletion's event reaches it later than the list begins.
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    proxy.set(Fault::Latency(Duration::from_millis(150)));
    let d = TestDispatcher::start_with(config(), "127.0.0.1:0", Some(proxy.addr), None).await?;
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut session = TestSession::open(&d, "window", "replica-0", subs).await?;
    assert!(
        d.handles.slice.borrow().settled.is_none(),
        "the successor holds its keys at first"
    );
    let key = format!("/ConfigMap/{}/cm-3", ns.name());
    let delete = async {
        let mut slice = d.handles.slice.clone();
        tokio::time::timeout(
            Duration::from_secs(30),
            slice.wait_for(|s| s.settled.is_some()),
        )
        .await??;
        api.delete("cm-3", &DeleteParams::default()).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let (got, deleted) = tokio::join!(
        session.collect_until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.key == key && r.deleted)
        }),
        delete
    );
    deleted?;
    let keys: Vec<(&str, bool)> = got.iter().map(|r| (r.key.as_str(), r.deleted)).collect();
    assert!(
        got.iter().any(|r| r.key == key && r.deleted),
        "the deletion of cm-3 as the handover completed was never delivered; got {keys:?}"
    );
    d.stop().await;
    Ok(())
}
