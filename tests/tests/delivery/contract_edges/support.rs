//! What the tests of this module share.

pub(super) use k8s_openapi::{
    api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::OwnerReference,
};
pub(super) use kube::{
    Api, Resource as _, ResourceExt as _,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
pub(super) use kube_dispatch_proto::v1::{Reason, ReconcileRequest, Subscription};
pub(super) use kube_dispatch_tests::{
    TestNamespace, TestResult, Widget, WidgetSpec,
    dispatcher::{TestDispatcher, TestSession, subscription, test_config},
    ensure_widget_crd,
};
pub(super) use std::time::Duration;

pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn reason(r: &ReconcileRequest) -> Reason {
    Reason::try_from(r.reason).unwrap_or(Reason::Unspecified)
}

/// What a controller receives, as the closing note of the issue shows it.
pub(super) fn seen(r: &ReconcileRequest) -> (Reason, String, String, bool) {
    (reason(r), r.key.clone(), r.uid.clone(), r.deleted)
}

/// Creates the Widget `w` in `ns` (whose CRD must exist); its controller reference, for the
/// children it owns.
pub(super) async fn widget_owner(ns: &TestNamespace) -> TestResult<OwnerReference> {
    let widgets: Api<Widget> = Api::namespaced(ns.client(), ns.name());
    let w = widgets
        .create(
            &PostParams::default(),
            &Widget::new("w", WidgetSpec { size: 1 }),
        )
        .await?;
    Ok(w.controller_owner_ref(&())
        .ok_or("a created Widget has a uid")?)
}

pub(super) fn labelled(name: &str, tier: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some([("tier".to_owned(), tier.to_owned())].into());
    cm
}

/// Polls, acknowledging each delivery, until one arrives; returns it.
pub(super) async fn next(s: &mut TestSession) -> TestResult<ReconcileRequest> {
    let got = s.hold(TIMEOUT).await?;
    let [one] = <[ReconcileRequest; 1]>::try_from(got)
        .map_err(|got| format!("expected one delivery, got {got:?}"))?;
    s.ack(&[one.delivery_id]).await?;
    Ok(one)
}
