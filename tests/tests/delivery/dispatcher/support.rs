//! What the tests of this module share.

pub(super) use futures::{StreamExt, TryStreamExt};
pub(super) use k8s_openapi::{
    api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::OwnerReference,
};
pub(super) use kube::{
    ResourceExt,
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
};
pub(super) use kube_dispatch_proto::{
    RequestKey, Ring,
    v1::{
        AckItem, Failure, OpenSessionRequest, PollRequest, Reason, ReconcileRequest, Subscription,
        ack_item,
    },
};
pub(super) use kube_dispatch_tests::{
    TestNamespace, TestResult, Widget, WidgetSpec,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
    ensure_widget_crd,
};
pub(super) use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::Duration,
};
pub(super) use tonic::Code;

pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn configmap(name: &str, value: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("value".to_owned(), value.to_owned())].into());
    cm
}

pub(super) fn cm_key(ns: &str, name: &str) -> String {
    format!("/ConfigMap/{ns}/{name}")
}

/// Creates ConfigMaps `cm-0` to `cm-{n-1}`, 16 at a time.
pub(super) async fn create_configmaps(api: &Api<ConfigMap>, n: usize) -> Result<(), kube::Error> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            api.create(&PostParams::default(), &configmap(&format!("cm-{i}"), "0"))
                .await
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// A namespace, its ConfigMaps API, one dispatcher and one session of group "g" subscribed to
/// the namespace's ConfigMaps.
pub(super) async fn configmap_setup(
    name: &str,
) -> TestResult<(TestNamespace, Api<ConfigMap>, TestDispatcher, TestSession)> {
    let ns = TestNamespace::create(name).await?;
    let api: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let d = TestDispatcher::start(test_config("dispatcher-0", &["dispatcher-0"])).await?;
    let s = TestSession::open(
        &d,
        "g",
        "r1",
        vec![subscription("v1", "ConfigMap", ns.name())],
    )
    .await?;
    Ok((ns, api, d, s))
}

pub(super) fn reason(r: &ReconcileRequest) -> Reason {
    Reason::try_from(r.reason).unwrap_or(Reason::Unspecified)
}
