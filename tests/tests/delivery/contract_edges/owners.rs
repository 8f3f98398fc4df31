//! Owners outside their children's namespace: a cluster-scoped object that owns namespaced
//! ones.

use super::support::*;

/// A cluster-scoped object owns a namespaced child (here the test's Namespace owns a ConfigMap
/// in it, as an operator's cluster-scoped resource owns what it makes in each namespace): the
/// child's change is delivered under the owner's own key, which has no namespace
/// (`/Namespace//<name>`), with the child among its children. Keyed by the child's namespace,
/// it named an object that does not exist, and the owner's reconcile found nothing.
#[tokio::test]
async fn a_cluster_scoped_owner_is_delivered_under_its_own_key() -> TestResult {
    use k8s_openapi::api::core::v1::Namespace;
    use kube_dispatch_proto::v1::{ChildrenState, ResourceRef};

    let ns = TestNamespace::create("edges-cluster-owner").await?;
    let namespaces: Api<Namespace> = Api::all(ns.client());
    let owner = namespaces
        .get(ns.name())
        .await?
        .controller_owner_ref(&())
        .ok_or("a Namespace has a uid")?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let owned = Subscription {
        owner: Some(ResourceRef {
            group: String::new(),
            version: "v1".into(),
            kind: "Namespace".into(),
            plural: String::new(),
        }),
        ..subscription("v1", "ConfigMap", ns.name())
    };
    let mut s = TestSession::open(&d, "namespaces", "r1", vec![owned]).await?;
    let mut child = labelled("c1", "x");
    child.metadata.owner_references = Some(vec![owner]);
    configmaps.create(&PostParams::default(), &child).await?;
    let got = next(&mut s).await?;
    assert_eq!(got.key, format!("/Namespace//{}", ns.name()));
    assert_eq!(
        got.children_state,
        ChildrenState::Complete as i32,
        "{got:?}"
    );
    let children: Vec<&str> = got
        .children
        .iter()
        .filter_map(|c| c.object.as_ref())
        .map(|o| o.name.as_str())
        .collect();
    assert_eq!(children, ["c1"]);
    d.stop().await;
    Ok(())
}
