//! A dispatcher joins while the API server's priority and fairness refuses its lists: warmed up
//! first, it joins only once it has listed what moves to it, and the others serve those keys
//! until then, so no write waits for its list (make before break). Without the warm-up the same
//! join makes the writes to the keys that move wait as long as the list is held back.

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
    rbac::v1::ClusterRoleBinding,
};
use kube::api::PostParams;
use kube_dispatch_dispatcher::config::Membership;
use kube_dispatch_tests::TestNamespace;

use super::support::*;

/// How long the API server refuses the joining dispatcher's lists once it has refused one.
const HELD: Duration = Duration::from_secs(8);

/// The audience of tokens the test API server takes (its service-account issuer).
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// With the warm-up (the default), the join adds at most a second to the worst write's wait.
#[tokio::test]
async fn a_join_while_the_joiners_lists_are_refused_makes_no_write_wait_for_them() -> TestResult {
    let waited = join_while_lists_are_refused("warm", Duration::from_secs(60)).await?;
    assert!(
        waited.during <= waited.before + Duration::from_secs(1),
        "a write waited {:?} during the join, against {:?} at worst before it",
        waited.during,
        waited.before
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
    let refusal = RefusedLists::install(&ns, &token).await?;
    let mut joiner = config(ns.name(), 2, BOUND);
    if let Membership::Leases(lease) = &mut joiner.membership {
        lease.warm_up = warm_up;
    }
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
    };
    println!(
        "{label}: {writes} writes; worst wait {:?} before the join, {:?} from its start; the join settled {:?} after it began",
        waited.before,
        waited.during,
        joining.elapsed()
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
    Ok(kube_dispatch_tests::identity::token(ns, "joiner", API_AUDIENCE).await?)
}

/// A priority level with no seat that rejects what it cannot run at once, and a flow schema
/// that sends it the joiner's lists of ConfigMaps in the test namespace (and nothing else: its
/// watches, Lease writes and reviews go through). A level with no seat still runs one request
/// while none runs, so the joiner's identity keeps one running: a list at a resourceVersion the
/// API server has not reached, which it holds 3 s before answering 504, asked again at once.
/// The joiner's own lists are refused with 429 meanwhile, but for the millisecond between two.
struct RefusedLists {
    client: kube::Client,
    name: String,
    occupier: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

impl RefusedLists {
    async fn install(ns: &TestNamespace, token: &str) -> TestResult<Self> {
        let client = ns.client();
        let name = format!("kube-dispatch-test-refuse-{}", ns.name());
        Api::<PriorityLevelConfiguration>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": { "name": name },
                    "spec": { "type": "Limited", "limited": {
                        "nominalConcurrencyShares": 0,
                        "lendablePercent": 0,
                        "borrowingLimitPercent": 0,
                        "limitResponse": { "type": "Reject" },
                    }},
                }))?,
            )
            .await?;
        Api::<FlowSchema>::all(client.clone())
            .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({
                "metadata": { "name": name },
                "spec": {
                    "priorityLevelConfiguration": { "name": name },
                    "matchingPrecedence": 2,
                    "distinguisherMethod": { "type": "ByUser" },
                    "rules": [{
                        "subjects": [{ "kind": "ServiceAccount", "serviceAccount": { "name": "joiner", "namespace": ns.name() } }],
                        "resourceRules": [{ "verbs": ["list"], "apiGroups": [""], "resources": ["configmaps"], "namespaces": [ns.name()] }],
                    }],
                },
            }))?)
            .await?;
        let stop = CancellationToken::new();
        let occupier = tokio::spawn(occupy(
            // Each answer is followed at once by the next request, never by a backoff.
            Cluster::shared().client_with_token(token, false).await?,
            format!(
                "/api/v1/namespaces/{}/configmaps?resourceVersion=4000000000&resourceVersionMatch=NotOlderThan",
                ns.name()
            ),
            stop.clone(),
        ));
        Ok(Self {
            client,
            name,
            occupier,
            stop,
        })
    }

    /// How many requests the API server has refused at the level: the joiner's lists (the
    /// occupier's requests run one after the other).
    async fn refused(&self) -> u64 {
        let Ok(request) = tonic::codegen::http::Request::get("/metrics").body(Vec::new()) else {
            return 0;
        };
        let metrics = self.client.request_text(request).await.unwrap_or_default();
        let series = format!(
            "apiserver_flowcontrol_rejected_requests_total{{flow_schema=\"{}\"",
            self.name
        );
        metrics
            .lines()
            .filter(|l| l.starts_with(&series))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Lists go through again.
    async fn remove(self) -> TestResult {
        self.stop.cancel();
        self.occupier.await?;
        let dp = DeleteParams::default();
        Api::<FlowSchema>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await?;
        Api::<PriorityLevelConfiguration>::all(self.client)
            .delete(&self.name, &dp)
            .await?;
        Ok(())
    }
}

/// Asks `path` again and again with `client` until `stop`, whatever the answers.
async fn occupy(client: kube::Client, path: String, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let Ok(request) = tonic::codegen::http::Request::get(&path).body(Vec::new()) else {
            return;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = client.request_text(request) => {}
        }
    }
}
