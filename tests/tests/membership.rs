//! Ring membership from Leases against the real API server: members appear when they hold a
//! Lease, leave at once when they release it, and are dropped after the lease duration when
//! they stop renewing without releasing (a crash).

use kube_dispatch_tests::{TestNamespace, TestResult};
use std::{
    collections::BTreeSet,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use kube_dispatch_core::handover::Slice;
use kube_dispatch_dispatcher::{config::LeaseConfig, k8s::membership};
use kube_dispatch_proto::Ring;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

struct Member {
    ring: watch::Receiver<Arc<Slice>>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

fn join(ns: &TestNamespace, identity: &str) -> Member {
    let empty = Slice::fixed(identity, Ring::new(Vec::<String>::new()));
    let (tx, ring) = watch::channel(Arc::new(empty));
    // Nothing is ever in flight here: the release is clean.
    let (_released, released) = watch::channel(None);
    let cancel = CancellationToken::new();
    let config = LeaseConfig {
        namespace: ns.name().to_owned(),
        identity: identity.to_owned(),
        address: format!("{identity}.invalid:7070"),
        duration: Duration::from_secs(2),
        renew_period: Duration::from_millis(500),
        grace: Duration::from_millis(500),
        handover_bound: Duration::from_secs(1),
    };
    let clean = Arc::new(AtomicBool::new(true));
    let task = tokio::spawn(membership::run(
        ns.client(),
        config,
        Default::default(),
        tx,
        released,
        cancel.clone(),
        clean,
    ));
    Member { ring, cancel, task }
}

/// Waits for the ring seen by `member` to have exactly `want` as members.
async fn members_become(member: &mut Member, want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
    let wait = member
        .ring
        .wait_for(|s| s.ring.members().iter().cloned().collect::<BTreeSet<_>>() == want);
    let reached = matches!(
        tokio::time::timeout(Duration::from_secs(30), wait).await,
        Ok(Ok(_))
    );
    let now = member.ring.borrow().ring.members().to_vec();
    assert!(reached, "ring never became {want:?}; it is {now:?}");
}

#[tokio::test]
async fn members_join_leave_and_are_dropped_when_they_stop_renewing() -> TestResult {
    let ns = TestNamespace::create("membership").await?;
    let mut a = join(&ns, "dispatcher-0");
    let b = join(&ns, "dispatcher-1");
    members_become(&mut a, &["dispatcher-0", "dispatcher-1"]).await;

    // A graceful leave releases the Lease: the others drop the member at once.
    b.cancel.cancel();
    b.task.await?;
    members_become(&mut a, &["dispatcher-0"]).await;

    // A crash (the task dies, the Lease stays): dropped once its Lease goes unrenewed.
    let c = join(&ns, "dispatcher-2");
    members_become(&mut a, &["dispatcher-0", "dispatcher-2"]).await;
    c.task.abort();
    members_become(&mut a, &["dispatcher-0"]).await;
    drop(c.ring);

    a.cancel.cancel();
    a.task.await?;
    Ok(())
}
