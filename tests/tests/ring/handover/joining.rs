//! A dispatcher joins while the API server's priority and fairness refuses its lists: warmed up
//! first, it joins only once it has listed what moves to it, and the others serve those keys
//! until then, so no write waits for its list (make before break). Without the warm-up the same
//! join makes the writes to the keys that move wait as long as the list is held back.

use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1::ClusterRoleBinding};
use kube::api::PostParams;
use kube_dispatch_dispatcher::config::Membership;
use kube_dispatch_tests::{TestNamespace, apf::RefusedLists};

use super::support::*;

/// How long the API server refuses the joining dispatcher's lists once it has refused one.
const HELD: Duration = Duration::from_secs(8);

/// With the warm-up (the default), the join adds at most a second to the worst write's wait;
/// and the joiner lists once: what its list showed while it warmed up, and every change since,
/// is what it serves when its gate opens, so it lists nothing beside its watch then.
#[tokio::test]
async fn a_join_while_the_joiners_lists_are_refused_makes_no_write_wait_for_them() -> TestResult {
    let waited = join_while_lists_are_refused("warm", Duration::from_secs(60)).await?;
    assert!(
        waited.during <= waited.before + Duration::from_secs(1),
        "a write waited {:?} during the join, against {:?} at worst before it",
        waited.during,
        waited.before
    );
    assert_eq!(
        (waited.joiner_side_lists, waited.joiner_spared),
        (0, 1),
        "the joiner's lists beside its watch, and those it did not need, as its gate opened"
    );
    Ok(())
}

/// Without it, the others let the moved keys go as the joiner arrives, and writes to them wait
/// for its list: what the warm-up removes.
#[tokio::test]
async fn without_a_warm_up_a_join_makes_writes_wait_for_the_joiners_refused_lists() -> TestResult {
    let waited = join_while_lists_are_refused("cold", Duration::ZERO).await?;
    assert!(
        waited.during >= HELD / 2,
        "the worst write waited only {:?} while the joiner's lists were refused for {HELD:?}",
        waited.during
    );
    Ok(())
}

/// The worst wait from a write to a reconcile that saw it, before the join and from its start.
struct Waited {
    before: Duration,
    during: Duration,
    /// The joiner's lists beside its watch until the end.
    joiner_side_lists: u64,
    /// The lists beside its watch it did not make, its groups having kept up.
    joiner_spared: u64,
}

/// Two dispatchers serve two replicas while ConfigMaps are written every 25 ms; a third joins
/// (with `warm_up`) under an identity whose lists of the namespace's ConfigMaps the API server
/// refuses (HTTP 429) until it has refused one and [`HELD`] has passed. Checks no overlap and
/// every final state reconciled; returns the worst waits.
async fn join_while_lists_are_refused(label: &str, warm_up: Duration) -> TestResult<Waited> {
    kube_dispatch_tests::log_to_file_from_env();
    let ns = TestNamespace::create(&format!("join-{label}")).await?;
    let journal = Journal::default();
    let mut lb = TestLoadBalancer::start(ns.name()).await?;
    assert!(lb.leads_within(Duration::from_secs(15)).await);
    let mut ds = start_settled(ns.name(), 2, BOUND).await?;
    let replicas = start_replicas(ns.name(), 2, &lb, &journal, Duration::ZERO, TTL)?;
    placed(&lb, 2, 2, Duration::from_secs(30)).await;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (writer, stop) = start_writing(&api, 60, Duration::from_millis(25), &journal).await?;
    journal
        .await_writes(journal.writes_len(), 80, Duration::from_secs(30))
        .await?;

    let joining = Instant::now();
    let token = joiner_identity(&ns).await?;
    let refusal = refuse_lists(&ns, &token).await?;
    let mut joiner = config(ns.name(), 2, BOUND);
    if let Membership::Leases(lease) = &mut joiner.membership {
        lease.warm_up = warm_up;
    }
    // Its lists are the ones held back: made by a peer (`--share-lists`), they would be made
    // under the peers' identity here, which the API server does not hold back. In a tier every
    // dispatcher has one identity, and the lister's requests are held back as its own.
    joiner.share_lists = false;
    ds.insert(2, TestDispatcher::start_as(joiner, token).await?);
    // The replica the load balancer places there opens a session, which makes the group and
    // starts its watch: hold its lists back from the first refusal on.
    eventually(
        Duration::from_secs(30),
        "the joining dispatcher's list refused",
        || async { (refusal.refused().await > 0).then_some(()) },
    )
    .await?;
    tokio::time::sleep(HELD).await;
    assert!(
        ds[&2].watch_total(|c| &c.applied) == 0,
        "the joiner listed ConfigMaps while its lists were to be refused"
    );
    refusal.remove().await?;
    settled(&ds, Duration::from_secs(60)).await;
    journal
        .await_writes(journal.writes_len(), 80, Duration::from_secs(30))
        .await?;
    stop.cancel();
    let writes = writer.await??;
    assert_finals_reconciled(&api, &journal, Duration::from_secs(30)).await?;
    let worst = |during: bool| {
        journal
            .delays()
            .into_iter()
            .filter(|(w, _)| (w.at >= joining) == during)
            .map(|(_, d)| d)
            .max()
            .unwrap_or_default()
    };
    let waited = Waited {
        before: worst(false),
        during: worst(true),
        joiner_side_lists: ds[&2].watch_total(|c| &c.side_lists),
        joiner_spared: ds[&2].watch_total(|c| &c.side_lists_spared),
    };
    println!(
        "{label}: {writes} writes; worst wait {:?} before the join, {:?} from its start; the join settled {:?} after it began; the joiner listed beside its watch {} times, and spared {}",
        waited.before,
        waited.during,
        joining.elapsed(),
        waited.joiner_side_lists,
        waited.joiner_spared,
    );
    stop_all(replicas, ds, [lb]).await;
    Api::<ClusterRoleBinding>::all(ns.client())
        .delete(
            &format!("kube-dispatch-test-joiner-{}", ns.name()),
            &DeleteParams::default(),
        )
        .await?;
    Ok(waited)
}

/// A ServiceAccount `joiner` of `ns` bound to cluster-admin (as a dispatcher's identity may do
/// all a dispatcher does) and a token of it for the API server: unlike the admin, an identity
/// priority and fairness can hold back.
async fn joiner_identity(ns: &TestNamespace) -> TestResult<String> {
    let client = ns.client();
    Api::<ServiceAccount>::namespaced(client.clone(), ns.name())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": { "name": "joiner" },
            }))?,
        )
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("kube-dispatch-test-joiner-{}", ns.name()) },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
            "subjects": [{ "kind": "ServiceAccount", "name": "joiner", "namespace": ns.name() }],
        }))?)
        .await?;
    Ok(kube_dispatch_tests::identity::token(
        ns,
        "joiner",
        kube_dispatch_tests::identity::API_AUDIENCE,
    )
    .await?)
}

/// The joiner's lists of ConfigMaps in the test namespace refused (`RefusedLists`).
async fn refuse_lists(ns: &TestNamespace, token: &str) -> TestResult<RefusedLists> {
    let subject = serde_json::json!({ "kind": "ServiceAccount", "serviceAccount": { "name": "joiner", "namespace": ns.name() } });
    let rules = serde_json::json!([{ "verbs": ["list"], "apiGroups": [""], "resources": ["configmaps"], "namespaces": [ns.name()] }]);
    RefusedLists::install(
        ns.client(),
        &format!("kube-dispatch-test-refuse-{}", ns.name()),
        (subject, rules),
        token,
        format!(
            "/api/v1/namespaces/{}/configmaps?resourceVersion=4000000000&resourceVersionMatch=NotOlderThan",
            ns.name()
        ),
    )
    .await
}
