//! Ring membership from Leases against the real API server: members appear when they hold a
//! Lease, leave at once when they release it, and are dropped after the lease duration when
//! they stop renewing without releasing (a crash); a member that joins is handed its keys
//! without waiting for the others' periodic renewals.

use kube_dispatch_tests::{TestNamespace, TestResult};
use std::{
    collections::BTreeSet,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::wait::await_condition,
};
use kube_dispatch_core::handover::Slice;
use kube_dispatch_dispatcher::{
    config::LeaseConfig,
    membership::{self, sessions::LeaseSessions, warm_up::WarmUp},
};
use kube_dispatch_proto::{
    Ring,
    lease::{DRAINED_ANNOTATION, LEASE_LABEL, RELEASED_ANNOTATION, WARMING_ANNOTATION, ring_id},
};
use tokio::{
    sync::watch,
    task::JoinHandle,
    time::{Instant, timeout},
};
use tokio_util::sync::CancellationToken;

struct Member {
    ring: watch::Receiver<Arc<Slice>>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

fn join(ns: &TestNamespace, identity: &str) -> Member {
    join_with(
        ns,
        identity,
        Duration::from_secs(2),
        Duration::from_millis(500),
        WarmUp::default(),
    )
}

/// A member with Lease `duration` renewed every `renew_period`, joining after `warm` ends when
/// it finds no Lease of its own. Nothing is ever in flight on it: it releases each ring it is
/// on as soon as it adopts it, as a dispatcher with idle queues does.
fn join_with(
    ns: &TestNamespace,
    identity: &str,
    duration: Duration,
    renew_period: Duration,
    warm: WarmUp,
) -> Member {
    let empty = Slice::fixed(identity, Ring::new(Vec::<String>::new()));
    let (tx, ring) = watch::channel(Arc::new(empty));
    let (released_tx, released) = watch::channel(None);
    let mut adopted = ring.clone();
    tokio::spawn(async move {
        while adopted.changed().await.is_ok() {
            let id = ring_id(&adopted.borrow_and_update().ring);
            released_tx.send_if_modified(|r| {
                let changed = r.as_deref() != Some(id.as_str());
                *r = Some(id);
                changed
            });
        }
    });
    let cancel = CancellationToken::new();
    let config = LeaseConfig {
        namespace: ns.name().to_owned(),
        identity: identity.to_owned(),
        address: format!("{identity}.invalid:7070"),
        duration,
        renew_period,
        grace: Duration::from_millis(500),
        handover_bound: Duration::from_secs(1),
        warm_up: Duration::ZERO,
    };
    let clean = Arc::new(AtomicBool::new(true));
    let task = tokio::spawn(membership::run(
        ns.client(),
        config,
        Default::default(),
        tx,
        released,
        Arc::new(LeaseSessions::new(Duration::from_secs(1))),
        (cancel.clone(), clean),
        Default::default(),
        warm,
    ));
    Member { ring, cancel, task }
}

/// Waits for `member` to serve every key it owns on a ring of exactly `want`; how long it took.
async fn settles_on(member: &mut Member, want: &[&str], within: Duration) -> Duration {
    let started = Instant::now();
    let wait = member
        .ring
        .wait_for(|s| s.ring.members() == want && s.is_settled());
    let reached = matches!(timeout(within, wait).await, Ok(Ok(_)));
    let now = member.ring.borrow().clone();
    assert!(
        reached,
        "{want:?} not settled within {within:?}: the ring is {:?}, settled on {:?}",
        now.ring.members(),
        now.settled.as_ref().map(|s| s.members().to_vec())
    );
    started.elapsed()
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

/// A dispatcher that joins counts only releases written after it adopted the new ring (so a
/// member that died meanwhile cannot be missed). Here the others have already released the
/// ring with the joiner on it when it starts (its Lease was written beforehand, drained, so no
/// previous process is waited out), so only releases written again after its adoption open its
/// gate: the others write them as soon as they see what it awaits, not on their next periodic
/// renewal. With a renew period of 30 s the joiner is served its keys within seconds.
#[tokio::test]
async fn a_joining_member_is_served_without_waiting_for_the_others_renewals() -> TestResult {
    const PERIOD: Duration = Duration::from_secs(30);
    const DURATION: Duration = Duration::from_secs(90);
    const PROMPT: Duration = Duration::from_secs(5);
    let ns = TestNamespace::create("membership-join").await?;
    let mut a = join_with(&ns, "dispatcher-0", DURATION, PERIOD, WarmUp::default());
    settles_on(&mut a, &["dispatcher-0"], PROMPT).await;
    let mut b = join_with(&ns, "dispatcher-1", DURATION, PERIOD, WarmUp::default());
    let both = ["dispatcher-0", "dispatcher-1"];
    let took = settles_on(&mut b, &both, PROMPT).await;
    settles_on(&mut a, &both, PROMPT).await;
    println!("the second member settled {took:?} after it started");

    // dispatcher-2's Lease appears (drained: a process that stopped cleanly; written as the
    // dispatcher writes it, so its own first renewal takes the mark off), and the others adopt
    // the ring with it and release that ring before its process starts.
    let all = ["dispatcher-0", "dispatcher-1", "dispatcher-2"];
    let id = ring_id(&Ring::new(all));
    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    let drained = serde_json::json!({ DRAINED_ANNOTATION: "true" });
    write_lease(&leases, "dispatcher-2", DURATION, drained).await?;
    for name in ["dispatcher-0", "dispatcher-1"] {
        let released = |l: Option<&Lease>| {
            l.and_then(|l| l.metadata.annotations.as_ref())
                .and_then(|a| a.get(RELEASED_ANNOTATION))
                .is_some_and(|r| *r == id)
        };
        timeout(PROMPT, await_condition(leases.clone(), name, released)).await??;
    }

    let mut c = join_with(&ns, "dispatcher-2", DURATION, PERIOD, WarmUp::default());
    let took = settles_on(&mut c, &all, PROMPT).await;
    for m in [&mut a, &mut b] {
        settles_on(m, &all, PROMPT).await;
    }
    println!("the third member settled {took:?} after it started (renew period {PERIOD:?})");

    for m in [a, b, c] {
        m.cancel.cancel();
        m.task.await?;
    }
    Ok(())
}

/// A serving dispatcher whose replica keeps polling writes its Lease once a renew period (400 ms
/// for test dispatchers), and not more: the Lease's versions over 4 s, counted by a watch of it
/// once the dispatcher serves its keys and its session is listed. A write loop (the load
/// balancer once renewed its own Lease about 13 times a second) would show nowhere else but on
/// the API server's bill.
#[tokio::test]
async fn a_serving_dispatcher_writes_its_lease_once_a_renew_period() -> TestResult {
    use kube_dispatch_tests::{
        dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
        leases::lease_versions,
    };

    let ns = TestNamespace::create("membership-renewals").await?;
    let config = lease_config(ns.name(), "dispatcher-0", Duration::from_secs(30));
    let d = TestDispatcher::start(config).await?;
    let mut slice = d.handles.slice.clone();
    timeout(Duration::from_secs(30), slice.wait_for(|s| s.is_settled())).await??;
    let subscriptions = vec![subscription("v1", "ConfigMap", ns.name())];
    let mut session = TestSession::open(&d, "renewals", "replica-0", subscriptions).await?;
    session.poll_acking(&[], Duration::from_millis(300)).await?;

    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    let window = Duration::from_secs(4);
    // The replica polls throughout, as replicas do.
    let polling = async {
        loop {
            if let Err(status) = session.poll_acking(&[], Duration::from_millis(300)).await {
                return status;
            }
        }
    };
    // 4 s at one renewal each 400 ms: 10, and the Lease as it stood at the start; 16 at most.
    let versions = tokio::select! {
        status = polling => panic!("the session's poll failed: {status}"),
        versions = lease_versions(leases, "dispatcher-0", window, 16) => versions?,
    };
    assert!(
        versions.len() >= 5,
        "only {} versions of the dispatcher's Lease within {window:?}: it does not renew every \
         400 ms",
        versions.len()
    );
    println!(
        "{} versions of the dispatcher's Lease in {window:?}",
        versions.len()
    );
    d.stop().await;
    Ok(())
}

/// A dispatcher that found its Lease unreleased (its previous process, or its previous term
/// before an undrain, may have reconciles running) does not release its Lease when it stops
/// within the handover bound, even with nothing of its own in flight: the others would hand
/// its keys out at once, beside those reconciles. The Lease is left to expire.
#[tokio::test]
async fn a_dispatcher_waiting_out_its_predecessor_leaves_its_lease_to_expire() -> TestResult {
    use kube_dispatch_tests::dispatcher::{TestDispatcher, lease_config};
    const BOUND: Duration = Duration::from_secs(60);
    let ns = TestNamespace::create("membership-predecessor").await?;
    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    // What a process killed a moment ago leaves: its Lease, held, renewed, not drained.
    let held = serde_json::json!({});
    write_lease(&leases, "dispatcher-0", Duration::from_secs(10), held).await?;
    let before = leases.get("dispatcher-0").await?.metadata.resource_version;
    let d = TestDispatcher::start(lease_config(ns.name(), "dispatcher-0", BOUND)).await?;
    // It renews the Lease it found (holding its keys meanwhile).
    timeout(
        Duration::from_secs(30),
        await_condition(leases.clone(), "dispatcher-0", |l: Option<&Lease>| {
            l.is_some_and(|l| l.metadata.resource_version != before)
        }),
    )
    .await??;
    assert!(!d.handles.slice.borrow().is_settled(), "it holds its keys");
    d.stop().await;
    let left = leases.get_opt("dispatcher-0").await?;
    let drained = left
        .as_ref()
        .and_then(|l| l.metadata.annotations.as_ref())
        .is_some_and(|a| a.contains_key(DRAINED_ANNOTATION));
    assert!(
        left.is_some() && !drained,
        "the Lease was released within the bound: {left:?}"
    );
    Ok(())
}

/// Writes the Lease of dispatcher `name` as the dispatcher writes its own (server-side apply,
/// its field manager), held by it and renewed now, with `annotations`.
async fn write_lease(
    leases: &Api<Lease>,
    name: &str,
    duration: Duration,
    annotations: serde_json::Value,
) -> Result<(), kube::Error> {
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "labels": { LEASE_LABEL: "true" },
            "annotations": annotations,
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration.as_secs(),
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
        },
    });
    let apply = PatchParams::apply("kube-dispatch-dispatcher").force();
    leases.patch(name, &apply, &Patch::Apply(&lease)).await?;
    Ok(())
}

/// A member warming up to join hands out nothing, even alone in its own view (its gate would
/// open at once there), and the others do not count it: a member that starts meanwhile serves
/// the ring of one. Once its warm-up ends, the mark goes at once rather than at the next
/// renewal (30 s here), and both are served the ring of two within seconds.
#[tokio::test]
async fn a_warming_member_serves_nothing_and_joins_once_warm() -> TestResult {
    const PERIOD: Duration = Duration::from_secs(30);
    const DURATION: Duration = Duration::from_secs(90);
    const PROMPT: Duration = Duration::from_secs(5);
    let ns = TestNamespace::create("membership-warm").await?;
    let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
    let warm = WarmUp::new(Duration::from_secs(600));
    let mut a = join_with(&ns, "dispatcher-0", DURATION, PERIOD, warm.clone());
    let marked = |l: Option<&Lease>| {
        l.and_then(|l| l.metadata.annotations.as_ref())
            .is_some_and(|a| a.get(WARMING_ANNOTATION).is_some_and(|v| v == "true"))
    };
    timeout(
        PROMPT,
        await_condition(leases.clone(), "dispatcher-0", marked),
    )
    .await??;
    // It has judged a view with itself in it: alone, and serving nothing.
    members_become(&mut a, &["dispatcher-0"]).await;
    assert!(
        !a.ring.borrow().is_settled(),
        "a warming member served keys"
    );

    let mut b = join_with(&ns, "dispatcher-1", DURATION, PERIOD, WarmUp::default());
    settles_on(&mut b, &["dispatcher-1"], PROMPT).await;
    assert!(
        !a.ring.borrow().is_settled(),
        "a warming member served keys"
    );

    warm.end();
    let both = ["dispatcher-0", "dispatcher-1"];
    let took = settles_on(&mut a, &both, PROMPT).await;
    settles_on(&mut b, &both, PROMPT).await;
    let lease = leases.get("dispatcher-0").await?;
    assert!(!marked(Some(&lease)), "the mark outlived the warm-up");
    // The Lease says what its holder follows, so a newer peer knows to ask it for its groups.
    let listed = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kube_dispatch_proto::lease::CAPABILITIES_ANNOTATION))
        .map(|v| kube_dispatch_proto::lease::parse_capabilities(v))
        .unwrap_or_default();
    assert!(
        listed.contains(kube_dispatch_proto::capabilities::tier::PEER_GROUPS),
        "the Lease lists {listed:?}"
    );
    println!(
        "the warmed-up member settled {took:?} after its warm-up ended (renew period {PERIOD:?})"
    );
    for m in [a, b] {
        m.cancel.cancel();
        m.task.await?;
    }
    Ok(())
}

/// Two members warming up side by side (a fresh install) leave each other out of their rings,
/// and their warm-ups end together: the one whose mark goes last must see the other as a
/// member before it serves anything, so that the two never serve a ring of one each at once.
/// Served on a view from before its own unmarked write, it did (each settled alone).
#[tokio::test]
async fn two_members_warming_up_together_never_both_serve_alone() -> TestResult {
    const PERIOD: Duration = Duration::from_secs(30);
    const DURATION: Duration = Duration::from_secs(90);
    let ns = TestNamespace::create("membership-warm-two").await?;
    let names = ["dispatcher-0", "dispatcher-1"];
    let warms = [
        WarmUp::new(Duration::from_secs(600)),
        WarmUp::new(Duration::from_secs(600)),
    ];
    let mut members: Vec<Member> = names
        .iter()
        .zip(&warms)
        .map(|(name, warm)| join_with(&ns, name, DURATION, PERIOD, warm.clone()))
        .collect();
    for (m, name) in members.iter_mut().zip(names) {
        members_become(m, &[name]).await;
    }
    // Every slice each publishes from now on: whether it serves a ring of one.
    let alone: Vec<_> = members
        .iter()
        .zip(names)
        .map(|(m, name)| tokio::spawn(alone_while(m.ring.clone(), name)))
        .collect();
    for warm in &warms {
        warm.end();
    }
    for m in members.iter_mut() {
        settles_on(m, &names, Duration::from_secs(5)).await;
    }
    for m in &members {
        m.cancel.cancel();
    }
    let mut spans = Vec::new();
    for task in alone {
        spans.push(task.await?);
    }
    for a in &spans[0] {
        for b in &spans[1] {
            assert!(
                a.1 <= b.0 || b.1 <= a.0,
                "both served a ring of one at once: {a:?} and {b:?}"
            );
        }
    }
    for m in members {
        m.task.await?;
    }
    Ok(())
}

/// The spans of time in which the slices on `ring` serve a ring of `name` alone, until the
/// channel closes.
async fn alone_while(mut ring: watch::Receiver<Arc<Slice>>, name: &str) -> Vec<(Instant, Instant)> {
    let mut spans = Vec::new();
    let mut since: Option<Instant> = None;
    loop {
        let alone = ring
            .borrow_and_update()
            .settled
            .as_ref()
            .is_some_and(|s| s.members() == [name]);
        let now = Instant::now();
        match (alone, since) {
            (true, None) => since = Some(now),
            (false, Some(start)) => {
                spans.push((start, now));
                since = None;
            }
            _ => {}
        }
        if ring.changed().await.is_err() {
            if let Some(start) = since {
                spans.push((start, Instant::now()));
            }
            return spans;
        }
    }
}
