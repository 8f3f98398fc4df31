//! The operator API and `kdctl` against two dispatchers on the real API server: `status`
//! shows the ring, each slice and each group's queue; `owner` says where a key stands (queued
//! for a replica, in flight on it, backing off, requeued) and who owns it, during a drain too;
//! `drain` hands a dispatcher's keys over with nothing lost or reconciled twice at once, and
//! `undrain` brings it back;
//! `reconcile` reconciles one key through the tier; a caller without the operator role is
//! refused.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kdctl::{
    command,
    connect::{Connection, Target, TokenSource},
    view::{OwnerView, Render as _},
};
use kube::{Api, api::PostParams};
use kube_dispatch_proto::{
    RequestKey,
    v1::{AckItem, Reason, ack_item},
};
use kube_dispatch_tests::{
    Cluster, TestNamespace, TestResult,
    dispatcher::{TestDispatcher, TestSession, lease_config, subscription},
    eventually, identity,
};

const BOUND: Duration = Duration::from_secs(3);
const GROUP: &str = "operated";
const COUNT: usize = 12;

fn target(ns: &TestNamespace, token: TokenSource) -> Target {
    Target {
        namespace: ns.name().to_owned(),
        dispatchers: Vec::new(),
        credentials: kube_dispatch_proto::credentials::Credentials::tls(
            Cluster::shared().dir().join("pki/ca.crt"),
        ),
        token,
        audience: "kube-dispatch".into(),
        timeout: Duration::from_secs(10),
    }
}

fn tester() -> TokenSource {
    TokenSource::File(Cluster::shared().dir().join("tokens/tester.token"))
}

async fn create(api: &Api<ConfigMap>, name: &str) -> Result<(), kube::Error> {
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm).await.map(drop)
}

/// dispatcher-0 and dispatcher-1 on Leases in `ns`, once both serve a ring of the two.
async fn two_dispatchers(ns: &TestNamespace) -> TestResult<(TestDispatcher, TestDispatcher)> {
    let d0 = TestDispatcher::start(lease_config(ns.name(), "dispatcher-0", BOUND)).await?;
    let d1 = TestDispatcher::start(lease_config(ns.name(), "dispatcher-1", BOUND)).await?;
    for d in [&d0, &d1] {
        let mut slice = d.handles.slice.clone();
        tokio::time::timeout(
            Duration::from_secs(30),
            slice.wait_for(|s| s.ring.members().len() == 2 && s.is_settled()),
        )
        .await??;
    }
    Ok((d0, d1))
}

/// The one place `view` shows for its key, with its owner.
fn place(view: &OwnerView) -> (&str, &str, &str, u32) {
    assert_eq!(view.places.len(), 1, "{}", view.table());
    let p = &view.places[0];
    (
        p.dispatcher.as_str(),
        p.state.as_str(),
        p.replica.as_str(),
        p.failures,
    )
}

fn ack(id: u64, outcome: ack_item::Outcome) -> AckItem {
    AckItem {
        delivery_id: id,
        outcome: Some(outcome),
        memo: Vec::new(),
    }
}

#[tokio::test]
async fn kdctl_shows_the_tier_finds_a_key_and_drains_a_dispatcher() -> TestResult {
    let ns = TestNamespace::create("kd-operator").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (d0, d1) = two_dispatchers(&ns).await?;
    let sub = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut s0 = TestSession::open(&d0, GROUP, "replica-a", sub()).await?;
    let mut s1 = TestSession::open(&d1, GROUP, "replica-b", sub()).await?;
    let ring = kube_dispatch_proto::Ring::new(["dispatcher-0", "dispatcher-1"]);
    // At least COUNT objects, and at least two on each dispatcher whatever the namespace's
    // random name does to the hashes.
    let on = |name: &str| ring.owner(&RequestKey::new("", "ConfigMap", ns.name(), name));
    let mut names: Vec<String> = Vec::new();
    while names.len() < COUNT
        || ["dispatcher-0", "dispatcher-1"]
            .iter()
            .any(|d| names.iter().filter(|n| on(n) == Some(*d)).count() < 2)
    {
        assert!(
            names.len() < 1000,
            "a ring of two that puts nothing on one member"
        );
        names.push(format!("cm-{}", names.len()));
    }
    for name in &names {
        create(&api, name).await?;
    }
    let owned_by = |owner: &str| -> Vec<String> {
        names
            .iter()
            .filter(|n| {
                ring.owner(&RequestKey::new("", "ConfigMap", ns.name(), n.as_str())) == Some(owner)
            })
            .cloned()
            .collect()
    };
    let (on0, on1) = (owned_by("dispatcher-0"), owned_by("dispatcher-1"));
    assert!(
        on1.len() >= 2,
        "the test needs two keys on dispatcher-1: {on1:?}"
    );
    // Each dispatcher delivers its own keys; take them all, acknowledging.
    let got0 = s0
        .collect_until(Duration::from_secs(10), |got| got.len() >= on0.len())
        .await;
    let got1 = s1
        .collect_until(Duration::from_secs(10), |got| got.len() >= on1.len())
        .await;
    assert_eq!((got0.len(), got1.len()), (on0.len(), on1.len()));

    let kdctl = Connection::new(ns.client(), target(&ns, tester())).await?;

    // status: both serving one ring, shares that cover the hash space, the group on each.
    let status = command::status(&kdctl).await?;
    println!("{}", status.table());
    assert!(status.healthy, "{:?}", status.problems);
    let names_seen: Vec<&str> = status.dispatchers.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names_seen, ["dispatcher-0", "dispatcher-1"]);
    let share: f64 = status.dispatchers.iter().map(|d| d.slice_share).sum();
    assert!((share - 1.0).abs() < 1e-6, "shares sum to {share}");
    assert!(
        status
            .dispatchers
            .iter()
            .all(|d| d.state == "serving" && d.sessions == 1)
    );
    let keys: u64 = status.groups.iter().map(|g| g.keys).sum();
    assert_eq!(keys, names.len() as u64);
    let replicas: Vec<(&str, &str)> = status
        .groups
        .iter()
        .map(|g| (g.dispatcher.as_str(), g.replicas[0].as_str()))
        .collect();
    assert_eq!(
        replicas,
        [("dispatcher-0", "replica-a"), ("dispatcher-1", "replica-b")]
    );

    // owner: a key owned by dispatcher-1, through each state.
    let name = on1[0].clone();
    let key = command::request_key(&kdctl, "configmaps", &format!("{}/{name}", ns.name())).await?;
    assert_eq!(key, RequestKey::new("", "ConfigMap", ns.name(), &name));
    assert_eq!(
        command::request_key(&kdctl, "ConfigMap", &name)
            .await
            .map_err(|e| e.to_string())
            .unwrap_err(),
        "ConfigMap is namespaced: give <namespace>/<name>"
    );
    let view = command::owner(&kdctl, &key).await?;
    println!("{}", view.table());
    assert_eq!(view.owner, "dispatcher-1");
    assert_eq!(place(&view), ("dispatcher-1", "idle", "", 0));

    // Queued for replica-b: a change while nobody polls.
    api.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"data": {"v": "1"}})),
    )
    .await?;
    // An error of kdctl ends the wait and fails the test.
    let view = eventually(Duration::from_secs(30), "the key queued", || async {
        match command::owner(&kdctl, &key).await {
            Ok(view) if view.places.first().is_none_or(|p| p.state != "queued") => None,
            answer => Some(answer),
        }
    })
    .await??;
    assert_eq!(place(&view), ("dispatcher-1", "queued", "replica-b", 0));

    // In flight on replica-b, then backing off after a failure, then requeued.
    let held = s1.hold(Duration::from_secs(5)).await?;
    assert_eq!(held.len(), 1);
    let view = command::owner(&kdctl, &key).await?;
    println!("{}", view.table());
    assert_eq!(place(&view), ("dispatcher-1", "in-flight", "replica-b", 0));
    s1.poll_with(
        vec![ack(
            held[0].delivery_id,
            ack_item::Outcome::Failure(Default::default()),
        )],
        Duration::from_millis(10),
    )
    .await?;
    let view = command::owner(&kdctl, &key).await?;
    assert_eq!(place(&view), ("dispatcher-1", "backing-off", "", 1));
    let retried = s1.hold(Duration::from_secs(10)).await?;
    s1.poll_with(
        vec![ack(
            retried[0].delivery_id,
            ack_item::Outcome::Requeue(kube_dispatch_proto::v1::Requeue {
                after: Some(prost_types::Duration {
                    seconds: 300,
                    nanos: 0,
                }),
            }),
        )],
        Duration::from_millis(10),
    )
    .await?;
    let view = command::owner(&kdctl, &key).await?;
    assert_eq!(place(&view), ("dispatcher-1", "requeue-after", "", 0));
    let wait = view.places[0].wait_seconds.unwrap_or_default();
    assert!((290.0..=300.0).contains(&wait), "requeued for {wait} s");

    // A caller with the operator role who may not get ConfigMaps learns nothing of the key.
    let (blind, _token) =
        connect_as(&ns, "status-only", &[], &[("get", "/kube-dispatch/status")]).await?;
    let view = command::owner(&blind, &key).await?;
    assert_eq!(view.owner, "dispatcher-1", "the ring is no secret");
    assert!(view.places.is_empty(), "{}", view.table());
    assert!(
        view.answers.iter().all(|a| a.error.is_none()),
        "{}",
        view.table()
    );

    // A caller without the operator role is refused, by name.
    let (nobody, _token) = connect_as(&ns, "nobody", &[], &[]).await?;
    let refused = command::status(&nobody).await?;
    assert!(!refused.healthy);
    let error = refused.dispatchers[0].error.clone().unwrap_or_default();
    assert!(
        error.contains(&format!(
            "system:serviceaccount:{}:nobody may not get /kube-dispatch/status",
            ns.name()
        )),
        "{error}"
    );

    // drain dispatcher-1 with one of its keys in flight: it waits for the ack, and
    // dispatcher-0 takes that key only after it.
    let in_flight_name = on1[1].clone();
    api.patch(
        &in_flight_name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
    )
    .await?;
    let held = s1.hold(Duration::from_secs(5)).await?;
    assert_eq!(held.len(), 1);
    let drain = {
        let kdctl = kdctl.clone();
        tokio::spawn(async move {
            command::drain(&kdctl, "dispatcher-1", Duration::from_secs(60)).await
        })
    };
    // While it drains: dispatcher-1 no longer serves the key, which is still in flight there
    // and nowhere else (dispatcher-0 does not hold it, not even queued).
    let in_flight_key = RequestKey::new("", "ConfigMap", ns.name(), &in_flight_name);
    let during = eventually(
        Duration::from_secs(30),
        "no dispatcher serving the key",
        || async {
            match command::owner(&kdctl, &in_flight_key).await {
                Ok(view) if view.answers.iter().any(|a| a.served) => None,
                answer => Some(answer),
            }
        },
    )
    .await??;
    println!("during the drain:\n{}", during.table());
    assert_eq!(
        place(&during),
        ("dispatcher-1", "in-flight", "replica-b", 0)
    );
    assert!(
        during.table().contains("owner: dispatcher-1 (draining"),
        "{}",
        during.table()
    );
    let status = command::status(&kdctl).await?;
    assert!(!status.healthy);
    assert_eq!(
        status.dispatchers[1].state,
        "draining",
        "{}",
        status.table()
    );
    assert!(
        !drain.is_finished(),
        "the drain waits for the delivery in flight"
    );
    s1.ack(&[held[0].delivery_id]).await?;
    let drained = drain.await??;
    println!("{}", drained.table());
    assert!(
        drained.clean && drained.problems.is_empty(),
        "{}",
        drained.table()
    );
    assert_eq!(drained.ring, ["dispatcher-0"]);

    // dispatcher-0 serves every key now; dispatcher-1's Lease is gone.
    let status = command::status(&kdctl).await?;
    println!("{}", status.table());
    assert!(status.healthy, "{:?}", status.problems);
    assert_eq!(status.dispatchers.len(), 1);
    assert!((status.dispatchers[0].slice_share - 1.0).abs() < 1e-9);
    let view = command::owner(&kdctl, &in_flight_key).await?;
    assert_eq!(view.owner, "dispatcher-0");
    assert!(view.answers[0].served);
    // A change of the moved key reaches replica-a on dispatcher-0, after the ack on
    // dispatcher-1: never two reconciles of it at once.
    api.patch(
        &in_flight_name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"data": {"v": "3"}})),
    )
    .await?;
    let got = s0
        .collect_until(Duration::from_secs(10), |got| {
            got.iter()
                .any(|r| r.key.ends_with(&format!("/{in_flight_name}")))
        })
        .await;
    assert!(
        got.iter()
            .any(|r| r.key.ends_with(&format!("/{in_flight_name}"))),
        "{got:?}"
    );
    d0.stop().await;
    d1.stop().await;
    Ok(())
}

/// `kdctl undrain` brings a drained dispatcher back into the ring without a restart: every
/// dispatcher then serves one ring with it again, and it hands its keys to the replicas that
/// poll it. A dispatcher that was not drained is left as it is; a caller who may not drain may
/// not undrain; a drained dispatcher, whose Lease is gone, is found by its pod or named.
#[tokio::test]
async fn kdctl_undrain_brings_a_drained_dispatcher_back_into_the_ring() -> TestResult {
    let ns = TestNamespace::create("kd-undrain").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (d0, d1) = two_dispatchers(&ns).await?;
    let ring = kube_dispatch_proto::Ring::new(["dispatcher-0", "dispatcher-1"]);
    let name = (0..1000)
        .map(|i| format!("cm-{i}"))
        .find(|n| {
            ring.owner(&RequestKey::new("", "ConfigMap", ns.name(), n)) == Some("dispatcher-1")
        })
        .expect("a name on dispatcher-1");
    create(&api, &name).await?;
    let kdctl = Connection::new(ns.client(), target(&ns, tester())).await?;
    let named = Connection::new(
        ns.client(),
        Target {
            dispatchers: vec![
                format!("dispatcher-0={}", d0.addr),
                format!("dispatcher-1={}", d1.addr),
            ],
            ..target(&ns, tester())
        },
    )
    .await?;

    // Serving: nothing to do. A caller who may not drain is refused.
    let view = command::undrain(&kdctl, "dispatcher-1", Duration::from_secs(30)).await?;
    assert!(
        !view.rejoining && view.problems.is_empty(),
        "{}",
        view.table()
    );
    let (blind, _token) =
        connect_as(&ns, "status-only", &[], &[("get", "/kube-dispatch/status")]).await?;
    let refused = command::undrain(&blind, "dispatcher-1", Duration::from_secs(30))
        .await
        .expect_err("refused");
    assert!(
        format!("{refused:#}").contains("may not post /kube-dispatch/drain"),
        "{refused:#}"
    );

    let drained = command::drain(&kdctl, "dispatcher-1", Duration::from_secs(60)).await?;
    assert_eq!(drained.ring, ["dispatcher-0"], "{}", drained.table());
    // Its Lease is gone, and this is no pod: kdctl says how to name it.
    let lost = command::undrain(&kdctl, "dispatcher-1", Duration::from_secs(30))
        .await
        .expect_err("no Lease, no pod");
    assert!(
        format!("{lost:#}").contains("--dispatcher NAME=ADDRESS"),
        "{lost:#}"
    );

    let view = command::undrain(&named, "dispatcher-1", Duration::from_secs(60)).await?;
    println!("{}", view.table());
    assert!(
        view.rejoining && !view.holds_for_previous && view.problems.is_empty(),
        "{}",
        view.table()
    );
    assert_eq!(view.ring, ["dispatcher-0", "dispatcher-1"]);
    let status = command::status(&kdctl).await?;
    assert!(status.healthy, "{}", status.table());
    assert_eq!(status.dispatchers.len(), 2, "{}", status.table());

    // It serves its key again: a replica polling it there is handed it.
    let mut s1 = TestSession::open(
        &d1,
        GROUP,
        "replica-b",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    let key = RequestKey::new("", "ConfigMap", ns.name(), &name).to_string();
    let got = s1
        .collect_until(Duration::from_secs(20), |got| {
            got.iter().any(|r| r.key == key)
        })
        .await;
    assert!(got.iter().any(|r| r.key == key), "{got:?}");
    d0.stop().await;
    d1.stop().await;
    Ok(())
}

/// With a kubeconfig alone, kdctl finds the CA bundle the tier publishes in its namespace: the
/// ConfigMap kube-dispatch-ca, else the ca.crt of the dispatchers' serving Secret; with
/// neither it says what it tried. The bundle found verifies the dispatchers.
#[tokio::test]
async fn kdctl_finds_the_tiers_ca_in_its_namespace() -> TestResult {
    use k8s_openapi::{ByteString, api::core::v1::Secret};
    use kdctl::connect::{CA_CONFIGMAP, DISPATCHER_TLS_SECRET, discover_ca};
    let ns = TestNamespace::create("kd-ca").await?;
    let ca = std::fs::read(Cluster::shared().dir().join("pki/ca.crt"))?;

    let none = discover_ca(&ns.client(), ns.name())
        .await
        .expect_err("no CA published yet");
    let said = format!("{none:#}");
    assert!(
        said.contains(CA_CONFIGMAP) && said.contains(DISPATCHER_TLS_SECRET),
        "{said}"
    );

    let secrets: Api<Secret> = Api::namespaced(ns.client(), ns.name());
    let mut secret = Secret::default();
    secret.metadata.name = Some(DISPATCHER_TLS_SECRET.into());
    secret.data = Some([("ca.crt".to_owned(), ByteString(ca.clone()))].into());
    secrets.create(&PostParams::default(), &secret).await?;
    let found = discover_ca(&ns.client(), ns.name()).await?;
    assert_eq!(
        (found.pem.as_slice(), found.source.as_str()),
        (
            ca.as_slice(),
            format!("Secret {}/{DISPATCHER_TLS_SECRET}", ns.name()).as_str()
        )
    );

    // The ConfigMap comes first: reading it needs no right to Secrets.
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut published = ConfigMap::default();
    published.metadata.name = Some(CA_CONFIGMAP.into());
    published.data = Some([("ca.crt".to_owned(), String::from_utf8(ca.clone())?)].into());
    configmaps
        .create(&PostParams::default(), &published)
        .await?;
    let found = discover_ca(&ns.client(), ns.name()).await?;
    assert_eq!(
        found.source,
        format!("ConfigMap {}/{CA_CONFIGMAP}", ns.name())
    );

    // What was found verifies a dispatcher's certificate (made for localhost here).
    let d0 = TestDispatcher::start(lease_config(ns.name(), "dispatcher-0", BOUND)).await?;
    let mut slice = d0.handles.slice.clone();
    tokio::time::timeout(Duration::from_secs(30), slice.wait_for(|s| s.is_settled())).await??;
    let mut by_found = target(&ns, tester());
    by_found.credentials = kube_dispatch_proto::credentials::Credentials::tls_pem(found.pem)
        .with_server_name("localhost");
    let connection = Connection::new(ns.client(), by_found).await?;
    let view = command::status(&connection).await?;
    assert!(view.healthy, "{}", view.table());
    // `kdctl version`: its own and the dispatcher's.
    let versions = command::version(&connection).await?;
    assert!(
        versions.kdctl.starts_with(env!("CARGO_PKG_VERSION")),
        "{}",
        versions.table()
    );
    assert_eq!(
        versions.versions,
        vec![env!("CARGO_PKG_VERSION").to_owned()],
        "{}",
        versions.table()
    );
    assert!(versions.problems.is_empty(), "{}", versions.table());
    Ok(())
}

/// A connection as the ServiceAccount `name` of `ns`, made with `verbs` on its ConfigMaps and
/// `post` on the non-resource `path`s given, through a token file (removed when dropped).
async fn connect_as(
    ns: &TestNamespace,
    name: &str,
    verbs: &[&str],
    paths: &[(&str, &str)],
) -> TestResult<(Connection, TokenFile)> {
    identity::account(ns, name, verbs).await?;
    for (verb, path) in paths {
        identity::grant_path(ns, name, verb, path).await?;
    }
    let path = Cluster::shared()
        .dir()
        .join(format!("tokens/{}-{name}.token", ns.name()));
    std::fs::write(&path, identity::token(ns, name, "kube-dispatch").await?)?;
    let connection =
        Connection::new(ns.client(), target(ns, TokenSource::File(path.clone()))).await?;
    Ok((connection, TokenFile(path)))
}

/// A token file, removed when dropped.
struct TokenFile(std::path::PathBuf);

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `kdctl reconcile` reconciles one key through the tier: the dispatcher that serves it hands
/// it again, as TRIGGERED, to the replica polling it there, and nothing else; a name no group
/// knows queues nothing; a caller who may read the operator API but not `post`
/// /kube-dispatch/reconcile is refused. `kdctl status` shows which replica polls which
/// dispatchers.
#[tokio::test]
async fn kdctl_reconciles_a_key_through_the_tier_and_shows_who_polls_where() -> TestResult {
    let ns = TestNamespace::create("kd-reconcile").await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let (d0, d1) = two_dispatchers(&ns).await?;
    // Four objects at least, one of them on dispatcher-0.
    let ring = kube_dispatch_proto::Ring::new(["dispatcher-0", "dispatcher-1"]);
    let on = |name: &str| ring.owner(&RequestKey::new("", "ConfigMap", ns.name(), name));
    let mut names: Vec<String> = Vec::new();
    while names.len() < 4 || !names.iter().any(|n| on(n) == Some("dispatcher-0")) {
        names.push(format!("cm-{}", names.len()));
    }
    for name in &names {
        create(&api, name).await?;
    }
    let on0: Vec<&String> = names
        .iter()
        .filter(|n| on(n) == Some("dispatcher-0"))
        .collect();
    let sub = || vec![subscription("v1", "ConfigMap", ns.name())];
    let mut a0 = TestSession::open(&d0, GROUP, "replica-a", sub()).await?;
    // replica-a polls both dispatchers, replica-b dispatcher-1 only (sessions live 3 s past
    // their last call: the ones on dispatcher-1 are needed for the status only).
    let _a1 = TestSession::open(&d1, GROUP, "replica-a", sub()).await?;
    let _b1 = TestSession::open(&d1, GROUP, "replica-b", sub()).await?;
    let first = a0
        .collect_until(Duration::from_secs(10), |got| got.len() >= on0.len())
        .await;
    assert_eq!(first.len(), on0.len());

    let kdctl = Connection::new(ns.client(), target(&ns, tester())).await?;
    let status = command::status(&kdctl).await?;
    let placed: Vec<(&str, Vec<&str>)> = status
        .placements
        .iter()
        .map(|p| {
            (
                p.replica.as_str(),
                p.dispatchers.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        placed,
        [
            ("replica-a", vec!["dispatcher-0", "dispatcher-1"]),
            ("replica-b", vec!["dispatcher-1"])
        ],
        "{}",
        status.table()
    );

    // The key is idle; asked, it is queued for replica-a on dispatcher-0 and delivered again.
    let name = on0[0];
    let key = command::request_key(&kdctl, "configmaps", &format!("{}/{name}", ns.name())).await?;
    let view = command::reconcile(&kdctl, &key).await?;
    println!("{}", view.table());
    assert_eq!(view.owner, "dispatcher-0");
    assert_eq!(place(&view), ("dispatcher-0", "queued", "replica-a", 0));
    let again = a0
        .collect_until(Duration::from_secs(10), |got| !got.is_empty())
        .await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].key, key.to_string());
    assert_eq!(again[0].reason(), Reason::Triggered);
    // Nothing else is delivered.
    let more = a0.collect_until(Duration::from_secs(1), |_| false).await;
    assert!(more.is_empty(), "{more:?}");

    // A name no group knows is not added.
    let unknown =
        command::request_key(&kdctl, "configmaps", &format!("{}/none", ns.name())).await?;
    let view = command::reconcile(&kdctl, &unknown).await?;
    assert!(view.places.is_empty(), "{}", view.table());
    assert!(view.answers.iter().any(|a| a.served));

    // Reading the operator API is not enough to act through it.
    let (reader, _token) =
        connect_as(&ns, "reader", &["get"], &[("get", "/kube-dispatch/status")]).await?;
    let refused = command::reconcile(&reader, &key).await?;
    let errors: Vec<&str> = refused
        .answers
        .iter()
        .filter_map(|a| a.error.as_deref())
        .collect();
    assert_eq!(errors.len(), 2, "{}", refused.table());
    assert!(
        errors
            .iter()
            .all(|e| e.contains("/kube-dispatch/reconcile")),
        "{errors:?}"
    );
    let nothing = a0.collect_until(Duration::from_secs(1), |_| false).await;
    assert!(nothing.is_empty(), "refused, yet delivered: {nothing:?}");
    d0.stop().await;
    d1.stop().await;
    Ok(())
}
