//! A key that moved to a serving dispatcher, held by its handover (the member that owned it
//! died, and its reconciles are waited out), deleted while that dispatcher is cut off from the
//! API server long enough to drop off its own ring, and its watch cannot resume (the API server
//! restarted): the re-list shows what exists, not what was deleted, and the old owner is dead. The dispatcher's index of held keys, filled by the list
//! its handover asked for, knew the key, so the re-list's sweep holds the deletion, delivered
//! once the handover completes (`dispatcher/HANDOVER.md`, "Deletions in a gap of the watch").
//!
//! This file holds one test on purpose: it restarts the shared API server, and cargo runs test
//! binaries one after another, so no other test is running while it does.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, api::DeleteParams};
use kube_dispatch_proto::{Ring, v1::ReconcileRequest};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
    eventually,
    faultproxy::{Fault, FaultProxy},
    journal::{Journal, write_round},
};
use tokio::time::Instant;

#[tokio::test]
async fn a_held_key_deleted_while_the_watch_is_away_is_delivered_once_the_handover_completes()
-> TestResult {
    let ring = Ring::new(["dispatcher-0", "dispatcher-1"]);
    let keys_of =
        |ns: &str| -> Vec<String> { (0..10).map(|i| format!("/ConfigMap/{ns}/cm-{i}")).collect() };
    let owned_by_1 = |keys: &[String]| -> usize {
        (keys.iter())
            .filter(|k| ring.owner_of_hash(ring.place(k)) == Some("dispatcher-1"))
            .count()
    };
    // The ring hashes the namespace too: one where each dispatcher owns a few of the keys.
    let ns = TestNamespace::create_where("held-keys", |ns| {
        (2..=8).contains(&owned_by_1(&keys_of(ns)))
    })
    .await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    write_round(&api, 10, 0, &Journal::default()).await?;
    let keys = keys_of(ns.name());
    let theirs: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .filter(|k| ring.owner_of_hash(ring.place(k)) == Some("dispatcher-1"))
        .collect();
    // A bound long enough that the handover still holds dispatcher-1's keys after the API
    // server's restart: its sessions (a client that never reports them ended) are waited out.
    let bound = Duration::from_secs(20);
    let proxy = FaultProxy::start(Cluster::shared().apiserver_addr().await?).await?;
    let config = lease_config(ns.name(), "dispatcher-0", bound);
    let d0 = TestDispatcher::start_with(config, "127.0.0.1:0", Some(proxy.addr), None).await?;
    let d1 = TestDispatcher::start(lease_config(ns.name(), "dispatcher-1", bound)).await?;
    for d in [&d0, &d1] {
        let mut slice = d.handles.slice.clone();
        let both = |s: &std::sync::Arc<kube_dispatch_core::handover::Slice>| {
            s.is_settled() && s.ring.members().len() == 2
        };
        tokio::time::timeout(Duration::from_secs(30), slice.wait_for(both)).await??;
    }
    let subs = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut mine = TestSession::open(&d0, "held", "replica-0", subs.clone()).await?;
    let mut other = TestSession::open(&d1, "held", "replica-1", subs).await?;
    let (n0, n1) = (keys.len() - theirs.len(), theirs.len());
    let (got0, got1) = tokio::join!(
        mine.collect_until(Duration::from_secs(20), |got| got.len() >= n0),
        other.collect_until(Duration::from_secs(20), |got| got.len() >= n1),
    );
    assert_eq!((got0.len(), got1.len()), (n0, n1));

    // dispatcher-1 dies: dispatcher-0 takes its keys and holds them for the bound, and its
    // watch lists them for the index of held keys. Then its watch goes away, one held key is
    // deleted, and the API server restarts, so the watch cannot resume and must re-list. The
    // session on dispatcher-0 is polled throughout.
    let died = Instant::now();
    let gone = theirs[0];
    let away = async {
        d1.kill();
        let mut slice = d0.handles.slice.clone();
        tokio::time::timeout(
            Duration::from_secs(30),
            slice.wait_for(|s| s.ring.members().len() == 1 && s.holds_keys()),
        )
        .await??;
        let group = d0.handles.groups.named("held").remove(0);
        eventually(Duration::from_secs(20), "the held keys are indexed", || {
            let indexed = group.figures().held_keys;
            async move { (indexed == n1).then_some(()) }
        })
        .await?;
        let indexed_after = died.elapsed();
        let name = gone.rsplit('/').next().unwrap_or_default().to_owned();
        // Cut off until its own Lease looks lapsed to it: off its own ring, it owns nothing,
        // and its index of held keys must stay as it was.
        proxy.set(Fault::Cut);
        tokio::time::timeout(Duration::from_secs(30), slice.wait_for(|s| !s.is_member())).await??;
        api.delete(&name, &DeleteParams::default()).await?;
        Cluster::shared()
            .restart_apiserver_expiring_watches(&ns)
            .await?;
        proxy.set(Fault::None);
        Ok::<_, kube_dispatch_tests::TestError>((indexed_after, died.elapsed()))
    };
    let (got, away) = tokio::join!(
        mine.collect_until(Duration::from_secs(120), |got| {
            theirs
                .iter()
                .all(|k| got.iter().any(|r| r.key == *k && r.deleted == (*k == gone)))
        }),
        away
    );
    let (indexed_after, healed_after) = away?;
    check_delivered(&got, &theirs, gone);
    println!(
        "held keys indexed {indexed_after:?} after the kill, the watch back {healed_after:?} after it, the deletion delivered {:?} after it",
        died.elapsed()
    );
    d0.stop().await;
    Ok(())
}

/// `got` holds exactly one deletion, of `gone`, and every key of `theirs`.
fn check_delivered(got: &[ReconcileRequest], theirs: &[&str], gone: &str) {
    let seen: Vec<(&str, bool)> = got.iter().map(|r| (r.key.as_str(), r.deleted)).collect();
    let deletions: Vec<&str> = (seen.iter())
        .filter(|(_, deleted)| *deleted)
        .map(|(key, _)| *key)
        .collect();
    assert_eq!(
        deletions,
        [gone],
        "exactly the deletion of the held key is delivered: {seen:?}"
    );
    for key in theirs {
        assert!(
            seen.iter().any(|(k, _)| k == key),
            "{key}, held, is delivered once the handover completes: {seen:?}"
        );
    }
}
